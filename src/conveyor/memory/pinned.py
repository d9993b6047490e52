"""Pinned (page-locked) host memory as real NumPy arrays.

``empty``/``zeros``/``empty_like``/``asarray`` return ordinary ``np.ndarray`` objects whose memory
comes from the device's pinned pool. When the last view of such an array is dropped, its block
goes back to the pool, fenced by the last event recorded with :func:`record_use`, so an async
copy still reading it cannot see its memory handed to someone else.

Pinned pools use exact-size classes (rounded up to whole 4 KiB pages), not powers of two: a
129 MiB request holds 129 MiB.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import DTypeLike

from conveyor import config
from conveyor.errors import InputError, OutOfMemoryError
from conveyor.interrupts import deferred_sigint
from conveyor.memory import hostmem, numa
from conveyor.memory.pool import BlockPool

if TYPE_CHECKING:
    from conveyor.backends.base import Device, Event, PinnedBuffer, Registration

PAGE = 4096


def page_bin(nbytes: int) -> int:
    """Round a pinned request up to whole pages (the exact-size class)."""
    return max(-(-nbytes // PAGE) * PAGE, PAGE)


class PinnedPool(BlockPool["PinnedBuffer"]):
    """A device's pool of pinned host blocks: ``device.pinned_pool``."""

    #: Host memory: bounded by the device's max_pinned_bytes, not its largest allocation.
    host_memory = True

    def __init__(self, device: Device, limit: int | None = None, *, svm: bool = False) -> None:
        # Every block is allocated on the device's NUMA node (memory/numa.py; nothing on a
        # host with one node).
        allocate = functools.partial(numa.allocate_near, device,
                                     device.alloc_svm if svm else device.alloc_pinned)
        where = "shared virtual" if svm else "pinned host"
        super().__init__(allocate, page_bin, limit=limit, keep=config.pool_keep(), where=where)
        self.device = device
        self.svm = svm


_svm_pools: weakref.WeakKeyDictionary[Device, PinnedPool] = weakref.WeakKeyDictionary()


def svm_pool(device: Device) -> PinnedPool:
    """The device's pool of fine-grained SVM blocks (made on first use)."""
    pool = _svm_pools.get(device)
    if pool is None:
        pool = _svm_pools[device] = PinnedPool(device, svm=True)
    return pool


def existing_svm_pool(device: Device) -> PinnedPool | None:
    """The device's SVM pool if one was made, else None (none is made): what a stream's end
    settles and ``device.close()`` closes, as the device's other pools. It was neither, so
    every size of ``cv.pinned.empty(..., svm=True)`` ever made stayed held, past close()."""
    return _svm_pools.get(device)


class PinnedOwner:
    """Owns one pooled block; the base of every array made from it.

    Exposes the block through ``__array_interface__`` so ``np.asarray(owner)`` is a view whose
    ``.base`` keeps the owner alive; when the owner dies, the block returns to its pool after
    ``last_use``.
    """

    def __init__(self, pool: PinnedPool, block: PinnedBuffer, nbytes: int) -> None:
        self.pool = pool
        self.device = pool.device
        self.block = block
        self.nbytes = nbytes
        pointer = hostmem.address(block.array)
        self.__array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (pointer, False),
            "version": 3,
        }
        # The finalizer may not hold self, so the fence lives in a one-item list both share.
        self._fence: list[Event | None] = [None]
        self._finalizer = weakref.finalize(self, _give_back, pool, block, self._fence)

    @property
    def last_use(self) -> Event | None:
        """The event the block's return to the pool waits for, if any."""
        return self._fence[0]

    def record_use(self, event: Event) -> None:
        """Fence the block's return to the pool on ``event``."""
        # Detached: the copy's own event may hold this very array, and the finalizer holds the
        # fence, so keeping the copy's event would keep the array alive for ever.
        self._fence[0] = event.detached()


def _give_back(pool: PinnedPool, block: PinnedBuffer, last: list[Event | None]) -> None:
    try:
        pool.release(block, after=last[0])
    except Exception:  # never raise from a finalizer (interpreter shutdown)
        pass


