"""kvtier as a secondary tier of vLLM's own tiering (kvtier.vllm.tier, KVTierTier) under vLLM's CPU tier, driven
through vLLM's TieringOffloadingSpec and TieringOffloadingManager (the scheduler side, which runs on any platform)
with a real kvtier engine on real files. vLLM's tiering worker needs a CUDA-alike or XPU device, so the bytes a GPU
would copy into the CPU tier are written into its shared-memory rows here (docs/vllm-integration.md, "kvtier under
vLLM's CPU tier", says what only a GPU checks).

On a vLLM whose tiering takes no out-of-tree tier (before 0.28) the same one config entry stops startup with
kvtier's error naming the release needed."""

import dataclasses
import hashlib
import os
import time

import numpy as np
import pytest

import kvtier.vllm as kv
from kvtier import HEADER_BYTES, vllm_plugin
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from test_spec_unit import make_config

CHUNKS = 4  # chunks stored per test (bpc 2: 32 tokens each)
needs_tiers = pytest.mark.skipif(not kv.compat.OUT_OF_TREE_TIERS,
                                 reason=f"vLLM {kv.compat.VLLM_VERSION}'s tiering takes no out-of-tree tier (0.28+)")


def tier_entry(root, **extra):
    """The one config entry of the docs: kvtier under vLLM's CPU tier."""
    return {"type": "KVTierTier", "module_path": "kvtier.vllm.tier", "kvtier_root": str(root),
            "kvtier_pool_bytes": "16MiB", "kvtier_stats_interval_s": 0, **extra}


_open_managers = []


@pytest.fixture(autouse=True)
def _shut_down_managers():
    """A test that fails midway still closes its engines (their pools' names repeat in the next test)."""
    yield
    while _open_managers:
        mgr = _open_managers.pop()
        try:
            mgr.shutdown()
        except Exception:  # noqa: BLE001 - closed by the test already, or it failed before opening
            pass


def tiering_spec(root, engine_id, **tier_extra):
    base = make_config(root, bpc=2, engine_id=engine_id)
    extra = {"cpu_bytes_to_use": 16 << 20, "blocks_per_chunk": 2, "secondary_tiers": [tier_entry(root, **tier_extra)]}
    return TieringOffloadingSpec(dataclasses.replace(base, extra_config=extra))


def tiering_manager(root, engine_id, **tier_extra):
    mgr = tiering_spec(root, engine_id, **tier_extra).get_manager()
    _open_managers.append(mgr)
    return mgr


def keys_of(salt, n=CHUNKS):
    return [make_offload_key(hashlib.sha256(salt + bytes([i])).digest(), 0) for i in range(n)]


def primary_bytes(manager):
    return np.asarray(manager.primary_tier.get_kv_memoryview()).view(np.uint8)


def primary_ids(spec):
    """The CPU tier's rows of a load or store spec: `chunk_ids` from vLLM 0.30, `block_ids` in 0.28-0.29."""
    ids = getattr(spec, "chunk_ids", None)
    return spec.block_ids if ids is None else ids


def rows(manager, chunk_ids):
    view = primary_bytes(manager)
    out = view[np.asarray(chunk_ids, dtype=np.int64)].copy()
    del view  # no export of the primary view may outlive the test (its shutdown releases it)
    return out


def step(manager):
    manager.on_schedule_end(ScheduleEndContext((), ()))


def store_through_cpu_tier(manager, keys, seed):
    """What vLLM's connector does for a stored prefix: the CPU tier allocates rows, the worker fills them from the GPU
    (here: random bytes written into the shared rows), complete_store cascades them to the secondary tiers."""
    ctx = ReqContext(req_id=f"store-{seed}")
    manager.on_new_request(ctx)
    out = manager.prepare_store(keys, ctx)
    assert out is not None and list(out.keys_to_store) == keys
    ids = np.asarray(primary_ids(out.store_spec), dtype=np.int64)
    view = primary_bytes(manager)
    data = np.random.default_rng(seed).integers(0, 256, size=(len(ids), view.shape[1]), dtype=np.uint8)
    view[ids] = data
    del view
    manager.complete_store(keys, ctx)
    manager.on_request_finished(ctx)
    deadline = time.monotonic() + 60
    while manager.has_pending_work():
        assert time.monotonic() < deadline, "the cascade to kvtier did not finish"
        step(manager)
        time.sleep(0.01)
    return data


def load_through_cpu_tier(manager, keys, ctx, max_steps=3000):
    """A new instance's lookups: kvtier HIT -> promotion into the CPU tier (HIT_PENDING) -> HIT; returns the last
    lookup answers and, when all hit, the promoted rows."""
    manager.on_new_request(ctx)
    res = []
    for _ in range(max_steps):
        res = [manager.lookup(k, ctx) for k in keys]
        if all(r == LookupResult.HIT for r in res) or LookupResult.MISS in res:
            break
        step(manager)
        time.sleep(0.005)
    if not all(r == LookupResult.HIT for r in res):
        return res, None
    spec = manager.prepare_load(keys, ctx)
    data = rows(manager, primary_ids(spec))
    manager.complete_load(keys, ctx)
    return res, data


def tier_of(manager):
    (tier,) = manager.secondary_tiers
    assert isinstance(tier, kv.KVTierTier)
    return tier


def entry_files(root):
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".kvc")]


