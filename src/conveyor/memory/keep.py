"""Pageable arrays kept page-locked between streams (issue 17, iterative use).

An array streamed again and again (epochs, solver iterations) pays the host staging copy on
every pass, in and out. ``cv.keep_pinned(a)`` (or ``cv.stream(..., keep_pinned=True)`` for
every pageable array input and output the caller passes) registers its memory with the device
once, where it is: ``cuMemHostRegister`` on CUDA; a ``CL_MEM_USE_HOST_PTR`` buffer on OpenCL,
to and from which blocks are copied buffer to buffer (on NVIDIA's OpenCL, which page-locks the
buffer's memory, from and to the array itself: backends/opencl.py). Every later stream that
reads it, or writes it (a writeable array), takes the direct path, with no staging copy.

The registrations of a process hold at most a budget of host memory (``pinned_budget``:
``cv.configure(pinned_budget=...)`` or ``CONVEYOR_PINNED_BUDGET``; default a quarter of the
host's memory): keeping one more array releases the least recently used ones first, and an
array larger than the budget is not kept (``keep_pinned`` returns False). A registration is
released by ``cv.release_pinned(a)`` (or with no argument: all), by ``device.close()``, at
interpreter exit, and when the array itself is freed (a weak reference: a dropped array does
not stay registered). A registration a running stream uses is released when the stream ends.

On OpenCL other than NVIDIA's, the host may change a kept array between streams: each stream
that uses it first tells the driver so (a map and unmap of the buffer), since a driver may
keep its own copy; and a block the device wrote into one is mapped for reading and unmapped
after its copy, so the host sees the rows when the block is done (the OpenCL rule for
``USE_HOST_PTR`` memory). Copies from and to the array itself need neither.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from conveyor import config
from conveyor.closing import Closeable
from conveyor.errors import InputError
from conveyor.memory import hostmem

if TYPE_CHECKING:
    from conveyor.backends.base import Device, Registration

_lock = threading.RLock()
#: Keys of arrays freed while the lock was taken elsewhere (see _forget).
_forgotten: collections.deque[tuple[int, int, int]] = collections.deque()


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Hold keep's lock; once this thread lets go of it (not a nested hold), release what
    ``_forget`` deferred meanwhile (a garbage collection inside the hold)."""
    with _lock:
        yield
    if _forgotten and not _lock._is_owned():  # type: ignore[attr-defined]
        _forget_pending()


def _forget_pending() -> None:
    """Release the registrations of arrays freed while the lock was busy (``_forget``): those
    waiting now, once each (one whose lock is busy again waits for the next call)."""
    for _ in range(len(_forgotten)):
        try:
            key = _forgotten.popleft()
        except IndexError:
            return
        _forget(key)
_budget: int | None = None  # set by configure(); None: the environment's or the default
#: (device, address, nbytes) -> Kept, least recently used first.
_kept: OrderedDict[tuple[int, int, int], Kept] = OrderedDict()


class Kept:
    """One array's registration on one device, and how many running streams use it."""

    def __init__(self, key: tuple[int, int, int], device: Device, registration: Registration,
                 nbytes: int) -> None:
        self.key = key
        self.device = device
        self.registration = registration
        self.nbytes = nbytes
        self.address = key[1]
        self.writable = registration.array.flags.writeable  # the device may write it
        self.holds = 0
        self.doomed = False  # released while a stream held it: closed when the last lets go
        # One host_changed() at a time: two streams that read one kept array, started at
        # once, mapped its buffer together on PoCL; the second unmap failed (INVALID_VALUE)
        # and the map left open aborted the process when PyOpenCL collected it.
        self.sync = threading.Lock()
        self.finalizer: weakref.finalize[Any, Any] | None = None

    def close(self) -> None:
        if self.finalizer is not None:
            self.finalizer.detach()
        try:
            self.registration.close()
        except Exception:  # a device already gone: nothing left to unregister
            pass


