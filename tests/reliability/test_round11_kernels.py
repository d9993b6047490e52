"""The eleventh round, kernels and their parameters (OpenCL C on PoCL): unusual declarations,
arrays whose dtype is not the pointer's, scalars at their limits, layouts and aliasing.

Found (each ``xfail(strict=True)`` test asserts the right behaviour; it passes today because
conveyor is wrong, and turns red when the bug is fixed):

- An output bound to a ``const`` (or ``__constant``) pointer parameter ran: the kernel cannot
  write it, so the output was left as it was or filled with the garbage of a device buffer no
  one wrote (a reduction returned NaN or -1.7e38). Chains refuse this; plain streams did not.
- A typedef chosen by a macro the compiler predefines (``#ifdef __opencl_c_fp64``,
  ``CL_VERSION_1_2``, ``__FAST_RELAXED_MATH__`` with ``-cl-fast-relaxed-math``) was resolved
  by conveyor's preprocessor, which does not define them, to the ``#else`` type: float32 arrays
  were taken for the compiler's ``double`` and read as doubles, float64 arrays were refused.
- A struct's layout was read from the raw source: a commented-out older definition, an
  inactive ``#ifdef`` branch, or the word "packed" in a comment decided the check, so wrong
  records streamed with no error and right ones were refused.
- An in-place map (``inputs=[a], outputs=[a]``) on the zero-copy path whose kernel reads its
  own element again after writing its output got the new value: 2a + 2 for NumPy's 2a + 1.
- A NumPy bool array holding bytes other than 0 and 1 (``.view(bool)`` of bytes) was passed to
  a ``bool*`` parameter as it was: the compiler reads such a bool by its low bit, so 2 was
  false where NumPy says True.
- An ``offset`` parameter too narrow for the stream's offsets (``uchar``, or ``uint`` with a
  ``first_row`` near 2**32) was refused only at the launch of the block that overflows it,
  after earlier blocks had written the output.
- A kernel name a macro makes (``#define KNAME mykernel``) was listed by its macro name
  ("kernels found: s, KNAME") and ``compile(src, "KNAME")`` gave a CompileError
  ``INVALID_KERNEL_NAME`` instead of naming ``mykernel``.
- A string literal holding ``kernel void s(...)`` (a printf) before the kernel ``s`` was read
  as its parameter list: a right stream was refused ("a type conveyor cannot resolve").
- ``reqd_work_group_size`` larger than the device allows failed at the first launch with
  a raw ``BackendError`` ``INVALID_WORK_GROUP_SIZE`` that names neither attribute nor limit.
- A ``__local`` pointer parameter: given ``pyopencl.LocalMemory`` the message said to pass an
  array, and given an array it said to declare the parameter ``__global`` (a circle).
- ``typedef long long wide;`` (128 bits on PoCL, refused when spelled ``long long*``) was
  resolved through the source to int64: int64 arrays were read as 16-byte elements.
- A ``pyopencl.array.Array`` in ``args=`` was passed without any check: float64 or int32
  bytes read as floats, a strided view ``a[::2]`` read as its whole base buffer, an offset
  view told to "pass an array", a reversed one a raw ``AssertionError`` from its repr, and
  one of the other PoCL's context hung the process for good in ``clSetKernelArg``.

Guards (already right): vector pointers refused whatever the array's shape; dtypes that are
not the pointer's (complex, datetime, void, bytes, unicode, longdouble, one-field records,
bool for uchar, int32 for uint) refused naming the parameter; several kernels in one source
with ``#include``, ``#pragma``, line continuations, attributes and commented-out kernels,
each chosen by name; ``half*`` through vload_half/vstore_half and ``size_t*`` exact;
``* const`` pointers; resident tables that are strided, reversed, Fortran-ordered,
transposed, read-only or broadcast views exact, and 0-d, empty or mistyped ones refused;
scalar casts at their edges; ``bool``/``size_t``/``half`` by value refused by the compiler.
"""

from __future__ import annotations

import decimal
import fractions
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import compiled, in_use  # noqa: E402

import conveyor as cv  # noqa: E402

_MAP = "ulong i = get_global_id(0);"


def _opencl_only(device: cv.Device) -> None:
    if device.backend != "opencl":
        pytest.skip("an OpenCL C kernel")


# -- 1. an output behind a const pointer -------------------------------------------------------
_SWAPPED = """__kernel void sq(__global float *y, __global const float *x, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] * x[i]; }"""
_CONSTANT_OUT = """__kernel void cp(__global const float *x, __constant float *y, ulong offset,
                                   ulong n) { }"""
_CONST_PARTIALS = """__kernel void pr(__global const float *x, __global const float *p,
                                      ulong offset, ulong n) { }"""


