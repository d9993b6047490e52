"""The eleventh round, ``conveyor.dask`` on a real two-worker LocalCluster (spawned processes,
PoCL, one thread each; one cluster for the module, as tests/test_dask.py): odd chunks, halos
across chunk boundaries, dtypes, every reduce op, graphs of several conveyor maps, file
streams in awkward places, bad options and failures on the workers.

Found (each ``xfail(strict=True)`` test asserts the right behaviour; it passes today because
conveyor is wrong, and turns red when the bug is fixed):

- An exception a worker cannot pickle (every PyOpenCL error a callable raises: its
  ``_ErrorRecord`` does not pickle) reached the client as a bare ``Exception`` holding only
  ``LogicError(<pyopencl._cl._ErrorRecord object at 0x...>)``: the driver's message
  (``INVALID_BUFFER_SIZE``) and conveyor's note naming the chunk or row range and the worker
  were both lost (Dask's ``error_message`` falls back to ``Exception(repr(e))``).
- An error whose text passes Dask's ``distributed.admin.max-error-length`` (10,000
  characters; a CompileError whose build log is long) was rebuilt by Dask as
  ``CompileError("Long error message", <the text cut>)``: its message became "Long error
  message" and the note naming the chunk and worker was lost.
- ``map_blocks(halo=h)`` with a boundary other than "none" ran the compute on the rows dask
  pads past the array's ends: a callable saw ``offset=-h`` and rows up to ``N + h``, which a
  local ``cv.stream(halo=h)`` never gives; one that reads per-row data by ``offset`` (works
  locally) failed with NumPy's broadcast error (a kernel reads such a table out of bounds).
  Known and documented until round 26, which streams a chunk's own rows only, its
  neighbours' rows (dask's pad rows at the ends) given as its halo.
- ``strict=`` and ``zero_copy=`` were not checked on the client (``depth=``, ``block_bytes=``
  are): ``strict="yes"`` failed in every chunk on the workers at ``compute()``.
- ``cvd.warm``'s note named the worker only as "pid N" (``get_worker()`` has no worker inside
  ``client.run``), where a task's note gives its name and address.

Guards (held when tried): zero-size, size-1, uneven and single chunks, chunks along axis 1,
1-element and empty arrays; halos over such chunks with every boundary against dask's own
``map_overlap`` and ``np.pad``; kernel reductions of int8/uint8/int64/uint64/float32 with each
op (value and type of one local stream); callable maps and sums of int8, uint64, float16,
bool and complex; a non-commutative fold over 50 chunks keeps chunk order; a map of a map,
persisted, computed twice, reduced and haloed; file streams with the same file in and out
(also when the kernel fails to build), a missing folder, an existing output of another
dtype, a folder as output, empty and one-row files; device specs no worker has, bad
``block_bytes``, bad build options: conveyor's errors with the chunk's note, no part file left.
Not tried: a read-only folder (the tests run as root, which writes anyway).
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

import conveyor as cv

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")

import conveyor.dask as cvd  # noqa: E402
from conveyor.backends.diagnose import cannot_compile  # noqa: E402


def _opencl_spec() -> str | None:
    for dev in cv.devices():
        if dev.backend == "opencl" and not cannot_compile([dev]):
            return str(dev.spec)
    return None


SPEC = _opencl_spec()
pytestmark = pytest.mark.skipif(SPEC is None, reason="no usable OpenCL device")

AXPY = """
__kernel void axpy(__global const float* x, __global float* y, float a, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = a * x[i] + (float)(offset + i);
}
"""
# Halo 2: element i of the block is x[i + 2]; rows i-2, i, i+2 of the array, and the row.
STENCIL = """
__kernel void sten(__global const float* x, __global float* y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] - 2.0f * x[i + 2] + 3.0f * x[i + 4] + (float)((offset + i) % 7);
}
"""
# Rows of w floats, halo 1: the row before, the row, the row after.
ROWSTEN = """
__kernel void rs(__global const float* x, __global float* y, ulong w, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] - 2.0f * x[i + w] + 5.0f * x[i + 2 * w] + (float)((offset + i) % 5);
}
"""
COPY = """__kernel void cp(__global const T* x, __global T* y, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i]; }"""


@pytest.fixture(scope="module")
def client():
    # This module's functions go to the workers by value: they cannot import tests/.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=":0", silence_logs=50)
    with cluster, distributed.Client(cluster) as c:
        c.wait_for_workers(2, timeout=60)
        yield c


def _local(source, name, inputs, **kw):
    dev = cv.device(SPEC)
    return cv.stream(dev.compile(source, name), inputs, device=dev, **kw)


def _np_stencil(block):
    """STENCIL on a block with 2 rows each side, without the offset term."""
    return block[:-4] - 2 * block[2:-2] + 3 * block[4:]


def _stencil_reference(x, mode):
    p = np.pad(x, 2, **mode)
    return (_np_stencil(p) + (np.arange(len(x)) % 7)).astype(np.float32)


def _notes(exc):
    return " ".join(getattr(exc, "__notes__", []))


ODD_CHUNKS = [((3, 0, 7),), ((0, 3, 7, 0),), ((1,) * 10,), ((10,),), ((9, 1),)]


# -- chunks -----------------------------------------------------------------------------------
@pytest.mark.parametrize("chunks", ODD_CHUNKS)
def test_map_blocks_over_zero_size_uneven_and_single_chunks(client, chunks):
    # guard: every chunk layout, empty ones included, gives NumPy's answer
    x = np.arange(10, dtype=np.float32) * 1.5
    y = cvd.map_blocks(cvd.kernel(AXPY, "axpy"), da.from_array(x, chunks=chunks),
                       args=(2.0,), device=SPEC)
    np.testing.assert_array_equal(y.compute(), 2 * x + np.arange(10))


def test_map_blocks_of_one_element_and_of_no_rows(client):
    # guard: 1 element, 0 rows
    k = cvd.kernel(AXPY, "axpy")
    one = np.array([4.0], np.float32)
    np.testing.assert_array_equal(
        cvd.map_blocks(k, da.from_array(one), args=(3.0,), device=SPEC).compute(), [12.0])
    empty = cvd.map_blocks(k, da.from_array(one[:0]), args=(3.0,), device=SPEC).compute()
    assert empty.shape == (0,) and empty.dtype == np.float32


@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", 3.0])
def test_halo_over_odd_chunks_equals_dasks_own_map_overlap(client, boundary):
    # guard: halo 2 across zero-size, size-1 and uneven chunk boundaries, against dask's
    # map_overlap of the same stencil in NumPy
    x = ((np.arange(50) * 7) % 13).astype(np.float32)
    k = cvd.kernel(STENCIL, "sten")
    for chunks in [((10, 0, 40),), ((1, 1, 48),), ((3, 0, 0, 47),), ((48, 2),), ((50,),)]:
        dx = da.from_array(x, chunks=chunks)
        ref = da.from_array(x, chunks=chunks).rechunk(
            {0: da.overlap.ensure_minimum_chunksize(2, dx.chunks[0])}).map_overlap(
            _np_stencil_same, depth=2, boundary=boundary, dtype=np.float32).compute()
        ref = (ref + np.arange(50) % 7).astype(np.float32)
        got = cvd.map_blocks(k, dx, halo=2, boundary=boundary, device=SPEC,
                             block_bytes=64).compute()
        np.testing.assert_array_equal(got, ref, err_msg=str(chunks))


def _np_stencil_same(block):
    """``_np_stencil`` keeping the block's shape (map_overlap trims the 2 rows each side)."""
    out = np.zeros_like(block)
    out[2:-2] = _np_stencil(block)
    return out


