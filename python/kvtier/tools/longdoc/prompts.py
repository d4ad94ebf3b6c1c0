"""The long-document benchmark's workload, pure (no I/O; unit-tested): documents, warm-up and query prompts, the
query order, and TTFT statistics. The whole benchmark is described in kvtier.tools.longdoc (package docstring)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from kvtier.tiny_model import BOS_ID, DEFAULTS, PUNCTUATION, SPECIAL_TOKENS

FIRST_WORD_ID = len(SPECIAL_TOKENS) + len(PUNCTUATION)
REPEAT_MODES = ("random", "tile", "interleave")
PHASES = ("both", "warmup", "query")

# Streams of pseudo-random ids are keyed by a tuple hashed into random.Random's seed, so that they do not depend on
# PYTHONHASHSEED or on the order in which prompts are built.
_KIND_DOC, _KIND_WARMUP_Q, _KIND_TAIL, _KIND_QUERY_Q, _KIND_ORDER = 1, 2, 3, 4, 5


def seeded_rng(*key: int) -> random.Random:
    return random.Random("kvtier-longdoc:" + ":".join(str(int(k)) for k in key))


def words(n: int, rng: random.Random, vocab_size: int) -> list[int]:
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
    return [BOS_ID] + words(spec.doc_tokens - 1, seeded_rng(spec.seed, _KIND_DOC, doc), spec.vocab_size)


def warmup_prompt(spec: PromptSpec, doc: int) -> list[int]:
    q = words(spec.query_tokens, seeded_rng(spec.seed, _KIND_WARMUP_Q, doc), spec.vocab_size)
    return document(spec, doc) + q


def differ(tok: int, avoid: int | None, vocab_size: int) -> int:
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
    rng = seeded_rng(spec.seed, _KIND_TAIL, spec.salt, doc, rep)
    tail = words(spec.prompt_tokens - keep, rng, spec.vocab_size)
    tail[0] = differ(tail[0], warm[keep], spec.vocab_size)
    return warm[:keep] + tail


def query_order(spec: PromptSpec) -> list[tuple[int, int]]:
    """(doc, rep) pairs of the query phase: tile = 0..N-1 repeated; interleave = each doc repeat_count times in a
    row; random = the tile order shuffled (seeded)."""
    n, r = spec.num_docs, spec.repeat_count
    if spec.repeat_mode == "interleave":
        return [(d, k) for d in range(n) for k in range(r)]
    order = [(d, k) for k in range(r) for d in range(n)]
    if spec.repeat_mode == "random":
        seeded_rng(spec.seed, _KIND_ORDER, spec.salt).shuffle(order)
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
