import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


@pytest.fixture(autouse=True)
def _worker_gets_what_this_vllm_passes(monkeypatch):
    """vLLM 0.34+'s connector worker resolves the GPU side of every job to DevicePointers
    (vllm/v1/kv_offload/pointer_utils.py, resolve_device_pointers) before it calls submit_store/submit_load (older
    releases pass the GPULoadStoreSpec itself; docs/vllm-version.md, 0.34.0). Tests hand the worker a
    GPULoadStoreSpec; on 0.34+ it goes through vLLM's own resolve_device_pointers first, with the KV caches the
    worker was built with, so every worker test covers what the installed release passes."""
    try:
        import kvtier.vllm as kv
    except Exception:  # noqa: BLE001 - tests that do not import the adapter (e.g. a server's own process)
        yield
        return
    if not kv.compat.DEVICE_POINTERS:
        yield
        return
    from vllm.v1.kv_offload.base import GPULoadStoreSpec
    from vllm.v1.kv_offload.pointer_utils import resolve_device_pointers

    cls = kv.KVTierWorker
    init, store, load = cls.__init__, cls.submit_store, cls.submit_load

    def __init__(self, kv_caches, *a, **k):
        init(self, kv_caches, *a, **k)
        self._vllm_kv_caches = kv_caches

    def resolve(self, spec):
        return resolve_device_pointers(spec, self._vllm_kv_caches) if isinstance(spec, GPULoadStoreSpec) else spec

    monkeypatch.setattr(cls, "__init__", __init__)
    monkeypatch.setattr(cls, "submit_store", lambda self, j, src, dst: store(self, j, resolve(self, src), dst))
    monkeypatch.setattr(cls, "submit_load", lambda self, j, src, dst, expedited=False:
                        load(self, j, src, resolve(self, dst), expedited))
    yield
