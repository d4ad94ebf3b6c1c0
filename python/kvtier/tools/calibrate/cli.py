"""`kvtier calibrate`'s command line (docs/calibration.md): which measurements to take, then the model, the
thresholds file, the report and the plots."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from kvtier.tiny_model import DEFAULTS
from kvtier.tools.calibrate.model import (MAP_MODELS, STATS, TIERS, build_model, json_safe, parse_bandwidths, summarize,
                                          thresholds, write_json)
from kvtier.tools.calibrate.offline import offline_recompute
from kvtier.tools.calibrate.plots import plot_min_bandwidth, plot_speedup_map
from kvtier.tools.calibrate.sweep import Progress, run_vllm
from kvtier.tools.calibrate.report import report

DEFAULT_SERVE_ARGS = ("--dtype bfloat16 --enforce-eager --block-size 16 --max-num-seqs 4 "
                      "--kv-cache-memory-bytes 1073741824 --enable-prefix-caching --seed 0")


def model_kv_bytes_per_token(model_dir: str | None, dtype_bytes: int = 2) -> int | None:
    """KV bytes per token from a model directory: kvtier_tiny_model.json, else config.json
    (2 * layers * kv_heads * head_dim * dtype_bytes)."""
    if not model_dir:
        return None
    p = Path(model_dir)
    try:
        info = json.loads((p / "kvtier_tiny_model.json").read_text())
        return int(info["kv_bytes_per_token_bf16"])
    except (OSError, KeyError, ValueError):
        pass
    try:
        c = json.loads((p / "config.json").read_text())
        c = c.get("text_config", c)
        layers = c["num_hidden_layers"]
        heads = c.get("num_attention_heads")
        kvh = c.get("num_key_value_heads") or heads
        hd = c.get("head_dim") or c["hidden_size"] // heads
        return int(2 * layers * kvh * hd * dtype_bytes)
    except (OSError, KeyError, ValueError, TypeError, ZeroDivisionError):
        return None


def _int_list(text: str) -> list[int]:
    out = []
    for x in text.split(","):
        x = x.strip().lower()
        if not x:
            continue
        mult = 1024 if x.endswith("k") else 1
        out.append(int(float(x.rstrip("k")) * mult))
    return out


def _float_list(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvtier calibrate", description="Measure the break-even frontier (f(D), g(P) "
                                "per tier), write the thresholds file and plot it. See docs/calibration.md.")
    src = p.add_argument_group("where the measurements come from")
    src.add_argument("--serve", metavar="MODEL_DIR", help="start vLLM with kvtier on this model (restarts it to "
                     "measure the disk tier)")
    src.add_argument("--url", help="a running vLLM with kvtier (started with VLLM_SERVER_DEV_MODE=1)")
    src.add_argument("--offline-recompute", metavar="MODEL_DIR",
                     help="measure f(D) with transformers on this model instead of through vLLM")
    src.add_argument("--random-weights", action="store_true", help="--offline-recompute: config.json only")
    src.add_argument("--device", default=None, help="--offline-recompute: torch device (default cuda if present)")
    src.add_argument("--replot", metavar="JSON", nargs="+",
                     help="recompute the model and redraw from measurements.json files (several: samples pooled)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--model", default="tiny", help="served model name (and the thresholds file's model)")
    p.add_argument("--model-tag", default=None,
                   help="model written to the thresholds file; the gate warns when it differs from the server's "
                        "kvtier_model_tag, else its --model (default: the --serve/--offline-recompute directory, "
                        "else --model)")
    p.add_argument("--sizes", type=_int_list, default=[512, 1024, 2048, 4096], help="document sizes (tokens; 4k ok)")
    p.add_argument("--fractions", type=_float_list, default=[0.25, 0.5, 0.75, 1.0],
                   help="cached prefix fractions (1.0 is always added: it gives g)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per point (medians)")
    p.add_argument("--stat", choices=tuple(STATS), default="median",
                   help="statistic over the repetitions (min: the least disturbed sample on a busy machine)")
    p.add_argument("--map-model", choices=MAP_MODELS, default="paper",
                   help="speedup model of the map and break-even fractions: paper = g(P) + f(D-P) vs f(D); "
                        "suffix = g(P) + f(D) - f(P) vs f(D) (the rest attends to the prefix)")
    p.add_argument("--tiers", default="dram,disk", help="tiers to measure: dram,disk")
    p.add_argument("--max-tokens", type=int, default=1, help="output tokens per request")
    p.add_argument("--chunk-tokens", type=int, default=256, help="kvtier chunk size (block_size) in tokens")
    p.add_argument("--kv-bytes-per-token", type=int, default=None,
                   help="KV bytes per token (default: from the model directory)")
    p.add_argument("--tier-bandwidth", default=None,
                   help="model g for tiers not measured: tier=bytes/s,... (e.g. disk=6.5G)")
    p.add_argument("--reference-bw", default=None,
                   help="reference lines on the bandwidth plot: name=bytes/s,... (e.g. 'PM9A3=6.5G')")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--salt", type=int, default=0, help="varies every prompt (to rerun against the same root)")
    p.add_argument("--vocab-size", type=int, default=DEFAULTS["vocab"])
    p.add_argument("--settle-s", type=float, default=0.5, help="pause after a store before the DRAM queries")
    p.add_argument("--no-quiesce", dest="quiesce", action="store_false",
                   help="do not wait for kvtier's writes to finish before each measured request (faster, noisier)")
    p.add_argument("--quiesce-timeout-s", type=float, default=30.0)
    p.add_argument("--flush-tokens", type=int, default=0,
                   help="--url with the disk tier: filler tokens that push the documents out of the DRAM tier")
    srv = p.add_argument_group("--serve")
    srv.add_argument("--vllm-python", default=sys.executable, help="python of vLLM's venv (default: this one)")
    srv.add_argument("--root", default=None, help="kvtier root (default OUT/kvtier-root, emptied first)")
    srv.add_argument("--keep-root", action="store_true", help="do not empty the root first")
    srv.add_argument("--pool-bytes", default="512MiB", help="kvtier_pool_bytes")
    srv.add_argument("--serve-args", default=DEFAULT_SERVE_ARGS, help="more vLLM arguments (one string)")
    srv.add_argument("--serve-gpu", action="store_true",
                     help="a CUDA vLLM: the servers get no CPU-platform environment (OMP threads, thread binding, "
                          "tcmalloc; kvtier.tools.launcher.server_env)")
    srv.add_argument("--start-timeout-s", type=float, default=600)
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    return p


def finish(a: argparse.Namespace, samples: list[dict], meta: dict, log) -> dict:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    kvb = a.kv_bytes_per_token or meta.get("kv_bytes_per_token") \
        or model_kv_bytes_per_token(a.serve or a.offline_recompute)
    if not kvb:
        raise SystemExit("kvtier calibrate: KV bytes per token unknown: pass --kv-bytes-per-token")
    summary = summarize(samples, a.stat)
    model = build_model(summary, kvb, a.chunk_tokens, parse_bandwidths(a.tier_bandwidth), a.map_model)
    model["measured_with"] = meta.get("measured_with")
    model["statistic"] = a.stat
    name = a.model_tag or meta.get("model") or a.model
    th = json_safe(thresholds(model, name))
    write_json(out / "thresholds.json", th)
    meta = dict(meta, model=name, kv_bytes_per_token=kvb, tokens_per_chunk=a.chunk_tokens)
    write_json(out / "measurements.json", json_safe({"meta": meta, "samples": samples, "model": model}))
    log(report(model, th))
    if not a.no_plots:
        title = f"{name}, {meta.get('measured_with', '')}".strip(", ")
        plot_speedup_map(model, out / "speedup_map.png", title)
        plot_min_bandwidth(model, out / "min_bandwidth.png", title, parse_bandwidths_any(a.reference_bw))
        log(f"plots: {out / 'speedup_map.png'}, {out / 'min_bandwidth.png'}")
    log(f"thresholds: {out / 'thresholds.json'}")
    return th


def parse_bandwidths_any(text: str | None) -> dict[str, float]:
    out = {}
    for part in (text or "").split(","):
        if "=" not in part:
            continue
        name, _, val = part.partition("=")
        val = val.strip()
        mult = {"G": 1e9, "M": 1e6, "K": 1e3}.get(val[-1:].upper(), 1.0)
        out[name.strip()] = float(val[:-1] if mult != 1.0 else val) * mult
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    a.tiers = [t.strip() for t in a.tiers.split(",") if t.strip()]
    for t in a.tiers:
        if t not in TIERS:
            p.error(f"--tiers: unknown tier {t!r} (tiers: {', '.join(TIERS)})")
    if 1.0 not in a.fractions:
        a.fractions = sorted(set(a.fractions) | {1.0})
    if any(not 0 < fr <= 1 for fr in a.fractions):
        p.error("--fractions must be in (0, 1]")
    if not a.sizes or any(d < 32 for d in a.sizes):
        p.error("--sizes must be >= 32 tokens")
    a.sizes = sorted(set(a.sizes))
    if a.reps < 1:
        p.error("--reps must be >= 1")
    try:
        parse_bandwidths(a.tier_bandwidth)
    except ValueError as e:
        p.error(str(e))
    modes = [x for x in (a.serve, a.url, a.replot) if x]
    if len(modes) > 1:
        p.error("choose one of --serve, --url, --replot")
    if not modes and not a.offline_recompute:
        p.error("nothing to measure: give --serve MODEL_DIR, --url URL, --offline-recompute MODEL_DIR or --replot")
    if a.url and "disk" in a.tiers and a.flush_tokens <= 0:
        print("kvtier calibrate: --url without --flush-tokens cannot force loads from disk; measuring dram only",
              file=sys.stderr)
        a.tiers = [t for t in a.tiers if t != "disk"]

    def log(msg: str) -> None:
        print(msg, flush=True)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.replot:
        samples, meta = [], {}
        for i, path in enumerate(a.replot):
            with open(path) as fh:
                data = json.load(fh)
            for smp in data["samples"]:
                samples.append(dict(smp, run=i) if len(a.replot) > 1 else smp)
            m = data.get("meta", {})
            if meta and m.get("tokens_per_chunk") != meta.get("tokens_per_chunk"):
                p.error(f"--replot: {path} has another chunk size than {a.replot[0]}")
            meta = meta or dict(m)
        if len(a.replot) > 1:
            meta["pooled_runs"] = [str(x) for x in a.replot]
            meta["reps"] = sum(1 for smp in samples if smp["kind"] == "cold") // max(1, len(meta.get("sizes", [1])))
        a.chunk_tokens = meta.get("tokens_per_chunk", a.chunk_tokens)
        finish(a, samples, meta, log)
        return 0
    t_start = time.monotonic()
    samples: list[dict] = []
    meta: dict = {"sizes": a.sizes, "fractions": a.fractions, "reps": a.reps, "tiers": a.tiers,
                  "max_tokens": a.max_tokens, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "argv": sys.argv[1:] if argv is None else list(argv),
                  # what the gate compares with: kvtier_model_tag, else vLLM's model (the path given to --model)
                  "model": a.model_tag or a.serve or a.offline_recompute or a.model}
    phases = {}
    if a.serve or a.url:
        samples, phases = run_vllm(a, log)
        meta["measured_with"] = "vLLM + kvtier" + (" (--serve)" if a.serve else " (--url)")
    if a.offline_recompute:
        prog = Progress(len(a.sizes) * a.reps, "offline f(D)", enabled=not a.no_progress)
        try:
            off = offline_recompute(a.offline_recompute, a.sizes, a.reps, a.device, a.random_weights, prog)
        finally:
            prog.close()
        samples = [s for s in samples if s["kind"] != "cold"] + off
        meta["measured_with"] = (meta.get("measured_with", "") + "; f(D) offline (transformers)").lstrip("; ")
    meta["phase_metrics"] = phases
    meta["wall_s"] = round(time.monotonic() - t_start, 1)
    for name, m in phases.items():
        keys = ("kvtier_lookup_hits_dram", "kvtier_lookup_hits_disk", "kvtier_lookup_misses", "kvtier_bytes_read",
                "external_prefix_cache_hits")
        shown = {k.split(":")[-1]: v for k, v in m.items() if any(x in k for x in keys)}
        log(f"server {name} counters: " + ", ".join(f"{k}={v:g}" for k, v in sorted(shown.items())))
    finish(a, samples, meta, log)
    log(f"calibration took {meta['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
