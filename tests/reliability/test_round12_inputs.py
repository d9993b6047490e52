"""Round twelve (helper I): the variety of inputs and outputs.

Memory maps in modes 'r', 'r+' and 'c' (copy-on-write: its writes stay in this process's
memory, never reach the file), ``np.load(mmap_mode=)``, ``cv.npy``/``cv.raw`` sources with
offsets, ``cv.npy_out``/``cv.raw_out``, ``cv.iterate`` of odd chunk sizes and wrong lengths,
rows of no elements, float16/complex/int8/uint64/bool through matching kernels, structured
outputs, outputs that are views into larger arrays, unaligned arrays, ``np.matrix`` and an
ndarray subclass whose ``__array_finalize__`` refuses slices. Every result is compared with
NumPy.

Found (strict xfails, each asserting the right behaviour):

- A complex64/complex128 input or output for a ``float*``/``double*`` parameter is refused
  (right) with the advice ``a.astype(np.float32)``, which throws the imaginary part away
  (NumPy's ComplexWarning). The vector message for ``float2*`` sends the user to ``float*``,
  where this advice waits. The bytes are pairs of floats: ``a.view(np.float32)`` is the fix.
- A file output with no dtype (``cv.npy_out(path)``, or a ``.npy`` path) for a struct pointer
  takes input 0's dtype and is then refused with "declare it as a pointer to a scalar type
  such as float*": the fix is ``dtype=`` on the output, which the message never names.
- A read-only memmap input and a copy-on-write memmap output of one file, one row apart, are
  refused as "overlap in memory" although they share no byte (``np.shares_memory`` is False:
  the copy-on-write map's writes never reach the file nor the other map).
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import compiled, opencl_c_only, zero_copy_where_unified  # noqa: E402

import conveyor as cv  # noqa: E402

SRC = """
__kernel void sc(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * 2.0f + 1.0f;
}
__kernel void st(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + x[i + 1] + x[i + 2];
}
__kernel void hf(__global const half *x, __global half *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) vstore_half(vload_half(i, x) * 2.0f, i, y);
}
__kernel void h2f(__global const half *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = vload_half(i, x) * 2.0f;
}
__kernel void i8(__global const char *x, __global char *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (char)(x[i] * 3);
}
__kernel void u64(__global const ulong *x, __global ulong *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * 3 + offset + i;
}
__kernel void nb(__global const bool *x, __global bool *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = !x[i];
}
__kernel void dd(__global const double *x, __global double *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * 2.0;
}
__kernel void c2(__global const float2 *x, __global float2 *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * 2.0f;
}
typedef struct { uchar a; float b; } rec;
__kernel void mk(__global const float *x, __global rec *r, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { r[i].a = (uchar)(offset + i); r[i].b = x[i] * 2.0f; }
}
"""


@pytest.fixture(autouse=True)
def _opencl_c_and_zero_copy(request):
    """Skip on CUDA (the kernels here are OpenCL C: vload_half, __global), and the
    zero_copy=True cases on a device that does not share the host's memory (refused there)."""
    if "device" not in request.fixturenames:
        return
    device = request.getfixturevalue("device")
    opencl_c_only(device)
    zero_copy_where_unified(device, request)

N = 3000
X = np.arange(N, dtype=np.float32)
SC = X * 2 + 1  # what "sc" makes of X
REC = np.dtype([("a", np.uint8), ("b", np.float32)], align=True)


def k(device: cv.Device, name: str) -> cv.Kernel:
    return compiled(device, SRC, name)


def stencil(x2: np.ndarray) -> np.ndarray:
    """What "st" makes of rows ``x2`` with halo=1 ("nearest"): flat sums of three."""
    p = np.pad(x2, ((1, 1),) + ((0, 0),) * (x2.ndim - 1), mode="edge").ravel()
    m = x2.size
    return (p[:m] + p[1:m + 1] + p[2:m + 2]).reshape(x2.shape)


