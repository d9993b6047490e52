"""Round twenty-seven: a review of this session's source changes (46c7caa..5fb0b50):
``preprocess.collapse_tables``, ``step.offset_arg``/``check_counts_fit`` (chain links too),
a window's halo rows given beside it (``Source.beside``, ``halo.Pads``/``rows_around``) as
conveyor.dask's ``_map_chunk``, ``_stream_range`` and ``RangeSink`` use them, and
``typedefs._top_level``/``_opens_template``, ``signature._pointer_typedefs``/``_pointee``,
``_EXT_VECTOR``.

Method (scripts kept out of the repository, under /tmp/r27rev): 980 seeded ``map_blocks``
calls (kernels of one and two inputs, writing and returning callables; 1 to 33 rows of 1 to
3 columns; uneven, zero-size and one-row chunks, chunked apart per input; halo 0 to 6; every
boundary name and constants; small ``block_bytes``), 900 on the synchronous scheduler and 80
on a two-worker ``LocalCluster``, each against one local ``cv.stream`` and NumPy's
``np.pad``; about 300 ``conveyor.dask.stream`` file streams on a three-worker cluster
(``.npy`` and ``cv.raw`` with a header, float32 and int64, 0 to 30 rows, halo 0 to 8 so that
ranges are often shorter than the halo, outputs and ``reduce=`` sum/min/max, small
``block_bytes``) against a local stream and NumPy; offset parameters of every integer type
(typedef'd, qualified) in single kernels, two-link chains and a stream over both PoCL
devices, with first_row from -(2**31)-5 to 2**40, against NumPy; 3,000 generated parameter
lists (round 26's generator, new seeds) and 22 hand-written ones (shifts, comparisons,
braces, ``->``, attributes, array bounds, template and default arguments) read raw and
preprocessed by 46c7caa and today; sources with long tables (CRLF, CR and LF line endings,
``__LINE__`` and ``__COUNTER__`` after them, a table as a macro argument, inside comments,
after a line continuation) read with and without ``collapse_tables``.

Found (each a strict xfail asserting the right behaviour, seen failing on the code before
its fix, and a plain test since; the third is refused as a vector of unknown width now):

- **Regression, wrong answer with no error**: ``conveyor.dask.stream(..., halo=h)`` over a
  bool file read through a ``bool*`` parameter gives the rows at each worker's seam the
  range's own edge row as their halo instead of the neighbour's rows (outputs and
  ``reduce=`` both). ``validate.guard_bools`` wraps the worker's ``FileSource`` in an
  ``io.BoolChecked``, which does not carry the inner source's ``beside``, so ``halo.Pads``
  pads the range as if it were the whole file. 46c7caa streamed the margin rows and gave the
  right output (it refused ``reduce=`` with a halo).
- **Regression, false refusal with a misleading message**: ``collapse_tables`` keeps a cut
  table's ``\\n`` only; a source with CR line endings (``\\r`` alone, which pcpp and clang
  count as line breaks) loses the table's lines, so ``__LINE__`` in an ``#if`` after it
  chooses another branch than the compiler does: ``real`` read as float where clang built
  double, and the size check refuses the kernel, blaming "a macro the compiler predefines".
  46c7caa read double and built it.
- **Misread, misleading refusal**: ``_EXT_VECTOR`` now matches a prefix of a width
  expression, ``ext_vector_type((4) * 2)`` read as 4 lanes; the size check refuses it,
  blaming "a macro the compiler predefines" (46c7caa read a scalar, with the same blame).

Held: every map_blocks and file-stream case above agreed with the local stream and NumPy
(but for the bool family); the offsets gave NumPy's values or were refused before any block,
never a false refusal; the 3,000 parameter lists read the same (or right where 46c7caa was
wrong) raw and preprocessed; of the hand-written ones only a CUDA default argument with a
comparison at the top level (``int s = A < B, float* y``) still merges the parameters after
it, as 46c7caa did (not a regression).
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

# Halo 1: rows i-1, i, i+1 weighted 1, 2, 4 (bool and uchar inputs).
SRC = """
__kernel void bsten(__global const bool* x, __global int* y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (int)x[i] + 2 * (int)x[i + 1] + 4 * (int)x[i + 2];
}
__kernel void usten(__global const uchar* x, __global int* y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (int)x[i] + 2 * (int)x[i + 1] + 4 * (int)x[i + 2];
}
__kernel void lsten(__global const long* x, __global long* y, int h, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) {
        long s = 0;
        for (int k = 0; k <= 2 * h; k++) s += (long)(k + 1) * x[i + (ulong)k];
        y[i] = 3 * s + (long)((offset + i) % 5);
    }
}
"""
BITS = np.array([1, 0, 0, 1, 1, 0, 1, 0, 0, 0, 1, 1], bool)


@pytest.fixture(scope="module")
def device():
    return cv.device(SPEC)


@pytest.fixture(scope="module")
def client():
    """Two in-process workers of one thread each: the one cluster of this file."""
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                       dashboard_address=":0", silence_logs=50)
    with cluster, distributed.Client(cluster, set_as_default=False) as c:
        c.wait_for_workers(2, timeout=60)
        yield c


def _bits_reference(x: np.ndarray) -> np.ndarray:
    p = np.pad(x.astype(np.int32), 1, mode="edge")
    return p[:-2] + 2 * p[1:-1] + 4 * p[2:]


# -- wrong answers ------------------------------------------------------------------------------
def test_a_bool_file_through_a_bool_pointer_gets_its_neighbours_rows_as_halo(client, device,
                                                                            tmp_path):
    np.save(tmp_path / "x.npy", BITS)
    want = _bits_reference(BITS)
    local = cv.stream(device.compile(SRC, "bsten"), [str(tmp_path / "x.npy")],
                      [np.int32], halo=1, device=device).outputs[0]
    np.testing.assert_array_equal(local, want)  # one local stream is right
    k = cvd.kernel(SRC, "bsten")
    report = cvd.stream(k, [str(tmp_path / "x.npy")], [str(tmp_path / "y.npy")], halo=1,
                        client=client, device=SPEC)
    assert [r["rows"] for r in report.ranges] == [(0, 6), (6, 12)]
    total = cvd.stream(k, [str(tmp_path / "x.npy")], reduce="sum", halo=1, client=client,
                       device=SPEC).result
    # Today: [3 1 4 6 3 1 3 1 0 4 6 7] (row 5 padded as row 5, row 6 as row 6), sum 39.
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), want)
    assert total == want.sum()


# -- false refusals and misleading messages ---------------------------------------------------
def test_a_table_with_cr_line_endings_keeps_its_lines_for_line_in_an_if(device):
    table = ",\r".join(str(i) for i in range(1200))  # > TABLE_CHARS: cut before pcpp
    src = ("__constant int t[] = {" + table + "};\r#if __LINE__ > 50\rtypedef double real;\r"
           "#else\rtypedef float real;\r#endif\r"
           "__kernel void k(__global const real* x, __global real* y, ulong offset, ulong n) {\r"
           "    ulong i = get_global_id(0); if (i < n) y[i] = x[i] * 2 + t[i]; }\r")
    # Today: InputError at the build, "conveyor read its type real as 4 bytes (float), but
    # the compiler's sizeof(real) or type differs: ... a macro the compiler predefines".
    # 46c7caa read double (pcpp counts a lone CR as a line break, as clang does).
    kernel = device.compile(src, "k")
    assert kernel.params[0].dtype == np.float64
    got = cv.stream(kernel, [np.arange(5, dtype=np.float64)], [np.float64],
                    device=device).outputs[0]
    np.testing.assert_array_equal(got, 3 * np.arange(5, dtype=np.float64))


def test_a_vector_width_expression_is_refused_not_blamed_on_a_macro(device):
    src = """typedef float vT __attribute__((ext_vector_type((4) * 2)));
