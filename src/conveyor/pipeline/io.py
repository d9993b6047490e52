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
- :func:`iterate` (in :mod:`conveyor.pipeline.chunks`, importable from here) takes any
  iterable of arrays (chunks along axis 0), read once, in order (a chunk may be a buffer the
  iterable fills again for the next one);
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
import stat
import threading
import tokenize
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from conveyor import config, files
from conveyor.errors import InputError
from conveyor.pipeline.options import _whole

if TYPE_CHECKING:
    from conveyor.pipeline.chunks import IterSource as IterSource
    from conveyor.pipeline.chunks import iterate as iterate
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
    #: Halo rows given beside this input (``halo.rows_around``): the rows before its first
    #: row and after its last where it is a window of a larger array (conveyor.dask streams
    #: a chunk's or a worker's rows with their neighbours' real rows), None at an end that is
    #: the whole array's (the stream's ``boundary=`` pads it).
    beside: tuple[np.ndarray | None, np.ndarray | None] = (None, None)

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


class BoolChecked(Source):
    """A bool input that a kernel reads through a ``bool`` pointer, checked block by block
    for bytes other than 0 and 1 as its rows are read (a file, an iterable: see
    ``validate.guard_bools``; an array is checked whole before the stream). Its rows are
    read on the stream's thread, as a cast input's are."""

    def __init__(self, inner: Source, what: str) -> None:
        self.inner = inner
        self.shape = inner.shape
        self.dtype = inner.dtype
        self.name = inner.name
        self.beside = inner.beside  # a window's halo rows (its neighbours check them)
        self.what = what

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo:hi`` of the inner source, read and checked."""
        rows = self.inner.rows(lo, hi)
        if isinstance(rows, FileRows):
            held = np.empty(rows.shape, self.dtype)
            rows.read_into(held)
        else:
            held = np.ascontiguousarray(rows)
        wrong = held.view(np.uint8) > 1
        if wrong.any():
            row = lo + int(np.argmax(wrong.reshape(-1))) // max(
                math.prod(held.shape[1:]) * self.dtype.itemsize, 1)
            raise InputError(
                f"{self.what} ({self.name}) is bool data holding a byte other than 0 and 1 "
                f"(row {row}), which NumPy reads as True but a kernel's bool load may not: "
                f"write it as NumPy's own bools (np.not_equal(a.view(np.uint8), 0)), or read "
                f"it as uint8 and declare the parameter uchar*")
        return held

    def close(self) -> None:
        """Close the inner source."""
        self.inner.close()


class FileSource(Source):
    """A C-ordered array stored at byte ``offset`` of a file (``.npy`` or raw binary).

    One object may feed several streams at once, in several threads (and the devices of one
    stream): every read holds the file descriptor it uses, and ``close()`` (at the end of each
    stream) closes it only once no read holds it; the next read opens the file again. A
    descriptor closed under a read failed with EBADF, or read another file's bytes once its
    number had been reused by another ``open``.
    """

    def __init__(self, path: PathLike, dtype: Any, shape: Sequence[int], offset: int,
                 header: bytes = b"", size: int | None = None) -> None:
        # Absolute now: each stream opens the file again by path, and a relative one read
        # another folder's file after os.chdir (same size and header: wrong values).
        # Not os.path.abspath: it drops "link/.." as text, where the OS follows the link first.
        self.path = Path(files.joined(path))
        self.name = str(path)
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(s) for s in shape)
        self.offset = offset
        self.row_bytes = math.prod(self.shape[1:]) * self.dtype.itemsize
        # What the shape and dtype were read from: the file's size and its first bytes (a
        # .npy's header). Each stream opens the file again by path; one rewritten meanwhile
        # (np.save of another dtype, a shorter file) was read with the old header: garbage.
        # ``size`` and ``header`` may be given by whoever read them (a Dask client, whose
        # workers open the file later): a file replaced meanwhile is then refused too.
        self._size = os.stat(self.path).st_size if size is None else size
        self._header = header
        self._fd: int | None = None
        # (size, mtime) of the open file, as it was when opened: a read that finds them
        # changed read a file being rewritten (see _check_not_rewritten).
        self._stamp: tuple[int, int] = (-1, -1)
        self._readers = 0  # reads that hold _fd now
        # Streams that began on _fd and have not finished: the file stays open (and its stamp
        # stands) until the last, though another stream's close() came first.
        self._streams: set[object] = set()
        self._in_place: set[object] = set()  # of those, streams whose outputs map the file
        self._closing = False  # close() was called while reads or streams held _fd
        self._lock = threading.Lock()

    @property
    def is_npy(self) -> bool:
        """Whether the file is a ``.npy`` (it has a header), not raw binary."""
        return bool(self._header)

    def rows(self, lo: int, hi: int) -> FileRows:
        """Rows ``lo:hi``, read when a staging thread copies them."""
        return FileRows(self, lo, hi)

    def read_into(self, dst: np.ndarray, lo: int) -> None:
        """Read ``len(dst)`` rows from row ``lo`` straight into ``dst`` (C-contiguous)."""
        view = byte_view(dst)
        position = self.offset + lo * self.row_bytes
        fd = self._hold()
        try:
            done = 0
            while done < len(view):
                got = os.preadv(fd, [view[done:]], position + done)
                if got == 0:
                    raise InputError(f"{self.name} got shorter while it was read: rerun on a "
                                     f"complete file")
                done += got
            self._check_not_rewritten(fd)
        finally:
            self._let_go()

    def begin(self, stream: object) -> None:
        """Open the file as ``stream`` begins, so its size and time are stamped before any
        input is read: stamped at the first read, a rewrite made before it (by another
        input's reader, a few blocks ahead) went unseen. The file stays open, and the stamp
        stands, until ``stream`` calls :meth:`finish`: closed when another stream of this
        source ended, it was opened again by this one's next read and stamped anew, so a
        rewrite between the two went unseen."""
        fd = self._hold()
        try:
            with self._lock:
                if self._streams and self._replaced(fd):
                    raise InputError(
                        f"{self.name} was replaced by another file while another stream of "
                        f"this input reads the old one: make the input again (cv.npy / "
                        f"cv.raw) to read the new file, or wait for that stream to end")
                if self._in_place and stream not in self._streams:
                    raise InputError(
                        f"{self.name} is written in place by another stream now (a memmap of "
                        f"it as that stream's output): its rows change under this one; "
                        f"stream it once that stream has ended")
                self._streams.add(stream)
        finally:
            self._let_go()

    def _replaced(self, fd: int) -> bool:
        """Whether the path names another file than the open descriptor (``os.replace``
        of a new ``.npy`` over it since it was opened)."""
        try:
            now = os.stat(self.path)
        except OSError:
            return True
        held = os.fstat(fd)
        return (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino)

    def file_id(self) -> tuple[int, int]:
        """(device, inode) of the file this source reads (its open descriptor's, once
        begun)."""
        with self._lock:
            fd = self._fd
        st = os.fstat(fd) if fd is not None else os.stat(self.path)
        return st.st_dev, st.st_ino

    def writes_in_place(self, stream: object) -> None:
        """``stream`` (begun) writes this file through a shared writable map of its own (a
        memmap of the input as its output): the changes it makes are let pass. InputError
        while another stream reads it: that stream's rows would change under it (a rewrite
        it must see), and the two cannot be told apart."""
        with self._lock:
            if self._streams - {stream}:
                raise InputError(
                    f"{self.name} is read by another stream now, and this one writes it in "
                    f"place (a memmap of it as an output): the other's rows would change "
                    f"under it; run the in-place stream once the other has ended")
            self._in_place.add(stream)

    def finish(self, stream: object) -> None:
        """``stream`` (of :meth:`begin`) has ended: the file closes once nothing else holds
        it and :meth:`close` was called."""
        with self._lock:
            self._streams.discard(stream)
            self._in_place.discard(stream)
            self._close_if_done()

    def _check_not_rewritten(self, fd: int) -> None:
        """InputError if the open file's size or modification time is not what it was when it
        was opened: another program wrote or truncated it while this stream read it, so the
        rows read may mix its old and new contents. ``np.save`` over the input mid-stream, or
        a truncate that grew back, gave a mix of old rows, new rows and zeros, with no error.
        A change made through a shared writable mapping of this process is let pass while a
        stream writes the file in place (:meth:`writes_in_place`: a memmap of the input as
        its output, which writes rows only after they were read), and only then: a map held
        elsewhere in the process (``np.load(p, mmap_mode="r+")`` kept by the caller) hid
        another program's rewrite."""
        st = os.fstat(fd)
        if (st.st_size, st.st_mtime_ns) == self._stamp or (self._in_place
                                                           and _mapped_writable(st)):
            return
        if st.st_size < self._stamp[0]:
            # Shorter than stamped: said as a read past the new end says it (which of the
            # two a truncate meets first depends on which block's read it lands between).
            raise InputError(f"{self.name} got shorter while it was read: rerun on a "
                             f"complete file")
        raise InputError(f"{self.name} changed while it was read (written or truncated by "
                         f"another program: now {st.st_size} bytes): the rows read may mix "
                         f"its old and new contents; rerun once nothing writes the file, or "
                         f"stream a copy of it")

    def _hold(self) -> int:
        """The open file, held by one read until :meth:`_let_go` (opened if it is not)."""
        with self._lock:
            if self._fd is None:
                try:
                    fd = open_regular(self.path, self.name)
                except OSError as exc:
                    files.raise_if_too_many_open(exc, self.name)
                    raise
                try:
                    self._check_unchanged(fd)
                except BaseException:
                    os.close(fd)
                    raise
                st = os.fstat(fd)
                self._stamp = (st.st_size, st.st_mtime_ns)
                self._fd = fd
                self._closing = False
            self._readers += 1
            return self._fd

    def _check_unchanged(self, fd: int) -> None:
        """InputError unless the file just opened has the size and first bytes it had when
        this source read its shape and dtype."""
        size = os.fstat(fd).st_size
        header = os.pread(fd, len(self._header), 0) if self._header else b""
        if size != self._size or header != self._header:
            what = "its header" if header != self._header else f"its size ({size} bytes)"
            raise InputError(f"{self.name} changed since this input was made from it ({what} "
                             f"differs): make the input again (cv.npy / cv.raw, or pass the "
                             f"path) to read the file as it is now")

    def _let_go(self) -> None:
        with self._lock:
            self._readers -= 1
            self._close_if_done()

    def close(self) -> None:
        """Close the file: now, or after the last read and the last begun stream that hold
        it (another stream's)."""
        with self._lock:
            self._closing = True
            self._close_if_done()

    def _close_if_done(self) -> None:
        # With the lock held.
        if self._closing and not self._readers and not self._streams:
            self._close_fd()

    def _close_fd(self) -> None:
        # With the lock held.
        fd, self._fd, self._closing = self._fd, None, False
        if fd is not None:
            os.close(fd)


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


