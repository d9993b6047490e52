"""Round twenty-five, helper A: kernel parameter types read from real-world kernel sources,
old reader (1da6a20) against new (round twenty-three's typedef reader and round
twenty-four's fixes: kernels/typedefs.py, signature.py, sizecheck.py, clmacros.py).

The corpus (kept out of the repository): 908 OpenCL C and CUDA C files from ten public
projects (ArrayFire, hashcat, Rodinia, cuda-samples, clBLAS, CLBlast, Boost.Compute, VexCL,
PyOpenCL, darknet), 980 kernels read raw and 1,100 after conveyor's preprocessing, and 52
kernels written in those projects' styles (CLBlast's ``PRECISION``/``real``, hashcat's
``typedef ulong ullong; typedef ullong u64;`` under a ``KERN_ATTR_BASIC()`` parameter list,
VexCL, Boost.Compute pairs, ArrayFire's ``KParam``, Loopy, ``#ifdef cl_khr_fp64``,
``reqd_work_group_size``, CUDA ``extern "C"``, ``__launch_bounds__``, namespaces, ``using``).
``parse_params`` gave the same reading before and after on every real file; the typedef
tables differ only where the new reader is right (CUDA's ``typedef unsigned short uint16;``,
a scalar, was a 16-lane uint vector) or both resolve nothing (template typedefs). The 50
kernels of the corpus that PoCL builds as they stand, two of hashcat's real kernels (built
with hashcat's options, VECT_SIZE 1 and 4), PyOpenCL's ``cfloat_t`` (its header's union),
and the style kernels read as the driver reports (structs aside), with no false refusal
from the sign checks (``typedef signed char``/``char``/``unsigned char``, ``long int``,
``unsigned long int``, enums up to 0x80000000u, a redundant ``typedef unsigned int uint;``).

Found (strict xfails asserting the right behaviour; none a regression of 1da6a20..HEAD):

- **A silent wrong value on CUDA (by reading)**: a CUDA kernel parameter with a C++ default
  argument (``float w = 0.5f``, in cuda-samples' volumeFiltering) is read as a parameter
  named ``0.5f`` of an unknown type: NVRTC's size check has nothing to compare, and an
  unknown type takes a NumPy scalar as given, so ``np.float64(0.25)`` is passed as 8 bytes
  to a 4-byte float (the kernel reads 0.0).
- **Refused, though it builds (OpenCL)**: a pointer typedef qualified after its ``*``
  (``typedef __global const real *restrict rp;``) or a typedef of a pointer typedef
  (``typedef wp wp2;``) is no pointer typedef to conveyor; the driver then reports
  ``real*`` and conveyor, which resolves a driver's typedef name only through the matching
  source parameter's name, cannot resolve it.
- **Refused on CUDA**: the same ``typedef float * __restrict__ fptr;`` makes the parameter
  a non-pointer ("must be a pointer").
- **Misread on CUDA**: ``const Pair<float, int> p`` is split at the template's comma (two
  parameters, the refusal blaming "macros that expand to several parameters"); a typedef
  inside the ``extern "C" { ... }`` that also holds the kernel (``typedef signed char
  int8;``) is left out as "declared only inside braces", and ``int8`` read as 8 ints.

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import (
    first_device_only,  # noqa: E402, F401
    pocl_only,  # noqa: E402
)

import conveyor as cv  # noqa: E402
from conveyor.kernels.preprocess import expand  # noqa: E402
from conveyor.kernels.signature import parse_params  # noqa: E402


def _read(params) -> list[tuple[str, bool, str]]:
    return [(p.name, p.is_pointer, str(p.dtype)) for p in params]


# -- real-world styles, read before and after alike ----------------------------------------------

HASHCAT = """typedef ulong   ullong;
typedef uchar  u8;
typedef uint   u32;
typedef ullong u64;
typedef u8  u8a;
typedef u64 u64a;
#define CONCAT(a, b)       a##b
#define VTYPE(type, width) CONCAT(type, width)
#if VECT_SIZE == 1
typedef u32 u32x;
#else
typedef VTYPE(uint, VECT_SIZE) u32x;
#endif
typedef struct digest { u32 digest_buf[4]; } digest_t;
#define GLOBAL_AS __global
#define KERNEL_FQ __kernel
#define KERN_ATTR_MIX() GLOBAL_AS const u8a *in, GLOBAL_AS u64a *out, \\
    GLOBAL_AS const digest_t *digests, const ullong k, const u32x s, ulong offset, ulong n
