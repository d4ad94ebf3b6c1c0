"""Long-document benchmark client for an OpenAI-compatible vLLM server (`python -m kvtier.bench_longdoc` is the same).

    python -m kvtier.tools.longdoc --url http://127.0.0.1:8000 --model tiny \\
        --doc-tokens 8192 --num-docs 4 --concurrency 1 --json out.json
    python -m kvtier.tools.longdoc summarize a.json b.json ... [--baseline LABEL]

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

Modules: ``prompts`` (the workload and its statistics, pure), ``run`` (the phases against a server), ``report``
(tables), ``cli`` (the command line).
"""
