#!/usr/bin/env python3
"""Splits `kvtier bench io --json` repetitions by which side went first, per chunk size and depth.

bench io alternates the side that goes first (even repetitions: raw first). On the virtual disks we test on, the
read phase that comes second is often faster, whichever side it is. This prints, per cell, each side's median GB/s
when it went first and when it went second, the median engine/raw ratio in each order, and the order-balanced
estimate sqrt(ratio_raw_first * ratio_engine_first): if going second speeds a side up by the same factor f
whichever it is, raw-first repetitions measure f * true and engine-first ones true / f, and the product cancels f.
Runs with --cross also get a table of the raw reader on the engine's files against its own and the engine.

  bench/io/orders.py FILE.json [FILE.json ...]    (files of one configuration; their repetitions are pooled)
"""
import json
import math
import statistics
import sys


def main(paths):
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    cells = {}
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
            results = doc["results"]
        except (OSError, ValueError, KeyError) as e:
            print(f"orders.py: {path}: not a bench io JSON file ({e})", file=sys.stderr)
            return 1
        for r in results:
            c = cells.setdefault((r["chunk_bytes"], r["depth"]), {})
            for i, x in enumerate(r.get("raw_reads_engine_files_gbps", [])):
                order = "raw_first" if i % 2 == 0 else "engine_first"
                c.setdefault(("cross", order), []).append((x, r["raw_read_gbps"][i], r["engine_read_gbps"][i]))
            for phase in ("read", "write"):
                eng, raw = r[f"engine_{phase}_gbps"], r[f"raw_{phase}_gbps"]
                for i, (e, w) in enumerate(zip(eng, raw)):
                    order = "raw_first" if i % 2 == 0 else "engine_first"
                    c.setdefault((phase, order), []).append((e, w))
    print(f"{len(paths)} file(s); GB/s medians; ratio = median of engine/raw per repetition")
    print("chunk  depth  phase   n   engine 1st/2nd    raw 1st/2nd     ratio raw-first  engine-first  balanced")
    for (chunk, depth), c in sorted(cells.items()):
        for phase in ("read", "write"):
            rf, ef = c.get((phase, "raw_first"), []), c.get((phase, "engine_first"), [])
            if not rf or not ef:
                continue
            med = statistics.median
            r_rf = med(e / w for e, w in rf)
            r_ef = med(e / w for e, w in ef)
            print(f"{chunk >> 20:3d}MiB {depth:6d}  {phase:<5} {len(rf) + len(ef):3d}   "
                  f"{med(e for e, _ in ef):5.2f} / {med(e for e, _ in rf):5.2f}    "
                  f"{med(w for _, w in rf):5.2f} / {med(w for _, w in ef):5.2f}     "
                  f"{r_rf:6.3f}          {r_ef:6.3f}       {math.sqrt(r_rf * r_ef):6.3f}")
    # --cross runs the raw reader on the engine's files third, after both reads. In engine-first repetitions the
    # raw side's own read is second, so cross/raw compares two phases that both follow a read phase.
    crossed = [(k, c) for k, c in sorted(cells.items()) if c.get(("cross", "engine_first"))]
    if crossed:
        print("--cross: the raw reader on the engine's files (always third), medians")
        print("chunk  depth   n   on engine files  own files  engine   cross/own (engine-first reps)  cross/engine")
        for (chunk, depth), c in crossed:
            ef = c[("cross", "engine_first")]
            allx = ef + c.get(("cross", "raw_first"), [])
            med = statistics.median
            print(f"{chunk >> 20:3d}MiB {depth:6d} {len(allx):3d}   {med(x for x, _, _ in allx):6.2f}"
                  f"           {med(w for _, w, _ in allx):6.2f}    {med(e for _, _, e in allx):6.2f}   "
                  f"{med(x / w for x, w, _ in ef):6.3f}                         "
                  f"{med(x / e for x, _, e in allx):6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
