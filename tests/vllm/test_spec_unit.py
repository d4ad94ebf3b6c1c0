"""Unit tests of kvtier.vllm driven with vLLM's own config and spec objects on CPU tensors (no server).

The protocol and address-math tests run against a pure-Python stand-in of the extension (fake_ext.py); the
restart test runs against the real kvtier._kvtier and is skipped when it is not built."""

import hashlib
import json
import logging
import os
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import kvtier.vllm as kv
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    LookupResult,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)

import fake_ext
from offload_config import build

LAYERS, HEADS, TOKENS, HEAD_DIM = 3, 2, 16, 64
PAGE = HEADS * TOKENS * 2 * HEAD_DIM * 2  # bf16, K and V packed: vLLM CPU layout
NUM_BLOCKS = 64


def make_config(root, bpc=4, engine_id="e0", extra=None, rank=0, world=1):
    ec = {"spec_name": "KVTierSpec", "spec_module_path": "kvtier.vllm", "kvtier_root": str(root),
          "blocks_per_chunk": bpc, "kvtier_pool_bytes": "64MiB", "kvtier_stats_interval_s": 0}
    ec.update(extra or {})
    return OffloadingConfig(
        groups=(build(OffloadingGroupConfig, tokens_per_block=TOKENS,
                      layer_names=tuple(f"l{i}" for i in range(LAYERS))),),
        worker_kv_bytes_per_block=LAYERS * PAGE,
        enable_kv_cache_events=False,
        extra_config=ec,
        engine_id=engine_id,
        model=OffloadingModelConfig(name="tiny-test", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=TOKENS, blocks_per_chunk=bpc),
        parallel=build(OffloadingParallelConfig, rank=rank, world_size=world, tp_size=world, pp_size=1, pcp_size=1,
                       dcp_size=1, data_parallel_index=0, is_parallelism_agnostic=True),
    )


def make_kv(seed):
    """Per-layer KV tensors like vLLM's CPU backend, canonicalized like OffloadingConnectorWorker does."""
    g = torch.Generator().manual_seed(seed)
    layers = [torch.randn((NUM_BLOCKS, HEADS, TOKENS, 2 * HEAD_DIM), generator=g).to(torch.bfloat16)
              for _ in range(LAYERS)]
    tensors = [CanonicalKVCacheTensor(t.view(torch.int8).view(NUM_BLOCKS, PAGE), PAGE) for t in layers]
    refs = [[CanonicalKVCacheRef(i, PAGE) for i in range(LAYERS)]]
    return layers, CanonicalKVCaches(tensors, refs)


def keys_for(n, salt=b""):
    return [make_offload_key(hashlib.sha256(salt + bytes([i])).digest(), 0) for i in range(n)]


@pytest.fixture
def fake(monkeypatch):
    fake_ext._PoolMem.registry.clear()
    monkeypatch.setattr(kv.extension, "load", lambda: fake_ext)
    return fake_ext


# ---------------------------------------------------------------------------------------------------- config
def test_unknown_key_names_it(tmp_path):
    with pytest.raises(ValueError, match="unknown kv_connector_extra_config key 'kvtier_pool_size'"):
        kv.parse_config({"kvtier_root": str(tmp_path), "kvtier_pool_size": 1})


def test_dotted_key_suggests_the_right_one(tmp_path):
    with pytest.raises(ValueError, match=r"'kvtier\.root'.*did you mean 'kvtier_root'"):
        kv.parse_config({"kvtier.root": str(tmp_path)})


@pytest.mark.parametrize("key,val,accepted", [
    ("kvtier_io_mode", "fast", "'auto' | 'direct' | 'buffered'"),
    ("kvtier_io_depth", 0, "an integer"),
    ("kvtier_pool_bytes", "lots", "a byte count"),
    ("kvtier_high_watermark", 1.5, "a number"),
    ("kvtier_fsync", "maybe", "true or false"),
])
def test_bad_value_names_key_and_accepted(tmp_path, key, val, accepted):
    with pytest.raises(ValueError) as e:
        kv.parse_config({"kvtier_root": str(tmp_path), key: val})
    assert f"'{key}'" in str(e.value) and accepted in str(e.value)


def test_root_required_and_must_exist(tmp_path):
    with pytest.raises(ValueError, match="'kvtier_root' is required"):
        kv.parse_config({})
    with pytest.raises(ValueError, match="no such directory"):
        kv.parse_config({"kvtier_root": str(tmp_path / "nope")})


def test_sizes_and_defaults(tmp_path):
    c = kv.parse_config({"kvtier_root": str(tmp_path), "kvtier_pool_bytes": "512MiB",
                         "kvtier_disk_budget_bytes": "2G", "kvtier_dir_mode": "0770"})
    assert c["kvtier_pool_bytes"] == 512 << 20 and c["kvtier_disk_budget_bytes"] == 2 << 30
    assert c["kvtier_dir_mode"] == 0o770 and c["kvtier_io_depth"] == 16


def test_spec_rejects_bad_key_at_construction(tmp_path):
    with pytest.raises(ValueError, match="kvtier_bogus"):
        kv.KVTierSpec(make_config(tmp_path, extra={"kvtier_bogus": 1}))


