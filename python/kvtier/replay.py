"""`kvtier replay`: replay a request trace (Mooncake / Alibaba Bailian JSONL) against an OpenAI-compatible vLLM.

    kvtier replay --trace mooncake_conversation_trace.jsonl --url http://127.0.0.1:8000 --model tiny \\
        --max-requests 40 --time-scale 0.05 --length-scale 0.125 --output-tokens 2 --json out.json

Each line of the trace is one request: `timestamp` (ms since the trace start), `input_length`, `output_length` and
`hash_ids`, the ids of the prompt's consecutive blocks of --block-tokens tokens (512 for Mooncake, 16 for
Bailian); equal ids mean equal blocks. The replayer builds token-id prompts whose blocks repeat exactly where the
ids repeat: block `h` is always the same pseudo-random words (from --seed and h alone), the last block is cut to
`input_length` (the partial block is the first tokens of its id's block), and a prompt longer than its ids cover is
padded with words unique to that request.

--length-scale s shrinks every prompt to ceil(s * input_length) tokens with blocks of round(s * block_tokens)
tokens, which keeps the reuse structure (which blocks repeat, and the prefix fractions) at a size the model can
take: the tiny CPU model here serves 8k tokens at most and Mooncake's prompts average 12k. --max-input-tokens
then truncates any prompt still too long (counted in the report).

Timing: request i is sent at (timestamp_i - timestamp_first) / 1000 * --time-scale seconds after the start
(0: as fast as --concurrency allows). At most --concurrency requests are in flight; a request that finds them all
busy waits (its wait is reported as queue delay). TTFT is measured per request with streaming, from the moment it
is sent.

The report: TTFT mean/p50/p95/p99, queue delay, the trace's own reuse (the prompt tokens an infinite prefix cache
could serve, from the ids), and from vLLM's /metrics the deltas over the run: vLLM's prefix cache (GPU, tokens),
external hits (tokens loaded through the connector), kvtier's chunk lookups by outcome (DRAM hit, disk hit, miss),
hit rates by tier, and bytes read and written by kvtier. --json writes all of it with every request.

Only the standard library is used (plus the long-document client's HTTP code, kvtier.bench_longdoc).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from kvtier import bench_longdoc as bl
from kvtier.tiny_model import DEFAULTS


@dataclass(frozen=True)
class TraceRequest:
    index: int  # line number in the trace (0-based)
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def parse_line(line: str, index: int) -> TraceRequest:
    o = json.loads(line)
    try:
        return TraceRequest(index, float(o["timestamp"]), int(o["input_length"]), int(o["output_length"]),
                            tuple(int(h) for h in o["hash_ids"]))
    except KeyError as e:
        raise ValueError(f"trace line {index + 1}: missing field {e}") from None


def load_trace(path: str, start: int = 0, max_requests: int | None = None,
               duration_s: float | None = None) -> list[TraceRequest]:
    """Requests of the trace from line `start` on, at most max_requests of them, and only those within duration_s
    (trace time) of the first one kept."""
    out: list[TraceRequest] = []
    t_first = None
    with open(path) as fh:
        for i, line in enumerate(fh):
            if i < start or not line.strip():
                continue
            r = parse_line(line, i)
            if t_first is None:
                t_first = r.timestamp_ms
            if duration_s is not None and r.timestamp_ms - t_first > duration_s * 1000.0:
                break
            out.append(r)
            if max_requests is not None and len(out) >= max_requests:
                break
    return out


def cut(reqs: list[TraceRequest], start: int = 0, max_requests: int | None = None,
        duration_s: float | None = None) -> list[TraceRequest]:
    """The same cut as load_trace, on a list (start counts list positions)."""
    out = []
    for r in reqs[start:]:
        if duration_s is not None and out and r.timestamp_ms - out[0].timestamp_ms > duration_s * 1000.0:
            break
        out.append(r)
        if max_requests is not None and len(out) >= max_requests:
            break
    return out


def schedule(reqs: list[TraceRequest], time_scale: float) -> list[float]:
    """Send offsets (seconds from the start) of the requests: trace time relative to the first, times time_scale."""
    if not reqs:
        return []
    if time_scale < 0:
        raise ValueError("time_scale must be >= 0")
    t0 = reqs[0].timestamp_ms
    return [max(0.0, (r.timestamp_ms - t0) / 1000.0 * time_scale) for r in reqs]


class TokenBuilder:
    """Deterministic prompts: block h's tokens depend only on (seed, h); equal ids -> identical token blocks."""

    def __init__(self, block_tokens: int, length_scale: float = 1.0, seed: int = 0,
                 vocab_size: int = DEFAULTS["vocab"], max_input_tokens: int | None = None):
        if block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")
        if not length_scale > 0:
            raise ValueError("length_scale must be > 0")
        self.trace_block_tokens = block_tokens
        self.length_scale = length_scale
        self.block_tokens = max(1, round(block_tokens * length_scale))
        self.seed = seed
        self.vocab_size = vocab_size
        self.max_input_tokens = max_input_tokens
        self._cache: dict[int, list[int]] = {}
        self.truncated = 0

    def length(self, r: TraceRequest) -> int:
        n = max(1, math.ceil(r.input_length * self.length_scale))
        return n

    def block(self, h: int) -> list[int]:
        b = self._cache.get(h)
        if b is None:
            rng = random.Random(f"kvtier-replay:{self.seed}:block:{h}")
            b = bl._words(self.block_tokens, rng, self.vocab_size)
            self._cache[h] = b
        return b

    def prompt(self, r: TraceRequest) -> list[int]:
        n = self.length(r)
        toks: list[int] = []
        for h in r.hash_ids:
            need = n - len(toks)
            if need <= 0:
                break
            toks.extend(self.block(h)[:need])
        if len(toks) < n:  # the ids cover less than input_length: pad with words of this request only
            rng = random.Random(f"kvtier-replay:{self.seed}:pad:{r.index}")
            toks.extend(bl._words(n - len(toks), rng, self.vocab_size))
        if self.max_input_tokens is not None and len(toks) > self.max_input_tokens:
            toks = toks[:self.max_input_tokens]
            self.truncated += 1
        return toks