# -- 1. memory maps: 'r', 'r+', 'c' (copy-on-write), np.load(mmap_mode=) -------------------------
@pytest.mark.parametrize("zero_copy", [None, False, True])
def test_a_copy_on_write_output_of_the_input_file_gets_the_result_and_the_file_stays(
        device, tmp_path, zero_copy):
    # guard: a mode 'c' map written by the stream keeps the result in memory, as NumPy's
    # writes to it do; the file (read through a mode 'r' map) is never written.
    p = tmp_path / "x.raw"
    X.tofile(p)
    y = np.memmap(p, np.float32, mode="c")
    y[:] = -5  # private pages: the input's map still reads the file
    x = np.memmap(p, np.float32, mode="r")
    cv.stream(k(device, "sc"), [x], [y], device=device, block_bytes=4000, zero_copy=zero_copy)
    np.testing.assert_array_equal(np.asarray(y), SC)
    np.testing.assert_array_equal(np.fromfile(p, np.float32), X)


@pytest.mark.parametrize("source", ["npy", "map_r", "same"])
@pytest.mark.parametrize("mode", ["r+", "c"])
def test_np_load_maps_as_outputs_of_their_own_file_with_a_halo(device, tmp_path, mode, source):
    # guard: in place with a halo through np.load(mmap_mode=) maps; 'r+' writes the file,
    # 'c' leaves it as it was.
    q = tmp_path / "x.npy"
    x2 = X.reshape(N // 3, 3)
    np.save(q, x2)
    out = np.load(q, mmap_mode=mode)
    if mode == "c":
        out[:] = -1  # private: a 'c' map in place reads its own changed pages
    given = {"npy": cv.npy(q), "map_r": np.load(q, mmap_mode="r"), "same": out}[source]
    before = np.array(out) if source == "same" else x2
    cv.stream(k(device, "st"), [given], [out], device=device, block_bytes=1200, halo=1)
    np.testing.assert_array_equal(np.asarray(out), stencil(before))
    np.testing.assert_array_equal(np.load(q), stencil(x2) if mode == "r+" else x2)


@pytest.mark.parametrize("zero_copy", [None, False, True])
def test_a_copy_on_write_input_with_private_changes_is_read_from_memory(device, tmp_path,
                                                                          zero_copy):
    # guard: what a 'c' map holds (its private pages), not the file, is the input, also in
    # place over an 'r+' map of the same file and into a file output.
    p = tmp_path / "x.raw"
    X.tofile(p)
    x = np.memmap(p, np.float32, mode="c")
    x[:] = 7
    y = np.memmap(p, np.float32, mode="r+")
    cv.stream(k(device, "sc"), [x], [y], device=device, block_bytes=4000, zero_copy=zero_copy)
    np.testing.assert_array_equal(np.fromfile(p, np.float32), np.full(N, 15, np.float32))
    X.tofile(p)
    x = np.memmap(p, np.float32, mode="c")
    x[:] = 3
    out = tmp_path / "o.npy"
    cv.stream(k(device, "sc"), [x], [cv.npy_out(out)], device=device, block_bytes=4000)
    np.testing.assert_array_equal(np.load(out), np.full(N, 7, np.float32))


def test_a_copy_on_write_input_shifted_against_a_shared_output_is_refused(device, tmp_path):
    # guard: a 'c' map's untouched pages show the file's new bytes (Linux), so an 'r+'
    # output one row further in would change rows the input has still to read.
    p = tmp_path / "x.raw"
    X.tofile(p)
    x = np.memmap(p, np.float32, mode="c")
    y = np.memmap(p, np.float32, mode="r+")
    with pytest.raises(cv.InputError, match="overlap"):
        cv.stream(k(device, "sc"), [x[:-1]], [y[1:]], device=device, block_bytes=4000)
    np.testing.assert_array_equal(np.fromfile(p, np.float32), X)


def test_a_read_only_map_shifted_against_a_copy_on_write_output_streams(device, tmp_path):
    p = tmp_path / "x.raw"
    X.tofile(p)
    x = np.memmap(p, np.float32, mode="r")
    y = np.memmap(p, np.float32, mode="c")
    assert not np.shares_memory(x[:-1], y[1:])  # NumPy: nothing written to y reaches x
    cv.stream(k(device, "sc"), [x[:-1]], [y[1:]], device=device, block_bytes=4000)
    np.testing.assert_array_equal(np.asarray(y[1:]), SC[:-1])
    np.testing.assert_array_equal(np.fromfile(p, np.float32), X)


def test_a_read_only_np_load_map_as_output_is_refused(device, tmp_path):
    # guard
    q = tmp_path / "x.npy"
    np.save(q, X)
    with pytest.raises(cv.InputError, match="read-only"):
        cv.stream(k(device, "sc"), [X], [np.load(q, mmap_mode="r")], device=device)


def test_an_unaligned_memmap_output_writes_only_its_bytes(device, tmp_path):
    # guard: a map at byte offset 1 (unaligned float32) gets the result, the bytes around it
    # stay zero.
    p = tmp_path / "m.raw"
    np.zeros(N * 4 + 8, np.uint8).tofile(p)
    y = np.memmap(p, np.float32, mode="r+", offset=1, shape=(N,))
    cv.stream(k(device, "sc"), [X], [y], device=device, block_bytes=1000)
    y.flush()
    raw = np.fromfile(p, np.uint8)
    np.testing.assert_array_equal(np.frombuffer(raw[1:1 + 4 * N].tobytes(), np.float32), SC)
    assert raw[0] == 0 and not raw[4 * N + 1:].any()


@pytest.mark.parametrize("zero_copy", [None, False, True])
def test_unaligned_arrays_in_and_out(device, zero_copy):
    # guard: np.frombuffer at odd byte offsets (flags.aligned False), float32 and float64.
    for dtype, kern, off in ((np.float32, "sc", 1), (np.float64, "dd", 4)):
        a = np.frombuffer(bytearray(N * 8 + 8), dtype, count=N, offset=off)
        a[:] = X
        o = np.frombuffer(bytearray(N * 8 + 8), dtype, count=N, offset=off + 2)
        assert not a.flags.aligned and not o.flags.aligned
        cv.stream(k(device, kern), [a], [o], device=device, block_bytes=1000,
                  zero_copy=zero_copy)
        want = X * 2 + 1 if kern == "sc" else X.astype(np.float64) * 2
        np.testing.assert_array_equal(o, want)


def test_raw_sources_with_offsets_and_shapes(device, tmp_path):
    # guard: unaligned offsets and a -1 axis read the right bytes; a shape that leaves bytes
    # over is refused, naming the sizes.
    p = tmp_path / "x.raw"
    X.tofile(p)
    with open(p, "ab") as f:
        f.write(b"\x00" * 7)
    raw = p.read_bytes()
    for off in (3, 7):
        rows = (len(raw) - off) // 4
        r = cv.stream(k(device, "sc"), [cv.raw(p, np.float32, shape=(-1,), offset=off)],
                      [np.float32], device=device, block_bytes=1000)
        with np.errstate(all="ignore"):  # odd offsets read odd floats: inf, NaN
            want = np.frombuffer(raw[off:off + 4 * rows], np.float32) * 2 + 1
        np.testing.assert_array_equal(r.outputs[0], want)
    with pytest.raises(cv.InputError, match="longer than it should be"):
        cv.raw(p, np.float32, shape=(10,))
    with pytest.raises(cv.InputError, match="whole number"):
        cv.raw(p, np.float32, shape=(-1, 3), offset=4)


# -- 2. dtypes through matching kernels ----------------------------------------------------------
def test_float16_through_vload_half_as_arrays_dtypes_and_files(device, tmp_path):
    # guard
    xh = (np.arange(N) / 8 - 100).astype(np.float16)
    want = xh * np.float16(2)
    y = np.zeros(N, np.float16)
    cv.stream(k(device, "hf"), [xh], [y], device=device, block_bytes=1000)
    np.testing.assert_array_equal(y, want)
    r = cv.stream(k(device, "hf"), [xh], [np.float16], device=device, block_bytes=1000)
    assert r.outputs[0].dtype == np.float16
    np.testing.assert_array_equal(r.outputs[0], want)
    cv.stream(k(device, "hf"), [xh], [cv.npy_out(tmp_path / "h.npy"),
                                      ], device=device, block_bytes=1000)
    cv.stream(k(device, "hf"), [xh], [cv.raw_out(tmp_path / "h.raw")], device=device,
              block_bytes=1000)
    np.testing.assert_array_equal(np.load(tmp_path / "h.npy"), want)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "h.raw", np.float16), want)
    r = cv.stream(k(device, "h2f"), [xh], [np.float32], device=device, block_bytes=1000)
    np.testing.assert_array_equal(r.outputs[0], xh.astype(np.float32) * 2)
    for wrong in ([np.float32], [cv.npy_out(tmp_path / "w.npy", dtype=np.float32)]):
        with pytest.raises(cv.InputError, match="half"):
            cv.stream(k(device, "hf"), [xh], wrong, device=device)
    assert not (tmp_path / "w.npy").exists()


