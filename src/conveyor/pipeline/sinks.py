"""Sinks: where a stream's output rows go (see :mod:`conveyor.pipeline.io` for sources).

An ndarray output becomes an :class:`ArraySink`; ``"y.npy"``, :func:`npy_out` and
:func:`raw_out` a :class:`FileSink`, written block by block into a temporary file in the
target's folder and renamed over the target only once the whole stream has succeeded, so a
failed or interrupted run leaves no partial or corrupt output. The file replaced keeps its
mode; a symlink is written through; a FIFO or device node is refused; the temporary file of a
killed run is removed by the next run of the same target (:mod:`conveyor.files`).
"""

from __future__ import annotations

import contextlib
import copy
import errno
import math
import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from conveyor import config, files
from conveyor.errors import InputError, advised
from conveyor.interrupts import deferred_sigint
from conveyor.pipeline.io import FileRows, PathLike, byte_view


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

    def prepare(self) -> None:
        """Every row is written: all that may fail before ``commit`` (a file's flush and
        checks), so that a stream commits its outputs only once each is ready."""

    def commit(self) -> None:
        """Every row is written: make the output visible."""

    def abort(self) -> None:
        """The stream failed: leave nothing behind."""


class ArraySink(Sink):
    """An ndarray output (the caller's, or a new one for a dtype)."""

    def __init__(self, array: np.ndarray, name: str = "array", *,
                 allocated: bool = False, given: np.ndarray | None = None) -> None:
        self.array = array
        self.allocated = allocated  # made by conveyor for a dtype: new in every stream
        # The caller's object where ``array`` is a plain view of it (a subclass: see
        # validate.plain): what report.outputs holds.
        self._given = given
        self.shape = tuple(int(s) for s in array.shape)
        self.dtype = array.dtype
        self.name = name

    @property
    def result(self) -> np.ndarray:
        """The array (the caller's own object)."""
        return self.array if self._given is None else self._given

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """A view of rows ``lo:hi``."""
        return self.array[lo:hi]


