"""``-i`` inputs of ``conveyor map`` / ``reduce``: files by suffix, ``FILE:COLUMN`` for
Parquet/Arrow, ``--dtype``/``--shape`` for raw binary, and ``--cast`` as they are read."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import conveyor as cv
from conveyor.errors import InputError
from conveyor.interrupts import deferred_sigint
from conveyor.kernels.signature import Param
from conveyor.pipeline.io import FileRows, Source, raw_source

TABLE_SUFFIXES = (".parquet", ".pq", ".arrow", ".feather", ".ipc")


class Input:
    """One ``-i`` argument: its text as given, the file, and the columns it names."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.path = text
        self.columns: list[str] | None = None
        # FILE:COLUMN only where FILE is a table and the whole text names no file. "FILE:"
        # names the table with no column (open_input asks for one). The first ":" after a
        # table's suffix ends FILE, so a column's own name may hold ":" ("t.parquet:a:b").
        colons = [i for i, c in enumerate(text) if c == ":"]
        head = next((text[:i] for i in colons
                     if Path(text[:i]).suffix.lower() in TABLE_SUFFIXES), None)
        if head is not None and not os.path.exists(text):  # Path.exists raises for long names
            self.path = head
            self.columns = [c for c in text[len(head) + 1:].split(",") if c] or None

    @property
    def kind(self) -> str:
        """"npy", "table" or "raw", from the file's suffix."""
        suffix = Path(self.path).suffix.lower()
        if suffix == ".npy":
            return "npy"
        return "table" if suffix in TABLE_SUFFIXES else "raw"


def check_options(inputs: Sequence[Input], options: argparse.Namespace) -> None:
    """InputError for options that would be ignored: --dtype/--shape with no raw input,
    --column with no Parquet/Arrow input that takes it, FILE:COLUMN on a non-table file."""
    for item in inputs:
        if not item.text:
            raise InputError("-i '': name the input file, e.g. -i data.npy")
        if item.columns is not None and item.kind != "table":
            raise InputError(f"-i {item.text}: only Parquet/Arrow inputs take :COLUMN")
    kinds = {item.kind for item in inputs}
    described = [item.text for item in inputs if item.kind != "raw"]
    for flag in ("dtype", "shape"):
        if getattr(options, flag) is not None and "raw" not in kinds:
            raise InputError(
                f"--{flag} describes raw binary inputs and no input is raw ({', '.join(described)}"
                f" carr{'ies' if len(described) == 1 else 'y'} their own): drop --{flag}"
                + ("; to convert an input's type use --cast DTYPE" if flag == "dtype" else "")
            )
    if options.columns and not any(i.kind == "table" and i.columns is None for i in inputs):
        raise InputError("--column names the column of Parquet/Arrow inputs given without "
                         ":COLUMN, and there is none: drop --column")


def open_input(item: Input, options: argparse.Namespace) -> Source:
    """The source of one input (checked now: a missing file or column is an InputError)."""
    if item.kind == "npy":
        return cv.npy(item.path)
    if item.kind == "table":
        names = item.columns or options.columns
        if not names:
            raise InputError(f"{item.path}: say which column to read: -i {item.path}:NAME "
                             f"(or --column NAME)")
        columns: str | list[str] = names[0] if len(names) == 1 else list(names)
        if Path(item.path).suffix.lower() in (".parquet", ".pq"):
            return cv.parquet(item.path, columns)
        return cv.arrow(item.path, columns)
    if options.dtype is None:
        raise InputError(f"{item.path} is not .npy, .parquet or .arrow: for a raw binary file "
                         f"give --dtype (e.g. float32) and, for N-D data, --shape -1,3")
    # raw_source: cv.raw whose messages name --dtype and --shape, not dtype= and shape=.
    return raw_source(item.path, _dtype(options.dtype, "--dtype"), _shape(options.shape), 0,
                      names=("--dtype", "--shape"))


