"""bench/io/trace_phases.py: cutting a tracefs block-layer trace into `kvtier bench io --trace-marks` phases."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "io"))

import trace_phases  # noqa: E402

HEAD = "# tracer: nop\n#\n"


def mark(ts, phase, edge, rep, chunk=2097152, depth=2):
    return (f"          kvtier-100     [001] ..... {ts:.6f}: tracing_mark_write: kvtier-bench-io PHASE {phase} "
            f"{edge} chunk {chunk} depth {depth} rep {rep}\n")


def issue(ts, sector, n=4104, rw="R", dev="254,0", task="kvtier-101"):
    return (f"          {task}     [001] ..... {ts:.6f}: block_rq_issue: {dev} {rw} {n * 512} () {sector} + {n} "
            f"be,0,4 [kvtier]\n")


def complete(ts, sector, n=4104, rw="R", dev="254,0"):
    return (f"          <idle>-0       [001] d.h1. {ts:.6f}: block_rq_complete: {dev} {rw} () {sector} + {n} "
            "be,0,4 [0]\n")


def phase(t0, name, rep, latency, sectors, gap=0.00005):
    """Two requests at a time (depth 2), answered together after `latency`, refilled after `gap`."""
    out, t = [mark(t0, name, "begin", rep)], t0 + 0.0001
    for i in range(0, len(sectors), 2):
        pair = sectors[i:i + 2]
        out += [issue(t, s) for s in pair]
        out += [complete(t + latency, s) for s in pair]
        t += latency + gap
    out.append(mark(t + 0.0001, name, "end", rep))
    return out, t + 0.001


def synthetic():
    lines, t = [HEAD], 100.0
    for rep, (raw_lat, eng_lat) in enumerate([(0.002, 0.002), (0.002, 0.004)]):
        for name, lat, base in (("raw_read", raw_lat, 1000), ("eng_read", eng_lat, 900000)):
            part, t = phase(t, name, rep, lat, [base + 8192 * i for i in range(8)])
            lines += part
    # Another disk's requests and a write during a read phase are not counted in it.
    lines.insert(3, issue(100.0002, 5, dev="8,0"))
    lines.insert(4, complete(100.0003, 5, dev="8,0"))
    lines.insert(5, issue(100.00025, 77777, n=8, rw="WS"))
    lines.insert(6, complete(100.0009, 77777, n=8, rw="WS"))
    return lines


def test_phases_latency_depth_batches_and_slow_flag():
    rows = trace_phases.analyze(synthetic())
    assert [(r["phase"], r["rep"]) for r in rows] == [("raw_read", 0), ("eng_read", 0), ("raw_read", 1),
                                                      ("eng_read", 1)]
    for r in rows:
        assert r["requests"] == 8
        assert abs(r["mib_per_req"] - 4104 * 512 / 2**20) < 1e-9
        assert r["batch"] == 2  # both requests of a pair complete at the same instant
        assert abs(r["turn_us"] - 50) < 1
    assert [round(r["lat_ms"], 3) for r in rows] == [2.0, 2.0, 2.0, 4.0]
    assert [r["slow"] for r in rows] == [False, False, False, True]  # 4 ms > 1.5 x the raw reader's 2 ms
    # Two requests in flight nearly all the time: the in-flight average is just under the depth.
    assert all(1.9 < r["qd"] <= 2.0 for r in rows)


def test_cli_prints_a_table_and_refuses_a_trace_without_marks(tmp_path):
    good = tmp_path / "trace.txt"
    good.write_text("".join(synthetic()))
    out = subprocess.run([sys.executable, str(REPO / "bench/io/trace_phases.py"), str(good)], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert "eng_read" in out.stdout and "2MiB d2 eng_read 1/2" in out.stdout

    bare = tmp_path / "bare.txt"
    bare.write_text(HEAD + issue(1.0, 8) + complete(1.002, 8))
    out = subprocess.run([sys.executable, str(REPO / "bench/io/trace_phases.py"), str(bare)], capture_output=True,
                         text=True)
    assert out.returncode == 1
    assert "no marked phase" in out.stderr
