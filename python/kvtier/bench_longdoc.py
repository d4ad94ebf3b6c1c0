"""Long-document benchmark client for an OpenAI-compatible vLLM server.

    python -m kvtier.bench_longdoc --url http://127.0.0.1:8000 --model tiny \\
        --doc-tokens 8192 --num-docs 4 --concurrency 1 --json out.json
    python -m kvtier.bench_longdoc summarize a.json b.json ... [--baseline LABEL]

Two phases, in the manner of LMCache's long_doc_qa benchmark:

* warm-up: every document is sent once (document + a warm-up question): this is what populates the caches;
* query: every document is sent again, `--repeat-count` times in the order given by `--repeat-mode`, with the
  first `round(reuse_fraction * doc_tokens)` tokens of the document reused and everything after them new
  (a fresh tail for the rest of the document and a different question).

Prompts are lists of token ids (sent as `prompt` to /v1/completions), so their lengths are exact and no tokenizer
is involved. The ids are pseudo-random words of the tiny model's vocabulary (`kvtier.tiny_model`), deterministic
for a (seed, document, phase, pass) tuple, and the first token after the reused prefix always differs from the
document's token at that position, so the shared prefix is exactly the reused length. Every prompt starts with BOS.

TTFT is measured per request with streaming: the time from sending the request to the first streamed chunk that
carries a choice. With `--metrics-url` (default: URL/metrics) the deltas of vLLM's prefix-cache, external-cache,
KV-offload and kvtier counters across each phase are reported too.

Only the standard library is used (threads + http.client), so the client runs in any Python 3.10+.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import random
import re
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from kvtier.tiny_model import BOS_ID, DEFAULTS, PUNCTUATION, SPECIAL_TOKENS

FIRST_WORD_ID = len(SPECIAL_TOKENS) + len(PUNCTUATION)
REPEAT_MODES = ("random", "tile", "interleave")
PHASES = ("both", "warmup", "query")

# Streams of pseudo-random ids are keyed by a tuple hashed into random.Random's seed, so that they do not depend on
# PYTHONHASHSEED or on the order in which prompts are built.
_KIND_DOC, _KIND_WARMUP_Q, _KIND_TAIL, _KIND_QUERY_Q, _KIND_ORDER = 1, 2, 3, 4, 5


def _rng(*key: int) -> random.Random:
    return random.Random("kvtier-longdoc:" + ":".join(str(int(k)) for k in key))


def _words(n: int, rng: random.Random, vocab_size: int) -> list[int]:
    return [rng.randrange(FIRST_WORD_ID, vocab_size) for _ in range(n)]


# --------------------------------------------------------------------------------------------------------------
# Prompt construction (pure; unit-tested)
# --------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PromptSpec:
    doc_tokens: int = 8192
    num_docs: int = 4
    query_tokens: int = 16
    reuse_fraction: float = 1.0
    repeat_count: int = 1
    repeat_mode: str = "tile"
    seed: int = 0
    salt: int = 0
    vocab_size: int = DEFAULTS["vocab"]

    def __post_init__(self):
        if self.doc_tokens < 2:
            raise ValueError("doc_tokens must be >= 2 (BOS + at least one word)")
        if self.num_docs < 1:
            raise ValueError("num_docs must be >= 1")
        if self.query_tokens < 1:
            raise ValueError("query_tokens must be >= 1")
        if not 0.0 <= self.reuse_fraction <= 1.0:
            raise ValueError("reuse_fraction must be in [0, 1]")
        if self.repeat_count < 1:
            raise ValueError("repeat_count must be >= 1")
        if self.repeat_mode not in REPEAT_MODES:
            raise ValueError(f"repeat_mode must be one of {', '.join(REPEAT_MODES)}")
        if self.vocab_size <= FIRST_WORD_ID + 1:
            raise ValueError("vocab_size too small")

    @property
    def reuse_tokens(self) -> int:
        """Tokens of the document shared by a query prompt and the warm-up prompt (BOS counts; at least 1)."""
        return max(1, min(self.doc_tokens, round(self.reuse_fraction * self.doc_tokens)))

    @property
    def prompt_tokens(self) -> int:
        return self.doc_tokens + self.query_tokens


def document(spec: PromptSpec, doc: int) -> list[int]:
    """The document's doc_tokens ids: BOS, then pseudo-random words."""
    return [BOS_ID] + _words(spec.doc_tokens - 1, _rng(spec.seed, _KIND_DOC, doc), spec.vocab_size)


def warmup_prompt(spec: PromptSpec, doc: int) -> list[int]:
    q = _words(spec.query_tokens, _rng(spec.seed, _KIND_WARMUP_Q, doc), spec.vocab_size)
    return document(spec, doc) + q


