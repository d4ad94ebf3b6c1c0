"""The `kvtier` console script: runs the C++ CLI installed in the package (kvtier/bin/kvtier) with the same argv.

Subcommands the C++ CLI does not know (e.g. `kvtier bench longdoc`, which drives vLLM) are to be handled here,
before the exec; today every command goes to the binary.
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