KERNEL_FQ void mix25 (KERN_ATTR_MIX ())
{
  const u64 gid = get_global_id (0);
  if (gid < n) out[gid] = in[gid] * k + s;
}
"""


def test_guard_hashcat_style_typedef_chains_through_a_macro_parameter_list(device):
    """guard: hashcat's ``typedef ulong ullong; typedef ullong u64; typedef u64 u64a;``, a
    ``u32x`` chosen by ``#if VECT_SIZE == 1`` (a ``-D`` option), and the parameter list a
    macro (``KERN_ATTR_...()``) that expands to it: each type read as the compiler reads it
    (``u64a*`` as uint64, ``ullong`` as uint64, ``u32x`` as uint32), the sign checks pass,
    and the kernel's sums come back."""
    pocl_only(device)
    k = device.compile(HASHCAT, "mix25", ["-DVECT_SIZE=1"])
    assert _read(k.params[:5]) == [("in", True, "uint8"), ("out", True, "uint64"),
                                   ("digests", True, "None"), ("k", False, "uint64"),
                                   ("s", False, "uint32")]
    x = np.arange(200, dtype=np.uint8)
    y = np.zeros(200, np.uint64)
    digests = cv.resident(np.zeros(4, np.dtype([("digest_buf", np.uint32, 4)])),
                          device=device)
    cv.stream(k, [x], [y], device=device, args=(digests, 2**40 + 3, 7), block_bytes=100)
    np.testing.assert_array_equal(y, x.astype(np.uint64) * np.uint64(2**40 + 3) + 7)


def test_guard_clblast_and_cuda_sample_styles_read_as_their_compilers_do():
    """guard (parse only): CLBlast's ``real``/``real2`` chosen by ``#if PRECISION == ...``
    (expanded as conveyor expands it) with ``__attribute__((reqd_work_group_size))``
    before ``void``; cuda-samples' ``typedef unsigned short uint16;`` (a scalar in CUDA:
    before round twenty-three it was read as a 16-lane uint), ``typedef float2 Complex;``,
    ``using index_t = int64_t;`` and a namespace's ``typedef`` brought in by ``using``."""
    clblast = ("#define PRECISION 64\n#if PRECISION == 32\ntypedef float real;\n"
               "typedef float2 real2;\n#elif PRECISION == 64\ntypedef double real;\n"
               "typedef double2 real2;\n#endif\n"
               "__kernel __attribute__((reqd_work_group_size(64, 1, 1)))\n"
               "void Xaxpy(const int n, const real arg_alpha, "
               "const __global real2* restrict xgm, __global real* ygm) {}\n")
    read = parse_params(expand(clblast), "Xaxpy")
    assert _read(read) == [("n", False, "int32"), ("arg_alpha", False, "float64"),
                           ("xgm", True, "float64"), ("ygm", True, "float64")]
    assert read[2].width == 2 and read[2].is_const
    samples = ('namespace detail { typedef float accum_t; }\nusing detail::accum_t;\n'
               'using index_t = int64_t;\ntypedef unsigned short uint16;\n'
               'typedef float2 Complex;\n'
               'extern "C" __global__ void __launch_bounds__(256, 2) k(const uint16 *in, '
               'Complex *c, const index_t n, const accum_t a) {}\n')
    read = parse_params(samples, "k")
    assert _read(read) == [("in", True, "uint16"), ("c", True, "float32"),
                           ("n", False, "int64"), ("a", False, "float32")]
    assert [p.width for p in read] == [1, 2, 1, 1]


# -- CUDA: a parameter's default argument ------------------------------------------------------

def test_cuda_parameter_with_a_default_argument_is_read_as_its_type():
    """cuda-samples' volumeFiltering declares ``__global__ void d_render_regular(...,
    float transferWeight = 0.0f)`` (C++ default arguments are legal on ``__global__``
    functions). conveyor reads a parameter named ``0.5f`` whose type is "float w =":
    NVRTC's argument sizes have nothing to check it against, and a type conveyor cannot
    resolve takes a NumPy scalar as given, so ``args=(np.float64(0.25),)`` is passed as 8
    bytes to a 4-byte float (the kernel reads the double's low half: 0.0)."""
    read = parse_params('extern "C" __global__ void k(float *o, int n, float w = 0.5f, '
                        'const unsigned int m = 4u) {}', "k")
    assert _read(read) == [("o", True, "float32"), ("n", False, "int32"),
                           ("w", False, "float32"), ("m", False, "uint32")]