#: The longest .npy header read (NumPy's own default is 10,000 bytes).
_MAX_HEADER = 1 << 20


def npy(path: PathLike) -> FileSource:
    """A ``.npy`` file as an input, read block by block; InputError if its size does not match
    its header, it is Fortran-ordered, or it holds Python objects."""
    target = _existing(path)
    try:
        with os.fdopen(open_regular(target, f"input file {target}"), "rb") as f:
            version = np.lib.format.read_magic(f)
            if version not in ((1, 0), (2, 0), (3, 0)):
                raise ValueError(f"format version {version[0]}.{version[1]}; NumPy writes "
                                 f"1.0 to 3.0")
            _check_header_length(f, version, target)
            # np.save writes headers past NumPy's default 10,000-byte limit for records of
            # many fields (800: "adjust max_header_size or allow_pickle", neither of which
            # cv.npy takes); the header's length is checked against the file's above.
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(
                    f, max_header_size=_MAX_HEADER)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(
                    f, max_header_size=_MAX_HEADER)
            else:  # 3.0 is 2.0 in UTF-8: the 2.0 reader's Latin-1 mangled field names
                shape, fortran, dtype = _read_header_3_0(f)
            offset = f.tell()
            f.seek(0)
            header = f.read(offset)
    except InputError:  # the path is no longer a regular file (open_regular)
        raise
    except (ValueError, OSError, SyntaxError, tokenize.TokenError, RecursionError) as exc:
        # TokenError: a header cut short ("{'descr': '<f4', 'fortran_or"), which NumPy
        # tokenizes before it parses.
        raise InputError(f"{path} is not a .npy file ({exc}): write it with np.save") from exc
    if dtype.hasobject:
        raise InputError(f"{path} holds Python objects ({dtype}): save a numeric array")
    if dtype.subdtype is not None:
        # A sub-array dtype ('<f4', (2,)), which np.save never writes (it writes shape (5, 2)
        # of '<f4'): its bytes are rows of that many elements. The rows came out of the
        # staging copy as (5,) against (5, 2): a bare ValueError mid-stream.
        base, inner = dtype.subdtype
        shape, dtype = (*shape, *inner), base
    # Fortran order is C order for a shape with at most one axis longer than 1 ((N, 1): the
    # same bytes either way), so only other shapes are refused.
    if fortran and sum(d > 1 for d in shape) > 1:
        raise InputError(f"{path} is Fortran-ordered: save np.ascontiguousarray(a) instead")
    if not shape:
        raise InputError(f"{path} holds a scalar: inputs must be arrays")
    if any(d < 0 for d in shape):
        raise InputError(f"{path} has a header with a negative shape {shape}: the file is "
                         f"damaged; write it again with np.save")
    _check_dims(path, shape, "its header's shape", dtype)
    _check_size(target, offset, shape, dtype, "its header says")
    return FileSource(target, dtype, shape, offset, header)


