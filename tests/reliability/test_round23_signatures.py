"""Round twenty-three, helper B: kernel signatures, generated.

A seeded generator (kept outside the repository) wrote OpenCL C kernels: 1 or 2 inputs,
one output, an optional resident table and up to two scalars, then ``offset`` and ``n``, each
spelled in one of many legal ways (``__global``/``global``/``__constant``/``constant``,
``const``/``volatile``/``restrict`` before or after the type and on the pointer, typedefs and
chains of them, typedefs of pointers, typedefs chosen by ``#if``/``#ifdef`` on ``-D`` options
and on the compiler's predefined macros, macros for types, qualifiers and whole parameters,
``unsigned``/``signed``/``long int``/``short unsigned`` spellings, comments and line
continuations in the list, attributes, decoy kernels, a prototype before the definition,
``__kernel``/``kernel``/``void __kernel``/a macro head, ``reqd_work_group_size``), each with a
body computing ``y[i] = a0[i] * s0 + a1[i] + s1 + tbl[(offset + i) % 7]``; each was built and
streamed on PoCL and compared with NumPy. Round sixteen's hand-written spellings are not
repeated here. Of ~2,000 generated cases, ~1,600 streamed right; every refusal was sorted
by hand. What the generator found, and probes around it:

- **Wrong answer**: a type the source defines under a name conveyor knows as another type is
  read as conveyor's: ``typedef short int32_t;`` and ``typedef double float1;`` (OpenCL C
  has neither name built in) as int32 and float32, ``enum small : uchar`` (1 byte) and an
  enum holding 2**32 (8 bytes, clang) as int32. ``resolve`` (signature.py:181-188) looks
  ``_SCALARS``, ``enum`` and ``_VECTOR`` (which takes CUDA's 1-lane ``float1``) up before
  the source's typedefs, ``from_driver`` resolves the driver's names the same way
  (argtypes.py:59), and the size check skips each as a built-in type (sizecheck.py:81-82).
  The arrays the kernel reads are refused; the ones conveyor asks for are read as pairs of
  shorts (``[0, 0, 1, 0, 2, ...]``), or as doubles / 8-byte enums past their buffers.
- **Wrong answer**: a typedef whose signedness is chosen by a macro the compiler predefines
  and conveyor's preprocessor does not know (``#ifdef __clang__ typedef int word; #else
  typedef uint word;``; the generator hit it through ``__AVX2__``, ``NULL``, ``__x86_64__``,
  for inputs, outputs and tables): the size check confirms the size and the kind, not the
  sign (sizecheck.py:43, ``_C_TYPES``), so a uint32 array passes for an ``int`` kernel: 3e9
  arrives as -1294967296.
- **Wrong answer (junk lanes)**: a scalar of ``typedef float v4
  __attribute__((ext_vector_type(4)))`` (how clang's header makes ``float4``) is "a type
  conveyor cannot resolve", which takes any NumPy scalar as given (argcast.py:34): 4 bytes
  for a 16-byte argument, the other lanes whatever followed them. ``float2`` by value is
  refused.
- **Crash (SIGSEGV)**: a parameter that conveyor's preprocessor names and the compiler leaves
  unnamed (the name under ``#ifndef FLT_MAX``): conveyor asks PoCL that argument's name
  (opencl_kernels.py:170-178), which PoCL answers with a segmentation fault (round sixteen
  kept the question from parameters unnamed in conveyor's own reading only).
- **False refusals of legal C**: a typedef of a pointer to a typedef (``typedef float real;
  typedef __global const real *rp;``: the driver says ``real*``, the source's parameter has
  base ``rp``, argtypes.py:61), a typedef declaring two names (``typedef float other,
  single;``) and a typedef with an attribute (both missed by ``_TYPEDEF``, signature.py:72):
  "a type conveyor cannot resolve". A kernel defined inside ``#ifdef CLK_LOCAL_MEM_FENCE``
  (or ``FLT_MAX``, ``M_PI``, ``CHAR_BIT``: macros the OpenCL C specification has every
  compiler define, absent from ``Device.source_macros``) is read from the raw text
  (build.py:144), where a typedef chosen by ``-D``, made by a macro or from a header is not
  resolved, and a macro head is "no kernel named ...".
- **False refusal, names lost**: an attribute whose parentheses hold a comma
  (``__attribute__((aligned(16), nosvm))``) splits the parameter there (signature.py:145,
  ``body.split(",")``): the count no longer matches the driver's, every parameter is named
  ``arg0``, ``arg1``... in messages, and one of a typedef type is refused.

Refusals the generator met that are right (InputError naming the parameter): a typedef chosen
by a predefined macro conveyor does not know, of another size or kind (the size check); an
output through a ``const`` typedef (the compiler refuses the body's write); ``long long``.
Guards say "guard:" in their docstrings.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    assert_clean,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    opencl_c_only,
    pocl_only,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402


def _compile(device: cv.Device, source: str, name: str, options: list[str] | None = None
             ) -> cv.Kernel:
    """``device.compile`` with PyOpenCL's "non-empty compiler output" warnings kept quiet."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return device.compile(source, name, options or [])


