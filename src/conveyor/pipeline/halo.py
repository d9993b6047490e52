"""Halo rows that an input slot does not copy from the input as it stands.

With ``halo=h`` each input slot holds ``h`` rows before and ``h`` after its block. Two kinds
of those rows come from here instead of from the input at the moment of the copy:

- **Pad rows** past either end follow ``boundary=``: Dask's names, each exactly np.pad's rows
  (``PAD_MODES``): "nearest" repeats the edge row (np.pad "edge", the default), "reflect"
  mirrors the rows including the edge row (np.pad "symmetric": Dask's "reflect" is not
  np.pad's "reflect"), "periodic" wraps around (np.pad "wrap"), a number is a constant
  (np.pad "constant"; one the input's dtype cannot hold is refused, see ``constant``). The
  ``h`` pad rows of each end are made once per stream (``Pads``), reading only the few rows
  they repeat: one copy per pad row took minutes for a large halo (a halo of a million rows:
  two million copies). The device copies a pinned input's pad rows from pinned memory, each
  end in one copy; staged inputs get them in their slot (``fill_pads``).
- **Rows an in-place stream overwrites** (an input that is also an output, see
  pipeline/overlap.py): block ``k`` reads the last ``h`` rows of block ``k - 1``, which block
  ``k - 1`` writes back, and on the pinned path nothing orders the two copies. Those rows
  are saved for every block before the first block runs: ``h`` rows per block of host
  memory, pinned where the device copies from them directly.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

from conveyor.backends.base import Device, PinnedBuffer
from conveyor.closing import Closeable
from conveyor.errors import InputError
from conveyor.interrupts import deferred_sigint
from conveyor.memory import hostmem
from conveyor.pipeline.chunks import IterSource
from conveyor.pipeline.io import ArraySource, Source
from conveyor.pipeline.plan import Block, Plan
from conveyor.pipeline.stage import copy_rows


class HaloRows(Closeable):
    """Pad rows of the pinned inputs in ``direct`` and saved rows of the inputs in
    ``in_place``, made now (before the first block). ``close()`` gives the pinned memory
    back; call it only once no copy reads it."""

    def __init__(self, device: Device, plan: Plan, sources: Sequence[Source],
                 direct: Sequence[bool], in_place: frozenset[int],
                 boundary: Boundary = "nearest") -> None:
        self._pool = device.pinned_pool
        self._pinned: list[PinnedBuffer] = []
        self._pads: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._saved: dict[int, np.ndarray] = {}
        self._halo = h = plan.halo
        try:
            for i, source in enumerate(sources):
                row_shape = source.shape[1:]
                if direct[i] and h:
                    assert isinstance(source, ArraySource)
                    pads = self._empty(True, (2, h, *row_shape), source.dtype)
                    edges = Pads(source, plan.rows, h, boundary)
                    np.copyto(pads[0], edges.front())
                    np.copyto(pads[1], edges.back())
                    self._pads[i] = (pads[0], pads[1])
                if i in in_place and h and plan.block_count > 1:
                    saved = self._empty(direct[i], (plan.block_count - 1, h, *row_shape),
                                        source.dtype)
                    _save_rows(saved, source, plan)
                    self._saved[i] = saved
        except BaseException:
            self.close()
            raise

    def _empty(self, pinned: bool, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if not pinned:
            return np.empty(shape, dtype)
        count = int(np.prod(shape, dtype=np.int64))
        block = self._pool.acquire(max(count * dtype.itemsize, 1))
        self._pinned.append(block)
        return block.array[: count * dtype.itemsize].view(dtype).reshape(shape)

    def pads(self, i: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The ``h`` pad rows before pinned input ``i`` and the ``h`` after it."""
        return self._pads.get(i)

    def before(self, i: int, block: Block) -> np.ndarray | None:
        """The ``h`` rows before ``block`` of input ``i`` as they were before the stream began,
        where a block before it writes them back (in place); None otherwise."""
        saved = self._saved.get(i)
        if saved is None or block.index == 0:
            return None
        return saved[block.index - 1]

    def direct_pieces(self, i: int, src: np.ndarray, block: Block, row_bytes: int
                      ) -> list[tuple[int, np.ndarray]]:
        """(byte offset in the slot, pinned rows) that fill pinned input ``i``'s slot for
        ``block``: the pad rows (one copy per end), the saved rows before the block (in
        place), and the rows of ``src`` itself."""
        h, rows = self._halo, len(src)
        lo, hi = max(block.start - h, 0), min(block.stop + h, rows)
        before = lo - (block.start - h)  # pad rows before the first row
        front, back = self._pads[i]
        pieces: list[tuple[int, np.ndarray]] = []
        if before:
            pieces.append((0, front[h - before :]))
        saved = self.before(i, block)
        if saved is not None:  # before is 0 here: every block but the first starts >= h
            pieces.append((0, saved))
            lo, before = block.start, h
        pieces.append((before * row_bytes, src[lo:hi]))
        after = block.rows + 2 * h - before - (hi - lo)
        if after:
            pieces.append(((before + hi - lo) * row_bytes, back[:after]))
        return pieces

    def close(self) -> None:
        """Give the pinned rows back to the pool."""
        pinned, self._pinned = self._pinned, []
        self._pads, self._saved = {}, {}
        for block in pinned:
            self._pool.release(block)