def apply_casts(sources: list[Source], inputs: Sequence[Input], params: Sequence[Param],
                casts: Sequence[str]) -> list[Source]:
    """``sources`` with each ``--cast [NAME:]DTYPE`` applied; NAME is the kernel parameter
    that receives the input or the input's ``-i`` text. A cast that names an input wins over
    one for all; two for one input (both named, or both for all) are refused: applied one
    after the other, the second converted the first's values (float64 through int32 to
    float32 lost every fraction, exit 0)."""
    general: str | None = None
    named: dict[int, str] = {}
    for cast in casts:
        name, sep, type_text = cast.rpartition(":")
        _dtype(type_text, f"--cast {cast}", cast=True)
        if not sep:
            if general is not None:
                raise InputError(f"--cast {general} and --cast {cast} both cast every input: "
                                 f"give one, or name the input each is for (--cast NAME:TYPE)")
            general = cast
            continue
        targets = [i for i, item in enumerate(inputs)
                   if name in (item.text, item.path)
                   or (i < len(params) and params[i].name == name)]
        if not targets:
            known = [p.name for p in params[: len(inputs)]] + [i.text for i in inputs]
            raise InputError(f"--cast {cast}: {name!r} is no input; name one of "
                             f"{', '.join(known)}, or give --cast {type_text} for all")
        for index in targets:
            if index in named:
                raise InputError(f"-i {inputs[index].text} is given two casts, --cast "
                                 f"{named[index]} and --cast {cast}: give one (each converts "
                                 f"the file's own values)")
            named[index] = cast
    result = list(sources)
    for index in range(len(result)):
        chosen = named.get(index, general)
        if chosen is None:
            continue
        dtype = _dtype(chosen.rpartition(":")[2], f"--cast {chosen}", cast=True)
        if result[index].dtype != dtype:
            result[index] = CastSource(result[index], dtype,
                                       f"-i {inputs[index].text}: --cast {chosen}")
    return result


