"""V1 (docs/vllm-integration.md): the form vLLM's own docs use, vLLM's OffloadingConnector with
"spec_name": "KVTierSpec" and no spec_module_path, resolved through kvtier's vLLM plugin (the vllm.general_plugins
entry point in pyproject.toml) of the installed package. A real server computes a long prompt, serves it again from
kvtier's DRAM tier after its prefix cache is reset, and a second server on the same root serves it from disk: the
same text and logprobs each time as the computed run. (kvtier's own KVTierConnector, which the other e2e tests use,
adds preload and the gate on top of this connector.)"""

import json
import time

from server import Server, tiny_model_dir
from test_e2e_server import CHUNK_TOKENS, LONG, LONG_CHUNKS, SHORT, assert_same


def offloading_connector_config(root) -> str:
    return json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                       "kv_connector_extra_config": {"spec_name": "KVTierSpec", "kvtier_root": str(root),
                                                     "block_size": 256, "kvtier_pool_bytes": "256MiB"}})


def wait_chunk_files(server, root, n, timeout_s=120):
    """Waits until n chunk files are on disk, poking the engine (vLLM submits a step's stores at its next step)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = len(list(root.rglob("*.kvc")))
        if found >= n:
            return found
        server.complete(SHORT, max_tokens=2)
        time.sleep(0.5)
    raise AssertionError(f"{len(list(root.rglob('*.kvc')))} chunk files under {root}, want {n}:\n"
                         f"{server.log_tail(30)}")


def test_offloading_connector_with_spec_name_alone_serves_from_dram_and_disk(tmp_path):
    model_dir = tiny_model_dir()
    root = tmp_path / "root"
    root.mkdir()
    tc = offloading_connector_config(root)
    with Server(model_dir, tmp_path / "a.log", tc) as a:
        a.wait_healthy()
        cold = a.complete(LONG)
        wait_chunk_files(a, root, LONG_CHUNKS)
        a.reset_prefix_cache()
        assert_same(a.complete(LONG), cold, "long, from kvtier's DRAM tier (OffloadingConnector by spec name)")
        hits = a.metrics().get("vllm:external_prefix_cache_hits_total", 0)
        assert hits >= LONG_CHUNKS * CHUNK_TOKENS, f"external prefix cache hits {hits}"
        log = a.log_tail(400)
        assert "KVTierSpec" in log or "kvtier" in log, log
    with Server(model_dir, tmp_path / "b.log", tc) as b:
        b.wait_healthy()
        assert_same(b.complete(LONG), cold, "long, from disk after a restart (OffloadingConnector by spec name)")
        hits = b.metrics().get("vllm:external_prefix_cache_hits_total", 0)
        assert hits >= LONG_CHUNKS * CHUNK_TOKENS, f"external prefix cache hits after the restart {hits}"
