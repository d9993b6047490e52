"""Round fifty-two, helper C: kernel parameters and scalar ``args=``, fuzzed.

A seeded generator (kept outside the repository, /tmp/r52p/gen.py and probes beside it) wrote
OpenCL C kernels whose scalar parameter is spelled as real code spells it (typedef chains with
``const``/``volatile`` before or after the type, ``#define``d types, typedefs with
``aligned`` attributes, ``unsigned``/``signed``/``short int``/``long int`` spellings, comments
and line continuations in the head, enums, unions, structs by value) and streamed each on
PoCL with values of every Python and NumPy kind (ints at and past the type's edges, floats,
bools, ``np.float16``, 0-d arrays, ``np.longdouble``, Fractions, Decimals, NaN/inf, complex),
comparing what the kernel received with the value the C type holds (NumPy's cast). Of 80
generated spellings x 6 values, every wrong answer and false refusal was of one kind (the
first finding). Plain scalar types, ``#define``d types, unqualified typedef chains and
structs by value held.

Found (strict xfails, each asserting the right behaviour):

- **Wrong answers, reads past a buffer, false refusals**: a typedef that adds a qualifier to
  another typedef (``typedef float real; typedef const real creal;``, also ``volatile``, or
  ``typedef T0 const T1;`` at any depth) is reported by PoCL under the inner name (``real``),
  which ``argtypes.from_driver`` resolves without the source's typedefs: the parameter is "a
  type conveyor cannot resolve". A scalar then takes any NumPy scalar as its bytes
  (``np.float64(2.5)`` arrives as 0.0, ``np.int8(3)`` as junk from past its byte) and refuses
  Python numbers; a resident table (``__global CI *t``) takes any dtype (float64 read as ints,
  an int8 table of 4 bytes read as 4 ints, past its buffer); an input or output
  (``__global creal *x``) is refused.
- **Wrong answer (double rounding)**: an integer for a ``float`` parameter is made a Python
  int and cast through float64: ``np.int64(2**60 + 2**36 + 1)`` arrives as ``2**60``, where C
  and NumPy's own cast give ``2**60 + 2**37``.
- **Wrong answer, read past the value**: a union passed by value takes a NumPy scalar of any
  size: ``np.float64(1.0)`` for a 4-byte ``union {float f; uint u;}`` arrives as 0.0, and an
  ``np.int8`` as bytes read past it. A struct of the source is refused so.
- **False refusal**: an enumerator past INT_MAX (``enum e { A, B = 0xFFFFFFFF }``, 4 bytes and
  unsigned to clang) cannot be passed: ``B`` is "out of range for enum e (int32)".
- **Messages**: a fractional value refused for an integer parameter is shown truncated
  (``-3.7`` for a ``ulong`` is quoted as ``-3``); a Decimal past an integer type's range says
  NumPy's "Python int too large to convert to C long", not the type's range.

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import sys
import warnings
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import assert_clean, first_device_only, opencl_c_only  # noqa: E402, F401

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402


def _compile(device: cv.Device, source: str, name: str = "k") -> cv.Kernel:
    """``device.compile`` with PyOpenCL's "non-empty compiler output" warnings kept quiet."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return device.compile(source, name, [])


def _scalar_kernel(head: str, param: str, read: str = "(double)s") -> str:
    """A kernel storing its scalar parameter ``s`` (declared ``param``) into every y[i]."""
    return (f"{head}\n__kernel void k(__global const uchar *x, __global double *y, {param}, "
            f"ulong offset, ulong n)\n{{ ulong i = get_global_id(0); if (i < n) y[i] = {read}; }}")


def _received(device: cv.Device, kernel: cv.Kernel, value: object) -> float:
    """What the kernel's ``s`` held, streamed over 4 rows."""
    x = np.zeros(4, np.uint8)
    y = np.full(4, -99.0)
    cv.stream(kernel, [x], [y], device=device, args=(value,))
    assert (y == y[0]).all() or np.isnan(y).all()
    return float(y[0])


# ---------------------------------------------------------------------------------------
# A typedef that qualifies another typedef: the driver names the inner one.

CONST_OF_TYPEDEF = "typedef float real; typedef const real creal;"


def test_const_typedef_of_a_typedef_scalar_is_cast(device):
    """``typedef float real; typedef const real creal;`` and a parameter ``creal s``: the
    driver reports ``real``, ``from_driver`` (argtypes.py:59) resolves it without the
    source's typedefs, and the scalar is "a type conveyor cannot resolve", which takes any
    NumPy scalar as its bytes. ``np.float64(2.5)``'s 8 bytes land in a 4-byte float (0.0);
    ``2.5`` is refused. Both should reach the kernel as 2.5f, as for ``real s``."""
    opencl_c_only(device)
    k = _compile(device, _scalar_kernel(CONST_OF_TYPEDEF, "creal s"))
    assert _received(device, k, np.float64(2.5)) == 2.5
    assert _received(device, k, 2.5) == 2.5
    assert_clean(device)


