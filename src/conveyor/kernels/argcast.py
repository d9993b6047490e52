"""Turn a scalar launch argument into the kernel parameter's type, or refuse it.

The casts a user can mean are kept (3.7 to an ``int`` parameter is 3, 2 to a ``float`` is
2.0, a NumPy scalar or a 0-d array of any numeric type); what no cast means is an InputError
naming the parameter: None (NumPy would make it NaN), strings (NumPy would parse them),
arrays with elements (they would fail mid-stream in the driver), complex numbers for real
parameters, and values outside the parameter type's range.
"""

from __future__ import annotations

import cmath
import decimal
import fractions
import math
import numbers
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from conveyor.errors import InputError
from conveyor.interrupts import deferred_sigint

if TYPE_CHECKING:
    from conveyor.kernels.signature import Param


def caster(param: Param) -> Callable[[Any], Any]:
    """The function that casts one argument for scalar parameter ``param`` (InputError when
    no cast means anything); for a type conveyor does not know, NumPy scalars pass as given."""
    dtype = param.dtype
    if dtype is None or param.width > 1:

        def as_given(value: Any) -> Any:
            if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.names:
                value = value[()]  # a 0-d record array: its record, as np.array(2.0) is 2.0
            if isinstance(value, np.generic) and not isinstance(value, np.str_ | np.bytes_):
                return value
            raise _refused(param, value, "conveyor does not know this type, so the value must "
                                         "be a NumPy scalar of it (e.g. a structured np.void)")

        return as_given

    def cast(value: Any) -> Any:
        return cast_scalar(param, value)

    return cast


def cast_scalar(param: Param, value: Any) -> Any:
    """``value`` as a NumPy scalar of ``param``'s dtype; InputError naming the parameter if
    no cast means anything (see the module docstring)."""
    dtype = param.dtype
    assert dtype is not None
    if type(value) is dtype.type:
        # Already what the driver takes (offset and n on every launch, args cast once before
        # the stream): no cast and no range to check, on the per-block path.
        return value
    if value is None:
        raise _refused(param, value, "None has no value (NumPy would pass NaN or fail)")
    if isinstance(value, str | bytes | np.str_ | np.bytes_):
        raise _refused(param, value, "a string is not a number")
    if isinstance(value, np.ndarray):
        if value.ndim != 0:
            raise _refused(param, value, f"an array of shape {value.shape} is not a scalar; "
                                         f"arrays go in inputs= (streamed block by block), "
                                         f"or in args= for a pointer parameter")
        value = value[()]
    if isinstance(value, np.generic):
        if isinstance(value, np.void):
            raise _refused(param, value, "a structured value is not a number")
        if isinstance(value, np.datetime64 | np.timedelta64):
            # .item() gives a count for units of ns and finer only (a datetime or timedelta
            # otherwise, None for NaT): refused whatever the unit, named as given.
            kind = "date" if isinstance(value, np.datetime64) else "duration"
            raise _refused(param, value, f"a {kind} is no number: pass its count of units, "
                                         f"value.astype(np.int64)")
        value = value.item()
    if isinstance(value, bool):
        value = int(value)
    given = value  # quoted as passed where refused (-3.7 was quoted as -3)
    if isinstance(value, decimal.Decimal):
        # No numbers.Real, so past the integer range check it got NumPy's "Python int too
        # large to convert to C long"; as a real it is truncated and checked as a float is.
        if value.is_snan():
            raise _refused(param, value, "a signalling NaN has no value")
        if dtype.kind in "fc":  # exactly, as a Fraction: rounded once to the type, below
            value = fractions.Fraction(value) if value.is_finite() else float(value)
    if not isinstance(value, numbers.Number):
        raise _refused(param, value, f"a {type(value).__name__} is not a number")
    if (isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real)
            and dtype.kind != "c"):  # complex, and np.clongdouble (whose .item() stays NumPy's)
        raise _refused(param, value, "a complex number has no real-valued cast")
    if dtype.kind in "iu" and isinstance(value, numbers.Real | decimal.Decimal) and not isinstance(
        value, numbers.Integral
    ):
        if not (value.is_finite() if isinstance(value, decimal.Decimal)
                else math.isfinite(float(value))):
            raise _refused(param, value, "an infinite or NaN value has no integer cast")
        # The documented cast: 3.7 -> 3, -3.7 -> -3. int() truncates as math.trunc does, and
        # also takes np.longdouble (whose .item() stays a NumPy scalar with no __trunc__).
        real: Any = value
        value = int(real)
    if dtype.kind in "iu" and isinstance(value, int):
        # NumPy says "Python int too large to convert to C long" past 2**63 (for ulong and
        # long alike), which names neither the type nor its range.
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise _refused(param, given, f"it does not fit: it is out of range for "
                                         f"{param.base or dtype} ({dtype}: "
                                         f"{_bound(info.min)} to {_bound(info.max)})")
    if dtype.kind == "f" and isinstance(value, numbers.Rational) and dtype.itemsize < 8:
        value = _rounded_once(value, np.finfo(dtype).nmant + 1)
    result = _checked(dtype.type, value, param, given)
    if dtype.kind in "fc" and not np.isfinite(result) and _finite(given):
        # np.longdouble(1e4000) to a double became inf with no overflow warning
        raise _refused(param, given, f"it does not fit (out of range for {dtype})")
    return result


