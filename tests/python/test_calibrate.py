"""Unit tests of `kvtier calibrate` (no server): interpolation, the frontier, the thresholds file, plots."""

import json
import math
import os
import subprocess
import sys

import pytest

import kvtier
from kvtier import tiny_model
from kvtier.tools.calibrate import cli as cal_cli, model as cal_model, plots as cal_plots, sweep as cal_sweep

KVB = 8192  # KV bytes per token of the tiny model
SIZES = [512, 1024, 2048, 4096]
FRACS = [0.25, 0.5, 0.75, 1.0]


def f_true(d):  # convex recompute time: linear + quadratic (attention) term, seconds
    return 2e-4 * d + 5e-8 * d * d


def g_true(p, t0=0.05, bw=1e8):  # hit time: overhead + bytes / bandwidth
    return t0 + p * KVB / bw


def synthetic_samples(tiers=("dram", "disk"), bws=None, reps=3, t0=0.05):
    bws = bws or {"dram": 1e8, "disk": 4e7}
    out = []
    for r in range(reps):
        jitter = 1.0 + 0.01 * (r - 1)
        for i in range(reps):
            out.append({"kind": "overhead", "tier": None, "doc_tokens": 16, "ttft_s": t0 * jitter, "rep": i})
        for d in SIZES:
            out.append({"kind": "cold", "tier": None, "doc_tokens": d, "fraction": None, "ttft_s": f_true(d) * jitter,
                        "rep": r})
            for t in tiers:
                for fr in FRACS:
                    p = round(fr * d)
                    h = g_true(p, t0, bws[t]) + f_true(d) - f_true(p)
                    out.append({"kind": "hit", "tier": t, "doc_tokens": d, "fraction": fr, "prefix_tokens": p,
                                "ttft_s": h * jitter, "rep": r})
    return out


def test_curve_interpolates_and_extends():
    cu = cal_model.Curve([(0, 0.0), (10, 1.0), (20, 3.0)])
    assert cu(5) == pytest.approx(0.5)
    assert cu(15) == pytest.approx(2.0)
    assert cu(30) == pytest.approx(5.0)  # extended with the last segment
    assert cal_model.Curve([(0, 1.0), (10, 2.0), (20, 1.0)])(40) == 1.0  # a falling last segment is held flat
    assert cu(-10) == 0.0  # never below 0
    assert cal_model.Curve([(4, 2.0)])(100) == 2.0
    with pytest.raises(ValueError):
        cal_model.Curve([])
    with pytest.raises(ValueError):
        cal_model.Curve([(1, 1.0), (1, 2.0)])


def test_summarize_takes_medians():
    s = cal_model.summarize([
        {"kind": "cold", "doc_tokens": 512, "ttft_s": 1.0}, {"kind": "cold", "doc_tokens": 512, "ttft_s": 9.0},
        {"kind": "cold", "doc_tokens": 512, "ttft_s": 2.0},
        {"kind": "hit", "tier": "dram", "doc_tokens": 512, "fraction": 1.0, "ttft_s": 0.5},
        {"kind": "overhead", "doc_tokens": 16, "ttft_s": 0.1}, {"kind": "overhead", "doc_tokens": 16, "ttft_s": 0.3},
    ])
    assert s["f"] == {512: 2.0}
    assert s["h"] == {"dram": {(512, 1.0): 0.5}}
    assert s["t0"] == pytest.approx(0.2)


def test_break_even_fraction_matches_the_inequality():
    f = cal_model.recompute_curve({d: f_true(d) for d in SIZES})
    g = cal_model.hit_curve({d: g_true(d) for d in SIZES}, 0.05)
    for d in SIZES:
        p = cal_model.break_even_fraction(f, g, d)
        assert p is not None and 0 < p <= 1
        # just above the line loading wins, just below it loses
        assert cal_model.speedup(f, g, d, min(1.0, p + 1e-3)) >= 1.0
        assert cal_model.speedup(f, g, d, p - 1e-3) < 1.0
    fr = [cal_model.break_even_fraction(f, g, d) for d in SIZES]
    assert fr == sorted(fr, reverse=True)  # bigger documents need a smaller reused fraction (paper fig. 6)


def test_break_even_never_when_loading_is_slower():
    f = cal_model.recompute_curve({d: f_true(d) for d in SIZES})
    g = cal_model.hit_curve({d: 10 * f_true(d) + 1 for d in SIZES}, 1.0)
    assert all(cal_model.break_even_fraction(f, g, d) is None for d in SIZES)
    assert cal_model.min_load_tokens(f, g, max(SIZES), 256) == cal_model.NEVER


