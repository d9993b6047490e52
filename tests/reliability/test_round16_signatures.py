"""Round sixteen, kernel signatures: how conveyor reads a kernel's parameter list (the text,
preprocessed) beside what the compiler builds (the driver's report, ``sizeof``), unusual but
legal C declarations, and compile options. Every result is compared with NumPy's.

Found (strict xfails, each asserting the right behaviour):

- The size check that confirms typedef types (``kernels/sizecheck.py``) lines up the raw
  source's parameters with the expanded source's, and skips every kernel where they do not
  line up: a kernel head spelled through a macro (``#define KERNEL __kernel``), or a
  parameter through one (``GPTR(real) x``). A ``typedef double real`` chosen by
  ``#ifdef __clang__`` is then read as float: a float32 array reaches a double kernel, wrong
  values with no error (and a kernel writing ``real*`` writes past its output: the process
  died of SIGSEGV here).
- PoCL is asked the name of a parameter the source leaves unnamed: conveyor reads the first
  head it finds (a named prototype before the definition), and takes ``[]`` of an unnamed
  array parameter (``__global float []``) for a name. The process dies of SIGSEGV.
- An ``enum`` parameter takes any NumPy scalar as its bytes: ``np.float32(2)`` reaches the
  kernel as the int 1073741824.
- An option holding two (``"-w -DUSE_DOUBLE"``: the driver splits options at spaces) is
  skipped by conveyor's preprocessor (``"-DA=1 -DB"`` is one define of A), and
  ``__OPENCL_C_VERSION__`` is taken from ``CL_DEVICE_OPENCL_C_VERSION`` (PoCL: 120) where
  this PoCL's compiler defines 300 by default, and ``-cl-std`` is ignored: a type chosen by
  them is read as the other branch, and a right stream is refused with a message that
  blames a macro the compiler predefines (with a macro-spelled head: wrong values).
- A ``// comment`` ending in a backslash continues onto the next line for the compiler, not
  for conveyor's preprocessor: a ``#define`` there is taken as defined.
- ``cv.stream(source, ...)`` and ``conveyor.dask.kernel(source, name)`` read kernel names
  from the raw text: a kernel whose head is a macro is "no kernel", one in ``#if 0`` is one.
- A CUDA kernel declared ``__global__ void __launch_bounds__(256) k(...)`` is not found
  (its "kernel" is ``__launch_bounds__``).
- A ``__constant`` input's blocks are sized with no regard to the device's
  ``CL_DEVICE_MAX_CONSTANT_BUFFER_SIZE`` (PoCL does not enforce it; GPU drivers fail the
  launch).
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
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402


def _compile(device: cv.Device, source: str, name: str, options: list[str] | None = None
             ) -> cv.Kernel:
    """``device.compile`` with PyOpenCL's "non-empty compiler output" warnings kept quiet
    (PoCL warns of C2x unnamed parameters and of the size check's own build)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return device.compile(source, name, options or [])


# ---------------------------------------------------------------------------------------
# Guards: unusual spellings the driver's report and conveyor's reading agree on.

SPELLINGS = """
#define IN __global const
#define OUT __global
typedef __global float *fptr;
typedef __global const float *cfptr;
/* __kernel void qual_after(__global const double *x, __global double *y, ulong offset,
   ulong n) -- an old signature, in a comment */
__constant char note[] = "__kernel void qual_after(__global int *x, ulong offset, ulong n) {";
__kernel void qual_after(__global float const *x, __global float *const y, ulong offset, \\
                         ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * 2.0f;
}
#pragma OPENCL FP_CONTRACT OFF
__kernel __attribute__((reqd_work_group_size(8, 1, 1)))
void arrays(const __global float *restrict x, volatile __global float y[4], ulong offset,
            ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * 2.0f;
}
__kernel void typedef_ptrs(cfptr x, fptr y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * 2.0f;
}
__kernel void by_macros(IN float *x, OUT float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * 2.0f;
}
__kernel void from_constant(__constant float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * 2.0f;
}
#define TWICE(T, NAME) __kernel void NAME(__global const T *x, __global T *y, ulong offset, \\
                                          ulong n) { \\
    ulong i = get_global_id(0); \\
    if (i < n) y[i] = x[i] * (T)2; \\
}
TWICE(int, twice_int)
TWICE(double, twice_double)
"""


@pytest.mark.parametrize("name, dtype", [
    ("qual_after", np.float32), ("arrays", np.float32), ("typedef_ptrs", np.float32),
    ("by_macros", np.float32), ("from_constant", np.float32), ("twice_int", np.int32),
    ("twice_double", np.float64)])
def test_unusual_spellings_read_as_the_compiler_builds(device, name, dtype):
    """guard: ``float const *``, ``float *const``, ``const __global ... restrict``,
    ``volatile ... y[4]``, typedef'd pointer types, qualifiers from macros, ``__constant``
    input, kernels made by a function-like macro (one source, several kernels), a fake
    signature in a comment and in a string, a continued line, ``#pragma`` and
    ``reqd_work_group_size``: each kernel's parameters are its own, the output writable, the
    input checked, the result NumPy's."""
    opencl_c_only(device)
    k = _compile(device, SPELLINGS, name)
    assert [p.name for p in k.params] == ["x", "y", "offset", "n"]
    assert [p.dtype for p in k.params[:2]] == [np.dtype(dtype)] * 2
    assert k.params[0].is_const or k.params[0].address == "constant"
    assert not k.params[1].is_const
    x = (np.arange(1000) % 97).astype(dtype)
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], device=device, block_bytes=800)
    np.testing.assert_array_equal(y, x * dtype(2))
    with pytest.raises(InputError, match="dtype"):  # the element type is checked
        cv.stream(k, [x.astype(np.int16)], [y], device=device)
    assert_clean(device)


