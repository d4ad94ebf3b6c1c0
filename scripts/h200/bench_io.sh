#!/usr/bin/env bash
# `kvtier bench io` on the GPU box (its virtual disk, a zram device, 16 cores; no GPU used): builds the release CLI
# there (liburing/xxhash from .gpudeps/ when the box lacks them, scripts/lib/debdeps.sh), then for each device and
# each copier one bench io run with the multi-threaded raw baseline ("raw best", the device's ceiling), 28 MiB and
# 2 MiB chunks, writes and reads. With ZRAM=16G, one call (about 6 minutes, estimated) measures zram and the virtual disk,
# `--copier none` (the vLLM adapter's path) and `--copier host`.
#
# Usage, through the device tool (carry .gpudeps):  [ZRAM=16G] scripts/h200/bench_io.sh [RUNS]   (default 1)
# Env: OUT (results folder, default out/bench-io-box), DIR (the virtual disk's directory, default /var/tmp),
#      ZRAM (SIZE like 16G: also measure an ext4 on /dev/zram0 of that size, reset afterwards, on failure too;
#            scripts/h200/zram.sh), DEVICES (default "zram virtio" with ZRAM, "virtio" without), COPIERS (default
#      "none host"), CHUNKS (chunk sizes, default 28MiB,2MiB), DEPTHS (default 16), TOTAL (bytes per phase,
#      default 2GiB), REPEAT (default 4),
#      RAW_ZRAM / RAW_VIRTIO (the raw baseline's variants per device; defaults below: every thread count and split
#      on zram, whose copy runs in the submitting thread; fewer on the virtual disk, which threads do not speed up
#      and where each phase takes seconds), REREAD (--reread N, default 0), BENCH_ARGS (more bench io arguments),
#      TRACE=1 (the virtual disk's runs through bench/io/trace_bench_io.sh: the block layer's view per phase),
#      KVTIER_BIN (a kvtier binary already built: no build; for trying the script on another machine).
# $OUT gets log.txt (everything printed), DEVICE-COPIER[-runR].json per run and logs.tar.gz (the --verbose logs, the
# build logs, the JSON files again, traces). The device tool brings back 8 files at most: when the runs would make
# more than 6 JSON files, they are only in logs.tar.gz.
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-1}
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "bench_io.sh: RUNS must be a positive integer, got '$runs'" >&2; exit 2; }
OUT=${OUT:-$PWD/out/bench-io-box}
DIR=${DIR:-/var/tmp}
ZRAM=${ZRAM:-}
if [ -n "$ZRAM" ]; then devices=${DEVICES:-zram virtio}; else devices=${DEVICES:-virtio}; fi
copiers=${COPIERS:-none host}
RAW_ZRAM=${RAW_ZRAM:---raw-threads auto --raw-split 4MiB,1MiB}
RAW_VIRTIO=${RAW_VIRTIO:---raw-threads 1,4 --raw-split 4MiB}
for d in $devices; do
  case $d in
    zram) [ -n "$ZRAM" ] || { echo "bench_io.sh: DEVICES has zram but ZRAM (its size, e.g. 16G) is unset" >&2; exit 2; } ;;
    virtio) ;;
    *) echo "bench_io.sh: DEVICES: '$d' is not zram or virtio" >&2; exit 2 ;;
  esac
done
for c in $copiers; do
  [[ $c == none || $c == host ]] || { echo "bench_io.sh: COPIERS: '$c' is not none or host" >&2; exit 2; }
done
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
logs=$(mktemp -d /tmp/kvtier-bench-io-logs.XXXXXX)
zmnt=/mnt/kvtier-zram
# shellcheck source=scripts/h200/zram.sh
source scripts/h200/zram.sh
finish() {
  local rc=$?
  kvtier_zram_down
  tar -C "$logs" -czf "$OUT/logs.tar.gz" . 2>/dev/null || true
  rm -rf "$logs"
  echo "== done ($(date -u +%H:%M:%S) UTC, exit $rc)"
}
trap finish EXIT
start=$(date +%s)
echo "== machine: $(nproc) cores, $(uname -r), $(free -g | awk '/^Mem:/ { print $2 " GiB memory" }')," \
  "$(df -h "$DIR" | tail -1); devices: $devices; copiers: $copiers; $(date -u +%FT%TZ)"
# shellcheck source=scripts/lib/debdeps.sh
source scripts/lib/debdeps.sh
kvtier_use_debs
unset LDFLAGS CXXFLAGS CFLAGS CPPFLAGS
if [ -n "${KVTIER_BIN:-}" ]; then
  bin=$KVTIER_BIN
else
  build=$PWD/build-box
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_TOOLS=ON \
    >"$logs/cmake.log" 2>&1 || { tail -30 "$logs/cmake.log"; exit 1; }
  cmake --build "$build" --target kvtier -j"$(nproc)" >"$logs/build.log" 2>&1 || { tail -30 "$logs/build.log"; exit 1; }
  bin=$build/kvtier
  echo "== built in $(( $(date +%s) - start )) s"
fi
echo "== source: $(git log -1 --format='%h %s' 2>/dev/null | cut -c1-100)$(git diff --quiet HEAD 2>/dev/null || echo ' (with changes)')"
n_json=$(( runs * $(wc -w <<<"$devices") * $(wc -w <<<"$copiers") ))
json_dir=$OUT
if [ "$n_json" -gt 6 ]; then
  json_dir=$logs
  echo "== $n_json runs: their JSON files go into logs.tar.gz only (the device tool brings back 8 files at most)"
fi
if [[ " $devices " == *" zram "* ]]; then kvtier_zram_up "$ZRAM" "$zmnt"; fi

for ((r = 1; r <= runs; r++)); do
  for dev in $devices; do
    if [ "$dev" = zram ]; then dir=$zmnt raw=$RAW_ZRAM; else dir=$DIR raw=$RAW_VIRTIO; fi
    for copier in $copiers; do
      name=$dev-$copier
      [ "$runs" -gt 1 ] && name+=-run$r
      echo "== $name: run $r of $runs, $dir ($(date -u +%H:%M:%S) UTC, $(( $(date +%s) - start )) s in)"
      # shellcheck disable=SC2206,SC2054
      args=(--dir "$dir" --copier "$copier" --chunk-sizes "${CHUNKS:-28MiB,2MiB}" --depths "${DEPTHS:-16}"
        --total "${TOTAL:-2GiB}" --repeat "${REPEAT:-4}" --reread "${REREAD:-0}" $raw ${BENCH_ARGS:-})
      if [[ ${TRACE:-0} == 1 && $dev == virtio ]]; then
        KVTIER_BIN="$bin" bench/io/trace_bench_io.sh "$logs/$name" "${args[@]}" --json "$json_dir/$name.json" \
          >/dev/null
        gzip -f "$logs/$name.trace"
        grep -E "read|slow" "$logs/$name.phases" || true
      else
        "$bin" bench io "${args[@]}" --verbose --json "$json_dir/$name.json" >"$logs/$name.log" 2>&1 ||
          { tail -30 "$logs/$name.log"; exit 1; }
      fi
      [ "$json_dir" = "$logs" ] || cp "$OUT/$name.json" "$logs/"
      grep -vE "^  " "$logs/$name.log" | grep -vE "^(engine:|cpu context)"
      if [ "$dev" = zram ]; then kvtier_zram_stats; fi
    done
  done
done
for dev in $devices; do
  for copier in $copiers; do
    echo "== $dev-$copier: repetitions by which side went first (bench/io/orders.py)"
    python3 bench/io/orders.py "$json_dir/$dev-$copier"*.json || true
  done
done
