#!/usr/bin/env bash
# Runs ON THE BOX once receive_part.sh holds every part. Checks each part and the whole
# archive against the manifest's sha256, unpacks it (Python's tarfile + lzma: needs no xz
# binary), installs the wheels with pip --no-index --no-deps into /tmp/kvtier-h200/site
# (/tmp/kvtier-h200-0.34/site for H200_SET=0.34), on top of the box's own packages (for 0.26 its
# torch 2.11.0+cu130; 0.34 brings torch 2.14.0, which shadows it there), and runs the import smoke
# check (smoke.py --set). Idempotent: a second call finds the stamp of the same archive and only prints the usage.
# Env: H200_SET (scripts/h200/set.sh, default 0.26), KVTIER_H200_DIR (default: the set's directory),
#      PYTHON (default python3), SMOKE=0 to skip the smoke check, SMOKE_ARGS=--no-gpu for a dry run without a GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/h200/set.sh
D=$SET_BOX_DIR
PY=${PYTHON:-python3}
SITE=$D/site
fail() { echo "FAIL: $*" >&2; exit 1; }

usage() {
  echo
  echo "wheel set $H200_SET (vLLM$([[ $H200_SET == 0.26 ]] && echo ' + LMCache')) installed in $SITE. Use it with:"
  echo "  export PYTHONPATH=$SITE\${PYTHONPATH:+:\$PYTHONPATH} PATH=$SITE/bin:\$PATH"
  echo "  python3 -m vllm.entrypoints.cli.main serve MODEL ...   (or: vllm serve MODEL ...)"
}

[[ -f $D/manifest ]] || fail "no $D/manifest: run scripts/h200/receive_part.sh for each part first"
SHA=$(awk '$1 == "sha256" {print $2}' "$D/manifest")
N=$(awk '$1 == "parts" {print $2}' "$D/manifest")
if [[ -f $SITE/.kvtier-h200-installed ]] && [[ $(cat "$SITE/.kvtier-h200-installed") == "$SHA" ]]; then
  echo "already installed (archive sha256 $SHA)"
  usage
  exit 0
fi

t0=$(date +%s)
missing=()
for ((k = 1; k <= N; k++)); do
  p=part$(printf %02d $k)
  [[ -f $D/parts/$p ]] || missing+=("$p")
done
((${#missing[@]} == 0)) || fail "missing parts: ${missing[*]} (of $N); carry them with stage_parts.sh + receive_part.sh"
cat $(for ((k = 1; k <= N; k++)); do echo "$D/parts/part$(printf %02d $k)"; done) > "$D/archive.tar.xz"
got=$(sha256sum "$D/archive.tar.xz" | cut -d' ' -f1)
[[ $got == "$SHA" ]] || fail "archive sha256 $got, manifest $SHA (a part is corrupt: receive it again)"
echo "archive ok: $(stat -c %s "$D/archive.tar.xz") bytes, sha256 $SHA"

rm -rf "$D/pkg" && mkdir -p "$D/pkg"
if command -v xz >/dev/null; then
  xz -dc -T0 "$D/archive.tar.xz" | tar -C "$D/pkg" -xf -
else
  "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], filter="data")' \
    "$D/archive.tar.xz" "$D/pkg"
fi
mapfile -t WHEELS < "$D/pkg/wheels.txt"
for w in "${WHEELS[@]}"; do [[ -f $D/pkg/wheels/$w ]] || fail "archive lacks $w"; done
echo "unpacked ${#WHEELS[@]} wheels in $(($(date +%s) - t0)) s"

# Two versions of one package would stop pip: the lock holds one of each.
dups=$(printf '%s\n' "${WHEELS[@]}" | cut -d- -f1 | tr 'A-Z_.' 'a-z--' | sort | uniq -d)
[[ -z $dups ]] || fail "two versions of: $dups"

rm -rf "$SITE.tmp"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
  --target "$SITE.tmp" $(printf "$D/pkg/wheels/%s " "${WHEELS[@]}") \
  || fail "pip install failed"
rm -rf "$SITE" && mv "$SITE.tmp" "$SITE"
# pip --target writes console scripts with the interpreter's path; they need PYTHONPATH too.
rm -rf "$D/pkg" "$D/archive.tar.xz"
echo "installed ${#WHEELS[@]} wheels into $SITE in $(($(date +%s) - t0)) s"

if [[ ${SMOKE:-1} != 0 ]]; then
  PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} "$PY" scripts/h200/smoke.py --set "$H200_SET" ${SMOKE_ARGS:-} || fail "smoke check failed"
fi
echo "$SHA" > "$SITE/.kvtier-h200-installed"
usage