# ---------------------------------------------------------------------------------------
# The size check skipped where the raw and the expanded parameter lists do not line up.

CLANG_REAL = """#ifdef __clang__
typedef double real;
#else
typedef float real;
#endif
#define KERNEL __kernel
#define GPTR(T) __global T *
"""
# Reads x as real (double for the compiler) and writes float: reads stay inside the float32
# input (n / 2 doubles), so a wrong reading gives wrong values, never a write past the output.
HEADS = {
    "plain": "__kernel void half_of(__global const real *x, __global float *y, ulong offset, "
             "ulong n)",
    "macro head": "KERNEL void half_of(__global const real *x, __global float *y, "
                  "ulong offset, ulong n)",
    "macro pointer": "__kernel void half_of(const GPTR(real) x, GPTR(float) y, ulong offset, "
                     "ulong n)",
}
BODY = " { ulong i = get_global_id(0); if (i < n / 2) y[i] = (float)x[i]; }\n"


@pytest.mark.parametrize("head", [
    "plain",
    "macro head",
    "macro pointer",
])
def test_typedef_chosen_by_clang_is_confirmed_whatever_the_spelling(device, head):
    """``real`` is double for the compiler (``__clang__``) and float for conveyor's
    preprocessor. Spelled plainly, the size check refuses it (guard, round fourteen). Spelled
    with ``#define KERNEL __kernel`` or ``GPTR(real) x``, the raw text's parameters do not
    line up with the expanded text's (no kernel ``half_of`` in the raw text; ``GPTR(real) x``
    is no pointer there), ``sizecheck.checks`` skips the kernel, and a float32 array streams
    into the double kernel: ``y`` holds garbage, no error."""
    opencl_c_only(device)
    x = np.arange(1, 1001, dtype=np.float32)
    y = np.zeros_like(x)
    with pytest.raises(InputError, match=r"sizeof\(real\)"):
        k = _compile(device, CLANG_REAL + HEADS[head] + BODY, "half_of")
        cv.stream(k, [x], [y], device=device)
    assert not y.any()  # refused before any work
    assert_clean(device)


# ---------------------------------------------------------------------------------------
# PoCL asked the name of an unnamed parameter: a crash, so run in a child.

