"""Iterable inputs (``cv.iterate``): chunks of any iterable along axis 0, read once, in order.

A chunk may be memory the iterable fills again for the next one, so no row of a chunk is read
once the next chunk has been asked for: see :class:`IterSource`.
"""

from __future__ import annotations

import sys
import threading
import types
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from conveyor.errors import InputError
from conveyor.memory.hostmem import address
from conveyor.pipeline import overlap, validate
from conveyor.pipeline.io import FileRows, Source
from conveyor.pipeline.options import _whole

#: Seconds an IterSource waits for the staging copies of rows it lent while none of them
#: reads, before it copies those rows itself (a copy that never runs: its stream failed).
LOAN_PATIENCE_S = 0.5

#: Empty chunks in a row after which an iterable is taken to be stuck (an InputError): a
#: reader at the end of its file that yields ``buf[:0]`` forever instead of ending hung the
#: stream, spinning, at its end (or, on a short file, before ``length`` rows). Large, since a
#: filter that passes nothing for a long run yields empty chunks legitimately: a million
#: takes about three seconds of a core to reach.
EMPTY_CHUNKS_LIMIT = 1_000_000


def _same_rows(chunk: np.ndarray, out: np.ndarray, start: int) -> bool:
    """Whether ``chunk`` is rows ``start:start+len(chunk)`` of ``out`` itself."""
    return (chunk.dtype == out.dtype and chunk.shape[1:] == out.shape[1:]
            and chunk.strides == out.strides and start + len(chunk) <= len(out)
            and address(chunk) == address(out) + start * out.strides[0])


