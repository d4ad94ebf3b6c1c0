#!/usr/bin/env python3
"""Side by side with the peers: kvtier vs vLLM's native filesystem tier vs LMCache's LocalDiskBackend vs the raw
io_uring baseline (`kvtier bench io`), on the same directory, the same chunk sizes and the same number of bytes.

Run through bench/peers/run.sh (it creates the peers venv and passes the interpreters). Two roles:

  bench.py orchestrate --out DIR ...      runs every (variant, chunk size, repetition) in its own worker process,
                                          runs the raw baseline, writes results.json, table.md and peers.png
  bench.py worker --variant V ...         one repetition of one variant: store, drop caches, cold load, warm load;
                                          prints one JSON line

Each worker measures, per phase, the wall time, the CPU seconds of its whole process (getrusage RUSAGE_SELF: all
threads), the bytes its process read from the block layer (/proc/self/io read_bytes) and, at the end, its peak RSS
(ru_maxrss). Only this file's own code is used to drive the peers; their storage layers are imported from their
installed packages and called the way their own code calls them (see docs/performance.md for the entry points).
"""

import argparse
import ctypes
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time

GiB = 1 << 30
MiB = 1 << 20

# Model shapes (bf16, 256-token chunks of 16 vLLM blocks of 16 tokens).
#   llama3b: Llama-3.2-3B: 28 layers x 2 (K,V) x 8 KV heads x 128 dims x 2 B = 112 KiB/token -> 28 MiB per chunk
#   small:   16 layers x 2 x 2 KV heads x 64 dims x 2 B = 8 KiB/token -> 2 MiB per chunk
MODELS = {
    "llama3b": dict(name="meta-llama/Llama-3.2-3B", layers=28, kv_heads=8, head_dim=128),
    "small": dict(name="bench/small-16L-2H-64D", layers=16, kv_heads=2, head_dim=64),
}
TOKENS_PER_CHUNK = 256
BLOCKS_PER_CHUNK = 16


def chunk_bytes(model):
    m = MODELS[model]
    return 2 * m["layers"] * m["kv_heads"] * m["head_dim"] * 2 * TOKENS_PER_CHUNK


# Variants: (peer, options). "defaults" = the peer's own defaults; "tuned" = the options its docs/source offer.
VARIANTS = {
    "kvtier": ("kvtier", {}),  # EngineOptions defaults: io_mode auto (O_DIRECT here), io_depth 16, io_uring
    "kvtier-slot": ("kvtier-slot", {}),  # the vLLM adapter's path: reserve/commit stores, promote/pin loads
    "kvtier-slot-whole": ("kvtier-slot", {"read_piece_bytes": 0}),  # the same, a chunk read in one request
    "kvtier-qd32": ("kvtier", {"io_depth": 32}),
    "kvtier-buffered": ("kvtier", {"io_mode": "buffered"}),
    "vllm-fs": ("vllm", {}),  # FileSystemTierManager defaults: 16 read + 16 write threads, O_DIRECT always
    "vllm-fs-4+4": ("vllm", {"n_read_threads": 4, "n_write_threads": 4}),
    "lmcache": ("lmcache", {}),  # LocalDiskBackend defaults: 4 disk threads, buffered
    "lmcache-odirect": ("lmcache", {"use_odirect": True, "disk_io_threads": 8}),
}

STAGING_BYTES = 1 * GiB  # every peer gets the same staging memory: kvtier pool, vLLM primary region, LMCache CPU pool


# ---------------------------------------------------------------------------------------------------------------
# measurement helpers


def proc_io():
    out = {}
    with open("/proc/self/io") as f:
        for line in f:
            k, v = line.split(":")
            out[k.strip()] = int(v)
    return out


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def rss_now():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def syncfs(path):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        libc.syncfs(fd)
    finally:
        os.close(fd)


def drop_caches():
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def measured(fn):
    """Runs fn(); returns (seconds, cpu seconds, bytes read from the block layer) of this process."""
    io0, c0, t0 = proc_io(), cpu_s(), time.perf_counter()
    fn()
    t1, c1, io1 = time.perf_counter(), cpu_s(), proc_io()
    return t1 - t0, c1 - c0, io1["read_bytes"] - io0["read_bytes"]


