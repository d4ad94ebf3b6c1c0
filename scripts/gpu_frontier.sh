#!/usr/bin/env bash
# The break-even frontier on a GPU box (issue 6; docs/performance.md "Break-even frontier on the H200"), one call:
#   1. build kvtier as scripts/gpu_bench.sh does (KVTIER_GPU_BUILD_ONLY=1) and check that both nanobind modules use
#      the shared libstdc++ (readelf/nm, the toolchain's defaults, and an import after torch with no LD_PRELOAD);
#   2. g(P): bench/gpu/frontier.py load - kvtier loads from disk (cold pool, O_DIRECT) and from DRAM (resident
#      slots) into vLLM-shaped GPU tensors through the CUDA copier, per model and prefix size;
#   3. f(D): bench/gpu/frontier.py recompute - transformers prefill, random bf16 weights, per model and size;
#   4. the frontier table (bench/gpu/frontier.py analyze --no-plots), last.
# $OUT gets log.txt, libstdcxx.txt, load.json, recompute.json and build/ (gpu_bench.sh's build logs). Plots and
# thresholds files: run `frontier.py analyze` on the two JSON files where matplotlib is (see docs/performance.md).
# Environment: OUT, FRONTIER_MODELS, FRONTIER_LOAD_SIZES, FRONTIER_F_SIZES, FRONTIER_LOAD_TIMEOUT (s, 210),
# FRONTIER_F_TIMEOUT (s, 300), KVTIER_DISK_ROOT (default /var/tmp/kvtier-frontier).
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
OUT=${OUT:-$repo/out/frontier}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1
start=$(date +%s)
step() { echo "=== [$(( $(date +%s) - start ))s] $*"; }
models=${FRONTIER_MODELS:-qwen2.5-32b,llama-3.2-3b,qwen3-4b}

step "build (scripts/gpu_bench.sh, build only)"
KVTIER_GPU_BUILD_ONLY=1 OUT=$OUT/build bash scripts/gpu_bench.sh >/dev/null 2>&1
rc=$?
tail -25 "$OUT/build/log.txt"
[ $rc = 0 ] || { echo "build failed (rc=$rc)"; exit 1; }
build=$repo/build-gpu
pkg=/tmp/kvtier-py
export PYTHONPATH=$pkg${PYTHONPATH:+:$PYTHONPATH}
sysroot_lib=/tmp/kvtier-sysroot/usr/lib/x86_64-linux-gnu
[ -d "$sysroot_lib" ] && export LD_LIBRARY_PATH=$sysroot_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

step "libstdc++ of the Python modules"
{
  cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
  echo "compiler: $cxx ($("$cxx" --version | head -1))"
  echo "-print-file-name=libstdc++.so: $("$cxx" -print-file-name=libstdc++.so)"
  echo "-print-file-name=libstdc++.a:  $("$cxx" -print-file-name=libstdc++.a)"
  ls -la "$(dirname "$("$cxx" -print-file-name=libstdc++.a)")"/libstdc++* 2>&1 | head
  echo "specs naming libstdc++:"; "$cxx" -dumpspecs | grep -o -E '.{0,60}(static-libstdc\+\+|lstdc\+\+).{0,60}' | head
  echo "environment:"; env | grep -E '^(LDFLAGS|CXXFLAGS|CFLAGS|CC|CXX|LIBRARY_PATH|LD_LIBRARY_PATH)=' || true
  echo "CMake: $(grep -E '^KVTIER_LIBSTDCXX_SHARED' "$build/CMakeCache.txt")"
  printf '#include <iostream>\nvoid probe() { std::cout << "probe" << std::endl; }\n' > /tmp/probe.cc
  "$cxx" -shared -fPIC -o /tmp/probe.so /tmp/probe.cc -v 2>&1 | grep -E 'collect2|/ld ' | tr ' ' '\n' \
    | grep -E 'stdc|static|Bstatic|Bdynamic|^-L' | sed 's/^/  plain g++ -shared link: /'
  echo "plain g++ -shared probe NEEDED: $(readelf -d /tmp/probe.so | grep -o 'NEEDED.*' | tr '\n' ' ')"
  command -v ninja >/dev/null && for t in _kvtier _kvtier_cuda; do
    echo "link line of $t:"; ninja -C "$build" -t commands "$t.cpython-312-x86_64-linux-gnu.so" 2>/dev/null | tail -1 \
      | tr ' ' '\n' | grep -E 'stdc|static|\.so|^-Wl' | sed 's/^/  /'
  done
  sys_so=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
  echo "system libstdc++: $sys_so, newest GLIBCXX $(strings "$sys_so" | grep -o '^GLIBCXX_3\.4\.[0-9]*' | sort -V | tail -1)"
  for so in "$pkg"/kvtier/_kvtier*.so; do
    echo "$(basename "$so"): NEEDED $(readelf -d "$so" | grep -o 'NEEDED.*\[.*\]' | sed 's/.*\[//; s/\]//' | tr '\n' ' ')"
    echo "  needs GLIBCXX up to $(objdump -T "$so" | grep -o 'GLIBCXX_3\.4\.[0-9]*' | sort -uV | tail -1);" \
      "std::ios_base symbols defined (a private copy): $(nm -D --defined-only "$so" | grep -c ' _ZNSt8ios_base'),"\
      "imported: $(nm -D --undefined-only "$so" | grep -c ' _ZNSt8ios_base')"
  done
} 2>&1 | tee "$OUT/libstdcxx.txt"
private=0
for so in "$pkg"/kvtier/_kvtier*.so; do readelf -d "$so" | grep -q 'NEEDED.*libstdc++' || private=1; done
# the crash seen before: Engine() (iostreams) and CudaCopier.describe() in a process that imported torch first
env -u LD_PRELOAD python3 -X faulthandler -c '
import numpy, torch, tempfile
import kvtier._kvtier as k, kvtier._kvtier_cuda as c
e = k.Engine({"root": tempfile.mkdtemp(), "model": "probe", "revision": "r", "kv_dtype": "bfloat16",
              "tokens_per_chunk": 256, "blocks_per_chunk": 16, "block_bytes": 65536, "pool_bytes": 64 << 20})