@pytest.mark.parametrize("boundary, mode", [
    ("nearest", {"mode": "edge"}), ("reflect", {"mode": "symmetric"}),
    ("periodic", {"mode": "wrap"}), ("none", {"mode": "edge"}),
    (-1.5, {"mode": "constant", "constant_values": -1.5}),
])
def test_halo_of_rows_chunked_along_axis_1(client, boundary, mode):
    # guard: 2-D rows chunked on both axes (and a zero-size row chunk), halo 1 row
    x = ((np.arange(60 * 4) * 7) % 13).astype(np.float32).reshape(60, 4)
    p = np.pad(x, ((1, 1), (0, 0)), **mode).ravel()
    n = x.size
    ref = (p[:n] - 2 * p[4:4 + n] + 5 * p[8:8 + n] + np.arange(n) % 5).astype(
        np.float32).reshape(x.shape)
    for chunks in [(7, 3), ((30, 0, 30), (1, 3)), ((1, 59), (2, 2))]:
        got = cvd.map_blocks(cvd.kernel(ROWSTEN, "rs"), da.from_array(x, chunks=chunks),
                             args=(4,), halo=1, boundary=boundary, device=SPEC).compute()
        np.testing.assert_array_equal(got, ref, err_msg=str(chunks))


@pytest.mark.parametrize("boundary, mode", [
    ("nearest", {"mode": "edge"}), ("reflect", {"mode": "symmetric"}),
    ("periodic", {"mode": "wrap"}), ("none", {"mode": "edge"}),
])
def test_halo_equal_to_the_rows(client, boundary, mode):
    # guard: 2 rows, halo 2 (the most dask's overlap allows)
    x = np.array([1.0, 2.0], np.float32)
    got = cvd.map_blocks(cvd.kernel(STENCIL, "sten"), da.from_array(x), halo=2,
                         boundary=boundary, device=SPEC).compute()
    np.testing.assert_array_equal(got, _stencil_reference(x, mode))