def raw(path: PathLike, dtype: Any, shape: Sequence[int] | int | None = None,
        offset: int = 0) -> FileSource:
    """A headerless binary file of C-ordered ``dtype`` values as an input, from byte
    ``offset``. ``shape`` may give -1 for axis 0 (or be None for 1-D): the rows then follow
    from the file's size. Shape entries and the offset are whole numbers (an integral float
    such as ``3.0`` is taken as meant); anything else, an offset past the file's end, or a
    size that does not match is an InputError, before any work."""
    return raw_source(path, dtype, shape, offset, names=("dtype=", "shape="))


def raw_source(path: PathLike, dtype: Any, shape: Sequence[int] | int | None, offset: int,
               names: tuple[str, str]) -> FileSource:
    """:func:`raw`, whose messages call its dtype and shape ``names`` (the command line's
    ``("--dtype", "--shape")``, the API's ``("dtype=", "shape=")``)."""
    target = _existing(path)
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError):  # NumPy parses strings: "f4,(" is a SyntaxError
        raise InputError(f"raw input {path}: {names[0]} {dtype!r} is not a NumPy dtype: give "
                         f"a numeric dtype, e.g. float32") from None
    sub: tuple[int, ...] = ()
    if dt.subdtype is not None:  # rows of its elements, as raw_out writes a sub-array dtype
        dt, sub = dt.subdtype[0], tuple(dt.subdtype[1])
    if dt.hasobject or dt.itemsize == 0 or (dt.kind not in "biufc" and not dt.names):
        # not text, dates or objects; records are read as raw_out writes them
        raise InputError(f"raw input {path}: dtype {dt} is not a numeric dtype: give "
                         f"{names[0]} a numeric or record dtype, e.g. float32")
    file_size = target.stat().st_size
    if not file_size and _holds_bytes(target):
        raise InputError(f"raw input {path} says it has 0 bytes but holds data (a /proc, /sys "
                         f"or FUSE file, whose size is not its length): copy it to a regular "
                         f"file and pass that")
    start = _whole(offset)
    if start is None:
        raise InputError(f"raw input {path}: offset={offset!r} is not a whole number: give "
                         f"the byte where the data starts, from 0 to {file_size}")
    if not 0 <= start <= file_size:
        where = "is negative" if start < 0 else "lies past its end"
        raise InputError(f"raw input {path} has {file_size} bytes and offset={offset!r} "
                         f"{where}: give the byte where the data starts, from 0 to "
                         f"{file_size}")
    dims = _raw_dims(path, shape) + list(sub)
    _check_dims(path, dims, names[1], dt)
    size = file_size - start
    row_bytes = math.prod(dims[1:]) * dt.itemsize
    after = f" after offset={start}" if start else ""
    if dims[0] < 0:
        if row_bytes == 0 or size % row_bytes:
            raise InputError(f"raw input {path}: {size} bytes{after} is not a whole number of "
                             f"{row_bytes}-byte rows ({dt}, rows {tuple(dims[1:])}): check "
                             f"{names[0]} and {names[1]}")
        dims[0] = size // row_bytes
    _check_size(target, start, tuple(dims), dt, f"{names[0]}/{names[1]} say",
                f"with offset={start}" if start else "in all")
    return FileSource(target, dt, dims, start)


