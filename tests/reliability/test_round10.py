"""The tenth round: several devices, reductions, chains and images, tried together.

Fixed (each test below fails on the code before its fix):

- ``reduce=f`` over several devices folded each device's partials once in the engine (its own
  report's result, then dropped) and then every device's partials again, in block order. An
  ``f`` that adds into its first argument (``a += b; return a``, the usual way to fold big
  arrays without a copy) had already changed the first partial of each device, so blocks were
  counted twice: 8.9e8 for a sum of 4.5e8, with no error. Each engine's share is now only
  kept (``Reduction.share``) and the stream folds all partials once; ``f`` is called
  ``blocks - 1`` times, as on one device.
- ``reduce="sum"`` over a callable's NumPy partials added them as they were: ``np.bool_``
  partials were or-ed (``True + True`` is ``True``: 20 blocks summed to True, a bool array
  stayed all True), and int8/int16/int32 partials wrapped around (int8 arrays silently,
  scalars with only NumPy's RuntimeWarning). They are now added as ``np.sum`` adds them
  (``reduce.widened``): bool and narrow integers as int64, unsigned as uint64.

- A chain's warm-up called its callable links on 64 rows of input 0 whatever the outputs'
  ``cv.rows`` ratios: with ``ratio=(1, 3)`` a callable that pools threes
  (``h.reshape(-1, 3)``) got 64 rows beside an output of 21 and raised NumPy's ValueError
  before any block (a plain callable's warm-up already took whole output rows). Both now take
  their rows from ``step.warm_up_rows``.

Guards (held when tried; kept few): a halo over two devices with every boundary, a first_row
and blocks that do not divide the rows, both schedules, equal to one device and to np.pad;
kernel reductions of integers near their limits equal NumPy's (an int32 sum is an int64
sum and does not overflow; an int64 sum wraps around as NumPy's does).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import data, kernel, store, to_host  # noqa: E402

import conveyor as cv  # noqa: E402


# -- 1. a custom reduce that adds into its first argument, over two devices --------------------
def _block_sum(a, queue, offset, n):
    return np.array([to_host(a, queue).astype(np.float64).sum()])


@pytest.mark.parametrize("schedule", ["dynamic", "static"])
def test_an_in_place_reduce_over_two_devices_counts_each_block_once(pair, schedule):
    x = np.arange(30_000, dtype=np.float32)
    calls = []

    def add_into(first, second):  # folds without a copy: changes its first argument
        calls.append(1)
        first += second
        return first

    one = cv.stream(_block_sum, [x], reduce=add_into, device=pair[0], block_bytes=4000)
    calls.clear()
    two = cv.stream(_block_sum, [x], reduce=add_into, device=pair, block_bytes=4000,
                    schedule=schedule)
    assert two.result.tolist() == one.result.tolist() == [x.astype(np.float64).sum()]
    assert len(calls) == two.blocks - 1  # one fold per block after the first, as on one
    assert [r.result for r in two.devices] == [None, None]


def test_an_in_place_reduce_ending_a_chain_over_two_devices(pair):
    x = data((20_000,), np.int32, 12)
    chain = cv.chain(cv.link(kernel(pair[0], "scale", np.int32), "in0", "t0", args=(3,)),
                     cv.link(lambda t, queue, offset, n: np.array(
                         [to_host(t, queue).astype(np.int64).sum()]), "t0"),
                     temps=[np.int32])

    def add_into(first, second):
        first += second
        return first

    report = cv.stream(chain, [x], device=pair, reduce=add_into, block_bytes=4000)
    assert report.result.tolist() == [3 * int(x.astype(np.int64).sum())]


# -- 2. reduce="sum" of a callable's bool and narrow integer partials -------------------------
def test_sum_of_bool_partials_counts_them_as_np_sum_does(device):
    x = np.arange(20_000, dtype=np.float32)

    def any_positive(a, queue, offset, n):
        return np.bool_(bool((to_host(a, queue) >= 0).any()))

    def flags(a, queue, offset, n):
        return to_host(a, queue)[:3] >= 0

    report = cv.stream(any_positive, [x], reduce="sum", device=device, block_bytes=4000)
    assert report.blocks == 20
    assert report.result == 20 and report.result.dtype == np.int64
    report = cv.stream(flags, [x], reduce="sum", device=device, block_bytes=4000)
    assert report.result.tolist() == [20, 20, 20]


def test_sum_of_narrow_int_partials_widens_as_np_sum_does(device, pair):
    x = np.full(20_000, 100, np.int8)

    def head(a, queue, offset, n):
        return to_host(a, queue)[:4]

    def big(a, queue, offset, n):
        return np.int32(2**30)

    for where in (device, pair):
        report = cv.stream(head, [x], reduce="sum", device=where, block_bytes=4000)
        partials = np.stack([x[:4]] * report.blocks)
        assert report.result.tolist() == np.sum(partials, axis=0).tolist() == [500] * 4
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "overflow encountered in scalar add"
            report = cv.stream(big, [x], reduce="sum", device=where, block_bytes=4000)
        assert report.result == 5 * 2**30 and report.result.dtype == np.int64
    unsigned = np.full(20_000, 200, np.uint16)
    report = cv.stream(lambda a, queue, offset, n: to_host(a, queue)[:2] * np.uint16(300),
                       [unsigned], reduce="sum", device=device, block_bytes=4000)
    assert report.result.dtype == np.uint64
    assert report.result.tolist() == [report.blocks * int(np.uint16(200) * np.uint16(300))] * 2


# -- 3. a chain's warm-up on whole output rows ------------------------------------------------
def _pool3(a, y, queue, offset, n):
    store(y, to_host(a, queue).reshape(-1, 3).sum(axis=1), queue)


def test_a_chains_warm_up_gives_whole_rows_of_a_ratio_output(device):
    x = np.arange(3 * 5000, dtype=np.float32)
    want = x.reshape(-1, 3).sum(axis=1)
    plain = cv.stream(_pool3, [x], [cv.rows(np.float32, ratio=(1, 3))], device=device,
                      block_bytes=4 * 999)
    np.testing.assert_array_equal(plain.outputs[0], want)
    chained = cv.stream(cv.chain(cv.link(_pool3, "in0", "out0")), [x],
                        [cv.rows(np.float32, ratio=(1, 3))], device=device,
                        block_bytes=4 * 999)
    np.testing.assert_array_equal(chained.outputs[0], want)


# -- guards ------------------------------------------------------------------------------------
@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", 7.5])
def test_guard_halo_over_two_devices_with_each_boundary(pair, boundary):
    x = data((1_003, 3), np.float32, 5)
    halo = 2
    mode = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}.get(boundary)
    padded = (np.pad(x, ((halo, halo), (0, 0)), mode=mode) if mode else
              np.pad(x, ((halo, halo), (0, 0)), constant_values=boundary))
    want = padded[0:len(x)].copy()
    for k in range(1, 2 * halo + 1):
        want = want + padded[k:k + len(x)]
    for schedule in ("dynamic", "static"):
        y = np.zeros_like(x)
        report = cv.stream(kernel(pair[0], "sten"), [x], [y], device=pair, args=(3, halo),
                           halo=halo, boundary=boundary, block_bytes=3 * 4 * 97,
                           schedule=schedule, first_row=123)
        assert report.blocks == 11
        if schedule == "static":  # an uneven share each: 5 and 6 blocks
            assert [r.blocks for r in report.devices] == [5, 6]
        np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_guard_kernel_sums_and_extremes_near_the_limits_are_numpys(pair, dtype):
    info = np.iinfo(dtype)
    x = np.full(12_001, info.max, dtype)
    x[::7] = info.min
    for op in ("sum", "min", "max"):
        want = getattr(np, op)(x)
        with warnings.catch_warnings():  # int64 wraps around, as np.sum does
            warnings.simplefilter("ignore", RuntimeWarning)
            got = cv.stream(kernel(pair[0], "ident", dtype), [x], reduce=op, device=pair,
                            block_bytes=4000).result
        assert got == want and got.dtype == want.dtype, (op, got, want)


def test_a_partial_returned_in_one_reused_buffer_is_kept_per_block(device):
    """A callable that fills one buffer for every block and returns it: every partial was
    that one array, and the sum came out as the last block's values times the blocks."""
    x = np.arange(20_000, dtype=np.float32)
    buf = np.zeros(2, np.float64)

    def first_and_sum(a, queue, offset, n):
        host = to_host(a, queue)
        buf[0], buf[1] = host[0], host.astype(np.float64).sum()
        return buf  # the same object every block

    for reduce in ("sum", lambda p, q: p + q):
        report = cv.stream(first_and_sum, [x], reduce=reduce, device=device, block_bytes=4000)
        assert report.blocks == 20
        assert report.result.tolist() == [float(x[::1000].sum()), float(x.sum(dtype=np.float64))]