def configure(*, pinned_budget: int | str | None = None) -> dict[str, int]:
    """Set conveyor's process-wide settings; returns them. ``pinned_budget``: most bytes of
    host memory that kept arrays (``cv.keep_pinned``) hold page-locked, an int or a size like
    "8GiB"; lowering it releases the least recently used ones at once."""
    global _budget
    if pinned_budget is not None:
        from conveyor.pipeline.options import size

        try:  # an int, a NumPy integer, an integral float or a size string, as cv.stream's
            pinned_budget = size("pinned_budget", pinned_budget)
        except InputError:
            if isinstance(pinned_budget, str):
                raise  # the size's own message
            # anything else is refused below, with this option's own advice
        if isinstance(pinned_budget, bool) or not isinstance(pinned_budget, int) \
                or pinned_budget < 0:
            raise InputError(f"pinned_budget={pinned_budget!r}: use 0 or more bytes (an int "
                             f"or a size like '8GiB')")
        config.check_size_cap("pinned_budget", pinned_budget, pinned_budget)
        with _locked():
            _budget = pinned_budget
            _fit(0)
    return {"pinned_budget": budget()}


def budget() -> int:
    """The budget in bytes: configure()'s, else ``CONVEYOR_PINNED_BUDGET``, else a quarter of
    the host's physical memory."""
    if _budget is not None:
        return _budget
    from_env = config.pinned_budget()
    if from_env is not None:
        return from_env
    from conveyor.memory.hostmem import physical_bytes

    host = physical_bytes()
    return 4 * 2**30 if host is None else host // 4


def kept_bytes() -> int:
    """Bytes of host memory kept page-locked now (all devices)."""
    _forget_pending()
    with _locked():
        return sum(k.nbytes for k in _kept.values())


def _key(array: np.ndarray, device: Device) -> tuple[int, int, int]:
    return (id(device), hostmem.address(array), array.nbytes)


def _owner(array: np.ndarray) -> np.ndarray:
    """The ndarray that owns ``array``'s memory (freed when it is), or ``array`` itself."""
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root


def _device(device: Device | str | None) -> Device:
    """``device`` as ``cv.stream`` takes it: a Device, a spec string, or None (the default)."""
    from conveyor.backends import device as open_device
    from conveyor.backends.base import Device as DeviceType

    if device is None or isinstance(device, str):
        return open_device(device, warm_up=False)
    if not isinstance(device, DeviceType):
        raise InputError(f"device={device!r}: pass a Device or a spec string like "
                         f"'opencl:0:0' or 'cuda:0'")
    return device


def keep_pinned(array: np.ndarray, *, device: Device | str | None = None) -> bool:
    """Keep ``array`` (C-contiguous, pageable) page-locked on ``device`` between streams, within
    the budget; True when it is kept (already or now), False when it cannot be (larger than
    the budget, every older one held by running streams, or the driver refused). Streams that
    read it, or write it (as an output; a writeable array), then copy it directly, with no
    staging copy. An array already page-locked by another library or by the caller (CuPy's or
    PyTorch's pinned memory; ``Device.page_locked``) is True with nothing registered or
    counted in the budget: streams copy it directly while its owner keeps it locked."""
    if not isinstance(array, np.ndarray):
        raise InputError(f"keep_pinned() takes a NumPy array, got {type(array).__name__}")
    if not array.flags.c_contiguous:
        raise InputError("keep_pinned() needs a C-contiguous array: pass "
                         "np.ascontiguousarray(a), and keep that")
    device = _device(device)
    from conveyor.memory import pinned

    if array.nbytes == 0 or pinned.is_pinned_for(array, device):
        return pinned.is_pinned_for(array, device)  # pinned for this device already
    key = _key(array, device)
    _forget_pending()
    with _locked():
        found = _kept.get(key)
        if found is not None:
            # Released while a stream held it (doomed), then kept again: keep that
            # registration. A second one under the same key was dropped from the table when
            # the stream let go of the first, and never closed.
            found.doomed = False
            _kept.move_to_end(key)
            if found.finalizer is None or not found.finalizer.alive:
                # The array it was kept through died while a stream held it: this one's
                # death releases it now.
                found.finalizer = weakref.finalize(_owner(array), _forget, key)
            return True
        if locked_elsewhere(device, array):  # _lock is reentrant
            return True  # page-locked by another library or the caller: copied directly
        if array.nbytes > budget() or not _fit(array.nbytes):
            return False
        # Registered through a view that does not own or reference the array: the driver's
        # objects keep what they are given alive, and the array must stay free to die (its
        # finalizer below then releases the registration before its memory goes).
        from conveyor.memory.hostmem import view

        unowned = view(key[1], array.nbytes)
        if not array.flags.writeable:
            unowned.flags.writeable = False
        try:
            registration = device.register_host(unowned)
        except Exception:
            return False
        if not registration.page_locked and device.backend == "cuda":
            registration.close()  # the driver refused: copies would not be faster
            return False
        kept = Kept(key, device, registration, array.nbytes)
        kept.finalizer = weakref.finalize(_owner(array), _forget, key)
        _kept[key] = kept
        return True


