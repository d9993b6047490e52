"""Anonymous host memory, faulted in by several threads, for page-locking in place.

``cuMemHostAlloc`` faults and locks its pages on the one calling thread: 2 GiB took 0.78 s on
an H200 (issue 17), most of it the kernel zeroing pages one by one. Page-locking memory that
is already faulted in (``cuMemHostRegister``) ran at 31-34 GB/s on the H100 (bench/NOTES.md),
and faulting scales with threads. So the CUDA backend maps anonymous memory here, asks for huge
pages, faults it in on ``THREADS`` threads (memory/prefault.py) and then registers it
(backends/cuda.py ``alloc_pinned``, the default; ``CONVEYOR_PINNED_ALLOC=driver`` keeps
cuMemHostAlloc).
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from conveyor.memory import numa, prefault

THREADS = 8
PROT_READ_WRITE = mmap.PROT_READ | mmap.PROT_WRITE
MAP_PRIVATE_ANONYMOUS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
_MAP_FAILED = ctypes.c_void_p(-1).value
_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def address(array: np.ndarray) -> int:
    """The address of ``array``'s first element. Read through ``ctypes``, not
    ``__array_interface__``, which lists every field of a record dtype first (43 ms for
    60,000 fields, on every block that asked)."""
    return int(array.ctypes.data)


def byte_bounds(array: np.ndarray) -> tuple[int, int]:
    """``numpy.lib.array_utils.byte_bounds`` without ``__array_interface__`` (see
    :func:`address`): the first byte of ``array`` and one past its last."""
    low = high = address(array)
    if array.flags.c_contiguous:
        return low, high + array.size * array.itemsize
    for extent, stride in zip(array.shape, array.strides, strict=True):
        if stride < 0:
            low += (extent - 1) * stride
        else:
            high += (extent - 1) * stride
    return low, high + array.itemsize


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    libc.mmap.restype = ctypes.c_void_p
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.munmap.restype = ctypes.c_int
    return libc


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            # Started lazily, maybe by a thread inside numa.on_node: its threads must not
            # keep that place (the memory they fault follows each mapping's own policy).
            _pool = ThreadPoolExecutor(THREADS, thread_name_prefix="conveyor-fault",
                                       initializer=numa.unbind_thread)
        return _pool


def physical_bytes() -> int | None:
    """The host's physical memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def round_up(nbytes: int) -> int:
    """``nbytes`` rounded up to whole pages (what :func:`map_faulted` maps)."""
    return max(-(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE, mmap.PAGESIZE)


def available() -> int | None:
    """The bytes of memory the host has available (``MemAvailable``), or None where
    /proc/meminfo does not say."""
    return _meminfo("MemAvailable:")


def total() -> int | None:
    """The bytes of memory the host has (``MemTotal``), or None where /proc/meminfo does not
    say."""
    return _meminfo("MemTotal:")


def _meminfo(field: str) -> int | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def fits(nbytes: int) -> bool:
    """True when ``nbytes`` is at most the memory the host has available (MemAvailable):
    more would have the kernel reclaim or kill while faulting; the caller then lets the
    driver allocate."""
    free = available()
    return free is None or nbytes <= free


def map_faulted(nbytes: int) -> int:
    """The address of ``round_up(nbytes)`` bytes of fresh anonymous memory, every page faulted
    in (zeros), huge pages asked for. MemoryError when the mapping or a fault fails; free it
    with :func:`unmap`."""
    size = round_up(nbytes)
    libc = _libc()
    address = libc.mmap(None, size, PROT_READ_WRITE, MAP_PRIVATE_ANONYMOUS, -1, 0)
    if address is None or address == _MAP_FAILED:
        raise MemoryError(f"mmap of {size} bytes failed (errno {ctypes.get_errno()})")
    try:
        place = numa.current()
        if place is not None:  # allocated for a device on a node: its pages go there
            numa.bind_range(address, size, place.node)
        prefault._madvise(address, size, prefault.MADV_HUGEPAGE)
        flat = view(address, size)
        step = prefault.PIECE_BYTES
        pieces = [flat[s : s + step] for s in range(0, size, step)]
        # Always faulted here (CONVEYOR_PREFAULT is about outputs): else the driver's
        # registration would fault every page on one thread.
        ways = list(_threads().map(lambda piece: prefault.populate(piece, "madvise"), pieces))
        if "failed" in ways:
            raise MemoryError(f"could not fault in {size} bytes of host memory")
    except BaseException:
        libc.munmap(address, size)
        raise
    return int(address)


class _Memory:
    def __init__(self, address: int, nbytes: int) -> None:
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                    "data": (address, False), "version": 3}


def view(address: int, nbytes: int) -> np.ndarray:
    """A uint8 array over ``nbytes`` at ``address`` (it does not own the memory)."""
    return np.asarray(_Memory(address, nbytes))


def unmap(address: int, nbytes: int) -> None:
    """Give back memory from :func:`map_faulted` (``nbytes`` as asked for there)."""
    _libc().munmap(address, round_up(nbytes))
