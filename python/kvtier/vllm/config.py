"""kvtier's keys in vLLM's kv_connector_extra_config: the table, validation (V4), the cache identity's defaults
and the break-even thresholds file (G1). docs/vllm-integration.md "Configuration keys" lists the same keys."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from . import compat, extension
from .compat import VLLM_KEYS, logger

_SIZE_SUFFIXES = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30,
                  "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40}
# How a key's value is written in kv_connector_extra_config, by the schema's option type.
_KIND_OF_TYPE = {"path": "path", "string": "str", "secret": "str", "choice": "str", "bool": "bool", "count": "int",
                 "bytes": "size", "fraction": "float", "mode": "mode"}
_SPELLING = {"size": "a byte count (int, or a string like '512MiB', '4G')", "int": "an integer", "float": "a number",
             "bool": "true or false", "str": "a string", "path": "an existing writable directory, absolute path",
             "mode": "a file mode (int, or octal string '0750') that gives the owner rwx"}


class _Key:
    """One kv_connector_extra_config key: an engine option (engine_key, from the engine's schema) or one of the
    adapter's own."""

    def __init__(self, kind: str, default: Any, doc: str, lo: float | None = None, hi: float | None = None,
                 choices: tuple[str, ...] | None = None, engine_key: str | None = None, spelling: str | None = None):
        self.kind, self.default, self.doc, self.lo, self.hi = kind, default, doc, lo, hi
        self.choices, self.engine_key, self.spelling = choices, engine_key, spelling

    def accepted(self) -> str:
        if self.choices:
            return " | ".join(repr(c) for c in self.choices)
        rng = ""
        if self.hi is not None and self.hi >= 1 << 63:
            rng = f" >= {self.lo}"
        elif self.lo is not None or self.hi is not None:
            rng = f" in [{self.lo if self.lo is not None else '-inf'}, {self.hi if self.hi is not None else 'inf'}]"
        return (self.spelling or _SPELLING[self.kind]) + rng


def _engine_keys() -> dict[str, _Key]:
    """The engine options offered to vLLM users (rows of the engine's schema with a vllm_key), as kvtier_<key>."""
    out: dict[str, _Key] = {}
    for row in extension.options_schema():
        if row["vllm_key"] is None:
            continue
        kind = _KIND_OF_TYPE[row["type"]]
        default = None if row["name"] == "root" else row["default"]
        spelling = row["accepted"] if row["type"] == "secret" else None  # the engine's words for its own rule
        out["kvtier_" + row["vllm_key"]] = _Key(kind, default, row["doc"], lo=row["min"], hi=row["max"],
                                                choices=tuple(row["choices"]) or None, engine_key=row["name"],
                                                spelling=spelling)
    return out


# The adapter's own keys (not engine options: the cache identity's names, the worker, preload, the gate, stats).
ADAPTER_KEYS: dict[str, _Key] = {
    "kvtier_model_tag": _Key("str", "", "model name in the cache identity (default: vLLM's model name/path); set "
                             "it when instances load the same weights from different paths"),
    "kvtier_revision": _Key("str", "", "weights revision (or any hash) in the cache identity (default: for a local "
                            "model directory a hash of its config.json and weight file names and sizes)"),
    "kvtier_copy_threads": _Key("int", 1, "host copy threads per worker copy", lo=1, hi=64),
    "kvtier_cuda_copy_mode": _Key("str", "batch_api", "how the CUDA worker copies (docs/gpu.md): 'batch_api' (the "
                                  "copy engines, no SMs: faster beside forward passes), 'kernel' (a copy kernel on "
                                  "the SMs, PCIe speed for a copy alone); 'auto' = kernel",
                                  choices=("auto", "kernel", "batch_api")),
    "kvtier_load_order": _Key("str", "oldest_first", "how a worker copies several requests' loads at once "
                              "(docs/vllm-integration.md \"Several loads at once\"): 'oldest_first' (the oldest "
                              "request's chunks first, another's only while it has none ready: the oldest load "
                              "done as early as the link allows) or 'shared' (every ready chunk at once: the link "
                              "shared, the requests done together)", choices=("oldest_first", "shared")),
    "kvtier_load_queue_mib": _Key("int", 1024, "with kvtier_load_order 'oldest_first', the MiB of load copies a "
                                  "worker keeps queued on the link for the oldest load (docs/vllm-integration.md "
                                  "\"Several loads at once\")", lo=1, hi=1 << 20),
    "kvtier_attach_timeout_s": _Key("float", 60.0, "how long a worker waits for the scheduler's pool to appear",
                                    lo=0.1, hi=3600.0),
    "kvtier_preload_max_inflight": _Key("int", 1, "speculative chunk reads in flight for waiting requests (R1, R2); "
                                        "0 turns preload off", lo=0, hi=1 << 20),
    "kvtier_thresholds_path": _Key("str", "", "break-even thresholds file (G1, docs/break-even.md); '' = gate off, "
                                   "logged at startup"),
    "kvtier_stats_interval_s": _Key("float", 10.0, "log a stats line and rewrite the stats file this often "
                                    "(0: never)", lo=0.0, hi=86400.0),
}

# Every key kvtier accepts: the engine's (generated from its schema) and the adapter's. docs/vllm-integration.md's
# table is generated from it (options_table(); tests/vllm/test_bad_config.py fails when the doc differs).
KVTIER_KEYS: dict[str, _Key] = {**_engine_keys(), **ADAPTER_KEYS}


def _parse_value(name: str, key: _Key, raw: Any) -> Any:
    def bad(why: str = "") -> ValueError:
        return ValueError(f"kvtier: bad value {raw!r} for kv_connector_extra_config key '{name}'"
                          f"{': ' + why if why else ''}; accepted: {key.accepted()}")

    val = _convert(key, raw, bad)
    if key.kind in ("int", "float", "size") and ((key.lo is not None and val < key.lo) or
                                                  (key.hi is not None and val > key.hi)):
        raise bad("out of range")
    if key.engine_key is not None:
        try:
            extension.check_option(key.engine_key, val)  # the engine's own rules (mode, secret, ...)
        except (TypeError, ValueError) as e:
            raise bad(str(e)) from None
    return val


def _convert(key: _Key, raw: Any, bad) -> Any:
    """The value in the key's kind: strings (choices lower-cased), bools (also 'true'/'false'), modes (also octal
    strings), sizes (also '512MiB'), numbers; ValueError (from `bad`) for anything else."""
    if key.kind in ("str", "path"):
        if not isinstance(raw, str):
            raise bad()
        if key.choices and raw.lower() not in key.choices:
            raise bad()
        if key.kind == "path":
            if not raw or not os.path.isabs(raw):
                raise bad("not an absolute path")
            if not os.path.isdir(raw):
                raise bad("no such directory")
            if not os.access(raw, os.W_OK | os.X_OK):
                raise bad("directory is not writable")
        return raw.lower() if key.choices else raw
    if key.kind == "bool":
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "false", "1", "0", "yes", "no"):
            return raw.lower() in ("true", "1", "yes")
        raise bad()
    if isinstance(raw, bool):
        raise bad()
    try:
        if key.kind == "mode":
            return raw if isinstance(raw, int) else int(str(raw), 8)
        if key.kind == "size":
            if isinstance(raw, int):
                return raw
            if not isinstance(raw, str):
                raise ValueError  # a float is not a byte count
            s = raw.strip().lower().replace(" ", "")
            num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
            suffix = s[len(num):]
            if suffix.endswith("b") and suffix not in _SIZE_SUFFIXES:
                suffix = suffix[:-1]
            if suffix not in _SIZE_SUFFIXES:
                raise ValueError
            return int(float(num) * _SIZE_SUFFIXES[suffix])
        if key.kind == "int":
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError
            return int(raw)
        return float(raw)
    except (TypeError, ValueError):
        raise bad() from None


