#!/usr/bin/env python3
"""Cuts a kernel trace of the block layer into `kvtier bench io` phases and prints what the disk did in each.

Input: tracefs text (`cat /sys/kernel/tracing/trace`) recorded with the events block:block_rq_issue and
block:block_rq_complete while `kvtier bench io --trace-marks /sys/kernel/tracing/trace_marker` ran (its lines
appear as tracing_mark_write; bench/io/trace_bench_io.sh does all of it). Per phase (raw_read, eng_read,
cross_read, writes, the reads at rest of --reread) it prints, for the requests of the phase's direction that were
issued and completed inside it:

  GB/s      bytes completed over the phase's wall time
  qd        time-weighted requests in flight at the disk (issue to completion)
  lat       mean, p10, p50, p90 of one request's time from issue to completion, ms
  batch     median number of requests completed within 20 us of each other (a virtual disk that answers a
            whole queue at once shows the queue depth here)
  turn      median time from a completion to the next issue, us (how fast the reader refills the disk)
  slow      '*' when the phase's mean latency is over 1.5 x the median of the raw reader's phases of the same
            kind and configuration (slow engine read phases on the cpu VM: bench/results/io/s6/README.md)

  bench/io/trace_phases.py TRACE [--dev MAJ,MIN]   (default: the device with the most block events)
"""
import argparse
import collections
import re
import statistics
import sys

LINE = re.compile(r"^\s*(?P<task>.+?)-(?P<tid>\d+)\s+\[(?P<cpu>\d+)\]\s+\S+\s+(?P<ts>\d+\.\d+): "
                  r"(?P<event>block_rq_issue|block_rq_complete|tracing_mark_write): (?P<rest>.*)$")
# block_rq_issue: 254,0 R 2101248 () 22024872 + 4104 be,0,4 [kvtier]
ISSUE = re.compile(r"^(?P<dev>\d+,\d+) (?P<rwbs>\S+) \d+ \(.*?\) (?P<sector>\d+) \+ (?P<n>\d+)")
# block_rq_complete: 254,0 R () 22024872 + 4104 be,0,4 [0]
COMPLETE = re.compile(r"^(?P<dev>\d+,\d+) (?P<rwbs>\S+) \(.*?\) (?P<sector>\d+) \+ (?P<n>\d+)")
MARK = re.compile(r"kvtier-bench-io PHASE (?P<phase>\S+) (?P<edge>begin|end) chunk (?P<chunk>\d+) depth "
                  r"(?P<depth>\d+) rep (?P<rep>\d+)")
BATCH_GAP = 20e-6


def direction(rwbs):
    if "D" in rwbs:
        return "discard"
    if "W" in rwbs:
        return "write"
    if "R" in rwbs:
        return "read"
    return "other"


def parse(lines, dev=None):
    """Returns (requests, phases): requests (issue_s, complete_s, dir, bytes) of device dev (or the busiest),
    phases [(name, chunk, depth, rep, begin_s, end_s)] in trace order."""
    issued = {}
    done = collections.defaultdict(list)
    counts = collections.Counter()
    phases, open_marks = [], {}
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        ts, event, rest = float(m["ts"]), m["event"], m["rest"]
        if event == "tracing_mark_write":
            k = MARK.search(rest)
            if not k:
                continue
            key = (k["phase"], int(k["chunk"]), int(k["depth"]), int(k["rep"]))
            if k["edge"] == "begin":
                open_marks[key] = ts
            elif key in open_marks:
                phases.append(key + (open_marks.pop(key), ts))
            continue
        r = (ISSUE if event == "block_rq_issue" else COMPLETE).match(rest)
        if not r or int(r["n"]) == 0:
            continue
        d = r["dev"]
        counts[d] += 1
        key = (d, int(r["sector"]), r["rwbs"])
        if event == "block_rq_issue":
            issued[key] = ts
        elif key in issued:
            done[d].append((issued.pop(key), ts, direction(r["rwbs"]), int(r["n"]) * 512))
    if dev is None and counts:
        dev = counts.most_common(1)[0][0]
    return sorted(done.get(dev, [])), phases


