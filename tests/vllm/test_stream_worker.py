"""Streamed transfers through KVTierManager and KVTierWorker (docs/architecture.md "Streamed transfers") on the real
kvtier._kvtier engine, vLLM's config objects and CPU tensors: a pool of 3 slots carries a 12-chunk store and load;
an asynchronous copier (the CUDA copier's seam) gets every copy behind the fence taken at submission and acks only
after its copy completed; a chunk that fails mid-stream is never copied and its blocks are reported as load errors
(or, where no KVTierConnector drains them, the job fails)."""

import threading
import time

import pytest
import torch

import kvtier.vllm as kv
from kvtier.vllm import worker as worker_mod
from vllm.v1.kv_offload.base import GPULoadStoreSpec, LookupResult, ReqContext

from test_spec_unit import LAYERS, PAGE, keys_for, make_config, make_kv

BPC = 2
CHUNKS = 12
SLOT = 4096 + BPC * LAYERS * PAGE  # a slot: the header page, then the chunk's blocks (LAYERS * PAGE bytes each)


def _real_ext():
    try:
        from kvtier import _kvtier  # noqa: F401
        return True
    except ImportError:
        return False


pytestmark = pytest.mark.skipif(not _real_ext(), reason="kvtier._kvtier not built")


class FencedAsyncCopier:
    """An asynchronous copier with fence(): copies run on a thread of its own a moment after they are queued, each
    records the fence it was given."""

    asynchronous = True

    def __init__(self, ext):
        self._host = kv.copiers.HostCopier(ext)
        self.fences_taken, self.fences_seen = 0, []
        self._done = {}
        self._lock = threading.Lock()

    def attach(self, pool):
        return

    def detach(self, pool):
        return

    def fence(self):
        self.fences_taken += 1
        return ("fence", self.fences_taken)

    def copy(self, direction, dst, src, sizes, after=None):
        self.fences_seen.append(after)
        ticket = object()
        with self._lock:
            self._done[ticket] = False

        def run():
            time.sleep(0.002)
            self._host.copy(direction, dst, src, sizes)
            with self._lock:
                self._done[ticket] = True
        threading.Thread(target=run).start()
        return ticket

    def done(self, ticket):
        with self._lock:
            return self._done[ticket]

    def wait(self, ticket):
        while not self.done(ticket):
            time.sleep(0.001)

    def close(self):
        return

    def describe(self):
        return "fenced asynchronous fake"


def _spec(tmp_path, engine_id):
    return kv.KVTierSpec(make_config(tmp_path, bpc=BPC, engine_id=engine_id,
                                     extra={"kvtier_pool_bytes": str(3 * SLOT), "kvtier_dram_max_slots": 3}))


def _wait_finished(worker, n=1, timeout_s=30):
    out, deadline = [], time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        out += worker.get_finished()
        time.sleep(0.005)
    assert len(out) == n, f"{len(out)} of {n} jobs finished"
    return out


def _store_all(tmp_path, keys, blocks, copier=None):
    src_layers, src_kv = make_kv(1)
    spec = _spec(tmp_path, "store")
    manager = spec.get_manager()
    manager.streaming = True
    worker = kv.KVTierWorker(src_kv, BPC, 0, LAYERS * PAGE, copier=copier)
    ctx = ReqContext(req_id="s")
    out = manager.prepare_store(keys, ctx)
    assert list(out.keys_to_store) == keys and out.store_spec.stream is not None
    assert worker.submit_store(1, GPULoadStoreSpec(blocks, group_sizes=[len(blocks)], block_indices=[0]),
                               out.store_spec)
    (res,) = _wait_finished(worker)
    assert res.success and res.transfer_size == len(blocks) * LAYERS * PAGE
    manager.complete_store(keys, ctx)
    deadline = time.monotonic() + 30
    while manager.engine.stats()["stores_completed"] < CHUNKS and time.monotonic() < deadline:
        time.sleep(0.02)
    st = manager.engine.stats()
    assert st["stores_completed"] == CHUNKS and st["pool_peak_slots"] <= 3, st
    manager.shutdown()
    worker.shutdown()
    return src_layers


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_store_and_a_load_larger_than_the_pool_stream_through_it(tmp_path, asynchronous):
    ext = kv.extension.load()
    keys = keys_for(CHUNKS, salt=b"stream")
    blocks = list(range(1, 1 + CHUNKS * BPC))
    store_copier = FencedAsyncCopier(ext) if asynchronous else None
    src_layers = _store_all(tmp_path, keys, blocks, store_copier)
    if asynchronous:  # every copy waited for the fence its job took at submission
        assert store_copier.fences_taken == 1 and set(store_copier.fences_seen) == {("fence", 1)}

    spec = _spec(tmp_path, "load")
    manager = spec.get_manager()
    manager.streaming = True
    ctx = ReqContext(req_id="r")
    assert [manager.lookup(k, ctx) for k in keys] == [LookupResult.HIT] * CHUNKS  # from the index: no read yet
    assert manager.engine.stats()["bytes_read"] == 0
    dst_layers, dst_kv = make_kv(2)
    load_copier = FencedAsyncCopier(ext) if asynchronous else None
    worker = kv.KVTierWorker(dst_kv, BPC, 0, LAYERS * PAGE, copier=load_copier)
    dst = list(range(30, 30 + CHUNKS * BPC))
    worker.submit_load(2, manager.prepare_load(keys, ctx), GPULoadStoreSpec(dst, group_sizes=[len(dst)],
                                                                            block_indices=[0]))
    (res,) = _wait_finished(worker)
    assert res.success
    for layer in range(LAYERS):
        assert torch.equal(dst_layers[layer][dst], src_layers[layer][blocks])
    manager.complete_load(keys, ctx)
    st = manager.engine.stats()
    assert st["bytes_read"] == CHUNKS * SLOT and st["pool_peak_slots"] <= 3, st
    assert worker_mod.take_load_errors() == set()
    manager.shutdown()
    worker.shutdown()


