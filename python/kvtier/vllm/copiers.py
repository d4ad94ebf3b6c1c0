"""The worker's copiers: how bytes move between pool slots and vLLM's KV tensors (docs/vllm-integration.md,
"Who does what" and "The CUDA worker")."""

from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np

from . import extension
from .compat import logger


# The copier seam: KVTierWorker does the bookkeeping (slot checks, address math, job tracking) and hands the bytes
# to a Copier. Two real ones: HostCopier (host KV tensors, vLLM's CPU platform: a synchronous memcpy) and
# CudaCopier (KV tensors on a CUDA device: kvtier._kvtier_cuda, asynchronous). Tests add a fake asynchronous one.
class Copier(Protocol):
    """Moves scattered segments between pool slots and KV tensors.

    copy(direction, dst, src, sizes) -> ticket: direction "h2d" (load: dst = KV side, src = slot side) or "d2h"
    (store: dst = slot side, src = KV side); 1-D uint64 arrays of equal length. Raises if the copy cannot be
    queued. done(ticket): True once the copy finished (also when it failed). wait(ticket): blocks until it
    finished; raises if it failed (so done() then wait() is how a finished job learns its outcome).
    attach(pool) / detach(pool): a staging pool becomes / stops being a copy endpoint (the pool outlives detach).
    asynchronous: False when copy() returns only after the bytes moved. An asynchronous copier may also have
    fence() -> token (on the submitting thread) and copy(..., after=token) from another thread, which then waits for
    what the submitting thread's stream had queued at fence() instead of what its own current stream holds."""

    asynchronous: bool

    def attach(self, pool: Any) -> None: ...

    def detach(self, pool: Any) -> None: ...

    def copy(self, direction: str, dst: np.ndarray, src: np.ndarray, sizes: np.ndarray) -> Any: ...

    def done(self, ticket: Any) -> bool: ...

    def wait(self, ticket: Any) -> None: ...

    def close(self) -> None: ...

    def describe(self) -> str: ...


class HostCopier:
    """Host KV tensors: kvtier._kvtier.copy_batch with the copy's direction, the engine's host copy path (HostCopy in
    src/transfer/host_copier.cc: memcpy, streaming stores out of the slots of a large load), GIL released, `threads`
    threads, synchronous."""

    asynchronous = False

    def __init__(self, ext: Any, threads: int = 1):
        self._ext = ext
        self._threads = int(threads)

    def attach(self, pool: Any) -> None:
        return

    def detach(self, pool: Any) -> None:
        return

    def copy(self, direction: str, dst: np.ndarray, src: np.ndarray, sizes: np.ndarray) -> Any:
        # The engine's host copy path (streaming stores out of the slots of a large load; src/transfer): the bytes
        # copied, nothing left to wait for.
        return self._ext.copy_batch(dst, src, sizes, self._threads, direction)

    def done(self, ticket: Any) -> bool:
        return True

    def wait(self, ticket: Any) -> None:
        return

    def close(self) -> None:
        return

    def describe(self) -> str:
        return f"host copy (the engine's host copier path), {self._threads} thread(s)"


class CudaCopier:
    """KV tensors on CUDA device `device`: kvtier._kvtier_cuda.CudaCopier (docs/gpu.md), asynchronous.

    Every copy is queued behind the work queued so far on the caller's current stream (the copier records an event
    there and its own per-direction stream waits for it on the device), then runs on the copier's stream; the ticket
    is that launch's completion event. The staging pool's whole mapping is registered (cudaHostRegister) when the
    worker attaches it: the copy kernel addresses host memory through its mapped device pointer."""

    asynchronous = True

    def __init__(self, device: int, ext: Any = None, current_stream: Any = None, mode: str = "auto"):
        self._ext = ext if ext is not None else extension.load_cuda()
        self.device, self.mode = int(device), mode
        self._c = self._ext.CudaCopier(device=self.device, mode=self.mode)
        if current_stream is None:
            import torch

            def current_stream() -> int:
                return int(torch.cuda.current_stream(self.device).cuda_stream)
        self._current_stream = current_stream
        self._side: Any = None  # the stream a fenced copy waits on (its own stream waits for the fence there)

    def attach(self, pool: Any) -> None:
        base, size = int(pool.base_address), int(pool.mapped_bytes)
        if not self._c.is_registered(base, size):
            t0 = time.perf_counter()
            self._c.register_host(base, size)
            logger.info("kvtier worker: registered the staging pool with CUDA (%d bytes, %.3f s)", size,
                        time.perf_counter() - t0)

    def detach(self, pool: Any) -> None:
        # CudaCopier unregisters only on destruction: start a fresh one, so the old mapping is unregistered before
        # the caller unmaps it. The caller has waited for every ticket (tickets do not survive this).
        self._c.close()
        self._c = self._ext.CudaCopier(device=self.device, mode=self.mode)

    def fence(self) -> Any:
        """An event recorded on the caller's current stream: a later copy(after=fence), issued from any thread,
        waits for the work queued there up to now (a streamed job's copies wait for what its submission saw)."""
        import torch

        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def copy(self, direction: str, dst: np.ndarray, src: np.ndarray, sizes: np.ndarray, after: Any = None) -> Any:
        if after is None:
            return self._c.copy_batch(direction, dst, src, sizes, stream=self._current_stream())
        import torch

        if self._side is None:
            self._side = torch.cuda.Stream(device=self.device)
        self._side.wait_event(after)
        return self._c.copy_batch(direction, dst, src, sizes, stream=int(self._side.cuda_stream))

    def done(self, ticket: Any) -> bool:
        return bool(self._c.query(ticket))

    def wait(self, ticket: Any) -> None:
        self._c.wait(ticket)

    def close(self) -> None:
        self._c.close()

    def describe(self) -> str:
        return f"CUDA copier: {self._c.describe()}"


def make_copier(tensors: list[Any], ext: Any, copy_threads: int, cuda_mode: str = "auto") -> Copier:
    """The copier for this rank's KV tensors: all on the host -> HostCopier; all on one CUDA device ->
    CudaCopier for that device (cuda_mode: kvtier_cuda_copy_mode); anything else is refused."""
    types = {t.device.type for t in tensors}
    if types <= {"cpu"}:
        return HostCopier(ext, copy_threads)
    if types == {"cuda"}:
        indices = {t.device.index for t in tensors}
        if len(indices) != 1:
            raise NotImplementedError(f"kvtier: this rank's KV tensors are on several CUDA devices {sorted(indices)}")
        (index,) = indices
        if index is None:
            import torch
            index = torch.cuda.current_device()
        return CudaCopier(int(index), mode=cuda_mode)
    raise NotImplementedError("kvtier: KV tensors must all be on the host (vLLM's CPU platform) or all on one "
                              f"CUDA device; got {sorted({str(t.device) for t in tensors})}")
