#!/usr/bin/env bash
# Runs HERE (PyPI reachable). Downloads the wheel set H200_SET names (scripts/h200/set.sh; default
# 0.26: vLLM 0.26.0 (CUDA wheel), LMCache 0.5.3) and every dependency the H200 box lacks (the list
# in scripts/h200/wheels.lock, wheels-0.34.lock for H200_SET=0.34), repacks them
# uncompressed (dropping vLLM files that dense bf16 serving on Hopper never loads: see
# repack.py), packs them into one .tar.xz and splits it into parts small enough to carry one
# per device call. Output (ignored by git through .git/info/exclude):
#   .h200/wheels/           the downloaded wheels, as PyPI serves them
#   .h200/kvtier-h200.tar.xz  the archive (repacked wheels under wheels/; kvtier-h200-0.34.tar.xz, ...)
#   .h200/parts/partNN      the archive split in PART_MIB MiB pieces (default 48; parts-0.34/ ...)
#   .h200/manifest          set, count, sizes and sha256 of the archive and of each part (manifest-0.34)
# Options: --relock (re-resolve wheels.lock with resolve.py first), --keep-moe (keep vLLM's
# MoE kernels, about 40 MiB more in the archive), --resplit (only split the existing archive
# again in PART_MIB pieces and rewrite the manifest: when the working tree grew and a part no
# longer fits beside it in one call).
# Then carry the parts to the box: docs/h200-vllm.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/h200/set.sh
ROOT=$PWD
H=$ROOT/.h200
PART_MIB=${PART_MIB:-48}
RELOCK=0
KEEP_MOE=
RESPLIT=0
for a in "$@"; do
  case $a in
    --relock) RELOCK=1 ;;
    --keep-moe) KEEP_MOE=--keep-moe ;;
    --resplit) RESPLIT=1 ;;
    *) echo "unknown option $a" >&2; exit 2 ;;
  esac
done
grep -qxF '/.h200/' .git/info/exclude 2>/dev/null || echo '/.h200/' >> .git/info/exclude
fetch_and_pack() {
  mkdir -p "$H/wheels"
  if [[ $RELOCK == 1 ]]; then
    python3 scripts/h200/resolve.py "$H/wheels" --set "$H200_SET"
  fi

  # Every glibc 2.17-2.35 manylinux tag: older pips do not expand a
  # manylinux_2_X tag to the ones below it, so each is named, newest first (pip prefers the earlier
  # tag where a release has several wheels, and the lock names those).
  PLAT=()
  for minor in $(seq 35 -1 17); do PLAT+=(--platform "manylinux_2_${minor}_x86_64"); done
  PLAT+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)

  # name==version of every wheel in the lock; download the ones not already here.
  mapfile -t WHEELS < <(grep -v '^#' "$LOCK" | awk 'NF {print $1}')
  mapfile -t SPECS < <(grep -v '^#' "$LOCK" | sed -n 's/.*# \([^ ]*==[^ ]*\) <-.*/\1/p')
  [[ ${#WHEELS[@]} == "${#SPECS[@]}" ]] || { echo "wheels.lock is malformed" >&2; exit 1; }
  missing=()
  for i in "${!WHEELS[@]}"; do
    [[ -f $H/wheels/${WHEELS[$i]} ]] || missing+=("${SPECS[$i]}")
  done
  if ((${#missing[@]})); then
    echo "downloading ${#missing[@]} wheels"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --abi cp312 --abi abi3 --abi none "${PLAT[@]}" -d "$H/wheels" "${missing[@]}"
  fi
  for w in "${WHEELS[@]}"; do
    [[ -f $H/wheels/$w ]] || { echo "missing after download: $w" >&2; exit 1; }
  done

  # Stage exactly the locked wheels (the download folder may hold others from a relock).
  STAGE=$H/stage
  rm -rf "$STAGE" && mkdir -p "$STAGE/src" "$STAGE/pkg/wheels"
  for w in "${WHEELS[@]}"; do ln "$H/wheels/$w" "$STAGE/src/$w"; done
  python3 scripts/h200/repack.py "$STAGE/src" "$STAGE/pkg/wheels" $KEEP_MOE
  # A list of the wheels travels inside the archive; install.sh installs exactly these.
  (cd "$STAGE/pkg/wheels" && ls *.whl) > "$STAGE/pkg/wheels.txt"

  echo "packing $(du -sh "$STAGE/pkg" | cut -f1) with xz -9 (a few minutes)"
  # Sorted names, fixed owner and time: the same wheels give the same archive.
  tar -C "$STAGE/pkg" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - wheels wheels.txt \
    | xz -9 -T2 -c > "$ARCHIVE.tmp"
  mv "$ARCHIVE.tmp" "$ARCHIVE"
  rm -rf "$STAGE"
}

ARCHIVE=$H/$SET_ARCHIVE
if [[ $RESPLIT == 1 ]]; then
  [[ -f $ARCHIVE ]] || { echo "--resplit: no $ARCHIVE to split; run without --resplit first" >&2; exit 1; }
else
  fetch_and_pack
fi

PARTS=$ROOT/$SET_PARTS
rm -rf "$PARTS" && mkdir -p "$PARTS"
split -b "${PART_MIB}M" -d -a 2 "$ARCHIVE" "$PARTS/part"
# Number parts from 01.
n=0
for f in $(ls "$PARTS" | sort); do
  n=$((n + 1))
  mv "$PARTS/$f" "$PARTS/p$(printf %02d $n)"
done
for f in "$PARTS"/p*; do mv "$f" "$PARTS/part${f##*/p}"; done

SHA=$(sha256sum "$ARCHIVE" | cut -d' ' -f1)
{
  echo "set $H200_SET"
  echo "archive $SET_ARCHIVE"
  echo "size $(stat -c %s "$ARCHIVE")"
  echo "sha256 $SHA"
  echo "parts $n"
  for f in "$PARTS"/part*; do echo "part ${f##*/} $(stat -c %s "$f") $(sha256sum "$f" | cut -d' ' -f1)"; done
} > "$ROOT/$SET_MANIFEST"
echo
echo "archive: $ARCHIVE, $(stat -c %s "$ARCHIVE") bytes ($(du -m "$ARCHIVE" | cut -f1) MiB), sha256 $SHA"
echo "parts: $n"
ls -l "$PARTS" | awk 'NR > 1 {printf "  %s %d bytes (%.1f MiB)\n", $9, $5, $5 / 1048576}'
echo "manifest: $SET_MANIFEST. Next: H200_SET=$H200_SET scripts/h200/stage_parts.sh all, then the device calls in docs/h200-vllm.md."