def _differ(tok: int, avoid: int | None, vocab_size: int) -> int:
    if avoid is None or tok != avoid:
        return tok
    nxt = tok + 1
    return nxt if nxt < vocab_size else FIRST_WORD_ID


def query_prompt(spec: PromptSpec, doc: int, rep: int = 0) -> list[int]:
    """doc[:reuse_tokens] + a new tail (rest of the document length) + a new question, for repetition `rep`.

    The token at position reuse_tokens differs from the warm-up prompt's token there, so the prompts share exactly
    reuse_tokens leading tokens. The tail depends on (seed, salt, doc, rep): separate runs with different salts
    (or repetitions) never share anything past the reused prefix.
    """
    warm = warmup_prompt(spec, doc)
    keep = spec.reuse_tokens
    rng = _rng(spec.seed, _KIND_TAIL, spec.salt, doc, rep)
    tail = _words(spec.prompt_tokens - keep, rng, spec.vocab_size)
    tail[0] = _differ(tail[0], warm[keep], spec.vocab_size)
    return warm[:keep] + tail


def query_order(spec: PromptSpec) -> list[tuple[int, int]]:
    """(doc, rep) pairs of the query phase: tile = 0..N-1 repeated; interleave = each doc repeat_count times in a
    row; random = the tile order shuffled (seeded)."""
    n, r = spec.num_docs, spec.repeat_count
    if spec.repeat_mode == "interleave":
        return [(d, k) for d in range(n) for k in range(r)]
    order = [(d, k) for k in range(r) for d in range(n)]
    if spec.repeat_mode == "random":
        _rng(spec.seed, _KIND_ORDER, spec.salt).shuffle(order)
    return order


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# --------------------------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of the values; nan for an empty list."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError("q must be in [0, 100]")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize_ttft(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "mean": math.nan, "p50": math.nan, "p95": math.nan, "min": math.nan, "max": math.nan}
    return {"n": len(values), "mean": sum(values) / len(values), "p50": percentile(values, 50),
            "p95": percentile(values, 95), "min": min(values), "max": max(values)}


# --------------------------------------------------------------------------------------------------------------
# Prometheus metrics
# --------------------------------------------------------------------------------------------------------------

_SAMPLE_RE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEnaNIif]+)(\s+\d+)?$")
METRIC_PATTERNS = ("prefix_cache", "kv_offload", "kvtier", "external_prefix")


