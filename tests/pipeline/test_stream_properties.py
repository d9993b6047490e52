"""Property tests: ``cv.stream`` equals NumPy exactly over lengths, block sizes, depths, dtypes,
shapes, halos, reductions and pinned/pageable memory, on the copying and zero-copy paths."""

from __future__ import annotations

import operator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from streamkit import DTYPES, add_reference, data, kernel, stencil_reference, to_host

import conveyor as cv

SETTINGS = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
ZERO_COPY = pytest.mark.parametrize("zero_copy", [False, None], ids=["copying", "auto"])

ROWS = st.one_of(
    st.sampled_from([1, 2, 3, 5, 7, 11, 13, 97, 101, 257, 1009]),
    st.integers(1, 3000),
)
ROW_SHAPES = st.sampled_from([(), (1,), (3,), (2, 3)])
SEEDS = st.integers(0, 2**32 - 1)


def _block_bytes(draw: st.DrawFn, rows: int, row_bytes: int, least: int = 1) -> int:
    """``block_bytes`` from one row up to a little past the whole array, not always whole."""
    block_rows = draw(st.integers(least, max(rows, least) + 2))
    return block_rows * row_bytes + draw(st.integers(0, row_bytes - 1))


@st.composite
def maps(draw: st.DrawFn) -> dict:
    dtype = draw(st.sampled_from(DTYPES))
    rows = draw(ROWS)
    row_shape = draw(ROW_SHAPES)
    row_bytes = int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize
    return {
        "dtype": dtype, "shape": (rows, *row_shape), "seed": draw(SEEDS),
        "block_bytes": _block_bytes(draw, rows, row_bytes), "depth": draw(st.integers(1, 4)),
    }  # fmt: skip


