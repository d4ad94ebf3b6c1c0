"""Build a tiny, deterministic Llama-architecture model for local vLLM tests.

Usage:
    python -m kvtier.tiny_model OUTDIR [--layers N] [--hidden H] [--heads Q]
                                       [--kv-heads K] [--head-dim D] ...

Everything is generated locally: random weights (seeded, saved as
safetensors in bfloat16) and a word-level tokenizer over a synthetic
vocabulary of pseudo-words (tokenizer.json + tokenizer_config.json). No
network access is needed; HF_HUB_OFFLINE=1 is set before transformers is
imported.

The default shape is chosen for a 2-core CPU running vLLM: prefilling an
8k-token prompt takes a few seconds, while the KV cache of those 8k tokens
is tens of MiB (see docs/vllm-version.md for measurements).

Prompts built from words of `synthetic_words()` tokenize to exactly one
token per word (plus the BOS token that the tokenizer prepends), so a
prompt of N tokens is `" ".join(synthetic_words(N - 1, seed))`.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import sys
import zlib
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, 3
PUNCTUATION = tuple(".,;:!?'\"()-") + tuple("0123456789")
_CONSONANTS = "bcdfghjklmnprstvz"
_VOWELS = "aeiou"

# Default shape. KV bytes per token (bf16) = 2 * layers * kv_heads * head_dim * 2.
DEFAULTS = dict(
    layers=16,
    hidden=256,
    heads=4,
    kv_heads=2,
    head_dim=64,
    intermediate=512,
    vocab=8192,
    max_pos=32768,
    seed=1234,
)


def _pseudo_words():
    """Yield pseudo-words: all 1-syllable, then 2-, then 3-syllable words."""
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    for n in itertools.count(1):
        for combo in itertools.product(syllables, repeat=n):
            yield "".join(combo)


def vocabulary(vocab_size: int) -> list[str]:
    """The ordered token list: specials, punctuation/digits, pseudo-words."""
    fixed = list(SPECIAL_TOKENS) + list(PUNCTUATION)
    if vocab_size <= len(fixed) + 16:
        raise ValueError(f"vocab_size {vocab_size} too small")
    words = list(itertools.islice(_pseudo_words(), vocab_size - len(fixed)))
    return fixed + words


def synthetic_words(n: int, seed: int = 0, vocab_size: int = DEFAULTS["vocab"]) -> list[str]:
    """n pseudo-words (deterministic for a seed), each one token."""
    import numpy as np

    words = vocabulary(vocab_size)[len(SPECIAL_TOKENS) + len(PUNCTUATION):]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(words), size=n)
    return [words[i] for i in idx]


def synthetic_token_ids(n: int, seed: int = 0, vocab_size: int = DEFAULTS["vocab"]) -> list[int]:
    """n token ids: BOS followed by n-1 pseudo-word ids (deterministic)."""
    import numpy as np

    first_word = len(SPECIAL_TOKENS) + len(PUNCTUATION)
    rng = np.random.default_rng(seed)
    ids = rng.integers(first_word, vocab_size, size=max(n - 1, 0))
    return [BOS_ID] + [int(i) for i in ids]


def build_tokenizer(outdir: Path, vocab_size: int, max_pos: int) -> None:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate(vocabulary(vocab_size))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(),
         pre_tokenizers.Digits(individual_digits=True)]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", BOS_ID)]
    )
    # Word-level decoding: tokens joined by single spaces.
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.save(str(outdir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": max_pos,
        "clean_up_tokenization_spaces": False,
        "chat_template": (
            "{{ bos_token }}{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} "
            "{% endfor %}{% if add_generation_prompt %}assistant : {% endif %}"
        ),
    }
    (outdir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    (outdir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def _param_rng_seed(seed: int, name: str) -> list[int]:
    return [seed, zlib.crc32(name.encode())]


def build_model(outdir: Path, a: argparse.Namespace) -> dict:
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if a.head_dim not in (64, 128):
        raise ValueError("head_dim must be 64 or 128 (vLLM CPU attention)")
    if a.heads % a.kv_heads:
        raise ValueError("heads must be a multiple of kv_heads")
    config = LlamaConfig(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        head_dim=a.head_dim,
        hidden_act="silu",
        max_position_embeddings=a.max_pos,
        initializer_range=0.02,
        rms_norm_eps=1e-5,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
    )
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(a.seed)
    model = LlamaForCausalLM(config)
    # Fill every parameter from a per-name numpy stream, so the weights do not
    # depend on transformers' init order or torch's RNG implementation.
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            rng = np.random.default_rng(_param_rng_seed(a.seed, name))
            std = 0.02
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                std = 0.02 / (2 * a.layers) ** 0.5
            vals = rng.standard_normal(size=tuple(p.shape), dtype=np.float32) * std
            p.copy_(torch.from_numpy(vals))
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.save_pretrained(str(outdir), safe_serialization=True)
    n_params = sum(p.numel() for p in model.parameters())
    kv_bytes_per_token = 2 * a.layers * a.kv_heads * a.head_dim * 2
    return {"params": n_params, "kv_bytes_per_token_bf16": kv_bytes_per_token}


def _digest(outdir: Path) -> str:
    h = hashlib.sha256()
    for name in sorted(os.listdir(outdir)):
        if name.endswith((".safetensors", "tokenizer.json")):
            h.update(name.encode())
            h.update((outdir / name).read_bytes())
    return h.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvtier.tiny_model", description=__doc__.split("\n")[0])
    p.add_argument("outdir", type=Path)
    p.add_argument("--layers", type=int, default=DEFAULTS["layers"])
    p.add_argument("--hidden", type=int, default=DEFAULTS["hidden"])
    p.add_argument("--heads", type=int, default=DEFAULTS["heads"])
    p.add_argument("--kv-heads", type=int, default=DEFAULTS["kv_heads"])
    p.add_argument("--head-dim", type=int, default=DEFAULTS["head_dim"])
    p.add_argument("--intermediate", type=int, default=DEFAULTS["intermediate"])
    p.add_argument("--vocab", type=int, default=DEFAULTS["vocab"])
    p.add_argument("--max-pos", type=int, default=DEFAULTS["max_pos"])
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    a = p.parse_args(argv)

    a.outdir.mkdir(parents=True, exist_ok=True)
    build_tokenizer(a.outdir, a.vocab, a.max_pos)
    info = build_model(a.outdir, a)
    info.update(
        layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads,
        head_dim=a.head_dim, intermediate=a.intermediate, vocab=a.vocab,
        max_pos=a.max_pos, seed=a.seed,
    )
    info["kv_mib_per_8k_tokens"] = info["kv_bytes_per_token_bf16"] * 8192 / 2**20
    info["digest"] = _digest(a.outdir)
    (a.outdir / "kvtier_tiny_model.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