def test_identity_from_vllm_config(tmp_path):
    spec = kv.KVTierSpec(make_config(tmp_path, bpc=4, world=2))
    o = spec.engine_options()
    assert o["tokens_per_chunk"] == 64 and o["blocks_per_chunk"] == 4
    assert o["block_bytes"] == 2 * LAYERS * PAGE and o["tp_size"] == 2 and o["kv_dtype"] == "bfloat16"
    assert o["model"] == "tiny-test" and o["pool_name"].startswith(f"/kvtier-{os.getpid()}-")
    # the same engine_id gives the same name in this process; another engine_id another name
    assert kv.KVTierSpec(make_config(tmp_path, world=2)).pool_name() == o["pool_name"]
    assert kv.KVTierSpec(make_config(tmp_path, engine_id="e1")).pool_name() != o["pool_name"]


def test_hashseed_warning(monkeypatch):
    """V5 follows the installed vLLM's hashing: without PYTHONHASHSEED, 0.26-0.28 hash randomly per process with
    every algorithm, 0.29+ only with xxhash/xxhash_cbor (sha256 gets a fixed default seed)."""
    from vllm.v1.core import kv_cache_utils

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    monkeypatch.setattr(kv.config, "_hashseed_warned", False)
    seeded_by_default = hasattr(kv_cache_utils, "DEFAULT_NONE_HASH_SEED")  # vLLM's own switch (0.29+)
    assert seeded_by_default == (kv.compat.VLLM_RELEASE >= (0, 29, 0))
    assert kv.check_hash_seed() is seeded_by_default  # algorithm unknown: the default sha256
    assert kv.check_hash_seed("sha256") is seeded_by_default
    assert kv.check_hash_seed("sha256_cbor") is seeded_by_default
    assert kv.check_hash_seed("xxhash") is False
    assert kv.check_hash_seed("xxhash_cbor") is False
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    assert kv.check_hash_seed() is True
    assert kv.check_hash_seed("xxhash") is True


def test_unsupported_vllm_version_is_refused():
    """The version check (detected once at import) names the supported range for anything outside it."""
    for ver, rel in (("0.25.1", (0, 25, 1)), ("0.35.0", (0, 35, 0)), ("1.0.0", (1, 0, 0)), ("dev", None)):
        with pytest.raises(kv.compat.UnsupportedVLLMVersion, match=r"supports vLLM 0\.26\.0 to 0\.34\.x.*" + ver):
            kv.compat.check_version(ver, rel)
    kv.compat.check_version("0.26.0", (0, 26, 0))
    kv.compat.check_version("0.32.1+cpu", (0, 32, 1))
    kv.compat.check_version("0.33.0", (0, 33, 0))
    kv.compat.check_version("0.34.0", (0, 34, 0))
    kv.compat.check_version("0.34.2", (0, 34, 2))
    assert kv.compat.SUPPORTED[0] <= kv.compat.VLLM_RELEASE < kv.compat.SUPPORTED[1]


def test_canonical_layout_is_refused(tmp_path):
    """vLLM 0.28+ reads canonical_layout itself; kvtier stores each rank's pages as vLLM holds them, so true is a
    clear error (and before 0.28 the key is unknown)."""
    with pytest.raises(ValueError, match="canonical_layout"):
        kv.parse_config({"kvtier_root": str(tmp_path), "canonical_layout": True})
    if kv.compat.VLLM_RELEASE >= (0, 28, 0):
        assert kv.parse_config({"kvtier_root": str(tmp_path), "canonical_layout": False})["kvtier_root"]


def test_metric_definitions_are_static():
    defs = kv.KVTierSpec.build_metric_definitions({})
    assert "vllm:kvtier_bytes_read" in defs and "vllm:kvtier_corrupt_entries" in defs


# ------------------------------------------------------------------------------------------ store and load
def _store(manager, worker, keys, gpu_blocks, req="store-req"):
    ctx = ReqContext(req_id=req)
    out = manager.prepare_store(keys, ctx)
    assert out is not None and list(out.keys_to_store) == keys
    src = GPULoadStoreSpec(gpu_blocks, group_sizes=[len(gpu_blocks)], block_indices=[0])
    assert worker.submit_store(1, src, out.store_spec)
    (res,) = worker.get_finished()
    assert res.success and res.transfer_size == len(gpu_blocks) * LAYERS * PAGE
    manager.complete_store(keys, ctx)


@pytest.mark.skipif(not kv.compat.DEVICE_POINTERS, reason="this vLLM passes GPULoadStoreSpec, not DevicePointers "
                    "(0.34+)")
