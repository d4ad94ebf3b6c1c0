"""bench/scoreboard.py: bench/results/scoreboard.json follows from the committed result files, and
docs/performance.md's summary tables follow from scoreboard.json."""

import copy
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import scoreboard  # noqa: E402


def committed():
    return (REPO / "bench" / "results" / "scoreboard.json").read_text(), (REPO / "docs" / "performance.md").read_text()


def test_the_committed_scoreboard_and_tables_are_up_to_date():
    board, doc = committed()
    assert scoreboard.check(board, doc) == []


def test_a_table_edited_by_hand_is_caught():
    board, doc = committed()
    row = next(r for r in json.loads(board)["engine_io"] if r["current"])
    cell = f"| {row['engine_gbps']:.2f} |"
    assert cell in doc
    drifted = doc.replace(cell, "| 9.99 |", 1)
    assert any("tables differ" in p for p in scoreboard.check(board, drifted))


def test_a_scoreboard_that_no_longer_follows_from_the_results_is_caught():
    board, doc = committed()
    b = json.loads(board)
    b["peers_storage"][0]["vllm_fs_gbps"] = 0.5
    edited = scoreboard.dumps(b)
    problems = scoreboard.check(edited, scoreboard.render_doc(doc, b))
    assert problems == ["bench/results/scoreboard.json differs from what the result files give "
                        "(run bench/scoreboard.py)"]


def test_missing_markers_are_named():
    board, doc = committed()
    cut = doc.replace("<!-- /scoreboard:peers_storage -->", "", 1)
    assert any("peers_storage" in p for p in scoreboard.check(board, cut))


def bench_io_doc(block_device="zram0", copier="none"):
    """A `kvtier bench io --json` file with the multi-threaded raw baseline: two repetitions, one cell."""
    return {
        "block_device": block_device, "copier": copier,
        "results": [{
            "chunk_bytes": 28 << 20, "depth": 16, "engine_reactors": 4,
            "engine_write_gbps": [8.0, 9.0], "raw_write_gbps": [5.0, 5.0],
            "engine_read_gbps": [15.0, 16.0], "raw_read_gbps": [5.5, 6.0],
            "raw_variants": [
                {"variant": "t1/whole", "threads": 1, "request_bytes": None,
                 "write_gbps": [5.0, 5.0], "read_gbps": [5.5, 6.0]},
                {"variant": "t8/4MiB", "threads": 8, "request_bytes": 4 << 20,
                 "write_gbps": [10.0, 12.0], "read_gbps": [20.0, 16.0]},
                {"variant": "t4/whole", "threads": 4, "request_bytes": None,
                 "write_gbps": [9.0, 9.0], "read_gbps": [12.0, 12.0]}],
        }],
    }


def test_engine_io_rows_take_the_best_raw_variant_and_pair_the_ratio_by_repetition():
    source = {"machine": "h200", "date": "2026-12-02", "command": "cmd", "files": ["a.json"]}
    rows = scoreboard.engine_io_rows(source, load=lambda p: bench_io_doc())
    w, r = rows
    assert (w["op"], r["op"]) == ("write", "read")
    assert (w["device"], w["path"], w["chunk_mib"], w["engine_reactors"]) == ("zram", "copier-none", 28, 4)
    # writes: t8/4MiB has the best median (11.0); ratio = median(8/10, 9/12) = 0.775, not 8.5 / 11
    assert (w["raw_best_variant"], w["raw_best_threads"], w["raw_best_gbps"], w["ratio"]) == ("t8/4MiB", 8, 11.0, 0.775)
    # reads: t8/4MiB again (18.0); median(15/20, 16/16) = 0.875
    assert (r["raw_best_gbps"], r["ratio"], r["engine_gbps"], r["raw_1t_gbps"]) == (18.0, 0.875, 15.5, 5.75)
    assert w["note"] is None


def test_engine_io_pools_runs_and_refuses_to_mix_devices():
    docs = {"a.json": bench_io_doc(), "b.json": bench_io_doc()}
    source = {"machine": "h200", "date": "d", "command": "c", "files": ["a.json", "b.json"]}
    rows = scoreboard.engine_io_rows(source, load=docs.__getitem__)
    assert rows[0]["repetitions"] == 4 and rows[0]["results"] == ["a.json", "b.json"]
    docs["b.json"] = bench_io_doc(block_device="vda")
    with pytest.raises(ValueError, match="share device and copier"):
        scoreboard.engine_io_rows(source, load=docs.__getitem__)


