"""The break-even model of `kvtier calibrate` (pure; unit-tested): interpolated f and g, the speedup map, break-even
fractions, min_load_tokens, the minimum bandwidth, the thresholds file (docs/break-even.md). Terms: the package
docstring (kvtier.tools.calibrate)."""

from __future__ import annotations

import bisect
import json
import math
import os
import statistics
from pathlib import Path

TIERS = ("dram", "disk")
NEVER = 2**31 - 1  # min_load_tokens when loading never pays in the measured range
FORMAT_VERSION = 1
PLOT_REQUIREMENTS = ("matplotlib==3.11.2 contourpy==1.3.3 cycler==0.12.1 fonttools==4.68.0 kiwisolver==1.5.1 "
                     "pyparsing==3.3.3 python-dateutil==4.0.0")


# --------------------------------------------------------------------------------------------------------------
# Interpolation and the frontier (pure; unit-tested)
# --------------------------------------------------------------------------------------------------------------

class Curve:
    """Piecewise-linear y(x) through sorted points, extended linearly beyond both ends (never below 0; beyond the
    last point never below the last value, so a noisy falling last segment does not run to 0)."""

    def __init__(self, points: list[tuple[float, float]]):
        pts = sorted((float(x), float(y)) for x, y in points)
        if not pts:
            raise ValueError("a curve needs at least one point")
        xs = [p[0] for p in pts]
        if len(set(xs)) != len(xs):
            raise ValueError("duplicate x in curve points")
        self.xs, self.ys = xs, [p[1] for p in pts]

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if len(xs) == 1:
            return ys[0]
        i = bisect.bisect_right(xs, x) - 1
        i = min(max(i, 0), len(xs) - 2)
        x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
        y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        if x > xs[-1]:
            y = max(y, ys[-1])
        return max(0.0, y)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def minimum(values: list[float]) -> float:
    return min(values) if values else math.nan


STATS = {"median": median, "min": minimum}


def recompute_curve(f_by_size: dict[int, float]) -> Curve:
    """f through (0, 0) and the measured (D, f(D))."""
    return Curve([(0, 0.0)] + [(d, t) for d, t in f_by_size.items() if d > 0])


def hit_curve(g_by_size: dict[int, float], t0: float | None) -> Curve:
    """g through (0, min(t0, g at the smallest size)) and the measured (P, g(P)); without t0, the first segment
    extended to 0 (floored at 0)."""
    pts = [(p, t) for p, t in g_by_size.items() if p > 0]
    if not pts:
        raise ValueError("no hit measurements")
    if t0 is None or math.isnan(t0):
        return Curve(pts)
    return Curve([(0, min(t0, min(pts)[1]))] + pts)


MAP_MODELS = ("paper", "suffix")


def speedup(f: Curve, g: Curve, d: float, p: float, kind: str = "paper") -> float:
    """Predicted TTFT speedup of loading a prefix of p*D tokens over recomputing the whole prompt (> 1: load wins).

    paper:  f(D) / (g(pD) + f((1-p)D))         (the paper's criterion g(P) + f(D - P) < f(D));
    suffix: f(D) / (g(pD) + f(D) - f(pD))      (the rest computed after the prefix, attending to it)."""
    p = min(1.0, max(0.0, p))
    if kind == "suffix":
        den = g(p * d) + max(0.0, f(d) - f(p * d))
    else:
        den = g(p * d) + f((1.0 - p) * d)
    return f(d) / den if den > 0 else math.inf


def break_even_fraction(f: Curve, g: Curve, d: float, steps: int = 400, kind: str = "paper") -> float | None:
    """Smallest prefix fraction p in (0, 1] with speedup >= 1 for a document of d tokens (None: never).

    Scans p on a grid, then bisects the first crossing."""
    prev = 0.0
    for i in range(1, steps + 1):
        p = i / steps
        if speedup(f, g, d, p, kind) >= 1.0:
            lo, hi = prev, p
            if lo == 0.0 and speedup(f, g, d, 1e-9, kind) >= 1.0:
                return 0.0
            for _ in range(40):
                mid = (lo + hi) / 2
                if speedup(f, g, d, mid, kind) >= 1.0:
                    hi = mid
                else:
                    lo = mid
            return hi
        prev = p
    return None


