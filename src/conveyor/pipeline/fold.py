"""The host fold of a reduction's partials, in block order, as they come.

A stream's blocks retire one after another; each gives a partial (a kernel's fold of its
per-element values, or a callable's return value). These were kept in a list and folded once
after the last block: a callable returning a histogram per block held one per block (10**4
blocks of ``np.bincount(x, minlength=K)``, 10**4 histograms at once), and a custom
``reduce=f`` first ran after the last block. A :class:`Fold` folds each partial as soon as
every earlier block's has come: on one device that is at once (blocks retire in order); over
several devices a partial that comes before an earlier block's waits in ``pending``. That is
about the devices' rings' worth while they keep pace; behind a device that stalls on one
block, the others' partials wait for it, up to their share of the stream (nothing slows a
device that runs ahead of the fold).

The result is what ``functools.reduce`` over the partials in block order gives, with
``np.sum``'s rules for ``"sum"`` (``reduce.widened``), Python's ``min``/``max`` for Python
ints (no overflow past int64), and a total in the type NumPy promotes the partials to (float16
partials added in float32, float32 and complex64 ones in float64 and complex128, given back
narrow; float64 beside a Python number). A tuple or list
partial is folded element by element, each element as a partial of its own (a histogram and
a count, an int64 and a float: stacking them into one array made NumPy's ValueError, or
an int64 past 2**53 a float64), and the total is a tuple (list) of the elements' totals.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from conveyor.errors import InputError
from conveyor.interrupts import deferred_sigint, interruptible


class WideHalves:
    """A total of narrow float partials (float16, float32, complex64) kept in the wider type
    it was added in, not yet cast back to ``dtype``: what a part of a reduction gives inside
    :func:`halves_kept_wide` (``conveyor.dask`` folds the chunks' totals; each cast on its own
    turned 30000 + 30000 + ... into inf and inf - inf into nan for float16, 3e38 + 3e38 into
    inf for float32, where ``cv.stream`` over the whole array gives 0). A fold takes it as a
    ``dtype`` partial of that value. ``floats``: for a total of integer partials, their sum in
    float64 (``Fold._floats``), for a float partial of a later part (an int64 total that
    wrapped in one Dask chunk, then a float chunk: np.sum adds every integer as float64)."""

    __slots__ = ("total", "dtype", "floats")

    def __init__(self, total: Any, dtype: Any = np.float16, floats: Any = None) -> None:
        self.total = total
        self.dtype = np.dtype(dtype)
        self.floats = floats

    def __reduce__(self) -> tuple[Any, ...]:  # sent between Dask workers
        return (WideHalves, (self.total, self.dtype.str, self.floats))


_keep_wide: contextvars.ContextVar[bool] = contextvars.ContextVar("keep_wide", default=False)


@contextlib.contextmanager
def halves_kept_wide() -> Iterator[None]:
    """Within: a sum of float16 partials gives :class:`WideHalves`, not a float16 total (for
    a total that is itself a partial of a larger reduction)."""
    token = _keep_wide.set(True)
    try:
        yield
    finally:
        _keep_wide.reset(token)


class Fold:
    """Partials of ``op`` folded in block order (:meth:`add`); :meth:`result` the total.
    Thread-safe: the engines of a stream over several devices add theirs from their own
    threads. ``element``/``kernel``: what the sum of no partials is (``reduce.empty_sum``)."""

    def __init__(self, op: str | Callable[[Any, Any], Any], element: np.dtype | None = None,
                 *, kernel: bool = False) -> None:
        self.op = op
        self.element = element
        self.kernel = kernel
        self.total: Any = None
        self.count = 0  # partials folded (None partials are skipped)
        self.pending: dict[int, Any] = {}  # block -> partial, come before an earlier block's
        self._next = 0  # the block whose partial is folded next
        self._first: tuple[int, tuple[int, ...]] | None = None  # (block, shape) of the first
        # The type NumPy promotes the partials to (None: none yet; off once a Python number
        # came, which np.sum's array coercion makes float64): a float16 or float32 total is
        # added wider and given back in it (one by one in float32, 2**24 + 1.0 ... stayed
        # 2**24).
        self._dtype: np.dtype | None = None
        self._dtype_off = False
        # While every partial of a "sum" is an integer (or bool): their sum in float64 too,
        # for the float partial that may come. np.sum of all the partials then promotes each
        # integer to float64 before adding, where the int64 total had wrapped (-2**63 + 5
        # and -7 gave +9.2e18, a sign flip).
        self._floats: Any = None
        self._parts: list[Fold] | None = None  # tuple or list partials: a fold per element
        self._kind: type = tuple  # ... and the type of block 0's (its total's type)
        # ... or, while every one holds numbers of one type, one fold of them as an array
        # (a fold per element of 4096-number lists took 1000 times longer), and that type.
        self._flat: Fold | None = None
        self._flat_type: type | None = None
        self._lock = threading.Lock()

    def add(self, partial: Any, block: int) -> None:
        """Block ``block``'s partial (blocks count from 0); folded with every later one that
        is pending once the blocks before it have come."""
        with self._lock:
            self.pending[block] = partial
            while self._next in self.pending:
                self._fold(self.pending.pop(self._next), self._next)
                self._next += 1

    def result(self) -> Any:
        """The folded total; with no partial, ``sum`` gives ``empty_sum`` (0, as NumPy
        does) and anything else None."""
        from conveyor.pipeline.reduce import empty_sum

        if not self.count:
            return empty_sum(self.element, kernel=self.kernel) if self.op == "sum" else None
        if self._flat is not None:
            flat = self._flat.result()
            if isinstance(flat, WideHalves):  # each element carried wide (and its floats)
                if _keep_wide.get():
                    floats = flat.floats
                    return self._made([
                        WideHalves(total, flat.dtype, None if floats is None else floats[i])
                        for i, total in enumerate(flat.total)])
                flat = flat.total.astype(flat.dtype)
            return self._made(flat.tolist() if self._python_totals() else list(flat))
        if self._parts is not None:
            return self._made([part.result() for part in self._parts])
        narrow = self._dtype
        if self.op == "sum" and _keep_wide.get() and self._floats is not None and \
                _int_kind(self.total):
            # integers: their float64 sum goes along, for a float in a later part
            return WideHalves(self.total, narrow if narrow is not None else self.total.dtype,
                              self._floats)
        if self.op == "sum" and not self._dtype_off and narrow is not None and \
                getattr(self.total, "dtype", narrow) != narrow:
            # Added wider (reduce.widened): kept wide, with the partials' own type, while it
            # is a part of a larger reduction (Dask's chunks: an int8 chunk's int64 total
            # beside a float16 one's is float16, as np.sum of all the partials); a float or
            # complex total given back in that type, as np.sum gives it.
            if _keep_wide.get():
                return WideHalves(self.total, narrow)
            if narrow.kind in "fc":
                return self.total.astype(narrow)
        return self.total

    def _made(self, totals: list[Any]) -> Any:
        """The total of tuple or list partials: block 0's kind holding ``totals`` (a named
        tuple is made from its fields; a tuple or list from an iterable)."""
        return self._kind(*totals) if hasattr(self._kind, "_fields") else self._kind(totals)

    def _fold(self, partial: Any, block: int) -> None:
        if partial is None:
            return
        op = self.op
        if not isinstance(op, str):
            if not self.count:
                # The total is the fold's own: an f that adds into its first argument
                # (a[k] += v) changed block 0's object, which the callable may hold (a
                # shared empty dict returned for blocks with nothing).
                self.total = (partial if isinstance(partial, np.ndarray | np.generic | int
                                                    | float | complex)
                              else copy.deepcopy(partial))
            else:
                self.total = _returning(op)(self.total, partial)
            self.count += 1
            return
        # Lists and tuples fold element by element ("sum" once joined them end to end).
        if isinstance(partial, list | tuple) or self._parts is not None or \
                self._flat is not None:
            self._fold_parts(partial, block)
            return
        value = partial
        kind: np.dtype | None = None
        carried = None  # a part's integers' float64 sum
        if isinstance(value, WideHalves):  # a part's wide total: a partial of its own type
            kind, value, carried = value.dtype, value.total, value.floats
        self._check(value, block)
        if kind is None and isinstance(value, np.ndarray | np.generic):
            kind = value.dtype
        elif kind is None and isinstance(value, bool):
            kind = np.dtype(np.bool_)  # NumPy lets a bool widen no float (max of float32, True)
        integers_so_far = self._dtype is None or self._dtype.kind in "biu"
        if kind is not None:
            self._dtype = kind if self._dtype is None else np.result_type(self._dtype, kind)
        else:
            self._dtype_off = True
        if op == "sum":
            from conveyor.pipeline.reduce import widened

            value = widened(value)
            # A float partial, or an unsigned one beside signed (int64 and uint64 promote to
            # float64): the integers so far, each as float64, as np.sum adds them.
            promoted = self._dtype is not None and self._dtype.kind in "fc"
            if self.count and integers_so_far and self._floats is not None and \
                    (_inexact(value) or promoted):
                self.total = self._floats
            self._floats = _integers_as_floats(self._floats, value, carried) \
                if integers_so_far and (not self.count or self._floats is not None) else None
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]  # a 0-d array is its scalar, as np.sum of partials gives it
        if self._dtype_off:
            # A Python number among the partials: NumPy's array of them is float64 (or
            # complex128), so float16 + 1e-9 is not rounded in float32, nor max(float16,
            # 1e5) inf.
            value = _double(value)
        if not self.count:
            self.total, self.count = value, 1
            return
        total = self.total
        if self._dtype_off:
            total = _double(total)
        elif op == "sum" and self._dtype is not None and self._dtype.kind in "iu":
            # Integers of both signs (or bools, widened to int64) together: np.sum gives the
            # promoted kind (int64 and uint8: exact int64; bool and uint64: exact uint64),
            # where int64 beside uint64 was float64.
            total, value = _as_kind(total, self._dtype.kind), _as_kind(value, self._dtype.kind)
        try:
            if _python_int_pair(total, value):
                # Python ints past int64 (with a NumPy integer too): NumPy raised
                # OverflowError ("Python int too large to convert to C long"). Exact.
                total, value = int(total), int(value)
                self.total = (total + value if op == "sum"
                              else (min if op == "min" else max)(total, value))
            elif op == "sum" and _int_kind(total) and _int_kind(value):
                # NumPy scalars check overflow where arrays wrap: np.sum of the same values
                # wraps (warned, or raised under np.errstate(over="raise")).
                with deferred_sigint(), np.errstate(over="ignore"):  # whole: interrupts.py
                    self.total = combiner(op)(total, value)
            else:
                self.total = combiner(op)(total, value)
        except OverflowError as exc:  # a NumPy value past its type beside a Python int
            raise InputError(
                f"reduce={op!r} cannot fold the callable's partials ({type(total).__name__} "
                f"and {type(value).__name__}: {exc}): return Python ints, or NumPy values of "
                f"one type") from exc
        except TypeError as exc:  # dict partials, say: np.add has no loop for them
            kinds = sorted({type(total).__name__, type(value).__name__})
            raise InputError(
                f"reduce={op!r} cannot fold the callable's partials ({', '.join(kinds)}: "
                f"{exc}): return a number or a numeric array, or pass reduce=f, a function "
                f"that folds two partials") from exc
        self.count += 1

    def _fold_parts(self, partial: Any, block: int) -> None:
        """A tuple or list partial: each element folded by a fold of its own (as one array
        while every partial holds numbers of one type: the same totals)."""
        first = self._first if self._first is not None else (block, ())
        if self._flat is not None:
            kind = _flat_type(partial) if isinstance(partial, list | tuple) else None
            if kind is not None and kind is self._flat_type and \
                    len(partial) == self._first[1][0]:  # type: ignore[index]
                self._flat._fold(_as_array(partial, kind), block)
                self.count += 1
                return
            self._unflatten()
        elif self._parts is None and not self.count and isinstance(partial, list | tuple):
            kind = _flat_type(partial)
            if kind is not None:
                self._flat, self._flat_type = Fold(self.op, self.element,
                                                   kernel=self.kernel), kind
                self._kind, self._first = type(partial), (block, (len(partial),))
                self._flat._fold(_as_array(partial, kind), block)
                self.count += 1
                return
        if not isinstance(partial, list | tuple) or (self._parts is None and self.count):
            raise InputError(
                f"reduce={self.op!r}: the callable's partial of block {block} is "
                f"{type(partial).__name__}, block {first[0]}'s was "
                f"{self._kind.__name__ if self._parts is not None else 'not a tuple or list'}: "
                f"every block must return a partial of one kind and shape")
        if self._parts is None:
            self._parts = [Fold(self.op, self.element, kernel=self.kernel) for _ in partial]
            self._kind, self._first = type(partial), (block, (len(partial),))
        elif len(partial) != len(self._parts):
            raise InputError(
                f"reduce={self.op!r}: the callable's partial of block {block} has "
                f"{len(partial)} elements, block {first[0]}'s {len(self._parts)}: every block "
                f"must return a partial of one shape")
        for part, element in zip(self._parts, partial, strict=True):
            part._fold(element, block)
        self.count += 1

    def _unflatten(self) -> None:
        """From one array fold to a fold per element, each holding its element's total so far
        (a later partial holds other types, or another length: refused as such below)."""
        flat = self._flat
        assert flat is not None and self._first is not None
        totals = flat.total.tolist() if self._python_totals() else list(flat.total)
        parts: list[Fold] = []
        for index, total in enumerate(totals):
            part = Fold(self.op, self.element, kernel=self.kernel)
            part.total, part.count = total, flat.count
            part._dtype, part._dtype_off = flat._dtype, flat._dtype_off
            if flat._floats is not None:  # each element's integers, as float64
                part._floats = flat._floats[index]
            if self._flat_type in _PYTHON_NUMBERS:  # Python numbers (an object array here)
                part._dtype, part._dtype_off = None, True
            part._first = (self._first[0], ())
            parts.append(part)
        self._parts, self._flat, self._flat_type = parts, None, None

    def _python_totals(self) -> bool:
        """Whether a fold per element of the flat partials would hold Python numbers: ints
        (exact, min and max too), and floats or complexes summed or not yet folded;
        ``np.maximum`` of two Python floats is an ``np.float64`` (a Python float total let a
        later float16 partial cast it down: 1e301 became inf)."""
        flat = self._flat
        assert flat is not None
        return self._flat_type is int or (
            self._flat_type in _PYTHON_NUMBERS and (self.op == "sum" or flat.count == 1))

    def _check(self, value: Any, block: int) -> None:
        """InputError for a partial ``"sum"``/``"min"``/``"max"`` cannot fold, and for one of
        another shape than the first block's (NumPy would broadcast a shape of one into
        every bin of the others, or fail with a raw ValueError)."""
        op = self.op
        if not _numeric(value):
            # Refused over one block as over many: one block's partial was never folded, so
            # a dict came back as the total there and was refused only with two blocks.
            raise InputError(
                f"reduce={op!r} cannot fold the callable's partials ({type(value).__name__}: "
                f"{op} takes numbers): return a number or a numeric array, or pass reduce=f, "
                f"a function that folds two partials")
        if self._first is None:
            self._first = (block, np.shape(value))
        elif np.shape(value) != self._first[1]:
            first_block, first_shape = self._first
            raise InputError(
                f"reduce={op!r}: the callable's partial of block {block} has shape "
                f"{np.shape(value)}, block {first_block}'s {first_shape}: every block must "
                f"return a partial of one shape (for counts, np.bincount(x, minlength=K))")


def combine(op: str | Callable[[Any, Any], Any], partials: Sequence[Any],
            element: np.dtype | None = None, *, kernel: bool = False) -> Any:
    """Fold ``partials`` (block ``k``'s at ``k``; None for none) in block order: what a
    :class:`Fold` of them gives."""
    fold = Fold(op, element, kernel=kernel)
    for block, partial in enumerate(partials):
        fold.add(partial, block)
    return fold.result()


def combiner(op: str | Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """The host function that folds two partials for ``op``."""
    if callable(op):
        return op
    if op == "sum":
        return lambda a, b: a + b
    if op == "min":
        return lambda a, b: np.minimum(a, b)
    if op == "max":
        return lambda a, b: np.maximum(a, b)
    raise InputError(f"reduce={op!r}: use 'sum', 'min', 'max' or a function f(a, b)")


def _returning(f: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``f``, with an InputError where it returns None (a forgotten ``return``): the next
    fold would get None, and a stream of two blocks would give None as its result."""
    def checked(a: Any, b: Any) -> Any:
        with interruptible():  # a slow f stops on Ctrl-C, as the compute callable does
            folded = f(a, b)
        if folded is None:
            name = getattr(f, "__name__", "f")
            raise InputError(
                f"reduce={name} returned None: it must return the folded value of its two "
                f"arguments (a function that adds into its first one ends with 'return a')")
        return folded
    return checked


def _numeric(partial: Any) -> bool:
    """Whether ``reduce="sum"``/``"min"``/``"max"`` can fold ``partial``: a number, or a
    NumPy array or scalar of numbers, dates or durations (or objects: Python's own numbers,
    past 64 bits, whose fold says what it cannot add)."""
    import numbers

    if isinstance(partial, np.ndarray | np.generic):
        return partial.dtype.kind in "biufcmMO"
    return isinstance(partial, numbers.Number)


#: Python's numbers, folded as an object array (ints exact past int64) or as float64/complex.
_PYTHON_NUMBERS = (int, float, complex)


def _flat_type(partial: list[Any] | tuple[Any, ...]) -> type | None:
    """The one type of every element of ``partial`` when it can be folded as one array with
    the totals a fold per element gives: Python ints, floats or complexes, or NumPy numeric
    scalars of one dtype; None otherwise (bools, mixed types, arrays, nested sequences)."""
    if len(partial) < 2:
        return None
    kind = type(partial[0])
    if not all(type(element) is kind for element in partial):
        return None
    if kind in _PYTHON_NUMBERS:
        return kind
    if issubclass(kind, np.generic) and np.dtype(kind).kind in "biufc":
        return kind
    return None


def _as_array(partial: list[Any] | tuple[Any, ...], kind: type) -> np.ndarray:
    """``partial``'s elements as one array: Python ints as objects (exact), the rest as their
    type's dtype."""
    return np.array(partial, dtype=object if kind is int else None)


def _python_int_pair(total: Any, value: Any) -> bool:
    """Both whole numbers of Python or NumPy scalars (not arrays; a bool too), one of them a
    Python int: folded as Python ints."""
    whole = (int, np.integer, np.bool_)
    return (isinstance(total, whole) and isinstance(value, whole)
            and (type(total) is int or type(value) is int))


def _int_kind(value: Any) -> bool:
    return isinstance(value, np.ndarray | np.integer) and value.dtype.kind in "iu"


def _double(value: Any) -> Any:
    """A NumPy float or complex narrower than 64 bits (128 complex) as float64
    (complex128); anything else as it is."""
    dtype = getattr(value, "dtype", None)
    if not isinstance(value, np.ndarray | np.generic) or dtype is None:
        return value
    if dtype.kind == "f" and dtype.itemsize < 8:
        return value.astype(np.float64)
    if dtype.kind == "c" and dtype.itemsize < 16:
        return value.astype(np.complex128)
    return value


def _inexact(value: Any) -> bool:
    """Whether ``value`` is a float or complex (NumPy's or Python's), scalar or array."""
    if isinstance(value, np.ndarray | np.generic):
        return value.dtype.kind in "fc"
    return isinstance(value, float | complex)


def _integers_as_floats(floats: Any, value: Any, carried: Any = None) -> Any:
    """``floats`` (the float64 sum of the integer partials so far, None before the first)
    plus the integer partial ``value`` (a NumPy integer, or a Python int: a bool's 1 or 0 is
    one) as float64; None once ``value`` is neither (a float ends the integers) or is past
    float64. (A Python bool among NumPy integers made the total a Python int, which NumPy
    then added to a float16's float32 in float32: 2**24 + 1 lost its 1.) ``carried``: the
    float64 sum a part's total came with (``WideHalves.floats``), taken for ``value``'s."""
    if carried is not None and isinstance(value, np.ndarray | np.generic) and \
            value.dtype.kind in "iu":
        as_float = carried
    elif isinstance(value, np.ndarray | np.generic) and value.dtype.kind in "iu":
        as_float = value.astype(np.float64)
    elif isinstance(value, int) and not isinstance(value, np.generic):
        try:
            as_float = np.float64(value)
        except OverflowError:
            return None
    else:
        return None
    return as_float if floats is None else floats + as_float


def _as_kind(value: Any, kind: str) -> Any:
    """A NumPy integer as int64 (``kind`` "i") or uint64 ("u"), wrapping as np.sum's total
    does; anything else (floats, Python ints) as it is."""
    if isinstance(value, np.ndarray | np.generic) and value.dtype.kind in "iu" and \
            value.dtype.kind != kind:
        return value.astype(np.int64 if kind == "i" else np.uint64)
    return value
