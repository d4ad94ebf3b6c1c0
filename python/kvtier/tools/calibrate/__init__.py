"""`kvtier calibrate`: measure the break-even frontier of external KV caching on this machine and model (SPEC G2).

    kvtier calibrate --serve MODEL_DIR --out DIR [--sizes 512,1024,2048,4096] [--fractions 0.25,0.5,0.75,1]
    kvtier calibrate --url http://127.0.0.1:8000 --model NAME --out DIR [--tiers dram] [--flush-tokens N]
    kvtier calibrate --offline-recompute MODEL_DIR --tier-bandwidth disk=6.5e9,dram=50e9 --out DIR
    kvtier calibrate --replot DIR/measurements.json --out DIR

Terms (paper, section 4.1): D document size in tokens, P cached prefix in tokens, f(D) cold TTFT (full compute and
store), g(P) cache-hit TTFT of a fully cached P-token prompt, per source tier. Caching pays when
g(P) + f(D - P) < f(D).

What is measured against vLLM with kvtier (streamed TTFT, greedy, `--max-tokens` output tokens):

* f(D): unique D-token prompts (BOS + pseudo-random words of the tiny model's vocabulary), each sent once.
* DRAM tier: right after a document was computed (and stored by kvtier), vLLM's own prefix cache is dropped
  (POST /reset_prefix_cache, server started with VLLM_SERVER_DEV_MODE=1) and a D-token prompt whose first
  round(fraction * D) tokens are the document's is sent: the prefix is loaded from kvtier's DRAM tier.
* disk tier: one more document per (D, fraction, repetition), stored on the first server; the server is then
  restarted on the same root (a cold DRAM tier), and each query loads its prefix from disk. Against a running server
  (--url) there is no restart: --flush-tokens sends that many tokens of filler prompts after the stores to push the
  documents out of the DRAM tier (use more than the pool holds).
* the per-request overhead t0: median TTFT of a 16-token prompt.

Every value is the median of --reps repetitions (--stat min: the minimum). g(P) is the full-hit TTFT (fraction 1); the other fractions are
measured too and drawn on the map to check the model. The model is interpolated piecewise linearly: f through
(0, 0) and the measured sizes, g through (0, min(t0, g(smallest))) and the measured sizes, both extended linearly
past the largest size. From it:

* the speedup map s(D, p) = f(D) / (g(pD) + f((1 - p)D)) and, per document size, the break-even fraction (the
  smallest p with s >= 1), per tier;
* min_load_tokens per tier for the gate: the smallest P with g(P) <= f(P), rounded up to a whole chunk. A load of
  P tokens saves at least f(P) of compute whatever follows the prefix (causal attention, convex f), so loads at
  or above it never lose under the model; 2**31 - 1 when no measured size pays (the gate then always recomputes);
* the minimum storage bandwidth per document size: KV bytes of D tokens / (f(D) - t0) (the paper's budget
  f(D) - (g(D) - t_copy(D)), with the non-transfer part of a hit taken as t0, capped at the fastest measured
  hit), next to KV bytes / f(D) and each tier's achieved rate KV bytes / g(D) (a lower bound: g includes the
  request's own overhead).

Outputs in --out: thresholds.json (format: docs/break-even.md), measurements.json (raw samples and the model),
speedup_map.png, min_bandwidth.png. --offline-recompute measures f(D) with transformers instead (a forward pass
of D tokens, as shared/baselines/h200_baseline.py does); g then comes from a server or from --tier-bandwidth
(g(P) = t0 + KV bytes / bandwidth). This module imports neither vLLM nor torch unless asked to.

Modules: ``model`` (the frontier model and the thresholds file, pure), ``report`` and ``plots``, ``sweep`` (the
measurements against vLLM), ``offline`` (f(D) with transformers), ``cli`` (the command line, `kvtier calibrate`).
The package exports what other tools use (bench/gpu/frontier.py). None of it imports vLLM; torch and transformers
only inside offline_recompute.
"""

from kvtier.tools.calibrate.model import (NEVER, TIERS, Curve, break_even_fraction, build_model, hit_curve, json_safe,
                                          min_load_tokens, recompute_curve, speedup, summarize, thresholds, write_json)
from kvtier.tools.calibrate.offline import offline_recompute
from kvtier.tools.calibrate.plots import plot_min_bandwidth, plot_speedup_map
from kvtier.tools.calibrate.report import report

__all__ = ["NEVER", "TIERS", "Curve", "break_even_fraction", "build_model", "hit_curve", "json_safe",
           "min_load_tokens", "offline_recompute", "plot_min_bandwidth", "plot_speedup_map", "recompute_curve",
           "report", "speedup", "summarize", "thresholds", "write_json"]
