"""`kvtier replay`: replay a request trace (Mooncake / Alibaba Bailian JSONL) against an OpenAI-compatible vLLM.

    kvtier replay --trace mooncake_conversation_trace.jsonl --url http://127.0.0.1:8000 --model tiny \\
        --max-requests 40 --time-scale 0.05 --length-scale 0.125 --output-tokens 2 --json out.json

Each line of the trace is one request: `timestamp` (ms since the trace start), `input_length`, `output_length` and
`hash_ids`, the ids of the prompt's consecutive blocks of --block-tokens tokens (512 for Mooncake, 16 for
Bailian); equal ids mean equal blocks. The replayer builds token-id prompts whose blocks repeat exactly where the
ids repeat: block `h` is always the same pseudo-random words (from --seed and h alone), the last block is cut to
`input_length` (the partial block is the first tokens of its id's block), and a prompt longer than its ids cover is
padded with words unique to that request.

--length-scale s shrinks every prompt to ceil(s * input_length) tokens with blocks of round(s * block_tokens)
tokens, which keeps the reuse structure (which blocks repeat, and the prefix fractions) at a size the model can
take: the tiny CPU model here serves 8k tokens at most and Mooncake's prompts average 12k. --max-input-tokens
then truncates any prompt still too long (counted in the report).

Timing: request i is sent at (timestamp_i - timestamp_first) / 1000 * --time-scale seconds after the start
(0: as fast as --concurrency allows). At most --concurrency requests are in flight; a request that finds them all
busy waits (its wait is reported as queue delay). TTFT is measured per request with streaming, from the moment it
is sent.

The report: TTFT mean/p50/p95/p99, queue delay, the trace's own reuse (the prompt tokens an infinite prefix cache
could serve, from the ids), and from vLLM's /metrics the deltas over the run: vLLM's prefix cache (GPU, tokens),
external hits (tokens loaded through the connector), kvtier's chunk lookups by outcome (DRAM hit, disk hit, miss),
hit rates by tier, and bytes read and written by kvtier. --json writes all of it with every request.

Only the standard library is used (the HTTP client is kvtier.tools.client).

Modules: ``trace`` (the trace and the prompts built from it, pure), ``report`` (metric deltas and the report),
``run`` (the passes against a server), ``cli`` (the command line, `kvtier replay`).
"""
