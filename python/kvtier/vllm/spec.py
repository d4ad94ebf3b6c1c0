"""KVTierSpec: kvtier's OffloadingSpec, the class vLLM loads (spec_name KVTierSpec, spec_module_path kvtier.vllm).
vLLM builds it in the scheduler process (get_manager) and in every worker process (get_worker)."""

from __future__ import annotations

import hashlib
import os
from typing import Any

from . import compat, config as cfg, extension, metrics
from .compat import (CanonicalKVCaches, OffloadingConfig, OffloadingManager, OffloadingMetricMetadata,
                     OffloadingSpec, OffloadingWorker, logger)
from .manager import KVTierManager
from .worker import KVTierWorker

LAYOUT_TAG = "kvtier-vllm-block-rank-page-v1"


def pool_name(config: OffloadingConfig) -> str:
    """'/kvtier-<pid>-<16 hex of engine_id>': unique per vLLM instance (engine_id is distinct per DP rank) and of the
    form the engine's orphan sweep removes after a crash. Workers learn it from each transfer spec, not by
    recomputing it (they do not know the scheduler's pid)."""
    h = hashlib.sha256(f"{config.engine_id}/{config.parallel.data_parallel_index}".encode())
    return f"/kvtier-{os.getpid()}-{h.hexdigest()[:16]}"


def engine_options(config: OffloadingConfig, kv: dict[str, Any], tokens_per_chunk: int, blocks_per_chunk: int,
                   block_bytes: int, layout_tag: str) -> dict[str, Any]:
    """The kvtier Engine's options for one vLLM instance: the cache identity (model, revision, dtype, chunk
    geometry, parallelism, the byte layout `layout_tag` of a chunk, which the release's suffix completes) and the
    engine keys of kv_connector_extra_config (`kv`, from config.parse_config). KVTierSpec and KVTierTier (tier.py)
    lay chunks out differently, so their entries never meet under one identity."""
    if block_bytes <= 0:
        raise ValueError("kvtier: vLLM reported 0 KV bytes per block; nothing to cache")
    opts: dict[str, Any] = {
        "root": kv["kvtier_root"],
        "model": kv["kvtier_model_tag"] or config.model.name,
        "revision": kv["kvtier_revision"] or cfg.default_revision(config.model.name),
        "kv_dtype": config.model.dtype,
        "tokens_per_chunk": int(tokens_per_chunk),
        "blocks_per_chunk": int(blocks_per_chunk),
        "block_bytes": int(block_bytes),
        "tp_size": int(config.parallel.tp_size),
        "pp_size": int(config.parallel.pp_size),
        "layout_tag": layout_tag + compat.LAYOUT_SUFFIX,
        "pool_name": pool_name(config),
    }
    for name, key in cfg.KVTIER_KEYS.items():
        if key.engine_key is not None:
            opts[key.engine_key] = kv[name]
    return opts


class KVTierSpec(OffloadingSpec):
    """kvtier's OffloadingSpec: instantiated by vLLM in the scheduler process and in every worker process."""

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        return metrics.definitions()

    def __init__(self, config: OffloadingConfig):
        self.kv = cfg.parse_config(config.extra_config)  # V4: before anything else
        super().__init__(config)
        cfg.check_hash_seed()
        par = config.parallel
        if par.pp_size != 1 or par.pcp_size != 1 or par.dcp_size != 1:
            raise ValueError(f"kvtier: pipeline/context parallelism is not supported (pp={par.pp_size}, "
                             f"pcp={par.pcp_size}, dcp={par.dcp_size})")
        if len(set(self.tokens_per_block)) > 1:
            raise ValueError(f"kvtier: KV cache groups with different block sizes {self.tokens_per_block} are "
                             "not supported")
        if "block_size" not in self.extra_config and "blocks_per_chunk" not in self.extra_config:
            self.blocks_per_chunk = cfg.default_blocks_per_chunk(self.tokens_per_block)  # vLLM reads it from the spec
        self._manager: KVTierManager | None = None
        self._worker: KVTierWorker | None = None

    # Identity and engine options -------------------------------------------------------------------------
    def rank_block_bytes(self) -> int:
        return int(self.config.worker_kv_bytes_per_block)

    def tokens_per_chunk(self) -> int:
        return int(self.tokens_per_block[0]) * int(self.blocks_per_chunk) if self.tokens_per_block else 0

    def pool_name(self) -> str:
        return pool_name(self.config)

    def engine_options(self) -> dict[str, Any]:
        n_layers = sum(len(g.layer_names) for g in self.config.groups)
        return engine_options(self.config, self.kv, self.tokens_per_chunk(), int(self.blocks_per_chunk),
                              self.rank_block_bytes() * int(self.config.parallel.world_size),
                              f"{LAYOUT_TAG}:groups={len(self.config.groups)}:layers={n_layers}")

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            ext = extension.load()
            opts = self.engine_options()
            engine = ext.Engine(opts)
            logger.info("kvtier: engine open: %s", engine.describe())
            stats_dir = os.path.join(self.kv["kvtier_root"], ".kvtier-stats")
            stats_path = None
            if self.kv["kvtier_stats_interval_s"] > 0:
                try:
                    os.makedirs(stats_dir, mode=self.kv["kvtier_dir_mode"], exist_ok=True)
                    stats_path = os.path.join(stats_dir, f"{opts['pool_name'].lstrip('/')}.json")
                except OSError as e:
                    logger.warning("kvtier: no stats file (%s)", e)
            thresholds = None
            if self.kv["kvtier_thresholds_path"]:
                thresholds = cfg.load_thresholds(self.kv["kvtier_thresholds_path"],
                                             self.kv["kvtier_model_tag"] or self.config.model.name)
                logger.info("kvtier: break-even gate on (%s): min load tokens dram=%d disk=%d, store_min_tokens=%d",
                            self.kv["kvtier_thresholds_path"], thresholds["dram"], thresholds["disk"],
                            thresholds["store"])
            else:
                logger.info("kvtier: break-even gate off (no kvtier_thresholds_path)")
            curves = cfg.load_estimate_curves(self.kv["kvtier_thresholds_path"]) if thresholds else None
            hpc = [int(tpb) * int(self.blocks_per_chunk) // int(self.tokens_per_hash) for tpb in self.tokens_per_block]
            self._manager = KVTierManager(engine, self.kv["kvtier_stats_interval_s"], stats_path,
                                          preload_max_inflight=self.kv["kvtier_preload_max_inflight"],
                                          thresholds=thresholds, hashes_per_chunk=hpc,
                                          group_ids=compat.group_ids(self.config),
                                          tokens_per_chunk=self.tokens_per_chunk(),
                                          world_size=int(self.config.parallel.world_size), estimates=curves)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._worker = KVTierWorker(kv_caches, int(self.blocks_per_chunk), int(self.config.parallel.rank),
                                        self.rank_block_bytes(), self.kv["kvtier_copy_threads"],
                                        self.kv["kvtier_attach_timeout_s"],
                                        pool_suffix=self.pool_name().rsplit("-", 1)[1],
                                        world_size=int(self.config.parallel.world_size),
                                        cuda_copy_mode=self.kv["kvtier_cuda_copy_mode"],
                                        load_order=self.kv["kvtier_load_order"],
                                        load_queue_bytes=self.kv["kvtier_load_queue_mib"] << 20)
        return self._worker