# ---------------------------------------------------------------------------------------
# Guard: one generated kernel holding most of the spellings the generator tried.

MIXED = r"""/* generated (seeded), then merged: every form below streamed right in the fuzzer */
#define KHEAD __kernel
#define MT(T, N) typedef T N;
#define RO const
#define GLOBAL __global
#if WIDTH == 2
typedef short unsigned s_in;
#elif WIDTH > 0
typedef double s_in;
#else
typedef float s_in;
#endif
#ifdef USE_WIDE
typedef long signed int c_0a;
#else
typedef char c_0a;
#endif
typedef c_0a c_0b;
typedef c_0b c_0;
MT(int unsigned, mt_0)
typedef __constant short *P_tab;
typedef ulong idx_t;
#if defined(__ENDIAN_LITTLE__) && __OPENCL_VERSION__ >= 120
typedef float s_scale;
#else
typedef double s_scale;
#endif
__kernel void scale_add7_x(__global const double *q, __global double *w, ulong offset,
                           ulong n) { ulong i = get_global_id(0); if (i < n) w[i] = q[i]; }
__kernel void xscale_add7(__global int *w, ulong offset, ulong n) { }
void __kernel __attribute__((reqd_work_group_size(16, 1, 1)))
scale_add7(volatile s_in RO global *restrict a0, GLOBAL RO c_0 * const a1,
           global mt_0 y[], P_tab tbl, RO s_scale /* s0 */ s0,
           __private long int s1, // a note, then a continued line \
           ulong offset, still a comment
           ulong const offset, idx_t n);
void __kernel __attribute__((reqd_work_group_size(16, 1, 1)))
scale_add7(volatile s_in RO global *restrict a0, GLOBAL RO c_0 * const a1,
           global mt_0 y[], P_tab tbl, RO s_scale /* s0 */ s0,
           __private long int s1, // a note, then a continued line \
           ulong offset, still a comment
           ulong const offset, idx_t n)
{
    ulong i = get_global_id(0);
    if (i < n) y[i] = (uint)((double)a0[i] * (double)s0 + (double)a1[i] + (double)s1
                             + (double)tbl[(offset + i) % 7]);
}
__kernel void scale_add72(__global float *w, ulong offset, ulong n) { }
"""