# -- dtypes and reductions --------------------------------------------------------------------
KERNEL_REDUCE_DATA = {
    "char": lambda: (np.arange(1000) % 256 - 128).astype(np.int8),
    "uchar": lambda: (np.arange(1000) % 256).astype(np.uint8),
    "long": lambda: np.int64(2**62) + np.arange(1000, dtype=np.int64) * np.int64(2**53),
    "ulong": lambda: np.uint64(2**63) + np.arange(1000, dtype=np.uint64) * np.uint64(2**54),
    "float": lambda: (np.arange(1000, dtype=np.float32) * 1.37 - 500).astype(np.float32),
}


@pytest.mark.parametrize("ctype", sorted(KERNEL_REDUCE_DATA))
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_kernel_reduce_of_each_dtype_and_op_is_one_local_stream(client, ctype):
    # guard: value and type of one local stream; exactly NumPy's for integers (wrapping
    # int64/uint64 sums included); chunks of 1 row and of none among them
    x = KERNEL_REDUCE_DATA[ctype]()
    source = COPY.replace("T", ctype)
    for op in ("sum", "min", "max"):
        local = _local(source, "cp", [x], reduce=op, block_bytes=256).result
        for chunks in [((1000,),), ((1, 0, 333, 666),), ((100,) * 10,)]:
            got = cvd.reduce(cvd.kernel(source, "cp"), da.from_array(x, chunks=chunks), op,
                             device=SPEC, block_bytes=256).compute()
            assert got == local and type(got) is type(local), (op, chunks, got, local)
            if x.dtype.kind in "iu":
                assert got == getattr(np, op)(x), (op, chunks)


def _negate(x, y, *, queue, offset, n):
    h = x.get(queue=queue)
    y.set(~h if h.dtype == np.bool_ else -h, queue=queue)


def _block_sum(x, *, queue, offset, n):
    h = x.get(queue=queue)
    return h.sum(dtype=h.dtype) if h.dtype.kind in "fc" else h.sum()


@pytest.mark.parametrize("dtype", [np.int8, np.uint64, np.float16, np.bool_, np.complex64,
                                   np.complex128])
def test_callable_map_and_sum_keep_odd_dtypes(client, dtype):
    # guard: dtype kept through workers; sums as one local stream gives them
    x = np.arange(500) % 7
    x = (x % 3 == 0) if dtype is np.bool_ else x.astype(dtype)
    if np.dtype(dtype).kind == "c":
        x = (x + 1j * x[::-1]).astype(dtype)
    dx = da.from_array(x, chunks=((0, 100, 1, 399),))
    got = cvd.map_blocks(_negate, dx, device=SPEC).compute()
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, ~x if dtype is np.bool_ else -x)
    total = cvd.reduce(_block_sum, dx, "sum", device=SPEC, block_bytes=64).compute()
    local = cv.stream(_block_sum, [x], reduce="sum", device=cv.device(SPEC),
                      block_bytes=64).result
    assert total == local and type(total) is type(local)


def _rows_seen(x, *, queue, offset, n):
    return [(int(offset), int(n))]


def test_a_non_commutative_fold_over_fifty_chunks_keeps_chunk_order(client):
    # guard: dask folds in a tree (split_every); the order of rows is kept
    x = da.from_array(np.arange(1000, dtype=np.float32), chunks=20)
    got = cvd.reduce(_rows_seen, x, lambda a, b: a + b, device=SPEC).compute()
    assert got[()] == [(20 * i, 20) for i in range(50)]


