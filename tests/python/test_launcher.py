"""kvtier.tools.launcher with real processes standing in for vLLM's API server (a small HTTP server that answers
/health, one that dies at startup, one that never answers): readiness, the startup error with the log's tail, that
stop() ends the whole process group, children included, the shell-command form of the README's servers, the
shutdown check, and the `python -m kvtier.tools.launcher serve` command line that scripts/demo.sh uses."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from kvtier.tools import launcher

HEALTHY = r"""
import http.server, os, subprocess, sys
port = int(sys.argv[1])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[2], "w").write(str(child.pid))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped by init) is not alive
        return f.read().split(") ", 1)[1][0] != "Z"


def test_a_healthy_server_is_ready_and_stop_ends_its_process_group(tmp_path):
    port = launcher.free_port()
    child_file = tmp_path / "child.pid"
    argv = [sys.executable, "-c", HEALTHY, str(port), str(child_file)]
    with launcher.VllmServer(argv, launcher.server_env(cpu=False), tmp_path / "s.log", port, name="fake",
                             start_timeout_s=60, stop_timeout_s=10).start() as s:
        s.wait_healthy()
        assert s.ready and s.ready_s is not None and s.url == f"http://127.0.0.1:{port}"
        child = int(child_file.read_text())
        assert alive(child)
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child), "the server's child outlived stop()"
    assert "serving" in (tmp_path / "s.log").read_text()


def test_a_server_that_exits_at_startup_raises_with_its_log(tmp_path):
    argv = [sys.executable, "-c", "import sys; print('bad config key kvtier_x'); sys.exit(3)"]
    s = launcher.VllmServer(argv, launcher.server_env(cpu=False), tmp_path / "bad.log", launcher.free_port(),
                            name="bad", start_timeout_s=60).start()
    try:
        with pytest.raises(RuntimeError, match="exited with 3") as info:
            s.wait_healthy()
        assert "kvtier_x" in str(info.value)
    finally:
        s.stop()


def test_a_failed_start_names_the_first_exception_that_is_not_one_of_vllms_wrappers(tmp_path):
    """vLLM's log ends in the API server's and the engine core's re-raises; the worker's exception, far above, is
    the cause (a block size the CPU backend refuses, say)."""
    log = tmp_path / "server.log"
    log.write_text(
        "(APIServer pid=1) WARNING 12-05 17:47:10 [system_utils.py:255] Found ulimit of 20000\n"
        "(Worker pid=7) ERROR 12-05 17:47:32 [multiproc_executor.py:1063]     raise ValueError(\n"
        "(Worker pid=7) ERROR 12-05 17:47:32 [multiproc_executor.py:1063] ValueError: No common block size for 16 "
        "(CPU_ATTN: [MultipleOf(32)]).\n"
        "(EngineCore pid=5) ERROR 12-05 17:47:32 [core.py:1510] RuntimeError: Worker failed with error 'No common "
        "block size', please check the stack trace above for the root cause\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
    assert launcher.root_cause(log) == "ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)])."
    # No worker exception in the log (the CPU platform refusing vLLM's CPU offloading): the engine core's re-raise.
    log.write_text(
        "(EngineCore pid=5) ERROR 12-05 17:49:47 [core.py:1510] RuntimeError: Worker failed with error 'CPU "
        "Offloading is currently only supported on CUDA-alike and XPU GPUs', please check the stack trace above\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n")
    assert launcher.root_cause(log).startswith("RuntimeError: Worker failed with error 'CPU Offloading is currently")
    log.write_text("RuntimeError: Engine core initialization failed. See root cause above.\nbye\n")
    assert launcher.root_cause(log) == ""
    assert launcher.root_cause(tmp_path / "missing.log") == ""
    argv = [sys.executable, "-c", "import sys; print('ValueError: kvtier_chunk_tokens must be a multiple of 16'); "
            "sys.exit(3)"]
    s = launcher.VllmServer(argv, launcher.server_env(cpu=False), tmp_path / "bad.log", launcher.free_port(),
                            name="bad", start_timeout_s=60).start()
    try:
        with pytest.raises(RuntimeError, match=r"exited with 3 during startup \(ValueError: kvtier_chunk_tokens"):
            s.wait_healthy()
    finally:
        s.stop()


def test_a_server_that_never_answers_times_out_and_is_killed(tmp_path):
    argv = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "time.sleep(600)"]
    s = launcher.VllmServer(argv, launcher.server_env(cpu=False), tmp_path / "slow.log", launcher.free_port(),
                            name="slow", start_timeout_s=2, stop_timeout_s=1).start()
    with pytest.raises(TimeoutError, match="not ready after 2"):
        s.wait_healthy()
    s.stop()  # SIGTERM is ignored: SIGKILL after stop_timeout_s
    assert s.proc.returncode == -signal.SIGKILL


