"""Round twenty-four, helper A: a review of the source changes of round twenty-three's fixes
(1da6a20..HEAD): typedef statements read by declarator (kernels/typedefs.py, signature.py),
the exact sign checks of sizecheck.py, OpenCL C's predefined macros (clmacros.py), the
halves kept wide through ``conveyor.dask`` (fold.WideHalves), ``_host_copy``'s deep copy of
any partial, and the read-back of a read-only resident table on eviction.

The old and new parsers were run side by side (``parse_params``) over sixty sources: typedef
chains, typedefs inside functions and structs, ``typedef struct {...} S;``, function-pointer
typedefs, ``#define``d types, redundant ``typedef unsigned int uint;``, typedef names equal to
parameter names, arrays ``float x[]`` and ``x[][4]``, CUDA ``using``, templates and unnamed
parameters: the same readings, but for those below. Real builds on PoCL: pointer typedefs
(``rp x``, ``const wp x``, ``wp restrict y``, ``typedef __global float *a, *b;``), enums of
a fixed type through typedef chains, ``char``/``signed char``/``uchar`` typedefs, typedefs
of typedefs of uint, ``long int``, ``short signed int``; pcpp's ``#if`` over the new limits
(``-1 < UINT_MAX`` is false, as in C), a user's own ``#define M_PI``, ``#undef FLT_MAX``.

Found (strict xfails, each asserting the right behaviour):

- **Regression (refused; a wrong answer on CUDA)**: a typedef of a built-in name inside a
  function, struct or namespace (``void f() { typedef ushort uint; }``) now retypes the
  kernel's own file-scope ``uint`` parameter: ``resolve`` takes the source's names before
  the built-ins (signature.py:170) and ``declared`` keeps a name declared only at an inner
  depth (typedefs.py:37-42). OpenCL refuses the kernel at its build (sizecheck); on CUDA,
  where the check compares sizes only, ``struct T { typedef double size_t; }`` makes a
  kernel's ``size_t n`` a float64: 8 bytes either way, n passed as a double's bits.
- **Regression (refused on CUDA)**: a redundant ``typedef size_t size_t;`` (legal C++, and
  C11) maps the name to itself, and ``resolve`` now follows it round and round to nothing
  (signature.py:170-175) where the built-in was read before.
- **Regression (refused)**: ``typedef float s, v4 __attribute__((ext_vector_type(4)));``
  reads ``s`` as a float4: the attribute is searched in the whole statement and given to
  every declarator without ``*`` (typedefs.py:60, 74); the kernel taking ``s a`` built and
  ran before, and is now refused at its build, blamed on "a macro such as __clang__".
- **Regression (refused)**: attributes that change a type other than ``ext_vector_type``
  (``mode(DI)``, ``vector_size(16)``) are stripped and the typedef read as its base type
  (``typedef int i64 __attribute__((mode(DI)))`` as a 4-byte int): the kernel is refused at
  its build; before, it was an unresolved name and the driver's reading passed it.
- **Wrong answer (Dask)**: ``conveyor.dask.reduce`` of tuple partials of float16 (two or
  more elements: the flat fold) still casts each chunk's totals to float16
  (fold.py:109-110 casts ``WideHalves`` back even inside ``halves_kept_wide``): nan where
  ``cv.stream`` gives 0; round twenty-three's fix covered scalars and arrays only.

- **Regression (refused)**: clmacros.py spells ``UINT_MAX`` ``0xffffffffU`` where clang's
  header has ``0xffffffff`` (signed in ``#if`` arithmetic): ``#if -1 < UINT_MAX`` is true
  for PoCL's compiler and false for conveyor, which reads the other branch and refuses the
  kernel at its build (before, UINT_MAX was undefined, 0, and the branch agreed).

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import (
    first_device_only,  # noqa: E402, F401
    opencl_c_only,  # noqa: E402
    pocl_only,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402
from conveyor.kernels.signature import parse_params  # noqa: E402

BODY = "{ ulong i = get_global_id(0); if (i < n) y[i] = x[i] * (float)a; }"
X = np.arange(100, dtype=np.float32)


def _times(device: cv.Device, source: str, name: str, arg: object) -> np.ndarray:
    """Build ``source`` and stream X through it with ``args=(arg,)``: y = x * a."""
    k = device.compile(source, name)
    y = np.zeros_like(X)
    cv.stream(k, [X], [y], device=device, args=(arg,), block_bytes=400)
    return y


# -- kernels/typedefs.py, signature.py: the source's typedefs before the built-in names -----------

def test_function_local_typedef_of_a_built_in_name_leaves_the_kernels_parameter_alone(device):
    """``uint`` in the kernel's parameter list is OpenCL's uint: the helper's ``typedef
    ushort uint;`` is local to its body. Round twenty-three's build ran this kernel
    (x * 3); today conveyor reads ``a`` as a ushort and its own size check refuses the kernel
    ("conveyor read its type uint as 2 bytes (ushort)")."""
    opencl_c_only(device)
    source = ("void helper24(void) { typedef ushort uint; uint t = 0; (void)t; }\n"
              "__kernel void local24(__global const float *x, __global float *y, uint a, "
              "ulong offset, ulong n) " + BODY)
    np.testing.assert_array_equal(_times(device, source, "local24", 3), X * 3)


def test_inner_scope_typedef_of_a_built_in_name_is_not_the_cuda_kernels_type():
    """CUDA C read by ``parse_params`` alone (NVRTC's size check compares sizes only, so
    what is read here is what is passed): a traits struct's ``typedef double size_t;`` made
    the kernel's ``size_t n`` a float64 (8 bytes, as size_t: no check catches it, and n is
    passed as a double's bits); a device function's ``typedef int uint32_t;`` made
    ``uint32_t *x`` an int32 array, a namespace's ``typedef short int32_t;`` an int16."""
    traits = parse_params('struct Traits { typedef double size_t; };\n'
                          'extern "C" __global__ void k(float *x, size_t n) {}', "k")
    local = parse_params('__device__ int f(int v) { typedef int uint32_t; return v; }\n'
                         'extern "C" __global__ void k(uint32_t *x, uint32_t a) {}', "k")
    spaced = parse_params('namespace detail { typedef short int32_t; }\n'
                          'extern "C" __global__ void k(int32_t *x, int32_t a) {}', "k")
    assert [str(p.dtype) for p in traits] == ["float32", "uint64"]
    assert [str(p.dtype) for p in local] == ["uint32", "uint32"]
    assert [str(p.dtype) for p in spaced] == ["int32", "int32"]