def phase_stats(requests, begin, end, want):
    reqs = [q for q in requests if q[0] >= begin and q[1] <= end and q[2] == want]
    if not reqs or end <= begin:
        return None
    lat = sorted(q[1] - q[0] for q in reqs)
    edges = sorted([(q[0], 1) for q in reqs] + [(q[1], -1) for q in reqs])
    depth, area, last = 0, 0.0, begin
    for t, step in edges:
        area += depth * (t - last)
        last, depth = t, depth + step
    completions = sorted(q[1] for q in reqs)
    batches, size = [], 1
    for a, b in zip(completions, completions[1:]):
        if b - a <= BATCH_GAP:
            size += 1
        else:
            batches.append(size)
            size = 1
    batches.append(size)
    events = sorted([(q[0], "i") for q in reqs] + [(q[1], "c") for q in reqs])
    turns, pending = [], None
    for t, kind in events:
        if kind == "c" and pending is None:
            pending = t
        elif kind == "i" and pending is not None:
            turns.append(t - pending)
            pending = None

    def pct(p):
        return lat[min(len(lat) - 1, int(p * len(lat)))]

    return {
        "requests": len(reqs),
        "gbps": sum(q[3] for q in reqs) / 1e9 / (end - begin),
        "qd": area / (end - begin),
        "mib_per_req": sum(q[3] for q in reqs) / len(reqs) / 2**20,
        "lat_ms": 1e3 * statistics.fmean(lat),
        "p10_ms": 1e3 * pct(0.1),
        "p50_ms": 1e3 * pct(0.5),
        "p90_ms": 1e3 * pct(0.9),
        "batch": statistics.median(batches),
        "turn_us": 1e6 * statistics.median(turns) if turns else float("nan"),
    }


def analyze(lines, dev=None):
    requests, phases = parse(lines, dev)
    rows = []
    for name, chunk, depth, rep, begin, end in phases:
        want = "write" if name.endswith("write") else "read"
        s = phase_stats(requests, begin, end, want)
        if s is not None:
            rows.append(dict(phase=name, chunk=chunk, depth=depth, rep=rep, **s))
    # The raw reader's own phases set the yardstick per configuration and direction.
    base = collections.defaultdict(list)
    for r in rows:
        if r["phase"].startswith(("raw_", "rest_raw_")):
            base[(r["chunk"], r["depth"], r["phase"].endswith("write"))].append(r["lat_ms"])
    for r in rows:
        ref = base.get((r["chunk"], r["depth"], r["phase"].endswith("write")))
        r["slow"] = bool(ref) and r["lat_ms"] > 1.5 * statistics.median(ref)
    return rows


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="tracefs text output")
    ap.add_argument("--dev", help="MAJ,MIN of the disk (default: the one with the most block events)")
    args = ap.parse_args(argv)
    try:
        with open(args.trace) as f:
            rows = analyze(f, args.dev)
    except OSError as e:
        print(f"trace_phases.py: {e}", file=sys.stderr)
        return 1
    if not rows:
        print("trace_phases.py: no marked phase with block requests in the trace (was it recorded with the "
              "block_rq_issue and block_rq_complete events while bench io ran with --trace-marks?)",
              file=sys.stderr)
        return 1
    print(f"{'chunk':>6} {'depth':>5} {'rep':>3} {'phase':<16} {'reqs':>5} {'MiB/req':>7} {'GB/s':>6} {'qd':>5} "
          f"{'lat ms':>6} {'p10':>5} {'p50':>5} {'p90':>5} {'batch':>5} {'turn us':>7} slow")
    for r in rows:
        print(f"{r['chunk'] >> 20:>4}Mi {r['depth']:>5} {r['rep']:>3} {r['phase']:<16} {r['requests']:>5} "
              f"{r['mib_per_req']:>7.2f} {r['gbps']:>6.2f} {r['qd']:>5.2f} {r['lat_ms']:>6.2f} {r['p10_ms']:>5.2f} "
              f"{r['p50_ms']:>5.2f} {r['p90_ms']:>5.2f} {r['batch']:>5.1f} {r['turn_us']:>7.0f} "
              f"{'*' if r['slow'] else ''}")
    by = collections.defaultdict(lambda: [0, 0])
    for r in rows:
        by[(r["chunk"], r["depth"], r["phase"])][0] += 1
        by[(r["chunk"], r["depth"], r["phase"])][1] += r["slow"]
    print("slow phases (mean latency > 1.5 x the median of the raw reader's): " +
          ", ".join(f"{c >> 20}MiB d{d} {p} {s}/{n}" for (c, d, p), (n, s) in sorted(by.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
