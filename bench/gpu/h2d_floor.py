"""The host-to-GPU floor of a box: a raw copy of one pinned host buffer into GPU memory with torch, nothing of kvtier.

    python3 bench/gpu/h2d_floor.py [--gib 8.75] [--reps 5] [--json OUT]

Prints and writes GB/s for (1) one contiguous copy of the whole buffer, (2) the buffer split in two halves copied at
once on two streams (two requests' loads sharing the link), (3) 1 GiB as 64 KiB pieces, one copy call each (a vLLM
block of one layer of the Llama-3.2-3B shape: what copying block by block would give, and why kvtier's CUDA copier
gathers a transfer's blocks in one launch), (4) the whole buffer back (D2H). The floor DRAM->GPU figures are compared
with (docs/performance.md, "Floors").
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
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
