"""scripts/h200/bench_io.sh, bench_io_ab.sh and zram.sh refuse bad settings before they build, mount or measure
anything (the runs themselves need the GPU box: docs/h200-vllm.md)."""

import os
import subprocess
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
