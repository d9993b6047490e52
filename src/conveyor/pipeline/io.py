"""Sources and sinks: where a stream's rows come from and where they go.

A *source* hands the engine rows ``lo:hi`` of one input; a *sink* takes rows of one output.
``cv.stream`` turns whatever it is given into one of them before anything is allocated:

- an ndarray (or memmap) becomes an :class:`ArraySource` / :class:`ArraySink`: the engine's
  zero-copy and pinned-direct paths use the array itself;
- ``"x.npy"`` or :func:`npy` reads a ``.npy`` file; :func:`raw` a headerless binary file.
  Both are read block by block with ``os.preadv`` straight into the pinned slot (no
  intermediate array), in parallel pieces on the staging threads;
- :func:`parquet` and :func:`arrow` (in :mod:`conveyor.pipeline.tables`, importable from here)
  read numeric columns of a Parquet or Arrow IPC file one row group / record batch at a time
  (PyArrow, extra ``parquet``);
- :func:`iterate` takes any iterable of arrays (chunks along axis 0), read once, in order;
- outputs (ndarrays, ``"y.npy"``, ``npy_out``, ``raw_out``) are sinks, in
  :mod:`conveyor.pipeline.sinks`: files are written into a temporary file renamed over the
  target only once the whole stream has succeeded.

Every check that can fail (a file whose size does not match its header, a missing column, an
output folder that cannot be written) runs when the source or sink is made, so a stream fails
before any memory is allocated, with an :class:`InputError` that says what to change.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from conveyor.errors import InputError

if TYPE_CHECKING:
    from conveyor.pipeline.tables import ChunkedSource as ChunkedSource
    from conveyor.pipeline.tables import arrow as arrow
    from conveyor.pipeline.tables import parquet as parquet

PathLike = str | os.PathLike[str]


# -- sources ---------------------------------------------------------------------------------
class Source:
    """One input: ``shape`` (rows first) and ``dtype``, and rows on request.

    The engine calls :meth:`rows` from its own thread in block order (``lo`` never goes back by
    more than the halo); the result is an ndarray or a :class:`FileRows`, which the staging
    threads copy into the pinned slot in pieces.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    name: str

    @property
    def nbytes(self) -> int:
        """Bytes of the whole input."""
        return math.prod(self.shape) * self.dtype.itemsize

    def rows(self, lo: int, hi: int) -> np.ndarray | FileRows:
        """Rows ``lo:hi``, for a staging copy."""
        raise NotImplementedError

    def close(self) -> None:
        """Release open files (a stream calls it when it ends)."""


class ArraySource(Source):
    """An ndarray (or memmap) input; ``array`` is used as is by the zero-copy paths."""

    def __init__(self, array: np.ndarray, name: str = "array") -> None:
        self.array = array
        self.shape = tuple(int(s) for s in array.shape)
        self.dtype = array.dtype
        self.name = name

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """A view of rows ``lo:hi``."""
        return self.array[lo:hi]