@pytest.mark.parametrize("zero_copy", [None, False])
def test_an_output_bound_to_a_const_parameter_is_refused_before_any_work(device, zero_copy):
    """Parameters in the wrong order (the output first) bind the input to ``float *y`` and the
    output to ``const float *x``: the kernel cannot write the output. ``cv.chain`` refuses this
    ("writes 'out0' through parameter 'x' ..., which is const"); a plain stream ran and left
    the output as it was, or as garbage from the device."""
    _opencl_only(device)
    x = np.arange(1000, dtype=np.float32)
    y = np.full_like(x, -1)
    with pytest.raises(cv.InputError, match="const"):
        cv.stream(compiled(device, _SWAPPED, "sq"), [x], [y], device=device,
                  zero_copy=zero_copy)
    assert (y == -1).all()


def test_constant_output_and_const_reduce_buffer_are_refused(device):
    _opencl_only(device)
    x = np.arange(1000, dtype=np.float32)
    y = np.full_like(x, -1)
    with pytest.raises(cv.InputError):
        cv.stream(compiled(device, _CONSTANT_OUT, "cp"), [x], [y], device=device)
    with pytest.raises(cv.InputError):
        cv.stream(compiled(device, _CONST_PARTIALS, "pr"), [x], reduce="sum", device=device)


# -- 2. typedefs chosen by macros the compiler predefines --------------------------------------
_REAL = """#ifdef {macro}
typedef double real;
#else
typedef float real;
#endif
__kernel void lower(__global const real *x, __global float *y, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) y[i] = i < n / 2 ? (float)x[i] : -1.0f;   /* reads half: never past x */
}}"""


@pytest.mark.parametrize(("macro", "options"), [
    ("__opencl_c_fp64", []), ("CL_VERSION_1_2", []),
    ("__FAST_RELAXED_MATH__", ["-cl-fast-relaxed-math"]),
])
def test_a_typedef_chosen_by_a_predefined_macro_is_the_compilers_type(device, macro, options):
    """OpenCL C compilers define ``CL_VERSION_1_2``, the OpenCL 3.0 feature macros
    (``__opencl_c_fp64`` where doubles are supported) and ``__FAST_RELAXED_MATH__`` under
    ``-cl-fast-relaxed-math``; both PoCLs here do (``real`` is 8 bytes). conveyor's
    preprocessor defines none of them, so it resolved the driver's ``real*`` to float32: a
    float32 array was read as doubles with no error, and a float64 one was refused."""
    _opencl_only(device)
    k = device.compile(_REAL.format(macro=macro), "lower", options=options)
    x = np.arange(64, dtype=np.float64)
    y = np.zeros(64, np.float32)
    cv.stream(k, [x], [y], device=device)
    np.testing.assert_array_equal(y, np.where(np.arange(64) < 32, x, -1).astype(np.float32))
    with pytest.raises(cv.InputError, match="'x'"):
        cv.stream(k, [x.astype(np.float32)], [y], device=device)


# -- 3. struct layouts read from the raw source ------------------------------------------------
_REC_KERNEL = """
__kernel void rs(__global const rec *r, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = (float)r[i].a + r[i].b; }"""
_COMMENTED = ("/* version 1: typedef struct { float a; float b; } rec; */\n"
              "typedef struct { double a; float b; } rec;\n" + _REC_KERNEL)
_CHOSEN = ("#ifdef WIDE\ntypedef struct { double a; float b; } rec;\n"
           "#else\ntypedef struct { float a; float b; } rec;\n#endif\n" + _REC_KERNEL)
_PACKED_WORD = ("// NumPy records are packed unless align=True\n"
                "typedef struct { uchar a; float b; } rec;\n" + _REC_KERNEL)
_NARROW = np.dtype([("a", "f4"), ("b", "f4")])  # 8 bytes
_WIDE = np.dtype([("a", "f8"), ("b", "f4")], align=True)  # 16 bytes
_PACKED = np.dtype([("a", "u1"), ("b", "f4")])  # 5 bytes, NumPy's packed layout
_ALIGNED = np.dtype([("a", "u1"), ("b", "f4")], align=True)  # 8 bytes, C's


def _records(dtype: np.dtype) -> np.ndarray:
    r = np.zeros(200, dtype)
    r["a"] = np.arange(200) % 100
    r["b"] = 0.5
    return r


def _right_or_refused(device, source, name, wrong, right) -> None:
    """Records of the layout the compiler uses stream exactly; the other layout is refused."""
    k = compiled(device, source, name)
    r = _records(right)
    y = np.zeros(len(r), np.float32)
    cv.stream(k, [r], [y], device=device)
    np.testing.assert_array_equal(y, r["a"].astype(np.float32) + r["b"])
    with pytest.raises(cv.InputError, match="struct 'rec'"):
        cv.stream(k, [_records(wrong)], [y], device=device)


