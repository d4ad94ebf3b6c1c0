"""The installed `kvtier` console script (pyproject.toml [project.scripts]): one --help listing every command with
its docs, and each listed command answering its own --help (the C++ ones through the packaged binary, calibrate,
replay and bench longdoc in Python)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def kvtier_script() -> Path:
    """The console script pip installed beside this interpreter (the venv's bin/, on PATH once it is activated)."""
    p = Path(sys.executable).parent / "kvtier"
    if not p.exists():
        pytest.fail(f"no kvtier console script at {p}: the package is not installed in this venv")
    return p


def run(*args):
    return subprocess.run([str(kvtier_script()), *args], capture_output=True, text=True, timeout=120)


def listed_commands(help_text: str) -> list[str]:
    block = help_text.split("commands:\n", 1)[1].split("\n\n", 1)[0]
    return [re.split(r"\s{2,}", line.strip())[0] for line in block.splitlines()]


def test_help_lists_every_command_with_its_docs():
    r = run("--help")
    assert r.returncode == 0, r.stderr
    cmds = listed_commands(r.stdout)
    assert set(cmds) >= {"bench io", "bench meta", "bench longdoc", "stats", "fsck", "gc", "calibrate", "replay"}
    for line in r.stdout.split("commands:\n", 1)[1].split("\n\n", 1)[0].splitlines():
        doc = line.split()[-1]
        assert doc.startswith("docs/") and (REPO / doc).is_file(), line


def test_every_listed_command_answers_its_help():
    for cmd in listed_commands(run("--help").stdout):
        r = run(*cmd.split(), "--help")
        assert r.returncode == 0, f"kvtier {cmd} --help: rc {r.returncode}\n{r.stdout}\n{r.stderr}"
        assert "usage:" in (r.stdout + r.stderr).lower(), cmd


def test_the_python_commands_are_the_ones_the_script_dispatches():
    """cli.py runs calibrate, replay and bench longdoc itself; the packaged C++ binary alone refuses them."""
    exe = Path(__import__("kvtier.cli", fromlist=["binary_path"]).binary_path())
    for cmd in (["calibrate"], ["replay"], ["bench", "longdoc"]):
        r = subprocess.run([str(exe), *cmd], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "command of the Python package" in r.stderr, (cmd, r.stderr)
