"""The break-even frontier on a GPU box (issue 6; docs/performance.md, "Break-even frontier on the H200").

Three steps, the first two on the GPU machine (scripts/gpu_frontier.sh runs them), the last anywhere:

  load       g(P): load time of a P-token prefix through kvtier into GPU tensors shaped like vLLM's paged KV cache
             (per layer [num_blocks, kv_heads, 16, 2*head] bf16, scattered block ids), for each model and size:
             disk  - a fresh engine (cold staging pool) promotes the P/256 chunks from their files (io_uring,
                     O_DIRECT where the filesystem allows it); each batch of chunks found ready is pinned and copied
                     to the GPU by the CUDA copier (one launch), overlapping the remaining reads; timed from the
                     first promote to the last copy's completion;
             dram  - the same chunks, now resident in the pool: promote (ready) + pin + one copy launch + wait.
             Every load lands on poisoned blocks and is compared with the stored KV bit for bit.
  recompute  f(D): prefill time of D tokens with transformers, random bf16 weights of the real architecture (SDPA),
             through kvtier.tools.calibrate.offline_recompute (one warm-up per size, as shared/baselines/h200_baseline.py).
  analyze    per model: kvtier.tools.calibrate's frontier model (break-even prefix fraction per document size and tier,
             min_load_tokens), thresholds file (docs/break-even.md), speedup map and minimum-bandwidth plots, plus
             the same model with a 13.5 GB/s SSD in place of this box's disk (the paper's drive) for comparison.

    python3 bench/gpu/frontier.py load --json load.json [--models ...] [--sizes 1k,4k,16k,32k,80k]
    python3 bench/gpu/frontier.py recompute --json recompute.json [--models ...] [--sizes 1k,...,80k]
    python3 bench/gpu/frontier.py analyze --load load.json --recompute recompute.json --out bench/results/h200
    python3 bench/gpu/frontier.py load --fake-cpu ...   # the load logic without a GPU (numpy + memmove)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BLOCK = 16  # vLLM block size (tokens)
BLOCKS_PER_CHUNK = 16  # 256-token chunks
TOKENS_PER_CHUNK = BLOCK * BLOCKS_PER_CHUNK
HEADER_BYTES = 4096
PAPER_SSD_BPS = 13.5e9  # the paper's drives (Kioxia CM7-R / Samsung PM1743)

# The published configs (shapes only; weights are random). kv: layers, kv heads, head size.
MODELS = {
    "llama-3.2-3b": {"kv": (28, 8, 128), "config": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 3072,
        "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": True}},
    "qwen3-4b": {"kv": (36, 8, 128), "config": {
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 2560,
        "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 262144, "rope_theta": 5000000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True}},
    # Qwen2.5-32B's shape (its published config; max_position_embeddings raised to cover 80k, which changes no
    # arithmetic): 64 layers, hidden 5120, 40 query heads, 8 KV heads of 128, MLP 27648.
    "qwen2.5-32b": {"kv": (64, 8, 128), "config": {
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 5120,
        "intermediate_size": 27648, "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8,
        "vocab_size": 152064, "max_position_embeddings": 131072, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False, "use_sliding_window": False}},
}


def kv_bytes_per_token(name: str) -> int:
    layers, heads, head = MODELS[name]["kv"]
    return layers * 2 * heads * head * 2


def layer_block_bytes(name: str) -> int:
    _, heads, head = MODELS[name]["kv"]
    return heads * BLOCK * 2 * head * 2


def _int_list(text: str) -> list[int]:
    out = []
    for x in text.split(","):
        x = x.strip().lower()
        if x:
            out.append(int(float(x.rstrip("k")) * (1024 if x.endswith("k") else 1)))
    return out


def _dump(path: str | None, obj: dict) -> None:
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------------------
# g(P): loads through kvtier into the GPU
# ----------------------------------------------------------------------------------------------------------------

class TorchKV:
    """vLLM-shaped per-layer KV tensors on the GPU, a reference copy, poison and compare."""

    def __init__(self, torch, layers, heads, head, num_blocks, seed):
        self.torch = torch
        dev = torch.device("cuda", 0)
        gen = torch.Generator(device=dev).manual_seed(seed)
        self.kv = [torch.empty((num_blocks, heads, BLOCK, 2 * head), dtype=torch.bfloat16, device=dev)
                   for _ in range(layers)]
        for t in self.kv:
            t.view(torch.int16).copy_(torch.randint(-32768, 32768, t.shape, dtype=torch.int16, device=dev,
                                                    generator=gen))
        self.ref = [t.clone() for t in self.kv]
        torch.cuda.synchronize()
        self.stream = torch.cuda.current_stream().cuda_stream

    def ptrs(self):
        return [t.data_ptr() for t in self.kv]

    def poison(self):
        for t in self.kv:
            t.view(self.torch.int16).fill_(-23131)
        self.torch.cuda.synchronize()

    def equal(self, block_ids: np.ndarray) -> bool:
        idx = self.torch.as_tensor(block_ids.astype(np.int64), device=self.kv[0].device)
        i16 = self.torch.int16  # compare bits: random bf16 patterns include NaNs, which never compare equal
        return all(self.torch.equal(t.view(i16).index_select(0, idx), r.view(i16).index_select(0, idx))
                   for t, r in zip(self.kv, self.ref))

    def sync(self):
        self.torch.cuda.synchronize()


class NumpyKV:
    """--fake-cpu: the same in host memory (addresses of numpy arrays), for the fake copier's memmove."""

    def __init__(self, layers, heads, head, num_blocks, seed):
        rng = np.random.default_rng(seed)
        self.kv = [rng.integers(-32768, 32768, (num_blocks, heads, BLOCK, 2 * head), dtype=np.int16)
                   for _ in range(layers)]
        self.ref = [a.copy() for a in self.kv]
        self.stream = 0

    def ptrs(self):
        return [a.ctypes.data for a in self.kv]

    def poison(self):
        for a in self.kv:
            a.fill(-23131)

    def equal(self, block_ids: np.ndarray) -> bool:
        return all(np.array_equal(a[block_ids], r[block_ids]) for a, r in zip(self.kv, self.ref))

    def sync(self):
        pass