def test_device_pointers_become_block_ids_and_foreign_ones_are_refused(fake, tmp_path):
    """vLLM 0.34+ hands the worker DevicePointers (resolve_device_pointers): compat.block_spec recovers exactly the
    block ids and groups vLLM resolved, and refuses addresses that are not blocks of the worker's own tensors."""
    from vllm.v1.kv_offload.pointer_utils import resolve_device_pointers

    _, kv_a = make_kv(1)
    _, kv_b = make_kv(2)
    tensors = [t.tensor for t in kv_a.tensors]
    refs = [[r.tensor_idx for r in g] for g in kv_a.group_data_refs]
    spec = GPULoadStoreSpec([5, 9, 2, 63, 0], group_sizes=[5], block_indices=[3])
    got = kv.compat.block_spec(resolve_device_pointers(spec, kv_a), tensors, refs)
    assert got.block_ids.tolist() == [5, 9, 2, 63, 0]
    assert list(got.group_sizes) == [5] and list(got.block_indices) == [3]
    with pytest.raises(ValueError, match="not block addresses"):
        kv.compat.block_spec(resolve_device_pointers(spec, kv_b), tensors, refs)
    dp = resolve_device_pointers(spec, kv_a)
    dp.ptrs[7] += 1  # one page address off by a byte
    with pytest.raises(ValueError, match="not block addresses"):
        kv.compat.block_spec(dp, tensors, refs)
    # the worker reports such a job failed and copies nothing
    spec_obj = kv.KVTierSpec(make_config(tmp_path))
    manager = spec_obj.get_manager()
    worker = spec_obj.get_worker(kv_a)
    out = manager.prepare_store(keys_for(1), ReqContext(req_id="r"))
    assert worker.submit_store(4, resolve_device_pointers(GPULoadStoreSpec([1, 2, 3, 4], group_sizes=[4],
                                                                           block_indices=[0]), kv_b),
                               out.store_spec)
    (res,) = worker.get_finished()
    assert res.job_id == 4 and not res.success


def _lookup_all(manager, keys, ctx, max_steps=10):
    for _ in range(max_steps):
        results = [manager.lookup(k, ctx) for k in keys]
        if all(r == LookupResult.HIT for r in results):
            return results
        assert LookupResult.MISS not in results, results
        assert manager.has_pending_work()
        manager.on_schedule_end(ScheduleEndContext((), ()))
    raise AssertionError(f"lookups still pending: {results}")


@pytest.mark.parametrize("skip", [0, 1, 3])
def test_round_trip_with_partial_first_chunk(fake, tmp_path, skip):
    bpc = 4
    spec = kv.KVTierSpec(make_config(tmp_path, bpc=bpc))
    manager = spec.get_manager()
    src_layers, src_kv = make_kv(1)
    dst_layers, dst_kv = make_kv(2)
    worker = spec.get_worker(src_kv)
    keys = keys_for(3)
    src_blocks = [5, 9, 2, 7, 11, 13, 1, 4, 20, 21, 22, 23]
    _store(manager, worker, keys, src_blocks)

    manager.engine.drop_dram()  # force a read from "disk": lookup must go through HIT_PENDING
    ctx = ReqContext(req_id="load-req")
    assert manager.lookup(keys[0], ctx) == LookupResult.HIT_PENDING
    _lookup_all(manager, keys, ctx)
    assert not manager.has_pending_work()

    # vLLM computed the first `skip` blocks locally: load only the tail of chunk 0 and chunks 1..2
    n = len(src_blocks) - skip
    dst_blocks = list(range(30, 30 + n))
    load_spec = manager.prepare_load(keys, ctx)
    dst_worker = kv.KVTierWorker(dst_kv, bpc, 0, LAYERS * PAGE)
    # expedited: vLLM 0.33+'s loads inside the step (sync_load_budget_bytes), followed by wait()
    assert dst_worker.submit_load(7, load_spec, GPULoadStoreSpec(dst_blocks, group_sizes=[n], block_indices=[skip]),
                                  expedited=skip == 1)
    dst_worker.wait({7})
    (res,) = dst_worker.get_finished()
    assert res.success and res.job_id == 7 and res.transfer_size == n * LAYERS * PAGE
    for layer in range(LAYERS):
        assert torch.equal(dst_layers[layer][dst_blocks], src_layers[layer][src_blocks[skip:]])
    # untouched blocks stay untouched
    _, fresh = make_kv(2)
    assert torch.equal(dst_kv.tensors[0].tensor[:30], fresh.tensors[0].tensor[:30])
    pinned = [r[2] for r in manager.engine.resident.values()]
    assert all(p == 1 for p in pinned)
    manager.complete_load(keys, ctx)
    assert all(r[2] == 0 for r in manager.engine.resident.values())