def test_transfer_config_argv_and_environment():
    tc = launcher.kvtier_transfer_config("/r", kvtier_pool_bytes="1GiB", block_size=512)
    assert tc["kv_connector"] == "KVTierConnector" and tc["kv_connector_module_path"] == "kvtier.vllm"
    ec = tc["kv_connector_extra_config"]
    assert ec == {"spec_name": "KVTierSpec", "spec_module_path": "kvtier.vllm", "kvtier_root": "/r",
                  "block_size": 512, "kvtier_pool_bytes": "1GiB"}
    argv = launcher.server_argv("py", "/m", 8123, ["--seed", "0"], tc)
    assert argv[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--port") + 1] == "8123" and json.loads(argv[-1]) == tc
    env = launcher.server_env(cpu=True, base={"PYTHONHASHSEED": "7"}, VLLM_SERVER_DEV_MODE="0")
    assert env["PYTHONHASHSEED"] == "7", "an explicit seed is kept"
    assert env["VLLM_SERVER_DEV_MODE"] == "0" and env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in launcher.server_env(cpu=False, base={})


def test_a_shell_command_line_gives_its_assignments_to_the_environment_and_its_program_from_path(tmp_path):
    (tmp_path / "bin").mkdir()
    prog = tmp_path / "bin" / "serve-me"
    prog.write_text("#!/bin/sh\n")
    prog.chmod(0o755)
    argv, env = launcher.command_argv("A=1 B='two words' serve-me --x 'y z' # comment",
                                      {"PATH": str(tmp_path / "bin"), "C": "3"})
    assert argv == [str(prog), "--x", "y z"]
    assert env == {"PATH": str(tmp_path / "bin"), "C": "3", "A": "1", "B": "two words"}
    with pytest.raises(FileNotFoundError, match="not-there"):
        launcher.command_argv("not-there --x", {"PATH": str(tmp_path / "bin")})


def test_shutdown_problems_name_what_is_not_clean():
    clean = "INFO Shutting down\nINFO kvtier: engine open\nINFO kvtier: worker detached\nINFO kvtier: engine closed\n"
    assert launcher.shutdown_problems(clean, 0) == []
    assert launcher.shutdown_problems("INFO no kvtier here\n", 0) == []
    assert launcher.shutdown_problems(clean, -9) == ["exit status -9"]
    bad = launcher.shutdown_problems(clean + "Traceback (most recent call last):\nEngineDeadError: x\n", 0)
    assert bad == ["log: Traceback (most recent call last):", "log: EngineDeadError: x"]
    (missing,) = launcher.shutdown_problems("INFO kvtier: engine open\nINFO kvtier: engine closed\n", 0)
    assert "kvtier's shutdown did not run" in missing


# The end of every fake API server below: /health answers 200 on the port it was given.
HEALTH_SERVER = r"""class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


# A stand-in for the API server as `launcher serve` runs it (--host/--port appended): serves /health, has a child
# (so the group kill is visible), exits 0 on SIGTERM, and with "dirty" logs a traceback while it does.
FAKE_SERVER = r"""
import http.server, signal, subprocess, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print("child", child.pid, flush=True)
def term(*_):
    if sys.argv[1] == "dirty":
        print("Traceback (most recent call last):", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
""" + HEALTH_SERVER


def start_serve(tmp_path, mode: str, **popen):
    log = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "kvtier.tools.launcher", "serve", "--name", "fake", "--log", str(log), "--gpu",
           "--start-timeout", "60", "--stop-timeout", "10", "--", sys.executable, "-c", FAKE_SERVER, mode]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen), log


def child_of(log) -> int:
    for line in log.read_text().splitlines():
        if line.startswith("child "):
            return int(line.split()[1])
    raise AssertionError(f"no child line in {log.read_text()!r}")


def wait_gone(pid: int, timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def test_serve_prints_ready_and_stops_the_server_when_signalled(tmp_path):
    p, log = start_serve(tmp_path, "clean")
    try:
        word, url = p.stdout.readline().split()
        assert word == "ready" and url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            assert r.status == 200
        child = child_of(log)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 0, err
    assert out == "" and err == "", (out, err)
    assert wait_gone(child), "the server's child outlived the launcher's stop"


def test_serve_says_when_the_server_did_not_shut_down_cleanly(tmp_path):
    p, _ = start_serve(tmp_path, "dirty")
    try:
        assert p.stdout.readline().startswith("ready ")
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 1 and "fake: shutdown not clean: log: Traceback" in err, err


def test_serve_fails_without_a_ready_line_when_the_server_dies_at_startup(tmp_path):
    cmd = [sys.executable, "-m", "kvtier.tools.launcher", "serve", "--name", "bad", "--log", str(tmp_path / "b.log"),
           "--gpu", "--", sys.executable, "-c", "import sys; sys.exit(3)"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == "", r
    assert "bad exited with 3 during startup" in r.stderr, r.stderr


def test_serve_stops_the_server_when_its_parent_exits(tmp_path):
    """A shell that starts the launcher in the background and is then gone (killed, say) leaves no server behind."""
    ready = tmp_path / "ready"
    os.mkfifo(ready)
    log = tmp_path / "server.log"
    script = (f"{sys.executable} -m kvtier.tools.launcher serve --name fake --log {log} --gpu --stop-timeout 10 "
              f"-- {sys.executable} -c '{FAKE_SERVER}' clean >{ready} &\n"
              f"read -r word url <{ready}; echo $word")
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "ready", r
    child = child_of(log)
    assert wait_gone(child), "the server outlived the shell that started its launcher"


def test_vllms_output_handler_traceback_after_its_client_completed_is_not_a_problem_but_before_it_is():
    """vLLM's own shutdown race (launcher.without_shutdown_race): its output handler's EngineDeadError block after its
    engine client's teardown began."""
    handler = ("(APIServer pid=1) ERROR 12-02 16:45:38 [async_llm.py:906] AsyncLLM output_handler failed.\n"
               "(APIServer pid=1) ERROR 12-02 16:45:38 [async_llm.py:906] Traceback (most recent call last):\n"
               "(APIServer pid=1) ERROR 12-02 16:45:38 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: "
               "EngineCore encountered an issue.\n")
    done = "(APIServer pid=1) INFO 12-02 16:45:38 [core_client.py:777] [shutdown] MPClient: complete\n"
    assert launcher.shutdown_problems(done + handler + "INFO: Application shutdown complete.\n", 0) == []
    assert len(launcher.shutdown_problems(handler + done, 0)) == 3, "before the client completed it counts"
    other = "(APIServer pid=1) ERROR 12-02 16:45:38 [core.py:12] EngineCore failed\n"
    assert launcher.shutdown_problems(done + other, 0) == ["log: " + other.strip()], "only the handler's lines"


# An API server whose EngineCore does not react to SIGTERM (tests/vllm/test_shutdown.py's CI failure): on SIGTERM it
# logs the line its vLLM logs before the EngineCore's SIGTERM (SIGNALLED_LINE), signals its child "VLLM::EngineCore" (which ignores it, its main thread asleep in a
# lock) and waits for it; the child dies of the launcher's SIGABRT, after faulthandler wrote its traceback.
STUCK_CORE_SERVER = r"""
import http.server, signal, subprocess, sys, threading
port = int(sys.argv[1])
core = subprocess.Popen([sys.executable, "-c", '''
import signal, threading
open("/proc/self/comm", "w").write("VLLM::EngineCore")
signal.signal(signal.SIGTERM, signal.SIG_IGN)
def wait_for_work():
    lock = threading.Lock(); lock.acquire(); lock.acquire()
print("core up", flush=True)
wait_for_work()
'''])
def term(*_):
    print("(APIServer) INFO SIGNALLED_LINE", flush=True)
    core.terminate()
    core.wait(60)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
""" + HEALTH_SERVER


@pytest.mark.parametrize("signalled", ["[shutdown] Process manager: send sigterm to process EngineCore",  # 0.32, 0.34
                                       "[shutdown] MPClient: stopping engine manager"])  # the only one 0.26 logs
def test_an_engine_core_that_ignores_sigterm_is_reported_with_its_threads_and_python_traceback(tmp_path, monkeypatch,
                                                                                              signalled):
    monkeypatch.setattr(launcher, "STUCK_CORE_S", 0.5)
    port = launcher.free_port()
    argv = [sys.executable, "-c", STUCK_CORE_SERVER.replace("SIGNALLED_LINE", signalled), str(port)]
    env = launcher.server_env(cpu=False, PYTHONFAULTHANDLER="1")
    s = launcher.VllmServer(argv, env, tmp_path / "s.log", port, name="stuck", start_timeout_s=60,
                            stop_timeout_s=60).start()
    s.wait_healthy()
    deadline = time.monotonic() + 30
    while "core up" not in s.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert s.stop() == 0
    assert s.stacks_path is not None and s.stacks_path.exists()
    report = s.stacks_path.read_text()
    assert "the EngineCore logged no '[shutdown] EngineCore: trigger received'" in report
    assert "VLLM::EngineCor" in report and "SigBlk=" in report and "wchan=" in report, report
    log = s.log_text()
    assert "Fatal Python error: Aborted" in log and "in wait_for_work" in log, log


# An API server whose EngineCore's SIGTERM went to another of its threads (vLLM's Python threads do not block signals:
# CPython then only marks its handler pending, and the main thread asleep in a lock sleeps on). The fake API server
# logs vLLM 0.26's line and does not signal the core at all, which leaves the core as such a SIGTERM does.
ASTRAY_SIGTERM_SERVER = r"""
import http.server, signal, subprocess, sys, threading
port = int(sys.argv[1])
core = subprocess.Popen([sys.executable, "-c", '''
import signal, sys, threading
open("/proc/self/comm", "w").write("VLLM::EngineCore")
def handler(*_):
    print("(EngineCore) INFO [shutdown] EngineCore: trigger received signal=SIGTERM", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, handler)
print("core up", flush=True)
lock = threading.Lock(); lock.acquire(); lock.acquire()
'''])
def term(*_):
    print("(APIServer) INFO [shutdown] MPClient: stopping engine manager", flush=True)
    core.wait(60)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
""" + HEALTH_SERVER


def test_an_engine_core_whose_sigterm_went_astray_is_sent_one_at_its_main_thread_and_stops_cleanly(tmp_path,
                                                                                                   monkeypatch):
    monkeypatch.setattr(launcher, "STUCK_CORE_S", 0.5)
    port = launcher.free_port()
    argv = [sys.executable, "-c", ASTRAY_SIGTERM_SERVER, str(port)]
    s = launcher.VllmServer(argv, launcher.server_env(cpu=False, PYTHONFAULTHANDLER="1"), tmp_path / "s.log", port,
                            name="astray", start_timeout_s=60, stop_timeout_s=60).start()
    s.wait_healthy()
    deadline = time.monotonic() + 30
    while "core up" not in s.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert s.stop() == 0
    assert s.core_nudged, s.stacks_path.read_text() if s.stacks_path else s.log_text()
    report = s.stacks_path.read_text()
    assert "SIGTERM to the main thread of EngineCore" in report and "the first SIGTERM went to another" in report
    log = s.log_text()
    assert "trigger received" in log and "Fatal Python error" not in log, log
    assert launcher.shutdown_problems(log, 0) == [], "a core that took the second SIGTERM shut down cleanly"


def test_signal_thread_reaches_the_named_thread_and_says_when_it_is_gone():
    got = []
    old = signal.signal(signal.SIGUSR2, lambda *_: got.append(True))
    try:
        assert launcher.signal_thread(os.getpid(), os.getpid(), signal.SIGUSR2)
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got
    finally:
        signal.signal(signal.SIGUSR2, old)
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert not launcher.signal_thread(p.pid, p.pid, 0), "a reaped process's thread is gone"