print("after torch, no LD_PRELOAD: Engine ok:", e.describe()[:60], "...")
e.close()
print("CudaCopier ok:", c.CudaCopier(0).describe()[:80])
' 2>&1 | tee -a "$OUT/libstdcxx.txt"
import_rc=${PIPESTATUS[0]}
if [ "$private" = 0 ] && [ "$import_rc" = 0 ]; then
  echo "LIBSTDCXX: FIXED (both modules NEED the shared libstdc++.so.6; import after torch works without LD_PRELOAD)" \
    | tee -a "$OUT/libstdcxx.txt"
else
  echo "LIBSTDCXX: NOT FIXED (private=$private import_rc=$import_rc): preloading the shared one for the benchmarks" \
    | tee -a "$OUT/libstdcxx.txt"
  if [ "$import_rc" != 0 ] && [ "$private" = 0 ]; then  # the shared one did not load: back to the toolchain default
    cmake -S . -B "$build" -DKVTIER_PY_SHARED_LIBSTDCXX=OFF >/dev/null \
      && cmake --build "$build" --target _kvtier _kvtier_cuda -j"$(nproc)" >/dev/null \
      && find "$build" -maxdepth 1 -name '_kvtier*.so' -exec cp {} "$pkg/kvtier/" \; \
      && echo "rebuilt with -DKVTIER_PY_SHARED_LIBSTDCXX=OFF"
  fi
  export LD_PRELOAD=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
fi

step "g(P): loads through kvtier into the GPU (frontier.py load)"
nvidia-smi --query-gpu=memory.used,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader || true
timeout "${FRONTIER_LOAD_TIMEOUT:-210}" python3 -X faulthandler bench/gpu/frontier.py load --models "$models" \
  --sizes "${FRONTIER_LOAD_SIZES:-256,1k,4k,16k,32k,80k}" --root "${KVTIER_DISK_ROOT:-/var/tmp/kvtier-frontier}" \
  --json "$OUT/load.json"
load_rc=$?
rm -rf "${KVTIER_DISK_ROOT:-/var/tmp/kvtier-frontier}"

step "f(D): transformers prefill (frontier.py recompute)"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout "${FRONTIER_F_TIMEOUT:-300}" python3 -X faulthandler \
  bench/gpu/frontier.py recompute --models "$models" --sizes "${FRONTIER_F_SIZES:-1k,4k,8k,16k,32k,64k,80k}" \
  --json "$OUT/recompute.json" 2>&1 | grep -v -i "warn"
f_rc=${PIPESTATUS[0]}
nvidia-smi --query-gpu=memory.used,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader || true

step "frontier (load rc=$load_rc, recompute rc=$f_rc)"
grep -h "LIBSTDCXX:" "$OUT/libstdcxx.txt"
python3 bench/gpu/frontier.py analyze --no-plots --recompute "$OUT/recompute.json" --load "$OUT/load.json" \
  --out /tmp/kvtier-frontier-analysis | sed -n '/^| model/,$p'
[ "$load_rc" = 0 ] && [ "$f_rc" = 0 ]
