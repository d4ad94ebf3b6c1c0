"""Per-request overhead of kvtier's vLLM manager + worker for one DRAM hit of N chunks (default 320: an 80k-token
prompt), with the real engine and vLLM's own config objects, copies left out (a copier that does nothing), so what
is timed is the path around the copy: two lookup passes, prepare_load, submit_load (slot checks and the segment
address arrays: 28 layers x 16 blocks x N chunks) and completion.

    PYTHONPATH=<kvtier installed, or python/ with the built extension> $VLLM_VENV/bin/python \
        bench/h200/manager_overhead.py [chunks]
"""
import hashlib, os, sys, tempfile, time
import numpy as np, torch
import kvtier.vllm as kv
from vllm.v1.kv_offload.base import (CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor,
                                     GPULoadStoreSpec, LookupResult, ReqContext, make_offload_key)
from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig,
                                       OffloadingModelConfig, OffloadingParallelConfig)
LAYERS, PAGE, BPC, CHUNKS = 28, 4096, 16, int(sys.argv[1]) if len(sys.argv) > 1 else 320
NB = CHUNKS * BPC + 16
root = tempfile.mkdtemp(dir="/var/tmp")
ec = {"spec_name": "KVTierSpec", "spec_module_path": "kvtier.vllm", "kvtier_root": root,
      "kvtier_pool_bytes": str((CHUNKS + 40) * (4096 + BPC * LAYERS * PAGE)), "kvtier_stats_interval_s": 0,
      "kvtier_preload_max_inflight": 0}
cfg = OffloadingConfig(groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=tuple(f"l{i}" for i in range(LAYERS))),),
    worker_kv_bytes_per_block=LAYERS * PAGE, enable_kv_cache_events=False, extra_config=ec, engine_id="ovh",
    model=OffloadingModelConfig(name="ovh", dtype="bfloat16"), cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=BPC),
    parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1, data_parallel_index=0, is_parallelism_agnostic=True))
spec = kv.KVTierSpec(cfg)
mgr = spec.get_manager()
layers = [torch.zeros((NB, PAGE), dtype=torch.int8) for _ in range(LAYERS)]
kvc = CanonicalKVCaches([CanonicalKVCacheTensor(t, PAGE) for t in layers], [[CanonicalKVCacheRef(i, PAGE) for i in range(LAYERS)]])
class NoCopy:
    asynchronous = True
    def attach(self, p): pass
    def detach(self, p): pass
    def copy(self, d, dst, src, sizes): return 1
    def done(self, t): return True
    def wait(self, t): pass
    def close(self): pass
    def describe(self): return "no-copy"
worker = kv.KVTierWorker(kvc, BPC, 0, LAYERS * PAGE, copier=NoCopy())
keys = [make_offload_key(hashlib.sha256(b"k%d" % i).digest(), 0) for i in range(CHUNKS)]
ctx = ReqContext(req_id="store")
out = mgr.prepare_store(keys, ctx)
blocks = list(range(CHUNKS * BPC))
worker.submit_store(1, GPULoadStoreSpec(blocks, group_sizes=[len(blocks)], block_indices=[0]), out.store_spec)
worker.get_finished(); mgr.complete_store(keys, ctx)
time.sleep(1)
for rep in range(3):
    c = ReqContext(req_id=f"load{rep}")
    t0 = time.perf_counter()
    res = [mgr.lookup(k, c) for k in keys]
    t1 = time.perf_counter()
    res2 = [mgr.lookup(k, c) for k in keys]  # vLLM asks again when the request is scheduled
    t2 = time.perf_counter()
    ls = mgr.prepare_load(keys, c)
    t3 = time.perf_counter()
    worker.submit_load(10 + rep, ls, GPULoadStoreSpec(blocks, group_sizes=[len(blocks)], block_indices=[0]))
    t4 = time.perf_counter()
    worker.get_finished(); mgr.complete_load(keys, c); mgr.on_request_finished(c)
    t5 = time.perf_counter()
    assert all(r == LookupResult.HIT for r in res), set(res)
    print(f"{CHUNKS} chunks: lookup pass {1e3*(t1-t0):.1f} ms, 2nd pass {1e3*(t2-t1):.1f} ms, prepare_load {1e3*(t3-t2):.1f} ms, "
          f"submit_load {1e3*(t4-t3):.1f} ms, finish {1e3*(t5-t4):.1f} ms; total {1e3*(t5-t0):.1f} ms")
worker.shutdown(); mgr.shutdown()
