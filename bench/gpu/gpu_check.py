"""GPU correctness tests and copy benchmarks of kvtier's CUDA copier (scripts/gpu_bench.sh runs this on the GPU box).

KV lives in GPU tensors shaped like vLLM's per-layer paged KV cache, blocks first: layer l is
[num_blocks, num_kv_heads, block_size=16, 2*head_size] bf16, so one layer of one GPU block is contiguous and a
256-token chunk (16 blocks) is 16 * layers scattered segments. For each model and each copy mode:

  store   engine A reserves slots; the copier copies scattered GPU blocks into them (d2h, one launch); the engine
          writes and publishes the chunks; engine A closes.
  load    engine B (same root, fresh pool) promotes every chunk (disk read + checksum into a slot) and pins it;
          the GPU tensors are poisoned; the copier copies whole chunks and partial ranges (blocks 5..11) into other
          scattered block ids (h2d, one launch); every loaded block must equal the stored one bit for bit, every
          block not loaded must still hold the poison.
  bench   with the same pinned slots: pool->GPU and GPU->pool of every chunk (one launch each) against a raw
          pinned cudaMemcpyAsync of the same bytes (torch's non_blocking copy), alternating, median of many.

Prints one JSON document (to --json, and a summary to stdout). `--report FILE...` prints the table of
scripts/gpu_bench.sh from this script's JSON and kvtier_gpu_bench's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import zlib

import numpy as np

MODELS = {  # layers, kv heads, head size (the published configs)
    "llama-3.2-3b": (28, 8, 128),
    "qwen3-4b": (36, 8, 128),
}
BLOCK_SIZE = 16
BLOCKS_PER_CHUNK = 16
HEADER_BYTES = 4096
POISON = -23131  # int16 0xA5A5


def layer_block_bytes(model: str) -> int:
    _, heads, head = MODELS[model]
    return heads * BLOCK_SIZE * 2 * head * 2


def segments(kv, lbb: int, slot_payload: list[int], block_stride: int, chunk_blocks: list[range], gpu_ids):
    """Host (slot) and device addresses of every (chunk block, layer) segment, as uint64 arrays.

    slot_payload[i]: address of chunk i's payload in its slot; chunk_blocks[i]: the chunk's blocks to copy;
    gpu_ids[i][b]: the GPU block id of chunk i's block b."""
    host, dev = [], []
    layer_base = np.array([t.data_ptr() for t in kv], dtype=np.uint64)
    offs = np.arange(len(kv), dtype=np.uint64) * np.uint64(lbb)
    for i, blocks in enumerate(chunk_blocks):
        for b in blocks:
            host.append(np.uint64(slot_payload[i] + b * block_stride) + offs)
            dev.append(layer_base + np.uint64(int(gpu_ids[i][b]) * lbb))
    h = np.concatenate(host).astype(np.uint64)
    d = np.concatenate(dev).astype(np.uint64)
    return h, d, np.full(h.shape, lbb, dtype=np.uint64)


def engine_options(root: str, model: str, revision: str, chunks: int) -> dict:
    layers = MODELS[model][0]
    lbb = layer_block_bytes(model)
    slot = HEADER_BYTES + BLOCKS_PER_CHUNK * layers * lbb
    return {
        "root": root, "model": model, "revision": revision, "kv_dtype": "bfloat16",
        "tokens_per_chunk": BLOCKS_PER_CHUNK * BLOCK_SIZE, "blocks_per_chunk": BLOCKS_PER_CHUNK,
        "block_bytes": layers * lbb, "pool_bytes": (chunks + 18) * (slot + 4096), "io_depth": 16,
    }


def promote_all(engine, keys, timeout_s=120.0):
    deadline = time.monotonic() + timeout_s
    pending = list(keys)
    while pending:
        left = []
        for k in pending:
            state, _, _ = engine.promote(k, False)
            if state == "miss":
                raise AssertionError(f"promote missed chunk {k.hex()}")
            if state == "pending":
                left.append(k)
        pending = left
        if pending:
            if time.monotonic() > deadline:
                raise TimeoutError("promote did not finish")
            time.sleep(0.001)


