"""Round thirty-four: a review of round thirty-two's fixes (``git diff 2f3ba72 4903064 --
src``): ``conveyor.dask`` ``map_blocks`` with a halo longer than the array, ``reduce(halo=,
boundary=)``, ``worker.run(boundary=)``, ``halo._read_once`` (a wrapped iterable), bool
elements in the built-in fold, the command's fold message.

Method (seeded probes kept out of the repository, under /tmp/r34rev): about 800 generated
jobs, each compared with one local ``cv.stream`` and NumPy: callables over int8 to uint64,
float16/32/64 and bool, rows of 1 to 3 columns, 0 to 8 rows, halos 0 to 13 (past the array),
every boundary and constants, chunkings with 1-row, uneven and empty chunks; kernels writing
bool, float, ulong and char values reduced with sum/min/max (halo, uneven and empty chunks,
small blocks); two inputs of two dtypes chunked apart on a LocalCluster (processes=False, 2
workers); constants at every dtype's edges (exact bytes); Fortran-order, strided, reversed and
transposed inputs; rows of no elements; halos up to 2**64; bool reductions through arrays,
``.npy`` paths, ``cv.npy``, ``cv.iterate``, two devices (with halos), chains and
``conveyor reduce``; ``conveyor.dask.stream`` bool reductions with halos. All agreed, except
what is below.

Found:

- **Refusal of legal work, a message that does not say what to change**:
  ``conveyor.dask.stream(..., halo=h, boundary=...)`` over files is "unknown option(s)
  boundary" (with advice about progress and trace), though ``cv.stream``,
  ``conveyor.dask.map_blocks`` and, since round thirty-two, ``conveyor.dask.reduce`` take it,
  and the worker's ``run`` and ``halo.rows_around`` already do.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import (  # noqa: E402, F401 (first_device_only: autouse, first device only)
    first_device_only,
    opencl_c_only,
)

import conveyor as cv  # noqa: E402

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

import conveyor.dask as cvd  # noqa: E402

# Halo h: row i's value reads rows i-h..i+h weighted (k+1); a flag every third sum.
SRC = """
__kernel void isten(__global const int *x, __global int *y, int h, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { int s = 0; for (int k = 0; k <= 2 * h; k++) s += (k + 1) * x[i + k];
                 y[i] = s + (int)((offset + i) % 7); }
}
__kernel void iflag(__global const int *x, __global bool *y, int h, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { int s = 0; for (int k = 0; k <= 2 * h; k++) s += (k + 1) * x[i + k];
                 y[i] = ((s + (int)((offset + i) % 5)) % 3) == 0; }
}
"""
MODES = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}


def _reference(x: np.ndarray, h: int, boundary: object) -> np.ndarray:
    """What ``isten`` writes, from NumPy's pad (a halo past the array repeats the pad)."""
    if isinstance(boundary, str):
        p = np.pad(x.astype(np.int64), h, mode=MODES[boundary])  # type: ignore[call-overload]
    else:
        p = np.pad(x.astype(np.int64), h, mode="constant", constant_values=boundary)
    s = sum((k + 1) * p[k : k + len(x)] for k in range(2 * h + 1))
    return (s + np.arange(len(x)) % 7).astype(np.int32)


@pytest.fixture(scope="module")
def client():
    """Two in-process workers of one thread each."""
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                       dashboard_address=":0", silence_logs=50)
    with cluster, distributed.Client(cluster, set_as_default=False) as c:
        c.wait_for_workers(2, timeout=60)
        yield c


# -- found ------------------------------------------------------------------------------------
def test_a_file_stream_takes_a_boundary_as_map_blocks_and_reduce_do(client, device, tmp_path):
    """The same stencil over the same rows: ``cv.stream`` and ``conveyor.dask.map_blocks``
    (and ``reduce``) take ``boundary="reflect"`` and equal NumPy; ``conveyor.dask.stream``
    over the ``.npy`` refuses it as an unknown option, advising about progress and trace.
    ``files._stream_range`` calls ``halo.rows_around(whole, lo, hi, halo)``, which takes a
    boundary, and ``worker.run`` passes one since round thirty-two: only ``files.stream``
    lacks the parameter."""
    opencl_c_only(device)
    x = ((np.arange(30, dtype=np.int32) * 7919) % 101) - 50
    np.save(tmp_path / "x.npy", x)
    for boundary in ("reflect", "periodic", -4):
        want = _reference(x, 2, boundary)
        local = cv.stream(device.compile(SRC, "isten"), [x], [np.int32], halo=2,
                          boundary=boundary, args=(2,), device=device).outputs[0]
        np.testing.assert_array_equal(local, want)  # holds
        with dask.config.set(scheduler="synchronous"):
            mapped = cvd.map_blocks(cvd.kernel(SRC, "isten"), da.from_array(x, chunks=7),
                                    args=(2,), halo=2, boundary=boundary,
                                    device=device.spec).compute()
        np.testing.assert_array_equal(mapped, want)  # holds
        out = tmp_path / f"y{boundary}.npy"
        cvd.stream(cvd.kernel(SRC, "isten"), [str(tmp_path / "x.npy")], [str(out)], halo=2,
                   boundary=boundary, args=(2,), device=device.spec, client=client)
        np.testing.assert_array_equal(np.load(out), want)