# -- graphs of conveyor maps --------------------------------------------------------------------
def test_a_map_of_a_map_persisted_computed_twice_and_reduced(client):
    # guard: one conveyor map feeding another, rechunked, persisted, computed twice,
    # reduced, and haloed with another boundary
    k = cvd.kernel(AXPY, "axpy")
    x = np.arange(1000, dtype=np.float32)
    y = cvd.map_blocks(k, da.from_array(x, chunks=333), args=(2.0,), device=SPEC)
    z = cvd.map_blocks(k, y, args=(0.5,), device=SPEC)
    ref_y = 2 * x + np.arange(1000)
    ref_z = (0.5 * ref_y + np.arange(1000)).astype(np.float32)
    np.testing.assert_array_equal(z.compute(), ref_z)
    np.testing.assert_array_equal(
        cvd.map_blocks(k, y.rechunk(100), args=(0.5,), device=SPEC).compute(), ref_z)
    kept = y.persist()
    for _ in range(2):
        np.testing.assert_array_equal(kept.compute(), ref_y)
        np.testing.assert_array_equal(
            cvd.map_blocks(k, kept, args=(0.5,), device=SPEC).compute(), ref_z)
    both = da.compute(y, z)
    np.testing.assert_array_equal(both[0], ref_y)
    np.testing.assert_array_equal(both[1], ref_z)
    assert cvd.reduce(k, y, "sum", args=(0.5,), device=SPEC).compute() == \
        ref_z.astype(np.float64).sum()
    np.testing.assert_array_equal(
        cvd.map_blocks(cvd.kernel(STENCIL, "sten"), y, halo=2, boundary="reflect",
                       device=SPEC).compute(),
        _stencil_reference(ref_y, {"mode": "symmetric"}))


# -- file streams ---------------------------------------------------------------------------------
def test_file_stream_with_the_same_file_in_and_out(client, tmp_path):
    # guard: in place, with a halo across the two workers' seam; and a failed build leaves
    # the input as it was and no part file
    x = ((np.arange(1000) * 7) % 13).astype(np.float32)
    path = tmp_path / "x.npy"
    np.save(path, x)
    broken = cvd.kernel(STENCIL.replace("3.0f * x", "3.0f ** x"), "sten")
    with pytest.raises(cv.CompileError) as info:
        cvd.stream(broken, [str(path)], [str(path)], halo=2, client=client, device=SPEC)
    assert "rows " in _notes(info.value)
    np.testing.assert_array_equal(np.load(path), x)
    assert os.listdir(tmp_path) == ["x.npy"]
    cvd.stream(cvd.kernel(STENCIL, "sten"), [str(path)], [str(path)], halo=2, client=client,
               device=SPEC, block_bytes=256)
    np.testing.assert_array_equal(np.load(path), _stencil_reference(x, {"mode": "edge"}))
    assert os.listdir(tmp_path) == ["x.npy"]


def test_file_outputs_in_awkward_places(client, tmp_path):
    # guard: a missing folder and a folder as output are InputErrors before any work; an
    # existing output of another dtype and shape is replaced whole
    k = cvd.kernel(AXPY, "axpy")
    x = np.arange(1000, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    with pytest.raises(cv.InputError, match="does not exist: create it"):
        cvd.stream(k, [str(tmp_path / "x.npy")], [str(tmp_path / "nope" / "y.npy")],
                   args=(2.0,), client=client, device=SPEC)
    (tmp_path / "dir.npy").mkdir()
    with pytest.raises(cv.InputError, match="is a folder"):
        cvd.stream(k, [str(tmp_path / "x.npy")], [str(tmp_path / "dir.npy")], args=(2.0,),
                   client=client, device=SPEC)
    np.save(tmp_path / "y.npy", np.zeros(5, np.int8))
    cvd.stream(k, [str(tmp_path / "x.npy")], [str(tmp_path / "y.npy")], args=(2.0,),
               client=client, device=SPEC)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), 2 * x + np.arange(1000))
    assert sorted(os.listdir(tmp_path)) == ["dir.npy", "x.npy", "y.npy"]