def _raw_dims(path: PathLike, shape: Any) -> list[int]:
    """``shape`` of a raw input as a list of ints. An integral float is taken as meant; ``2.5``
    is refused (truncated, it read fewer values than the file holds, with no error)."""
    if shape is None:
        return [-1]
    given: list[Any] | None = None
    config.check_ordered(shape, f"raw input {path}")
    if _whole(shape) is not None:
        given = [shape]  # one number: 1-D
    elif not isinstance(shape, str | bytes):
        try:
            given = list(shape)
        except TypeError:
            pass
    if given is None:
        raise InputError(f"raw input {path}: shape={shape!r} is not a shape: give a tuple of "
                         f"whole numbers, e.g. (-1, 3)")
    dims = []
    for entry in given:
        dim = _whole(entry)
        if dim is None:
            raise InputError(f"raw input {path}: shape {shape!r} has {entry!r}, not a whole "
                             f"number: give whole numbers, e.g. (-1, 3)")
        dims.append(dim)
    if not dims or dims[0] < -1 or any(d < 0 for d in dims[1:]):
        raise InputError(f"raw input {path}: shape {shape} may have -1 only for axis 0")
    return dims


def as_source(value: Any, index: int) -> Source:
    """Input ``index`` as a Source: a path (``.npy``), a Source, or an array."""
    if isinstance(value, Source):
        return value
    from conveyor.pipeline.image import ImageInput

    if isinstance(value, ImageInput):  # cv.image(...): pipeline/image.py
        return value.source(index)
    if isinstance(value, str | os.PathLike):
        # Checked first: a path-like of bytes was pathlib's own TypeError.
        if Path(files.path_text(value, f"input {index}")).suffix.lower() != ".npy":
            raise InputError(f"input {index} {value}: a path must name a .npy file; use "
                             f"cv.raw(), cv.parquet() or cv.arrow() for other files")
        return npy(value)
    from conveyor.pipeline import validate

    return ArraySource(validate.as_input(value, index), f"input {index}")