def test_a_commented_out_struct_definition_does_not_decide_the_layout(device):
    _opencl_only(device)
    _right_or_refused(device, _COMMENTED, "rs", wrong=_NARROW, right=_WIDE)


def test_the_struct_of_the_inactive_ifdef_branch_does_not_decide_the_layout(device):
    _opencl_only(device)
    _right_or_refused(device, _CHOSEN, "rs", wrong=_WIDE, right=_NARROW)


def test_the_struct_of_the_active_ifdef_branch_is_checked(device):
    """guard: with -DWIDE the first branch is both the one conveyor reads and the compiler's."""
    _opencl_only(device)
    k = device.compile(cv.portable(_CHOSEN), "rs", options=["-DWIDE"])
    r = _records(_WIDE)
    y = np.zeros(len(r), np.float32)
    cv.stream(k, [r], [y], device=device)
    np.testing.assert_array_equal(y, r["a"].astype(np.float32) + r["b"])
    with pytest.raises(cv.InputError, match="struct 'rec'"):
        cv.stream(k, [_records(_NARROW)], [y], device=device)


def test_the_word_packed_in_a_comment_does_not_turn_the_layout_check_off(device):
    """``check_struct`` skips any source that mentions ``pack``/``packed`` (for
    ``__attribute__((packed))`` and ``#pragma pack``), comments included."""
    _opencl_only(device)
    _right_or_refused(device, _PACKED_WORD, "rs", wrong=_PACKED, right=_ALIGNED)


# -- 4. in place: a map that reads its element again after writing ----------------------------
_REREAD = """__kernel void twice_plus_one(__global const float *x, __global float *y, ulong offset,
                                         ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { y[i] = x[i] + 1.0f; y[i] += x[i]; }   /* its own element only */
}"""


def test_in_place_map_that_reads_its_element_after_writing_gives_numpys_answer(device):
    """README: in place "gives NumPy's answer, as if every input row were read before any
    output row was written". This map reads only its own element, but again after writing
    its output: on the zero-copy path, with the input's buffer the output's, the second read
    saw x + 1. An in-place stream copies now unless zero_copy=True is asked for."""
    _opencl_only(device)
    a = np.arange(10_000, dtype=np.float32)
    expected = 2 * a + 1
    cv.stream(compiled(device, _REREAD, "twice_plus_one"), [a], [a], device=device,
              block_bytes=4000)
    np.testing.assert_array_equal(a, expected)


def test_in_place_map_that_rereads_is_exact_when_copying(device):
    """guard: the same kernel in place with zero_copy=False."""
    _opencl_only(device)
    a = np.arange(10_000, dtype=np.float32)
    expected = 2 * a + 1
    cv.stream(compiled(device, _REREAD, "twice_plus_one"), [a], [a], device=device,
              block_bytes=4000, zero_copy=False)
    np.testing.assert_array_equal(a, expected)


# -- 5. bool arrays with bytes other than 0 and 1 ---------------------------------------------
_NOT = """__kernel void lnot(__global const bool *x, __global bool *y, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = !x[i]; }"""


def test_bool_arrays_stream_through_bool_pointers(device):
    """guard: NumPy's own bools (0 and 1) to a ``bool*`` kernel are exact."""
    _opencl_only(device)
    x = np.arange(1000) % 3 == 0
    y = np.zeros_like(x)
    cv.stream(compiled(device, _NOT, "lnot"), [x], [y], device=device)
    np.testing.assert_array_equal(y, ~x)


def test_bool_bytes_other_than_0_and_1_are_true_or_refused(device):
    """``np.frombuffer(raw, bool)`` (or ``u8.view(bool)``) holds any byte; NumPy reads every
    nonzero byte as True. The compiler loads a ``bool`` by its low bit (2 is false): such an
    array is either streamed as NumPy reads it or refused, never reinterpreted."""
    _opencl_only(device)
    x = np.frombuffer(bytes([0, 1, 2, 255] * 250), dtype=np.bool_)
    y = np.zeros(len(x), np.bool_)
    # Refused (the load is the compiler's: PoCL's read 2 as false, NVIDIA's as true).
    with pytest.raises(cv.InputError, match="bytes other than 0 and 1"):
        cv.stream(compiled(device, _NOT, "lnot"), [x], [y], device=device)
    assert not y.any()
    fixed = np.not_equal(x.view(np.uint8), 0)  # what the message says to pass
    cv.stream(compiled(device, _NOT, "lnot"), [fixed], [y], device=device)
    np.testing.assert_array_equal(y, np.logical_not(x))


# -- 6. an offset type too narrow for the stream ----------------------------------------------
_NARROW_OFFSET = """__kernel void at(__global const float *x, __global float *y, {t} offset,
                                     {t} n) {{
    size_t i = get_global_id(0); if (i < n) y[i] = x[i] + (float)(offset + i); }}"""


