"""Round twenty-six, helper A: a review of the last session's source changes (4fa3b7e..46c7caa,
with 1da6a20..4fa3b7e for context): ``kernels/typedefs.py``'s ``split_top``,
``split_default`` and ``_top_level`` (template arguments tracked as brackets), pointer
typedefs qualified after the star and typedefs of pointer typedefs, ``extern "C"`` blocks,
``parse_params`` reading its typedef table once, and ``fold.Fold._made``.

Method: a seeded generator (``/tmp/r26a/gen.py``, kept out of the repository) of 3,000 OpenCL
C parameter lists (pointer typedefs of every qualifier order, chains, ``restrict``/``const``/
``volatile`` after the star, several declarators, typedef'd and qualified scalars, arrays,
parameter attributes), each read by the parser of 1da6a20 (a worktree) and of today, and the
differing ones built and streamed on PoCL against NumPy; CUDA parameter lists read by both.

Found (each a strict xfail asserting the right behaviour, seen failing on the code before
its fix, and a plain test since):

- **Regression, a wrong answer with no error (OpenCL)**: a ``<`` or ``>`` anywhere in a
  parameter list that is no template bracket (a shift or a comparison inside an attribute
  or an array bound: ``__attribute__((aligned(1 << 4)))``, ``aligned(64 >> 2)``,
  ``float a[1 << 4]``) moves ``_top_level``'s one depth counter (typedefs.py:198-203): no
  later comma is at depth 0, so the whole list is read as one parameter. PoCL's report has
  five arguments, ``from_driver`` matches none to the source, so every typedef'd type is
  unresolved: a ``count_t`` (``typedef int``) scalar takes a NumPy float32's bits (2.0 ->
  1073741824), ``real*`` is refused, names become ``arg0``... On CUDA the count differs
  from NVRTC's and the kernel is refused, blamed on "macros that expand to several
  parameters". 1da6a20 read all of these right.
- **Regression (refused, misleading message)**: the same counter in ``_attributes_known``:
  ``typedef int wide __attribute__((aligned(1 << 3), mode(DI)))`` no longer sees ``mode``;
  the typedef is read as a 4-byte int and the build refuses the kernel, blaming "a macro the
  compiler predefines". 1da6a20 streamed it (an np.int64 argument).
- **Regression (CUDA, refused)**: a template argument with a parenthesized comparison, the
  C++ idiom for one (``Flag<(2 > 1)> f``): ``>`` inside the parentheses closes a bracket.
- **Missed spellings (refused)**: a qualified typedef of a pointer typedef (``typedef const
  wp0 wp;``, ``typedef rp0 const rp;``, CUDA's ``typedef fp __restrict__ rfp;``) is no
  pointer typedef (``_pointer_typedefs`` follows only unqualified names, signature.py:168);
  CUDA's ``using fp = float * __restrict__;`` neither; a CUDA default argument in braces
  (``float2 w = {0.f, 1.f}``) is split at its comma; a CUDA default argument with a shift
  (``int s = 1 << 4``) swallows the parameters after it.
- **Near the area (not regressions)**: ``ext_vector_type((4))`` (a parenthesized macro) is
  read as a scalar and the build's refusal blames "a macro the compiler predefines";
  CUDA's ``__grid_constant__ const float s`` is an unknown type.

Held (same readings as 1da6a20, or right where they differ): the 3,000 generated lists but
for the two families above (150 of them streamed on PoCL: every failure was one of them);
``fold.combine`` over 3,000 random partial sets (scalars, tuples, lists, named tuples,
mixed, None) gave the same reprs on 1da6a20 and today; a float16 sum folded in random
groups under ``halves_kept_wide`` equals the whole fold (2,000 cases). Regressions were
confirmed by running this file with ``--runxfail`` on 1da6a20's ``src``: each passes there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import (
    first_device_only,  # noqa: E402, F401
    pocl_only,  # noqa: E402
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402
from conveyor.kernels.signature import parse_params  # noqa: E402


def _read(params) -> list[tuple[str, bool, str]]:
    return [(p.name, p.is_pointer, str(p.dtype)) for p in params]


# -- a shift or comparison in a parameter list ---------------------------------------------------

SHIFTED = [
    "__attribute__((aligned(1 << 4)))",
    "__attribute__((aligned(64 >> 2)))",
    "__attribute__((aligned(sizeof(float) > 2 ? 16 : 8)))",
]


@pytest.mark.parametrize("attribute", SHIFTED)
def test_shift_or_comparison_in_a_parameter_attribute_keeps_the_parameters(attribute):
    """1da6a20 read five parameters; today one (named ``n``, a pointer of no type)."""
    source = (f"__kernel void k(__global const float * {attribute} a, __global float *c, "
              f"int s, ulong offset, ulong n) {{}}")
    assert _read(parse_params(source, "k")) == [
        ("a", True, "float32"), ("c", True, "float32"), ("s", False, "int32"),
        ("offset", False, "uint64"), ("n", False, "uint64")]


@pytest.mark.parametrize("bound", ["1 << 4", "64 >> 2"])
def test_shift_in_an_array_parameter_bound_keeps_the_parameters(bound):
    source = f"__kernel void k(__global const float a[{bound}], __global float *c, int s) {{}}"
    assert _read(parse_params(source, "k")) == [
        ("a", True, "float32"), ("c", True, "float32"), ("s", False, "int32")]


SHIFTED_KERNEL = """typedef int count_t;
__kernel void k26(__global const float * __attribute__((aligned(1 << 4))) a,
                  __global float *c, count_t s, ulong offset, ulong n)
{ size_t i = get_global_id(0); if (i < n) c[i] = a[i] * s; }
"""


def test_shifted_attribute_still_casts_a_typedef_scalar(device):
    """A wrong answer with no error: ``np.float32(2)`` for ``count_t s`` (``typedef int``)
    was cast to 2 on 1da6a20; today the source is read as one parameter, PoCL's five match
    none of it, ``count_t`` is a type conveyor cannot resolve, and the float's four bytes are
    passed as they are (1073741824 read as the int)."""
    pocl_only(device)
    k = device.compile(SHIFTED_KERNEL, "k26")
    x = np.arange(64, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], device=device, args=(np.float32(2),), block_bytes=64)
    np.testing.assert_array_equal(y, x * 2)


SHIFTED_REAL = """typedef float real;
__kernel void r26(__global const real * __attribute__((aligned(1 << 4))) a,
                  __global real *c, real s, ulong offset, ulong n)
{ size_t i = get_global_id(0); if (i < n) c[i] = a[i] * s; }
"""


def test_shifted_attribute_still_resolves_a_typedef_pointer(device):
    pocl_only(device)
    k = device.compile(SHIFTED_REAL, "r26")
    x = np.arange(64, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], device=device, args=(3,), block_bytes=64)
    np.testing.assert_array_equal(y, x * 3)
    assert [p.name for p in k.params] == ["a", "c", "s", "offset", "n"]  # arg0... today


def test_mode_attribute_after_a_shifted_alignment_is_still_seen(device):
    """``typedef int wide __attribute__((aligned(1 << 3), mode(DI)))`` is 8 bytes. 1da6a20
    left it to the driver (an np.int64 argument streamed); round twenty-four leaves such
    typedefs unresolved; today ``mode(DI)`` is not seen and the build raises "conveyor read
    its type wide as 4 bytes (int) ... a macro the compiler predefines"."""
    pocl_only(device)
    source = """typedef int wide __attribute__((aligned(1 << 3), mode(DI)));
__kernel void w26(__global const long *a, __global long *c, wide s, ulong offset, ulong n)
{ size_t i = get_global_id(0); if (i < n) c[i] = a[i] + s; }
"""
    k = device.compile(source, "w26")
    x = np.arange(64, dtype=np.int64)
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], device=device, args=(np.int64(2**40 + 3),), block_bytes=64)
    np.testing.assert_array_equal(y, x + 2**40 + 3)