def test_min_load_tokens_is_the_chunk_rounded_crossing():
    f = cal_model.recompute_curve({d: f_true(d) for d in SIZES})
    g = cal_model.hit_curve({d: g_true(d) for d in SIZES}, 0.05)
    n = cal_model.min_load_tokens(f, g, max(SIZES), 256)
    assert n % 256 == 0
    exact = next(p for p in range(1, 4097) if g(p) <= f(p))
    assert n - 256 < exact <= n
    assert cal_model.min_load_tokens(f, g, max(SIZES), 1) == exact


def test_measured_break_even():
    assert cal_model.measured_break_even([0.25, 0.5, 0.75, 1.0], [0.5, 0.8, 1.2, 2.0]) == pytest.approx(0.625)
    assert cal_model.measured_break_even([0.25, 0.5], [1.1, 2.0]) == 0.25
    assert cal_model.measured_break_even([0.25, 0.5], [0.9, 0.95]) is None
    assert cal_model.measured_break_even([0.25, 0.5], [None, 1.5]) == 0.5


def test_thresholds_file(tmp_path):
    model = cal_model.build_model(cal_model.summarize(synthetic_samples()), KVB, 256)
    th = cal_model.json_safe(cal_model.thresholds(model, "tiny"))
    cal_model.write_json(tmp_path / "thresholds.json", th)
    back = json.loads((tmp_path / "thresholds.json").read_text())
    assert back["version"] == 1 and back["model"] == "tiny" and back["tokens_per_chunk"] == 256
    dram, disk = back["tiers"]["dram"]["min_load_tokens"], back["tiers"]["disk"]["min_load_tokens"]
    assert isinstance(dram, int) and isinstance(disk, int)
    assert 0 < dram <= disk  # the slower tier needs longer prefixes
    assert back["store_min_tokens"] == min(dram, disk)
    fr = back["frontier"]
    assert fr["sizes"] == SIZES and len(fr["f"]) == 4
    for t in ("dram", "disk"):
        e = fr["tiers"][t]
        assert len(e["break_even_fraction"]) == 4 and e["source"] == "measured"
        assert len(e["measured_speedup"]) == 4 and len(e["measured_speedup"][0]) == 4
        # the synthetic hits follow g(P) + f(D) - f(P), a load never beats compute below min_load_tokens
        assert e["measured_speedup"][-1][-1] > 1.0
    assert all(b > 0 for b in fr["min_bandwidth_Bps"])
    # min bandwidth falls with document size (prefill grows faster than the KV it makes)
    assert fr["min_bandwidth_Bps"] == sorted(fr["min_bandwidth_Bps"], reverse=True)


def test_thresholds_missing_tier_and_modeled_tier():
    s = cal_model.summarize(synthetic_samples(tiers=("dram",)))
    th = cal_model.thresholds(cal_model.build_model(s, KVB, 256), "m")
    assert th["tiers"]["disk"]["min_load_tokens"] == th["tiers"]["dram"]["min_load_tokens"]
    assert "disk" in th["frontier"]["estimated"]
    model = cal_model.build_model(s, KVB, 256, bandwidths={"disk": 1e7})
    assert model["tiers"]["disk"]["source"].startswith("modeled")
    th2 = cal_model.thresholds(model, "m")
    assert "estimated" not in th2["frontier"]
    assert th2["tiers"]["disk"]["min_load_tokens"] > th2["tiers"]["dram"]["min_load_tokens"]


def test_parse_bandwidths():
    assert cal_model.parse_bandwidths("disk=6.5G, dram=5e10") == {"disk": 6.5e9, "dram": 5e10}
    with pytest.raises(ValueError):
        cal_model.parse_bandwidths("tape=1G")
    assert cal_cli._int_list("512,1k,4K") == [512, 1024, 4096]


