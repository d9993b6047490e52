"""Strict async mode: catch what would silently block a running stream.

Three things on the hot path look asynchronous and are not:

- ``pageable-copy``: a pageable host array handed to an async copy. The driver stages it
  through its own pinned memory: the copy blocks the host and runs at a fraction of the link.
- ``pool-allocation``: a pool allocation (a miss) after the ring was built. A fresh device or
  pinned allocation synchronises the device and can take most of a second.
- ``kernel-build``: a kernel built or loaded after the first block. A module load waits for
  the device to go idle.

The engine enters :func:`hot_path` for its device after ``_build()`` (so only its own thread,
and only that device, is watched) and leaves it when the last block is issued and retired.
The checks are one-line hooks in the pools' miss path, the kernel builder and the backends'
``copy_in``/``copy_out``; outside a hot path each costs one thread-local lookup.

Inside a strict hot path (``cv.stream(..., strict=True)`` or ``CONVEYOR_STRICT=1``) a hazard
raises :class:`~conveyor.errors.HazardError`; otherwise it warns once per process and hazard
with a :class:`HazardWarning` that says the fix.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from conveyor.errors import HazardError

PAGEABLE_COPY = "pageable-copy"
POOL_ALLOCATION = "pool-allocation"
KERNEL_BUILD = "kernel-build"
HAZARDS = (PAGEABLE_COPY, POOL_ALLOCATION, KERNEL_BUILD)

_FIXES = {
    PAGEABLE_COPY: "allocate host arrays with cv.pinned.empty/asarray, or pin them with "
                   "cv.pinned.register(array), before streaming",
    POOL_ALLOCATION: "allocate before the stream (acquire and release once to warm the pool), "
                     "and do not allocate device or pinned memory inside a compute callable",
    KERNEL_BUILD: "compile every kernel before cv.stream (dev.compile(...)), or pass "
                  "dev.compile(..., wait=False) to cv.stream, which loads it before the "
                  "first block",
}


class HazardWarning(UserWarning):
    """A hot-path operation that silently blocks (see :mod:`conveyor.hazards`)."""


_local = threading.local()
_warned: set[str] = set()
_warned_lock = threading.Lock()


def _watching(device: Any) -> bool | None:
    """None when ``device`` is not on this thread's hot path, else whether it is strict."""
    # A dict lookup, not a walk of the stack: the backends ask this at every copy.
    watched: dict[int, bool] | None = getattr(_local, "watched", None)
    if not watched:
        return None
    return watched.get(id(device))


@contextlib.contextmanager
def hot_path(device: Any, *, strict: bool) -> Iterator[None]:
    """Watch ``device`` on this thread for the ``with`` block: hazards raise when ``strict``,
    else warn once per process and hazard."""
    stack: list[tuple[Any, bool]] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    depth = len(stack)
    try:  # the push inside: a Ctrl-C between it and the try left the device watched for good
        stack.append((device, strict))
        _local.watched = _innermost(stack)
        yield
    finally:
        del stack[depth:]
        _local.watched = _innermost(stack)


@contextlib.contextmanager
def unwatched() -> Iterator[None]:
    """Within: nothing is a hazard on this thread (conveyor's own set-up done on the hot
    path's thread: a staging ring's entries, allocated as its path starts, were reported as
    the user's allocation in strict mode)."""
    saved = getattr(_local, "watched", None)
    _local.watched = {}
    try:
        yield
    finally:
        _local.watched = saved


def _innermost(stack: list[tuple[Any, bool]]) -> dict[int, bool]:
    """Each watched device's strictness, the innermost context winning."""
    return {id(device): strict for device, strict in stack}


def armed(device: Any) -> bool:
    """True when ``device`` is on this thread's hot path (hooks test this before paying for a
    check of their own)."""
    return _watching(device) is not None


def report(device: Any, hazard: str, what: str) -> None:
    """Raise or warn about ``hazard`` on ``device`` if it is on this thread's hot path."""
    strict = _watching(device)
    if strict is None:
        return
    spec = getattr(device, "spec", str(device))
    message = f"conveyor: {what} while a stream runs on {spec}; fix: {_FIXES[hazard]}"
    if strict:
        raise HazardError(hazard, f"{message} (strict mode)")
    with _warned_lock:
        if hazard in _warned:
            return
        _warned.add(hazard)
    warnings.warn(message + " (warned once; strict=True or CONVEYOR_STRICT=1 raises)",
                  HazardWarning, stacklevel=4)


def pageable_copy(device: Any, call: str, nbytes: int) -> None:
    """Hook: a backend's ``call`` (copy_in/copy_out) got a pageable host array."""
    report(device, PAGEABLE_COPY,
           f"{call} of {nbytes} bytes got a pageable host array: the copy blocks the host "
           f"and runs at pageable speed")


def pool_allocation(device: Any, where: str, nbytes: int) -> None:
    """Hook: a pool missed and allocates ``nbytes`` of ``where`` memory."""
    if device is None:
        return
    report(device, POOL_ALLOCATION,
           f"the {where} memory pool allocated {nbytes} bytes after the ring was built (a "
           f"fresh allocation can synchronise the device)")


def kernel_build(device: Any, name: str, step: str) -> None:
    """Hook: kernel ``name`` is being built or loaded (``step``) on ``device``."""
    report(device, KERNEL_BUILD,
           f"kernel {name!r} was {step} after the first block (a module load waits for the "
           f"device to go idle)")


def reset_warnings() -> None:
    """Forget which hazards have warned, so each warns again (for tests)."""
    with _warned_lock:
        _warned.clear()