# -- pointer typedefs qualified after their "*", and typedefs of them ------------------------------

POINTERS = """typedef float Real;
typedef __global const Real *restrict in_ptr;
typedef __global Real *out_base;
typedef out_base out_ptr;
__kernel void restrict25(in_ptr a, __global Real *b, const Real s, ulong offset, ulong n)
{ size_t i = get_global_id(0); if (i < n) b[i] = a[i] * s; }
__kernel void chain25(__global const Real *a, out_ptr b, const Real s, ulong offset, ulong n)
{ size_t i = get_global_id(0); if (i < n) b[i] = a[i] * s; }
"""


def test_restrict_pointer_typedef_of_a_typedef_streams(device):
    """``typedef __global const Real *restrict in_ptr;`` (round twenty-three's ``rp`` with
    ``restrict``, as CLBlast-style code writes its pointers): ``typedefs._statement``
    matches its declarator only with ``*`` and spaces between the type and the name, so
    ``restrict`` ends the type and ``in_ptr`` is no pointer typedef; PoCL reports
    ``Real*``, and ``argtypes.from_driver`` resolves a driver's typedef name only through
    the source parameter's own name (``in_ptr``): "Real* (a type conveyor cannot
    resolve)", and the stream is refused."""
    pocl_only(device)
    k = device.compile(POINTERS, "restrict25")
    x = np.arange(100, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], device=device, args=(3,), block_bytes=100)
    np.testing.assert_array_equal(y, x * 3)


def test_typedef_of_a_pointer_typedef_streams(device):
    """``typedef __global Real *out_base; typedef out_base out_ptr;``: ``out_ptr`` maps to
    ``out_base`` (no ``*``), so it is neither an element typedef that resolves nor a
    pointer typedef; PoCL reports ``Real*`` and conveyor cannot resolve it (as above)."""
    pocl_only(device)
    k = device.compile(POINTERS, "chain25")
    x = np.arange(100, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], device=device, args=(3,), block_bytes=100)
    np.testing.assert_array_equal(y, x * 3)


def test_cuda_restrict_pointer_typedef_is_a_pointer():
    """CUDA reads the source alone: ``typedef float * __restrict__ fptr;`` (or ``* const``)
    leaves ``fptr x`` a non-pointer of an unknown type, and a stream refuses the array it
    receives ("must be a pointer")."""
    read = parse_params('typedef float * __restrict__ fptr;\n'
                        'typedef const float * const cfptr;\n'
                        'extern "C" __global__ void k(cfptr x, fptr y, int n) {}', "k")
    assert _read(read) == [("x", True, "float32"), ("y", True, "float32"),
                           ("n", False, "int32")]
    assert read[0].is_const and not read[1].is_const


# -- CUDA C++: template arguments and extern "C" blocks --------------------------------------------

def test_cuda_template_struct_parameter_is_one_parameter():
    """``const Pair<float, int> p`` is one parameter (a struct by value); ``split_top``
    splits at commas outside parentheses only, so conveyor reads four parameters for three
    and NVRTC's size check refuses the kernel, blaming "macros that expand to several
    parameters"."""
    read = parse_params('template <class A, class B> struct Pair { A a; B b; };\n'
                        'extern "C" __global__ void k(float *o, const Pair<float, int> p, '
                        'int n) {}', "k")
    assert [p.name for p in read] == ["o", "p", "n"]


def test_cuda_typedef_in_the_kernels_own_extern_c_block_is_read():
    """A CUDA file wrapped in ``extern "C" { ... }``: its ``typedef signed char int8;`` is
    at file scope for the kernel beside it, but ``typedefs.declared`` leaves out a built-in
    name (``int8``: an OpenCL vector to conveyor) declared only inside braces (round
    twenty-four's fix for a struct's or a function's typedef), so ``const int8 *x`` is read
    as a pointer to 8 ints and refused."""
    read = parse_params('extern "C" {\ntypedef signed char int8;\n'
                        '__global__ void k(const int8 *x, float *y, int n) {}\n}\n', "k")
    assert _read(read) == [("x", True, "int8"), ("y", True, "float32"), ("n", False, "int32")]
    assert read[0].width == 1
