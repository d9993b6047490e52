"""The CUDA libraries conveyor calls (cuda.core, cuda.bindings' driver and NVRTC), loaded once,
and how a failed call becomes a :class:`~conveyor.errors.BackendError`.

Shared by the CUDA backend's modules (cuda.py, cuda_events.py, cuda_images.py) so that none of
them imports another only for these.
"""

from __future__ import annotations

import re
from typing import Any

from conveyor.errors import BackendError

_IMPORT_ERROR: Exception | None = None
try:
    import cuda.core as cc
    from cuda.bindings import driver, nvrtc
except Exception as exc:  # cuda.core is there but cannot load (no cuda.bindings, wrong major)
    _IMPORT_ERROR = exc
    cc = driver = nvrtc = None

_HOST_ALLOC_FLAGS = 0x01 | 0x02  # CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP
_ERROR_NAME = re.compile(r"(?:CUDA|NVRTC)_ERROR_[A-Z0-9_]+")


def _code_name(err: Any) -> str:
    return str(getattr(err, "name", err))


def _check(result: Any, call: str) -> Any:
    """Unpack a cuda.bindings result tuple; BackendError unless it is CUDA_SUCCESS."""
    err = result[0]
    if int(err) != 0:
        _, text = driver.cuGetErrorString(err)
        message = text.decode() if isinstance(text, bytes) else "driver call failed"
        raise BackendError(message, call=call, code=_code_name(err))
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def _wrap(exc: Exception, call: str) -> BackendError:
    """A cuda.core exception as a BackendError with the symbolic code from its message."""
    found = _ERROR_NAME.search(str(exc))
    return BackendError(str(exc), call=call, code=found.group(0) if found else "")


class _HostMemory:
    """Exposes ``nbytes`` at ``pointer`` to NumPy; the base of a pinned buffer's ``array``."""

    def __init__(self, pointer: int, nbytes: int) -> None:
        self.__array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (pointer, False), "version": 3,
        }