def test_tensor_parallel_ranks_copy_only_their_share(fake, tmp_path):
    """TP=2 (docs/vllm-integration.md, "Byte layout of a chunk"): one manager, a worker per rank, each with its own
    KV tensors (its heads). In every block of a slot rank r's pages sit at [r * B, (r + 1) * B), B = the rank's bytes
    per block; each worker copies exactly that share, both ways, and counts it (the per-rank shutdown line)."""
    bpc, world, rank_bytes = 2, 2, LAYERS * PAGE
    specs = [kv.KVTierSpec(make_config(tmp_path, bpc=bpc, rank=r, world=world)) for r in range(world)]
    manager = specs[0].get_manager()
    assert manager.engine.options["block_bytes"] == world * rank_bytes and manager.engine.options["tp_size"] == 2
    src = [make_kv(10 + r) for r in range(world)]
    workers = [specs[r].get_worker(src[r][1]) for r in range(world)]
    keys = keys_for(2, b"tp")
    src_blocks = [5, 9, 2, 7]
    ctx = ReqContext(req_id="tp-store")
    out = manager.prepare_store(keys, ctx)
    for w in workers:  # every rank gets the same transfer spec from the scheduler
        assert w.submit_store(1, GPULoadStoreSpec(src_blocks, group_sizes=[4], block_indices=[0]), out.store_spec)
        (res,) = w.get_finished()
        assert res.success and res.transfer_size == len(src_blocks) * rank_bytes
    manager.complete_store(keys, ctx)

    # The slot: block j of chunk c holds rank 0's pages, then rank 1's, each in layer order.
    stride = manager.engine.block_stride
    for c, slot in enumerate(out.store_spec.slots.tolist()):
        payload = np.frombuffer(manager.engine._payload(slot), dtype=np.int8)
        for j in range(bpc):
            blk = src_blocks[c * bpc + j]
            for r in range(world):
                want = torch.cat([src[r][1].tensors[i].tensor[blk] for i in range(LAYERS)]).numpy()
                at = j * stride + r * rank_bytes
                assert np.array_equal(payload[at:at + rank_bytes], want), (c, j, r)

    ctx = ReqContext(req_id="tp-load")
    _lookup_all(manager, keys, ctx)
    load_spec = manager.prepare_load(keys, ctx)
    dst_blocks = [40, 41, 42, 43]
    for r in range(world):
        dst_layers, dst_kv = make_kv(20 + r)
        w = kv.KVTierWorker(dst_kv, bpc, r, rank_bytes, world_size=world)
        assert w.submit_load(2, load_spec, GPULoadStoreSpec(dst_blocks, group_sizes=[4], block_indices=[0]))
        (res,) = w.get_finished()
        assert res.success and res.transfer_size == len(dst_blocks) * rank_bytes
        for layer in range(LAYERS):
            assert torch.equal(dst_layers[layer][dst_blocks], src[r][0][layer][src_blocks]), (r, layer)
        assert w.copied == {"store": [0, 0], "load": [len(dst_blocks) * rank_bytes, 1]}
    manager.complete_load(keys, ctx)
    for w in workers:
        assert w.copied == {"store": [len(src_blocks) * rank_bytes, 1], "load": [0, 0]}


def test_load_source_names_the_tier(fake, tmp_path):
    """get_load_source (asked by vLLM 0.32+ after a HIT): HOST for chunks found in the staging pool, DISK for
    chunks this request's lookup had to read."""
    cache_hit_source = pytest.importorskip("vllm.v1.metrics.cache_hit_source",
                                           reason="this vLLM has no CacheHitSource (added in 0.32)")
    spec = kv.KVTierSpec(make_config(tmp_path, bpc=1))
    manager = spec.get_manager()
    _, src_kv = make_kv(1)
    worker = spec.get_worker(src_kv)
    keys = keys_for(2, b"src")
    _store(manager, worker, keys, [3, 4])
    hot = ReqContext(req_id="hot")
    _lookup_all(manager, keys, hot)
    assert [manager.get_load_source(k, hot) for k in keys] == [cache_hit_source.CacheHitSource.HOST] * 2
    manager.on_request_finished(hot)
    manager.engine.drop_dram()
    cold = ReqContext(req_id="cold")
    _lookup_all(manager, keys, cold)
    assert [manager.get_load_source(k, cold) for k in keys] == [cache_hit_source.CacheHitSource.DISK] * 2


def test_already_stored_keys_are_excluded(fake, tmp_path):
    spec = kv.KVTierSpec(make_config(tmp_path, bpc=2))
    manager = spec.get_manager()
    _, src_kv = make_kv(1)
    worker = spec.get_worker(src_kv)
    keys = keys_for(2)
    _store(manager, worker, keys[:1], [1, 2])
    out = manager.prepare_store(keys, ReqContext(req_id="r2"))
    assert list(out.keys_to_store) == keys[1:] and len(out.store_spec) == 1


def test_pool_full_returns_none(fake, tmp_path):
    spec = kv.KVTierSpec(make_config(tmp_path, bpc=4, extra={"kvtier_pool_bytes": "1MiB"}))
    manager = spec.get_manager()
    n_slots = manager.engine._mem.nslots
    assert manager.prepare_store(keys_for(n_slots + 1), ReqContext(req_id="r")) is None


def test_unpins_on_finish_not_during_load(fake, tmp_path):
    spec = kv.KVTierSpec(make_config(tmp_path, bpc=1))
    manager = spec.get_manager()
    _, src_kv = make_kv(1)
    worker = spec.get_worker(src_kv)
    keys = keys_for(2)
    _store(manager, worker, keys, [3, 4])
    ctx = ReqContext(req_id="a")
    _lookup_all(manager, keys, ctx)
    manager.prepare_load(keys, ctx)
    manager.on_request_finished(ctx)  # aborted while its load is in flight: keep the pins
    assert all(r[2] == 1 for r in manager.engine.resident.values())
    manager.complete_load(keys, ctx)
    assert all(r[2] == 0 for r in manager.engine.resident.values())
    ctx2 = ReqContext(req_id="b")  # looked up, never admitted, finished: pins released
    _lookup_all(manager, keys, ctx2)
    manager.on_request_finished(ctx2)
    assert all(r[2] == 0 for r in manager.engine.resident.values())