@pytest.mark.parametrize(("ctype", "first_row"), [("uchar", 0), ("uint", 2**32 - 500)])
def test_an_offset_type_too_narrow_for_the_stream_is_refused_before_any_work(device, ctype,
                                                                             first_row):
    """Every block's offset is known before the first: (first_row + rows) must fit ``uchar``
    (255) or ``uint``. The InputError came at block 3 (uchar) or 6 (uint), after the blocks
    before had written 300 or 500 elements of the output."""
    _opencl_only(device)
    x = np.zeros(1000, np.float32)
    y = np.full_like(x, -1)
    with pytest.raises(cv.InputError, match="offset"):
        cv.stream(compiled(device, _NARROW_OFFSET.format(t=ctype), "at"), [x], [y],
                  device=device, block_bytes=400, first_row=first_row)
    assert (y == -1).all(), f"{int((y != -1).sum())} elements written before the error"
    assert in_use(device) == (0, 0)


def test_an_offset_type_wide_enough_streams(device):
    """guard: ``ushort`` offsets for 1000 elements are exact."""
    _opencl_only(device)
    x = np.zeros(1000, np.float32)
    y = np.full_like(x, -1)
    cv.stream(compiled(device, _NARROW_OFFSET.format(t="ushort"), "at"), [x], [y],
              device=device, block_bytes=400)
    np.testing.assert_array_equal(y, np.arange(1000, dtype=np.float32))


# -- 7. kernel names: made by a macro, inside a string, missing ------------------------------
_MACRO_NAME = """#define KNAME mykernel
void helper(__global float *p) { }
__kernel void s(__global const float *x, __global float *y, ulong offset, ulong n) { }
__kernel void KNAME(__global const float *x, __global float *y, ulong offset, ulong n) { }"""


def test_kernel_names_listed_and_refused_are_the_compilers(device):
    _opencl_only(device)
    with pytest.raises(cv.InputError, match="mykernel"):
        device.compile(_MACRO_NAME, "nope")
    with pytest.raises(cv.InputError, match="mykernel"):
        device.compile(_MACRO_NAME, "KNAME")


def test_missing_and_non_kernel_names_are_input_errors_listing_the_kernels(device):
    """guard: a helper function, a name with spaces, a name only in a comment."""
    _opencl_only(device)
    source = _MACRO_NAME + "\n// __kernel void ghost(__global float *y, ulong offset, ulong n)\n"
    for name in ("helper", " s", "ghost"):
        with pytest.raises(cv.InputError, match="kernels found: s"):
            device.compile(source, name)
    assert device.compile(source, "mykernel").name == "mykernel"


_STRING = r"""typedef double real;
__kernel void dbg(__global const real *p, __global real *q, ulong offset, ulong n) {
    if (get_global_id(0) == n) printf("kernel void s(__global const float *x)\n"); }
__kernel void s(__global const real *x, __global real *y, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] * 2; }"""


def test_a_string_literal_naming_the_kernel_does_not_hide_its_parameters(device):
    _opencl_only(device)
    k = compiled(device, _STRING, "s")
    x = np.arange(100, dtype=np.float64)
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], device=device)
    np.testing.assert_array_equal(y, 2 * x)


# -- 8. attributes ----------------------------------------------------------------------------
def test_reqd_work_group_size_past_the_devices_limit_is_an_input_error(device):
    _opencl_only(device)
    size = 2 * int(device.cl_device.max_work_group_size)
    source = (f"__kernel __attribute__((reqd_work_group_size({size}, 1, 1))) void s("
              f"__global const float *x, __global float *y, ulong offset, ulong n) {{ {_MAP} "
              f"if (i < n) y[i] = x[i]; }}")
    x = np.arange(1000, dtype=np.float32)
    y = np.zeros_like(x)
    with pytest.raises(cv.InputError, match="reqd_work_group_size"):
        cv.stream(compiled(device, source, "s"), [x], [y], device=device)


# -- 9. __local pointers ------------------------------------------------------------------------
_LOCAL = """__kernel void l(__global const float *x, __global float *y, __local float *s,
                          ulong offset, ulong n) {
    ulong i = get_global_id(0); size_t l = get_local_id(0);
    s[l] = i < n ? x[i] : 0.0f; barrier(CLK_LOCAL_MEM_FENCE); if (i < n) y[i] = s[l] * 2.0f;
}"""


