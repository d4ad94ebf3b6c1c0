"""`python -m kvtier.replay`, the same as `kvtier replay` (kvtier.tools.replay)."""

import sys

from kvtier.tools.replay.cli import main

if __name__ == "__main__":
    sys.exit(main())
