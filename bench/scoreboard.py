#!/usr/bin/env python3
"""The scoreboard: the figures that matter, in one machine-readable file written from committed result files.

  bench/scoreboard.py           writes bench/results/scoreboard.json from the result files named in SOURCES below,
                                and docs/performance.md's summary tables (between its scoreboard marker comments)
                                from that
  bench/scoreboard.py --check   writes nothing; exits 1, saying what differs, when either file is out of date
                                (tests/python/test_scoreboard.py runs the same check)
  bench/scoreboard.py --plot    also draws the vllm_ttft rows, TTFT per system per cell, into
                                bench/results/vllm_ttft.png (matplotlib: python/requirements-dev.txt)

Rows (docs/performance.md, "The scoreboard", says what each field means):
  engine_io      one per machine, device, copier path, chunk size, depth and direction, from `kvtier bench io --json`
                 files: the engine against the device's ceiling (raw best) in the same run
  peers_storage  one per chunk size and operation, from `bench/peers/run.sh` (bench/results/peers/results.json)
  vllm_ttft      one per system and phase of a `bench/h200/headline.py run` file (headline.json): TTFT in a real vLLM on
                 the GPU box
  vllm_queue     one per system of a queue-workload headline.json (headline.py run --workload queue): TTFT of the
                 cached and uncached requests in flight at once, with preload on or off
  engine_paths   one per chunk size of a bench/io/path_ab.py summary: the stream path over the former job path
  engine_builds  one per chunk size of bench/io/build_ab.py summaries (runs pooled): a change's build over the build
                 before it
  load_under_writeback  one per setting (write bound, write piece) of a bench/io/load_under_writeback.py --json
                 file: loads during a write-back, against the engine without either
A field a source file does not have is null, and the row's "note" says why. A source that a later run replaced
says so ("superseded": what replaced it): its rows stay in the JSON with "current": false and that reason, and the
doc's tables show current rows only (history lives in the result files, not in the tables).

To add a measurement: commit its result files under bench/results/, name them in SOURCES (with the command that
made them and the date), run this script, commit the three files together.
"""
import argparse
import json
import re
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCOREBOARD = REPO / "bench" / "results" / "scoreboard.json"
DOC = REPO / "docs" / "performance.md"

# engine_io: `kvtier bench io --json` files (a pattern like "bench/results/io/box-DATE/zram-none*.json" stands for the
# files it matches). Files listed together are runs of one measurement: their repetitions are pooled (medians over
# all of them; ratios are medians of the per-repetition ratios). "device" is read from the files' block_device
# where they record it; "device" here is for files that predate that field. scripts/h200/bench_io.sh writes one
# file per device and copier (DEVICE-COPIER[-runR].json): one source each.
PLACED = ("the engine as it is now: 16 reactors, chunks placed on the least busy reactor "
          "(box-placed-2026-12-02)")
LATER_LEASE = "the same cell on a later lease with 12 requests (streamed-2026-12-04, ec332f3)"


def _streamed_disk(pool, folder, commit, extra):
    """A kvtier-disk cell of bench/results/h200/streamed-2026-12-03 (issue 25's setting)."""
    return {"machine": "h200", "date": "2026-12-03", "device": "zram",
            **({} if "batch_api" in extra else {"superseded": LATER_LEASE}),
            "tier": "disk only" + (" (batch_api copies)" if "batch_api" in extra else ""), "pool_gib": pool,
            "pressure": pool * 2**30 < 10.7e9, "gate": "off", "preload": "on",
            "command": "ZRAM=56G HEADLINE_ARGS='--shape qwen2.5-32b --sizes 40k --docs 4 --concurrency 4 "
                       f"--max-num-seqs 2 --systems kvtier-disk --disk-pool-gib {pool}{extra}' "
                       f"scripts/h200/headline.sh at {commit}",
            "file": f"bench/results/h200/streamed-2026-12-03/{folder}/headline.json"}


# The lease of 2026-12-04 at ec332f3 (bench/results/h200/streamed-2026-12-04/README.md): every cell 3 query rounds.
Q3 = ("--shape qwen2.5-32b --sizes 40k --docs 4 --concurrency 4 --max-num-seqs 2 --deadline-s 400 "
      "--start-timeout-s 240 --run-timeout-s 240 --query-rounds 3")


def _lease_1204(folder, system_args, tier, zram=True, **fields):
    return {"machine": "h200", "date": "2026-12-04", "device": "zram" if zram else "-", "tier": tier,
            "gate": "off", "preload": "on", **fields,
            "command": f"{'ZRAM=56G ' if zram else ''}HEADLINE_ARGS='{Q3} {system_args}' scripts/h200/headline.sh "
                       "at ec332f3",
            "file": f"bench/results/h200/streamed-2026-12-04/{folder}/headline.json"}


def _box_034(folder, systems, commit, dated_folder, **fields):
    """A cell of the vLLM 0.34.0 runs on an H100 80GB (11 GiB of GPU KV, --max-num-seqs 1, 2 query rounds)."""
    return {"machine": "h100", "vllm": "0.34.0", "date": "2026-12-05", "device": "zram", "gate": "off",
            "preload": "on", **fields,
            "command": "ZRAM=56G H200_SET=0.34 HEADLINE_ARGS='--shape qwen2.5-32b --sizes 40k --docs 4 --concurrency 4 "
                       "--max-num-seqs 1 --gpu-kv-gib 11 --query-rounds 2 --tiered-gib 32 --disk-pool-gib 8 "
                       f"--systems {systems}' scripts/h200/headline.sh at {commit}",
            "file": f"bench/results/h200/{dated_folder}/{folder}/headline.json"}


# The later lease at d34fe41 (bench/results/h200/vllm-0.34-h100-2026-12-05-d34fe41/README.md): every system of the
# setting on one lease, the same flags; one headline.json holds several systems, each with its own settings.
LEASE_D34FE41 = "every system of the cell on one later lease (vllm-0.34-h100-2026-12-05-d34fe41)"
_SYSTEM_034 = {
    "kvtier-dram": {"tier": "DRAM tier + disk", "tier_gib": 32, "gate": "on (thresholds-qwen2.5-32b.json)"},
    "kvtier-tier": {"tier": "CPU tier + kvtier tier", "tier_gib": 32, "pool_gib": 8, "gate": "-", "preload": "-"},
    "native": {"tier": "CPU tier + fs tier", "tier_gib": 32, "gate": "-", "preload": "-"},
    "kvtier-disk": {"tier": "disk only", "pool_gib": 8, "pressure": True},
    "kvtier-disk-nopreload": {"tier": "disk only", "pool_gib": 8, "pressure": True, "preload": "off"},
    "recompute": {"tier": "none", "device": "-", "gate": "-", "preload": "-"},
    "gpu-prefix": {"tier": "none", "device": "-", "gate": "-", "preload": "-"},
}


def _box_034_d34(folder, systems):
    return _box_034(folder, systems, "d34fe41", "vllm-0.34-h100-2026-12-05-d34fe41", tier="-",
                    per_system=_SYSTEM_034)


def _box_034_1718002(folder, systems, tier, **fields):
    return _box_034(folder, systems, "1718002", "vllm-0.34-h100-2026-12-05", tier=tier, superseded=LEASE_D34FE41,
                    **fields)


# The lease at c3873f0 (vLLM 0.26.0 on an H100 80GB, the box's virtual disk; bench/results/h200/gate-h100-2026-12-06-
# c3873f0/README.md): the gate calibrated on the box (calibrate-h100-2026-12-06-c3873f0), on and off.
GATE_ARGS = ("--shape qwen2.5-32b --sizes 40k --docs 4 --concurrency 4 --max-num-seqs 1 --gpu-kv-gib 11 "
             "--query-rounds 2 --disk-pool-gib 8 --tiered-gib 32")
_SYSTEM_GATE = {
    "kvtier-disk": {"tier": "disk only", "pool_gib": 8, "pressure": True,
                    "gate": "on (the box's calibration: disk never)"},
    "recompute": {"tier": "none", "device": "-", "gate": "-", "preload": "-"},
    "gpu-prefix": {"tier": "none", "device": "-", "gate": "-", "preload": "-"},
}


def _box_c387(folder, args, **fields):
    return {"machine": "h100", "date": "2026-12-06", "device": "virtio", "gate": "off", "preload": "on", **fields,
            "command": f"HEADLINE_ARGS='{GATE_ARGS} {args}' scripts/h200/headline.sh at c3873f0",
            "file": f"bench/results/h200/{folder}/headline.json"}


# The lease at 197ec49 (vLLM 0.26.0 on an H100 80GB; bench/results/h200/peers-h100-2026-12-06-197ec49/README.md): the
# 40k cell on zram with the peers, every system with the same flags, host memory 8 GiB (pressure) and 32 GiB (ample).
PEERS_ARGS = ("--shape qwen2.5-32b --sizes 40k --docs 4 --concurrency 4 --max-num-seqs 1 --gpu-kv-gib 11 "
              "--query-rounds 2")
