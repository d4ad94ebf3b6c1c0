#!/usr/bin/env python3
"""Import smoke check for the carried vLLM + LMCache (scripts/h200/install.sh runs it).

Imports what `vllm serve` with kvtier's OffloadingConnector spec, vLLM's native offload and
LMCacheConnectorV1 need at start, and kvtier's server launcher (kvtier.tools, from this
checkout), and reports every Requires-Dist of vllm and lmcache that the environment does not
satisfy. Exit 1 if an import fails.

--set 0.34 (scripts/h200/set.sh): vLLM 0.34.0 with its carried torch 2.14.0, no LMCache; the torch that
loads must be 2.14.0, and the CUDA libraries it loaded are listed with where they came from (the carried
site or the box's own packages).

--no-gpu: for the dry run on a machine without the NVIDIA driver: an import that fails only
because libcuda.so.1 cannot be loaded is reported as such and does not fail the check.
"""
import importlib
import importlib.metadata as md
import os
import sys
import time
import traceback

# kvtier's server launcher and HTTP client (pure Python, from this checkout): what headline.py starts servers with.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

from pip._vendor.packaging.markers import default_environment
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

NO_GPU = "--no-gpu" in sys.argv
SET = sys.argv[sys.argv.index("--set") + 1] if "--set" in sys.argv else "0.26"
TORCH = {"0.26": "2.11.0", "0.34": "2.14.0"}[SET]

# Deliberately not carried (scripts/h200/resolve.py, EXCLUDE): reported, not a failure.
LEFT_OUT = {
    "flashinfer-python", "apache-tvm-ffi", "nvidia-cutlass-dsl", "quack-kernels", "tilelang",
    "xgrammar", "pynvvideocodec", "torchcodec", "tokenspeed-mla", "humming-kernels",
    "fastsafetensors", "nvidia-cudnn-frontend", "nixl-cu13", "cufile-python",
    "google-cloud-bigtable", "google-api-core", "awscrt", "instanttensor", "torch-c-dlpack-ext",
}
LMCACHE = ["lmcache", "lmcache.c_ops", "lmcache.integration.vllm.vllm_v1_adapter", "lmcache.v1.cache_engine",
           "vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector"]

IMPORTS = [
    "torch",
    "vllm",
    "vllm._C_stable_libtorch",
    "vllm.vllm_flash_attn.flash_attn_interface",
    "xgrammar",
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.cli.main",
    "vllm.v1.attention.backends.flash_attn",
    "vllm.v1.kv_offload.factory",
    "vllm.v1.kv_offload.cpu",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector",
    "vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector",
    "vllm.model_executor.models.llama",
    "vllm.model_executor.models.qwen3",
    "lmcache",
    "lmcache.c_ops",
    "lmcache.integration.vllm.vllm_v1_adapter",
    "lmcache.v1.cache_engine",
    "kvtier.tools.launcher",
    "kvtier.tools.client",
]
if SET != "0.26":  # no LMCache in the newer sets
    IMPORTS = [m for m in IMPORTS if m not in LMCACHE]


def loaded_cuda_libs():
    """The CUDA libraries this process mapped (name -> path), from /proc/self/maps."""
    libs = {}
    for line in open("/proc/self/maps"):
        path = line.split()[-1]
        base = os.path.basename(path)
        if any(base.startswith(p) for p in ("libnccl", "libcudnn.", "libcublas", "libcusparseLt", "libcudart",
                                            "libnvshmem", "libtorch_cuda.")):
            libs[base] = path
    return libs


def is_driver_error(exc):
    text = "".join(traceback.format_exception(exc))
    return "libcuda.so" in text


def main():
    bad = 0
    if NO_GPU:
        # vllm_flash_attn's __init__ hides why its extensions failed; load FA3 directly first.
        try:
            importlib.import_module("vllm.vllm_flash_attn._vllm_fa3_C")
        except ImportError as e:
            if "libcuda.so" in str(e):
                print(f"nogpu vllm.vllm_flash_attn._vllm_fa3_C: {e} (needs the NVIDIA driver)")
                IMPORTS.remove("vllm.vllm_flash_attn.flash_attn_interface")
    for mod in IMPORTS:
        t = time.time()
        try:
            m = importlib.import_module(mod)
            extra = ""
            if mod == "torch":
                extra = f" {m.__version__} cuda {m.version.cuda} gpu={m.cuda.is_available()} from {m.__file__}"
                if not m.__version__.startswith(TORCH):
                    print(f"FAIL torch: {m.__version__} loaded, set {SET} needs {TORCH}")
                    bad += 1
            elif mod == "vllm":
                extra = f" {m.__version__} from {m.__file__}"
            elif mod == "lmcache":
                extra = f" {md.version('lmcache')} from {m.__file__}"
            elif mod.endswith("flash_attn_interface"):
                extra = f" FA2={m.FA2_AVAILABLE} FA3={m.FA3_AVAILABLE}"
                if not m.FA3_AVAILABLE and not (NO_GPU and "libcuda" in str(m.FA3_UNAVAILABLE_REASON)):
                    print(f"FAIL {mod}: FA3 unavailable: {m.FA3_UNAVAILABLE_REASON}")
                    bad += 1
                    continue
                if not m.FA3_AVAILABLE:
                    extra += f" (FA3 needs the driver here: {m.FA3_UNAVAILABLE_REASON})"
            print(f"ok   {mod} ({time.time() - t:.1f} s){extra}")
        except BaseException as e:  # noqa: BLE001 - report everything
            if NO_GPU and is_driver_error(e):
                print(f"nogpu {mod}: {type(e).__name__}: {str(e)[:200]} (needs the NVIDIA driver)")
            else:
                bad += 1
                print(f"FAIL {mod}: {type(e).__name__}: {e}")
                traceback.print_exc(limit=-4)
    for base, path in sorted(loaded_cuda_libs().items()):
        print(f"lib  {base}: {path}")
    # Requirements that the environment does not meet (informational).
    env = default_environment()
    for dist in ("vllm", "lmcache") if SET == "0.26" else ("vllm", "torch"):
        unmet = []
        for rd in md.requires(dist) or []:
            r = Requirement(rd)
            if r.marker is not None and not r.marker.evaluate(dict(env, extra="")):
                continue
            name = canonicalize_name(r.name)
            try:
                v = md.version(r.name)
            except md.PackageNotFoundError:
                unmet.append(f"{r.name} (absent{', left out on purpose' if name in LEFT_OUT else ''})")
                continue
            if r.specifier and not r.specifier.contains(v, prereleases=True):
                unmet.append(f"{r.name} {v} vs '{r.specifier}'")
        print(f"{dist} {md.version(dist)}: requirements not met: {'; '.join(unmet) or 'none'}")
    print("smoke: " + ("FAILED" if bad else "passed") + f" ({bad} failed imports)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