def test_load_from_reused_slot_fails_instead_of_copying(fake, tmp_path):
    spec = kv.KVTierSpec(make_config(tmp_path, bpc=1))
    manager = spec.get_manager()
    _, src_kv = make_kv(1)
    worker = spec.get_worker(src_kv)
    keys = keys_for(1)
    _store(manager, worker, keys, [3])
    ctx = ReqContext(req_id="a")
    _lookup_all(manager, keys, ctx)
    load_spec = manager.prepare_load(keys, ctx)
    load_spec.gens[0] += 1  # as if the slot had been given to another chunk
    worker.submit_load(9, load_spec, GPULoadStoreSpec([8], group_sizes=[1], block_indices=[0]))
    (res,) = worker.get_finished()
    assert not res.success


def test_worker_attach_timeout_is_clear(fake, tmp_path):
    _, src_kv = make_kv(1)
    w = kv.KVTierWorker(src_kv, 1, 0, LAYERS * PAGE, attach_timeout_s=0.2)
    spec = kv.KVTierLoadStoreSpec("/kvtier-nope", 8192, 4096, [0], [1])
    t0 = time.monotonic()
    w.submit_load(1, spec, GPULoadStoreSpec([0], group_sizes=[1], block_indices=[0]))
    (res,) = w.get_finished()
    assert not res.success and time.monotonic() - t0 < 5


def test_stats_reach_vllm_metrics(fake, tmp_path):
    spec = kv.KVTierSpec(make_config(tmp_path, bpc=1))
    manager = spec.get_manager()
    _, src_kv = make_kv(1)
    _store(manager, spec.get_worker(src_kv), keys_for(2), [1, 2])
    stats = manager.get_stats()
    red = stats.reduce()
    assert red["vllm:kvtier_bytes_written"] > 0
    assert manager.get_stats() is None  # rate limited to once a second


# ------------------------------------------------------------------------------- real extension, restart
def _real_ext():
    try:
        from kvtier import _kvtier  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.skipif(not _real_ext(), reason="kvtier._kvtier not built")
