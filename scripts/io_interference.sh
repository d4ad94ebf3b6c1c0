#!/usr/bin/env bash
# Does the disk get slower while the guest's CPUs copy memory? Runs `kvtier bench io` (2 MiB files, depth 4; only
# its raw side's reads are used) with no background load, with a memcpy load and with a register-only spin load
# (bench/io/hog.cc, one thread, busy half of the time), alternating, ROUNDS times, and prints the raw read GB/s of
# each condition. DIR must be on the disk to measure and support O_DIRECT (not tmpfs).
# The engine's read path does memory-heavy work per byte (verify, copy out); this says how much such work by
# itself costs the disk on this machine. Usage: scripts/io_interference.sh [DIR] [ROUNDS]   (defaults /var/tmp 3)
# HOG_CPUS="0 1": also run each load pinned to each of these CPUs (taskset), e.g. on and off the CPU that takes
# the disk's interrupts (/proc/interrupts); unpinned loads are then left out.
# HOG_KINDS="read write": which loads (bench/io/hog.cc: memcpy read sread write stream cached avx scalar alu spin);
# default "memcpy spin".
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/var/tmp}
rounds=${2:-3}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "io_interference: ROUNDS must be a positive integer, got '$rounds'" >&2; exit 2; }
kvtier=${KVTIER_BIN:-build/release/kvtier}
if [[ ! -x $kvtier ]]; then
  cmake --preset release >/dev/null && cmake --build --preset release --target kvtier -j"$(nproc)" >/dev/null
fi
hog=$(mktemp -d)/hog
trap 'rm -rf "$(dirname "$hog")"; [[ -n ${hog_pid:-} ]] && kill "$hog_pid" 2>/dev/null || true' EXIT
g++ -O2 -std=c++20 -o "$hog" bench/io/hog.cc
declare -A reads
kinds=(${HOG_KINDS:-memcpy spin})
for kind in "${kinds[@]}"; do
  [[ $kind =~ ^(memcpy|read|sread|write|stream|cached|avx|scalar|alu|spin)$ ]] ||
    { echo "io_interference: HOG_KINDS: unknown load '$kind' (memcpy read sread write stream cached avx scalar alu spin)" >&2; exit 2; }
done
conds=(none "${kinds[@]}")
if [[ -n ${HOG_CPUS:-} ]]; then
  conds=(none)
  for cpu in $HOG_CPUS; do
    [[ $cpu =~ ^[0-9]+$ ]] || { echo "io_interference: HOG_CPUS must list CPU numbers, got '$HOG_CPUS'" >&2; exit 2; }
    for kind in "${kinds[@]}"; do conds+=("$kind@$cpu"); done
  done
fi
for ((r = 1; r <= rounds; r++)); do
  for cond in "${conds[@]}"; do
    hog_pid=
    if [[ $cond != none ]]; then
      kind=${cond%@*}
      if [[ $cond == *@* ]]; then taskset -c "${cond#*@}" "$hog" "$kind" 0.5 & else "$hog" "$kind" 0.5 & fi
      hog_pid=$!
    fi
    out=$("$kvtier" bench io --dir "$dir" --chunk-sizes 2MiB --depths 4 --repeat 4 --total 1GiB --raw-threads 1 \
      --raw-split none --verbose)
    if [[ -n $hog_pid ]]; then kill "$hog_pid" 2>/dev/null || true; wait "$hog_pid" 2>/dev/null || true; hog_pid=; fi
    vals=$(grep -E 'rep [0-9]+ raw +read' <<<"$out" | awk '{print $8}' | tr '\n' ' ' || true)
    if [[ -z $vals ]]; then echo "io_interference: no raw read figures in the bench output:" >&2; echo "$out" >&2; exit 1; fi
    reads[$cond]+="$vals"
    echo "round $r, background $cond: raw read GB/s $vals" >&2
  done
done
args=()
for cond in "${conds[@]}"; do args+=("$cond" "${reads[$cond]}"); done
python3 - "${args[@]}" <<'PY'
import statistics, sys
pairs = list(zip(sys.argv[1::2], sys.argv[2::2]))
label = {"none": "none", "memcpy": "memcpy (50%)", "read": "read (50%)", "sread": "sread (50%)", "write": "write (50%)",
         "stream": "stream (50%)", "cached": "cached (50%)", "avx": "avx (50%)", "scalar": "scalar (50%)",
         "alu": "alu (50%)", "spin": "spin (50%)"}
vals = {c: [float(x) for x in v.split()] for c, v in pairs}
base = statistics.median(vals["none"])
print("background load      raw 2 MiB reads at depth 4, GB/s: median (n)   vs none")
for c, _ in pairs:
    kind, _, cpu = c.partition("@")
    name = label[kind] + (f" on CPU {cpu}" if cpu else "")
    m = statistics.median(vals[c])
    print(f"{name:<24} {m:6.3f} ({len(vals[c])})                              {m / base:5.3f}")
PY