class FakeCopier:
    """--fake-cpu stand-in for kvtier._kvtier_cuda.CudaCopier: memmove, tickets complete at once."""

    def __init__(self, device=0, mode="auto"):
        self.mode = "kernel" if mode == "auto" else mode
        self._next = 1

    def register_host(self, address, nbytes):
        pass

    def copy_batch(self, direction, dst, src, sizes, stream=0):
        for d, s, n in zip(dst.tolist(), src.tolist(), sizes.tolist()):
            ctypes.memmove(d, s, n)
        self._next += 1
        return self._next - 1

    def wait(self, ticket):
        assert ticket < self._next

    def close(self):
        pass


class Layout:
    """Addresses of every (chunk block, layer) segment: slot payload side and GPU block side."""

    def __init__(self, name: str, kv_ptrs: list[int], gpu_ids: np.ndarray, block_stride: int):
        layers = MODELS[name]["kv"][0]
        self.lbb = np.uint64(layer_block_bytes(name))
        self.layer_base = np.array(kv_ptrs, dtype=np.uint64)
        self.layer_off = np.arange(layers, dtype=np.uint64) * self.lbb
        self.block_off = np.arange(BLOCKS_PER_CHUNK, dtype=np.uint64) * np.uint64(block_stride)
        self.gpu_ids = gpu_ids.astype(np.uint64)  # [chunk, block] -> GPU block id

    def segments(self, chunks: list[int], payload: list[int]):
        c = np.asarray(chunks, dtype=np.int64)
        pay = np.asarray(payload, dtype=np.uint64)
        host = pay[:, None, None] + self.block_off[None, :, None] + self.layer_off[None, None, :]
        dev = self.layer_base[None, None, :] + self.gpu_ids[c][:, :, None] * self.lbb
        host = host.reshape(-1)
        return host, dev.reshape(-1), np.full(host.shape, self.lbb, dtype=np.uint64)


def engine_options(root: str, name: str, pool_chunks: int, io_depth: int) -> dict:
    layers = MODELS[name]["kv"][0]
    block_bytes = layers * layer_block_bytes(name)
    slot = HEADER_BYTES + BLOCKS_PER_CHUNK * block_bytes
    return {"root": root, "model": name, "revision": "random-kv-frontier", "kv_dtype": "bfloat16",
            "tokens_per_chunk": TOKENS_PER_CHUNK, "blocks_per_chunk": BLOCKS_PER_CHUNK, "block_bytes": block_bytes,
            "pool_bytes": (pool_chunks + 2 * io_depth + 4) * (slot + 4096), "io_depth": io_depth}