def test_redundant_self_typedef_of_a_built_in_name_is_still_that_type():
    """``typedef size_t size_t;`` (C++ and C11 allow a typedef redeclared as itself; clang
    builds ``typedef uint uint;`` in OpenCL C with a warning) maps the name to itself:
    ``resolve`` follows the source's name first, round and round, and gives up (None)
    where round twenty-three read the built-in (uint64). A CUDA kernel's ``size_t n`` is
    then a type conveyor cannot resolve, and ``args=(n,)`` is refused; on OpenCL the
    driver's reading hides it."""
    cuda = parse_params('typedef size_t size_t;\n'
                        'extern "C" __global__ void k(float *x, size_t n) {}', "k")
    opencl = parse_params("typedef uint uint;\n__kernel void k(__global uint *x, uint a) {}",
                          "k")
    assert [str(p.dtype) for p in cuda] == ["float32", "uint64"]
    assert [str(p.dtype) for p in opencl] == ["uint32", "uint32"]

def test_ext_vector_type_applies_to_its_own_declarator_only(device):
    """``typedef float s, v4 __attribute__((ext_vector_type(4)));`` declares a float ``s``
    and a float4 ``v4`` (clang: sizeof(s) is 4). Today ``s`` is read as a float4 and the
    kernel taking ``s a``, which round twenty-three built and ran (x * 2 with
    ``np.float32(2)``), is refused at its build, blamed on "a macro ... such as
    __clang__"."""
    opencl_c_only(device)
    head = "typedef float s, v4 __attribute__((ext_vector_type(4)));\n"
    params = parse_params(head + "__kernel void k(__global float *x, s a, v4 b) {}", "k")
    assert [(str(p.dtype), p.width) for p in params] == \
        [("float32", 1), ("float32", 1), ("float32", 4)]
    source = head + ("__kernel void vec24(__global const float *x, __global float *y, s a, "
                     "ulong offset, ulong n) " + BODY)
    np.testing.assert_array_equal(_times(device, source, "vec24", np.float32(2)), X * 2)


