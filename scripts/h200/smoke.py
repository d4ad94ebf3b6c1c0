#!/usr/bin/env python3
"""Import smoke check for the carried vLLM + LMCache (scripts/h200/install.sh runs it).

Imports what `vllm serve` with kvtier's OffloadingConnector spec, vLLM's native offload and
LMCacheConnectorV1 need at start, and kvtier's server launcher (kvtier.tools, from this
checkout), and reports every Requires-Dist of vllm and lmcache that the environment does not
satisfy. Exit 1 if an import fails.

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

# Deliberately not carried (scripts/h200/resolve.py, EXCLUDE): reported, not a failure.
LEFT_OUT = {
    "flashinfer-python", "apache-tvm-ffi", "nvidia-cutlass-dsl", "quack-kernels", "tilelang",
    "xgrammar", "pynvvideocodec", "torchcodec", "tokenspeed-mla", "humming-kernels",
    "fastsafetensors", "nvidia-cudnn-frontend", "nixl-cu13", "cufile-python",
    "google-cloud-bigtable", "google-api-core", "awscrt",
}

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
                extra = f" {m.__version__} cuda {m.version.cuda} gpu={m.cuda.is_available()}"
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
    # Requirements that the environment does not meet (informational).
    env = default_environment()
    for dist in ("vllm", "lmcache"):
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
