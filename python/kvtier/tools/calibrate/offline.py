"""f(D) without vLLM: a transformers forward pass over D tokens (`kvtier calibrate --offline-recompute`, and
bench/gpu/frontier.py). Imports torch and transformers when called."""

from __future__ import annotations

import time

from kvtier.tools.calibrate.sweep import Progress

def offline_recompute(model_dir: str, sizes: list[int], reps: int, device: str | None = None,
                      random_weights: bool = False, progress: Progress | None = None,
                      max_rep_s: float | None = None, stop_on_oom: bool = False) -> list[dict]:
    """f(D) samples from a transformers forward pass over D tokens (the prefill a cold request does), timed as
    shared/baselines/h200_baseline.py does: decoder + lm_head of the last position, one warm-up per size.

    max_rep_s: fewer timed repetitions at sizes whose warm-up took long (at least one, at most `reps`, about this
    many seconds each size). stop_on_oom: a size that runs out of device memory ends the sweep (an "oom" sample
    records it) instead of raising."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))

    t_build = time.perf_counter()
    if random_weights:
        cfg = AutoConfig.from_pretrained(model_dir)
        torch.manual_seed(0)
        prev = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # parameters are created in bf16 (a 32B model has no room for fp32)
        try:
            with dev:
                model = AutoModelForCausalLM.from_config(cfg)
        finally:
            torch.set_default_dtype(prev)
        model = model.to(device=dev, dtype=torch.bfloat16)
    else:
        try:  # transformers >= 4.56 names it dtype; older ones torch_dtype
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
        except TypeError:
            model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16)
        model = model.to(dev)
    model.eval()
    vocab = model.config.vocab_size
    info = {"attn_implementation": getattr(model.config, "_attn_implementation", None),
            "build_s": round(time.perf_counter() - t_build, 2),
            "params": sum(p.numel() for p in model.parameters())}

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    samples = []
    for d in sizes:
        ids = torch.randint(0, vocab, (1, d), device=dev, generator=None)
        oom = False
        with torch.inference_mode():
            def fwd():
                h = model.model(input_ids=ids, use_cache=False).last_hidden_state
                return model.lm_head(h[:, -1:])
            try:
                t0 = time.perf_counter()
                fwd()
                sync()
                warm = time.perf_counter() - t0
                n = reps if not max_rep_s else max(1, min(reps, int(max_rep_s // max(warm, 1e-9))))
                for r in range(n):
                    t0 = time.perf_counter()
                    fwd()
                    sync()
                    samples.append(dict({"kind": "cold", "tier": None, "doc_tokens": d, "fraction": None,
                                         "prefix_tokens": None, "ttft_s": time.perf_counter() - t0, "rep": r,
                                         "server": "offline", "warmup_s": warm}, **info))
                    if progress:
                        progress.update(f"offline D={d}")
            except torch.cuda.OutOfMemoryError:
                if not stop_on_oom:
                    raise
                oom = True
        if oom:  # out of the except block, so its traceback no longer holds the activations
            del ids
            torch.cuda.empty_cache()
            samples.append(dict({"kind": "oom", "tier": None, "doc_tokens": d, "fraction": None,
                                 "prefix_tokens": None, "ttft_s": None, "server": "offline"}, **info))
            break
        if dev.type == "cuda":
            samples[-1]["peak_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
    del model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    return samples
