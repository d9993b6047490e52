"""``python -m conveyor.cli``: the ``conveyor`` command."""

import sys

from conveyor.cli import main

sys.exit(main())
