"""The worker side: KVTierWorker, vLLM's OffloadingWorker, copying chunks between staging-pool slots and this
rank's KV tensors (docs/vllm-integration.md "Who does what", "The slot protocol", "The CUDA worker")."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import numpy as np

from . import compat, extension, metrics
from .compat import CanonicalKVCaches, GPULoadStoreSpec, LoadStoreSpec, OffloadingWorker, TransferResult, logger
from .copiers import Copier, make_copier
from .transfer import KVTierLoadStoreSpec

# Stream board entry states (src/staging/staging_pool.h, StreamEntryState).
_ENTRY_WAITING, _ENTRY_READY, _ENTRY_FAILED, _ENTRY_SKIPPED = 0, 1, 2, 3
# A streamed job with no progress for this long is reported in the log (where its chunks stand), again each period.
_STREAM_STALL_S = 10.0
# How long wait() (vLLM's flush of stores whose GPU blocks it reuses) lets a streamed store wait for slots.
_FLUSH_WAIT_S = 10.0
# Several requests' streamed loads at once, kvtier_load_order 'oldest_first' (docs/vllm-integration.md "Several loads
# at once"): one copy covers at most _LOAD_PIECE_BYTES (at least one chunk), so its chunks are acked, and the engine
# fills their slots again, as the pieces land; the oldest load keeps at most kvtier_load_queue_mib of copies queued
# (1 GiB: about 19 ms of a 55 GB/s link), and a younger load gets a piece only while the oldest has none ready and less
# than two pieces (nor more than that queue) are queued, so the oldest waits for at most two pieces of another's.
_LOAD_PIECE_BYTES = 128 << 20
_LOAD_QUEUE_BYTES = 1 << 30
LOAD_ORDERS = ("oldest_first", "shared")

# The signals kvtier's threads leave to the process's own threads (src/util/thread.h): all but the faults the kernel
# sends to the thread that caused them. A SIGTERM to the worker must reach vLLM's handler in the main thread.
_FAULT_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP, signal.SIGSYS,
                  signal.SIGABRT}


def _block_signals() -> None:
    """Called first by each thread the worker starts: process-directed signals never land on it (Python handlers run
    only in the main thread, which a signal taken here would not wake)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals() - _FAULT_SIGNALS)


# Blocks of streamed loads that failed mid-stream (a chunk that could not be read or verified: its blocks were never
# written), for vLLM's get_block_ids_with_load_errors. Only compat.KVTierConnector drains them; a worker reports a
# failed chunk this way only where it does (report_load_errors), else its job fails as a failed transfer.
_load_errors_lock = threading.Lock()
_load_errors: set[int] = set()
_load_errors_drained = False


def report_load_errors() -> None:
    """Called by compat.KVTierConnector in a worker process: failed chunks' blocks reach vLLM from now on."""
    global _load_errors_drained
    _load_errors_drained = True


def take_load_errors() -> set[int]:
    with _load_errors_lock:
        out = set(_load_errors)
        _load_errors.clear()
    return out


class _StreamJob:
    """A streamed transfer (docs/architecture.md "Streamed transfers"): its chunks are copied as the engine makes
    each one ready on the stream board, and acked so the engine can reuse the slot."""

    def __init__(self, job_id: int, load: bool, pool: Any, stream: tuple[int, int, int], layout: tuple,
                 fence: Any, t0: float):
        self.job_id, self.load, self.pool, self.t0, self.fence = job_id, load, pool, t0, fence
        self.first, self.count, self.tag = stream
        (self.slot_rel, self.kv, self.sizes, self.page_chunk, self.block_ids, self.block_chunk) = layout
        # _layout lists pages chunk after chunk (page_chunk never decreases): chunk k's pages are
        # [page_start[k], page_start[k + 1]), so a copy gathers its pages in O(its pages), not O(the job's pages).
        self.page_start = np.searchsorted(self.page_chunk, np.arange(self.count + 1), side="left")
        ends = np.concatenate([[0], np.cumsum(self.sizes, dtype=np.uint64)])
        self.chunk_bytes = (ends[self.page_start[1:]] - ends[self.page_start[:-1]]).astype(np.int64)
        self.todo = np.ones(self.count, dtype=bool)  # chunks not copied, failed or skipped yet
        self.inflight: list[tuple[Any, np.ndarray, int]] = []  # (ticket, chunks, bytes) of asynchronous copies
        self.failed: list[int] = []
        self.nbytes = 0
        self.first_copy_t = 0.0
        self.payload_offset = 0  # the chunk's header page before its payload in a slot
        self.progress_t = t0  # when the stream thread last moved it on (stall reports)
        # The stream thread advances the job under lock; wait() abandons a store under it (abandoned: no copy starts
        # after that, so none reads GPU blocks vLLM reuses once wait() returns).
        self.lock = threading.Lock()
        self.abandoned = False


class _Job:
    """A submitted transfer whose copy may still be running."""

    __slots__ = ("job_id", "load", "ticket", "nbytes", "t0", "pool", "slots", "gens")

    def __init__(self, job_id: int, load: bool, ticket: Any, nbytes: int, t0: float, pool: Any,
                 spec: KVTierLoadStoreSpec):
        self.job_id, self.load, self.ticket, self.nbytes, self.t0, self.pool = job_id, load, ticket, nbytes, t0, pool
        self.slots, self.gens = spec.slots.tolist(), spec.gens.tolist()