def time_pair(fn_ours, fn_raw, iters: int):
    ours, raw = [], []
    for _ in range(3):
        fn_ours()
        fn_raw()
    for _ in range(iters):
        t0 = time.perf_counter()
        fn_ours()
        t1 = time.perf_counter()
        fn_raw()
        t2 = time.perf_counter()
        ours.append(t1 - t0)
        raw.append(t2 - t1)
    return statistics.median(ours), statistics.median(raw), ours, raw


def run_model(torch, kvtier, cuda_ext, model: str, mode: str, chunks: int, root: str, iters: int) -> dict:
    layers, heads, head = MODELS[model]
    lbb = layer_block_bytes(model)
    fake = not torch.cuda.is_available()  # --fake-cpu: the logic of this script on a machine without a GPU
    dev = torch.device("cpu") if fake else torch.device("cuda", 0)
    num_blocks = 2 * chunks * BLOCKS_PER_CHUNK + 7
    gen = torch.Generator(device="cpu").manual_seed(zlib.crc32(f"{model}/{mode}".encode()))
    kv = [torch.empty((num_blocks, heads, BLOCK_SIZE, 2 * head), dtype=torch.bfloat16, device=dev)
          for _ in range(layers)]
    for t in kv:
        t.view(torch.int16).copy_(torch.randint(-32768, 32768, t.shape, dtype=torch.int16, generator=gen))
    assert kv[0][1].data_ptr() - kv[0][0].data_ptr() == lbb
    perm = torch.randperm(num_blocks, generator=gen).numpy()
    store_ids = perm[: chunks * BLOCKS_PER_CHUNK].reshape(chunks, BLOCKS_PER_CHUNK)
    load_ids = perm[chunks * BLOCKS_PER_CHUNK: 2 * chunks * BLOCKS_PER_CHUNK].reshape(chunks, BLOCKS_PER_CHUNK)
    keys = [f"{model}/{mode}/chunk{i}".encode().ljust(32, b"\0") for i in range(chunks)]
    revision = f"random-{mode}"
    stream = 0 if fake else torch.cuda.current_stream().cuda_stream
    out = {"model": model, "mode": mode, "chunks": chunks, "segment_bytes": lbb,
           "segments_per_chunk": BLOCKS_PER_CHUNK * layers, "chunk_bytes": BLOCKS_PER_CHUNK * layers * lbb}

    copier = cuda_ext.CudaCopier(0, mode)
    assert copier.mode == mode, (copier.mode, mode)

    # --- store: GPU blocks -> reserved slots -> disk (engine A) ---------------------------------------------------
    with kvtier.Engine(engine_options(root, model, revision, chunks)) as a:
        pool = kvtier.Pool.attach(a.pool_name)
        t0 = time.perf_counter()
        copier.register_host(pool.base_address, pool.mapped_bytes)
        out["register_s"] = time.perf_counter() - t0
        out["registered_bytes"] = pool.mapped_bytes
        refs = a.reserve_for_store(keys)
        assert refs is not None and all(r is not None for r in refs), refs
        payload = [pool.slot_address(s) + HEADER_BYTES for s, _ in refs]
        h, d, n = segments(kv, lbb, payload, a.block_stride, [range(BLOCKS_PER_CHUNK)] * chunks, store_ids)
        ticket = copier.copy_batch("d2h", h, d, n, stream)  # dst = slots, src = GPU blocks
        copier.wait(ticket)
        assert copier.query(ticket)
        a.commit_store(keys, True)
        deadline = time.monotonic() + 120
        while a.stats()["disk_entries"] < chunks:  # committed stores publish asynchronously
            assert time.monotonic() < deadline, a.stats()
            time.sleep(0.005)
        pool.close()
        copier.close()  # unregisters engine A's pool before it goes away

    # --- load: disk -> slots (engine B, fresh pool) -> poisoned GPU blocks ---------------------------------------
    copier = cuda_ext.CudaCopier(0, mode)
    with kvtier.Engine(engine_options(root, model, revision, chunks)) as b:
        assert all(b.lookup(k) == "disk" for k in keys), [b.lookup(k) for k in keys]
        promote_all(b, keys)
        refs = b.pin(keys)
        pool = kvtier.Pool.attach(b.pool_name)
        copier.register_host(pool.base_address, pool.mapped_bytes)
        payload = [pool.slot_address(s) + HEADER_BYTES for s, _ in refs]
        reference = [t.clone() for t in kv]
        for t in kv:
            t.view(torch.int16).fill_(POISON)
        # whole chunks, and blocks 5..11 of every third chunk (a partial-chunk load)
        ranges = [range(5, 12) if i % 3 == 1 else range(BLOCKS_PER_CHUNK) for i in range(chunks)]
        h, d, n = segments(kv, lbb, payload, b.block_stride, ranges, load_ids)
        ticket = copier.copy_batch("h2d", d, h, n, stream)  # dst = GPU blocks, src = slots
        copier.stream_wait(ticket, stream)  # the consumer's stream waits on the device, no host block
        if not fake:
            torch.cuda.current_stream().synchronize()
        assert copier.query(ticket)
        loaded_dst, loaded_src, untouched = [], [], []
        for i, r in enumerate(ranges):
            for blk in range(BLOCKS_PER_CHUNK):
                if blk in r:
                    loaded_dst.append(int(load_ids[i][blk]))
                    loaded_src.append(int(store_ids[i][blk]))
                else:
                    untouched.append(int(load_ids[i][blk]))
        ld = torch.tensor(loaded_dst, device=dev)
        ls = torch.tensor(loaded_src, device=dev)
        un = torch.tensor(untouched, device=dev, dtype=torch.long)
        mismatched_layers = 0
        poison_broken = 0
        for l in range(layers):
            got = kv[l].view(torch.int16).index_select(0, ld)
            want = reference[l].view(torch.int16).index_select(0, ls)
            mismatched_layers += int(not torch.equal(got, want))
            if len(untouched):
                poison_broken += int((kv[l].view(torch.int16).index_select(0, un) != POISON).any().item())
        out["load_exact"] = mismatched_layers == 0 and poison_broken == 0
        out["loaded_blocks"] = len(loaded_dst)
        out["partial_chunks"] = sum(1 for r in ranges if len(r) != BLOCKS_PER_CHUNK)
        out["mismatched_layers"] = mismatched_layers
        out["poison_broken_layers"] = poison_broken
        del reference

        # --- bench: every chunk whole, pool->GPU and GPU->pool, against raw pinned cudaMemcpyAsync ------------
        full = [range(BLOCKS_PER_CHUNK)] * chunks
        h, d, n = segments(kv, lbb, payload, b.block_stride, full, load_ids)
        total = int(n.sum())
        pinned = torch.empty(total, dtype=torch.uint8, pin_memory=not fake)
        pinned.fill_(7)
        flat = torch.empty(total, dtype=torch.uint8, device=dev)
        s = None if fake else torch.cuda.Stream()

        def ours(direction):
            def f():
                t = (copier.copy_batch("h2d", d, h, n, stream) if direction == "h2d"
                     else copier.copy_batch("d2h", h, d, n, stream))
                copier.wait(t)
            return f

        def raw(direction):
            def f():
                if fake:
                    (flat.copy_(pinned) if direction == "h2d" else pinned.copy_(flat))
                    return
                with torch.cuda.stream(s):
                    if direction == "h2d":
                        flat.copy_(pinned, non_blocking=True)
                    else:
                        pinned.copy_(flat, non_blocking=True)
                s.synchronize()
            return f

        for direction in ("h2d", "d2h"):
            o, r, os_, rs = time_pair(ours(direction), raw(direction), iters)
            out[f"{direction}_bytes"] = total
            out[f"{direction}_gbps"] = total / o / 1e9
            out[f"{direction}_raw_gbps"] = total / r / 1e9
            out[f"{direction}_ratio"] = r / o
            out[f"{direction}_samples_s"] = os_
            out[f"{direction}_raw_samples_s"] = rs
        # the d2h timing wrote the same bytes back (same block mapping): the resident chunks are unchanged
        b.unpin(keys)
        pool.close()
        copier.close()
    return out


