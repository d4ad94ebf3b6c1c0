# Shared by the filesystem scripts of scripts/dfs (moosefs.sh, glusterfs.sh): names, the network of namespaces, the
# background daemons, the teardown and the command line. Sourced after the script has set `cmd` and `dir` (its first
# two arguments), `dfs_name` (the log prefix) and `subnet` (three octets), and defined fs_up HOST... (its daemons and
# one client mount per host under $dir/mnt) and optionally fs_stop_hook and fs_env (more lines for DIR/env);
# moosefs.sh's header describes the network
# and the mount namespaces.

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
# Names derived from DIR, so that several clusters (two CI jobs, a leftover) never collide; short: IFNAMSIZ is 16.
tag=$(printf '%s' "$dir" | md5sum | cut -c1-6)
ns_srv=kvt$tag-s
br=kvtbr$tag
srv_ip=$subnet.1

log() { echo "$dfs_name: $*" >&2; }

host_ns() { echo "kvt$tag-$1"; }

# Unmounts the client mounts, runs fs_stop_hook (when defined), stops the daemons of run/*.pid, deletes the
# namespaces (which removes the veth pairs and the bridge).
down() {
  local rc=0
  for m in "$dir"/mnt/*; do
    [ -d "$m" ] || continue
    if mountpoint -q "$m" 2>/dev/null || grep -q " $m fuse" /proc/mounts; then
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || { log "cannot unmount $m"; rc=1; }
    fi
  done
  if declare -F fs_stop_hook >/dev/null; then fs_stop_hook || rc=1; fi
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
  rm -rf "$dir"/run "$dir"/master "$dir"/chunks "$dir"/etc "$dir"/env "$dir"/gluster
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

start_daemon() {  # start_daemon NAME CMD...: in the background, pid in run/NAME.pid, output in run/NAME.log
  local name=$1
  shift
  "$@" >"$dir/run/$name.log" 2>&1 &
  echo $! >"$dir/run/$name.pid"
}

# A bridge in the server namespace ($subnet.1), one namespace and veth pair per host ($subnet.2, .3, ...).
net_up() {
  ip netns add "$ns_srv"
  ip -n "$ns_srv" link set lo up
  ip -n "$ns_srv" link add "$br" type bridge
  ip -n "$ns_srv" addr add "$srv_ip/24" dev "$br"
  ip -n "$ns_srv" link set "$br" up
  local i=2 h ns
  for h in "$@"; do
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
}

# Ready for what kvtier's usage records do (layout/usage_ledger.h: a small file rewritten in place and fsynced,
# read by the others with O_DIRECT): three rewrites in a row by the first host that each return within 2 s and are
# seen by every other host within 2 s. A fresh MooseFS passes the first probe but stalls a rewrite's fsync for ~8 s
# until its chunkserver has reported its space to the master; records written meanwhile reach no other host, and
# a budget test run then measures the filesystem's start-up, not kvtier.
probe_rewrites() {
  local first=$1 h i=0 good=0 v got deadline=$((SECONDS + 60))
  local f="$dir/mnt/$first/.kvtier-dfs-rewrite"
  printf 0000 >"$f"
  while ((good < 3)); do
    if ((SECONDS >= deadline)); then
      log "timed out after 60s waiting for in-place rewrites on host $first to reach the other hosts"
      return 1
    fi
    i=$((i + 1))
    v=$(printf '%04d' "$i")
    if ! printf '%s' "$v" | timeout 2 dd of="$f" bs=4 count=1 conv=notrunc,fsync status=none 2>/dev/null; then
      good=0
      continue
    fi
    for h in "${@:2}"; do
      local seen=0 until=$((SECONDS + 2))
      while ((SECONDS <= until)); do
        got=$(timeout 2 dd if="$dir/mnt/$h/.kvtier-dfs-rewrite" bs=4096 count=1 iflag=direct status=none 2>/dev/null |
          head -c4) || true
        if [ "$got" = "$v" ]; then
          seen=1
          break
        fi
        sleep 0.05
      done
      if ((!seen)); then
        good=-1
        break
      fi
    done
    good=$((good + 1))
  done
  rm -f "$f"
}

# Once every host reads what the first one wrote: writes and prints DIR/env. t0: $EPOCHREALTIME at the start.
finish_up() {
  local t0=$1
  shift
  local hosts=("$@") first=$1 h ms
  wait_for 30 "a write through host $first" bash -c "echo probe > '$dir/mnt/$first/.kvtier-dfs-probe'"
  for h in "${hosts[@]}"; do
    wait_for 10 "host $h to see host $first's file" grep -q probe "$dir/mnt/$h/.kvtier-dfs-probe"
  done
  rm -f "$dir/mnt/$first/.kvtier-dfs-probe"
  probe_rewrites "${hosts[@]}"
  ms=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d", (b - a) * 1000 }')
  {
    echo "KVTIER_DFS=$dfs_name"
    echo "KVTIER_DFS_DIR=$dir"
    echo "KVTIER_DFS_HOSTS=\"${hosts[*]}\""
    echo "KVTIER_DFS_SERVER_NS=$ns_srv"
    for h in "${hosts[@]}"; do
      echo "KVTIER_DFS_NS_$h=$(host_ns "$h")"
      echo "KVTIER_DFS_MNT_$h=$dir/mnt/$h"
    done
    echo "KVTIER_DFS_UP_MS=$ms"
    if declare -F fs_env >/dev/null; then fs_env; fi
  } >"$dir/env"
  cat "$dir/env"
  log "up in $ms ms: hosts ${hosts[*]}, mounts under $dir/mnt"
}

# up DIR [HOST...] | down DIR | exec DIR HOST CMD...
dfs_main() {
  case "$cmd" in
    up)
      shift 2
      local hosts=("$@")
      ((${#hosts[@]})) || hosts=(a b)
      command -v ip >/dev/null && command -v nsenter >/dev/null || { log "missing ip or nsenter"; return 3; }
      [ -c /dev/fuse ] || { log "no /dev/fuse"; return 3; }
      if ip netns list 2>/dev/null | grep -q "^$ns_srv\b"; then
        log "already up in $dir (run: $0 down $dir)"
        return 1
      fi
      trap 'rc=$?; log "bring-up failed (rc $rc): tearing down"; tail -n 20 "$dir"/run/*.log >&2 2>/dev/null || true; down || true; exit $rc' ERR
      mkdir -p "$dir"/run "$dir"/etc "$dir"/mnt
      local t0=$EPOCHREALTIME
      net_up "${hosts[@]}"
      fs_up "${hosts[@]}"
      finish_up "$t0" "${hosts[@]}"
      trap - ERR
      ;;
    down)
      down
      ;;
    exec)
      local h=${3:?host}
      shift 3
      exec ip netns exec "$(host_ns "$h")" "$@"
      ;;
    *)
      sed -n '6,9p' "$0" >&2
      return 2
      ;;
  esac
}