def test_volatile_typedef_of_an_int_typedef_scalar_is_cast(device):
    """The same through ``volatile`` and a chain (the generator's most common failure):
    ``typedef int I; typedef I J; typedef volatile J K;``, parameter ``K s``. PoCL names
    ``J``; ``np.float32(7)`` is passed as its bits (1088421888), ``7`` is refused."""
    opencl_c_only(device)
    k = _compile(device, _scalar_kernel("typedef int I; typedef I J; typedef volatile J K;",
                                        "K s"))
    assert _received(device, k, np.float32(7)) == 7
    assert _received(device, k, 7) == 7
    assert_clean(device)


CONST_TABLE = """typedef int I; typedef const I CI;
__kernel void k(__global const float *x, __global float *y, __global CI *t, ulong offset,
                ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + t[i % 4];
}"""


def test_const_typedef_table_of_another_dtype_is_refused(device):
    """``typedef int I; typedef const I CI;`` and ``__global CI *t``: PoCL says ``I*``, left
    unresolved, so the table's dtype is not checked. A float64 table ``[1, 2, 3, 4]`` is read
    as ints (y = x + [0, 1072693248, 0, 1073741824]), and an int8 table of 4 bytes is read as
    4 ints, past its buffer. It should be refused, naming ``t``, as for ``__global const int
    *t``; an int32 table streams right."""
    opencl_c_only(device)
    k = _compile(device, CONST_TABLE)
    x = np.arange(8, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], device=device, args=(np.array([1, 2, 3, 4], np.int32),))
    np.testing.assert_array_equal(y, x + np.tile(np.float32([1, 2, 3, 4]), 2))
    y[:] = 0
    with pytest.raises(InputError, match="'t'"):
        cv.stream(k, [x], [y], device=device, args=(np.array([1, 2, 3, 4], np.float64),))
    assert not y.any()
    assert_clean(device)


def test_const_typedef_of_a_typedef_input_streams(device):
    """``__global creal *x`` (``typedef const real creal``): "kernel parameter 'x' is real* (a
    type conveyor cannot resolve) ... declare it as a pointer to a scalar type", for the
    float32 array it takes."""
    opencl_c_only(device)
    k = _compile(device, CONST_OF_TYPEDEF + """
__kernel void k(__global creal *x, __global float *y, ulong offset, ulong n)
{ ulong i = get_global_id(0); if (i < n) y[i] = x[i] * 2.0f; }""")
    x = np.arange(8, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], device=device)
    np.testing.assert_array_equal(y, x * 2)
    assert_clean(device)


# ---------------------------------------------------------------------------------------
# Integers for a float parameter: rounded twice.

def test_integer_for_a_float_parameter_rounds_once(device):
    """``argcast.cast_scalar`` makes a NumPy integer a Python int (argcast.py:78) and casts
    it with ``np.float32(int)`` (argcast.py:103), which goes through float64: ``2**60 + 2**36
    + 1`` becomes ``2**60 + 2**36`` (float64's step there is 256), a tie that float32 rounds
    to even, ``2**60``. C's ``(float)`` of that long, and NumPy's ``astype(np.float32)``, round
    once: ``2**60 + 2**37``."""
    opencl_c_only(device)  # OpenCL C sources
    k = _compile(device, _scalar_kernel("", "float s"))
    value = 2**60 + 2**36 + 1
    want = float(np.array([value], np.int64).astype(np.float32)[0])
    assert want == 2**60 + 2**37
    assert _received(device, k, np.int64(value)) == want
    assert _received(device, k, value) == want
    assert_clean(device)


# ---------------------------------------------------------------------------------------
# Unions by value: any size taken.

UNION = "typedef union { float f; uint u; } U;"


@pytest.mark.xfail(strict=True, reason="a union by value takes a NumPy scalar of any size: "
                   "np.float64(1.0) for a 4-byte union arrives as 0.0, no error")