def min_load_tokens(f: Curve, g: Curve, max_tokens: int, tokens_per_chunk: int, step: int = 1) -> int:
    """Smallest P (rounded up to a whole chunk) with g(P) <= f(P), searched in (0, max_tokens]; NEVER if none."""
    p = step
    while p <= max_tokens:
        if g(p) <= f(p):
            return int(math.ceil(p / tokens_per_chunk) * tokens_per_chunk)
        p += step
    return NEVER


def measured_break_even(fractions: list[float], speedups: list[float | None]) -> float | None:
    """Break-even fraction from measured speedups at the given fractions: linear interpolation between the last
    fraction below 1 and the first at or above it; the smallest measured fraction if that one already pays;
    None if none pays."""
    pts = sorted((p, s) for p, s in zip(fractions, speedups) if s is not None and not math.isnan(s))
    for i, (p, s) in enumerate(pts):
        if s >= 1.0:
            if i == 0:
                return p
            p0, s0 = pts[i - 1]
            return p0 + (p - p0) * (1.0 - s0) / (s - s0) if s != s0 else p
    return None


# --------------------------------------------------------------------------------------------------------------
# Measurements -> model -> thresholds
# --------------------------------------------------------------------------------------------------------------

def summarize(samples: list[dict], stat: str = "median") -> dict:
    """Medians (or minima: stat="min") of the raw samples: recompute {D: f}, hit {tier: {(D, frac): h}}, t0."""
    if stat not in STATS:
        raise ValueError(f"stat must be one of {', '.join(STATS)}")
    median = STATS[stat]
    cold: dict[int, list[float]] = {}
    hits: dict[str, dict[tuple[int, float], list[float]]] = {}
    t0s: list[float] = []
    for s in samples:
        if s["kind"] == "cold":
            cold.setdefault(int(s["doc_tokens"]), []).append(s["ttft_s"])
        elif s["kind"] == "hit":
            key = (int(s["doc_tokens"]), round(float(s["fraction"]), 6))
            hits.setdefault(s["tier"], {}).setdefault(key, []).append(s["ttft_s"])
        elif s["kind"] == "overhead":
            t0s.append(s["ttft_s"])
    return {"f": {d: median(v) for d, v in sorted(cold.items())},
            "h": {t: {k: median(v) for k, v in sorted(m.items())} for t, m in hits.items()},
            "t0": median(t0s) if t0s else None}


def parse_bandwidths(text: str | None) -> dict[str, float]:
    """'disk=6.5e9,dram=5e10' (bytes/s; suffixes G/M accepted: 6.5G) -> {tier: bytes/s}."""
    out: dict[str, float] = {}
    if not text:
        return out
    for part in text.split(","):
        if not part.strip():
            continue
        name, _, val = part.partition("=")
        name, val = name.strip(), val.strip()
        if name not in TIERS:
            raise ValueError(f"unknown tier {name!r} in --tier-bandwidth (tiers: {', '.join(TIERS)})")
        mult = 1.0
        if val[-1:].upper() in ("G", "M", "K"):
            mult = {"G": 1e9, "M": 1e6, "K": 1e3}[val[-1].upper()]
            val = val[:-1]
        out[name] = float(val) * mult
        if out[name] <= 0:
            raise ValueError(f"--tier-bandwidth {name}: must be > 0")
    return out


