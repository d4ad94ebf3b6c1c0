#!/usr/bin/env bash
# A second real distributed filesystem on one machine, as several hosts (SPEC M4): GlusterFS (glusterd and one
# brick of a one-brick volume) inside a server network namespace, and one FUSE client mount of the volume per client
# namespace ("hosts" a, b, c...), joined by veth pairs to a bridge; the network and the mount namespaces are as in
# scripts/dfs/moosefs.sh (scripts/dfs/lib.sh).
#   scripts/dfs/glusterfs.sh up DIR [HOST...]     bring it up (hosts default: a b); prints and writes DIR/env
#   scripts/dfs/glusterfs.sh down DIR             tear everything down (mounts, volume, daemons, namespaces)
#   scripts/dfs/glusterfs.sh exec DIR HOST CMD... run CMD as host HOST (in its network namespace)
#
# Addresses: 10.213.78.0/24 inside the namespaces only. glusterd keeps its state in DIR (working-directory), but its
# command socket (/var/run/glusterd.socket, which the gluster CLI uses: over TCP the CLI is read-only) and the
# bricks' pid and socket files (/var/run/gluster) are the machine's: one GlusterFS cluster per machine at a time;
# `up` refuses to start when another glusterd is running.
# Needs root, /dev/fuse and the Debian packages of scripts/dfs/setup.sh glusterfs.
set -Eeuo pipefail

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || {
  sed -n '6,8p' "$0" >&2
  exit 2
}
dfs_name=glusterfs
subnet=10.213.78
volume=kvtier
# shellcheck source=scripts/dfs/lib.sh
. "$(dirname "$0")/lib.sh"

gl() { timeout 60 gluster --mode=script "$@"; }

fs_up() {
  local tool h
  for tool in glusterd gluster glusterfs; do
    command -v "$tool" >/dev/null || { log "missing $tool (scripts/dfs/setup.sh glusterfs installs it)"; return 3; }
  done
  if pgrep -x glusterd >/dev/null; then
    log "another glusterd runs on this machine (its command socket is the machine's): stop it first"
    return 1
  fi
  mkdir -p "$dir/gluster/state" "$dir/gluster/brick" "$dir/gluster/log"
  # The brick on a tmpfs of its own: its statfs counts the pages the volume's files hold, one atomic figure (the
  # suite's usage sampler; a walk of the brick is not one instant, and overcounts while entries come and go).
  mount -t tmpfs -o "size=${KVTIER_DFS_BRICK_SIZE:-4g},mode=0755" kvtier-brick "$dir/gluster/brick"
  printf '%s\n' "volume management" "    type mgmt/glusterd" "    option working-directory $dir/gluster/state" \
    "    option transport-type socket" "    option transport.socket.listen-port 24007" \
    "    option transport.socket.bind-address $srv_ip" "    option ping-timeout 0" "    option event-threads 1" \
    "    option max-port 60999" "end-volume" >"$dir/etc/glusterd.vol"
  # -N: in the foreground, so that run/glusterd.pid is its pid.
  start_daemon glusterd ip netns exec "$ns_srv" glusterd -N -f "$dir/etc/glusterd.vol" \
    -l "$dir/gluster/log/glusterd.log"
  wait_for 30 "glusterd to listen" ip netns exec "$ns_srv" bash -c "exec 3<>/dev/tcp/$srv_ip/24007"
  wait_for 30 "glusterd's command socket" gl volume list
  gl volume create "$volume" "$srv_ip:$dir/gluster/brick" force >/dev/null
  gl volume start "$volume" >/dev/null
  for h in "$@"; do
    mkdir -p "$dir/mnt/$h"
    start_daemon "mount-$h" nsenter --net="/run/netns/$(host_ns "$h")" glusterfs -N --volfile-server="$srv_ip" \
      --volfile-id="$volume" --log-file="$dir/gluster/log/mount-$h.log" "$dir/mnt/$h"
    wait_for 20 "the mount of host $h" grep -q " $dir/mnt/$h fuse" /proc/mounts
  done
}

# The brick: the volume's bytes as the server stores them (the suite's usage sampler reads its statfs).
fs_env() { echo "KVTIER_DFS_BRICK=$dir/gluster/brick"; }

fs_stop_hook() {
  if [ -f "$dir/run/glusterd.pid" ]; then stop_volume; fi
  if mountpoint -q "$dir/gluster/brick"; then umount "$dir/gluster/brick" || umount -l "$dir/gluster/brick"; fi
}

stop_volume() {
  # The brick process is glusterd's child in another session: stop the volume through glusterd first.
  gl volume stop "$volume" force >/dev/null 2>&1 || true
  gl volume delete "$volume" >/dev/null 2>&1 || true
  local pid
  for pid in $(pgrep -f "glusterfsd.*$dir/gluster/brick" || true); do kill -KILL "$pid" 2>/dev/null || true; done
}

dfs_main "$@"
