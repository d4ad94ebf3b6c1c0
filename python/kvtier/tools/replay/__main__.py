import sys

from kvtier.tools.replay.cli import main

sys.exit(main())
