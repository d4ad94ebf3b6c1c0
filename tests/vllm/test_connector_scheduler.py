"""KVTierConnector's scheduler side inside vLLM's own OffloadingConnector (OffloadingConnectorScheduler), built from
vLLM's config objects with a real kvtier engine, and vLLM Requests with vLLM's block hasher: no server, no worker,
no GPU (it runs on the CUDA vllm of a machine without one: DeviceConfig "cpu" stands in for the device vLLM cannot
infer there; docs/vllm-version.md, "CUDA vLLM on this machine").

* A new request's block hashes reach kvtier's manager through vLLM's on_new_request (KVTierConnector), which turns
  them into chunk keys and queues their preload.
* Chunks stored under the keys kvtier derives are the ones vLLM's scheduler looks up for an identical request: its
  get_num_new_matched_tokens reports the stored prefix.
* Per-request controls in a request's kv_transfer_params, parsed by vLLM's scheduler where the release has them:
  kv_load_tiers (kvtier's disk is a STORAGE tier of its root's locality), max_load_tokens (applied by vLLM's scheduler
  alone); and the break-even gate's estimate in the finished request's kv_transfer_params ("kvtier_gate")."""

import dataclasses
import json
import time

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
from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler as offloading_scheduler
from vllm.v1.request import Request, RequestStatus

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


def _request(req_id, n_tokens, **kv_transfer_params):
    extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params else None
    return Request(req_id, list(range(1, n_tokens + 1)), SamplingParams(max_tokens=1, extra_args=extra), None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256))


def _store(mgr, keys, req_id):
    """Stores chunks under kvtier's keys through the engine (the slots' bytes do not matter here)."""
    streaming, mgr.streaming = mgr.streaming, False
    ctx = ReqContext(req_id=req_id)
    out = mgr.prepare_store(keys, ctx)
    assert out is not None and [bytes(k) for k in out.keys_to_store] == keys
    mgr.complete_store(keys, ctx)
    mgr.streaming = streaming


def _matched(connector, request, steps=200):
    """vLLM's lookup of a request, asked again after each step while kvtier reads (HIT_PENDING: None)."""
    mgr = connector.connector_scheduler.manager
    for _ in range(steps):
        hit, _ = connector.get_num_new_matched_tokens(request, 0)
        if hit is not None:
            return hit
        mgr.on_schedule_end(None)
        time.sleep(0.005)
    raise AssertionError(f"{request.request_id}: still pending after {steps} steps")


N_TOKENS = 4 * CHUNK + 43  # 4 full chunks and a partial one


def _on_disk_only(model_config, root):
    """4 chunks written to `root` by one instance, then a new instance on it: its pool is empty, its disk has them."""
    conn, _ = _connector(model_config, root)
    mgr = conn.connector_scheduler.manager
    req = _request("writer", N_TOKENS)
    conn.on_new_request(req)
    keys = mgr._req_keys["writer"]
    _store(mgr, keys, "writer")
    deadline = time.monotonic() + 60
    while not all(mgr.engine.stored(k) for k in keys):
        assert time.monotonic() < deadline, "the stores were not written"
        time.sleep(0.01)
    mgr.shutdown()
    conn, _ = _connector(model_config, root)
    return conn


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

    _store(mgr, keys, "first")
    assert _matched(connector, second) == 4 * CHUNK


@pytest.mark.skipif(not hasattr(offloading_scheduler, "KV_LOAD_TIERS_KEY"),
                    reason=f"vLLM {kv.compat.VLLM_VERSION} parses no kv_load_tiers")
def test_kv_load_tiers_admit_kvtiers_disk_as_local_storage_only(model_config, tmp_path):
    """kvtier's disk is a STORAGE tier, LOCAL on a root one host uses (REMOTE on one several hosts mount): a
    request whose kv_load_tiers exclude it gets no hit from the disk and starts no read for it (no preload)."""
    conn = _on_disk_only(model_config, tmp_path)
    mgr = conn.connector_scheduler.manager
    assert mgr.locality == "LOCAL"
    try:
        read = mgr.engine.stats()["bytes_read"]
        for i, tiers in enumerate([[{"medium": "cpu"}], [{"medium": "storage", "locality": "remote"}], []]):
            req = _request(f"excluded-{i}", N_TOKENS, kv_load_tiers=tiers)
            conn.on_new_request(req)
            assert _matched(conn, req) == 0, tiers
        assert mgr.engine.preload_stats()["enqueued"] == 0
        assert mgr.engine.stats()["bytes_read"] == read
        req = _request("admitted", N_TOKENS, kv_load_tiers=[{"medium": "storage", "locality": "local"}])
        conn.on_new_request(req)
        assert _matched(conn, req) == 4 * CHUNK
    finally:
        mgr.shutdown()