def test_generated_spellings_stream_right(device):
    """guard: a kernel merged from the generator's passing cases: a ``-D`` value choosing a
    typedef through ``#if``/``#elif`` (``-D WIDTH=2`` as two items), a chain of typedefs
    chosen by an ``#ifdef`` that is not taken, a typedef made by a macro, qualifiers from
    macros, ``const`` after the type, ``volatile``, ``restrict``, ``* const``, ``y[]``, a
    ``__constant`` table through a pointer typedef, a typedef chosen by predefined macros
    conveyor knows, ``long int``, ``__private``, a ``//`` comment continued onto a line that
    looks like a parameter, decoy kernels whose names hold the kernel's, a prototype and
    ``void __kernel __attribute__((...))``: every parameter read as the compiler builds it,
    and the result NumPy's."""
    opencl_c_only(device)
    k = _compile(device, MIXED, "scale_add7", ["-D", "WIDTH=2", "-w"])
    assert [p.name for p in k.params] == ["a0", "a1", "y", "tbl", "s0", "s1", "offset", "n"]
    assert [str(p.dtype) for p in k.params] == [
        "uint16", "int8", "uint32", "int16", "float32", "int64", "uint64", "uint64"]
    a0 = (np.arange(1000) % 10).astype(np.uint16)
    a1 = (np.arange(1000) % 7).astype(np.int8)
    tbl = np.arange(7, dtype=np.int16) * 3 % 5
    y = np.zeros(1000, np.uint32)
    cv.stream(k, [a0, a1], [y], device=device, args=(tbl, 1.5, 4), block_bytes=800)
    want = (a0 * 1.5 + a1 + 4 + tbl[np.arange(1000) % 7]).astype(np.uint32)
    np.testing.assert_array_equal(y, want)
    with pytest.raises(InputError, match="'a0'"):  # the element type is still checked
        cv.stream(k, [a0.astype(np.int16), a1], [y], device=device, args=(tbl, 1.5, 4))
    assert_clean(device)


# ---------------------------------------------------------------------------------------
# Wrong answers: a typedef read as another type.

SHADOWED = """typedef short int32_t;   /* OpenCL C has no int32_t: a short here */
typedef double float1;   /* nor 1-lane vectors (CUDA's float1): a double here */
enum small : uchar { SMALL_A, SMALL_B };          /* C23's fixed type (clang): 1 byte */
__kernel void shadow(__global const int32_t *a, __global const float1 *b,
                     __global const enum small *c,
                     __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (float)a[i] + (float)b[i] * 10 + (float)c[i] * 100;
}
"""

BIG_ENUM = """enum big { BIG_A = 0, BIG_B = 0x100000000 };  /* past int: 8 bytes (clang) */
__kernel void big(__global const enum big *d, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (float)d[i];
}
"""


def test_types_the_source_defines_are_read_as_it_defines_them(device):
    """``typedef short int32_t;`` and ``typedef double float1;`` are legal OpenCL C (neither
    name is built in); ``enum small : uchar`` is 1 byte. conveyor read them as int32, float32
    and int32: its tables of C and CUDA names came before the source's typedefs (signature.py
    ``resolve``), every enum was int32, and the size check skipped all three as built-in
    types. The arrays the kernel reads (int16, float64, uint8) were refused; the arrays
    conveyor asked for were read wrong: int32 as pairs of shorts (``[0, 0, 1, 0, 2, ...]``),
    float32 as doubles past their buffer. An enum holding 2**32 (8 bytes, clang), which
    conveyor cannot size, is refused by the size check, naming the parameter."""
    pocl_only(device)
    k = _compile(device, SHADOWED, "shadow")
    read = [(p.dtype.kind, p.dtype.itemsize) if p.dtype is not None else None
            for p in k.params[:3]]
    assert read == [("i", 2), ("f", 8), ("u", 1)], [p.describe() for p in k.params[:3]]
    x = np.arange(100) % 2
    arrays = [x.astype(p.dtype) for p in k.params[:3]]
    y = np.zeros(100, np.float32)
    cv.stream(k, arrays, [y], device=device)
    np.testing.assert_array_equal(y, (x * 111).astype(np.float32))
    with pytest.raises(InputError, match=r"big\.d.*enum big"):
        _compile(device, BIG_ENUM, "big")
    assert_clean(device)


CLANG_REAL = """#ifdef __clang__
typedef double real;
#else
typedef float real;
#endif
__kernel void half_of(__global const real *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n / 2) y[i] = (float)x[i];
}
"""

SIGNED_BY_CLANG = """#ifdef __clang__
typedef int word;
#else
typedef uint word;
#endif
__kernel void widen(__global const word *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (float)x[i];
}
"""