def _fit(nbytes: np.ndarray, allowance: int) -> int:
    """How many of the chunks (their sizes in order) fit `allowance` bytes: at least one where it is positive."""
    if allowance <= 0 or len(nbytes) == 0:
        return 0
    return max(1, int(np.searchsorted(np.cumsum(nbytes), allowance, side="right")))


def _pieces(nbytes: np.ndarray, piece: int) -> list[slice]:
    """The chunks (their sizes in order) cut into runs of at most `piece` bytes, at least one chunk each."""
    out, start, size = [], 0, 0
    for k, b in enumerate(nbytes.tolist()):
        if k > start and size + b > piece:
            out.append(slice(start, k))
            start, size = k, 0
        size += b
    if start < len(nbytes):
        out.append(slice(start, len(nbytes)))
    return out


class _LoadOrder:
    """One pass of the stream thread over its jobs with kvtier_load_order 'oldest_first' (_LOAD_PIECE_BYTES says
    the rule): how many bytes of copies each load may start now, `limit` the bytes queued for the oldest."""

    def __init__(self, jobs: list[_StreamJob], limit: int = _LOAD_QUEUE_BYTES):
        self.limit = limit
        self.queued = sum(nb for j in jobs if j.load for _, _, nb in j.inflight)
        self.head = next((j for j in jobs if j.load and j.todo.any()), None)  # the oldest load with chunks to copy
        self.head_sent = 0

    def allowance(self, job: _StreamJob) -> int:
        if job is self.head:
            return self.limit - self.queued
        return min(2 * _LOAD_PIECE_BYTES, self.limit) - self.queued if self.head_sent == 0 else 0

    def sent(self, job: _StreamJob, nbytes: int) -> None:
        self.queued += nbytes
        if job is self.head:
            self.head_sent = nbytes