def test_cuda_template_argument_with_a_parenthesized_comparison():
    read = parse_params('template <bool B> struct Flag { int v; };\n'
                        'extern "C" __global__ void k(float *o, const Flag<(2 > 1)> f, '
                        'int n) {}', "k")
    assert [p.name for p in read] == ["o", "f", "n"]


def test_cuda_default_argument_with_a_shift():
    read = parse_params('extern "C" __global__ void k(float *o, int s = 1 << 4, int n = 0) {}',
                        "k")
    assert _read(read) == [("o", True, "float32"), ("s", False, "int32"),
                           ("n", False, "int32")]


def test_cuda_default_argument_with_a_comparison():
    """A default argument comparing at the top level (``int s = A < B``): its ``<`` follows a
    name, was taken for a template bracket that never closed, and the parameters after it
    merged into ``s`` (known since round twenty-seven; fixed in session 20: a ``<`` opens
    template arguments only when a ``>`` closes it)."""
    read = parse_params('#define A 1\n#define B 2\nextern "C" __global__ void '
                        'k(float *o, int s = A < B, float *y, int n = x<y) {}', "k")
    assert _read(read) == [("o", True, "float32"), ("s", False, "int32"),
                           ("y", True, "float32"), ("n", False, "int32")]


def test_cuda_default_argument_in_braces():
    read = parse_params('extern "C" __global__ void k(float *o, float2 w = {0.f, 1.f}, '
                        'int n = 0) {}', "k")
    assert [p.name for p in read] == ["o", "w", "n"]


