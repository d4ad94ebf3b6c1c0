# shellcheck shell=bash
# Sourced by scripts/gpu_bench.sh (and tests/python/test_h200_scripts.py): the kvtier Python package as the GPU box
# imports it, without pip (scripts/h200/headline.sh puts DEST on vLLM's PYTHONPATH; docs/gpu.md, docs/h200-vllm.md).
#
#   kvtier_stage_python DEST [BUILD]   DEST/kvtier becomes a copy of python/kvtier's Python tree: the .py files of
#                                      every subpackage (kvtier.vllm, kvtier.tools and its tools), no extension
#                                      sources, no __pycache__; then the extension modules built in BUILD
#                                      (_kvtier*.so directly in it), if BUILD is given. DEST is emptied first, so
#                                      no module of an earlier tree survives. Run from the repository root.
#
# Copying python/kvtier/*.py alone left the box without kvtier.vllm once the adapter became a package (issue 25).

kvtier_stage_python() {
  local dest=$1 build=${2:-}
  if [ ! -f python/kvtier/__init__.py ]; then echo "stage: run from the repository root" >&2; return 1; fi
  rm -rf "$dest" && mkdir -p "$dest" && dest=$(cd "$dest" && pwd) || return 1
  (cd python && find kvtier -name __pycache__ -prune -o -type f -name '*.py' -print0 \
    | xargs -0 cp --parents -t "$dest") || { echo "stage: copying python/kvtier to $dest failed" >&2; return 1; }
  if [ -n "$build" ]; then
    find "$build" -maxdepth 1 -name '_kvtier*.so' -exec cp {} "$dest/kvtier/" \;
  fi
  echo "stage: $(find "$dest/kvtier" -name '*.py' | wc -l) modules and" \
    "$(find "$dest/kvtier" -maxdepth 1 -name '_kvtier*.so' | wc -l) extension modules in $dest/kvtier"
}