UNNAMED = {
    "named prototype first": (
        "__kernel void f(__global const float *x, __global float *y, float s, ulong offset, "
        "ulong n);\n"
        "__kernel void f(__global const float *x, __global float *y, float, ulong offset, "
        "ulong n) { ulong i = get_global_id(0); if (i < n) y[i] = x[i] * 2; }\n"),
    "unnamed array": (
        "__kernel void f(__global const float *x, __global float *y, __global const float [], "
        "ulong offset, ulong n) { ulong i = get_global_id(0); if (i < n) y[i] = x[i] * 2; }\n"),
}


@pytest.mark.parametrize("form", list(UNNAMED))
def test_unnamed_parameter_is_never_asked_its_name(device, form, tmp_path):
    """A kernel whose definition leaves a parameter unnamed (C2x; PoCL builds it with a
    warning). conveyor tells PoCL which arguments not to ask the name of (PoCL answers that
    query with a segmentation fault) from the parameters it read: the *first* head of the
    kernel (a prototype with every name), or ``__global float []`` read as named ``[]``. The
    child process died of SIGSEGV; it should build the kernel and stream it."""
    opencl_c_only(device)
    script = f"""
import sys, warnings, numpy as np, conveyor as cv
warnings.simplefilter("ignore")
dev = [d for d in cv.devices() if d.backend == "opencl"][0]
try:
    k = dev.compile({UNNAMED[form]!r}, "f")
except cv.CompileError:
    sys.exit(0)  # a compiler that wants every parameter named: refused, not a crash
assert [p.name for p in k.params][:2] == ["x", "y"], [p.name for p in k.params]
x = np.arange(100, dtype=np.float32)
y = np.zeros_like(x)
third = np.zeros(4, np.float32) if k.params[2].is_pointer else 1.0
cv.stream(k, [x], [y], device=dev, args=(third,))
assert np.array_equal(y, x * 2)
"""
    env = dict(os.environ, CONVEYOR_CACHE_DIR=str(tmp_path), PYTHONPATH=os.pathsep.join(
        [str(Path(cv.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])


# ---------------------------------------------------------------------------------------
# Scalars of a type conveyor does not resolve.

ENUM_SCALE = """enum scale { ONE = 1, TWO = 2 };
__kernel void scaled(__global const float *x, __global float *y, enum scale s, ulong offset,
                     ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * (float)s;
}
"""


def test_enum_parameter_with_int32_is_right(device):
    """guard: an ``enum`` parameter given an ``np.int32`` (the enum's size) works."""
    opencl_c_only(device)
    k = _compile(device, ENUM_SCALE, "scaled")
    x = np.arange(500, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], device=device, args=(np.int32(2),))
    np.testing.assert_array_equal(y, x * 2)


def test_enum_parameter_refuses_or_casts_a_float_scalar(device):
    """``args=(np.float32(2),)`` for ``enum scale s``: conveyor resolves no dtype for an
    enum, so any NumPy scalar passes as given, and the kernel reads the float's bits as the
    int 0x40000000: ``y`` is ``x * 1073741824``, no error. It should cast to the enum's
    integer (``int``: 4 bytes) or be refused."""
    opencl_c_only(device)
    k = _compile(device, ENUM_SCALE, "scaled")
    x = np.arange(500, dtype=np.float32)
    y = np.zeros_like(x)
    try:
        cv.stream(k, [x], [y], device=device, args=(np.float32(2),))
    except InputError:
        assert not y.any()
    else:
        np.testing.assert_array_equal(y, x * 2)


# ---------------------------------------------------------------------------------------
# Compile options: what the driver does with them vs what conveyor's preprocessor reads.

CHOSEN = """#ifdef USE_DOUBLE
typedef double real;
#else
typedef float real;
#endif
__kernel void twice_real(__global const real *x, __global real *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * 2;
}
"""


@pytest.mark.parametrize("options", [
    ["-w", "-DUSE_DOUBLE"],
    ["-w -DUSE_DOUBLE"],
], ids=["separate", "one option"])
def test_type_chosen_by_a_define_is_read_as_the_compiler_reads_it(device, options):
    """``real`` is double when ``USE_DOUBLE`` is defined. Given as separate options, conveyor
    reads it right (guard). Given as one option, which PyOpenCL joins with the others and
    the driver splits at spaces (the compiler defines USE_DOUBLE; ``includes.include_dirs``
    already splits ``-I`` so), ``preprocess._defines`` skips it (it does not start with
    ``-D``; ``"-DA=1 -DUSE_DOUBLE"`` is read as one define of A), reads float, and the size
    check refuses a right float64 stream saying the type is chosen "with a macro the
    compiler predefines ... (such as __clang__)" and to "choose the type with -D options",
    what the user did."""
    opencl_c_only(device)
    k = _compile(device, CHOSEN, "twice_real", options)
    x = np.arange(1000, dtype=np.float64) / 3
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], device=device)
    np.testing.assert_array_equal(y, x * 2)


