"""Starting and stopping vLLM's OpenAI API server (`python -m vllm.entrypoints.openai.api_server`, or any command
that serves /health): the one launcher of the vLLM tests (tests/vllm/server.py, the README's commands in
tests/vllm/test_readme.py), `kvtier calibrate` (kvtier.tools.calibrate.sweep), the H200 headline benchmark
(bench/h200/headline.py, scripts/h200/smoke.py) and, through its command line, scripts/demo.sh and
scripts/vllm_smoke.sh:

    python -m kvtier.tools.launcher serve [--name N] [--log PATH] [--port P] [--gpu] -- ARGV...

starts ARGV with `--host 127.0.0.1 --port P` appended (a free port unless given) and the environment of server_env(),
waits for /health, prints one line `ready http://127.0.0.1:P` on stdout (nothing else goes there), and runs until it
is signalled (SIGTERM, SIGINT, SIGHUP) or its parent exits: then it stops the server as VllmServer.stop() does and
exits 0, or 1 when the server failed to start, died on its own or did not shut down cleanly (shutdown_problems(),
said on stderr). A shell starts it in the background and reads the ready line; `kill PID` stops the server.

A server runs in its own process group and is always stopped: SIGTERM to the API server, SIGKILL to the group after a
grace period.
Only the standard library: the module imports neither vLLM nor torch, so a client Python that has only the kvtier
sources on its path (bench/h200/headline.py) can use it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

API_SERVER = ("-m", "vllm.entrypoints.openai.api_server")
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"

# What every server gets unless the caller says otherwise: no network, no usage stats, the dev endpoints
# (/reset_prefix_cache), and a fixed PYTHONHASHSEED (docs/vllm-integration.md, "PYTHONHASHSEED").
BASE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "VLLM_SERVER_DEV_MODE": "1", "PYTHONHASHSEED": "0"}
# vLLM's CPU platform on a small shared machine: no thread pinning, tcmalloc when installed.
CPU_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kvtier_transfer_config(root: str | os.PathLike, **extra: Any) -> dict:
    """vLLM's --kv-transfer-config for kvtier (docs/vllm-integration.md): KVTierConnector with KVTierSpec on `root`;
    `extra` adds or overrides kv_connector_extra_config keys (block_size defaults to 256 tokens)."""
    ec = {"spec_name": "KVTierSpec", "spec_module_path": "kvtier.vllm", "kvtier_root": str(root), "block_size": 256}
    ec.update(extra)
    return {"kv_connector": "KVTierConnector", "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
            "kv_connector_extra_config": ec}


def server_env(cpu: bool = True, base: Mapping[str, str] | None = None, **overrides: str) -> dict[str, str]:
    """The server's environment: `base` (default os.environ) with BASE_ENV filled in where unset, CPU_ENV and
    tcmalloc for vLLM's CPU platform (`cpu`), then `overrides`."""
    env = dict(os.environ if base is None else base)
    for k, v in BASE_ENV.items():
        env.setdefault(k, v)
    if cpu:
        for k, v in CPU_ENV.items():
            env.setdefault(k, v)
        env.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0)) or os.cpu_count() or 2))
        if os.path.exists(TCMALLOC) and "tcmalloc" not in env.get("LD_PRELOAD", ""):
            env["LD_PRELOAD"] = TCMALLOC + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    env.update(overrides)
    _drop_unbuilt_source(env)
    return env


def _drop_unbuilt_source(env: dict[str, str]) -> None:
    """Drop this source tree from the server's PYTHONPATH when it has no built extension there: a client run from
    python/ must not make vLLM import an unbuilt kvtier instead of the installed one."""
    pkg = Path(__file__).resolve().parents[1]  # python/kvtier
    if any(pkg.glob("_kvtier*.so")) or not env.get("PYTHONPATH"):
        return
    keep = [x for x in env["PYTHONPATH"].split(os.pathsep) if x and Path(x).resolve() != pkg.parent]
    if keep:
        env["PYTHONPATH"] = os.pathsep.join(keep)
    else:
        env.pop("PYTHONPATH")