def parse_prometheus(text: str) -> dict[str, float]:
    """{series: value} of the samples of a Prometheus text exposition (series = name + labels as written)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if not m:
            continue
        try:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        except ValueError:
            continue
    return out


def _interesting(series: str) -> bool:
    name = series.split("{", 1)[0]
    if name.endswith("_created") or name.endswith("_bucket"):
        return False
    return any(p in name for p in METRIC_PATTERNS)


def metric_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """after - before for the interesting counters (and histogram sums/counts), summed over labels by metric name;
    series absent before count from 0. Gauges: metric_gauges."""
    out: dict[str, float] = {}
    for series, v in after.items():
        if not _interesting(series):
            continue
        name = series.split("{", 1)[0]
        if not name.endswith(_COUNTER_SUFFIXES):
            continue
        out[name] = out.get(name, 0.0) + v - before.get(series, 0.0)
    return dict(sorted(out.items()))


_COUNTER_SUFFIXES = ("_total", "_sum", "_count")


def metric_gauges(after: dict[str, float]) -> dict[str, float]:
    """Values of the interesting gauges (series that are not counters or histogram parts), summed over labels."""
    out: dict[str, float] = {}
    for series, v in after.items():
        name = series.split("{", 1)[0]
        if _interesting(series) and not name.endswith(_COUNTER_SUFFIXES):
            out[name] = out.get(name, 0.0) + v
    return dict(sorted(out.items()))


BYTES_READ_METRICS = ("kvtier_bytes_read", "kvtier_load_bytes", "kv_offload_load_bytes")


def bytes_read(deltas: dict[str, float]) -> float | None:
    """The kvtier (or vLLM offload) bytes loaded during a phase, from its metric deltas, if exported."""
    for want in BYTES_READ_METRICS:
        for name, v in deltas.items():
            if name.split(":")[-1].startswith(want):
                return v
    return None


# --------------------------------------------------------------------------------------------------------------
# HTTP client
# --------------------------------------------------------------------------------------------------------------

class Server:
    def __init__(self, url: str, model: str, timeout: float = 900.0):
        u = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        self.scheme, self.host, self.port = u.scheme, u.hostname or "127.0.0.1", u.port
        self.base_path = u.path.rstrip("/")
        self.model = model
        self.timeout = timeout

    def _conn(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        conn = self._conn()
        try:
            data = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, self.base_path + path, body=data, headers=headers)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def completion(self, prompt: list[int], max_tokens: int) -> dict:
        """One streamed greedy completion; returns ttft_s, total_s, text, prompt_tokens (from usage)."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        conn = self._conn()
        t0 = time.perf_counter()
        ttft = None
        text: list[str] = []
        usage = None
        try:
            conn.request("POST", self.base_path + "/v1/completions", body=json.dumps(body).encode(),
                         headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
            r = conn.getresponse()
            if r.status != 200:
                raise RuntimeError(f"/v1/completions: HTTP {r.status}: {r.read()[:500]!r}")
            while True:
                raw = r.readline()
                if not raw:
                    break
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                choices = chunk.get("choices") or []
                if choices:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text.append(choices[0].get("text") or "")
                if chunk.get("usage"):
                    usage = chunk["usage"]
        finally:
            conn.close()
        total = time.perf_counter() - t0
        if ttft is None:
            raise RuntimeError("stream ended without a token")
        return {"ttft_s": ttft, "total_s": total, "text": "".join(text),
                "prompt_tokens": (usage or {}).get("prompt_tokens")}

    def metrics(self, metrics_url: str | None) -> dict[str, float] | None:
        try:
            if metrics_url:
                u = urllib.parse.urlsplit(metrics_url)
                conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
                try:
                    conn.request("GET", u.path or "/metrics")
                    r = conn.getresponse()
                    status, data = r.status, r.read()
                finally:
                    conn.close()
            else:
                status, data = self.request("GET", "/metrics")
            if status != 200:
                return None
            return parse_prometheus(data.decode("utf-8", "replace"))
        except OSError:
            return None

    def reset_prefix_cache(self, attempts: int = 60) -> bool:
        """POST /reset_prefix_cache (needs VLLM_SERVER_DEV_MODE=1 on the server); retries while blocks are held
        (in-flight offload stores). Only vLLM's own cache is reset, never the external one."""
        for _ in range(attempts):
            status, data = self.request("POST", "/reset_prefix_cache")
            if status == 404:
                raise RuntimeError("/reset_prefix_cache not found: start the server with VLLM_SERVER_DEV_MODE=1")
            if status == 200:
                try:
                    if json.loads(data or b"{}").get("success", True):
                        return True
                except ValueError:
                    return True
            time.sleep(0.5)
        return False


# --------------------------------------------------------------------------------------------------------------
# Phases
# --------------------------------------------------------------------------------------------------------------

@dataclass
class PhaseResult:
    name: str
    requests: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    ttft: dict = field(default_factory=dict)
    metrics: dict | None = None
    gauges: dict | None = None


def run_phase(server: Server, name: str, prompts: list[tuple[int, int, list[int]]], concurrency: int,
              max_tokens: int, metrics_url: str | None, log=print, metrics_flush_s: float = 0.0) -> PhaseResult:
    before = server.metrics(metrics_url)
    res = PhaseResult(name)
    lock = threading.Lock()

    def one(item):
        doc, rep, prompt = item
        r = server.completion(prompt, max_tokens)
        r.update(doc=doc, rep=rep, prompt_len=len(prompt))
        if r["prompt_tokens"] is not None and r["prompt_tokens"] != len(prompt):
            raise RuntimeError(f"server counted {r['prompt_tokens']} prompt tokens, sent {len(prompt)}")
        with lock:
            res.requests.append(r)
            log(f"  {name} doc={doc} rep={rep} tokens={len(prompt)} ttft={r['ttft_s'] * 1000:.1f} ms")
        return r

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, prompts))
    res.wall_s = time.perf_counter() - t0
    res.ttft = summarize_ttft([r["ttft_s"] for r in res.requests])
    if metrics_flush_s > 0:
        # Connector counters reach /metrics only with a scheduler step, at most once a second (kvtier's get_stats):
        # wait, then make one step happen with a 2-token request, so the phase's last loads are counted.
        time.sleep(metrics_flush_s)
        server.completion([BOS_ID, FIRST_WORD_ID], 1)
    after = server.metrics(metrics_url)
    if before is not None and after is not None:
        res.metrics = metric_deltas(before, after)
    if after is not None:
        res.gauges = metric_gauges(after)
    return res


def _fmt_ms(v: float) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1000:.1f}"


def _fmt_bytes(v: float | None) -> str:
    if v is None:
        return "-"
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= div:
            return f"{v / div:.1f} {unit}"
    return f"{v:.0f} B"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


def phase_table(phases: list[PhaseResult]) -> str:
    rows = []
    for p in phases:
        rows.append([p.name, str(p.ttft["n"]), _fmt_ms(p.ttft["mean"]), _fmt_ms(p.ttft["p50"]),
                     _fmt_ms(p.ttft["p95"]), f"{p.wall_s:.1f}"])
    return table(["phase", "requests", "TTFT mean ms", "p50 ms", "p95 ms", "wall s"], rows)


