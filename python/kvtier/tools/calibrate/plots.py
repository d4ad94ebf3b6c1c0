"""The plots of `kvtier calibrate`: the speedup map and the minimum bandwidth per document size (matplotlib,
installed on demand: model.PLOT_REQUIREMENTS)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from kvtier.tools.calibrate.model import NEVER, PLOT_REQUIREMENTS, TIERS, hit_curve, recompute_curve, speedup

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