@needs_tiers
def test_store_then_load_through_vllms_cpu_tier_is_byte_identical(tmp_path):
    keys = keys_of(b"round-trip")
    first = tiering_manager(tmp_path, "first")
    tier = tier_of(first)
    assert tier.medium.name == "STORAGE" and tier.locality.name == "LOCAL"  # a tmp root: one host
    stored = store_through_cpu_tier(first, keys, seed=1)
    assert all(tier.engine.stored(bytes(k)) for k in keys)
    assert tier.engine.stats()["stores_completed"] >= 1
    first.shutdown()
    assert len(entry_files(tmp_path)) == CHUNKS

    # a new instance on the same root: its CPU tier is empty, kvtier's disk has every chunk
    second = tiering_manager(tmp_path, "second")
    res, loaded = load_through_cpu_tier(second, keys, ReqContext(req_id="reader"))
    assert res == [LookupResult.HIT] * CHUNKS
    assert np.array_equal(loaded, stored)
    assert tier_of(second).engine.stats()["bytes_read"] >= stored.nbytes
    second.shutdown()


@needs_tiers
def test_a_chunk_kvtier_never_stored_is_a_miss(tmp_path):
    manager = tiering_manager(tmp_path, "e")
    ctx = ReqContext(req_id="r")
    manager.on_new_request(ctx)
    assert manager.lookup(keys_of(b"never")[0], ctx) == LookupResult.MISS
    assert tier_of(manager).lookup(keys_of(b"never")[0], ctx) == LookupResult.MISS
    manager.shutdown()


@needs_tiers
def test_a_corrupt_entry_is_never_promoted(tmp_path):
    """A flipped payload byte fails kvtier's checksum: that chunk's promotion fails and it is never a HIT; the other
    chunks still load, byte-identical."""
    keys = keys_of(b"corrupt")
    first = tiering_manager(tmp_path, "first")
    stored = store_through_cpu_tier(first, keys, seed=2)
    first.shutdown()
    (bad,) = [f for f in entry_files(tmp_path) if os.path.basename(f) == bytes(keys[1]).hex() + ".kvc"]
    with open(bad, "r+b") as f:  # docs/file-format.md: the payload follows the header page
        f.seek(HEADER_BYTES + 10)
        b = f.read(1)
        f.seek(HEADER_BYTES + 10)
        f.write(bytes([b[0] ^ 0xFF]))

    second = tiering_manager(tmp_path, "second")
    ctx = ReqContext(req_id="reader")
    res, loaded = load_through_cpu_tier(second, keys, ctx)
    assert loaded is None and res[1] == LookupResult.MISS  # never HIT: vLLM recomputes it
    assert tier_of(second).engine.stats()["corrupt_entries"] >= 1
    good = [keys[0]] + keys[2:]
    res, loaded = load_through_cpu_tier(second, good, ReqContext(req_id="reader-2"))
    assert res == [LookupResult.HIT] * len(good)
    assert np.array_equal(loaded, np.concatenate([stored[:1], stored[2:]]))
    second.shutdown()


@needs_tiers
def test_kv_load_tiers_select_kvtier_by_medium_and_locality(tmp_path):
    """vLLM's tiering matches a request's kv_load_tiers against each secondary tier's medium and locality
    (tiering/manager.py, lookup): kvtier's is STORAGE and, on a root one host uses, LOCAL (or what the entry's
    "locality" says)."""
    from vllm.v1.kv_offload.base import Locality, Medium, TierFilter, TierMatcher

    keys = keys_of(b"filter")
    first = tiering_manager(tmp_path, "first")
    store_through_cpu_tier(first, keys, seed=3)
    first.shutdown()
    second = tiering_manager(tmp_path, "second")
    for i, (matcher, hit) in enumerate([(TierMatcher(medium=Medium.CPU), False),
                                        (TierMatcher(medium=Medium.STORAGE, locality=Locality.REMOTE), False),
                                        (TierMatcher(medium=Medium.STORAGE, locality=Locality.LOCAL), True)]):
        ctx = ReqContext(req_id=f"r{i}", load_tier_filter=TierFilter(matchers=(matcher,)))
        res, _ = load_through_cpu_tier(second, keys[:1], ctx)
        assert (res == [LookupResult.HIT]) is hit, (matcher, res)
    second.shutdown()
    remote = tiering_manager(tmp_path, "third", locality="REMOTE")
    assert tier_of(remote).locality.name == "REMOTE"
    remote.shutdown()


@needs_tiers
def test_settings_of_kvtiers_own_spec_are_refused_in_a_tier_entry(tmp_path):
    with pytest.raises(ValueError, match="kvtier_thresholds_path"):
        tiering_manager(tmp_path, "e", kvtier_thresholds_path=str(tmp_path / "t.json"))
    with pytest.raises(ValueError, match="kvtier_pool_byts"):
        tiering_manager(tmp_path, "e2", kvtier_pool_byts="1G")


def test_the_plugin_registers_the_tier_and_old_releases_get_a_clear_error(tmp_path):
    """kvtier's plugin names KVTierTier in vLLM's SecondaryTierFactory, so the entry works without module_path; a
    release whose tiering cannot take it stops with kvtier's error (naming 0.28 and KVTierSpec), not vLLM's
    "Unknown secondary tier type"."""
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    vllm_plugin.register()
    assert SecondaryTierFactory.get_tier_class({"type": "KVTierTier"}) is kv.KVTierTier
    if kv.compat.OUT_OF_TREE_TIERS:
        cls = SecondaryTierFactory.get_tier_class({"type": "KVTierTier", "module_path": "kvtier.vllm.tier"})
        assert cls is kv.KVTierTier
        return
    with pytest.raises(kv.compat.UnsupportedVLLMVersion, match=r"0\.28\.0 or later.*KVTierSpec"):
        tiering_manager(tmp_path, "old")
