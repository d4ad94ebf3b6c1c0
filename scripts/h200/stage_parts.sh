#!/usr/bin/env bash
# Runs HERE. Puts parts I..J (default J=I) of the H200_SET's parts (scripts/h200/set.sh: .h200/parts,
# .h200/parts-0.34) and its manifest into .h200/carry
# (emptied first), so that the next device call carries exactly them: carry [".h200/carry"]
# and run `scripts/h200/receive_part.sh I` there.
# `stage_parts.sh all` instead makes one folder per part, .h200/carry01 .. .h200/carryNN
# (hard links, no copies), so that the device calls can follow each other with no step here
# in between: call k carries [".h200/carryKK"] and runs `receive_part.sh K`. Checks that the working tree that travels
# (tracked + untracked-not-ignored files, plus .h200/carry) stays under the 64 MiB limit.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/h200/set.sh
I=${1:?usage: stage_parts.sh I [J] | all}
J=${2:-$I}
H=.h200
[[ -f $SET_MANIFEST ]] || { echo "no $SET_MANIFEST: run H200_SET=$H200_SET scripts/h200/fetch_wheels.sh first" >&2; exit 1; }
N=$(awk '$1 == "parts" {print $2}' $SET_MANIFEST)
# The device tool counts what the files take on disk (allocated blocks: a tree of 1,000 small files takes 2 MiB more
# than its bytes), so this does too.
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | du -cB1 --files0-from=- 2>/dev/null | tail -1 | cut -f1)
if [[ $I == all ]]; then
  rm -rf $H/carry $H/carry[0-9]*
  for ((k = 1; k <= N; k++)); do
    kk=$(printf %02d $k)
    mkdir -p $H/carry$kk
    cp $SET_MANIFEST $H/carry$kk/manifest
    ln $SET_PARTS/part$kk $H/carry$kk/
    sz=$(du -cB1 $H/carry$kk/* | tail -1 | cut -f1)
    ((tree + sz < 64 * 1048576 - 262144)) || { echo "carry$kk too large for one call" >&2; exit 1; }
    printf 'call %d: carry [".h200/carry%s"] (%.1f MiB + tree %.1f MiB), command: H200_SET=%s bash scripts/h200/receive_part.sh %d\n' \
      "$k" "$kk" "$(echo "$sz / 1048576" | bc -l)" "$(echo "$tree / 1048576" | bc -l)" "$H200_SET" "$k"
  done
  echo "last call: append '&& H200_SET=$H200_SET bash scripts/h200/install.sh' (and what should run with vLLM)"
  exit 0
fi
((I >= 1 && J >= I && J <= N)) || { echo "parts run 1..$N; asked $I..$J" >&2; exit 1; }
rm -rf $H/carry $H/carry[0-9]* && mkdir -p $H/carry
cp $SET_MANIFEST $H/carry/manifest
for ((k = I; k <= J; k++)); do
  ln $SET_PARTS/part$(printf %02d $k) $H/carry/
done
carry=$(du -cB1 $H/carry/* | tail -1 | cut -f1)
total=$((tree + carry))
printf 'staged parts %d..%d of %d in %s: %.1f MiB + working tree %.1f MiB = %.1f MiB (limit 64)\n' \
  "$I" "$J" "$N" "$H/carry" "$(echo "$carry / 1048576" | bc -l)" "$(echo "$tree / 1048576" | bc -l)" \
  "$(echo "$total / 1048576" | bc -l)"
((total < 64 * 1048576 - 262144)) || { echo "too large for one call: stage fewer parts" >&2; exit 1; }
echo "device call: carry [\".h200/carry\"], command: H200_SET=$H200_SET bash scripts/h200/receive_part.sh $I${2:+ $J}"