def test_files_without_the_raw_variants_give_null_fields_and_say_why():
    doc = bench_io_doc(block_device="vda", copier="host")
    for res in doc["results"]:
        del res["raw_variants"]
    source = {"machine": "cpu", "date": "d", "command": "c", "files": ["a.json"]}
    w = scoreboard.engine_io_rows(source, load=lambda p: doc)[0]
    assert (w["device"], w["path"], w["raw_best_gbps"], w["ratio"]) == ("virtio", "host", None, None)
    assert w["ratio_to_raw_1t"] == 1.7 and "single-thread" in w["note"]


def test_peers_rows_use_the_slot_path_when_measured():
    doc = json.loads((REPO / "bench" / "results" / "peers" / "results.json").read_text())
    doc["rows"] = [r for r in doc["rows"] if r["variant"] != "kvtier-slot"]  # as measured before the slot path
    with_slot = copy.deepcopy(doc)
    for r in doc["rows"]:
        if r["variant"] == "kvtier":
            with_slot["rows"].append(dict(r, variant="kvtier-slot", store_gbps=2.2, store_cpu=0.1))
    source = {"machine": "cpu", "date": "d", "command": "c", "file": "results.json"}
    rows = scoreboard.peers_rows(source, load=lambda p: with_slot)
    store28 = next(r for r in rows if r["chunk_mib"] == 28 and r["op"] == "store")
    assert store28["kvtier_slot_gbps"] == 2.2 and store28["kvtier_cpu_s_per_gb"] == 0.1
    assert store28["slot_over_vllm_fs"] == round(2.2 / store28["vllm_fs_gbps"], 3)
    assert store28["note"] is None
    plain = scoreboard.peers_rows(source, load=lambda p: doc)
    assert all(r["kvtier_slot_gbps"] is None and r["note"] for r in plain)


def test_a_source_pattern_stands_for_the_committed_files_it_matches():
    source = {"machine": "h200", "device": "virtio", "date": "d", "command": "c",
              "files": ["bench/results/io/box-s8/bench-io-box-run*.json"]}
    rows = scoreboard.engine_io_rows(source)
    assert rows[0]["results"] == ["bench/results/io/box-s8/bench-io-box-run1.json",
                                  "bench/results/io/box-s8/bench-io-box-run2.json"]
    with pytest.raises(ValueError, match="no such files"):
        scoreboard.engine_io_rows(dict(source, files=["bench/results/io/nothing-here-*.json"]))


def test_engine_paths_rows_take_each_chunk_sizes_medians_and_the_pairs_spread():
    summary = {"pairs": 2, "stream_over_job": {
        str(28 << 20): {"median": {"write_ratio_to_best": 1.0, "read_ratio_to_best": 0.9,
                                   "median_engine_write_gbps": 1.1, "median_engine_read_gbps": 0.95},
                        "per_pair": {"write_ratio_to_best": [0.9, 1.1], "read_ratio_to_best": [0.8, 1.0],
                                     "median_engine_write_gbps": [1.0, 1.2], "median_engine_read_gbps": [0.7, 1.2]}},
        str(2 << 20): {"median": {"write_ratio_to_best": 1.0, "read_ratio_to_best": 1.0,
                                  "median_engine_write_gbps": 1.0, "median_engine_read_gbps": 1.0},
                       "per_pair": {k: [1.0, 1.0] for k in ("write_ratio_to_best", "read_ratio_to_best",
                                                            "median_engine_write_gbps", "median_engine_read_gbps")}}}}
    source = {"machine": "cpu", "date": "d", "load": "quiet", "command": "c", "file": "x/summary.json"}
    rows = scoreboard.engine_paths_rows(source, load=lambda p: summary)
    assert [r["chunk_mib"] for r in rows] == [2, 28]
    big = rows[1]
    assert big["stream_over_job_read_ratio_to_best"] == 0.9 and big["pairs"] == 2
    assert (big["pair_min"], big["pair_max"]) == (0.7, 1.2)
    assert "| cpu | 28 MiB | 2 |" in scoreboard.table_engine_paths({"engine_paths": rows})