class IterSource(Source):
    """Chunks of an iterable along axis 0, read once, in order. ``length`` (total rows) is
    required up front, because the plan is made before the first block; the first chunk gives
    the dtype and row shape. Rows are held only while a block (with its halo) needs them.

    A chunk may be memory that the iterable fills again for the next one (``f.readinto(buf)``,
    ``yield buf[:rows]``), so no row of a chunk is read once the next chunk has been asked for.
    A block within one chunk is lent to the staging copies as it is (a :class:`FileRows` over
    the chunk: no copy here), and the next chunk is asked for only once they have read it. A
    block that spans chunks is copied into an array of its own as its chunks come: only its
    rows (what the next block needs again, its halo, is in that array too); the rest of its
    last chunk is lent later. After the last row the iterable is asked once more and must
    end (or yield only empty chunks): more rows than ``length`` are an InputError, as fewer
    are, and so are ``EMPTY_CHUNKS_LIMIT`` empty chunks in a row (a reader stuck at the end
    of its file, which hung the stream). ``close()``, called as the stream ends, closes the
    iterable where it is a generator or made here (see :func:`iterate`).
    """

    def __init__(self, chunks: Iterable[Any], length: int) -> None:
        rows = _whole(length)
        if rows is None or rows < 0:
            raise InputError(f"iterate(length={length!r}): give the total rows, a whole number, "
                             f"0 or more")
        if isinstance(chunks, np.ndarray | np.generic) and (
                np.ndim(chunks) < 2 or np.shape(chunks)[0] * np.shape(chunks)[1] != rows):
            # Iterating an array yields its rows one by one, each a chunk of one dimension
            # less: unless that is what is meant (a[k] is chunk k, length = its rows in
            # all), the stream failed later with "yielded at least ... rows".
            raise InputError(f"iterate() was given an array of shape {np.shape(chunks)}, not an "
                             f"iterable of chunks: pass the array itself as the input, or "
                             f"iterate over its pieces (iterate(np.array_split(a, k), "
                             f"length=len(a)))")
        self.name = f"iterable of {type(chunks).__name__}"
        try:
            self._chunks: Iterator[Any] = iter(chunks)
        except TypeError:
            raise InputError(f"iterate() takes an iterable of arrays (a generator, a list of "
                             f"chunks), got {type(chunks).__name__}") from None
        # What the stream closes when it ends (see close()): a generator, or an iterator that
        # iter() made here from an iterable (nobody else holds it); never an iterator object
        # the caller passed in, which a ``for`` loop would not close either.
        self._owned = (isinstance(self._chunks, types.GeneratorType)
                       or self._chunks is not chunks)
        self._closed = False
        self._reader: object | None = None  # the stream that claimed it (see claim())
        self._outputs: list[tuple[int, np.ndarray]] = []  # its stream's array outputs (watch())
        self._halo = 0
        self._length = rows
        self._read = 0  # rows the iterable has yielded
        self._ended = False  # it raised StopIteration
        self._empty = 0  # empty chunks in a row, up to the last one yielded
        self._cond = threading.Condition()  # guards the loans
        self._loans: list[_Loan] = []  # rows lent to staging copies since the last next()
        self._maps_checked: dict[int, object] = {}  # mappings whose file size was checked
        #: The files behind memory-mapped chunks, by mapping (a stream's trace must not
        #: replace one: stream.py checks them before it writes the trace).
        self.mapped_files: dict[int, str] = {}
        try:
            first = self._next()
            if first is None and rows:
                raise InputError(f"{self.name} is empty but length={rows}: pass the real "
                                 f"length")
            template = first if first is not None else np.empty(0, np.float32)
            # No chunk at all: float32 is a stand-in, which a kernel's parameter type
            # replaces (adopt_types): a uchar kernel refused "input 0 has dtype float32".
            self.untyped = first is None
            self.dtype = template.dtype
            self.shape = (rows, *template.shape[1:])
            # The rows held, in order from row _first on: (input row of rows[0], rows,
            # whether they are the iterable's memory).
            self._held: list[tuple[int, np.ndarray, bool]] = (
                [(0, first, True)] if first is not None else [])
            self._first = 0
            if not rows:
                self._check_end()
        except BaseException:
            self._close_chunks()  # refused: no stream will read it (its error is noted)
            raise

    def _next(self) -> np.ndarray | None:
        """The next chunk, checked (None once the iterable has ended); InputError once the
        chunks hold more than ``length`` rows."""
        if self._ended:
            return None
        try:
            chunk = next(self._chunks)
        except StopIteration:
            self._ended = True
            return None
        where = f"a chunk of {self.name} (from row {self._read})"
        validate.device_memory(chunk, where, "yield host arrays (a PyOpenCL array's .get())")
        validate.check_values(chunk, where)
        # A plain ndarray view of the chunk's memory, as validate.plain gives for inputs:
        # np.asarray drops an ndarray subclass (a memmap too), so rows are never read through
        # a subclass's __getitem__ (one that copies would hand out copies of reused memory).
        try:
            array = np.asarray(chunk)
        except (ValueError, TypeError) as exc:  # a ragged list: NumPy's "inhomogeneous shape"
            raise InputError(f"{self.name} yielded a chunk NumPy cannot make one array of "
                             f"(from row {self._read}): {exc}; yield NumPy arrays cut along "
                             f"axis 0") from None
        if array.ndim == 0 or array.dtype.hasobject:
            raise InputError(f"{self.name} yielded {array.dtype} of shape {array.shape}: yield "
                             f"numeric arrays, cut along axis 0")
        # A map whose file was cut: SIGBUS. Once per mapping: each look reads
        # /proc/self/maps, and chunks of one np.memmap may come by the hundred thousand.
        mapping = overlap.mapping_of(array)
        # (An empty chunk reads nothing: the check, which skips it, waits for one with rows.)
        if mapping is not None and array.size and id(mapping) not in self._maps_checked:
            maps = overlap.read_maps()
            overlap.check_map_sizes([(where, array)], maps)
            self._maps_checked[id(mapping)] = mapping  # held: its id stays its own
            path = overlap.mapped_path(array, maps)
            if path is not None:
                self.mapped_files[id(mapping)] = path
        if hasattr(self, "shape") and (array.dtype != self.dtype
                                       or array.shape[1:] != self.shape[1:]):
            raise InputError(
                f"{self.name} yielded a chunk of {array.dtype} rows {array.shape[1:]} after "
                f"{self.dtype} rows {self.shape[1:]}: every chunk must match the first"
            )
        self._empty = 0 if len(array) else self._empty + 1
        if self._empty >= EMPTY_CHUNKS_LIMIT:
            where = ("after its last row" if self._read == self._length
                     else f"after {self._read} rows of length={self._length}")
            raise InputError(
                f"{self.name} yielded {self._empty} empty chunks in a row {where}, and has not "
                f"ended: end it once it has no more rows (a reader at the end of its file "
                f"gets 0 bytes from readinto: return there instead of yielding buf[:0]; a "
                f"filter that passes nothing for that long can leave its empty chunks out: "
                f"(c for c in chunks if len(c)))")
        self._refuse_shared(array, self._read)
        self._read += len(array)
        if self._read > self._length:
            raise InputError(f"{self.name} yielded at least {self._read} rows but length="
                             f"{self._length}: pass the real length")
        return array

    def watch(self, outputs: Sequence[tuple[int, np.ndarray]], halo: int) -> None:
        """Refuse chunks that share memory with ``outputs`` ((index, array) of the claiming
        stream's array outputs), the chunk held now included. Chunks are read when their
        block is staged, after earlier blocks' outputs were written: a chunk that is a view
        of an output (``a[s:e]`` of the output ``a``) was read with rows already overwritten
        (one wrong value per block, with a halo, and no error). A chunk that is exactly the
        output's own rows, with no halo, is in place and right: each block reads its rows
        before it writes them."""
        self._outputs = list(outputs)
        self._halo = halo
        for start, rows, own in getattr(self, "_held", []):
            if own:
                self._refuse_shared(rows, start)

    def _refuse_shared(self, chunk: np.ndarray, start: int) -> None:
        for index, out in self._outputs:
            if not (chunk.size and out.size) or (not self._halo and _same_rows(chunk, out,
                                                                               start)):
                continue
            try:
                # NumPy's stubs allow only -1 and 0; any positive bound works at run time.
                shared = np.shares_memory(chunk, out, max_work=10**6)  # type: ignore[arg-type]
            except np.exceptions.TooHardError:
                shared = True  # not ruled out: refused, as an overlap that may be
            if shared:
                raise InputError(
                    f"{self.name}: the chunk from row {start} shares memory with output "
                    f"{index}, which the stream writes while it still reads the chunks: yield "
                    f"a copy (chunk.copy()), or write the results to another array")

    def claim(self, stream: object) -> None:
        """Mark this input as read by ``stream`` (any object standing for one call), before
        any work; InputError if another stream claimed it or it was closed. Two streams
        reading one iterable at once shared its position and held rows with no lock: each
        returned some of the other's rows and uninitialised memory, with no error."""
        with self._cond:
            if self._closed:
                raise InputError(f"{self.name} was closed when the stream that read it ended "
                                 f"(rows 0:{self._read} read): a cv.iterate() input serves "
                                 f"one stream; pass a new cv.iterate(...) of a new iterable")
            if self._reader is not None and self._reader is not stream:
                raise InputError(f"{self.name} is being read by another stream: a "
                                 f"cv.iterate() input serves one stream; give each stream a "
                                 f"cv.iterate(...) of its own iterable")
            self._reader = stream

    def claimed_by(self, stream: object) -> bool:
        """True when ``stream`` claimed this input, or no stream has (then it may close it)."""
        with self._cond:
            return self._reader is None or self._reader is stream

    def rows(self, lo: int, hi: int) -> np.ndarray | FileRows:
        """Rows ``lo:hi``; ``lo`` must not go back before rows already let go of (those before
        the ``lo`` of a call that asked the iterable for more)."""
        if self._closed:
            raise InputError(f"{self.name} was closed when the stream that read it ended "
                             f"(rows 0:{self._read} read): a cv.iterate() input serves one "
                             f"stream; pass a new cv.iterate(...) of a new iterable")
        if lo < self._first:
            raise InputError(f"{self.name} is read once, in order: rows {lo}: are gone")
        last = hi == self._length and not self._ended  # then the iterable is asked to end
        if hi <= self._read and not last:  # held already
            for start, rows, theirs in self._held:
                if start <= lo and hi <= start + len(rows):
                    if not theirs:
                        return rows[lo - start : hi - start]
                    loan = _Loan(self, rows[lo - start : hi - start], lo)
                    with self._cond:
                        self._loans.append(loan)
                    return FileRows(loan, lo, hi)
            return self._gather(lo, hi)[0]  # across chunks: a copy
        # The iterable is asked for more: rows before lo are let go of, and rows lo:hi are
        # copied out of its memory first (the rows still held after hi are its new chunk's).
        out, tail = self._gather(lo, hi)
        self._held = [(lo, out, False), *tail]
        self._first = lo
        if last:
            self._check_end()
        return out

    def _gather(self, lo: int, hi: int) -> tuple[np.ndarray, list[tuple[int, np.ndarray, bool]]]:
        """Rows ``lo:hi`` copied into an array of their own, from the rows held, then from
        chunks asked for until ``hi``; and the rest of the last chunk, held as it is."""
        out = np.empty((hi - lo, *self.shape[1:]), self.dtype)
        for start, rows, _ in self._held:
            self._copy_part(out, lo, hi, start, rows)
        tail: list[tuple[int, np.ndarray, bool]] = []
        if self._read < hi:
            # Every row still needed is in ``out`` now; the iterable may reuse the memory of
            # its chunks once the staging copies have read what was lent out of them.
            self._settle()
            while self._read < hi:
                start = self._read
                chunk = self._next()
                if chunk is None:
                    raise InputError(f"{self.name} ended after {self._read} rows but length="
                                     f"{self._length}: pass the real length")
                self._copy_part(out, lo, hi, start, chunk)
                if self._read > hi:
                    tail = [(hi, chunk[hi - start :], True)]
        return out, tail

    @staticmethod
    def _copy_part(out: np.ndarray, lo: int, hi: int, start: int, rows: np.ndarray) -> None:
        """Copy the rows of ``rows`` (input rows from ``start``) that lie in ``lo:hi`` into
        ``out`` (rows ``lo:hi``)."""
        first, stop = max(start, lo), min(start + len(rows), hi)
        if first < stop:
            out[first - lo : stop - lo] = rows[first - start : stop - start]

    def _settle(self) -> None:
        """Before the next ``next()``: no staging copy reads a chunk's memory any more."""
        with self._cond:
            for loan in self._loans:
                loan.settle()
            self._loans = []

    def _check_end(self) -> None:
        """After the last row: the iterable must end (empty chunks aside; a chunk with rows
        raises in _next)."""
        self._settle()
        while self._next() is not None:
            pass

    def close(self) -> None:
        """The stream is over and its staging copies joined: none reads a loan any more. The
        iterable is closed (see :func:`iterate`): a generator left suspended by a failed
        stream runs its ``finally`` now, not whenever the garbage collector gets to it."""
        with self._cond:
            self._loans = []
            # Nothing reads them now: a cv.iterate object (or a kept exception of its
            # stream) held the last chunks gathered and the stream's outputs for good.
            self._held = []
            self._outputs = []
        self._close_chunks()

    def _close_chunks(self) -> None:
        """Close the iterable where it is ours to close (a generator, or what iter() made
        here) and has ``close()``; once. An error of that close never replaces the error
        the stream is raising (the stream calls close() in a ``finally``): it becomes a note
        on it; after a stream that succeeded (its outputs written) it is a warning."""
        if self._closed:
            return
        self._closed = True
        closer = getattr(self._chunks, "close", None) if self._owned else None
        if not callable(closer):
            return
        failing = sys.exc_info()[1]  # in the stream's ``finally``: the error it raises
        try:
            closer()
        except Exception as exc:  # the user's code: reported, never raised
            what = (f"conveyor: closing the {self.name} as its stream ended failed: "
                    f"{type(exc).__name__}: {exc}")
            if failing is not None:
                failing.add_note(what)
            else:
                warnings.warn(what, RuntimeWarning, stacklevel=3)


