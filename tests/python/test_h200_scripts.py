"""scripts/h200/bench_io.sh, bench_io_ab.sh and zram.sh refuse bad settings before they build, mount or measure
anything, and scripts/gpu_bench.sh's staging of the Python package (scripts/lib/stage_python.sh) carries every
subpackage (the runs themselves need the GPU box: docs/h200-vllm.md)."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def bench_io(tmp_path, env, *args):
    # Should a check be missing, the script must still do nothing heavy here: no ZRAM, no build (KVTIER_BIN), a
    # binary that fails at once, and its files under tmp_path.
    env = {**os.environ, "OUT": str(tmp_path / "out"), "DIR": str(tmp_path), "KVTIER_BIN": "/bin/false", **env}
    env.pop("ZRAM", None)
    return subprocess.run(["bash", str(REPO / "scripts/h200/bench_io.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=60)


def test_bench_io_refuses_bad_settings(tmp_path):
    for env, args, says in [({}, ["0"], "RUNS must be a positive integer"),
                            ({"DEVICES": "zram"}, [], "ZRAM (its size, e.g. 16G) is unset"),
                            ({"DEVICES": "nvme"}, [], "'nvme' is not zram or virtio"),
                            ({"COPIERS": "cuda"}, [], "'cuda' is not none or host")]:
        r = bench_io(tmp_path, env, *args)
        assert r.returncode == 2 and says in r.stderr, (env, args, r.stderr)
        assert not (tmp_path / "out").exists()


def test_zram_up_refuses_a_size_without_a_unit_and_down_without_a_device_does_nothing():
    script = f"source {REPO}/scripts/h200/zram.sh; kvtier_zram_up 16 /tmp/x; echo rc=$?; kvtier_zram_down; echo down=$?"
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert "rc=2" in r.stdout and "must be a number with a unit" in r.stderr
    assert "down=0" in r.stdout and "reset" not in r.stdout


def test_bench_io_ab_refuses_bad_settings(tmp_path):
    # Each refusal comes before the builds and the zram device (a missing check would start a cmake build here).
    tree = tmp_path / "old"
    tree.mkdir()
    for env, args, says in [({"ZRAM": "8G", "A_SRC": str(tree)}, ["x"], "ROUNDS must be a positive integer"),
                            ({"A_SRC": str(tree)}, [], "ZRAM (the zram device's size, e.g. 24G) is unset"),
                            ({"ZRAM": "8G", "A_SRC": str(tree)}, [], "is no source tree"),
                            ({"ZRAM": "8G"}, [], "A_SRC='' is no source tree")]:
        env = {**{k: v for k, v in os.environ.items() if k not in ("ZRAM", "A_SRC")},
               "OUT": str(tmp_path / "out"), **env}
        r = subprocess.run(["bash", str(REPO / "scripts/h200/bench_io_ab.sh"), *args], capture_output=True,
                           text=True, env=env, timeout=60)
        assert r.returncode == 2 and says in r.stderr, (env, args, r.stderr)
        assert not (tmp_path / "out").exists()


def test_gpu_bench_stages_every_subpackage_and_a_plain_python_finds_kvtier_vllm_there(tmp_path):
    # scripts/gpu_bench.sh stages the package the GPU box imports (/tmp/kvtier-py) with this function; copying
    # python/kvtier/*.py alone left kvtier.vllm out, and every kvtier server died at startup (issue 25).
    assert "kvtier_stage_python \"$pkg\" \"$build\"" in (REPO / "scripts/gpu_bench.sh").read_text()
    pkg = tmp_path / "pkg"
    (pkg / "kvtier" / "stale").mkdir(parents=True)  # what an earlier tree left there goes
    r = subprocess.run(["bash", "-c", 'source scripts/lib/stage_python.sh && kvtier_stage_python "$1"', "_",
                        str(pkg)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    src = REPO / "python"
    want = sorted(str(p.relative_to(src)) for p in (src / "kvtier").rglob("*.py") if "__pycache__" not in p.parts)
    assert sorted(str(p.relative_to(pkg)) for p in pkg.rglob("*") if p.is_file()) == want
    assert "kvtier/vllm/__init__.py" in want and "kvtier/tools/launcher.py" in want

    # A Python without site-packages (no vLLM, no installed kvtier, no extension): the modules are found under the
    # staged tree, and importing kvtier.vllm gets as far as its vLLM version check (its extension loads lazily).
    code = """if True:
        import importlib, importlib.util, json
        out = {m: importlib.util.find_spec(m).origin for m in
               ("kvtier.vllm", "kvtier.tools", "kvtier.tools.launcher", "kvtier.bench_longdoc")}
        importlib.import_module("kvtier.tools.launcher")
        importlib.import_module("kvtier.bench_longdoc")
        try:
            importlib.import_module("kvtier.vllm")
            out["import kvtier.vllm"] = "ok"
        except ModuleNotFoundError as e:
            out["import kvtier.vllm"] = "missing " + str(e.name)
        except Exception as e:  # no vLLM in this Python: UnsupportedVLLMVersion from kvtier.vllm.compat
            out["import kvtier.vllm"] = type(e).__name__
        print(json.dumps(out))"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    r = subprocess.run([sys.executable, "-S", "-c", code], env={**env, "PYTHONPATH": str(pkg)}, cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for m in ("kvtier.vllm", "kvtier.tools", "kvtier.tools.launcher", "kvtier.bench_longdoc"):
        assert out[m].startswith(str(pkg)), (m, out[m])
    assert out["import kvtier.vllm"] in ("ok", "UnsupportedVLLMVersion"), out


