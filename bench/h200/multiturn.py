"""Round-robin multi-turn conversations larger than the DRAM tier (issue 8, the SCBench pattern): TTFT, and the
bytes read from the disk per byte the admitted requests needed. Called by headline.py (`run --workload multiturn`);
one server at a time.

Conversation c starts with a context of --mt-context tokens; every later turn sends the whole history again plus
--mt-turn-tokens new tokens (what a chat client does: previous turns + the new question). Rounds go over every
conversation in order (round robin), so by the time a conversation comes back, the others' turns have pushed it out
of the GPU cache and, once the conversations outgrow it, out of the DRAM tier. vLLM's own prefix cache is reset
before each round (so every history comes from the external tier, as in bench/tier/acceptance.py's bound run), the
stores of the previous round get time to reach the disk, and the page cache is dropped (a buffered tier gets no
free RAM tier from the kernel).

Figures per round and in total:
* needed: vLLM's kv_offload_load_bytes (what the offloading connector copied into GPU blocks for admitted requests:
  the same counter for kvtier and vLLM's native tier, both are OffloadingConnector specs);
* read from disk: the block device's sectors read (/sys/dev/block/MAJ:MIN/stat of the storage root's device), so
  every process and both buffered and O_DIRECT reads count, and nothing a page cache served does;
* TTFT of every request (streamed), and the connector's own counters where it exports them.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kvtier.tools.client import ApiClient as Client, metric_deltas
from kvtier.tools.longdoc.prompts import FIRST_WORD_ID, seeded_rng, words


def block_device_stat(path: Path) -> Path | None:
    """The /sys stat file of the block device that holds `path` (a partition's own stat if it is one)."""
    st = os.stat(path)
    p = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat")
    return p if p.exists() else None


def sectors_read(stat: Path | None) -> int | None:
    if stat is None:
        return None
    try:
        return int(stat.read_text().split()[2])
    except (OSError, ValueError, IndexError):
        return None


def conversation(c: int, tokens: int, vocab: int) -> list[int]:
    """The first `tokens` tokens of conversation c (deterministic; every turn extends the same stream)."""
    return [1] + words(tokens - 1, seeded_rng(8, c), vocab)


def multiturn(server, model: dict, kn: dict, a, root: Path) -> dict:
    """Runs the workload on one ready headline Server; returns a JSON-able record."""
    from headline import drop_caches, log  # noqa: PLC0415 (headline imports us lazily)

    vocab = model["config"]["vocab_size"]
    client = Client(server.url, "m")
    root.mkdir(parents=True, exist_ok=True)
    stat = block_device_stat(root)
    rec: dict = {"system": server.name, "workload": "multiturn", "convs": a.mt_convs, "turns": a.mt_turns,
                 "context_tokens": a.mt_context, "turn_tokens": a.mt_turn_tokens, "tiered_gib": a.tiered_gib,
                 "block_device_stat": str(stat) if stat else None, "rounds": []}
    final = a.mt_context + (a.mt_turns - 1) * a.mt_turn_tokens
    rec["working_set_bytes"] = a.mt_convs * final * model["kv_bytes_per_token"]
    streams = [conversation(c, final, vocab) for c in range(a.mt_convs)]
    # The query of turn t: history up to its length, then a distinct question token so that two turns never
    # share their last block exactly (vLLM computes the last token in any case).
    tot = {"needed": 0.0, "disk": 0, "ttfts": []}
    try:
        for t in range(a.mt_turns):
            n = a.mt_context + t * a.mt_turn_tokens
            prompts = [s[:n] + [FIRST_WORD_ID + 7 + t] for s in streams]
            if t:
                new_bytes = a.mt_convs * a.mt_turn_tokens * model["kv_bytes_per_token"]
                time.sleep(max(2.0, (new_bytes if t > 1 else a.mt_convs * n * model["kv_bytes_per_token"]) / 1.5e9))
                if not client.reset_prefix_cache():
                    raise RuntimeError("reset_prefix_cache kept failing")
                drop_caches()
            before = client.metrics(None)
            s0 = sectors_read(stat)
            t0 = time.monotonic()
            with ThreadPoolExecutor(a.concurrency) as ex:
                res = list(ex.map(lambda p: client.completion(p, 2), prompts))
            wall = time.monotonic() - t0
            time.sleep(1.2)  # connector counters reach /metrics at most once a second: one more step after that
            client.completion([1, FIRST_WORD_ID], 1)
            after = client.metrics(None)
            s1 = sectors_read(stat)
            d = metric_deltas(before or {}, after or {})
            needed = sum(v for k, v in d.items() if k.endswith("kv_offload_load_bytes_total"))
            disk = (s1 - s0) * 512 if s0 is not None and s1 is not None else None
            ttfts = [r["ttft_s"] for r in res]
            rnd = {"turn": t, "prompt_tokens": n + 1, "ttft_s": ttfts, "ttft_mean_s": sum(ttfts) / len(ttfts),
                   "wall_s": round(wall, 2), "needed_bytes": needed, "disk_read_bytes": disk,
                   "metrics": {k: v for k, v in d.items() if "kvtier" in k or "kv_offload" in k}}
            rec["rounds"].append(rnd)
            tot["needed"] += needed
            tot["disk"] += disk or 0
            tot["ttfts"] += ttfts if t else []
            log(f"{server.name} multiturn turn {t}: {n + 1} tokens, TTFT mean {rnd['ttft_mean_s'] * 1e3:.0f} ms, "
                f"needed {needed / 1e9:.2f} GB, read from disk {(disk or 0) / 1e9:.2f} GB")
    except Exception as e:  # keep what was measured
        rec["error"] = f"{type(e).__name__}: {e}"[:800]
    rec["needed_bytes"] = tot["needed"]
    rec["disk_read_bytes"] = tot["disk"]
    rec["read_per_needed"] = tot["disk"] / tot["needed"] if tot["needed"] else None
    later = tot["ttfts"]
    rec["later_turns_ttft_mean_s"] = sum(later) / len(later) if later else None
    if not rec.get("error"):
        rpn = f"{rec['read_per_needed']:.2f}" if rec["read_per_needed"] is not None else "n/a"
        rec["summary"] = (f"later turns' TTFT mean {(rec['later_turns_ttft_mean_s'] or 0) * 1e3:.0f} ms; needed "
                          f"{tot['needed'] / 1e9:.1f} GB, read from disk {tot['disk'] / 1e9:.1f} GB "
                          f"({rpn} per byte needed); working set {rec['working_set_bytes'] / 1e9:.1f} GB vs "
                          f"DRAM tier {a.tiered_gib} GiB")
    return rec
