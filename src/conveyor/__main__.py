"""``python -m conveyor``: the ``conveyor`` command (as ``python -m conveyor.cli``), where a
console script is not on the PATH."""

import sys

from conveyor.cli import main

sys.exit(main())