def _tiny_wheel(path: Path, name: str, version: str) -> None:
    """A pure-Python wheel pip installs: one module, its METADATA, WHEEL and RECORD."""
    import zipfile
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}.py": "VALUE = 1\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)


def test_a_wheel_set_travels_in_parts_and_installs_and_the_box_refuses_another_sets_parts(tmp_path):
    """The carrying chain of docs/h200-vllm.md for H200_SET=0.34 (scripts/h200/set.sh), on a tiny archive in a
    scratch repo: stage_parts.sh all makes one carry folder per part, receive_part.sh checks each against the
    manifest and refuses parts of another set, install.sh joins, checks and installs them into the set's site."""
    import hashlib
    import shutil
    import tarfile
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copytree(REPO / "scripts/h200", repo / "scripts/h200")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".git/info/exclude").write_text("/.h200/\n")
    pkg = tmp_path / "pkg"
    (pkg / "wheels").mkdir(parents=True)
    _tiny_wheel(pkg / "wheels/kvtier_probe-1.0-py3-none-any.whl", "kvtier_probe", "1.0")
    (pkg / "wheels.txt").write_text("kvtier_probe-1.0-py3-none-any.whl\n")
    h = repo / ".h200"
    (h / "parts-0.34").mkdir(parents=True)
    archive = h / "kvtier-h200-0.34.tar.xz"
    with tarfile.open(archive, "w:xz") as t:
        t.add(pkg / "wheels", "wheels")
        t.add(pkg / "wheels.txt", "wheels.txt")
    data = archive.read_bytes()
    half = len(data) // 2
    parts = [data[:half], data[half:]]
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    lines = ["set 0.34", "archive kvtier-h200-0.34.tar.xz", f"size {len(data)}", f"sha256 {sha(data)}", "parts 2"]
    for k, p in enumerate(parts, 1):
        (h / f"parts-0.34/part{k:02d}").write_bytes(p)
        lines.append(f"part part{k:02d} {len(p)} {sha(p)}")
    (h / "manifest-0.34").write_text("\n".join(lines) + "\n")
    box = tmp_path / "box"
    env = {**os.environ, "H200_SET": "0.34", "KVTIER_H200_DIR": str(box)}

    def run(*cmd, **extra):
        return subprocess.run(["bash", *cmd], cwd=repo, env={**env, **extra}, capture_output=True, text=True,
                              timeout=120)

    r = run("scripts/h200/stage_parts.sh", "all")
    assert r.returncode == 0 and "H200_SET=0.34 bash scripts/h200/receive_part.sh 2" in r.stdout, r.stdout + r.stderr
    assert sorted(p.name for p in h.glob("carry*")) == ["carry01", "carry02"]
    r = run("scripts/h200/stage_parts.sh", "all", H200_SET="0.26")  # the other set has no parts here
    assert r.returncode == 1 and "no .h200/manifest" in r.stderr
    r = run("scripts/h200/receive_part.sh", "1", H200_SET="0.26", KVTIER_H200_DIR=str(tmp_path / "box26"))
    assert r.returncode == 1 and "the carried parts are set 0.34, H200_SET is 0.26" in r.stderr, r.stderr
    r = run("scripts/h200/receive_part.sh", "1", H200_SET="0.7")
    assert r.returncode == 2 and "the sets are 0.26 and 0.34" in r.stderr
    (h / "carry02/part02").unlink()  # a hard link to the part: a new file, damaged on the way
    (h / "carry02/part02").write_bytes(b"x" + parts[1][1:])
    r = run("scripts/h200/receive_part.sh", "1")
    assert r.returncode == 1 and "FAIL: part02 sha256" in r.stderr, r.stdout + r.stderr
    shutil.rmtree(h / "carry02")
    r = run("scripts/h200/install.sh", SMOKE="0")
    assert r.returncode == 1 and "missing parts: part02" in r.stderr
    r = run("scripts/h200/stage_parts.sh", "all")
    assert r.returncode == 0
    r = run("scripts/h200/receive_part.sh", "1")
    assert r.returncode == 0 and "part01: already held" in r.stdout and "all parts held" in r.stdout, r.stdout
    r = run("scripts/h200/install.sh", SMOKE="0")
    assert r.returncode == 0 and "wheel set 0.34 (vLLM) installed in" in r.stdout, r.stdout + r.stderr
    assert (box / "site/kvtier_probe.py").read_text() == "VALUE = 1\n"
    r = run("scripts/h200/install.sh", SMOKE="0")
    assert r.returncode == 0 and "already installed" in r.stdout
    # --resplit: the same archive in parts of another size, without downloading or packing (a tree that grew).
    r = run("scripts/h200/fetch_wheels.sh", "--resplit", PART_MIB="1")
    assert r.returncode == 0 and "parts: 1" in r.stdout, r.stdout + r.stderr
    manifest = (h / "manifest-0.34").read_text().splitlines()
    assert f"sha256 {sha(data)}" in manifest and "parts 1" in manifest
    assert (h / "parts-0.34/part01").read_bytes() == data and not (h / "parts-0.34/part02").exists()
    archive.unlink()
    r = run("scripts/h200/fetch_wheels.sh", "--resplit")
    assert r.returncode == 1 and "--resplit: no" in r.stderr, r.stderr