class KVTierWorker(OffloadingWorker):
    """Copies chunks between pool slots and this rank's KV tensors: host memcpy for host tensors (vLLM's CPU
    platform), the CUDA copier for tensors on a CUDA device (docs/vllm-integration.md, "The CUDA worker")."""

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, rank: int, rank_block_bytes: int,
                 copy_threads: int = 1, attach_timeout_s: float = 60.0, copier: Copier | None = None,
                 pool_suffix: str | None = None, world_size: int = 1, cuda_copy_mode: str = "batch_api",
                 load_order: str = "oldest_first", load_queue_bytes: int = _LOAD_QUEUE_BYTES):
        if load_order not in LOAD_ORDERS:
            raise ValueError(f"kvtier: load_order {load_order!r} is not one of {LOAD_ORDERS}")
        if int(load_queue_bytes) <= 0:
            raise ValueError(f"kvtier: load_queue_bytes must be positive, got {load_queue_bytes}")
        self._oldest_first = load_order == "oldest_first"
        self._load_queue_bytes = int(load_queue_bytes)
        self._ext = extension.load()
        self.bpc = int(blocks_per_chunk)
        self.rank, self.world_size = int(rank), int(world_size)
        self.rank_block_bytes = int(rank_block_bytes)
        # This rank's share of every block in a slot: [rank_offset, rank_offset + rank_block_bytes) of the
        # world_size * rank_block_bytes bytes (docs/vllm-integration.md, "Byte layout of a chunk").
        self.rank_offset = self.rank * self.rank_block_bytes
        # Bytes and jobs this rank copied successfully, stores and loads (logged at shutdown: per-rank evidence
        # that each rank moves only its share: tests/vllm/test_e2e_server.py, tensor parallelism).
        self.copied = {"store": [0, 0], "load": [0, 0]}
        self.copy_threads = int(copy_threads)
        self.attach_timeout_s = float(attach_timeout_s)
        tensors = [t.tensor for t in kv_caches.tensors]
        self._copier: Copier = copier if copier is not None else make_copier(tensors, self._ext, copy_threads,
                                                                              cuda_copy_mode)
        self._tensors = tensors  # keep them alive
        self._bases = np.array([t.data_ptr() for t in tensors], dtype=np.uint64)
        self._row_strides = np.array([t.stride(0) * t.element_size() for t in tensors], dtype=np.uint64)
        # Per group: (tensor index, page bytes, offset inside the rank's share of a block), layer order; a tensor
        # shared by several layers appears once.
        self._groups: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        # Per group, the tensor index of every data ref as vLLM gave them (vLLM 0.34+ resolves a transfer's blocks
        # to one address per block and data ref: compat.block_spec turns them back into block ids).
        self._group_refs = [[int(r.tensor_idx) for r in refs] for refs in kv_caches.group_data_refs]
        for refs in kv_caches.group_data_refs:
            seen: set[int] = set()
            idx, sizes, offs = [], [], []
            off = 0
            for r in refs:
                if r.tensor_idx in seen:
                    continue
                seen.add(r.tensor_idx)
                idx.append(r.tensor_idx)
                sizes.append(r.page_size_bytes)
                offs.append(off)
                off += r.page_size_bytes
            if off > rank_block_bytes:
                raise ValueError(f"kvtier: a block of this rank holds {off} bytes, more than the "
                                 f"{rank_block_bytes} bytes per block the cache identity was built with")
            self._groups.append((np.array(idx, dtype=np.int64), np.array(sizes, dtype=np.uint64),
                                 np.array(offs, dtype=np.uint64)))
        self._pool = None
        self._pool_name: str | None = None
        self._finished: list[TransferResult] = []
        self._pending: dict[int, _Job] = {}  # asynchronous copies not yet seen complete, in submission order
        self._streams: dict[int, _StreamJob] = {}  # streamed jobs not finished yet (the stream thread's work)
        self._stream_cv = threading.Condition()
        self._stream_thread: threading.Thread | None = None
        self._stream_stop = False
        self._lock = threading.Lock()
        self._tl = metrics.timeline()
        self._attach_lock = threading.RLock()  # _attach: the transfer path and the pre-attach thread
        self._closed = False
        logger.info("kvtier worker: rank %d of %d copies bytes [%d, %d) of each %d-byte block; %d KV tensors, "
                    "%d groups, %d bytes/block for this rank, blocks_per_chunk=%d, %s, loads %s (%d MiB queued)",
                    self.rank,
                    self.world_size, self.rank_offset, self.rank_offset + self.rank_block_bytes,
                    self.rank_block_bytes * self.world_size, len(tensors), len(self._groups),
                    int(sum(int(s.sum()) for _, s, _ in self._groups)), self.bpc, self._copier.describe(),
                    load_order, self._load_queue_bytes >> 20)
        # Registering a large pool with CUDA takes seconds (3.5 s for 20 GiB on the H200): do it before the first
        # request needs it. The worker does not know the pool's name (the scheduler's pid is in it) but its suffix,
        # so a thread looks for the pool in /dev/shm and attaches it while the server starts.
        self._preattach_thread = None
        if pool_suffix and self._copier.asynchronous:
            self._preattach_thread = threading.Thread(target=self._preattach, args=(pool_suffix,),
                                                      name="kvtier-preattach", daemon=True)
            self._preattach_thread.start()

    @staticmethod
    def _find_pool(suffix: str) -> str | None:
        """The newest /dev/shm/kvtier-<pid>-<suffix> ('/name' as shm_open wants it), or None."""
        try:
            names = [n for n in os.listdir("/dev/shm") if n.startswith("kvtier-") and n.endswith("-" + suffix)]
        except OSError:
            return None
        if not names:
            return None
        newest = max(names, key=lambda n: os.stat(os.path.join("/dev/shm", n)).st_mtime_ns)
        return "/" + newest

    def _preattach(self, suffix: str) -> None:
        _block_signals()
        deadline = time.monotonic() + self.attach_timeout_s
        while time.monotonic() < deadline:
            name = self._find_pool(suffix)
            if name is not None:
                try:
                    with self._attach_lock:
                        if self._pool is None and not self._closed:
                            self._attach(name)
                    return
                except Exception as e:  # the transfer path attaches (and reports) on its own
                    logger.debug("kvtier worker: pre-attach of %s: %s", name, e)
            time.sleep(0.2)

    # -- pool ----------------------------------------------------------------------------------------------
    def _attach(self, name: str):
        with self._attach_lock:
            return self._attach_locked(name)

    def _attach_locked(self, name: str):
        if self._pool is not None and self._pool_name == name:
            return self._pool
        if self._pool is not None:
            # Another pool (a new scheduler-side engine): nothing may still copy from or into the old mapping.
            self._drain()
            self._copier.detach(self._pool)
            self._pool.close()
            self._pool = None
        deadline = time.monotonic() + self.attach_timeout_s
        delay = 0.01
        while True:
            try:
                pool = self._ext.Pool.attach(name)
                break
            except (OSError, ValueError, RuntimeError) as e:
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"kvtier worker: cannot attach the staging pool {name} within "
                                       f"{self.attach_timeout_s}s (kvtier_attach_timeout_s): {e}") from e
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        try:
            self._copier.attach(pool)  # CUDA: register the mapping (once per attached pool)
        except BaseException:
            pool.close()
            raise
        self._pool, self._pool_name = pool, name
        return pool

    def _slot_addresses(self, pool, spec: KVTierLoadStoreSpec) -> np.ndarray:
        return np.array([pool.slot_address(int(s)) for s in spec.slots], dtype=np.uint64) + \
            np.uint64(spec.payload_offset)

    def _check_slots(self, pool, spec: KVTierLoadStoreSpec, want: str) -> str | None:
        for s, g in zip(spec.slots.tolist(), spec.gens.tolist()):
            gen, state = pool.observe(int(s))
            if gen != g or state != want:
                return f"slot {s}: generation {gen} state {state}, expected generation {g} state {want}"
        return None

    def _addresses(self, spec: KVTierLoadStoreSpec, gpu: GPULoadStoreSpec, slot_addr: np.ndarray):
        """(slot-side addresses, KV-side addresses, sizes) of every page of the transfer (see _layout)."""
        rel, kv, sizes, page_chunk, _, _ = self._layout(len(slot_addr), gpu, spec.block_stride)
        return rel + slot_addr[page_chunk], kv, sizes

    def _layout(self, n_chunks: int, gpu: GPULoadStoreSpec, block_stride: int):
        """Every page of a transfer of n_chunks chunks, in vLLM's semantics: group by group, the first chunk of a
        group skips block_indices[g] % blocks_per_chunk blocks. Returns (slot-side offsets from the chunk's slot
        address, KV-side addresses, sizes, the chunk of each page, the GPU block ids, the chunk of each block).
        KV-side addresses are tensor.data_ptr() + block id * row stride: device addresses for CUDA tensors."""
        block_ids = np.asarray(gpu.block_ids, dtype=np.uint64)
        group_sizes = list(gpu.group_sizes)
        block_indices = list(gpu.block_indices)
        if len(group_sizes) != len(self._groups):
            raise ValueError(f"transfer has {len(group_sizes)} groups, the worker knows {len(self._groups)}")
        slot_parts, kv_parts, size_parts, chunk_parts, block_chunk_parts = [], [], [], [], []
        gpu_off = 0
        key_off = 0
        stride = np.uint64(block_stride)
        for (tidx, sizes, offs), n, bidx in zip(self._groups, group_sizes, block_indices):
            n = int(n)
            if n == 0:
                continue
            skip = int(bidx) % self.bpc
            nkeys = -(-(n + skip) // self.bpc)
            if key_off + nkeys > n_chunks:
                raise ValueError(f"transfer needs {key_off + nkeys} chunks, the spec has {n_chunks}")
            j = np.arange(skip, skip + n, dtype=np.uint64)
            chunk = key_off + (j // np.uint64(self.bpc)).astype(np.int64)
            block_base = (j % np.uint64(self.bpc)) * stride + np.uint64(self.rank_offset)
            ids = block_ids[gpu_off:gpu_off + n]
            # (n blocks, E pages): slot side in payload order, KV side one row per tensor.
            slot_parts.append((block_base[:, None] + offs[None, :]).ravel())
            kv_parts.append((self._bases[tidx][None, :] + ids[:, None] * self._row_strides[tidx][None, :]).ravel())
            size_parts.append(np.tile(sizes, n))
            chunk_parts.append(np.repeat(chunk, len(sizes)))
            block_chunk_parts.append(chunk)
            gpu_off += n
            key_off += nkeys
        if gpu_off != len(block_ids) or key_off != n_chunks:
            raise ValueError(f"transfer covers {gpu_off}/{len(block_ids)} blocks and {key_off}/{n_chunks} chunks")
        if not slot_parts:
            e = np.zeros(0, dtype=np.uint64)
            return e, e, e, np.zeros(0, dtype=np.int64), block_ids, np.zeros(0, dtype=np.int64)
        return (np.concatenate(slot_parts), np.concatenate(kv_parts), np.concatenate(size_parts),
                np.concatenate(chunk_parts), block_ids, np.concatenate(block_chunk_parts))

    # -- transfers -----------------------------------------------------------------------------------------
    #
    # Ordering with the CUDA copier (mirrors vLLM 0.26's own CPU offloading worker, kv_offload/cpu/gpu_worker.py,
    # where it matters, and is stricter where that is cheap):
    # * Store (d2h): queued behind the caller's current stream, i.e. behind the forward pass that wrote the KV
    #   (vLLM submits stores at the start of the next step, before that step's forward is queued, exactly as its
    #   own worker does with stream.wait_stream(current_stream)). vLLM keeps the GPU blocks of a store from reuse
    #   until the job is reported (completed_jobs) or flushed through wait(jobs_to_flush): wait() must block.
    # * Load (h2d): also queued behind the current stream. vLLM's own worker does not do this for loads; we do, so
    #   that a destination block freed by a preemption while an earlier step's forward pass is still queued (async
    #   scheduling) is not written before that pass is done with it. The cost is at most one step's queued work of
    #   delay before the copy starts; the copy still overlaps the forward pass of the step it is submitted in.
    # * No stream_wait after a load: vLLM schedules the loaded request only after get_finished() reported the job,
    #   which happens only after query() saw the copy complete on the device, so any later forward pass that reads
    #   the blocks is queued after the bytes landed. Making the compute stream wait on the ticket at submit time
    #   would instead stall this step's forward pass (which does not read those blocks) for the whole copy.
    # * Slots stay valid while a copy runs: a load's slots stay pinned until complete_load, a store's slot stays
    #   `filling` until complete_store, and vLLM calls those only after get_finished() reported the job (a request
    #   finished during its load keeps its pins until then: KVTierManager.on_request_finished). The exception is
    #   reset_cache, which releases everything at once while the workers learn of the flush one step later; the
    #   generation re-check at completion (_finish) keeps a load whose slot was refilled meanwhile from reporting
    #   success.
    def _transfer(self, job_id: int, spec: LoadStoreSpec, gpu: GPULoadStoreSpec, load: bool) -> bool:
        t0 = time.perf_counter()
        assert isinstance(spec, KVTierLoadStoreSpec), type(spec)
        if spec.stream is not None:
            return self._submit_stream(job_id, spec, gpu, load, t0)
        ok, nbytes = True, 0
        try:
            if len(spec) > 0:
                pool = self._attach(spec.pool_name)
                problem = self._check_slots(pool, spec, "ready" if load else "filling")
                if problem is not None:
                    if load:
                        # Never hand unverified bytes to the model: fail the job loudly.
                        logger.error("kvtier worker: load job %d: %s", job_id, problem)
                        ok = False
                    else:
                        # Only after vLLM's reset_cache: the reservation was given back; vLLM drops the job.
                        logger.warning("kvtier worker: store job %d skipped: %s", job_id, problem)
                else:
                    slot_side, kv_side, sizes = self._addresses(spec, gpu, self._slot_addresses(pool, spec))
                    t1 = time.perf_counter()
                    if load:
                        ticket = self._copier.copy("h2d", kv_side, slot_side, sizes)
                    else:
                        ticket = self._copier.copy("d2h", slot_side, kv_side, sizes)
                    if self._tl is not None:
                        t2 = time.perf_counter()
                        self._tl("submit", job=job_id, load=load, bytes=int(sizes.sum()), pages=int(len(sizes)),
                                 chunks=len(spec), addr_ms=(t1 - t0) * 1e3, issue_ms=(t2 - t1) * 1e3)
                    if self._copier.asynchronous:
                        with self._lock:
                            self._pending[job_id] = _Job(job_id, load, ticket, int(sizes.sum()), t0, pool, spec)
                        return True
                    nbytes = int(ticket)  # HostCopier: the bytes copied
        except Exception:
            logger.exception("kvtier worker: %s job %d failed", "load" if load else "store", job_id)
            ok = False
        with self._lock:
            if ok:
                self._count(load, nbytes)
            self._finished.append(TransferResult(job_id=job_id, success=ok, transfer_size=int(nbytes),
                                                 transfer_time=time.perf_counter() - t0))
        return True

    # -- streamed transfers (docs/architecture.md "Streamed transfers") ----------------------------------------
    #
    # submit_* registers the job and returns; the worker's stream thread copies each chunk as the engine publishes
    # it on the stream board (load: read and verified into its slot; store: a slot granted to fill), acks it so the
    # engine can reuse the slot, and reports the job once every chunk is copied, failed or skipped. With the CUDA
    # copier every copy of the job waits for a fence recorded on the caller's stream at submission (what a
    # synchronous job's copy queued behind then), not for work queued later.
    def _submit_stream(self, job_id: int, spec: KVTierLoadStoreSpec, gpu: GPULoadStoreSpec, load: bool,
                       t0: float) -> bool:
        first, count, tag = spec.stream
        try:
            layout = self._layout(count, gpu, spec.block_stride)
            if np.any(np.diff(layout[3]) < 0):  # _StreamJob.page_start relies on it
                raise ValueError("the transfer's pages are not in chunk order")
            pool = self._attach(spec.pool_name) if tag != 0 else None
            fence_fn = getattr(self._copier, "fence", None)
            fence = fence_fn() if fence_fn is not None and count > 0 else None
        except Exception:
            logger.exception("kvtier worker: %s job %d: cannot start its stream", "load" if load else "store", job_id)
            with self._lock:
                self._finished.append(TransferResult(job_id=job_id, success=False, transfer_size=0,
                                                     transfer_time=time.perf_counter() - t0))
            return True
        job = _StreamJob(job_id, load, pool, (first, count, tag), layout, fence, t0)
        job.payload_offset = int(spec.payload_offset)
        if tag == 0:  # the stream could not open: every chunk failed (the manager logged why)
            job.failed = list(range(count))
            job.todo[:] = False
            self._finish_stream(job)
            return True
        if self._tl is not None:
            self._tl("submit", job=job_id, load=load, bytes=int(job.sizes.sum()), pages=int(len(job.sizes)),
                     chunks=count, stream=True)
        with self._stream_cv:
            self._streams[job_id] = job
            if self._stream_thread is None:
                self._stream_thread = threading.Thread(target=self._stream_loop, name="kvtier-streams", daemon=True)
                self._stream_thread.start()
            self._stream_cv.notify_all()
        return True

    def _stream_loop(self) -> None:
        _block_signals()
        while True:
            with self._stream_cv:
                while not self._streams and not self._stream_stop:
                    self._stream_cv.wait()
                if self._stream_stop:  # shutdown: what is still streaming is abandoned (nothing will ack it)
                    self._streams.clear()
                    self._stream_cv.notify_all()
                    return
                jobs = list(self._streams.values())
            try:
                pool = jobs[0].pool
                bell = pool.worker_bell()
            except Exception:  # the pool went away under the jobs (a pool switch): they fail
                logger.exception("kvtier worker: the stream board is gone")
                pool, bell = None, 0
            progressed = self._stream_pass(jobs, pool is not None)
            if not progressed and pool is not None:
                busy = any(j.inflight for j in jobs)
                try:
                    pool.wait_worker_bell(bell, 0.0002 if busy else 0.005)
                except Exception:
                    time.sleep(0.005)

    def _stream_pass(self, jobs: list[_StreamJob], board: bool) -> bool:
        """One pass of the stream thread over its jobs, oldest first (_streams keeps submission order): acks, copies
        (loads in kvtier_load_order), finishes. Returns whether any job moved on."""
        progressed = False
        now = time.perf_counter()
        order = _LoadOrder(jobs, self._load_queue_bytes) if self._oldest_first else None
        for job in jobs:
            try:
                if not board:
                    raise RuntimeError("no stream board")
                allowance = order.allowance(job) if order is not None and job.load else None
                moved, sent, held = self._advance_stream(job, allowance)
                if order is not None and job.load:
                    order.sent(job, sent)
                if moved or held:  # held back for an older load is waiting its turn, not stalled
                    progressed = progressed or moved
                    job.progress_t = now
                elif now - job.progress_t > _STREAM_STALL_S:
                    self._report_stall(job, now)
            except Exception:
                logger.exception("kvtier worker: %s job %d failed", "load" if job.load else "store", job.job_id)
                job.failed.extend(int(k) for k in np.nonzero(job.todo)[0])
                job.todo[:] = False
                job.inflight = []
                self._finish_stream(job, broken=True)
                progressed = True
        return progressed

    def _report_stall(self, job: _StreamJob, now: float) -> None:
        """A streamed job that made no progress for _STREAM_STALL_S: says where each of its chunks stands (the
        engine's side of the board), once per stall period; the job keeps waiting."""
        job.progress_t = now
        try:
            entries = np.frombuffer(job.pool.observe_entries(job.first, job.count), dtype=np.uint32).reshape(-1, 4)
            states = {name: int(((entries[:, 0] == job.tag) & (entries[:, 1] == v) & job.todo).sum())
                      for name, v in (("waiting", _ENTRY_WAITING), ("ready", _ENTRY_READY))}
            states["other tag"] = int(((entries[:, 0] != job.tag) & job.todo).sum())
        except Exception as e:
            states = {"unreadable": str(e)}
        logger.warning("kvtier worker: %s job %d (stream entries %d+%d, tag %d) made no progress for %.0f s: %d "
                       "chunks left %s, %d copies in flight", "load" if job.load else "store", job.job_id,
                       job.first, job.count, job.tag, _STREAM_STALL_S, int(job.todo.sum()), states,
                       len(job.inflight))

    def _advance_stream(self, job: _StreamJob, allowance: int | None = None) -> tuple[bool, int, bool]:
        """Acks the job's finished copies and copies its ready chunks: all of them (allowance None), or in pieces
        while they fit `allowance` bytes (at least one chunk where it is positive). Returns (progressed, bytes it
        started copying under the allowance (0 without one), whether ready chunks were held back)."""
        with job.lock:
            return (False, 0, False) if job.abandoned else self._advance_stream_locked(job, allowance)

    def _advance_stream_locked(self, job: _StreamJob, allowance: int | None) -> tuple[bool, int, bool]:
        progressed, sent, held = False, 0, False
        for ticket, chunks, nbytes in list(job.inflight):
            if not self._copier.done(ticket):
                continue
            job.inflight.remove((ticket, chunks, nbytes))
            try:
                self._copier.wait(ticket)
            except Exception:
                logger.exception("kvtier worker: %s job %d: a copy failed", "load" if job.load else "store",
                                 job.job_id)
                job.failed.extend(int(k) for k in chunks)
                nbytes = 0
            self._ack(job, chunks, nbytes)
            progressed = True
        if job.todo.any():
            entries = np.frombuffer(job.pool.observe_entries(job.first, job.count), dtype=np.uint32).reshape(-1, 4)
            mine = entries[:, 0] == job.tag
            failed = job.todo & (~mine | (entries[:, 1] == _ENTRY_FAILED))  # another tag: the stream was closed
            skipped = job.todo & mine & (entries[:, 1] == _ENTRY_SKIPPED)
            ready = job.todo & mine & (entries[:, 1] == _ENTRY_READY)
            if failed.any():
                job.failed.extend(int(k) for k in np.nonzero(failed)[0])
                job.todo &= ~failed
                progressed = True
            if skipped.any():
                job.todo &= ~skipped
                progressed = True
            if ready.any():
                chunks = np.nonzero(ready)[0]
                if allowance is None:
                    self._copy_ready(job, chunks, entries)
                    progressed = True
                else:
                    taken = chunks[:_fit(job.chunk_bytes[chunks], allowance)]
                    for piece in _pieces(job.chunk_bytes[taken], _LOAD_PIECE_BYTES):
                        self._copy_ready(job, taken[piece], entries)
                    sent, held = int(job.chunk_bytes[taken].sum()), len(taken) < len(chunks)
                    progressed = progressed or len(taken) > 0
        if not job.todo.any() and not job.inflight:
            self._finish_stream(job)
        return progressed, sent, held

    def _copy_ready(self, job: _StreamJob, ready: np.ndarray, entries: np.ndarray) -> None:
        want = "ready" if job.load else "filling"
        good, addr = [], np.zeros(job.count, dtype=np.uint64)
        for k in ready.tolist():
            slot, gen = int(entries[k, 2]), int(entries[k, 3])
            g, state = job.pool.observe(slot)
            if g != gen or state != want:
                # Never copy bytes the engine does not vouch for (load), or into a slot no longer ours (store).
                logger.error("kvtier worker: %s job %d chunk %d: slot %d is generation %d %s, expected %d %s",
                             "load" if job.load else "store", job.job_id, k, slot, g, state, gen, want)
                job.failed.append(k)
                job.pool.ack_entry(job.first + k, job.tag)
                continue
            good.append(k)
            addr[k] = job.pool.slot_address(slot) + job.payload_offset
        job.todo[ready] = False
        if not good:
            return
        chunks = np.asarray(good, dtype=np.int64)
        spans = [(int(job.page_start[k]), int(job.page_start[k + 1])) for k in good]
        slot_side = np.concatenate([job.slot_rel[a:b] + addr[k] for k, (a, b) in zip(good, spans)])
        kv_side = np.concatenate([job.kv[a:b] for a, b in spans])
        sizes = np.concatenate([job.sizes[a:b] for a, b in spans])
        if job.first_copy_t == 0.0:
            job.first_copy_t = time.perf_counter()
        if self._tl is not None:
            self._tl("stream_copy", job=job.job_id, load=job.load, chunks=[int(k) for k in good],
                     bytes=int(sizes.sum()))
        kwargs = {"after": job.fence} if job.fence is not None else {}
        if job.load:
            ticket = self._copier.copy("h2d", kv_side, slot_side, sizes, **kwargs)
        else:
            ticket = self._copier.copy("d2h", slot_side, kv_side, sizes, **kwargs)
        if self._copier.asynchronous:
            job.inflight.append((ticket, chunks, int(sizes.sum())))
        else:
            self._ack(job, chunks, int(ticket))

    def _ack(self, job: _StreamJob, chunks: np.ndarray, nbytes: int) -> None:
        job.nbytes += int(nbytes)
        for k in chunks.tolist():
            job.pool.ack_entry(job.first + int(k), job.tag)

    def _finish_stream(self, job: _StreamJob, broken: bool = False, taken: bool = False) -> None:
        """Reports a streamed job once: by whoever takes it out of _streams (taken: the caller already did)."""
        with self._stream_cv:
            if not taken and self._streams.pop(job.job_id, None) is None and job.tag != 0:
                return
            self._stream_cv.notify_all()
        ok = not broken
        if job.failed and job.load:
            failed = np.isin(job.block_chunk, np.asarray(job.failed, dtype=np.int64))
            blocks = {int(b) for b in job.block_ids[failed].tolist()}
            if _load_errors_drained:
                with _load_errors_lock:
                    _load_errors.update(blocks)
                logger.warning("kvtier worker: load job %d: %d of %d chunks could not be loaded; vLLM recomputes "
                               "their %d blocks", job.job_id, len(set(job.failed)), job.count, len(blocks))
            else:
                logger.error("kvtier worker: load job %d: %d chunks could not be loaded, and this connector cannot "
                             "report failed blocks (use KVTierConnector)", job.job_id, len(set(job.failed)))
                ok = False
        if self._tl is not None:
            self._tl("done", job=job.job_id, load=job.load, ok=ok, ms=(time.perf_counter() - job.t0) * 1e3,
                     failed=len(job.failed), first_copy_ms=(job.first_copy_t - job.t0) * 1e3 if job.first_copy_t
                     else None)
        with self._lock:
            if ok:
                self._count(job.load, job.nbytes)
            self._finished.append(TransferResult(job_id=job.job_id, success=ok, transfer_size=int(job.nbytes),
                                                 transfer_time=time.perf_counter() - job.t0))

    def _wait_streams(self, job_ids: set[int] | None) -> None:
        """Blocks until the listed streamed jobs finished. vLLM waits so for stores whose GPU blocks it is about to
        reuse (jobs_to_flush). A store still waiting for slots after _FLUSH_WAIT_S gives up its remaining chunks (the
        engine drops them when the stream closes: a later miss, never wrong bytes) rather than stall vLLM's step:
        the pool may be held by stores whose jobs vLLM submits only after this wait."""
        deadline = time.monotonic() + _FLUSH_WAIT_S
        abandoned: list[_StreamJob] = []
        with self._stream_cv:
            while True:
                left = [self._streams[j] for j in (job_ids if job_ids is not None else list(self._streams))
                        if j in self._streams]
                if not left:
                    break
                if time.monotonic() >= deadline:
                    stores = [j for j in left if not j.load]
                    for job in stores:
                        del self._streams[job.job_id]
                        abandoned.append(job)
                    if len(stores) == len(left):
                        break
                    deadline = float("inf")  # loads: wait on (the stall report says where they stand)
                self._stream_cv.wait(0.1)
        for job in abandoned:
            # No copy starts after this; copies in flight finish before the job is reported.
            with job.lock:
                job.abandoned = True
                inflight, job.inflight = job.inflight, []
            for ticket, chunks, nbytes in inflight:
                try:
                    self._copier.wait(ticket)
                    self._ack(job, chunks, nbytes)
                except Exception:
                    logger.exception("kvtier worker: store job %d: a copy failed", job.job_id)
            logger.warning("kvtier worker: store job %d: %d of %d chunks got no slot within %.0f s of vLLM's flush; "
                           "they are not stored", job.job_id, int(job.todo.sum()), job.count, _FLUSH_WAIT_S)
            job.todo[:] = False
            self._finish_stream(job, taken=True)

    def _count(self, load: bool, nbytes: int) -> None:
        if nbytes <= 0:  # nothing copied (an empty spec, a store skipped after reset_cache)
            return
        c = self.copied["load" if load else "store"]
        c[0] += int(nbytes)
        c[1] += 1

    def _finish(self, job: _Job) -> None:
        """Completes an asynchronous job (its copy is done, or wait() blocks until it is) and queues its result.
        transfer_time runs from submission to the moment completion was seen (includes the wait for the stream's
        earlier work and the polling interval: an upper bound of the copy time). A job is finished once: the
        caller that takes it out of _pending does it."""
        with self._lock:
            if self._pending.pop(job.job_id, None) is None:
                return
        ok = True
        try:
            self._copier.wait(job.ticket)  # raises if the copy failed
        except Exception:
            logger.exception("kvtier worker: %s job %d: the copy failed", "load" if job.load else "store", job.job_id)
            ok = False
        if ok:
            problem = None
            for s, g in zip(job.slots, job.gens):
                gen, state = job.pool.observe(int(s))
                if gen != g:  # the slot was refilled while we copied (only after vLLM's reset_cache)
                    problem = f"slot {s}: generation {gen} state {state}, expected generation {g}"
                    break
            if problem is not None and job.load:
                logger.error("kvtier worker: load job %d: slot reused during the copy, bytes not trusted: %s",
                             job.job_id, problem)
                ok = False
            elif problem is not None:
                # The reservation was given back by reset_cache and the slot handed to another chunk before this
                # store's copy finished; vLLM has dropped the job. Say so: the other chunk's bytes may be affected.
                logger.error("kvtier worker: store job %d: slot reassigned before its copy finished (after a "
                             "cache reset): %s", job.job_id, problem)
        if self._tl is not None:
            self._tl("done", job=job.job_id, load=job.load, ok=ok, ms=(time.perf_counter() - job.t0) * 1e3)
        with self._lock:
            if ok:
                self._count(job.load, job.nbytes)
            self._finished.append(TransferResult(job_id=job.job_id, success=ok,
                                                 transfer_size=int(job.nbytes) if ok else 0,
                                                 transfer_time=time.perf_counter() - job.t0))

    def _drain(self) -> None:
        with self._lock:
            jobs = list(self._pending.values())
        for job in jobs:
            self._finish(job)

    def _block_spec(self, job_id: int, device_spec: Any, load: bool) -> GPULoadStoreSpec | None:
        """vLLM's GPU side of a job as block ids (compat.block_spec); None after reporting the job failed."""
        try:
            return compat.block_spec(device_spec, self._tensors, self._group_refs)
        except Exception:
            logger.exception("kvtier worker: %s job %d: its GPU blocks", "load" if load else "store", job_id)
            with self._lock:
                self._finished.append(TransferResult(job_id=job_id, success=False, transfer_size=0,
                                                     transfer_time=0.0))
            return None

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: LoadStoreSpec) -> bool:
        """src_spec: a GPULoadStoreSpec, or vLLM 0.34+'s DevicePointers (compat.block_spec)."""
        gpu = self._block_spec(job_id, src_spec, False)
        return True if gpu is None else self._transfer(job_id, dst_spec, gpu, load=False)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: Any, expedited: bool = False) -> bool:
        """dst_spec: a GPULoadStoreSpec, or vLLM 0.34+'s DevicePointers (compat.block_spec). expedited (vLLM 0.33+):
        vLLM waits for the job inside the step (wait()); every kvtier load starts at once, so it changes nothing."""
        gpu = self._block_spec(job_id, dst_spec, True)
        return True if gpu is None else self._transfer(job_id, src_spec, gpu, load=True)

    def get_finished(self) -> list[TransferResult]:
        with self._lock:
            jobs = list(self._pending.values())
        for job in jobs:
            if self._copier.done(job.ticket):
                self._finish(job)
        with self._lock:
            out, self._finished = self._finished, []
        return out

    def wait(self, job_ids: set[int]) -> None:
        # Host copies are synchronous (nothing pending). Asynchronous ones: block on each job's own ticket; the
        # result is reported by the next get_finished(), as vLLM's own worker does.
        with self._lock:
            jobs = [self._pending[j] for j in job_ids if j in self._pending]
        for job in jobs:
            self._finish(job)
        self._wait_streams(set(job_ids))

    def shutdown(self) -> None:
        with self._attach_lock:  # no pre-attach after this
            self._closed = True
        with self._stream_cv:
            self._stream_stop = True
            self._stream_cv.notify_all()
        if self._stream_thread is not None:
            self._stream_thread.join(timeout=30)
        self._drain()
        self._copier.close()
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self._tensors = []
        (sb, sj), (lb, lj) = self.copied["store"], self.copied["load"]
        logger.info("kvtier: worker detached: rank %d of %d stored %d bytes in %d jobs and loaded %d bytes in %d jobs "
                    "(bytes [%d, %d) of each block)", self.rank, self.world_size, sb, sj, lb, lj, self.rank_offset,
                    self.rank_offset + self.rank_block_bytes)
