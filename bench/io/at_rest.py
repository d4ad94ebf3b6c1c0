#!/usr/bin/env python3
"""Summarizes the 'ALT'/'LAT' lines that an experiment build of `kvtier bench io` prints.

That build is commit 79f6e36 plus an experiment patch of temporary switches, not in the product (in git history:
`git show e565164^:bench/results/io/s5-experiment-switches.patch`):
KVTIER_EXPERIMENT_ALT=K re-reads the first repetition's files K times, three readers rotating (raw on its own files,
raw on the engine's files, engine), printing "ALT a own X cross Y engine Z" (GB/s) and "LAT ..." (mean read latency
per phase); KVTIER_EXPERIMENT_NOVERIFY skips load verification, _NODEADLINE drops the per-op linked timeouts,
_FLAGS0 sets up the ring without SINGLE_ISSUER/COOP_TASKRUN, _SYNCOPEN opens and closes chunk files with plain
syscalls on the reactor thread instead of through the ring, _COPIER_NICE=N runs the host copier thread at nice N, _NOTIMEOUT makes the reactor wait for completions without its
20 ms timeout, _POOL_X=N gives the bench's engine N x depth pool slots, _ENGINE_DEPTH=N runs the bench's engine at
depth N whatever the raw side's. The committed `kvtier bench io --reread N` is the
product version of the rotation. Per file: medians of each reader and of the per-rotation ratios.

  bench/io/at_rest.py FILE [FILE ...]     (e.g. bench/results/io/s5-at-rest/*.txt)
"""
import statistics
import sys


def main(paths):
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print("file                 n   own  cross engine  engine/cross engine/own cross/own  read latency raw/engine ms")
    for path in paths:
        try:
            lines = open(path).read().splitlines()
        except OSError as e:
            print(f"at_rest.py: {e}", file=sys.stderr)
            return 1
        rows = [l.split() for l in lines if l.startswith("ALT ")]
        lat = [l.split() for l in lines if l.startswith("LAT ")]
        if not rows:
            print(f"at_rest.py: {path}: no ALT lines", file=sys.stderr)
            return 1
        own = [float(r[3]) for r in rows]
        cross = [float(r[5]) for r in rows]
        eng = [float(r[7]) for r in rows]
        med = statistics.median
        latency = ""
        if lat:
            latency = f"{med(float(x[5]) for x in lat):.3f} / {med(float(x[10]) for x in lat):.3f}"
        name = path.rsplit("/", 1)[-1].removesuffix(".txt")
        print(f"{name:<18} {len(rows):3d}  {med(own):5.2f} {med(cross):5.2f} {med(eng):5.2f}   "
              f"{med(e / c for e, c in zip(eng, cross)):6.3f}      {med(e / o for e, o in zip(eng, own)):6.3f}    "
              f"{med(c / o for c, o in zip(cross, own)):6.3f}    {latency}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