class FileSink(Sink):
    """A ``.npy`` (``header=True``) or raw output file, written into a temporary file in the
    same folder and renamed over ``path`` by :meth:`commit`. ``shape``/``dtype`` may be left
    None and are then filled in by the stream (rows of input 0; the kernel's output type)."""

    def __init__(self, path: PathLike, dtype: Any = None, shape: Sequence[int] | None = None,
                 *, header: bool = True, durable: bool = True) -> None:
        text = files.path_text(path, "an output")
        if not text.strip():
            raise InputError(f"an output got {text!r} as its path: name a file, e.g. "
                             f"'out.npy'")
        self.path = Path(text)
        self.name = str(path)
        # What the name meant when it was given (joined, not normalised: "link/.." is the
        # link's parent to the OS, not this folder).
        self._absolute = files.joined(text)
        self.header = header
        self.durable = durable
        self.dtype = _out_dtype(self.name, dtype)  # type: ignore[assignment]
        self.shape = _out_shape(self.name, shape) if shape is not None else ()
        self._given_shape = shape is not None
        self.dtype_hint = ""  # set by resolve() where the stream chose the dtype
        self.offset = 0
        self._fd: int | None = None
        self._tmp: Path | None = None
        # The part's folder, held open: a folder moved during the stream (``mv results
        # results.old``) took the part with it, where abort()'s unlink by path never found it.
        self._dir_fd: int | None = None
        self._ready = False  # prepare() done: commit() only renames
        # The file replaced at commit: a symlink's target (written through), never a node.
        self.target = files.output_target(self.path, f"output {self.name}")

    def for_stream(self) -> FileSink:
        """This output as one stream writes it: a copy with its own temporary file, shape and
        dtype. A ``cv.npy_out`` object describes a file; streams that share one (at once, in
        threads, or one after another with other kernels) each write their own part, as two
        runs of one target do, and the last to finish replaces the file. They shared its open
        part: two at once failed with an AssertionError and a FileNotFoundError, leaving a
        locked part and its descriptor behind; a later stream kept the first one's dtype."""
        fresh = copy.copy(self)
        fresh._fd = fresh._tmp = fresh._dir_fd = None
        # Where the name points now: a link re-pointed since the output was made (``latest ->
        # run2``) is written through as it is, and a folder removed since is named as such.
        fresh.target = self.target = files.output_target(self._absolute,
                                                          f"output {self.name}")
        return fresh

    def resolve(self, rows: int, row_shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Fill in the shape and dtype the stream decides; InputError if they disagree."""
        if self.dtype is None:
            self.dtype = np.dtype(dtype)
            # Told when the compute's result has another type (pipeline/step.py).
            self.dtype_hint = (f"; the file output {self.name} is {self.dtype} because no "
                               f"dtype was given: give yours with cv.npy_out(path, dtype=...)")
        if self.dtype.hasobject:
            raise InputError(f"output {self.name} has dtype {self.dtype}: use a numeric dtype")
        inner: tuple[int, ...] = ()
        while self.dtype.subdtype is not None:
            # ('<f4', (2,)): rows of 2 float32, as np.empty(5, it) is (5, 2) and cv.npy reads
            # an .npy header of it (a bare ValueError at the first block's copy-out before);
            # nested ones ((('<f4', (2,)), (3,))) outer dimensions first, as NumPy nests them.
            self.dtype, more = self.dtype.subdtype
            inner = (*inner, *more)
        if inner and self._given_shape:
            self.shape = (*self.shape, *inner)
        if not self._given_shape:
            self.shape = (rows, *row_shape, *inner)
        nbytes = math.prod(self.shape) * self.dtype.itemsize
        if nbytes > _MAX_FILE_BYTES:  # an OverflowError from ftruncate, after the part was made
            raise InputError(f"output {self.name} would be {self.shape} of {self.dtype}, "
                             f"{nbytes} bytes: more than any file holds (2**63 - 1 bytes); "
                             f"check input 0's length")

    @property
    def result(self) -> str:
        """The output's path as given; absolute where the current folder has changed since
        (the name as given would now load another folder's file)."""
        return self.name if files.joined(self.name) == self._absolute else self._absolute

    def rows(self, lo: int, hi: int) -> FileRows:
        """Where rows ``lo:hi`` go."""
        return FileRows(self, lo, hi)

    def open(self) -> None:
        """Create the temporary file, with its header, at the output's full size, first
        deleting the parts of this target left by runs that were killed (with a warning)."""
        files.remove_stale_parts(self.target)
        # Whole, or Ctrl-C between mkstemp and the rename leaves a .new file that no later
        # run removes (stale parts are .part), and a part made but not yet held here
        # outlives abort(); the interrupt is raised once both are ours (interrupts.py).
        with deferred_sigint():
            try:
                # No inode left (ENOSPC from mkstemp) named a temporary .new file that does
                # not exist, not the output: named as a full disk is at the rows.
                with self._naming_errors():
                    self._fd, self._tmp = files.new_part(self.target)
                    self._dir_fd = files.hold_folder(self._fd, self._tmp)
            except OSError as exc:
                # os.access said yes (root: /sys, a read-only mount): no file can be made there.
                if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
                raise InputError(f"output {self.name}: cannot write in folder "
                                 f"{self.target.parent} ({exc.strerror}): write elsewhere or "
                                 f"fix its permissions") from exc
        fd = self._fd
        if self.header:
            with self._naming_errors(), os.fdopen(os.dup(fd), "wb") as f:
                header = {"descr": np.lib.format.dtype_to_descr(self.dtype),
                          "fortran_order": False, "shape": self.shape}
                try:
                    np.lib.format.write_array_header_1_0(f, header)
                except UnicodeEncodeError:  # field names outside Latin-1 (a ValueError too)
                    _write_header_3_0(f, header)
                except ValueError:  # a header too long for format 1.0
                    np.lib.format.write_array_header_2_0(f, header)
                self.offset = f.tell()
        try:
            os.ftruncate(fd, self.offset + self.nbytes)
        except OSError as exc:
            if exc.errno != errno.EFBIG:
                raise
            # Over the process's file-size limit (RLIMIT_FSIZE) or the file system's: still an
            # OSError (the environment, not the arguments: the command line exits 1 for it),
            # but one that names the output and what to change ("File too large" before).
            raise advised(OSError(errno.EFBIG, (
                f"output {self.name} needs {self.offset + self.nbytes} bytes, more than this "
                f"process may write to one file (its file-size limit, `ulimit -f`) or its file "
                f"system holds: raise the limit, write elsewhere, or write a smaller output"
            ))) from exc

    def write_from(self, src: np.ndarray, lo: int) -> None:
        """Write ``src`` (C-contiguous rows) at row ``lo``."""
        assert self._fd is not None, "open() first"
        view = byte_view(np.ascontiguousarray(src))
        row_bytes = math.prod(self.shape[1:]) * self.dtype.itemsize
        position = self.offset + lo * row_bytes
        done = 0
        with self._naming_errors():
            while done < len(view):
                done += os.pwritev(self._fd, [view[done:]], position + done)

    def _naming_errors(self) -> contextlib.AbstractContextManager[None]:
        """A full disk or quota, named: "[Errno 28] No space left on device" named no output
        and no folder; so are too many open files."""
        return naming_errors(self.name, self.target.parent)

    def prepare(self) -> None:
        """Flush to disk, take the mode of the file it replaces, check the target again
        (readied twice, as before a stream's writable tables are copied back and again at
        its commit, the file is flushed once: nothing is written between)."""
        assert self._fd is not None and self._tmp is not None
        self.check_place()
        with self._naming_errors():
            files.ready_part(self._fd, self.target, self.durable and not self._ready)
        self._ready = True

    def check_place(self) -> None:
        """InputError where the output's folder was moved or replaced, or a link on its way
        re-pointed, since its part was made (the part is not where the name leads)."""
        if self._dir_fd is not None and not self._still_named():
            raise InputError(f"output {self.name}: its folder {self.target.parent} was moved "
                             f"or replaced, or a link on its way re-pointed, while the stream "
                             f"wrote the output, so it was not written: stream again once the "
                             f"path stays put")

    def _still_named(self) -> bool:
        """Whether the name as given still leads to the part's folder and the target's name
        (a link re-pointed during the stream sent the output to its old place, reported at
        the name): by the folder's identity, so a folder moved and linked back is fine."""
        assert self._dir_fd is not None
        try:
            now = files.resolve(self._absolute, f"output {self.name}")
        except InputError:
            return False
        return now.name == self.target.name and files.same_folder(self._dir_fd, now.parent)

    def commit(self) -> None:
        """Rename over the target (:meth:`prepare` first, where it was not called); the
        part's lock is held through the rename (see files.commit_part)."""
        assert self._fd is not None and self._tmp is not None
        if not self._ready:
            self.prepare()
        self._ready = False
        fd, self._fd = self._fd, None
        try:
            if self._dir_fd is not None:  # in the folder the part was made in (checked)
                os.replace(self._tmp.name, self.target.name, src_dir_fd=self._dir_fd,
                           dst_dir_fd=self._dir_fd)
            else:
                os.replace(self._tmp, self.target)
        finally:
            os.close(fd)
            self._close_folder()
        self._tmp = None

    def _close_folder(self) -> None:
        if self._dir_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._dir_fd)
            self._dir_fd = None

    def abort(self) -> None:
        """Close and delete the temporary file."""
        self._ready = False
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                if self._dir_fd is not None:  # where the folder went, if it moved
                    os.unlink(self._tmp.name, dir_fd=self._dir_fd)
                else:
                    self._tmp.unlink()
            self._tmp = None
        self._close_folder()


@contextlib.contextmanager
def naming_errors(name: str, folder: Path) -> Iterator[None]:
    """A full disk or quota met writing output ``name`` (in ``folder``), named with what to
    do ("[Errno 28] No space left on device" named no output and no folder); so are too many
    open files. Other errors pass as they are."""
    try:
        yield
    except OSError as exc:
        files.raise_if_too_many_open(exc, f"output {name}")
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise advised(OSError(exc.errno, f"output {name}: {exc.strerror} in {folder}: free "
                                         f"some space or write elsewhere")) from exc


def commit_all(sinks: Sequence[Sink]) -> None:
    """Make every output visible: each readied first, so that one refused (its file's place
    taken by a folder, a full disk at the flush) leaves every earlier output as it was. A
    Ctrl-C among the renames is held until the last is done, and then raised saying the
    outputs were written (``errors.outputs_written``): raised between two, it left one new
    file beside an old one, and the command said no output was written."""
    from conveyor.errors import note_outputs_written
    from conveyor.interrupts import deferred_sigint

    for sink in sinks:
        sink.prepare()
    done = 0
    try:
        with deferred_sigint():
            for sink in sinks:
                sink.commit()
                done += 1
    except BaseException as exc:
        if done == len(sinks):
            note_outputs_written(exc)
        raise


def _out_dtype(name: str, dtype: Any) -> np.dtype | None:
    """``dtype`` of output ``name`` as a NumPy dtype (None stays None); InputError for what
    NumPy cannot read as one (it parses "f4,(" as Python: a SyntaxError)."""
    if dtype is None:
        return None
    try:
        return np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError):
        raise InputError(f"output {name}: dtype={dtype!r} is not a NumPy dtype: give a "
                         f"numeric dtype, e.g. np.float32") from None


