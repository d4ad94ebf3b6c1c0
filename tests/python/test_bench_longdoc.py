"""Unit tests of the long-document benchmark client: prompts, orders, statistics, metrics (no server)."""

import json
import math
import os
import subprocess
import sys

import pytest

import kvtier
from kvtier.tools import client
from kvtier.tools.longdoc import cli as ld_cli, prompts as ld, report as ld_report
from kvtier.tiny_model import BOS_ID


def spec(**kw):
    base = dict(doc_tokens=512, num_docs=3, query_tokens=8, reuse_fraction=1.0, seed=5)
    base.update(kw)
    return ld.PromptSpec(**base)


def test_prompts_are_deterministic_and_seeded():
    s = spec()
    assert ld.warmup_prompt(s, 1) == ld.warmup_prompt(spec(), 1)
    assert ld.query_prompt(s, 1, 0) == ld.query_prompt(spec(), 1, 0)
    assert ld.warmup_prompt(s, 1) != ld.warmup_prompt(spec(seed=6), 1)
    assert ld.document(s, 0) != ld.document(s, 1)


def test_prompts_do_not_depend_on_pythonhashseed():
    code = ("import json,sys; from kvtier.tools.longdoc import prompts as ld; s=ld.PromptSpec(doc_tokens=64,num_docs=2,"
            "query_tokens=4,reuse_fraction=0.5,repeat_mode='random',repeat_count=3,seed=9);"
            "print(json.dumps([ld.query_prompt(s,1,2), ld.query_order(s)]))")
    outs = []
    for hs in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hs)
        env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(kvtier.__file__)),
                                             env.get("PYTHONPATH", "")])
        outs.append(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                   capture_output=True, text=True).stdout)
    assert outs[0] == outs[1]


def test_lengths_are_exact_and_start_with_bos():
    s = spec(doc_tokens=777, query_tokens=13)
    for d in range(s.num_docs):
        w = ld.warmup_prompt(s, d)
        q = ld.query_prompt(s, d, 0)
        assert len(ld.document(s, d)) == 777
        assert len(w) == len(q) == 790 == s.prompt_tokens
        assert w[0] == q[0] == BOS_ID
        assert all(ld.FIRST_WORD_ID <= t < s.vocab_size for t in w[1:] + q[1:])


@pytest.mark.parametrize("frac", [0.0, 0.1, 0.25, 0.5, 0.9, 0.999, 1.0])
def test_reuse_fraction_is_exact(frac):
    s = spec(doc_tokens=1000, reuse_fraction=frac)
    expected = max(1, round(frac * 1000))
    assert s.reuse_tokens == expected
    for d in range(s.num_docs):
        for rep in range(3):
            w, q = ld.warmup_prompt(s, d), ld.query_prompt(s, d, rep)
            assert ld.common_prefix(w, q) == expected
            assert q[:expected] == ld.document(s, d)[:expected]


def test_query_tails_differ_between_reps_docs_and_salts():
    s = spec(reuse_fraction=0.5)
    keep = s.reuse_tokens
    q0, q1 = ld.query_prompt(s, 0, 0), ld.query_prompt(s, 0, 1)
    assert q0[:keep] == q1[:keep]
    assert ld.common_prefix(q0, q1) == keep or ld.common_prefix(q0, q1) < keep + 3
    qs = ld.query_prompt(spec(reuse_fraction=0.5, salt=1), 0, 0)
    assert qs[:keep] == q0[:keep] and qs[keep:] != q0[keep:]
    # A salted query phase shares nothing past the reused prefix with the unsalted one (bar chance matches).
    assert ld.common_prefix(qs, q0) < keep + 3
    # Whole-document reuse: only the question differs.
    s1 = spec(reuse_fraction=1.0)
    w, q = ld.warmup_prompt(s1, 2), ld.query_prompt(s1, 2, 0)
    assert ld.common_prefix(w, q) == s1.doc_tokens


def test_warmup_prompt_does_not_depend_on_salt_or_reuse():
    assert ld.warmup_prompt(spec(salt=3, reuse_fraction=0.2), 1) == ld.warmup_prompt(spec(), 1)


def test_repeat_modes():
    s = spec(num_docs=3, repeat_count=2, repeat_mode="tile")
    assert ld.query_order(s) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    s = spec(num_docs=3, repeat_count=2, repeat_mode="interleave")
    assert ld.query_order(s) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    s = spec(num_docs=6, repeat_count=3, repeat_mode="random")
    o = ld.query_order(s)
    assert sorted(o) == sorted(ld.query_order(spec(num_docs=6, repeat_count=3, repeat_mode="tile")))
    assert o == ld.query_order(spec(num_docs=6, repeat_count=3, repeat_mode="random"))
    assert o != ld.query_order(spec(num_docs=6, repeat_count=3, repeat_mode="tile"))
    assert ld.query_order(spec(num_docs=1, repeat_count=1, repeat_mode="random")) == [(0, 0)]


