"""A stream's options, checked and normalised once at the top of ``cv.stream``.

What is unambiguous is accepted: an integral float for a count or a size (``depth=3.0``,
``block_bytes=1e5``), a size string with a unit (``memory_limit="1GiB"``), one bare array,
path or dtype where a list of inputs or outputs is expected. Everything else is an
:class:`InputError` naming the parameter, what was given and what is accepted, raised before
any work.
"""

from __future__ import annotations

import array
import math
import numbers
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from conveyor import config
from conveyor.errors import InputError
from conveyor.interrupts import deferred_sigint


@dataclass(frozen=True)
class StreamOptions:
    """The options of one stream, as plain Python values: made once at the top of
    ``cv.stream`` and passed down to the plan and the engine."""

    depth: int = 3
    block_bytes: int | None = None
    memory_limit: int | None = None
    halo: int = 0
    workers: int | None = None
    args: tuple[Any, ...] = ()
    reduce: str | Callable[[Any, Any], Any] | None = None
    #: None until stream() has decided (on where the device shares memory with the host).
    zero_copy: bool | None = None
    progress: bool = False
    strict: bool = False
    #: Call a callable compute once on the first rows before the stream (pipeline/step.py).
    warmup: bool = True
    #: The halo's rows past either end (pipeline/halo.py): "nearest", "reflect", "periodic"
    #: or a number.
    boundary: str | int | float | complex = "nearest"
    #: The row of a larger whole array that the inputs' row 0 is: offsets count from there.
    first_row: int = 0

    @classmethod
    def parse(cls, *, depth: Any = 3, block_bytes: Any = None, memory_limit: Any = None,
              halo: Any = 0, workers: Any = None, args: Any = (), reduce: Any = None,
              zero_copy: Any = None, progress: Any = False, strict: Any = None,
              warmup: Any = True, boundary: Any = "nearest",
              first_row: Any = 0) -> StreamOptions:
        """Check and normalise the options as ``cv.stream`` received them; InputError for
        anything that cannot be meant as one value. ``strict=None`` is the configured
        default (``CONVEYOR_STRICT``)."""
        return cls(
            depth=count("depth", depth, 1, "at least 1",
                        "an int of 1 or more (blocks in flight), e.g. depth=3"),
            block_bytes=size("block_bytes", block_bytes),
            memory_limit=size("memory_limit", memory_limit),
            halo=count("halo", halo, 0, "0 or more rows",
                       "an int of 0 or more (rows each side of a block)"),
            workers=None if workers is None else _workers(workers),
            args=scalar_args(args),
            reduce=reduce_op(reduce),
            zero_copy=None if zero_copy is None else flag("zero_copy", zero_copy),
            progress=flag("progress", progress),
            strict=config.strict_mode() if strict is None else flag("strict", strict),
            warmup=flag("warmup", warmup),
            boundary=_boundary(boundary),
            first_row=_first_row(first_row),
        )


flag = config.flag  # ``value`` as a bool, or InputError naming ``name`` (config.flag)


def reduce_op(value: Any) -> Any:
    """``reduce=`` with Python's and NumPy's whole-array folds taken as their names:
    ``reduce=sum`` (the quotes forgotten) was called as ``sum(total, partial)``, which adds
    the first's elements onto the second (a wrong total with array partials, a raw TypeError
    with scalars); ``np.max(total, partial)`` reads the second as an axis."""
    import builtins

    named = {builtins.sum: "sum", builtins.min: "min", builtins.max: "max",
             np.sum: "sum", np.min: "min", np.max: "max", np.amin: "min", np.amax: "max"}
    try:
        refused = _WHOLE_ARRAY_FOLDS.get(value)
        found = named.get(value, value)
    except TypeError:  # unhashable: a callable object with __eq__ and no __hash__
        refused, found = None, value
    if refused is None and found is value and callable(value):  # not a name taken
        unpaired = _not_pairwise(value)
        if unpaired is not None:
            name = getattr(value, "__name__", repr(value))
            raise InputError(f"reduce={name}: conveyor calls reduce(total, partial) with two "
                             f"partials, and {unpaired}")
    if refused is not None:
        name = getattr(value, "__name__", repr(value))
        raise InputError(
            f"reduce={name}: it folds the elements of one array (a second argument is read as "
            f"an axis or refused), but conveyor calls reduce(total, partial) with two partials: "
            f"{refused}")
    return found


