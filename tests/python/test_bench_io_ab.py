"""bench/io/build_ab.py: two kvtier binaries in alternating `kvtier bench io` runs, B/A per pair, medians summed up
(how docs/performance.md judges an engine change on the cpu machine). One tiny pair of the packaged binary against
itself, and its refusals."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "io" / "build_ab.py"


def kvtier_script() -> Path:
    p = Path(sys.executable).parent / "kvtier"
    assert p.exists(), f"no kvtier console script at {p}: the package is not installed in this venv"
    return p


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=300)


def test_pairs_alternate_and_the_summary_holds_b_over_a_per_chunk_size(tmp_path):
    k = kvtier_script()
    out = tmp_path / "out"
    r = run("--a", k, "--b", k, "--pairs", 2, "--out", out, "--", "--dir", tmp_path, "--total", "8MiB",
            "--chunk-sizes", "1MiB", "--depths", "2", "--repeat", "1", "--raw-threads", "1", "--raw-split", "none")
    assert r.returncode == 0, r.stdout + r.stderr
    runs = [line.split("--json ")[1] for line in r.stdout.splitlines() if line.startswith("+ ")]
    assert [Path(x).name for x in runs] == ["pair0-a.json", "pair0-b.json", "pair1-b.json", "pair1-a.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pairs"] == 2
    row = summary["b_over_a"][str(1 << 20)]
    for key in ("write_ratio_to_best", "read_ratio_to_best", "median_engine_write_gbps", "median_engine_read_gbps"):
        assert len(row["per_pair"][key]) == 2 and all(v > 0 for v in row["per_pair"][key]), key
    assert 0 < row["pair_min"] <= row["pair_max"]
    assert "B/A medians over 2 pairs" in r.stdout


def test_it_refuses_a_missing_binary_json_of_its_own_and_no_pairs(tmp_path):
    k = kvtier_script()
    for args, why in [(["--a", tmp_path / "none", "--b", k], "not an executable"),
                      (["--a", k, "--b", k, "--", "--json", "x"], "--json is set"),
                      (["--a", k, "--b", k, "--pairs", "0"], "at least 1")]:
        r = run("--out", tmp_path / "o", *args)
        assert r.returncode == 2 and why in r.stderr, (args, r.stderr)
