"""Two vLLM CPU servers on two hosts sharing one kvtier root on MooseFS (SPEC M4, V3): server A in host a's network
namespace on mount a, server B in host b's on mount b. A serves a long prompt (computed, stored); B then serves the
same prompt from A's entries: identical text and logprobs, B's bytes read >= the prompt's chunks, no entry counted
corrupt. Run by scripts/test_multihost.sh --vllm with the vLLM venv's python (scripts/setup_vllm.sh):

    VENV/bin/python tests/multihost/vllm_two_hosts.py --env DIR/env --logs DIR
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "vllm"))

from kvtier.tiny_model import synthetic_token_ids, synthetic_words  # noqa: E402
from server import Server, kvtier_transfer_config, tiny_model_dir  # noqa: E402
from test_multihost import read_env  # noqa: E402

CHUNK_TOKENS = 256
CHUNK_BYTES = 16 * 256 * 1024  # as tests/vllm/test_e2e_server.py: 16 blocks of 16 tokens, 16 KiB per token
LOGPROB_TOL = 1e-5             # ditto: float32 orders of summation move a logprob by at most 9.5e-7
LONG = synthetic_token_ids(3000, seed=21)
SHORT = " ".join(synthetic_words(12, seed=7))
CLONE_NEWNET = 0x40000000


class Host:
    """Runs calls in a thread that entered the host's network namespace (setns affects only the calling thread), so
    the test talks to a server listening on that namespace's loopback."""

    def __init__(self, netns: str):
        self.netns = netns
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, initializer=self._enter)

    def _enter(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{self.netns}", os.O_RDONLY)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {self.netns}")
        os.close(fd)

    def call(self, fn, *args, **kw):
        return self.pool.submit(fn, *args, **kw).result()

    def server(self, model_dir, log_path, transfer_config) -> Server:
        """A vLLM server started with `ip netns exec`: the same command line as tests/vllm/server.py's."""
        real = subprocess.Popen

        def popen(args, **kw):
            return real(["ip", "netns", "exec", self.netns, *args], **kw)

        subprocess.Popen = popen
        try:
            return Server(model_dir, log_path, transfer_config)
        finally:
            subprocess.Popen = real


def wait_metric(host: Host, server: Server, name: str, at_least: float, timeout_s: float = 180) -> float:
    deadline = time.monotonic() + timeout_s
    val = 0.0
    while time.monotonic() < deadline:
        host.call(server.complete, SHORT, max_tokens=2)  # vLLM submits a step's stores at the next step
        time.sleep(0.5)
        val = host.call(server.metrics).get(name, 0.0)
        if val >= at_least:
            return val
    raise AssertionError(f"{name} = {val} < {at_least} after {timeout_s}s:\n{server.log_tail(30)}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", required=True)
    ap.add_argument("--logs", required=True)
    args = ap.parse_args()
    env = read_env(args.env)
    case = f"vllm-{os.getpid()}"
    roots = {h: os.path.join(env[f"KVTIER_DFS_MNT_{h}"], case) for h in ("a", "b")}
    os.makedirs(roots["a"], mode=0o750)
    model_dir = tiny_model_dir()
    ha, hb = Host(env["KVTIER_DFS_NS_a"]), Host(env["KVTIER_DFS_NS_b"])
    t0 = time.monotonic()
    a = ha.server(model_dir, os.path.join(args.logs, "vllm-a.log"), kvtier_transfer_config(roots["a"]))
    b = hb.server(model_dir, os.path.join(args.logs, "vllm-b.log"), kvtier_transfer_config(roots["b"]))
    result = None  # set when the run got to its verdict: then both servers' shutdowns are checked (server.Server.stop)
    try:
        ha.call(a.wait_healthy)
        hb.call(b.wait_healthy)
        started_s = time.monotonic() - t0
        out_a = ha.call(a.complete, LONG)
        chunks = len(LONG) // CHUNK_TOKENS
        written = wait_metric(ha, a, "vllm:kvtier_bytes_written_total", chunks * CHUNK_BYTES)
        out_b = hb.call(b.complete, LONG)
        read = wait_metric(hb, b, "vllm:kvtier_bytes_read_total", chunks * CHUNK_BYTES)
        ma, mb = ha.call(a.metrics), hb.call(b.metrics)
        corrupt = ma.get("vllm:kvtier_corrupt_entries_total", 0) + mb.get("vllm:kvtier_corrupt_entries_total", 0)
        diff = max((abs(x - y) for x, y in zip(out_a.logprobs, out_b.logprobs)), default=0.0)
        same = out_a.text == out_b.text and len(out_a.logprobs) == len(out_b.logprobs) and diff <= LOGPROB_TOL
        print(f"figure: vllm_two_hosts servers_up_s={started_s:.0f} chunks={chunks} a_written_mib={written / 2**20:.0f} "
              f"b_read_mib={read / 2**20:.0f} identical={same} largest_logprob_diff={diff:.1e} "
              f"ttft_a_s={out_a.ttft:.3f} ttft_b_s={out_b.ttft:.3f} corrupt={corrupt:.0f}", flush=True)
        ok = same and corrupt == 0
        if not same:
            print(f"vllm_two_hosts: outputs differ: {out_a.text!r} vs {out_b.text!r}", flush=True)
        result = 0 if ok else 1
    finally:
        try:
            a.stop(check=result is not None)
        finally:
            b.stop(check=result is not None)
    return result


if __name__ == "__main__":
    sys.exit(main())
