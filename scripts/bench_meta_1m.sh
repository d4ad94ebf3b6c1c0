#!/usr/bin/env bash
# `kvtier bench meta` at 10k, 100k and 1M entries (issue 2) on an ext4 filesystem without online discard: a sparse
# image file under DIR (default /var/tmp), loop-mounted. The root mount here has `discard`, which makes every unlink
# wait for the virtual disk's trim (~300/s: evicting and removing 1M entries would take about an hour). Needs root
# (mkfs, mount). Figures: docs/performance.md, "Metadata rates". Usage:
#   scripts/bench_meta_1m.sh [--dir DIR] [--json OUT] [--kvtier PATH]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=/var/tmp json=/tmp/bench-meta-1m.json kvtier=build/release/kvtier
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir=$2; shift 2;; --json) json=$2; shift 2;; --kvtier) kvtier=$2; shift 2;;
    -h|--help) sed -n '2,6p' "$0"; exit 0;;
    *) echo "bench_meta_1m.sh: unknown argument $1" >&2; exit 2;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "bench_meta_1m.sh: needs root (mkfs.ext4, mount -o loop)" >&2; exit 1; }
if [ ! -x "$kvtier" ]; then
  cmake --preset release >/dev/null && cmake --build --preset release -j"$(nproc)" --target kvtier >/dev/null
fi
img=$dir/kvtier-bench-meta.$$.img mnt=$(mktemp -d /tmp/kvtier-bench-meta.XXXXXX)
cleanup() { mountpoint -q "$mnt" && umount "$mnt"; rm -f "$img"; rmdir "$mnt" 2>/dev/null || true; }
trap cleanup EXIT
truncate -s 24G "$img"
mkfs.ext4 -q -F -N 1400000 "$img"
mount -o loop,nodiscard "$img" "$mnt"
"$kvtier" bench meta --dir "$mnt" --entries 10000,100000,1000000 --json "$json"