def owner(array: np.ndarray) -> PinnedOwner | None:
    """The pinned block behind ``array``, or None when it is ordinary pageable memory."""
    base: Any = array
    while base is not None:
        if isinstance(base, PinnedOwner):
            return base
        base = getattr(base, "base", None)
    return None


def is_pinned(array: np.ndarray, device: Device | str | None = None) -> bool:
    """True when ``array`` lives in conveyor pinned memory (of ``device``, if given)."""
    found = owner(array)
    if isinstance(device, str):
        device = _resolve(device)
    return found is not None and (device is None or found.device is device)


def is_pinned_for(array: np.ndarray, device: Device) -> bool:
    """True when ``device`` can copy ``array`` without staging it: pinned for ``device``, or
    for another device whose pinned memory it copies directly (``Device.copies_pinned_of``:
    CUDA's portable pinned memory; another context of the same OpenCL platform), as when
    one pinned input streams over several GPUs."""
    found = owner(array)
    return found is not None and device.copies_pinned_of(found.device)


def record_use(array: np.ndarray, event: Event) -> None:
    """Note that ``event`` uses ``array``: its block is not reused before the event completes."""
    found = owner(array)
    if found is not None:
        found.record_use(event)


def _resolve(device: Device | str | None) -> Device:
    """``device`` as ``cv.stream`` takes it: a Device, a spec string, or None (the default);
    anything else is an InputError (a spec string was an AttributeError)."""
    from conveyor.memory.keep import _device

    return _device(device)


def empty(
    shape: int | tuple[int, ...],
    dtype: DTypeLike = np.float32,
    *,
    device: Device | str | None = None,
    svm: bool = False,
) -> np.ndarray:
    """A new uninitialised C-ordered array in pinned memory (or fine-grained SVM with
    ``svm=True``; BackendError where the device has none). InputError for a size past the
    device's largest allocation; OutOfMemoryError if the host has not the memory."""
    svm = config.flag("svm", svm)  # "no" allocated shared virtual memory
    dt = config.dtype_of(dtype, "cv.pinned.empty's dtype")
    if dt.hasobject:
        raise InputError(f"pinned arrays cannot hold Python objects (dtype {dt})")
    if dt.itemsize == 0:
        raise InputError(f"dtype {dt} has no bytes: give one with a size, e.g. 'S4' or 'V8'")
    shape_tuple = _shape(shape)
    if dt.subdtype is not None:  # as np.empty: (3,) of float32 (2, 3) is (3, 2, 3) float32
        dt, sub = dt.subdtype
        shape_tuple = (*shape_tuple, *sub)
    # Python integers: an int64 product wraps ((2**32, 2**32) of float32 came out as 0 bytes).
    nbytes = math.prod(shape_tuple) * dt.itemsize
    if nbytes > sys.maxsize:
        raise InputError(
            f"shape {shape_tuple} of {dt} is {nbytes} bytes, more than any array can address "
            f"({sys.maxsize} bytes): use a smaller shape"
        )
    dev = _resolve(device)
    if svm and nbytes > dev.max_alloc_bytes:  # as alloc_pinned says it for pinned memory
        raise InputError(
            f"{nbytes} bytes of shared virtual memory is more than {dev.name}'s largest "
            f"allocation ({dev.max_alloc_bytes} bytes): use a smaller array")
    pool = svm_pool(dev) if svm else dev.pinned_pool
    try:
        with deferred_sigint():  # the block has its owner (and finalizer) before a Ctrl-C
            block = pool.acquire(max(nbytes, 1))
            holder = PinnedOwner(pool, block, nbytes)
    except OutOfMemoryError as exc:  # no stream here: its memory_limit advice cannot apply
        exc.advice = "use a smaller array" + (
            ", or raise device.pinned_pool.limit" if exc.limit is not None and not svm else "")
        raise
    raw = np.asarray(holder)
    return raw.view(dt).reshape(shape_tuple)


