"""A real `vllm serve` (the OpenAI API server module) on the tiny model, in its own process group, always killed
(kvtier.tools.launcher), with the client calls the tests make (kvtier.tools.client). Stopping a server that became
ready asserts that it shut down cleanly (assert_clean_shutdown, issue 20: "Server shutdown logs clean in the
end-to-end tests")."""

import hashlib
import json
import os
import re
import subprocess
import sys
from typing import NamedTuple

from kvtier.tools import launcher
from kvtier.tools.client import ApiClient


def cpu_block_size() -> int:
    """16 where vLLM's CPU attention takes it (up to 0.28), else the smallest block size it takes (0.29+: multiples
    of 32; CPUAttentionBackend.get_supported_kernel_block_sizes, docs/vllm-version.md)."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    sizes = CPUAttentionBackend.get_supported_kernel_block_sizes()
    if any(16 % s.base == 0 if hasattr(s, "base") else s == 16 for s in sizes):
        return 16
    return min(getattr(s, "base", s) for s in sizes)

# float32, not the bf16 of a real deployment: the tiny model's weights are random, so its next-token logits are all
# within a few hundredths of each other (logprobs about -7.9 against -ln(8192) = -9.0 for uniform). In bf16 the
# rounding of two equally valid orders of summation (a prompt computed in one pass, or a cached prefix plus the
# rest, or beside another request) flips greedy tokens: vLLM alone, without kvtier, gave another output in 19 of
# 41 such variants of the test prompts (bench/vllm/numerics.py; a CI run once failed on such a flip). In float32
# none did, logprobs within 9.5e-7, while one prompt token changed moves a logprob by 3.5e-4 or more: the comparison
# in test_e2e_server.py (text and logprobs, LOGPROB_TOL) is then both stable and sensitive.
# --shutdown-timeout: with vLLM 0.26.0's default of 0, SIGTERM makes the API server kill its EngineCore at once
# (SIGKILL right after SIGTERM), before the connector's shutdown runs: kvtier's engine never closes (stores in
# flight are lost, the pool is left for the next start's orphan sweep) and vLLM's own shared memory leaks
# (resource_tracker warnings). With a timeout the EngineCore shuts down in order (test_shutdown.py).
SERVE_ARGS = ["--served-model-name", "tiny", "--dtype", "float32", "--enforce-eager",
              "--block-size", str(cpu_block_size()),
              "--max-model-len", "8192", "--max-num-seqs", "4", "--kv-cache-memory-bytes", str(512 << 20),
              "--enable-prefix-caching", "--seed", "0", "--shutdown-timeout", "30"]


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_model_dir() -> str:
    """The tiny model of python/kvtier/tiny_model.py, built once per version of that file (KVTIER_MODEL_DIR
    overrides the place)."""
    d = os.environ.get("KVTIER_MODEL_DIR")
    if not d:
        with open(os.path.join(REPO, "python", "kvtier", "tiny_model.py"), "rb") as f:
            h = hashlib.sha256(f.read()).hexdigest()[:12]
        d = os.path.expanduser(f"~/.cache/kvtier/models/tiny-llama-{h}")
    if not os.path.exists(os.path.join(d, "kvtier_tiny_model.json")):
        subprocess.run([sys.executable, "-m", "kvtier.tiny_model", d], check=True, timeout=600)
    return d


def kvtier_transfer_config(root, **extra) -> str:
    """kvtier by name only: the names resolve through kvtier's vLLM plugin (python/kvtier/vllm_plugin.py);
    test_plugin.py checks that the explicit module paths resolve to the same classes."""
    ec = {"spec_name": "KVTierSpec", "kvtier_root": str(root),
          "block_size": 256, "kvtier_pool_bytes": "256MiB", "kvtier_stats_interval_s": 1}
    ec.update(extra)
    return json.dumps({"kv_connector": "KVTierConnector", "kv_role": "kv_both", "kv_connector_extra_config": ec})


def assert_clean_shutdown(log: str, rc: int | None, stacks=None) -> None:
    """The server's shutdown was clean (launcher.shutdown_problems: no traceback, error, forced kill or leak in `log`,
    exit status 0, and kvtier's own shutdown lines where kvtier's engine was open); else fails with the log's
    tail, and `stacks` (launcher.VllmServer.stacks_path: where a stuck EngineCore's threads stood) when given."""
    problems = launcher.shutdown_problems(log, rc)
    tail = "\n".join(log.splitlines()[-60:])
    where = ""
    if stacks is not None and os.path.exists(stacks):
        with open(stacks, errors="replace") as f:
            where = f"\n--- {stacks}:\n" + f.read()[:20000]
    assert not problems, ("server shutdown not clean:\n" + "\n".join(problems[:20]) + "\n--- log tail:\n" + tail
                          + where)


class Completion(NamedTuple):
    """A streamed greedy completion: its text, the time to its first token, and the logprob of each token."""
    text: str
    ttft: float | None
    logprobs: tuple[float, ...]


class Server(launcher.VllmServer):
    """One server on the tiny model (SERVE_ARGS), started at construction; the client calls the tests make. The
    first stop() of a server that became ready asserts a clean shutdown (of the log written since the SIGTERM, or of
    all of it when the server had exited before); leaving a `with` block on an exception stops without asserting, so
    the test's own failure is the one reported."""

    def __init__(self, model_dir, log_path, transfer_config=None, start_timeout_s=420, env=None, extra_args=()):
        port = launcher.free_port()
        argv = launcher.server_argv(sys.executable, model_dir, port, SERVE_ARGS, transfer_config) + list(extra_args)
        # PYTHONFAULTHANDLER: a stuck EngineCore's Python tracebacks reach the log (launcher.report_stuck_engine_core).
        super().__init__(argv, launcher.server_env(**{"PYTHONFAULTHANDLER": "1", **(env or {})}), log_path, port,
                         name="server", start_timeout_s=start_timeout_s)
        self.base = self.url
        self.client = ApiClient(self.url, "tiny", timeout=300)
        self._shutdown_checked = False
        self.start()

    def stop(self, check: bool = True):
        rc = super().stop()
        if self.core_nudged:  # vLLM's race, not kvtier's: its SIGTERM went to another thread (launcher.py)
            print(f"NOTE {self.log_path}: the EngineCore took only the SIGTERM sent to its main thread; see "
                  f"{self.stacks_path}")
        if check and self.ready and not self._shutdown_checked:
            self._shutdown_checked = True
            assert_clean_shutdown(self.log_text(self.stop_log_offset or 0), rc, self.stacks_path)
        return rc

    def __exit__(self, exc_type, *exc):
        self.stop(check=exc_type is None)

    def complete(self, prompt, max_tokens=8) -> Completion:
        """Streamed greedy completion with the logprob of every generated token."""
        r = self.client.completion(prompt, max_tokens, logprobs=True)
        return Completion(r["text"], r["ttft_s"], tuple(r["logprobs"]))

    def reset_prefix_cache(self):
        status, body = self.client.request("POST", "/reset_prefix_cache")
        assert status == 200, (status, body)

    def metrics(self) -> dict:
        """Sum of every sample of each metric name (labels dropped), and name[source] per source label."""
        series = self.client.metrics(None)
        assert series is not None, "no /metrics"
        out: dict = {}
        for key, val in series.items():
            name = key.split("{", 1)[0]
            out[name] = out.get(name, 0.0) + val
            src = re.search(r'source="([^"]+)"', key)
            if src:
                out[f"{name}[{src.group(1)}]"] = out.get(f"{name}[{src.group(1)}]", 0.0) + val
        return out
