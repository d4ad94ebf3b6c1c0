import sys

from kvtier.tools.calibrate.cli import main

sys.exit(main())
