#!/usr/bin/env bash
# A real distributed filesystem on one machine, as several hosts (SPEC M4): MooseFS master + chunkserver inside a
# server network namespace, and one FUSE client mount of the same volume per client namespace ("hosts" a, b, c...),
# all joined by veth pairs to a bridge in the server namespace.
#
#   scripts/dfs/moosefs.sh up DIR [HOST...]     bring it up (hosts default: a b); prints and writes DIR/env
#   scripts/dfs/moosefs.sh down DIR             tear everything down (mounts, daemons, namespaces, links)
#   scripts/dfs/moosefs.sh exec DIR HOST CMD... run CMD as host HOST (in its network namespace)
#
# Network: every address is inside the namespaces this script creates (10.213.77.0/24 on the bridge: .1 the server,
# .2.. the hosts) or loopback; nothing is routed anywhere else (no default route in any namespace, no link to the
# machine's own network).
#
# Mount namespaces: `ip netns exec` gives each command a private mount namespace (a slave of the machine's), so a
# FUSE mount made inside it is invisible to the machine and dies with it. The client daemons (mfsmount) therefore
# enter only the network namespace (nsenter --net): their mounts DIR/mnt/<host> live in the machine's mount
# namespace, visible to every process (an engine started with `ip netns exec` sees them, being a slave of it),
# while all of each client's traffic goes over its own namespace's veth. Each mount is its own FUSE superblock with
# its own page cache and MooseFS client caches, as on separate machines.
#
# Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN), /dev/fuse and the Debian packages of scripts/dfs/setup.sh moosefs.
# `up` fails cleanly: anything it started is torn down again before it exits non-zero.
set -Eeuo pipefail

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || {
  sed -n '6,9p' "$0" >&2
  exit 2
}
dfs_name=moosefs
subnet=10.213.77
# shellcheck source=scripts/dfs/lib.sh
. "$(dirname "$0")/lib.sh"

fs_up() {
  local tool h
  for tool in mfsmaster mfschunkserver mfsmount; do
    command -v "$tool" >/dev/null || { log "missing $tool (scripts/dfs/setup.sh moosefs installs it)"; return 3; }
  done
  mkdir -p "$dir"/master "$dir"/chunks/hdd
  # Master.
  cp /var/lib/mfs/metadata.mfs.empty "$dir/master/metadata.mfs"
  echo "$subnet.0/24 / rw,alldirs,maproot=0:0" >"$dir/etc/mfsexports.cfg"
  printf '%s\n' "WORKING_USER = root" "WORKING_GROUP = root" "DATA_PATH = $dir/master" \
    "EXPORTS_FILENAME = $dir/etc/mfsexports.cfg" "TOPOLOGY_FILENAME = $dir/etc/mfstopology.cfg" \
    "MATOML_LISTEN_HOST = $srv_ip" "MATOCS_LISTEN_HOST = $srv_ip" "MATOCL_LISTEN_HOST = $srv_ip" \
    >"$dir/etc/mfsmaster.cfg"
  : >"$dir/etc/mfstopology.cfg"
  start_daemon master ip netns exec "$ns_srv" mfsmaster -c "$dir/etc/mfsmaster.cfg" -f
  wait_for 20 "the master to listen" ip netns exec "$ns_srv" bash -c "exec 3<>/dev/tcp/$srv_ip/9421"

  # One chunkserver (goal 1: one copy of each chunk).
  echo "$dir/chunks/hdd" >"$dir/etc/mfshdd.cfg"
  printf '%s\n' "WORKING_USER = root" "WORKING_GROUP = root" "DATA_PATH = $dir/chunks" \
    "HDD_CONF_FILENAME = $dir/etc/mfshdd.cfg" "HDD_LEAVE_SPACE_DEFAULT = 1GiB" "BIND_HOST = $srv_ip" \
    "MASTER_HOST = $srv_ip" "CSSERV_LISTEN_HOST = $srv_ip" >"$dir/etc/mfschunkserver.cfg"
  start_daemon chunkserver ip netns exec "$ns_srv" mfschunkserver -c "$dir/etc/mfschunkserver.cfg" -f
  wait_for 20 "the chunkserver to listen" ip netns exec "$ns_srv" bash -c "exec 3<>/dev/tcp/$srv_ip/9422"

  # Client mounts: network namespace only (see the header on mount namespaces).
  for h in "$@"; do
    mkdir -p "$dir/mnt/$h"
    start_daemon "mount-$h" nsenter --net="/run/netns/$(host_ns "$h")" \
      mfsmount "$dir/mnt/$h" -f -H "$srv_ip" -o nosuid,nodev
    wait_for 20 "the mount of host $h" grep -q " $dir/mnt/$h fuse" /proc/mounts
  done
}

dfs_main "$@"
