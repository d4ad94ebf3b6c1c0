"""The chunk size when kv_connector_extra_config has neither `block_size` nor `blocks_per_chunk`: 256 tokens
(vLLM's own default is one GPU block per chunk, a 16-token file), or a startup refusal that says what to set.

Unit tests build KVTierSpec from vLLM's OffloadingConfig as vLLM's build_offloading_config leaves it without those
keys (blocks_per_chunk=1); the end-to-end test starts a real server on the tiny model without `block_size` and
reads the chunk size from the storage root's MANIFEST (docs/file-format.md)."""

import glob
import json
import os

import pytest

import kvtier.vllm as kv
from kvtier.tiny_model import synthetic_words
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)

import server as srv
from offload_config import build


def vllm_config(root, tokens_per_block, **extra):
    """OffloadingConfig as vLLM builds it (offload_config.build fills the fields later releases add):
    blocks_per_chunk from the extra keys, else 1."""
    ec = {"spec_name": "KVTierSpec", "spec_module_path": "kvtier.vllm", "kvtier_root": str(root),
          "kvtier_stats_interval_s": 0, **extra}
    bpc = ec.get("blocks_per_chunk") or (ec["block_size"] // tokens_per_block if "block_size" in ec else 1)
    return build(
        OffloadingConfig,
        groups=(build(OffloadingGroupConfig, tokens_per_block=tokens_per_block, layer_names=("l0", "l1")),),
        worker_kv_bytes_per_block=2 * 4096, enable_kv_cache_events=False, extra_config=ec, engine_id="e0",
        model=build(OffloadingModelConfig, name="tiny-test", dtype="bfloat16"),
        cache=build(OffloadingCacheConfig, tokens_per_hash=tokens_per_block, blocks_per_chunk=bpc),
        parallel=build(OffloadingParallelConfig, rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1,
                       dcp_size=1, data_parallel_index=0, is_parallelism_agnostic=True))


@pytest.mark.parametrize("tokens_per_block,blocks", [(16, 16), (32, 8), (64, 4), (128, 2), (256, 1), (512, 1)])
def test_no_block_size_gives_256_token_chunks(tmp_path, tokens_per_block, blocks):
    spec = kv.KVTierSpec(vllm_config(tmp_path, tokens_per_block))
    assert spec.blocks_per_chunk == blocks
    assert spec.tokens_per_chunk() == max(256, tokens_per_block)
    assert spec.engine_options()["tokens_per_chunk"] == max(256, tokens_per_block)


@pytest.mark.parametrize("extra,blocks", [({"block_size": 64}, 4), ({"blocks_per_chunk": 1}, 1),
                                          ({"block_size": 1024}, 64)])
def test_explicit_chunk_size_is_kept(tmp_path, extra, blocks):
    spec = kv.KVTierSpec(vllm_config(tmp_path, 16, **extra))
    assert spec.blocks_per_chunk == blocks


def test_block_size_not_dividing_256_is_refused_saying_what_to_set(tmp_path):
    with pytest.raises(ValueError, match=r"--block-size 48 .*set kv_connector_extra_config key 'block_size' to a "
                                         r"multiple of 48 \(e\.g\. 240\)"):
        kv.KVTierSpec(vllm_config(tmp_path, 48))


def test_server_without_block_size_writes_256_token_chunks(tmp_path):
    """A real server whose --kv-transfer-config has no block_size: the namespace says 256 tokens (256 / --block-size
    blocks) per chunk, and a 600-token prompt leaves its two full chunks on disk."""
    root = tmp_path / "root"
    root.mkdir()
    cfg = json.loads(srv.kvtier_transfer_config(root))
    del cfg["kv_connector_extra_config"]["block_size"]
    assert "blocks_per_chunk" not in cfg["kv_connector_extra_config"]
    cfg = json.dumps(cfg)
    model = srv.tiny_model_dir()
    with srv.Server(model, tmp_path / "server.log", transfer_config=cfg) as s:
        s.wait_healthy()
        prompt = " ".join(synthetic_words(599, seed=7))  # 600 tokens with BOS (one token per word)
        s.complete(prompt, max_tokens=2)
        s.stop()
    manifests = glob.glob(str(root / "ns-*" / "MANIFEST"))
    assert len(manifests) == 1, os.listdir(root)
    fields = dict(line.split("=", 1) for line in open(manifests[0]).read().splitlines())
    bpc = 256 // srv.cpu_block_size()  # --block-size of the e2e servers: 16, or 32 from vLLM 0.29 on the CPU
    assert (fields["tokens_per_chunk"], fields["blocks_per_chunk"]) == ("256", str(bpc)), fields
    chunks = glob.glob(str(root / "ns-*" / "*" / "*" / "*.kvc"))
    assert len(chunks) >= 2, chunks