_MAX_FILE_BYTES = 2**63 - 1 - (1 << 20)  # off_t, less room for the header


def _out_shape(name: str, shape: Any) -> tuple[int, ...]:
    """``shape`` of output ``name`` as ints; InputError for a fraction (``int()`` made 100.5
    rows 100, silently) or anything that is not a sequence of numbers."""
    from conveyor.pipeline.options import _whole

    config.check_ordered(shape, f"output {name}")
    given = [shape] if _whole(shape) is not None else shape
    try:
        dims = [_whole(d) for d in given]
    except TypeError:
        dims = [None]
    if any(d is None for d in dims):
        raise InputError(f"output {name}: shape={shape!r} is not a shape: give whole numbers, "
                         f"e.g. (rows, 3)")
    if not dims:  # a stream's outputs have rows (it crashed with an IndexError)
        raise InputError(f"output {name}: shape={shape!r} has no axis: give the rows first, "
                         f"e.g. (rows,) or (rows, 3), or leave shape=None for input 0's rows")
    if any(d < 0 for d in dims):  # type: ignore[operator]
        # (A raw output's ftruncate failed with a bare EINVAL; a .npy's ring with "cannot
        # allocate -24 bytes"; -1 rows was advised a ratio of (-1, 6).)
        raise InputError(f"output {name}: shape={shape!r} has a negative axis: give the rows "
                         f"and the row shape as ints of 0 or more, or leave shape=None for "
                         f"input 0's rows and the kernel's row")
    return tuple(int(d) for d in dims)  # type: ignore[arg-type]


