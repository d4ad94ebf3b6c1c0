#!/usr/bin/env bash
# The multi-host suite (SPEC M4, tests/multihost): brings up a real MooseFS (scripts/dfs/moosefs.sh: master and
# chunkserver in one network namespace, one FUSE client mount per host namespace), runs the engines of hosts a, b
# (and c) as separate processes in their namespaces on their mounts, prints the figures, tears it all down.
#
#   scripts/test_multihost.sh [-k CASE]...      (arguments go to tests/multihost/test_multihost.py)
#
# Environment: KVTIER_SKIP_APT=1 skips the Debian install step (scripts/dfs/setup_moosefs.sh); KVTIER_BUILD_DIR
# (default build/dev) is where kvtier_mh_engine and kvtier are built.
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

[ "${KVTIER_SKIP_APT:-0}" = 1 ] || { scripts/setup.sh && scripts/dfs/setup_moosefs.sh; }
build=${KVTIER_BUILD_DIR:-build/dev}
if [ ! -f "$build/CMakeCache.txt" ]; then cmake --preset dev >/dev/null; fi
cmake --build "$build" -j"$(nproc)" --target kvtier_mh_engine kvtier >/dev/null

dfs=$(mktemp -d /tmp/kvtier-dfs.XXXXXX)
cleanup() {
  scripts/dfs/moosefs.sh down "$dfs" || echo "multihost: teardown of $dfs reported a problem" >&2
  rm -rf "$dfs"
}
trap cleanup EXIT
start=$(date +%s)
scripts/dfs/moosefs.sh up "$dfs" a b c >/dev/null
echo "multihost: MooseFS up in $(grep KVTIER_DFS_UP_MS "$dfs/env" | cut -d= -f2) ms (hosts a b c)"
python3 tests/multihost/test_multihost.py --env "$dfs/env" --tool "$build/kvtier_mh_engine" \
  --kvtier "$build/kvtier" "$@"
echo "multihost: done in $(($(date +%s) - start)) s"