def test_union_by_value_refuses_a_scalar_of_another_size(device):
    """``U s`` with ``typedef union { float f; uint u; } U;`` (4 bytes): the check of a
    struct by value (validate.py:667, ``c_layout``) reads no union, and argcast's
    ``as_given`` (argcast.py:34) passes any NumPy scalar as its bytes. ``np.float32(2.5)``
    is right; ``np.float64(1.0)`` reaches ``s.f`` as 0.0 (its low 4 bytes), an
    ``np.int8(5)`` as bytes read past it. A scalar whose size is not the union's should be
    refused, naming ``s``, as a struct's is."""
    opencl_c_only(device)
    k = _compile(device, _scalar_kernel(UNION, "U s", "s.f"))
    assert _received(device, k, np.float32(2.5)) == 2.5
    with pytest.raises(InputError, match="'s'"):
        _received(device, k, np.float64(1.0))
    assert_clean(device)


# ---------------------------------------------------------------------------------------
# Enums past INT_MAX.

@pytest.mark.xfail(strict=True, reason="an enumerator past INT_MAX (0xFFFFFFFF, a 4-byte "
                   "unsigned enum to clang) is refused as out of range for int32")
def test_enum_value_past_int_max_is_passed(device):
    """``enum e { A = 0, B = 0xFFFFFFFF }`` is 4 bytes, unsigned int to clang (the size check
    takes either sign for enums, sizecheck.py ``_ENUM_C_TYPES``), but the cast is int32's
    (signature.py:413, argcast.py:98): passing ``B`` is "out of range for enum e (int32:
    -2147483648 = -2**31 to 2147483647 = 2**31-1)". It should reach the kernel as B."""
    opencl_c_only(device)
    k = _compile(device, _scalar_kernel("enum e { A = 0, B = 0xFFFFFFFF };", "enum e s"))
    assert _received(device, k, 0xFFFFFFFF) == 0xFFFFFFFF
    assert _received(device, k, np.uint32(0xFFFFFFFF)) == 0xFFFFFFFF
    assert_clean(device)


# ---------------------------------------------------------------------------------------
# Messages.

def test_refused_fraction_is_quoted_as_given(device):
    """``args=(-3.7,)`` for ``ulong s``: "args[0]: -3 cannot be passed as kernel parameter
    's' (ulong s): it does not fit: it is out of range for ulong" (``_refused`` is given the
    truncated value, argcast.py:94-101); ``1e20`` is quoted as 100000000000000000000. The
    message should quote the value passed."""
    opencl_c_only(device)  # OpenCL C sources
    k = _compile(device, _scalar_kernel("", "ulong s"))
    with pytest.raises(InputError, match=r"-3\.7 cannot be passed"):
        _received(device, k, -3.7)


def test_decimal_past_the_range_names_the_range(device):
    """``Decimal('1e30')`` for ``int s``: Decimal is no ``numbers.Real``, so it skips the
    integer range check (argcast.py:86-101) and NumPy refuses it ("it does not fit (Python
    int too large to convert to C long)"). The message should give int's range, as an int's
    does."""
    opencl_c_only(device)  # OpenCL C sources
    k = _compile(device, _scalar_kernel("", "int s"))
    with pytest.raises(InputError, match="out of range for int"):
        _received(device, k, Decimal("1e30"))


# ---------------------------------------------------------------------------------------
# Guards.

def test_scalar_kinds_reach_the_kernel_as_c_holds_them(device):
    """guard: Python and NumPy numbers of every kind at a few types' edges arrive as C's
    cast holds them (truncation toward zero, the type's bounds, float32 rounding), and what
    does not fit or means nothing is refused naming the parameter."""
    opencl_c_only(device)  # OpenCL C sources
    kernels = {t: _compile(device, _scalar_kernel("", f"{t} s"))
               for t in ("char", "uint", "long", "float")}
    taken = [("char", -128, -128), ("char", np.int8(-1), -1), ("char", -3.7, -3),
             ("char", Fraction(-7, 2), -3), ("char", Decimal("3.7"), 3),
             ("char", np.array(True), 1), ("uint", 2**32 - 1, 2**32 - 1),
             ("uint", np.float16(65504), 65504), ("uint", -0.5, 0),
             ("long", -(2**63), -(2**63)), ("long", np.longdouble("1.5"), 1),
             ("float", Fraction(1, 3), float(np.float32(1 / 3))),
             ("float", Decimal("0.1"), float(np.float32(0.1))), ("float", np.array(2.5), 2.5)]
    for t, value, want in taken:
        assert _received(device, kernels[t], value) == want, (t, value)
    refused = [("char", 128), ("uint", -1), ("long", 2**63), ("char", float("nan")),
               ("float", 3.5e38), ("float", 1 + 0j), ("uint", None), ("uint", "1"),
               ("float", Decimal("sNaN"))]
    for t, value in refused:
        with pytest.raises(InputError, match="'s'"):
            _received(device, kernels[t], value)
    assert_clean(device)