@pytest.mark.skipif("max_load_tokens" not in getattr(offloading_scheduler.RequestOffloadState,
                                                     "__dataclass_fields__", {}),
                    reason=f"vLLM {kv.compat.VLLM_VERSION} has no per-request max_load_tokens")
def test_max_load_tokens_caps_a_kvtier_hit(model_config, tmp_path):
    """vLLM's scheduler caps the hit it asks the manager about (offloading/scheduler.py, max_hit_size_tokens), so
    kvtier needs no code of its own: a 4-chunk hit limited to a bit more than one chunk loads one chunk."""
    conn = _on_disk_only(model_config, tmp_path)
    mgr = conn.connector_scheduler.manager
    try:
        capped = _request("capped", N_TOKENS, max_load_tokens=CHUNK + 5)
        conn.on_new_request(capped)
        assert 0 < _matched(conn, capped) <= CHUNK + 5
        whole = _request("whole", N_TOKENS)
        conn.on_new_request(whole)
        assert _matched(conn, whole) == 4 * CHUNK
    finally:
        mgr.shutdown()


def _thresholds_with_frontier(path, dram_min):
    """A thresholds file as `kvtier calibrate` writes it: the gate's minimums and the measured curves."""
    frontier = {"sizes": [128, 512], "f": [0.5, 2.0], "t0": 0.05,
                "tiers": {"dram": {"hit_sizes": [128, 512], "g": [0.06, 0.12]},
                          "disk": {"hit_sizes": [128, 512], "g": [0.1, 0.4]}}}
    path.write_text(json.dumps({"version": 1, "model": "m", "tokens_per_chunk": CHUNK, "store_min_tokens": 0,
                                "tiers": {"dram": {"min_load_tokens": dram_min}, "disk": {"min_load_tokens": 0}},
                                "frontier": frontier}))
    return str(path)


@pytest.mark.parametrize("dram_min, decision", [(2 * CHUNK, "load"), (8 * CHUNK, "recompute")])
def test_gate_estimate_is_returned_with_the_finished_request(model_config, tmp_path, dram_min, decision):
    """The break-even gate's per-request estimate (tokens worth loading, their tier, the threshold, the decision, and
    the calibrated TTFT of loading and of recomputing them) comes back in the kv_transfer_params vLLM returns with
    the finished request (the OpenAI response's kv_transfer_params) under "kvtier_gate"."""
    root = tmp_path / "root"
    root.mkdir()
    thr = _thresholds_with_frontier(tmp_path / "thresholds.json", dram_min)
    conn, _ = _connector(model_config, root, kvtier_thresholds_path=thr)
    mgr = conn.connector_scheduler.manager
    try:
        writer = _request("writer", N_TOKENS)
        conn.on_new_request(writer)
        _store(mgr, mgr._req_keys["writer"], "writer")  # resident in kvtier's pool: a DRAM hit
        reader = _request("reader", N_TOKENS)
        conn.on_new_request(reader)
        assert _matched(conn, reader) == (4 * CHUNK if decision == "load" else 0)
        reader.status = RequestStatus.FINISHED_STOPPED
        _, params = conn.request_finished(reader, [])
        est = params["kvtier_gate"]
        assert est["tier"] == "dram" and est["load_tokens"] == 4 * CHUNK and est["min_load_tokens"] == dram_min
        assert est["decision"] == decision
        # 256 tokens on the calibrated curves: g_dram 0.06 + (0.12 - 0.06) * 128/384, f 0.5 + 1.5 * 128/384
        assert est["expected_load_s"] == pytest.approx(0.08) and est["expected_recompute_s"] == pytest.approx(1.0)
        assert mgr.gate_estimate("reader") is None or mgr.gate_estimate("reader") == est  # until the manager ends it
        writer.status = RequestStatus.FINISHED_STOPPED
        _, params = conn.request_finished(writer, [])  # never looked up: no estimate, vLLM's params untouched
        assert params is None or "kvtier_gate" not in params
    finally:
        mgr.shutdown()
