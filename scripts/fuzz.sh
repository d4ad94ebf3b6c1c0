#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/*_fuzz.cc) with clang and runs each for a bounded time, starting from the
# committed seed corpus (fuzz/corpus/<target>/, read-only here: new inputs go to a scratch corpus).
#
#   scripts/fuzz.sh                      # 30 s per target (CI)
#   KVTIER_FUZZ_SECONDS=3600 scripts/fuzz.sh   # a longer soak
# Prints each target's executions; exits non-zero when a target finds a crash (the reproducer is left in
# build-fuzz/crashes/).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${KVTIER_FUZZ_SECONDS:-30}
build=${KVTIER_FUZZ_BUILD:-build-fuzz}
if ! command -v clang++ >/dev/null; then echo "fuzz: clang++ not installed (scripts/setup.sh installs it)" >&2; exit 1; fi
cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVTIER_BUILD_FUZZ=ON -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_TOOLS=OFF >/dev/null
targets=(chunk_header_fuzz manifest_fuzz config_fuzz)
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
mkdir -p "$build/crashes"
for t in "${targets[@]}"; do
  seeds=fuzz/corpus/${t%_fuzz}
  work="$build/corpus/$t"
  mkdir -p "$work"
  log="$build/$t.log"
  if ! "$build/$t" -max_total_time="$seconds" -max_len=12288 -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$build/crashes/$t-" -print_final_stats=1 "$work" "$seeds" >"$log" 2>&1; then
    tail -40 "$log" >&2
    echo "fuzz: $t FAILED (reproducer in $build/crashes/)" >&2
    exit 1
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  echo "fuzz: $t: $execs executions in ${seconds} s, $cov, no crash"
done
