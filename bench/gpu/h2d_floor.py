"""The host-to-GPU floor of a box: a raw copy of one pinned host buffer into GPU memory with torch, nothing of kvtier.

    python3 bench/gpu/h2d_floor.py [--gib 8.75] [--reps 5] [--json OUT]

Prints and writes GB/s for (1) one contiguous copy of the whole buffer, (2) the buffer split in two halves copied at
once on two streams (two requests' loads sharing the link), (3) 1 GiB as 64 KiB pieces, one copy call each (a vLLM
block of one layer of the Llama-3.2-3B shape: what copying block by block would give, and why kvtier's CUDA copier
gathers a transfer's blocks in one launch), (4) the whole buffer back (D2H), (5) how long a small H2D copy on its
own stream takes to land while 0, 128 MiB or 1 GiB of H2D copies are queued on another stream (a vLLM step's input
copies beside a load's queued copies: kvtier_load_queue_mib, docs/vllm-integration.md). The floor DRAM->GPU figures
are compared with (docs/performance.md, "Floors").
"""
import argparse
import json
import time

import torch


def timed(fn, reps):
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return sorted(out)[len(out) // 2]  # median


def behind_backlog(host, dev, backlog, reps, small=64 << 10, piece=128 << 20):
    """Median ms from issuing a `small`-byte H2D copy on its own stream to its landing, with `backlog` bytes of H2D
    copies (pieces of `piece` bytes) queued just before on another stream."""
    big, mine = torch.cuda.Stream(), torch.cuda.Stream()
    src = torch.ones(small, dtype=torch.uint8).pin_memory()
    dst = torch.empty(small, dtype=torch.uint8, device="cuda")
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        with torch.cuda.stream(big):
            for i in range(backlog // piece):
                dev[i * piece:(i + 1) * piece].copy_(host[i * piece:(i + 1) * piece], non_blocking=True)
        t = time.perf_counter()
        with torch.cuda.stream(mine):
            dst.copy_(src, non_blocking=True)
        mine.synchronize()
        out.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return sorted(out)[len(out) // 2] * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=8.75, help="bytes copied per repetition (8.75 GiB: an 80k-token "
                    "request of the Llama-3.2-3B shape)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--piece-kib", type=int, default=64)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    n = int(a.gib * 2**30)
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    host[::4096] = 1  # touch every page
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    half = n // 2
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def two_streams():
        with torch.cuda.stream(s1):
            dev[:half].copy_(host[:half], non_blocking=True)
        with torch.cuda.stream(s2):
            dev[half:].copy_(host[half:], non_blocking=True)

    piece = a.piece_kib << 10
    pieces = min(n // piece, 16384)  # 1 GiB of 64 KiB pieces: enough to see the per-call cost

    def small_pieces():
        for i in range(pieces):
            dev[i * piece:(i + 1) * piece].copy_(host[i * piece:(i + 1) * piece], non_blocking=True)

    r = {"gpu": torch.cuda.get_device_name(0), "bytes": n, "reps": a.reps,
         "one_copy_GBps": n / timed(lambda: dev.copy_(host, non_blocking=True), a.reps) / 1e9,
         "two_streams_GBps": n / timed(two_streams, a.reps) / 1e9,
         f"pieces_{a.piece_kib}KiB_GBps": pieces * piece / timed(small_pieces, a.reps) / 1e9,
         "d2h_one_copy_GBps": n / timed(lambda: host.copy_(dev, non_blocking=True), a.reps) / 1e9}
    for mib in (0, 128, 1024):
        if mib << 20 <= n:
            r[f"small_copy_behind_{mib}MiB_ms"] = behind_backlog(host, dev, mib << 20, a.reps)
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
