"""Load latency while the engine writes back new entries (I1, EngineOptions::max_writes_at_disk).

A cached request's load on a disk that also takes the write-back of newly computed documents (vLLM stores every
prompt it computes): while a writer thread commits `--writes` new chunks from pool slots (reserve_for_store +
commit_store, as vLLM's workers commit them, `--batch` at a time), the reader promotes `--reads` chunks stored before
the run, one after another, each from disk (a fresh engine: its DRAM tier is empty), and times each promotion until
its slot is ready; make the write-back outlast the loads (`--writes`), or the later loads find the disk idle. Runs
alternate between the write bounds of `--caps` (0, the default: half of io_depth; io_depth: no bound, writes take
any place at the disk), `--repeat` runs each, every run on chunks of its own. The table gives each bound's
promotion latency (mean, median and p95 over all its runs), the loads' total time per run (what a request loading
these chunks waits) and how long the write-back took.

  python3 bench/io/load_under_writeback.py --dir /var/tmp/kvtier-wb [--chunk-mib 32] [--json OUT]

Needs the kvtier extension (PYTHONPATH=python after scripts/test.sh's build, or an installed kvtier).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import threading
import time
from pathlib import Path

BLOCK_BYTES = 1 << 20  # one block per MiB of chunk


def options(root: Path, a: argparse.Namespace, cap: int) -> dict:
    slot = 4096 + a.chunk_mib * BLOCK_BYTES
    return {"root": str(root), "model": "load-under-writeback", "revision": "1", "kv_dtype": "bfloat16",
            "tokens_per_chunk": 256, "blocks_per_chunk": a.chunk_mib, "block_bytes": BLOCK_BYTES,
            "pool_bytes": (2 * a.batch + a.reads + 2 * a.io_depth + 8) * slot, "dram_max_slots": a.batch,
            "io_depth": a.io_depth, "max_writes_at_disk": cap, "io_mode": a.io_mode, "reactors": a.reactors}


def key(run: int, kind: int, i: int) -> bytes:
    return (kind << 56 | run << 32 | i).to_bytes(8, "little") * 4


def promote(engine, k: bytes, timeout_s: float = 120.0) -> float:
    """Seconds until the chunk is resident; a "miss" (no pool slot free now: vLLM would recompute) is asked again."""
    t = time.monotonic()
    while True:
        state, _, _ = engine.promote(k)
        if state == "ready":
            return time.monotonic() - t
        if time.monotonic() - t > timeout_s:
            raise RuntimeError(f"promotion of a stored chunk still {state!r} after {timeout_s:.0f} s")
        time.sleep(0.0005)


def writeback(engine, keys: list[bytes], batch: int, done: dict) -> None:
    t = time.monotonic()
    for i in range(0, len(keys), batch):
        part = keys[i:i + batch]
        while engine.reserve_for_store(part) is None:  # the pool is full: the write-back is behind the disk
            time.sleep(0.001)
        engine.commit_store(part, True)
    while engine.stats().get("stores_completed", 0) < done["before"] + (len(keys) + batch - 1) // batch:
        time.sleep(0.005)
    done["s"] = time.monotonic() - t


def one_run(kvtier, base: Path, a: argparse.Namespace, cap: int, run: int) -> dict:
    root = base / f"run{run}"  # a root of its own, removed after the run
    root.mkdir()
    try:
        return measure(kvtier, root, a, cap, run)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def measure(kvtier, root: Path, a: argparse.Namespace, cap: int, run: int) -> dict:
    with kvtier.Engine(options(root, a, cap)) as e:  # the chunks this run loads, stored and left on disk
        for i in range(0, a.reads, a.batch):
            ks = [key(run, 1, j) for j in range(i, min(a.reads, i + a.batch))]
            while e.reserve_for_store(ks) is None:
                time.sleep(0.001)
            e.commit_store(ks, True)
        while e.stats().get("disk_entries", 0) < a.reads:
            time.sleep(0.005)
    with kvtier.Engine(options(root, a, cap)) as e:  # cold DRAM tier: each promotion reads the disk
        done = {"before": e.stats().get("stores_completed", 0)}
        w = threading.Thread(target=writeback, args=(e, [key(run, 2, j) for j in range(a.writes)], a.batch, done))
        w.start()
        time.sleep(a.lead_s)  # the write-back is under way before the first load
        lat = [promote(e, key(run, 1, j)) for j in range(a.reads)]
        w.join()
        return {"cap": cap, "run": run, "load_s": lat, "writeback_s": done["s"], "stats": e.stats()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", required=True, help="a directory on the disk to measure (a subdirectory is removed after)")
    p.add_argument("--chunk-mib", type=int, default=32, help="chunk payload (a 32B model's chunk of 256 tokens: 64)")
    p.add_argument("--reads", type=int, default=16, help="cached chunks each run loads, one after another")
    p.add_argument("--writes", type=int, default=64, help="new chunks each run writes back meanwhile")
    p.add_argument("--batch", type=int, default=8, help="chunks per commit (a request's stores in one step)")
    p.add_argument("--io-depth", type=int, default=16)
    p.add_argument("--reactors", type=int, default=0, help="EngineOptions::reactors (0: one per core, 2..16)")
    p.add_argument("--io-mode", default="auto", choices=("auto", "direct", "buffered"))
    p.add_argument("--caps", default="0,16", help="max_writes_at_disk values to compare (0: io_depth / 2)")
    p.add_argument("--repeat", type=int, default=2, help="runs per cap, alternating")
    p.add_argument("--lead-s", type=float, default=0.2, help="write-back time before the first load")
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    import kvtier

    caps = [int(c) for c in a.caps.split(",")]
    root = Path(a.dir) / "load-under-writeback"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    runs = []
    try:
        for r in range(a.repeat):
            for cap in (caps if r % 2 == 0 else caps[::-1]):
                runs.append(one_run(kvtier, root, a, cap, len(runs)))
                x = runs[-1]
                print(f"run {x['run']}: cap {cap}: load median {statistics.median(x['load_s']) * 1000:.1f} ms, "
                      f"write-back {x['writeback_s']:.2f} s", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n{a.reads} loads of {a.chunk_mib} MiB during the write-back of {a.writes} x {a.chunk_mib} MiB, "
          f"io_depth {a.io_depth}, {a.repeat} runs per cap")
    print(f"{'max_writes_at_disk':>20} {'load mean ms':>13} {'p50 ms':>8} {'p95 ms':>8} {'loads total s':>14} "
          f"{'write-back s':>13}")
    table = []
    for cap in caps:
        lat = sorted(t for x in runs if x["cap"] == cap for t in x["load_s"])
        wb = statistics.median(x["writeback_s"] for x in runs if x["cap"] == cap)
        total = statistics.median(sum(x["load_s"]) for x in runs if x["cap"] == cap)
        row = {"cap": cap, "load_mean_s": statistics.mean(lat), "load_p50_s": statistics.median(lat),
               "load_p95_s": lat[int(0.95 * (len(lat) - 1))], "loads_total_s": total, "writeback_s": wb}
        table.append(row)
        name = f"0 ({max(1, a.io_depth // 2)})" if cap == 0 else f"{cap}{' (none)' if cap >= a.io_depth else ''}"
        print(f"{name:>20} {row['load_mean_s'] * 1000:13.1f} {row['load_p50_s'] * 1000:8.1f} "
              f"{row['load_p95_s'] * 1000:8.1f} {total:14.2f} {wb:13.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "table": table, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