class FakeCudaExt:
    """Stands in for kvtier._kvtier_cuda on a machine without a GPU (--fake-cpu): memmove, tickets done at once."""

    class CudaCopier:
        def __init__(self, device=0, mode="auto"):
            self.mode = "kernel" if mode == "auto" else mode
            self._next = 1

        def register_host(self, address, nbytes):
            pass

        def copy_batch(self, direction, dst, src, sizes, stream=0):
            import ctypes
            assert direction in ("h2d", "d2h") and dst.dtype == np.uint64 and len(dst) == len(src) == len(sizes)
            for d, s, n in zip(dst.tolist(), src.tolist(), sizes.tolist()):
                ctypes.memmove(d, s, n)
            self._next += 1
            return self._next - 1

        def query(self, ticket):
            return ticket < self._next

        def wait(self, ticket):
            assert ticket < self._next

        def stream_wait(self, ticket, stream):
            pass

        def close(self):
            pass


def report(paths: list[str]) -> None:
    rows = []
    for p in paths:
        with open(p) as f:
            doc = json.load(f)
        for r in doc.get("copy", []):
            rows.append((f"pool->GPU {r['model']} {r['mode']}", r["h2d_gbps"], r["h2d_raw_gbps"], r["h2d_ratio"],
                         0.9, "exact" if r["load_exact"] else "MISMATCH"))
            rows.append((f"GPU->pool {r['model']} {r['mode']}", r["d2h_gbps"], r["d2h_raw_gbps"], r["d2h_ratio"],
                         0.9, ""))
        for r in doc.get("disk", []):
            rows.append((f"disk->GPU engine {r['model']} {r['mode']}", r["engine_disk_to_gpu_gbps"],
                         min(r["raw_disk_gbps"], r["raw_h2d_gbps"]), r["disk_to_gpu_ratio"], 0.9,
                         "exact" if r["load_exact"] else "MISMATCH"))
            rows.append((f"DRAM->GPU engine {r['model']} {r['mode']}", r["engine_dram_to_gpu_gbps"],
                         r["raw_h2d_gbps"], r["dram_to_gpu_ratio"], 0.9, ""))
    print(f"{'path':44s} {'GB/s':>7s} {'raw GB/s':>9s} {'ratio':>6s} {'target':>6s}  check")
    for name, ours, raw, ratio, target, check in rows:
        flag = "ok" if ratio >= target else "BELOW"
        print(f"{name:44s} {ours:7.2f} {raw:9.2f} {ratio:6.3f} {target:6.2f}  {flag} {check}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="llama-3.2-3b,qwen3-4b")
    ap.add_argument("--modes", default="kernel,batch_api")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--root", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--report", nargs="*", default=None)
    ap.add_argument("--fake-cpu", action="store_true", help="check this script's logic without a GPU (memmove copier)")
    args = ap.parse_args()
    if args.report is not None:
        report(args.report)
        return 0

    import torch
    import kvtier
    if args.fake_cpu:
        cuda_ext = FakeCudaExt
    else:
        from kvtier import _kvtier_cuda as cuda_ext

    root = args.root or tempfile.mkdtemp(prefix="kvtier-gpu-")
    results = {"device": "fake-cpu" if args.fake_cpu else torch.cuda.get_device_name(0), "torch": torch.__version__,
               "cuda": torch.version.cuda, "copy": []}
    ok = True
    for model in args.models.split(","):
        for mode in args.modes.split(","):
            sub = os.path.join(root, f"{model}-{mode}")
            os.makedirs(sub, exist_ok=True)
            r = run_model(torch, kvtier, cuda_ext, model, mode, args.chunks, sub, args.iters)
            ok &= r["load_exact"]
            results["copy"].append(r)
            print(f"{model:14s} {mode:9s} load {'EXACT' if r['load_exact'] else 'MISMATCH'} "
                  f"({r['loaded_blocks']} blocks, {r['partial_chunks']} partial chunks)  "
                  f"h2d {r['h2d_gbps']:.1f} GB/s (raw {r['h2d_raw_gbps']:.1f}, x{r['h2d_ratio']:.3f})  "
                  f"d2h {r['d2h_gbps']:.1f} GB/s (raw {r['d2h_raw_gbps']:.1f}, x{r['d2h_ratio']:.3f})  "
                  f"register {r['register_s']:.2f}s for {r['registered_bytes'] >> 20} MiB", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
