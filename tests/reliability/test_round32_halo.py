"""Round thirty-two, halo rows given beside a source (``Source.beside``), a review.

Method (scripts kept out of the repository, under /tmp/r32halo): seeded differential runs
against NumPy's ``np.pad`` (edge, symmetric, wrap, constant) of a weighted-window kernel
that also adds its offsets: 150 local streams (arrays, ``.npy``, ``cv.raw`` with a 13-byte
header, memmaps, read-only arrays, ``cv.iterate``; rows of shape (), (1,), (3,), (2, 3); halos
0 to 2·rows + 1; blocks of 1 row up to one block; ``first_row``; 20% on both PoCL devices),
300 ``cv.iterate`` streams whose generator refills one buffer, 150 two-link chains reading
the input with its halo in both links, 200 in-place streams (arrays, pinned arrays,
memmaps, ``.npy`` in and its memmap out) under every boundary, 120 ``conveyor.dask.map_blocks``
calls (uneven and one-row chunks; int64 kernels, and callables returning the rows ``h``
before or after for float32, uint8, bool, complex64 and records), constants at the types'
edges on map_blocks and locally, and 200 ``conveyor.dask.stream`` file streams on two- and
three-worker ``LocalCluster`` s (``.npy`` v1, v2 and v3 headers, records with a non-Latin-1
field name, Fortran-ordered (N, 1) files, raw files with offsets of 0 to 100 bytes,
sub-array dtypes, rows of 2-D shapes, halos wider than a worker's range and than the file,
``reduce="sum"``, small ``block_bytes``). Every one of those agreed with NumPy, or was
refused the way a local stream refuses it.

Found (strict xfails, each asserting the right behaviour):

- **A crash where a local stream refuses**: ``conveyor.dask.stream(..., halo=h)`` with a
  halo no host can hold reaches each worker, whose ``halo.rows_around`` makes ``h``
  positions and ``h`` rows for each side before the stream's own host-memory check:
  ``halo=10**9`` on a 10-row file was a bare ``MemoryError`` ("Unable to allocate 7.45 GiB",
  under a 6 GB ``ulimit -v``), ``halo=2**62`` NumPy's ``ValueError: array is too big``. One
  local ``cv.stream`` of the same file refuses both before allocating anything, with an
  InputError saying to use a smaller halo.
- **A misleading refusal**: a worker's range shorter than the halo, cut into blocks shorter
  than the halo, is refused with the local message for a whole input: "halo=12 rows is more
  than the input's 10 rows ... (halo=10 already reaches every row of the input from every
  block; the rows past its ends are the boundary's)". The file has 30 rows, and the rows
  past the range are its neighbours' rows, not the boundary's: the advised ``halo=10``
  gives other values. (A local stream of the file is refused too, saying rightly "halo=12
  rows is more than a block".)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import first_device_only  # noqa: E402, F401 (autouse: first device only)

import conveyor as cv  # noqa: E402

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import conveyor.dask as cvd  # noqa: E402
from conveyor.backends.diagnose import cannot_compile  # noqa: E402


def _opencl_spec() -> str | None:
    for dev in cv.devices():
        if dev.backend == "opencl" and not cannot_compile([dev]):
            return str(dev.spec)
    return None


SPEC = _opencl_spec()
pytestmark = pytest.mark.skipif(SPEC is None, reason="no usable OpenCL device")

# y[i] = 7 * sum over the window of (k*k + 3) * x[i + k*ri], plus the element's offset.
SRC = """
__kernel void wsum(__global const long* x, __global long* y, ulong ri, int h, ulong offset,
                   ulong n) {
    ulong i = get_global_id(0);
    if (i < n) {
        long s = 0;
        for (int k = 0; k <= 2 * h; k++) s += (long)(k * k + 3) * x[i + (ulong)k * ri];
        y[i] = s * 7 + (long)(offset + i);
    }
}
"""
MODES = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}


def _reference(x: np.ndarray, h: int, boundary: object = "nearest") -> np.ndarray:
    pad = [(h, h)] + [(0, 0)] * (x.ndim - 1)
    if isinstance(boundary, str):
        p = np.pad(x, pad, mode=MODES[boundary])
    else:
        p = np.pad(x, pad, mode="constant", constant_values=boundary)
    rows = x.shape[0]
    total = np.zeros(x.shape, np.int64)
    for k in range(2 * h + 1):
        total = total + (k * k + 3) * p[k : k + rows]
    return total * 7 + np.arange(x.size, dtype=np.int64).reshape(x.shape)


def _args(x: np.ndarray, h: int) -> tuple[np.uint64, np.int32]:
    return np.uint64(int(np.prod(x.shape[1:], dtype=np.int64))), np.int32(h)


@pytest.fixture(scope="module")
def device():
    return cv.device(SPEC)


@pytest.fixture(scope="module")
def client():
    """Three in-process workers of one thread each: the one cluster of this file."""
    cluster = distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=False,
                                       dashboard_address=":0", silence_logs=50)
    with cluster, distributed.Client(cluster, set_as_default=False) as c:
        c.wait_for_workers(3, timeout=60)
        yield c


# -- crashes where a local stream refuses -------------------------------------------------------
def test_a_cluster_file_stream_refuses_a_halo_no_host_holds_as_a_local_one_does(
        client, device, tmp_path):
    x = np.arange(10, dtype=np.int64)
    np.save(tmp_path / "x.npy", x)
    h = 2**62
    with pytest.raises(cv.InputError, match="smaller halo"):  # the local stream: refused
        cv.stream(device.compile(SRC, "wsum"), [str(tmp_path / "x.npy")], [np.int64],
                  args=_args(x, 1), halo=h, device=device)
    # Today: ValueError "array is too big; `arr.size * arr.dtype.itemsize` is larger than
    # the maximum possible size" from halo.rows_around's np.arange(lo - h, lo) on a worker
    # (halo=10**9: MemoryError, "Unable to allocate 7.45 GiB", under ulimit -v 6 GB).
    with pytest.raises(cv.InputError, match="smaller halo"):
        cvd.stream(cvd.kernel(SRC, "wsum"), [str(tmp_path / "x.npy")],
                   [str(tmp_path / "y.npy")], args=_args(x, 1), halo=h, client=client,
                   device=SPEC)
    assert not (tmp_path / "y.npy").exists()


# -- misleading messages ------------------------------------------------------------------------
def test_a_worker_range_shorter_than_the_halo_is_not_called_the_whole_input(client, tmp_path):
    x = np.arange(30, dtype=np.int64)
    np.save(tmp_path / "x.npy", x)
    with pytest.raises(cv.InputError) as caught:
        cvd.stream(cvd.kernel(SRC, "wsum"), [str(tmp_path / "x.npy")],
                   [str(tmp_path / "y.npy")], args=_args(x, 12), halo=12, block_bytes=40,
                   client=client, device=SPEC)
    text = str(caught.value)
    assert "more than a block" in text
    # Today: "halo=12 rows is more than the input's 10 rows, and more than a block (5 rows):
    # use a smaller halo (halo=10 already reaches every row of the input from every block;
    # the rows past its ends are the boundary's), or a block_bytes that holds the whole
    # input".
    assert "input's 10 rows" not in text and "halo=10 already" not in text


# -- guards -------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["v3-records", "fortran-column", "raw-offset"])
def test_guard_cluster_ranges_read_their_halo_at_the_right_offsets(client, tmp_path, layout):
    """guard: 7 rows on three workers (ranges of 2, 2 and 3 rows), halo 3 (wider than a
    range), a file whose data starts at an unusual offset: a v3 header (a record field named
    outside Latin-1), a Fortran-ordered (N, 1) file, a raw file after 13 bytes. Each row's
    output is the rows h before and after it as np.pad's edge mode gives them."""
    h, rows = 3, 7
    base = np.arange(rows, dtype=np.int64) * 11 - 20
    if layout == "v3-records":
        x = np.zeros(rows, [("a", "<i8"), ("\u00e9t\u00e9", "<f8")])
        x["a"], x["\u00e9t\u00e9"] = base, base * 0.5
        with open(tmp_path / "x.npy", "wb") as f:
            np.lib.format.write_array(f, x, version=(3, 0))
        source: object = str(tmp_path / "x.npy")
    elif layout == "fortran-column":
        x = np.asfortranarray(base.reshape(rows, 1))
        np.save(tmp_path / "x.npy", x)
        source = str(tmp_path / "x.npy")
    else:
        x = base
        (tmp_path / "x.raw").write_bytes(b"0123456789abc" + x.tobytes())
        source = cv.raw(tmp_path / "x.raw", np.int64, (rows,), offset=13)

    def before_and_after(a, y, z, queue, offset, n):
        count = y.shape[0]
        return a[0:count].copy(queue=queue), a[2 * h : 2 * h + count].copy(queue=queue)

    report = cvd.stream(before_and_after, [source],
                        [cv.npy_out(tmp_path / "y.npy", x.dtype),
                         cv.npy_out(tmp_path / "z.npy", x.dtype)],
                        halo=h, client=client, device=SPEC)
    assert sorted(r["rows"] for r in report.ranges) == [(0, 2), (2, 4), (4, 7)]
    p = np.pad(np.ascontiguousarray(x), [(h, h)] + [(0, 0)] * (x.ndim - 1), mode="edge")
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), p[:rows])
    np.testing.assert_array_equal(np.load(tmp_path / "z.npy"), p[2 * h : 2 * h + rows])


@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", "none", -7])
def test_guard_map_blocks_of_2d_rows_and_one_row_chunks_equals_np_pad(boundary):
    """guard: rows of (2, 3), chunks of 1, 1, 3 and 1 rows (merged up to the halo), halo 2:
    each chunk's stream gets its neighbours' rows (dask's pad rows at the ends) beside it."""
    x = (np.arange(6 * 6, dtype=np.int64).reshape(6, 2, 3) * 37) % 101 - 50
    arr = da.from_array(x, chunks=((1, 1, 3, 1), 2, 3))
    got = cvd.map_blocks(cvd.kernel(SRC, "wsum"), arr, args=_args(x, 2), halo=2,
                         boundary=boundary, device=SPEC).compute(scheduler="sync")
    np.testing.assert_array_equal(got, _reference(x, 2, "nearest" if boundary == "none"
                                                  else boundary))
