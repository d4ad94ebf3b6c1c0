# Sourced by the scripts of scripts/h200/: which wheel set is carried to the box (docs/h200-vllm.md).
#   H200_SET=0.26 (default): vLLM 0.26.0 and LMCache 0.5.3 on the box's own torch 2.11.0.
#   H200_SET=0.34: vLLM 0.34.0 with torch 2.14.0 and what it pins that the box lacks (no LMCache).
# Sets SET_SUFFIX (empty for 0.26), LOCK (the set's wheel list), SET_ARCHIVE (file name), SET_PARTS and SET_MANIFEST
# (here, under .h200) and SET_BOX_DIR (on the box, KVTIER_H200_DIR overrides).
H200_SET=${H200_SET:-0.26}
case $H200_SET in
  0.26) SET_SUFFIX= ;;
  0.34) SET_SUFFIX=-0.34 ;;
  *) echo "H200_SET=$H200_SET is not a wheel set; the sets are 0.26 and 0.34" >&2; exit 2 ;;
esac
LOCK=scripts/h200/wheels$SET_SUFFIX.lock
SET_ARCHIVE=kvtier-h200$SET_SUFFIX.tar.xz
SET_PARTS=.h200/parts$SET_SUFFIX
SET_MANIFEST=.h200/manifest$SET_SUFFIX
SET_BOX_DIR=${KVTIER_H200_DIR:-/tmp/kvtier-h200$SET_SUFFIX}