def random_fill(buf_u8):
    """Fills a writable uint8 numpy view with pseudo-random bytes (incompressible, not zero pages)."""
    import numpy as np

    rng = np.random.default_rng(len(buf_u8))
    step = 64 * MiB
    for off in range(0, len(buf_u8), step):
        n = min(step, len(buf_u8) - off)
        buf_u8[off : off + n] = rng.integers(0, 256, n, dtype=np.uint8)


# ---------------------------------------------------------------------------------------------------------------
# peers


def kvtier_options(root, model, opts):
    """The engine options both kvtier variants run with: the model's chunk geometry, the shared staging size."""
    return {"root": root, "model": MODELS[model]["name"], "revision": "bench-peers", "kv_dtype": "bfloat16",
            "tokens_per_chunk": TOKENS_PER_CHUNK, "blocks_per_chunk": BLOCKS_PER_CHUNK,
            "block_bytes": chunk_bytes(model) // BLOCKS_PER_CHUNK, "pool_bytes": STAGING_BYTES, **opts}


class KvtierPeer:
    """kvtier's Python API (docs/python-api.md): Engine.store / Engine.load from and into host buffers.

    Host path: every chunk is also memcpy'd between the host buffer and a staging slot (the peers start from and
    end in their own staging memory, so this is extra work on kvtier's side). Set-up stores and loads one pool's
    worth of other keys (untimed), so the pool's shared-memory pages are faulted in, as the peers' own set-up does
    for their staging memory (vLLM: MADV_POPULATE_WRITE; LMCache: its allocator). The data set is twice the pool,
    so the timed loads, in store order, miss the pool (LRU) and read from disk; read_bytes checks that."""

    def __init__(self, root, model, n, opts):
        import numpy as np
        import kvtier

        self.kvtier, self.np = kvtier, np
        self.root, self.chunk, self.n = root, chunk_bytes(model), n
        self.options = kvtier_options(root, model, opts)
        self.engine = kvtier.Engine(self.options)
        nbuf = 16
        self.bufs = np.empty((nbuf, self.chunk), dtype=np.uint8)
        random_fill(self.bufs.reshape(-1))
        self.addrs = [self.bufs[i].ctypes.data for i in range(nbuf)]
        warm = STAGING_BYTES // self.chunk
        keys = [b"kvtier-bench-peers-warmup" + i.to_bytes(8, "little") for i in range(warm)]
        self.engine.wait(self.engine.store([(k, self.addrs[i % nbuf]) for i, k in enumerate(keys)]), timeout_ms=600000)
        self.engine.wait(self.engine.load([(k, 0, 0, self.addrs[i % nbuf]) for i, k in enumerate(keys)]), timeout_ms=600000)

    def key(self, rep, i):
        return b"kvtier-bench-peers" + rep.to_bytes(4, "little") + i.to_bytes(8, "little")

    def store(self, rep):
        items = [(self.key(rep, i), self.addrs[i % len(self.addrs)]) for i in range(self.n)]
        r = self.engine.wait(self.engine.store(items), timeout_ms=600000)
        if r["chunks_ok"] != self.n:
            raise RuntimeError(f"kvtier store: {r['chunks_ok']}/{self.n} ok: {r['chunks'][0]}")

    def before_load(self):
        pass

    def load(self, rep):
        items = [(self.key(rep, i), 0, 0, self.addrs[i % len(self.addrs)]) for i in range(self.n)]
        r = self.engine.wait(self.engine.load(items), timeout_ms=600000)
        if r["chunks_ok"] != self.n:
            bad = [c for c in r["chunks"] if not c["ok"]][:1]
            raise RuntimeError(f"kvtier load: {r['chunks_ok']}/{self.n} ok: {bad}")

    def close(self):
        self.engine.close()


class KvtierSlotPeer:
    """kvtier's slot path, the one its vLLM adapter drives (python/kvtier/vllm.py: the scheduler-side manager calls
    the engine, vLLM's workers copy between GPU memory and the shared pool's slots): no host memcpy on either side.

    Store: reserve_for_store(batch) gives a slot per chunk (what prepare_store does); the worker would fill the
    slots here (the bench leaves the pseudo-random bytes that set-up wrote into every slot); commit_store(batch)
    (complete_store) has the engine checksum, write and publish them. A full pool (None) waits for earlier writes.
    The phase ends when every commit's write has completed (stats()["stores_completed"]: one per commit_store).
    Load: from a fresh engine on the same root (before_load), promote(key) per chunk (the lookup of a disk hit), up
    to `window` reads in flight (REQUEST_CHUNKS, as far as half the pool holds: vLLM's scheduler looks up, and so
    promotes, every chunk of a request's prefix at once); a ready chunk is pinned (prepare_load), its bytes are
    where the worker would copy them from, and it is unpinned (complete_load). Waiting is polling with short
    sleeps, as vLLM's scheduler asks again every step. Peak RSS counts the pool twice: the engine's mapping and the
    one attached here, as a worker's."""

    BATCH = 16  # chunks per reserve/commit: one store per scheduler step of a request
    REQUEST_CHUNKS = 160  # a 40k-token request's prefix in 256-token chunks
    POLL_S = 0.0002  # the wait between two polls of the engine

    def __init__(self, root, model, n, opts):
        import numpy as np
        import kvtier

        self.np, self.kvtier = np, kvtier
        self.chunk, self.n = chunk_bytes(model), n
        self.options = kvtier_options(root, model, opts)
        self.engine = kvtier.Engine(self.options)
        self.pool = kvtier.Pool.attach(self.engine.pool_name)
        slots = self.pool.num_slots
        # Pseudo-random bytes in every slot (untimed; faults the pool in, as the peers' set-up does theirs).
        region = np.ctypeslib.as_array(
            (ctypes.c_uint8 * (slots * self.pool.slot_stride)).from_address(self.pool.slot_address(0)))
        random_fill(region)
        del region
        self.batch = max(1, min(self.BATCH, slots // 4))
        self.window = max(1, min(self.REQUEST_CHUNKS, slots // 2))

    def key(self, rep, i):
        return b"kvtier-bench-peers" + rep.to_bytes(4, "little") + i.to_bytes(8, "little")

    def _stores_completed(self):
        return self.engine.stats()["stores_completed"]

    def store(self, rep):
        st0 = self.engine.stats()
        base, dropped, commits = st0["stores_completed"], st0["stores_dropped"], 0
        keys = [self.key(rep, i) for i in range(self.n)]
        i = 0
        while i < self.n:
            batch = keys[i : i + self.batch]
            refs = self.engine.reserve_for_store(batch)
            if refs is None:  # the pool is full of chunks still being written
                time.sleep(self.POLL_S)
                continue
            if any(r is None for r in refs):
                raise RuntimeError("kvtier-slot store: a fresh key needed no write")
            self.engine.commit_store(batch, True)
            commits += 1
            i += len(batch)
        while self._stores_completed() - base < commits:
            time.sleep(self.POLL_S)
        lost = self.engine.stats()["stores_dropped"] - dropped
        if lost:
            raise RuntimeError(f"kvtier-slot store: {lost} chunks dropped")

    def before_load(self):
        # A load from disk, as in a vLLM that restarted (or whose DRAM tier evicted the chunks): a fresh engine on the
        # same root, so no chunk is resident (the stored ones stay in the pool otherwise, write-through). Untimed;
        # the new pool is faulted in at open.
        self.pool.close()
        self.engine.close()
        self.engine = self.kvtier.Engine(self.options)
        self.pool = self.kvtier.Pool.attach(self.engine.pool_name)

    def load(self, rep):
        from collections import deque

        inflight, nxt, done = deque(), 0, 0
        while done < self.n:
            while len(inflight) < self.window and nxt < self.n:
                k = self.key(rep, nxt)
                state, _, _ = self.engine.promote(k, False)
                if state == "miss":
                    raise RuntimeError(f"kvtier-slot load: chunk {nxt} missed")
                inflight.append(k)
                nxt += 1
            k = inflight[0]
            state = self.engine.residency(k)
            if state == "pending":
                time.sleep(self.POLL_S)
                continue
            if state != "ready":
                raise RuntimeError(f"kvtier-slot load: chunk {done} is {state}")
            self.engine.pin([k])  # the worker copies out of the slot now
            self.engine.unpin([k])
            inflight.popleft()
            done += 1

    def close(self):
        self.pool.close()
        self.engine.close()


class VllmFsPeer:
    """vLLM's native filesystem tier (vllm/v1/kv_offload/tiering/fs): FileSystemTierManager over a
    SharedOffloadRegion (its primary CPU tier's shared-memory region in /dev/shm), as TieringOffloadingSpec.get_manager
    builds them. submit_store / submit_load with JobMetadata, completion via drain_jobs + get_finished_jobs, exactly the
    calls TieringOffloadingManager makes. The OffloadingSpec argument is a stand-in holding the fields FileMapper reads
    (model name, dtype, groups, parallel sizes) and blocks_per_chunk."""

    def __init__(self, root, model, n, opts):
        import logging
        import types

        import numpy as np
        from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
        from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager
        from vllm.v1.kv_offload.tiering.base import JobMetadata
        from vllm.v1.kv_offload.base import ReqContext, make_offload_key

        logging.getLogger("vllm").setLevel(logging.WARNING)
        self.np, self.JobMetadata, self.ReqContext, self.make_key = np, JobMetadata, ReqContext, make_offload_key
        self.chunk, self.n = chunk_bytes(model), n
        self.num_blocks = STAGING_BYTES // self.chunk
        m = MODELS[model]
        self.region = SharedOffloadRegion(
            engine_id=f"kvtier-bench-peers-{os.getpid()}",
            num_blocks=self.num_blocks,
            rank=None,
            kv_bytes_per_block=self.chunk,
            cpu_page_size=self.chunk,
        )
        self.view = self.region.create_kv_memoryview()
        arr = np.frombuffer(self.view, dtype=np.uint8)
        random_fill(arr)
        del arr
        ns = types.SimpleNamespace
        spec = ns(
            config=ns(
                groups=[ns(tokens_per_block=16, layer_names=[f"model.layers.{i}.self_attn.attn" for i in range(m["layers"])])],
                model=ns(name=m["name"], dtype="torch.bfloat16"),
                cache=ns(tokens_per_hash=16),
                parallel=ns(tp_size=1, pp_size=1, pcp_size=1, dcp_size=1, rank=0, is_parallelism_agnostic=True),
            ),
            kv_events_config=ns(enable_kv_cache_events=False, self_describing_kv_events=False),
            blocks_per_chunk=BLOCKS_PER_CHUNK,
        )
        self.tier = FileSystemTierManager(spec, self.view, "fs", root_dir=root, **opts)
        self.job = 0

    def _run(self, rep, submit):
        jobs = []
        for start in range(0, self.n, self.num_blocks):  # one job per primary-region's worth of blocks
            idx = range(start, min(self.n, start + self.num_blocks))
            keys = [self.make_key(rep.to_bytes(4, "little") + i.to_bytes(12, "little"), 0) for i in idx]
            self.job += 1
            jobs.append(self.job)
            submit(self.JobMetadata(self.job, keys, self.np.array([i % self.num_blocks for i in idx], dtype=self.np.int64),
                                    False, self.ReqContext(req_id=f"bench-{rep}")))
        self.tier.drain_jobs()
        done = {r.job_id: r.success for r in self.tier.get_finished_jobs()}
        if sorted(done) != jobs or not all(done.values()):
            raise RuntimeError(f"vllm fs tier: jobs {jobs} finished {done}")

    def store(self, rep):
        self._run(rep, self.tier.submit_store)

    def before_load(self):
        pass

    def load(self, rep):
        self._run(rep, self.tier.submit_load)

    def close(self):
        self.tier.shutdown()
        self.tier = None  # drops its memoryview of the region
        self.view.release()
        self.region.cleanup()


class LmcachePeer:
    """LMCache's LocalDiskBackend (lmcache/v1/storage_backend/local_disk_backend.py) with the LocalCPUBackend that
    is its staging allocator, built as lmcache.v1.storage_backend.CreateStorageBackends builds them (asyncio loop
    in a thread). Store: submit_put_task(key, MemoryObj) per chunk (what batched_submit_put_task does); completion
    through on_complete_callback. Load: batched_get_blocking(keys) (what StorageManager's synchronous retrieve calls),
    in batches that fit the CPU pool, releasing the MemoryObjs after each batch."""

    def __init__(self, root, model, n, opts):
        import asyncio

        import numpy as np
        import torch
        from lmcache.utils import CacheEngineKey
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.memory_management import MemoryFormat
        from lmcache.v1.metadata import LMCacheMetadata
        from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
        from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

        self.torch, self.Key = torch, CacheEngineKey
        m = MODELS[model]
        self.chunk, self.n = chunk_bytes(model), n
        extra = {}
        if opts.get("use_odirect"):
            extra["use_odirect"] = True
        if "disk_io_threads" in opts:
            extra["disk_io_threads"] = opts["disk_io_threads"]
        self.cfg = LMCacheEngineConfig.from_defaults(
            chunk_size=TOKENS_PER_CHUNK,
            local_cpu=True,
            max_local_cpu_size=STAGING_BYTES / GiB,
            local_disk=f"file://{root}",
            max_local_disk_size=2 * n * self.chunk / GiB + 1,
            extra_config=extra or None,
        )
        md = LMCacheMetadata(model_name=m["name"], world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
                             kv_dtype=torch.bfloat16, kv_shape=(m["layers"], 2, TOKENS_PER_CHUNK, m["kv_heads"], m["head_dim"]))
        self.loop = asyncio.new_event_loop()
        self.loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.loop_thread.start()
        self.cpu = LocalCPUBackend(self.cfg, md, "cpu")
        self.disk = LocalDiskBackend(self.cfg, self.loop, self.cpu, "cpu")
        self.shape = torch.Size([2, m["layers"], TOKENS_PER_CHUNK, m["kv_heads"] * m["head_dim"]])
        self.fmt = MemoryFormat.KV_2LTD
        self.src = []
        for _ in range(16):
            obj = self.cpu.allocate(self.shape, torch.bfloat16, self.fmt)
            random_fill(obj.tensor.view(torch.uint8).reshape(-1).numpy())
            self.src.append(obj)
        # loads: as many chunks per batch as fit in the CPU pool next to the 16 source objects
        self.batch = max(1, min(n, (STAGING_BYTES - 17 * self.chunk) // self.chunk))

    def key(self, rep, i):
        return self.Key(self.cfg_model(), 1, 0, rep * 10_000_000 + i, self.torch.bfloat16)

    def cfg_model(self):
        return "bench-peers"

    def store(self, rep):
        done = threading.Semaphore(0)
        for i in range(self.n):
            self.disk.submit_put_task(self.key(rep, i), self.src[i % len(self.src)], on_complete_callback=lambda k: done.release())
        for _ in range(self.n):
            if not done.acquire(timeout=600):
                raise RuntimeError("lmcache store: timed out")

    def before_load(self):
        pass

    def load(self, rep):
        for start in range(0, self.n, self.batch):
            keys = [self.key(rep, i) for i in range(start, min(self.n, start + self.batch))]
            objs = self.disk.batched_get_blocking(keys)
            bad = sum(o is None for o in objs)
            for o in objs:
                if o is not None:
                    o.ref_count_down()
            if bad:
                raise RuntimeError(f"lmcache load: {bad}/{len(keys)} chunks missing")

    def close(self):
        self.disk.close()
        self.loop.call_soon_threadsafe(self.loop.stop)


PEERS = {"kvtier": KvtierPeer, "kvtier-slot": KvtierSlotPeer, "vllm": VllmFsPeer, "lmcache": LmcachePeer}


def worker(args):
    peer_name, opts = VARIANTS[args.variant]
    chunk = chunk_bytes(args.model)
    n = max(1, args.total // chunk)
    root = os.path.join(args.dir, f"{args.variant}-{args.model}-{os.getpid()}")
    os.makedirs(root)
    peer = None
    try:
        peer = PEERS[peer_name](root, args.model, n, opts)
        rss_base = rss_now()
        res = {"variant": args.variant, "peer": peer_name, "model": args.model, "chunk_bytes": chunk, "chunks": n,
               "bytes": n * chunk, "rep": args.rep}
        res["store_s"], res["store_cpu_s"], _ = measured(lambda: peer.store(args.rep))
        res["sync_s"], res["sync_cpu_s"], _ = measured(lambda: syncfs(root))
        peer.before_load()
        res["dropped"] = drop_caches()
        res["cold_s"], res["cold_cpu_s"], res["cold_read_bytes"] = measured(lambda: peer.load(args.rep))
        peer.before_load()
        res["warm_s"], res["warm_cpu_s"], res["warm_read_bytes"] = measured(lambda: peer.load(args.rep))
        res["rss_base"] = rss_base
        res["rss_peak"] = peak_rss()
    finally:
        if peer is not None:
            peer.close()
        shutil.rmtree(root, ignore_errors=True)
    print("RESULT " + json.dumps(res), flush=True)


# ---------------------------------------------------------------------------------------------------------------
# orchestrator


def run_raw(kvtier_bin, d, models, total, reps):
    sizes = ",".join(f"{chunk_bytes(m) // MiB}MiB" for m in models)
    out = os.path.join(d, "raw.json")
    # The single-thread raw baseline only (its CPU per GB is parsed from --verbose below).
    cmd = [kvtier_bin, "bench", "io", "--dir", d, "--chunk-sizes", sizes, "--depths", "16", "--total",
           f"{total // MiB}MiB", "--repeat", str(reps), "--raw-threads", "1", "--raw-split", "none", "--verbose",
           "--json", out]
    print("+ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        sys.stdout.write(p.stderr)
        raise RuntimeError("kvtier bench io failed")
    j = json.load(open(out))
    os.unlink(out)
    # verbose lines: "  28MiB qd 16 rep 0 raw    write 2.056 GB/s (cpu 0.12 cores: ..."
    cpu = {}
    for line in p.stdout.splitlines():
        f = line.split()
        if len(f) > 10 and f[1] == "qd" and f[3] == "rep" and f[8] == "GB/s" and f[9] == "(cpu":
            side, op = f[5], f[6]
            cpu.setdefault((f[0], side, op), []).append(float(f[10]) / float(f[7]))  # cores / (GB/s) = CPU s per GB
    rows = []
    for r in j["results"]:
        size = f"{r['chunk_bytes'] // MiB}MiB"
        model = next(m for m in models if chunk_bytes(m) == r["chunk_bytes"])
        scale = r["chunk_bytes"] / r["file_bytes"]  # bench io counts file bytes (4 KiB header + chunk)
        for side in ("raw", "engine"):
            rows.append({
                "variant": "raw io_uring" if side == "raw" else "kvtier (C++ bench io)",
                "model": model,
                "store_gbps": statistics.median(r[f"{side}_write_gbps"]) * scale,
                "cold_gbps": statistics.median(r[f"{side}_read_gbps"]) * scale,
                "warm_gbps": None,
                "store_cpu": statistics.median(cpu.get((size, side, "write"), [float("nan")])),
                "cold_cpu": statistics.median(cpu.get((size, side, "read"), [float("nan")])),
                "rss_peak": j.get("peak_rss_bytes"),
                "read_amp": None,
                "reps": len(r[f"{side}_write_gbps"]),
            })
    return rows, " ".join(cmd)


def summarize(results):
    rows = []
    keys = sorted({(r["variant"], r["model"]) for r in results}, key=lambda k: (k[1], list(VARIANTS).index(k[0])))
    for variant, model in keys:
        rs = [r for r in results if r["variant"] == variant and r["model"] == model]
        gb = rs[0]["bytes"] / 1e9
        med = lambda f: statistics.median(f(r) for r in rs)
        rows.append({
            "variant": variant,
            "model": model,
            "store_gbps": med(lambda r: gb / r["store_s"]),
            "store_sync_gbps": med(lambda r: gb / (r["store_s"] + r["sync_s"])),
            "cold_gbps": med(lambda r: gb / r["cold_s"]),
            "warm_gbps": med(lambda r: gb / r["warm_s"]),
            "store_cpu": med(lambda r: r["store_cpu_s"] / gb),
            "cold_cpu": med(lambda r: r["cold_cpu_s"] / gb),
            "warm_cpu": med(lambda r: r["warm_cpu_s"] / gb),
            "rss_peak": med(lambda r: r["rss_peak"]),
            "rss_base": med(lambda r: r["rss_base"]),
            "read_amp": med(lambda r: r["cold_read_bytes"] / r["bytes"]),
            "warm_read_amp": med(lambda r: r["warm_read_bytes"] / r["bytes"]),
            "reps": len(rs),
            "dropped": all(r["dropped"] for r in rs),
        })
    return rows


def fmt(v, spec=".2f"):
    return "-" if v is None or v != v else format(v, spec)


def table(rows):
    hdr = ("| model (chunk) | variant | store GB/s | store+syncfs GB/s | cold load GB/s | warm load GB/s | "
           "CPU s/GB store | CPU s/GB cold | CPU s/GB warm | peak RSS MiB (after setup) | disk bytes read / requested (cold, warm) |")
    lines = [hdr, "|" + "|".join(["---"] * (hdr.count("|") - 1)) + "|"]
    for r in rows:
        label = f"{r['model']} ({chunk_bytes(r['model']) // MiB} MiB)"
        rss = "-" if r.get("rss_peak") is None else f"{r['rss_peak'] / MiB:.0f}" + (
            f" ({r['rss_base'] / MiB:.0f})" if r.get("rss_base") else "")
        amp = "-" if r.get("read_amp") is None else f"{r['read_amp']:.2f}, {r['warm_read_amp']:.2f}"
        lines.append(f"| {label} | {r['variant']} | {fmt(r['store_gbps'])} | {fmt(r.get('store_sync_gbps'))} | "
                     f"{fmt(r['cold_gbps'])} | {fmt(r.get('warm_gbps'))} | {fmt(r['store_cpu'])} | {fmt(r['cold_cpu'])} | "
                     f"{fmt(r.get('warm_cpu'))} | {rss} | {amp} |")
    return "\n".join(lines)


def chart(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows}, key=lambda m: -chunk_bytes(m))
    metrics = [("store_gbps", "store GB/s"), ("cold_gbps", "cold load GB/s"), ("warm_gbps", "warm load GB/s"),
               ("cold_cpu", "CPU s per GB, cold load")]
    fig, axes = plt.subplots(len(models), len(metrics), figsize=(4.2 * len(metrics), 3.6 * len(models)), squeeze=False)
    for i, m in enumerate(models):
        rs = [r for r in rows if r["model"] == m]
        for j, (k, title) in enumerate(metrics):
            ax = axes[i][j]
            names = [r["variant"] for r in rs]
            vals = [0 if r.get(k) is None or r.get(k) != r.get(k) else r[k] for r in rs]
            colors = ["#1f77b4" if n.startswith("kvtier") else "#7f7f7f" if n.startswith("raw") else
                      "#ff7f0e" if n.startswith("vllm") else "#2ca02c" for n in names]
            ax.barh(range(len(vals)), vals, color=colors)
            ax.set_yticks(range(len(vals)))
            ax.set_yticklabels(names if j == 0 else [""] * len(names), fontsize=8)
            ax.invert_yaxis()
            ax.set_title(f"{m} ({chunk_bytes(m) // MiB} MiB): {title}", fontsize=9)
            for y, v in enumerate(vals):
                ax.text(v, y, f" {v:.2f}", va="center", fontsize=7)
            ax.margins(x=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def orchestrate(args):
    os.makedirs(args.out, exist_ok=True)
    variants = args.variants.split(",")
    models = args.models.split(",")
    pythons = {"kvtier": args.kvtier_python, "kvtier-slot": args.kvtier_python, "vllm": args.vllm_python,
               "lmcache": args.lmcache_python}
    results = []
    log = open(os.path.join(args.out, "runs.jsonl"), "w")
    for rep in range(args.reps):
        for model in models:
            order = variants if rep % 2 == 0 else list(reversed(variants))  # alternate: drift favours no one
            for v in order:
                py = pythons[VARIANTS[v][0]]
                cmd = [py, os.path.abspath(__file__), "worker", "--variant", v, "--model", model, "--total",
                       str(args.total), "--dir", args.dir, "--rep", str(rep)]
                t0 = time.time()
                p = subprocess.run(cmd, capture_output=True, text=True,
                                   env=dict(os.environ, VLLM_LOGGING_LEVEL="WARNING", LMCACHE_LOG_LEVEL="WARNING"))
                line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
                if p.returncode != 0 or not line:
                    print(f"FAILED {v} {model} rep {rep}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}", flush=True)
                    raise SystemExit(1)
                r = json.loads(line[0][7:])
                results.append(r)
                log.write(json.dumps(r) + "\n")
                log.flush()
                gb = r["bytes"] / 1e9
                print(f"rep {rep} {model:8s} {v:16s} store {gb / r['store_s']:.2f} GB/s  cold {gb / r['cold_s']:.2f}  "
                      f"warm {gb / r['warm_s']:.2f}  cpu/GB store {r['store_cpu_s'] / gb:.2f} cold {r['cold_cpu_s'] / gb:.2f}  "
                      f"rss {r['rss_peak'] / MiB:.0f} MiB  read/req {r['cold_read_bytes'] / r['bytes']:.2f}  "
                      f"({time.time() - t0:.0f} s)", flush=True)
    rows = summarize(results)
    raw_cmd = None
    if args.kvtier_bin and not args.no_raw:
        raw_rows, raw_cmd = run_raw(args.kvtier_bin, args.dir, models, args.total, args.reps)
        rows += raw_rows
        rows.sort(key=lambda r: (r["model"], r["variant"].startswith("raw") is False, r["variant"]))
    t = table(rows)
    print(t)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(t + "\n")
    json.dump({"rows": rows, "runs": results, "raw_command": raw_cmd, "argv": sys.argv}, open(os.path.join(args.out, "results.json"), "w"), indent=1)
    try:
        import matplotlib  # noqa: F401  (in the vLLM venv when its lock has it; the chart is optional)
    except ImportError:
        print(f"wrote {args.out}/table.md results.json (no peers.png: matplotlib is not installed)")
        return
    chart(rows, os.path.join(args.out, "peers.png"))
    print(f"wrote {args.out}/table.md results.json peers.png")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--variant", required=True, choices=list(VARIANTS))
    w.add_argument("--model", required=True, choices=list(MODELS))
    w.add_argument("--total", type=int, required=True)
    w.add_argument("--dir", required=True)
    w.add_argument("--rep", type=int, default=0)
    o = sub.add_parser("orchestrate")
    o.add_argument("--out", required=True)
    o.add_argument("--dir", required=True)
    o.add_argument("--total", type=int, default=2 * GiB)
    o.add_argument("--reps", type=int, default=3)
    o.add_argument("--models", default="llama3b,small")
    o.add_argument("--variants", default=",".join(v for v in VARIANTS if v != "kvtier-buffered"))
    o.add_argument("--kvtier-python", required=True)
    o.add_argument("--vllm-python", required=True)
    o.add_argument("--lmcache-python", required=True)
    o.add_argument("--kvtier-bin")
    o.add_argument("--no-raw", action="store_true")
    args = ap.parse_args()
    worker(args) if args.cmd == "worker" else orchestrate(args)


if __name__ == "__main__":
    main()
