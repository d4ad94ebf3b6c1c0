"""The HTTP side of the tools: a client of vLLM's OpenAI-compatible server (streamed completions, /metrics,
/reset_prefix_cache) and the parsing of its Prometheus metrics. Only the standard library (http.client), so it runs
in any Python 3.10+."""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.parse

_SAMPLE_RE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEnaNIif]+)(\s+\d+)?$")
METRIC_PATTERNS = ("prefix_cache", "kv_offload", "kvtier", "external_prefix")


def parse_prometheus(text: str) -> dict[str, float]:
    """{series: value} of the samples of a Prometheus text exposition (series = name + labels as written)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if not m:
            continue
        try:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        except ValueError:
            continue
    return out


def _interesting(series: str) -> bool:
    name = series.split("{", 1)[0]
    if name.endswith("_created") or name.endswith("_bucket"):
        return False
    return any(p in name for p in METRIC_PATTERNS)


def metric_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """after - before for the interesting counters (and histogram sums/counts), summed over labels by metric name;
    series absent before count from 0. Gauges: metric_gauges."""
    out: dict[str, float] = {}
    for series, v in after.items():
        if not _interesting(series):
            continue
        name = series.split("{", 1)[0]
        if not name.endswith(_COUNTER_SUFFIXES):
            continue
        out[name] = out.get(name, 0.0) + v - before.get(series, 0.0)
    return dict(sorted(out.items()))


_COUNTER_SUFFIXES = ("_total", "_sum", "_count")


def metric_gauges(after: dict[str, float]) -> dict[str, float]:
    """Values of the interesting gauges (series that are not counters or histogram parts), summed over labels."""
    out: dict[str, float] = {}
    for series, v in after.items():
        name = series.split("{", 1)[0]
        if _interesting(series) and not name.endswith(_COUNTER_SUFFIXES):
            out[name] = out.get(name, 0.0) + v
    return dict(sorted(out.items()))


BYTES_READ_METRICS = ("kvtier_bytes_read", "kvtier_load_bytes", "kv_offload_load_bytes")


def bytes_read(deltas: dict[str, float]) -> float | None:
    """The kvtier (or vLLM offload) bytes loaded during a phase, from its metric deltas, if exported."""
    for want in BYTES_READ_METRICS:
        for name, v in deltas.items():
            if name.split(":")[-1].startswith(want):
                return v
    return None


class ApiClient:
    """A client of one vLLM API server at `url` serving `model`."""

    def __init__(self, url: str, model: str, timeout: float = 900.0):
        u = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        self.scheme, self.host, self.port = u.scheme, u.hostname or "127.0.0.1", u.port
        self.base_path = u.path.rstrip("/")
        self.model = model
        self.timeout = timeout

    def _conn(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        conn = self._conn()
        try:
            data = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, self.base_path + path, body=data, headers=headers)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def completion(self, prompt: list[int] | str, max_tokens: int, logprobs: bool = False,
                   priority: int | None = None) -> dict:
        """One streamed greedy completion; returns ttft_s (to the first streamed choice), total_s, text,
        prompt_tokens (from usage) and, with `logprobs`, the logprob of every generated token. `priority`: vLLM's
        request priority (lower goes first; a server started with --scheduling-policy priority honours it)."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        if logprobs:
            body["logprobs"] = 1
        if priority is not None:
            body["priority"] = priority
        token_logprobs: list[float] = []
        conn = self._conn()
        t0 = time.perf_counter()
        ttft = None
        text: list[str] = []
        usage = None
        try:
            conn.request("POST", self.base_path + "/v1/completions", body=json.dumps(body).encode(),
                         headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
            r = conn.getresponse()
            if r.status != 200:
                raise RuntimeError(f"/v1/completions: HTTP {r.status}: {r.read()[:500]!r}")
            while True:
                raw = r.readline()
                if not raw:
                    break
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                choices = chunk.get("choices") or []
                if choices:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text.append(choices[0].get("text") or "")
                    token_logprobs.extend((choices[0].get("logprobs") or {}).get("token_logprobs") or [])
                if chunk.get("usage"):
                    usage = chunk["usage"]
        finally:
            conn.close()
        total = time.perf_counter() - t0
        if ttft is None:
            raise RuntimeError("stream ended without a token")
        out = {"ttft_s": ttft, "total_s": total, "text": "".join(text),
               "prompt_tokens": (usage or {}).get("prompt_tokens")}
        if logprobs:
            out["logprobs"] = token_logprobs
        return out

    def metrics(self, metrics_url: str | None) -> dict[str, float] | None:
        try:
            if metrics_url:
                u = urllib.parse.urlsplit(metrics_url)
                conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
                try:
                    conn.request("GET", u.path or "/metrics")
                    r = conn.getresponse()
                    status, data = r.status, r.read()
                finally:
                    conn.close()
            else:
                status, data = self.request("GET", "/metrics")
            if status != 200:
                return None
            return parse_prometheus(data.decode("utf-8", "replace"))
        except OSError:
            return None

    def reset_prefix_cache(self, attempts: int = 60) -> bool:
        """POST /reset_prefix_cache (needs VLLM_SERVER_DEV_MODE=1 on the server); retries while blocks are held
        (in-flight offload stores). Only vLLM's own cache is reset, never the external one."""
        for _ in range(attempts):
            status, data = self.request("POST", "/reset_prefix_cache")
            if status == 404:
                raise RuntimeError("/reset_prefix_cache not found: start the server with VLLM_SERVER_DEV_MODE=1")
            if status == 200:
                try:
                    if json.loads(data or b"{}").get("success", True):
                        return True
                except ValueError:
                    return True
            time.sleep(0.5)
        return False
