"""KVTierWorker's copier seam (docs/vllm-integration.md, "The CUDA worker"), without a GPU.

* An asynchronous fake copier that moves the bytes (memmove, host tensors) only when the test completes its ticket:
  jobs are not reported before their copy is done, wait() blocks until it is, failed copies report success=False,
  stored and loaded bytes land where they should, a load whose slot is refilled during the copy is refused.
* _CudaCopier driven through a fake kvtier._kvtier_cuda and host tensors that claim to be on cuda:1: device
  choice, pool registration once per pool, directions, argument order and the caller's stream.
The scheduler side is fake_ext's pure-Python engine, as in test_spec_unit.py."""

import ctypes
import sys
import threading
import time
import types

import numpy as np
import pytest
import torch

import kvtier.vllm as kv
from vllm.v1.kv_offload.base import CanonicalKVCaches, CanonicalKVCacheTensor, GPULoadStoreSpec, ReqContext

import fake_ext
from test_spec_unit import LAYERS, PAGE, _lookup_all, keys_for, make_config, make_kv


@pytest.fixture
def fake(monkeypatch):
    fake_ext._PoolMem.registry.clear()
    monkeypatch.setattr(kv.extension, "load", lambda: fake_ext)
    return fake_ext


def _memmove_all(dst, src, sizes):
    for d, s, n in zip(dst.tolist(), src.tolist(), sizes.tolist()):
        ctypes.memmove(d, s, n)


class FakeAsyncCopier:
    """A _Copier whose copies happen only when the test calls complete(ticket) (or fail(ticket))."""

    asynchronous = True

    def __init__(self):
        self.calls = []  # (direction, dst, src, sizes)
        self.attached, self.detached, self.closed = [], [], False
        self._state = {}  # ticket -> "queued" | "done" | "failed"
        self._cv = threading.Condition()
        self.raise_on_copy = False

    def attach(self, pool):
        self.attached.append(pool.base_address)

    def detach(self, pool):
        self.detached.append(pool.base_address)

    def copy(self, direction, dst, src, sizes):
        if self.raise_on_copy:
            raise RuntimeError("CUDA copy: an injected launch failure")
        assert direction in ("h2d", "d2h")
        self.calls.append((direction, dst.copy(), src.copy(), sizes.copy()))
        ticket = len(self.calls)
        with self._cv:
            self._state[ticket] = "queued"
        return ticket

    def complete(self, ticket):
        _, dst, src, sizes = self.calls[ticket - 1]
        _memmove_all(dst, src, sizes)
        with self._cv:
            self._state[ticket] = "done"
            self._cv.notify_all()

    def fail(self, ticket):
        with self._cv:
            self._state[ticket] = "failed"
            self._cv.notify_all()

    def done(self, ticket):
        with self._cv:
            return self._state[ticket] != "queued"

    def wait(self, ticket):
        with self._cv:
            self._cv.wait_for(lambda: self._state[ticket] != "queued", timeout=10)
            if self._state[ticket] == "failed":
                raise RuntimeError("CUDA copy: an injected failure")
            assert self._state[ticket] == "done", "wait() timed out in the test"

    def close(self):
        self.closed = True

    def describe(self):
        return "fake asynchronous copier"


def _setup(tmp_path, bpc=2, n_keys=2):
    spec = kv.KVTierSpec(make_config(tmp_path, bpc=bpc))
    manager = spec.get_manager()
    return spec, manager, keys_for(n_keys, salt=b"copier")


def _payload(manager, slot):
    return manager.engine._payload(slot)