def test_real_engine_restart_serves_from_disk(tmp_path):
    bpc = 2
    keys = keys_for(3, salt=b"restart")
    blocks = [1, 2, 3, 4, 5, 6]
    src_layers, src_kv = make_kv(1)
    spec = kv.KVTierSpec(make_config(tmp_path, bpc=bpc, engine_id="first"))
    manager = spec.get_manager()
    worker = spec.get_worker(src_kv)
    _store(manager, worker, keys, blocks)
    deadline = time.monotonic() + 30
    while manager.engine.stats()["stores_completed"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    manager.shutdown()
    worker.shutdown()

    spec2 = kv.KVTierSpec(make_config(tmp_path, bpc=bpc, engine_id="second"))
    m2 = spec2.get_manager()
    ctx = ReqContext(req_id="r")
    deadline = time.monotonic() + 30
    while True:
        res = [m2.lookup(k, ctx) for k in keys]
        assert LookupResult.MISS not in res
        if all(r == LookupResult.HIT for r in res):
            break
        assert m2.has_pending_work() or LookupResult.HIT_PENDING in res
        m2.on_schedule_end(ScheduleEndContext((), ()))
        assert time.monotonic() < deadline
        time.sleep(0.01)
    dst_layers, dst_kv = make_kv(2)
    w2 = spec2.get_worker(dst_kv)
    dst = [40, 41, 42, 43, 44]
    w2.submit_load(3, m2.prepare_load(keys, ctx), GPULoadStoreSpec(dst, group_sizes=[5], block_indices=[1]))
    (r,) = w2.get_finished()
    assert r.success
    for layer in range(LAYERS):
        assert torch.equal(dst_layers[layer][dst], src_layers[layer][blocks[1:]])
    m2.complete_load(keys, ctx)
    assert m2.engine.stats()["bytes_read"] > 0
    m2.shutdown()
    w2.shutdown()


# ------------------------------------------------------------------------------------------ preload and gate (R1, G1)
class _Req:
    """The fields of vllm.v1.request.Request that the manager reads."""

    def __init__(self, req_id, n_blocks, salt=b""):
        self.request_id = req_id
        self.block_hashes = [hashlib.sha256(salt + bytes([i])).digest() for i in range(n_blocks)]
        self.num_prompt_tokens = n_blocks * TOKENS + 1


def _scheduler_on_new_request(manager, request):
    """vLLM's scheduler adding a request: KVTierConnector.on_new_request (hands the manager the block hashes),
    then vLLM's own OffloadingConnector.on_new_request, here into a stand-in of its connector scheduler that calls
    the manager's on_new_request with a ReqContext as OffloadingConnectorScheduler does."""
    connector = object.__new__(kv.KVTierConnector)  # the connector's state, without vLLM's config objects
    connector._kvtier_manager = manager
    manager.requests_noted = True
    connector.connector_scheduler = SimpleNamespace(
        on_new_request=lambda req: manager.on_new_request(ReqContext(req_id=req.request_id)))
    connector.on_new_request(request)


def _connector_keys(request, hashes_per_chunk):
    """vLLM's own derivation (RequestOffloadState.update_offload_keys), for comparison."""
    from itertools import islice
    return [make_offload_key(h, 0) for h in islice(request.block_hashes, hashes_per_chunk - 1, None,
                                                   hashes_per_chunk)]


def test_new_request_keys_match_the_connector_and_are_preloaded(fake, tmp_path):
    spec = kv.KVTierSpec(make_config(tmp_path, bpc=2, extra={"kvtier_preload_max_inflight": 2}))
    manager = spec.get_manager()
    req = _Req("r1", 8)
    _scheduler_on_new_request(manager, req)
    assert manager._req_keys["r1"] == [bytes(k) for k in _connector_keys(req, 2)]
    assert manager.engine.preload_log[0] == ("enqueue", "r1", 4)
    manager.on_request_finished(ReqContext(req_id="r1"))
    assert manager.engine.preload_log[-1] == ("forget", "r1")


def test_plain_offloading_connector_turns_preload_off_and_says_so(fake, tmp_path, monkeypatch):
    """With vLLM's OffloadingConnector (no note_request), on_new_request has only a ReqContext: no keys, no
    preload, lookups as usual, and one warning that names the connector to use."""
    spec = kv.KVTierSpec(make_config(tmp_path, bpc=2, extra={"kvtier_preload_max_inflight": 2}))
    manager = spec.get_manager()
    logged = []
    monkeypatch.setattr(kv.manager.logger, "warning", lambda msg, *a: logged.append(msg % a))
    manager.on_new_request(ReqContext(req_id="r1"))
    manager.on_new_request(ReqContext(req_id="r2"))
    assert "r1" not in manager._req_keys and manager.engine.preload_log == []
    warnings = [m for m in logged if "KVTierConnector" in m]
    assert len(warnings) == 1, warnings
    key = make_offload_key(_Req("r1", 2).block_hashes[1], 0)
    assert manager.lookup(key, ReqContext(req_id="r1")) == LookupResult.MISS


def test_preload_off_enqueues_nothing(fake, tmp_path):
    spec = kv.KVTierSpec(make_config(tmp_path, bpc=2, extra={"kvtier_preload_max_inflight": 0}))
    manager = spec.get_manager()
    _scheduler_on_new_request(manager, _Req("r1", 8))
    assert not hasattr(manager.engine, "preload_log")


def _thresholds(tmp_path, dram, disk, store=0, **extra):
    p = tmp_path / "thresholds.json"
    p.write_text(json.dumps({"version": 1, "model": "tiny-test", "tokens_per_chunk": 64,
                             "tiers": {"dram": {"min_load_tokens": dram}, "disk": {"min_load_tokens": disk}},
                             "store_min_tokens": store, **extra}))
    return str(p)


def test_gate_declines_short_disk_loads_and_admits_long_ones(fake, tmp_path):
    bpc = 1  # 16-token chunks
    root = tmp_path / "root"
    root.mkdir()
    thr = _thresholds(tmp_path, dram=0, disk=5 * TOKENS)
    spec = kv.KVTierSpec(make_config(root, bpc=bpc, extra={"kvtier_thresholds_path": thr}))
    manager = spec.get_manager()
    _, src_kv = make_kv(1)
    worker = spec.get_worker(src_kv)
    short, long = _Req("short", 4, salt=b"s"), _Req("long", 8, salt=b"l")
    for r in (short, long):
        keys = [make_offload_key(h, 0) for h in r.block_hashes]
        _store(manager, worker, keys, list(range(1, 1 + len(keys))), req="store-" + r.request_id)
    manager.engine.drop_dram()
    for r in (short, long):
        _scheduler_on_new_request(manager, r)
    k_short = make_offload_key(short.block_hashes[0], 0)
    k_long = make_offload_key(long.block_hashes[0], 0)
    assert manager.lookup(k_short, ReqContext(req_id="short")) == LookupResult.MISS  # 4 chunks = 64 tokens < 80
    assert manager.lookup(k_short, ReqContext(req_id="short")) == LookupResult.MISS  # decided once
    assert manager._mgr["declined_loads"] == 1
    assert manager.lookup(k_long, ReqContext(req_id="long")) in (LookupResult.HIT, LookupResult.HIT_PENDING)
    # A lookup that starts mid-request is decided over the chunks from its own position on (vLLM skips the chunks
    # its GPU prefix cache holds): 4 chunks from index 4 decline, 5 from index 3 load.
    again = _Req("again", 8, salt=b"l")
    _scheduler_on_new_request(manager, again)
    ctx = ReqContext(req_id="again")
    assert manager.lookup(make_offload_key(again.block_hashes[4], 0), ctx) == LookupResult.MISS
    assert manager.lookup(make_offload_key(again.block_hashes[3], 0), ctx) in (LookupResult.HIT,
                                                                              LookupResult.HIT_PENDING)
    manager.on_request_finished(ctx)
    assert "again" not in manager._req_pos and "again" not in manager._req_keys


def test_a_streamed_hit_is_answered_again_without_the_engine_until_its_load(fake, tmp_path):
    """vLLM asks every waiting request's chunks again on every scheduler step: a chunk answered HIT to be streamed
    from disk keeps that answer without another engine lookup (a call that releases the GIL each time) until the
    request's load releases it; a lookup after that asks the engine again."""
    spec = kv.KVTierSpec(make_config(tmp_path, bpc=1))
    manager = spec.get_manager()
    _, src_kv = make_kv(1)
    worker = spec.get_worker(src_kv)
    keys = keys_for(4, salt=b"streamed")
    _store(manager, worker, keys, [1, 2, 3, 4])
    manager.engine.drop_dram()
    manager.streaming = True  # loads streamed, as compat._enable_streaming sets it with one KV cache group
    ctx = ReqContext(req_id="r")
    before = manager.engine.counters["lookups"]
    for _ in range(5):  # five scheduler steps
        assert [manager.lookup(k, ctx) for k in keys] == [LookupResult.HIT] * 4
    assert manager.engine.counters["lookups"] - before == 4, "only the first step's answers asked the engine"
    manager.on_request_finished(ctx)
    assert [manager.lookup(k, ctx) for k in keys] == [LookupResult.HIT] * 4
    assert manager.engine.counters["lookups"] - before == 8


def test_preload_reads_ahead_only_what_the_gate_could_admit(fake, tmp_path):
    """R1 with G1: with the disk tier never paying, a request is read ahead only if it fits the room unused preloads
    may hold (read whole, it loads as a DRAM hit); a longer one would be read for a load the gate declines. A disk
    threshold the request reaches lets any length be read ahead."""
    never = 2147483647
    spec = kv.KVTierSpec(make_config(tmp_path, bpc=1, extra={
        "kvtier_preload_max_inflight": 2, "kvtier_thresholds_path": _thresholds(tmp_path, dram=TOKENS, disk=never),
        "kvtier_pool_bytes": 16 * (4096 + LAYERS * PAGE)}))  # 16 slots of a one-block chunk
    manager = spec.get_manager()
    room = manager.engine.preload_room
    assert 2 <= room < 16
    _scheduler_on_new_request(manager, _Req("fits", room, salt=b"f"))
    _scheduler_on_new_request(manager, _Req("too-long", room + 1, salt=b"t"))
    assert [e for e in manager.engine.preload_log if e[0] == "enqueue"] == [("enqueue", "fits", room)]
    manager._gate["disk"] = (room + 1) * TOKENS  # the disk pays from this length on
    _scheduler_on_new_request(manager, _Req("long-enough", room + 1, salt=b"l"))
    assert manager.engine.preload_log[-1] == ("enqueue", "long-enough", room + 1)


def test_gate_store_admission(fake, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    thr = _thresholds(tmp_path, dram=0, disk=0, store=6 * 2 * TOKENS)
    spec = kv.KVTierSpec(make_config(root, bpc=2, extra={"kvtier_thresholds_path": thr}))
    manager = spec.get_manager()
    short = _Req("short", 8, salt=b"x")  # 4 chunks of 32 tokens: below 6 chunks
    _scheduler_on_new_request(manager, short)
    out = manager.prepare_store(keys_for(2, b"x"), ReqContext(req_id="short"))
    assert out is not None and list(out.keys_to_store) == []
    assert manager._mgr["stores_declined"] == 1


@pytest.mark.parametrize("body, field", [
    ({"version": 2}, "version"),
    ({"version": 1, "model": "m", "tokens_per_chunk": 0}, "tokens_per_chunk"),
    ({"version": 1, "model": "m", "tokens_per_chunk": 64, "tiers": {"dram": {"min_load_tokens": 1}}},
     "tiers.disk.min_load_tokens"),
    ({"version": 1, "model": "m", "tokens_per_chunk": 64,
      "tiers": {"dram": {"min_load_tokens": 1}, "disk": {"min_load_tokens": -1}}}, "tiers.disk.min_load_tokens"),
])
def test_bad_thresholds_file_names_the_field(tmp_path, body, field):
    p = tmp_path / "t.json"
    p.write_text(json.dumps(body))
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        kv.load_thresholds(str(p))


def test_thresholds_defaults_store_to_disk_threshold(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"version": 1, "model": "m", "tokens_per_chunk": 64, "future_key": 1,
                             "tiers": {"dram": {"min_load_tokens": 10}, "disk": {"min_load_tokens": 99}}}))
    assert kv.load_thresholds(str(p)) == {"dram": 10, "disk": 99, "store": 99}


