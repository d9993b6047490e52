"""The eleventh round, helper D: resident tables, per-record outputs (``cv.rows`` ratios and
``cv.per_block``), reductions, halos at the ends, and outputs conveyor allocates for a dtype.
Every answer is compared with NumPy. Each xfail asserts the right behaviour of a bug found
here; the rest are guards (held when tried).

Found (xfail, strict):

- ``cv.resident(a[::2])`` (any table that is not C-contiguous) copies the table when the
  handle is made, and its first stream uploads that copy: a change to ``a`` between making
  the handle and its first stream is never seen, where a contiguous table's first stream
  uploads the values of that moment. Nothing was uploaded before, so no ``refresh()`` should
  be needed.
- ``reduce="sum"`` over a callable's list (or tuple) partials concatenates them (``[a, b] +
  [c, d]``): four blocks of two values gave a list of eight, where ``"min"``/``"max"`` fold
  them element by element as NumPy does.
- Partials of different shapes (``np.bincount`` of each block, whose length follows the
  block's largest value) are broadcast against each other: a first block of zeros, whose
  bincount has one bin, added its count to every bin of the total (1400 in each of five
  bins, against NumPy's 1400, 400, 400, 400, 400), with no error; shapes that do not
  broadcast raise NumPy's raw "operands could not be broadcast together".
- ``reduce="max"`` (and ``"min"``) over Python int partials of ``uint64`` data (``int(h.max())``
  past ``2**63``) failed after the whole stream with NumPy's raw ``OverflowError: Python int
  too large to convert to C long``.
- A ``reduce=f`` that returns None (``a += b`` and a forgotten ``return``) made
  ``report.result`` None, which the README gives for a stream of no elements; or, when ``f``
  is called again with that None, the user's own TypeError about NoneType.
- A float32 kernel ``reduce="sum"`` is a float64 result, but the device fold adds each work
  item's elements in float32: 3001 values of 2**127 summed to inf in one block, and to
  NumPy's float64 sum (5.1e41) with ``block_bytes=1000`` (one element per work item): the
  answer depends on the block size.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import compiled, opencl_c_only, to_host  # noqa: E402

import conveyor as cv  # noqa: E402

LUT = """
__kernel void lut(__global const float *x, __global float *y, __global const float *t,
                  ulong m, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + t[(offset + i) % m];
}
__kernel void lut2(__global const float *x, __global float *y, __global const float *t,
                   __constant float *u, ulong m, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + t[(offset + i) % m] * 10.0f + u[(offset + i) % m];
}
__kernel void hist(__global const uint *x, __global uint *h, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) atomic_inc(&h[x[i] % 4]);
}
"""


def _lut_ref(x: np.ndarray, table: np.ndarray, first: int = 0) -> np.ndarray:
    flat = np.asarray(table).reshape(-1)
    return x + flat[(first + np.arange(len(x))) % len(flat)]


# == 1. resident tables ======================================================================
@pytest.mark.parametrize("layout", ["strided", "fortran"])
def test_a_non_contiguous_handle_uploads_its_values_at_its_first_stream(device, layout):
    opencl_c_only(device)
    x = np.zeros(1000, np.float32)
    if layout == "strided":
        base = np.arange(20, dtype=np.float32)
        table = base[::2]
    else:
        base = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
        table = base
    handle = cv.resident(table)  # nothing uploaded yet
    base[...] = 100  # changed before any stream used the handle
    y = cv.stream(compiled(device, LUT, "lut"), [x], [np.float32],
                  args=(handle, table.size), device=device).outputs[0]
    handle.close()
    np.testing.assert_array_equal(y, _lut_ref(x, np.ascontiguousarray(table)))


def test_guard_a_contiguous_handle_uploads_its_values_at_its_first_stream(device):
    # guard: the contiguous counterpart of the xfail above
    opencl_c_only(device)
    x = np.zeros(1000, np.float32)
    table = np.arange(10, dtype=np.float32)
    with cv.resident(table) as handle:
        table[:] = 7
        y = cv.stream(compiled(device, LUT, "lut"), [x], [np.float32], args=(handle, 10),
                      device=device).outputs[0]
    np.testing.assert_array_equal(y, np.full(1000, 7, np.float32))


def test_guard_a_table_changed_between_chunks_is_seen_by_the_next_stream(device):
    # guard: a table is uploaded once, before the first block: a cv.iterate generator that
    # changes it between chunks does not change the stream it feeds; the next stream (a plain
    # array, and a handle after refresh()) sees the new values.
    opencl_c_only(device)
    x = np.arange(1000, dtype=np.float32)
    k = compiled(device, LUT, "lut")
    table = np.arange(7, dtype=np.float32)

    def chunks():
        table[:] = 1  # before the first chunk: the stream's table
        for i in range(0, 1000, 100):
            yield x[i:i + 100]
            table[:] = 50 + i

    y = cv.stream(k, [cv.iterate(chunks(), length=1000)], [np.float32], args=(table, 7),
                  device=device, block_bytes=400).outputs[0]
    np.testing.assert_array_equal(y, x + 1)
    y = cv.stream(k, [x], [np.float32], args=(table, 7), device=device,
                  block_bytes=400).outputs[0]
    np.testing.assert_array_equal(y, x + 950)
    with cv.resident(table) as handle:
        cv.stream(k, [x], [np.float32], args=(handle, 7), device=device)
        table[:] = 3
        handle.refresh()
        y = cv.stream(k, [x], [np.float32], args=(handle, 7), device=device).outputs[0]
    np.testing.assert_array_equal(y, x + 3)
    strided = np.arange(20, dtype=np.float32)  # a plain strided table, changed between streams
    first = cv.stream(k, [x], [np.float32], args=(strided[::2], 10), device=device).outputs[0]
    strided[:] = 4
    second = cv.stream(k, [x], [np.float32], args=(strided[::2], 10), device=device).outputs[0]
    np.testing.assert_array_equal(first, _lut_ref(x, np.arange(0, 20, 2, dtype=np.float32)))
    np.testing.assert_array_equal(second, x + 4)


@pytest.mark.parametrize("zero_copy", [None, False])
def test_guard_a_table_viewing_the_in_place_array_or_an_output_holds_the_old_values(
        device, zero_copy):
    # guard: the table is uploaded before any block writes, so a table that is a view of an
    # in-place input (or of an output) reads the values from before the stream (NumPy's
    # answer).
    opencl_c_only(device)
    k = compiled(device, LUT, "lut")
    old = np.arange(1000, dtype=np.float32)
    a = old.copy()
    cv.stream(k, [a], [a], args=(a[::-1][:10], 10), device=device, block_bytes=400,
              zero_copy=zero_copy)
    np.testing.assert_array_equal(a, _lut_ref(old, old[::-1][:10]))
    c = np.full(1000, 3, np.float32)
    cv.stream(k, [old], [c], args=(c[500:510], 10), device=device, block_bytes=400,
              zero_copy=zero_copy)
    np.testing.assert_array_equal(c, old + 3)


def test_guard_memmap_large_and_repeated_tables(device, tmp_path):
    # guard: a read-only memmap table; a table 750 times a block; one array (or handle) for
    # two pointer parameters, __global const and __constant.
    opencl_c_only(device)
    x = np.arange(1000, dtype=np.float32)
    k, k2 = compiled(device, LUT, "lut"), compiled(device, LUT, "lut2")
    np.save(tmp_path / "t.npy", np.arange(5, dtype=np.float32) * 2)
    mm = np.load(tmp_path / "t.npy", mmap_mode="r")
    y = cv.stream(k, [x], [np.float32], args=(mm, 5), device=device).outputs[0]
    np.testing.assert_array_equal(y, _lut_ref(x, mm))
    big = np.arange(300_000, dtype=np.float32)
    y = cv.stream(k, [x], [np.float32], args=(big, 300_000), device=device,
                  block_bytes=400).outputs[0]
    np.testing.assert_array_equal(y, _lut_ref(x, big))
    t = np.arange(6, dtype=np.float32)
    want = x + t[np.arange(1000) % 6] * 11
    with cv.resident(t) as handle:
        for args in ((t, t, 6), (handle, handle, 6), (handle, t, 6)):
            y = cv.stream(k2, [x], [np.float32], args=args, device=device).outputs[0]
            np.testing.assert_array_equal(y, want)
        assert handle.users == 0


def test_guard_tables_no_device_buffer_holds_are_refused_naming_the_parameter(device, tmp_path):
    # guard: a path, a file input, a list, a scalar, an empty array, the wrong dtype or byte
    # order: InputErrors that name the parameter, before any work.
    opencl_c_only(device)
    x = np.arange(100, dtype=np.float32)
    k = compiled(device, LUT, "lut")
    np.save(tmp_path / "t.npy", np.arange(3, dtype=np.float32))
    for bad in (str(tmp_path / "t.npy"), cv.npy(tmp_path / "t.npy"), [1.0, 2.0],
                np.float32(3), np.zeros(0, np.float32), np.arange(3, dtype=">f4"),
                np.arange(3, dtype=np.float64)):
        y = np.zeros_like(x)
        with pytest.raises(cv.InputError, match="'t'"):
            cv.stream(k, [x], [y], args=(bad, 3), device=device)
        assert not y.any()


def test_guard_a_writable_table_that_is_also_the_input_counts_the_old_input(device):
    # guard: the input is read before the table is copied back into the same array.
    opencl_c_only(device)
    hist = np.zeros(1000, np.uint32)
    hist[::3] = 1
    want = np.zeros(1000, np.uint32)
    want[:4] = np.bincount(hist % 4, minlength=4)
    want += hist
    handle = cv.resident(hist, writable=True)
    cv.stream(compiled(device, LUT, "hist"), [hist], args=(handle,), device=device,
              block_bytes=400)
    handle.close()
    np.testing.assert_array_equal(hist, want)


# == 2. reductions ===========================================================================
def _blocks(x):
    return [x[i:i + 250] for i in range(0, len(x), 250)]


@pytest.mark.parametrize("kind", [list, tuple])
def test_sum_of_list_partials_adds_them_element_by_element(device, kind):
    x = np.arange(1000, dtype=np.float32)

    def two(a, queue, offset, n):
        h = to_host(a, queue)
        return kind([float(h.sum()), float(h.max())])

    want = np.sum([[b.sum(), b.max()] for b in _blocks(x)], axis=0)
    for op in ("min", "max"):  # folded element by element already
        got = cv.stream(two, [x], reduce=op, device=device, block_bytes=1000).result
        assert np.asarray(got).tolist() == getattr(np, op)(
            [[b.sum(), b.max()] for b in _blocks(x)], axis=0).tolist()
    got = cv.stream(two, [x], reduce="sum", device=device, block_bytes=1000).result
    assert np.asarray(got).tolist() == want.tolist()


@pytest.mark.parametrize("op", ["sum", "min", "max"])
def test_partials_of_different_shapes_are_refused_not_broadcast(device, op):
    x = np.zeros(3000, np.int32)
    x[1000:] = np.arange(2000) % 5  # block 0 is all zeros: its bincount has one bin

    def counts(a, queue, offset, n):
        return np.bincount(to_host(a, queue))

    with pytest.raises(cv.InputError, match="shape"):
        cv.stream(counts, [x], reduce=op, device=device, block_bytes=4000)
    y = np.arange(3000, dtype=np.int32) % 7
    y[:1000] %= 3  # shapes (3,) then (7,): no broadcast
    with pytest.raises(cv.InputError, match="shape"):
        cv.stream(counts, [y], reduce=op, device=device, block_bytes=4000)


def test_guard_partials_of_one_shape_fold_as_numpy(device):
    # guard: the same bincounts with minlength: equal to NumPy's
    x = np.zeros(3000, np.int32)
    x[1000:] = np.arange(2000) % 5
    got = cv.stream(lambda a, queue, offset, n: np.bincount(to_host(a, queue), minlength=5),
                    [x], reduce="sum", device=device, block_bytes=4000).result
    assert got.tolist() == np.bincount(x).tolist()


@pytest.mark.parametrize("op", ["min", "max"])
def test_min_max_of_python_int_partials_past_int64(device, op):
    x = np.arange(1000, dtype=np.uint64) + np.uint64(2**64 - 2000)

    def extreme(a, queue, offset, n):
        return int(getattr(to_host(a, queue), op)())  # a Python int, up to 2**64 - 1

    got = cv.stream(extreme, [x], reduce=op, device=device, block_bytes=800).result
    assert int(got) == int(getattr(np, op)(x))


def test_guard_min_max_of_numpy_uint64_partials_past_int64(device):
    # guard: the same extremes as NumPy scalars fold exactly, in uint64
    x = np.arange(1000, dtype=np.uint64) + np.uint64(2**64 - 2000)
    for op in ("min", "max"):
        got = cv.stream(lambda a, queue, offset, n, op=op: getattr(to_host(a, queue), op)(),
                        [x], reduce=op, device=device, block_bytes=800).result
        assert got == getattr(np, op)(x) and got.dtype == np.uint64


def test_a_reduce_function_that_returns_none_is_an_input_error(device):
    x = np.arange(1000, dtype=np.float32)

    def partial(a, queue, offset, n):
        return np.array([to_host(a, queue).astype(np.float64).sum()])

    def forgot_return(first, second):
        first += second  # no return

    for f in (forgot_return, lambda first, second: None):
        with pytest.raises(cv.InputError, match="None"):
            cv.stream(partial, [x], reduce=f, device=device, block_bytes=1000)


def test_a_float32_kernel_sum_does_not_depend_on_the_block_size(device):
    k = compiled(device, """__kernel void ident(__global const float *x, __global float *r,
        ulong offset, ulong n) { ulong i = get_global_id(0); if (i < n) r[i] = x[i]; }""",
                 "ident")
    x = np.full(3001, 2.0**127, np.float32)  # two of them overflow float32
    want = 3001 * 2.0**127  # exact in float64, in any order: the result is a float64
    got = {bb: cv.stream(k, [x], reduce="sum", device=device, block_bytes=bb).result
           for bb in (1000, None)}
    assert got == {1000: want, None: want}


_C = {"int8": "char", "uint8": "uchar", "int16": "short", "uint16": "ushort",
      "uint32": "uint", "uint64": "ulong", "float32": "float", "float64": "double"}


def _ident(device, dtype):
    t = _C[np.dtype(dtype).name]
    return compiled(device, f"""__kernel void id_{t}(__global const {t} *x, __global {t} *r,
        ulong offset, ulong n) {{ ulong i = get_global_id(0); if (i < n) r[i] = x[i]; }}""",
                    f"id_{t}")


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16", "uint32", "uint64"])
def test_guard_kernel_reductions_of_narrow_and_unsigned_extremes_are_numpys(device, dtype):
    # guard (round ten kept int32, int64 and uint8 near their limits): one element, the
    # minimum alone, the maximum alone, both mixed; several blocks and one.
    info = np.iinfo(dtype)
    mixed = np.full(3001, info.max, dtype)
    mixed[::5] = info.min
    cases = [np.array([info.max], dtype), np.full(3001, info.min, dtype),
             np.full(3001, info.max, dtype), mixed]
    k = _ident(device, dtype)
    for x in cases:
        for op in ("sum", "min", "max"):
            for bb in (1000, None):
                with warnings.catch_warnings():  # a uint64 sum wraps, as np.sum's does
                    warnings.simplefilter("ignore", RuntimeWarning)
                    got = cv.stream(k, [x], reduce=op, device=device, block_bytes=bb).result
                    want = getattr(np, op)(x)
                assert got == want and got.dtype == want.dtype, (op, bb, len(x), got, want)


def test_guard_reductions_of_one_element_and_of_none(device):
    # guard: one element: itself (a float sum in float64); none: 0 for sum, InputError for
    # min/max, with a kernel and with a callable.
    for dtype in ("float32", "float64", "int8", "uint64"):
        k = _ident(device, dtype)
        one = np.array([5], dtype)
        assert cv.stream(k, [one], reduce="sum", device=device).result == 5
        for op in ("min", "max"):
            got = cv.stream(k, [one], reduce=op, device=device).result
            assert got == 5 and got.dtype == np.dtype(dtype)
            with pytest.raises(cv.InputError, match="empty"):
                cv.stream(k, [np.zeros(0, dtype)], reduce=op, device=device)
        assert cv.stream(k, [np.zeros(0, dtype)], reduce="sum", device=device).result == 0
    got = cv.stream(lambda a, queue, offset, n: to_host(a, queue).sum(), [np.zeros(0, np.int8)],
                    reduce="sum", device=device).result
    assert got == 0 and got.dtype == np.sum(np.zeros(0, np.int8)).dtype


def test_guard_bool_values_are_counted_by_the_device_fold(device):
    # guard: a kernel writing bool flags for reduce= counts them as np.sum does (refused
    # until session 20), any nonzero byte a True; min/max are bools
    k = compiled(device, """__kernel void flag(__global const float *x, __global bool *r,
        ulong offset, ulong n) { ulong i = get_global_id(0);
        if (i < n) ((__global uchar *)r)[i] = x[i] > 0.5f ? (uchar)(1 + i % 7) : 0; }""",
                 "flag")
    x = (np.arange(100, dtype=np.float32) % 3) / 2
    flags = x > 0.5
    got = cv.stream(k, [x], reduce="sum", device=device, block_bytes=64).result
    assert got == flags.sum() and np.asarray(got).dtype == np.int64
    assert cv.stream(k, [x], reduce="max", device=device).result is np.True_
    assert cv.stream(k, [x], reduce="min", device=device).result is np.False_


def test_guard_kernel_reduction_with_a_halo_folds_only_the_block(device):
    # guard: the values buffer holds the block's n elements, never its halo rows
    k = compiled(device, """__kernel void center(__global const float *x, __global float *r,
        ulong h, ulong offset, ulong n) { ulong i = get_global_id(0); if (i < n) r[i] = x[i + h]; }
        """, "center")
    x = np.arange(1001, dtype=np.float32) - 300
    for h in (1, 3):
        for op in ("sum", "min", "max"):
            for bb in (None, 404):
                got = cv.stream(k, [x], reduce=op, args=(h,), halo=h, device=device,
                                block_bytes=bb).result
                assert got == getattr(np, op)(x.astype(np.float64)), (h, op, bb)


def test_guard_a_callable_reduction_with_an_allocated_output_beside_it(device):
    # guard: the partials fold while the callable fills an output conveyor allocated
    opencl_c_only(device)
    x = np.arange(1000, dtype=np.float32)

    def double_and_sum(a, y, queue, offset, n):
        h = to_host(a, queue)
        y.set(h * 2)
        return h.astype(np.float64).sum()

    report = cv.stream(double_and_sum, [x], [np.float32], reduce="sum", device=device,
                       block_bytes=400)
    assert report.result == x.sum(dtype=np.float64)
    np.testing.assert_array_equal(report.outputs[0], x * 2)


# == 3. per-record outputs ===================================================================
RECORDS = """
__kernel void pool(__global const float *x, __global float *y, __global float *z, ulong cols,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0), rows = n / cols;
    if (i < rows / 3 * cols) {
        ulong r = i / cols, c = i % cols;
        y[i] = x[3 * r * cols + c] + x[(3 * r + 1) * cols + c] + x[(3 * r + 2) * cols + c];
    }
    if (i < rows / 2) {
        float s = 0.0f;
        for (ulong c = 0; c < cols; c++) s += x[2 * i * cols + c] - x[(2 * i + 1) * cols + c];
        z[i] = s + (float)(offset / cols / 2 + i);
    }
}
__kernel void bsum(__global const float *x, __global float *y, ulong offset, ulong n) {
    if (get_global_id(0) == 0) {
        float s = 0.0f;
        for (ulong j = 0; j < n; j++) s += x[j];
        y[0] = s; y[1] = (float)offset; y[2] = (float)n;
    }
}
__kernel void hpool(__global const float *x, __global float *y, ulong h, ulong offset,
                    ulong n) {
    ulong i = get_global_id(0);
    if (i < n / 4) {
        float s = 0.0f;
        for (int k = 0; k < 4; k++) s += x[h + 4 * i + k];
        y[i] = s + x[4 * i];
    }
}
"""


@pytest.mark.parametrize("rows,cols", [(6, 1), (6, 3), (1200, 5), (0, 3)])
def test_guard_two_ratio_outputs_with_odd_blocks_and_iterables(device, rows, cols):
    # guard: ratios 1/3 (2-D rows) and 1/2 (one value per two rows) at once: blocks cut at
    # multiples of 6, odd block_bytes, a short last block, a cv.iterate of 5-row chunks
    x = np.random.default_rng(rows).integers(-50, 50, (rows, cols)).astype(np.float32)
    want_y = x.reshape(-1, 3, cols).sum(axis=1)
    want_z = (x[0::2] - x[1::2]).sum(axis=1) + np.arange(rows // 2)
    k = compiled(device, RECORDS, "pool")
    for bb in (None, cols * 4 * 7, cols * 4 * 13, cols * 4 * 600):
        for source in ("array", "iterate"):
            inp = x if source == "array" else cv.iterate(
                (x[i:i + 5] for i in range(0, rows, 5)), length=rows)
            y, z = cv.stream(k, [inp], [cv.rows(np.float32, ratio=(1, 3), shape=(cols,)),
                                        cv.rows(np.float32, ratio=(1, 2), shape=())],
                             args=(cols,), device=device, block_bytes=bb).outputs
            np.testing.assert_array_equal(y, want_y)
            np.testing.assert_array_equal(z, want_z)


def test_guard_per_block_records_over_odd_blocks(device):
    # guard: one record per block, the short last block's included, equal to its rows
    k = compiled(device, RECORDS, "bsum")
    rng = np.random.default_rng(5)
    for rows in (0, 1, 999, 1001):
        x = rng.integers(-50, 50, rows).astype(np.float32)
        for bb in (12, 400, None):
            report = cv.stream(k, [x], [cv.per_block((3,), np.float32)], device=device,
                               block_bytes=bb)
            want = np.array([[x[a:b].sum(), a, b - a] for a, b in report.block_ranges],
                            np.float32).reshape(-1, 3)
            assert len(report.block_ranges) == report.blocks
            np.testing.assert_array_equal(report.outputs[0], want)


def test_guard_a_ratio_output_with_a_halo(device):
    # guard: pooling by 4 that also reads the halo row before each group, odd block sizes
    k = compiled(device, RECORDS, "hpool")
    x = np.arange(1000, dtype=np.float32) % 13
    for h in (1, 2):
        p = np.pad(x, (h, h), mode="edge")
        want = np.array([p[h + 4 * i:h + 4 * i + 4].sum() + p[4 * i] for i in range(250)],
                        np.float32)
        for bb in (None, 4 * 12, 4 * 100, 4 * 996):
            out = cv.stream(k, [x], [cv.rows(np.float32, ratio=(1, 4))], args=(h,), halo=h,
                            device=device, block_bytes=bb).outputs[0]
            np.testing.assert_array_equal(out, want)


def test_guard_a_callable_returns_ratio_rows_over_odd_blocks(device):
    # guard: a callable returning the block's pooled (1/3) or repeated (2/1) rows
    import pyopencl.array as cla

    if device.backend != "opencl":
        pytest.skip("returns PyOpenCL arrays")
    x = np.arange(3 * 201, dtype=np.float32).reshape(-1, 1).repeat(2, axis=1)

    def pool(a, y, queue, offset, n):
        return cla.to_device(queue, np.ascontiguousarray(
            to_host(a, queue).reshape(-1, 3, 2).sum(axis=1)))

    def repeat(a, y, queue, offset, n):
        return cla.to_device(queue, np.ascontiguousarray(np.repeat(to_host(a, queue), 2, 0)))

    for bb in (None, 8 * 5, 8 * 300):
        got = cv.stream(pool, [x], [cv.rows(np.float32, ratio=(1, 3))], device=device,
                        block_bytes=bb).outputs[0]
        np.testing.assert_array_equal(got, x.reshape(-1, 3, 2).sum(axis=1))
        chunks = cv.iterate((x[i:i + 7] for i in range(0, len(x), 7)), length=len(x))
        got = cv.stream(repeat, [chunks], [cv.rows(np.float32, ratio=(2, 1))], device=device,
                        block_bytes=bb).outputs[0]
        np.testing.assert_array_equal(got, np.repeat(x, 2, axis=0))


# == 4. halos at the ends ====================================================================
_T = {"float32": "float", "float64": "double", "int8": "char", "uint8": "uchar",
      "int16": "short", "uint64": "ulong"}


def _window_ref(x, h, boundary, mul=3):
    pad = [(h, h)] + [(0, 0)] * (x.ndim - 1)
    mode = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}.get(boundary)
    p = np.pad(x, pad, mode=mode) if mode else np.pad(x, pad, constant_values=boundary)
    s = np.zeros_like(x)
    with np.errstate(all="ignore"):
        for k in range(2 * h + 1):  # an order-dependent fold: every halo row in its place
            s = (s * x.dtype.type(mul) + p[k:k + len(x)]).astype(x.dtype)
    return s


def _window(device, dtype):
    t = _T[np.dtype(dtype).name]
    return compiled(device, f"""__kernel void win_{t}(__global const {t} *x, __global {t} *y,
        ulong cols, ulong h, ulong offset, ulong n) {{
        ulong i = get_global_id(0);
        if (i < n) {{ {t} s = 0; for (ulong k = 0; k <= 2 * h; k++) s = ({t})(s * ({t})3 +
            x[i + k * cols]); y[i] = s; }} }}""", f"win_{t}")


@pytest.mark.parametrize("dtype", list(_T))
def test_guard_halos_over_one_row_and_past_the_data_in_every_dtype(device, dtype):
    # guard: 1, 2 and 7 rows (1-D and 2-D), halos 1, 2 and 5 (past the data), each boundary,
    # from an array and from a cv.iterate of one-row chunks, against np.pad
    rng = np.random.default_rng(7)
    d = np.dtype(dtype)
    k = _window(device, d)
    for shape in [(1,), (1, 3), (2,), (7, 2)]:
        if d.kind == "f":
            x = rng.integers(-8, 8, shape).astype(d)
        else:
            info = np.iinfo(d)
            x = rng.integers(info.min, info.max, shape, endpoint=True, dtype=d)
        cols = int(np.prod(shape[1:]))
        for h in (1, 5):
            for boundary in ("nearest", "reflect", "periodic", 1):
                for source in ("array", "iterate"):
                    if source == "iterate" and boundary == "periodic":
                        continue
                    inp = x if source == "array" else cv.iterate(
                        (x[i:i + 1] for i in range(len(x))), length=len(x))
                    y = np.zeros_like(x)
                    cv.stream(k, [inp], [y], args=(cols, h), halo=h, boundary=boundary,
                              device=device)
                    np.testing.assert_array_equal(y, _window_ref(x, h, boundary),
                                                  err_msg=f"{shape} h={h} {boundary} {source}")


def test_guard_iterate_halos_where_the_last_block_is_shorter_than_the_halo(device):
    # guard: 17 rows in blocks of 8 leave a 1-row last block under a halo of 3 or 4; chunks
    # of 1, 3 and 7 rows that do not line up with the blocks
    k = _window(device, np.int16)
    x = np.arange(34, dtype=np.int16).reshape(17, 2)
    for h in (3, 4):
        for chunk in (1, 3, 7):
            for boundary in ("nearest", "reflect", -1):
                y = np.zeros_like(x)
                cv.stream(k, [cv.iterate((x[i:i + chunk] for i in range(0, 17, chunk)),
                                         length=17)], [y], args=(2, h), halo=h,
                          boundary=boundary, device=device, block_bytes=8 * 2 * 2)
                np.testing.assert_array_equal(y, _window_ref(x, h, boundary))


def test_guard_halo_rows_of_bool_half_and_complex_inputs_are_np_pads(device):
    # guard: a callable sees each block with its halo rows exactly as np.pad makes them
    rng = np.random.default_rng(9)
    cases = [rng.random(5) > 0.5, rng.integers(-9, 9, (37, 2)).astype(np.float16),
             (rng.integers(-9, 9, 6) + 1j * rng.integers(-9, 9, 6)).astype(np.complex64)]
    for x in cases:
        cols = int(np.prod(x.shape[1:]))
        for h in (1, 3):
            for boundary in ("nearest", "reflect", "periodic", 1):
                seen = {}

                def grab(a, y, queue, offset, n, seen=seen):
                    seen[offset] = to_host(a, queue).copy()

                cv.stream(grab, [x], [x.dtype], halo=h, boundary=boundary, device=device,
                          block_bytes=x.dtype.itemsize * cols * 4, warmup=False)
                mode = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}.get(
                    boundary)
                pad = [(h, h)] + [(0, 0)] * (x.ndim - 1)
                p = (np.pad(x, pad, mode=mode) if mode else
                     np.pad(x, pad, constant_values=boundary))
                assert sorted(seen) == list(range(0, x.size, 4 * cols))
                for offset, block in seen.items():
                    row = offset // cols
                    assert block.tobytes() == p[row:row + len(block)].tobytes()


# == 5. outputs conveyor allocates ===========================================================
def test_guard_allocated_outputs_of_any_dtype_are_new_distinct_arrays(device):
    # guard: dtypes a kernel cannot declare still make arrays of input 0's rows for a
    # callable; two outputs of one dtype are two arrays; a kernel's mismatch is refused
    opencl_c_only(device)
    x = np.arange(60, dtype=np.float32).reshape(20, 3)

    def fill(a, y, z, queue, offset, n):
        h = to_host(a, queue)
        y.set(np.ascontiguousarray(h.astype(y.dtype)))
        z.set(np.ascontiguousarray((h + 1).astype(z.dtype)))

    for dtype in (np.float16, np.complex64, np.int8, bool, np.uint64):
        y, z = cv.stream(fill, [x], [dtype, dtype], device=device, block_bytes=24).outputs
        assert y.shape == z.shape == x.shape and y.dtype == z.dtype == np.dtype(dtype)
        assert not np.shares_memory(y, z)
        np.testing.assert_array_equal(y, x.astype(dtype))
        np.testing.assert_array_equal(z, (x + 1).astype(dtype))
    with pytest.raises(cv.InputError, match="float64"):
        cv.stream(compiled(device, LUT, "lut"), [x.reshape(-1)], [np.float64],
                  args=(np.ones(2, np.float32), 2), device=device)
