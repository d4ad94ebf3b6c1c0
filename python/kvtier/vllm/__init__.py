"""kvtier as a vLLM KV offloading spec (vLLM's OffloadingConnector; supported releases: `compat.SUPPORTED_VLLM`).

Load it with::

    --kv-transfer-config '{"kv_connector":"KVTierConnector","kv_connector_module_path":"kvtier.vllm",
      "kv_role":"kv_both","kv_connector_extra_config":{"spec_name":"KVTierSpec","spec_module_path":"kvtier.vllm",
                                   "kvtier_root":"/mnt/nvme/kvcache","block_size":256}}'

Who does what (docs/vllm-integration.md has the full story):

* The scheduler process (vLLM's EngineCore) calls ``KVTierSpec.get_manager()``. The manager owns one
  ``kvtier._kvtier.Engine``: the storage root, the index, the disk I/O reactors and the staging pool in shared
  memory. Every chunk a worker reads or writes is *resident in a pool slot*: a load is only ever handed out for a
  chunk the engine has already read and verified into a slot (lookup answers HIT_PENDING while the read is in
  flight), and a store is a slot the engine reserved for the worker to fill and writes out after
  ``complete_store``.
* Every worker process calls ``KVTierSpec.get_worker(kv_caches)``. The worker attaches the pool by the name carried
  in each transfer spec (lazily: workers register their KV caches before the scheduler creates the engine) and
  copies bytes between pool slots and vLLM's KV tensors: ``kvtier._kvtier.copy_batch`` for host tensors (the
  engine's host copy, GIL released), ``kvtier._kvtier_cuda`` for tensors on a CUDA device. A worker never touches
  the disk.

Byte layout of a chunk payload (the engine's ``layout_tag``): block ``b`` of the chunk starts at
``payload_offset + b * block_stride``; inside it rank ``r`` (tensor parallelism) owns
``[r * rank_block_bytes, (r + 1) * rank_block_bytes)``; inside a rank's share come the pages of the group's
canonical KV tensors in vLLM's order (layer order), each ``page_size_bytes`` long.

Modules: ``compat`` (everything taken from a particular vLLM release, and ``KVTierConnector``), ``config`` (the
kv_connector_extra_config keys), ``metrics``, ``transfer`` (the transfer spec), ``manager`` (scheduler side),
``copiers`` and ``worker`` (worker side), ``spec`` (``KVTierSpec``), ``tier`` (``KVTierTier``: kvtier as a secondary
tier of vLLM's own tiering, under its CPU tier; docs/vllm-integration.md).
"""

from .compat import SUPPORTED_VLLM, VLLM_KEYS, KVTierConnector
from .config import KVTIER_KEYS, check_hash_seed, default_revision, load_thresholds, parse_config
from .copiers import CudaCopier, HostCopier, make_copier
from .manager import KVTierManager
from .spec import LAYOUT_TAG, KVTierSpec
from .tier import KVTierTier
from .transfer import KVTierLoadStoreSpec
from .worker import KVTierWorker

__all__ = ["KVTIER_KEYS", "LAYOUT_TAG", "SUPPORTED_VLLM", "VLLM_KEYS", "CudaCopier", "HostCopier",
           "KVTierConnector", "KVTierLoadStoreSpec", "KVTierManager", "KVTierSpec", "KVTierTier", "KVTierWorker",
           "check_hash_seed", "default_revision", "load_thresholds", "make_copier", "parse_config"]