class FileSource(Source):
    """A C-ordered array stored at byte ``offset`` of a file (``.npy`` or raw binary)."""

    def __init__(self, path: PathLike, dtype: Any, shape: Sequence[int], offset: int) -> None:
        self.path = Path(path)
        self.name = str(path)
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(s) for s in shape)
        self.offset = offset
        self.row_bytes = math.prod(self.shape[1:]) * self.dtype.itemsize
        self._fd: int | None = None
        self._lock = threading.Lock()

    def rows(self, lo: int, hi: int) -> FileRows:
        """Rows ``lo:hi``, read when a staging thread copies them."""
        return FileRows(self, lo, hi)

    def read_into(self, dst: np.ndarray, lo: int) -> None:
        """Read ``len(dst)`` rows from row ``lo`` straight into ``dst`` (C-contiguous)."""
        view = memoryview(dst.data).cast("B")
        position = self.offset + lo * self.row_bytes
        done = 0
        while done < len(view):
            got = os.preadv(self._file(), [view[done:]], position + done)
            if got == 0:
                raise InputError(f"{self.name} got shorter while it was read: rerun on a "
                                 f"complete file")
            done += got

    def _file(self) -> int:
        with self._lock:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY)
            return self._fd

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class FileRows:
    """Rows ``lo:hi`` of a file source or sink; slicing gives sub-ranges (the staging pieces).

    ``file`` has ``shape`` and ``dtype`` and ``read_into(dst, lo)`` (a source) or
    ``write_from(src, lo)`` (a sink)."""

    __slots__ = ("file", "lo", "hi")

    def __init__(self, file: Any, lo: int, hi: int) -> None:
        self.file = file
        self.lo = lo
        self.hi = hi

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of these rows."""
        return (self.hi - self.lo, *self.file.shape[1:])

    @property
    def ndim(self) -> int:
        """Dimensions of these rows."""
        return len(self.file.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of these rows."""
        return math.prod(self.shape) * self.file.dtype.itemsize

    def __getitem__(self, rows: slice) -> FileRows:
        start, stop, _ = rows.indices(self.hi - self.lo)
        return FileRows(self.file, self.lo + start, self.lo + stop)

    def read_into(self, dst: np.ndarray) -> None:
        """Read these rows (of a source) into ``dst``."""
        if dst.shape != self.shape:
            raise ValueError(f"rows of shape {self.shape} do not fit into {dst.shape}")
        self.file.read_into(dst, self.lo)

    def write_from(self, src: np.ndarray) -> None:
        """Write ``src`` into these rows (of a sink)."""
        if src.shape != self.shape:
            raise ValueError(f"rows of shape {src.shape} do not fit into {self.shape}")
        self.file.write_from(src, self.lo)


class IterSource(Source):
    """Chunks of an iterable along axis 0, read once, in order. ``length`` (total rows) is
    required up front, because the plan is made before the first block; the first chunk gives
    the dtype and row shape. Rows are held only while a block (with its halo) needs them."""

    def __init__(self, chunks: Iterable[Any], length: int) -> None:
        if length < 0:
            raise InputError(f"iterate(length={length}): give the total rows, 0 or more")
        self.name = f"iterable of {type(chunks).__name__}"
        self._chunks: Iterator[Any] = iter(chunks)
        first = self._next() if length else None
        if first is None and length:
            raise InputError(f"{self.name} is empty but length={length}: pass the real length")
        template = first if first is not None else np.empty(0, np.float32)
        self.dtype = template.dtype
        self.shape = (length, *template.shape[1:])
        self._held = template if first is not None else template[:0]
        self._held_start = 0

    def _next(self) -> np.ndarray | None:
        try:
            chunk = next(self._chunks)
        except StopIteration:
            return None
        array = np.asarray(chunk)
        if array.ndim == 0 or array.dtype.hasobject:
            raise InputError(f"{self.name} yielded {array.dtype} of shape {array.shape}: yield "
                             f"numeric arrays, cut along axis 0")
        if hasattr(self, "shape") and (array.dtype != self.dtype
                                       or array.shape[1:] != self.shape[1:]):
            raise InputError(
                f"{self.name} yielded a chunk of {array.dtype} rows {array.shape[1:]} after "
                f"{self.dtype} rows {self.shape[1:]}: every chunk must match the first"
            )
        return array

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo:hi``; ``lo`` must not go back before rows already let go of."""
        start = self._held_start
        if lo < start:
            raise InputError(f"{self.name} is read once, in order: rows {lo}: are gone")
        if hi <= start + len(self._held):
            return self._held[lo - start : hi - start]
        # Let go of the rows before lo, then take chunks until hi is covered.
        pieces = [self._held[lo - start :]]
        have = len(pieces[0])
        while lo + have < hi:
            chunk = self._next()
            if chunk is None:
                raise InputError(f"{self.name} ended after {lo + have} rows but length="
                                 f"{self.shape[0]}: pass the real length")
            pieces.append(chunk)
            have += len(chunk)
        self._held = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        self._held_start = lo
        return self._held[: hi - lo]


def npy(path: PathLike) -> FileSource:
    """A ``.npy`` file as an input, read block by block; InputError if its size does not match
    its header, it is Fortran-ordered, or it holds Python objects."""
    target = _existing(path)
    try:
        with open(target, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            offset = f.tell()
    except (ValueError, OSError, SyntaxError) as exc:
        raise InputError(f"{path} is not a .npy file ({exc}): write it with np.save") from exc
    if dtype.hasobject:
        raise InputError(f"{path} holds Python objects ({dtype}): save a numeric array")
    if fortran and len(shape) > 1:
        raise InputError(f"{path} is Fortran-ordered: save np.ascontiguousarray(a) instead")
    if not shape:
        raise InputError(f"{path} holds a scalar: inputs must be arrays")
    if any(d < 0 for d in shape):
        raise InputError(f"{path} has a header with a negative shape {shape}: the file is "
                         f"damaged; write it again with np.save")
    _check_size(target, offset, shape, dtype, "its header says")
    return FileSource(target, dtype, shape, offset)


def raw(path: PathLike, dtype: Any, shape: Sequence[int] | None = None,
        offset: int = 0) -> FileSource:
    """A headerless binary file of C-ordered ``dtype`` values as an input. ``shape`` may give
    -1 for axis 0 (or be None for 1-D): the rows then follow from the file's size."""
    target = _existing(path)
    dt = np.dtype(dtype)
    if dt.hasobject or dt.itemsize == 0:
        raise InputError(f"raw input {path}: dtype {dt} is not a numeric dtype")
    size = target.stat().st_size - offset
    dims = list(shape) if shape is not None else [-1]
    if not dims or dims[0] < -1 or any(d < 0 for d in dims[1:]):
        raise InputError(f"raw input {path}: shape {shape} may have -1 only for axis 0")
    row_bytes = math.prod(dims[1:]) * dt.itemsize
    if dims[0] < 0:
        if row_bytes == 0 or size % row_bytes:
            raise InputError(f"raw input {path}: {size} bytes is not a whole number of "
                             f"{row_bytes}-byte rows ({dt}, rows {tuple(dims[1:])}): check "
                             f"--dtype and --shape")
        dims[0] = size // row_bytes
    _check_size(target, offset, tuple(dims), dt, "--dtype/--shape say")
    return FileSource(target, dt, dims, offset)


