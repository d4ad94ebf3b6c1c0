#!/usr/bin/env bash
# Installs what the multi-host suite (tests/multihost, SPEC M4) needs from Debian for one distributed filesystem, and
# iproute2 (network namespaces, veth pairs). Idempotent: installs only what is missing.
#   scripts/dfs/setup.sh moosefs     MooseFS master, chunkserver, client (FUSE mounts)
#   scripts/dfs/setup.sh glusterfs   GlusterFS server (glusterd, bricks) and client (FUSE mounts)
# The daemons are never started by the packages' service units here: scripts/dfs/<fs>.sh runs them by hand inside
# network namespaces.
set -euo pipefail
case "${1:-}" in
  moosefs) pkgs=(moosefs-master moosefs-chunkserver moosefs-client fuse3 iproute2) ;;
  glusterfs) pkgs=(glusterfs-server glusterfs-client fuse3 iproute2) ;;
  *) echo "usage: scripts/dfs/setup.sh moosefs|glusterfs" >&2; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "dfs/setup.sh $1: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  # policy-rc.d 101: the packages' postinst scripts must not start their daemons on the host's network. Only where
  # no policy exists already, and removed again afterwards.
  policy=/usr/sbin/policy-rc.d
  added_policy=0
  if [ ! -e "$policy" ] && [ -w /usr/sbin ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && added_policy=1
  fi
  rc=0
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || rc=$?
  [ "$added_policy" = 1 ] && rm -f "$policy"
  exit "$rc"
fi