def test_engine_builds_rows_pool_the_runs_pairs_per_chunk_size():
    def summary(write, read, sizes=(2 << 20,)):
        pairs = {"write_ratio_to_best": write, "read_ratio_to_best": read,
                 "median_engine_write_gbps": write, "median_engine_read_gbps": read}
        return {"b_over_a": {str(size): {"median": {}, "per_pair": pairs} for size in sizes}}
    files = {"r1/summary.json": summary([1.0, 0.9], [1.2, 0.8]),
             "r2/summary.json": summary([1.1, 1.05, 0.95], [1.0, 0.7, 1.0], sizes=(2 << 20, 28 << 20))}
    source = {"machine": "cpu", "date": "d", "load": "quiet", "change": "a -> b", "command": "c",
              "files": list(files)}
    rows = scoreboard.engine_builds_rows(source, load=files.__getitem__)
    assert [(r["chunk_mib"], r["runs"], r["pairs"]) for r in rows] == [(2, 2, 5), (28, 1, 3)]
    two = rows[0]
    assert two["b_over_a_write_ratio_to_best"] == 1.0 and two["b_over_a_read_ratio_to_best"] == 1.0
    assert (two["pair_min"], two["pair_max"]) == (0.7, 1.2)
    table = scoreboard.table_engine_builds({"engine_builds": rows})
    assert "| cpu | a -> b | 2 MiB | 2 | 5 | 1.00 | 1.00 |" in table


def test_load_under_writeback_rows_give_each_setting_and_its_ratios_to_the_engine_without_either():
    def t(cap, piece, total, wb):
        return {"cap": cap, "write_piece_mib": piece, "load_mean_s": 0.2, "load_p50_s": 0.1, "load_p95_s": 0.3,
                "loads_total_s": total, "writeback_s": wb}
    doc = {"args": {"chunk_mib": 32, "reads": 16, "load_batch": 16, "writes": 256, "io_depth": 16},
           "table": [t(0, 1.0, 1.0, 5.5), t(0, 0.0, 2.0, 5.0), t(16, 0.0, 4.0, 5.0)],
           "runs": [{"cap": c, "write_piece_mib": m} for c, m in ((0, 1.0), (0, 0.0), (16, 0.0)) * 2]}
    source = {"machine": "cpu", "device": "virtio", "reactors": "1", "date": "d", "command": "c", "file": "x/f/r.json"}
    pieces, bounded, base = scoreboard.load_under_writeback_rows(source, load=lambda p: doc)
    assert (pieces["writes_at_disk"], pieces["write_piece_mib"], pieces["runs"], pieces["load_batch"]) == (8, 1.0, 2, 16)
    assert pieces["loads_total_baseline_over_this"] == 4.0 and pieces["writeback_this_over_baseline"] == 1.1
    assert bounded["loads_total_baseline_over_this"] == 2.0 and bounded["write_piece_mib"] is None, "0: whole chunks"
    assert base["writes_at_disk"] is None and base["loads_total_baseline_over_this"] is None, "io_depth: no bound"
    table = scoreboard.table_load_under_writeback({"load_under_writeback": [pieces, bounded, base]})
    assert "| 8 of 16 | 1 MiB | 2 | 200 / 100 / 300 | 1.00 | 5.50 | 4.00 | 1.10 |" in table
    assert "| no bound (16) | whole chunk | 2 |" in table and "| baseline | - |" in table
    old = {"args": {"chunk_mib": 32, "reads": 16, "writes": 256, "io_depth": 16},  # a file from before write pieces
           "table": [{k: v for k, v in t(0, 0, 1.0, 5.0).items() if k != "write_piece_mib"}],
           "runs": [{"cap": 0}]}
    (row,) = scoreboard.load_under_writeback_rows(source, load=lambda p: old)
    assert row["write_piece_mib"] is None and row["load_batch"] == 1 and row["writeback_this_over_baseline"] is None


def test_superseded_rows_stay_in_the_json_and_leave_the_tables():
    doc = bench_io_doc()
    old = {"machine": "h200", "date": "d1", "command": "old run", "files": ["a.json"], "superseded": "run b"}
    new = {"machine": "h200", "date": "d2", "command": "new run", "files": ["b.json"]}
    board = scoreboard.build({"engine_io": [old, new], "peers_storage": [], "vllm_ttft": []}, load=lambda p: doc)
    rows = board["engine_io"]
    assert [(r["date"], r["current"], r.get("superseded")) for r in rows] == [("d1", False, "run b")] * 2 + \
        [("d2", True, None)] * 2
    table = scoreboard.table_engine_io(board)
    assert "| d2 |" in table and "| d1 |" not in table
    assert table.endswith("2 superseded rows (earlier runs of these cells) stay in `bench/results/scoreboard.json` "
                          "(`engine_io`, `\"current\": false`), each with what replaced it.")
    board["engine_io"] = rows[2:]
    assert "superseded" not in scoreboard.table_engine_io(board)