def test_reset_cache_releases_in_flight_slots_only_after_the_workers_flush(fake, tmp_path):
    """vLLM flushes the dropped jobs in the workers one step after reset_cache: until then a copy may still use the
    slots, so neither a load's pins nor a store's reservation may be released at once."""
    spec = kv.KVTierSpec(make_config(tmp_path, bpc=1))
    manager = spec.get_manager()
    _, src_kv = make_kv(1)
    worker = spec.get_worker(src_kv)
    keys = keys_for(2)
    _store(manager, worker, keys, [3, 4])
    ctx = ReqContext(req_id="a")
    _lookup_all(manager, keys, ctx)
    manager.prepare_load(keys, ctx)  # a load in flight
    stored = keys_for(1, salt=b"store")
    out = manager.prepare_store(stored, ReqContext(req_id="s"))  # and a store in flight
    assert out is not None and len(out.store_spec) == 1
    res = manager.engine.resident
    loaded = [bytes(k) for k in keys]
    manager.reset_cache()
    assert all(res[k][2] == 1 for k in loaded), "pins released while the load may run"
    assert res[bytes(stored[0])][1] == "filling", "store slot given back while the copy may write it"
    assert manager.has_pending_work()
    for _ in range(kv.manager._RESET_QUARANTINE_STEPS - 1):
        manager.on_schedule_end(ScheduleEndContext((), ()))
        assert all(res[k][2] == 1 for k in loaded)
        assert bytes(stored[0]) in res
    manager.on_schedule_end(ScheduleEndContext((), ()))
    assert all(res[k][2] == 0 for k in loaded)
    assert bytes(stored[0]) not in res and bytes(stored[0]) not in manager.engine.disk  # dropped, not published
    assert not manager.has_pending_work()