def _whole_array_folds() -> dict[Any, str]:
    """NumPy's and Python's whole-array folds that conveyor takes by no name, each with what
    to give instead (``np.prod(total, partial)`` read the partial as an axis: NumPy's
    TypeError after every block had run)."""
    import builtins
    import math
    import statistics

    mean = "give reduce='sum' and divide the result by the number of values"
    spread = ("a spread cannot be folded from two partials: reduce to sums of x and of x*x "
              "(two outputs, or a tuple partial) and combine them afterwards")
    return {
        np.prod: "give reduce=np.multiply", np.nanprod: "give reduce=np.multiply",
        math.prod: "give reduce=np.multiply",
        np.mean: mean, np.average: mean, np.nanmean: mean,
        np.median: "a median cannot be folded from partials: stream the values out and take "
                   "np.median of the result",
        np.std: spread, np.var: spread, np.nanstd: spread, np.nanvar: spread,
        np.nanmedian: "a median cannot be folded from partials: stream the values out and "
                      "take np.nanmedian of the result",
        np.percentile: "a percentile cannot be folded from partials: stream the values out",
        np.nanpercentile: "a percentile cannot be folded from partials: stream the values out",
        np.quantile: "a quantile cannot be folded from partials: stream the values out",
        np.nanquantile: "a quantile cannot be folded from partials: stream the values out",
        np.ptp: "reduce='min' and reduce='max' (two streams, or a tuple partial (min, max) "
                "with reduce=f) and subtract",
        np.count_nonzero: "give reduce='sum' of each block's count",
        np.nansum: "give reduce='sum' (leave NaN values out in the kernel or callable)",
        # np.fmin/np.fmax take two partials and skip NaN as these do ('min'/'max' spread it).
        np.nanmin: "give reduce=np.fmin", np.nanmax: "give reduce=np.fmax",
        math.fsum: "give reduce='sum'",
        statistics.mean: mean, statistics.fmean: mean,
        statistics.median: "a median cannot be folded from partials: stream the values out",
        np.all: "give reduce=np.logical_and", builtins.all: "give reduce=np.logical_and",
        np.any: "give reduce=np.logical_or", builtins.any: "give reduce=np.logical_or",
    }


_WHOLE_ARRAY_FOLDS = _whole_array_folds()


def _not_pairwise(value: Any) -> str | None:
    """What to give instead where ``value`` cannot be ``f(total, partial)``: a ufunc's
    ``reduce``/``accumulate``/``reduceat`` (``np.add.reduce(total, partial)`` reads the partial
    as an axis), or a function whose signature takes fewer than two positional arguments or
    needs more; None where it may be one (or says nothing of itself). Parameter names say
    nothing: ``lambda p, q: p + q`` is a fold of two partials."""
    import inspect

    owner = getattr(value, "__self__", None)
    name = getattr(value, "__name__", "")
    if isinstance(owner, np.ufunc) and name in ("reduce", "accumulate", "reduceat"):
        return (f"np.{owner.__name__}.{name} reads a second argument as an axis: give the "
                f"ufunc itself, reduce=np.{owner.__name__}")
    if isinstance(value, np.ufunc):
        return None if value.nin == 2 else f"np.{value.__name__} takes {value.nin} arguments"
    try:
        # Not followed to a __wrapped__ function first: a functools.wraps adapter of two
        # arguments around a function of one was refused for the wrapped one's signature.
        # (NumPy's dispatchers have none of their own: theirs is the wrapped function's.)
        try:
            signature = inspect.signature(value, follow_wrapped=False)
        except (TypeError, ValueError):
            signature = inspect.signature(value)
        params = list(signature.parameters.values())
    except (TypeError, ValueError):
        return None  # a builtin with no signature: it says at its first call
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keywords = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if keywords:
        return (f"it needs the keyword argument(s) {', '.join(keywords)}, which conveyor does "
                f"not pass: bind them first, e.g. functools.partial(f, {keywords[0]}=...)")
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    if len(positional) < 2:
        return (f"it takes {len(positional)} positional argument(s): give a function of two, "
                f"f(total, partial)")
    required = [p for p in positional[2:] if p.default is p.empty]
    if required:
        return (f"it needs {len(positional)} positional arguments: give a function of two, "
                f"f(total, partial)")
    module = getattr(value, "__module__", None) or ""
    if module.split(".")[0] in ("numpy", "statistics") and positional[1].default \
            is not positional[1].empty:
        # NumPy's and statistics' functions of one array and options (np.cumsum(a, axis),
        # np.sort, np.unique, statistics.stdev(data, xbar)): the partial read as the option.
        return (f"{module}.{name} takes one array and reads a second argument as an option: "
                f"give a function of two partials, e.g. reduce=np.add")
    return None


