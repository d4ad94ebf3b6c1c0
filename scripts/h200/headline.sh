#!/usr/bin/env bash
# The headline experiment on the GPU box (issue 8; docs/h200-vllm.md, docs/performance.md "Headline"), one call:
#   1. vLLM 0.26.0 (CUDA) + LMCache from the carried parts (scripts/h200/install.sh; idempotent), or with
#      H200_SET=0.34 vLLM 0.34.0 and its torch 2.14.0 (scripts/h200/set.sh; no LMCache),
#   2. kvtier built with the CUDA copier (scripts/gpu_bench.sh KVTIER_GPU_BUILD_ONLY=1; incremental),
#   3. an import check of everything a server needs,
#   4. bench/h200/headline.py run: all systems' servers at once, then each benchmarked in turn (or, with --sequential,
#      the default of --shape qwen2.5-32b, each system's server alone on the GPU); the table last.
# $OUT gets log.txt, headline.json and logs.tar.gz (server logs, build logs). Environment: OUT, HEADLINE_ARGS (extra
# arguments for headline.py run, e.g. "--systems baseline,kvtier-dram --sizes 1k,10k" or "--shape qwen2.5-32b
# --sizes 40k"; kvtier-dram's gate uses the shape's thresholds file of bench/results/h200/), HEADLINE_STEPS
# (default "install,build,check,run"; "install,build,check" prepares the box in an earlier call; "calibrate" runs
# headline.py calibrate before the run, with CALIBRATE_ARGS), HEADLINE_RAMDISK_GIB
# (N > 0: an ext4 file system on a loop device backed by /dev/shm, N GiB, mounted at /mnt/kvtier-ram, a fast-NVMe
# stand-in; the run's --work goes there), ZRAM (SIZE like 48G: instead, an ext4 on /dev/zram0 of that size at
# /mnt/kvtier-zram, the fast-NVMe stand-in of docs/h200-vllm.md, reset when the script ends, on failure too;
# scripts/h200/zram.sh; the run's --work goes there; with either device each system's storage root is removed and
# the device trimmed before the next system, headline.py --trim), HEADLINE_TIMELINE=1 (kvtier servers log the
# connector's timeline; the per-request breakdown of each kvtier system's query phases is printed and saved as
# timeline-<system>.json).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/h200/set.sh
repo=$PWD
OUT=${OUT:-$repo/out/headline}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1
start=$(date +%s)
step() { echo "=== [$(( $(date +%s) - start ))s] $*"; }
steps=",${HEADLINE_STEPS:-install,build,check,run},"
want() { [[ "$steps" == *",$1,"* ]]; }
logs=/tmp/kvtier-headline-logs
mkdir -p "$logs"
# shellcheck source=scripts/h200/zram.sh
source scripts/h200/zram.sh
finish() {
  kvtier_zram_down
  tar -C "$logs" -czf "$OUT/logs.tar.gz" . 2>/dev/null
  step "done"
}
trap finish EXIT

if want install; then
  step "install wheel set $H200_SET (scripts/h200/install.sh)"
  bash scripts/h200/install.sh || { echo "install failed"; exit 1; }
fi
site=$SET_BOX_DIR/site
export PYTHONPATH=/tmp/kvtier-py:$site${PYTHONPATH:+:$PYTHONPATH} H200_SET
# The CuTe DSL's wheel puts its packages (cutlass, ...) on sys.path with a .pth file, which Python reads only in site
# directories, not on PYTHONPATH: name the directory itself (the 0.34 set; resolve.py, "carry_excluded").
[ -d "$site/nvidia_cutlass_dsl/dsl_packages" ] && export PYTHONPATH=$site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
# The 0.34 set's torch 2.14.0 runs on the box's cuDNN 9.19 (scripts/h200/resolve.py, TORCH_214_OLDER_OK).
[[ $H200_SET == 0.26 ]] || export PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1
sysroot_lib=/tmp/kvtier-sysroot/usr/lib/x86_64-linux-gnu
[ -d "$sysroot_lib" ] && export LD_LIBRARY_PATH=$sysroot_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

if want build; then
  step "build kvtier with the CUDA copier (scripts/gpu_bench.sh, build only)"
  KVTIER_GPU_BUILD_ONLY=1 OUT=$logs/build bash scripts/gpu_bench.sh >/dev/null 2>&1
  rc=$?
  tail -5 "$logs/build/log.txt"
  [ $rc = 0 ] || { echo "build failed (rc=$rc)"; tail -40 "$logs/build/build.log" 2>/dev/null; exit 1; }
  [ -d "$sysroot_lib" ] && export LD_LIBRARY_PATH=$sysroot_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

if want check; then
  step "import check"
  python3 -X faulthandler - <<'EOF' || { echo "import check failed"; exit 1; }
import importlib, importlib.metadata as m, os, sys, time
t = time.time()
failed = []
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0), "from", torch.__file__)
mods = ["vllm", "vllm.entrypoints.openai.api_server", "vllm.v1.kv_offload.tiering.spec",
        "vllm.v1.kv_offload.tiering.fs.manager", "kvtier._kvtier", "kvtier._kvtier_cuda", "kvtier.vllm"]
