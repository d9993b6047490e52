"""Round nineteen, helper B: false refusals and false warnings. Eighteen rounds added many
checks before a stream; each can also refuse (or warn about, or slow down) a correct use. Here
the legitimate neighbours of those checks, each compared with NumPy and run with warnings
turned into errors.

Found (strict xfails, each asserting the right behaviour):

- **Wrong answer, no error**: a ctypes array given as an output (``(ctypes.c_float * n)()``,
  host memory as array.array is) is taken by ``np.dtype()`` as a subarray dtype: the stream
  makes a new ``(rows, n)`` array in ``report.outputs`` and the caller's buffer is never
  written (``validate.as_output``). An ``array.array`` or ``memoryview`` output is refused
  with what to pass; a ctypes one is silently dropped.
- **False warning**: every kernel with a parameter whose type is a typedef (``typedef float
  real;``) builds with a compiler warning, "use of logical '&&' with constant operand", from
  the check line round eighteen appends (``kernels/sizecheck.py``: ``(sizeof(T) == n) &&
  (__builtin_types_compatible_p(T, U))``): PyOpenCL raises a ``CompilerWarning`` at every
  build and every load from the disk cache, and under ``-W error`` (a test suite's
  ``filterwarnings = error``) ``dev.compile`` itself fails.
- **False refusal**: a source with a ``typedef enum { A, B } mode;`` parameter no longer
  compiles at all (every kernel of it): round sixteen reads an enum as int, and round
  eighteen's clang check asks ``__builtin_types_compatible_p(mode, int)``, false for an enum
  of non-negative values (clang gives it ``unsigned int``): an InputError that blames a
  macro the compiler predefines.
- **False refusal**: a typedef of a built-in type in one of C's other spellings (``typedef
  long int i64;``, ``typedef short int i16;``, ``typedef unsigned short int u16;``, ``typedef
  signed int s32;``) is "a type conveyor cannot resolve" at the stream, though the same
  spellings written in the parameter list stream right: ``signature.resolve`` looks the
  typedef's text up in ``_SCALARS`` word for word.

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import array
import ctypes
import mmap
import os
import sys
import time
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    add_reference,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    kernel,
    rec_kernels,
    stencil_reference,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402


def _quiet_build():
    """Warnings as errors, but PyOpenCL's CompilerWarning (the typedef check's warning,
    xfailed on its own below) left out."""
    context = warnings.catch_warnings()
    context.__enter__()
    warnings.simplefilter("error")
    warnings.filterwarnings("ignore", message="Non-empty compiler output")
    warnings.filterwarnings("ignore", message=".*build succeeded, but resulted in non-empty")
    return context


@pytest.fixture
def strict_warnings():
    """Every warning an error (a false warning on a correct use is a bug), but the one
    xfailed by ``test_typedef_parameter_builds_without_a_compiler_warning``."""
    context = _quiet_build()
    yield
    context.__exit__(None, None, None)


def _vadd(n: int = 4000):
    a = np.arange(n, dtype=np.float32)
    b = np.full(n, 0.5, np.float32)
    return a, b, add_reference(a, b)


# -- typedefs and the compiler's size check -------------------------------------------------
TYPEDEFS = """
typedef float real;
typedef uint u32;
typedef unsigned char byte;
typedef long long_t;
typedef signed char i8;
typedef size_t sz;
#define UT unsigned int
__kernel void t_real(__global const real *x, __global real *y, real k, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] * k; }
__kernel void t_u32(__global const u32 *x, __global u32 *y, u32 k, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] * k; }
__kernel void t_byte(__global const byte *x, __global byte *y, byte k, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] * k; }
__kernel void t_long(__global const long_t *x, __global long_t *y, long_t k, ulong offset,
                     ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] * k; }
__kernel void t_i8(__global const i8 *x, __global i8 *y, i8 k, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] * k; }
__kernel void t_sz(__global const sz *x, __global sz *y, ulong k, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] * k; }
__kernel void t_UT(__global const UT *x, __global UT *y, UT k, u32 offset, u32 n) {
    u32 i = get_global_id(0); if (i < n) y[i] = x[i] * k; }
