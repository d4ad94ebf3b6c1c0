#!/usr/bin/env bash
# Runs ON THE BOX, in the repo root, in a call that carried .h200/carry or .h200/carryKK
# (stage_parts.sh put one or more parts and the manifest there). Copies each carried part, checked against the
# manifest's sha256, to /tmp/kvtier-h200/parts (/tmp/kvtier-h200-0.34/parts for H200_SET=0.34; it outlives the
# call while the machine stays warm) and prints which parts the box now holds and which are still missing.
# Usage: receive_part.sh I [J]   (the parts this call is expected to bring; fails if absent)
# Env: H200_SET (scripts/h200/set.sh, default 0.26), KVTIER_H200_DIR (default: the set's directory).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/h200/set.sh
D=$SET_BOX_DIR
I=${1:?usage: receive_part.sh I [J]}
J=${2:-$I}
mkdir -p "$D/parts"
src=()
for dir in .h200/carry .h200/carry[0-9]*; do [[ -d $dir ]] && src+=("$dir"); done
man=
for dir in "${src[@]}"; do [[ -f $dir/manifest ]] && { man=$dir/manifest; break; }; done
[[ -n $man ]] || { echo "FAIL: no manifest carried (.h200/carry/manifest)" >&2; exit 1; }
# A manifest without a set line is the 0.26 set's (made before sets existed).
got_set=$(awk '$1 == "set" {print $2}' "$man")
[[ ${got_set:-0.26} == "$H200_SET" ]] || { echo "FAIL: the carried parts are set ${got_set:-0.26}, H200_SET is $H200_SET" >&2; exit 1; }
# A manifest for another archive means the parts held so far belong to an older build.
if [[ -f $D/manifest ]] && ! cmp -s "$man" "$D/manifest"; then
  echo "manifest changed (new archive): dropping the parts held for the old one"
  rm -f "$D"/parts/part* "$D/manifest"
fi
cp "$man" "$D/manifest"
N=$(awk '$1 == "parts" {print $2}' "$D/manifest")
for dir in "${src[@]}"; do
  for f in "$dir"/part[0-9][0-9]; do
    [[ -e $f ]] || continue
    name=${f##*/}
    want=$(awk -v n="$name" '$1 == "part" && $2 == n {print $4}' "$D/manifest")
    [[ -n $want ]] || { echo "FAIL: $name is not in the manifest" >&2; exit 1; }
    if [[ -f $D/parts/$name ]] && [[ $(sha256sum "$D/parts/$name" | cut -d' ' -f1) == "$want" ]]; then
      echo "$name: already held"
      continue
    fi
    cp "$f" "$D/parts/$name.tmp"
    got=$(sha256sum "$D/parts/$name.tmp" | cut -d' ' -f1)
    [[ $got == "$want" ]] || { rm -f "$D/parts/$name.tmp"; echo "FAIL: $name sha256 $got, manifest $want" >&2; exit 1; }
    mv "$D/parts/$name.tmp" "$D/parts/$name"
    echo "$name: received ($(stat -c %s "$D/parts/$name") bytes, sha256 ok)"
  done
done
held=() missing=()
for ((k = 1; k <= N; k++)); do
  p=part$(printf %02d $k)
  if [[ -f $D/parts/$p ]]; then held+=("$p"); else missing+=("$p"); fi
done
echo "held ${#held[@]} of $N: ${held[*]:-none}; missing: ${missing[*]:-none}"
for ((k = I; k <= J; k++)); do
  p=part$(printf %02d $k)
  [[ -f $D/parts/$p ]] || { echo "FAIL: $p was expected in this call and is not held" >&2; exit 1; }
done
if ((${#missing[@]} == 0)); then
  echo "all parts held: run scripts/h200/install.sh"
fi
