#!/usr/bin/env python3
"""Which of the box's own CUDA libraries can serve a carried torch (wheel set 0.34, scripts/h200/resolve.py).

Runs HERE (PyPI reachable; needs binutils' nm). For each CUDA library package that torch pins and the box has in
an older version (scripts/h200/box-packages.txt), downloads the box's version, and compares the symbols with that
library's prefix that the carried wheels' shared libraries import (nm -D --undefined-only: torch's, vLLM's) with those
the box's version exports (nm -D --defined-only). A library whose every imported symbol is exported can serve (resolve.py's
box_older_ok); one with missing symbols must be carried.

Usage: abi_check.py WHEEL... [--dl DIR]   (DIR: where the box's versions are downloaded, default .h200/abi)
Exit 1 if a library the set leaves to the box (resolve.TORCH_214_OLDER_OK) misses a symbol.
"""
import os
import re
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import resolve  # noqa: E402

# package -> (shared library in the package, symbol prefix torch imports from it)
LIBS = {
    "nvidia-cudnn-cu13": ("libcudnn.so.9", r"cudnn"),
    "nvidia-cusparselt-cu13": ("libcusparseLt.so.0", r"cusparseLt"),
    "nvidia-cublas": ("libcublas.so.13", r"cublas(?!Lt)"),
    "nvidia-cublas ": ("libcublasLt.so.13", r"cublasLt"),  # the same package, its second library
    "nvidia-nccl-cu13": ("libnccl.so.2", r"nccl"),
}


def nm(path, defined):
    out = subprocess.run(["nm", "-D", "--defined-only" if defined else "--undefined-only", path],
                         capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.split()}


def main():
    args = sys.argv[1:]
    dl = ".h200/abi"
    if "--dl" in args:
        i = args.index("--dl")
        dl = args[i + 1]
        del args[i:i + 2]
    os.makedirs(dl, exist_ok=True)
    box = resolve.load_box()
    leave = resolve.TORCH_214_OLDER_OK
    with tempfile.TemporaryDirectory() as tmp:
        imported = set()
        for whl in args:
            with zipfile.ZipFile(whl) as z:
                libs = [n for n in z.namelist() if re.search(r"\.so(\.\d+)*$", n)]
                z.extractall(os.path.join(tmp, "w"), libs)
            for n in libs:
                imported |= nm(os.path.join(tmp, "w", n), defined=False)
        bad = 0
        for pkg, (lib, prefix) in LIBS.items():
            pkg = pkg.strip()
            ver = box.get(resolve.norm(pkg))
            if not ver:
                print(f"{pkg}: no version in box-packages.txt, skipped")
                continue
            resolve.download(dl, f"{pkg}=={ver}")
            whl = resolve.wheel_for(dl, resolve.norm(pkg), ver)
            with zipfile.ZipFile(whl) as z:
                member = next(n for n in z.namelist() if n.endswith("/" + lib))
                z.extract(member, tmp)
            exported = nm(os.path.join(tmp, member), defined=True)
            want = {s for s in imported if re.match(prefix, s)}
            missing = sorted(want - exported)
            verdict = "serves" if not missing else "must be carried"
            print(f"{pkg} {ver} {lib}: the wheels import {len(want)} symbols, {len(missing)} missing: {verdict}"
                  + (f" ({', '.join(missing)})" if missing else ""))
            if missing and pkg in leave:
                bad += 1
                print(f"FAIL: resolve.py leaves {pkg} to the box")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