def _until(cond, timeout_s: float, what: str, poll_s: float = 0.002):
    deadline = time.monotonic() + timeout_s
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(poll_s)


def store_chunks(kvtier, copier_cls, kv, name: str, keys: list[bytes], gpu_ids, root: str, batch: int,
                 io_depth: int) -> dict:
    """Engine A: reserve slots, copy the chunks' GPU blocks into them (one d2h launch per batch), commit; wait until
    every chunk is on disk. The pool holds two batches: published chunks are evicted to make room."""
    t0 = time.perf_counter()
    with kvtier.Engine(engine_options(root, name, 2 * batch, io_depth)) as a:
        pool = kvtier.Pool.attach(a.pool_name)
        copier = copier_cls(0, "kernel")
        copier.register_host(pool.base_address, pool.mapped_bytes)
        lay = Layout(name, kv.ptrs(), gpu_ids, a.block_stride)
        for i in range(0, len(keys), batch):
            part = keys[i:i + batch]
            refs = _until(lambda: a.reserve_for_store(part), 300, f"reserve_for_store at chunk {i}")
            assert all(r is not None for r in refs), "chunk already stored: use a fresh root"
            payload = [pool.slot_address(s) + a.payload_offset for s, _ in refs]
            h, d, n = lay.segments(list(range(i, i + len(part))), payload)
            copier.wait(copier.copy_batch("d2h", h, d, n, kv.stream))  # dst = slots, src = GPU blocks
            a.commit_store(part, True)
        _until(lambda: a.stats()["disk_entries"] >= len(keys), 600, "stores did not publish", 0.01)
        st = a.stats()
        describe = a.describe()
        copier.close()
        pool.close()
    s = time.perf_counter() - t0
    return {"store_s": s, "store_gbps": len(keys) * BLOCKS_PER_CHUNK * MODELS[name]["kv"][0]
            * layer_block_bytes(name) / s / 1e9, "disk_entries": st["disk_entries"], "describe": describe}


def load_from_disk(eng, pool, copier, lay, kv, keys: list[bytes], timeout_s: float = 600) -> tuple[float, int]:
    """Cold load of `keys` (none resident): promote all, copy each batch found ready as soon as it is (one launch),
    pinning it; returns (seconds, launches). Leaves every key pinned."""
    index = {k: i for i, k in enumerate(keys)}
    t0 = time.perf_counter()
    pending = list(keys)
    tickets = []
    deadline = time.monotonic() + timeout_s
    while pending:
        ready, left = [], []
        for k in pending:
            state, _, _ = eng.promote(k, False)
            if state == "ready":
                ready.append(k)
            elif state == "pending":
                left.append(k)
            else:
                raise AssertionError(f"promote missed chunk {index[k]}")
        if ready:
            refs = eng.pin(ready)
            payload = [pool.slot_address(s) + eng.payload_offset for s, _ in refs]
            h, d, n = lay.segments([index[k] for k in ready], payload)
            tickets.append(copier.copy_batch("h2d", d, h, n, kv.stream))  # dst = GPU blocks, src = slots
        elif left:
            if time.monotonic() > deadline:
                raise TimeoutError("promotions did not finish")
            time.sleep(0.0005)
        pending = left
    for t in tickets:
        copier.wait(t)
    return time.perf_counter() - t0, len(tickets)


def load_from_dram(eng, pool, copier, lay, kv, keys: list[bytes]) -> float:
    """Every key resident: promote (ready at once) + pin + one copy launch + wait; unpinned afterwards."""
    t0 = time.perf_counter()
    for k in keys:
        state, _, _ = eng.promote(k, False)
        if state != "ready":
            raise AssertionError(f"chunk not resident for the DRAM load: {state}")
    refs = eng.pin(keys)
    payload = [pool.slot_address(s) + eng.payload_offset for s, _ in refs]
    h, d, n = lay.segments(list(range(len(keys))), payload)
    copier.wait(copier.copy_batch("h2d", d, h, n, kv.stream))
    s = time.perf_counter() - t0
    eng.unpin(keys)
    return s