# -- helpers ---------------------------------------------------------------------------------
def byte_view(array: np.ndarray) -> memoryview:
    """The bytes of C-contiguous ``array``, of any dtype (``memoryview(a.data)`` refused
    datetimes: "cannot include dtype 'M' in a buffer", mid-stream)."""
    return memoryview(array.reshape(-1).view(np.uint8))  # type: ignore[arg-type]


def _existing(path: PathLike) -> Path:
    """``path`` as a Path; InputError, before any work, unless it is a regular file this
    process may read (an unreadable one failed mid-stream, after the kernel was built)."""
    from conveyor.files import path_text

    target = Path(path_text(path, "an input"))
    try:
        is_file = target.is_file()
    except OSError as exc:  # a name too long for the file system
        raise InputError(f"input file {target}: {exc.strerror}: check the path") from None
    if not is_file:
        raise InputError(f"input file {target} does not exist or is not a file: check the "
                         f"path")
    try:
        os.close(open_regular(target, f"input file {target}"))
    except OSError as exc:
        from conveyor.files import raise_if_too_many_open

        raise_if_too_many_open(exc, f"input file {target}")  # not the file's permissions
        raise InputError(f"cannot read input file {target} ({exc.strerror}): check its "
                         f"permissions") from None
    return target


def _read_header_3_0(f: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    """A format 3.0 header (NumPy writes it for field names outside Latin-1): as
    ``read_array_header_2_0``, with the text read as UTF-8."""
    import ast
    import struct

    (length,) = struct.unpack("<I", f.read(4))
    text = f.read(length).decode("utf-8")
    found = ast.literal_eval(text)
    if not isinstance(found, dict) or set(found) != {"descr", "fortran_order", "shape"}:
        raise ValueError(f"header is not a dict of descr, fortran_order and shape: {text!r}")
    shape, fortran = found["shape"], found["fortran_order"]
    if not isinstance(shape, tuple) or not all(isinstance(d, int) for d in shape) \
            or not isinstance(fortran, bool):
        raise ValueError(f"header's shape or fortran_order is not valid: {text!r}")
    try:
        dtype = np.lib.format.descr_to_dtype(found["descr"])
    except (TypeError, ValueError, SyntaxError) as exc:  # a descr that is no dtype: 5
        raise ValueError(f"descr {found['descr']!r} is not a dtype ({exc})") from None
    return shape, fortran, dtype


def open_regular(path: PathLike, name: str) -> int:
    """A descriptor of ``path`` opened for reading, if it is a regular file still; InputError
    naming ``name`` if it is not (a FIFO or a device put in its place after its check: an
    open of a FIFO waits for a writer, forever). Opened without waiting (``O_NONBLOCK``,
    which regular files' reads ignore)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(f"{name} is no longer a regular file (a pipe or a device took its "
                         f"place): give a file")
    return fd


def _holds_bytes(path: Path) -> bool:
    """Whether ``path`` yields a byte when read (whatever its size says)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return bool(os.pread(fd, 1, 0))
    except OSError:
        return False
    finally:
        os.close(fd)


def _check_header_length(f: Any, version: tuple[int, int], target: Path) -> None:
    """ValueError if the header length a ``.npy`` file's magic is followed by runs past the
    file's end. NumPy reads that many bytes before looking: a damaged or hostile v2/v3 header
    claiming 4 GiB made it allocate them (a bare MemoryError under a memory limit)."""
    at = f.tell()
    width = 2 if version == (1, 0) else 4
    field = f.read(width)
    f.seek(at)
    if len(field) < width:
        return  # NumPy says the file ends in the header length
    length = int.from_bytes(field, "little")
    size = os.fstat(f.fileno()).st_size
    if at + width + length > size:
        raise ValueError(f"its header length field says {length} bytes, past the file's end "
                         f"at {size} bytes")
    if length > _MAX_HEADER:  # (NumPy's own words advise options cv.npy does not take)
        raise InputError(f"{target}: its .npy header is {length} bytes, more than the "
                         f"{_MAX_HEADER} conveyor reads (a record of tens of thousands of "
                         f"fields): save fewer fields per file, or the fields as columns of "
                         f"one numeric array")


def _mapped_writable(st: os.stat_result) -> bool:
    """True if this process maps the file ``st`` describes shared and writable (a
    ``np.memmap(mode="r+")``): its writes change the file's modification time. False where
    ``/proc/self/maps`` cannot be read. Matched by inode alone: an overlay file system shows
    the lower device there, not ``st_dev`` (a match on another device's file only lets a
    change pass, as before this check existed)."""
    inode = str(st.st_ino).encode()
    try:
        with open("/proc/self/maps", "rb") as maps:  # bytes: a name need not be UTF-8
            for line in maps:
                fields = line.split(None, 5)
                if (len(fields) >= 5 and fields[4] == inode
                        and fields[1][1:2] == b"w" and fields[1][3:4] == b"s"):
                    return True
    except OSError:
        return False
    return False


def _check_dims(path: PathLike, shape: Sequence[int], what: str,
                dtype: np.dtype | None = None) -> None:
    """InputError for a dimension past 2**63 - 1: no array has one (NumPy's shapes are
    64-bit), and a file with no bytes per row (a 0 in its shape) matched any such count.
    With ``dtype``, also for a shape whose non-zero dimensions' bytes pass 2**63 - 1, which
    NumPy refuses even for an empty array ("array is too big", from deep in the stream)."""
    if any(d > _MAX_DIM for d in shape):
        raise InputError(f"{path}: {what} {tuple(shape)} has a dimension past 2**63 - 1, "
                         f"which no array has: fix the shape")
    if dtype is not None and math.prod(d for d in shape if d > 0) * dtype.itemsize > _MAX_DIM:
        raise InputError(f"{path}: {what} {tuple(shape)} of {dtype} spans more than 2**63 - 1 "
                         f"bytes without its zero dimensions, which NumPy cannot shape: fix "
                         f"the shape")


_MAX_DIM = 2**63 - 1


def _check_size(path: Path, offset: int, shape: Sequence[int], dtype: np.dtype,
                says: str, counted: str = "with the header") -> None:
    expected = offset + math.prod(shape) * dtype.itemsize
    size = path.stat().st_size
    if size != expected:
        what = "truncated" if size < expected else "longer than it should be"
        raise InputError(
            f"{path} is {what}: {says} {tuple(shape)} {dtype} ({expected} bytes {counted}) but "
            f"it has {size} bytes: rewrite the file or fix its shape"
        )


def __getattr__(name: str) -> Any:
    # Parquet and Arrow inputs live in pipeline/tables.py; their names stay importable here.
    if name in ("ChunkedSource", "arrow", "parquet"):
        from conveyor.pipeline import tables

        return getattr(tables, name)
    # Iterable inputs live in pipeline/chunks.py; their names stay importable here.
    if name in ("IterSource", "iterate"):
        from conveyor.pipeline import chunks

        return getattr(chunks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