def test_attributes_that_change_a_typedefs_type_are_not_read_as_its_base(device):
    """``typedef int i64 __attribute__((mode(DI)));`` is an 8-byte integer and
    ``typedef float vs4 __attribute__((vector_size(16)));`` a vector of four floats; today
    both are read as their base type (int, float) once the attributes are stripped: the
    kernel taking ``i64 a`` (given ``np.int64(3)``), which round twenty-three passed through
    the driver's reading, is refused at its build."""
    opencl_c_only(device)
    vs4 = parse_params("typedef float vs4 __attribute__((vector_size(16)));\n"
                       "__kernel void k(__global vs4 *x) {}", "k")[0]
    assert (vs4.dtype, vs4.width) != (np.dtype(np.float32), 1)  # float4, or unresolved
    source = ("typedef int i64 __attribute__((mode(DI)));\n"
              "__kernel void mode24(__global const float *x, __global float *y, i64 a, "
              "ulong offset, ulong n) " + BODY)
    np.testing.assert_array_equal(_times(device, source, "mode24", np.int64(3)), X * 3)


TYPEDEFS = """
typedef __global const float *rp;
typedef __global float *wp, *wp2;
typedef signed char sc;
typedef char c8;
typedef unsigned char byte;
typedef unsigned int uint;
typedef uint u1;
typedef u1 u2;
typedef short signed int ssi;
enum color : uchar { RED, GREEN };
typedef enum color col;
typedef col col2;
#if LONG_MAX > INT_MAX && CHAR_MIN < 0 && SHRT_MIN == -32768 && defined(M_PI_F)
typedef long wide;
#else
typedef int wide;
#endif
#define M_PI 3.14f
__kernel void types24(rp x, wp2 y, sc a, c8 b, byte c, u2 d, ssi e, col2 f, wide g,
                      ulong offset, ulong n)
{ ulong i = get_global_id(0); if (i < n) y[i] = x[i] + a + b + c + d + e + f + g; }
"""


@pytest.mark.filterwarnings("ignore:Non-empty compiler output")  # the redefinitions
def test_guard_pointer_typedefs_sign_exact_typedefs_fixed_enums_and_limits(device):
    """guard: one kernel with pointer typedefs (``rp x``, ``wp2 y`` of ``typedef __global
    float *wp, *wp2;``), typedefs of ``signed char``, ``char``, ``unsigned char``, a
    redundant ``typedef unsigned int uint;`` and a chain of it, ``short signed int``, an
    ``enum color : uchar`` through two typedefs, and a type chosen by ``#if LONG_MAX >
    INT_MAX && ...`` beside a user's own ``#define M_PI``: each read as the compiler reads
    it, no false refusal by the sign checks, and the right sum."""
    pocl_only(device)
    k = device.compile(TYPEDEFS, "types24")
    read = [(p.is_pointer, str(p.dtype)) for p in k.params[:9]]
    assert read == [(True, "float32"), (True, "float32"), (False, "int8"), (False, "int8"),
                    (False, "uint8"), (False, "uint32"), (False, "int16"), (False, "uint8"),
                    (False, "int64")]
    assert k.params[0].is_const and not k.params[1].is_const
    args = (-2, -3, 200, 4_000_000_000, -5, 1, 2**40)
    y = np.zeros_like(X)
    cv.stream(k, [X], [y], device=device, args=args, block_bytes=400)
    want = X.copy()
    for value in args:  # as the kernel adds: each converted to float, left to right
        want = want + np.float32(value)
    np.testing.assert_array_equal(y, want)


# -- pipeline/fold.py, dask/arrays.py: float16 totals kept wide ------------------------------------

