#!/usr/bin/env bash
# The multi-host suite (SPEC M4, tests/multihost): brings up a real MooseFS, then a real GlusterFS
# (scripts/dfs/<fs>.sh: the servers in one network namespace, one FUSE client mount per host namespace), runs the
# engines of hosts a, b (and c) as separate processes in their namespaces on their mounts, prints the figures,
# tears it all down.
#
#   scripts/test_multihost.sh [-k CASE]...      (arguments go to tests/multihost/test_multihost.py)
#
# KVTIER_MULTIHOST_VLLM=1 also runs two vLLM CPU servers, one per host, on the shared root
# (tests/multihost/vllm_two_hosts.py) in the vLLM venv of scripts/setup_vllm.sh (KVTIER_VENV_ROOT applies), with
# kvtier installed there from this tree (scripts/kvtier_install.sh, as scripts/test_vllm.sh does).
#
# Environment: KVTIER_MULTIHOST_FS (default "moosefs glusterfs"); KVTIER_SKIP_APT=1 skips the Debian install
# steps (scripts/setup.sh, scripts/dfs/setup.sh <fs>); KVTIER_BUILD_DIR (default build/dev) is where
# kvtier_mh_engine and kvtier are built.
# Skips (exit 0, saying why) only where a capability is missing: root (network namespaces, mounts), /dev/fuse,
# `ip netns`. Anything else that fails is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
skip() {
  echo "multihost: SKIPPED: $*" >&2
  exit 0
}
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, FUSE mounts); run as root or in a privileged container"
[ -c /dev/fuse ] || skip "no /dev/fuse (FUSE is not available in this kernel or container)"
probe=kvtprobe$$
ip netns add "$probe" 2>/dev/null || skip "cannot create a network namespace (ip netns add: CAP_SYS_ADMIN/NET_ADMIN)"
ip netns del "$probe"

[ "${KVTIER_SKIP_APT:-0}" = 1 ] || scripts/setup.sh
build=${KVTIER_BUILD_DIR:-build/dev}
if [ ! -f "$build/CMakeCache.txt" ]; then cmake --preset dev >/dev/null; fi
cmake --build "$build" -j"$(nproc)" --target kvtier_mh_engine kvtier >/dev/null

# KVTIER_MULTIHOST_FS: the filesystems to run the suite on, in turn (scripts/dfs/<name>.sh).
filesystems=${KVTIER_MULTIHOST_FS:-moosefs glusterfs}
dfs=""
cleanup() {
  if [ -n "$dfs" ]; then
    scripts/dfs/"$fs".sh down "$dfs" || echo "multihost: teardown of $dfs reported a problem" >&2
    rm -rf "$dfs"
  fi
}
trap cleanup EXIT
start=$(date +%s)
rc=0
for fs in $filesystems; do
  [ "${KVTIER_SKIP_APT:-0}" = 1 ] || scripts/dfs/setup.sh "$fs"
  dfs=$(mktemp -d "/tmp/kvtier-$fs.XXXXXX")
  scripts/dfs/"$fs".sh up "$dfs" a b c >/dev/null
  echo "multihost: $fs up in $(grep KVTIER_DFS_UP_MS "$dfs/env" | cut -d= -f2) ms (hosts a b c)"
  python3 tests/multihost/test_multihost.py --env "$dfs/env" --tool "$build/kvtier_mh_engine" \
    --kvtier "$build/kvtier" "$@" || rc=$?
  # Two vLLM servers on the first filesystem only (their start dominates).
  if [ "${KVTIER_MULTIHOST_VLLM:-0}" = 1 ] && [ "$fs" = "${filesystems%% *}" ]; then
    echo "=== multihost: two vLLM servers (hosts a, b) on one root ($fs) ==="
    venv=$(scripts/setup_vllm.sh | tail -n1)
    # shellcheck source=scripts/kvtier_install.sh
    source scripts/kvtier_install.sh
    kvtier_install_into "$venv" || rc=1
    mkdir -p build/multihost-logs
    repo=$(pwd)
    # From outside the repository: `kvtier` must be the installed package, not python/kvtier.
    (cd /tmp && "$venv/bin/python" "$repo/tests/multihost/vllm_two_hosts.py" --env "$dfs/env" \
       --logs "$repo/build/multihost-logs") || rc=$?
  fi
  scripts/dfs/"$fs".sh down "$dfs" || { echo "multihost: teardown of $fs reported a problem" >&2; rc=1; }
  rm -rf "$dfs"
  dfs=""
done
echo "multihost: done in $(($(date +%s) - start)) s"
exit "$rc"
