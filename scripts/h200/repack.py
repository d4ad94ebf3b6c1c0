#!/usr/bin/env python3
"""Repack wheels uncompressed (ZIP_STORED) so that the outer .tar.xz compresses the raw bytes
(xz shrinks vLLM's FA3 library to 11 MB where the wheel's deflate gives 38 MB), and drop from
the vLLM wheel the files that dense bf16 serving on Hopper never loads (see DROP_VLLM).

Usage: repack.py SRC_DIR OUT_DIR [--keep-moe]
Every dropped file is removed from the wheel's RECORD too, so pip installs the rest cleanly.
"""
import os
import re
import sys
import zipfile

# path regex -> why it is safe to leave out (each was checked in the source of vLLM 0.26.0 and of 0.34.0)
DROP_VLLM = {
    r"^vllm/vllm_flash_attn/_vllm_fa2_C\.abi3\.so$":
        "FlashAttention 2 (290 MiB). flash_attn_interface.py imports it under try/except "
        "(FA2_AVAILABLE=False) and fa_utils.get_flash_attn_version picks FA3 on compute "
        "capability 9.x unless ALiBi or VLLM_BATCH_INVARIANT ask for FA2; if anything did, "
        "it fails at start with 'Cannot use FA version 2', never silently",
    r"^vllm/vllm-rs$":
        "Rust frontend binary, used only with VLLM_USE_RUST_FRONTEND=1 (default 0)",
    r"^vllm/third_party/fmha_sm100/":
        "Blackwell (SM100) sparse attention for MiniMax-M3, imported lazily there only",
    r"^vllm/third_party/deep_gemm/_C\.cpython-3(10|11|13|14)-":
        "DeepGEMM's extension for other Python versions (the box runs 3.12)",
}
DROP_MOE = {
    r"^vllm/_moe_C_stable_libtorch\.abi3\.so$":
        "MoE kernels (topk_softmax, moe_align_block_size, ...): cuda.py imports it under "
        "contextlib.suppress(ImportError), and torch.ops._moe_C is called only from fused_moe "
        "paths; a MoE model would fail loudly (no such op), a dense one never touches it",
}


def repack(src, dst, drop):
    dropped = []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        names = zin.namelist()
        keep = [n for n in names if not any(re.search(p, n) for p in drop)]
        dropped = [n for n in names if n not in keep]
        for n in keep:
            info = zin.getinfo(n)
            data = zin.read(n)
            if n.endswith(".dist-info/RECORD") and dropped:
                lines = data.decode().splitlines(keepends=True)
                gone = set(dropped)
                data = "".join(l for l in lines if l.split(",")[0] not in gone).encode()
            new = zipfile.ZipInfo(n, date_time=info.date_time)
            new.external_attr = info.external_attr
            new.compress_type = zipfile.ZIP_STORED
            zout.writestr(new, data)
    return dropped


def main():
    src_dir, out_dir = sys.argv[1], sys.argv[2]
    keep_moe = "--keep-moe" in sys.argv
    os.makedirs(out_dir, exist_ok=True)
    for f in sorted(os.listdir(src_dir)):
        if not f.endswith(".whl"):
            continue
        drop = {}
        if f.startswith("vllm-"):
            drop = dict(DROP_VLLM)
            if not keep_moe:
                drop.update(DROP_MOE)
        src = os.path.join(src_dir, f)
        dst = os.path.join(out_dir, f)
        dropped = repack(src, dst, drop)
        if dropped:
            with zipfile.ZipFile(src) as z:
                size = sum(z.getinfo(n).file_size for n in dropped)
            print(f"{f}: left out {len(dropped)} files, {size / 2**20:.1f} MiB uncompressed:")
            for p, why in drop.items():
                hit = [n for n in dropped if re.search(p, n)]
                if hit:
                    print(f"  {p} ({len(hit)} files): {why}")


if __name__ == "__main__":
    main()