@pytest.mark.parametrize("kw", [dict(doc_tokens=1), dict(num_docs=0), dict(query_tokens=0),
                                dict(reuse_fraction=1.5), dict(reuse_fraction=-0.1), dict(repeat_count=0),
                                dict(repeat_mode="zigzag")])
def test_invalid_specs(kw):
    with pytest.raises(ValueError):
        spec(**kw)


def test_percentiles_and_summary():
    assert ld.percentile([3.0], 95) == 3.0
    assert ld.percentile([1, 2, 3, 4], 50) == 2.5
    assert ld.percentile(list(range(101)), 95) == pytest.approx(95.0)
    assert ld.percentile([10, 0], 100) == 10
    assert math.isnan(ld.percentile([], 50))
    with pytest.raises(ValueError):
        ld.percentile([1], 101)
    st = ld.summarize_ttft([0.1, 0.2, 0.3, 0.4])
    assert st["n"] == 4 and st["mean"] == pytest.approx(0.25) and st["p50"] == pytest.approx(0.25)
    assert st["p95"] == pytest.approx(0.385) and st["min"] == 0.1 and st["max"] == 0.4
    assert ld.summarize_ttft([])["n"] == 0


PROM_BEFORE = """# HELP vllm:prefix_cache_queries_total x
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 100.0
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 10.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.7e9
vllm:kv_offload_load_bytes_total{transfer_type="a"} 5
vllm:num_requests_running{engine="0"} 0
"""
PROM_AFTER = """vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 300.0
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 10.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.8e9
vllm:kv_offload_load_bytes_total{transfer_type="a"} 105
vllm:kv_offload_load_bytes_total{transfer_type="b"} 20
vllm:external_prefix_cache_hits_total{engine="0"} 4096
kvtier_bytes_read_total 8192
vllm:num_requests_running{engine="0"} 1
vllm:kvtier_dram_entries 64
vllm:kv_offload_load_time_sum 0.5
vllm:kv_offload_load_time_count 2
"""


def test_metric_deltas():
    before, after = client.parse_prometheus(PROM_BEFORE), client.parse_prometheus(PROM_AFTER)
    assert before['vllm:prefix_cache_queries_total{engine="0",model_name="tiny"}'] == 100.0
    d = client.metric_deltas(before, after)
    assert d["vllm:prefix_cache_queries_total"] == 200.0
    assert d["vllm:prefix_cache_hits_total"] == 0.0
    assert d["vllm:kv_offload_load_bytes_total"] == 120.0
    assert d["vllm:external_prefix_cache_hits_total"] == 4096
    assert "vllm:prefix_cache_queries_created" not in d and "vllm:num_requests_running" not in d
    assert "vllm:kvtier_dram_entries" not in d
    assert d["vllm:kv_offload_load_time_sum"] == 0.5 and d["vllm:kv_offload_load_time_count"] == 2
    assert client.metric_gauges(after) == {"vllm:kvtier_dram_entries": 64}
    assert client.bytes_read(d) == 8192  # kvtier's own counter wins over vLLM's offload bytes
    del d["kvtier_bytes_read_total"]
    assert client.bytes_read(d) == 120.0
    assert client.bytes_read({}) is None


