#!/usr/bin/env python3
"""Two builds of `kvtier bench io` on one machine, in alternating pairs: a change to the engine (B) judged against
the commit before it (A), on a disk whose speed drifts between runs.

    git worktree add /tmp/ab-a COMMIT && cmake -S /tmp/ab-a -B /tmp/ab-a/build -DCMAKE_BUILD_TYPE=Release \\
        -DKVTIER_BUILD_TESTS=OFF && cmake --build /tmp/ab-a/build --target kvtier
    bench/io/build_ab.py --a /tmp/ab-a/build/kvtier --b build/release/kvtier --pairs 4 --out DIR -- \\
        --dir /var/tmp --total 256MiB --chunk-sizes 2MiB --depths 4 --repeat 4 --raw-threads 1 --raw-split none

Each pair runs A then B (the order flips every pair, so neither side always goes first), each run with its own raw
baseline. Per pair and chunk size it takes B/A of each side's ratio to raw best (write and read) and of engine
GB/s, and prints the medians over pairs and the lowest and highest per-pair ratio (how noisy the machine was).
Every run's JSON and a summary (summary.json) go to --out.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

KEYS = [("write_ratio_to_best", "write ratio to raw best"), ("read_ratio_to_best", "read ratio to raw best"),
        ("median_engine_write_gbps", "engine write GB/s"), ("median_engine_read_gbps", "engine read GB/s")]


def run(kvtier: str, args: list[str], out: str) -> dict:
    cmd = [kvtier, "bench", "io", *args, "--json", out]
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"build_ab: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-4000:]}")
    with open(out) as f:
        return {row["chunk_bytes"]: row for row in json.load(f)["results"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="the kvtier binary of the baseline (before the change)")
    p.add_argument("--b", required=True, help="the kvtier binary of the change")
    p.add_argument("--pairs", type=int, default=4, help="A/B pairs (default %(default)s)")
    p.add_argument("--out", required=True, help="directory for each run's JSON and summary.json")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then `kvtier bench io` options (not --json)")
    a = p.parse_args()
    extra = [x for x in a.bench_args if x != "--"]
    if any(x.startswith("--json") for x in extra):
        p.error("--json is set by build_ab.py")
    if a.pairs < 1:
        p.error("--pairs must be at least 1")
    for side in (a.a, a.b):
        if not (os.path.isfile(side) and os.access(side, os.X_OK)):
            p.error(f"{side} is not an executable kvtier binary")
    os.makedirs(a.out, exist_ok=True)
    per_size: dict[int, dict[str, list[float]]] = {}
    for i in range(a.pairs):
        order = [("a", a.a), ("b", a.b)] if i % 2 == 0 else [("b", a.b), ("a", a.a)]
        docs = {side: run(binary, extra, os.path.join(a.out, f"pair{i}-{side}.json")) for side, binary in order}
        for size, a_row in docs["a"].items():
            d = per_size.setdefault(size, {k: [] for k, _ in KEYS})
            for k, _ in KEYS:
                d[k].append(docs["b"][size][k] / a_row[k])
        print(f"pair {i + 1}/{a.pairs} done", flush=True)
    summary = {"pairs": a.pairs, "a": a.a, "b": a.b, "bench_args": extra, "b_over_a": {}}
    for size, d in sorted(per_size.items()):
        med = {k: statistics.median(v) for k, v in d.items()}
        ratios = [x for k, _ in KEYS[:2] for x in d[k]]
        summary["b_over_a"][str(size)] = {"median": med, "per_pair": d, "pair_min": min(ratios),
                                          "pair_max": max(ratios)}
        print(f"chunk {size / 2**20:g} MiB, B/A medians over {a.pairs} pairs: " +
              ", ".join(f"{label} {med[k]:.3f}" for k, label in KEYS) +
              f"; per-pair ratios to raw best {min(ratios):.3f}-{max(ratios):.3f}")
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