# What vLLM's or LMCache's log said where a peer's run hung or gained nothing (the folder's logs.tar.gz).
NATIVE_32_HUNG = ("round 2 of 2 hung (200 s: 4 waiting, 0 running, GPU KV 90.9% held); at the client's abort "
                  "EngineCore died: AssertionError, assert len(offload_keys) == len(offload_block_ids) "
                  "(offloading/scheduler.py:975, _build_store_jobs; vllm-project/vllm#52170, fixed by #52923)")
NATIVE_8_NO_HITS = ("completed by recomputing every request: external prefix-cache hits 0; 'Request ...: cannot store "
                    "chunks' (scheduler.py:1010) 12 times, a request's 10.7 GB never fit the 8 GiB CPU tier")
LMCACHE_8_HUNG = ("round 1 hung (110 s): 'No eviction candidates found in local cpu backend. Local cpu memory is under "
                  "pressure. Waiting for 0.1 seconds before retrying.' 1,295 times (local_cpu_backend.py:705)")


def _peers_per_system(tier_gib, request_bytes, pool_gib, thresholds, outcome=None):
    """The per_system settings of a peers lease's file: each system's host memory (kvtier-disk its pool, the others
    their tier), whether it is smaller than one request, the gate's file, and the outcome of a peer that hung."""
    pressure = tier_gib * 2**30 < request_bytes
    tiered = {"tier_gib": tier_gib, "pressure": pressure}
    peer = {**tiered, "gate": "-", "preload": "-"}
    per = {
        "kvtier-disk": {"tier": "disk only", "pool_gib": pool_gib, "pressure": True},
        "kvtier-dram": {"tier": "DRAM tier + disk", **tiered, "gate": f"on ({thresholds})"},
        "native": {"tier": "CPU tier + fs tier", **peer},
        "lmcache": {"tier": "CPU tier + local disk", **peer},
        "recompute": {"tier": "none", "device": "-", "gate": "-", "preload": "-"},
        "gpu-prefix": {"tier": "none", "device": "-", "gate": "-", "preload": "-"},
    }
    for system, text in (outcome or {}).items():
        per[system]["outcome"] = text
    return per


def _box_197(folder, args, tier_gib, outcome=None, zram=True, **fields):
    per = _peers_per_system(tier_gib, 10.7e9, 8, "thresholds-qwen2.5-32b.json", outcome)
    return {"machine": "h100", "date": "2026-12-06", "device": "zram", "tier": "-", "gate": "off", "preload": "on",
            "per_system": per, **fields,
            "command": f"{'ZRAM=56G ' if zram else ''}HEADLINE_ARGS='{PEERS_ARGS} {args}' scripts/h200/headline.sh "
                       "at 197ec49",
            "file": f"bench/results/h200/peers-h100-2026-12-06-197ec49/{folder}/headline.json"}


# The lease at 57d1175 (vLLM 0.26.0 on an H100 80GB; bench/results/h200/peers-llama-h100-2026-12-06-57d1175/README.md):
# the Llama-3.2-3B shape at 40k and 80k on zram with the peers, host memory 4 GiB (pressure at both sizes) and 24 GiB.
LLAMA_ARGS = ("--shape llama-3.2-3b --sequential --sizes 40k,80k --docs 2 --concurrency 2 --max-num-seqs 2 "
              "--gpu-kv-gib 20 --query-rounds 4")
NATIVE_LLAMA_4_HUNG = ("round 1: 1.4 s and 76.6 s ('Running: 0 reqs, Waiting: 1 reqs, Deferred: 1 reqs' for over a "
                       "minute), round 2 hung to the 90 s timeout; at the client's abort EngineCore died: "
                       "AssertionError, assert len(offload_keys) == len(offload_block_ids) (vllm-project/vllm#52170); "
                       "'cannot store chunks' 12 times, a request never fit the 4 GiB CPU tier; 80k not run (deadline)")
LMCACHE_LLAMA_4_HUNG = ("round 1 hung (60 s): 'No eviction candidates found in local cpu backend ... Waiting for 0.1 "
                        "seconds before retrying.' 793 times; 80k not run (deadline)")


def _box_57d(folder, args, tier_gib, outcome=None):
    per = _peers_per_system(tier_gib, 4.7e9, 4, "thresholds-llama-3.2-3b.json", outcome)  # 4.7 GB: a 40k request
    return {"machine": "h100", "date": "2026-12-06", "device": "zram", "tier": "-", "gate": "off", "preload": "on",
            "per_system": per,
            "command": f"ZRAM=56G HEADLINE_ARGS='{LLAMA_ARGS} {args}' scripts/h200/headline.sh at 57d1175",
            "file": f"bench/results/h200/peers-llama-h100-2026-12-06-57d1175/{folder}/headline.json"}


def _superseded(source, why, systems=None):
    """source with the rows of `systems` (None: all of them) marked superseded by `why`."""
    if systems is None:
        return {**source, "superseded": why}
    per = {k: ({**v, "superseded": why} if k in systems else v) for k, v in source["per_system"].items()}
    return {**source, "per_system": per}


# The lease at d362a81 (vLLM 0.26.0 on an H100 80GB; bench/results/h200/order-h100-2026-12-06-d362a81/README.md): the
# copy modes (batch_api, the default since, against the kernel) and load orders in the Llama cells and the 32B DRAM
# cell, with the peers and recompute in the same lease.
LEASE_D362 = ("the same cell on the d362a81 lease, every system in one lease, kvtier with batch_api copies, the "
              "default since (order-h100-2026-12-06-d362a81)")
KERNEL = " (kernel copies)"  # a variant: kvtier_cuda_copy_mode kernel, the default before d362a81's lease
DMA_EXTRA = " --kvtier-extra '{\"kvtier_cuda_copy_mode\":\"batch_api\"}'"


def _box_d362(folder, args, tier_gib, copies=None, llama=True):
    """copies: how the file's kvtier systems copied, 'batch_api' (--kvtier-extra) or 'kernel' (the default then, a
    variant in the tables); None for a file of peers or the baseline alone."""
    bytes_, pool, thresholds = (4.7e9, 4, "thresholds-llama-3.2-3b.json") if llama else \
        (10.7e9, 8, "thresholds-qwen2.5-32b.json")
    per = _peers_per_system(tier_gib, bytes_, pool, thresholds)
    per["kvtier-dram-shared"] = {**per["kvtier-dram"], "tier": "DRAM tier + disk (load order shared)"}
    if copies == "kernel":
        for system in ("kvtier-disk", "kvtier-dram", "kvtier-dram-shared"):
            per[system] = {**per[system], "tier": per[system]["tier"].replace(")", ", kernel copies)")
                           if "(" in per[system]["tier"] else per[system]["tier"] + KERNEL}
    return {"machine": "h100", "date": "2026-12-06", "device": "zram", "tier": "-", "gate": "off", "preload": "on",
            "per_system": per,
            "command": f"ZRAM=56G HEADLINE_ARGS='{LLAMA_ARGS if llama else PEERS_ARGS} {args}"
                       f"{DMA_EXTRA if copies == 'batch_api' else ''}' scripts/h200/headline.sh at d362a81",
            "file": f"bench/results/h200/order-h100-2026-12-06-d362a81/{folder}/headline.json"}