def test_summary_table(tmp_path, capsys):
    def res(label, mean, hits=None, nbytes=None):
        m = {}
        if hits is not None:
            m["vllm:external_prefix_cache_hits"] = hits
        if nbytes is not None:
            m["vllm:kv_offload_load_bytes"] = nbytes
        return {"label": label, "phases": {"query": {"ttft": ld.summarize_ttft([mean, mean]), "metrics": m}}}

    files = []
    for i, r in enumerate([res("recompute", 2.0), res("kvtier-disk", 0.5, 16384, 3 * 2**20),
                           res("kvtier-dram", 0.25, 16384, 2**20)]):
        f = tmp_path / f"{i}.json"
        f.write_text(json.dumps(r))
        files.append(str(f))
    assert ld_cli.main(["summarize", *files]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("config")
    assert "recompute" in out[2] and "1.00x" in out[2] and "2000.0" in out[2]
    assert "speedup (p50)" in out[0]
    assert "kvtier-disk" in out[3] and "4.00x" in out[3] and "3.0 MiB" in out[3] and "16384" in out[3]
    assert "8.00x" in out[4]


def test_runs_with_one_label_are_one_row_of_all_their_requests(tmp_path, capsys):
    """The demo runs each configuration once per document, interleaved: summarize pools the runs of a label."""
    def run(label, ttfts, hits):
        reqs = [{"ttft_s": t} for t in ttfts]
        return {"label": label, "phases": {"query": {"requests": reqs, "ttft": ld.summarize_ttft(ttfts),
                                                     "metrics": {"vllm:external_prefix_cache_hits": hits}}}}
    runs = [run("base", [1.0], 0), run("kv", [0.2], 10), run("base", [3.0], 0), run("kv", [0.4, 0.3], 20)]
    merged = ld_report.merge_runs(runs)
    assert [r["label"] for r in merged] == ["base", "kv"]
    kv = merged[1]["phases"]["query"]
    assert kv["ttft"]["n"] == 3 and abs(kv["ttft"]["p50"] - 0.3) < 1e-12
    assert kv["metrics"]["vllm:external_prefix_cache_hits"] == 30
    files = []
    for i, r in enumerate(runs):
        f = tmp_path / f"{i}.json"
        f.write_text(json.dumps(r))
        files.append(str(f))
    assert ld_cli.main(["summarize", *files]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 and out[3].split()[:2] == ["kv", "3"] and "6.67x" in out[3]  # 2.0 s / 0.3 s


def test_warm_docs_leave_documents_out_of_the_warmup_and_the_query_reports_ttft_per_class(monkeypatch):
    """--warm-docs: the warm-up sends only those documents; the query sends every one, marks each request cached or
    not, and summarizes TTFT per class (a fake server answers a prompt whose document it saw in 0.1 s, else 1 s)."""
    from kvtier.tools.longdoc import run as ld_run
    seen: set[tuple[int, ...]] = set()
    sent = []
    priorities = []

    class FakeServer:
        def __init__(self, url, model):
            pass

        def completion(self, prompt, max_tokens, priority=None):
            head = tuple(prompt[:64])
            cached = head in seen
            seen.add(head)
            sent.append(head)
            priorities.append((cached, priority))
            return {"ttft_s": 0.1 if cached else 1.0, "prompt_tokens": len(prompt)}

        def metrics(self, url=None):
            return None

        def reset_prefix_cache(self):
            return True

    monkeypatch.setattr(ld_run, "ApiClient", FakeServer)
    a = ld_cli.parser().parse_args(["--doc-tokens", "256", "--num-docs", "4", "--warm-docs", "0,2", "--quiet"])
    result = ld_run.run(a, log=lambda msg: None)
    warm, query = result["phases"]["warmup"], result["phases"]["query"]
    assert sorted(q["doc"] for q in warm["requests"]) == [0, 2]
    assert warm["ttft_by_class"] is None, "the warm-up has no uncached class to compare"
    assert {q["doc"]: q["cached"] for q in query["requests"]} == {0: True, 1: False, 2: True, 3: False}
    by = query["ttft_by_class"]
    assert (by["cached"]["n"], by["uncached"]["n"]) == (2, 2)
    assert by["cached"]["mean"] == pytest.approx(0.1) and by["uncached"]["mean"] == pytest.approx(1.0)
    assert query["ttft"]["n"] == 4
    assert {p for _, p in priorities} == {None}, "no --cached-priority: no request carries a priority"
    # --cached-priority: the cached documents' query requests carry it, nothing else does.
    seen.clear()
    priorities.clear()
    a = ld_cli.parser().parse_args(["--doc-tokens", "256", "--num-docs", "4", "--warm-docs", "0,2", "--quiet",
                                    "--cached-priority", "-1"])
    result = ld_run.run(a, log=lambda msg: None)
    assert sorted(priorities, key=str) == sorted([(False, None)] * 2 + [(True, -1)] * 2 + [(False, None)] * 2,
                                                 key=str), "warm-up: none; query: the two cached ones"
    assert result["cached_priority"] == -1


def test_warm_docs_out_of_range_are_refused():
    with pytest.raises(SystemExit):
        ld_cli.main(["--num-docs", "2", "--warm-docs", "0,5"])


def test_a_cached_priority_without_warm_docs_is_refused(capsys):
    with pytest.raises(SystemExit):
        ld_cli.main(["--num-docs", "2", "--cached-priority", "-1"])
    assert "--cached-priority needs --warm-docs" in capsys.readouterr().err
