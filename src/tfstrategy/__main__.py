"""``python -m tfstrategy``."""

import sys

from tfstrategy.cli import main

sys.exit(main())