def _fit(more: int) -> bool:
    """Release least recently used registrations (not held by a stream) until ``more`` bytes
    fit the budget; False when they cannot."""
    limit = budget()
    total = sum(k.nbytes for k in _kept.values())
    for key in list(_kept):
        if total + more <= limit:
            break
        kept = _kept[key]
        if kept.holds:
            continue
        del _kept[key]
        total -= kept.nbytes
        kept.close()
    return total + more <= limit


def _forget(key: tuple[int, int, int]) -> None:
    """The array was freed: release its registration (weakref callback). One a running
    stream holds is released when the stream lets go: that stream reads the same memory
    through another array (``np.frombuffer`` twice, views of one shared buffer), which keeps
    the memory alive, and its later blocks would otherwise fall back to pageable copies, or
    on CUDA copy from memory unregistered under them.

    Never waits for the lock: a garbage collection runs this callback wherever it happens,
    also inside the device's host lock, while another thread holding this lock waits for that
    one (keep_pinned registering an array): a key then waits in ``_forgotten`` for the next
    call that takes the lock."""
    # On a thread that holds the lock already (a collection inside release_pinned's loop,
    # or device.close()'s) the RLock would be taken again and _kept changed under that loop:
    # a KeyError, and the registrations after it left registered. Deferred to the hold's end.
    if _lock._is_owned() or not _lock.acquire(blocking=False):  # type: ignore[attr-defined]
        _forgotten.append(key)
        return
    try:
        kept = _kept.get(key)
        if kept is None:
            return
        if kept.holds:
            kept.doomed = True  # Holds.close() closes it
            return
        del _kept[key]
    finally:
        _lock.release()
    try:
        kept.registration.close()  # the finalizer is this call
    except Exception:  # never raise from a finalizer (a device gone, a forked child)
        pass


def release_pinned(array: np.ndarray | None = None, *,
                   device: Device | str | None = None) -> int:
    """Release the registration of ``array`` (on ``device``, a Device or a spec string, else
    on every device), or of every kept array when ``array`` is None; returns the bytes
    released. One a running stream uses is released when the stream ends."""
    if array is not None and not isinstance(array, np.ndarray):  # it matched nothing: 0
        raise InputError(f"release_pinned() takes the NumPy array given to keep_pinned(), or "
                         f"None for every kept array; got {type(array).__name__}")
    if device is not None:
        device = _device(device)
    _forget_pending()
    with _locked():
        doomed = [k for k in _kept.values()
                  if (device is None or k.device is device)
                  and (array is None or k.key[1:] == _key(array, k.device)[1:])]
        freed = 0
        for kept in doomed:
            freed += kept.nbytes
            if kept.holds:
                kept.doomed = True
                continue
            del _kept[kept.key]
            kept.close()
    return freed


def release_device(device: Device) -> None:
    """Release every registration on ``device`` (it is closing); one a running stream holds
    when that stream lets go (CUDA would otherwise unregister memory its copies still read)."""
    with _locked():
        for kept in [k for k in _kept.values() if k.device is device]:
            if kept.holds:
                kept.doomed = True
                continue
            del _kept[kept.key]
            kept.close()