"""
TYPEDEF_CASES = [("t_real", np.float32), ("t_u32", np.uint32), ("t_byte", np.uint8),
                 ("t_long", np.int64), ("t_i8", np.int8), ("t_sz", np.uint64),
                 ("t_UT", np.uint32)]


def test_typedefs_of_built_in_types_stream_right_on_both_devices(pair, strict_warnings):
    """guard: typedefs of built-in types (float, uint, unsigned char, long, signed char,
    size_t) and a macro naming a type, as pointers, scalars and offset/n, pass round
    eighteen's size-and-kind check on both PoCLs (LLVM 14 and 15) and stream exactly, on each
    device and over both."""
    for dev in pair:
        for name, dtype in TYPEDEF_CASES:
            k = dev.compile(TYPEDEFS, name)
            x = (np.arange(2000) % 40).astype(dtype)
            y = np.zeros_like(x)
            cv.stream(k, [x], [y], args=(3,), device=dev, block_bytes=x.itemsize * 300)
            np.testing.assert_array_equal(y, (x * dtype(3)).astype(dtype), err_msg=name)
    x = np.arange(2000, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(pair[0].compile(TYPEDEFS, "t_real"), [x], [y], args=(np.float32(1.5),),
              device=pair, block_bytes=1200)
    np.testing.assert_array_equal(y, x * np.float32(1.5))


def test_typedef_parameter_builds_without_a_compiler_warning(device):
    """A kernel whose only typedef is ``real`` (float) compiles without a warning, as the same
    kernel written with ``float`` does. The check line conveyor appends, ``typedef char
    __conveyor_sizeof_check_0[((sizeof(real) == 4) && (__conveyor_same(real, float))) ? 1 :
    -1];``, makes clang warn "use of logical '&&' with constant operand"
    (-Wconstant-logical-operand): PyOpenCL turns the build log into a CompilerWarning (twice
    on a fresh build, once on every load from the disk cache), and under warnings as errors
    ``dev.compile`` raises it. (A unique comment makes the build fresh: the in-process memo
    would hide it.)"""
    if device.backend != "opencl" or "Portable" not in device.info.platform:
        pytest.skip("PoCL's compiler: NVIDIA's OpenCL logs its builds, NVRTC takes no OpenCL C")
    source = (f"// round 19 {os.getpid()} {time.time_ns()}\ntypedef float real;\n"
              "__kernel void wk(__global const real *x, __global real *y, ulong offset, "
              "ulong n) { ulong i = get_global_id(0); if (i < n) y[i] = x[i]; }\n")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        k = device.compile(source, "wk")
    assert [str(w.message)[:60] for w in seen] == []
    x = np.arange(100, dtype=np.float32)
    np.testing.assert_array_equal(cv.stream(k, [x], [np.float32], device=device).outputs[0], x)


ENUM = """
typedef enum { MODE_A, MODE_B } mode;
__kernel void en(__global const int *x, __global int *y, mode m, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] * ((int)m + 2); }
"""


def test_typedef_enum_parameter_compiles_and_streams(device, strict_warnings):
    """``typedef enum { MODE_A, MODE_B } mode;`` and a ``mode m`` parameter: round sixteen
    passes an enum as int32 (cast), and the kernel streamed. Round eighteen's kind check
    (sizecheck.checks: ``_C_TYPES['int32'] == ('int',)``) asks clang
    ``__builtin_types_compatible_p(mode, int)``, which is 0 for an enum whose values are all
    non-negative (its compatible type is ``unsigned int``): ``dev.compile`` raises an
    InputError ("the source chooses that type with a macro the compiler predefines") for the
    whole source. ``enum mode`` written out, or an enum with a negative value, still works."""
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels, PyOpenCL arrays in callables")
    k = device.compile(ENUM, "en")
    x = np.arange(1000, dtype=np.int32)
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], args=(1,), device=device)
    np.testing.assert_array_equal(y, x * 3)


SPELLINGS = [("long int", np.int64), ("short int", np.int16), ("unsigned short int", np.uint16),
             ("signed int", np.int32), ("long unsigned int", np.uint64)]
SPELLED = "".join(
    f"typedef {c} sp{i}_t;\n__kernel void sp{i}(__global const sp{i}_t *x, __global sp{i}_t *y, "
    f"ulong offset, ulong n) {{ ulong i = get_global_id(0); if (i < n) y[i] = x[i] * 3; }}\n"
    f"__kernel void dsp{i}(__global const {c} *x, __global {c} *y, ulong offset, ulong n) "
    f"{{ ulong i = get_global_id(0); if (i < n) y[i] = x[i] * 3; }}\n"
    for i, (c, _) in enumerate(SPELLINGS))


def test_other_c_spellings_written_out_stream_right(device, strict_warnings):
    """guard: ``long int``, ``short int``, ``unsigned short int``, ``signed int``, ``long
    unsigned int`` written in the parameter list (the driver names the type)."""
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels, PyOpenCL arrays in callables")
    for i, (_, dtype) in enumerate(SPELLINGS):
        x = (np.arange(500) % 30).astype(dtype)
        y = cv.stream(device.compile(SPELLED, f"dsp{i}"), [x], [dtype], device=device).outputs[0]
        np.testing.assert_array_equal(y, x * dtype(3))


@pytest.mark.parametrize("index", range(len(SPELLINGS)), ids=[c for c, _ in SPELLINGS])
def test_typedef_of_other_c_spellings_streams(device, index, strict_warnings):
    """``typedef long int sp0_t;`` (and ``short int``, ``unsigned short int``, ``signed int``,
    ``long unsigned int``): the driver reports the typedef's name, conveyor resolves it
    through the source's typedefs (signature.resolve), and looks ``"long int"`` up in
    ``_SCALARS`` word for word, which holds ``long`` and ``unsigned long`` but none of C's
    other spellings: the stream is refused ("sp0_t* (a type conveyor cannot resolve)"),
    though the same spelling in the parameter list streams (the guard above)."""
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels, PyOpenCL arrays in callables")
    dtype = SPELLINGS[index][1]
    x = (np.arange(500) % 30).astype(dtype)
    y = cv.stream(device.compile(SPELLED, f"sp{index}"), [x], [dtype], device=device).outputs[0]
    np.testing.assert_array_equal(y, x * dtype(3))


# -- host memory of other kinds -------------------------------------------------------------
def test_ctypes_array_output_is_written_or_refused(device):
    """``outputs=[(ctypes.c_float * n)()]``: ``np.dtype()`` of a ctypes array *instance* is
    ``('<f4', (n,))``, so ``validate.as_output`` makes a new array of rows × n floats (a
    second wrong answer: ``report.outputs[0]`` is not the result either) and the caller's
    buffer stays zero, with no error. ``array.array`` and ``memoryview`` outputs are refused
    with what to pass; a ctypes buffer should be written (``np.ctypeslib.as_array``) or
    refused the same way."""
    a, b, ref = _vadd(1000)
    out = (ctypes.c_float * 1000)()
    try:
        cv.stream(kernel(device, "add"), [a, b], [out], device=device)
    except InputError:
        return  # refused before any work: right too
    np.testing.assert_array_equal(np.ctypeslib.as_array(out), ref)


class _Interface:
    """An object that exposes host memory through ``__array_interface__`` only."""

    def __init__(self, values: np.ndarray) -> None:
        self._values = values
        self.__array_interface__ = values.__array_interface__


def test_host_memory_of_other_kinds_streams_exactly(device, strict_warnings):
    """guard: inputs that hold host memory without being NumPy arrays (array.array,
    memoryview, ctypes, ``__array_interface__``, anonymous and file ``mmap``, shared memory)
    stream exactly; an anonymous mmap and shared memory also as outputs and in place."""
    from multiprocessing import shared_memory

    a, b, ref = _vadd()
    k = kernel(device, "add")
    for made in (array.array("f", a.tolist()), memoryview(a), (ctypes.c_float * a.size)(*a),
                 _Interface(a)):
        c = np.zeros_like(a)
        cv.stream(k, [made, b], [c], device=device, block_bytes=4000)
        np.testing.assert_array_equal(c, ref, err_msg=type(made).__name__)
    anon = np.frombuffer(mmap.mmap(-1, a.nbytes), np.float32)
    anon[:] = a
    out = np.frombuffer(mmap.mmap(-1, a.nbytes), np.float32)
    cv.stream(k, [anon, b], [out], device=device, block_bytes=4000)
    np.testing.assert_array_equal(out, ref)
    cv.stream(k, [anon, b], [anon], device=device, block_bytes=4000)
    np.testing.assert_array_equal(anon, ref)
    shared = shared_memory.SharedMemory(create=True, size=a.nbytes)
    try:
        held = np.ndarray(a.shape, np.float32, buffer=shared.buf)
        held[:] = a
        cv.stream(k, [held, b], [held], device=device, block_bytes=4000)
        np.testing.assert_array_equal(held, ref)
        del held
    finally:
        shared.close()
        shared.unlink()


# -- memory maps ------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["r", "r+", "c", "w+"])
def test_memmaps_with_offsets_of_larger_files(device, tmp_path, mode, strict_warnings):
    """guard: a memmap at a byte offset (not page-aligned) into a file larger than the map,
    opened r, r+, c and w+, as an input, and (r+, c, w+) as an output and in place; round
    seventeen's cut-file check (overlap.check_map_sizes) must not take the file's other
    bytes for the map's, and the bytes around the map stay as they were (c: the file is
    untouched)."""
    a, b, ref = _vadd(1000)
    path = tmp_path / "m.bin"
    whole = np.concatenate([np.full(100, 7, np.float32), a, np.full(50, 9, np.float32)])
    whole.tofile(path)
    m = np.memmap(path, np.float32, mode=mode, offset=400, shape=(1000,))
    if mode == "w+":
        m[:] = a
    k = kernel(device, "add")
    c = np.zeros_like(a)
    cv.stream(k, [m, b], [c], device=device, block_bytes=400)
    np.testing.assert_array_equal(c, ref)
    if mode != "r":
        cv.stream(k, [a, b], [m], device=device, block_bytes=400)
        np.testing.assert_array_equal(np.asarray(m), ref)
        cv.stream(k, [m, b], [m], device=device, block_bytes=400)
        np.testing.assert_array_equal(np.asarray(m), add_reference(ref, b))
        m.flush()
    del m
    raw = np.fromfile(path, np.float32)
    if mode in ("r+", "w+"):
        np.testing.assert_array_equal(raw[100:1100], add_reference(ref, b))
    else:
        np.testing.assert_array_equal(raw[100:1100], a)
    if mode != "w+":  # w+ made the file anew, of the map's end (offset + 4000 bytes)
        np.testing.assert_array_equal(raw[:100], 7)
        np.testing.assert_array_equal(raw[1100:], 9)


def test_memmap_views_slices_and_grown_files(device, tmp_path, strict_warnings):
    """guard: slices and reshaped rows of one memmap as input and output (disjoint halves),
    and a memmap whose file grew after it was mapped."""
    a, b, ref = _vadd(1000)
    path = tmp_path / "v.bin"
    np.concatenate([a, np.zeros_like(a)]).tofile(path)
    m = np.memmap(path, np.float32, mode="r+")
    k = kernel(device, "add")
    cv.stream(k, [m[:1000], b], [m[1000:]], device=device, block_bytes=400)
    np.testing.assert_array_equal(np.asarray(m[1000:]), ref)
    c = np.zeros_like(a)
    cv.stream(k, [m.reshape(2, 1000)[1], b], [c], device=device, block_bytes=400)
    np.testing.assert_array_equal(c, add_reference(ref, b))
    with open(path, "ab") as grow:
        grow.write(bytes(4096))
    cv.stream(k, [m[:1000], b], [c], device=device, block_bytes=400)
    np.testing.assert_array_equal(c, ref)
    del m


# -- file outputs by other names --------------------------------------------------------------
def test_outputs_named_through_proc_fd_and_symlinks(device, tmp_path, strict_warnings):
    """guard: an output named ``/proc/self/fd/N`` of a named file (cv.npy_out, cv.raw_out), a
    trace through one, and a symlink to an existing file (the link stays, its target gets the
    result); round seventeen refuses such links only for files with no name."""
    a, b, ref = _vadd(1000)
    k = kernel(device, "add")
    target = tmp_path / "o.npy"
    np.save(target, np.zeros(3))
    fd = os.open(target, os.O_RDWR)
    try:
        cv.stream(k, [a, b], [cv.npy_out(f"/proc/self/fd/{fd}")], device=device)
    finally:
        os.close(fd)
    np.testing.assert_array_equal(np.load(target), ref)
    raw = tmp_path / "o.bin"
    fd = os.open(raw, os.O_RDWR | os.O_CREAT)
    trace = tmp_path / "t.json"
    trace_fd = os.open(trace, os.O_RDWR | os.O_CREAT)
    try:
        cv.stream(k, [a, b], [cv.raw_out(f"/proc/self/fd/{fd}")], device=device,
                  trace=f"/proc/self/fd/{trace_fd}")
    finally:
        os.close(fd)
        os.close(trace_fd)
    np.testing.assert_array_equal(np.fromfile(raw, np.float32), ref)
    assert trace.stat().st_size > 0
    real = tmp_path / "real.npy"
    np.save(real, np.zeros(3))
    link = tmp_path / "sub"
    link.mkdir()
    (link / "l.npy").symlink_to("../real.npy")
    cv.stream(k, [a, b], [str(link / "l.npy")], device=device)
    assert (link / "l.npy").is_symlink()
    np.testing.assert_array_equal(np.load(real), ref)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.bin", "o.npy", "real.npy", "sub",
                                                          "t.json"]


def test_own_files_in_a_sticky_folder_and_raw_files_in_tmp(device, tmp_path, strict_warnings):
    """guard: replacing one's own file in a sticky folder anyone may write, and a raw input
    file directly in /tmp."""
    a, b, ref = _vadd(1000)
    k = kernel(device, "add")
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    np.save(sticky / "o.npy", np.zeros(3))
    cv.stream(k, [a, b], [str(sticky / "o.npy")], device=device)
    np.testing.assert_array_equal(np.load(sticky / "o.npy"), ref)
    raw = Path("/tmp") / f"r19_legit_{os.getpid()}.bin"
    a.tofile(raw)
    try:
        c = np.zeros_like(a)
        cv.stream(k, [cv.raw(str(raw), "f4"), b], [c], device=device, block_bytes=400)
        np.testing.assert_array_equal(c, ref)
    finally:
        raw.unlink()


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_files_of_every_format_and_relative_paths(device, tmp_path, version, monkeypatch,
                                                      strict_warnings):
    """guard: ``.npy`` files of format 1.0, 2.0, 3.0 written by NumPy, read as cv.npy, as a
    path, and written back; a relative cv.npy made before an os.chdir reads its own folder's
    file while the old folder still has it."""
    x = (np.arange(3000, dtype=np.float32) * 1.5 - 7).reshape(1000, 3)
    path = tmp_path / "x.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array(f, x, version=version)
    k = kernel(device, "ident")
    for given in (cv.npy(path), str(path)):
        out = cv.stream(k, [given], [np.float32], device=device, block_bytes=1200).outputs[0]
        np.testing.assert_array_equal(out, x)
    monkeypatch.chdir(tmp_path)
    relative = cv.npy("x.npy")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    np.save("x.npy", x + 1)
    out = cv.stream(k, [relative], [cv.npy_out("y.npy")], device=device).outputs[0]
    np.testing.assert_array_equal(np.load(out), x)


# -- __constant parameters: not slowed where they fit -----------------------------------------
CONSTANT = """
__kernel void cg(__global const float *x, __global float *y, __global const float *t,
                 ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] + t[(offset + i) % 4]; }