@ZERO_COPY
@SETTINGS
@given(case=maps())
def test_map_equals_numpy(device, zero_copy, case):
    dtype, shape = case["dtype"], case["shape"]
    a, b = data(shape, dtype, case["seed"]), data(shape, dtype, case["seed"] + 1)
    c = np.zeros(shape, dtype)
    report = cv.stream(kernel(device, "add", dtype), [a, b], [c], device=device,
                       depth=case["depth"], block_bytes=case["block_bytes"],
                       zero_copy=zero_copy)
    np.testing.assert_array_equal(c, add_reference(a, b))
    assert report.blocks == -(-shape[0] // report.block_rows)


@ZERO_COPY
@SETTINGS
@given(case=maps(), pin=st.tuples(st.booleans(), st.booleans(), st.booleans()))
def test_pinned_and_pageable_arrays_equal_numpy(device, zero_copy, case, pin):
    dtype, shape = case["dtype"], case["shape"]
    a, b = data(shape, dtype, case["seed"]), data(shape, dtype, case["seed"] + 1)
    ins = [cv.pinned.asarray(x, device=device) if p else x
           for x, p in zip((a, b), pin[:2], strict=True)]
    c = cv.pinned.empty_like(a, device=device) if pin[2] else np.empty_like(a)
    cv.stream(kernel(device, "add", dtype), ins, [c], device=device, depth=case["depth"],
              block_bytes=case["block_bytes"], zero_copy=zero_copy)
    np.testing.assert_array_equal(c, add_reference(a, b))


@ZERO_COPY
@SETTINGS
@given(case=maps())
def test_dtype_outputs_are_new_arrays_in_the_report(device, zero_copy, case):
    dtype, shape = case["dtype"], case["shape"]
    a, b = data(shape, dtype, case["seed"]), data(shape, dtype, case["seed"] + 1)
    report = cv.stream(kernel(device, "add", dtype), [a, b], [dtype], device=device,
                       depth=case["depth"], block_bytes=case["block_bytes"],
                       zero_copy=zero_copy)
    (c,) = report.outputs
    assert c.shape == shape and c.dtype == dtype
    np.testing.assert_array_equal(c, add_reference(a, b))


@st.composite
def stencils(draw: st.DrawFn) -> dict:
    dtype = draw(st.sampled_from(DTYPES))
    halo = draw(st.integers(0, 3))
    rows = draw(ROWS)
    cols = draw(st.sampled_from([None, 1, 3]))
    row_bytes = (cols or 1) * dtype.itemsize
    return {
        "dtype": dtype, "halo": halo, "seed": draw(SEEDS), "depth": draw(st.integers(1, 4)),
        "shape": (rows,) if cols is None else (rows, cols),
        "block_bytes": _block_bytes(draw, rows, row_bytes, least=max(halo, 1)),
    }  # fmt: skip


@ZERO_COPY
@SETTINGS
@given(case=stencils())
def test_halo_stencil_equals_edge_padded_numpy(device, zero_copy, case):
    dtype, shape, halo = case["dtype"], case["shape"], case["halo"]
    x = data(shape, dtype, case["seed"])
    y = np.zeros(shape, dtype)
    cols = int(np.prod(shape[1:], dtype=np.int64))
    cv.stream(kernel(device, "sten", dtype), [x], [y], device=device, args=(cols, halo),
              halo=halo, depth=case["depth"], block_bytes=case["block_bytes"],
              zero_copy=zero_copy)
    np.testing.assert_array_equal(y, stencil_reference(x, halo))


@st.composite
def reductions(draw: st.DrawFn, integer_sums: bool = True) -> dict:
    op = draw(st.sampled_from(["sum", "min", "max"]))
    kinds = [d for d in DTYPES if d.kind in "iu"] if op == "sum" else DTYPES
    case = draw(maps())
    dtype = draw(st.sampled_from(kinds))
    rows = case["shape"][0]
    row_bytes = int(np.prod(case["shape"][1:], dtype=np.int64)) * dtype.itemsize
    case.update(op=op, dtype=dtype, block_bytes=_block_bytes(draw, rows, row_bytes))
    return case


def _numpy_reduce(op: str, x: np.ndarray):
    if op == "sum":
        return int(x.sum(dtype=np.uint64 if x.dtype.kind == "u" else np.int64))
    return x.min() if op == "min" else x.max()


@ZERO_COPY
@SETTINGS
@given(case=reductions())
def test_kernel_reduction_equals_numpy(device, zero_copy, case):
    dtype, op = case["dtype"], case["op"]
    x = data(case["shape"], dtype, case["seed"])
    report = cv.stream(kernel(device, "ident", dtype), [x], reduce=op, device=device,
                       depth=case["depth"], block_bytes=case["block_bytes"],
                       zero_copy=zero_copy)
    expected = _numpy_reduce(op, x)
    assert (int(report.result) if op == "sum" else report.result) == expected


def _min_max(x, queue, offset, n):
    host = to_host(x, queue)
    return (host.min(), host.max())


def _combine_min_max(p, q):
    return (min(p[0], q[0]), max(p[1], q[1]))


@ZERO_COPY
@SETTINGS
@given(case=maps())
def test_callable_reduction_with_user_combine_equals_numpy(device, zero_copy, case):
    x = data(case["shape"], case["dtype"], case["seed"])
    report = cv.stream(_min_max, [x], reduce=_combine_min_max, device=device,
                       depth=case["depth"], block_bytes=case["block_bytes"],
                       zero_copy=zero_copy)
    assert report.result == (x.min(), x.max())


@ZERO_COPY
@SETTINGS
@given(case=maps())
def test_callable_builtin_sum_equals_numpy(device, zero_copy, case):
    x = data(case["shape"], case["dtype"], case["seed"])

    def block_sum(x, queue, offset, n):
        return to_host(x, queue).astype(np.int64).sum()

    report = cv.stream(block_sum, [x], reduce="sum", device=device, depth=case["depth"],
                       block_bytes=case["block_bytes"], zero_copy=zero_copy)
    assert report.result == x.astype(np.int64).sum()


@ZERO_COPY
@SETTINGS
@given(case=maps())
def test_callable_partials_combine_in_block_order(device, zero_copy, case):
    x = data(case["shape"], case["dtype"], case["seed"])
    row_items = int(np.prod(case["shape"][1:], dtype=np.int64))

    def where(x, queue, offset, n):
        return [(offset, n)]

    report = cv.stream(where, [x], reduce=operator.add, device=device, depth=case["depth"],
                       block_bytes=case["block_bytes"], zero_copy=zero_copy)
    step = report.block_rows
    rows = x.shape[0]
    expected = [(s * row_items, (min(s + step, rows) - s) * row_items)
                for s in range(0, rows, step)]
    assert report.result == expected


@ZERO_COPY
@pytest.mark.parametrize("row_shape", [(), (3,), (2, 3)], ids=["1d", "2d", "3d"])
def test_zero_length_inputs_run_nothing(device, zero_copy, row_shape):
    calls = []
    x = np.zeros((0, *row_shape), np.float32)
    out = np.zeros((0, *row_shape), np.float32)
    before = device.memory_pool.stats(), device.pinned_pool.stats()
    report = cv.stream(lambda *a, **k: calls.append(k), [x], [out, np.int32], device=device,
                       zero_copy=zero_copy)
    assert report.blocks == 0 and calls == []
    assert report.outputs[0] is out
    assert report.outputs[1].shape == (0, *row_shape) and report.outputs[1].dtype == np.int32
    assert (device.memory_pool.stats(), device.pinned_pool.stats()) == before


@ZERO_COPY
def test_zero_length_kernel_reduction_sums_to_zero(device, zero_copy):
    x = np.zeros(0, np.int32)
    report = cv.stream(kernel(device, "ident", np.int32), [x], reduce="sum", device=device,
                       zero_copy=zero_copy)
    assert report.blocks == 0 and report.result == 0