SOURCES = {
    "engine_io": [
        *[{"machine": "h200", "date": "2026-12-02", "superseded": PLACED,
           "command": "ZRAM=24G scripts/h200/bench_io.sh 1 (depth 16, reactors auto: 8 of 16 cores)",
           "files": [f"bench/results/io/box-reactors-2026-12-02/auto/{dev}-{copier}.json"]}
          for dev in ("zram", "virtio") for copier in ("none", "host")],
        {"machine": "h200", "date": "2026-12-02", "superseded": PLACED,
         "command": "DEVICES=zram COPIERS=none DEPTHS=16,64 REPEAT=2 RAW_ZRAM='--raw-threads 8,16 --raw-split 4MiB' "
                    "BENCH_ARGS='--reactors 16' ZRAM=24G scripts/h200/bench_io.sh 1",
         "files": ["bench/results/io/box-reactors-2026-12-02/r16/zram-none.json"]},
        {"machine": "h200", "date": "2026-12-02", "superseded": PLACED + " (1 MiB pieces, the default)",
         "command": "DEVICES=zram COPIERS=none REPEAT=2 RAW_ZRAM='--raw-threads 8,16 --raw-split 4MiB' "
                    "BENCH_ARGS='--read-piece 1MiB' ZRAM=24G scripts/h200/bench_io.sh 1 (depth 16, reactors auto: "
                    "16; loads in verified pieces, read_piece_bytes 1 MiB)",
         "files": ["bench/results/io/box-pieces-2026-12-02/p1MiB/zram-none.json"]},
        # The same zram command at 741793c (chunks on reactor hash(key) mod reactors; `git checkout 741793c` to rerun)
        # and at 845ec5a (chunks on the least busy reactor, as the engine does now).
        *[{"machine": "h200", "date": "2026-12-02", **({"superseded": "chunks placed on the least busy reactor "
                                                       "(load-placed, 845ec5a)"} if folder == "hash-placed" else {}),
           "command": "ZRAM=24G DEVICES=zram COPIERS=none REPEAT=4 RAW_ZRAM='--raw-threads 8,16 --raw-split "
                      f"4MiB,1MiB' BENCH_ARGS='--raw-verify' scripts/h200/bench_io.sh 2 at {commit} (depth 16, "
                      f"reactors auto: 16; {placement})",
           "files": [f"bench/results/io/box-placed-2026-12-02/{folder}/zram-none-run*.json"]}
          for folder, commit, placement in (
              ("hash-placed", "741793c", "chunks placed on reactors by key hash"),
              ("load-placed", "845ec5a", "chunks placed on the least busy reactor"))],
        {"machine": "h200", "date": "2026-12-02",
         "command": "DEVICES=virtio COPIERS=none REPEAT=4 scripts/h200/bench_io.sh 2 (depth 16, reactors auto: 16; "
                    "chunks placed on the least busy reactor, 845ec5a)",
         "files": ["bench/results/io/box-placed-2026-12-02/virtio/virtio-none-run*.json"]},
        {"machine": "h200", "date": "2026-12-04",
         "command": "ZRAM=24G DEVICES=zram COPIERS=none CHUNKS=64MiB DEPTHS=16 REPEAT=2 TOTAL=4GiB "
                    "RAW_ZRAM='--raw-threads 8,16 --raw-split 4MiB' BENCH_ARGS='--raw-verify' "
                    "scripts/h200/bench_io.sh 1 at 84998cc (the "
                    "32B shape's 64 MiB chunks; --path stream: JobClient over the stream pump)",
         "files": ["bench/results/io/box-64mib-2026-12-04/zram-none.json"]},
        {"machine": "cpu", "device": "virtio", "date": "2026-12-01",
         "command": "kvtier bench io --dir /var/tmp --reread 6 (copier host, three runs)",
         "files": [f"bench/results/io/bench-io-s6-final-run{i}-2026-12-01.json" for i in (1, 2, 3)]},
        {"machine": "cpu", "device": "virtio", "date": "2026-12-01",
         "command": "kvtier bench io --dir /var/tmp --reread 6 --touch --copier none",
         "files": ["bench/results/io/s7/bench-io-touch-none-run1-2026-12-01.json"]},
    ],
    "peers_storage": [
        {"machine": "cpu", "date": "2026-12-03", "command": "bench/peers/run.sh",
         "file": "bench/results/peers/results.json"},
    ],
    # vllm_ttft: `bench/h200/headline.py run` files (headline.json; scripts/h200/headline.sh writes them), one source
    # each, with what the file does not say: the tier (and its size, pool_gib or tier_gib), whether it is smaller
    # than one request (pressure), the device under the root, gate and preload.
    "vllm_ttft": [
        *[_streamed_disk(pool, folder, commit, extra)
          for pool, folder, commit, extra in (
              (32, "kvtier-disk-pool32-d1af0a8", "d1af0a8", ""), (8, "kvtier-disk-pool8-d1af0a8", "d1af0a8", ""),
              (32, "kvtier-disk-pool32-71e4c8f", "71e4c8f", ""), (8, "kvtier-disk-pool8-71e4c8f", "71e4c8f", ""),
              (32, "kvtier-disk-pool32-2874512", "2874512", ""), (8, "kvtier-disk-pool8-2874512", "2874512", ""),
              (32, "kvtier-disk-pool32-2874512-run2", "2874512", ""),
              (32, "kvtier-disk-pool32-d78abb9", "d78abb9", " --query-rounds 2"),
              (32, "kvtier-disk-pool32-d78abb9-run2", "d78abb9", " --query-rounds 2"),
              (8, "kvtier-disk-pool8-d78abb9", "d78abb9", " --query-rounds 2"),
              (32, "kvtier-disk-pool32-batchapi-d78abb9", "d78abb9",
               " --query-rounds 2 --kvtier-extra '{\"kvtier_cuda_copy_mode\":\"batch_api\"}'"))],
        *[{"machine": "h200", "date": "2026-12-03", "device": "-", "tier": "none", "gate": "-", "preload": "-",
           "superseded": LATER_LEASE,
           "command": "HEADLINE_ARGS='--shape qwen2.5-32b --sizes 40k --docs 4 --concurrency 4 --max-num-seqs 2 "
                      f"--systems baseline' scripts/h200/headline.sh at {commit}",
           "file": f"bench/results/h200/streamed-2026-12-03/baseline-{commit}/headline.json"}
          for commit in ("d1af0a8", "71e4c8f", "2874512")],
        _lease_1204("baseline-ec332f3", "--systems baseline", "none", zram=False, gate="-", preload="-"),
        *[_lease_1204(f"kvtier-disk-pool{pool}-ec332f3{run}", f"--systems kvtier-disk --disk-pool-gib {pool}",
                      "disk only", pool_gib=pool, pressure=pool * 2**30 < 10.7e9)
          for pool, run in ((32, ""), (32, "-run2"), (32, "-run3"), (8, ""), (8, "-run2"))],
        _lease_1204("kvtier-disk-nopreload-pool32-ec332f3", "--systems kvtier-disk-nopreload --disk-pool-gib 32",
                    "disk only", pool_gib=32, preload="off"),
        _lease_1204("kvtier-dram-tier32-ec332f3", "--systems kvtier-dram --tiered-gib 32 --thresholds auto",
                    "DRAM tier + disk", tier_gib=32, gate="on (thresholds-qwen2.5-32b.json)"),
        _lease_1204("native-tier32-ec332f3", "--systems native --tiered-gib 32", "CPU tier + fs tier", tier_gib=32,
                    gate="-", preload="-"),
        # vLLM 0.34.0 on an H100 80GB: 11 GiB of GPU KV and --max-num-seqs 1 (the README says why); 2 query rounds.
        _box_034_1718002("kvtier-disk-pool8-1718002", "kvtier-disk,native", "disk only", pool_gib=8, pressure=True),
        _box_034_1718002("native-tier32-1718002", "native", "CPU tier + fs tier", tier_gib=32, gate="-", preload="-"),
        _box_034_d34("kvtier-dram-tier-native-d34fe41", "kvtier-dram,kvtier-tier,native"),
        _box_034_d34("kvtier-disk-nopreload-baseline-d34fe41", "kvtier-disk,kvtier-disk-nopreload,baseline"),
        _box_034_d34("native-kvtier-tier-d34fe41-run2", "native,kvtier-tier"),
        _box_c387("gate-h100-2026-12-06-c3873f0", "--systems kvtier-disk,baseline --disk-thresholds FILE (the box's "
                  "calibration, calibrate-h100-2026-12-06-c3873f0/thresholds.json)", tier="-", per_system=_SYSTEM_GATE),
        _box_c387("gate-off-h100-2026-12-06-c3873f0", "--systems kvtier-disk", tier="disk only", pool_gib=8,
                  pressure=True),
        _box_197("pressure8", "--systems kvtier-disk,native --tiered-gib 8 --disk-pool-gib 8", 8,
                 outcome={"native": NATIVE_8_NO_HITS}),
        _superseded(_box_197("ample32", "--systems kvtier-dram,native,lmcache --tiered-gib 32 --disk-pool-gib 8 "
                             "--deadline-s 330 (lmcache not started: the deadline)", 32,
                             outcome={"native": NATIVE_32_HUNG}), LEASE_D362, {"kvtier-dram"}),
        _box_197("lmcache32", "--systems lmcache --tiered-gib 32", 32),
        _box_197("lmcache8", "--systems lmcache --tiered-gib 8 --run-timeout-s 110", 8,
                 outcome={"lmcache": LMCACHE_8_HUNG}),
        _box_197("baseline", "--systems baseline", 8, zram=False),
        _superseded(_box_57d("pressure4", "--systems kvtier-disk,native --tiered-gib 4 --disk-pool-gib 4 "
                             "--run-timeout-s 90 --deadline-s 300", 4, outcome={"native": NATIVE_LLAMA_4_HUNG}),
                    LEASE_D362, {"kvtier-disk"}),
        _superseded(_box_57d("ample24", "--systems kvtier-dram,native,lmcache --tiered-gib 24 --disk-pool-gib 4 "
                             "--run-timeout-s 90 --deadline-s 330 (lmcache's runs skipped: the deadline)", 24),
                    LEASE_D362),
        _superseded(_box_57d("baseline-lmcache24", "--systems baseline,lmcache --tiered-gib 24 --disk-pool-gib 4 "
                             "--run-timeout-s 90 --deadline-s 200", 24), LEASE_D362),
        _box_57d("lmcache4", "--systems lmcache --tiered-gib 4 --disk-pool-gib 4 --run-timeout-s 60 --deadline-s 100",
                 4, outcome={"lmcache": LMCACHE_LLAMA_4_HUNG}),
        _box_d362("order24", "--systems kvtier-dram,kvtier-dram-shared --tiered-gib 24 --run-timeout-s 90 "
                  "--deadline-s 300", 24, copies="kernel"),
        _box_d362("order24-dma", "--systems kvtier-dram,kvtier-dram-shared --tiered-gib 24 --run-timeout-s 90 "
                  "--deadline-s 300", 24, copies="batch_api"),
        _box_d362("peers24", "--systems native,lmcache --tiered-gib 24 --disk-pool-gib 4 --run-timeout-s 90 "
                  "--deadline-s 300", 24),
        _box_d362("baseline", "--systems baseline --run-timeout-s 90 --deadline-s 200", 24),
        _box_d362("pressure4-kernel", "--systems kvtier-disk --tiered-gib 4 --disk-pool-gib 4 --run-timeout-s 90 "
                  "--deadline-s 200", 4, copies="kernel"),
        _box_d362("pressure4-dma", "--systems kvtier-disk --tiered-gib 4 --disk-pool-gib 4 --run-timeout-s 90 "
                  "--deadline-s 200", 4, copies="batch_api"),
        _box_d362("ample32-kernel", "--systems kvtier-dram --tiered-gib 32 --disk-pool-gib 8 --run-timeout-s 200 "
                  "--deadline-s 200", 32, copies="kernel", llama=False),
        _box_d362("ample32-dma", "--systems kvtier-dram --tiered-gib 32 --disk-pool-gib 8 --run-timeout-s 200 "
                  "--deadline-s 200", 32, copies="batch_api", llama=False),
        {**_box_c387("peers-h100-2026-12-06-197ec49/gate", "--systems kvtier-disk --disk-thresholds FILE (the box's "
                     "calibration, calibrate-h100-2026-12-06-c3873f0/thresholds.json)", tier="disk only", pool_gib=8,
                     pressure=True, gate="on (the box's calibration: disk never)"),
         "command": f"HEADLINE_ARGS='{GATE_ARGS} --systems kvtier-disk --disk-thresholds FILE' "
                    "scripts/h200/headline.sh at 197ec49 (FILE: calibrate-h100-2026-12-06-c3873f0/thresholds.json)"},
    ],
    # vllm_queue: headline.json files of the queue workload (headline.py run --workload queue): every query request at
    # once, half of them cached, TTFT per class.
    "vllm_queue": [
        {"machine": "h100", "date": "2026-12-06", "device": "virtio", "pool_gib": 8,
         "command": "HEADLINE_ARGS='--shape qwen2.5-32b --workload queue --sizes 5k --docs 32 --max-num-seqs 1 "
                    "--gpu-kv-gib 11 --disk-pool-gib 8 --tiered-gib 32 --systems kvtier-disk,kvtier-disk-nopreload' "
                    "scripts/h200/headline.sh at c3873f0",
         "file": "bench/results/h200/queue-h100-2026-12-06-c3873f0/headline.json"},
    ],
    # engine_paths: bench/io/path_ab.py summaries (kvtier bench io's stream path over the engine's former job path,
    # alternating pairs; path_ab.py and --path job are in the commit each command names).
    "engine_paths": [
        {"machine": "cpu", "date": "2026-12-03", "load": "other builds and vLLM servers ran (load average 3-4)",
         "superseded": "the same pairs on the quiet machine (path-ab-2mib-quiet-8pairs-2026-12-04)",
         "command": "bench/io/path_ab.py --kvtier build/release/kvtier --pairs 4 --out OUT -- --dir /var/tmp "
                    "--total 256MiB --chunk-sizes 2MiB --depths 4 --repeat 4 --raw-threads 1 --raw-split none "
                    "(JobClient as in 416bb12)",
         "file": "bench/results/io/path-ab-2mib-2026-12-03/summary.json"},
        *[{"machine": "cpu", "date": "2026-12-04", "load": "quiet (nothing else ran)",
           **({"superseded": "8 pairs (path-ab-2mib-quiet-8pairs-2026-12-04)"} if pairs == 4 else {}),
           "command": f"at 8330055: bench/io/path_ab.py --kvtier build/release/kvtier --pairs {pairs} --out OUT -- "
                      "--dir /var/tmp --total 256MiB --chunk-sizes 2MiB --depths 4 --repeat 4 --raw-threads 1 "
                      "--raw-split none",
           "file": f"bench/results/io/path-ab-2mib-quiet-{pairs}pairs-2026-12-04/summary.json"} for pairs in (4, 8)],
    ],
    # engine_builds: bench/io/build_ab.py summaries (an engine change's build B over the build before it A, alternating
    # pairs); the runs a source lists are pooled.
    "engine_builds": [
        {"machine": "cpu", "date": "2026-12-05", "load": "quiet", "change": "0ea7e19 -> d3a9901 (issue 28, part)",
         "superseded": "the whole of issue 28's engine work (issue28-build-ab-final)",
         "command": "bench/io/build_ab.py --a A/kvtier --b B/kvtier --pairs 8 --out OUT -- --dir /var/tmp --total "
                    "256MiB --chunk-sizes 2MiB --depths 4 --repeat 4 --raw-threads 1 --raw-split none (run1: 4 pairs; "
                    "run4-28mib: --total 512MiB --chunk-sizes 28MiB)",
         "files": ["bench/results/io/issue28-build-ab-2026-12-05/run*/summary.json"]},
        {"machine": "cpu", "date": "2026-12-05", "load": "quiet (run5: a compile started beside it)", "change": "a9943b6 -> df58d61 (issue 28)",
         "command": "bench/io/build_ab.py --a A/kvtier --b B/kvtier --pairs 4 --out OUT -- --dir /var/tmp --total "
                    "256MiB --chunk-sizes 2MiB --depths 4 --repeat 4 --raw-threads 1 --raw-split none (once per run)",
         "files": ["bench/results/io/issue28-build-ab-final/run*/summary.json"]},
    ],
    # load_under_writeback: bench/io/load_under_writeback.py --json files (loads of stored chunks while new ones are
    # committed; the engine's write bound, max_writes_at_disk, and write pieces, write_piece_bytes, on and off), one
    # per reactor count and load batch.
    "load_under_writeback": [
        *[{"machine": "cpu", "device": "virtio", "date": "2026-12-05", "reactors": reactors,
           "superseded": "the loads-first, write-pieces engine (load-under-writeback-cpu-2026-12-06-pieces)",
           "command": "at fc9dced: python3 bench/io/load_under_writeback.py --dir /var/tmp/kvtier-wb --chunk-mib 32 "
                      f"--reads 16 --writes 256 --repeat 2 --reactors {flag} --json OUT",
           "file": f"bench/results/io/load-under-writeback-cpu-2026-12-05-fc9dced/{name}.json"}
          for reactors, flag, name in (("auto (2)", 0, "reactors-auto"), ("1", 1, "reactors-1"))],
        *[{"machine": "h200", "device": "virtio", "date": "2026-12-06", "reactors": reactors,
           "command": "at 2d6d3d9, before loads first and write pieces (the box's 16 cores; "
                      "KVTIER_GPU_BUILD_ONLY=1 scripts/gpu_bench.sh, then): "
                      "python3 bench/io/load_under_writeback.py --dir /var/tmp/kvtier-wb --chunk-mib 32 --reads 16 "
                      f"--writes 256 --repeat 2 --reactors {flag} --json OUT",
           "file": f"bench/results/io/load-under-writeback-h200-2026-12-06-2d6d3d9/{name}.json"}
          for reactors, flag, name in (("auto (16)", 0, "reactors-auto"), ("1", 1, "reactors-1"))],
        {"machine": "h100", "device": "virtio", "date": "2026-12-06", "reactors": "auto (16)",
         "command": "at c3873f0, on the box after HEADLINE_STEPS=install,build,check scripts/h200/headline.sh: "
                    "python3 bench/io/load_under_writeback.py --dir /var/tmp/kvtier-wb --chunk-mib 32 --reads 16 "
                    "--load-batch 16 --writes 256 --repeat 2 --reactors 0 --caps 0 --write-pieces 1,0 --json OUT",
         "file": "bench/results/io/load-under-writeback-h100-2026-12-06-c3873f0/reactors-auto.json"},
        *[{"machine": "cpu", "device": "virtio", "date": "2026-12-06", "reactors": str(r),
           "command": "python3 bench/io/load_under_writeback.py --dir /var/tmp/kvtier-wb --chunk-mib 32 --reads 16 "
                      f"--load-batch {lb} --writes 256 --repeat 2 --reactors {r} --caps 0,16 --write-pieces 1,0 "
                      "--json OUT",
           "file": f"bench/results/io/load-under-writeback-cpu-2026-12-06-pieces/batch{lb}-r{r}.json"}
          for lb in (16, 1) for r in (16, 2, 1)],
        *[{"machine": "cpu", "device": "virtio", "date": "2026-12-06", "reactors": str(r),
           "command": "python3 bench/io/load_under_writeback.py --dir /var/tmp/kvtier-wb --chunk-mib 32 --reads 16 "
                      f"--load-batch 16 --writes 256 --repeat 2 --reactors {r} --caps 0 --write-pieces 4,1,0 "
                      "--json OUT",
           "file": f"bench/results/io/load-under-writeback-cpu-2026-12-06-pieces/pieces-4-1-0-batch16-r{r}.json"}
          for r in (16, 2)],
        *[{"machine": "cpu", "device": "virtio", "date": "2026-12-06", "reactors": reactors,
           "command": "python3 bench/io/load_under_writeback.py --dir /var/tmp/kvtier-wb --chunk-mib 32 --reads 0 "
                      f"--writes 256 --repeat 2 --reactors {flag} --caps 0 --write-pieces 1,4,0 --json OUT",
           "file": f"bench/results/io/load-under-writeback-cpu-2026-12-06-pieces/writeback-alone-r{flag}.json"}
          for reactors, flag in (("auto (2)", 0), ("16", 16))],
    ],
}

