#!/usr/bin/env bash
# vLLM integration tests (tests/vllm): kvtier.vllm's spec/manager/worker driven directly with vLLM's config
# objects, then real `vllm serve` processes on the tiny model with kvtier as the OffloadingConnector's spec.
#
#   scripts/test_vllm.sh            # unit + end-to-end (several minutes on 2 cores)
#   scripts/test_vllm.sh --unit     # unit tests only (about a minute)
#   scripts/test_vllm.sh ARGS...    # anything else is passed to pytest (e.g. -k restart)
#
# How kvtier gets into vLLM's Python: each vLLM release lives in its own venv (scripts/setup_vllm.sh prints its
# path). kvtier is built once as a wheel by a small builder venv of the same interpreter (build-vllm/builder:
# scikit-build-core and nanobind only; the extension links neither vLLM nor torch, so one wheel serves every
# release), incrementally in build-vllm/wheel/, separate from the .venv build in build-python/ so the two never
# race; the wheel is then installed into the vLLM venv with --no-deps, with pytest if missing. The vLLM server
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

builder="$repo_root/build-vllm/builder"
if ! "$builder/bin/python" -c "import scikit_build_core, nanobind" 2>/dev/null; then
    echo "=== creating the kvtier wheel builder $builder ===" >&2
    rm -rf "$builder"
    "$("$py" -c 'import sys; print(sys._base_executable)')" -m venv "$builder" >&2
    "$builder/bin/python" -m pip install -q scikit-build-core==1.1.2 nanobind==3.1.0 >&2
fi
if ! "$py" -c "import pytest" 2>/dev/null; then
    echo "=== installing pytest into $venv ===" >&2
    "$py" -m pip install -q pytest==9.2.0 >&2
fi
echo "=== building the kvtier wheel, installing it into $venv ===" >&2
dist="$repo_root/build-vllm/dist"
rm -rf "$dist"
"$builder/bin/python" -m pip wheel -q --no-deps --no-build-isolation -Cbuild-dir=build-vllm/wheel/{wheel_tag} \
    -w "$dist" . >&2
"$py" -m pip install -q --no-deps --force-reinstall "$dist"/kvtier-*.whl >&2
"$py" -c "import kvtier._kvtier, kvtier.vllm" || { echo "test_vllm.sh: kvtier not importable in $venv" >&2; exit 1; }

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONHASHSEED=0
args=()
if [[ "${1:-}" == "--unit" ]]; then
    shift
    args=(test_spec_unit.py)
fi
cd tests/vllm  # not the repo root: `kvtier` must resolve to the installed package, not python/kvtier
exec "$py" -m pytest -q -s -p no:cacheprovider "${args[@]}" "$@"
