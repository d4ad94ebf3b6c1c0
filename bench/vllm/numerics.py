"""How stable are the tiny model's greedy outputs under vLLM alone (no connector)? The evidence behind the float32
choice of the end-to-end tests (tests/vllm/server.py, docs/vllm-integration.md).

For each test prompt (the ones of tests/vllm/test_e2e_server.py) the prompt is completed once as the reference,
then again in variants that change only the order of vLLM's summation: its own prefix cache warmed with the first
P tokens (P = 16, 160, 256, 528, ... so the rest is computed against cached KV), or beside a concurrent request.
Then, as the check's sensitivity, variants that really change the context: one prompt token changed, one chunk of
256 tokens replaced by another prompt's. Prints per variant whether the text is the same and the largest logprob
difference, then a summary line.

    scripts/setup_vllm.sh                        # once; prints the venv
    HF_HUB_OFFLINE=1 PYTHONHASHSEED=0 <venv>/bin/python bench/vllm/numerics.py --dtype bfloat16
    HF_HUB_OFFLINE=1 PYTHONHASHSEED=0 <venv>/bin/python bench/vllm/numerics.py --dtype float32

About 2 minutes per dtype on 2 cores. The tiny model is built as the tests build it (tests/vllm/conftest.py).
"""

import argparse
import json
import os
import sys
import tempfile
import threading

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "vllm"))
sys.path.insert(0, os.path.join(REPO, "python"))

from kvtier.tiny_model import DEFAULTS, synthetic_token_ids  # noqa: E402
from server import Server, tiny_model_dir  # noqa: E402

PROMPTS = {"other": synthetic_token_ids(1100, seed=12), "long": synthetic_token_ids(3000, seed=11),
           "long2": synthetic_token_ids(3000, seed=13)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--json", help="write every variant's result here")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, \
            Server(tiny_model_dir(), os.path.join(tmp, "server.log"), extra_args=["--dtype", a.dtype]) as s:
        s.wait_healthy()

        def record(name, kind, variant, got, ref):
            diff = max(abs(x - y) for x, y in zip(got.logprobs, ref.logprobs))
            rows.append({"prompt": name, "kind": kind, "variant": variant, "same_text": got.text == ref.text,
                         "max_logprob_diff": diff, "text": got.text})
            print(f"{a.dtype:8} {name:6} {kind:11} {variant:22} {'same' if got.text == ref.text else 'DIFFERS':8}"
                  f" max |d logprob| {diff:.2e}", flush=True)

        for name, toks in PROMPTS.items():
            s.reset_prefix_cache()
            ref = s.complete(toks)
            print(f"{a.dtype:8} {name:6} reference   {ref.text!r}", flush=True)
            for p in sorted(set(list(range(256, len(toks), 256)) + [16, 160, 528, 1040])):
                s.reset_prefix_cache()
                s.complete(toks[:p], max_tokens=1)
                record(name, "order", f"{p} tokens cached", s.complete(toks), ref)
            s.reset_prefix_cache()
            other = PROMPTS["long2" if name != "long2" else "long"]
            t = threading.Thread(target=lambda: s.complete(other, max_tokens=30))
            t.start()
            got = s.complete(toks)
            t.join()
            record(name, "order", "beside another request", got, ref)
            for pos in (1, len(toks) // 3, len(toks) - 100):
                v = list(toks)
                v[pos] = v[pos] + 1 if v[pos] + 1 < DEFAULTS["vocab"] else v[pos] - 1
                s.reset_prefix_cache()
                record(name, "context", f"token {pos} changed", s.complete(v), ref)
            v = list(toks)
            v[256:512] = other[256:512]
            s.reset_prefix_cache()
            record(name, "context", "chunk 1 replaced", s.complete(v), ref)
    order = [r for r in rows if r["kind"] == "order"]
    ctx = [r for r in rows if r["kind"] == "context"]
    print(f"{a.dtype}: reorderings with another text: {sum(not r['same_text'] for r in order)} of {len(order)}, "
          f"largest logprob difference {max(r['max_logprob_diff'] for r in order):.2e}; real context changes: "
          f"smallest logprob difference {min(r['max_logprob_diff'] for r in ctx):.2e}, text unchanged in "
          f"{sum(r['same_text'] for r in ctx)} of {len(ctx)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"dtype": a.dtype, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
