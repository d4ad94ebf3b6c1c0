import sys

from kvtier.tools.longdoc.cli import main

sys.exit(main())
