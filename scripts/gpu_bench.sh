#!/usr/bin/env bash
# The GPU run of kvtier (issue 6; docs/gpu.md): on a machine with an NVIDIA GPU, nvcc, Python 3 with PyTorch, numpy
# and nanobind, builds kvtier (engine, CUDA copier, the nanobind modules kvtier._kvtier and kvtier._kvtier_cuda, the
# C++ GPU benchmark) against that machine's Python, then runs
#   1. bench/gpu/gpu_check.py: store/poison/load correctness with vLLM-shaped KV (Llama-3.2-3B, Qwen3-4B, bf16, block
#      size 16, 256-token chunks, scattered block ids, partial chunks) through both copy modes, and pool<->GPU copy
#      bandwidth against raw pinned cudaMemcpyAsync;
#   2. kvtier_gpu_bench: disk -> pool -> GPU through the engine with the CUDA copier against raw O_DIRECT reads, and
#      DRAM tier -> GPU, per copy mode;
# and prints the ratio table last. Full JSON and the log go to $OUT (default out/gpu).
#
# Missing system libraries (liburing, xxhash, pkg-config) are taken from Debian packages in .gpudeps/ when the
# machine lacks them (scripts/lib/debdeps.sh says how to fetch them).
#
# Environment: OUT, KVTIER_GPU_CHUNKS (chunks per copy check, default 8), KVTIER_DISK_CHUNKS (chunks for the disk
# benchmark, default 64), KVTIER_DISK_ROOT (a directory on the disk to measure, default /var/tmp/kvtier-gpu-bench),
# KVTIER_GPU_MODES (default "kernel batch_api").
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
OUT=${OUT:-$repo/out/gpu}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1
modes=${KVTIER_GPU_MODES:-kernel batch_api}
disk_root=${KVTIER_DISK_ROOT:-/var/tmp/kvtier-gpu-bench}
start=$(date +%s)
step() { echo "=== [$(( $(date +%s) - start ))s] $*"; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
  --format=csv,noheader 2>&1 || true
nvcc --version | tail -1
python3 -c 'import torch, numpy, nanobind; print("torch", torch.__version__, "cuda", torch.version.cuda, "numpy", numpy.__version__, "nanobind", nanobind.__version__)'
uname -r; nproc; df -h "$(dirname "$disk_root")" /dev/shm | tail -n +1

step "dependencies"
# shellcheck source=lib/debdeps.sh
source scripts/lib/debdeps.sh
kvtier_use_debs || exit 1

step "build"
# A private copy of libstdc++ in the Python modules crashes in a process that loaded the shared one already (numpy,
# torch). On the H200 box the cause is the toolchain (a dangling libstdc++.so in /opt/gcc: static by default), which
# CMakeLists.txt handles by linking the shared one explicitly (docs/gpu.md); environment linker flags could do the
# same harm, so build with the plain toolchain defaults.
env | grep -E '^(LDFLAGS|CXXFLAGS|CFLAGS|CPPFLAGS)=' || true
unset LDFLAGS CXXFLAGS CFLAGS CPPFLAGS
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
build=$repo/build-gpu
cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DKVTIER_WITH_CUDA=ON -DKVTIER_BUILD_PYTHON=ON \
  -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_TOOLS=OFF -DPython_EXECUTABLE="$(command -v python3)" \
  -DCMAKE_SHARED_LINKER_FLAGS= -DCMAKE_MODULE_LINKER_FLAGS= -DCMAKE_EXE_LINKER_FLAGS= \
  >"$OUT/cmake.log" 2>&1 || { tail -40 "$OUT/cmake.log"; exit 1; }
cmake --build "$build" --target _kvtier _kvtier_cuda kvtier_gpu_bench -j"$(nproc)" >"$OUT/build.log" 2>&1 \
  || { grep -E "error|Error" -A3 "$OUT/build.log" | head -60; exit 1; }
# The package as the box imports it (scripts/h200/headline.sh puts it on vLLM's PYTHONPATH): every subpackage
# (kvtier.vllm, kvtier.tools) and the modules just built.
pkg=/tmp/kvtier-py
# shellcheck source=lib/stage_python.sh
source scripts/lib/stage_python.sh
kvtier_stage_python "$pkg" "$build" || exit 1
export PYTHONPATH=$pkg${PYTHONPATH:+:$PYTHONPATH}
for so in "$pkg"/kvtier/_kvtier*.so; do
  if ! ldd "$so" | grep -q 'libstdc++'; then
    # still private (CMake found no shared libstdc++ to link, see docs/gpu.md): make the process load the shared one
    # first so there is one copy (and say so)
    echo "WARNING: $so carries its own libstdc++; preloading the shared one"
    export LD_PRELOAD=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
  fi
done
python3 -c 'import kvtier._kvtier as k, kvtier._kvtier_cuda as c; print("kvtier modules:", k.__file__, c.__file__)' || exit 1
command -v cuobjdump >/dev/null && cuobjdump --list-elf --list-ptx "$build"/src/cuda/libkvtier_cuda.a 2>&1 | head -4

[ "${KVTIER_GPU_BUILD_ONLY:-0}" = 1 ] && exit 0

rc=0
step "correctness and pool<->GPU copies (gpu_check.py)"
python3 -X faulthandler bench/gpu/gpu_check.py --chunks "${KVTIER_GPU_CHUNKS:-8}" --modes "${modes// /,}" --json "$OUT/copy.json" \
  || rc=1

step "disk -> pool -> GPU through the engine (kvtier_gpu_bench)"
disk_jsons=()
for mode in $modes; do
  root=$disk_root/$mode  # each mode stores its own chunks, so each one's loads are compared with what it stored
  rm -rf "$root" && mkdir -p "$root"
  "$build"/src/cuda/kvtier_gpu_bench --root "$root" --model llama-3.2-3b --chunks "${KVTIER_DISK_CHUNKS:-64}" \
    --mode "$mode" --passes 3 >"$OUT/disk-$mode.json" || rc=1
  rm -rf "$root"
  disk_jsons+=("$OUT/disk-$mode.json")
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d[k] for k in ('mode','load_exact','raw_disk_gbps','raw_h2d_gbps','engine_disk_to_gpu_gbps','engine_dram_to_gpu_gbps','disk_to_gpu_ratio','dram_to_gpu_ratio','bytes_read_by_disk_loads','bytes_read_by_dram_loads')})" "$OUT/disk-$mode.json" || rc=1
done
python3 - "$OUT/copy.json" "${disk_jsons[@]}" <<'EOF' || rc=1
import json, sys
import os
out = json.load(open(sys.argv[1])) if os.path.exists(sys.argv[1]) else {"copy": []}
out["disk"] = []
for p in sys.argv[2:]:
    try:
        out["disk"].append(json.load(open(p)))
    except (OSError, ValueError) as e:
        print("no result in", p, e)
json.dump(out, open(sys.argv[1].replace("copy.json", "gpu_bench.json"), "w"), indent=1)
EOF

step "table (rc=$rc)"
python3 bench/gpu/gpu_check.py --report "$OUT/gpu_bench.json"
exit $rc
