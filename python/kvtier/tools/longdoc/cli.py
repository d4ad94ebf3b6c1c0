"""The long-document benchmark's command line: `python -m kvtier.tools.longdoc` (or `python -m kvtier.bench_longdoc`)
runs it against a server; `... summarize FILES` prints one table of several runs."""

from __future__ import annotations

import argparse
import json
import sys

from kvtier.tiny_model import DEFAULTS
from kvtier.tools.longdoc.prompts import PHASES, REPEAT_MODES, PromptSpec
from kvtier.tools.longdoc.report import SUMMARY_HEADERS, merge_runs, summary_rows, table
from kvtier.tools.longdoc.run import run

def _doc_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of document indices: {text!r}") from None


def summarize_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m kvtier.bench_longdoc summarize",
                                description="One TTFT table from several --json results; runs with the same "
                                            "--label are one row (their requests pooled).")
    p.add_argument("files", nargs="+")
    p.add_argument("--phase", default="query", choices=("warmup", "query"))
    p.add_argument("--baseline", help="label of the run the speedup is relative to (default: the first)")
    a = p.parse_args(argv)
    results = []
    for f in a.files:
        with open(f) as fh:
            results.append(json.load(fh))
    print(table(SUMMARY_HEADERS, summary_rows(merge_runs(results, a.phase), a.phase, a.baseline)))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvtier.bench_longdoc",
                                description="Long-document TTFT benchmark against an OpenAI-compatible vLLM server "
                                            "(subcommand `summarize FILES...` prints one table of several runs).")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    p.add_argument("--model", default="tiny", help="served model name")
    p.add_argument("--doc-tokens", type=int, default=8192, help="document length in tokens (BOS included)")
    p.add_argument("--num-docs", type=int, default=4)
    p.add_argument("--docs", type=_doc_list, default=None,
                   help="only these documents (comma list of indices below --num-docs), e.g. to interleave the "
                        "phases of several configurations document by document")
    p.add_argument("--warm-docs", type=_doc_list, default=None,
                   help="the warm-up sends only these documents (comma list; default: every one the query sends): "
                        "the query then mixes cached and uncached documents, and each phase reports TTFT per class "
                        "(ttft_by_class) beside the whole (a queue in which cached requests may wait behind others' "
                        "prefill)")
    p.add_argument("--cached-priority", type=int, default=None,
                   help="with --warm-docs: the query requests of the warmed (cached) documents carry vLLM's request "
                        "priority N (lower goes first on a server started with --scheduling-policy priority), as a "
                        "router that knows what is cached would send them")
    p.add_argument("--query-tokens", type=int, default=16, help="length of the question after the document")
    p.add_argument("--reuse-fraction", type=float, default=1.0,
                   help="fraction of the document reused by the query phase (1.0 = whole document)")
    p.add_argument("--repeat-count", type=int, default=1, help="query passes over the documents")
    p.add_argument("--repeat-mode", choices=REPEAT_MODES, default="tile")
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--seed", type=int, default=0, help="content seed (documents, questions, random order)")
    p.add_argument("--salt", type=int, default=0,
                   help="varies the query tails and questions only (to repeat a query phase with new suffixes)")
    p.add_argument("--vocab-size", type=int, default=DEFAULTS["vocab"])
    p.add_argument("--phase", choices=PHASES, default="both", help="run both phases or only one")
    p.add_argument("--reset-prefix-cache", action="store_true",
                   help="POST /reset_prefix_cache before the run and between the phases (server needs "
                        "VLLM_SERVER_DEV_MODE=1); the external cache is kept")
    p.add_argument("--settle-s", type=float, default=0.0, help="pause between the phases (lets stores finish)")
    p.add_argument("--metrics-url", default=None, help="Prometheus endpoint (default: URL/metrics)")
    p.add_argument("--metrics-flush-s", type=float, default=0.0,
                   help="before a phase's final /metrics read: wait this long, then send a 2-token request so "
                        "connector counters pushed once per second include the phase's last requests")
    p.add_argument("--label", default="", help="name of this configuration in the JSON and summaries")
    p.add_argument("--json", dest="json_out", default=None, help="write the results here")
    p.add_argument("--quiet", action="store_true", help="no per-request lines")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "summarize":
        return summarize_main(argv[1:])
    a = parser().parse_args(argv)
    if a.concurrency < 1:
        parser().error("--concurrency must be >= 1")
    if a.cached_priority is not None and a.warm_docs is None:
        parser().error("--cached-priority needs --warm-docs (which documents are cached)")
    for name, docs in (("--docs", a.docs), ("--warm-docs", a.warm_docs)):
        if docs is not None and any(not 0 <= d < a.num_docs for d in docs):
            parser().error(f"{name}: indices must be in [0, {a.num_docs})")
    try:
        PromptSpec(doc_tokens=a.doc_tokens, num_docs=a.num_docs, query_tokens=a.query_tokens,
                   reuse_fraction=a.reuse_fraction, repeat_count=a.repeat_count, repeat_mode=a.repeat_mode,
                   vocab_size=a.vocab_size)
    except ValueError as e:
        parser().error(str(e))

    def log(msg: str):
        if a.quiet and msg.startswith("  ") and "ttft=" in msg:
            return
        print(msg, flush=True)

    result = run(a, log)
    if a.json_out:
        with open(a.json_out, "w") as fh:
            json.dump(result, fh, indent=1, default=lambda o: None)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