def options_table() -> str:
    """The Markdown table of KVTIER_KEYS for docs/vllm-integration.md ("Configuration keys")."""
    rows = ["| key | default | accepted | meaning |", "|---|---|---|---|"]
    for name, key in KVTIER_KEYS.items():
        if key.default is None:
            default = "(required)"
        elif key.kind == "size":
            default = _fmt_size(key.default)
        elif key.kind == "mode":
            default = f"`0{key.default:o}`"
        elif key.kind == "bool":
            default = "true" if key.default else "false"
        elif key.kind == "str":
            default = f"`{key.default}`" if key.default else "''"
        else:
            default = f"{key.default:g}" if isinstance(key.default, float) else str(key.default)
        accepted = key.accepted().replace("|", "\\|")
        rows.append(f"| `{name}` | {default} | {accepted} | {key.doc} |")
    return "\n".join(rows) + "\n"


def _fmt_size(n: int) -> str:
    for unit, div in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n and n % div == 0:
            return f"{n // div} {unit}"
    return str(n)


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
    engine = {key.engine_key: out[name] for name, key in KVTIER_KEYS.items() if key.engine_key is not None}
    try:
        extension.check_options(engine)  # the engine's rules over several options (watermark order, ...)
    except ValueError as e:
        why = str(e)
        for name, key in KVTIER_KEYS.items():
            if key.engine_key is not None:
                why = re.sub(rf"\b{key.engine_key}\b", name, why)
        raise ValueError(f"kvtier: kv_connector_extra_config: {why}") from None
    secret = out["kvtier_checksum_secret"]
    if secret.startswith("file:") and not os.path.isfile(secret[5:]):
        raise ValueError(f"kvtier: kv_connector_extra_config key 'kvtier_checksum_secret' names a key file "
                         f"{secret[5:]!r} that does not exist; accepted: "
                         + KVTIER_KEYS["kvtier_checksum_secret"].accepted())
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