def test_the_plot_groups_the_current_ttft_rows_by_cell_and_runs_of_one_system_into_one_bar(tmp_path):
    row = {"machine": "h100", "vllm": "0.34.0", "model": "qwen2.5-32b", "tokens": 40960, "tier": "disk only",
           "pressure": False, "pool_gib": 32, "current": True, "completed": True, "requests": 8}
    board = {"vllm_ttft": [
        {**row, "system": "kvtier-disk", "mean_ms": 1000, "p50_ms": 900, "p95_ms": 2000},
        {**row, "system": "kvtier-disk", "mean_ms": 2000, "p50_ms": 1100, "p95_ms": 3000},
        {**row, "system": "kvtier-disk", "pressure": True, "pool_gib": 8, "mean_ms": 1500, "p50_ms": 1, "p95_ms": 2},
        {**row, "system": "kvtier-disk", "tier": "disk only (batch_api copies)", "mean_ms": 7, "p50_ms": 7,
         "p95_ms": 7},
        {**row, "system": "native", "mean_ms": 3000, "p50_ms": 3000, "p95_ms": 3000, "current": False},
        {**row, "system": "native", "vllm": "0.26.0", "mean_ms": 4000, "p50_ms": 4000, "p95_ms": 4000},
        {**row, "system": "lmcache", "pressure": True, "pool_gib": None, "tier_gib": 8, "mean_ms": None,
         "p50_ms": None, "p95_ms": None, "completed": False, "done": 0},
        {**row, "vllm": "0.26.0", "system": "kvtier-disk", "gate": "on (a file)", "device": "virtio", "mean_ms": 5,
         "p50_ms": 5, "p95_ms": 5},
        {**row, "vllm": "0.26.0", "system": "native", "device": "zram", "mean_ms": 6, "p50_ms": 6, "p95_ms": 6,
         "completed": False, "done": 4},
    ]}
    cells = dict(scoreboard.plot_cells(board))
    assert sorted(cells) == ["h100, vLLM 0.26.0\nqwen2.5-32b, 40k tokens, root on virtio/zram",
                             "h100, vLLM 0.34.0\nqwen2.5-32b, 40k tokens"]
    assert cells["h100, vLLM 0.26.0\nqwen2.5-32b, 40k tokens, root on virtio/zram"] == [
        ("native", 4000, 4000, 4000, 1), ("kvtier-disk, gate on, virtio", 5, 5, 5, 1),
        ("native, zram, 4 of 8 done", 6, 6, 6, 1)], "a gated run is a bar of its own; a cell of two devices names them"
    assert cells["h100, vLLM 0.34.0\nqwen2.5-32b, 40k tokens"] == [
        ("kvtier-disk", 1500, 1000, 2500, 2),  # two runs: the mean of their means, the medians of p50 and p95
        ("kvtier-disk, 8 GiB", 1500, 1, 2, 1),  # smaller than one request
        ("kvtier-disk, batch_api copies", 7, 7, 7, 1),
        ("lmcache, 8 GiB, 0 of 8 done", None, None, None, 1)], "superseded rows are left out; a hung run has no value"
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (python/requirements-dev.txt)")
    png = tmp_path / "ttft.png"
    scoreboard.plot_vllm_ttft(board, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ttft_rows_count_the_requests_asked_for_and_keep_what_a_run_that_did_not_complete_logged():
    ttft = {"mean": 1.0, "p50": 1.0, "p95": 2.0, "n": 4}
    doc = {"model": "qwen2.5-32b", "concurrency": 4, "argv": ["headline.py", "run", "--query-rounds", "2"], "runs": [
        {"system": "kvtier-disk", "doc_tokens": 40960, "docs": 4,
         "query": {"ttft": {**ttft, "n": 8}, "rounds": 2}},
        {"system": "native", "doc_tokens": 40960, "docs": 4, "query": {"ttft": ttft},  # round 2 hung: round 1's
         "error": "query timed out after 200.0 s"},
        {"system": "lmcache", "doc_tokens": 40960, "docs": 4, "error": "query timed out after 110.0 s"},
        {"system": "kvtier-dram", "skipped": "deadline"}]}
    source = {"machine": "h100", "date": "d", "device": "zram", "tier": "-", "gate": "off", "preload": "on",
              "command": "c", "file": "bench/results/h200/peers-x/cell/headline.json",
              "per_system": {"native": {"tier": "CPU tier + fs tier", "tier_gib": 32, "outcome": "EngineCore died"}}}
    rows = scoreboard.vllm_rows(source, load=lambda p: doc)
    assert [(r["system"], r["requests"], r["done"], r["completed"], r["mean_ms"], r["outcome"]) for r in rows] == [
        ("kvtier-disk", 8, 8, True, 1000, None),
        ("native", 8, 4, False, 1000, "query timed out after 200.0 s; EngineCore died"),
        ("lmcache", 8, 0, False, None, "query timed out after 110.0 s")], "a run the deadline skipped is no row"
    board = {"vllm_ttft": [{**r, "vllm": "0.26.0", "current": True} for r in rows]}
    table = scoreboard.table_vllm_ttft(board)
    assert "| 1000 | 1000 | 2000 | yes | peers-x/cell |" in table
    assert "| 1000 | 1000 | 2000 | no: 4 of 8 | peers-x/cell |" in table and "| - | - | - | no: 0 of 8 |" in table
    assert "- native, 32 GiB, peers-x/cell: query timed out after 200.0 s; EngineCore died" in table


def test_queue_rows_give_each_class_and_the_preload_planner_of_each_system():
    """vllm_queue: one row per system of a --workload queue headline.json, TTFT of all requests and per class, the
    query phase's bytes from its metrics, the planner's counters from the engine's final stats (none without
    preload)."""
    def run(system, cached_s, planner):
        t = {"n": 2, "mean": cached_s, "p50": cached_s, "p95": cached_s}
        return ({"system": system, "doc_tokens": 5120, "query": {
                    "ttft": {**t, "n": 4}, "wall_s": 22.46,
                    "ttft_by_class": {"cached": t, "uncached": {**t, "mean": 1.0}},
                    "metrics": {"vllm:kvtier_bytes_read_total": 21.5e9, "vllm:kvtier_bytes_written_total": 18.6e9}}},
                {"system": system, "kvtier_stats": [{"preload_planner": planner} if planner else {}]})
    runs = [run("kvtier-disk", 2.0, {"started": 8, "refused_no_room": 548}), run("kvtier-disk-nopreload", 3.0, None)]
    doc = {"model": "qwen2.5-32b", "versions": {"vllm": "0.26.0"}, "argv": ["run", "--max-num-seqs", "1"],
           "runs": [r for r, _ in runs], "freed": [f for _, f in runs]}
    source = {"machine": "h100", "device": "virtio", "pool_gib": 8, "date": "2026-12-06", "command": "c",
              "file": "bench/results/h200/q/headline.json"}
    rows = scoreboard.vllm_queue_rows(source, load=lambda p: doc)
    assert [(r["system"], r["preload"], r["cached_mean_ms"], r["uncached_mean_ms"], r["preloads_started"],
             r["preloads_refused_no_room"]) for r in rows] == [
        ("kvtier-disk", "on", 2000, 1000, 8, 548), ("kvtier-disk-nopreload", "off", 3000, 1000, None, None)]
    assert rows[0]["read_gb"] == 21.5 and rows[0]["query_s"] == 22.5 and rows[0]["max_num_seqs"] == 1
    table = scoreboard.table_vllm_queue({"vllm_queue": rows})
    assert "| 8 (548) |" in table and "| kvtier-disk-nopreload | off |" in table, table


def test_one_system_of_a_file_can_be_superseded_and_the_others_stay_current():
    """A later lease re-measured one system of a cell (bench/scoreboard.py, _superseded with systems): that system's
    row leaves the tables with the reason; the file's other rows stay."""
    ttft = {"mean": 1.0, "p50": 1.0, "p95": 2.0, "n": 2}
    doc = {"model": "llama-3.2-3b", "concurrency": 2, "runs": [
        {"system": s, "doc_tokens": 40960, "docs": 2, "query": {"ttft": ttft}} for s in ("kvtier-disk", "native")]}
    per = {"kvtier-disk": {"tier": "disk only", "pool_gib": 4}, "native": {"tier": "CPU tier + fs tier"}}
    source = {"machine": "h100", "date": "d", "device": "zram", "tier": "-", "gate": "off", "preload": "on",
              "command": "c", "file": "bench/results/h200/x/headline.json", "per_system": per}
    board = scoreboard.build({"vllm_ttft": [scoreboard._superseded(source, "the later lease", {"kvtier-disk"})]},
                             load=lambda p: doc)
    assert [(r["system"], r["current"], r.get("superseded")) for r in board["vllm_ttft"]] == [
        ("kvtier-disk", False, "the later lease"), ("native", True, None)]
    whole = scoreboard.build({"vllm_ttft": [scoreboard._superseded(source, "all")]}, load=lambda p: doc)
    assert [r["current"] for r in whole["vllm_ttft"]] == [False, False]
    assert "superseded" not in source["per_system"]["kvtier-disk"], "the source itself is left as it was"
