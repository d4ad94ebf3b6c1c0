"""bench/io/load_under_writeback.py end to end on a small scale: every run loads its chunks from disk while the
write-back is under way, and the table and JSON carry each write bound's figures (the real engine and files)."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_load_under_writeback_alternates_the_bounds_and_reports_each(tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "io" / "load_under_writeback.py"), "--dir",
                        str(tmp_path), "--chunk-mib", "1", "--reads", "4", "--writes", "24", "--batch", "4",
                        "--io-depth", "4", "--caps", "0,4", "--repeat", "2", "--lead-s", "0.01", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert [x["cap"] for x in doc["runs"]] == [0, 4, 4, 0]  # alternated: each bound goes first once
    for x in doc["runs"]:
        assert len(x["load_s"]) == 4 and all(t > 0 for t in x["load_s"])
        assert x["stats"]["bytes_read"] >= 4 << 20, "each load came from disk"
        assert x["stats"]["stores_completed"] >= 6, "the write-back ran"
    assert [row["cap"] for row in doc["table"]] == [0, 4]
    assert "0 (2)" in r.stdout and "4 (none)" in r.stdout, r.stdout
    assert not (tmp_path / "load-under-writeback").exists(), "the roots are removed"
