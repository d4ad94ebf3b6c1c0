"""The text report of a calibration: per document size f(D), g per tier, the break-even fraction and the minimum
bandwidth, then the thresholds."""

from __future__ import annotations

import math

from kvtier.tools.calibrate.model import NEVER, TIERS
from kvtier.tools.longdoc.report import table


def fmt_s(v) -> str:
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
        row = [str(d), fmt_s(model["f"][i])]
        for t in tiers:
            e = model["tiers"][t]
            gs = dict(zip(e["hit_sizes"], e["g"]))
            be = e["break_even_fraction"][i]
            row += [fmt_s(gs.get(d)), "never" if be is None else f"{be:.3f}"]
        bw = model["min_bandwidth_Bps"][i]
        row.append("-" if not bw else f"{bw / 1e9:.3f}")
        rows.append(row)
    lines = [table(head, rows)]
    if model.get("t0") is not None:
        lines.append(f"t0 (16-token prompt TTFT): {model['t0'] * 1000:.0f} ms")
    for t in TIERS:
        v = th["tiers"][t]["min_load_tokens"]
        lines.append(f"{t}: min_load_tokens {('never (' + str(v) + ')') if v == NEVER else v}"
                     + (f"  [{th['frontier']['estimated'][t]}]" if t in th["frontier"].get("estimated", {}) else ""))
    lines.append(f"store_min_tokens {th['store_min_tokens']}")
    return "\n".join(lines)
