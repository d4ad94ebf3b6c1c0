"""KVTierConnector's scheduler side inside vLLM's own OffloadingConnector (OffloadingConnectorScheduler), built from
vLLM's config objects with a real kvtier engine, and vLLM Requests with vLLM's block hasher: no server, no worker,
no GPU (it runs on the CUDA vllm of a machine without one: DeviceConfig "cpu" stands in for the device vLLM cannot
infer there; docs/vllm-version.md, "CUDA vLLM on this machine").

* A new request's block hashes reach kvtier's manager through vLLM's on_new_request (KVTierConnector), which turns
  them into chunk keys and queues their preload.
* Chunks stored under the keys kvtier derives are the ones vLLM's scheduler looks up for an identical request: its
  get_num_new_matched_tokens reports the stored prefix."""

import dataclasses

import pytest
import torch

import kvtier.vllm as kv
from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.request import Request

from server import tiny_model_dir

BLOCK = 16         # tokens per GPU block
CHUNK = 64         # tokens per kvtier chunk (block_size)
LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(16)]  # the tiny model's attention layers
NUM_BLOCKS = 64


def _kv_cache_config():
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.float32)
    page = spec.page_size_bytes
    names = {f.name for f in dataclasses.fields(KVCacheTensor)}
    if "layers" in names:  # 0.29+: one backing allocation, a block's pages of every layer contiguous
        tensors = [KVCacheTensor(size=page * len(LAYERS) * NUM_BLOCKS, layers=LAYERS, layer_stride=page,
                                 block_stride=page * len(LAYERS))]
    else:  # 0.26-0.28: a tensor per layer
        tensors = [KVCacheTensor(size=page * NUM_BLOCKS, shared_by=[name]) for name in LAYERS]
    return KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=tensors,
                         kv_cache_groups=[KVCacheGroupSpec(layer_names=LAYERS, kv_cache_spec=spec)])


@pytest.fixture(scope="module")
def model_config():
    return ModelConfig(model=tiny_model_dir(), dtype="float32")  # the slow part of a VllmConfig: built once


def _connector(model_config, root, **extra):
    ec = {"spec_name": "KVTierSpec", "spec_module_path": "kvtier.vllm", "kvtier_root": str(root),
          "block_size": CHUNK, "kvtier_pool_bytes": "64MiB", "kvtier_stats_interval_s": 0,
          "kvtier_preload_max_inflight": 4, **extra}
    vc = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"),
                    cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
                    kv_transfer_config=KVTransferConfig(kv_connector="KVTierConnector",
                                                        kv_connector_module_path="kvtier.vllm", kv_role="kv_both",
                                                        kv_connector_extra_config=ec))
    init_none_hash(sha256)
    return kv.KVTierConnector(vc, KVConnectorRole.SCHEDULER, _kv_cache_config()), vc


@pytest.fixture
def connector(model_config, tmp_path):
    conn, vc = _connector(model_config, tmp_path)
    # one KV-cache group: streamed loads, and vLLM recomputes a chunk that fails mid-stream
    assert conn.connector_scheduler.manager.streaming
    assert vc.kv_transfer_config.kv_load_failure_policy == "recompute"
    yield conn
    conn.connector_scheduler.manager.shutdown()


def test_sync_loads_keep_loads_verified(model_config, tmp_path):
    """vLLM 0.33+ loads inside the step when sync_load_budget_bytes > 0: a chunk failing mid-stream could not be
    recomputed then, so kvtier verifies every chunk before its hit (compat._enable_streaming). Before 0.33 the key is
    not vLLM's, and kvtier refuses it as unknown."""
    if not kv.compat.SYNC_LOADS:
        with pytest.raises(ValueError, match="sync_load_budget_bytes"):
            _connector(model_config, tmp_path, sync_load_budget_bytes=1 << 20)
        return
    conn, _ = _connector(model_config, tmp_path, sync_load_budget_bytes=1 << 20)
    try:
        mgr = conn.connector_scheduler.manager
        assert mgr.requests_noted and not mgr.streaming
    finally:
        conn.connector_scheduler.manager.shutdown()


def _request(req_id, n_tokens):
    return Request(req_id, list(range(1, n_tokens + 1)), SamplingParams(max_tokens=1), None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256))


def test_hashes_reach_the_manager_and_a_stored_prefix_is_what_vllm_finds(connector):
    mgr = connector.connector_scheduler.manager
    assert isinstance(mgr, kv.KVTierManager) and mgr.requests_noted
    n = 4 * CHUNK + 43  # 4 full chunks and a partial one
    first = _request("first", n)
    assert len(first.block_hashes) == n // BLOCK
    connector.on_new_request(first)
    keys = mgr._req_keys["first"]
    assert len(keys) == 4  # full chunks only
    assert mgr.engine.preload_stats()["enqueued"] == 4  # its preload was queued (nothing is stored: no reads)

    second = _request("second", n)  # added before vLLM's first lookup of this step (as its scheduler does)
    connector.on_new_request(second)
    assert mgr._req_keys["second"] == keys

    # nothing stored yet: vLLM finds nothing
    assert connector.get_num_new_matched_tokens(first, 0)[0] == 0

    # store the 4 chunks under kvtier's keys through the engine (the slots' bytes do not matter here)
    mgr.streaming = False
    ctx = ReqContext(req_id="first")
    out = mgr.prepare_store(keys, ctx)
    assert out is not None and [bytes(k) for k in out.keys_to_store] == keys
    mgr.complete_store(keys, ctx)

    hit = None
    for _ in range(200):  # HIT_PENDING while the engine reads; vLLM asks again after each step
        hit, _ = connector.get_num_new_matched_tokens(second, 0)
        if hit is not None:
            break
        mgr.on_schedule_end(None)
    assert hit == 4 * CHUNK
