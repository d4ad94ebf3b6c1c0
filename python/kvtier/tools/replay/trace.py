"""The trace and the prompts built from it (pure; unit-tested): parsing, cutting, the send schedule, token blocks that
repeat where the trace's hash ids repeat, and the reuse an unbounded prefix cache would find."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

from kvtier.tiny_model import DEFAULTS
from kvtier.tools.longdoc.prompts import words

@dataclass(frozen=True)
class TraceRequest:
    index: int  # line number in the trace (0-based)
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def parse_line(line: str, index: int) -> TraceRequest:
    o = json.loads(line)
    try:
        return TraceRequest(index, float(o["timestamp"]), int(o["input_length"]), int(o["output_length"]),
                            tuple(int(h) for h in o["hash_ids"]))
    except KeyError as e:
        raise ValueError(f"trace line {index + 1}: missing field {e}") from None


def load_trace(path: str, start: int = 0, max_requests: int | None = None,
               duration_s: float | None = None) -> list[TraceRequest]:
    """Requests of the trace from line `start` on, at most max_requests of them, and only those within duration_s
    (trace time) of the first one kept."""
    out: list[TraceRequest] = []
    t_first = None
    with open(path) as fh:
        for i, line in enumerate(fh):
            if i < start or not line.strip():
                continue
            r = parse_line(line, i)
            if t_first is None:
                t_first = r.timestamp_ms
            if duration_s is not None and r.timestamp_ms - t_first > duration_s * 1000.0:
                break
            out.append(r)
            if max_requests is not None and len(out) >= max_requests:
                break
    return out


def cut(reqs: list[TraceRequest], start: int = 0, max_requests: int | None = None,
        duration_s: float | None = None) -> list[TraceRequest]:
    """The same cut as load_trace, on a list (start counts list positions)."""
    out = []
    for r in reqs[start:]:
        if duration_s is not None and out and r.timestamp_ms - out[0].timestamp_ms > duration_s * 1000.0:
            break
        out.append(r)
        if max_requests is not None and len(out) >= max_requests:
            break
    return out


def schedule(reqs: list[TraceRequest], time_scale: float) -> list[float]:
    """Send offsets (seconds from the start) of the requests: trace time relative to the first, times time_scale."""
    if not reqs:
        return []
    if time_scale < 0:
        raise ValueError("time_scale must be >= 0")
    t0 = reqs[0].timestamp_ms
    return [max(0.0, (r.timestamp_ms - t0) / 1000.0 * time_scale) for r in reqs]


class TokenBuilder:
    """Deterministic prompts: block h's tokens depend only on (seed, h); equal ids -> identical token blocks."""

    def __init__(self, block_tokens: int, length_scale: float = 1.0, seed: int = 0,
                 vocab_size: int = DEFAULTS["vocab"], max_input_tokens: int | None = None):
        if block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")
        if not length_scale > 0:
            raise ValueError("length_scale must be > 0")
        self.trace_block_tokens = block_tokens
        self.length_scale = length_scale
        self.block_tokens = max(1, round(block_tokens * length_scale))
        self.seed = seed
        self.vocab_size = vocab_size
        self.max_input_tokens = max_input_tokens
        self._cache: dict[int, list[int]] = {}
        self.truncated = 0

    def length(self, r: TraceRequest) -> int:
        n = max(1, math.ceil(r.input_length * self.length_scale))
        return n

    def block(self, h: int) -> list[int]:
        b = self._cache.get(h)
        if b is None:
            rng = random.Random(f"kvtier-replay:{self.seed}:block:{h}")
            b = words(self.block_tokens, rng, self.vocab_size)
            self._cache[h] = b
        return b

    def prompt(self, r: TraceRequest) -> list[int]:
        n = self.length(r)
        toks: list[int] = []
        for h in r.hash_ids:
            need = n - len(toks)
            if need <= 0:
                break
            toks.extend(self.block(h)[:need])
        if len(toks) < n:  # the ids cover less than input_length: pad with words of this request only
            rng = random.Random(f"kvtier-replay:{self.seed}:pad:{r.index}")
            toks.extend(words(n - len(toks), rng, self.vocab_size))
        if self.max_input_tokens is not None and len(toks) > self.max_input_tokens:
            toks = toks[:self.max_input_tokens]
            self.truncated += 1
        return toks


def ideal_reuse(reqs: list[TraceRequest], builder: TokenBuilder) -> dict:
    """What an unbounded prefix cache could serve: per request, the leading blocks whose ids were all seen before
    at the same position chain (the ids are prefix hashes), in prompt tokens."""
    seen: set[tuple[int, ...]] = set()
    total = reusable = 0
    for r in reqs:
        n = builder.length(r)
        if builder.max_input_tokens is not None:
            n = min(n, builder.max_input_tokens)
        total += n
        k = 0
        for i in range(len(r.hash_ids)):
            if r.hash_ids[:i + 1] in seen:
                k += 1
            else:
                break
        full_blocks = n // builder.block_tokens
        reusable += min(k, full_blocks) * builder.block_tokens
        for i in range(len(r.hash_ids)):
            seen.add(r.hash_ids[:i + 1])
    return {"prompt_tokens": total, "reusable_tokens": reusable,
            "reusable_fraction": reusable / total if total else 0.0}