# -- the public constructors ------------------------------------------------------------------


def _write_header_3_0(f: Any, header: dict[str, Any]) -> None:
    """A ``.npy`` header of format 3.0 (2.0 in UTF-8), laid out as NumPy lays it out: what
    ``np.save`` writes for field names outside Latin-1, which formats 1.0 and 2.0 cannot
    hold (a bare UnicodeEncodeError before)."""
    text = "{" + "".join(f"'{key}': {value!r}, " for key, value in sorted(header.items()))
    encoded = (text + "}").encode("utf-8")
    pad = 64 - (6 + 2 + 4 + len(encoded) + 1) % 64  # magic, version, length, text, "\n"
    encoded += b" " * pad + b"\n"
    f.write(b"\x93NUMPY\x03\x00" + struct.pack("<I", len(encoded)) + encoded)


def npy_out(path: PathLike, dtype: Any = None, shape: Sequence[int] | None = None) -> FileSink:
    """A ``.npy`` output file, renamed into place only when the stream succeeds. ``dtype``
    defaults to the kernel's output parameter type (else input 0's); ``shape`` to input 0's
    rows."""
    return FileSink(path, dtype, shape, header=True)


def raw_out(path: PathLike, dtype: Any = None, shape: Sequence[int] | None = None) -> FileSink:
    """A headerless binary output file (C order), like :func:`npy_out` otherwise."""
    return FileSink(path, dtype, shape, header=False)


def _dtype_hint(value: Any) -> str:
    """For a string output that names a dtype (``"float32"``): how to ask for one."""
    if not isinstance(value, str) or os.sep in value:
        return ""
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError, SyntaxError):
        return ""
    return f"; for a new array of {dtype}, pass the dtype itself ({dtype_code(dtype)})"


def dtype_code(dtype: np.dtype) -> str:
    """How to write ``dtype`` in Python: ``np.float32`` where NumPy names it so, else
    ``np.dtype('<U3')`` (``np.str96``, ``np.datetime64[s]`` and ``np.bytes32`` do not exist:
    an error message advised them)."""
    if dtype.subdtype is not None:  # "(2,)f4": str() gives text np.dtype cannot read back
        base, shape = dtype.subdtype
        return f"np.dtype(({dtype_code(base)}, {shape}))"
    named = np.__dict__.get(dtype.name)  # not getattr: NumPy warns for names it took out
    if isinstance(named, type) and issubclass(named, np.generic) and np.dtype(named) == dtype:
        return f"np.{dtype.name}"
    if dtype.fields is None and np.dtype(str(dtype)) == dtype:
        return f"np.dtype({str(dtype)!r})"
    return f"np.dtype({dtype.descr!r})"


def as_sink(value: Any, index: int, rows: int, row_shape: tuple[int, ...],
            dtype: np.dtype) -> Sink:
    """Output ``index`` as a Sink: a path (``.npy``), a Sink, an array, or a dtype (``dtype``
    is the default element type of a file sink)."""
    if isinstance(value, str | os.PathLike):
        # Checked first: a path-like of bytes was pathlib's own TypeError.
        if Path(files.path_text(value, f"output {index}")).suffix.lower() != ".npy":
            raise InputError(f"output {index} {value}: a path must name a .npy file; use "
                             f"cv.raw_out() for a raw binary file{_dtype_hint(value)}")
        value = npy_out(value)
    if isinstance(value, FileSink):
        value = value.for_stream()  # the caller's object is never opened: see for_stream
        value.resolve(rows, row_shape, dtype)
        return value
    if isinstance(value, Sink):
        return value
    from conveyor.pipeline import validate

    array = validate.as_output(value, index, rows, row_shape)
    return ArraySink(array, f"output {index}", allocated=not isinstance(value, np.ndarray),
                     given=value if isinstance(value, np.ndarray) and value is not array
                     else None)
