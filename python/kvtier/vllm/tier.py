"""KVTierTier: kvtier's disk tier as a secondary tier of vLLM's own tiering, under vLLM's CPU tier
(docs/vllm-integration.md, "kvtier under vLLM's CPU tier").

vLLM's TieringOffloadingSpec (vllm/v1/kv_offload/tiering/) keeps a CPU primary tier in shared memory and cascades
every chunk stored there to its secondary tiers; a chunk missing from the CPU tier is promoted back from the first
secondary tier that has it. One entry of its ``secondary_tiers`` adds kvtier::

    {"type": "KVTierTier", "module_path": "kvtier.vllm.tier", "kvtier_root": "/mnt/nvme/kvcache"}

(``module_path`` may be left out where kvtier's vLLM plugin is installed: it registers the name.) The tier runs in
vLLM's scheduler process only: a store copies a CPU-tier chunk (one row of the primary memoryview, every rank's
share of it) through kvtier's staging pool to a verified file under the root; a load reads and verifies the file and
copies it into the CPU-tier chunk vLLM allocated. Both are jobs of kvtier's engine (its JobClient with the host
copier: docs/python-api.md, Engine.store/load/wait), submitted without blocking and polled each step. What kvtier
adds under vLLM's CPU tier: checksummed entries (a corrupt or torn file is a miss, never bytes), the disk budget with
eviction, and roots several hosts share (M1-M3).

Only the scheduler side of vLLM's tiering runs without a GPU: its worker (CPUOffloadingWorker) refuses platforms
other than CUDA-alike and XPU, so the tier form serves only on a GPU (docs/vllm-integration.md says what only a GPU
checks). Needs vLLM 0.28+ (compat.OUT_OF_TREE_TIERS); older releases get a clear error.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from . import compat, config as cfg, extension, metrics
from .compat import STORAGE_MEDIUM, LookupResult, ReqContext, RequestOffloadingContext, SecondaryTierManager, logger
from .manager import root_locality
from .spec import engine_options

# How a chunk of vLLM's CPU tier is laid out in a kvtier entry: one row of the primary memoryview as it is (every
# rank's share, then the row's alignment padding; vllm/v1/kv_offload/cpu/spec.py), so entries of KVTierSpec (per-rank
# pages, spec.LAYOUT_TAG) and of this tier never share an identity.
TIER_LAYOUT_TAG = "kvtier-vllm-tier-row-v1"
# kv_connector_extra_config keys of kvtier's that a tier entry takes: the engine's and the cache identity's names.
# The others configure KVTierSpec's worker, preload and gate, which the tier form does not have.
_SPEC_ONLY_KEYS = {"kvtier_copy_threads", "kvtier_cuda_copy_mode", "kvtier_load_order", "kvtier_load_queue_mib",
                   "kvtier_attach_timeout_s", "kvtier_preload_max_inflight", "kvtier_thresholds_path"}
# How long drain_jobs waits for one job: the engine's own deadlines (op_timeout_ms) end every job well before.
_DRAIN_WAIT_MS = 600_000
# A key whose load failed is a miss for this long. On a shared root kvtier keeps a young bad entry (another host may
# be writing it: docs/operations.md, "What a shared root changes"), so without this memory vLLM's tiering would find
# it again at once and promote it again, step after step, while the request waits.
_FAILED_LOAD_MISS_S = 30.0


class KVTierTier(SecondaryTierManager):
    """A SecondaryTierManager over one kvtier Engine (one per vLLM instance). Entered only under the tiering
    manager's lock (never concurrently), in the scheduler process."""

    medium = STORAGE_MEDIUM  # vLLM 0.32+ derives cache_hit_source DISK from it (tiering/base.py __init_subclass__)

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
        compat.check_out_of_tree_tiers()
        return metrics.definitions(counters={})

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str, locality: str | None = None,
                 backpressure_detector: Any = None, **config: Any):
        compat.check_out_of_tree_tiers()
        config.pop("module_path", None)  # vLLM 0.28+ drops it; a name registered by kvtier's plugin may carry it
        unused = sorted(set(config) & _SPEC_ONLY_KEYS)
        if unused:
            raise ValueError(f"kvtier: secondary tier {tier_type!r}: {', '.join(unused)} configure KVTierSpec's "
                             f"worker, preload or gate, which the tier form does not have; remove them")
        self.kv = cfg.parse_config(config)  # V4: names any unknown key and the accepted ones
        cfg.check_hash_seed()
        bp = {} if backpressure_detector is None else {"backpressure_detector": backpressure_detector}
        super().__init__(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view, tier_type=tier_type, **bp)
        if primary_kv_view.ndim != 2 or not primary_kv_view.c_contiguous:
            raise ValueError(f"kvtier: vLLM's CPU tier is not (chunks, row bytes) contiguous "
                             f"(shape {primary_kv_view.shape}, strides {primary_kv_view.strides})")
        self._num_chunks, self._row_bytes = (int(n) for n in primary_kv_view.shape)
        # The rows' address, read once: holding an export of the view would make the primary tier's release() of
        # it at shutdown fail (tiering/manager.py, CPUPrimaryTierOffloadingManager.shutdown).
        self._base = int(np.frombuffer(primary_kv_view, dtype=np.uint8).ctypes.data)
        spec_cfg = offloading_spec.config
        tokens_per_block = tuple(int(t) for t in offloading_spec.tokens_per_block)
        if len(set(tokens_per_block)) != 1:
            raise ValueError(f"kvtier: KV cache groups with different block sizes {tokens_per_block} are not "
                             "supported")
        n_layers = sum(len(g.layer_names) for g in spec_cfg.groups)
        # copies: the ranks' shares in a row (one for vLLM's replicated MLA layout, cpu/spec.py)
        copies = 1 if getattr(offloading_spec, "replicated_layout", False) else int(spec_cfg.parallel.world_size)
        layout = f"{TIER_LAYOUT_TAG}:groups={len(spec_cfg.groups)}:layers={n_layers}:copies={copies}"
        opts = engine_options(spec_cfg, self.kv, tokens_per_block[0] * int(offloading_spec.blocks_per_chunk), 1,
                              self._row_bytes, layout)
        self.engine = extension.load().Engine(opts)
        # kv_load_tiers matches this tier as STORAGE and this locality (vLLM's "locality" key of a tier entry, as its
        # fs tier has; by default the root's, as kvtier's probe found it).
        self.locality = compat.Locality(locality.upper()) if locality else compat.Locality(root_locality(self.engine))
        self._jobs: dict[int, tuple[int, list[Any], bool, float]] = {}  # vLLM job -> (engine job, keys, load, t0)
        self._finished: list[Any] = []  # JobResults not yet taken by get_finished_jobs
        self._failed_until: dict[bytes, float] = {}  # key -> until when it is a miss (_FAILED_LOAD_MISS_S)
        self._deltas = metrics.StatsDeltas()
        self._last_stats_t = 0.0
        logger.info("kvtier: secondary tier %r (%s, %s) under vLLM's CPU tier of %d chunks x %d B: %s", tier_type,
                    self.medium, self.locality, self._num_chunks, self._row_bytes, self.engine.describe())

    # -- lookups ---------------------------------------------------------------------------------------------
    def lookup(self, key: Any, req_context: ReqContext) -> LookupResult:
        # "dram" (in kvtier's pool), "disk" and "pending" (being read) can all be loaded; a corrupt entry is found
        # only by the load, which then fails that key and vLLM recomputes it.
        key = bytes(key)
        if self._failed_until and self._failed_until.get(key, 0.0) > time.monotonic():
            return LookupResult.MISS
        return LookupResult.MISS if self.engine.lookup(key) == "absent" else LookupResult.HIT

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    # -- transfers -------------------------------------------------------------------------------------------
    def _addresses(self, job: Any) -> list[int]:
        ids = np.asarray(compat.tier_chunk_ids(job), dtype=np.int64)
        if len(ids) != len(job.keys) or (ids < 0).any() or (ids >= self._num_chunks).any():
            raise ValueError(f"kvtier: tier job {job.job_id}: {len(job.keys)} keys, chunk ids {ids.tolist()} "
                             f"(the CPU tier has {self._num_chunks})")
        return [self._base + int(c) * self._row_bytes for c in ids]

    def submit_store(self, job_metadata: Any) -> None:
        def store() -> int | None:
            items = [(bytes(k), a) for k, a in zip(job_metadata.keys, self._addresses(job_metadata))
                     if not self.engine.stored(bytes(k))]  # already on disk: nothing to write
            return self.engine.store(items) if items else None

        self._submit(job_metadata, False, store)

    def submit_load(self, job_metadata: Any) -> None:
        self._submit(job_metadata, True, lambda: self.engine.load(
            [(bytes(k), 0, 0, a) for k, a in zip(job_metadata.keys, self._addresses(job_metadata))]))

    def _submit(self, job: Any, load: bool, submit) -> None:
        t0 = time.monotonic()
        try:
            engine_job = submit()
        except (ValueError, OSError, RuntimeError) as e:  # refused before any byte moved: the job fails
            logger.warning("kvtier: tier %s job %d of %d chunks refused: %s", "load" if load else "store", job.job_id,
                           len(job.keys), e)
            self._finished.append(compat.tier_job_result(job.job_id, False, None, 0.0, 0))
            return
        if engine_job is None:  # nothing to write
            self._finished.append(compat.tier_job_result(job.job_id, True, None, 0.0, 0))
            return
        self._jobs[job.job_id] = (int(engine_job), list(job.keys), load, t0)

    def _result(self, job_id: int, outcome: dict[str, Any]) -> Any:
        _, keys, load, t0 = self._jobs.pop(job_id)
        ok = {bytes(c["key"]) for c in outcome["chunks"] if c["ok"]}
        success = len(ok) == len(outcome["chunks"])
        if load and not success:
            now = time.monotonic()
            self._failed_until = {k: t for k, t in self._failed_until.items() if t > now}
            self._failed_until.update((bytes(c["key"]), now + _FAILED_LOAD_MISS_S) for c in outcome["chunks"]
                                      if not c["ok"])
        if not success:
            logger.warning("kvtier: tier %s job %d: %d of %d chunks failed (%s)", outcome["kind"], job_id,
                           len(outcome["chunks"]) - len(ok), len(outcome["chunks"]),
                           next(c["error"] for c in outcome["chunks"] if not c["ok"]))
        # A promotion's loaded keys stand even when others failed (vLLM frees the failed ones' CPU chunks).
        partial = [k for k in keys if bytes(k) in ok] if load and not success and ok else None
        return compat.tier_job_result(job_id, success, partial, time.monotonic() - t0, int(outcome["bytes"]))

    def get_finished_jobs(self) -> Iterable[Any]:
        for job_id, (engine_job, *_rest) in list(self._jobs.items()):
            try:
                outcome = self.engine.wait(engine_job, 0)
            except TimeoutError:
                continue
            self._finished.append(self._result(job_id, outcome))
        out, self._finished = self._finished, []
        return out

    def has_pending_work(self) -> bool:
        return bool(self._jobs)

    def drain_jobs(self) -> None:
        # Every job's copies are over when the engine reports it (a load's bytes land only after verification), so
        # the results carry no deferred_release (vLLM 0.34+).
        for job_id, (engine_job, *_rest) in list(self._jobs.items()):
            self._finished.append(self._result(job_id, self.engine.wait(engine_job, _DRAIN_WAIT_MS)))

    # -- stats and shutdown ----------------------------------------------------------------------------------
    def get_stats(self) -> Any:
        now = time.monotonic()
        if self.engine is None or now - self._last_stats_t < 1.0:
            return None
        self._last_stats_t = now
        return self._deltas.stats(self.engine.stats(), {})

    def shutdown(self) -> None:
        if self.engine is None:
            return
        self.drain_jobs()
        self.engine.close()
        self.engine = None  # dropped: see KVTierManager.shutdown
        logger.info("kvtier: secondary tier closed")
