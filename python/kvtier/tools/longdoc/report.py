"""Tables of the long-document benchmark: one run's phases, and a summary of several runs (the demo's table)."""

from __future__ import annotations

import math

from kvtier.tools.client import bytes_read
from kvtier.tools.longdoc.prompts import summarize_ttft

def fmt_ms(v: float) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1000:.1f}"


def fmt_bytes(v: float | None) -> str:
    if v is None:
        return "-"
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= div:
            return f"{v / div:.1f} {unit}"
    return f"{v:.0f} B"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


def phase_table(phases: list) -> str:
    """One row per PhaseResult."""
    rows = []
    for p in phases:
        rows.append([p.name, str(p.ttft["n"]), fmt_ms(p.ttft["mean"]), fmt_ms(p.ttft["p50"]),
                     fmt_ms(p.ttft["p95"]), f"{p.wall_s:.1f}"])
    return table(["phase", "requests", "TTFT mean ms", "p50 ms", "p95 ms", "wall s"], rows)


def merge_runs(results: list[dict], phase: str = "query") -> list[dict]:
    """Runs with the same label as one result, in order of first appearance: their requests pooled (TTFT statistics
    recomputed from them) and their metric deltas added. A label with one run is returned as it is."""
    groups: dict[str, list[dict]] = {}
    for r in results:
        groups.setdefault(r.get("label") or "?", []).append(r)
    out = []
    for label, runs in groups.items():
        phases = [r["phases"][phase] for r in runs if r["phases"].get(phase)]
        if len(runs) == 1 or not phases:
            out.append(runs[0])
            continue
        requests = [q for p in phases for q in (p.get("requests") or [])]
        metrics: dict[str, float] = {}
        for p in phases:
            for k, v in (p.get("metrics") or {}).items():
                metrics[k] = metrics.get(k, 0.0) + v
        merged = {"requests": requests, "metrics": metrics,
                  "ttft": summarize_ttft([q["ttft_s"] for q in requests])}
        out.append(dict(runs[0], phases={phase: merged}))
    return out


def summary_rows(results: list[dict], phase: str = "query", baseline: str | None = None) -> list[list[str]]:
    """One row per result; the speedup is the ratio of median TTFTs (robust to the odd slow request on a shared
    machine)."""
    base = None
    for r in results:
        if baseline is None or r.get("label") == baseline:
            p = r["phases"].get(phase)
            if p:
                base = p["ttft"]["p50"]
                break
    rows = []
    for r in results:
        p = r["phases"].get(phase)
        if not p:
            continue
        t = p["ttft"]
        speedup = "-" if not base or not t["p50"] else f"{base / t['p50']:.2f}x"
        m = p.get("metrics") or {}
        hits = m.get("vllm:external_prefix_cache_hits_total", m.get("vllm:external_prefix_cache_hits"))
        rows.append([r.get("label") or "?", str(t["n"]), fmt_ms(t["mean"]), fmt_ms(t["p50"]), fmt_ms(t["p95"]),
                     speedup, "-" if hits is None else f"{hits:.0f}", fmt_bytes(bytes_read(m))])
    return rows


SUMMARY_HEADERS = ["config", "queries", "TTFT mean ms", "p50 ms", "p95 ms", "speedup (p50)", "ext hit tokens",
                   "kvtier bytes read"]
