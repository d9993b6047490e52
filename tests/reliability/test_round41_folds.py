"""Round forty-one, folds: reductions and outputs of other lengths, taken as numbers.

Checked against NumPy on many inputs (fuzz scripts under /tmp, not kept): ``reduce="sum" |
"min" | "max"`` of kernels over char..ulong, float, double and bool at their types' edges
(int64/uint64 sums that wrap, -0.0 beside +0.0, NaN and +-inf in any block, subnormals),
0 to 1000 elements, blocks of 1 to 3 elements, one device, two devices (both schedules),
``conveyor.dask.reduce`` with uneven and empty chunks and ``conveyor.dask.stream`` over files:
every answer NumPy's, of NumPy's type. Callables' partials of NumPy scalars, 0-d arrays,
lists, tuples, named tuples, Python ints past int64, Fractions, Decimals, float16, bools,
dates, over one device, two and Dask. ``cv.rows`` ratios (1, 1), (3, 7), (7, 3), (2, 4),
(1, 13), (13, 1)... with 2-D rows and row shapes, halos of every boundary, ``first_row``
negative and positive, ``cv.iterate`` cut anywhere, two devices, chains (with a reduction
beside), callables and chain links with q past the 64-row warm-up, images; ``cv.per_block``
records against ``report.block_ranges`` (also per device). All of that held.

Found (each a strict xfail asserting the right behaviour):

- A reducing callable's partial that is an ndarray of dtype object (Python ints past int64,
  Fractions, sets for a custom ``reduce=f``) is refused as if it were text, with ``"sum"``
  and with any ``f(a, b)``: ``step.partial_of`` refuses kinds ``"OSU"``; the README refuses
  only None and text, the fold takes objects (``fold._numeric``), and a list of the same
  Python ints is folded as exactly such an array.
- A callable's float32 partials are added one by one in float32: 2**24 then 256 partials
  of 1.0 sum to 2**24 (every 1.0 rounds away), where ``np.sum`` of the same partials keeps
  them. The float16 case was fixed in round fifteen (added in float32); float32 was not.
- A 0-d array partial gives a 0-d array as ``report.result`` over one block and a NumPy
  scalar over several (``np.sum`` gives the scalar): the result's type depends on the
  block size (a 0-d array is no dict key, for one).
- An empty input with a ``cv.rows`` output of ratio (1, 10**6) under a 1 MiB
  ``memory_limit`` is refused ("one ring of 3 slots of 1000000 rows needs 25165824 device
  bytes"): the plan sizes a ring of q rows for a stream that has no block.
- A reducing callable that returns None is told "return the block's value (e.g.
  x.sum())": on OpenCL its arrays are PyOpenCL arrays, which have no ``sum`` method.
"""

from __future__ import annotations