def test_a_local_pointer_parameter_works_or_says_it_is_not_supported(device):
    """``pyopencl.LocalMemory`` (PyOpenCL's way to size a ``__local`` argument) was told "pass
    an array", and an array was told "declare it __global const or __constant". Either the
    PyOpenCL idiom works, or both messages say that a ``__local`` parameter is not supported
    (and to declare a fixed-size ``__local`` array inside the kernel)."""
    _opencl_only(device)
    import pyopencl as cl

    k = compiled(device, _LOCAL, "l")
    x = np.arange(1000, dtype=np.float32)
    y = np.zeros_like(x)
    try:
        cv.stream(k, [x], [y], args=(cl.LocalMemory(4 * k.default_local_size),),
                  device=device)
    except cv.InputError as exc:
        assert "pass an array" not in str(exc), str(exc)
        with pytest.raises(cv.InputError) as again:
            cv.stream(k, [x], [y], args=(np.zeros(256, np.float32),), device=device)
        assert "declare it __global" not in str(again.value), str(again.value)
    else:
        np.testing.assert_array_equal(y, 2 * x)


# -- 10. long long behind a typedef -------------------------------------------------------------
_LONGLONG = """typedef {t} wide;
__kernel void ll(__global const wide *x, __global long *y, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) y[i] = i < n / 2 ? (long)x[i] : -1;   /* reads half: never past x */
}}"""


@pytest.mark.parametrize("ctype", ["long long", "unsigned long long"])
def test_long_long_behind_a_typedef_is_refused_as_long_long_is(device, ctype):
    """``long long*`` is refused at compile (OpenCL C's long long is 128 bits here), but
    ``typedef long long wide;`` resolved through the source to int64: int64 arrays were read
    as 16-byte elements with no error (``sizeof(wide)`` is 16 on both PoCLs)."""
    _opencl_only(device)
    x = np.arange(64, dtype=np.int64 if ctype == "long long" else np.uint64)
    y = np.zeros(64, np.int64)
    with pytest.raises(cv.InputError, match="long long"):
        cv.stream(compiled(device, _LONGLONG.format(t=ctype), "ll"), [x], [y], device=device)


# -- 11. device arrays in args= ---------------------------------------------------------------
def _cl_table(device: cv.Device, values: np.ndarray):
    import pyopencl as cl
    import pyopencl.array as cl_array

    return cl_array.to_device(cl.CommandQueue(device.context), values)


def _stream_lut(device: cv.Device, table, values: np.ndarray) -> None:
    """Stream ``y = x + table[i % m]``; exact against ``values`` (what ``table`` holds), or
    an InputError, never another answer."""
    x = np.arange(100, dtype=np.float32)
    y = np.zeros_like(x)
    try:
        cv.stream(compiled(device, _LUT, "lut"), [x], [y], args=(table, len(values)),
                  device=device)
    except cv.InputError as exc:
        assert "pass an array" not in str(exc), str(exc)  # it is one
        return
    np.testing.assert_array_equal(y, x + values.astype(np.float32)[np.arange(100) % len(values)])


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_a_device_array_of_another_dtype_in_args_is_refused(device, dtype):
    """A ``pyopencl.array.Array`` in ``args=`` goes to the kernel "as it is": its dtype was
    never compared with the parameter's, so float64 or int32 bytes were read as floats."""
    _opencl_only(device)
    values = np.arange(8).astype(dtype)
    with pytest.raises(cv.InputError, match="'t'"):
        cv.stream(compiled(device, _LUT, "lut"), [np.zeros(100, np.float32)],
                  [np.zeros(100, np.float32)], args=(_cl_table(device, values), 8),
                  device=device)


@pytest.mark.parametrize("view", ["strided", "offset", "reversed"])
def test_a_device_array_view_in_args_is_exact_or_refused(device, view):
    """``a[::2]`` was passed as its base buffer (every element, not every other), ``a[4:]``
    was told to "pass an array" (it is one), and ``a[::-1]`` raised PyOpenCL's
    ``AssertionError: Array in get() must be contiguous`` from the message's repr."""
    _opencl_only(device)
    values = np.arange(16, dtype=np.float32)
    table = _cl_table(device, values)
    picked = {"strided": slice(None, None, 2), "offset": slice(4, None),
              "reversed": slice(None, None, -1)}[view]
    _stream_lut(device, table[picked], values[picked])


def test_a_device_array_in_args_is_used_in_place(device):
    """guard: a float32 ``pyopencl.array.Array`` of the stream's context is passed as it is."""
    _opencl_only(device)
    values = np.arange(16, dtype=np.float32) * 3
    _stream_lut(device, _cl_table(device, values), values)


class _ForeignBufferReached(RuntimeError):
    """clSetKernelArg was about to get a buffer of another OpenCL platform (PoCL hangs)."""