class CastSource(Source):
    """Another source's rows converted to ``dtype`` as they are read (on the stream's own
    thread: a cast input is read without the parallel file path). A value ``dtype`` cannot
    hold is an InputError naming ``where`` (the input and its ``--cast``), the value and its
    row, raised mid-stream, before any output is committed: NumPy's cast would wrap it (300
    to int8 is 44), make NaN an integer (INT_MIN) or a large float64 inf. A float's fraction
    is truncated toward zero (3.7 is 3), as ``--arg`` does."""

    def __init__(self, inner: Source, dtype: np.dtype, where: str = "") -> None:
        self.inner = inner
        self.dtype = dtype
        self.shape = inner.shape
        self.name = f"{inner.name} as {dtype}"
        self.where = where or f"--cast {dtype}"
        if np.dtype(inner.dtype).kind not in "biufc":
            raise InputError(f"{self.where}: input {inner.name} holds {inner.dtype} values, "
                             f"not numbers, which have no {dtype} value: write the file's "
                             f"values as numbers first")
        if np.dtype(inner.dtype).kind == "c" and dtype.kind != "c":
            raise InputError(f"{self.where}: the input holds complex {inner.dtype} values, "
                             f"which have no {dtype} value: keep the real part in the file "
                             f"first (np.save('real.npy', np.load('FILE').real)), or write "
                             f"the real and imaginary parts interleaved "
                             f"(np.load('FILE').view(np.float{inner.dtype.itemsize * 4}))")
        self.beside = (self._converted(inner.beside[0], after=False),
                       self._converted(inner.beside[1], after=True))

    def _converted(self, rows: np.ndarray | None, after: bool) -> np.ndarray | None:
        """Halo rows given beside the inner source (``Source.beside``), converted; a value
        refused is named by its row (negative before row 0)."""
        if rows is None:
            return None
        held = np.asarray(rows)
        return self._cast(held, self.shape[0] if after else -len(held))

    def _cast(self, held: np.ndarray, lo: int) -> np.ndarray:
        """``held`` (rows from ``lo``) converted; InputError naming a value it cannot hold."""
        converted, bad = _convert(held, self.dtype)
        if bad is not None:
            raise InputError(self._refusal(held, bad, lo))
        return converted

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo:hi`` of the inner source, converted."""
        rows = self.inner.rows(lo, hi)
        if isinstance(rows, FileRows):
            held = np.empty(rows.shape, self.inner.dtype)
            rows.read_into(held)
        else:
            held = np.asarray(rows)
        return self._cast(held, lo)

    def close(self) -> None:
        """Close the inner source."""
        self.inner.close()

    def _refusal(self, held: np.ndarray, index: int, lo: int) -> str:
        """The message for the value at flat ``index`` of ``held`` (rows from ``lo``)."""
        value = held.reshape(-1)[index]
        row = lo + index // max(int(np.prod(held.shape[1:])), 1)
        head = f"{self.where} cannot hold {value!s} (row {row}): "
        if self.dtype.kind == "f":
            why = (f"past {self.dtype}'s largest finite value ({np.finfo(self.dtype).max!s}) it "
                   f"would become inf")
        elif self.dtype.kind == "b":
            why = "bool holds 0 and 1"
        elif not np.isfinite(value):
            why = f"{self.dtype} is an integer type, with no NaN or infinity"
        else:
            info = np.iinfo(self.dtype)
            why = f"{self.dtype} holds {info.min} to {info.max}"
            if held.dtype.kind == "f":
                why += " (a fraction is truncated toward zero)"
        return f"{head}{why}: cast to a type that holds it, or fix the data"


#: Elements range-checked at a time: the min and the max of a slice this size read it from
#: the cache, so checking a block costs one pass over its memory, not two.
_SLICE = 1 << 16


def _convert(held: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, int | None]:
    """``held`` as ``dtype``, and the flat index of the first value ``dtype`` cannot hold
    (None when every value fits; the array is then the converted one)."""
    if dtype.kind == "f":
        # Too large for dtype overflows to inf, which sets the cast's overflow flag: checked at
        # no extra pass. NaN and inf stay themselves (dtype holds them) and set no flag.
        try:
            with deferred_sigint(), np.errstate(over="raise"):  # whole: interrupts.py
                return held.astype(dtype), None
        except FloatingPointError:
            with deferred_sigint(), np.errstate(over="ignore"):
                converted = held.astype(dtype)
            grown = np.isinf(converted) & ~np.isinf(held)
            return converted, int(np.argmax(grown))
    if dtype.kind == "b":
        converted = held.astype(dtype)
        if held.dtype.kind == "b":
            return converted, None
        wrong = converted != held  # 2, 0.5 and NaN all become True, which is 1
        return converted, int(np.argmax(wrong)) if wrong.any() else None
    if held.dtype.kind in "biu" and np.can_cast(held.dtype, dtype, "safe"):
        return held.astype(dtype), None
    # Open bounds: a float's fraction is truncated, so -128.5 is int8's -128. NumPy's own cast
    # sets no flag for most of these (300.0 to int8 goes through int32), so they are checked.
    info = np.iinfo(dtype)
    low, high = info.min - 1, info.max + 1
    flat = held.reshape(-1)
    for start in range(0, flat.size, _SLICE):
        part = flat[start:start + _SLICE]
        # .item(): Python numbers, compared exactly (int64's bounds are not all float64s);
        # NaN compares false, so it fails too.
        if not (low < part.min().item() and part.max().item() < high):
            return held, start + next(i for i, v in enumerate(part.tolist())
                                      if not low < v < high)
    return held.astype(dtype), None


def _dtype(text: str, where: str, cast: bool = False) -> np.dtype:
    """``text`` as a numeric dtype; a cast's target in this machine's byte order (kernels read
    no other: ``--cast x:>f4`` was taken, then refused with Python advice)."""
    try:
        dtype = np.dtype(text)
    except (TypeError, ValueError, SyntaxError):  # NumPy parses "f4,(" as Python: SyntaxError
        raise InputError(f"{where}: {text!r} is not a NumPy dtype: use e.g. float32") from None
    if dtype.kind == "c":
        raise InputError(f"{where}: {dtype}: kernels have no complex type, so the command "
                         f"takes real types only (bool, int, uint, float): use e.g. float32")
    if dtype.hasobject or dtype.kind not in "biuf":
        raise InputError(f"{where}: {dtype} is not a numeric dtype: use e.g. float32")
    if cast and not dtype.isnative:
        native = dtype.newbyteorder("=").name
        # "--cast x:>f4": x; "--cast my x.npy:>f4": my x.npy; "--cast >f4": none
        name = where.removeprefix("--cast ").rpartition(":")[0]
        raise InputError(f"{where}: {text} is not in this machine's byte order, which kernels "
                         f"read: cast to {native} (--cast {name + ':' if name else ''}{native})")
    return dtype


def _shape(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        shape = tuple(int(part) for part in text.replace("x", ",").split(",") if part.strip())
    except ValueError as exc:
        raise InputError(f"--shape {text!r}: give integers separated by commas, e.g. -1,3")\
            from exc
    if not shape:
        raise InputError(f"--shape {text!r} names no axis: give integers separated by commas, "
                         f"e.g. -1,3 (rows of 3), or leave --shape out for one value per row")
    return shape
