"""Acceptance runs of the DRAM tier, preload and break-even gate (issue 3) on real vLLM (CPU platform, tiny model).

    $VLLM_VENV/bin/python bench/tier/acceptance.py preload   # query TTFT with preload off vs on, under queueing,
                                                             # 8 fresh servers in ABBA order (about 8 minutes)
    $VLLM_VENV/bin/python bench/tier/acceptance.py bound     # round-robin multi-turn: disk bytes vs bytes needed
    $VLLM_VENV/bin/python bench/tier/acceptance.py gate      # thresholds file: short prompts recomputed, outputs same
    $VLLM_VENV/bin/python bench/tier/acceptance.py all

scripts/test_vllm.sh installs kvtier into the pinned vLLM venv first; this script only drives servers
(tests/vllm/server.py) and prints figures. Every server is killed on exit. Figures go to docs/performance.md.
"""

import argparse
import concurrent.futures as cf
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "vllm"))

from server import Server, kvtier_transfer_config  # noqa: E402
from kvtier.tiny_model import synthetic_token_ids  # noqa: E402

CHUNK_TOKENS = 256


# The preload run's model: KV-heavy (8 layers x 16 KV heads x 128 = 64 KiB of KV per token, 8x the default tiny
# model) but cheap to prefill on a CPU (hidden 256), so that loading the documents is a large share of their TTFT.
PRELOAD_SHAPE = "layers=8,heads=16,kv_heads=16,head_dim=128"


def model_dir(shape: str = "") -> str:
    """The tiny model (tiny_model.py's default shape, or `shape`: "layers=8,kv_heads=16,..." of its flags), built
    once per source hash and shape under ~/.cache/kvtier/models."""
    import hashlib
    flags = []
    for kv in filter(None, shape.split(",")):
        k, v = kv.split("=")
        flags += ["--" + k.strip().replace("_", "-"), v.strip()]
    d = os.environ.get("KVTIER_MODEL_DIR") if not shape else None
    if not d:
        with open(os.path.join(REPO, "python", "kvtier", "tiny_model.py"), "rb") as f:
            h = hashlib.sha256(f.read()).hexdigest()[:12]
        tag = "".join(f"-{k[2:]}{v}" for k, v in zip(flags[::2], flags[1::2]))
        d = os.path.expanduser(f"~/.cache/kvtier/models/tiny-llama-{h}{tag}")
    if not os.path.exists(os.path.join(d, "kvtier_tiny_model.json")):
        subprocess.run([sys.executable, "-m", "kvtier.tiny_model", d, *flags], check=True, timeout=600)
    return d


def parse_size(v) -> int:
    m = re.fullmatch(r"(\d+)\s*([KMGT]?)(i?B)?", str(v).strip())
    if not m:
        raise ValueError(f"bad size {v!r}")
    return int(m.group(1)) << (10 * " KMGT".index(m.group(2) or " "))


def say(*a):
    print("[tier]", *a, flush=True)


def engine_stats(root: str, timeout_s: float = 10.0) -> dict:
    """The newest stats file the manager wrote (kvtier_stats_interval_s=1)."""
    d = os.path.join(root, ".kvtier-stats")
    deadline = time.monotonic() + timeout_s
    while True:
        files = [os.path.join(d, f) for f in os.listdir(d) if f.endswith(".json")] if os.path.isdir(d) else []
        if files:
            newest = max(files, key=os.path.getmtime)
            try:
                with open(newest) as f:
                    return json.load(f)
            except (OSError, ValueError):
                pass
        if time.monotonic() > deadline:
            return {}
        time.sleep(0.5)


def pool_slots(log_path: str) -> int:
    with open(log_path) as f:
        m = re.search(r"pool \S+ (\d+) slots x", f.read())
    return int(m.group(1)) if m else -1


def run_concurrent(server, prompts, concurrency, max_tokens=2):
    with cf.ThreadPoolExecutor(concurrency) as ex:
        return list(ex.map(lambda p: server.complete(p, max_tokens=max_tokens), prompts))


def settle(server, seconds=2.5):
    """Lets the last stores finish and the stats file catch up (vLLM steps only with work: poke it)."""
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        server.complete([1, 2, 3, 4], max_tokens=1)
        time.sleep(0.5)