def _store_then_load_from_disk(tmp_path, req_id: str):
    """A spec on tmp_path (2 blocks per chunk): its worker stores 2 chunks (job 1), the DRAM tier is dropped, and the
    request `req_id` looks them up and loads them from disk (job 9). Returns the manager."""
    spec = kv.KVTierSpec(make_config(tmp_path, bpc=2))
    manager = spec.get_manager()
    _, src_kv = make_kv(1)
    worker = spec.get_worker(src_kv)
    keys = keys_for(2)
    _store(manager, worker, keys, [1, 2, 3, 4])
    manager.engine.drop_dram()
    ctx = ReqContext(req_id=req_id)
    _lookup_all(manager, keys, ctx)
    load_spec = manager.prepare_load(keys, ctx)
    assert worker.submit_load(9, load_spec, GPULoadStoreSpec([5, 6, 7, 8], group_sizes=[4], block_indices=[0]))
    (res,) = worker.get_finished()
    assert res.success
    manager.complete_load(keys, ctx)
    return manager


def test_timeline_on_a_full_device_stops_and_serving_goes_on(fake, tmp_path, monkeypatch, caplog):
    """The timeline is diagnostics: its file on a full file system (here /dev/full, ENOSPC from the kernel) ends it
    with one warning, and the store, the lookup and the load that wrote to it all succeed (a write error here once
    killed vLLM's EngineCore from on_schedule_end)."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (a device whose writes fail with ENOSPC)")
    tl = tmp_path / "timeline"
    tl.mkdir()
    (tl / f"timeline-{os.getpid()}.jsonl").symlink_to("/dev/full")
    monkeypatch.setenv("KVTIER_TIMELINE_DIR", str(tl))
    with caplog.at_level(logging.WARNING, logger="vllm.kvtier"):
        manager = _store_then_load_from_disk(tmp_path, "full-req")
        manager.on_schedule_end(ScheduleEndContext((), ()))
    stopped = [r for r in caplog.records if "timeline" in r.getMessage() and "stopped" in r.getMessage()]
    assert stopped and all("No space left" in r.getMessage() for r in stopped)  # one per timeline (manager, worker)
    assert len(stopped) <= 2


def test_timeline_records_each_request_phase(fake, tmp_path, monkeypatch):
    """KVTIER_TIMELINE_DIR: lookup (first answer and each change), prepare/complete_load and the worker's submit
    and done land in per-process JSONL files; without the variable nothing is written."""
    tl = tmp_path / "timeline"
    monkeypatch.setenv("KVTIER_TIMELINE_DIR", str(tl))
    bpc = 2
    _store_then_load_from_disk(tmp_path, "tl-req")
    (f,) = list(tl.iterdir())
    events = [json.loads(line) for line in f.read_text().splitlines()]
    mine = [e for e in events if e.get("req") == "tl-req"]
    assert [e["result"] for e in mine if e["ev"] == "lookup"] == [str(LookupResult.HIT_PENDING),
                                                                   str(LookupResult.HIT)]
    assert [e["ev"] for e in mine if e["ev"] != "lookup"] == ["prepare_load", "complete_load"]
    submits = [e for e in events if e["ev"] == "submit"]
    assert [(e["job"], e["load"], e["bytes"]) for e in submits] == [(1, False, 4 * LAYERS * PAGE),
                                                                    (9, True, 4 * LAYERS * PAGE)]
    assert all(e["t"] > 0 for e in events) and any(e["ev"] == "step" for e in events)

    monkeypatch.delenv("KVTIER_TIMELINE_DIR")
    (tmp_path / "x").mkdir()
    other = kv.KVTierSpec(make_config(tmp_path / "x", bpc=bpc, engine_id="e1"))
    other.get_manager().on_schedule_end(ScheduleEndContext((), ()))
    assert len(list(tl.iterdir())) == 1