class _Loan:
    """Rows of a chunk (the iterable's memory) lent to staging copies, as the ``file`` of a
    :class:`FileRows`: ``left`` rows are not read yet, ``reading`` copies read them now."""

    __slots__ = ("cond", "rows", "first", "left", "reading", "shape", "dtype")

    def __init__(self, source: IterSource, rows: np.ndarray, first: int) -> None:
        self.cond = source._cond
        self.rows = rows
        self.first = first  # the input row of rows[0]
        self.left = len(rows)
        self.reading = 0
        self.shape = source.shape
        self.dtype = source.dtype

    def read_into(self, dst: np.ndarray, lo: int) -> None:
        """Copy ``len(dst)`` rows from input row ``lo`` into ``dst``."""
        with self.cond:
            rows = self.rows
            self.reading += 1
        try:
            at = lo - self.first
            np.copyto(dst, rows[at : at + len(dst)], casting="no")
        finally:
            with self.cond:
                self.reading -= 1
                self.left -= len(dst)
                self.cond.notify_all()

    def settle(self) -> None:
        """With ``cond`` held: return once no copy will read the chunk itself. Copies that
        read now are waited for; rows no copy has started on after ``LOAN_PATIENCE_S`` (it
        failed before reading, or never ran) are copied here, for any copy still to come."""
        while self.left > 0:
            if not self.cond.wait(LOAN_PATIENCE_S) and not self.reading:
                self.rows = self.rows.copy()
                return


