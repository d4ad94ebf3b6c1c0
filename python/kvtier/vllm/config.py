"""kvtier's keys in vLLM's kv_connector_extra_config: the table, validation (V4), the cache identity's defaults
and the break-even thresholds file (G1). docs/vllm-integration.md "Configuration keys" lists the same keys."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

from . import compat
from .compat import VLLM_KEYS, logger

_IO_MODES = ("auto", "direct", "buffered")
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
    if "canonical_layout" in VLLM_KEYS and extra.get("canonical_layout"):
        raise ValueError("kvtier: kv_connector_extra_config key 'canonical_layout' must be false or unset: kvtier "
                         "stores each tensor-parallel rank's pages as vLLM holds them (docs/vllm-integration.md)")
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


_hashseed_warned = False


def check_hash_seed(algo: str | None = None) -> bool:
    """V5: whether vLLM's block hashes are reproducible across processes, which kvtier's entries need (keys are
    prefix hashes). vLLM 0.26-0.28 seed the hash chain with os.urandom(32) unless PYTHONHASHSEED is set, whatever
    --prefix-caching-hash-algo is; 0.29+ do so only for the xxhash algorithms (sha256, the default, gets a fixed
    seed). Warns once per process where it matters (compat.hash_seed_matters) and PYTHONHASHSEED is unset; `algo`
    is None where it is not known (the spec sees no vLLM config): compat.KVTierConnector passes it at startup."""
    global _hashseed_warned
    if os.environ.get("PYTHONHASHSEED") is not None:
        return True
    if not compat.hash_seed_matters(algo):
        return True
    if not _hashseed_warned:
        _hashseed_warned = True
        logger.warning(
            "kvtier: PYTHONHASHSEED is not set. vLLM %s then seeds its block hashes (--prefix-caching-hash-algo "
            "%s) with random bytes, so cached KV written by this process will never be found after a restart or by "
            "another vLLM instance. Start every vLLM sharing the root with the same PYTHONHASHSEED (e.g. "
            "PYTHONHASHSEED=0).", compat.VLLM_VERSION, algo or "sha256")
    return False


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
