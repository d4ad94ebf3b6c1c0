"""The headline harness's pure parts: the timeline breakdown (bench/h200/timeline.py) and the multi-turn workload's
prompt streams and disk counters (bench/h200/multiturn.py). The GPU runs themselves happen on the H200 box."""

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "h200"))

import multiturn  # noqa: E402
import timeline  # noqa: E402


def _write(d: Path, pid: int, events: list[dict]) -> None:
    with open(d / f"timeline-{pid}.jsonl", "w") as f:
        for e in events:
            f.write(json.dumps({"pid": pid, **e}) + "\n")
        f.write('{"t": 99, "ev": "st')  # a line cut by a kill is skipped


def test_timeline_phases_of_one_load(tmp_path):
    sched = [
        {"t": 10.000, "ev": "new", "req": "a"},
        {"t": 10.010, "t0": 10.010, "ev": "lookup", "req": "a", "result": "HIT"},
        {"t": 10.011, "ev": "step"},
        {"t": 10.030, "ev": "prepare_load", "req": "a", "chunks": 4},
        {"t": 10.050, "ev": "step"},
        {"t": 10.250, "ev": "complete_load", "req": "a", "chunks": 4},
        {"t": 10.300, "ev": "finished", "req": "a"},
        {"t": 10.400, "ev": "new", "req": "b"},  # never loaded: not reported
    ]
    worker = [
        {"t": 10.040, "ev": "submit", "job": 7, "load": True, "bytes": 2_000_000_000, "pages": 64, "chunks": 4,
         "addr_ms": 1.5, "issue_ms": 2.5},
        {"t": 10.045, "ev": "submit", "job": 8, "load": False, "bytes": 10, "pages": 1, "chunks": 1,
         "addr_ms": 0.1, "issue_ms": 0.1},
        {"t": 10.240, "ev": "done", "job": 7, "load": True, "ok": True, "ms": 200.0},
    ]
    _write(tmp_path, 1, sched)
    _write(tmp_path, 2, worker)
    ev = timeline.load_events(tmp_path)
    (row,) = timeline.requests(ev)
    assert row["req"] == "a" and row["chunks"] == 4
    assert row["arrive->lookup"] == pytest.approx(10.0)
    assert row["lookup->prepare"] == pytest.approx(20.0)
    assert row["prepare->submit"] == pytest.approx(10.0)
    assert row["copy"] == pytest.approx(200.0) and row["copy_GBps"] == pytest.approx(10.0)
    assert row["done->complete"] == pytest.approx(10.0)
    assert row["complete->end"] == pytest.approx(50.0)
    assert row["steps"] == 2
    # a window that excludes the request's arrival drops it
    assert timeline.requests(ev, 10.1, 11.0) == []
    assert "copy_GBps" in timeline.table([row])


def test_timeline_cli_without_events_fails(tmp_path, capsys):
    assert timeline.main([str(tmp_path)]) == 1
    assert "no timeline events" in capsys.readouterr().err


def test_multiturn_turns_extend_one_stream():
    a = multiturn.conversation(3, 600, 4096)
    b = multiturn.conversation(3, 900, 4096)
    assert len(a) == 600 and b[:600] == a and a[0] == 1
    assert multiturn.conversation(4, 600, 4096) != a
    assert all(4 <= t < 4096 for t in b[1:])


def test_block_device_counter_of_a_path(tmp_path):
    stat = multiturn.block_device_stat(tmp_path)
    if stat is None:
        pytest.skip(f"{tmp_path} is not on a block device (tmpfs or overlay without /sys/dev/block entry)")
    n = multiturn.sectors_read(stat)
    assert isinstance(n, int) and n >= 0
    assert multiturn.sectors_read(tmp_path / "missing") is None
    assert multiturn.sectors_read(None) is None