def test_typedef_sign_chosen_by_a_predefined_macro_is_not_misread(device):
    """``word`` is ``int`` for the compiler (``__clang__``) and ``uint`` for conveyor's
    preprocessor. Same size, same kind: the size check passes it (it confirms the kind only,
    for enums' sake), and a uint32 array of 3e9 reaches the kernel as -1294967296: ``y``
    holds negative numbers, no error. Either the kernel is refused (as for a size that
    differs) or the array streams to the values it holds."""
    opencl_c_only(device)
    x = np.array([3_000_000_000, 5, 4_000_000_000, 0] * 25, np.uint32)
    y = np.zeros(100, np.float32)
    try:
        k = _compile(device, SIGNED_BY_CLANG, "widen")
        cv.stream(k, [x], [y], device=device)
    except InputError:
        assert not y.any()  # refused before any work
    else:
        np.testing.assert_array_equal(y, x.astype(np.float32))
    assert_clean(device)


# ---------------------------------------------------------------------------------------
# A crash: a parameter unnamed for the compiler, named for conveyor.

UNNAMED_BY_MACRO = """__kernel void f(__global const float *x, __global float *y, float
#ifndef FLT_MAX
    unused
#endif
    , ulong offset, ulong n) { ulong i = get_global_id(0); if (i < n) y[i] = x[i] * 2; }
"""


