"""A real `vllm serve` (the OpenAI API server module) on the tiny model, in its own process group, always killed."""

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import NamedTuple

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
SERVE_ARGS = ["--served-model-name", "tiny", "--dtype", "float32", "--enforce-eager", "--block-size", "16",
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kvtier_transfer_config(root, **extra) -> str:
    ec = {"spec_name": "KVTierSpec", "spec_module_path": "kvtier.vllm", "kvtier_root": str(root),
          "block_size": 256, "kvtier_pool_bytes": "256MiB", "kvtier_stats_interval_s": 1}
    ec.update(extra)
    return json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                       "kv_connector_extra_config": ec})


class Completion(NamedTuple):
    """A streamed greedy completion: its text, the time to its first token, and the logprob of each token."""
    text: str
    ttft: float | None
    logprobs: tuple[float, ...]


class Server:
    def __init__(self, model_dir, log_path, transfer_config=None, start_timeout_s=420, env=None, extra_args=()):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                "--host", "127.0.0.1", "--port", str(self.port), *SERVE_ARGS]
        if transfer_config:
            args += ["--kv-transfer-config", transfer_config]
        args += list(extra_args)
        e = dict(os.environ)
        e.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                  "PYTHONHASHSEED": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_SERVER_DEV_MODE": "1"})
        e.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 2))
        tcmalloc = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
        if os.path.exists(tcmalloc) and "tcmalloc" not in e.get("LD_PRELOAD", ""):
            e["LD_PRELOAD"] = tcmalloc + (":" + e["LD_PRELOAD"] if e.get("LD_PRELOAD") else "")
        e.update(env or {})
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=e, start_new_session=True)
        self.start_timeout_s = start_timeout_s

    def wait_healthy(self):
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} during startup:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1)
        raise TimeoutError(f"/health not ready after {self.start_timeout_s}s:\n{self.log_tail()}")

    def wait_exit(self, timeout_s) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"server still running after {timeout_s}s:\n{self.log_tail()}") from None

    def log_tail(self, n=60) -> str:
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def stop(self):
        """SIGTERM to the API server alone (it stops its EngineCore and workers in order: a group-wide SIGTERM races
        their own shutdown with the API server's, test_shutdown.py), then SIGKILL to whatever is left."""
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        try:  # the leader is gone or late: its children may not be
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    # --- client ---
    def post(self, path, body, timeout=300):
        req = urllib.request.Request(self.base + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        return urllib.request.urlopen(req, timeout=timeout)

    def complete(self, prompt, max_tokens=8, timeout=300) -> Completion:
        """Streamed greedy completion with the logprob of every generated token."""
        body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True, "logprobs": 1}
        t0 = time.perf_counter()
        ttft, parts, logprobs = None, [], []
        with self.post("/v1/completions", body, timeout=timeout) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                choice = json.loads(line[5:])["choices"][0]
                piece = choice.get("text", "")
                if ttft is None and piece:
                    ttft = time.perf_counter() - t0
                parts.append(piece)
                logprobs.extend((choice.get("logprobs") or {}).get("token_logprobs") or [])
        return Completion("".join(parts), ttft, tuple(logprobs))

    def reset_prefix_cache(self):
        with self.post("/reset_prefix_cache", {}) as r:
            assert r.status == 200

    def metrics(self) -> dict:
        """Sum of every sample of each metric name (labels dropped)."""
        text = urllib.request.urlopen(self.base + "/metrics", timeout=30).read().decode()
        out: dict = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            m = re.match(r"^([^{\s]+)(\{[^}]*\})?\s+(\S+)", line)
            if not m:
                continue
            name, labels, val = m.group(1), m.group(2) or "", float(m.group(3))
            out[name] = out.get(name, 0.0) + val
            src = re.search(r'source="([^"]+)"', labels)
            if src:
                out[f"{name}[{src.group(1)}]"] = out.get(f"{name}[{src.group(1)}]", 0.0) + val
        return out