def test_store_and_load_are_reported_only_after_the_copy(fake, tmp_path):
    bpc = 2
    spec, manager, keys = _setup(tmp_path, bpc)
    src_layers, src_kv = make_kv(1)
    copier = FakeAsyncCopier()
    worker = kv.KVTierWorker(src_kv, bpc, 0, LAYERS * PAGE, copier=copier)
    src_blocks = [9, 3, 17, 5]

    ctx = ReqContext(req_id="store")
    out = manager.prepare_store(keys, ctx)
    slots = out.store_spec.slots.tolist()
    assert worker.submit_store(1, GPULoadStoreSpec(src_blocks, group_sizes=[4], block_indices=[0]), out.store_spec)
    assert worker.get_finished() == []  # the copy has not run
    assert not _payload(manager, slots[0]).any()
    direction, dst, src, sizes = copier.calls[0]
    assert direction == "d2h"
    base = manager.engine._mem.buf.ctypes.data
    assert np.all((dst >= base) & (dst < base + manager.engine._mem.buf.nbytes))  # store: slot side is dst
    assert int(src[0]) == src_kv.tensors[0].tensor.data_ptr() + src_blocks[0] * PAGE
    copier.complete(1)
    (res,) = worker.get_finished()
    assert res.job_id == 1 and res.success and res.transfer_size == 4 * LAYERS * PAGE
    assert worker.get_finished() == []  # reported once
    manager.complete_store(keys, ctx)

    # block b of chunk k holds the pages of src_blocks[k*bpc + b], layer by layer
    stride = manager.engine.block_stride
    for i, blk in enumerate(src_blocks):
        pay = _payload(manager, slots[i // bpc])
        for layer in range(LAYERS):
            off = (i % bpc) * stride + layer * PAGE
            want = src_kv.tensors[layer].tensor[blk].numpy().view(np.uint8)
            assert np.array_equal(pay[off:off + PAGE], want)

    dst_layers, dst_kv = make_kv(2)
    before = [t.clone() for t in dst_layers]
    dst_copier = FakeAsyncCopier()
    dst_worker = kv.KVTierWorker(dst_kv, bpc, 0, LAYERS * PAGE, copier=dst_copier)
    lctx = ReqContext(req_id="load")
    _lookup_all(manager, keys, lctx)
    load_spec = manager.prepare_load(keys, lctx)
    dst_blocks = [40, 41, 42]  # the first block was computed by vLLM: skip 1
    assert dst_worker.submit_load(2, load_spec, GPULoadStoreSpec(dst_blocks, group_sizes=[3], block_indices=[1]))
    assert dst_worker.get_finished() == []
    assert all(torch.equal(a, b) for a, b in zip(dst_layers, before))  # nothing written yet
    assert dst_copier.calls[0][0] == "h2d"
    assert int(dst_copier.calls[0][1][0]) == dst_kv.tensors[0].tensor.data_ptr() + 40 * PAGE  # load: KV side is dst
    dst_copier.complete(1)
    (res,) = dst_worker.get_finished()
    assert res.job_id == 2 and res.success and res.transfer_size == 3 * LAYERS * PAGE
    for layer in range(LAYERS):
        assert torch.equal(dst_layers[layer][dst_blocks], src_layers[layer][src_blocks[1:]])
        assert torch.equal(dst_layers[layer][:40], before[layer][:40])
    manager.complete_load(keys, lctx)
    assert all(r[2] == 0 for r in manager.engine.resident.values())


def test_wait_blocks_until_the_copy_is_done(fake, tmp_path):
    spec, manager, keys = _setup(tmp_path, bpc=1, n_keys=1)
    _, src_kv = make_kv(1)
    copier = FakeAsyncCopier()
    worker = kv.KVTierWorker(src_kv, 1, 0, LAYERS * PAGE, copier=copier)
    out = manager.prepare_store(keys, ReqContext(req_id="r"))
    worker.submit_store(5, GPULoadStoreSpec([7], group_sizes=[1], block_indices=[0]), out.store_spec)
    slot = int(out.store_spec.slots[0])

    t = threading.Timer(0.3, copier.complete, args=(1,))
    t0 = time.monotonic()
    t.start()
    worker.wait({5, 99})  # 99: unknown (or already reported) jobs are ignored
    elapsed = time.monotonic() - t0
    t.join()
    assert elapsed >= 0.25, elapsed
    assert _payload(manager, slot)[:PAGE].tobytes() == src_kv.tensors[0].tensor[7].numpy().tobytes()
    (res,) = worker.get_finished()
    assert res.job_id == 5 and res.success
    worker.wait({5})  # already done: returns at once


def test_failed_copy_reports_failure(fake, tmp_path):
    spec, manager, keys = _setup(tmp_path, bpc=1, n_keys=2)
    _, src_kv = make_kv(1)
    copier = FakeAsyncCopier()
    worker = kv.KVTierWorker(src_kv, 1, 0, LAYERS * PAGE, copier=copier)
    out = manager.prepare_store(keys, ReqContext(req_id="r"))
    worker.submit_store(1, GPULoadStoreSpec([1, 2], group_sizes=[2], block_indices=[0]), out.store_spec)
    copier.fail(1)
    (res,) = worker.get_finished()
    assert res.job_id == 1 and not res.success and res.transfer_size == 0

    # a copy that cannot even be queued fails the job at once
    copier.raise_on_copy = True
    worker.submit_store(2, GPULoadStoreSpec([1, 2], group_sizes=[2], block_indices=[0]), out.store_spec)
    (res,) = worker.get_finished()
    assert res.job_id == 2 and not res.success

    # a failure seen through wait()
    copier.raise_on_copy = False
    worker.submit_store(3, GPULoadStoreSpec([1, 2], group_sizes=[2], block_indices=[0]), out.store_spec)
    threading.Timer(0.05, copier.fail, args=(2,)).start()
    worker.wait({3})
    (res,) = worker.get_finished()
    assert res.job_id == 3 and not res.success


def test_jobs_complete_independently(fake, tmp_path):
    spec, manager, keys = _setup(tmp_path, bpc=1, n_keys=2)
    _, src_kv = make_kv(1)
    copier = FakeAsyncCopier()
    worker = kv.KVTierWorker(src_kv, 1, 0, LAYERS * PAGE, copier=copier)
    out = manager.prepare_store(keys, ReqContext(req_id="r"))
    s0 = kv.KVTierLoadStoreSpec(out.store_spec.pool_name, out.store_spec.block_stride,
                                out.store_spec.payload_offset, out.store_spec.slots[:1], out.store_spec.gens[:1])
    s1 = kv.KVTierLoadStoreSpec(out.store_spec.pool_name, out.store_spec.block_stride,
                                out.store_spec.payload_offset, out.store_spec.slots[1:], out.store_spec.gens[1:])
    worker.submit_store(10, GPULoadStoreSpec([1], group_sizes=[1], block_indices=[0]), s0)
    worker.submit_store(11, GPULoadStoreSpec([2], group_sizes=[1], block_indices=[0]), s1)
    copier.complete(2)
    assert [r.job_id for r in worker.get_finished()] == [11]
    copier.complete(1)
    assert [r.job_id for r in worker.get_finished()] == [10]


def test_load_refused_if_slot_refilled_during_copy(fake, tmp_path):
    spec, manager, keys = _setup(tmp_path, bpc=1, n_keys=1)
    _, src_kv = make_kv(1)
    ctx = ReqContext(req_id="s")
    out = manager.prepare_store(keys, ctx)
    kv.KVTierWorker(src_kv, 1, 0, LAYERS * PAGE).submit_store(1, GPULoadStoreSpec([3], group_sizes=[1],
                                                                                   block_indices=[0]),
                                                           out.store_spec)
    manager.complete_store(keys, ctx)
    lctx = ReqContext(req_id="l")
    _lookup_all(manager, keys, lctx)
    load_spec = manager.prepare_load(keys, lctx)
    _, dst_kv = make_kv(2)
    copier = FakeAsyncCopier()
    worker = kv.KVTierWorker(dst_kv, 1, 0, LAYERS * PAGE, copier=copier)
    worker.submit_load(4, load_spec, GPULoadStoreSpec([8], group_sizes=[1], block_indices=[0]))
    manager.engine._mem.gen[int(load_spec.slots[0])] += 1  # the engine refilled the slot (after a reset_cache)
    copier.complete(1)
    (res,) = worker.get_finished()
    assert res.job_id == 4 and not res.success


def test_shutdown_and_pool_switch_wait_for_pending_copies(fake, tmp_path):
    spec, manager, keys = _setup(tmp_path, bpc=1, n_keys=1)
    _, src_kv = make_kv(1)
    copier = FakeAsyncCopier()
    worker = kv.KVTierWorker(src_kv, 1, 0, LAYERS * PAGE, copier=copier)
    out = manager.prepare_store(keys, ReqContext(req_id="r"))
    worker.submit_store(1, GPULoadStoreSpec([1], group_sizes=[1], block_indices=[0]), out.store_spec)
    assert copier.attached == [manager.engine._mem.buf.ctypes.data]
    # a second engine (another pool): the pending copy is waited for and the old pool detached first
    spec2 = kv.KVTierSpec(make_config(tmp_path, bpc=1, engine_id="other"))
    m2 = spec2.get_manager()
    out2 = m2.prepare_store(keys_for(1, salt=b"other"), ReqContext(req_id="r2"))
    threading.Timer(0.05, copier.complete, args=(1,)).start()
    worker.submit_store(2, GPULoadStoreSpec([2], group_sizes=[1], block_indices=[0]), out2.store_spec)
    assert copier.detached == [manager.engine._mem.buf.ctypes.data]
    assert copier.attached[-1] == m2.engine._mem.buf.ctypes.data
    assert [r.job_id for r in worker.get_finished()] == [1]
    threading.Timer(0.05, copier.complete, args=(2,)).start()
    worker.shutdown()
    assert copier.closed
    assert [r.job_id for r in worker.get_finished()] == [2]


# ------------------------------------------------------------------------------------------- the CUDA copier
class _OnCuda:
    """A host tensor that says it is on cuda:<index> (the worker reads device, data_ptr, stride, element_size, and
    on vLLM 0.34+ shape: compat.block_spec checks block ids against it)."""

    def __init__(self, t, index):
        self._t, self.device = t, torch.device("cuda", index)
        self.shape = t.shape

    def data_ptr(self):
        return self._t.data_ptr()

    def stride(self, dim):
        return self._t.stride(dim)

    def element_size(self):
        return self._t.element_size()


def _cuda_kv(seed, index=1):
    layers, host = make_kv(seed)
    tensors = [CanonicalKVCacheTensor(_OnCuda(t.tensor, index), t.page_size_bytes) for t in host.tensors]
    return layers, host, CanonicalKVCaches(tensors, host.group_data_refs)


class FakeCudaExt(types.SimpleNamespace):
    """kvtier._kvtier_cuda's surface: CudaCopier copies at once (memmove) and logs every call."""

    def __init__(self):
        log = []
        self.log = log

        class CudaCopier:
            def __init__(self, device=0, mode="auto", kernel_threads=256, kernel_blocks_per_sm=4):
                self.device, self.registered, self.next = device, [], 0
                log.append(("init", device, mode))

            def is_registered(self, address, bytes):
                return any(a <= address and address + bytes <= a + n for a, n in self.registered)

            def register_host(self, address, bytes):
                log.append(("register_host", address, bytes))
                self.registered.append((address, bytes))

            def copy_batch(self, direction, dst, src, sizes, stream=0):
                assert all(isinstance(a, np.ndarray) and a.dtype == np.uint64 for a in (dst, src, sizes))
                log.append(("copy_batch", direction, int(dst[0]), int(src[0]), stream))
                _memmove_all(dst, src, sizes)
                self.next += 1
                return self.next

            def query(self, ticket):
                log.append(("query", ticket))
                return True

            def wait(self, ticket):
                log.append(("wait", ticket))

            def stream_wait(self, ticket, stream):
                log.append(("stream_wait", ticket, stream))

            def describe(self):
                return f"fake CUDA device {self.device}"

            def close(self):
                log.append(("close",))

        self.CudaCopier = CudaCopier
        self.NO_STREAM_DEPENDENCY = 2**64 - 1


def test_the_cuda_copy_mode_reaches_the_copier(fake, tmp_path, monkeypatch):
    ext = FakeCudaExt()
    monkeypatch.setattr(kv.extension, "load_cuda", lambda: ext)
    _, _, src_kv = _cuda_kv(1)
    worker = kv.KVTierWorker(src_kv, 1, 0, LAYERS * PAGE, cuda_copy_mode="batch_api")
    assert worker._copier.mode == "batch_api" and ext.log[0] == ("init", 1, "batch_api")


def test_cuda_tensors_use_the_cuda_copier(fake, tmp_path, monkeypatch):
    ext = FakeCudaExt()
    monkeypatch.setattr(kv.extension, "load_cuda", lambda: ext)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=0xABC))
    spec, manager, keys = _setup(tmp_path, bpc=1, n_keys=2)
    src_layers, host_src, src_kv = _cuda_kv(1)
    worker = kv.KVTierWorker(src_kv, 1, 0, LAYERS * PAGE)
    # kvtier_cuda_copy_mode's default: the copy engines
    assert isinstance(worker._copier, kv.CudaCopier) and ext.log[0] == ("init", 1, "batch_api")

    ctx = ReqContext(req_id="s")
    out = manager.prepare_store(keys, ctx)
    worker.submit_store(1, GPULoadStoreSpec([4, 6], group_sizes=[2], block_indices=[0]), out.store_spec)
    (res,) = worker.get_finished()
    assert res.success and res.transfer_size == 2 * LAYERS * PAGE
    manager.complete_store(keys, ctx)
    mem = manager.engine._mem.buf
    assert ("register_host", mem.ctypes.data, mem.nbytes) in ext.log
    slot_addr = mem.ctypes.data + int(out.store_spec.slots[0]) * manager.engine._mem.slot_stride + 4096
    kv_addr = host_src.tensors[0].tensor.data_ptr() + 4 * PAGE
    assert ("copy_batch", "d2h", slot_addr, kv_addr, 0xABC) in ext.log  # dst = slot, src = KV, caller's stream

    _, host_dst, dst_kv = _cuda_kv(2)
    w2 = kv.KVTierWorker(dst_kv, 1, 0, LAYERS * PAGE)
    lctx = ReqContext(req_id="l")
    _lookup_all(manager, keys, lctx)
    w2.submit_load(2, manager.prepare_load(keys, lctx), GPULoadStoreSpec([10, 11], group_sizes=[2],
                                                                        block_indices=[0]))
    (res,) = w2.get_finished()
    assert res.success and res.job_id == 2
    loads = [e for e in ext.log if e[0] == "copy_batch" and e[1] == "h2d"]
    assert loads == [("copy_batch", "h2d", host_dst.tensors[0].tensor.data_ptr() + 10 * PAGE, slot_addr, 0xABC)]
    for layer in range(LAYERS):
        assert torch.equal(host_dst.tensors[layer].tensor[[10, 11]], host_src.tensors[layer].tensor[[4, 6]])
    assert not [e for e in ext.log if e[0] == "stream_wait"]  # see the comment above KVTierWorker._transfer
    # the pool is registered once per copier, however many jobs
    w2.submit_load(3, manager.prepare_load(keys, lctx), GPULoadStoreSpec([12, 13], group_sizes=[2],
                                                                        block_indices=[0]))
    w2.get_finished()
    assert sum(1 for e in ext.log if e[0] == "register_host") == 2  # one per worker (two copiers)
    w2.shutdown()
    assert ext.log[-1] == ("close",)


