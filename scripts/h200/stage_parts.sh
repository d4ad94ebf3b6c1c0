#!/usr/bin/env bash
# Runs HERE. Puts parts I..J (default J=I) of .h200/parts and the manifest into .h200/carry
# (emptied first), so that the next device call carries exactly them: carry [".h200/carry"]
# and run `scripts/h200/receive_part.sh I` there.
# `stage_parts.sh all` instead makes one folder per part, .h200/carry01 .. .h200/carryNN
# (hard links, no copies), so that the device calls can follow each other with no step here
# in between: call k carries [".h200/carryKK"] and runs `receive_part.sh K`. Checks that the working tree that travels
# (tracked + untracked-not-ignored files, plus .h200/carry) stays under the 64 MiB limit.
set -euo pipefail
cd "$(dirname "$0")/../.."
I=${1:?usage: stage_parts.sh I [J] | all}
J=${2:-$I}
H=.h200
[[ -f $H/manifest ]] || { echo "no $H/manifest: run scripts/h200/fetch_wheels.sh first" >&2; exit 1; }
N=$(awk '$1 == "parts" {print $2}' $H/manifest)
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
if [[ $I == all ]]; then
  rm -rf $H/carry $H/carry[0-9]*
  for ((k = 1; k <= N; k++)); do
    kk=$(printf %02d $k)
    mkdir -p $H/carry$kk
    cp $H/manifest $H/carry$kk/manifest
    ln $H/parts/part$kk $H/carry$kk/
    sz=$(du -cb $H/carry$kk/* | tail -1 | cut -f1)
    ((tree + sz < 64 * 1048576 - 262144)) || { echo "carry$kk too large for one call" >&2; exit 1; }
    printf 'call %d: carry [".h200/carry%s"] (%.1f MiB + tree %.1f MiB), command: bash scripts/h200/receive_part.sh %d\n' \
      "$k" "$kk" "$(echo "$sz / 1048576" | bc -l)" "$(echo "$tree / 1048576" | bc -l)" "$k"
  done
  echo "last call: append '&& bash scripts/h200/install.sh' (and what should run with vLLM)"
  exit 0
fi
((I >= 1 && J >= I && J <= N)) || { echo "parts run 1..$N; asked $I..$J" >&2; exit 1; }
rm -rf $H/carry $H/carry[0-9]* && mkdir -p $H/carry
cp $H/manifest $H/carry/manifest
for ((k = I; k <= J; k++)); do
  ln $H/parts/part$(printf %02d $k) $H/carry/
done
carry=$(du -cb $H/carry/* | tail -1 | cut -f1)
total=$((tree + carry))
printf 'staged parts %d..%d of %d in %s: %.1f MiB + working tree %.1f MiB = %.1f MiB (limit 64)\n' \
  "$I" "$J" "$N" "$H/carry" "$(echo "$carry / 1048576" | bc -l)" "$(echo "$tree / 1048576" | bc -l)" \
  "$(echo "$total / 1048576" | bc -l)"
((total < 64 * 1048576 - 262144)) || { echo "too large for one call: stage fewer parts" >&2; exit 1; }
echo "device call: carry [\".h200/carry\"], command: bash scripts/h200/receive_part.sh $I${2:+ $J}"