def adopt_types(sources: Sequence[Any], kernel: Any) -> None:
    """An iterable that yielded no chunk takes the type of the parameter of ``kernel`` it is
    bound to (inputs come first): with no rows there is nothing of its own to check."""
    for source, param in zip(sources, kernel.params, strict=False):
        if isinstance(source, IterSource) and source.untyped:
            dtype = param_dtype(kernel, param)
            if dtype is not None:
                source.dtype = dtype


def param_dtype(kernel: Any, param: Any) -> np.dtype | None:
    """The element type an empty iterable bound to ``kernel``'s pointer parameter ``param``
    takes: its scalar type, or the records of the struct it points to as the compiler lays
    them out (it was refused as float32), or, where conveyor cannot lay that struct out
    (packed, aligned, a union inside), an opaque one-byte record, which no check judges:
    no row of it is ever read. None for a pointer to neither."""
    if param.dtype is not None:
        return np.dtype(param.dtype)
    if not getattr(param, "struct_name", None):
        return None
    from conveyor.pipeline.structs import records_dtype

    records = records_dtype(kernel, param)
    return records if records is not None else np.dtype("V1")


def iterate(chunks: Iterable[Any], length: int) -> IterSource:
    """Any iterable of arrays (chunks along axis 0, any sizes) as an input of ``length`` rows
    in all. It is read once, in order; the first chunk is read now for the dtype.

    A chunk may be a buffer the iterable fills again for the next chunk (``f.readinto(buf)``
    then ``yield buf[:rows]``): every row of a chunk is staged or copied before the next one is
    asked for, and a chunk is not read after that. It must not change before (another
    thread writing it). After the last row the iterable is asked once more (as
    ``zip(strict=True)`` does), so a generator runs to its end: it must end there, or yield
    only empty chunks (fewer than ``EMPTY_CHUNKS_LIMIT`` in a row: more, anywhere, are taken
    for a reader stuck at the end of its file). Fewer or more rows than ``length`` are an
    InputError (more: when a chunk runs past ``length``, or at that last ask), and so is a
    chunk whose values NumPy would change (a masked array with masked elements, PyArrow data
    with nulls: see :func:`conveyor.pipeline.validate.check_values`).

    The input serves one stream, which closes the iterable as it ends, whether it succeeded
    or failed, before ``cv.stream`` returns or raises: a generator left suspended by a
    failure (a kernel, a link of a chain, an output, or a refusal of the stream) runs its
    ``finally`` then (a reader closes its file), not whenever the garbage collector gets to
    it; so does a generator this call refuses. Closed are generators, and the iterator that
    ``iter()`` makes here from an iterable that is not its own iterator (a class whose
    ``__iter__`` is a generator); an iterator object that is no generator, passed in as it
    is (``__iter__`` returns itself), is the caller's and stays open, as a ``for`` loop
    leaves it, so it may be read on or closed by its owner. An error raised by the close
    itself never replaces the stream's error (it is added to it as a note); after a stream
    that succeeded it is a RuntimeWarning. A second stream of the same input is an
    InputError: make a new ``cv.iterate(...)`` for each."""
    return IterSource(chunks, length)