NOTE_NO_RAW_BEST = ("measured before bench io had its multi-threaded raw baseline: raw_best_gbps, raw_best_threads "
                    "and ratio are null; raw_1t_gbps and ratio_to_raw_1t are the single-thread raw baseline's")
NOTE_NO_SLOT = ("measured before bench/peers had kvtier's slot path: kvtier_slot_gbps, kvtier_cpu_s_per_gb and the "
                "slot ratios are null; kvtier_host_* are kvtier's host path (an extra memcpy per chunk)")
VLLM_TTFT_NOTE = ("no rows yet: the vLLM head-to-head on the GPU box (issue 18) defines them as {machine, model, tier, "
                  "device, tokens, concurrency, requests, system, gate, preload, mean_ms, p50_ms, p95_ms, completed, "
                  "result}")


def _r(x, digits=3):
    return None if x is None else round(float(x), digits)


def _median(v):
    return statistics.median(v) if v else None


def _paired(eng, raw):
    """Per-repetition ratios engine/raw of one file (repetitions are paired by index)."""
    return [e / r for e, r in zip(eng, raw) if r]


def _device(doc, default):
    name = doc.get("block_device") or ""
    if name.startswith("zram"):
        return "zram"
    if name.startswith("vd"):
        return "virtio"
    return name or default