class _GuardedKernel:
    """The real ``cl.Kernel``, whose ``set_args`` refuses one buffer: on PoCL, a buffer of
    the other platform's context given to clSetKernelArg hangs the process for good."""

    def __init__(self, real, foreign_ptr: int) -> None:
        self._real, self._foreign = real, foreign_ptr

    def set_args(self, *values):
        if any(getattr(v, "int_ptr", None) == self._foreign for v in values):
            raise _ForeignBufferReached("a buffer of another platform reached clSetKernelArg")
        return self._real.set_args(*values)

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_a_device_array_of_another_device_is_refused_before_any_launch(pair, monkeypatch):
    """Found as a hang: ``args=(pyopencl_array_of_device_1,)`` to a stream on device 0 (the
    two PoCLs are two platforms) blocked forever in ``set_args``. The real kernel is wrapped
    so that the foreign buffer raises instead of hanging; the stream must refuse it first."""
    first, second = pair
    if first.backend != "opencl" or second.backend != "opencl":
        pytest.skip("OpenCL device arrays")
    source = _LUT.replace("lut(", "lut_foreign(")
    k = first.compile(cv.portable(source), "lut_foreign")  # its own: the wrapper stays here
    table = _cl_table(second, np.arange(16, dtype=np.float32))
    monkeypatch.setattr(k, "cl_kernel", _GuardedKernel(k.cl_kernel, table.base_data.int_ptr))
    y = np.zeros(100, np.float32)
    with pytest.raises(cv.InputError):
        cv.stream(k, [np.arange(100, dtype=np.float32)], [y], args=(table, 16), device=first)
    assert (y == 0).all()


# -- guards -------------------------------------------------------------------------------------
_VEC = """__kernel void v(__global const float4 *x, __global float4 *y, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] * 2.0f; }"""


@pytest.mark.parametrize("array", [
    np.zeros((100, 4), np.float32),
    np.zeros(100, [("x", "f4"), ("y", "f4"), ("z", "f4"), ("w", "f4")]),
    np.zeros(100, "V16"),
], ids=["n-by-4", "structured", "void16"])
def test_vector_pointers_are_refused_whatever_the_arrays_shape(device, array):
    """guard: (n, 4) float32, four-field records and 16-byte voids to ``float4*``: refused with
    how to write it (``vload4``), nothing allocated, the output untouched."""
    _opencl_only(device)
    out = np.ones_like(array)
    before = out.copy()
    with pytest.raises(cv.InputError, match="vload4"):
        cv.stream(compiled(device, _VEC, "v"), [array], [out], device=device)
    assert out.tobytes() == before.tobytes()
    assert in_use(device) == (0, 0)


_COPY = "__kernel void c(__global const {t} *x, __global float *y, ulong offset, ulong n) {{ " \
        + _MAP + " if (i < n) y[i] = (float)x[i]; }}"


@pytest.mark.parametrize(("ctype", "array"), [
    ("float", np.ones(100, np.complex64)),
    ("long", np.arange(100).astype("datetime64[s]")),
    ("long", np.arange(100).astype("timedelta64[s]")),
    ("uint", np.zeros(100, "V4")),
    ("uint", np.array(["a"] * 100)),
    ("float", np.zeros(100, "S4")),
    ("float", np.zeros(100, [("a", "f4")])),
    ("double", np.zeros(100, np.longdouble)),
    ("uchar", np.ones(100, bool)),
    ("uint", np.arange(100, dtype=np.int32)),
    ("float", np.arange(100, dtype=np.float64)),
], ids=["complex", "datetime", "timedelta", "void", "unicode", "bytes", "one-field", "longdouble",
        "bool-uchar", "int-uint", "f64-float"])
def test_an_array_whose_dtype_is_not_the_pointers_is_refused(device, ctype, array):
    """guard: never reinterpreted: an InputError naming the parameter and both types."""
    _opencl_only(device)
    y = np.zeros(100, np.float32)
    with pytest.raises(cv.InputError, match=r"parameter 'x' is \w+\*") as info:
        cv.stream(compiled(device, _COPY.format(t=ctype), "c"), [array], [y], device=device)
    assert str(array.dtype) in str(info.value)
    assert (y == 0).all()


_HEADER = "typedef uint word;\n#define SCALE 3\n"
_MANY = r"""#include "r11_types.h"
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
/* a comment about the kernel void ghost(int) we removed */
// __kernel void gone(__global float *y, ulong offset, ulong n) { }
__kernel __attribute__((vec_type_hint(float4))) __attribute__((work_group_size_hint(64, 1, 1)))
void first(__global const word *x, \
           __global word *y, \
           ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * SCALE;
}
void __kernel second(__global const word *restrict x, __global word *restrict y,
                     word add, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + add + (word)(offset + i);
}
__kernel void third(__global const double *x, __global double * const y, const double k,
                    ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] * k; }
"""