def ideal_reuse(reqs: list[TraceRequest], builder: TokenBuilder) -> dict:
    """What an unbounded prefix cache could serve: per request, the leading blocks whose ids were all seen before
    at the same position chain (the ids are prefix hashes), in prompt tokens."""
    seen: set[tuple[int, ...]] = set()
    total = reusable = 0
    for r in reqs:
        n = builder.length(r)
        if builder.max_input_tokens is not None:
            n = min(n, builder.max_input_tokens)
        total += n
        k = 0
        for i in range(len(r.hash_ids)):
            if r.hash_ids[:i + 1] in seen:
                k += 1
            else:
                break
        full_blocks = n // builder.block_tokens
        reusable += min(k, full_blocks) * builder.block_tokens
        for i in range(len(r.hash_ids)):
            seen.add(r.hash_ids[:i + 1])
    return {"prompt_tokens": total, "reusable_tokens": reusable,
            "reusable_fraction": reusable / total if total else 0.0}


# --------------------------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------------------------

_SOURCE_RE = re.compile(r'source="([^"]+)"')


def counters(series: dict[str, float]) -> dict[str, float]:
    """Counter values summed over labels by name, plus name[source] for series with a source label."""
    out: dict[str, float] = {}
    for s, v in series.items():
        name = s.split("{", 1)[0]
        out[name] = out.get(name, 0.0) + v
        m = _SOURCE_RE.search(s)
        if m:
            key = f"{name}[{m.group(1)}]"
            out[key] = out.get(key, 0.0) + v
    return out


def _get(d: dict[str, float], name: str) -> float | None:
    for k in (name + "_total", name):
        if k in d:
            return d[k]
    return None


