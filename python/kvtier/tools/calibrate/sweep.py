"""The measurements of `kvtier calibrate` against vLLM with kvtier (the I/O): prompts, the sweep over document
sizes, prefix fractions and tiers, and the servers it starts (--serve) or talks to (--url)."""

from __future__ import annotations

import argparse
import random
import shlex
import shutil
import sys
import time
from pathlib import Path

from kvtier.tiny_model import BOS_ID
from kvtier.tools.client import ApiClient, metric_deltas
from kvtier.tools.launcher import VllmServer, free_port, kvtier_transfer_config, server_argv, server_env
from kvtier.tools.longdoc.prompts import differ, words


class Progress:
    """tqdm when installed, else a one-line text bar on stderr."""

    def __init__(self, total: int, desc: str = "calibrate", enabled: bool = True):
        self.total, self.n, self.desc, self.enabled = total, 0, desc, enabled
        self._bar = None
        self._t0 = time.monotonic()
        if enabled:
            try:
                from tqdm import tqdm
                self._bar = tqdm(total=total, desc=desc, unit="req", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                pass

    def update(self, note: str = "") -> None:
        self.n += 1
        if not self.enabled:
            return
        if self._bar is not None:
            if note:
                self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(1)
            return
        width = 30
        done = int(width * self.n / max(self.total, 1))
        el = time.monotonic() - self._t0
        eta = el / self.n * (self.total - self.n) if self.n else 0
        sys.stderr.write(f"\r{self.desc} [{'#' * done}{'.' * (width - done)}] {self.n}/{self.total} "
                         f"{el:.0f}s<{eta:.0f}s {note:<30.30}")
        sys.stderr.flush()

    def write(self, msg: str) -> None:
        if self._bar is not None:
            self._bar.write(msg, file=sys.stderr)
        else:
            sys.stderr.write(("\n" if self.enabled and self.n else "") + msg + "\n")
            sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled:
            sys.stderr.write("\n")


# --------------------------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------------------------

_KIND_DOC, _KIND_TAIL, _KIND_FILL, _KIND_PROBE = 11, 12, 13, 14
_TIER_CODE = {"cold": 0, "dram": 1, "disk": 2, "warm": 3, "overhead": 4, "flush": 5}


def _rng(*key) -> random.Random:
    return random.Random("kvtier-calibrate:" + ":".join(str(k) for k in key))


def doc_prompt(seed: int, tier: str, d: int, frac_idx: int, rep: int, vocab: int) -> list[int]:
    """A document of d tokens (BOS + words), unique for its (seed, tier, d, fraction index, rep)."""
    return [BOS_ID] + words(d - 1, _rng(seed, _KIND_DOC, _TIER_CODE[tier], d, frac_idx, rep), vocab)


def hit_prompt(doc: list[int], prefix: int, seed: int, salt: int, vocab: int) -> list[int]:
    """doc[:prefix] followed by fresh words up to len(doc); shares exactly `prefix` leading tokens with doc."""
    prefix = max(1, min(len(doc), prefix))
    if prefix == len(doc):
        return list(doc)
    tail = words(len(doc) - prefix, _rng(seed, _KIND_TAIL, salt, len(doc), prefix), vocab)
    tail[0] = differ(tail[0], doc[prefix], vocab)
    return doc[:prefix] + tail


def plan_counts(sizes: list[int], fractions: list[float], reps: int, tiers: list[str]) -> int:
    n = len(sizes) * reps  # cold documents of the dram sweep (or plain f samples)
    if "dram" in tiers:
        n += len(sizes) * reps * len(fractions)
    if "disk" in tiers:
        n += 2 * len(sizes) * reps * len(fractions)
    return n


def _name_code(name: str) -> int:
    return sum(ord(c) for c in name)



# --------------------------------------------------------------------------------------------------------------
# The sweep against vLLM
# --------------------------------------------------------------------------------------------------------------

class Sweep:
    def __init__(self, a: argparse.Namespace, progress: Progress, log):
        self.a, self.progress, self.log = a, progress, log
        self.samples: list[dict] = []
        self.phases: dict[str, dict] = {}

    def _send(self, server: ApiClient, prompt: list[int]) -> float:
        r = server.completion(prompt, self.a.max_tokens)
        if r["prompt_tokens"] is not None and r["prompt_tokens"] != len(prompt):
            raise RuntimeError(f"server counted {r['prompt_tokens']} prompt tokens, sent {len(prompt)}")
        return r["ttft_s"]

    def _ext_hits(self, server: ApiClient) -> float | None:
        m = server.metrics(None)
        if m is None:
            return None
        return sum(v for k, v in m.items() if k.split("{")[0] in ("vllm:external_prefix_cache_hits_total",
                                                                     "vllm:external_prefix_cache_hits"))

    def record(self, kind: str, tier: str | None, d: int, frac: float | None, prefix: int | None, ttft: float,
               rep: int, server_name: str, ext: float | None = None) -> None:
        s = {"kind": kind, "tier": tier, "doc_tokens": d, "fraction": frac, "prefix_tokens": prefix,
             "ttft_s": ttft, "rep": rep, "server": server_name}
        if ext is not None:
            s["external_hit_tokens"] = ext
        self.samples.append(s)

    def prewarm(self, server: ApiClient, name: str) -> None:
        """Throw-away requests (first requests after startup are slow), then the overhead t0 samples. The throw-away
        documents are the same on every server: server B, on server A's root, loads them from disk, which warms
        its load path and stores nothing more."""
        a = self.a
        for i, d in enumerate(a.sizes):
            self._send(server, doc_prompt(a.seed + 7919 * (1 + a.salt), "warm", d, i, 0, a.vocab_size))
        for i in range(max(3, a.reps)):
            p = doc_prompt(a.seed + 7919 * (1 + a.salt), "overhead", 16, i, _name_code(name), a.vocab_size)
            self.record("overhead", None, 16, None, None, self._send(server, p), i, name)

    def reset(self, server: ApiClient) -> None:
        if not server.reset_prefix_cache():
            self.progress.write("warning: /reset_prefix_cache kept failing; a hit may come from vLLM's own cache")

    def settle(self, server: ApiClient) -> None:
        """Let the previous request's stores reach kvtier: vLLM submits a step's stores at the next step."""
        self._send(server, doc_prompt(self.a.seed, "overhead", 16, 999, int(time.monotonic() * 1000), self.a.vocab_size))
        time.sleep(self.a.settle_s)

    def _bytes_written(self, server: ApiClient) -> float | None:
        m = server.metrics(None)
        if m is None:
            return None
        return sum(v for k, v in m.items() if k.split("{")[0].startswith("vllm:kvtier_bytes_written"))

    def quiesce(self, server: ApiClient) -> None:
        """Before a measured request: wait until kvtier's writes of the previous requests are done (its
        bytes_written counter stops moving), so that no file write competes with the measurement. Each check
        pokes the server with a 16-token request (counters move only while vLLM steps) and waits > 1 s (kvtier
        samples its engine once a second)."""
        if not self.a.quiesce:
            return
        last = self._bytes_written(server)
        deadline = time.monotonic() + self.a.quiesce_timeout_s
        while time.monotonic() < deadline:
            self._send(server, doc_prompt(self.a.seed, "overhead", 16, 998, time.monotonic_ns(), self.a.vocab_size))
            time.sleep(max(self.a.settle_s, 1.1))
            w = self._bytes_written(server)
            if w is None or w == last:
                return
            last = w

    def hit(self, server: ApiClient, tier: str, doc: list[int], fi: int, frac: float, rep: int, name: str) -> None:
        a = self.a
        d = len(doc)
        prefix = max(1, min(d, round(frac * d)))
        self.quiesce(server)
        self.reset(server)
        before = self._ext_hits(server)
        t = self._send(server, hit_prompt(doc, prefix, a.seed, a.salt * 100 + rep, a.vocab_size))
        after = self._ext_hits(server)
        ext = after - before if before is not None and after is not None else None
        self.record("hit", tier, d, frac, prefix, t, rep, name, ext)
        self.progress.update(f"{tier} D={d} p={frac:g} {t * 1000:.0f}ms")

    def cold(self, server: ApiClient, tier: str, d: int, fi: int, rep: int, name: str) -> list[int]:
        a = self.a
        doc = doc_prompt(a.seed + 7919 * a.salt, tier, d, fi, rep, a.vocab_size)
        self.quiesce(server)
        t = self._send(server, doc)
        self.record("cold", None, d, None, None, t, rep, name)
        self.progress.update(f"cold D={d} {t * 1000:.0f}ms")
        return doc

    def wait_stores(self, server: ApiClient, timeout_s: float = 300) -> None:
        """Until kvtier's bytes_written stops growing (stores reach the disk asynchronously)."""
        last, stable_since = None, time.monotonic()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.settle(server)
            m = server.metrics(None) or {}
            w = sum(v for k, v in m.items() if k.split("{")[0].startswith("vllm:kvtier_bytes_written"))
            if w != last:
                last, stable_since = w, time.monotonic()
            elif time.monotonic() - stable_since >= 3:
                return
        self.progress.write(f"warning: kvtier still writing after {timeout_s}s")

    def phase_metrics(self, name: str, server: ApiClient, before: dict | None) -> None:
        self.settle(server)
        time.sleep(1.2)
        self.settle(server)
        after = server.metrics(None)
        if before is not None and after is not None:
            d = metric_deltas(before, after)
            self.phases[name] = {k: v for k, v in d.items() if v}

    def run_server_a(self, server: ApiClient, name: str) -> list[tuple[int, int, float, int, list[int]]]:
        """Cold f(D) + DRAM hits; stores the disk documents. Returns the disk queries to run later."""
        a = self.a
        self.prewarm(server, name)
        before = server.metrics(None)
        disk_docs = []
        for rep in range(a.reps):
            order = list(a.sizes)
            _rng(a.seed, "order", rep).shuffle(order)
            for d in order:
                doc = self.cold(server, "dram", d, 0, rep, name)
                if "dram" in a.tiers:
                    if not a.quiesce:
                        self.settle(server)
                    for fi, frac in enumerate(a.fractions):
                        self.hit(server, "dram", doc, fi, frac, rep, name)
                if "disk" in a.tiers:
                    for fi, frac in enumerate(a.fractions):
                        ddoc = self.cold(server, "disk", d, fi, rep, name)
                        disk_docs.append((d, fi, frac, rep, ddoc))
        self.phase_metrics("A", server, before)
        return disk_docs

    def run_disk(self, server: ApiClient, name: str, disk_docs, prewarm: bool) -> None:
        a = self.a
        if prewarm:
            self.prewarm(server, name)
        before = server.metrics(None)
        order = list(disk_docs)
        _rng(a.seed, "disk-order").shuffle(order)
        for d, fi, frac, rep, doc in order:
            self.hit(server, "disk", doc, fi, frac, rep, name)
        self.phase_metrics("disk", server, before)

    def flush(self, server: ApiClient, tokens: int) -> None:
        a = self.a
        chunk = max(a.sizes)
        i = 0
        sent = 0
        while sent < tokens:
            n = min(chunk, tokens - sent)
            if n < 2:
                break
            self._send(server, doc_prompt(a.seed + 7919 * a.salt, "flush", n, i, 0, a.vocab_size))
            sent += n
            i += 1


def start_server(a: argparse.Namespace, root: Path, max_len: int, log_path: Path) -> VllmServer:
    """vLLM with kvtier on `root` for the sweep (--serve, --vllm-python, --serve-args, --chunk-tokens,
    --pool-bytes), started."""
    port = free_port()
    tc = kvtier_transfer_config(root, block_size=a.chunk_tokens, kvtier_pool_bytes=a.pool_bytes,
                                kvtier_stats_interval_s=1)
    args = ["--served-model-name", a.model, "--max-model-len", str(max_len), *shlex.split(a.serve_args)]
    env = server_env(cpu=not getattr(a, "serve_gpu", False))
    return VllmServer(server_argv(a.vllm_python, a.serve, port, args, tc), env, log_path, port,
                      name="vLLM", start_timeout_s=a.start_timeout_s, stop_timeout_s=60).start()


def run_vllm(a: argparse.Namespace, log) -> tuple[list[dict], dict]:
    total = plan_counts(a.sizes, a.fractions, a.reps, a.tiers)
    progress = Progress(total, enabled=not a.no_progress)
    sweep = Sweep(a, progress, log)
    try:
        if a.url:
            server = ApiClient(a.url, a.model)
            disk_docs = sweep.run_server_a(server, "url")
            if "disk" in a.tiers:
                sweep.wait_stores(server)
                progress.write(f"flushing the DRAM tier with {a.flush_tokens} tokens of filler prompts")
                sweep.flush(server, a.flush_tokens)
                sweep.run_disk(server, "url", disk_docs, prewarm=False)
        else:
            out = Path(a.out)
            root = Path(a.root) if a.root else out / "kvtier-root"
            if root.exists() and not a.keep_root:
                shutil.rmtree(root)
            root.mkdir(parents=True, exist_ok=True)
            max_len = max(a.sizes) + 64
            progress.write(f"starting vLLM (server A) on {a.serve}, root {root}")
            with start_server(a, root.resolve(), max_len, out / "server-A.log") as srv:
                srv.wait_healthy()
                disk_docs = sweep.run_server_a(ApiClient(srv.url, a.model), "A")
                if "disk" in a.tiers:
                    sweep.wait_stores(ApiClient(srv.url, a.model))
            if "disk" in a.tiers:
                progress.write("restarting vLLM (server B, same root, cold DRAM tier)")
                with start_server(a, root.resolve(), max_len, out / "server-B.log") as srv:
                    srv.wait_healthy()
                    sweep.run_disk(ApiClient(srv.url, a.model), "B", disk_docs, prewarm=True)
    finally:
        progress.close()
    return sweep.samples, sweep.phases