@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
def test_dask_reduce_of_tuple_float16_partials_folds_as_cv_stream_does(device):
    """Round twenty-three's case with a tuple partial ``(h, h)``: 32 chunks of +30000 then
    -30000 halves. ``cv.stream`` adds in float32 and casts once: (0, 0). Through
    ``conveyor.dask.reduce`` each chunk's flat fold casts its ``WideHalves`` back to float16
    at once (``Fold.result``: "lists of halves: their elements cast now"), the group totals
    overflow: (nan, nan). A scalar or an array partial gives 0 (round twenty-three's fix);
    the same tuple with an int beside the half (the per-element fold) gives 0 too."""
    dask = pytest.importorskip("dask")
    da = pytest.importorskip("dask.array")
    import conveyor.dask as cvd

    x = np.arange(64, dtype=np.float32)

    def part(a, *, queue, offset, n):
        h = np.float16(30000 if offset < 32 else -30000)
        return h, h

    local = cv.stream(part, [x], device=device, reduce="sum", block_bytes=8).result
    assert tuple(local) == (0, 0)
    with dask.config.set(scheduler="synchronous"):
        got = cvd.reduce(part, da.from_array(x, chunks=2), "sum", device=device.spec,
                         block_bytes=8).compute()
    got = tuple(got[()] if isinstance(got, np.ndarray) else got)
    assert got == (0, 0) and all(v.dtype == np.float16 for v in got), got


# -- pipeline/step.py: _host_copy of any partial ---------------------------------------------------

def test_guard_a_record_view_reused_for_every_block_folds_each_blocks_values(device):
    """guard: ``reduce=f`` over np.void partials (records now pass ``partial_of``), each a
    view of ONE record array the callable refills for every block: every block's (offset,
    n) is folded, not the last block's four times; ``reduce="sum"`` of records is
    conveyor's InputError."""
    rec = np.zeros(1, dtype=[("s", "f8"), ("c", "i8")])

    def part(a, *, queue, offset, n):
        rec[0] = (offset, n)
        return rec[0]

    def add(a, b):
        return np.array([(a["s"] + b["s"], a["c"] + b["c"])], dtype=a.dtype)[0]

    x = np.arange(400, dtype=np.float32)
    total = cv.stream(part, [x], device=device, reduce=add, block_bytes=400).result
    assert (float(total["s"]), int(total["c"])) == (0 + 100 + 200 + 300, 400)
    with pytest.raises(InputError, match="sum takes numbers"):
        cv.stream(part, [x], device=device, reduce="sum", block_bytes=400)


def test_guard_a_partial_holding_a_lock_is_conveyors_error(device):
    """guard: a partial object holding a ``threading.Lock`` cannot be copied: an InputError
    naming the block and what to return (round twenty-three's fold raised the raw
    "TypeError: cannot pickle '_thread.lock' object" for it too: nothing that worked now
    fails)."""
    class Acc:
        def __init__(self, s: float) -> None:
            self.s, self.lock = s, threading.Lock()

    def part(a, *, queue, offset, n):
        return Acc(float(n))

    with pytest.raises(InputError, match="block 0 .*cannot be copied"):
        cv.stream(part, [np.arange(400, dtype=np.float32)], device=device,
                  reduce=lambda a, b: Acc(a.s + b.s), block_bytes=400)


# -- pipeline/resident.py: a read-only table read back on eviction ---------------------------------

LOOK = """__kernel void look24(__global const float *x, __global float *y,
    __global const float *t, ulong offset, ulong n)
{ ulong i = get_global_id(0); if (i < n) y[i] = x[i] + t[(offset + i) % 64]; }"""


def test_guard_evicted_strided_and_fortran_tables_keep_their_values_until_refresh(device):
    """guard: read-only tables given as a strided column and a Fortran-order column, evicted
    (as the pool's out-of-memory ladder does) between streams: the next stream sees the
    table as it was uploaded, the host's later change (no refresh) is not picked up by an
    eviction, ``refresh()`` after an eviction uploads the change, ``close()`` after an
    eviction frees it and refuses a later stream."""
    opencl_c_only(device)
    k = device.compile(LOOK, "look24")
    x = np.zeros(256, np.float32)

    def run(handle):
        y = np.zeros_like(x)
        cv.stream(k, [x], [y], device=device, args=(handle,), block_bytes=256)
        return y

    base = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)
    for table in (base[:, 1], np.asfortranarray(base)[:, 1]):
        handle = cv.resident(table)
        first = np.resize(np.ascontiguousarray(table), 256)
        np.testing.assert_array_equal(run(handle), first)
        assert handle.evict() and handle.buffer is None
        table += 1000  # the host's copy changes, with no refresh()
        np.testing.assert_array_equal(run(handle), first)
        assert handle.evict()
        np.testing.assert_array_equal(run(handle), first)
        handle.refresh()
        np.testing.assert_array_equal(run(handle), first + 1000)
        assert handle.evict()
        handle.close()
        with pytest.raises(InputError, match="closed"):
            run(handle)