#: The range of ``first_row`` (and of every element offset a stream passes): a signed 64-bit
#: integer, which a kernel's ``ulong offset`` reads in two's complement (pipeline/step.py).
FIRST_ROW_RANGE = (-(1 << 63), (1 << 63) - 1)


def _first_row(value: Any) -> int:
    """``first_row`` as an int: an int or a NumPy integer, negative too, within a signed
    64-bit integer; InputError otherwise (bools and floats included: a row index is no
    count, and ``2.5`` or ``True`` is a mistake). Whether the offsets of every row fit is
    checked with the rows (pipeline/step.py: check_offsets)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        kind = "" if value is None else _kind(value)
        raise InputError(f"first_row={value!r}{kind}: first_row takes an int (or a "
                         f"NumPy integer), the row of the whole array that the inputs' row 0 "
                         f"is")
    row = int(value)
    low, high = FIRST_ROW_RANGE
    if not low <= row <= high:
        raise InputError(f"first_row={row} lies outside a signed 64-bit integer ({low} to "
                         f"{high}): a kernel's ulong offset would wrap around and repeat the "
                         f"offsets of other rows. Pass the row of the whole array that the "
                         f"inputs' row 0 is, within that range")
    return row


#: The most staging threads a stream may ask for (``workers=``, ``--workers``). The pool
#: starts a thread per piece copied at once (8 MiB pieces, at most 4 per worker and block),
#: so an unbounded ``workers=99999999999`` was accepted and started one thread per 8 MiB of
#: every block: about 2,000 for a 16 GiB block (29 for a 256 MiB one, against 3 by default
#: on 4 cores). Past about 16, host memcpy gains nothing (stage.py: default_workers).
MAX_WORKERS = 1024


def _workers(value: Any) -> int:
    """``workers=`` as an int from 1 to ``MAX_WORKERS``; InputError giving that range
    otherwise (a larger number is refused, not capped: it is a mistake, not a wish)."""
    accepted = (f"None (the default number) or an int from 1 to {MAX_WORKERS} (staging "
                f"threads)")
    number = count("workers", value, 1, "at least 1", accepted)
    if number > MAX_WORKERS:
        raise InputError(f"workers={value!r} is more staging threads than conveyor starts: "
                         f"workers takes {accepted}; a few (the default: three per four cores, "
                         f"at most 16) saturate host memory copies")
    return number


def count(name: str, value: Any, minimum: int, must: str, accepted: str) -> int:
    """``value`` as an int of at least ``minimum``: an int, a NumPy integer or an integral
    float; InputError (naming ``name``, saying it ``must`` be so and what it ``accepted``)
    for anything else."""
    number = _whole(value)
    if number is None:
        raise InputError(f"{name}={value!r}{_kind(value)} is not a whole number: {name} takes "
                         f"{accepted}")
    if number < minimum:
        raise InputError(f"{name} must be {must}, got {value!r}: {name} takes {accepted}")
    return number


def size(name: str, value: Any) -> int | None:
    """``value`` as bytes (an int), or None: an int, an integral float (``1e5``) or a size
    string (``"512MiB"``, ``"1.5GB"``); InputError (naming ``name``) for anything else."""
    if value is None:
        return None
    if isinstance(value, str):
        return config.parse_size(name, value)
    number = _whole(value)
    if number is None:
        raise InputError(f"{name}={value!r}{_kind(value)} is not a whole number of bytes: "
                         f"{name} takes None, {config.SIZE_FORMS}")
    if number < 0:  # refused where it is given (a Dask graph's options reach a worker later)
        raise InputError(f"{name}={value!r} is negative: give a number of bytes, or a size "
                         f"such as '64MiB'")
    return config.check_size_cap(name, value, number)


def _whole(value: Any) -> int | None:
    """An int for an int, a NumPy integer or an integral finite float; None otherwise (bools
    too: ``depth=True`` is a mistake, not 1)."""
    if isinstance(value, bool | np.bool_):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Rational):  # a Fraction: exact, however large
        return int(value.numerator) if value.denominator == 1 else None
    if isinstance(value, numbers.Real):
        try:
            as_float = float(value)
        except OverflowError:
            return None
        if math.isfinite(as_float) and as_float.is_integer():
            return int(as_float)
    return None


def _kind(value: Any) -> str:
    """`` (a str)`` for values whose repr does not show their type."""
    if isinstance(value, int | float):
        return ""
    return f" (a {type(value).__name__})"


def scalar_args(value: Any) -> tuple[Any, ...]:
    """``args=`` as a tuple (one scalar alone is a tuple of one); InputError otherwise."""
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return tuple(value)
    if isinstance(value, numbers.Number | np.generic):
        return (value,)  # one scalar argument
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return (value,)  # a 0-d array is one scalar, as it is inside a tuple
    raise InputError(f"args={value!r}{_kind(value)}: args takes a tuple of kernel arguments, "
                     f"e.g. args=(2.0, 7), or args=(table,) for one array or resident table")


def _boundary(value: Any) -> str | int | float | complex:
    if isinstance(value, str) and value in ("nearest", "reflect", "periodic"):
        return value
    if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
        # A complex constant, for complex inputs (np.pad takes one); each part is checked
        # against the input's type by halo.constant.
        return complex(value)  # 2+0j too: a complex constant is refused for real inputs
    if isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_):
        number = value.item() if isinstance(value, np.generic) else value
        if isinstance(number, numbers.Integral):
            return int(number)
        try:
            with deferred_sigint(), np.errstate(over="ignore"):  # whole: interrupts.py
                constant = float(number)
        except OverflowError:  # a Fraction past float64's range
            constant = math.inf
        if math.isinf(constant) and bool(np.isfinite(number) if isinstance(number, np.generic)
                                          else not isinstance(number, float)):
            # np.longdouble('1e4000') became inf, a Fraction raised: a finite number past
            # every float type the pad rows are made in
            top = float(np.finfo(np.float64).max)
            raise InputError(f"boundary={value!r} lies past float64's range (finite values "
                             f"within ±{top!r}), so the pad rows cannot hold it: pass a "
                             f"constant in that range (or float('inf'))")
        return constant
    flag = (f" (a bool is no constant: pass {int(value)} for the rows past the ends)"
            if isinstance(value, bool | np.bool_) else _kind(value))
    raise InputError(f"boundary={value!r}{flag}: boundary takes 'nearest' (repeat the "
                     f"edge row), 'reflect' (mirror, edge row included), 'periodic' (wrap "
                     f"around) or a number (a constant)")


def as_inputs(value: Any) -> list[Any]:
    """``inputs`` as a list: a list or tuple as given; one array, path or source alone is a
    list of one."""
    if value is None:
        raise InputError("inputs=None: inputs takes a list of arrays or files, e.g. [a, b]")
    if isinstance(value, range) or (
            isinstance(value, list | tuple) and len(value) > 1
            and all(_is_number(item) for item in value)):
        # A list of inputs, each a number: "input 0 is a scalar", which sent the caller to
        # args= when the numbers were meant as one array. (One number alone, [3.5], is still
        # "input 0 is a scalar: pass scalars in args=".)
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
        kind = "range" if isinstance(value, range) else type(value).__name__
        raise InputError(
            f"inputs={shown} is a {kind} of numbers, not an array: inputs is a list of "
            f"arrays or files, so each number would be an input of its own. For one input "
            f"holding these numbers pass an array: np.asarray(values, dtype)"
            + (", or np.arange(start, stop, dtype=...)" if kind == "range" else "")
            + ", e.g. inputs=[np.asarray(values, np.float32)]; scalar kernel arguments go in "
              "args=")
    return _as_list(value)


def _is_number(value: Any) -> bool:
    """A Python or NumPy scalar number (a bool too), not an array."""
    return isinstance(value, numbers.Number | np.generic) and not isinstance(
        value, str | bytes | np.str_ | np.bytes_ | np.void)


def as_outputs(value: Any) -> list[Any]:
    """``outputs`` as a list: None is no outputs; one array, path, sink or dtype alone is a
    list of one."""
    return [] if value is None else _as_list(value)


#: One input or output alone, never a list of them: a path, an array, or a buffer of numbers
#: (which Python counts a sequence: ``list()`` of a memoryview, bytearray or array.array
#: made each number an input, "input 0 is a scalar", and of a 2-D memoryview raised
#: NotImplementedError).
_ONE = (str, bytes, bytearray, memoryview, array.array, os.PathLike, np.ndarray)


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, _ONE):
        return [value]
    if isinstance(value, Sequence):
        return list(value)
    if isinstance(value, Mapping | Iterator | set | frozenset):
        # A generator, dict or set is no array: taking it as one gave "dtype object" errors.
        raise InputError(
            f"inputs and outputs take a list or tuple of arrays, files or dtypes (or one "
            f"alone), not a {type(value).__name__}: pass list(...) of them"
        )
    return [value]
