"""`python -m kvtier.bench_longdoc`: the long-document benchmark under the name scripts and docs use
(kvtier.tools.longdoc)."""

import sys

from kvtier.tools.longdoc.cli import main

if __name__ == "__main__":
    sys.exit(main())