__kernel void k(__global const float* x, __global float* y, vT s, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] + s.s0; }"""
    # ext_vector_type((8)) is read as 8 lanes and refused as "a vector passed by value"; a
    # width conveyor does not evaluate is a vector of unknown width: refused by value too
    # (the compile itself no longer blames "a macro the compiler predefines").
    with pytest.raises(cv.InputError, match="vector passed by value|does not know this type"):
        kernel = device.compile(src, "k")
        cv.stream(kernel, [np.ones(4, np.float32)], [np.float32],
                  args=[np.arange(8, dtype=np.float32)], device=device)


# -- guards -------------------------------------------------------------------------------------
def test_guard_a_uchar_file_of_the_same_bits_streams_across_the_seam(client, tmp_path):
    """guard: the same data and kernel read as uchar (no BoolChecked wrapper): each worker's
    halo is its neighbour's rows, output and sum."""
    np.save(tmp_path / "x.npy", BITS.astype(np.uint8))
    want = _bits_reference(BITS)
    k = cvd.kernel(SRC, "usten")
    cvd.stream(k, [str(tmp_path / "x.npy")], [str(tmp_path / "y.npy")], halo=1,
               client=client, device=SPEC)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), want)
    assert cvd.stream(k, [str(tmp_path / "x.npy")], reduce="sum", halo=1, client=client,
                      device=SPEC).result == want.sum()


@pytest.mark.parametrize("op", ["sum", "min", "max", None])
def test_guard_file_ranges_shorter_than_the_halo(client, device, tmp_path, op):
    """guard: 3 rows on two workers (ranges of 1 and 2 rows), halo 5 (each range's halo
    reaches past the other range and past the file's ends), a header offset: outputs and
    reductions equal one local stream and np.pad's edge rows."""
    x = np.array([7, -3, 11], np.int64)
    (tmp_path / "x.raw").write_bytes(b"HEADER!!" + x.tobytes())
    h = 5
    p = np.pad(x, h, mode="edge")
    want = 3 * sum((k + 1) * p[k : k + 3] for k in range(2 * h + 1)) + np.arange(3) % 5
    src = cv.raw(tmp_path / "x.raw", np.int64, (3,), offset=8)
    k = cvd.kernel(SRC, "lsten")
    args = (np.int32(h),)
    if op is None:
        report = cvd.stream(k, [src], [str(tmp_path / "y.npy")], args=args, halo=h,
                            client=client, device=SPEC)
        assert sorted(r["rows"] for r in report.ranges) == [(0, 1), (1, 3)]
        np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), want)
        return
    got = cvd.stream(k, [src], reduce=op, args=args, halo=h, client=client,
                     device=SPEC).result
    local = cv.stream(device.compile(SRC, "lsten"), [x], reduce=op, args=args, halo=h,
                      device=device).result
    assert got == local == getattr(np, op)(want)
