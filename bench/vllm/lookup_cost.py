"""What one lookup of kvtier's vLLM manager costs the scheduler (vLLM asks chunk by chunk, for every waiting
request, on every step: docs/vllm-integration.md). Stores a request's chunks with the real engine, opens a second
manager on the root as a restarted server would, hands it the request as vLLM's scheduler does (note_request, then
on_new_request), and times passes of lookups over the request's chunks with streamed loads, gate off and on.

    scripts/setup_vllm.sh                                  # once; prints the venv
    cd tests/vllm && <venv>/bin/python ../../bench/vllm/lookup_cost.py --chunks 160,320

Needs kvtier installed in the venv (scripts/kvtier_install.sh). Prints one line per (chunks, gate) and, with --json,
writes them. The figures are microseconds on this machine's CPU; compare two trees in one run of each.
"""

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "vllm"))

import kvtier.vllm as kv  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key  # noqa: E402

import test_spec_unit as t  # noqa: E402  (its vLLM config, KV tensors and scheduler stand-ins)


class _Req:
    def __init__(self, req_id, hashes):
        self.request_id = req_id
        self.block_hashes = hashes
        self.num_prompt_tokens = len(hashes) * t.TOKENS + 1


def measure(chunks: int, reps: int) -> list[dict]:
    root = Path(tempfile.mkdtemp(prefix="kvtier-lookup-"))
    hashes = [hashlib.sha256(b"lookup" + i.to_bytes(4, "little")).digest() for i in range(chunks)]
    keys = [make_offload_key(h, 0) for h in hashes]
    pool = {"kvtier_pool_bytes": "512MiB"}
    spec = kv.KVTierSpec(t.make_config(root, bpc=1, engine_id="store", extra=pool))
    m, (_, kvc) = spec.get_manager(), t.make_kv(1)
    w = spec.get_worker(kvc)
    for i in range(0, chunks, 16):
        t._store(m, w, keys[i:i + 16], list(range(1, 1 + len(keys[i:i + 16]))), req=f"s{i}")
    deadline = time.monotonic() + 120
    while m.engine.stats()["disk_entries"] < chunks:  # published on disk
        if time.monotonic() > deadline:
            raise SystemExit(f"{chunks} chunks stored, {m.engine.stats()['disk_entries']} on disk after 120 s")
        time.sleep(0.05)
    m.shutdown()
    w.shutdown()
    out = []
    for gate in ("off", "on"):
        extra = dict(pool)
        if gate == "on":  # every load admitted: the gate's decision is made, then found again on every lookup
            extra["kvtier_thresholds_path"] = t._thresholds(root, 1, 1)
        m2 = kv.KVTierSpec(t.make_config(root, bpc=1, engine_id=f"query-{gate}", extra=extra)).get_manager()
        m2.streaming = True  # as compat._enable_streaming sets it with one KV cache group
        t._scheduler_on_new_request(m2, _Req("q", hashes))
        ctx = ReqContext(req_id="q")
        first = [m2.lookup(k, ctx) for k in keys]
        if any(r != LookupResult.HIT for r in first):
            raise SystemExit(f"expected {chunks} hits, got {sorted(set(map(str, first)))}")
        t0 = time.perf_counter()
        for _ in range(reps):
            for k in keys:
                m2.lookup(k, ctx)
        dt = time.perf_counter() - t0
        m2.shutdown()
        out.append({"chunks": chunks, "gate": gate, "reps": reps, "us_per_lookup": round(dt / (reps * chunks) * 1e6, 3),
                    "ms_per_request_pass": round(dt / reps * 1e3, 4)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", default="160,320", help="chunks per request (160: 40k tokens of 256)")
    ap.add_argument("--reps", type=int, default=200, help="passes over the request's chunks")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    rows = []
    for n in (int(x) for x in a.chunks.split(",")):
        for r in measure(n, a.reps):
            print(f"chunks {r['chunks']:4d} gate {r['gate']:3s}: {r['us_per_lookup']:.2f} us per lookup, "
                  f"{r['ms_per_request_pass']:.3f} ms per pass over the request", flush=True)
            rows.append(r)
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