def load_estimate_curves(path: str) -> dict[str, Any] | None:
    """The calibration's curves in a thresholds file's `frontier` (written by `kvtier calibrate`, docs/calibration.md):
    {"recompute": f, "dram": g_dram, "disk": g_disk} as functions of tokens -> seconds (a tier without its curve is
    left out), for the gate's per-request estimate (docs/break-even.md). None when the file has no such frontier
    (hand-written thresholds): the estimate then has no times. The gate's decision never reads them."""
    from kvtier.tools.calibrate.model import hit_curve, recompute_curve

    with open(path) as f:
        frontier = json.load(f).get("frontier")
    try:
        t0 = frontier.get("t0")
        out: dict[str, Any] = {"recompute": recompute_curve(dict(zip(frontier["sizes"], frontier["f"])))}
        for tier, entry in (frontier.get("tiers") or {}).items():
            if entry.get("hit_sizes") and entry.get("g"):
                out[tier] = hit_curve(dict(zip(entry["hit_sizes"], entry["g"])), t0)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    return out


TABLE_BEGIN = "<!-- kvtier keys: generated by `python -m kvtier.vllm.config --update docs/vllm-integration.md` -->"
TABLE_END = "<!-- end of generated kvtier keys -->"


def doc_table(text: str) -> str | None:
    """The generated table inside a document's text (between TABLE_BEGIN and TABLE_END), or None."""
    if TABLE_BEGIN not in text or TABLE_END not in text:
        return None
    return text.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0].strip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m kvtier.vllm.config",
                                description="Print the kv_connector_extra_config keys table (from the engine's "
                                            "options schema and the adapter's keys), or rewrite it in a document.")
    p.add_argument("--update", metavar="DOC", help="replace the table between the markers in DOC")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    table = options_table()
    if not a.update:
        print(table, end="")
        return 0
    with open(a.update) as f:
        text = f.read()
    if doc_table(text) is None:
        raise SystemExit(f"{a.update}: no {TABLE_BEGIN} ... {TABLE_END} markers")
    head, rest = text.split(TABLE_BEGIN, 1)
    tail = rest.split(TABLE_END, 1)[1]
    with open(a.update, "w") as f:
        f.write(head + TABLE_BEGIN + "\n" + table + TABLE_END + tail)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