def _save_rows(saved: np.ndarray, source: Source, plan: Plan) -> None:
    """Rows ``[start - h, start)`` of every block but the first, into ``saved[k - 1]``."""
    h = plan.halo
    if isinstance(source, ArraySource) and h <= 64:  # one gather (its index: 8 bytes a row)
        starts = np.arange(1, plan.block_count, dtype=np.int64) * plan.block_rows
        rows = (starts[:, None] - h + np.arange(h, dtype=np.int64)).reshape(-1)
        np.take(source.array, rows, axis=0, out=saved.reshape(-1, *source.shape[1:]),
                mode="clip")
        return
    for k in range(1, plan.block_count):
        start = k * plan.block_rows
        copy_rows(saved[k - 1], source.rows(start - h, start))


#: ``boundary=`` as Dask's map_overlap names it, and the np.pad mode that gives the same rows.
PAD_MODES = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}

#: A boundary: one of PAD_MODES' names, or a number (np.pad's "constant").
Boundary = str | int | float | complex


def pad_index(rows: int, positions: np.ndarray, mode: str) -> np.ndarray:
    """The input row that each of ``positions`` (rows before 0 or from ``rows`` on) repeats
    under np.pad ``mode`` ("edge", "symmetric" or "wrap"), however far past the end."""
    if mode == "edge":
        return np.clip(positions, 0, rows - 1)
    if mode == "wrap":
        return positions % rows
    folded = positions % (2 * rows)  # symmetric: the input, then it reversed, repeating
    return np.where(folded < rows, folded, 2 * rows - 1 - folded)


def _read_once(source: Source) -> bool:
    """Whether ``source`` is read once, in order (``cv.iterate``), also under the wrappers
    that check or convert its rows as they are read (a bool iterable read through a
    ``bool*`` is wrapped: its back pad rows were made before the first block, and the
    iterable had run to its end)."""
    while not isinstance(source, IterSource) and getattr(source, "inner", None) is not None:
        source = source.inner  # type: ignore[attr-defined]
    return isinstance(source, IterSource)