def find(device: Device, array: np.ndarray, *, written: bool = False) -> Kept | None:
    """The kept registration that covers all of ``array`` on ``device`` (one the device may
    write, for ``written``), or None; of several (overlapping kept views), the one a stream
    held last (:func:`hold` moves what it holds to the end)."""
    if not _kept:
        return None
    start = hostmem.address(array)
    end = start + array.nbytes
    with _locked():
        for kept in reversed(_kept.values()):
            if kept.device is device and kept.address <= start \
                    and end <= kept.address + kept.nbytes and (kept.writable or not written):
                return kept
    return None


def locked_elsewhere(device: Device, array: np.ndarray, *, written: bool = False) -> bool:
    """True when ``array`` is page-locked memory that neither conveyor's pools nor its kept
    arrays hold (CuPy's or PyTorch's pinned memory, a range the caller registered): the
    device copies it directly; with ``written`` (an output), only where the device may write
    it. Memory of a kept array is left to :func:`hold`, which decides whether a stream may
    write it and holds it while the stream runs."""
    with _locked():
        if _overlaps_kept(device, array):
            return False
    return device.page_locked(array, written=written)


def _overlaps_kept(device: Device, array: np.ndarray) -> bool:
    """True when a kept registration on ``device`` shares a byte with ``array`` (``_lock``
    held)."""
    start = hostmem.address(array)
    end = start + array.nbytes
    return any(kept.device is device and kept.address < end
               and start < kept.address + kept.nbytes for kept in _kept.values())


class Holds(Closeable):
    """Registrations a stream reads from: none is released before ``close()``."""

    def __init__(self, held: list[Kept]) -> None:
        self.held = held

    def close(self) -> None:
        held, self.held = self.held, []
        with _locked():
            for kept in held:
                kept.holds -= 1
                if kept.doomed and not kept.holds and _kept.get(kept.key) is kept:
                    del _kept[kept.key]
                    kept.close()
            if held:
                _fit(0)  # a budget lowered while the stream held them is kept from now on


def hold(device: Device, arrays: list[np.ndarray], written: Sequence[bool] = ()
         ) -> tuple[list[bool], Holds]:
    """Which of ``arrays`` are kept on ``device`` (these take the direct path), held until the
    returned ``Holds`` closes; on OpenCL the driver is told the host may have changed them.
    ``written[i]``: the stream writes ``arrays[i]`` (an output), which its registration must
    allow."""
    writes = list(written) + [False] * (len(arrays) - len(written))
    held: list[Kept] = []
    read: dict[int, Kept] = {}
    # Found and held under one lock: another thread's keep_pinned() may release any kept
    # array no stream holds (the budget), and must not release one between the two.
    _forget_pending()
    with _locked():
        found: list[Kept | None] = [find(device, a, written=w) if a.flags.c_contiguous
                                    else None for a, w in zip(arrays, writes, strict=True)]
        for kept, w in zip(found, writes, strict=True):
            if kept is not None and not kept.doomed:
                kept.holds += 1
                held.append(kept)
                _kept.move_to_end(kept.key)
                if not w:
                    read[id(kept)] = kept
        # Every other kept view over the bytes read is told too: a block's copy may go
        # through any registration that covers it (NVIDIA's OpenCL keeps a copy per
        # registration: rows changed through one overlapping view were read stale).
        # (Held too: the stream may copy through them.)
        for array, w in zip(arrays, writes, strict=True):
            if w or not array.flags.c_contiguous or not array.nbytes:
                continue
            low = hostmem.address(array)
            high = low + array.nbytes
            for other in list(_kept.values()):
                if (other.device is device and other.address < high and not other.doomed
                        and low < other.address + other.nbytes and id(other) not in read):
                    other.holds += 1
                    held.append(other)
                    read[id(other)] = other
    # Only what the stream reads: an output's every byte is written (and mapped back per
    # block), and on a driver that keeps its own copy this sync uploads the whole array.
    holds = Holds(held)
    try:
        for kept in read.values():
            changed = getattr(kept.registration, "host_changed", None)
            if changed is not None:
                with kept.sync:
                    changed()
    except BaseException:
        holds.close()  # or the registrations stay held (never released) for ever
        raise
    return [k is not None and not k.doomed for k in found], holds


@atexit.register
def _release_all() -> None:
    try:
        release_pinned()
    except Exception:  # at exit: the drivers may be gone already
        pass