def test_guard_template_arguments_and_defaults_read_right():
    """guard: what round twenty-five fixed, in several spellings (no spaces, nested
    templates closed by ``>>``, a default made by a template's constructor)."""
    pair = "template <class A, class B> struct Pair { A a; B b; };\n"
    for params, names in [
        ("float *o, float w=0.5f, int n=0", ["o", "w", "n"]),
        ("float *o, Pair<float, Pair<int, int>> p, int n", ["o", "p", "n"]),
        ("float *o, Pair<float, int> p = Pair<float, int>(), int n = 0", ["o", "p", "n"]),
        ("float *o, const Pair<float,int> &p, int n", ["o", "&p", "n"]),
    ]:
        read = parse_params(f'{pair}extern "C" __global__ void k({params}) {{}}', "k")
        assert [p.name for p in read] == names, params


# -- qualified typedefs of pointer typedefs ----------------------------------------------------

QUALIFIED_POINTERS = """typedef float real;
typedef __global real *wp0;
typedef const wp0 wp;
typedef __global const real *rp0;
typedef rp0 const rp;
__kernel void q26(rp a, wp c, real s, ulong offset, ulong n)
{ size_t i = get_global_id(0); if (i < n) c[i] = a[i] * s; }
"""


def test_qualified_typedef_of_a_pointer_typedef_streams(device):
    """Round twenty-five made ``typedef wp0 wp;`` a pointer typedef; the same with a const
    (a const pointer, ``const wp0`` or ``wp0 const``) is not: PoCL reports ``real*`` and
    conveyor refuses the stream."""
    pocl_only(device)
    k = device.compile(QUALIFIED_POINTERS, "q26")
    x = np.arange(64, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], device=device, args=(3,), block_bytes=64)
    np.testing.assert_array_equal(y, x * 3)


@pytest.mark.parametrize("declaration", [
    "typedef float *fp0; typedef const fp0 fp;",
    "typedef float *fp0; typedef fp0 const fp;",
    "typedef float *fp0; typedef fp0 __restrict__ fp;",
    "using fp = float * __restrict__;",
])
def test_cuda_qualified_pointer_typedefs_are_pointers(declaration):
    read = parse_params(f'{declaration}\nextern "C" __global__ void k(fp o, int n) {{}}', "k")
    assert _read(read) == [("o", True, "float32"), ("n", False, "int32")]


def test_guard_pointer_typedef_spellings_stream(device):
    """guard: the spellings round twenty-five fixed, streamed on PoCL (``restrict``/``const``/
    ``volatile`` after the star, a chain of two, two declarators)."""
    pocl_only(device)
    source = """typedef float real;
typedef __global const real *restrict rp, *restrict rq;
typedef __global real * volatile wv;
typedef __global real *w0; typedef w0 w1; typedef w1 w2;
__kernel void g26(rq a, w2 c, real s, ulong offset, ulong n)
{ size_t i = get_global_id(0); if (i < n) c[i] = a[i] * s; }
__kernel void h26(rp a, wv c, real s, ulong offset, ulong n)
{ size_t i = get_global_id(0); if (i < n) c[i] = a[i] * s; }
"""
    x = np.arange(64, dtype=np.float32)
    for name in ("g26", "h26"):
        k = device.compile(source, name)
        y = np.zeros_like(x)
        cv.stream(k, [x], [y], device=device, args=(np.float64(3),), block_bytes=64)
        np.testing.assert_array_equal(y, x * 3)


# -- near the area: spellings round twenty-three's readings miss ----------------------------------

def test_parenthesized_ext_vector_width_is_read_as_a_vector(device):
    """``#define VW (4)`` then ``ext_vector_type(VW)``: ``_EXT_VECTOR`` takes digits in one
    pair of parentheses only, so ``v4`` is read as a float; the size check then refuses the
    kernel with "a macro the compiler predefines (such as __clang__)", where
    ``ext_vector_type(4)`` gets the refusal that says what to change (a vector pointer:
    declare float* and vload4)."""
    pocl_only(device)
    source = """#define VW (4)
typedef float v4 __attribute__((ext_vector_type(VW)));
__kernel void v26(__global const v4 *a, __global float *c, float s, ulong offset, ulong n)
{ size_t i = get_global_id(0); if (i < n) c[i] = a[i].x * s; }
"""
    x = np.arange(64, dtype=np.float32)
    with pytest.raises(InputError, match="a vector type"):
        cv.stream(device.compile(source, "v26"), [x], [np.zeros_like(x)], device=device,
                  args=(3,), block_bytes=64)


def test_cuda_grid_constant_parameter_is_its_type():
    read = parse_params('extern "C" __global__ void k(float *o, __grid_constant__ const float s, '
                        'int n) {}', "k")
    assert _read(read) == [("o", True, "float32"), ("s", False, "float32"),
                           ("n", False, "int32")]
