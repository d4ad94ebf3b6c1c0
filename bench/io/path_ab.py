#!/usr/bin/env python3
"""The stream path (JobClient over StreamPump, `kvtier bench io`'s default) against the engine's own job path, in
alternating runs of `kvtier bench io` on one machine (docs/cli.md, `--path`).

    bench/io/path_ab.py --kvtier build/release/kvtier --pairs 4 --out DIR -- --dir /var/tmp --total 256MiB \\
        --chunk-sizes 2MiB --depths 4 --repeat 4 --raw-threads 1 --raw-split none

Each pair runs `--path job` then `--path stream` (the order flips every pair, so neither side always goes first
on a disk that drifts), each with its own raw baseline. Per pair and chunk size it takes stream/job of each
side's ratio to raw best (write and read) and of engine GB/s, and prints the medians over pairs. Every run's JSON
and a summary (`summary.json`) go to --out.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run(kvtier: str, path: str, args: list[str], out: str) -> dict:
    cmd = [kvtier, "bench", "io", *args, "--path", path, "--json", out]
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"path_ab: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-4000:]}")
    with open(out) as f:
        return json.load(f)


def rows(doc: dict) -> dict:
    return {row["chunk_bytes"]: row for row in doc["results"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kvtier", default="build/release/kvtier", help="the kvtier binary (default %(default)s)")
    p.add_argument("--pairs", type=int, default=4, help="job/stream pairs (default %(default)s)")
    p.add_argument("--out", required=True, help="directory for each run's JSON and summary.json")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then `kvtier bench io` options (not --path/--json)")
    a = p.parse_args()
    extra = [x for x in a.bench_args if x != "--"]
    if any(x.startswith("--path") or x.startswith("--json") for x in extra):
        p.error("--path and --json are set by path_ab.py")
    if a.pairs < 1:
        p.error("--pairs must be at least 1")
    os.makedirs(a.out, exist_ok=True)
    keys = [("write_ratio_to_best", "write ratio to raw best"), ("read_ratio_to_best", "read ratio to raw best"),
            ("median_engine_write_gbps", "engine write GB/s"), ("median_engine_read_gbps", "engine read GB/s")]
    per_size: dict[int, dict[str, list[float]]] = {}
    for i in range(a.pairs):
        order = ["job", "stream"] if i % 2 == 0 else ["stream", "job"]
        docs = {path: rows(run(a.kvtier, path, extra, os.path.join(a.out, f"pair{i}-{path}.json"))) for path in order}
        for size, job_row in docs["job"].items():
            stream_row = docs["stream"][size]
            d = per_size.setdefault(size, {k: [] for k, _ in keys})
            for k, _ in keys:
                d[k].append(stream_row[k] / job_row[k])
        print(f"pair {i + 1}/{a.pairs} done", flush=True)
    summary = {"pairs": a.pairs, "bench_args": extra, "stream_over_job": {}}
    for size, d in sorted(per_size.items()):
        med = {k: statistics.median(v) for k, v in d.items()}
        summary["stream_over_job"][str(size)] = {"median": med, "per_pair": d}
        print(f"chunk {size >> 20} MiB, stream/job medians over {a.pairs} pairs: " +
              ", ".join(f"{label} {med[k]:.3f}" for k, label in keys))
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