def _rounded_once(value: numbers.Rational, digits: int) -> float:
    """``value`` (an int, a Fraction, a Decimal made one) rounded to ``digits`` significant
    bits (to nearest, ties to even), as a float64 that holds it exactly: cast through float64
    it was rounded twice (2**60 + 2**36 + 1 became 2**60 for a float32; C and NumPy's int64
    cast give 2**60 + 2**37; 1 + 2**-24 + 10**-30 became 1.0, not 1 + 2**-23)."""
    size = abs(fractions.Fraction(value))
    if not size:
        return 0.0
    top, bottom = size.numerator, size.denominator
    shift = digits - (top.bit_length() - bottom.bit_length())  # scale by 2**shift
    while True:
        scaled, scale = (top << shift, bottom) if shift >= 0 else (top, bottom << -shift)
        kept, rest = divmod(scaled, scale)
        if kept >= 1 << digits:
            shift -= 1
        elif kept < 1 << (digits - 1):
            shift += 1
        else:
            break
    if 2 * rest > scale or (2 * rest == scale and kept & 1):
        kept += 1
    try:
        rounded = math.ldexp(kept, -shift)
    except OverflowError:
        rounded = math.inf
    return -rounded if value < 0 else rounded


def _bound(value: int) -> str:
    """An integer type's bound, with its power of two where the digits are many: 2**64-1."""
    power = (value + 1).bit_length() - 1 if value > 0 else (-value).bit_length() - 1
    if power >= 31 and value in (2**power - 1, -(2**power)):
        return f"{value} = {'-' if value < 0 else ''}2**{power}{'-1' if value > 0 else ''}"
    return str(value)


def _finite(value: Any) -> bool:
    """Whether a number is finite, as its own type says (np.longdouble(1e4000) is, though
    it has no float); True for what cannot tell (ints too large for a float)."""
    if isinstance(value, np.generic):
        return bool(np.isfinite(value))
    if isinstance(value, decimal.Decimal):  # complex() of Decimal('1e400') is inf
        return value.is_finite()
    try:
        return cmath.isfinite(complex(value))
    except (TypeError, ValueError, OverflowError):
        return True


def _checked(make: Callable[[Any], Any], value: Any, param: Param, shown: Any = None) -> Any:
    """``make(value)``; InputError quoting ``shown`` (the value as passed) if it fails."""
    try:
        # Whole under Ctrl-C: one that skipped errstate's __exit__ left overflow raising for
        # the rest of the process (interrupts.py; the sweep test found it).
        with deferred_sigint(), np.errstate(over="raise"):  # 1e40 to a float32 raises too
            return make(value)
    except (TypeError, ValueError, OverflowError, FloatingPointError) as exc:
        raise _refused(param, value if shown is None else shown,
                       f"it does not fit ({exc})") from exc


def _refused(param: Param, value: Any, why: str) -> InputError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    if param.dtype is None:
        wanted = "a NumPy scalar"
    else:
        wanted = f"{'an' if param.dtype.name.startswith('int') else 'a'} {param.dtype} value"
    return InputError(
        f"{shown} cannot be passed as kernel parameter {param.name!r} ({param.type_text}): "
        f"{why}; pass {wanted}"
    )