if os.environ["H200_SET"] == "0.26":
    mods += ["lmcache", "vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector"]
else:
    # vLLM 0.34.0 imports the MiniMax-M3 MSA warm-up at every CUDA start; it needs the CuTe DSL and quack.
    mods += ["kvtier.vllm.tier", "cutlass", "quack", "vllm.model_executor.warmup.minimax_m3_msa_warmup"]
for mod in mods:
    try:
        importlib.import_module(mod)
        print("ok  ", mod)
    except Exception as e:  # report all, then fail
        print("FAIL", mod, type(e).__name__, str(e)[:300])
        failed.append(mod)
for p in ("vllm", "lmcache"):
    try:
        print(p, m.version(p))
    except Exception as e:
        print(p, "not installed")
print(f"imports took {time.time() - t:.1f} s")
if failed:
    sys.exit(f"cannot import {', '.join(failed)}: a server that needs one would die at startup")
import kvtier._kvtier_cuda as c
print(c.CudaCopier(0).describe()[:100])
EOF
fi

work_args=()
if [ -n "${ZRAM:-}" ] && [ "${HEADLINE_RAMDISK_GIB:-0}" != 0 ]; then
  echo "ZRAM and HEADLINE_RAMDISK_GIB exclude each other"; exit 2
fi
if [ -n "${ZRAM:-}" ]; then
  step "zram: ${ZRAM} ext4 on /dev/zram0"
  kvtier_zram_up "$ZRAM" /mnt/kvtier-zram || exit 1
  work_args=(--work /mnt/kvtier-zram/work --trim)
fi
if [ "${HEADLINE_RAMDISK_GIB:-0}" != 0 ]; then
  step "RAM disk: ${HEADLINE_RAMDISK_GIB} GiB ext4 on a loop device over /dev/shm"
  mnt=/mnt/kvtier-ram
  if ! mountpoint -q "$mnt"; then
    mkdir -p "$mnt" && rm -f /dev/shm/kvtier-ram.img && truncate -s "${HEADLINE_RAMDISK_GIB}G" /dev/shm/kvtier-ram.img \
      && mkfs.ext4 -q -F -E nodiscard /dev/shm/kvtier-ram.img && mount -o loop /dev/shm/kvtier-ram.img "$mnt" \
      || { echo "RAM disk: could not make or mount it (see above)"; exit 1; }
  fi
  df -h "$mnt"; cat /sys/block/loop*/queue/logical_block_size 2>/dev/null | head -1
  work_args=(--work "$mnt/work" --trim)
fi
timeline_args=()
[ "${HEADLINE_TIMELINE:-0}" = 1 ] && timeline_args=(--timeline)

if want calibrate; then
  # kvtier calibrate against this harness's model and server flags (headline.py calibrate; CALIBRATE_ARGS, e.g.
  # "--gpu-kv-gib 11 --sizes 8k,16k,32k"), on the run's storage: thresholds.json into $OUT/calibrate
  step "calibrate"
  cal_work=()
  [ ${#work_args[@]} -gt 0 ] && cal_work=(--work "${work_args[1]}")
  # shellcheck disable=SC2086
  python3 bench/h200/headline.py calibrate --out "$OUT/calibrate" --python python3 "${cal_work[@]}" \
    ${CALIBRATE_ARGS:-} || echo "calibrate failed (rc=$?)"
fi

if want run; then
  step "headline run"
  # shellcheck disable=SC2086
  # headline.json straight into $OUT (rewritten after every run: a call cut short keeps what was measured)
  python3 bench/h200/headline.py run --out "$OUT" --logs "$logs" --python python3 \
    --thresholds auto "${work_args[@]}" "${timeline_args[@]}" \
    ${HEADLINE_ARGS:-}
  rc=$?
  if [ ${#timeline_args[@]} -gt 0 ] && [ -f "$OUT/headline.json" ]; then
    # every kvtier system of this run (its timeline directory may hold an earlier call's events too: the headline's
    # wall clocks pick this run's requests)
    step "timelines of the kvtier systems' query phases"
    python3 bench/h200/timeline.py "$logs" --headline "$OUT/headline.json" --each-system "$OUT"
  fi
  if [ ${#work_args[@]} -gt 0 ] && [ "${HEADLINE_RAMDISK_KEEP:-0}" != 1 ]; then
    # The image's blocks stay allocated in /dev/shm after the roots are deleted (no discard): give the memory back,
    # or the next call's servers start with tens of GiB less (the host OOM killer ended a Qwen3 run that way).
    step "RAM disk: unmount and delete (HEADLINE_RAMDISK_KEEP=1 keeps it)"
    umount /mnt/kvtier-ram && rm -f /dev/shm/kvtier-ram.img
  fi
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv >> "$logs/nvidia-smi.txt" 2>&1
  free -g >> "$logs/free.txt" 2>&1
  exit $rc
fi
