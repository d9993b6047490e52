"""Outputs of other lengths (issue 14 item 2): one record per block (``cv.per_block``) and
row ratios of input 0 (``cv.rows(dtype, ratio=(p, q))``), blocks cut so every block maps to
whole output rows; errors naming the ratio and the length."""

from __future__ import annotations

import numpy as np
import pytest
from streamkit import in_use

import conveyor as cv
from conveyor.errors import InputError

BLOCK_SUM = cv.portable("""
__kernel void block_sum(__global const float *x, __global float *record, ulong offset,
                        ulong n) {
    if (get_global_id(0) == 0) {
        float s = 0.0f;
        for (ulong i = 0; i < n; i++) s += x[i];
        record[0] = s; record[1] = (float)offset; record[2] = (float)n;
    }
}
""")
POOL = cv.portable("""
__kernel void pool4(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n / 4) y[i] = x[4 * i] + x[4 * i + 1] + x[4 * i + 2] + x[4 * i + 3];
}
__kernel void twice(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { y[2 * i] = x[i]; y[2 * i + 1] = -x[i]; }
}
""")


@pytest.mark.parametrize("zero_copy", [False, None])
def test_per_block_records_and_the_rows_each_covered(device, zero_copy):
    k = device.compile(BLOCK_SUM, "block_sum")
    x = (np.arange(10_000) % 5).astype(np.float32)
    report = cv.stream(k, [x], [cv.per_block((3,), np.float32)], device=device,
                       block_bytes=4 * 1024, zero_copy=zero_copy)
    records = report.outputs[0]
    ranges = report.block_ranges
    assert records.shape == (report.blocks, 3) and ranges.shape == (report.blocks, 2)
    assert ranges[0, 0] == 0 and ranges[-1, 1] == len(x)
    assert (ranges[1:, 0] == ranges[:-1, 1]).all()
    expected = np.array([[x[a:b].sum(), a, b - a] for a, b in ranges], np.float32)
    np.testing.assert_array_equal(records, expected)
    assert in_use(device) == (0, 0)


@pytest.mark.parametrize("block_bytes", [4 * 1001, 4 * 4096])
def test_a_ratio_of_one_in_four_pools_whole_groups(device, block_bytes):
    k = device.compile(POOL, "pool4")
    x = np.arange(8192 * 3, dtype=np.float32) % 11
    report = cv.stream(k, [x], [cv.rows(np.float32, ratio=(1, 4))], device=device,
                       block_bytes=block_bytes)
    assert report.block_rows % 4 == 0  # 1001 rows asked: cut at a multiple of 4
    np.testing.assert_array_equal(report.outputs[0], x.reshape(-1, 4).sum(axis=1))


def test_a_ratio_of_two_up_samples(device):
    k = device.compile(POOL, "twice")
    x = np.arange(5000, dtype=np.float32)
    report = cv.stream(k, [x], [cv.rows(np.float32, ratio=(4, 2))], device=device,
                       block_bytes=4 * 700)
    np.testing.assert_array_equal(report.outputs[0], np.stack([x, -x], axis=1).reshape(-1))


def test_callables_get_and_return_blocks_of_the_output_length(device):
    if device.backend != "opencl":
        pytest.skip("PyOpenCL arrays in the callable")
    x = np.arange(4000, dtype=np.float32)
    seen = []

    def compute(x, y, *, queue, offset, n):
        seen.append(y.shape)
        return x[: len(x) // 2] * 2  # the first half of each block, doubled

    report = cv.stream(compute, [x], [cv.rows(np.float32, ratio=(1, 2))], device=device,
                       block_bytes=4 * 1000)
    expected = np.concatenate([x[a : a + (b - a) // 2] * 2 for a, b in report.block_ranges])
    np.testing.assert_array_equal(report.outputs[0], expected)
    assert set(seen[1:]) == {(500,)}


@pytest.mark.parametrize(("output", "halo", "message"), [
    ("ratio", 0, r"ratio=\(1, 4\) but input 0 has 1001 rows, not a multiple of 4"),
    ("per_block", 2, r"per-block output with halo=2"),
    ("bad-ratio", 0, r"ratio=\(0, 4\).*two positive ints"),
])
def test_shapes_that_cannot_work_are_input_errors_before_any_work(device, output, halo,
                                                                  message):
    x = np.arange(1001, dtype=np.float32)

    def compute(*arrays, queue, offset, n):
        raise AssertionError("no work may start")

    with pytest.raises(InputError, match=message):
        out = {"ratio": lambda: cv.rows(np.float32, ratio=(1, 4)),
               "per_block": lambda: cv.per_block(1, np.float32),
               "bad-ratio": lambda: cv.rows(np.float32, ratio=(0, 4))}[output]()
        cv.stream(compute, [x], [out], device=device, halo=halo)
