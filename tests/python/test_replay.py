"""Unit tests of the trace replayer (no server): token streams, time scaling, cutting, metrics, report."""

import json
import os

import pytest

from kvtier.tools.replay import report as rp_report, run as rp_run, trace as rp_trace

TRACES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "traces")


def req(i, ts, n, ids, out=4):
    return rp_trace.TraceRequest(i, ts, n, out, tuple(ids))


def write_trace(path, rows):
    with open(path, "w") as fh:
        for ts, n, ids in rows:
            fh.write(json.dumps({"timestamp": ts, "input_length": n, "output_length": 3, "hash_ids": ids}) + "\n")


def test_same_ids_give_identical_blocks_and_different_ids_differ():
    b = rp_trace.TokenBuilder(block_tokens=16, seed=1)
    p1 = b.prompt(req(0, 0, 48, [7, 8, 9]))
    p2 = b.prompt(req(1, 0, 48, [7, 8, 10]))
    p3 = b.prompt(req(2, 0, 48, [5, 8, 9]))
    assert len(p1) == len(p2) == len(p3) == 48
    assert p1[:32] == p2[:32] and p1[32:] != p2[32:]
    # id 8 is the same block wherever it appears
    assert p3[16:32] == p1[16:32] and p3[:16] != p1[:16]
    # deterministic across builders, depends on the seed
    assert rp_trace.TokenBuilder(16, seed=1).prompt(req(0, 0, 48, [7, 8, 9])) == p1
    assert rp_trace.TokenBuilder(16, seed=2).prompt(req(0, 0, 48, [7, 8, 9])) != p1


def test_final_partial_block_and_padding():
    b = rp_trace.TokenBuilder(block_tokens=16)
    full = b.prompt(req(0, 0, 32, [1, 2]))
    part = b.prompt(req(1, 0, 21, [1, 2]))
    assert len(part) == 21 and part == full[:21]  # the last block cut to input_length
    longer = b.prompt(req(2, 0, 40, [1, 2]))  # ids cover 32 tokens: 8 padding tokens of this request
    assert len(longer) == 40 and longer[:32] == full
    assert b.prompt(req(3, 0, 40, [1, 2]))[32:] != longer[32:]
    assert len(b.prompt(req(4, 0, 20, [1, 2, 3]))) == 20  # more ids than tokens


def test_length_scale_keeps_the_structure():
    b = rp_trace.TokenBuilder(block_tokens=512, length_scale=0.125)
    assert b.block_tokens == 64
    a = b.prompt(req(0, 0, 1024 + 100, [1, 2, 3]))
    c = b.prompt(req(1, 0, 1024 + 300, [1, 2, 4]))
    assert len(a) == 141 and len(c) == 166  # ceil(0.125 * n)
    assert a[:128] == c[:128] and a[128:] != c[128:141]


def test_max_input_tokens_truncates():
    b = rp_trace.TokenBuilder(16, max_input_tokens=20)
    assert len(b.prompt(req(0, 0, 64, [1, 2, 3, 4]))) == 20 and b.truncated == 1


def test_schedule_scales_time():
    reqs = [req(0, 1000, 8, [1]), req(1, 1500, 8, [1]), req(2, 4000, 8, [1])]
    assert rp_trace.schedule(reqs, 1.0) == [0.0, 0.5, 3.0]
    assert rp_trace.schedule(reqs, 0.1) == pytest.approx([0.0, 0.05, 0.3])
    assert rp_trace.schedule(reqs, 0) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        rp_trace.schedule(reqs, -1)


def test_load_and_cut(tmp_path):
    rows = [(0, 10, [1]), (500, 20, [1, 2]), (1000, 30, [3]), (2500, 40, [4]), (9000, 50, [5])]
    write_trace(tmp_path / "t.jsonl", rows)
    all_ = rp_trace.load_trace(str(tmp_path / "t.jsonl"))
    assert [x.input_length for x in all_] == [10, 20, 30, 40, 50]
    assert [x.index for x in rp_trace.load_trace(str(tmp_path / "t.jsonl"), start=2)] == [2, 3, 4]
    assert len(rp_trace.load_trace(str(tmp_path / "t.jsonl"), max_requests=2)) == 2
    # duration in trace seconds from the first kept request
    assert [x.index for x in rp_trace.load_trace(str(tmp_path / "t.jsonl"), start=1, duration_s=2.0)] == [1, 2, 3]
    assert [x.index for x in rp_trace.cut(all_, start=1, duration_s=2.0)] == [1, 2, 3]
    assert [x.index for x in rp_trace.cut(all_, max_requests=3, duration_s=100)] == [0, 1, 2]


def test_ideal_reuse_counts_repeated_prefixes():
    b = rp_trace.TokenBuilder(16)
    reqs = [req(0, 0, 48, [1, 2, 3]), req(1, 0, 40, [1, 2, 9]), req(2, 0, 32, [5, 2])]
    ideal = rp_trace.ideal_reuse(reqs, b)
    # request 1 reuses blocks 1,2 (32 tokens); request 2 starts with a new id: block 2 at a new chain is no hit
    assert ideal["prompt_tokens"] == 120 and ideal["reusable_tokens"] == 32


