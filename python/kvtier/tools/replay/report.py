"""The replay's report: deltas of vLLM's and kvtier's counters over a pass, rates derived from them, and the text
report of a run."""

from __future__ import annotations

import math
import re

from kvtier.tools.longdoc.report import fmt_bytes, table

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
    lines.append(table(["pass", "ok", "errors", "TTFT mean ms", "p50", "p95", "p99", "queue ms", "wall s"],
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
            f"{fmt_bytes(m.get('kvtier_bytes_read'))}, written {fmt_bytes(m.get('kvtier_bytes_written'))}"
            + (f"; declined loads {m['kvtier_declined_loads']:.0f}" if m.get("kvtier_declined_loads") else "")
            + (f"; preloads started/used/wasted {m.get('kvtier_preload_started', 0):.0f}/"
               f"{m.get('kvtier_preload_used', 0):.0f}/{m.get('kvtier_preload_wasted', 0):.0f}"
               if m.get("kvtier_preload_started") else ""))
    return "\n".join(lines)
