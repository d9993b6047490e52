"""Outputs of other lengths than input 0: one record per block, or a row ratio.

- :func:`per_block` ``(shape, dtype)``: the kernel writes one record of ``shape`` per block
  (its output buffer holds exactly one); ``report.outputs`` holds ``blocks × shape`` and
  ``report.block_ranges`` the input rows ``[start, stop)`` each block covered.
- :func:`rows` ``(dtype, ratio=(p, q))``: an output of ``rows × p / q`` rows of input 0
  (decimation, pooling, up-sampling). Blocks are cut at multiples of ``q`` input rows, so every
  block maps to whole output rows: block rows ``[start, stop)`` write output rows
  ``[start × p / q, stop × p / q)``. Input 0's length must be a multiple of ``q``. The ratio
  is kept as written, not put in lowest terms: ``(2, 4)`` is a kernel that makes 2 rows from
  each group of 4, whose groups a cut every 2 rows would split (row 3 came back 0).

Both make new arrays; the kernel still gets ``offset`` and ``n`` in elements of input 0 and
works out where its output goes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from conveyor.errors import InputError
from conveyor.pipeline.sinks import ArraySink


class Shaped:
    """An output whose length is not input 0's (see the module)."""

    ratio: tuple[int, int] = (1, 1)
    per_block = False
    dtype: np.dtype

    def sink(self, index: int, rows: int, row_shape: tuple[int, ...]) -> ShapedSink:
        """The sink of output ``index`` for an input 0 of ``rows`` rows of ``row_shape``."""
        raise NotImplementedError


class PerBlock(Shaped):
    """One record of ``shape`` per block."""

    per_block = True

    def __init__(self, shape: Sequence[int] | int, dtype: Any) -> None:
        self.shape = _dims(shape, f"per_block(shape={shape!r}): give the record's shape as "
                                  f"positive ints, e.g. per_block((4,), np.float32) or "
                                  f"per_block(1, ...)")
        self.dtype = _dtype(dtype, "per_block")
        _check_ndim(len(self.shape), f"per_block(shape={shape!r})")
        record = math.prod(self.shape) * self.dtype.itemsize
        if record >= 2**63:  # np.empty raised a bare "array is too big" ValueError
            raise InputError(f"per_block(shape={shape!r}): a record of {record} bytes is more "
                             f"than any array holds: give a smaller record shape")

    def sink(self, index: int, rows: int, row_shape: tuple[int, ...]) -> ShapedSink:
        return ShapedSink(self, np.empty((0, *self.shape), self.dtype), f"output {index}")


class Rows(Shaped):
    """``rows × p / q`` rows of ``shape`` (default: input 0's row shape)."""

    def __init__(self, dtype: Any, ratio: tuple[int, int] = (1, 1),
                 shape: Sequence[int] | None = None) -> None:
        self.dtype = _dtype(dtype, "rows")
        try:
            parts = tuple(ratio)
            # Whole numbers, integral floats taken as meant (_whole: inf and nan are not).
            from conveyor.pipeline.options import _whole

            wholes = [_whole(v) for v in parts]
            valid = len(wholes) == 2 and all(v is not None for v in wholes)
            p, q = (int(v) for v in wholes) if valid else (0, 0)  # type: ignore[arg-type]
            valid = valid and p > 0 and q > 0
        except (TypeError, ValueError):
            valid = False
        if not valid:
            raise InputError(f"rows(ratio={ratio!r}): give (p, q), two positive ints: output "
                             f"rows = input rows × p / q, e.g. ratio=(1, 4)")
        self.ratio = (p, q)  # as written: q is the group the kernel reads (see the module)
        self.shape = None if shape is None else _dims(
            shape, f"rows(shape={shape!r}): give the shape of each output row as positive "
                   f"ints, e.g. shape=(3,) (default: input 0's row shape)")

    def sink(self, index: int, rows: int, row_shape: tuple[int, ...]) -> ShapedSink:
        p, q = self.ratio
        if rows % q:
            raise InputError(
                f"output {index} has ratio=({p}, {q}) but input 0 has {rows} rows, not a "
                f"multiple of {q}: every block must map to whole output rows; pad or trim "
                f"input 0 to a multiple of {q} rows ({rows // q * q} or {-(-rows // q) * q})")
        shape = row_shape if self.shape is None else self.shape
        _check_ndim(len(shape), f"output {index}")
        out_rows = rows * p // q
        try:
            array = np.empty((out_rows, *shape), self.dtype)
        except (ValueError, MemoryError) as exc:
            nbytes = out_rows * math.prod(shape) * self.dtype.itemsize
            raise InputError(
                f"output {index} with ratio=({p}, {q}) would hold {out_rows} rows of "
                f"{shape} {self.dtype} ({nbytes} bytes) for input 0's {rows} rows: more than "
                f"this host can allocate ({exc}): check the ratio") from None
        return ShapedSink(self, array, f"output {index}")