@pytest.mark.parametrize("drained", [True, False])
def test_a_chunk_gone_mid_stream_is_never_copied_and_its_blocks_are_reported(tmp_path, monkeypatch, drained):
    keys = keys_for(CHUNKS, salt=b"gone")
    blocks = list(range(1, 1 + CHUNKS * BPC))
    _store_all(tmp_path, keys, blocks)
    spec = _spec(tmp_path, "load")
    manager = spec.get_manager()
    manager.streaming = True
    ctx = ReqContext(req_id="r")
    assert [manager.lookup(k, ctx) for k in keys] == [LookupResult.HIT] * CHUNKS
    # Chunk 5's file disappears after its hit (another instance evicted it, say).
    ns = next(p for p in tmp_path.iterdir() if p.name.startswith("ns-"))
    files = sorted(ns.rglob("*.kvc"))
    victim = next(f for f in files if keys[5][:32].hex() in f.name)
    victim.unlink()
    monkeypatch.setattr(worker_mod, "_load_errors_drained", drained)
    dst_layers, dst_kv = make_kv(2)
    before = [t.clone() for t in dst_layers]
    worker = kv.KVTierWorker(dst_kv, BPC, 0, LAYERS * PAGE)
    dst = list(range(30, 30 + CHUNKS * BPC))
    worker.submit_load(3, manager.prepare_load(keys, ctx), GPULoadStoreSpec(dst, group_sizes=[len(dst)],
                                                                            block_indices=[0]))
    (res,) = _wait_finished(worker)
    failed_blocks = set(dst[5 * BPC:6 * BPC])
    for layer in range(LAYERS):  # the failed chunk's blocks were never written
        assert torch.equal(dst_layers[layer][sorted(failed_blocks)], before[layer][sorted(failed_blocks)])
    if drained:
        assert res.success
        assert worker_mod.take_load_errors() == failed_blocks
    else:
        assert not res.success  # nobody would recompute those blocks: the job fails, as a failed transfer
        assert worker_mod.take_load_errors() == set()
    manager.complete_load(keys, ctx)
    manager.shutdown()
    worker.shutdown()


def test_a_flushed_store_that_gets_no_slot_gives_up_its_chunks_instead_of_stalling(tmp_path, monkeypatch):
    """vLLM waits (jobs_to_flush) for a store whose GPU blocks it reuses; if another store's reservations, whose job
    vLLM submits only after this wait, hold the whole pool, the waiting store gives up its chunks (not stored: a later
    miss) within the flush bound instead of stalling vLLM's step forever."""
    monkeypatch.setattr(worker_mod, "_FLUSH_WAIT_S", 0.5)
    src_layers, src_kv = make_kv(1)
    spec = _spec(tmp_path, "flush")
    manager = spec.get_manager()
    manager.streaming = True
    worker = kv.KVTierWorker(src_kv, BPC, 0, LAYERS * PAGE)
    hog = manager.prepare_store(keys_for(3, salt=b"hog"), ReqContext(req_id="hog"))  # 3 slots granted, never filled
    assert hog is not None and len(hog.keys_to_store) == 3
    keys = keys_for(2, salt=b"flushed")
    out = manager.prepare_store(keys, ReqContext(req_id="f"))
    blocks = [1, 2, 3, 4]
    assert worker.submit_store(7, GPULoadStoreSpec(blocks, group_sizes=[4], block_indices=[0]), out.store_spec)
    t0 = time.monotonic()
    worker.wait({7})
    assert time.monotonic() - t0 < 5
    (res,) = _wait_finished(worker)
    assert res.success and res.transfer_size == 0  # nothing copied, nothing stored
    manager.complete_store(keys, ReqContext(req_id="f"))
    assert not any(manager.engine.stored(k) for k in keys)
    manager.shutdown()
    worker.shutdown()
