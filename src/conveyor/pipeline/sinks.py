"""Sinks: where a stream's output rows go (see :mod:`conveyor.pipeline.io` for sources).

An ndarray output becomes an :class:`ArraySink`; ``"y.npy"``, :func:`npy_out` and
:func:`raw_out` a :class:`FileSink`, written block by block into a temporary file in the
target's folder and renamed over the target only once the whole stream has succeeded, so a
failed or interrupted run leaves no partial or corrupt output. The file replaced keeps its
mode; a symlink is written through; a FIFO or device node is refused; the temporary file of a
killed run is removed by the next run of the same target (:mod:`conveyor.files`).

A file output's rows are written through a shared mapping of the temporary file, by the
staging threads in parallel: ``pwrite`` into one file takes the file's lock on Linux, so
parallel writes ran one at a time (1.2-1.9 GB/s into a file on this machine's disk, against
5.3-7.7 through a mapping: bench/NOTES.md). The file's blocks are reserved first
(``fallocate``), so a full disk fails at the start with ENOSPC, not with SIGBUS at a page
written later; where the file system cannot reserve, or with ``CONVEYOR_FILE_WRITES=pwrite``,
rows are written with ``pwrite``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import math
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from conveyor import config, files
from conveyor.errors import InputError
from conveyor.pipeline.io import FileRows, PathLike


# -- sinks -----------------------------------------------------------------------------------
class Sink:
    """One output: ``shape`` and ``dtype``; rows to write into; committed at the end."""

    shape: tuple[int, ...]
    dtype: np.dtype
    name: str

    @property
    def nbytes(self) -> int:
        """Bytes of the whole output."""
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def result(self) -> Any:
        """What ``report.outputs`` holds for this output."""
        raise NotImplementedError

    def rows(self, lo: int, hi: int) -> np.ndarray | FileRows:
        """Where rows ``lo:hi`` go."""
        raise NotImplementedError

    def open(self) -> None:
        """Prepare to receive rows (a file sink creates its temporary file)."""

    def commit(self) -> None:
        """Every row is written: make the output visible."""

    def abort(self) -> None:
        """The stream failed: leave nothing behind."""


class ArraySink(Sink):
    """An ndarray output (the caller's, or a new one for a dtype)."""

    def __init__(self, array: np.ndarray, name: str = "array") -> None:
        self.array = array
        self.shape = tuple(int(s) for s in array.shape)
        self.dtype = array.dtype
        self.name = name

    @property
    def result(self) -> np.ndarray:
        """The array."""
        return self.array

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """A view of rows ``lo:hi``."""
        return self.array[lo:hi]


class FileSink(Sink):
    """A ``.npy`` (``header=True``) or raw output file, written into a temporary file in the
    same folder and renamed over ``path`` by :meth:`commit`. ``shape``/``dtype`` may be left
    None and are then filled in by the stream (rows of input 0; the kernel's output type)."""

    def __init__(self, path: PathLike, dtype: Any = None, shape: Sequence[int] | None = None,
                 *, header: bool = True, durable: bool = True) -> None:
        self.path = Path(path)
        self.name = str(path)
        self.header = header
        self.durable = durable
        self.dtype = np.dtype(dtype) if dtype is not None else None  # type: ignore[assignment]
        self.shape = tuple(int(s) for s in shape) if shape is not None else ()
        self._given_shape = shape is not None
        self.offset = 0
        self._fd: int | None = None
        self._tmp: Path | None = None
        self._map: mmap.mmap | None = None  # the part file, mapped for writing (or None)
        self._bytes: np.ndarray | None = None  # its bytes, while writes may come
        self._writers = 0  # writes in progress through the mapping
        self._idle = threading.Condition()
        # The file replaced at commit: a symlink's target (written through), never a node.
        self.target = files.output_target(self.path, f"output {self.name}")

    def resolve(self, rows: int, row_shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Fill in the shape and dtype the stream decides; InputError if they disagree."""
        if self.dtype is None:
            self.dtype = np.dtype(dtype)
        if self.dtype.hasobject:
            raise InputError(f"output {self.name} has dtype {self.dtype}: use a numeric dtype")
        if not self._given_shape:
            self.shape = (rows, *row_shape)

    @property
    def result(self) -> str:
        """The output's path."""
        return self.name

    def rows(self, lo: int, hi: int) -> FileRows:
        """Where rows ``lo:hi`` go."""
        return FileRows(self, lo, hi)

    def open(self) -> None:
        """Create the temporary file, with its header, at the output's full size, first
        deleting the parts of this target left by runs that were killed (with a warning)."""
        files.remove_stale_parts(self.target)
        fd, part = files.new_part(self.target)
        self._fd, self._tmp = fd, part
        if self.header:
            with os.fdopen(os.dup(fd), "wb") as f:
                header = {"descr": np.lib.format.dtype_to_descr(self.dtype),
                          "fortran_order": False, "shape": self.shape}
                try:
                    np.lib.format.write_array_header_1_0(f, header)
                except ValueError:  # a header too long for format 1.0
                    np.lib.format.write_array_header_2_0(f, header)
                self.offset = f.tell()
        os.ftruncate(fd, self.offset + self.nbytes)
        if self.nbytes:
            self._map = _map_for_writing(fd, self.offset + self.nbytes, part)
            if self._map is not None:
                self._bytes = np.frombuffer(self._map, np.uint8)

    def write_from(self, src: np.ndarray, lo: int) -> None:
        """Write ``src`` (C-contiguous rows) at row ``lo``; called by several threads at once
        for different rows."""
        assert self._fd is not None, "open() first"
        flat = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        row_bytes = math.prod(self.shape[1:]) * self.dtype.itemsize
        position = self.offset + lo * row_bytes
        with self._idle:
            mapped = self._bytes
            self._writers += mapped is not None
        if mapped is not None:
            try:
                np.copyto(mapped[position : position + flat.nbytes], flat)
            finally:
                with self._idle:
                    self._writers -= 1
                    self._idle.notify_all()
            return
        view = flat.data.cast("B")
        done = 0
        while done < len(view):
            done += os.pwritev(self._fd, [view[done:]], position + done)

    def _unmap(self, flush: bool) -> None:
        """Wait for writes in progress, then (``flush``: write back and) drop the mapping."""
        with self._idle:
            self._bytes = None  # later writes find no mapping
            while self._writers:
                self._idle.wait()
        held, self._map = self._map, None
        if held is None:
            return
        if flush:
            held.flush()  # msync: the rows reach the file before commit_part's fsync
        with contextlib.suppress(BufferError):  # a view still alive: unmapped when it dies
            held.close()

    def commit(self) -> None:
        """Flush to disk and rename over the target, keeping the mode of the file it
        replaces."""
        assert self._fd is not None and self._tmp is not None
        self._unmap(flush=self.durable)
        fd, self._fd = self._fd, None
        files.commit_part(fd, self._tmp, self.target, self.durable)
        self._tmp = None

    def abort(self) -> None:
        """Close and delete the temporary file."""
        self._unmap(flush=False)
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                self._tmp.unlink()
            self._tmp = None


@functools.cache
def _fallocate() -> Callable[[int, int, int, int], int] | None:
    """libc's ``fallocate`` (Linux; no emulation where the file system has none, unlike
    ``posix_fallocate``, which writes zeros over the whole file), or None."""
    try:
        call = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    call.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    call.restype = ctypes.c_int
    return call


def _map_for_writing(fd: int, size: int, part: Path) -> mmap.mmap | None:
    """The first ``size`` bytes of ``fd`` mapped shared for writing, its blocks reserved
    first; None where the file system cannot reserve or map them (then rows are written with
    ``pwrite``). OSError (ENOSPC, EDQUOT, EFBIG) where the disk has no room."""
    call = _fallocate()
    if call is None or config.file_writes() == "pwrite":
        return None
    if call(fd, 0, 0, size) != 0:
        code = ctypes.get_errno()
        if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise OSError(code, os.strerror(code), str(part))
        return None  # EOPNOTSUPP and the like: pwrite
    try:
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError, OverflowError):
        return None


# -- the public constructors ------------------------------------------------------------------


def npy_out(path: PathLike, dtype: Any = None, shape: Sequence[int] | None = None) -> FileSink:
    """A ``.npy`` output file, renamed into place only when the stream succeeds. ``dtype``
    defaults to the kernel's output parameter type (else input 0's); ``shape`` to input 0's
    rows."""
    return FileSink(path, dtype, shape, header=True)


def raw_out(path: PathLike, dtype: Any = None, shape: Sequence[int] | None = None) -> FileSink:
    """A headerless binary output file (C order), like :func:`npy_out` otherwise."""
    return FileSink(path, dtype, shape, header=False)


def as_sink(value: Any, index: int, rows: int, row_shape: tuple[int, ...],
            dtype: np.dtype) -> Sink:
    """Output ``index`` as a Sink: a path (``.npy``), a Sink, an array, or a dtype (``dtype``
    is the default element type of a file sink)."""
    if isinstance(value, str | os.PathLike):
        if Path(value).suffix.lower() != ".npy":
            raise InputError(f"output {index} {value}: a path must name a .npy file; use "
                             f"cv.raw_out() for a raw binary file")
        value = npy_out(value)
    if isinstance(value, FileSink):
        value.resolve(rows, row_shape, dtype)
        return value
    if isinstance(value, Sink):
        return value
    from conveyor.pipeline import validate

    return ArraySink(validate.as_output(value, index, rows, row_shape), f"output {index}")