def test_guard_an_evicted_table_is_the_same_table_on_two_devices(pair):
    """guard: a read-only table uploaded to the first device, evicted, changed on the host
    with no refresh(), then streamed over both devices (either first): every block sees the
    table as uploaded (the home device uploads the kept values, the other gets the same
    copy); after refresh(), every block sees the change."""
    first, _ = pair
    opencl_c_only(first)
    k = first.compile(LOOK, "look24")
    table = np.arange(64, dtype=np.float32)
    handle = cv.resident(table)
    x = np.zeros(2560, np.float32)

    def run(devices):
        y = np.zeros_like(x)
        cv.stream(k, [x], [y], device=devices, args=(handle,), block_bytes=256)
        return y

    want = np.resize(table.copy(), 2560)
    np.testing.assert_array_equal(run(first), want)
    for devices in (pair, pair[::-1]):
        assert handle.evict()
        table += 1000
        np.testing.assert_array_equal(run(list(devices)), want)
    handle.refresh()
    np.testing.assert_array_equal(run(list(pair)), np.resize(table, 2560))
    handle.close()

def test_guard_opencl_limits_choose_a_typedef_as_the_compiler_does():
    """guard (no build): conveyor's preprocessing with the new predefined macros takes the
    branch the compiler takes, for limits written with suffixes and hex (``ULONG_MAX ==
    0xffffffffffffffffUL``), and leaves a user's ``#undef``/``#define`` of one in force."""
    from conveyor.kernels.clmacros import predefined
    from conveyor.kernels.preprocess import expand_checked

    macros = tuple(predefined().items())
    tail = "\n__kernel void k(__global real *y) {}"
    for condition, want in (("ULONG_MAX == 0xffffffffffffffffUL", "float64"),
                            ("INT_MIN < -2147483647 && SCHAR_MIN == -128", "float64"),
                            ("-1 < ULONG_MAX", "float32")):
        source = (f"#if {condition}\ntypedef double real;\n#else\ntypedef float real;\n"
                  f"#endif{tail}")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            text, expanded = expand_checked(source, (), macros)
        assert expanded and str(parse_params(text, "k")[0].dtype) == want, condition
    source = ("#undef INT_MAX\n#define INT_MAX 5\n#if INT_MAX > 40000\ntypedef double real;"
              "\n#else\ntypedef float real;\n#endif" + tail)
    text, expanded = expand_checked(source, (), macros)
    assert expanded and str(parse_params(text, "k")[0].dtype) == "float32"


def test_uint_max_in_an_if_is_the_compilers_token(device):
    """The compiler's ``UINT_MAX`` is ``0xffffffff`` (clang's opencl-c-base.h; PoCL's
    compiler says ``#if -1 < UINT_MAX`` is true: the preprocessor's arithmetic is intmax_t,
    where that literal is signed). clmacros.py:19 spells it ``0xffffffffU``, unsigned in
    ``#if``: conveyor reads the ``#else`` branch (int for the compiler's long) and its size
    check refuses the kernel. Before clmacros, UINT_MAX was undefined (0) and the same
    branch as the compiler's was read. (The only one of the 23 integer macros that differs:
    each tried in ``-1 < M``, ``M > 0``, ``M / 2 > 0`` against the compiler.)"""
    opencl_c_only(device)
    source = ("#if -1 < UINT_MAX\ntypedef long wide;\n#else\ntypedef int wide;\n#endif\n"
              "__kernel void umax24(__global const float *x, __global float *y, wide a, "
              "ulong offset, ulong n) " + BODY)
    np.testing.assert_array_equal(_times(device, source, "umax24", 2), X * 2)
