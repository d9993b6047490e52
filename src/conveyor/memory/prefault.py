"""Fault host memory in before a copy writes it, off the staging threads' critical path.

A fresh output (``np.empty_like(a)``) has no pages yet: the stage-out copies that first write
it take a page fault per page, and those faults (the kernel zeroing each page) ran at a
fraction of memcpy speed on the staging workers (issue 17: a pre-faulted output was 10-20 %
faster even warm). :class:`Prefaulter` populates an output's rows a few blocks ahead of the
stage-out, on threads of its own, with ``madvise(MADV_POPULATE_WRITE)`` (Linux >= 5.14: the
kernel faults a whole range in one call, no trap per page), falling back to writing back one
byte per page where that call is missing. Populating never changes what the memory holds:
a page already there is left as is, a new one reads as zeros either way.

``CONVEYOR_PREFAULT`` picks the way: ``off`` (the default: on an H100 host, 1 GiB streams
into fresh outputs ran at 4-9 GB/s with it and 15 GB/s without, bench/NOTES.md), ``madvise``,
``touch`` (the fallback, forced).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import mmap
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from conveyor import config

PAGE = mmap.PAGESIZE
MADV_HUGEPAGE = 14
MADV_POPULATE_WRITE = 23
#: Bytes faulted per call: pieces small enough that several threads share one block.
PIECE_BYTES = 16 * 2**20
#: Threads that pre-fault (the kernel's page zeroing scales with threads until memory
#: bandwidth; more would take cores from the staging copies).
THREADS = 4


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        libc.madvise.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def _madvise(address: int, length: int, advice: int) -> int:
    """``madvise`` on the whole pages inside [address, address + length): 0, or the errno
    (EINVAL where the kernel does not know the advice)."""
    libc = _libc()
    start = -(-address // PAGE) * PAGE
    end = (address + length) // PAGE * PAGE
    if libc is None:
        return errno.EINVAL
    if end <= start:
        return 0
    if libc.madvise(start, end - start, advice) == 0:
        return 0
    return ctypes.get_errno() or errno.EINVAL


def _bytes(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1).view(np.uint8)


def populate(array: np.ndarray, mode: str | None = None) -> str:
    """Fault in every page of ``array`` (C-contiguous) for writing, contents unchanged.
    Returns the way it was done: "madvise", "touch" (the kernel has no MADV_POPULATE_WRITE,
    or ``mode`` says so), "off", or "failed" (the kernel could not fault the memory in, e.g.
    out of memory: then no page is touched, and a later write faults or fails as it would
    have)."""
    mode = mode or config.prefault_mode()
    if mode == "off" or array.nbytes == 0:
        return "off"
    flat = _bytes(array)
    if mode == "madvise":
        code = _madvise(flat.ctypes.data, flat.nbytes, MADV_POPULATE_WRITE)
        if code == 0:
            return "madvise"
        if code != errno.EINVAL:
            return "failed"
    touch(flat)
    return "touch"


def touch(flat: np.ndarray) -> None:
    """Write back one byte of every page of the uint8 array ``flat`` (its own value): the
    fallback where the kernel has no MADV_POPULATE_WRITE. The caller makes sure nothing else
    writes these bytes meanwhile."""
    first = (-flat.ctypes.data) % PAGE  # the first byte that starts a page
    picks = flat[first::PAGE]
    # A ufunc, not `flat[...] = picks`: NumPy skips an assignment of an array to itself.
    np.bitwise_or(picks, 0, out=picks)
    if first:
        np.bitwise_or(flat[:1], 0, out=flat[:1])


def advise_huge(array: np.ndarray) -> bool:
    """Ask for transparent huge pages under ``array`` (its whole 2 MiB-aligned parts), for
    memory conveyor allocates itself: 512 times fewer faults. NumPy does this itself for large
    arrays where it can; this makes it explicit. False where refused (THP off)."""
    flat = _bytes(array)
    return _madvise(flat.ctypes.data, flat.nbytes, MADV_HUGEPAGE) == 0


def empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``np.empty`` with huge pages asked for (for outputs conveyor allocates)."""
    out = np.empty(shape, dtype)
    if out.nbytes >= 2 * 2**20:
        advise_huge(out)
    return out


class Prefaulter:
    """Pre-faults row ranges of arrays on ``THREADS`` threads of its own.

    ``submit(key, parts)`` starts faulting ``parts`` (C-contiguous arrays) in pieces; ``wait(key)``
    returns once they are all done (raising the first failure). ``close()`` waits for what runs
    and joins the threads."""

    def __init__(self, threads: int = THREADS, mode: str | None = None,
                 fault: Callable[[np.ndarray, str], str] = populate) -> None:
        self.mode = mode or config.prefault_mode()
        self._fault = fault
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="conveyor-prefault")
        self._running: dict[int, list[Future[str]]] = {}
        #: How each piece was faulted ("madvise", "touch"), for tests and the bench.
        self.ways: set[str] = set()

    @property
    def enabled(self) -> bool:
        """False when ``CONVEYOR_PREFAULT=off``."""
        return self.mode != "off"

    def submit(self, key: int, parts: list[np.ndarray]) -> None:
        """Start faulting ``parts``; ``wait(key)`` waits for them."""
        futures = []
        for part in parts:
            flat = _bytes(part)
            for start in range(0, flat.nbytes, PIECE_BYTES):
                piece = flat[start : start + PIECE_BYTES]
                futures.append(self._pool.submit(self._fault, piece, self.mode))
        self._running[key] = futures

    def wait(self, key: int) -> None:
        """Wait until the parts submitted under ``key`` are faulted in."""
        for future in self._running.pop(key, []):
            self.ways.add(future.result())

    def close(self) -> None:
        """Wait for every piece still running and join the threads."""
        running, self._running = self._running, {}
        self._pool.shutdown(wait=True, cancel_futures=True)
        for futures in running.values():
            for future in futures:
                if not future.cancelled() and future.exception() is None:
                    self.ways.add(future.result())


class Faulted:
    """An event-like handle (``wait``/``is_done``) for the parts submitted under ``key``: the
    stage-out waits on it as on the block's copy-out events, never the engine's thread."""

    def __init__(self, prefaulter: Prefaulter, key: int) -> None:
        self.prefaulter = prefaulter
        self.key = key

    def wait(self) -> None:
        """Wait until the parts are faulted in; raise the first failure."""
        self.prefaulter.wait(self.key)

    def is_done(self) -> bool:
        """True once every part is faulted in."""
        return all(f.done() for f in self.prefaulter._running.get(self.key, []))

    def detached(self) -> Faulted:
        return self