def server_argv(python: str, model: str | os.PathLike, port: int, args: Sequence[str] = (),
                transfer_config: Mapping | str | None = None) -> list[str]:
    """The command line of one API server on 127.0.0.1:port."""
    argv = [python, *API_SERVER, "--model", str(model), "--host", "127.0.0.1", "--port", str(port), *args]
    if transfer_config:
        tc = transfer_config if isinstance(transfer_config, str) else json.dumps(transfer_config)
        argv += ["--kv-transfer-config", tc]
    return argv


def command_argv(command: str, env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """A shell command line as a shell runs a simple command (README.md's server commands): the leading NAME=value
    words go into a copy of `env`, the program is looked up on that environment's PATH. Returns (argv, env)."""
    words = shlex.split(command, comments=True)
    env = dict(env)
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    if not words:
        raise ValueError(f"no command in {command!r}")
    exe = shutil.which(words[0], path=env.get("PATH", ""))
    if exe is None:
        raise FileNotFoundError(f"{words[0]} is not on PATH ({env.get('PATH', '')})")
    return [exe, *words[1:]], env


# Lines a clean SIGTERM shutdown of a vLLM server never logs (vLLM 0.26.0 to 0.32: tests/vllm/test_shutdown.py).
_UNCLEAN = re.compile(r"Traceback \(most recent call last\)|EngineDeadError|\bERROR\b|exited unexpectedly|"
                      r"force killing|leaked (shared_memory|semaphore)|nanobind: leaked|Exception ignored")
# vLLM's own race in an orderly shutdown, seen on 0.27.0 and 0.32.0 (vllm-project/vllm#48745, fix proposed in
# vllm-project/vllm#49000): AsyncLLM.shutdown() tears the engine client down first ("[shutdown] MPClient: cleaning up
# background resources", then "... complete"); the client's output-queue task, cancelled, hands the output handler an
# EngineDeadError, and when the handler runs before its own cancellation lands it logs "AsyncLLM output_handler
# failed." with a traceback ending in that EngineDeadError. A server without any connector does it too. That block,
# and only after the client's teardown began, is not counted; anything else (an engine that died: "exited
# unexpectedly", another exception, the same block before the teardown) is.
_TEARDOWN = ("[shutdown] MPClient: cleaning up background resources", "[shutdown] MPClient: complete")
_HANDLER_FAILED = re.compile(r"\[(async_llm\.py:\d+)\] AsyncLLM output_handler failed\.")


def without_shutdown_race(lines: Sequence[str]) -> list[str]:
    """`lines` less vLLM's output-handler EngineDeadError block logged after its engine client's teardown began."""
    start = next((i for i, line in enumerate(lines) if any(t in line for t in _TEARDOWN)), None)
    if start is None:
        return list(lines)
    out, i = list(lines[:start + 1]), start + 1
    while i < len(lines):
        m = _HANDLER_FAILED.search(lines[i])
        if m:
            j = i + 1
            while j < len(lines) and f"[{m.group(1)}]" in lines[j]:
                j += 1
            if lines[j - 1].split(f"[{m.group(1)}] ", 1)[-1].startswith("vllm.v1.engine.exceptions.EngineDeadError"):
                i = j
                continue
        out.append(lines[i])
        i += 1
    return out


def shutdown_problems(log: str, returncode: int | None) -> list[str]:
    """What makes a server's shutdown unclean, from its log (the part written since SIGTERM, or all of it) and its
    exit status: tracebacks, errors, forced kills and leaks in the log, a non-zero status, and for a server that
    opened kvtier's engine the lack of kvtier's own shutdown lines ('kvtier: engine closed', 'kvtier: worker
    detached'). vLLM's own output-handler race at shutdown is not counted (without_shutdown_race). Empty when
    clean."""
    problems = [f"log: {line.strip()}" for line in without_shutdown_race(log.splitlines()) if _UNCLEAN.search(line)]
    if returncode != 0:
        problems.append(f"exit status {returncode}")
    if "kvtier: engine open" in log and not ("kvtier: engine closed" in log and "kvtier: worker detached" in log):
        problems.append("kvtier's shutdown did not run (no 'kvtier: engine closed' and 'kvtier: worker detached')")
    return problems


def log_tail(path: str | os.PathLike, n: int = 40) -> str:
    try:
        return "".join(Path(path).read_text(errors="replace").splitlines(True)[-n:])
    except OSError:
        return ""


# An exception's last line in a traceback ("ValueError: ..."), past the "(Worker pid=N) ERROR ... [file:line]" prefix.
_EXCEPTION_LINE = re.compile(r"(?:^|\]\s)([A-Za-z_][\w.]*(?:Error|Exception|Exit)): (.+)$")
# The engine core's re-raise of a worker's failure (which quotes the worker's message) and the API server's, which
# names none: the cause is the first other exception, else the first re-raise.
_WRAPPER = "Worker failed with error"
_GENERIC = ("Engine core initialization failed", "Engine process failed to start")


def root_cause(path: str | os.PathLike) -> str:
    """The first exception a server's log names that is not one of vLLM's start-up wrappers ("ValueError: No common
    block size ..."), else the engine core's re-raise of a worker's failure, else "": a failed start's cause, which
    the log's tail buries under the wrappers' tracebacks."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    wrapped = ""
    for line in lines:
        m = _EXCEPTION_LINE.search(line.strip())
        if not m or any(g in m.group(2) for g in _GENERIC):
            continue
        if _WRAPPER not in m.group(2):
            return f"{m.group(1)}: {m.group(2)}"[:500]
        wrapped = wrapped or f"{m.group(1)}: {m.group(2)}"[:500]
    return wrapped


# A stuck EngineCore (tests/vllm/test_shutdown.py): the API server logs one of the first lines as it sends the
# EngineCore SIGTERM (vLLM 0.26 logs only the second, right before its SIGTERM; 0.32 and 0.34 both), and vLLM's handler
# in the EngineCore logs _CORE_TRIGGERED first thing (vllm/v1/engine/core.py, 0.26 to 0.34). An EngineCore that has
# not logged it this long after is reported (VllmServer.report_stuck_engine_core) before vLLM kills it at the end of
# --shutdown-timeout.
_CORE_SIGNALLED = ("[shutdown] Process manager: send sigterm to process EngineCore",
                   "[shutdown] MPClient: stopping engine manager")
_CORE_TRIGGERED = "[shutdown] EngineCore: trigger received"
STUCK_CORE_S = 8.0


def group_pids(pgid: int) -> list[int]:
    """The processes of process group pgid (from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and int(fields[2]) == pgid:
            out.append(int(d.name))
    return sorted(out)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def process_report(pid: int, gdb_timeout_s: float = 15.0) -> str:
    """Where a process stands: for each thread its name, state, signal masks (blocked, pending to it and to the
    process), wchan and kernel stack (when readable), then gdb's backtrace of every thread where gdb is installed
    (gdb_timeout_s > 0). For a process that does not react to a signal (where its main thread waits)."""
    name = _comm(pid)
    if not name:
        return f"=== pid {pid}: gone\n"
    lines = [f"=== pid {pid} {name}"]
    for t in sorted(Path(f"/proc/{pid}/task").glob("*"), key=lambda p: int(p.name)):
        def read(n: str) -> str:
            try:
                return (t / n).read_text()
            except OSError:
                return ""
        status = dict(x.split(":", 1) for x in read("status").splitlines() if ":" in x)
        fields = " ".join(f"{k}={status.get(k, '').strip()}" for k in ("State", "SigBlk", "SigPnd", "ShdPnd"))
        lines.append(f"--- thread {t.name} {read('comm').strip()} {fields} wchan={read('wchan').strip()}")
        lines.extend("    " + x for x in read("stack").splitlines()[:12])
    if gdb_timeout_s > 0 and shutil.which("gdb"):
        try:
            r = subprocess.run(["gdb", "-batch", "-p", str(pid), "-ex", "thread apply all bt 30"],
                               capture_output=True, text=True, timeout=gdb_timeout_s)
            lines.extend(x for x in r.stdout.splitlines() if x.startswith(("Thread ", "#")) or not x.strip())
        except (subprocess.TimeoutExpired, OSError) as e:
            lines.append(f"gdb: {e}")
    return "\n".join(lines) + "\n"


def signal_thread(pid: int, tid: int, sig: int) -> bool:
    """Sends sig to thread tid of process pid (tgkill(2): that thread takes it, where kill(2) lets the kernel pick
    any thread that does not block it). False when the thread is gone."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if hasattr(libc, "tgkill"):
        rc = libc.tgkill(pid, tid, sig)
    else:  # glibc before 2.30
        rc = libc.syscall({"x86_64": 234, "aarch64": 131}[os.uname().machine], pid, tid, sig)
    return rc == 0


class VllmServer:
    """One vLLM API server process. `start()` launches it; `wait_healthy()` blocks until /health answers (or raises
    with the log's tail); `poll_ready()` checks once, for starting several servers side by side; `stop()` ends the
    whole process group. A context manager (stops on exit)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], log_path: str | os.PathLike, port: int,
                 name: str = "vllm", start_timeout_s: float = 600, stop_timeout_s: float = 60,
                 cwd: str | os.PathLike | None = None):
        self.argv, self.env, self.port, self.name, self.cwd = list(argv), dict(env), int(port), name, cwd
        self.log_path = Path(log_path)
        self.url = f"http://127.0.0.1:{self.port}"
        self.start_timeout_s, self.stop_timeout_s = start_timeout_s, stop_timeout_s
        self.proc: subprocess.Popen | None = None
        self.stop_log_offset: int | None = None
        self._log = None
        self.started = 0.0
        self.ready = False
        self.ready_s: float | None = None
        self.error = ""
        self.stacks_path: Path | None = None  # report_stuck_engine_core's report, once written
        self.core_nudged = False  # a stuck EngineCore's main thread was sent SIGTERM itself (and then took it)
        self._core_signalled_at: float | None = None
        self._nudged_at: float | None = None
        self._nudged: list[int] = []

    def start(self) -> "VllmServer":
        self.started = time.monotonic()
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=self.env, cwd=self.cwd, start_new_session=True)
        return self

    def poll_ready(self) -> bool:
        """One /health probe; sets `ready` (and `ready_s`), or `error` if the process exited."""
        if self.ready or self.error:
            return self.ready
        if self.proc.poll() is not None:
            cause = root_cause(self.log_path)
            self.error = (f"{self.name} exited with {self.proc.returncode} during startup"
                          + (f" ({cause})" if cause else "") + f"; log: {self.log_path}")
            return False
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                if r.status == 200:
                    self.ready = True
                    self.ready_s = time.monotonic() - self.started
        except (urllib.error.URLError, OSError):
            pass
        return self.ready

    def wait_healthy(self) -> "VllmServer":
        deadline = self.started + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.poll_ready():
                return self
            if self.error:
                raise RuntimeError(self.error + "\n" + self.log_tail())
            time.sleep(1)
        raise TimeoutError(f"{self.name}: /health not ready after {self.start_timeout_s}s; log: {self.log_path}\n"
                           + self.log_tail())

    def wait_exit(self, timeout_s: float) -> int:
        rc = self._wait_watching(timeout_s)
        if rc is None:
            raise TimeoutError(f"{self.name} still running after {timeout_s}s:\n{self.log_tail()}")
        return rc

    def _wait_watching(self, timeout_s: float) -> int | None:
        """Waits for the API server to exit (None: still running after timeout_s), reporting a stuck EngineCore on
        the way (report_stuck_engine_core)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                rc = self.proc.wait(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
                if self._nudged_at is not None:  # it exited before the next look: did the nudged core take it?
                    self._settle_nudge(final=True)
                return rc
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    return None
                self.report_stuck_engine_core()

    def report_stuck_engine_core(self) -> Path | None:
        """Once the API server has sent its EngineCore SIGTERM and the EngineCore has not logged its handler's line
        for STUCK_CORE_S: writes each thread's state of every process of the server's group other than the API server
        (process_report, no gdb) to <log>.stacks.txt and sends SIGTERM again, to the EngineCore's main thread itself
        (tgkill). A process-directed SIGTERM taken by another of its threads (vLLM's own Python threads do not block
        signals) only marks CPython's handler pending, and the main thread asleep in a lock is not woken; this one
        wakes it. If the handler's line then comes within STUCK_CORE_S, the report says so and `core_nudged` is set;
        else gdb's backtraces are added and, where the server runs with PYTHONFAULTHANDLER set, the EngineCore is sent
        SIGABRT so that Python's faulthandler writes every thread's traceback to the server log. Returns the report's
        path once written (stacks_path)."""
        if self.proc is None or (self.stacks_path is not None and self._nudged_at is None):
            return self.stacks_path
        text = self.log_text(self.stop_log_offset or 0)
        now = time.monotonic()
        if self._nudged_at is not None:  # the report is written and the main threads were signalled
            self._settle_nudge(final=False)
            return self.stacks_path
        if not any(line in text for line in _CORE_SIGNALLED) or _CORE_TRIGGERED in text:
            return None
        if self._core_signalled_at is None:
            self._core_signalled_at = now
        if now - self._core_signalled_at < STUCK_CORE_S:
            return None
        pids = [p for p in group_pids(self.proc.pid) if p != self.proc.pid]
        self._nudged = [p for p in pids if "EngineCor" in _comm(p)]
        report = [f"{self.name}: the EngineCore logged no '{_CORE_TRIGGERED}' {STUCK_CORE_S:.0f} s after its SIGTERM"]
        report += [process_report(p, gdb_timeout_s=0) for p in pids]
        self.stacks_path = Path(str(self.log_path) + ".stacks.txt")
        self.stacks_path.write_text("\n".join(report))
        for p in self._nudged:
            sent = signal_thread(p, p, signal.SIGTERM)
            self._append_report(f"{self.name}: SIGTERM to the main thread of EngineCore {p}: "
                                + ("sent" if sent else "not sent (the process is gone)"))
        self._nudged_at = time.monotonic()
        return self.stacks_path

    def _settle_nudge(self, final: bool) -> None:
        """After the SIGTERM to the EngineCore's main thread: its handler's line came (core_nudged), or it has not
        come within STUCK_CORE_S (the deep report), or the server exited without it (final)."""
        waited = time.monotonic() - self._nudged_at
        if _CORE_TRIGGERED in self.log_text(self.stop_log_offset or 0):
            self.core_nudged = True
            self._append_report(f"{self.name}: the EngineCore logged '{_CORE_TRIGGERED}' after the SIGTERM to its "
                                f"main thread (within {waited:.1f} s): the first SIGTERM went to another of its "
                                "threads")
        elif final:
            self._append_report(f"{self.name}: the server exited {waited:.1f} s after the SIGTERM to the EngineCore's "
                                f"main thread, its EngineCore without '{_CORE_TRIGGERED}'")
        elif waited >= STUCK_CORE_S:
            self._deep_report()
        else:
            return
        self._nudged_at = None

    def _append_report(self, text: str) -> None:
        with open(self.stacks_path, "a") as f:
            f.write("\n" + text + "\n")

    def _deep_report(self) -> None:
        """The EngineCore did not take even the SIGTERM sent to its main thread: gdb on it, then its Python
        tracebacks, then gdb on the rest (vLLM kills what is left at the end of --shutdown-timeout)."""
        self._append_report(f"{self.name}: no '{_CORE_TRIGGERED}' {STUCK_CORE_S:.0f} s after the SIGTERM to the "
                            "EngineCore's main thread either: it does not react to SIGTERM")
        cores = [p for p in self._nudged if _comm(p)]
        for p in cores:
            self._append_report(process_report(p))
        if self.env.get("PYTHONFAULTHANDLER"):
            for p in cores:
                try:
                    os.kill(p, signal.SIGABRT)
                except OSError:
                    pass
        for p in group_pids(self.proc.pid):
            if p != self.proc.pid and p not in cores:
                self._append_report(process_report(p))

    def log_tail(self, n: int = 60) -> str:
        return log_tail(self.log_path, n)

    def _kill(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def log_text(self, since: int = 0) -> str:
        """The server's log from byte `since` on."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(since)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> int | None:
        """SIGTERM to the API server alone (it stops its EngineCore and workers in order; a group-wide SIGTERM races
        their own shutdown with the API server's, tests/vllm/test_shutdown.py), then SIGKILL to whatever is left of
        the group. Returns the API server's exit status (None if it was never started). `stop_log_offset`: where
        the log stood when the SIGTERM was sent (None: the server had exited before)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    self.stop_log_offset = os.path.getsize(self.log_path)
                except OSError:
                    self.stop_log_offset = 0
                try:
                    os.kill(self.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                self._wait_watching(self.stop_timeout_s)
            self._kill(signal.SIGKILL)  # the leader is gone or late: its children may not be
            self.proc.wait(timeout=30)
        if self._log is not None:
            self._log.close()
            self._log = None
        return None if self.proc is None else self.proc.returncode

    def __enter__(self) -> "VllmServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ------------------------------------------------------------------------------------------------------------------
# python -m kvtier.tools.launcher serve ...
# ------------------------------------------------------------------------------------------------------------------

def serve(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvtier.tools.launcher serve",
                                 description="Start a vLLM API server (ARGV, with --host 127.0.0.1 --port P added), "
                                             "print 'ready URL' once /health answers, stop it when signalled.")
    ap.add_argument("--name", default="server", help="the server's name in messages")
    ap.add_argument("--log", default="server.log", help="the server's log file (stdout and stderr)")
    ap.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    ap.add_argument("--start-timeout", type=float, default=600, help="seconds to wait for /health")
    ap.add_argument("--stop-timeout", type=float, default=60,
                    help="seconds between the SIGTERM and the SIGKILL of what is left")
    ap.add_argument("--gpu", action="store_true", help="no CPU-platform environment (server_env(cpu=False))")
    ap.add_argument("argv", nargs=argparse.REMAINDER, help="-- the server's command line")
    a = ap.parse_args(argv)
    cmd = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    if not cmd:
        ap.error("the server's command line is missing (after --)")
    port = a.port or free_port()
    server = VllmServer([*cmd, "--host", "127.0.0.1", "--port", str(port)], server_env(cpu=not a.gpu), a.log, port,
                        name=a.name, start_timeout_s=a.start_timeout, stop_timeout_s=a.stop_timeout)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    parent = os.getppid()
    say = lambda msg: print(f"launcher: {a.name}: {msg}", file=sys.stderr, flush=True)  # noqa: E731
    server.start()
    try:
        while not server.poll_ready():
            if server.error or stop.is_set() or time.monotonic() > server.started + server.start_timeout_s:
                say(server.error or ("stopped during startup" if stop.is_set() else
                                     f"/health not ready after {server.start_timeout_s:.0f} s; log: {a.log}"))
                return 1
            stop.wait(1)
        print(f"ready {server.url}", flush=True)
        # Nothing else goes to stdout: the reader may have closed it.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
        while not stop.is_set() and server.proc.poll() is None and os.getppid() == parent:
            stop.wait(0.5)
        if server.proc.poll() is not None:
            say(f"exited on its own with status {server.proc.returncode}; log: {a.log}")
            return 1
    finally:
        rc = server.stop()
    since = server.stop_log_offset
    problems = shutdown_problems(server.log_text(since or 0), rc) if since is not None else []
    for p in problems[:10]:
        say(f"shutdown not clean: {p}")
    return 1 if problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["serve"]:
        print("usage: python -m kvtier.tools.launcher serve [options] -- ARGV...  (serve --help)", file=sys.stderr)
        return 2
    return serve(args[1:])


if __name__ == "__main__":
    sys.exit(main())
