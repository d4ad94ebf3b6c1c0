"""Loading kvtier's compiled modules (tests replace `load` / `load_cuda` with stand-ins)."""

from __future__ import annotations

from typing import Any


def load() -> Any:
    """kvtier._kvtier, or an ImportError that says how to install it into vLLM's Python."""
    try:
        from kvtier import _kvtier  # type: ignore[attr-defined]
    except ImportError as e:
        raise ImportError("kvtier: the C++ extension kvtier._kvtier is not built or not on the path of this "
                          "Python; install kvtier into vLLM's environment (pip install --no-deps "
                          "--no-build-isolation <kvtier repo>)") from e
    return _kvtier


def load_cuda() -> Any:
    """kvtier._kvtier_cuda (the CUDA copier, docs/gpu.md), or an ImportError that says how to build it."""
    try:
        from kvtier import _kvtier_cuda  # type: ignore[attr-defined]
    except ImportError as e:
        raise ImportError("kvtier: vLLM's KV cache is on a CUDA device but kvtier's CUDA copier "
                          "(kvtier._kvtier_cuda) is not built or cannot be loaded in this Python; build kvtier with "
                          "CUDA: pip install --no-deps --no-build-isolation "
                          "-C cmake.define.KVTIER_WITH_CUDA=ON <kvtier repo> (needs nvcc; docs/gpu.md)") from e
    return _kvtier_cuda