def test_parameter_unnamed_only_for_the_compiler_does_not_crash(device, tmp_path):
    """The third parameter is named under ``#ifndef FLT_MAX``: conveyor's preprocessor does
    not define ``FLT_MAX`` (the compiler's header does), so conveyor reads it named and asks
    PoCL its name, which PoCL answers with a segmentation fault (round sixteen's guard keeps
    that question from parameters unnamed in conveyor's own reading). The child should build
    the kernel and stream it."""
    pocl_only(device)
    script = f"""
import sys, warnings, numpy as np, conveyor as cv
warnings.simplefilter("ignore")
dev = [d for d in cv.devices() if d.backend == "opencl"][0]
k = dev.compile({UNNAMED_BY_MACRO!r}, "f")
x = np.arange(100, dtype=np.float32)
y = np.zeros_like(x)
cv.stream(k, [x], [y], device=dev, args=(1.0,))
assert np.array_equal(y, x * 2)
"""
    env = dict(os.environ, CONVEYOR_CACHE_DIR=str(tmp_path), PYTHONPATH=os.pathsep.join(
        [str(Path(cv.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])


# ---------------------------------------------------------------------------------------
# False refusals of legal C.

LEGAL_TYPEDEFS = """typedef double real;
typedef __global const real *rp;                    /* a pointer to a typedef */
typedef float other, single;                        /* two names */
typedef int word __attribute__((aligned(4)));       /* with an attribute */
__kernel void legal(rp a, __global const single *b, __global const word *c,
                    __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (float)a[i] + b[i] * 10 + (float)c[i] * 100;
}
"""


def test_legal_typedef_forms_are_read(device):
    """``a`` is a typedef of a pointer to a typedef (the driver names the pointee ``real``,
    conveyor's parameter has base ``rp``: argtypes.py ``from_driver`` matches the two by
    name), ``b`` a typedef declaring two names and ``c`` a typedef with an attribute (both
    missed by signature.py's ``_TYPEDEF``). Each is refused: "real* (a type conveyor cannot
    resolve)". The float64, float32 and int32 arrays should stream."""
    opencl_c_only(device)
    k = _compile(device, LEGAL_TYPEDEFS, "legal")
    assert [p.dtype for p in k.params[:3]] == [np.dtype(t) for t in ("f8", "f4", "i4")], [
        p.describe() for p in k.params[:3]]
    x = np.arange(100) % 3
    y = np.zeros(100, np.float32)
    cv.stream(k, [x.astype("f8"), x.astype("f4"), x.astype("i4")], [y], device=device)
    np.testing.assert_array_equal(y, (x * 111).astype(np.float32))
    assert_clean(device)


COMMA_ATTRIBUTE = """typedef double real;
__kernel void scaled(__global const real * __attribute__((aligned(16), nosvm)) x,
                     __global float *y, float s, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (float)x[i] * s;
}
"""


def test_comma_inside_an_attribute_keeps_the_parameter_whole(device):
    """``__attribute__((aligned(16), nosvm))`` on a parameter: the list is split at every
    comma, so conveyor reads six parameters where the driver reports five. None is named
    (``arg0``..., in every message) and ``real`` is not resolved: the float64 array is
    refused. The names should be the source's and the stream should run."""
    opencl_c_only(device)
    k = _compile(device, COMMA_ATTRIBUTE, "scaled")
    assert [p.name for p in k.params] == ["x", "y", "s", "offset", "n"]
    x = np.arange(100, dtype=np.float64)
    y = np.zeros(100, np.float32)
    cv.stream(k, [x], [y], device=device, args=(2.5,))
    np.testing.assert_array_equal(y, x.astype(np.float32) * np.float32(2.5))
    assert_clean(device)


EXT_VECTOR = """typedef float v4 __attribute__((ext_vector_type(4)));
__kernel void affine(__global const float *x, __global float *y, v4 s, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * s.x + s.y;
}
"""


def test_vector_typedef_by_attribute_is_refused_by_value(device):
    """``typedef float v4 __attribute__((ext_vector_type(4)))`` is how clang's own header
    makes ``float4``. conveyor does not read it (the typedef reader skips attributes), the
    driver says ``v4``, and the scalar is "a type conveyor cannot resolve", which takes any
    NumPy scalar as given: ``np.float32(2)`` is passed as 4 bytes for a 16-byte argument, and
    ``s.y`` is whatever followed them (y[0] was 3e-41). It should be refused as ``float2``
    by value is ("declare 4 scalar parameters instead"), before any work."""
    opencl_c_only(device)
    k = _compile(device, EXT_VECTOR, "affine")
    x = np.arange(100, dtype=np.float32)
    y = np.zeros_like(x)
    with pytest.raises(InputError, match="'s'"):
        cv.stream(k, [x], [y], device=device, args=(np.float32(2),))
    assert not y.any()
    assert_clean(device)


def test_size_check_holds_after_a_line_directive(device):
    """guard: the size check finds which of its appended lines failed by their line numbers
    or by name; a ``#line`` directive (generated sources have them) moves the numbers, and a
    check not found is dropped as one the compiler could not evaluate. ``real`` chosen by
    ``__clang__`` is still refused, never read as float."""
    opencl_c_only(device)
    source = '#line 500 "generated.cl"\n' + CLANG_REAL
    x = np.arange(1, 101, dtype=np.float32)
    y = np.zeros_like(x)
    with pytest.raises(InputError, match=r"sizeof\(real\)"):
        k = _compile(device, source, "half_of")
        cv.stream(k, [x], [y], device=device)
    assert not y.any()
    assert_clean(device)


SPEC_MACRO_GUARD = """#ifdef USE_DOUBLE
typedef double real;
#else
typedef float real;
#endif
#ifdef CLK_LOCAL_MEM_FENCE  /* OpenCL C (every compiler defines it): not CUDA */
__kernel void twice(__global const real *x, __global real *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * 2;
}
#endif
"""


def test_kernel_inside_a_branch_on_a_spec_macro_is_read_expanded(device):
    """``CLK_LOCAL_MEM_FENCE`` (like ``FLT_MAX``, ``M_PI``, ``CHAR_BIT``, ``INT_MAX``) is a
    macro the OpenCL C specification has every compiler define; conveyor's preprocessor does
    not (``Device.source_macros``), finds no kernel ``twice`` in the expanded text, and reads
    the raw text (build.py ``_read_params``), where ``real`` has two typedefs: "real* (a type
    conveyor cannot resolve)" for the float64 array ``-DUSE_DOUBLE`` asks for. (With a
    macro head, ``#define KHEAD __kernel``, it is "no kernel named 'twice'"; a typedef from a
    header is not seen either.) The stream should run."""
    opencl_c_only(device)
    k = _compile(device, SPEC_MACRO_GUARD, "twice", ["-DUSE_DOUBLE"])
    assert k.params[0].dtype == np.dtype(np.float64), k.params[0].describe()
    x = np.arange(100, dtype=np.float64)
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], device=device)
    np.testing.assert_array_equal(y, x * 2)
    assert_clean(device)