def _shape(shape: Any) -> tuple[int, ...]:
    """``shape`` as a tuple of Python ints of 0 or more; InputError for anything else."""
    config.check_ordered(shape, "pinned array")
    dims = (shape,) if _is_count(shape) else shape
    try:
        dims = tuple(dims)
    except TypeError:
        raise InputError(
            f"shape={shape!r} ({type(shape).__name__}): pass an int or a tuple of ints"
        ) from None
    if not all(_is_count(d) for d in dims):
        raise InputError(f"shape {dims!r} has a dimension that is not an int: pass ints, "
                         f"e.g. (1000, 3)")
    ints = tuple(int(d) for d in dims)
    if any(d < 0 for d in ints):
        raise InputError(f"negative dimension in shape {ints}: dimensions are 0 or more")
    return ints


def _is_count(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def zeros(
    shape: int | tuple[int, ...],
    dtype: DTypeLike = np.float32,
    *,
    device: Device | str | None = None,
    svm: bool = False,
) -> np.ndarray:
    """Like :func:`empty`, filled with zeros: every byte, as ``np.zeros`` makes them (a fill
    with the number 0 made ``b'0'`` of text, a TypeError of a void dtype, and left a record's
    padding holding the pool's earlier bytes)."""
    out = empty(shape, dtype, device=device, svm=svm)
    _bytes(out).fill(0)
    return out


def _bytes(array: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous ``array``, as a 1-D uint8 view."""
    return array.reshape(-1).view(np.uint8)


def empty_like(array: Any, *, device: Device | str | None = None) -> np.ndarray:
    """A pinned array of ``array``'s shape and dtype (always C-ordered); ``array`` may be
    anything ``np.asarray`` takes, as for ``np.empty_like``."""
    array = _with_shape(array)
    return empty(array.shape, array.dtype, device=device)


def zeros_like(array: Any, *, device: Device | str | None = None) -> np.ndarray:
    """A pinned array of zeros of ``array``'s shape and dtype."""
    array = _with_shape(array)
    return zeros(array.shape, array.dtype, device=device)


def _with_shape(array: Any) -> Any:
    """``array`` where it has a shape and a dtype (an array, a CuPy or PyTorch one), else
    ``np.asarray(array)`` (a list), as ``np.empty_like`` takes it."""
    return array if hasattr(array, "shape") and hasattr(array, "dtype") else np.asarray(array)


def asarray(array: Any, *, device: Device | str | None = None) -> np.ndarray:
    """``array`` in pinned memory: itself when already pinned on the device, else a copy."""
    dev = _resolve(device)
    source = np.asarray(array)
    if is_pinned(source, dev) and source.flags.c_contiguous:
        return source
    out = empty(source.shape, source.dtype, device=dev)
    if source.dtype.names:  # a record's padding too, not only its fields (the pool's bytes)
        _bytes(out)[...] = _bytes(np.ascontiguousarray(source))
    else:
        np.copyto(out, source)
    return out


@contextlib.contextmanager
def register(array: np.ndarray, *, device: Device | str | None = None) -> Iterator[Registration]:
    """Pin ``array`` in place for the ``with`` block, where the backend can.

    CUDA page-locks the pages (cuMemHostRegister). OpenCL has no such call: it wraps the array
    in a USE_HOST_PTR buffer, zero-copy on host-unified devices, but copies from it on a
    discrete GPU may be staged by the driver (NVIDIA's page-locks it);
    ``registration.page_locked`` says which happened.
    The array must be C-contiguous and must outlive the ``with`` block.
    """
    if not isinstance(array, np.ndarray):
        raise InputError(f"register() takes a NumPy array, got {type(array).__name__}")
    if not array.flags.c_contiguous:
        raise InputError("register() needs a C-contiguous array: pass np.ascontiguousarray(a)")
    if array.nbytes == 0:
        raise InputError("register() needs a non-empty array")
    dev = _resolve(device)
    registration = dev.register_host(array)
    try:
        yield registration
    finally:
        registration.close()
