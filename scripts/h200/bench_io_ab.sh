#!/usr/bin/env bash
# Two engines in one device call: `kvtier bench io` of this tree (B) and of another commit (A) on the same zram
# device, alternately A B B A per round, so a change to the engine is judged against the box's drift, which moves
# raw best by 10% between calls (bench/results/io/box-placed-2026-12-02/README.md). Each run has its own raw baseline;
# compare the engines' ratios to raw best and to raw+xxh3 best.
#
# Usage, through the device tool (carry .gpudeps and the A tree):
#   git archive COMMIT | tar -x -C ab-old      (here; add ab-old to .git/info/exclude and carry it)
#   ZRAM=24G A_SRC=ab-old scripts/h200/bench_io_ab.sh [ROUNDS]   (default 2: A B B A A B B A)
# Env: OUT (default out/bench-io-ab), ZRAM (size of /dev/zram0, required), CHUNKS (default 28MiB), REPEAT (default 4),
#      RAW (raw variants, default '--raw-threads 16 --raw-split 4MiB --raw-verify'), BENCH_ARGS (more arguments).
# $OUT gets log.txt (with the summary: per side the medians over its runs) and runs.tar.gz (A-N.json, B-N.json and
# their --verbose logs, one per run: the device tool brings back 8 files at most).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-2}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "bench_io_ab.sh: ROUNDS must be a positive integer, got '$rounds'" >&2; exit 2; }
[ -n "${ZRAM:-}" ] || { echo "bench_io_ab.sh: ZRAM (the zram device's size, e.g. 24G) is unset" >&2; exit 2; }
[ -f "${A_SRC:-}/CMakeLists.txt" ] || { echo "bench_io_ab.sh: A_SRC='${A_SRC:-}' is no source tree" >&2; exit 2; }
OUT=${OUT:-$PWD/out/bench-io-ab}
mkdir -p "$OUT/runs"
exec > >(tee "$OUT/log.txt") 2>&1
zmnt=/mnt/kvtier-zram
# shellcheck source=scripts/h200/zram.sh
source scripts/h200/zram.sh
trap 'kvtier_zram_down; tar -C "$OUT" -czf "$OUT/runs.tar.gz" runs && rm -rf "$OUT/runs"' EXIT
# shellcheck source=scripts/lib/debdeps.sh
source scripts/lib/debdeps.sh
kvtier_use_debs
unset LDFLAGS CXXFLAGS CFLAGS CPPFLAGS
build() {  # build SRC DIR
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_TOOLS=ON >"$2.cmake.log" 2>&1 &&
    cmake --build "$2" --target kvtier -j"$(nproc)" >"$2.build.log" 2>&1 || { tail -30 "$2".*.log; exit 1; }
}
start=$(date +%s)
build "$A_SRC" "$PWD/build-ab-a"
build . "$PWD/build-ab-b"
echo "== built A ($A_SRC) and B (this tree: $(git log -1 --format=%h 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null ||
  echo ' with changes')) in $(( $(date +%s) - start )) s"
kvtier_zram_up "$ZRAM" "$zmnt"
n=0
for ((r = 1; r <= rounds; r++)); do
  for side in A B B A; do
    n=$((n + 1))
    bin=$PWD/build-ab-$(tr AB ab <<<"$side")/kvtier
    # shellcheck disable=SC2086
    "$bin" bench io --dir "$zmnt" --copier none --chunk-sizes "${CHUNKS:-28MiB}" --depths 16 --total 2GiB \
      --repeat "${REPEAT:-4}" ${RAW:---raw-threads 16 --raw-split 4MiB --raw-verify} ${BENCH_ARGS:-} \
      --json "$OUT/runs/$side-$n.json" >"$OUT/runs/$side-$n.log" 2>&1 || { tail -30 "$OUT/runs/$side-$n.log"; exit 1; }
    echo "== $side run $n ($(( $(date +%s) - start )) s in)"
    grep -E "^ *[0-9]+MiB +[0-9]+ +[0-9]+ .* (read|write) " "$OUT/runs/$side-$n.log" || true
  done
done
python3 - "$OUT/runs" <<'EOF'
import glob, json, os, statistics, sys
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "[AB]-*.json"))):
    side = os.path.basename(f)[0]
    for r in json.load(open(f))["results"]:
        for op in ("read", "write"):
            rows.setdefault((r["chunk_bytes"] >> 20, op, side), []).append(
                (r[f"median_engine_{op}_gbps"], r.get(f"{op}_ratio_to_best"), r.get(f"{op}_ratio_to_verify_best")))
print("chunk   op     side  runs  engine GB/s  / raw best  / raw+xxh3 best   (medians over the side's runs)")
for (mib, op, side), xs in sorted(rows.items()):
    med = lambda i: statistics.median([x[i] for x in xs if x[i] is not None] or [float("nan")])
    print(f"{mib:4d}MiB  {op:5s}  {side}     {len(xs):3d}  {med(0):11.2f}  {med(1):10.3f}  {med(2):15.3f}")
EOF
