#!/usr/bin/env bash
# Python tests: builds and installs the kvtier package (extension + CLI) into the project venv .venv (Python 3.11,
# created on first use, ignored by git), then runs pytest on tests/python. Called by scripts/test.sh.
#
# Environment:
#   KVTIER_PYTHON   interpreter to create .venv from (default: python3.11, else python3)
#   KVTIER_SKIP_APT=1  do not run scripts/setup.sh (Debian packages: cmake, liburing, xxhash, python3-venv)
#   KVTIER_INSTALL_ONLY=1  build and install the package into .venv, run no tests (bench/peers/run.sh uses it)
#
# The package is built with --no-build-isolation against the pinned python/requirements-dev.txt, in a CMake tree of
# its own (build-python/dev-venv) so that reruns are incremental; `pip install .` without these flags works too.
# With CI=true (or KVTIER_WERROR=ON) the build is -Werror for kvtier's own code (CMakeLists.txt, KVTIER_WERROR):
# this is the optimized (Release) build of the extension and the CLI, which warns where debug builds do not.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${KVTIER_SKIP_APT:-0}" = 1 ] || scripts/setup.sh

venv=.venv
py=${KVTIER_PYTHON:-}
if [ -z "$py" ]; then
  if command -v python3.11 >/dev/null; then py=python3.11; else py=python3; fi
fi
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null
then
  echo "=== python: creating $venv with $py ==="
  rm -rf "$venv"
  "$py" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r python/requirements-dev.txt

echo "=== python: building the kvtier package ==="
log=build-python/pip-install.log
mkdir -p build-python
start=$(date +%s)
# Always said, ON or OFF: the CMake tree keeps the last value it was given.
werror=OFF
if [ "${CI:-}" = true ] || [ "${KVTIER_WERROR:-}" = ON ]; then werror=ON; fi
if ! CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$venv/bin/python" -m pip install -v --disable-pip-version-check \
    --no-build-isolation --no-deps -C build-dir=build-python/dev-venv -C cmake.define.KVTIER_WERROR=$werror \
    . >"$log" 2>&1; then
  tail -n 60 "$log" >&2
  echo "python: pip install failed (full log: $log)" >&2
  exit 1
fi
echo "built in $(($(date +%s) - start)) s (KVTIER_WERROR=$werror)"
[ "${KVTIER_INSTALL_ONLY:-0}" = 1 ] && exit 0

echo "=== python: pytest tests/python ==="
# Run from outside the repo so that `import kvtier` can only find the installed package.
repo=$(pwd)
rc=0
(cd /tmp && "$repo/$venv/bin/python" -m pytest -q -p no:cacheprovider "$repo/tests/python") || rc=$?
if [ "$rc" = 5 ]; then
  echo "python: pytest collected no tests" >&2
  exit 1
fi
[ "$rc" = 0 ] || exit "$rc"

# --- vLLM tests ---
# The vLLM tests run in vLLM's own venv outside the repo, with kvtier installed there from this tree in its own CMake
# tree (build-vllm/): scripts/test_vllm.sh does all of it. scripts/test.sh runs it as a step of its own (and calls
# this script with KVTIER_TEST_VLLM=0); KVTIER_TEST_VLLM=1 runs it from here too.
if [ "${KVTIER_TEST_VLLM:-0}" = 1 ] && [ -x scripts/test_vllm.sh ]; then
  echo "=== python: vLLM tests (scripts/test_vllm.sh) ==="
  scripts/test_vllm.sh
fi
