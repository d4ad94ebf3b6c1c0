"""kvtier: an external KV cache for vLLM (API: docs/python-api.md).

`Engine` (the scheduler side), `Pool` (a worker's view of the engine's shared-memory staging pool), `copy_batch`
(the host copier) and `HEADER_BYTES` come from the C++ extension `kvtier._kvtier`, loaded on first use so that
helpers that need no extension (e.g. `kvtier.tiny_model`) import without it.
"""

from __future__ import annotations

__all__ = ["Engine", "Pool", "copy_batch", "HEADER_BYTES"]

_EXPORTS = frozenset(__all__)


def _extension():
    try:
        from kvtier import _kvtier
    except ImportError as e:
        raise ImportError(
            "kvtier extension not built; run pip install . in the kvtier repository "
            f"(importing kvtier._kvtier failed: {e})"
        ) from e
    return _kvtier


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(_extension(), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kvtier' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _EXPORTS)