def test_file_streams_of_no_rows_and_of_one_row(client, tmp_path):
    # guard: as a local stream gives them (0 for an empty sum, the same InputError for max)
    k = cvd.kernel(AXPY, "axpy")
    np.save(tmp_path / "e.npy", np.zeros(0, np.float32))
    np.save(tmp_path / "one.npy", np.array([5.0], np.float32))
    cvd.stream(k, [str(tmp_path / "e.npy")], [str(tmp_path / "eo.npy")], args=(2.0,),
               client=client, device=SPEC)
    assert np.load(tmp_path / "eo.npy").shape == (0,)
    assert cvd.stream(k, [str(tmp_path / "e.npy")], reduce="sum", args=(2.0,), client=client,
                      device=SPEC).result == 0
    with pytest.raises(cv.InputError, match="empty input"):
        cvd.stream(k, [str(tmp_path / "e.npy")], reduce="max", args=(2.0,), client=client,
                   device=SPEC)
    report = cvd.stream(k, [str(tmp_path / "one.npy")], [str(tmp_path / "oo.npy")],
                        args=(2.0,), client=client, device=SPEC)
    assert [r["rows"] for r in report.ranges] == [(0, 1)]
    np.testing.assert_array_equal(np.load(tmp_path / "oo.npy"), [10.0])
    assert sorted(os.listdir(tmp_path)) == ["e.npy", "eo.npy", "one.npy", "oo.npy"]


# -- options and failures on the workers --------------------------------------------------------
def test_a_device_no_worker_has_is_an_input_error_with_the_chunk(client, tmp_path):
    # guard: conveyor's InputError, listing the workers' devices, with the chunk's note;
    # a file stream leaves no part
    k = cvd.kernel(AXPY, "axpy")
    x = np.arange(1000, dtype=np.float32)
    for spec in ("opencl:7:0", "foo:bar"):
        with pytest.raises(cv.InputError, match="no device matches") as info:
            cvd.map_blocks(k, da.from_array(x, chunks=300), args=(2.0,),
                           device=spec).compute()
        assert "chunk " in _notes(info.value) and "tcp://" in _notes(info.value)
    np.save(tmp_path / "x.npy", x)
    with pytest.raises(cv.InputError, match="no device matches"):
        cvd.stream(k, [str(tmp_path / "x.npy")], [str(tmp_path / "y.npy")], args=(2.0,),
                   client=client, device="opencl:7:0")
    assert os.listdir(tmp_path) == ["x.npy"]


def test_bad_block_bytes_and_build_options_are_conveyors_errors(client, tmp_path):
    # guard: refused on the client (-1, 1.5, True) or by each chunk's stream (0, 3: less than
    # a row) with the chunk's note; a huge one is capped; an unknown build option is a
    # CompileError; no part file left
    k = cvd.kernel(AXPY, "axpy")
    x = np.arange(1000, dtype=np.float32)
    dx = da.from_array(x, chunks=300)
    for bad in (-1, 1.5, True):
        with pytest.raises(cv.InputError, match="block_bytes"):
            cvd.map_blocks(k, dx, args=(2.0,), device=SPEC, block_bytes=bad)
    for bad in (0, 3):
        with pytest.raises(cv.InputError, match="smaller than one row") as info:
            cvd.map_blocks(k, dx, args=(2.0,), device=SPEC, block_bytes=bad).compute()
        assert "chunk " in _notes(info.value)
    np.testing.assert_array_equal(
        cvd.map_blocks(k, dx, args=(2.0,), device=SPEC, block_bytes=2**70).compute(),
        2 * x + np.arange(1000))
    np.save(tmp_path / "x.npy", x)
    with pytest.raises(cv.InputError, match="smaller than one row"):
        cvd.stream(k, [str(tmp_path / "x.npy")], [str(tmp_path / "y.npy")], args=(2.0,),
                   client=client, device=SPEC, block_bytes=3)
    with pytest.raises(cv.CompileError, match="-cl-no-such-option"):
        cvd.stream(cvd.kernel(AXPY, "axpy", ["-cl-no-such-option"]), [str(tmp_path / "x.npy")],
                   [str(tmp_path / "y.npy")], args=(2.0,), client=client, device=SPEC)
    assert os.listdir(tmp_path) == ["x.npy"]


def _raises_a_driver_error(x, y, *, queue, offset, n):
    import pyopencl as cl

    if offset >= 300:
        cl.Buffer(queue.context, cl.mem_flags.READ_ONLY, 0)  # LogicError INVALID_BUFFER_SIZE
    y.set(x.get(queue=queue), queue=queue)


def test_a_driver_error_in_a_callable_keeps_its_message_locally(client):
    # guard: in one local stream PyOpenCL's own error comes with its message
    import pyopencl as cl

    with pytest.raises(cl.LogicError, match="INVALID_BUFFER_SIZE"):
        cv.stream(_raises_a_driver_error, [np.arange(1000, dtype=np.float32)], [np.float32],
                  device=cv.device(SPEC), block_bytes=1200)


