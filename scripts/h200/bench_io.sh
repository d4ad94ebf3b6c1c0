#!/usr/bin/env bash
# `kvtier bench io` on the GPU box (its own virtual disk and 16 cores; no GPU used): builds the release CLI there
# (liburing/xxhash from .gpudeps/ when the box lacks them, scripts/lib/debdeps.sh) and runs the default bench with
# --reread RUNS times, so the engine/raw ratios of this machine and of the CPU machine can be compared.
# Usage, through the device tool (carry .gpudeps):  scripts/h200/bench_io.sh [RUNS]   (default 2)
# Env: OUT (results folder, default out/bench-io-box), DIR (directory on the disk to measure, default /var/tmp),
#      REREAD (default 6), BENCH_ARGS (more bench io arguments, e.g. for a quick check),
#      TRACE=1 (run through bench/io/trace_bench_io.sh: the block layer's view per phase, RUN.phases; the kernel
#      trace itself is gzipped; needs a writable tracefs on the box).
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-2}
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "bench_io.sh: RUNS must be a positive integer, got '$runs'" >&2; exit 2; }
OUT=${OUT:-$PWD/out/bench-io-box}
DIR=${DIR:-/var/tmp}
mkdir -p "$OUT"
echo "== machine: $(nproc) cores, $(uname -r), $(df -h "$DIR" | tail -1)"
# shellcheck source=../lib/debdeps.sh
source scripts/lib/debdeps.sh
kvtier_use_debs
unset LDFLAGS CXXFLAGS CFLAGS CPPFLAGS
build=$PWD/build-box
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_TOOLS=ON \
  >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build "$build" --target kvtier -j"$(nproc)" >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
for ((r = 1; r <= runs; r++)); do
  echo "== run $r of $runs ($(date -u +%H:%M:%S) UTC)"
  if [[ ${TRACE:-0} == 1 ]]; then
    # shellcheck disable=SC2086
    KVTIER_BIN="$build/kvtier" bench/io/trace_bench_io.sh "$OUT/bench-io-box-run$r" --dir "$DIR" \
      --reread "${REREAD:-6}" ${BENCH_ARGS:-} --json "$OUT/bench-io-box-run$r.json" >/dev/null
    gzip -f "$OUT/bench-io-box-run$r.trace"
    grep -E "read|slow" "$OUT/bench-io-box-run$r.phases"
  else
    # shellcheck disable=SC2086
    "$build/kvtier" bench io --dir "$DIR" --reread "${REREAD:-6}" ${BENCH_ARGS:-} --verbose \
      --json "$OUT/bench-io-box-run$r.json" >"$OUT/bench-io-box-run$r.log" 2>&1 ||
      { tail -30 "$OUT/bench-io-box-run$r.log"; exit 1; }
  fi
  grep -vE "^  " "$OUT/bench-io-box-run$r.log" | grep -vE "^(engine:|cpu context)"
done
python3 bench/io/orders.py "$OUT"/bench-io-box-run*.json
