"""bench/io/load_under_writeback.py end to end on a small scale: every run loads its chunks from disk while the
write-back is under way, and the table and JSON carry each write bound's figures (the real engine and files)."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_load_under_writeback_alternates_the_settings_and_reports_each(tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "io" / "load_under_writeback.py"), "--dir",
                        str(tmp_path), "--chunk-mib", "1", "--reads", "4", "--load-batch", "2", "--writes", "24",
                        "--batch", "4", "--io-depth", "4", "--caps", "0,4", "--write-pieces", "0.0625,0", "--repeat",
                        "2", "--lead-s", "0.01", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    settings = [(0, 0.0625), (0, 0.0), (4, 0.0625), (4, 0.0)]
    assert [(x["cap"], x["write_piece_mib"]) for x in doc["runs"]] == settings + settings[::-1]  # each first once
    for x in doc["runs"]:
        assert len(x["load_s"]) == 2 and all(t > 0 for t in x["load_s"]), "4 loads, 2 at a time"
        assert x["stats"]["bytes_read"] >= 4 << 20, "each load came from disk"
        assert x["stats"]["stores_completed"] >= 6, "the write-back ran"
    assert [(row["cap"], row["write_piece_mib"]) for row in doc["table"]] == settings
    for row in doc["table"]:
        assert row["load_p95_s"] == max(t for x in doc["runs"] if (x["cap"], x["write_piece_mib"]) ==
                                        (row["cap"], row["write_piece_mib"]) for t in x["load_s"]), "4 batches: p95 is the largest"
    assert "0 (2)" in r.stdout and "4 (none)" in r.stdout, r.stdout
    assert not (tmp_path / "load-under-writeback").exists(), "the roots are removed"
    table = doc["table"]
    doc["table"] = []
    out.write_text(json.dumps(doc))
    again = subprocess.run([sys.executable, str(REPO / "bench" / "io" / "load_under_writeback.py"), "--dir", "-",
                            "--retable", str(out)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert json.loads(out.read_text())["table"] == table, "--retable recomputes the same table from the runs"