def test_several_kernels_with_includes_pragmas_continuations_and_attributes(device, tmp_path):
    """guard: each kernel of one source chosen by name; a typedef from an ``#include``d
    header, a macro, ``#pragma``, ``\\`` continuations in the parameter list, attributes around
    ``void``, ``restrict``, ``* const`` and comments that mention kernels; the names in
    comments are not kernels."""
    _opencl_only(device)
    (tmp_path / "r11_types.h").write_text(_HEADER)
    options = [f"-I{tmp_path}"]
    x = np.arange(5000, dtype=np.uint32)
    y = np.zeros_like(x)
    cv.stream(device.compile(_MANY, "first", options=options), [x], [y], device=device,
              block_bytes=4000)
    np.testing.assert_array_equal(y, x * 3)
    cv.stream(device.compile(_MANY, "second", options=options), [x], [y], args=(np.uint8(7),),
              device=device, block_bytes=4000)
    np.testing.assert_array_equal(y, x + 7 + np.arange(5000, dtype=np.uint32))
    d = np.linspace(-1, 1, 5000)
    e = np.zeros_like(d)
    cv.stream(device.compile(_MANY, "third", options=options), [d], [e], args=(-0.25,),
              device=device, block_bytes=4000)
    np.testing.assert_array_equal(e, d * -0.25)
    with pytest.raises(cv.InputError, match="word"):
        cv.stream(device.compile(_MANY, "first", options=options), [x.view(np.int32)],
                  [y], device=device)
    for ghost in ("ghost", "gone"):
        with pytest.raises(cv.InputError, match="kernels found: first, second, third"):
            device.compile(_MANY, ghost, options=options)


_POINTER_TYPEDEFS = """typedef __global float *fptr;
typedef __global const float *cfptr;
#define REAL double
__kernel void k(cfptr x, __global const volatile REAL *z, fptr y, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] + (float)z[i]; }"""


def test_pointer_typedefs_macro_types_and_volatile_are_resolved(device):
    """guard: ``typedef __global float *fptr`` parameters (const or not), a ``#define``d
    element type and a ``volatile`` pointer: exact, and a float64 array for ``cfptr`` refused."""
    _opencl_only(device)
    k = compiled(device, _POINTER_TYPEDEFS, "k")
    assert [p.is_const for p in k.params[:3]] == [True, True, False]
    x = np.arange(1000, dtype=np.float32)
    z = np.linspace(0, 1, 1000)
    y = np.zeros_like(x)
    cv.stream(k, [x, z], [y], device=device)
    np.testing.assert_array_equal(y, x + z.astype(np.float32))
    with pytest.raises(cv.InputError, match="'x' is float"):
        cv.stream(k, [x.astype(np.float64), z], [y], device=device)


_HALF = """__kernel void h(__global const half *x, __global half *y, float k, ulong offset,
                          ulong n) {
    ulong i = get_global_id(0); if (i < n) vstore_half(vload_half(i, x) * k, i, y); }"""
_SIZES = """__kernel void z(__global const size_t *x, __global size_t *y, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] + offset + i; }"""


def test_half_and_size_t_pointers_are_exact(device):
    """guard: float16 through ``half*`` (vload_half/vstore_half: float32 math, rounded back)
    and uint64 through ``size_t*``."""
    _opencl_only(device)
    x = (np.arange(3000) / 7).astype(np.float16)
    y = np.zeros_like(x)
    cv.stream(compiled(device, _HALF, "h"), [x], [y], args=(3,), device=device,
              block_bytes=2000)
    np.testing.assert_array_equal(y, (x.astype(np.float32) * np.float32(3)).astype(np.float16))
    s = np.arange(3000, dtype=np.uint64) * 2**40
    t = np.zeros_like(s)
    cv.stream(compiled(device, _SIZES, "z"), [s], [t], device=device, block_bytes=8000)
    np.testing.assert_array_equal(t, s + np.arange(3000, dtype=np.uint64))


@pytest.mark.parametrize("ctype", ["bool", "size_t", "half"])
def test_scalar_types_opencl_forbids_as_kernel_arguments_are_compile_errors(device, ctype):
    """guard: ``bool``, ``size_t`` and ``half`` by value are refused by the compiler itself,
    as a CompileError with its log, not a crash or a wrong cast."""
    _opencl_only(device)
    source = (f"__kernel void b(__global float *y, {ctype} f, ulong offset, ulong n) "
              f"{{ {_MAP} if (i < n) y[i] = (float)f; }}")
    with pytest.raises(cv.CompileError, match="kernel parameter|not allowed"):
        device.compile(source, "b")


def test_const_pointers_to_writable_data_are_outputs(device):
    """guard: ``float * const y`` is a const pointer to writable floats: an output in a stream
    and in a chain (the driver reports the pointee's qualifier, not the pointer's)."""
    _opencl_only(device)
    source = ("__kernel void s(__global const float * const x, __global float * const y, "
              "const float k, ulong offset, ulong n) { ulong i = get_global_id(0); "
              "if (i < n) y[i] = x[i] * k; }")
    k = compiled(device, source, "s")
    x = np.arange(1000, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], args=(3,), device=device)
    np.testing.assert_array_equal(y, 3 * x)
    y[:] = 0
    cv.stream(cv.chain(cv.link(k, reads="in0", writes="out0", args=(3,))), [x], [y],
              device=device)
    np.testing.assert_array_equal(y, 3 * x)