def test_cuda_without_the_cuda_module_is_a_clear_error(fake, monkeypatch):
    monkeypatch.setitem(sys.modules, "kvtier._kvtier_cuda", None)  # makes the import fail
    _, _, cuda_kv = _cuda_kv(1)
    with pytest.raises(ImportError, match="KVTIER_WITH_CUDA"):
        kv.KVTierWorker(cuda_kv, 1, 0, LAYERS * PAGE)


def test_mixed_devices_are_refused(fake):
    _, host = make_kv(1)
    tensors = list(host.tensors)
    tensors[1] = CanonicalKVCacheTensor(_OnCuda(tensors[1].tensor, 0), PAGE)
    with pytest.raises(NotImplementedError, match="cuda:0"):
        kv.KVTierWorker(CanonicalKVCaches(tensors, host.group_data_refs), 1, 0, LAYERS * PAGE)


def test_host_tensors_keep_the_synchronous_host_copier(fake, tmp_path):
    _, src_kv = make_kv(1)
    w = kv.KVTierWorker(src_kv, 1, 0, LAYERS * PAGE, copy_threads=2)
    assert isinstance(w._copier, kv.HostCopier) and not w._copier.asynchronous


# ------------------------------------------------------------------------------------------- real extension
def _real_ext():
    try:
        from kvtier import _kvtier  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.skipif(not _real_ext(), reason="kvtier._kvtier not built")