def test_int8_uint64_and_bool_through_matching_kernels(device):
    # guard: int8 wraps as NumPy's int8 does; uint64 past 2**63; bool stays bytes 0 and 1.
    rng = np.random.default_rng(4)
    xi = rng.integers(-128, 128, N).astype(np.int8)
    y = np.zeros(N, np.int8)
    cv.stream(k(device, "i8"), [xi], [y], device=device, block_bytes=1000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.testing.assert_array_equal(y, xi * np.int8(3))
    xu = rng.integers(2**63, 2**64 - 1, N, dtype=np.uint64, endpoint=True)
    r = cv.stream(k(device, "u64"), [xu], [np.uint64], device=device, block_bytes=1000)
    np.testing.assert_array_equal(r.outputs[0], xu * np.uint64(3) + np.arange(N, dtype=np.uint64))
    xb = rng.integers(0, 2, N).astype(bool)
    r = cv.stream(k(device, "nb"), [xb], [bool], device=device, block_bytes=1000)
    np.testing.assert_array_equal(r.outputs[0], ~xb)
    assert set(r.outputs[0].view(np.uint8).tolist()) <= {0, 1}


def test_complex_through_a_vector_pointer_is_refused_with_vload2(device):
    # guard: float2* is a vector pointer; the message says to declare float* and use vload2.
    xc = (X + 1j * X[::-1]).astype(np.complex64)
    with pytest.raises(cv.InputError, match="vload2"):
        cv.stream(k(device, "c2"), [xc], [np.complex64], device=device)


def test_complex_as_pairs_of_doubles_through_a_double_kernel(device):
    # guard: the working way, a float64 view of a complex128 array, equals NumPy.
    xc = (X + 1j * X[::-1]).astype(np.complex128)
    out = np.zeros(N, np.complex128)
    cv.stream(k(device, "dd"), [xc.view(np.float64)], [out.view(np.float64)], device=device,
              block_bytes=1000)
    np.testing.assert_array_equal(out, xc * 2)


@pytest.mark.parametrize("where", ["input", "output"])
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_a_complex_array_for_a_real_pointer_is_told_to_pass_a_view(device, dtype, where):
    name = "sc" if dtype == np.complex64 else "dd"
    real = "float32" if dtype == np.complex64 else "float64"
    xc = (X + 1j).astype(dtype)
    inputs, outputs = ([xc], [np.dtype(real)]) if where == "input" else ([xc.real.copy()],
                                                                       [np.dtype(dtype)])
    with pytest.raises(cv.InputError) as caught:
        cv.stream(k(device, name), inputs, outputs, device=device)
    message = str(caught.value)
    assert "astype" not in message  # a.astype(np.float32) of complex drops the imaginary part
    assert f"view(np.{real})" in message


# -- 3. structured outputs -----------------------------------------------------------------------
def test_structured_outputs_as_dtypes_arrays_and_files(device, tmp_path):
    # guard: an aligned record dtype (C's layout) as a dtype, an array, npy_out and raw_out;
    # NumPy's packed layout is refused for each.
    def right(o):
        np.testing.assert_array_equal(o["a"], np.arange(N) % 256)
        np.testing.assert_array_equal(o["b"], X * 2)

    mk = k(device, "mk")
    right(cv.stream(mk, [X], [REC], device=device, block_bytes=1000).outputs[0])
    o = np.zeros(N, REC)
    cv.stream(mk, [X], [o], device=device, block_bytes=1000)
    right(o)
    cv.stream(mk, [X], [cv.npy_out(tmp_path / "r.npy", dtype=REC)], device=device,
              block_bytes=1000)
    right(np.load(tmp_path / "r.npy"))
    cv.stream(mk, [X], [cv.raw_out(tmp_path / "r.raw", dtype=REC)], device=device,
              block_bytes=1000)
    right(np.fromfile(tmp_path / "r.raw", REC))
    packed = np.dtype([("a", np.uint8), ("b", np.float32)])
    for out in (packed, np.zeros(N, packed), cv.npy_out(tmp_path / "p.npy", dtype=packed)):
        with pytest.raises(cv.InputError, match="align=True"):
            cv.stream(mk, [X], [out], device=device)
    assert not (tmp_path / "p.npy").exists()


@pytest.mark.parametrize("how", ["npy_out", "path"])
def test_a_file_output_for_a_struct_pointer_takes_the_structs_records(device, tmp_path, how):
    # Refused until session 21 ("give its dtype"), which the command line could not give:
    # the file takes the struct's records as the compiler lays them out (pipeline/clayout.py).
    target = tmp_path / "r.npy"
    out = cv.npy_out(target) if how == "npy_out" else str(target)
    cv.stream(k(device, "mk"), [X], [out], device=device)
    records = np.load(target)
    assert records.dtype == np.dtype([("a", "u1"), ("b", "<f4")], align=True)
    np.testing.assert_array_equal(records["a"], np.arange(len(X)).astype(np.uint8))
    np.testing.assert_array_equal(records["b"], X * 2.0)


# -- 4. outputs that are views into larger arrays, or read-only ---------------------------------
def test_outputs_that_are_row_slices_of_larger_arrays_get_only_their_rows(device):
    # guard: a contiguous row slice (1-D and 2-D) is written, nothing around it.
    big = np.full(2 * N, -1, np.float32)
    cv.stream(k(device, "sc"), [X], [big[N // 2:N // 2 + N]], device=device, block_bytes=1000)
    np.testing.assert_array_equal(big[N // 2:N // 2 + N], SC)
    assert (big[:N // 2] == -1).all() and (big[N // 2 + N:] == -1).all()
    x2 = X.reshape(N // 3, 3)
    big2 = np.full((N, 3), -1, np.float32)
    cv.stream(k(device, "sc"), [x2], [big2[10:10 + N // 3]], device=device, block_bytes=1200)
    np.testing.assert_array_equal(big2[10:10 + N // 3], x2 * 2 + 1)
    assert (big2[:10] == -1).all() and (big2[10 + N // 3:] == -1).all()


def test_outputs_that_are_not_contiguous_or_read_only_are_refused(device):
    # guard: a column, a block of columns, every other element, an as_strided view, and a
    # read-only array; each untouched.
    wide = np.zeros((N, 6), np.float32)
    ro = np.zeros(N, np.float32)
    ro.flags.writeable = False
    cases = [
        ([X], wide[:, 1], "C-contiguous"),
        ([X.reshape(N // 3, 3)], wide[: N // 3, :3], "C-contiguous"),
        ([X], np.zeros(2 * N, np.float32)[::2], "C-contiguous"),
        ([X], np.lib.stride_tricks.as_strided(wide, shape=(N,), strides=(24,)), "C-contiguous"),
        ([X], ro, "read-only"),
    ]
    for inputs, out, phrase in cases:
        with pytest.raises(cv.InputError, match=phrase):
            cv.stream(k(device, "sc"), inputs, [out], device=device)
    assert not wide.any() and not ro.any()


# -- 5. cv.iterate: chunk sizes, lengths --------------------------------------------------------
def _chunks(sizes, arr):
    at = 0
    for size in sizes:
        yield arr[at:at + size]
        at += size


@pytest.mark.parametrize("sizes", [[0, 1, 0, N - 1], [1] * 64 + [N - 64], [N]])
def test_iterate_chunks_of_no_one_and_all_rows(device, sizes):
    # guard
    r = cv.stream(k(device, "sc"), [cv.iterate(_chunks(sizes, X), N)], [np.float32],
                  device=device, block_bytes=1000)
    np.testing.assert_array_equal(r.outputs[0], SC)


@pytest.mark.parametrize("sizes, data, phrase", [
    ([1000, 999], X, "ended after 1999 rows"),
    ([N, 5], np.arange(N + 5, dtype=np.float32), "at least 3005 rows"),
    ([N + 5], np.arange(N + 5, dtype=np.float32), "at least 3005 rows"),
])
def test_iterate_of_the_wrong_length_leaves_no_file(device, tmp_path, sizes, data, phrase):
    # guard: fewer or more rows than declared: an InputError, no output file, no part.
    with pytest.raises(cv.InputError, match=phrase):
        cv.stream(k(device, "sc"), [cv.iterate(_chunks(sizes, data), N)],
                  [cv.npy_out(tmp_path / "o.npy")], device=device, block_bytes=1000)
    assert os.listdir(tmp_path) == []


def test_iterate_beside_an_array_with_odd_chunk_sizes(device):
    # guard: chunks cut across block edges, as input 1 beside an array input 0.
    kern = compiled(device, """
__kernel void ad(__global const float *a, __global const float *b, __global float *y,
                 ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = a[i] - b[i] * 3.0f;
}""", "ad")
    b = X[::-1].copy()
    r = cv.stream(kern, [X, cv.iterate(_chunks([7, 1500, 0, 1493], b), N)], [np.float32],
                  device=device, block_bytes=1000)
    np.testing.assert_array_equal(r.outputs[0], X - b * np.float32(3))


# -- 6. rows of no elements ---------------------------------------------------------------------
def test_rows_of_no_elements_make_outputs_of_that_shape(device):
    # guard: (N, 0) and (N, 3, 0) run nothing; a dtype output has the input's shape.
    r = cv.stream(k(device, "sc"), [np.zeros((N, 0), np.float32)], [np.float32], device=device)
    assert r.outputs[0].shape == (N, 0)
    out = np.zeros((N, 3, 0), np.float32)
    cv.stream(k(device, "sc"), [np.zeros((N, 3, 0), np.float32)], [out], device=device)


# -- 7. ndarray subclasses ------------------------------------------------------------------------
class NoSlices(np.ndarray):
    """An ndarray whose views of another shape raise (as some unit-carrying arrays do)."""

    def __array_finalize__(self, obj):
        if obj is not None and getattr(obj, "shape", None) != self.shape:
            raise RuntimeError("NoSlices arrays cannot be sliced")


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix
@pytest.mark.parametrize("halo", [0, 1])
def test_matrix_and_a_subclass_refusing_slices_stream_from_their_memory(device, halo):
    # guard: np.matrix (always 2-D) and NoSlices as inputs and outputs equal NumPy; the
    # output keeps its class.
    kern = k(device, "sc")
    want = (np.pad(X, halo, mode="edge")[:N] if halo else X) * 2 + 1
    m_out = np.asmatrix(np.zeros((N, 1), np.float32))
    cv.stream(kern, [np.asmatrix(X.reshape(N, 1))], [m_out], device=device, block_bytes=1000,
              halo=halo)
    assert type(m_out) is np.matrix
    np.testing.assert_array_equal(np.asarray(m_out).ravel(), want)
    s_out = np.zeros(N, np.float32).view(NoSlices)
    cv.stream(kern, [X.view(NoSlices)], [s_out], device=device, block_bytes=1000, halo=halo)
    np.testing.assert_array_equal(s_out.view(np.ndarray), want)
    r = cv.stream(kern, [cv.iterate(iter([X.view(NoSlices)]), N)], [np.float32],
                  device=device, block_bytes=1000)
    np.testing.assert_array_equal(r.outputs[0], SC)
