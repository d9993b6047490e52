"""NVTX ranges for the engine's host stages on CUDA, so Nsight Systems shows them by name.

Only where the ``nvtx`` package is installed and the device is CUDA: :func:`annotator` returns
None otherwise, and the engine then pays one ``is None`` test per stage. The package is
imported on first use, never at conveyor's import.
"""

from __future__ import annotations

import functools
from typing import Any

DOMAIN = "conveyor"
_COLORS = {"stage": 0xFF8C6BB1, "issue": 0xFF2B8CBE, "host-wait": 0xFF969696}


class Annotator:
    """Push/pop NVTX ranges in the ``conveyor`` domain (per thread, properly nested)."""

    def __init__(self, module: Any) -> None:
        self._domain = module.get_domain(DOMAIN)

    def push(self, message: str, kind: str) -> None:
        """Open a range named ``message``; ``kind`` ("stage", "issue", "host-wait") colours it."""
        attributes = self._domain.get_event_attributes(message=message,
                                                       color=_COLORS.get(kind))
        self._domain.push_range(attributes)

    def pop(self) -> None:
        """Close the innermost range this thread opened."""
        self._domain.pop_range()


def annotator(backend: str) -> Annotator | None:
    """An Annotator for a ``backend`` ("cuda" only) when ``nvtx`` imports, else None."""
    if backend != "cuda":
        return None
    return _cuda_annotator()


@functools.cache
def _cuda_annotator() -> Annotator | None:
    """Tried once per process: where ``nvtx`` is not installed, every CUDA stream tried to
    import it again, each a search of ``sys.path`` (and of import hooks such as numba-cuda's)
    from whichever thread streamed; three threads streaming at once hung in that search on
    the H100 (session 19)."""
    try:
        import nvtx
    except Exception:  # not installed, or its library does not load: no ranges
        return None
    try:
        return Annotator(nvtx)
    except Exception:  # an nvtx without domains: no ranges rather than a failed stream
        return None