def test_real_pool_with_an_asynchronous_copier(tmp_path):
    """The real engine and pool: what _CudaCopier registers (base_address, mapped_bytes) covers every slot address
    the worker copies from or to, and an asynchronous store then load moves the right bytes."""
    bpc = 2
    spec = kv.KVTierSpec(make_config(tmp_path, bpc=bpc, engine_id="async-real"))
    manager = spec.get_manager()
    keys = keys_for(2, salt=b"async-real")
    src_layers, src_kv = make_kv(1)
    copier = FakeAsyncCopier()
    pools = []
    orig_attach = copier.attach
    copier.attach = lambda pool: (pools.append((pool.base_address, pool.mapped_bytes)), orig_attach(pool))
    worker = kv.KVTierWorker(src_kv, bpc, 0, LAYERS * PAGE, copier=copier)
    ctx = ReqContext(req_id="s")
    out = manager.prepare_store(keys, ctx)
    blocks = [3, 4, 5, 6]
    worker.submit_store(1, GPULoadStoreSpec(blocks, group_sizes=[4], block_indices=[0]), out.store_spec)
    assert worker.get_finished() == []
    (base, size), = pools
    slot_side = copier.calls[0][1]
    assert np.all((slot_side >= base) & (slot_side + copier.calls[0][3] <= base + size))
    copier.complete(1)
    (res,) = worker.get_finished()
    assert res.success
    manager.complete_store(keys, ctx)

    lctx = ReqContext(req_id="l")
    _lookup_all(manager, keys, lctx)
    dst_layers, dst_kv = make_kv(2)
    dst_copier = FakeAsyncCopier()
    w2 = kv.KVTierWorker(dst_kv, bpc, 0, LAYERS * PAGE, copier=dst_copier)
    w2.submit_load(2, manager.prepare_load(keys, lctx), GPULoadStoreSpec([20, 21, 22, 23], group_sizes=[4],
                                                                        block_indices=[0]))
    threading.Timer(0.05, dst_copier.complete, args=(1,)).start()
    w2.wait({2})
    (res,) = w2.get_finished()
    assert res.success
    for layer in range(LAYERS):
        assert torch.equal(dst_layers[layer][[20, 21, 22, 23]], src_layers[layer][blocks])
    manager.complete_load(keys, lctx)
    w2.shutdown()
    worker.shutdown()
    manager.shutdown()