def test_metrics_report():
    before = {'vllm:prefix_cache_queries_total{engine="0"}': 100.0, 'vllm:prefix_cache_hits_total{engine="0"}': 10,
              "vllm:kvtier_lookups_total": 5, "vllm:kvtier_lookup_hits_dram_total": 1,
              'vllm:prompt_tokens_by_source_total{source="local_compute"}': 50}
    after = {'vllm:prefix_cache_queries_total{engine="0"}': 300.0, 'vllm:prefix_cache_hits_total{engine="0"}': 60,
             "vllm:kvtier_lookups_total": 15, "vllm:kvtier_lookup_hits_dram_total": 5,
             "vllm:kvtier_lookup_hits_disk_total": 3, "vllm:kvtier_lookup_misses_total": 2,
             "vllm:kvtier_bytes_read_total": 4096, "vllm:external_prefix_cache_queries_total": 200,
             "vllm:external_prefix_cache_hits_total": 100,
             'vllm:prompt_tokens_by_source_total{source="local_compute"}': 150,
             'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}': 100}
    m = rp_report.metrics_report(before, after)
    assert m["gpu_prefix_hit_rate"] == pytest.approx(0.25)
    assert m["kvtier_lookups"] == 10 and m["kvtier_hit_rate_dram"] == pytest.approx(0.4)
    assert m["kvtier_hit_rate_disk"] == pytest.approx(0.3)
    assert m["kvtier_bytes_read"] == 4096 and m["external_hit_rate"] == pytest.approx(0.5)
    assert m["prompt_tokens_local_compute"] == 100 and m["prompt_tokens_external_kv_transfer"] == 100


def _expect_prompts_repeat_where_ids_repeat(path, n):
    reqs = rp_trace.load_trace(path, max_requests=200)
    b = rp_trace.TokenBuilder(512, length_scale=1 / 32)
    prompts = {x.index: b.prompt(x) for x in reqs}
    bt = b.block_tokens
    for x in reqs[:n]:
        assert len(prompts[x.index]) == b.length(x)
        for y in reqs[:n]:
            k = 0
            while k < min(len(x.hash_ids), len(y.hash_ids)) and x.hash_ids[k] == y.hash_ids[k]:
                k += 1
            n_same = min(k * bt, len(prompts[x.index]), len(prompts[y.index]))
            assert prompts[x.index][:n_same] == prompts[y.index][:n_same]
            if k < min(len(x.hash_ids), len(y.hash_ids)) and (k + 1) * bt <= min(len(prompts[x.index]),
                                                                                  len(prompts[y.index])):
                assert prompts[x.index][k * bt:(k + 1) * bt] != prompts[y.index][k * bt:(k + 1) * bt]


def test_trace_prompts_repeat_where_ids_repeat(tmp_path):
    # A trace in the Mooncake format, written here: shared first blocks, a shared longer prefix, a request that
    # shares nothing, a final partial block.
    ids = [[0, 1, 2], [0, 1, 3, 4], [0, 5], [6, 7], [0, 1, 2, 8], [0, 1, 3, 9, 10]]
    rows = [(1000 * i, 512 * len(h) - 100 * (i % 2), h) for i, h in enumerate(ids)]
    write_trace(tmp_path / "t.jsonl", rows)
    _expect_prompts_repeat_where_ids_repeat(str(tmp_path / "t.jsonl"), len(rows))


def test_mooncake_trace_prompts_repeat_where_ids_repeat():
    path = os.path.join(TRACES, "mooncake_conversation_trace.jsonl")
    if not os.path.exists(path):
        pytest.skip(f"the Mooncake trace {os.path.normpath(path)} is not on this machine (team data outside the "
                    "repository, not in a clean clone; test_trace_prompts_repeat_where_ids_repeat runs the same "
                    "checks on a trace written by the test)")
    _expect_prompts_repeat_where_ids_repeat(path, 60)


def test_format_report_runs():
    res = {"trace": "t", "requests": 2, "first_line": 1, "last_line": 2, "trace_span_s": 1.0, "time_scale": 0.5,
           "block_tokens": 64, "trace_block_tokens": 512, "length_scale": 0.125, "prompt_tokens_mean": 100.0,
           "prompt_tokens_max": 120, "truncated": 0, "ideal": {"reusable_fraction": 0.5},
           "passes": [{"name": "replay", "errors": 0, "wall_s": 1.0,
                       "ttft": rp_run.summarize([0.1, 0.2]), "queue_delay": rp_run.summarize([0.0, 0.0]),
                       "metrics": {"kvtier_lookups": 4, "kvtier_hit_rate_dram": 0.5, "kvtier_bytes_read": 2048}}]}
    text = rp_report.format_report(res)
    assert "p99" in text and "DRAM 50.0%" in text and "2.0 KiB" in text