def test_plots(tmp_path):
    model = cal_model.build_model(cal_model.summarize(synthetic_samples()), KVB, 256)
    a = cal_plots.plot_speedup_map(model, tmp_path / "map.png", "synthetic")
    b = cal_plots.plot_min_bandwidth(model, tmp_path / "bw.png", "synthetic", {"drive": 2e8})
    for p in (a, b):
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_prompts_share_exactly_the_prefix():
    doc = cal_sweep.doc_prompt(0, "dram", 512, 0, 0, 8192)
    assert len(doc) == 512 and doc[0] == tiny_model.BOS_ID
    for p in (1, 128, 256, 511):
        q = cal_sweep.hit_prompt(doc, p, 0, 0, 8192)
        assert len(q) == 512 and q[:p] == doc[:p] and q[p] != doc[p]
    assert cal_sweep.hit_prompt(doc, 512, 0, 0, 8192) == doc
    assert cal_sweep.doc_prompt(0, "disk", 512, 0, 0, 8192) != doc


def test_replot_cli_writes_everything(tmp_path):
    meas = {"meta": {"tokens_per_chunk": 256, "kv_bytes_per_token": KVB, "model": "tiny"},
            "samples": synthetic_samples()}
    (tmp_path / "m.json").write_text(json.dumps(meas))
    out = tmp_path / "out"
    assert cal_cli.main(["--replot", str(tmp_path / "m.json"), "--out", str(out), "--no-progress"]) == 0
    for name in ("thresholds.json", "measurements.json", "speedup_map.png", "min_bandwidth.png"):
        assert (out / name).stat().st_size > 0
    th = json.loads((out / "thresholds.json").read_text())
    assert th["version"] == 1 and set(th["tiers"]) == {"dram", "disk"}


def test_import_needs_neither_vllm_nor_torch():
    code = ("import sys, kvtier.calibrate, kvtier.replay, kvtier.bench_longdoc, kvtier.tools.launcher; "
            "print(any(m.split('.')[0] in ('vllm', 'torch', 'matplotlib') for m in sys.modules))")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(kvtier.__file__)), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "False"


def test_progress_without_tqdm(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    p = cal_sweep.Progress(3, "t")
    for _ in range(3):
        p.update("x")
    p.close()
    assert "3/3" in capsys.readouterr().err


def test_hit_curve_without_t0_extends_the_first_segment():
    g = cal_model.hit_curve({128: 0.05, 256: 0.10}, None)
    assert g(0) == pytest.approx(0.0) and g(64) == pytest.approx(0.025)
    g = cal_model.hit_curve({128: 0.05, 256: 0.10}, 0.5)  # t0 above the fastest hit: capped at it
    assert g(0) == pytest.approx(0.05)


def test_stat_min():
    samples = [{"kind": "cold", "doc_tokens": 512, "ttft_s": v} for v in (3.0, 1.0, 2.0)]
    assert cal_model.summarize(samples, "min")["f"] == {512: 1.0}
    with pytest.raises(ValueError):
        cal_model.summarize(samples, "mean")


def test_suffix_model():
    f = cal_model.recompute_curve({d: f_true(d) for d in SIZES})
    g = cal_model.hit_curve({d: g_true(d) for d in SIZES}, 0.05)
    d, p = 4096, 0.5
    assert cal_model.speedup(f, g, d, p, "suffix") == pytest.approx(f(d) / (g(p * d) + f(d) - f(p * d)))
    # with a convex f the rest of the prompt costs more than f(D - P): the suffix model is the more cautious
    assert cal_model.speedup(f, g, d, p, "suffix") < cal_model.speedup(f, g, d, p, "paper")
    be = cal_model.break_even_fraction(f, g, d, kind="suffix")
    exact = next(x for x in range(1, 4097) if g(x) <= f(x))
    assert be * d == pytest.approx(exact, abs=16)  # the suffix frontier is min_load_tokens / D


def test_serve_gpu_gives_the_servers_no_cpu_platform_settings(tmp_path, monkeypatch):
    """--serve starts vLLM with the CPU platform's environment (thread binding, OMP threads) unless --serve-gpu says
    the vLLM is a CUDA one (headline.py calibrate on the GPU box passes it)."""
    seen = []

    class Server:
        def __init__(self, argv, env, *args, **kwargs):
            seen.append(env)

        def start(self):
            return self

    monkeypatch.setattr(cal_sweep, "VllmServer", Server)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    for extra in ([], ["--serve-gpu"]):
        a = cal_cli.parser().parse_args(["--serve", str(tmp_path), "--out", str(tmp_path / "o"), *extra])
        cal_sweep.start_server(a, tmp_path / "root", 4096, tmp_path / "log.txt")
    assert seen[0]["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and "OMP_NUM_THREADS" in seen[0]
    assert "VLLM_CPU_OMP_THREADS_BIND" not in seen[1]