def run_load(a) -> int:
    import kvtier
    torch = None
    if a.fake_cpu:
        copier_cls = FakeCopier
    else:
        import torch
        from kvtier import _kvtier_cuda
        copier_cls = _kvtier_cuda.CudaCopier
    sizes = sorted({-(-s // TOKENS_PER_CHUNK) * TOKENS_PER_CHUNK for s in _int_list(a.sizes)})
    out = {"what": "g(P): kvtier loads into vLLM-shaped GPU KV tensors", "sizes": sizes,
           "device": "fake-cpu" if a.fake_cpu else torch.cuda.get_device_name(0),
           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:], "models": {}}
    ok = True
    for name in a.models.split(","):
        layers, heads, head = MODELS[name]["kv"]
        n_max = max(sizes) // TOKENS_PER_CHUNK
        chunk_bytes = BLOCKS_PER_CHUNK * layers * layer_block_bytes(name)
        root = os.path.join(a.root, name)
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        num_blocks = n_max * BLOCKS_PER_CHUNK + 7
        seed = sum(name.encode())
        kv = NumpyKV(layers, heads, head, num_blocks, seed) if a.fake_cpu else \
            TorchKV(torch, layers, heads, head, num_blocks, seed)
        rng = np.random.default_rng(seed)
        gpu_ids = rng.permutation(num_blocks)[: n_max * BLOCKS_PER_CHUNK].reshape(n_max, BLOCKS_PER_CHUNK)
        keys = [f"{name}/frontier/{i}".encode().ljust(32, b"\0") for i in range(n_max)]
        m = {"kv_bytes_per_token": kv_bytes_per_token(name), "chunk_bytes": chunk_bytes,
             "segments_per_chunk": BLOCKS_PER_CHUNK * layers, "segment_bytes": layer_block_bytes(name), "rows": []}
        m.update(store_chunks(kvtier, copier_cls, kv, name, keys, gpu_ids, root, a.store_batch, a.io_depth))
        print(f"{name}: stored {n_max} chunks ({n_max * chunk_bytes / 2**30:.1f} GiB) in {m['store_s']:.1f} s "
              f"({m['store_gbps']:.2f} GB/s)", flush=True)
        for p in sizes:
            n = p // TOKENS_PER_CHUNK
            part = keys[:n]
            with kvtier.Engine(engine_options(root, name, n, a.io_depth)) as eng:  # fresh pool: a cold DRAM tier
                pool = kvtier.Pool.attach(eng.pool_name)
                copier = copier_cls(0, "kernel")
                t0 = time.perf_counter()
                copier.register_host(pool.base_address, pool.mapped_bytes)
                reg_s = time.perf_counter() - t0
                assert all(eng.lookup(k) == "disk" for k in part)
                lay = Layout(name, kv.ptrs(), gpu_ids, eng.block_stride)
                read0 = eng.stats()["bytes_read"]
                kv.poison()
                disk_s, launches = load_from_disk(eng, pool, copier, lay, kv, part)
                kv.sync()
                disk_exact = kv.equal(gpu_ids[:n].reshape(-1))
                bytes_read = eng.stats()["bytes_read"] - read0
                eng.unpin(part)
                dram, dram_exact = [], True
                for r in range(a.dram_reps):
                    kv.poison()
                    dram.append(load_from_dram(eng, pool, copier, lay, kv, part))
                    if r == 0:
                        kv.sync()
                        dram_exact = kv.equal(gpu_ids[:n].reshape(-1))
                read_dram = eng.stats()["bytes_read"] - read0 - bytes_read
                describe = eng.describe()
                copier.close()
                pool.close()
            payload = n * chunk_bytes
            row = {"tokens": p, "chunks": n, "payload_bytes": payload, "disk_s": disk_s, "disk_launches": launches,
                   "disk_gbps": payload / disk_s / 1e9, "disk_bytes_read": bytes_read, "disk_exact": disk_exact,
                   "dram_s": statistics.median(dram), "dram_samples_s": dram,
                   "dram_gbps": payload / statistics.median(dram) / 1e9, "dram_bytes_read": read_dram,
                   "dram_exact": dram_exact, "register_s": reg_s}
            m["rows"].append(row)
            m["engine"] = describe
            ok &= disk_exact and dram_exact and read_dram == 0
            print(f"{name:12s} P={p:6d}  disk {disk_s * 1e3:8.1f} ms ({row['disk_gbps']:5.2f} GB/s, {launches} "
                  f"launches, {'exact' if disk_exact else 'MISMATCH'})  dram {row['dram_s'] * 1e3:7.1f} ms "
                  f"({row['dram_gbps']:5.1f} GB/s, {'exact' if dram_exact else 'MISMATCH'})  "
                  f"register {reg_s:.2f} s", flush=True)
            out["models"][name] = m
            _dump(a.json, out)
        shutil.rmtree(root, ignore_errors=True)
        del kv
        if torch is not None:
            torch.cuda.empty_cache()
    out["ok"] = ok
    _dump(a.json, out)
    return 0 if ok else 1


# ----------------------------------------------------------------------------------------------------------------
# f(D): prefill with transformers (kvtier.tools.calibrate.offline_recompute)
# ----------------------------------------------------------------------------------------------------------------

def run_recompute(a) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    import transformers
    from kvtier.tools import calibrate

    sizes = _int_list(a.sizes)
    out = {"what": "f(D): transformers prefill, random bf16 weights", "sizes": sizes, "reps": a.reps,
           "max_rep_s": a.max_rep_s, "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
           "torch": torch.__version__, "transformers": transformers.__version__,
           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "models": {}}
    tmp = tempfile.mkdtemp(prefix="kvtier-frontier-cfg-")
    for name in a.models.split(","):
        d = os.path.join(tmp, name)
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(dict(MODELS[name]["config"], torch_dtype="bfloat16"), f)
        t0 = time.perf_counter()
        try:
            samples = calibrate.offline_recompute(d, sizes, a.reps, random_weights=True, max_rep_s=a.max_rep_s,
                                                  stop_on_oom=True)
            err = None
        except Exception as e:  # noqa: BLE001 - keep the other models' results
            samples, err = [], f"{type(e).__name__}: {e}"
            print(f"{name}: FAILED {err}", flush=True)
        out["models"][name] = {"kv_bytes_per_token": kv_bytes_per_token(name), "config": MODELS[name]["config"],
                               "samples": samples, "error": err, "wall_s": time.perf_counter() - t0}
        for d_ in sizes:
            ts = [s["ttft_s"] for s in samples if s["kind"] == "cold" and s["doc_tokens"] == d_]
            if ts:
                first = next(s for s in samples if s["doc_tokens"] == d_)
                print(f"{name:12s} D={d_:6d}  f {statistics.median(ts) * 1e3:9.1f} ms  (warm-up "
                      f"{first['warmup_s'] * 1e3:.1f} ms, {len(ts)} timed, attn {first['attn_implementation']}, "
                      f"build {first['build_s']} s)", flush=True)
            elif any(s["kind"] == "oom" and s["doc_tokens"] == d_ for s in samples):
                print(f"{name:12s} D={d_:6d}  out of device memory: sweep stopped", flush=True)
        _dump(a.json, out)
        torch.cuda.empty_cache()
    return 0


# ----------------------------------------------------------------------------------------------------------------
# The frontier: calibrate's model per model and tier, thresholds, plots
# ----------------------------------------------------------------------------------------------------------------

def frontier_samples(rec: dict, load: dict | None) -> list[dict]:
    """calibrate's sample records: cold (f) from the prefill runs, hit (g, fraction 1) per tier from the loads."""
    samples = [s for s in rec["samples"] if s["kind"] == "cold"]
    rows = (load or {}).get("rows", [])
    one = [r for r in rows if r["chunks"] == 1]
    if one:  # a load moves whole chunks: a hit of fewer tokens costs what one chunk from DRAM does (t0)
        samples.append({"kind": "overhead", "tier": None, "ttft_s": one[0]["dram_s"]})
    for r in rows:
        samples.append({"kind": "hit", "tier": "disk", "doc_tokens": r["tokens"], "fraction": 1.0,
                        "ttft_s": r["disk_s"]})
        for t in r["dram_samples_s"]:
            samples.append({"kind": "hit", "tier": "dram", "doc_tokens": r["tokens"], "fraction": 1.0, "ttft_s": t})
    return samples


def analyze_model(calibrate, name: str, rec: dict, load: dict | None, out: Path, plots: bool,
                  box_disk_bps: float | None) -> dict:
    kvb = kv_bytes_per_token(name)
    summary = calibrate.summarize(frontier_samples(rec, load))
    model = calibrate.build_model(summary, kvb, TOKENS_PER_CHUNK)
    model["measured_with"] = ("f(D): transformers prefill, random bf16 weights, SDPA; g(P): kvtier engine + CUDA "
                              "copier into vLLM-shaped GPU tensors (no request overhead on either side)")
    th = calibrate.json_safe(calibrate.thresholds(model, name))
    calibrate.write_json(out / f"thresholds-{name}.json", th)
    # the paper's drive in place of this box's disk: same f; g_disk(P) = g_dram(P) + KV bytes / 13.5 GB/s (the read,
    # then this path's DRAM hit: no overlap, so an upper bound for such a drive behind this engine)
    paper_samples = [s for s in frontier_samples(rec, load) if s["kind"] != "hit" or s["tier"] == "dram"]
    paper_samples += [{"kind": "hit", "tier": "disk", "doc_tokens": p, "fraction": 1.0,
                       "ttft_s": g + p * kvb / PAPER_SSD_BPS}
                      for (p, fr), g in summary["h"].get("dram", {}).items() if abs(fr - 1.0) < 1e-9]
    paper = calibrate.build_model(calibrate.summarize(paper_samples), kvb, TOKENS_PER_CHUNK)
    if plots:
        title = f"{name} on the H200 (f: transformers prefill; g: kvtier -> GPU)"
        calibrate.plot_speedup_map(model, out / f"speedup_map-{name}.png", title)
        ref = {"this box's disk (raw O_DIRECT)": box_disk_bps} if box_disk_bps else {}
        ref["paper's SSD"] = PAPER_SSD_BPS
        ref["PCIe 5 x16 H2D (pinned)"] = 55e9
        calibrate.plot_min_bandwidth(model, out / f"min_bandwidth-{name}.png",
                                     f"{name} on the H200: KV bandwidth needed to break even", ref)
    return {"model": model, "thresholds": th, "paper_ssd_model": paper, "report": calibrate.report(model, th)}


def frontier_fraction(calibrate, f, g, d: float, steps: int = 2000) -> float | None:
    """The break-even line: the smallest prefix fraction p such that loading pays (calibrate.speedup >= 1) for
    every fraction from p to 1; None when even a full hit does not pay. (calibrate.break_even_fraction returns the
    first fraction that pays, which under f(D - P) can be a sliver near 0 below a region that does not.)"""
    if calibrate.speedup(f, g, d, 1.0) < 1.0:
        return None
    lo = 0.0
    for i in range(steps - 1, -1, -1):
        p = i / steps
        if calibrate.speedup(f, g, d, p) < 1.0:
            lo = p
            break
    else:
        return 0.0
    hi = lo + 1.0 / steps
    for _ in range(40):
        mid = (lo + hi) / 2
        if calibrate.speedup(f, g, d, mid) >= 1.0:
            hi = mid
        else:
            lo = mid
    return hi


def causal_tokens(f, g, max_tokens: int, step: int = 16) -> int | None:
    """Smallest P from which on g(P) <= f(P) up to max_tokens: the prefix from which a load pays whatever follows
    it, when the suffix's prefill costs f(D) - f(P) (causal attention, FLOP-additive)."""
    p, first = step, None
    while p <= max_tokens:
        if g(p) <= f(p):
            first = p if first is None else first
        else:
            first = None
        p += step
    return first


def frontier_table(results: dict) -> str:
    """Markdown: per model and document size, f, g per tier, break-even fraction per tier (and with 13.5 GB/s)."""
    lines = ["| model | D | f(D) ms | g disk(D) ms | g DRAM(D) ms | break-even P/D disk | break-even P/D DRAM | "
             "P/D, 13.5 GB/s drive | causal: disk P* / D | min GB/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    from kvtier.tools import calibrate

    def pct(v):
        return "never" if v is None else f"{100 * v:.1f}%"

    for name, r in results.items():
        m, paper = r["model"], r["paper_ssd_model"]
        f = calibrate.recompute_curve(dict(zip(m["sizes"], m["f"])))
        curves = {}
        for src, mm in (("", m), ("paper", paper)):
            for t, e in mm["tiers"].items():
                curves[src + t] = calibrate.hit_curve(dict(zip(e["hit_sizes"], e["g"])), mm.get("t0"))
        pstar = causal_tokens(f, curves["disk"], max(m["sizes"])) if "disk" in curves else None
        r["frontier_rows"] = []
        for i, d in enumerate(m["sizes"]):
            be = {k: frontier_fraction(calibrate, f, c, d) for k, c in curves.items()}
            cells = [name, f"{d // 1024}k" if d % 1024 == 0 else str(d), f"{f(d) * 1e3:.0f}"]
            cells += [f"{curves[t](d) * 1e3:.0f}" if t in curves else "-" for t in ("disk", "dram")]
            cells += [pct(be[k]) if k in be else "-" for k in ("disk", "dram", "paperdisk")]
            cells.append("never" if pstar is None or pstar > d else f"{pstar} = {100 * pstar / d:.1f}%")
            bw = m["min_bandwidth_Bps"][i]
            cells.append(f"{bw / 1e9:.2f}" if bw else "-")
            lines.append("| " + " | ".join(cells) + " |")
            r["frontier_rows"].append({"doc_tokens": d, "f_s": f(d), **{f"g_{k}_s": c(d) for k, c in curves.items()},
                                       **{f"break_even_{k}": v for k, v in be.items()}, "causal_disk_tokens": pstar,
                                       "min_bandwidth_Bps": bw})
    return "\n".join(lines)


def run_analyze(a) -> int:
    from kvtier.tools import calibrate
    rec = json.load(open(a.recompute))
    load = json.load(open(a.load)) if a.load and os.path.exists(a.load) else {"models": {}}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, r in rec["models"].items():
        if not any(s["kind"] == "cold" for s in r["samples"]):
            print(f"{name}: no recompute samples ({r.get('error')})")
            continue
        results[name] = analyze_model(calibrate, name, r, load["models"].get(name), out, not a.no_plots,
                                      a.box_disk_gbps * 1e9 if a.box_disk_gbps else None)
        print(f"== {name}\n{results[name]['report']}")
    table = frontier_table(results)
    print(table)
    doc = {"inputs": {"recompute": a.recompute, "load": a.load}, "table_md": table,
           "frontier": {n: {"rows": r.get("frontier_rows"), "model": r["model"],
                            "paper_ssd_model": r["paper_ssd_model"],
                            "min_load_tokens": {t: r["thresholds"]["tiers"][t]["min_load_tokens"]
                                                for t in ("dram", "disk")}} for n, r in results.items()}}
    calibrate.write_json(out / a.name, calibrate.json_safe(doc))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ld = sub.add_parser("load")
    ld.add_argument("--models", default="llama-3.2-3b,qwen3-4b,qwen2.5-32b")
    ld.add_argument("--sizes", default="256,1k,4k,16k,32k,80k")
    ld.add_argument("--root", default="/var/tmp/kvtier-frontier")
    ld.add_argument("--io-depth", type=int, default=16)
    ld.add_argument("--store-batch", type=int, default=32)
    ld.add_argument("--dram-reps", type=int, default=3)
    ld.add_argument("--json", default=None)
    ld.add_argument("--fake-cpu", action="store_true")
    rc = sub.add_parser("recompute")
    rc.add_argument("--models", default="llama-3.2-3b,qwen3-4b,qwen2.5-32b")
    rc.add_argument("--sizes", default="1k,4k,8k,16k,32k,64k,80k")
    rc.add_argument("--reps", type=int, default=3)
    rc.add_argument("--max-rep-s", type=float, default=10.0, help="fewer timed reps where a pass is long")
    rc.add_argument("--json", default=None)
    an = sub.add_parser("analyze")
    an.add_argument("--recompute", required=True)
    an.add_argument("--load", default=None)
    an.add_argument("--out", required=True)
    an.add_argument("--name", default="frontier.json")
    an.add_argument("--box-disk-gbps", type=float, default=None, help="reference line: this box's raw disk")
    an.add_argument("--no-plots", action="store_true")
    a = ap.parse_args()
    return {"load": run_load, "recompute": run_recompute, "analyze": run_analyze}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