VERSIONED = """#if __OPENCL_C_VERSION__ >= 200
typedef double real;
#else
typedef float real;
#endif
__kernel void twice_versioned(__global const real *x, __global real *y, ulong offset,
                              ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * 2;
}
"""


def _compiler_c_version(device: cv.Device, options: list[str]) -> int:
    """``__OPENCL_C_VERSION__`` as the device's compiler defines it under ``options``
    (a probe kernel built with PyOpenCL)."""
    import pyopencl as cl

    source = "__kernel void v(__global int *y) { y[0] = __OPENCL_C_VERSION__; }"
    program = cl.Program(device.context, source).build(options=options)
    queue = cl.CommandQueue(device.context)
    out = np.zeros(1, np.int32)
    buffer = cl.Buffer(device.context, cl.mem_flags.WRITE_ONLY, out.nbytes)
    program.v(queue, (1,), None, buffer)
    cl.enqueue_copy(queue, out, buffer)
    queue.finish()
    return int(out[0])


@pytest.mark.parametrize("options", [[], ["-cl-std=CL1.2"], ["-cl-std=CL3.0"]],
                         ids=["default", "cl-std 1.2", "cl-std 3.0"])
def test_type_chosen_by_the_c_version_is_read_as_the_compiler_reads_it(device, options,
                                                                       request):
    """``real`` is double where ``__OPENCL_C_VERSION__ >= 200``. conveyor's preprocessor
    takes that macro from the device's ``CL_DEVICE_OPENCL_C_VERSION`` (PoCL: "OpenCL C 1.2",
    so 120) and ignores ``-cl-std``; this PoCL's compiler defines 300 by default (its
    ``CL_DEVICE_VERSION`` is 3.0) and whatever ``-cl-std`` says. Where the two differ (the
    test marks itself xfail there), conveyor reads float and the size check refuses a right
    stream of the compiler's type (with the message blaming ``__clang__``); where they agree
    (``-cl-std=CL1.2`` here), a guard."""
    opencl_c_only(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            version = _compiler_c_version(device, options)
        except Exception:  # noqa: BLE001 - a compiler without that -cl-std
            pytest.skip(f"the compiler takes no {options}")
    if not options and str(version) != device.source_macros().get("__OPENCL_C_VERSION__"):
        request.applymarker(pytest.mark.xfail(strict=True, reason=(
            "round 16: __OPENCL_C_VERSION__ read from CL_DEVICE_OPENCL_C_VERSION, not the "
            "compiler's default nor -cl-std")))
    dtype = np.float64 if version >= 200 else np.float32
    k = _compile(device, VERSIONED, "twice_versioned", options)
    x = np.arange(1000, dtype=dtype) / 3
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], device=device)
    np.testing.assert_array_equal(y, x * 2)


def test_define_in_a_continued_line_comment_is_no_define(device):
    """C joins a line ending in a backslash to the next before it sees comments, so the
    ``#define USE_DOUBLE`` after ``// ... \\`` is part of the comment for the compiler:
    ``real`` is float. pcpp (and ``signature.code_only``) end the comment at the newline:
    conveyor reads ``real`` as double, and refuses a right float32 stream (the size check)."""
    opencl_c_only(device)
    source = "// float only here: no USE_DOUBLE \\\n#define USE_DOUBLE\n" + CHOSEN
    k = _compile(device, source, "twice_real")
    x = np.arange(1000, dtype=np.float32) / 3
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], device=device)
    np.testing.assert_array_equal(y, x * 2)