def _mib(nbytes):
    m = nbytes / (1 << 20)
    return int(m) if m == int(m) else round(m, 3)


def _expand(patterns):
    """Paths relative to the repository; a pattern with * or ? stands for the committed files it matches, sorted."""
    out = []
    for p in patterns:
        if any(c in p for c in "*?["):
            found = sorted(str(f.relative_to(REPO)) for f in REPO.glob(p))
            if not found:
                raise ValueError(f"scoreboard source {p}: no such files")
            out += found
        else:
            out.append(p)
    return out


def engine_io_rows(source, load=None):
    """The rows of one engine_io source (files of one machine, device and copier)."""
    load = load or (lambda p: json.loads((REPO / p).read_text()))
    source = dict(source, files=_expand(source["files"]))
    docs = [(p, load(p)) for p in source["files"]]
    devices = {_device(d, source.get("device")) for _, d in docs}
    copiers = {d.get("copier", "host") for _, d in docs}
    if len(devices) != 1 or len(copiers) != 1:
        raise ValueError(f"{source['files']}: files of one source must share device and copier "
                         f"(got {sorted(devices)}, {sorted(copiers)})")
    device, copier = devices.pop(), copiers.pop()
    cells = {}
    for _, doc in docs:
        for res in doc["results"]:
            cells.setdefault((res["chunk_bytes"], res["depth"]), []).append(res)
    rows = []
    for (chunk, depth), results in sorted(cells.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        for op in ("write", "read"):
            eng = [x for res in results for x in res[f"engine_{op}_gbps"]]
            raw1 = [x for res in results for x in res[f"raw_{op}_gbps"]]
            ratio1 = [x for res in results for x in _paired(res[f"engine_{op}_gbps"], res[f"raw_{op}_gbps"])]
            row = {"machine": source["machine"], "device": device, "chunk_mib": _mib(chunk), "depth": depth, "op": op,
                   "path": "copier-none" if copier == "none" else "host", "engine_gbps": _r(_median(eng)),
                   "raw_best_gbps": None, "raw_best_threads": None, "raw_best_variant": None, "ratio": None,
                   "raw_1t_gbps": _r(_median(raw1)), "ratio_to_raw_1t": _r(_median(ratio1)),
                   "engine_reactors": None, "repetitions": len(eng), "date": source["date"],
                   "command": source["command"], "result": source["files"][0]}
            if len(source["files"]) > 1:
                row["results"] = list(source["files"])
            if all("raw_variants" in res for res in results):
                # "raw best" is the device's ceiling: the variants that only move bytes. Those that also hash every
                # byte (bench io --raw-verify, "verify": true) give "raw+xxh3 best", the floor of the engine's work.
                variants, hashing = {}, {}
                for res in results:
                    for v in res["raw_variants"]:
                        into = hashing if v.get("verify") else variants
                        into.setdefault(v["variant"], {"threads": v["threads"], "gbps": [], "pairs": []})
                        into[v["variant"]]["gbps"] += v[f"{op}_gbps"]
                        into[v["variant"]]["pairs"] += _paired(res[f"engine_{op}_gbps"], v[f"{op}_gbps"])
                best = max(variants, key=lambda k: _median(variants[k]["gbps"]))
                row.update(raw_best_gbps=_r(_median(variants[best]["gbps"])), raw_best_threads=variants[best]["threads"],
                           raw_best_variant=best, ratio=_r(_median(variants[best]["pairs"])))
                if hashing:
                    hb = max(hashing, key=lambda k: _median(hashing[k]["gbps"]))
                    row.update(raw_xxh3_best_gbps=_r(_median(hashing[hb]["gbps"])), raw_xxh3_best_variant=hb,
                               ratio_to_raw_xxh3_best=_r(_median(hashing[hb]["pairs"])))
                reactors = {res.get("engine_reactors") for res in results}
                row["engine_reactors"] = reactors.pop() if len(reactors) == 1 else sorted(reactors, key=str)
                row["note"] = None
            else:
                row["engine_reactors"] = 1  # the engine had one reactor thread before it recorded the count
                row["note"] = NOTE_NO_RAW_BEST
            rows.append(row)
    return rows


PEER_VARIANTS = {"kvtier_slot": "kvtier-slot", "kvtier_slot_whole": "kvtier-slot-whole", "kvtier_host": "kvtier",
                 "vllm_fs": "vllm-fs",
                 "lmcache_odirect": "lmcache-odirect", "lmcache": "lmcache", "raw": "raw io_uring"}


def peers_rows(source, load=None):
    load = load or (lambda p: json.loads((REPO / p).read_text()))
    doc = load(source["file"])
    chunk_of = {r["model"]: r["chunk_bytes"] for r in doc["runs"]}
    by = {(r["model"], r["variant"]): r for r in doc["rows"]}
    rows = []
    for model in sorted(chunk_of, key=lambda m: -chunk_of[m]):
        for op, key in (("store", "store"), ("cold_load", "cold")):
            def fig(name, what):
                r = by.get((model, PEER_VARIANTS[name]))
                return None if r is None else _r(r.get(f"{key}_{what}"))
            row = {"machine": source["machine"], "chunk_mib": _mib(chunk_of[model]), "op": op}
            for name in PEER_VARIANTS:
                row[f"{name}_gbps"] = fig(name, "gbps")
            row["kvtier_cpu_s_per_gb"] = fig("kvtier_slot", "cpu")
            for name in ("kvtier_host", "vllm_fs", "lmcache_odirect"):
                row[f"{name}_cpu_s_per_gb"] = fig(name, "cpu")
            slot = row["kvtier_slot_gbps"]
            row["slot_over_vllm_fs"] = _r(slot / row["vllm_fs_gbps"]) if slot and row["vllm_fs_gbps"] else None
            whole = row["kvtier_slot_whole_gbps"]
            row["slot_whole_over_vllm_fs"] = _r(whole / row["vllm_fs_gbps"]) if whole and row["vllm_fs_gbps"] else None
            row["slot_over_lmcache_odirect"] = (_r(slot / row["lmcache_odirect_gbps"])
                                                if slot and row["lmcache_odirect_gbps"] else None)
            row["host_over_vllm_fs"] = (_r(row["kvtier_host_gbps"] / row["vllm_fs_gbps"])
                                        if row["kvtier_host_gbps"] and row["vllm_fs_gbps"] else None)
            row.update(date=source["date"], command=source["command"], result=source["file"],
                       note=None if slot is not None else NOTE_NO_SLOT)
            rows.append(row)
    return rows


def vllm_rows(source, load=None):
    """The rows of one headline.json: each run's query phase (the baseline's warm-up phase is the recompute row, its
    query phase vLLM's own GPU prefix cache)."""
    load = load or (lambda p: json.loads((REPO / p).read_text()))
    doc = load(source["file"])
    rows = []
    argv = doc.get("argv") or []
    rounds = int(argv[argv.index("--query-rounds") + 1]) if "--query-rounds" in argv else 1
    for run in doc["runs"]:
        if "skipped" in run:  # not started (headline.py --deadline-s): no cell
            continue
        phases = [("recompute", "warmup"), ("gpu-prefix", "query")] if run["system"] == "baseline" else \
            [(run["system"], "query")]
        for system, phase in phases:
            t = (run.get(phase) or {}).get("ttft")
            requests = run["docs"] * (rounds if phase == "query" else 1)  # asked for: headline.py --query-rounds
            f = {**source, **source.get("per_system", {}).get(system, {})}  # one file, several systems' settings
            row = {"machine": f["machine"], "vllm": f.get("vllm", "0.26.0"), "model": doc["model"],
                   "tier": f["tier"],
                   "pool_gib": f.get("pool_gib"), "tier_gib": f.get("tier_gib"),
                   "pressure": f.get("pressure", False), "device": f["device"],
                   "tokens": run["doc_tokens"], "concurrency": doc["concurrency"], "requests": requests,
                   "system": system, "gate": f["gate"], "preload": f["preload"],
                   "mean_ms": _r(t["mean"] * 1e3, 0) if t else None, "p50_ms": _r(t["p50"] * 1e3, 0) if t else None,
                   "p95_ms": _r(t["p95"] * 1e3, 0) if t else None,
                   "completed": bool(t) and t["n"] == requests, "done": t["n"] if t else 0,
                   "outcome": "; ".join(x for x in (run.get("error"), f.get("outcome")) if x) or None,
                   "date": source["date"], "command": source["command"], "result": source["file"]}
            if "superseded" in source.get("per_system", {}).get(system, {}):  # one system's row of the file
                row["superseded"] = f["superseded"]
            rows.append(row)
    return rows


def engine_paths_rows(source, load=None):
    """One row per chunk size of a path_ab.py summary: medians over pairs of stream/job, and the pairs' spread."""
    load = load or (lambda p: json.loads((REPO / p).read_text()))
    doc = load(source["file"])
    rows = []
    for size, d in sorted(doc["stream_over_job"].items(), key=lambda kv: int(kv[0])):
        spread = [x for v in d["per_pair"].values() for x in v]
        rows.append({"machine": source["machine"], "chunk_mib": _mib(int(size)), "pairs": doc["pairs"],
                     **{f"stream_over_job_{k}": _r(v) for k, v in d["median"].items()},
                     "pair_min": _r(min(spread)), "pair_max": _r(max(spread)), "load": source["load"],
                     "date": source["date"], "command": source["command"], "result": source["file"]})
    return rows


def engine_builds_rows(source, load=None):
    """One row per chunk size over a change's build_ab.py summaries: the runs' pairs pooled, medians of B/A per pair,
    and the pairs' spread."""
    load = load or (lambda p: json.loads((REPO / p).read_text()))
    docs = [load(f) for f in _expand(source["files"])]
    sizes = sorted({int(size) for d in docs for size in d["b_over_a"]})
    rows = []
    for size in sizes:
        per = {}
        for d in docs:
            for k, v in d["b_over_a"].get(str(size), {}).get("per_pair", {}).items():
                per.setdefault(k, []).extend(v)
        spread = [x for k, v in per.items() if k.endswith("ratio_to_best") for x in v]
        rows.append({"machine": source["machine"], "change": source["change"], "chunk_mib": _mib(size),
                     "runs": sum(str(size) in d["b_over_a"] for d in docs),
                     "pairs": len(per.get("write_ratio_to_best", [])),
                     **{f"b_over_a_{k}": _r(_median(v)) for k, v in per.items()},
                     "pair_min": _r(min(spread)), "pair_max": _r(max(spread)), "load": source["load"],
                     "date": source["date"], "command": source["command"],
                     "result": str(Path(_expand(source["files"])[0]).parent.parent)})
    return rows


def vllm_queue_rows(source, load=None):
    """One row per system of a queue-workload headline.json: TTFT of all requests and per class (cached, uncached),
    the query phase's time and bytes, and the preload planner's counters from the engine's final stats."""
    load = load or (lambda p: json.loads((REPO / p).read_text()))
    doc = load(source["file"])
    stats = {f["system"]: (f.get("kvtier_stats") or [{}])[-1] for f in doc.get("freed", [])}
    rows = []
    for run in doc["runs"]:
        q = run["query"]
        m = q.get("metrics", {})
        by = q["ttft_by_class"]
        planner = stats.get(run["system"], {}).get("preload_planner") or {}

        def ms(t, k):
            return _r(t[k] * 1e3, 0)
        rows.append({
            "machine": source["machine"], "vllm": doc["versions"]["vllm"], "model": doc["model"],
            "device": source["device"], "tokens": run["doc_tokens"], "requests": q["ttft"]["n"],
            "cached": by["cached"]["n"], "max_num_seqs": int(doc["argv"][doc["argv"].index("--max-num-seqs") + 1]),
            "pool_gib": source["pool_gib"], "system": run["system"],
            "preload": "off" if run["system"].endswith("nopreload") else "on",
            "mean_ms": ms(q["ttft"], "mean"),
            **{f"{c}_{k}_ms": ms(by[c], k) for c in ("cached", "uncached") for k in ("mean", "p50", "p95")},
            "query_s": _r(q["wall_s"], 1),
            "read_gb": _r(m.get("vllm:kvtier_bytes_read_total", 0) / 1e9, 1),
            "written_gb": _r(m.get("vllm:kvtier_bytes_written_total", 0) / 1e9, 1),
            "preloads_started": planner.get("started"), "preloads_refused_no_room": planner.get("refused_no_room"),
            "date": source["date"], "command": source["command"], "result": source["file"]})
    return rows


def load_under_writeback_rows(source, load=None):
    """One row per setting (write bound, write piece) of a load_under_writeback.py file (its table: batch latency
    mean, p50 and p95 over every run's batches, medians over runs of the loads' total and of the write-back), each
    with the ratios to the file's baseline: its setting closest to the engine before both (no write pieces, the
    largest bound), whose own ratios are null. Files from before write pieces wrote each chunk at once."""
    load = load or (lambda p: json.loads((REPO / p).read_text()))
    doc = load(source["file"])
    a = doc["args"]
    table = [{**t, "write_piece_mib": t.get("write_piece_mib", 0.0)} for t in doc["table"]]
    whole = [t for t in table if t["write_piece_mib"] == 0] or table
    base = max(whole, key=lambda t: min(t["cap"] or a["io_depth"] // 2, a["io_depth"]))
    rows = []
    for t in table:
        bound = max(1, a["io_depth"] // 2) if t["cap"] == 0 else t["cap"]
        mine = [x for x in doc["runs"] if x["cap"] == t["cap"] and x.get("write_piece_mib", 0.0) == t["write_piece_mib"]]
        ms = {k: _r(t[f"load_{k}_s"] * 1e3, 1) if t[f"load_{k}_s"] is not None else None for k in ("mean", "p50", "p95")}
        row = {"machine": source["machine"], "device": source["device"], "reactors": source["reactors"],
               "chunk_mib": a["chunk_mib"], "loads": a["reads"], "load_batch": a.get("load_batch", 1),
               "writes_gib": _r(a["writes"] * a["chunk_mib"] / 1024), "io_depth": a["io_depth"],
               "max_writes_at_disk": t["cap"], "writes_at_disk": bound if bound < a["io_depth"] else None,
               "write_piece_mib": t["write_piece_mib"] or None, "runs": len(mine),
               "load_mean_ms": ms["mean"], "load_p50_ms": ms["p50"], "load_p95_ms": ms["p95"],
               "loads_total_s": _r(t["loads_total_s"]) if a["reads"] else None, "writeback_s": _r(t["writeback_s"]),
               "loads_total_baseline_over_this": None, "writeback_this_over_baseline": None}
        if t is not base:
            if a["reads"]:
                row["loads_total_baseline_over_this"] = _r(base["loads_total_s"] / t["loads_total_s"])
            row["writeback_this_over_baseline"] = _r(t["writeback_s"] / base["writeback_s"])
        row.update(date=source["date"], command=source["command"], result=source["file"])
        rows.append(row)
    return rows


def _marked(source, rows):
    """rows with whether they are current (and, if not, what superseded the row or its whole source)."""
    out = []
    for r in rows:
        why = r.get("superseded") or source.get("superseded")
        out.append({**r, "current": not why, **({"superseded": why} if why else {})})
    return out


def build(sources=SOURCES, load=None):
    def rows(name, fn):
        return [row for s in sources.get(name, []) for row in _marked(s, fn(s, load))]
    return {
        "what": "kvtier's scoreboard, written by bench/scoreboard.py from the result files it names; "
                "docs/performance.md's summary tables are generated from it",
        "engine_io": rows("engine_io", engine_io_rows),
        "peers_storage": rows("peers_storage", peers_rows),
        "vllm_ttft": rows("vllm_ttft", vllm_rows),
        "vllm_queue": rows("vllm_queue", vllm_queue_rows),
        "engine_paths": rows("engine_paths", engine_paths_rows),
        "engine_builds": rows("engine_builds", engine_builds_rows),
        "load_under_writeback": rows("load_under_writeback", load_under_writeback_rows),
        "notes": {"vllm_ttft": VLLM_TTFT_NOTE} if not sources["vllm_ttft"] else {},
    }


def dumps(board):
    return json.dumps(board, indent=1) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# The tables of docs/performance.md


def _f(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def table_engine_io(board):
    out = ["| machine | device | path | chunk | depth | op | reactors | engine GB/s | raw best GB/s (variant) "
           "| engine / raw best | raw+xxh3 best GB/s | engine / raw+xxh3 best | raw 1 thread GB/s "
           "| engine / raw 1 thread | date |",
           "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    rows, note = _current(board, "engine_io")
    for r in rows:
        best = "-" if r["raw_best_gbps"] is None else f"{r['raw_best_gbps']:.2f} ({r['raw_best_variant']})"
        out.append(f"| {r['machine']} | {r['device']} | {r['path']} | {r['chunk_mib']} MiB | {r['depth']} | {r['op']} "
                   f"| {r.get('engine_reactors') or '-'} | {_f(r['engine_gbps'])} | {best} | {_f(r['ratio'], 3)} "
                   f"| {_f(r.get('raw_xxh3_best_gbps'))} | {_f(r.get('ratio_to_raw_xxh3_best'), 3)} "
                   f"| {_f(r['raw_1t_gbps'])} | {_f(r['ratio_to_raw_1t'], 3)} | {r['date']} |")
    return "\n".join(out) + note


def table_peers(board):
    out = ["| chunk | op | kvtier slot | kvtier slot, whole-chunk reads | kvtier host | vLLM fs | LMCache O_DIRECT "
           "| LMCache | raw io_uring | slot / vLLM fs | slot whole / vLLM fs | slot / LMCache O_DIRECT "
           "| CPU s/GB: kvtier slot, host, vLLM fs, LMCache O_DIRECT | date |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    rows, note = _current(board, "peers_storage")
    for r in rows:
        cpu = ", ".join(_f(r[k]) for k in ("kvtier_cpu_s_per_gb", "kvtier_host_cpu_s_per_gb", "vllm_fs_cpu_s_per_gb",
                                           "lmcache_odirect_cpu_s_per_gb"))
        out.append(f"| {r['chunk_mib']} MiB | {r['op']} | {_f(r['kvtier_slot_gbps'])} "
                   f"| {_f(r.get('kvtier_slot_whole_gbps'))} | {_f(r['kvtier_host_gbps'])} "
                   f"| {_f(r['vllm_fs_gbps'])} | {_f(r['lmcache_odirect_gbps'])} | {_f(r['lmcache_gbps'])} "
                   f"| {_f(r['raw_gbps'])} | {_f(r['slot_over_vllm_fs'])} | {_f(r.get('slot_whole_over_vllm_fs'))} "
                   f"| {_f(r['slot_over_lmcache_odirect'])} | {cpu} | {r['date']} |")
    return "\n".join(out) + note


def table_vllm_ttft(board):
    if not board["vllm_ttft"]:
        return "No rows yet: " + board["notes"]["vllm_ttft"].split(": ", 1)[1] + "."
    out = ["| GPU, vLLM | model | tier | pool GiB | pressure | device | tokens | concurrency | requests | system | gate "
           "| preload | mean ms | p50 ms | p95 ms | completed | result |",
           "|---|---|---|---:|---|---|---:|---:|---:|---|---|---|---:|---:|---:|---|---|"]
    rows, note = _current(board, "vllm_ttft")
    for r in rows:
        pool = r.get("pool_gib") or r.get("tier_gib")
        out.append(f"| {r['machine']}, {r['vllm']} | {r['model']} | {r['tier']} "
                   f"| {pool if pool is not None else '-'} "
                   f"| {'yes' if r.get('pressure') else 'no'} | {r['device']} | {r['tokens']} | {r['concurrency']} "
                   f"| {r['requests']} | {r['system']} | {r['gate']} | {r['preload']} | {_f(r['mean_ms'], 0)} "
                   f"| {_f(r['p50_ms'], 0)} | {_f(r['p95_ms'], 0)} "
                   f"| {'yes' if r['completed'] else 'no: %d of %d' % (r.get('done', 0), r['requests'])} "
                   f"| {_run_folder(r['result'])} |")
    failed = [r for r in rows if r.get("outcome")]
    if failed:
        out += ["", "What the logs of the peers' runs that hung or gained nothing say:", ""]
        out += [f"- {r['system']}, {r.get('tier_gib') or r.get('pool_gib')} GiB, {_run_folder(r['result'])}: "
                f"{r['outcome']}" for r in failed]
    return "\n".join(out) + note


def _run_folder(result):
    """The folder a result file names, with its parent where that is a lease's folder (peers-.../pressure8: any
    folder between bench/results/h200 and the cell's)."""
    parts = result.split("/")
    return "/".join(parts[-3:-1]) if parts[-3] != "h200" else parts[-2]


def table_engine_paths(board):
    out = ["| machine | chunk | pairs | write ratio | read ratio | engine write GB/s | engine read GB/s "
           "| pairs from | to | load | date | result |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    rows, note = _current(board, "engine_paths")
    for r in rows:
        out.append(f"| {r['machine']} | {r['chunk_mib']} MiB | {r['pairs']} "
                   f"| {_f(r['stream_over_job_write_ratio_to_best'])} | {_f(r['stream_over_job_read_ratio_to_best'])} "
                   f"| {_f(r['stream_over_job_median_engine_write_gbps'])} "
                   f"| {_f(r['stream_over_job_median_engine_read_gbps'])} | {_f(r['pair_min'])} "
                   f"| {_f(r['pair_max'])} | {r['load']} | {r['date']} | {r['result'].split('/')[-2]} |")
    return "\n".join(out) + note


def table_engine_builds(board):
    out = ["| machine | change | chunk | runs | pairs | write ratio | read ratio | engine write GB/s "
           "| engine read GB/s | pairs from | to | load | date | result |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    rows, note = _current(board, "engine_builds")
    for r in rows:
        out.append(f"| {r['machine']} | {r['change']} | {r['chunk_mib']} MiB | {r['runs']} | {r['pairs']} "
                   f"| {_f(r['b_over_a_write_ratio_to_best'])} | {_f(r['b_over_a_read_ratio_to_best'])} "
                   f"| {_f(r['b_over_a_median_engine_write_gbps'])} | {_f(r['b_over_a_median_engine_read_gbps'])} "
                   f"| {_f(r['pair_min'])} | {_f(r['pair_max'])} | {r['load']} | {r['date']} "
                   f"| {r['result'].split('/')[-1]} |")
    return "\n".join(out) + note


def table_load_under_writeback(board):
    out = ["| machine | device | reactors | loads (at once) | during the write-back of | writes at the disk (of io_depth) "
           "| write piece | runs | load mean / p50 / p95 ms | loads' total s | write-back s "
           "| loads' total, baseline / this | write-back, this / baseline | date | result |",
           "|---|---|---|---|---:|---|---|---:|---|---:|---:|---:|---:|---|---|"]
    rows, note = _current(board, "load_under_writeback")
    for r in rows:
        bound = f"{r['writes_at_disk']} of {r['io_depth']}" if r["writes_at_disk"] else f"no bound ({r['io_depth']})"
        loads = f"{r['loads']} x {r['chunk_mib']} MiB ({r['load_batch']})" if r["loads"] else "none"
        lat = " / ".join(_f(r[k], 0) for k in ("load_mean_ms", "load_p50_ms", "load_p95_ms"))
        base = "baseline" if r["writeback_this_over_baseline"] is None else _f(r["loads_total_baseline_over_this"])
        piece = f"{r['write_piece_mib']:g} MiB" if r["write_piece_mib"] else "whole chunk"
        out.append(f"| {r['machine']} | {r['device']} | {r['reactors']} | {loads} | {r['writes_gib']:g} GiB | {bound} "
                   f"| {piece} | {r['runs']} | {lat} | {_f(r['loads_total_s'])} | {_f(r['writeback_s'])} | {base} "
                   f"| {_f(r['writeback_this_over_baseline'])} | {r['date']} | {r['result'].split('/')[-2]} |")
    return "\n".join(out) + note


def table_vllm_queue(board):
    out = ["| GPU, vLLM | model | device | tokens | requests (cached) | max-num-seqs | pool GiB | system | preload "
           "| all: mean ms | cached: mean / p50 / p95 ms | uncached: mean / p50 / p95 ms | query phase s "
           "| read / written GB | preloads started (refused: no room) | date | result |",
           "|---|---|---|---:|---|---:|---:|---|---|---:|---|---|---:|---|---|---|---|"]
    rows, note = _current(board, "vllm_queue")
    for r in rows:
        cls = {c: " / ".join(_f(r[f"{c}_{k}_ms"], 0) for k in ("mean", "p50", "p95")) for c in ("cached", "uncached")}
        pre = "-" if r["preloads_started"] is None else f"{r['preloads_started']} ({r['preloads_refused_no_room']})"
        out.append(f"| {r['machine']}, {r['vllm']} | {r['model']} | {r['device']} | {r['tokens']} "
                   f"| {r['requests']} ({r['cached']}) | {r['max_num_seqs']} | {r['pool_gib']:g} | {r['system']} "
                   f"| {r['preload']} | {_f(r['mean_ms'], 0)} | {cls['cached']} | {cls['uncached']} "
                   f"| {_f(r['query_s'], 1)} | {_f(r['read_gb'], 1)} / {_f(r['written_gb'], 1)} | {pre} | {r['date']} "
                   f"| {r['result'].split('/')[-2]} |")
    return "\n".join(out) + note


TABLES = {"engine_io": table_engine_io, "peers_storage": table_peers, "vllm_ttft": table_vllm_ttft,
          "vllm_queue": table_vllm_queue, "engine_paths": table_engine_paths, "engine_builds": table_engine_builds,
          "load_under_writeback": table_load_under_writeback}
MARK = re.compile(r"(<!-- scoreboard:(\w+) -->\n)(.*?)(<!-- /scoreboard:\2 -->)", re.S)


def _current(board, name):
    """The table's rows (current ones) and the line that says how many superseded rows the JSON keeps."""
    rows = board[name]
    now = [r for r in rows if r.get("current", True)]
    old = len(rows) - len(now)
    note = (f"\n\n{old} superseded row{'s' if old != 1 else ''} (earlier runs of these cells) stay in "
            f"`bench/results/scoreboard.json` (`{name}`, `\"current\": false`), each with what replaced it."
            if old else "")
    return now, note


def render_doc(text, board):
    """text with every scoreboard table between its markers regenerated from board."""
    seen = set()

    def repl(m):
        name = m.group(2)
        if name not in TABLES:
            raise ValueError(f"docs/performance.md: unknown scoreboard table '{name}'")
        seen.add(name)
        return m.group(1) + "<!-- generated by bench/scoreboard.py from bench/results/scoreboard.json -->\n" + \
            TABLES[name](board) + "\n" + m.group(4)

    out = MARK.sub(repl, text)
    missing = set(TABLES) - seen
    if missing:
        raise ValueError(f"docs/performance.md: no markers for {sorted(missing)} "
                         f"(<!-- scoreboard:NAME --> ... <!-- /scoreboard:NAME -->)")
    return out


def check(board_text, doc_text, sources=SOURCES, load=None):
    """What is out of date, as a list of sentences (empty: nothing)."""
    problems = []
    want = dumps(build(sources, load))
    if board_text != want:
        problems.append("bench/results/scoreboard.json differs from what the result files give "
                        "(run bench/scoreboard.py)")
    try:
        if doc_text != render_doc(doc_text, json.loads(board_text)):
            problems.append("docs/performance.md's scoreboard tables differ from bench/results/scoreboard.json "
                            "(run bench/scoreboard.py)")
    except (ValueError, KeyError) as e:
        problems.append(str(e))
    return problems


# ---------------------------------------------------------------------------------------------------------------
# The plot of the vllm_ttft rows (docs/performance.md, "In a real vLLM on the GPU box")

PLOT = REPO / "bench" / "results" / "vllm_ttft.png"


def plot_cells(board):
    """The current vllm_ttft rows as cells (GPU, vLLM, model, tokens; the title names the devices of the cell's
    roots), each a list of bars: (label, mean ms of the rows' means, p50 ms, p95 ms, rows). A label is the system,
    with its host memory (pool or tier) where that is smaller than one request, its variant, whether its gate was on,
    the device where the cell's rows used several, and how many of its requests completed where not all did; several
    runs of one label in a cell make one bar of their mean (p50 and p95 their medians). A run with no result (it hung
    before its first request completed) is a bar with mean None."""
    cells: dict = {}
    devices: dict = {}  # cell -> the devices its rows' roots were on
    current = [r for r in board["vllm_ttft"] if r["current"]]
    key = lambda r: f"{r['machine']}, vLLM {r['vllm']}\n{r['model']}, {r['tokens'] // 1024}k tokens"  # noqa: E731
    for r in current:
        if r.get("device", "-") != "-":
            devices.setdefault(key(r), set()).add(r["device"])
    for r in current:
        variant = re.search(r"\((.*)\)", r["tier"])  # "disk only (batch_api copies)"
        memory = r.get("pool_gib") if r.get("pool_gib") is not None else r.get("tier_gib")
        mixed = len(devices.get(key(r), ())) > 1 and r.get("device", "-") != "-"
        label = r["system"] + (f", {memory:g} GiB" if r["pressure"] else "") + \
            (f", {variant.group(1)}" if variant else "") + \
            (", gate on" if r.get("gate", "").startswith("on") else "") + (f", {r['device']}" if mixed else "") + \
            ("" if r["completed"] else f", {r.get('done', 0)} of {r['requests']} done")
        cells.setdefault(key(r), {}).setdefault(label, []).append(r)
    out = []
    for k, bars in cells.items():
        where = f", root on {'/'.join(sorted(devices[k]))}" if k in devices else ""
        out.append((k + where, [_bar(label, rows) for label, rows in bars.items()]))
    return out


def _bar(label, rows):
    done = [x for x in rows if x["mean_ms"] is not None]
    if not done:
        return label, None, None, None, len(rows)
    return (label, _r(statistics.mean(x["mean_ms"] for x in done), 0),
            _r(statistics.median(x["p50_ms"] for x in done), 0), _r(statistics.median(x["p95_ms"] for x in done), 0),
            len(rows))


def plot_vllm_ttft(board, png=PLOT):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cells = plot_cells(board)
    widths = [max(4, 0.8 * len(bars)) for _, bars in cells]  # a bar's label needs about 0.8 inch
    fig, axes = plt.subplots(1, len(cells), figsize=(sum(widths) + 1, 6), squeeze=False,
                             gridspec_kw={"width_ratios": widths})
    for ax, (title, bars) in zip(axes[0], cells):
        top = max(b[3] for b in bars if b[1] is not None)
        bars = sorted(bars, key=lambda b: b[1] if b[1] is not None else float("inf"))  # no result: rightmost
        xs = range(len(bars))
        ok = [(x, b) for x, b in zip(xs, bars) if b[1] is not None]
        ax.bar([x for x, _ in ok], [b[1] for _, b in ok],
               color=["#2b6cb0" if b[0].startswith("kvtier") else "#a0aec0" for _, b in ok])
        ax.errorbar([x for x, _ in ok], [b[2] for _, b in ok], yerr=[[0] * len(ok), [b[3] - b[2] for _, b in ok]],
                    fmt="_", color="black", capsize=4, label="p50 to p95")
        for x, b in zip(xs, bars):
            if b[1] is None:  # hung before any request completed: a hatched bar to the top, no value
                ax.bar([x], [top], color="none", edgecolor="#c53030", hatch="//")
        ax.set_xticks(list(xs), [f"{b[0]}\n" + (f"{b[1]:.0f} ms" if b[1] is not None else "no result") +
                                 (f" ({b[4]} runs)" if b[4] > 1 else "") for b in bars],
                      rotation=35, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("query TTFT, mean of the cell's requests (ms, log)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("vllm_ttft rows of bench/results/scoreboard.json (kvtier blue; recompute = the baseline's warm-up)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110, metadata={"Software": None})
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file is out of date")
    ap.add_argument("--plot", action="store_true", help=f"also draw the vllm_ttft rows into {PLOT.relative_to(REPO)}")
    args = ap.parse_args(argv)
    if args.check:
        problems = check(SCOREBOARD.read_text() if SCOREBOARD.exists() else "", DOC.read_text())
        for p in problems:
            print(f"scoreboard.py: {p}", file=sys.stderr)
        return 1 if problems else 0
    board = build()
    SCOREBOARD.write_text(dumps(board))
    DOC.write_text(render_doc(DOC.read_text(), board))
    if args.plot:
        plot_vllm_ttft(board)
        print(f"wrote {PLOT.relative_to(REPO)}")
    print(f"wrote {SCOREBOARD.relative_to(REPO)} ({len(board['engine_io'])} engine_io, "
          f"{len(board['peers_storage'])} peers_storage, {len(board['vllm_ttft'])} vllm_ttft, "
          f"{len(board['vllm_queue'])} vllm_queue, "
          f"{len(board['engine_paths'])} engine_paths, {len(board['engine_builds'])} engine_builds, "
          f"{len(board['load_under_writeback'])} load_under_writeback rows) and "
          f"{DOC.relative_to(REPO)}'s tables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