class ShapedSink(ArraySink):
    """A new array for a Shaped output; a per-block one is made once the plan says how many
    blocks there are (``allocate``)."""

    def __init__(self, request: Shaped, array: np.ndarray, name: str) -> None:
        super().__init__(array, name, allocated=True)
        self.ratio = request.ratio
        self.per_block = request.per_block

    def allocate(self, blocks: int) -> None:
        """Per-block outputs: the array of ``blocks`` records."""
        if self.per_block:
            try:
                self.array = np.empty((blocks, *self.shape[1:]), self.dtype)
            except (ValueError, MemoryError) as exc:  # cv.iterate(length=2**62)
                nbytes = blocks * math.prod(self.shape[1:]) * self.dtype.itemsize
                raise InputError(
                    f"{self.name} (per_block) would hold {blocks} records of "
                    f"{self.shape[1:]} {self.dtype} ({nbytes} bytes), one per block: more "
                    f"than this host can allocate ({exc}): check input 0's length, or use "
                    f"a larger block_bytes (fewer blocks)") from None
            self.shape = tuple(int(s) for s in self.array.shape)


def per_block(shape: Sequence[int] | int, dtype: Any) -> PerBlock:
    """An output of one record of ``shape`` per block (see the module)."""
    return PerBlock(shape, dtype)


def rows(dtype: Any, ratio: tuple[int, int] = (1, 1), shape: Sequence[int] | None = None
         ) -> Rows:
    """An output of ``rows × p / q`` rows of input 0 (see the module)."""
    return Rows(dtype, ratio, shape)


def _dims(shape: Any, message: str) -> tuple[int, ...]:
    """``shape`` (one whole number, or a sequence of them) as a tuple of positive ints, an
    integral float taken as meant (``2.0`` as 2, as ``depth=3.0`` is); InputError with
    ``message`` for anything else (2.5, a string, a bool, a zero or negative size)."""
    from conveyor.pipeline.options import _whole

    dims = (shape,) if _whole(shape) is not None else shape
    if isinstance(dims, np.ndarray) and dims.ndim == 1:  # taken by cv.raw and the others
        dims = list(dims)
    if isinstance(dims, str | bytes) or not isinstance(dims, Sequence):
        raise InputError(message)
    whole = [_whole(d) for d in dims]
    if not all(d is not None and d > 0 for d in whole):
        raise InputError(message)
    return tuple(int(d) for d in whole)  # type: ignore[arg-type]


#: The most dimensions a NumPy array has (NumPy 2: 64); an output adds one for its rows.
MAX_NDIM = 64


def _check_ndim(row_ndim: int, what: str) -> None:
    """InputError when rows of ``row_ndim`` dimensions make an array of more than NumPy's
    most (a raw ValueError from np.empty, or "more than this host can allocate")."""
    if row_ndim + 1 > MAX_NDIM:
        raise InputError(f"{what}: rows of {row_ndim} dimensions make an array of "
                         f"{row_ndim + 1}, more than NumPy's {MAX_NDIM}: give rows of at most "
                         f"{MAX_NDIM - 1} dimensions")


def _dtype(value: Any, what: str) -> np.dtype:
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError, SyntaxError) as exc:  # "f4,(": SyntaxError
        raise InputError(f"{what}(dtype={value!r}): pass a NumPy dtype ({exc})") from None
    if dtype.hasobject:
        raise InputError(f"{what}(dtype={dtype}): use a numeric dtype")
    return dtype
