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

# CUDA cannot be used in a child forked after the parent initialised it: every call fails with
# an unhelpful "initialization error" or hangs. cuda.py marks the child (os.register_at_fork);
# the backend's modules ask here, and say what to do instead.
_FORK_STATE = [False]
FORK_MESSAGE = (
    "this process was forked after conveyor's CUDA backend was initialised in its parent, and "
    "CUDA cannot be used in a forked child: start worker processes with "
    "multiprocessing.get_context('spawn') (or 'forkserver') instead of fork"
)


def forked() -> bool:
    """True in a child forked after the CUDA backend was initialised."""
    return _FORK_STATE[0]


def refuse_if_forked() -> None:
    """BackendError in a forked child (see :data:`FORK_MESSAGE`)."""
    if _FORK_STATE[0]:
        raise BackendError(FORK_MESSAGE, call="fork", code="CUDA_ERROR_NOT_INITIALIZED")
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
