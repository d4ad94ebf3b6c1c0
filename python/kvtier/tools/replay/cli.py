"""`kvtier replay`'s command line (docs/calibration.md, "The trace replayer")."""

from __future__ import annotations

import argparse
import json
import sys

from kvtier.tiny_model import DEFAULTS
from kvtier.tools.replay.report import format_report
from kvtier.tools.replay.run import run

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvtier replay", description="Replay a Mooncake/Bailian JSONL trace against "
                                "vLLM; report TTFT, cache hit rates by tier and bytes moved.")
    p.add_argument("--trace", required=True, help="JSONL: timestamp (ms), input_length, output_length, hash_ids")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="tiny", help="served model name")
    p.add_argument("--block-tokens", type=int, default=512, help="tokens per hash id (Mooncake 512, Bailian 16)")
    p.add_argument("--length-scale", type=float, default=1.0,
                   help="scale prompt lengths and blocks by this factor (keeps the reuse structure)")
    p.add_argument("--max-input-tokens", type=int, default=None, help="truncate longer prompts")
    p.add_argument("--start", type=int, default=0, help="skip the first N requests of the trace")
    p.add_argument("--max-requests", type=int, default=None, help="replay at most N requests")
    p.add_argument("--duration", type=float, default=None, help="replay at most this many seconds of trace time")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply trace inter-arrival times (0.1: ten times faster; 0: as fast as possible)")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight at most")
    p.add_argument("--output-tokens", type=int, default=None, help="fixed output length (default: the trace's)")
    p.add_argument("--max-output-tokens", type=int, default=None, help="cap the trace's output lengths")
    p.add_argument("--passes", type=int, default=1, help="replay the cut this many times")
    p.add_argument("--reset-prefix-cache", action="store_true",
                   help="POST /reset_prefix_cache before each pass (needs VLLM_SERVER_DEV_MODE=1): later passes "
                        "find their prefixes in kvtier, not in vLLM's own cache")
    p.add_argument("--seed", type=int, default=0, help="token content seed")
    p.add_argument("--vocab-size", type=int, default=DEFAULTS["vocab"])
    p.add_argument("--json", dest="json_out", default=None, help="write the report and every request here")
    p.add_argument("--quiet", action="store_true", help="no per-request lines")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    if a.concurrency < 1:
        p.error("--concurrency must be >= 1")
    if a.time_scale < 0:
        p.error("--time-scale must be >= 0")
    if not a.length_scale > 0:
        p.error("--length-scale must be > 0")
    if a.passes < 1:
        p.error("--passes must be >= 1")

    def log(msg: str) -> None:
        print(msg, flush=True)

    result = run(a, log)
    log(format_report(result))
    if a.json_out:
        with open(a.json_out, "w") as fh:
            json.dump(result, fh, indent=1, default=lambda o: None)
            fh.write("\n")
    return 0 if all(p["errors"] == 0 for p in result["passes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
