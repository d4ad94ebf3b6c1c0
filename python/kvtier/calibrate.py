"""`kvtier calibrate`: measure the break-even frontier of external KV caching on this machine and model (SPEC G2).

    kvtier calibrate --serve MODEL_DIR --out DIR [--sizes 512,1024,2048,4096] [--fractions 0.25,0.5,0.75,1]
    kvtier calibrate --url http://127.0.0.1:8000 --model NAME --out DIR [--tiers dram] [--flush-tokens N]
    kvtier calibrate --offline-recompute MODEL_DIR --tier-bandwidth disk=6.5e9,dram=50e9 --out DIR
    kvtier calibrate --replot DIR/measurements.json --out DIR

Terms (paper, section 4.1): D document size in tokens, P cached prefix in tokens, f(D) cold TTFT (full compute and
store), g(P) cache-hit TTFT of a fully cached P-token prompt, per source tier. Caching pays when
g(P) + f(D - P) < f(D).

What is measured against vLLM with kvtier (streamed TTFT, greedy, `--max-tokens` output tokens):

* f(D): unique D-token prompts (BOS + pseudo-random words of the tiny model's vocabulary), each sent once.
* DRAM tier: right after a document was computed (and stored by kvtier), vLLM's own prefix cache is dropped
  (POST /reset_prefix_cache, server started with VLLM_SERVER_DEV_MODE=1) and a D-token prompt whose first
  round(fraction * D) tokens are the document's is sent: the prefix is loaded from kvtier's DRAM tier.
* disk tier: one more document per (D, fraction, repetition), stored on the first server; the server is then
  restarted on the same root (a cold DRAM tier), and each query loads its prefix from disk. Against a running server
  (--url) there is no restart: --flush-tokens sends that many tokens of filler prompts after the stores to push the
  documents out of the DRAM tier (use more than the pool holds).
* the per-request overhead t0: median TTFT of a 16-token prompt.

Every value is the median of --reps repetitions (--stat min: the minimum). g(P) is the full-hit TTFT (fraction 1); the other fractions are
measured too and drawn on the map to check the model. The model is interpolated piecewise linearly: f through
(0, 0) and the measured sizes, g through (0, min(t0, g(smallest))) and the measured sizes, both extended linearly
past the largest size. From it:

* the speedup map s(D, p) = f(D) / (g(pD) + f((1 - p)D)) and, per document size, the break-even fraction (the
  smallest p with s >= 1), per tier;
* min_load_tokens per tier for the gate: the smallest P with g(P) <= f(P), rounded up to a whole chunk. A load of
  P tokens saves at least f(P) of compute whatever follows the prefix (causal attention, convex f), so loads at
  or above it never lose under the model; 2**31 - 1 when no measured size pays (the gate then always recomputes);
* the minimum storage bandwidth per document size: KV bytes of D tokens / (f(D) - t0) (the paper's budget
  f(D) - (g(D) - t_copy(D)), with the non-transfer part of a hit taken as t0, capped at the fastest measured
  hit), next to KV bytes / f(D) and each tier's achieved rate KV bytes / g(D) (a lower bound: g includes the
  request's own overhead).

Outputs in --out: thresholds.json (format: docs/break-even.md), measurements.json (raw samples and the model),
speedup_map.png, min_bandwidth.png. --offline-recompute measures f(D) with transformers instead (a forward pass
of D tokens, as shared/baselines/h200_baseline.py does); g then comes from a server or from --tier-bandwidth
(g(P) = t0 + KV bytes / bandwidth). This module imports neither vLLM nor torch unless asked to.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import random
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from kvtier import bench_longdoc as bl
from kvtier.tiny_model import BOS_ID, DEFAULTS

TIERS = ("dram", "disk")
NEVER = 2**31 - 1  # min_load_tokens when loading never pays in the measured range
FORMAT_VERSION = 1
PLOT_REQUIREMENTS = ("matplotlib==3.11.2 contourpy==1.3.3 cycler==0.12.1 fonttools==4.68.0 kiwisolver==1.5.1 "
                     "pyparsing==3.3.3 python-dateutil==4.0.0")
DEFAULT_SERVE_ARGS = ("--dtype bfloat16 --enforce-eager --block-size 16 --max-num-seqs 4 "
                      "--kv-cache-memory-bytes 1073741824 --enable-prefix-caching --seed 0")


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


def _json_safe(obj):
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


# --------------------------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------------------------

def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("kvtier calibrate: plots need matplotlib: "
                         f"{sys.executable} -m pip install {PLOT_REQUIREMENTS}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _size_label(d: float) -> str:
    d = int(round(d))
    return f"{d // 1024}k" if d >= 1024 and d % 1024 == 0 else str(d)


def plot_speedup_map(model: dict, path: Path, title: str = "") -> Path:
    """One panel per tier: log2 speedup over (document size, prefix fraction), the break-even line (speedup 1),
    measured grid points annotated with their measured speedup."""
    plt = _pyplot()
    from matplotlib.colors import TwoSlopeNorm

    tiers = [t for t in TIERS if t in model["tiers"]]
    if not tiers:
        raise ValueError("no tier to plot")
    sizes = model["sizes"]
    f = recompute_curve(dict(zip(sizes, model["f"])))
    lo, hi = math.log2(min(sizes)) - 0.3, math.log2(max(sizes)) + 0.3
    nx, ny = 96, 80
    xs = [2 ** (lo + (hi - lo) * i / (nx - 1)) for i in range(nx)]
    ys = [(j + 0.5) / ny * 1.06 for j in range(ny)]
    fig, axes = plt.subplots(1, len(tiers), figsize=(5.2 * len(tiers), 4.2), squeeze=False)
    vmax = 0.0
    grids = {}
    for tier in tiers:
        e = model["tiers"][tier]
        g = hit_curve(dict(zip(e["hit_sizes"], e["g"])), model.get("t0"))
        kind = model.get("map_model", "paper")
        z = [[math.log2(min(1e6, max(1e-6, speedup(f, g, x, y, kind)))) for x in xs] for y in ys]
        grids[tier] = (g, z)
        vmax = max([vmax] + [abs(v) for row in z for v in row if math.isfinite(v)])
    vmax = min(max(vmax, 0.1), 8.0)
    norm = TwoSlopeNorm(vmin=-vmax, vcenter=0.0, vmax=vmax)
    for ax, tier in zip(axes[0], tiers):
        e = model["tiers"][tier]
        g, z = grids[tier]
        mesh = ax.pcolormesh(xs, ys, z, cmap="RdBu", norm=norm, shading="auto")
        cs = ax.contour(xs, ys, z, levels=[0.0], colors="k", linewidths=2)
        if cs.allsegs and any(len(s) for s in cs.allsegs[0]):
            ax.plot([], [], "k-", lw=2, label=f"break-even ({model.get('map_model', 'paper')} model)")
        mf = e.get("measured_fractions")
        if mf:
            for d, row in zip(sizes, e["measured_speedup"]):
                for fr, s in zip(mf, row):
                    if s is None:
                        continue
                    ax.plot([d], [fr], marker="o", ms=5, mfc="white" if s >= 1 else "black", mec="k")
                    ax.annotate(f"{s:.2f}", (d, fr), textcoords="offset points", xytext=(4, 4), fontsize=7)
            ax.plot([], [], "o", mfc="white", mec="k", label="measured, faster")
            ax.plot([], [], "o", mfc="black", mec="k", label="measured, slower")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([_size_label(d) for d in sizes])
        ax.minorticks_off()
        ax.set_xlim(xs[0], xs[-1])
        ax.set_ylim(0, 1.06)
        ax.set_xlabel("document size D (tokens)")
        ax.set_ylabel("cached prefix fraction P/D")
        mlt = e["min_load_tokens"]
        ax.set_title(f"{tier}: load beats recompute above the line\nmin_load_tokens = "
                     f"{'never' if mlt == NEVER else mlt}", fontsize=10)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower left", fontsize=7, framealpha=0.8)
        fig.colorbar(mesh, ax=ax, label="log2 TTFT speedup vs recompute")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_min_bandwidth(model: dict, path: Path, title: str = "",
                       reference: dict[str, float] | None = None) -> Path:
    """Minimum storage bandwidth for a fully cached prompt to break even, per document size; tiers' achieved
    load rates; optional reference lines (e.g. a drive's rated bandwidth)."""
    plt = _pyplot()
    sizes = model["sizes"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    gb = 1e9

    def line(vals, **kw):
        pts = [(d, v / gb) for d, v in zip(sizes, vals) if v]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], **kw)

    line(model["min_bandwidth_Bps"], marker="o", color="C3", lw=2,
         label="min. bandwidth for break-even: KV(D) / (f(D) - t0)")
    line(model["kv_over_recompute_Bps"], marker=".", color="C3", ls=":", label="KV(D) / f(D) (no overhead)")
    for i, tier in enumerate(t for t in TIERS if t in model["tiers"]):
        e = model["tiers"][tier]
        pts = [(d, r / gb) for d, r in zip(e["hit_sizes"], e["load_rate_Bps"]) if r]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="s", ls="--", color=f"C{i}",
                    label=f"{tier}: achieved KV(D) / g(D) ({e['source'].split(':')[0]})")
    for j, (name, bw) in enumerate((reference or {}).items()):
        ax.axhline(bw / gb, color="gray", ls=(0, (4, 2 + j)), lw=1)
        ax.annotate(f"{name} ({bw / gb:.3g} GB/s)", (sizes[0], bw / gb), textcoords="offset points",
                    xytext=(2, 3), fontsize=7, color="gray")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([_size_label(d) for d in sizes])
    ax.minorticks_off()
    ax.set_xlabel("document size D (tokens)")
    ax.set_ylabel("GB/s")
    ax.set_title(title or "KV cache break-even bandwidth", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------------------------------

class Progress:
    """tqdm when installed, else a one-line text bar on stderr."""

    def __init__(self, total: int, desc: str = "calibrate", enabled: bool = True):
        self.total, self.n, self.desc, self.enabled = total, 0, desc, enabled
        self._bar = None
        self._t0 = time.monotonic()
        if enabled:
            try:
                from tqdm import tqdm
                self._bar = tqdm(total=total, desc=desc, unit="req", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                pass

    def update(self, note: str = "") -> None:
        self.n += 1
        if not self.enabled:
            return
        if self._bar is not None:
            if note:
                self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(1)
            return
        width = 30
        done = int(width * self.n / max(self.total, 1))
        el = time.monotonic() - self._t0
        eta = el / self.n * (self.total - self.n) if self.n else 0
        sys.stderr.write(f"\r{self.desc} [{'#' * done}{'.' * (width - done)}] {self.n}/{self.total} "
                         f"{el:.0f}s<{eta:.0f}s {note:<30.30}")
        sys.stderr.flush()

    def write(self, msg: str) -> None:
        if self._bar is not None:
            self._bar.write(msg, file=sys.stderr)
        else:
            sys.stderr.write(("\n" if self.enabled and self.n else "") + msg + "\n")
            sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled:
            sys.stderr.write("\n")


# --------------------------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------------------------

_KIND_DOC, _KIND_TAIL, _KIND_FILL, _KIND_PROBE = 11, 12, 13, 14
_TIER_CODE = {"cold": 0, "dram": 1, "disk": 2, "warm": 3, "overhead": 4, "flush": 5}


def _rng(*key) -> random.Random:
    return random.Random("kvtier-calibrate:" + ":".join(str(k) for k in key))


def doc_prompt(seed: int, tier: str, d: int, frac_idx: int, rep: int, vocab: int) -> list[int]:
    """A document of d tokens (BOS + words), unique for its (seed, tier, d, fraction index, rep)."""
    return [BOS_ID] + bl._words(d - 1, _rng(seed, _KIND_DOC, _TIER_CODE[tier], d, frac_idx, rep), vocab)


def hit_prompt(doc: list[int], prefix: int, seed: int, salt: int, vocab: int) -> list[int]:
    """doc[:prefix] followed by fresh words up to len(doc); shares exactly `prefix` leading tokens with doc."""
    prefix = max(1, min(len(doc), prefix))
    if prefix == len(doc):
        return list(doc)
    tail = bl._words(len(doc) - prefix, _rng(seed, _KIND_TAIL, salt, len(doc), prefix), vocab)
    tail[0] = bl._differ(tail[0], doc[prefix], vocab)
    return doc[:prefix] + tail


def plan_counts(sizes: list[int], fractions: list[float], reps: int, tiers: list[str]) -> int:
    n = len(sizes) * reps  # cold documents of the dram sweep (or plain f samples)
    if "dram" in tiers:
        n += len(sizes) * reps * len(fractions)
    if "disk" in tiers:
        n += 2 * len(sizes) * reps * len(fractions)
    return n


# --------------------------------------------------------------------------------------------------------------
# vLLM servers
# --------------------------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_kv_bytes_per_token(model_dir: str | None, dtype_bytes: int = 2) -> int | None:
    """KV bytes per token from a model directory: kvtier_tiny_model.json, else config.json
    (2 * layers * kv_heads * head_dim * dtype_bytes)."""
    if not model_dir:
        return None
    p = Path(model_dir)
    try:
        info = json.loads((p / "kvtier_tiny_model.json").read_text())
        return int(info["kv_bytes_per_token_bf16"])
    except (OSError, KeyError, ValueError):
        pass
    try:
        c = json.loads((p / "config.json").read_text())
        c = c.get("text_config", c)
        layers = c["num_hidden_layers"]
        heads = c.get("num_attention_heads")
        kvh = c.get("num_key_value_heads") or heads
        hd = c.get("head_dim") or c["hidden_size"] // heads
        return int(2 * layers * kvh * hd * dtype_bytes)
    except (OSError, KeyError, ValueError, TypeError, ZeroDivisionError):
        return None


def _name_code(name: str) -> int:
    return sum(ord(c) for c in name)


def _server_pythonpath(env: dict) -> None:
    """Drop this source tree from the server's PYTHONPATH when it has no built extension there (running the
    client from python/ must not make vLLM import an unbuilt kvtier)."""
    here = Path(__file__).resolve().parent
    if any(here.glob("_kvtier*.so")) or not env.get("PYTHONPATH"):
        return
    keep = [x for x in env["PYTHONPATH"].split(os.pathsep) if x and Path(x).resolve() != here.parent]
    if keep:
        env["PYTHONPATH"] = os.pathsep.join(keep)
    else:
        env.pop("PYTHONPATH")


class VllmServer:
    """`python -m vllm.entrypoints.openai.api_server` with kvtier, in its own process group, always killed."""

    def __init__(self, python: str, model_dir: str, served_name: str, root: Path, log_path: Path,
                 chunk_tokens: int, pool_bytes: str, max_model_len: int, serve_args: str,
                 extra_config: dict | None = None, start_timeout_s: float = 600):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        ec = {"spec_name": "KVTierSpec", "spec_module_path": "kvtier.vllm", "kvtier_root": str(root),
              "block_size": chunk_tokens, "kvtier_pool_bytes": pool_bytes, "kvtier_stats_interval_s": 1}
        ec.update(extra_config or {})
        tc = json.dumps({"kv_connector": "KVTierConnector", "kv_connector_module_path": "kvtier.vllm",
                         "kv_role": "kv_both", "kv_connector_extra_config": ec})
        args = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(self.port),
                "--max-model-len", str(max_model_len), *shlex.split(serve_args), "--kv-transfer-config", tc]
        env = dict(os.environ)
        env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                    "VLLM_SERVER_DEV_MODE": "1"})
        env.setdefault("PYTHONHASHSEED", "0")
        _server_pythonpath(env)
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        tcmalloc = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
        if os.path.exists(tcmalloc) and "tcmalloc" not in env.get("LD_PRELOAD", ""):
            env["LD_PRELOAD"] = tcmalloc + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True)
        self.start_timeout_s = start_timeout_s

    def wait_healthy(self) -> "VllmServer":
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} during startup; log: {self.log_path}\n"
                                   + self.log_tail())
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(1)
        raise TimeoutError(f"vLLM /health not ready after {self.start_timeout_s}s; log: {self.log_path}")

    def log_tail(self, n: int = 40) -> str:
        try:
            return "".join(self.log_path.read_text(errors="replace").splitlines(True)[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=30)
        else:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._log.close()


# --------------------------------------------------------------------------------------------------------------
# The sweep against vLLM
# --------------------------------------------------------------------------------------------------------------

class Sweep:
    def __init__(self, a: argparse.Namespace, progress: Progress, log):
        self.a, self.progress, self.log = a, progress, log
        self.samples: list[dict] = []
        self.phases: dict[str, dict] = {}

    def _send(self, server: bl.Server, prompt: list[int]) -> float:
        r = server.completion(prompt, self.a.max_tokens)
        if r["prompt_tokens"] is not None and r["prompt_tokens"] != len(prompt):
            raise RuntimeError(f"server counted {r['prompt_tokens']} prompt tokens, sent {len(prompt)}")
        return r["ttft_s"]

    def _ext_hits(self, server: bl.Server) -> float | None:
        m = server.metrics(None)
        if m is None:
            return None
        return sum(v for k, v in m.items() if k.split("{")[0] in ("vllm:external_prefix_cache_hits_total",
                                                                     "vllm:external_prefix_cache_hits"))

    def record(self, kind: str, tier: str | None, d: int, frac: float | None, prefix: int | None, ttft: float,
               rep: int, server_name: str, ext: float | None = None) -> None:
        s = {"kind": kind, "tier": tier, "doc_tokens": d, "fraction": frac, "prefix_tokens": prefix,
             "ttft_s": ttft, "rep": rep, "server": server_name}
        if ext is not None:
            s["external_hit_tokens"] = ext
        self.samples.append(s)

    def prewarm(self, server: bl.Server, name: str) -> None:
        """Throw-away requests (first requests after startup are slow), then the overhead t0 samples."""
        a = self.a
        for i, d in enumerate(a.sizes):
            self._send(server, doc_prompt(a.seed + 7919 * (1 + a.salt), "warm", d, i, _name_code(name), a.vocab_size))
        for i in range(max(3, a.reps)):
            p = doc_prompt(a.seed + 7919 * (1 + a.salt), "overhead", 16, i, _name_code(name), a.vocab_size)
            self.record("overhead", None, 16, None, None, self._send(server, p), i, name)

    def reset(self, server: bl.Server) -> None:
        if not server.reset_prefix_cache():
            self.progress.write("warning: /reset_prefix_cache kept failing; a hit may come from vLLM's own cache")

    def settle(self, server: bl.Server) -> None:
        """Let the previous request's stores reach kvtier: vLLM submits a step's stores at the next step."""
        self._send(server, doc_prompt(self.a.seed, "overhead", 16, 999, int(time.monotonic() * 1000), self.a.vocab_size))
        time.sleep(self.a.settle_s)

    def _bytes_written(self, server: bl.Server) -> float | None:
        m = server.metrics(None)
        if m is None:
            return None
        return sum(v for k, v in m.items() if k.split("{")[0].startswith("vllm:kvtier_bytes_written"))

    def quiesce(self, server: bl.Server) -> None:
        """Before a measured request: wait until kvtier's writes of the previous requests are done (its
        bytes_written counter stops moving), so that no file write competes with the measurement. Each check
        pokes the server with a 16-token request (counters move only while vLLM steps) and waits > 1 s (kvtier
        samples its engine once a second)."""
        if not self.a.quiesce:
            return
        last = self._bytes_written(server)
        deadline = time.monotonic() + self.a.quiesce_timeout_s
        while time.monotonic() < deadline:
            self._send(server, doc_prompt(self.a.seed, "overhead", 16, 998, time.monotonic_ns(), self.a.vocab_size))
            time.sleep(max(self.a.settle_s, 1.1))
            w = self._bytes_written(server)
            if w is None or w == last:
                return
            last = w

    def hit(self, server: bl.Server, tier: str, doc: list[int], fi: int, frac: float, rep: int, name: str) -> None:
        a = self.a
        d = len(doc)
        prefix = max(1, min(d, round(frac * d)))
        self.quiesce(server)
        self.reset(server)
        before = self._ext_hits(server)
        t = self._send(server, hit_prompt(doc, prefix, a.seed, a.salt * 100 + rep, a.vocab_size))
        after = self._ext_hits(server)
        ext = after - before if before is not None and after is not None else None
        self.record("hit", tier, d, frac, prefix, t, rep, name, ext)
        self.progress.update(f"{tier} D={d} p={frac:g} {t * 1000:.0f}ms")

    def cold(self, server: bl.Server, tier: str, d: int, fi: int, rep: int, name: str) -> list[int]:
        a = self.a
        doc = doc_prompt(a.seed + 7919 * a.salt, tier, d, fi, rep, a.vocab_size)
        self.quiesce(server)
        t = self._send(server, doc)
        self.record("cold", None, d, None, None, t, rep, name)
        self.progress.update(f"cold D={d} {t * 1000:.0f}ms")
        return doc

    def wait_stores(self, server: bl.Server, timeout_s: float = 300) -> None:
        """Until kvtier's bytes_written stops growing (stores reach the disk asynchronously)."""
        last, stable_since = None, time.monotonic()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.settle(server)
            m = server.metrics(None) or {}
            w = sum(v for k, v in m.items() if k.split("{")[0].startswith("vllm:kvtier_bytes_written"))
            if w != last:
                last, stable_since = w, time.monotonic()
            elif time.monotonic() - stable_since >= 3:
                return
        self.progress.write(f"warning: kvtier still writing after {timeout_s}s")

    def phase_metrics(self, name: str, server: bl.Server, before: dict | None) -> None:
        self.settle(server)
        time.sleep(1.2)
        self.settle(server)
        after = server.metrics(None)
        if before is not None and after is not None:
            d = bl.metric_deltas(before, after)
            self.phases[name] = {k: v for k, v in d.items() if v}

    def run_server_a(self, server: bl.Server, name: str) -> list[tuple[int, int, float, int, list[int]]]:
        """Cold f(D) + DRAM hits; stores the disk documents. Returns the disk queries to run later."""
        a = self.a
        self.prewarm(server, name)
        before = server.metrics(None)
        disk_docs = []
        for rep in range(a.reps):
            order = list(a.sizes)
            _rng(a.seed, "order", rep).shuffle(order)
            for d in order:
                doc = self.cold(server, "dram", d, 0, rep, name)
                if "dram" in a.tiers:
                    if not a.quiesce:
                        self.settle(server)
                    for fi, frac in enumerate(a.fractions):
                        self.hit(server, "dram", doc, fi, frac, rep, name)
                if "disk" in a.tiers:
                    for fi, frac in enumerate(a.fractions):
                        ddoc = self.cold(server, "disk", d, fi, rep, name)
                        disk_docs.append((d, fi, frac, rep, ddoc))
        self.phase_metrics("A", server, before)
        return disk_docs

    def run_disk(self, server: bl.Server, name: str, disk_docs, prewarm: bool) -> None:
        a = self.a
        if prewarm:
            self.prewarm(server, name)
        before = server.metrics(None)
        order = list(disk_docs)
        _rng(a.seed, "disk-order").shuffle(order)
        for d, fi, frac, rep, doc in order:
            self.hit(server, "disk", doc, fi, frac, rep, name)
        self.phase_metrics("disk", server, before)

    def flush(self, server: bl.Server, tokens: int) -> None:
        a = self.a
        chunk = max(a.sizes)
        i = 0
        sent = 0
        while sent < tokens:
            n = min(chunk, tokens - sent)
            if n < 2:
                break
            self._send(server, doc_prompt(a.seed + 7919 * a.salt, "flush", n, i, 0, a.vocab_size))
            sent += n
            i += 1


def run_vllm(a: argparse.Namespace, log) -> tuple[list[dict], dict]:
    total = plan_counts(a.sizes, a.fractions, a.reps, a.tiers)
    progress = Progress(total, enabled=not a.no_progress)
    sweep = Sweep(a, progress, log)
    try:
        if a.url:
            server = bl.Server(a.url, a.model)
            disk_docs = sweep.run_server_a(server, "url")
            if "disk" in a.tiers:
                sweep.wait_stores(server)
                progress.write(f"flushing the DRAM tier with {a.flush_tokens} tokens of filler prompts")
                sweep.flush(server, a.flush_tokens)
                sweep.run_disk(server, "url", disk_docs, prewarm=False)
        else:
            out = Path(a.out)
            root = Path(a.root) if a.root else out / "kvtier-root"
            if root.exists() and not a.keep_root:
                shutil.rmtree(root)
            root.mkdir(parents=True, exist_ok=True)
            max_len = max(a.sizes) + 64
            common = dict(python=a.vllm_python, model_dir=a.serve, served_name=a.model, root=root.resolve(),
                          chunk_tokens=a.chunk_tokens, pool_bytes=a.pool_bytes, max_model_len=max_len,
                          serve_args=a.serve_args, start_timeout_s=a.start_timeout_s)
            progress.write(f"starting vLLM (server A) on {a.serve}, root {root}")
            srv = VllmServer(log_path=out / "server-A.log", **common)
            try:
                srv.wait_healthy()
                disk_docs = sweep.run_server_a(bl.Server(srv.url, a.model), "A")
                if "disk" in a.tiers:
                    sweep.wait_stores(bl.Server(srv.url, a.model))
            finally:
                srv.stop()
            if "disk" in a.tiers:
                progress.write("restarting vLLM (server B, same root, cold DRAM tier)")
                srv = VllmServer(log_path=out / "server-B.log", **common)
                try:
                    srv.wait_healthy()
                    sweep.run_disk(bl.Server(srv.url, a.model), "B", disk_docs, prewarm=True)
                finally:
                    srv.stop()
    finally:
        progress.close()
    return sweep.samples, sweep.phases


# --------------------------------------------------------------------------------------------------------------
# Offline recompute (transformers)
# --------------------------------------------------------------------------------------------------------------

def offline_recompute(model_dir: str, sizes: list[int], reps: int, device: str | None = None,
                      random_weights: bool = False, progress: Progress | None = None,
                      max_rep_s: float | None = None, stop_on_oom: bool = False) -> list[dict]:
    """f(D) samples from a transformers forward pass over D tokens (the prefill a cold request does), timed as
    shared/baselines/h200_baseline.py does: decoder + lm_head of the last position, one warm-up per size.

    max_rep_s: fewer timed repetitions at sizes whose warm-up took long (at least one, at most `reps`, about this
    many seconds each size). stop_on_oom: a size that runs out of device memory ends the sweep (an "oom" sample
    records it) instead of raising."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))

    t_build = time.perf_counter()
    if random_weights:
        cfg = AutoConfig.from_pretrained(model_dir)
        torch.manual_seed(0)
        prev = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # parameters are created in bf16 (a 32B model has no room for fp32)
        try:
            with dev:
                model = AutoModelForCausalLM.from_config(cfg)
        finally:
            torch.set_default_dtype(prev)
        model = model.to(device=dev, dtype=torch.bfloat16)
    else:
        try:  # transformers >= 4.56 names it dtype; older ones torch_dtype
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
        except TypeError:
            model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16)
        model = model.to(dev)
    model.eval()
    vocab = model.config.vocab_size
    info = {"attn_implementation": getattr(model.config, "_attn_implementation", None),
            "build_s": round(time.perf_counter() - t_build, 2),
            "params": sum(p.numel() for p in model.parameters())}

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    samples = []
    for d in sizes:
        ids = torch.randint(0, vocab, (1, d), device=dev, generator=None)
        oom = False
        with torch.inference_mode():
            def fwd():
                h = model.model(input_ids=ids, use_cache=False).last_hidden_state
                return model.lm_head(h[:, -1:])
            try:
                t0 = time.perf_counter()
                fwd()
                sync()
                warm = time.perf_counter() - t0
                n = reps if not max_rep_s else max(1, min(reps, int(max_rep_s // max(warm, 1e-9))))
                for r in range(n):
                    t0 = time.perf_counter()
                    fwd()
                    sync()
                    samples.append(dict({"kind": "cold", "tier": None, "doc_tokens": d, "fraction": None,
                                         "prefix_tokens": None, "ttft_s": time.perf_counter() - t0, "rep": r,
                                         "server": "offline", "warmup_s": warm}, **info))
                    if progress:
                        progress.update(f"offline D={d}")
            except torch.cuda.OutOfMemoryError:
                if not stop_on_oom:
                    raise
                oom = True
        if oom:  # out of the except block, so its traceback no longer holds the activations
            del ids
            torch.cuda.empty_cache()
            samples.append(dict({"kind": "oom", "tier": None, "doc_tokens": d, "fraction": None,
                                 "prefix_tokens": None, "ttft_s": None, "server": "offline"}, **info))
            break
        if dev.type == "cuda":
            samples[-1]["peak_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
    del model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    return samples


# --------------------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------------------

def _int_list(text: str) -> list[int]:
    out = []
    for x in text.split(","):
        x = x.strip().lower()
        if not x:
            continue
        mult = 1024 if x.endswith("k") else 1
        out.append(int(float(x.rstrip("k")) * mult))
    return out


def _float_list(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvtier calibrate", description="Measure the break-even frontier (f(D), g(P) "
                                "per tier), write the thresholds file and plot it. See docs/calibration.md.")
    src = p.add_argument_group("where the measurements come from")
    src.add_argument("--serve", metavar="MODEL_DIR", help="start vLLM with kvtier on this model (restarts it to "
                     "measure the disk tier)")
    src.add_argument("--url", help="a running vLLM with kvtier (started with VLLM_SERVER_DEV_MODE=1)")
    src.add_argument("--offline-recompute", metavar="MODEL_DIR",
                     help="measure f(D) with transformers on this model instead of through vLLM")
    src.add_argument("--random-weights", action="store_true", help="--offline-recompute: config.json only")
    src.add_argument("--device", default=None, help="--offline-recompute: torch device (default cuda if present)")
    src.add_argument("--replot", metavar="JSON", nargs="+",
                     help="recompute the model and redraw from measurements.json files (several: samples pooled)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--model", default="tiny", help="served model name (and the thresholds file's model)")
    p.add_argument("--model-tag", default=None,
                   help="model written to the thresholds file; the gate warns when it differs from the server's "
                        "kvtier_model_tag, else its --model (default: the --serve/--offline-recompute directory, "
                        "else --model)")
    p.add_argument("--sizes", type=_int_list, default=[512, 1024, 2048, 4096], help="document sizes (tokens; 4k ok)")
    p.add_argument("--fractions", type=_float_list, default=[0.25, 0.5, 0.75, 1.0],
                   help="cached prefix fractions (1.0 is always added: it gives g)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per point (medians)")
    p.add_argument("--stat", choices=tuple(STATS), default="median",
                   help="statistic over the repetitions (min: the least disturbed sample on a busy machine)")
    p.add_argument("--map-model", choices=MAP_MODELS, default="paper",
                   help="speedup model of the map and break-even fractions: paper = g(P) + f(D-P) vs f(D); "
                        "suffix = g(P) + f(D) - f(P) vs f(D) (the rest attends to the prefix)")
    p.add_argument("--tiers", default="dram,disk", help="tiers to measure: dram,disk")
    p.add_argument("--max-tokens", type=int, default=1, help="output tokens per request")
    p.add_argument("--chunk-tokens", type=int, default=256, help="kvtier chunk size (block_size) in tokens")
    p.add_argument("--kv-bytes-per-token", type=int, default=None,
                   help="KV bytes per token (default: from the model directory)")
    p.add_argument("--tier-bandwidth", default=None,
                   help="model g for tiers not measured: tier=bytes/s,... (e.g. disk=6.5G)")
    p.add_argument("--reference-bw", default=None,
                   help="reference lines on the bandwidth plot: name=bytes/s,... (e.g. 'PM9A3=6.5G')")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--salt", type=int, default=0, help="varies every prompt (to rerun against the same root)")
    p.add_argument("--vocab-size", type=int, default=DEFAULTS["vocab"])
    p.add_argument("--settle-s", type=float, default=0.5, help="pause after a store before the DRAM queries")
    p.add_argument("--no-quiesce", dest="quiesce", action="store_false",
                   help="do not wait for kvtier's writes to finish before each measured request (faster, noisier)")
    p.add_argument("--quiesce-timeout-s", type=float, default=30.0)
    p.add_argument("--flush-tokens", type=int, default=0,
                   help="--url with the disk tier: filler tokens that push the documents out of the DRAM tier")
    srv = p.add_argument_group("--serve")
    srv.add_argument("--vllm-python", default=sys.executable, help="python of vLLM's venv (default: this one)")
    srv.add_argument("--root", default=None, help="kvtier root (default OUT/kvtier-root, emptied first)")
    srv.add_argument("--keep-root", action="store_true", help="do not empty the root first")
    srv.add_argument("--pool-bytes", default="512MiB", help="kvtier_pool_bytes")
    srv.add_argument("--serve-args", default=DEFAULT_SERVE_ARGS, help="more vLLM arguments (one string)")
    srv.add_argument("--start-timeout-s", type=float, default=600)
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    return p


def finish(a: argparse.Namespace, samples: list[dict], meta: dict, log) -> dict:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    kvb = a.kv_bytes_per_token or meta.get("kv_bytes_per_token") \
        or model_kv_bytes_per_token(a.serve or a.offline_recompute)
    if not kvb:
        raise SystemExit("kvtier calibrate: KV bytes per token unknown: pass --kv-bytes-per-token")
    summary = summarize(samples, a.stat)
    model = build_model(summary, kvb, a.chunk_tokens, parse_bandwidths(a.tier_bandwidth), a.map_model)
    model["measured_with"] = meta.get("measured_with")
    model["statistic"] = a.stat
    name = a.model_tag or meta.get("model") or a.model
    th = _json_safe(thresholds(model, name))
    write_json(out / "thresholds.json", th)
    meta = dict(meta, model=name, kv_bytes_per_token=kvb, tokens_per_chunk=a.chunk_tokens)
    write_json(out / "measurements.json", _json_safe({"meta": meta, "samples": samples, "model": model}))
    log(report(model, th))
    if not a.no_plots:
        title = f"{name}, {meta.get('measured_with', '')}".strip(", ")
        plot_speedup_map(model, out / "speedup_map.png", title)
        plot_min_bandwidth(model, out / "min_bandwidth.png", title, parse_bandwidths_any(a.reference_bw))
        log(f"plots: {out / 'speedup_map.png'}, {out / 'min_bandwidth.png'}")
    log(f"thresholds: {out / 'thresholds.json'}")
    return th


def parse_bandwidths_any(text: str | None) -> dict[str, float]:
    out = {}
    for part in (text or "").split(","):
        if "=" not in part:
            continue
        name, _, val = part.partition("=")
        val = val.strip()
        mult = {"G": 1e9, "M": 1e6, "K": 1e3}.get(val[-1:].upper(), 1.0)
        out[name.strip()] = float(val[:-1] if mult != 1.0 else val) * mult
    return out


def _fmt_s(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1000:.0f}"


def report(model: dict, th: dict) -> str:
    sizes = model["sizes"]
    tiers = [t for t in TIERS if t in model["tiers"]]
    head = ["D tokens", "f(D) ms"]
    for t in tiers:
        head += [f"g_{t}(D) ms", f"{t} break-even P/D"]
    head += ["min GB/s"]
    rows = []
    for i, d in enumerate(sizes):
        row = [str(d), _fmt_s(model["f"][i])]
        for t in tiers:
            e = model["tiers"][t]
            gs = dict(zip(e["hit_sizes"], e["g"]))
            be = e["break_even_fraction"][i]
            row += [_fmt_s(gs.get(d)), "never" if be is None else f"{be:.3f}"]
        bw = model["min_bandwidth_Bps"][i]
        row.append("-" if not bw else f"{bw / 1e9:.3f}")
        rows.append(row)
    lines = [bl.table(head, rows)]
    if model.get("t0") is not None:
        lines.append(f"t0 (16-token prompt TTFT): {model['t0'] * 1000:.0f} ms")
    for t in TIERS:
        v = th["tiers"][t]["min_load_tokens"]
        lines.append(f"{t}: min_load_tokens {('never (' + str(v) + ')') if v == NEVER else v}"
                     + (f"  [{th['frontier']['estimated'][t]}]" if t in th["frontier"].get("estimated", {}) else ""))
    lines.append(f"store_min_tokens {th['store_min_tokens']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    a.tiers = [t.strip() for t in a.tiers.split(",") if t.strip()]
    for t in a.tiers:
        if t not in TIERS:
            p.error(f"--tiers: unknown tier {t!r} (tiers: {', '.join(TIERS)})")
    if 1.0 not in a.fractions:
        a.fractions = sorted(set(a.fractions) | {1.0})
    if any(not 0 < fr <= 1 for fr in a.fractions):
        p.error("--fractions must be in (0, 1]")
    if not a.sizes or any(d < 32 for d in a.sizes):
        p.error("--sizes must be >= 32 tokens")
    a.sizes = sorted(set(a.sizes))
    if a.reps < 1:
        p.error("--reps must be >= 1")
    try:
        parse_bandwidths(a.tier_bandwidth)
    except ValueError as e:
        p.error(str(e))
    modes = [x for x in (a.serve, a.url, a.replot) if x]
    if len(modes) > 1:
        p.error("choose one of --serve, --url, --replot")
    if not modes and not a.offline_recompute:
        p.error("nothing to measure: give --serve MODEL_DIR, --url URL, --offline-recompute MODEL_DIR or --replot")
    if a.url and "disk" in a.tiers and a.flush_tokens <= 0:
        print("kvtier calibrate: --url without --flush-tokens cannot force loads from disk; measuring dram only",
              file=sys.stderr)
        a.tiers = [t for t in a.tiers if t != "disk"]

    def log(msg: str) -> None:
        print(msg, flush=True)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.replot:
        samples, meta = [], {}
        for i, path in enumerate(a.replot):
            with open(path) as fh:
                data = json.load(fh)
            for smp in data["samples"]:
                samples.append(dict(smp, run=i) if len(a.replot) > 1 else smp)
            m = data.get("meta", {})
            if meta and m.get("tokens_per_chunk") != meta.get("tokens_per_chunk"):
                p.error(f"--replot: {path} has another chunk size than {a.replot[0]}")
            meta = meta or dict(m)
        if len(a.replot) > 1:
            meta["pooled_runs"] = [str(x) for x in a.replot]
            meta["reps"] = sum(1 for smp in samples if smp["kind"] == "cold") // max(1, len(meta.get("sizes", [1])))
        a.chunk_tokens = meta.get("tokens_per_chunk", a.chunk_tokens)
        finish(a, samples, meta, log)
        return 0
    t_start = time.monotonic()
    samples: list[dict] = []
    meta: dict = {"sizes": a.sizes, "fractions": a.fractions, "reps": a.reps, "tiers": a.tiers,
                  "max_tokens": a.max_tokens, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "argv": sys.argv[1:] if argv is None else list(argv),
                  # what the gate compares with: kvtier_model_tag, else vLLM's model (the path given to --model)
                  "model": a.model_tag or a.serve or a.offline_recompute or a.model}
    phases = {}
    if a.serve or a.url:
        samples, phases = run_vllm(a, log)
        meta["measured_with"] = "vLLM + kvtier" + (" (--serve)" if a.serve else " (--url)")
    if a.offline_recompute:
        prog = Progress(len(a.sizes) * a.reps, "offline f(D)", enabled=not a.no_progress)
        try:
            off = offline_recompute(a.offline_recompute, a.sizes, a.reps, a.device, a.random_weights, prog)
        finally:
            prog.close()
        samples = [s for s in samples if s["kind"] != "cold"] + off
        meta["measured_with"] = (meta.get("measured_with", "") + "; f(D) offline (transformers)").lstrip("; ")
    meta["phase_metrics"] = phases
    meta["wall_s"] = round(time.monotonic() - t_start, 1)
    for name, m in phases.items():
        keys = ("kvtier_lookup_hits_dram", "kvtier_lookup_hits_disk", "kvtier_lookup_misses", "kvtier_bytes_read",
                "external_prefix_cache_hits")
        shown = {k.split(":")[-1]: v for k, v in m.items() if any(x in k for x in keys)}
        log(f"server {name} counters: " + ", ".join(f"{k}={v:g}" for k, v in sorted(shown.items())))
    finish(a, samples, meta, log)
    log(f"calibration took {meta['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