class Pads:
    """The ``h`` rows before and after one input under ``boundary``, read once per end
    (the few rows they repeat, in one copy). The rows after an input read once, in order
    (``cv.iterate``) are read when the last blocks need them, while the source still holds
    them."""

    def __init__(self, source: Source, rows: int, h: int, boundary: Boundary) -> None:
        self.source = source
        self.rows = rows
        self.h = h
        self.boundary = boundary
        read_once = _read_once(source)
        if read_once and boundary == "periodic":
            raise InputError(f"boundary='periodic' with {source.name}: the rows before the "
                             f"first block are the input's last rows, and an iterable is read "
                             f"once, in order: pass an array or a file, or another boundary")
        front, back = source.beside  # a window's neighbours, where given
        self._front = (self._given(front, "before") if front is not None
                       else self._make(np.arange(-h, 0, dtype=np.int64)))
        self._back: np.ndarray | None = None
        if back is not None:
            self._back = self._given(back, "after")
        elif not read_once:
            self._back = self._make(np.arange(rows, rows + h, dtype=np.int64))

    def front(self) -> np.ndarray:
        """The ``h`` rows before row 0 (the last is right before it)."""
        return self._front

    def back(self) -> np.ndarray:
        """The ``h`` rows after the last row."""
        if self._back is None:
            self._back = self._make(np.arange(self.rows, self.rows + self.h, dtype=np.int64))
        return self._back

    def _given(self, rows: np.ndarray, where: str) -> np.ndarray:
        """Rows given beside the input (``Source.beside``), checked against the halo."""
        source = self.source
        if rows.shape != (self.h, *source.shape[1:]) or rows.dtype != source.dtype:
            raise InputError(f"{source.name}: the rows given {where} it are {rows.shape} of "
                             f"{rows.dtype}, not the halo's {(self.h, *source.shape[1:])} of "
                             f"{source.dtype}")
        return np.ascontiguousarray(rows)

    def _make(self, positions: np.ndarray) -> np.ndarray:
        source = self.source
        out = np.empty((len(positions), *source.shape[1:]), source.dtype)
        if not isinstance(self.boundary, str):
            out.fill(constant(self.boundary, source.dtype, source.name))
            return out
        index = pad_index(self.rows, positions, PAD_MODES[self.boundary])
        lo, hi = int(index.min()), int(index.max()) + 1
        held = np.empty((hi - lo, *source.shape[1:]), source.dtype)
        copy_rows(held, source.rows(lo, hi))
        np.take(held, index - lo, axis=0, out=out)
        return out


def rows_around(source: Source, lo: int, hi: int, h: int, boundary: Boundary = "nearest"
                ) -> tuple[np.ndarray, np.ndarray]:
    """The ``h`` rows before row ``lo`` and after row ``hi - 1`` of the whole ``source``, as
    a stream of all of it with ``halo=h`` and ``boundary`` gives them to rows ``lo:hi``: its
    own rows where they exist, pad rows past its ends (a window at an end of the array gets
    the array's pad rows, which under "reflect" and "periodic" are rows the window lacks).
    For a stream of rows ``lo:hi`` alone (``Source.beside``): the same values with only those
    rows streamed, so a reduction counts no neighbour (conveyor.dask.stream). InputError,
    before anything is allocated, where the host could not hold them (``halo=2**62`` was
    NumPy's "array is too big" on a Dask worker, where one local stream is refused)."""
    row_bytes = math.prod(source.shape[1:]) * source.dtype.itemsize
    needed, host = 2 * h * (row_bytes + 8), hostmem.total()
    if host is not None and needed > host:
        raise InputError(
            f"halo={h} rows on each side of rows {lo}:{hi} of {source.name} would take about "
            f"{needed} bytes of host memory, more than the host's {host}: use a smaller halo")
    return (_rows_at(source, np.arange(lo - h, lo), boundary),
            _rows_at(source, np.arange(hi, hi + h), boundary))


def _rows_at(source: Source, positions: np.ndarray, boundary: Boundary) -> np.ndarray:
    """Row ``p`` of ``source`` for each of ``positions``, pad rows under ``boundary`` where
    ``p`` lies past either end; each run of neighbouring rows read once."""
    rows = source.shape[0]
    out = np.empty((len(positions), *source.shape[1:]), source.dtype)
    if isinstance(boundary, str):
        index = pad_index(rows, positions, PAD_MODES[boundary])
    else:
        out.fill(constant(boundary, source.dtype, source.name))
        index = positions
    inside = (index >= 0) & (index < rows)
    wanted = np.unique(index[inside])
    for run in np.split(wanted, np.flatnonzero(np.diff(wanted) != 1) + 1) if wanted.size else ():
        first, last = int(run[0]), int(run[-1]) + 1
        held = np.empty((last - first, *source.shape[1:]), source.dtype)
        copy_rows(held, source.rows(first, last))
        here = inside & (index >= first) & (index < last)
        out[here] = held[index[here] - first]
    return out


