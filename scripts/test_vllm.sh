#!/usr/bin/env bash
# vLLM integration tests (tests/vllm): kvtier.vllm's spec/manager/worker driven directly with vLLM's config
# objects, then real `vllm serve` processes on the tiny model with kvtier as the OffloadingConnector's spec.
#
#   scripts/test_vllm.sh            # unit + end-to-end (several minutes on 2 cores)
#   scripts/test_vllm.sh --unit     # unit tests only (about a minute)
#   scripts/test_vllm.sh ARGS...    # anything else is passed to pytest (e.g. -k restart)
#
# How kvtier gets into vLLM's Python: the pinned vLLM lives in its own venv (scripts/setup_vllm.sh prints its path);
# this script installs the kvtier package there with `pip install --no-deps --no-build-isolation .`, building
# the C++ extension in build-vllm/<venv name>/ (one CMake tree per venv, incremental after the first build,
# separate from the .venv build in build-python/ so no two ever race). The build needs scikit-build-core and
# nanobind in that venv, and pytest runs the tests: all three are installed there if missing. The vLLM server
# processes the e2e tests start import kvtier.vllm from that same installed package.
#
# Environment: KVTIER_VLLM_LOCK (which vLLM: a lock for scripts/setup_vllm.sh, default the oldest supported),
# KVTIER_MODEL_DIR (tiny model; built if missing), PYTHONHASHSEED is forced to 0 for the servers.
set -Eeuo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
venv=$("$repo_root/scripts/setup_vllm.sh" | tail -n1)
py="$venv/bin/python"
[[ -x "$py" ]] || { echo "test_vllm.sh: no python in $venv" >&2; exit 1; }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

if ! "$py" -c "import scikit_build_core, nanobind, pytest" 2>/dev/null; then
    echo "=== installing build/test tools into $venv ===" >&2
    "$py" -m pip install -q scikit-build-core==1.1.2 nanobind==3.1.0 pytest==9.2.0 >&2
fi
echo "=== installing kvtier into $venv ===" >&2
"$py" -m pip install -q --no-deps --no-build-isolation -Cbuild-dir="build-vllm/$(basename "$venv")/{wheel_tag}" . >&2
"$py" -c "import kvtier._kvtier, kvtier.vllm" || { echo "test_vllm.sh: kvtier not importable in $venv" >&2; exit 1; }

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONHASHSEED=0
args=()
if [[ "${1:-}" == "--unit" ]]; then
    shift
    args=(test_spec_unit.py)
fi
cd tests/vllm  # not the repo root: `kvtier` must resolve to the installed package, not python/kvtier
exec "$py" -m pytest -q -s -p no:cacheprovider "${args[@]}" "$@"
