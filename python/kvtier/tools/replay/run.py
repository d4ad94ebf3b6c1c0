"""The replay against a server (the I/O): requests sent on the trace's schedule, at most --concurrency in flight,
TTFT and queue delay per request, counter deltas per pass."""

from __future__ import annotations

import argparse
import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from kvtier.tools.client import ApiClient
from kvtier.tools.longdoc.prompts import percentile, summarize_ttft, words
from kvtier.tools.replay.report import metrics_report
from kvtier.tools.replay.trace import TokenBuilder, TraceRequest, ideal_reuse, load_trace, schedule

def summarize(values: list[float]) -> dict:
    s = summarize_ttft(values)
    s["p99"] = percentile(values, 99) if values else math.nan
    return s


@dataclass
class PassResult:
    name: str
    requests: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    ttft: dict = field(default_factory=dict)
    queue_delay: dict = field(default_factory=dict)
    errors: int = 0
    metrics: dict | None = None


def settle_metrics(server: ApiClient, builder: TokenBuilder) -> dict[str, float] | None:
    """vLLM collects connector stats while it steps and kvtier samples its engine once a second: poke, wait, poke."""
    probe = words(8, random.Random(f"kvtier-replay-probe:{time.monotonic_ns()}"), builder.vocab_size)
    for _ in range(2):
        try:
            server.completion(probe, 1)
        except (OSError, RuntimeError):
            pass
        time.sleep(1.2)
    return server.metrics(None)


def replay_pass(server: ApiClient, reqs: list[TraceRequest], builder: TokenBuilder, a: argparse.Namespace,
                name: str, log=print) -> PassResult:
    offsets = schedule(reqs, a.time_scale)
    prompts = [builder.prompt(r) for r in reqs]
    res = PassResult(name)
    lock = threading.Lock()
    slots = threading.BoundedSemaphore(a.concurrency)
    before = server.metrics(None)

    def out_tokens(r: TraceRequest) -> int:
        if a.output_tokens is not None:
            return a.output_tokens
        n = max(1, r.output_length)
        return min(n, a.max_output_tokens) if a.max_output_tokens else n

    def one(i: int, scheduled: float, sent: float):
        r = reqs[i]
        rec = {"index": r.index, "scheduled_s": scheduled, "queue_delay_s": sent - scheduled,
               "prompt_tokens": len(prompts[i]), "max_tokens": out_tokens(r)}
        try:
            c = server.completion(prompts[i], rec["max_tokens"])
            rec.update(ttft_s=c["ttft_s"], latency_s=c["total_s"])
        except Exception as e:  # noqa: BLE001 - a failed request is reported, not fatal
            rec["error"] = f"{type(e).__name__}: {e}"[:300]
        finally:
            slots.release()
        with lock:
            res.requests.append(rec)
            if not a.quiet:
                t = rec.get("ttft_s")
                log(f"  {name} #{r.index} tokens={rec['prompt_tokens']} "
                    + (f"ttft={t * 1000:.1f} ms" if t is not None else f"ERROR {rec['error']}"))

    t_start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=a.concurrency) as pool:
        for i, off in enumerate(offsets):
            delay = t_start + off - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            slots.acquire()
            pool.submit(one, i, off, time.perf_counter() - t_start)
    res.wall_s = time.perf_counter() - t_start
    res.requests.sort(key=lambda x: x["index"])
    ok = [x for x in res.requests if "ttft_s" in x]
    res.errors = len(res.requests) - len(ok)
    res.ttft = summarize([x["ttft_s"] for x in ok])
    res.queue_delay = summarize([x["queue_delay_s"] for x in res.requests])
    after = settle_metrics(server, builder) if before is not None else None
    if before is not None and after is not None:
        res.metrics = metrics_report(before, after)
    return res


def run(a: argparse.Namespace, log=print) -> dict:
    reqs = load_trace(a.trace, a.start, a.max_requests, a.duration)
    if not reqs:
        raise SystemExit(f"kvtier replay: no requests in {a.trace} after the cut")
    builder = TokenBuilder(a.block_tokens, a.length_scale, a.seed, a.vocab_size, a.max_input_tokens)
    server = ApiClient(a.url, a.model)
    lengths = [min(builder.length(r), a.max_input_tokens or 1 << 62) for r in reqs]
    passes = []
    for k in range(a.passes):
        if a.reset_prefix_cache and not server.reset_prefix_cache():
            log("warning: /reset_prefix_cache kept failing")
        name = f"pass{k + 1}" if a.passes > 1 else "replay"
        passes.append(asdict(replay_pass(server, reqs, builder, a, name, log)))
    return {"trace": a.trace, "url": a.url, "model": a.model, "requests": len(reqs),
            "first_line": reqs[0].index + 1, "last_line": reqs[-1].index + 1,
            "trace_span_s": (reqs[-1].timestamp_ms - reqs[0].timestamp_ms) / 1000.0,
            "time_scale": a.time_scale, "concurrency": a.concurrency, "trace_block_tokens": a.block_tokens,
            "block_tokens": builder.block_tokens, "length_scale": a.length_scale,
            "prompt_tokens_mean": sum(lengths) / len(lengths), "prompt_tokens_max": max(lengths),
            "truncated": sum(1 for r in reqs if builder.length(r) > (a.max_input_tokens or 1 << 62)),
            "ideal": ideal_reuse(reqs, builder), "passes": passes}