# -- guards: what held, kept because each takes a path round thirty-two added -----------------
def test_a_dask_reduce_of_flags_with_a_halo_is_one_local_stream(device):
    """Bool elements in the built-in fold (sum an int64 count, min/max a bool) through
    ``conveyor.dask.reduce`` with a halo: uneven chunks, 1-row and empty chunks (merged
    before dask's overlap), a halo past the array (one chunk, padded by its stream), small
    blocks; each equal to one local stream and NumPy, dtype included."""
    opencl_c_only(device)
    x = ((np.arange(11, dtype=np.int32) * 37) % 19) - 9
    k = device.compile(SRC, "iflag")
    cases = [(1, "nearest", (3, 1, 0, 7)), (2, "reflect", (1, 1, 1, 8)),
             (3, "periodic", (0, 5, 6)), (2, "none", (4, 0, 4, 3)), (1, -7, (11,)),
             (13, "reflect", (2, 9)), (13, 4, (1,) * 11)]
    for h, boundary, chunks in cases:
        p = _reference(x, h, "nearest" if boundary == "none" else boundary)
        flags = ((p - np.arange(11) % 7 + np.arange(11) % 5) % 3) == 0
        blocks = {"block_bytes": 16} if h < 4 else {}  # a halo past the array: one block
        for op, fold in (("sum", np.sum), ("min", np.min), ("max", np.max)):
            want = fold(flags)
            local = cv.stream(k, [x], reduce=op, halo=h, args=(h,), device=device, **blocks,
                              boundary="nearest" if boundary == "none" else boundary).result
            with dask.config.set(scheduler="synchronous"):
                got = cvd.reduce(cvd.kernel(SRC, "iflag"), da.from_array(x, chunks=(chunks,)),
                                 op, args=(h,), halo=h, boundary=boundary,
                                 device=device.spec, **blocks).compute()
            what = (h, boundary, chunks, op)
            assert local == want and np.asarray(local).dtype == np.asarray(want).dtype, what
            assert got == want and np.asarray(got).dtype == np.asarray(want).dtype, what


def test_map_blocks_past_the_array_with_two_inputs_and_edge_constants(device):
    """A halo longer than the array (one chunk, padded by its stream) and one within it
    (dask's overlap), two inputs of two dtypes chunked apart, constants at uint64's edge
    (exact bytes: a float on the way would round them); a constant one input's dtype cannot
    hold is refused on the client, as locally."""
    opencl_c_only(device)

    def take(a, b, y, *, queue, offset, n):  # row i: the halo's first rows of each input
        rows = y.shape[0]
        y.set(a.get(queue=queue)[:rows] ^ b.get(queue=queue)[:rows].astype(np.uint64),
              queue=queue)

    def first(a, y, *, queue, offset, n):
        y.set(np.ascontiguousarray(a.get(queue=queue)[: y.shape[0]]), queue=queue)

    a = np.array([3, 1 << 63, 7], np.uint64)
    b = np.array([9, 8, 200], np.uint8)
    for h in (1, 3, 5):
        for boundary in ("periodic", "reflect", 200):
            want = cv.stream(take, [a, b], [np.uint64], halo=h, boundary=boundary,
                             device=device).outputs[0]
            with dask.config.set(scheduler="synchronous"):
                got = cvd.map_blocks(take, da.from_array(a, chunks=1),
                                     da.from_array(b, chunks=2), dtype=np.uint64, halo=h,
                                     boundary=boundary, device=device.spec).compute()
            assert got.tobytes() == want.tobytes(), (h, boundary)
        for edge in (2**64 - 1, 2**64 - 2, 2**63 + 1):
            want = cv.stream(first, [a], [np.uint64], halo=h, boundary=edge,
                             device=device).outputs[0]
            assert want[0] == edge
            with dask.config.set(scheduler="synchronous"):
                got = cvd.map_blocks(first, da.from_array(a, chunks=1), dtype=np.uint64,
                                     halo=h, boundary=edge, device=device.spec).compute()
            assert got.tobytes() == want.tobytes(), (h, edge)
        with pytest.raises(cv.InputError, match="uint8"):
            cvd.map_blocks(take, da.from_array(a), da.from_array(b), dtype=np.uint64,
                           halo=h, boundary=2**64 - 1, device=device.spec)
