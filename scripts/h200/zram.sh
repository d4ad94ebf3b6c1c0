# shellcheck shell=bash
# Sourced by scripts/h200/bench_io.sh and scripts/h200/headline.sh: a zram block device with ext4 on it, the GPU
# box's stand-in for a fast NVMe array (docs/h200-vllm.md, "The fast device: zram", says what it stands in for and
# what it does not). Needs root and a kernel with zram (/sys/block/zram0, or the module).
#
#   kvtier_zram_up SIZE MOUNTPOINT   SIZE like 16G (binary units K/M/G/T): /dev/zram0 of that size, ext4, mounted
#                                    at MOUNTPOINT; prints its compression algorithm and size
#   kvtier_zram_stats                what zram holds: data written and its compressed size (their ratio near 1.0
#                                    says the data was incompressible, as the measurement needs)
#   kvtier_zram_down                 unmounts and resets the device (its memory goes back); does nothing when no
#                                    device was set up; safe to call twice. Callers run it from their EXIT trap, so
#                                    it runs on failure too.
#
# A device left set up by an earlier call that was killed (no trap runs on SIGKILL) is unmounted and reset before
# a new one is made.

kvtier_zram_mount=""

kvtier_zram_up() {
  local size=$1 mnt=$2 dev=/dev/zram0 sys=/sys/block/zram0
  if ! [[ $size =~ ^[1-9][0-9]*[KMGT]$ ]]; then
    echo "zram: the size must be a number with a unit K, M, G or T (e.g. 16G), got '$size'" >&2
    return 2
  fi
  if [ "$(id -u)" != 0 ]; then echo "zram: needs root" >&2; return 1; fi
  [ -e "$sys" ] || modprobe zram num_devices=1 2>/dev/null || true
  if [ ! -e "$sys" ]; then echo "zram: no $sys (this kernel has no zram)" >&2; return 1; fi
  if [ "$(cat "$sys/disksize")" != 0 ]; then
    echo "zram: $dev is already set up (an earlier run?): unmounting and resetting it"
    grep -q "^$dev " /proc/mounts && umount "$dev"
    echo 1 >"$sys/reset" || { echo "zram: cannot reset $dev (in use?)" >&2; return 1; }
  fi
  echo "$size" >"$sys/disksize" || { echo "zram: cannot size $dev to $size (not enough memory?)" >&2; return 1; }
  kvtier_zram_mount=$mnt  # from here on kvtier_zram_down has something to undo
  mkfs.ext4 -q -F "$dev" || { echo "zram: mkfs.ext4 $dev failed" >&2; return 1; }
  if ! { mkdir -p "$mnt" && mount "$dev" "$mnt"; }; then echo "zram: cannot mount $dev at $mnt" >&2; return 1; fi
  echo "zram: $dev $(numfmt --to=iec "$(cat "$sys/disksize")") (algorithm: $(cat "$sys/comp_algorithm")), ext4 at $mnt"
}

kvtier_zram_stats() {
  local sys=/sys/block/zram0 orig compr
  [ -r "$sys/mm_stat" ] || return 0
  read -r orig compr _ <"$sys/mm_stat"
  if [ "${orig:-0}" -gt 0 ]; then
    echo "zram: holds $(numfmt --to=iec "$orig") of data in $(numfmt --to=iec "$compr")" \
      "(compressed/original $(awk -v c="$compr" -v o="$orig" 'BEGIN { printf "%.3f", c / o }'))"
  fi
}

kvtier_zram_down() {
  [ -n "$kvtier_zram_mount" ] || return 0
  local dev=/dev/zram0 sys=/sys/block/zram0
  kvtier_zram_stats
  if grep -q "^$dev " /proc/mounts; then umount "$dev" || umount -l "$dev"; fi
  echo 1 >"$sys/reset" && echo "zram: $dev reset" || echo "zram: could not reset $dev" >&2
  kvtier_zram_mount=""
}