def run(a: argparse.Namespace, log=print) -> dict:
    spec = PromptSpec(doc_tokens=a.doc_tokens, num_docs=a.num_docs, query_tokens=a.query_tokens,
                      reuse_fraction=a.reuse_fraction, repeat_count=a.repeat_count, repeat_mode=a.repeat_mode,
                      seed=a.seed, salt=a.salt, vocab_size=a.vocab_size)
    server = Server(a.url, a.model)
    metrics_url = a.metrics_url
    phases: list[PhaseResult] = []
    if a.reset_prefix_cache:
        server.reset_prefix_cache()
    if a.phase in ("both", "warmup"):
        prompts = [(d, 0, warmup_prompt(spec, d)) for d in range(spec.num_docs)]
        phases.append(run_phase(server, "warmup", prompts, a.concurrency, a.max_tokens, metrics_url, log,
                                a.metrics_flush_s))
    if a.phase == "both" and a.reset_prefix_cache:
        time.sleep(a.settle_s)
        if not server.reset_prefix_cache():
            log("warning: /reset_prefix_cache kept failing; query phase may hit vLLM's own prefix cache")
    elif a.phase == "both" and a.settle_s:
        time.sleep(a.settle_s)
    if a.phase in ("both", "query"):
        prompts = [(d, k, query_prompt(spec, d, k)) for d, k in query_order(spec)]
        phases.append(run_phase(server, "query", prompts, a.concurrency, a.max_tokens, metrics_url, log,
                                a.metrics_flush_s))
    result = {"label": a.label, "url": a.url, "model": a.model, "spec": asdict(spec),
              "reuse_tokens": spec.reuse_tokens, "concurrency": a.concurrency, "max_tokens": a.max_tokens,
              "phases": {p.name: asdict(p) for p in phases}}
    log(phase_table(phases))
    for p in phases:
        if p.metrics is None:
            log(f"{p.name}: no metrics (could not read /metrics)")
            continue
        shown = {k: v for k, v in p.metrics.items() if v}
        if shown:
            log(f"{p.name} metric deltas:")
            for k, v in shown.items():
                log(f"  {k} {v:g}")
        else:
            log(f"{p.name}: no prefix-cache/offload/kvtier counter changed")
        if p.gauges:
            log(f"{p.name} gauges at the end: " + ", ".join(f"{k}={v:g}" for k, v in p.gauges.items()))
    return result


# --------------------------------------------------------------------------------------------------------------
# Summary of several runs (the demo's table)
# --------------------------------------------------------------------------------------------------------------

def summary_rows(results: list[dict], phase: str = "query", baseline: str | None = None) -> list[list[str]]:
    base_mean = None
    for r in results:
        if baseline is None or r.get("label") == baseline:
            p = r["phases"].get(phase)
            if p:
                base_mean = p["ttft"]["mean"]
                break
    rows = []
    for r in results:
        p = r["phases"].get(phase)
        if not p:
            continue
        t = p["ttft"]
        speedup = "-" if not base_mean or not t["mean"] else f"{base_mean / t['mean']:.2f}x"
        m = p.get("metrics") or {}
        hits = m.get("vllm:external_prefix_cache_hits_total", m.get("vllm:external_prefix_cache_hits"))
        rows.append([r.get("label") or "?", str(t["n"]), _fmt_ms(t["mean"]), _fmt_ms(t["p50"]), _fmt_ms(t["p95"]),
                     speedup, "-" if hits is None else f"{hits:.0f}", _fmt_bytes(bytes_read(m))])
    return rows


SUMMARY_HEADERS = ["config", "queries", "TTFT mean ms", "p50 ms", "p95 ms", "speedup", "ext hit tokens",
                   "kvtier bytes read"]


def summarize_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m kvtier.bench_longdoc summarize",
                                description="One TTFT table from several --json results.")
    p.add_argument("files", nargs="+")
    p.add_argument("--phase", default="query", choices=("warmup", "query"))
    p.add_argument("--baseline", help="label of the run the speedup is relative to (default: the first)")
    a = p.parse_args(argv)
    results = []
    for f in a.files:
        with open(f) as fh:
            results.append(json.load(fh))
    print(table(SUMMARY_HEADERS, summary_rows(results, a.phase, a.baseline)))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvtier.bench_longdoc",
                                description="Long-document TTFT benchmark against an OpenAI-compatible vLLM server "
                                            "(subcommand `summarize FILES...` prints one table of several runs).")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    p.add_argument("--model", default="tiny", help="served model name")
    p.add_argument("--doc-tokens", type=int, default=8192, help="document length in tokens (BOS included)")
    p.add_argument("--num-docs", type=int, default=4)
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
