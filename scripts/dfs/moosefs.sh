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
# Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN), /dev/fuse and the Debian packages of scripts/dfs/setup_moosefs.sh.
# `up` fails cleanly: anything it started is torn down again before it exits non-zero.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || {
  sed -n '6,9p' "$0" >&2
  exit 2
}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
# Names derived from DIR, so that several clusters (two CI jobs, a leftover) never collide; short: IFNAMSIZ is 16.
tag=$(printf '%s' "$dir" | md5sum | cut -c1-6)
ns_srv=kvt$tag-s
br=kvtbr$tag
subnet=10.213.77
srv_ip=$subnet.1

log() { echo "moosefs: $*" >&2; }

host_ns() { echo "kvt$tag-$1"; }

down() {
  local rc=0
  # Client mounts first (their daemons then exit), then the servers, then the namespaces (which removes the links).
  for m in "$dir"/mnt/*; do
    [ -d "$m" ] || continue
    if mountpoint -q "$m" 2>/dev/null || grep -q " $m fuse" /proc/mounts; then
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || { log "cannot unmount $m"; rc=1; }
    fi
  done
  local pids=()
  for pidfile in "$dir"/run/*.pid; do
    [ -f "$pidfile" ] || continue
    pids+=("$(cat "$pidfile")")
    rm -f "$pidfile"
  done
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^kvt$tag-" || true); do
    ip netns del "$ns" 2>/dev/null || { log "cannot delete namespace $ns"; rc=1; }
  done
  rm -rf "$dir"/run "$dir"/master "$dir"/chunks "$dir"/etc "$dir"/env
  rmdir "$dir"/mnt/* "$dir"/mnt 2>/dev/null || true
  return $rc
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local secs=$1 what=$2
  shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "timed out after ${secs}s waiting for $what"
      return 1
    fi
    sleep 0.1
  done
}

start_daemon() {  # start_daemon NAME NETNS-ARGS... -- CMD...: background, pid in run/NAME.pid, log in run/NAME.log
  local name=$1
  shift
  "$@" >"$dir/run/$name.log" 2>&1 &
  echo $! >"$dir/run/$name.pid"
}

up() {
  local hosts=("$@")
  ((${#hosts[@]})) || hosts=(a b)
  local t0=$EPOCHREALTIME
  for tool in ip nsenter mfsmaster mfschunkserver mfsmount; do
    command -v "$tool" >/dev/null || { log "missing $tool (scripts/dfs/setup_moosefs.sh installs it)"; return 3; }
  done
  [ -c /dev/fuse ] || { log "no /dev/fuse"; return 3; }
  if ip netns list 2>/dev/null | grep -q "^$ns_srv\b"; then
    log "already up in $dir (run: $0 down $dir)"
    return 1
  fi
  trap 'rc=$?; log "bring-up failed (rc $rc): tearing down"; tail -n 20 "$dir"/run/*.log >&2 2>/dev/null || true; down || true; exit $rc' ERR
  mkdir -p "$dir"/run "$dir"/master "$dir"/chunks/hdd "$dir"/etc "$dir"/mnt

  # Network: a bridge in the server namespace, one veth pair per host.
  ip netns add "$ns_srv"
  ip -n "$ns_srv" link set lo up
  ip -n "$ns_srv" link add "$br" type bridge
  ip -n "$ns_srv" addr add "$srv_ip/24" dev "$br"
  ip -n "$ns_srv" link set "$br" up
  local i=2
  for h in "${hosts[@]}"; do
    local ns
    ns=$(host_ns "$h")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # Created inside the server namespace, then one end moved: the pair never appears in the machine's namespace.
    ip -n "$ns_srv" link add "v$tag$h" type veth peer name "eth0" netns "$ns"
    ip -n "$ns_srv" link set "v$tag$h" master "$br" up
    ip -n "$ns" addr add "$subnet.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    echo "$h $subnet.$i" >>"$dir/run/hosts"
    i=$((i + 1))
  done

  # Master.
  cp /var/lib/mfs/metadata.mfs.empty "$dir/master/metadata.mfs"
  cat >"$dir/etc/mfsexports.cfg" <<EOF
$subnet.0/24 / rw,alldirs,maproot=0:0
EOF
  cat >"$dir/etc/mfsmaster.cfg" <<EOF
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $dir/master
EXPORTS_FILENAME = $dir/etc/mfsexports.cfg
TOPOLOGY_FILENAME = $dir/etc/mfstopology.cfg
MATOML_LISTEN_HOST = $srv_ip
MATOCS_LISTEN_HOST = $srv_ip
MATOCL_LISTEN_HOST = $srv_ip
EOF
  : >"$dir/etc/mfstopology.cfg"
  start_daemon master ip netns exec "$ns_srv" mfsmaster -c "$dir/etc/mfsmaster.cfg" -f
  wait_for 20 "the master to listen" ip netns exec "$ns_srv" bash -c "exec 3<>/dev/tcp/$srv_ip/9421"

  # One chunkserver (goal 1: one copy of each chunk).
  echo "$dir/chunks/hdd" >"$dir/etc/mfshdd.cfg"
  cat >"$dir/etc/mfschunkserver.cfg" <<EOF
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $dir/chunks
HDD_CONF_FILENAME = $dir/etc/mfshdd.cfg
HDD_LEAVE_SPACE_DEFAULT = 1GiB
BIND_HOST = $srv_ip
MASTER_HOST = $srv_ip
CSSERV_LISTEN_HOST = $srv_ip
EOF
  start_daemon chunkserver ip netns exec "$ns_srv" mfschunkserver -c "$dir/etc/mfschunkserver.cfg" -f
  wait_for 20 "the chunkserver to listen" ip netns exec "$ns_srv" bash -c "exec 3<>/dev/tcp/$srv_ip/9422"

  # Client mounts: network namespace only (see the header on mount namespaces).
  for h in "${hosts[@]}"; do
    local ns
    ns=$(host_ns "$h")
    mkdir -p "$dir/mnt/$h"
    start_daemon "mount-$h" nsenter --net="/run/netns/$ns" \
      mfsmount "$dir/mnt/$h" -f -H "$srv_ip" -o nosuid,nodev
    wait_for 20 "the mount of host $h" grep -q " $dir/mnt/$h fuse" /proc/mounts
  done
  # The volume is writable once the chunkserver has registered with the master: write through the first host and
  # read it back through every other one.
  local first=${hosts[0]}
  wait_for 30 "a write through host $first" bash -c "echo probe > '$dir/mnt/$first/.kvtier-dfs-probe'"
  for h in "${hosts[@]}"; do
    wait_for 10 "host $h to see host $first's file" grep -q probe "$dir/mnt/$h/.kvtier-dfs-probe"
  done
  rm -f "$dir/mnt/$first/.kvtier-dfs-probe"
  local ms
  ms=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d", (b - a) * 1000 }')
  {
    echo "KVTIER_DFS=moosefs"
    echo "KVTIER_DFS_DIR=$dir"
    echo "KVTIER_DFS_HOSTS=\"${hosts[*]}\""
    echo "KVTIER_DFS_SERVER_NS=$ns_srv"
    for h in "${hosts[@]}"; do
      echo "KVTIER_DFS_NS_$h=$(host_ns "$h")"
      echo "KVTIER_DFS_MNT_$h=$dir/mnt/$h"
    done
    echo "KVTIER_DFS_UP_MS=$ms"
  } >"$dir/env"
  trap - ERR
  cat "$dir/env"
  log "up in $ms ms: hosts ${hosts[*]}, mounts under $dir/mnt"
}

case "$cmd" in
  up)
    shift 2
    up "$@"
    ;;
  down)
    down
    ;;
  exec)
    h=${3:?host}
    shift 3
    exec ip netns exec "$(host_ns "$h")" "$@"
    ;;
  *)
    sed -n '6,9p' "$0" >&2
    exit 2
    ;;
esac
