"""Load latency while the engine writes back new entries (I1, EngineOptions::max_writes_at_disk and
write_piece_bytes).

A cached request's load on a disk that also takes the write-back of newly computed documents (vLLM stores every
prompt it computes): while a writer thread commits `--writes` new chunks from pool slots (reserve_for_store +
commit_store, as vLLM's workers commit them, `--batch` at a time), the reader promotes `--reads` chunks stored before
the run, `--load-batch` at a time (1: one after another; vLLM asks for a request's chunks together), each from disk
(a fresh engine: its DRAM tier is empty), and times each batch until every slot of it is ready; make the write-back
outlast the loads (`--writes`), or the later loads find the disk idle. Runs alternate between the settings, every
write bound of `--caps` (0, the default: half of io_depth; io_depth: no bound, writes take any place at the disk)
with every write piece of `--write-pieces` (MiB; 0: a chunk in one write), `--repeat` runs each, every run on chunks
of its own. The table gives each setting's batch latency (mean, median and p95 over all its runs), the loads' total
time per run (what a request loading these chunks waits) and how long the write-back took.

  python3 bench/io/load_under_writeback.py --dir /var/tmp/kvtier-wb [--chunk-mib 32] [--json OUT]

Needs the kvtier extension (PYTHONPATH=python after scripts/test.sh's build, or an installed kvtier).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import threading
import time
from pathlib import Path

BLOCK_BYTES = 1 << 20  # one block per MiB of chunk


def options(root: Path, a: argparse.Namespace, cap: int, piece_mib: float = 1) -> dict:
    slot = 4096 + a.chunk_mib * BLOCK_BYTES
    return {"root": str(root), "model": "load-under-writeback", "revision": "1", "kv_dtype": "bfloat16",
            "tokens_per_chunk": 256, "blocks_per_chunk": a.chunk_mib, "block_bytes": BLOCK_BYTES,
            "pool_bytes": (2 * a.batch + a.reads + 2 * a.io_depth + 8) * slot, "dram_max_slots": a.batch,
            "io_depth": a.io_depth, "max_writes_at_disk": cap, "write_piece_bytes": int(piece_mib * BLOCK_BYTES),
            "io_mode": a.io_mode, "reactors": a.reactors}


def key(run: int, kind: int, i: int) -> bytes:
    return (kind << 56 | run << 32 | i).to_bytes(8, "little") * 4


def promote(engine, keys: list[bytes], timeout_s: float = 120.0) -> float:
    """Seconds until every chunk of keys is resident, their promotions asked together; a "miss" (no pool slot free
    now: vLLM would recompute) is asked again."""
    t = time.monotonic()
    left = list(keys)
    while True:
        left = [k for k in left if engine.promote(k)[0] != "ready"]
        if not left:
            return time.monotonic() - t
        if time.monotonic() - t > timeout_s:
            raise RuntimeError(f"{len(left)} promotions of stored chunks not ready after {timeout_s:.0f} s")
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


def one_run(kvtier, base: Path, a: argparse.Namespace, cap: int, piece_mib: float, run: int) -> dict:
    root = base / f"run{run}"  # a root of its own, removed after the run
    root.mkdir()
    try:
        return measure(kvtier, root, a, cap, piece_mib, run)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def measure(kvtier, root: Path, a: argparse.Namespace, cap: int, piece_mib: float, run: int) -> dict:
    with kvtier.Engine(options(root, a, cap)) as e:  # the chunks this run loads, stored and left on disk
        for i in range(0, a.reads, a.batch):
            ks = [key(run, 1, j) for j in range(i, min(a.reads, i + a.batch))]
            while e.reserve_for_store(ks) is None:
                time.sleep(0.001)
            e.commit_store(ks, True)
        while e.stats().get("disk_entries", 0) < a.reads:
            time.sleep(0.005)
    with kvtier.Engine(options(root, a, cap, piece_mib)) as e:  # cold DRAM tier: each promotion reads the disk
        done = {"before": e.stats().get("stores_completed", 0)}
        w = threading.Thread(target=writeback, args=(e, [key(run, 2, j) for j in range(a.writes)], a.batch, done))
        w.start()
        time.sleep(a.lead_s)  # the write-back is under way before the first load
        lat = [promote(e, [key(run, 1, j) for j in range(i, min(a.reads, i + a.load_batch))])
               for i in range(0, a.reads, a.load_batch)]
        w.join()
        return {"cap": cap, "write_piece_mib": piece_mib, "run": run, "load_s": lat, "writeback_s": done["s"],
                "stats": e.stats()}


def report(runs: list[dict], settings: list[tuple[int, float]], a: argparse.Namespace) -> list[dict]:
    """Prints the table of each setting's runs and returns it (the JSON's "table"): batch latency mean, median and
    p95 (nearest rank) over all the setting's batches, medians over its runs of the loads' total and the
    write-back."""
    print(f"\n{a.reads} loads of {a.chunk_mib} MiB, {a.load_batch} at a time, during the write-back of {a.writes} x "
          f"{a.chunk_mib} MiB, io_depth {a.io_depth}, {a.repeat} runs per setting")
    print(f"{'max_writes_at_disk':>20} {'write piece MiB':>16} {'load mean ms':>13} {'p50 ms':>8} {'p95 ms':>8} "
          f"{'loads total s':>14} {'write-back s':>13}")
    table = []
    for cap, piece in settings:
        mine = [x for x in runs if x["cap"] == cap and x.get("write_piece_mib", 0.0) == piece]
        lat = sorted(t for x in mine for t in x["load_s"])
        wb = statistics.median(x["writeback_s"] for x in mine)
        total = statistics.median(sum(x["load_s"]) for x in mine)
        row = {"cap": cap, "write_piece_mib": piece, "load_mean_s": statistics.mean(lat) if lat else None,
               "load_p50_s": statistics.median(lat) if lat else None,
               "load_p95_s": lat[max(0, math.ceil(0.95 * len(lat)) - 1)] if lat else None,
               "loads_total_s": total, "writeback_s": wb}
        table.append(row)
        name = f"0 ({max(1, a.io_depth // 2)})" if cap == 0 else f"{cap}{' (none)' if cap >= a.io_depth else ''}"
        ms = [f"{row[k] * 1000:.1f}" if row[k] is not None else "-" for k in ("load_mean_s", "load_p50_s", "load_p95_s")]
        print(f"{name:>20} {piece:>16g} {ms[0]:>13} {ms[1]:>8} {ms[2]:>8} {total:14.2f} {wb:13.2f}")
    return table


def settings_of(a: argparse.Namespace) -> list[tuple[int, float]]:
    return [(int(c), float(m)) for c in a.caps.split(",") for m in a.write_pieces.split(",")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", required=True, help="a directory on the disk to measure (a subdirectory is removed after)")
    p.add_argument("--chunk-mib", type=int, default=32, help="chunk payload (a 32B model's chunk of 256 tokens: 64)")
    p.add_argument("--reads", type=int, default=16, help="cached chunks each run loads (0: the write-back alone)")
    p.add_argument("--load-batch", type=int, default=1, help="chunks promoted together (1: one after another)")
    p.add_argument("--writes", type=int, default=64, help="new chunks each run writes back meanwhile")
    p.add_argument("--batch", type=int, default=8, help="chunks per commit (a request's stores in one step)")
    p.add_argument("--io-depth", type=int, default=16)
    p.add_argument("--reactors", type=int, default=0, help="EngineOptions::reactors (0: one per core, 2..16)")
    p.add_argument("--io-mode", default="auto", choices=("auto", "direct", "buffered"))
    p.add_argument("--caps", default="0,16", help="max_writes_at_disk values to compare (0: io_depth / 2)")
    p.add_argument("--write-pieces", default="1",
                   help="write_piece_bytes values to compare, in MiB (0: a chunk in one write)")
    p.add_argument("--repeat", type=int, default=2, help="runs per setting, alternating")
    p.add_argument("--lead-s", type=float, default=0.2, help="write-back time before the first load")
    p.add_argument("--json", default="")
    p.add_argument("--retable", metavar="JSON", help="recompute and print the table of a --json file from its runs "
                   "with this version's statistics, rewrite its \"table\", and exit")
    a = p.parse_args(argv)
    if a.retable:
        doc = json.loads(Path(a.retable).read_text())
        old = argparse.Namespace(**{"load_batch": 1, "write_pieces": "0", **doc["args"]})
        doc["table"] = report(doc["runs"], settings_of(old), old)
        Path(a.retable).write_text(json.dumps(doc, indent=1) + "\n")
        return 0
    import kvtier

    if a.load_batch < 1:
        p.error("--load-batch must be at least 1")
    settings = settings_of(a)
    root = Path(a.dir) / "load-under-writeback"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    runs = []
    try:
        for r in range(a.repeat):
            for cap, piece in (settings if r % 2 == 0 else settings[::-1]):
                runs.append(one_run(kvtier, root, a, cap, piece, len(runs)))
                x = runs[-1]
                median = f"{statistics.median(x['load_s']) * 1000:.1f} ms" if x["load_s"] else "-"
                print(f"run {x['run']}: cap {cap}, write piece {piece:g} MiB: load median {median}, "
                      f"write-back {x['writeback_s']:.2f} s", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    table = report(runs, settings, a)
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "table": table, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
