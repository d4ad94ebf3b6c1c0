"""End-to-end: `kvtier replay` runs a time-scaled slice of the Mooncake conversation trace against a real vLLM with
kvtier on the tiny model and prints its report (issue 3 acceptance). Two passes over the slice, vLLM's own prefix
cache reset before each: the second pass finds the prompts' full chunks in kvtier.

Prompt lengths are scaled by 1/8 (Mooncake's 512-token blocks become 64 tokens, the slice's prompts average about
1.8k tokens) and capped at 4096 tokens, within the tiny server's 8192-token limit; output is 2 tokens."""

import json
import os
import subprocess
import sys

import pytest

from server import Server, kvtier_transfer_config, tiny_model_dir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACE = os.path.join(os.path.dirname(REPO), "shared", "data", "traces", "mooncake_conversation_trace.jsonl")


@pytest.fixture(scope="module")
def model_dir():
    return tiny_model_dir()


@pytest.mark.skipif(not os.path.exists(TRACE), reason="shared/data/traces not present")
def test_replay_mooncake_slice(model_dir, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    out = tmp_path / "replay.json"
    with Server(model_dir, tmp_path / "server.log", kvtier_transfer_config(root)) as s:
        s.wait_healthy()
        cmd = [sys.executable, "-m", "kvtier.replay", "--trace", TRACE, "--url", s.base, "--model", "tiny",
               "--max-requests", "12", "--time-scale", "0.1", "--length-scale", "0.125",
               "--max-input-tokens", "4096", "--output-tokens", "2", "--concurrency", "4",
               "--passes", "2", "--reset-prefix-cache", "--quiet", "--json", str(out)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        print(p.stdout)
        assert p.returncode == 0, p.stdout + p.stderr + s.log_tail(30)
    assert "p99" in p.stdout and "kvtier chunk lookups" in p.stdout
    rep = json.loads(out.read_text())
    assert rep["requests"] == 12 and rep["block_tokens"] == 64
    first, second = rep["passes"]
    for ps in rep["passes"]:
        assert ps["errors"] == 0 and ps["ttft"]["n"] == 12
        assert ps["ttft"]["p50"] > 0 and ps["ttft"]["p99"] >= ps["ttft"]["p50"]
    m = second["metrics"]
    # the first pass stored every full chunk; after the reset the second pass loads them from kvtier
    assert m.get("kvtier_hits_dram", 0) + m.get("kvtier_hits_disk", 0) > 0, m  # a zero counter is left out
    assert m["external_hits_tokens"] > 0
    assert first["metrics"]["kvtier_bytes_written"] > 0
    assert m["external_hits_tokens"] > first["metrics"].get("external_hits_tokens", 0)
