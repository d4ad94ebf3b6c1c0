#!/usr/bin/env bash
# Runs `kvtier bench io` with the block layer's request events traced and prints what the disk did in each phase
# (bench/io/trace_phases.py): per-request latency, requests in flight, completion batches, refill time, and which
# phases were slow. Needs root and tracefs (/sys/kernel/tracing); uses the release build.
#
#   bench/io/trace_bench_io.sh OUT [bench io options...]
#       e.g. bench/io/trace_bench_io.sh /tmp/t1 --dir /var/tmp --chunk-sizes 2MiB --depths 4 --total 1GiB
#   writes OUT.log (bench io --verbose output), OUT.trace (the kernel trace), OUT.phases (the table, also printed)
#
# The tracing state it changes (buffer size, the two events, tracing_on) is restored on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
out=$1
shift
T=/sys/kernel/tracing
if [ ! -e "$T/trace_marker" ] && [ -d "$T" ] && [ "$(id -u)" = 0 ]; then
  mount -t tracefs nodev "$T" 2>/dev/null || true  # containers often have it unmounted
fi
[ -w "$T/trace_marker" ] || T=/sys/kernel/debug/tracing
if [ ! -w "$T/trace_marker" ]; then
  echo "trace_bench_io.sh: no writable tracefs (/sys/kernel/tracing); needs root and a kernel with tracing" >&2
  exit 1
fi
bin=${KVTIER_BIN:-build/release/kvtier}  # KVTIER_BIN: another build, e.g. an experiment
if [ -z "${KVTIER_BIN:-}" ] && [ ! -x "$bin" ]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target kvtier >/dev/null
fi
events=(block/block_rq_issue block/block_rq_complete)  # trace_marker lines are recorded without an event
# "1408", or "7 (expanded: 1408)" while the buffer has not been used yet: the size it gets once used.
old_size=$(sed -E 's/.*expanded: ([0-9]+).*/\1/' "$T/buffer_size_kb")
old_on=$(cat "$T/tracing_on")
restore() {
  echo 0 >"$T/tracing_on"
  for e in "${events[@]}"; do echo 0 >"$T/events/$e/enable" 2>/dev/null || true; done
  echo "$old_size" >"$T/buffer_size_kb" 2>/dev/null || echo "trace_bench_io.sh: could not restore buffer_size_kb" >&2
  echo "$old_on" >"$T/tracing_on"
}
trap restore EXIT
echo 0 >"$T/tracing_on"
echo >"$T/trace"
echo 65536 >"$T/buffer_size_kb"  # KiB per CPU: a default run records ~20 MB, mostly on the interrupt CPU
for e in "${events[@]}"; do echo 1 >"$T/events/$e/enable"; done
echo 1 >"$T/tracing_on"
rc=0
"$bin" bench io --verbose --trace-marks "$T/trace_marker" "$@" >"$out.log" 2>&1 || rc=$?
echo 0 >"$T/tracing_on"
cat "$T/trace" >"$out.trace"
if [ "$rc" != 0 ]; then
  tail -n 20 "$out.log" >&2
  echo "trace_bench_io.sh: bench io failed (rc $rc), log in $out.log" >&2
  exit "$rc"
fi
if grep -q "LOST.*EVENTS" "$out.trace"; then
  echo "trace_bench_io.sh: warning: the trace buffer overflowed (events lost); use a smaller --total" >&2
fi
python3 bench/io/trace_phases.py "$out.trace" | tee "$out.phases"