def metrics_report(before: dict[str, float], after: dict[str, float]) -> dict:
    """Deltas of the counters that describe the cache over a run, and rates derived from them."""
    b, a = counters(before), counters(after)
    delta = {k: v - b.get(k, 0.0) for k, v in a.items() if not k.endswith("_created")}
    out: dict = {}

    def put(key, name):
        v = _get(delta, name)
        if v is not None:
            out[key] = v
        return v

    q = put("gpu_prefix_queries_tokens", "vllm:prefix_cache_queries")
    h = put("gpu_prefix_hits_tokens", "vllm:prefix_cache_hits")
    if q:
        out["gpu_prefix_hit_rate"] = (h or 0.0) / q
    eq = put("external_queries_tokens", "vllm:external_prefix_cache_queries")
    eh = put("external_hits_tokens", "vllm:external_prefix_cache_hits")
    if eq:
        out["external_hit_rate"] = (eh or 0.0) / eq
    for src in ("local_compute", "local_cache_hit", "external_kv_transfer"):
        v = _get(delta, f"vllm:prompt_tokens_by_source[{src}]")
        if v is None:
            v = delta.get(f"vllm:prompt_tokens_by_source_total[{src}]")
        if v is not None:
            out[f"prompt_tokens_{src}"] = v
    lookups = put("kvtier_lookups", "vllm:kvtier_lookups")
    hd = put("kvtier_hits_dram", "vllm:kvtier_lookup_hits_dram")
    hk = put("kvtier_hits_disk", "vllm:kvtier_lookup_hits_disk")
    put("kvtier_misses", "vllm:kvtier_lookup_misses")
    put("kvtier_lookup_pending", "vllm:kvtier_lookup_pending")
    put("kvtier_declined_loads", "vllm:kvtier_declined_loads")
    put("kvtier_stores_declined", "vllm:kvtier_stores_declined")
    for k in ("started", "used", "wasted"):
        put(f"kvtier_preload_{k}", f"vllm:kvtier_preload_{k}")
    if lookups:
        out["kvtier_hit_rate_dram"] = (hd or 0.0) / lookups
        out["kvtier_hit_rate_disk"] = (hk or 0.0) / lookups
    put("kvtier_bytes_read", "vllm:kvtier_bytes_read")
    put("kvtier_bytes_written", "vllm:kvtier_bytes_written")
    put("kvtier_chunks_loaded", "vllm:kvtier_chunks_loaded")
    put("kvtier_stores_completed", "vllm:kvtier_stores_completed")
    put("kvtier_promotions", "vllm:kvtier_promotions")
    put("offload_load_bytes", "vllm:kv_offload_load_bytes")
    put("offload_store_bytes", "vllm:kv_offload_store_bytes")
    return out


# --------------------------------------------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------------------------------------------

def summarize(values: list[float]) -> dict:
    s = bl.summarize_ttft(values)
    s["p99"] = bl.percentile(values, 99) if values else math.nan
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


def settle_metrics(server: bl.Server, builder: TokenBuilder) -> dict[str, float] | None:
    """vLLM collects connector stats while it steps and kvtier samples its engine once a second: poke, wait, poke."""
    probe = bl._words(8, random.Random(f"kvtier-replay-probe:{time.monotonic_ns()}"), builder.vocab_size)
    for _ in range(2):
        try:
            server.completion(probe, 1)
        except (OSError, RuntimeError):
            pass
        time.sleep(1.2)
    return server.metrics(None)


def replay_pass(server: bl.Server, reqs: list[TraceRequest], builder: TokenBuilder, a: argparse.Namespace,
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


def _ms(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1000:.1f}"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def format_report(result: dict) -> str:
    lines = [f"trace {result['trace']}: {result['requests']} requests (lines {result['first_line']}.."
             f"{result['last_line']}), {result['trace_span_s']:.1f} s of trace time x {result['time_scale']:g}; "
             f"blocks of {result['block_tokens']} tokens (trace {result['trace_block_tokens']} x length scale "
             f"{result['length_scale']:g}); prompt tokens mean {result['prompt_tokens_mean']:.0f}, "
             f"max {result['prompt_tokens_max']}; truncated {result['truncated']}",
             f"trace reuse: {_pct(result['ideal']['reusable_fraction'])} of prompt tokens are a repeated prefix "
             f"(unbounded cache)"]
    rows = []
    for p in result["passes"]:
        t, q = p["ttft"], p["queue_delay"]
        rows.append([p["name"], str(t["n"]), str(p["errors"]), _ms(t["mean"]), _ms(t["p50"]), _ms(t["p95"]),
                     _ms(t["p99"]), _ms(q["mean"]), f"{p['wall_s']:.1f}"])
    lines.append(bl.table(["pass", "ok", "errors", "TTFT mean ms", "p50", "p95", "p99", "queue ms", "wall s"],
                          rows))
    for p in result["passes"]:
        m = p.get("metrics")
        if not m:
            lines.append(f"{p['name']}: no metrics (could not read /metrics)")
            continue
        lines.append(
            f"{p['name']}: GPU prefix cache hit {_pct(m.get('gpu_prefix_hit_rate'))} of "
            f"{m.get('gpu_prefix_queries_tokens', 0):.0f} tokens; external (kvtier) hit "
            f"{_pct(m.get('external_hit_rate'))} ({m.get('external_hits_tokens', 0):.0f} tokens); kvtier chunk "
            f"lookups {m.get('kvtier_lookups', 0):.0f}: DRAM {_pct(m.get('kvtier_hit_rate_dram'))}, disk "
            f"{_pct(m.get('kvtier_hit_rate_disk'))}, misses {m.get('kvtier_misses', 0):.0f}; read "
            f"{bl._fmt_bytes(m.get('kvtier_bytes_read'))}, written {bl._fmt_bytes(m.get('kvtier_bytes_written'))}"
            + (f"; declined loads {m['kvtier_declined_loads']:.0f}" if m.get("kvtier_declined_loads") else "")
            + (f"; preloads started/used/wasted {m.get('kvtier_preload_started', 0):.0f}/"
               f"{m.get('kvtier_preload_used', 0):.0f}/{m.get('kvtier_preload_wasted', 0):.0f}"
               if m.get("kvtier_preload_started") else ""))
    return "\n".join(lines)


def run(a: argparse.Namespace, log=print) -> dict:
    reqs = load_trace(a.trace, a.start, a.max_requests, a.duration)
    if not reqs:
        raise SystemExit(f"kvtier replay: no requests in {a.trace} after the cut")
    builder = TokenBuilder(a.block_tokens, a.length_scale, a.seed, a.vocab_size, a.max_input_tokens)
    server = bl.Server(a.url, a.model)
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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvtier replay", description="Replay a Mooncake/Bailian JSONL trace against "
                                "vLLM; report TTFT, cache hit rates by tier and bytes moved.")
    p.add_argument("--trace", required=True, help="JSONL: timestamp (ms), input_length, output_length, hash_ids")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="tiny", help="served model name")
    p.add_argument("--block-tokens", type=int, default=512, help="tokens per hash id (Mooncake 512, Bailian 16)")
    p.add_argument("--length-scale", type=float, default=1.0,
                   help="scale prompt lengths and blocks by this factor (keeps the reuse structure)")
    p.add_argument("--max-input-tokens", type=int, default=None, help="truncate longer prompts")
    p.add_argument("--start", type=int, default=0, help="skip the first N requests of the trace")
    p.add_argument("--max-requests", type=int, default=None, help="replay at most N requests")
    p.add_argument("--duration", type=float, default=None, help="replay at most this many seconds of trace time")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply trace inter-arrival times (0.1: ten times faster; 0: as fast as possible)")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight at most")
    p.add_argument("--output-tokens", type=int, default=None, help="fixed output length (default: the trace's)")
    p.add_argument("--max-output-tokens", type=int, default=None, help="cap the trace's output lengths")
    p.add_argument("--passes", type=int, default=1, help="replay the cut this many times")
    p.add_argument("--reset-prefix-cache", action="store_true",
                   help="POST /reset_prefix_cache before each pass (needs VLLM_SERVER_DEV_MODE=1): later passes "
                        "find their prefixes in kvtier, not in vLLM's own cache")
    p.add_argument("--seed", type=int, default=0, help="token content seed")
    p.add_argument("--vocab-size", type=int, default=DEFAULTS["vocab"])
    p.add_argument("--json", dest="json_out", default=None, help="write the report and every request here")
    p.add_argument("--quiet", action="store_true", help="no per-request lines")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    if a.concurrency < 1:
        p.error("--concurrency must be >= 1")
    if a.time_scale < 0:
        p.error("--time-scale must be >= 0")
    if not a.length_scale > 0:
        p.error("--length-scale must be > 0")
    if a.passes < 1:
        p.error("--passes must be >= 1")

    def log(msg: str) -> None:
        print(msg, flush=True)

    result = run(a, log)
    log(format_report(result))
    if a.json_out:
        with open(a.json_out, "w") as fh:
            json.dump(result, fh, indent=1, default=lambda o: None)
            fh.write("\n")
    return 0 if all(p["errors"] == 0 for p in result["passes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
