"""Where a kvtier hit's time goes inside vLLM: per-request phases from the connector's timeline
(KVTIER_TIMELINE_DIR, python/kvtier/vllm/metrics.py "Timeline"; headline.py run --timeline writes one directory per kvtier
server).

    python3 bench/h200/timeline.py DIR [--headline headline.json --system kvtier-dram --phase query]
    python3 bench/h200/timeline.py LOGS --headline headline.json --each-system OUTDIR   (what headline.sh runs)

For each request that loaded (had a prepare_load), in scheduler order:
  arrive->lookup   from on_new_request to the first lookup answer (the scheduler reaching the request)
  lookup->prepare  from the first lookup to prepare_load (HIT_PENDING reads, waiting for GPU blocks)
  prepare->submit  from prepare_load to the worker's submit of the copy (one scheduler step: the worker runs it)
  addr / issue     worker time building the address arrays / issuing the copy (inside prepare->submit's end; a
                   streamed load has neither: its copies are issued chunk by chunk as reads land)
  first copy       a streamed load: from submit to its first chunk's copy (the first read landed and verified)
  copy             from submit to the worker seeing the copy complete (an upper bound of the copy; for a streamed
                   load, its last chunk's read and copy)
  done->complete   from the copy seen complete to the scheduler's complete_load (get_finished -> next step)
  complete->end    from complete_load to on_request_finished (the prefill of the new tokens + 2 output tokens)
Steps: scheduler steps (on_schedule_end) between arrival and complete_load. With --headline, requests are limited
to the wall-clock window of one system's phase per document size.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load_events(d: Path) -> list[dict]:
    ev = []
    for f in sorted(d.glob("timeline-*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                ev.append(json.loads(line))
            except ValueError:
                pass  # a line cut by a kill
    ev.sort(key=lambda e: e["t"])
    return ev


def requests(ev: list[dict], t0: float = 0.0, t1: float = float("inf")) -> list[dict]:
    """Per-request phase durations (ms) of the requests that arrived in [t0, t1) and loaded."""
    by: dict[str, dict] = {}
    for e in ev:
        rid = e.get("req")
        if rid is None:
            continue
        r = by.setdefault(rid, {"req": rid})
        k = e["ev"]
        if k == "lookup":
            r.setdefault("lookup", e["t0"])
            r["last_lookup_result"] = e.get("result")
        elif k in ("new", "prepare_load", "complete_load", "finished"):
            r.setdefault(k, e["t"])
            if k == "prepare_load":
                r["chunks"] = e.get("chunks")
    submits = [e for e in ev if e["ev"] == "submit" and e.get("load")]
    dones = {e["job"]: e for e in ev if e["ev"] == "done" and e.get("load")}
    steps = [e["t"] for e in ev if e["ev"] == "step"]
    out = []
    used: set[int] = set()
    for r in sorted(by.values(), key=lambda r: r.get("prepare_load", 0)):
        if "prepare_load" not in r or not (t0 <= r.get("new", r["prepare_load"]) < t1):
            continue
        # the worker's load submit for this prepare_load: the first unused one after it with as many chunks
        sub = next((s for s in submits if s["job"] not in used and s["t"] >= r["prepare_load"]
                    and s.get("chunks") == r.get("chunks")), None)
        row = {"req": r["req"], "chunks": r.get("chunks")}
        ms = lambda a, b: round((b - a) * 1e3, 1) if a is not None and b is not None else None  # noqa: E731
        row["arrive->lookup"] = ms(r.get("new"), r.get("lookup"))
        row["lookup->prepare"] = ms(r.get("lookup"), r["prepare_load"])
        if sub is not None:
            used.add(sub["job"])
            done = dones.get(sub["job"])
            row.update({"prepare->submit": ms(r["prepare_load"], sub["t"]), "bytes": sub["bytes"],
                        "pages": sub["pages"]})
            for col, key in (("addr", "addr_ms"), ("issue", "issue_ms")):  # not in a streamed submit
                if sub.get(key) is not None:
                    row[col] = round(sub[key], 1)
            if done is not None:
                if done.get("first_copy_ms") is not None:
                    row["first copy"] = round(done["first_copy_ms"], 1)
                row["copy"] = ms(sub["t"], done["t"])
                row["done->complete"] = ms(done["t"], r.get("complete_load"))
                row["copy_GBps"] = round(sub["bytes"] / max(1e-9, done["t"] - sub["t"]) / 1e9, 1)
        row["complete->end"] = ms(r.get("complete_load"), r.get("finished"))
        row["arrive->complete"] = ms(r.get("new"), r.get("complete_load"))
        a, b = r.get("new"), r.get("complete_load")
        row["steps"] = sum(1 for t in steps if a is not None and b is not None and a <= t <= b)
        out.append(row)
    return out


COLS = ("chunks", "steps", "arrive->lookup", "lookup->prepare", "prepare->submit", "addr", "issue", "first copy",
        "copy", "copy_GBps", "done->complete", "complete->end", "arrive->complete")


def table(rows: list[dict]) -> str:
    lines = ["  ".join(f"{c:>15s}" for c in COLS)]
    for r in rows:
        lines.append("  ".join(f"{'-' if r.get(c) is None else r[c]!s:>15s}" for c in COLS))
    return "\n".join(lines)


def by_phase(ev: list[dict], headline: dict, system: str, phase: str) -> dict[str, list[dict]]:
    """The rows of each of the system's runs in headline.json (keyed by document size), printed as they go."""
    result = {}
    for run in headline.get("runs", []):
        w = run.get(f"{phase}_wall_clock")
        if run.get("system") != system or not w or len(w) < 2:
            continue
        rows = requests(ev, w[0], w[1])
        result[str(run["doc_tokens"])] = rows
        print(f"== {system} {run['doc_tokens']} tokens, {phase} phase (client TTFTs ms: "
              f"{[round(x * 1e3) for x in (run.get(phase) or {}).get('ttft_s') or []]})")
        print(table(rows))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="a timeline directory; with --each-system, the logs directory holding timeline-<system>")
    p.add_argument("--headline", help="headline.json: split the requests by the system's phases")
    p.add_argument("--system", default="kvtier-dram")
    p.add_argument("--phase", default="query")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--each-system", metavar="OUTDIR",
                   help="with --headline: every kvtier system of its runs that has DIR/timeline-<system>, its rows "
                        "written to OUTDIR/timeline-<system>.json")
    a = p.parse_args(argv)
    if a.each_system:
        if not a.headline:
            p.error("--each-system needs --headline")
        h = json.loads(Path(a.headline).read_text())
        systems = sorted({r["system"] for r in h.get("runs", []) if str(r.get("system", "")).startswith("kvtier")})
        for system in systems:
            ev = load_events(Path(a.dir) / f"timeline-{system}")
            if ev:
                out = Path(a.each_system) / f"timeline-{system}.json"
                out.write_text(json.dumps(by_phase(ev, h, system, a.phase), indent=1) + "\n")
        return 0
    ev = load_events(Path(a.dir))
    if not ev:
        print(f"no timeline events under {a.dir}", file=sys.stderr)
        return 1
    if a.headline:
        result = by_phase(ev, json.loads(Path(a.headline).read_text()), a.system, a.phase)
    else:
        rows = requests(ev)
        result = {"all": rows}
        print(table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
