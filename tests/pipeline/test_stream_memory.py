"""Memory: a stream of an input many times ``memory_limit`` stays within the limit, on the
report's figure and on the device pool's own peak."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from streamkit import add_reference, data, kernel

import conveyor as cv
from conveyor.memory.pool import device_bin
from conveyor.pipeline.plan import ArraySpec, make_plan

LIMIT = 1 << 20
ZERO_COPY = pytest.mark.parametrize("zero_copy", [False, None], ids=["copying", "auto"])


def _inputs(dtype=np.float32, shape=None):
    shape = shape or (8 * LIMIT // np.dtype(dtype).itemsize,)
    return data(shape, dtype, 1), data(shape, dtype, 2)


@ZERO_COPY
def test_peak_device_bytes_stay_within_the_limit(device, zero_copy):
    a, b = _inputs()
    c = np.empty_like(a)
    report = cv.stream(kernel(device, "add"), [a, b], [c], device=device,
                       memory_limit=LIMIT, zero_copy=zero_copy)
    assert a.nbytes == 8 * LIMIT
    assert report.peak_device_bytes <= LIMIT
    np.testing.assert_array_equal(c, add_reference(a, b))


@ZERO_COPY
def test_device_pool_peak_stays_within_the_limit(device, zero_copy):
    a, b = _inputs()
    device.memory_pool.reset_peak()
    before = device.memory_pool.stats().in_use_bytes
    cv.stream(kernel(device, "add"), [a, b], [np.empty_like(a)], device=device,
              memory_limit=LIMIT, zero_copy=zero_copy)
    assert device.memory_pool.stats().peak_in_use_bytes - before <= LIMIT


def test_plan_picks_blocks_that_fit(device):
    a, b = _inputs()
    report = cv.stream(kernel(device, "add"), [a, b], [np.empty_like(a)], device=device,
                       memory_limit=LIMIT, depth=3, zero_copy=False)
    assert report.blocks > 1
    assert 3 * 3 * report.block_rows * a.itemsize <= LIMIT


@ZERO_COPY
@pytest.mark.parametrize("row_shape", [(), (4,)], ids=["1d", "2d"])
def test_kernel_reduction_stays_within_the_limit(device, zero_copy, row_shape):
    x = data((8 * LIMIT // 4 // max(row_shape or (1,)), *row_shape), np.int32, 3)
    device.memory_pool.reset_peak()
    before = device.memory_pool.stats().in_use_bytes
    report = cv.stream(kernel(device, "ident", np.int32), [x], reduce="sum", device=device,
                       memory_limit=LIMIT, zero_copy=zero_copy)
    assert report.peak_device_bytes <= LIMIT
    assert device.memory_pool.stats().peak_in_use_bytes - before <= LIMIT
    assert int(report.result) == int(x.sum(dtype=np.int64))


def test_block_bytes_that_overflow_the_limit_is_an_input_error(device):
    a, b = _inputs()
    with pytest.raises(cv.InputError, match="memory limit"):
        cv.stream(kernel(device, "add"), [a, b], [np.empty_like(a)], device=device,
                  memory_limit=LIMIT, block_bytes=LIMIT, zero_copy=False)


def test_pinned_arrays_return_to_their_pool_after_a_stream(device):
    a, b = _inputs(shape=(50_000,))
    pa, pc = cv.pinned.asarray(a, device=device), cv.pinned.empty_like(a, device=device)
    cv.stream(kernel(device, "add"), [pa, b], [pc], device=device, block_bytes=40_000,
              zero_copy=False)
    np.testing.assert_array_equal(pc, add_reference(a, b))
    del pa, pc
    gc.collect()
    assert device.pinned_pool.stats().in_use_bytes == 0


# -- depth and block count (issue 13 item 4) --------
def test_depth_is_capped_at_the_block_count(device):
    # depth=10**6 on 1,000 elements made 10**6 slots (781 MiB of device memory, minutes).
    a = data((1000,), np.float32, 4)
    c = np.empty_like(a)
    report = cv.stream(kernel(device, "scale"), [a], [c], device=device, args=(np.float32(2),),
                       depth=10**6, zero_copy=False)
    assert report.blocks == report.depth == 1
    assert report.peak_device_bytes == 2 * device_bin(a.nbytes)
    np.testing.assert_array_equal(c, a * np.float32(2))


def test_depth_is_capped_at_the_block_count_of_a_small_block(device):
    a = data((1000,), np.float32, 5)
    c = np.empty_like(a)
    report = cv.stream(kernel(device, "scale"), [a], [c], device=device, args=(np.float32(2),),
                       depth=50, block_bytes=400, zero_copy=False)
    assert (report.blocks, report.depth) == (10, 10)
    np.testing.assert_array_equal(c, a * np.float32(2))


def test_plan_makes_its_blocks_on_demand():
    # iterate(length=2**50) built all 2**26 blocks up front (50 s) before a MemoryError.
    spec = ArraySpec((2**50,), np.dtype(np.float32))
    plan = make_plan((spec,), (), depth=3, block_bytes=None, memory_limit=None, halo=0,
                     global_mem_bytes=2**34, max_alloc_bytes=2**32)
    blocks = plan.blocks()
    assert len(blocks) == plan.block_count == 2**50 // plan.block_rows
    assert blocks[1].start == plan.block_rows
    assert blocks[-1].stop == 2**50
    assert [b.index for b in blocks[2:4]] == [2, 3]
    assert next(iter(blocks)).start == 0


def test_a_huge_iterate_length_fails_at_the_end_of_its_chunks(device):
    chunks = (np.ones(1000, np.float32) for _ in range(3))
    with pytest.raises(cv.InputError, match="ended after 3000 rows but length="):
        cv.stream(kernel(device, "ident"), [cv.iterate(chunks, length=2**50)], reduce="sum",
                  device=device, block_bytes=4000)