# ---------------------------------------------------------------------------------------
# Kernel names read from the raw text.

MACRO_HEAD = """#define KERNEL __kernel
KERNEL void doubled(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * 2.0f;
}
"""
OLD_IN_IF0 = """#if 0
__kernel void doubled_old(__global const float *x, __global float *y, ulong offset, ulong n)
{ }
#endif
""" + MACRO_HEAD.replace("KERNEL void", "__kernel void")


@pytest.mark.parametrize("source", [MACRO_HEAD, OLD_IN_IF0], ids=["macro head", "if 0"])
def test_stream_of_a_source_string_finds_its_one_kernel(device, source):
    """``cv.stream(source, ...)`` runs the one kernel a source defines. It counts kernels in
    the raw text (``stream._compile_source``): a head spelled ``KERNEL void`` is no kernel
    ("defines 0 kernels"), one inside ``#if 0`` is ("defines 2 kernels"), where the
    compiler builds exactly one."""
    opencl_c_only(device)
    x = np.arange(1000, dtype=np.float32)
    y = np.zeros_like(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cv.stream(source, [x], [y], device=device)
    np.testing.assert_array_equal(y, x * 2)


@pytest.mark.parametrize("source, name, options", [
    (MACRO_HEAD, "doubled", []),
    (MACRO_HEAD.replace("void doubled", "void KNAME"), "doubled", ["-DKNAME=doubled"]),
], ids=["macro head", "name from -D"])
def test_dask_kernel_finds_a_kernel_the_compiler_builds(source, name, options):
    """``conveyor.dask.kernel(source, name, options)`` refuses a name absent from the raw
    text: "no kernel named 'doubled' in the source; kernels found: none" (or ``KNAME``),
    though the compiler, given those options, builds ``doubled`` (``cv.stream`` and the
    command line read the preprocessed text)."""
    import conveyor.dask

    spec = conveyor.dask.kernel(source, name, options)
    assert spec.name == name


def test_cuda_launch_bounds_head_is_read():
    """CUDA's ``__launch_bounds__(...)`` stands between ``void`` and the name (NVRTC's
    headers make it an attribute; conveyor's preprocessor has no definition of it): the
    head is not matched, and the kernel found is ``__launch_bounds__``. The parser alone
    (no GPU here): what a CUDA device's compile reads."""
    from conveyor.kernels.preprocess import expand
    from conveyor.kernels.signature import kernel_names, parse_params

    source = ('extern "C" __global__ void __launch_bounds__(256, 2) scale(const float *x, '
              'float *y, unsigned long long offset, unsigned long long n) { }\n')
    text = expand(source, (), (("__CUDACC__", "1"), ("__CUDA_ARCH__", "900")))
    assert kernel_names(text) == ["scale"]
    params = parse_params(text, "scale")
    assert [(p.name, str(p.dtype)) for p in params] == [
        ("x", "float32"), ("y", "float32"), ("offset", "uint64"), ("n", "uint64")]


# ---------------------------------------------------------------------------------------
# __constant inputs and the device's constant buffer size.

def test_constant_input_blocks_fit_the_constant_buffer(device):
    """A ``__constant float *x`` input streamed in blocks of 1 MiB: a block bigger than
    the device's ``CL_DEVICE_MAX_CONSTANT_BUFFER_SIZE`` (PoCL: 512 KiB; NVIDIA: 64 KiB)
    is past what the kernel may be given (GPU drivers fail the launch, mid-stream). PoCL does
    not enforce it; conveyor should size such blocks to fit (or refuse)."""
    opencl_c_only(device)
    k = _compile(device, SPELLINGS, "from_constant")
    limit = int(device.cl_device.max_constant_buffer_size)
    x = np.arange(limit // 2, dtype=np.float32)  # 2x the limit in bytes
    y = np.zeros_like(x)
    try:
        report = cv.stream(k, [x], [y], device=device, block_bytes=1 << 20)
    except InputError:
        return
    np.testing.assert_array_equal(y, x * 2)
    assert report.block_rows * x.itemsize <= limit, (report.block_rows, limit)