def constant(boundary: int | float | complex, dtype: np.dtype, name: str) -> np.ndarray:
    """``boundary`` as one value of ``dtype`` (0-d), as np.pad's "constant" makes it; an
    InputError naming input ``name`` and the type's range if ``dtype`` cannot hold it.

    Decided on the number itself, not by casting and comparing back: NumPy 2 casts a Python
    float to the array's float type before comparing (1e40 becomes float32 inf, which equals
    itself, with an overflow warning), and NaN equals nothing (so NaN, a float32 value, would
    be refused). Floats (and complex, by their real part) round to the nearest value of the
    type (0.1 for float32, as np.pad does) unless that overflows to ±inf; NaN and ±inf are
    float values. Integer and bool types take whole numbers in their range only."""
    kind = dtype.kind
    if isinstance(boundary, numbers.Complex) and not isinstance(boundary, numbers.Real):
        boundary = complex(boundary)  # np.complex64 is no Python complex
    if isinstance(boundary, complex):
        if kind != "c":
            raise InputError(f"boundary={boundary!r} is complex, and {name} holds {dtype}, "
                             f"which has no imaginary part: pass a real constant")
        part = np.dtype(f"f{dtype.itemsize // 2}")
        real = constant(boundary.real, part, name)
        imag = constant(boundary.imag, part, name)
        return np.array(complex(float(real), float(imag))).astype(dtype)
    if kind in "fc":
        part = np.dtype(f"f{dtype.itemsize // 2}") if kind == "c" else dtype
        try:
            number = float(boundary)  # a Python int past float64's range raises here
        except OverflowError:
            number = math.inf  # refused below (only a longdouble could hold it)
        else:
            if not math.isfinite(number):
                return np.array(number, dtype)  # NaN, +inf, -inf: every float type has them
        # Whole under Ctrl-C (interrupts.py); an overflow is refused below, not warned about.
        with deferred_sigint(), np.errstate(over="ignore"):
            value = np.array(number).astype(part)
        if np.isfinite(value):
            return value.astype(dtype)
        top = np.finfo(part).max  # shown exactly (float16's str() would round it to 65500)
        shown = repr(float(top)) if part.itemsize <= 8 else str(top)
        raise InputError(f"boundary={boundary!r} is not a {dtype} value ({name} holds {dtype}, "
                         f"whose finite values lie within ±{shown}; NaN and ±inf are {dtype} "
                         f"values too): pass a constant in that range")
    if kind in "iub":
        lo, hi = (0, 1) if kind == "b" else (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
        whole = isinstance(boundary, int) or boundary.is_integer()  # NaN, ±inf: not whole
        if whole and lo <= int(boundary) <= hi:
            return np.array(int(boundary), dtype)
        held = "0 or 1" if kind == "b" else f"whole numbers from {lo} to {hi}"
        raise InputError(f"boundary={boundary!r} is not a {dtype} value ({name} holds {dtype}: "
                         f"{held}): pass a constant that type holds exactly")
    raise InputError(f"boundary={boundary!r}: {name} holds {dtype}, not numbers: pass "
                     f"boundary='nearest', 'reflect' or 'periodic'")


def fill_pads(view: np.ndarray, first: int, end: int, pads: Pads) -> None:
    """Fill the pad rows of a staged slot ``view`` whose rows ``[first, end)`` hold input rows:
    the ``first`` rows before them and the rows from ``end`` on lie past an end of the input
    (made once per stream by ``pads``)."""
    if first:
        np.copyto(view[:first], pads.front()[pads.h - first :])
    if end < len(view):
        np.copyto(view[end:], pads.back()[: len(view) - end])


def first_block(source: Source, dtype: np.dtype, row_shape: tuple[int, ...], plan: Plan,
                rows: int, boundary: Boundary) -> np.ndarray:
    """Input ``source``'s slot for a block of ``rows`` rows at row 0, as the stream's first
    block holds it: the ``plan.halo`` pad rows before row 0 under ``boundary``, the input's
    rows from index ``plan.halo`` on, and pad rows after an input that ends inside it. For a
    callable's warm-up, which runs before any slot exists (step.py, chainstep.py): with its
    rows at index 0 it saw every row ``plan.halo`` places early, and zeros for the pads."""
    h = plan.halo
    host = np.zeros((rows + 2 * h, *row_shape), dtype)
    have = min(rows + h, plan.rows)
    copy_rows(host[h : h + have], source.rows(0, have))
    if h:
        fill_pads(host, h, h + have, Pads(source, plan.rows, h, boundary))
    return host