__kernel void cc(__constant float *x, __global float *y, __constant float *t,
                 ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] + t[(offset + i) % 4]; }
"""


def test_constant_inputs_and_tables_that_fit_keep_the_block_size(pair, strict_warnings):
    """guard: a ``__constant`` input and table that fit the device's constant buffer stream
    in the same blocks as the ``__global const`` kernel (round sixteen's cap applies only
    past it), with no warning, on one device, with a resident table, and over two."""
    first = pair[0]
    t = np.array([1, 2, 3, 4], np.float32)
    # Rows that fit the smallest constant buffer beside the table (64 KiB on NVIDIA).
    fit = min(20000, (min(d.max_constant_bytes for d in pair) - t.nbytes) // 4)
    for rows, options in ((1000, {}), (fit, {}), (4000, {"block_bytes": 4000})):
        x = np.arange(rows, dtype=np.float32)
        ref = x + t[np.arange(rows) % 4]
        blocks = []
        for name in ("cg", "cc"):
            y = np.zeros_like(x)
            blocks.append(cv.stream(first.compile(CONSTANT, name), [x], [y], args=(t,),
                                    device=first, **options).blocks)
            np.testing.assert_array_equal(y, ref)
        assert blocks[0] == blocks[1], (rows, options, blocks)
    x = np.arange(8000, dtype=np.float32)
    y = np.zeros_like(x)
    with cv.resident(t) as table:
        cv.stream(first.compile(CONSTANT, "cc"), [x], [y], args=(table,), device=pair,
                  block_bytes=4000)
    np.testing.assert_array_equal(y, x + t[np.arange(8000) % 4])


def test_tables_of_every_ordinary_kind(device, tmp_path, strict_warnings):
    """guard: ``args=`` tables and ``cv.resident`` tables given as array.array, memoryview,
    ctypes, read-only, strided, 2-D, memmaps at an offset (r, c, a slice), bytes-backed."""
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels, PyOpenCL arrays in callables")
    t = np.array([1, 2, 3, 4], np.float32)
    path = tmp_path / "t.bin"
    np.concatenate([np.zeros(3, np.float32), t, np.zeros(5, np.float32)]).tofile(path)
    tables = [t, array.array("f", t.tolist()), memoryview(t), (ctypes.c_float * 4)(*t),
              np.frombuffer(t.tobytes(), np.float32), np.repeat(t, 2)[::2], t.reshape(2, 2),
              np.memmap(path, np.float32, "r", offset=12, shape=(4,)),
              np.memmap(path, np.float32, "c", offset=12, shape=(4,)),
              np.memmap(path, np.float32, "r")[3:7]]
    x = np.arange(1000, dtype=np.float32)
    ref = x + t[np.arange(1000) % 4]
    for name in ("cg", "cc"):
        k = device.compile(CONSTANT, name)
        for table in tables:
            y = np.zeros_like(x)
            cv.stream(k, [x], [y], args=(table,), device=device, block_bytes=400)
            np.testing.assert_array_equal(y, ref, err_msg=f"{name} {type(table).__name__}")
            with cv.resident(table, device=device) as held:
                y[:] = 0
                cv.stream(k, [x], [y], args=(held,), device=device, block_bytes=400)
            np.testing.assert_array_equal(y, ref, err_msg=f"{name} resident")


# -- values given in other types --------------------------------------------------------------
def test_flags_counts_and_dtypes_of_other_types(device, tmp_path, strict_warnings):
    """guard: flags as np.bool_, counts as NumPy integers and whole Fractions, dtypes as
    strings, np.dtype objects and Python types (raw files, file outputs, cv.rows,
    cv.per_block, chain temps), all exact."""
    a, b, ref = _vadd(1000)
    k = kernel(device, "add")
    for options in ({"zero_copy": np.False_}, {"progress": np.False_}, {"depth": np.int64(3)},
                    {"depth": Fraction(6, 2)}, {"block_bytes": np.uint32(400)},
                    {"block_bytes": Fraction(800, 2)}, {"memory_limit": np.int64(1 << 20)},
                    {"workers": np.int8(2)}, {"first_row": np.int64(5)}):
        c = np.zeros_like(a)
        cv.stream(k, [a, b], [c], device=device, **options)
        if "first_row" in options:
            np.testing.assert_array_equal(c, a + b + ((np.arange(1000) + 5) % 7))
        else:
            np.testing.assert_array_equal(c, ref, err_msg=str(options))
    ident = kernel(device, "ident")
    raw = tmp_path / "x.bin"
    a.tofile(raw)
    for dtype in ("f4", "<f4", "float32", np.dtype("f4"), np.float32):
        got = cv.stream(ident, [cv.raw(raw, dtype)], [np.float32], device=device).outputs[0]
        np.testing.assert_array_equal(got, a)
        cv.stream(ident, [a], [cv.npy_out(tmp_path / "o.npy", dtype)], device=device)
        np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), a)
    got = cv.stream(ident, [cv.raw(raw, "f4", (np.int64(999),), offset=np.int64(4))],
                    [np.float32], device=device).outputs[0]
    np.testing.assert_array_equal(got, a[1:])
    got = cv.stream(ident, [cv.iterate(iter([a[:500], a[500:]]), np.int64(1000))],
                    [np.float32], device=device).outputs[0]
    np.testing.assert_array_equal(got, a)
    x = np.arange(3000, dtype=np.float32).reshape(1000, 3)
    y = np.zeros_like(x)
    cv.stream(kernel(device, "sten"), [x], [y], args=(np.uint64(3), np.int8(1)),
              halo=np.int64(1), device=device, block_bytes=1200)
    np.testing.assert_array_equal(y, stencil_reference(x, 1))


# -- records, bools, reductions, iterables ---------------------------------------------------
def test_record_dtypes_with_the_structs_padding(device, tmp_path, strict_warnings):
    """guard: records laid out as the C struct (``align=True``, or explicit offsets and
    itemsize) as an input, a ``.npy`` file, an output, a new output and a table."""
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels, PyOpenCL arrays in callables")
    src = rec_kernels("char")
    aligned = np.dtype([("a", "i1"), ("b", "f4")], align=True)
    explicit = np.dtype({"names": ["a", "b"], "formats": ["i1", "f4"], "offsets": [0, 4],
                         "itemsize": 8})
    x = (np.arange(1000) % 100).astype(np.float32)
    for dtype in (aligned, explicit):
        r = np.zeros(1000, dtype)
        r["a"], r["b"] = np.arange(1000) % 100, np.arange(1000) * 0.5
        want = r["a"].astype(np.float32) + r["b"]
        k = device.compile(src, "rec_sum")
        np.testing.assert_array_equal(
            cv.stream(k, [r], [np.float32], device=device, block_bytes=800).outputs[0], want)
        np.save(tmp_path / "r.npy", r)
        np.testing.assert_array_equal(cv.stream(k, [tmp_path / "r.npy"], [np.float32],
                                                device=device).outputs[0], want)
        made = cv.stream(device.compile(src, "rec_make"), [x], [dtype],
                         device=device).outputs[0]
        np.testing.assert_array_equal(made["a"], x.astype(np.int8))
        np.testing.assert_array_equal(made["b"], x * 0.5)
        lut = cv.stream(device.compile(src, "rec_lut"), [x], [np.float32], args=(r[:4].copy(),),
                        device=device).outputs[0]
        np.testing.assert_array_equal(lut, x + want[:4][np.arange(1000) % 4])


BOOLS = """
__kernel void bc(__global const bool *x, __global int *y, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] ? 1 : 0; }
__kernel void bo(__global const int *x, __global bool *y, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] > 3; }
"""


def test_bool_inputs_of_zeros_and_ones(pair, tmp_path, strict_warnings):
    """guard: bool inputs that hold only 0 and 1 (strided, 2-D, a view of uint8, a kernel's
    own bool output, a ``.npy`` file and its map, an iterable) are taken on one device and
    over two."""
    first = pair[0]
    count, out = first.compile(BOOLS, "bc"), first.compile(BOOLS, "bo")
    flags = np.arange(8000) % 3 == 0
    for given, want in ((flags[::2], flags[::2]), (flags.reshape(80, 100), flags.reshape(80, 100)),
                        (flags.astype(np.uint8).view(bool), flags)):
        got = cv.stream(count, [given], [np.int32], device=first, block_bytes=400).outputs[0]
        np.testing.assert_array_equal(got, want)
    x = np.arange(1000, dtype=np.int32) % 7
    made = cv.stream(out, [x], [np.bool_], device=pair, block_bytes=100).outputs[0]
    np.testing.assert_array_equal(made, x > 3)
    np.save(tmp_path / "b.npy", made)
    for given in (tmp_path / "b.npy", np.load(tmp_path / "b.npy", mmap_mode="r")[10:]):
        got = cv.stream(count, [given], [np.int32], device=pair, block_bytes=100).outputs[0]
        np.testing.assert_array_equal(got, (x > 3)[-len(got):])
    got = cv.stream(count, [cv.iterate(iter([made[:400], made[400:]]), 1000)], [np.int32],
                    device=first, block_bytes=100).outputs[0]
    np.testing.assert_array_equal(got, x > 3)


REDUCE = "".join(
    f"__kernel void r_{c}(__global const {c} *x, __global {c} *r, ulong offset, ulong n) "
    f"{{ ulong i = get_global_id(0); if (i < n) r[i] = x[i]; }}\n"
    for c in ("char", "ushort", "ulong"))
#: The dtypes streamkit's kernels leave out (float32, int32, uint8, int64 are reduced there).
REDUCE_TYPES = [("char", np.int8), ("ushort", np.uint16), ("ulong", np.uint64)]


def test_reductions_of_every_dtype_on_one_and_two_devices(pair, strict_warnings):
    """guard: sum, min and max of int8, uint16 and uint64 (each dtype builds the device's fold
    kernels: the suite's own cover the others) equal to NumPy's on one device and over two; a
    custom fold of a callable's partials over two."""
    first = pair[0]
    for c, dtype in REDUCE_TYPES:
        k = first.compile(REDUCE, f"r_{c}")
        v = np.arange(3001) * 7919 % 1000
        v = (v - (300 if np.dtype(dtype).kind in "if" else 0)).astype(dtype)
        for op in ("sum", "min", "max"):
            for where in (first, pair):
                got = cv.stream(k, [v], reduce=op, device=where,
                                block_bytes=v.itemsize * 500).result
                assert got == getattr(np, op)(v), (c, op, got)

    def partial(x, *, queue, offset, n):
        return int(x.get().sum())

    a = np.arange(5000, dtype=np.float32)
    got = cv.stream(partial, [a], device=pair, block_bytes=4000, reduce=lambda p, q: p + q)
    assert got.result == int(a.sum())


def test_iterables_of_one_row_chunks(device, strict_warnings):
    """guard: iterables whose chunks are one row (2-D rows, 1-D single elements)."""
    ident = kernel(device, "ident")
    x = np.arange(3000, dtype=np.float32).reshape(1000, 3)
    chunks = (x[i:i + 1] for i in range(1000))
    got = cv.stream(ident, [cv.iterate(chunks, 1000)], [np.float32], device=device,
                    block_bytes=1200).outputs[0]
    np.testing.assert_array_equal(got, x)
    flat = x.ravel()
    got = cv.stream(ident, [cv.iterate((flat[i:i + 1] for i in range(3000)), 3000)],
                    [np.float32], device=device, block_bytes=400).outputs[0]
    np.testing.assert_array_equal(got, flat)


# -- pools and devices over time --------------------------------------------------------------
def test_pool_limits_lowered_then_raised_and_a_closed_device_used_again(pair, strict_warnings):
    """guard: a device pool's and a pinned pool's ``limit`` set low then raised (the next
    stream plans to the new limit: one block again), and ``device.close()`` then streams
    again with the same kernel, a new one, and over both devices."""
    second = pair[1]
    a, b, ref = _vadd(100_000)
    k = kernel(second, "add")
    for pool in (second.memory_pool, second.pinned_pool):
        old = pool.limit
        try:
            pool.limit = "64KiB"
            c = np.zeros_like(a)
            assert cv.stream(k, [a, b], [c], device=second, zero_copy=False).blocks > 1
            np.testing.assert_array_equal(c, ref)
            pool.limit = "64MiB"
            c[:] = 0
            assert cv.stream(k, [a, b], [c], device=second, zero_copy=False).blocks == 1
            np.testing.assert_array_equal(c, ref)
        finally:
            pool.limit = old
    second.close()
    for compute, where in ((k, second), (kernel(second, "add"), second), (k, pair)):
        c = np.zeros_like(a)
        cv.stream(compute, [a, b], [c], device=where, block_bytes=40000)
        np.testing.assert_array_equal(c, ref)
