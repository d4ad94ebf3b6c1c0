"""The `kvtier` console script (installed by `pip install .`, README.md): one command for the C++ CLI and the
vLLM-facing tools of this package.

`calibrate`, `replay` and `bench longdoc` run here (they drive vLLM over HTTP); every other argv, `--help`
included, goes to the C++ CLI installed in the package (kvtier/bin/kvtier, tools/main.cc), whose usage text lists
all commands, these three too, with their docs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def binary_path() -> Path:
    """The C++ CLI shipped in the package; KVTIER_CLI overrides it (e.g. a dev build: build/kvtier)."""
    override = os.environ.get("KVTIER_CLI")
    if override:
        return Path(override)
    return Path(__file__).resolve().parent / "bin" / "kvtier"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # Python-side subcommands (they drive vLLM over HTTP; the C++ CLI does not know them).
    if args[:1] == ["calibrate"]:
        from kvtier.tools.calibrate.cli import main as calibrate
        return calibrate(args[1:])
    if args[:1] == ["replay"]:
        from kvtier.tools.replay.cli import main as replay
        return replay(args[1:])
    if args[:2] == ["bench", "longdoc"]:
        from kvtier.tools.longdoc.cli import main as longdoc
        return longdoc(args[2:])
    exe = binary_path()
    if not os.access(exe, os.X_OK):
        print(f"kvtier: the C++ CLI is missing at {exe}; reinstall with pip install .", file=sys.stderr)
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, [str(exe), *args])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