def iterate(chunks: Iterable[Any], length: int) -> IterSource:
    """Any iterable of arrays (chunks along axis 0, any sizes) as an input of ``length`` rows
    in all. It is read once, in order; the first chunk is read now for the dtype."""
    return IterSource(chunks, length)


def as_source(value: Any, index: int) -> Source:
    """Input ``index`` as a Source: a path (``.npy``), a Source, or an array."""
    if isinstance(value, Source):
        return value
    from conveyor.pipeline.image import ImageInput

    if isinstance(value, ImageInput):  # cv.image(...): pipeline/image.py
        return value.source(index)
    if isinstance(value, str | os.PathLike):
        if Path(value).suffix.lower() != ".npy":
            raise InputError(f"input {index} {value}: a path must name a .npy file; use "
                             f"cv.raw(), cv.parquet() or cv.arrow() for other files")
        return npy(value)
    from conveyor.pipeline import validate

    return ArraySource(validate.as_input(value, index), f"input {index}")


# -- helpers ---------------------------------------------------------------------------------
def _existing(path: PathLike) -> Path:
    target = Path(path)
    if not target.is_file():
        raise InputError(f"input file {path} does not exist or is not a file: check the path")
    return target


def _check_size(path: Path, offset: int, shape: Sequence[int], dtype: np.dtype,
                says: str) -> None:
    expected = offset + math.prod(shape) * dtype.itemsize
    size = path.stat().st_size
    if size != expected:
        what = "truncated" if size < expected else "longer than it should be"
        raise InputError(
            f"{path} is {what}: {says} {tuple(shape)} {dtype} ({expected} bytes with the "
            f"header) but it has {size} bytes: rewrite the file or fix its shape"
        )


def __getattr__(name: str) -> Any:
    # Parquet and Arrow inputs live in pipeline/tables.py; their names stay importable here.
    if name in ("ChunkedSource", "arrow", "parquet"):
        from conveyor.pipeline import tables

        return getattr(tables, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