def test_an_asynchronous_worker_attaches_and_registers_the_pool_before_the_first_transfer(fake, tmp_path,
                                                                                         monkeypatch):
    """Registering a big pool with CUDA takes seconds: the worker finds the pool by its name's suffix and attaches
    it in the background, so the first transfer does not pay for it (and attaches nothing again)."""
    spec, manager, keys = _setup(tmp_path, bpc=1, n_keys=1)
    name = manager.engine.pool_name
    suffix = name.rsplit("-", 1)[1]
    monkeypatch.setattr(kv.KVTierWorker, "_find_pool", staticmethod(lambda s: name if s == suffix else None))
    _, src_kv = make_kv(1)
    copier = FakeAsyncCopier()
    worker = kv.KVTierWorker(src_kv, 1, 0, LAYERS * PAGE, copier=copier, pool_suffix=suffix)
    worker._preattach_thread.join(timeout=10)
    assert len(copier.attached) == 1, "the pool was not attached in the background"
    ctx = ReqContext(req_id="s")
    out = manager.prepare_store(keys, ctx)
    assert worker.submit_store(1, GPULoadStoreSpec([3], group_sizes=[1], block_indices=[0]), out.store_spec)
    assert len(copier.attached) == 1  # the transfer found it attached
    copier.complete(1)
    (res,) = worker.get_finished()
    assert res.success
    manager.complete_store(keys, ctx)
    worker.shutdown()


def test_the_host_worker_does_not_pre_attach(fake, tmp_path):
    _, src_kv = make_kv(1)
    worker = kv.KVTierWorker(src_kv, 1, 0, LAYERS * PAGE, pool_suffix="0123456789abcdef")
    assert worker._preattach_thread is None
    worker.shutdown()


def test_find_pool_picks_the_newest_matching_shm_object(tmp_path):
    import os
    made = []
    try:
        for pid in (111111, 222222):
            path = f"/dev/shm/kvtier-{pid}-feedfacecafebeef"
            with open(path, "wb"):
                pass
            os.utime(path, ns=(pid * 1000, pid * 1000))
            made.append(path)
        assert kv.KVTierWorker._find_pool("feedfacecafebeef") == "/kvtier-222222-feedfacecafebeef"
        assert kv.KVTierWorker._find_pool("0000000000000000") is None
    finally:
        for p in made:
            os.unlink(p)