def build_model(summary: dict, kv_bytes_per_token: int, tokens_per_chunk: int,
                bandwidths: dict[str, float] | None = None, map_model: str = "paper") -> dict:
    """The frontier model: per tier g(P) points, break-even fractions, min_load_tokens; bandwidth curves."""
    f_by = {d: v for d, v in summary["f"].items() if not math.isnan(v)}
    if not f_by:
        raise ValueError("no recompute (cold) measurements")
    sizes = sorted(f_by)
    f = recompute_curve(f_by)
    t0 = summary.get("t0")
    if t0 is not None and math.isnan(t0):
        t0 = None
    model = {"sizes": sizes, "f": [f_by[d] for d in sizes], "t0": t0, "tiers": {}, "map_model": map_model,
             "kv_bytes_per_token": kv_bytes_per_token, "tokens_per_chunk": tokens_per_chunk}
    tiers_g: dict[str, dict[int, float]] = {}
    sources: dict[str, str] = {}
    for tier, grid in summary["h"].items():
        g_by = {d: v for (d, frac), v in grid.items() if abs(frac - 1.0) < 1e-9 and not math.isnan(v)}
        if g_by:
            tiers_g[tier] = g_by
            sources[tier] = "measured"
    for tier, bw in (bandwidths or {}).items():
        if tier in tiers_g:
            continue
        over = t0 or 0.0
        tiers_g[tier] = {d: over + d * kv_bytes_per_token / bw for d in sizes}
        sources[tier] = f"modeled: t0 + KV bytes / {bw:.3g} B/s"
    kv = [d * kv_bytes_per_token for d in sizes]
    # the non-transfer part of a hit: t0, but never more than the fastest measured hit (t0 is one noisy probe)
    g_all = [v for grid in summary["h"].values() for v in grid.values() if not math.isnan(v)]
    overhead = min([t0] + g_all) if t0 is not None else 0.0
    model["hit_overhead_s"] = overhead
    budget = [(f_by[d] - overhead) for d in sizes]
    model["min_bandwidth_Bps"] = [k / b if b > 0 else None for k, b in zip(kv, budget)]
    model["kv_over_recompute_Bps"] = [k / f_by[d] if f_by[d] > 0 else None for k, d in zip(kv, sizes)]
    max_tokens = max(sizes)
    for tier in TIERS:
        if tier not in tiers_g:
            continue
        g = hit_curve(tiers_g[tier], t0)
        gs = tiers_g[tier]
        entry = {"source": sources[tier],
                 "hit_sizes": sorted(gs), "g": [gs[d] for d in sorted(gs)],
                 "break_even_fraction": [break_even_fraction(f, g, d, kind=map_model) for d in sizes],
                 "min_load_tokens": min_load_tokens(f, g, max_tokens, tokens_per_chunk,
                                                    step=max(1, tokens_per_chunk // 16))}
        exact = None
        for p in range(1, max_tokens + 1, max(1, tokens_per_chunk // 64)):
            if g(p) <= f(p):
                exact = p
                break
        entry["break_even_tokens"] = exact
        entry["load_rate_Bps"] = [d * kv_bytes_per_token / gs[d] if gs[d] > 0 else None for d in sorted(gs)]
        grid = summary["h"].get(tier, {})
        if grid:
            fracs = sorted({fr for (_, fr) in grid})
            meas = []
            for d in sizes:
                row = []
                for fr in fracs:
                    h = grid.get((d, fr))
                    row.append(f_by[d] / h if h and not math.isnan(h) and h > 0 else None)
                meas.append(row)
            entry["measured_fractions"] = fracs
            entry["measured_speedup"] = meas
            entry["measured_break_even_fraction"] = [measured_break_even(fracs, row) for row in meas]
            entry["measured_hit_ttft_s"] = [[grid.get((d, fr)) for fr in fracs] for d in sizes]
        model["tiers"][tier] = entry
    return model


def thresholds(model: dict, model_name: str) -> dict:
    """The thresholds file (docs/break-even.md, format version 1). A tier without data takes the other tier's
    value (noted in frontier.estimated); with no tier at all, both are NEVER."""
    tiers = model["tiers"]
    vals = {t: tiers[t]["min_load_tokens"] for t in TIERS if t in tiers}
    estimated = {}
    for t in TIERS:
        if t not in vals:
            other = [v for v in vals.values()]
            vals[t] = max(other) if other else NEVER
            estimated[t] = "no data for this tier: copied from " + (", ".join(vals) if other else "nothing")
    measured = [v for t, v in vals.items() if t not in estimated] or list(vals.values())
    frontier = {k: v for k, v in model.items() if k != "tiers"}
    frontier["tiers"] = tiers
    if estimated:
        frontier["estimated"] = estimated
    frontier["generated_by"] = "kvtier calibrate"
    return {"version": FORMAT_VERSION, "model": model_name, "tokens_per_chunk": int(model["tokens_per_chunk"]),
            "tiers": {t: {"min_load_tokens": int(vals[t])} for t in TIERS},
            "store_min_tokens": int(min(measured)),
            "frontier": frontier}


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1, default=lambda o: None, allow_nan=False)
        fh.write("\n")
    os.replace(tmp, path)


def json_safe(obj):
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj
