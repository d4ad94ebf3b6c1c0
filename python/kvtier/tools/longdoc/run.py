"""The long-document benchmark's phases against a server (the I/O): warm-up, then query, with the metric deltas of
each phase."""

from __future__ import annotations

import argparse
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from kvtier.tiny_model import BOS_ID
from kvtier.tools.client import ApiClient, metric_deltas, metric_gauges
from kvtier.tools.longdoc.prompts import FIRST_WORD_ID, PromptSpec, query_order, query_prompt, summarize_ttft, \
    warmup_prompt
from kvtier.tools.longdoc.report import phase_table

@dataclass
class PhaseResult:
    name: str
    requests: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    ttft: dict = field(default_factory=dict)
    metrics: dict | None = None
    gauges: dict | None = None
    ttft_by_class: dict | None = None  # {"cached": ..., "uncached": ...} where the warm-up left documents out


def run_phase(server: ApiClient, name: str, prompts: list[tuple[int, int, list[int]]], concurrency: int,
              max_tokens: int, metrics_url: str | None, log=print, metrics_flush_s: float = 0.0,
              warm: set[int] | None = None, cached_priority: int | None = None) -> PhaseResult:
    """Sends the prompts, `concurrency` in flight; warm: the documents the warm-up sent, where it left some out (each
    request is marked cached or not, and TTFT is summarized per class too); cached_priority: vLLM's request priority
    of the cached ones (the others keep the default 0)."""
    before = server.metrics(metrics_url)
    res = PhaseResult(name)
    lock = threading.Lock()

    def one(item):
        doc, rep, prompt = item
        cached = warm is not None and doc in warm
        r = server.completion(prompt, max_tokens, priority=cached_priority if cached else None)
        r.update(doc=doc, rep=rep, prompt_len=len(prompt))
        if warm is not None:
            r["cached"] = cached
        if r["prompt_tokens"] is not None and r["prompt_tokens"] != len(prompt):
            raise RuntimeError(f"server counted {r['prompt_tokens']} prompt tokens, sent {len(prompt)}")
        with lock:
            res.requests.append(r)
            log(f"  {name} doc={doc} rep={rep} tokens={len(prompt)} ttft={r['ttft_s'] * 1000:.1f} ms")
        return r

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, prompts))
    res.wall_s = time.perf_counter() - t0
    res.ttft = summarize_ttft([r["ttft_s"] for r in res.requests])
    if warm is not None:
        res.ttft_by_class = {cls: summarize_ttft([r["ttft_s"] for r in res.requests if r["cached"] == (cls == "cached")])
                             for cls in ("cached", "uncached")}
    if metrics_flush_s > 0:
        # Connector counters reach /metrics only with a scheduler step, at most once a second (kvtier's get_stats):
        # wait, then make one step happen with a 2-token request, so the phase's last loads are counted.
        time.sleep(metrics_flush_s)
        server.completion([BOS_ID, FIRST_WORD_ID], 1)
    after = server.metrics(metrics_url)
    if before is not None and after is not None:
        res.metrics = metric_deltas(before, after)
    if after is not None:
        res.gauges = metric_gauges(after)
    return res


def run(a: argparse.Namespace, log=print) -> dict:
    spec = PromptSpec(doc_tokens=a.doc_tokens, num_docs=a.num_docs, query_tokens=a.query_tokens,
                      reuse_fraction=a.reuse_fraction, repeat_count=a.repeat_count, repeat_mode=a.repeat_mode,
                      seed=a.seed, salt=a.salt, vocab_size=a.vocab_size)
    server = ApiClient(a.url, a.model)
    metrics_url = a.metrics_url
    phases: list[PhaseResult] = []
    if a.reset_prefix_cache:
        server.reset_prefix_cache()
    docs = set(range(spec.num_docs)) if a.docs is None else set(a.docs)
    warm_arg = getattr(a, "warm_docs", None)
    warm = docs if warm_arg is None else docs & set(warm_arg)
    by_class = warm if warm != docs else None  # a mix of cached and uncached documents in the query
    if a.phase in ("both", "warmup"):
        prompts = [(d, 0, warmup_prompt(spec, d)) for d in range(spec.num_docs) if d in warm]
        phases.append(run_phase(server, "warmup", prompts, a.concurrency, a.max_tokens, metrics_url, log,
                                a.metrics_flush_s))
    if a.phase == "both" and a.reset_prefix_cache:
        time.sleep(a.settle_s)
        if not server.reset_prefix_cache():
            log("warning: /reset_prefix_cache kept failing; query phase may hit vLLM's own prefix cache")
    elif a.phase == "both" and a.settle_s:
        time.sleep(a.settle_s)
    if a.phase in ("both", "query"):
        prompts = [(d, k, query_prompt(spec, d, k)) for d, k in query_order(spec) if d in docs]
        phases.append(run_phase(server, "query", prompts, a.concurrency, a.max_tokens, metrics_url, log,
                                a.metrics_flush_s, by_class, getattr(a, "cached_priority", None)))
    result = {"label": a.label, "url": a.url, "model": a.model, "spec": asdict(spec),
              "reuse_tokens": spec.reuse_tokens, "concurrency": a.concurrency, "max_tokens": a.max_tokens,
              "cached_priority": getattr(a, "cached_priority", None),
              "phases": {p.name: asdict(p) for p in phases}}
    log(phase_table(phases))
    for p in phases:
        for cls, t in (p.ttft_by_class or {}).items():
            if t["n"]:
                log(f"{p.name} {cls}: {t['n']} requests, TTFT mean {t['mean'] * 1000:.1f} ms, "
                    f"p50 {t['p50'] * 1000:.1f} ms, p95 {t['p95'] * 1000:.1f} ms")
    for p in phases:
        if p.metrics is None:
            log(f"{p.name}: no metrics (could not read /metrics)")
            continue
        shown = {k: v for k, v in p.metrics.items() if v}
        if shown:
            log(f"{p.name} metric deltas:")
            for k, v in shown.items():
                log(f"  {k} {v:g}")
        else:
            log(f"{p.name}: no prefix-cache/offload/kvtier counter changed")
        if p.gauges:
            log(f"{p.name} gauges at the end: " + ", ".join(f"{k}={v:g}" for k, v in p.gauges.items()))
    return result