def test_a_driver_error_in_a_chunk_keeps_its_message_and_note(client):
    x = da.from_array(np.arange(1000, dtype=np.float32), chunks=300)
    with pytest.raises(Exception) as info:  # noqa: B017 - the type is the fix's to choose
        cvd.map_blocks(_raises_a_driver_error, x, device=SPEC, block_bytes=1200).compute()
    # Today: Exception("LogicError(<pyopencl._cl._ErrorRecord object at 0x...>)"), no notes.
    assert "INVALID_BUFFER_SIZE" in str(info.value)
    assert "chunk " in _notes(info.value) and "tcp://" in _notes(info.value)


def test_a_driver_error_in_a_file_stream_keeps_its_message_and_leaves_no_part(client,
                                                                              tmp_path):
    np.save(tmp_path / "x.npy", np.arange(1000, dtype=np.float32))
    with pytest.raises(Exception) as info:  # noqa: B017 - the type is the fix's to choose
        cvd.stream(_raises_a_driver_error, [str(tmp_path / "x.npy")],
                   [str(tmp_path / "y.npy")], client=client, device=SPEC, block_bytes=1200)
    assert os.listdir(tmp_path) == ["x.npy"]  # this part holds today
    assert "INVALID_BUFFER_SIZE" in str(info.value)
    # Each worker's range fails; whichever reaches the client first is named.
    assert re.search(r"rows (0:500|500:1000) of .*x\.npy, on worker", _notes(info.value))


def test_a_long_build_log_keeps_the_compile_errors_message_and_note(client):
    name = "undeclared_" + "q" * 2000
    bad = AXPY.replace("a * x[i]", " + ".join(f"{name}{j}" for j in range(8)))
    x = da.from_array(np.ones(100, np.float32), chunks=50)
    with pytest.raises(cv.CompileError) as info:
        cvd.map_blocks(cvd.kernel(bad, "axpy"), x, args=(1.0,), device=SPEC).compute()
    # Today: message "Long error message", the log cut at 10,000 characters, no notes.
    assert info.value.message.startswith("OpenCL build failed"), info.value.message[:80]
    assert "chunk " in _notes(info.value)


_WEIGHTS = np.arange(100, dtype=np.float32) + 1


def _weighted(x, y, *, queue, offset, n):
    """A halo-2 callable that multiplies each row by its weight: rows offset:offset+n."""
    body = x.get(queue=queue)[2:2 + n]
    y.set((body * _WEIGHTS[offset:offset + n]).astype(np.float32), queue=queue)


def test_a_halo_callable_sees_only_rows_of_the_array_as_in_a_local_stream(client):
    x = np.arange(100, dtype=np.float32)
    local = cv.stream(_weighted, [x], [np.float32], halo=2, device=cv.device(SPEC),
                      block_bytes=160).outputs[0]
    np.testing.assert_array_equal(local, x * _WEIGHTS)  # locally: offsets 0..99 only
    got = cvd.map_blocks(_weighted, da.from_array(x, chunks=40), halo=2, boundary="nearest",
                         device=SPEC, block_bytes=160).compute()
    # Today: ValueError "operands could not be broadcast together" (offset -2, rows to 101).
    np.testing.assert_array_equal(got, x * _WEIGHTS)


def test_strict_and_zero_copy_are_checked_on_the_client(client):
    x = da.from_array(np.arange(100, dtype=np.float32), chunks=50)
    k = cvd.kernel(AXPY, "axpy")
    for bad in ({"strict": "yes"}, {"zero_copy": "maybe"}):
        # Today: no error here; each chunk raises the InputError at compute().
        with pytest.raises(cv.InputError, match="takes True or False"):
            cvd.map_blocks(k, x, args=(2.0,), device=SPEC, **bad)
        with pytest.raises(cv.InputError, match="takes True or False"):
            cvd.reduce(k, x, "sum", args=(2.0,), device=SPEC, **bad)


def test_warm_names_the_worker_that_failed(client):
    with pytest.raises(cv.InputError, match="no device matches") as info:
        cvd.warm(cvd.kernel(AXPY, "axpy"), client=client, device="opencl:7:0")
    # Today: "conveyor.dask: building kernel 'axpy', on worker pid 1234".
    assert "tcp://" in _notes(info.value)