# ------------------------------------------------------------------------------------------------------------------
def preload(work: str, args) -> dict:
    """Long documents on disk, cold DRAM tier, and lookups that come late: preload off vs on, in ABBA order.

    vLLM looks up a waiting request only when the scheduler reaches it with token budget left, and it examines
    the waiting queue every step while it can (a request pending on kvtier's reads holds no budget), so with idle
    budget demand promotions start as early as preload would. Late lookups are the case preload is for: here
    uncached "blocker" prompts arrive first and, with --max-num-batched-tokens below a blocker's length, their
    chunked prefill takes the whole token budget for several steps, so the document queries queued behind them are
    not looked up until the blockers are done. With preload (on_new_request) their chunks are read meanwhile.

    What makes the difference measurable (docs/performance.md): a KV-heavy tiny model (PRELOAD_SHAPE, 64 KiB per
    token) so that the documents' KV on disk is GBs (their load is a large share of their TTFT) while the blockers'
    CPU prefill stays short; a fresh server per measured run (cold DRAM tier; the documents were stored by a warm-up
    server); and the runs in the order of --order (default ABBA then BAAB: off, on, on, off, on, off, off, on) so
    that a drift over the invocation that is linear or quadratic in the run index cancels in the per-setting means.
    Blockers differ per run (nothing of them is cached); TTFT is measured for the document queries only.
    """
    md = model_dir(args.preload_shape)
    with open(os.path.join(md, "kvtier_tiny_model.json")) as f:
        kv_per_token = json.load(f)["kv_bytes_per_token_bf16"]
    root = os.path.join(work, "root-preload")
    os.makedirs(root)
    docs = [synthetic_token_ids(args.doc_tokens, seed=100 + i) for i in range(args.num_docs)]
    queries = [d + synthetic_token_ids(16, seed=900 + i)[1:] for i, d in enumerate(docs)]
    doc_chunks = args.num_docs * (args.doc_tokens // CHUNK_TOKENS)
    doc_bytes = doc_chunks * CHUNK_TOKENS * kv_per_token
    kv_cache = ["--kv-cache-memory-bytes", str(parse_size(args.kv_cache_bytes)),
                "--max-num-seqs", str(args.max_num_seqs)]
    say(f"preload: model {os.path.basename(md)} ({kv_per_token // 1024} KiB KV/token), {args.num_docs} documents x "
        f"{args.doc_tokens} tokens = {doc_chunks} chunks, {doc_bytes / 2**30:.2f} GiB on disk; {args.blockers} "
        f"blockers x {args.blocker_tokens} tokens, --max-num-batched-tokens {args.batched_tokens}, --max-num-seqs "
        f"{args.max_num_seqs}; order {args.order}")
    t_warm = time.monotonic()
    with Server(md, os.path.join(work, "preload-warm.log"),
                kvtier_transfer_config(root, kvtier_preload_max_inflight=0, kvtier_pool_bytes=args.preload_pool),
                extra_args=kv_cache + ["--max-num-batched-tokens", str(max(args.doc_tokens, 2048))]) as s:
        s.wait_healthy()
        run_concurrent(s, docs, 2, max_tokens=1)
        # every document chunk on disk before the measured servers start (stores complete asynchronously)
        deadline = time.monotonic() + 120
        while True:
            settle(s, 1.5)
            st = engine_stats(root)
            if (st.get("bytes_written") or 0) >= doc_bytes or time.monotonic() > deadline:
                break
    say(f"preload: warm-up stored {(st.get('bytes_written') or 0) / 2**30:.2f} GiB in "
        f"{time.monotonic() - t_warm:.0f} s")
    sched = kv_cache + ["--max-num-batched-tokens", str(args.batched_tokens)]
    runs = []
    for i, c in enumerate(args.order):
        k = args.preload_k if c == "1" else 0
        log = os.path.join(work, f"preload-run{i}-k{k}.log")
        blockers = [synthetic_token_ids(args.blocker_tokens, seed=7000 + 10 * i + b) for b in range(args.blockers)]
        cfg = kvtier_transfer_config(root, kvtier_preload_max_inflight=k, kvtier_pool_bytes=args.preload_pool)
        with Server(md, log, cfg, extra_args=sched) as s:
            s.wait_healthy()
            s.complete([1, 5, 6, 7], max_tokens=1)  # first-request costs outside the measurement
            t0 = time.monotonic()
            with cf.ThreadPoolExecutor(len(blockers) + len(queries)) as ex:
                bf = [ex.submit(s.complete, b, 1) for b in blockers]
                time.sleep(args.blocker_lead_s)  # the blockers are admitted and own the token budget
                qf = [ex.submit(s.complete, q, 2) for q in queries]
                res = [f.result() for f in qf]
                btt = sorted(f.result()[1] for f in bf)
            wall = time.monotonic() - t0
            ttfts = sorted(r[1] for r in res)
            settle(s, 2.5)
            st = engine_stats(root)
        mean = sum(ttfts) / len(ttfts)
        # Secondary figure: how long the documents take once the blockers are done (their first tokens, on the
        # clock of the blockers' submission, after the last blocker's first token).
        after = sum(args.blocker_lead_s + t for t in ttfts) / len(ttfts) - max(btt)
        # this server's engine counters (each server's engine starts from zero)
        delta = {c: st.get(c) or 0 for c in ("preload_started", "preload_used", "preload_wasted", "bytes_read")}
        r = {"run": i, "preload_max_inflight": k, "mean_ttft_s": mean, "p50_ttft_s": ttfts[len(ttfts) // 2],
             "max_ttft_s": ttfts[-1], "ttfts_s": ttfts, "wall_s": wall, "blocker_ttft_s": btt,
             "after_blockers_s": after, **delta}
        runs.append(r)
        say(f"run {i} preload {'on ' if k else 'off'} (K={k}): document query TTFT mean {mean * 1000:.0f} ms p50 "
            f"{r['p50_ttft_s'] * 1000:.0f} ms max {ttfts[-1] * 1000:.0f} ms (blockers' TTFT "
            f"{', '.join(f'{b * 1000:.0f}' for b in btt)} ms; documents' first tokens {after * 1000:.0f} ms after the "
            f"last blocker's), wall {wall:.1f} s, preload started/used/wasted {delta['preload_started']}/"
            f"{delta['preload_used']}/{delta['preload_wasted']}, read {delta['bytes_read'] / 1e6:.0f} MB")
    shutil.rmtree(root, ignore_errors=True)  # GBs of documents and blockers; the logs stay in the work dir
    out = {"config": {"model": os.path.basename(md), "kv_bytes_per_token": kv_per_token,
                      "num_docs": args.num_docs, "doc_tokens": args.doc_tokens, "doc_chunks": doc_chunks,
                      "doc_bytes": doc_bytes, "blockers": args.blockers, "blocker_tokens": args.blocker_tokens,
                      "batched_tokens": args.batched_tokens, "max_num_seqs": args.max_num_seqs,
                      "blocker_lead_s": args.blocker_lead_s,
                      "preload_pool": args.preload_pool, "kv_cache_bytes": args.kv_cache_bytes,
                      "preload_k": args.preload_k, "order": args.order},
           "runs": runs}
    for name, on in (("off", False), ("on", True)):
        rs = [r for r in runs if (r["preload_max_inflight"] > 0) == on]
        out[name] = {f: sum(r[f] for r in rs) / len(rs) if rs else None
                     for f in ("mean_ttft_s", "p50_ttft_s", "after_blockers_s", "preload_started",
                               "preload_used", "preload_wasted", "bytes_read")}
        out[name]["runs"] = len(rs)
    off, on = out["off"], out["on"]
    if off["runs"] and on["runs"]:
        out["speedup"] = off["mean_ttft_s"] / on["mean_ttft_s"]
        out["ttft_saved_s"] = off["mean_ttft_s"] - on["mean_ttft_s"]
        out["after_blockers_saved_s"] = off["after_blockers_s"] - on["after_blockers_s"]
        out["preload_started_min"] = min(r["preload_started"] for r in runs if r["preload_max_inflight"] > 0)
        say(f"PRELOAD document query TTFT, mean of {off['runs']} runs off / {on['runs']} on (order {args.order}): "
            f"off {off['mean_ttft_s'] * 1000:.0f} ms, on {on['mean_ttft_s'] * 1000:.0f} ms "
            f"({out['speedup']:.2f}x, {out['ttft_saved_s'] * 1000:+.0f} ms saved); after the blockers "
            f"{off['after_blockers_s'] * 1000:.0f} ms off vs {on['after_blockers_s'] * 1000:.0f} ms on; preload "
            f"started/used/wasted per on-run {on['preload_started']:.0f}/{on['preload_used']:.0f}/"
            f"{on['preload_wasted']:.0f} of {doc_chunks} document chunks")
    return out


# ------------------------------------------------------------------------------------------------------------------
def bound(work: str, args) -> dict:
    """Round-robin multi-turn conversations whose working set is several times the DRAM tier and the pool; vLLM's
    own prefix cache is reset every round so every turn's history comes from kvtier."""
    md = model_dir()
    out = {}
    for k in (1, 1000):
        root = os.path.join(work, f"root-bound-k{k}")
        os.makedirs(root)
        log = os.path.join(work, f"bound-k{k}.log")
        cfg = kvtier_transfer_config(root, kvtier_preload_max_inflight=k, kvtier_pool_bytes=args.pool_mib << 20,
                                     kvtier_dram_max_slots=args.dram_slots, kvtier_dram_policy=args.policy)
        with Server(md, log, cfg) as s:
            s.wait_healthy()
            slots = pool_slots(log)
            hist = [synthetic_token_ids(args.turn_tokens, seed=500 + c) for c in range(args.conversations)]
            for turn in range(args.turns):
                if turn:
                    hist = [h + synthetic_token_ids(args.turn_tokens, seed=1000 * turn + c)[1:]
                            for c, h in enumerate(hist)]
                run_concurrent(s, hist, args.concurrency, max_tokens=1)
                settle(s, 1.5)
                s.reset_prefix_cache()
            settle(s, 2.5)
            st = engine_stats(root)
        mgr = st.get("manager", {})
        needed = mgr.get("load_bytes_needed", 0)
        read = st.get("bytes_read", 0)
        ws_chunks = args.conversations * (args.turns * (args.turn_tokens - 1) // CHUNK_TOKENS)
        r = {"pool_slots": slots, "dram_max_slots": args.dram_slots, "working_set_chunks": ws_chunks,
             "bytes_read": read, "bytes_needed": needed, "ratio": (read / needed) if needed else None,
             "pool_peak_slots": st.get("pool_peak_slots"), "preload_started": st.get("preload_started"),
             "preload_used": st.get("preload_used"), "preload_wasted": st.get("preload_wasted"),
             "dram_hits": st.get("lookup_hits_dram"), "disk_hits": st.get("lookup_hits_disk")}
        out[f"k{k}"] = r
        ratio = f"{r['ratio']:.3f}" if r["ratio"] else "n/a"
        say(f"BOUND preload_max_inflight={k}: read {read} B, needed {needed} B, ratio {ratio}; pool peak "
            f"{r['pool_peak_slots']}/{slots} slots; working set {ws_chunks} chunks vs DRAM {args.dram_slots} / "
            f"pool {slots}; preload started/used/wasted {r['preload_started']}/{r['preload_used']}/"
            f"{r['preload_wasted']}")
    return out


# ------------------------------------------------------------------------------------------------------------------
def gate(work: str, args) -> dict:
    """Disk loads below N tokens are unprofitable: prompts below N recompute (declined loads), above N load; the
    outputs are the same either way."""
    md = model_dir()
    n = args.gate_tokens
    root = os.path.join(work, "root-gate")
    os.makedirs(root)
    short = synthetic_token_ids(n - CHUNK_TOKENS, seed=71)      # its hit would be below N tokens
    long = synthetic_token_ids(n + 2 * CHUNK_TOKENS, seed=72)  # above N
    thr = os.path.join(work, "thresholds.json")
    with open(thr, "w") as f:
        json.dump({"version": 1, "model": "tiny", "tokens_per_chunk": CHUNK_TOKENS,
                   "tiers": {"dram": {"min_load_tokens": n}, "disk": {"min_load_tokens": n}},
                   "store_min_tokens": 0}, f)
    with Server(md, os.path.join(work, "gate-store.log"), kvtier_transfer_config(root)) as s:
        s.wait_healthy()
        ref = {name: s.complete(p, max_tokens=8)[0] for name, p in (("short", short), ("long", long))}
        settle(s, 3)
    with Server(md, os.path.join(work, "gate-load.log"),
                kvtier_transfer_config(root, kvtier_thresholds_path=thr)) as s:
        s.wait_healthy()
        got = {name: s.complete(p, max_tokens=8)[0] for name, p in (("short", short), ("long", long))}
        settle(s, 2.5)
        st = engine_stats(root)
    mgr = st.get("manager", {})
    out = {"threshold_tokens": n, "short_tokens": len(short), "long_tokens": len(long),
           "declined_loads": mgr.get("declined_loads"), "disk_hits": st.get("lookup_hits_disk"),
           "bytes_read": st.get("bytes_read"), "identical": got == ref}
    say(f"GATE N={n}: short {len(short)} tokens, long {len(long)} tokens: declined_loads {out['declined_loads']}, "
        f"bytes read {out['bytes_read']}, outputs identical {out['identical']}")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("preload", "bound", "gate", "all"))
    p.add_argument("--doc-tokens", type=int, default=2048, help="preload: tokens per document")
    p.add_argument("--num-docs", type=int, default=24, help="preload: documents (= concurrent queries, above the "
                   "servers' --max-num-seqs)")
    p.add_argument("--concurrency", type=int, default=8, help="bound: concurrent requests (above --max-num-seqs 4)")
    p.add_argument("--preload-shape", default=PRELOAD_SHAPE, help="preload: tiny_model.py flags of the model")
    p.add_argument("--blockers", type=int, default=2, help="preload: uncached prompts sent ahead of the queries")
    p.add_argument("--blocker-tokens", type=int, default=1536)
    p.add_argument("--blocker-lead-s", type=float, default=0.5, help="preload: head start of the blockers")
    p.add_argument("--batched-tokens", type=int, default=256,
                   help="preload: the servers' --max-num-batched-tokens (a blocker's prefill takes the budget)")
    p.add_argument("--preload-pool", default="8GiB", help="preload: kvtier_pool_bytes (unused preloads may fill half)")
    p.add_argument("--max-num-seqs", type=int, default=4,
                   help="preload: the servers' --max-num-seqs (below --num-docs)")
    p.add_argument("--kv-cache-bytes", default="2GiB", help="preload: the servers' --kv-cache-memory-bytes")
    p.add_argument("--preload-k", type=int, default=1, help="preload: kvtier_preload_max_inflight of the 'on' runs")
    p.add_argument("--order", default="01101001",
                   help="preload: the measured runs, 0 = preload off, 1 = on (default ABBA twice, mirrored)")
    p.add_argument("--preload-first", action="store_true", help="preload: --order 1001")
    p.add_argument("--conversations", type=int, default=6)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--turn-tokens", type=int, default=513)
    p.add_argument("--pool-mib", type=int, default=24)
    p.add_argument("--dram-slots", type=int, default=6)
    p.add_argument("--policy", default="lru", choices=("lru", "arc"))
    p.add_argument("--gate-tokens", type=int, default=1536)
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    if args.preload_first:
        args.order = "1001"
    if not args.order or set(args.order) - {"0", "1"}:
        p.error("--order: a string of 0 (preload off) and 1 (on)")
    work = tempfile.mkdtemp(prefix="kvtier-tier-")
    say("work dir", work)
    res = {}
    for what in (("preload", "bound", "gate") if args.what == "all" else (args.what,)):
        res[what] = globals()[what](work, args)
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    ok = True
    if "preload" in res:
        # The acceptance itself: the documents' mean query TTFT, averaged over the runs of each setting (ABBA
        # cancels a linear drift), is lower with preload on, and preload did read ahead in every "on" run (its
        # wasted reads are reported). The wait after the blockers is printed as a secondary figure.
        pr = res["preload"]
        ok &= (pr["off"]["runs"] > 0 and pr["on"]["runs"] > 0 and pr["preload_started_min"] > 0
               and pr["on"]["mean_ttft_s"] < pr["off"]["mean_ttft_s"])
    if "bound" in res:
        for r in res["bound"].values():
            ok &= r["ratio"] is not None and r["ratio"] <= 1.2 and 0 <= (r["pool_peak_slots"] or 0) <= r["pool_slots"]
    if "gate" in res:
        ok &= bool(res["gate"]["identical"]) and (res["gate"]["declined_loads"] or 0) >= 1
    say("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
