"""`python -m kvtier.calibrate`, the same as `kvtier calibrate` (kvtier.tools.calibrate)."""

import sys

from kvtier.tools.calibrate.cli import main

if __name__ == "__main__":
    sys.exit(main())
