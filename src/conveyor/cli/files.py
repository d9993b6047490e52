"""The command's one rule for files it writes: an existing file is replaced only with
``--force`` (outputs, traces and plots alike; the old file stays until the new one is
complete, since every write goes to a temporary file renamed over it)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from conveyor.errors import InputError


def refuse_to_replace(paths: Sequence[str | None], force: bool) -> None:
    """InputError naming the first of ``paths`` that exists, unless ``force``."""
    if force:
        return
    for path in paths:
        if path is not None and os.path.lexists(path):
            raise InputError(f"{path} exists: add --force to replace it")