import sys
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (
    assert_clean,
    compiled,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
)
from reliakit import (  # noqa: E402
    opencl_c_only as _opencl_callable,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

COPY = """__kernel void cp(__global const {T} *x, __global {T} *y, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i];
}}"""

# Output 0: y[J] = x[J * q / p] (rows of ratio p/q); output 1: the row each came from, as
# offsets say it; output 2: one record per block (offset, n, the block's sum).
RATIO = """__kernel void rk(__global const uint *x, __global uint *y, __global long *z,
    __global long *rec, uint p, uint q, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    ulong outn = n * p / q;
    for (ulong j = i; j < outn; j += n) {
        y[j] = x[j * q / p];
        z[j] = (long)offset + (long)(j * q / p);
    }
    if (i == 0) {
        long s = 0;
        for (ulong k = 0; k < n; k++) s += x[k];
        rec[0] = (long)offset; rec[1] = (long)n; rec[2] = s;
    }
}"""




# -- findings --------------------------------------------------------------------------------

def _big_ints(x, *, queue, offset, n):
    h = x.get()
    return np.array([int(h.sum()) * 2**70, int(h.size)], dtype=object)


def _fractions(x, *, queue, offset, n):
    return np.array([Fraction(int(x.get().sum()), 3)], dtype=object)


@pytest.mark.parametrize("case", ["sum-big-ints", "f-fractions"])
def test_object_array_partials_are_folded_not_refused(device, case):
    """The README refuses a partial that is None or text; np.sum adds object arrays of
    Python ints exactly, and a custom f folds whatever it is given. A list of the same
    ints is folded (as just such an array, inside the fold)."""
    _opencl_callable(device)
    x = np.arange(100, dtype=np.int32)
    if case == "sum-big-ints":
        got = cv.stream(_big_ints, [x], device=device, reduce="sum", block_bytes=40).result
        assert list(got) == [4950 * 2**70, 100]
    else:
        got = cv.stream(_fractions, [x], device=device, reduce=lambda a, b: a + b,
                        block_bytes=40).result
        assert list(got) == [Fraction(4950, 3)]
    assert_clean(device)


def _ones_after_2_24(x, *, queue, offset, n):
    return np.float32(2**24) if offset == 0 else np.float32(n)


def test_float32_partials_of_a_callable_sum_keep_what_np_sum_keeps(device):
    """Blocks of one element: block 0's partial 2**24, each later one 1.0. np.sum of those
    partials gives 16777472 (pairwise); conveyor gives 16777216, as float16 partials did
    before round fifteen (2048 + 1.0 is 2048)."""
    _opencl_callable(device)
    x = np.zeros(257, np.float32)
    partials = np.array([2**24] + [1.0] * 256, np.float32)
    want = np.sum(partials)
    exact = 2**24 + 256
    got = cv.stream(_ones_after_2_24, [x], device=device, reduce="sum", block_bytes=4).result
    assert type(got) is np.float32
    assert abs(float(got) - exact) <= abs(float(want) - exact), (got, want)
    assert_clean(device)


def _zero_d(x, *, queue, offset, n):
    return np.array(x.get().sum(), np.int64)


@pytest.mark.parametrize("op", ["sum", "max"])
def test_zero_d_array_partials_give_one_result_type_at_every_block_size(device, op):
    _opencl_callable(device)
    x = np.arange(10, dtype=np.int32)
    one = cv.stream(_zero_d, [x], device=device, reduce=op).result
    many = cv.stream(_zero_d, [x], device=device, reduce=op, block_bytes=20).result
    assert type(many) is np.int64
    assert type(one) is type(many), (one, many)
    assert one == 45
    assert_clean(device)


def test_an_empty_input_with_a_ratio_of_many_rows_gives_an_empty_output(device):
    """0 rows are a multiple of any q; the same empty stream with ratio (1, 1000) runs."""
    k = compiled(device, COPY.format(T="float"), "cp")
    empty = np.zeros(0, np.float32)
    small = cv.stream(k, [empty], [cv.rows(np.float32, (1, 1000))], device=device,
                      memory_limit="1MiB")
    assert small.outputs[0].shape == (0,) and small.blocks == 0
    report = cv.stream(k, [empty], [cv.rows(np.float32, (1, 10**6))], device=device,
                       memory_limit="1MiB")
    assert report.outputs[0].shape == (0,) and report.blocks == 0
    assert_clean(device)


def _forgets_return(x, *, queue, offset, n):
    x.get()


def test_the_advice_to_a_callable_returning_none_is_code_its_arrays_take(device):
    _opencl_callable(device)
    import pyopencl.array as cla

    with pytest.raises(InputError) as caught:
        cv.stream(_forgets_return, [np.arange(10, dtype=np.float32)], device=device,
                  reduce="sum")
    assert not hasattr(cla.Array, "sum")
    assert "x.sum()" not in str(caught.value), str(caught.value)
    assert_clean(device)


# -- guards ----------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["one", "pair-static", "pair-dynamic", "iterate"])
def test_outputs_of_three_lengths_and_first_row_match_numpy_and_block_ranges(
        device, pair, where):
    """guard: a ratio (7, 3) output, its rows' source offsets and per-block records in one
    stream, first_row=-5, blocks of a few rows: every row NumPy's, every record its block's
    (offset = first_row + start, n, sum), block_ranges tiling the rows."""
    p, q, first_row = 7, 3, -5
    n_rows = q * 23
    x = (np.arange(n_rows, dtype=np.uint32) * 2654435761) % 1000
    kw: dict = {"device": device}
    source: object = x
    if where.startswith("pair"):
        kw = {"device": pair, "schedule": where.split("-")[1]}
    elif where == "iterate":
        source = cv.iterate(iter([x[:5].copy(), x[5:40].copy(), x[40:].copy()]), length=n_rows)
    k = compiled(kw["device"] if where == "one" or where == "iterate" else pair[0], RATIO, "rk")
    report = cv.stream(k, [source], [cv.rows(np.uint32, (p, q)), cv.rows(np.int64, (p, q)),
                                     cv.per_block((3,), np.int64)],
                       args=(p, q), block_bytes=-(-8 * p // q) * 6, first_row=first_row, **kw)
    y, z, rec = report.outputs
    rows_from = np.arange(n_rows * p // q) * q // p
    assert np.array_equal(y, x[rows_from])
    assert np.array_equal(z, first_row + rows_from)
    ranges = report.block_ranges
    assert report.blocks > 3 and rec.shape == (report.blocks, 3) == (len(ranges), 3)
    assert ranges[0, 0] == 0 and ranges[-1, 1] == n_rows
    assert np.array_equal(ranges[1:, 0], ranges[:-1, 1])
    assert np.array_equal(rec[:, 0], ranges[:, 0] + first_row)
    assert np.array_equal(rec[:, 1], ranges[:, 1] - ranges[:, 0])
    assert [int(s) for s in rec[:, 2]] == [int(x[a:b].sum()) for a, b in ranges]
    for d in pair:
        assert_clean(d)


EDGES = {
    np.int64: [2**62, 2**62, 2**62, -1, -(2**63), 7],
    np.uint64: [2**64 - 1, 2**63, 2**63 + 5, 1, 0],
    np.int8: [-128, 127, -1, 0, 127],
    np.float64: [-0.0, 0.0, np.inf, 1.0, -np.inf, np.nan, 5e-324],
    np.float32: [0.0, -0.0, 1e-45, -3.0, 2.0],
}
_C = {np.int64: "long", np.uint64: "ulong", np.int8: "char", np.float64: "double",
      np.float32: "float"}


@pytest.mark.parametrize("dtype", list(EDGES), ids=lambda d: np.dtype(d).name)
def test_kernel_folds_at_the_types_edges_are_numpys_on_every_road(device, pair, dtype):
    """guard: sum/min/max of a type's edges (int64/uint64 sums that wrap, signed zeros,
    NaN and inf in a later block, subnormals) in blocks of 1 and 2 elements, over two
    devices, and through conveyor.dask.reduce with an empty chunk (synchronous scheduler):
    NumPy's value and type (a float sum as float64)."""
    dask = pytest.importorskip("dask")
    da = pytest.importorskip("dask.array")
    cvd = pytest.importorskip("conveyor.dask")
    if device.backend != "opencl":
        pytest.skip("the Dask road here names an OpenCL device")
    x = np.array(EDGES[dtype], dtype)
    src = COPY.format(T=_C[dtype])
    k = compiled(device, src, "cp")
    kp = compiled(pair[0], src, "cp")
    chunks = ((0, 2, len(x) - 2),)
    for op in ("sum", "min", "max"):
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            want = getattr(np, op)(x.astype(np.float64) if op == "sum" and
                                   x.dtype.kind == "f" else x)
            got = [cv.stream(k, [x], device=device, reduce=op, block_bytes=b).result
                   for b in (None, x.itemsize, 2 * x.itemsize)]
            got.append(cv.stream(kp, [x], device=pair, reduce=op,
                                 block_bytes=x.itemsize).result)
            with dask.config.set(scheduler="synchronous"):
                got.append(cvd.reduce(cvd.kernel(src, "cp"), da.from_array(x, chunks=chunks),
                                      op, device=device.spec, block_bytes=x.itemsize
                                      ).compute())
        for result in got:
            assert type(result) is type(want), (op, result, want)
            if np.isnan(want):
                assert np.isnan(result), (op, result)
            else:
                assert result == want and np.signbit(result) == np.signbit(want), (op, result)
    assert_clean(device)
    for d in pair:
        assert_clean(d)