_LUT = """__kernel void lut(__global const float *x, __global float *y, __constant float *t, uint m,
                          ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] + t[(offset + i) % m]; }"""
_BASE = np.arange(64, dtype=np.float32).reshape(8, 8)


@pytest.mark.parametrize("table", [
    _BASE.reshape(-1)[::3], _BASE.reshape(-1)[::-1], np.asfortranarray(_BASE), _BASE[:, 2],
    _BASE.T, np.frombuffer(_BASE.tobytes(), np.float32),
    np.broadcast_to(np.float32(2.5), (10,)), np.array([7.0], np.float32),
], ids=["strided", "reversed", "fortran", "column", "transposed", "read-only", "broadcast",
        "one-element"])
def test_resident_tables_of_any_layout_are_read_in_c_order(device, table):
    """guard: a ``__constant`` table given as a strided, reversed, Fortran-ordered,
    transposed, read-only or broadcast view is uploaded as its C-order elements."""
    _opencl_only(device)
    x = np.arange(1000, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(compiled(device, _LUT, "lut"), [x], [y], args=(table, table.size),
              device=device, block_bytes=400)
    np.testing.assert_array_equal(y, x + np.ravel(table)[np.arange(1000) % table.size])


@pytest.mark.parametrize("table", [np.array(3.0, np.float32), np.zeros(0, np.float32),
                                   np.ones(5, bool), np.arange(5.0)],
                         ids=["0-d", "empty", "bool", "float64"])
def test_resident_tables_no_buffer_holds_as_declared_are_refused(device, table):
    """guard: 0-d, empty, bool and float64 tables for ``__constant float*``."""
    _opencl_only(device)
    x = np.arange(100, dtype=np.float32)
    y = np.zeros_like(x)
    with pytest.raises(cv.InputError, match="'t'"):
        cv.stream(compiled(device, _LUT, "lut"), [x], [y], args=(table, 1), device=device)
    assert (y == 0).all()
    assert in_use(device) == (0, 0)


_FILL = "__kernel void f(__global const float *x, __global {t} *y, {t} v, ulong offset, " \
        "ulong n) {{ " + _MAP + " if (i < n) y[i] = v; }}"


@pytest.mark.parametrize(("ctype", "value", "expected"), [
    ("float", -0.0, np.float32(-0.0)),
    ("float", 3.4028235677973362e38, np.finfo(np.float32).max),  # rounds to FLT_MAX
    ("int", fractions.Fraction(-7, 2), np.int32(-3)),
    ("int", -2**31 - 0.5, np.int32(-2**31)),
    ("float", decimal.Decimal("0.1"), np.float32(0.1)),
    ("double", np.array(1.5, dtype=">f8"), np.float64(1.5)),
    ("uint", np.array(7, dtype=">u4"), np.uint32(7)),
    ("uchar", np.bool_(True), np.uint8(1)),
], ids=["minus-zero", "flt-max-rounding", "fraction", "int-min-minus-half", "decimal",
        "big-endian-0d-double", "big-endian-0d-uint", "numpy-bool"])
def test_scalar_arguments_at_their_edges_are_cast_as_documented(device, ctype, value, expected):
    """guard: casts at the edges: -0.0 keeps its sign, the largest double that rounds to
    FLT_MAX does, fractions truncate toward zero, big-endian 0-d arrays read by value."""
    _opencl_only(device)
    dtype = np.dtype(type(expected))
    y = np.zeros(4, dtype)
    cv.stream(compiled(device, _FILL.format(t=ctype), "f"), [np.zeros(4, np.float32)], [y],
              args=(value,), device=device)
    assert y.tobytes() == np.full(4, expected, dtype).tobytes()


@pytest.mark.parametrize(("ctype", "value"), [
    ("float", 3.4028235677973366e38),  # half an ulp past FLT_MAX: would round to inf
    ("float", decimal.Decimal("sNaN")),
    ("uint", -1.5),
    ("char", np.uint8(200)),
    ("ushort", np.int8(-1)),
    ("int", np.array([5])),
], ids=["past-flt-max", "signalling-decimal", "negative-to-unsigned", "uint8-200-to-char",
        "int8-minus-one-to-ushort", "one-element-array"])
def test_scalar_arguments_no_cast_means_are_refused(device, ctype, value):
    """guard: InputError naming args[0] and the parameter, before any work."""
    _opencl_only(device)
    k = compiled(device, _FILL.format(t=ctype), "f")
    out = np.zeros(4, k.params[1].dtype)
    with pytest.raises(cv.InputError, match=r"args\[0\].*'v'"):
        cv.stream(k, [np.zeros(4, np.float32)], [out], args=(value,), device=device)
    assert (out == 0).all()
