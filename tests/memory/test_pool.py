"""The device memory pool: size bins, reuse, limit, the out-of-memory ladder, statistics and
event-fenced release. Faults are injected by wrapping the real ``device.alloc_device``."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import conveyor as cv
from conveyor.memory.pinned import page_bin
from conveyor.memory.pool import (
    KEEP_FACTOR,
    STALE_STREAMS,
    BlockPool,
    DevicePool,
    device_bin,
)

MIB = 1 << 20


class FailingAllocate:
    """``device.alloc_device``, but the first ``failures`` calls raise OutOfMemoryError."""

    def __init__(self, device: cv.Device, failures: int) -> None:
        self.device = device
        self.failures = failures
        self.calls = 0

    def __call__(self, nbytes: int):
        self.calls += 1
        if self.calls <= self.failures:
            raise cv.OutOfMemoryError(nbytes, 0, None)
        return self.device.alloc_device(nbytes)


@pytest.fixture
def pool(device):
    """A private pool over the device's real allocator, closed after the test."""
    made = BlockPool(device.alloc_device, device_bin)
    yield made
    made.close()


# -- size classes --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("request_bytes", "expected"),
    [(1, 512), (512, 512), (513, 1024), (4097, 8192), (MIB, MIB), (MIB + 1, MIB + MIB // 8)],
)
def test_device_bin_rounds_to_its_size_class(request_bytes, expected):
    assert device_bin(request_bytes) == expected


@pytest.mark.parametrize("request_bytes", [MIB + 1, 3 * MIB + 7, 129 * MIB, 1000 * MIB + 1])
def test_device_bin_wastes_at_most_an_eighth_above_one_mib(request_bytes):
    size = device_bin(request_bytes)
    assert request_bytes <= size <= request_bytes * 1.125
    assert device_bin(size) == size


def test_page_bin_keeps_129_mib_at_129_mib():
    assert page_bin(129 * MIB) == 129 * MIB
    assert page_bin(1) == 4096
    assert page_bin(4097) == 8192


def test_pinned_pool_holds_129_mib_for_a_129_mib_request(device):
    pinned_pool = device.pinned_pool
    before = pinned_pool.stats().in_use_bytes
    block = pinned_pool.acquire(129 * MIB)
    try:
        assert block.nbytes == 129 * MIB
        assert pinned_pool.stats().in_use_bytes - before == 129 * MIB
    finally:
        pinned_pool.release(block)
        pinned_pool.trim()


def test_device_pool_holds_its_bin_not_the_next_power_of_two(device):
    memory_pool = device.memory_pool
    block = memory_pool.acquire(129 * MIB)
    try:
        assert block.nbytes == device_bin(129 * MIB) == 144 * MIB
    finally:
        memory_pool.release(block)
        memory_pool.trim()


# -- reuse ---------------------------------------------------------------------------------
def test_released_block_comes_back_as_a_hit(pool):
    first = pool.acquire(MIB)
    pool.release(first)
    again = pool.acquire(MIB - 100)  # same size class
    try:
        assert again is first
        stats = pool.stats()
        assert (stats.hits, stats.misses) == (1, 1)
    finally:
        pool.release(again)


def test_other_size_class_is_a_miss(pool):
    small = pool.acquire(MIB)
    pool.release(small)
    large = pool.acquire(2 * MIB)
    try:
        assert large is not small
        assert pool.stats().misses == 2
    finally:
        pool.release(large)


# -- limit -----------------------------------------------------------------------------------
def test_acquire_beyond_the_limit_raises_out_of_memory(device):
    limited = BlockPool(device.alloc_device, device_bin, limit=2 * MIB)
    held = limited.acquire(MIB // 2)
    limited.release(held)
    in_use = limited.acquire(MIB)
    try:
        with pytest.raises(cv.OutOfMemoryError) as caught:
            limited.acquire(2 * MIB)
        assert caught.value.limit == 2 * MIB
        assert caught.value.in_use == MIB
        assert limited.stats().held_bytes == 0  # the ladder freed the held block first
    finally:
        limited.release(in_use)
        limited.close()


def test_fragmented_pool_under_a_limit_succeeds_after_freeing_held_blocks(device):
    limited = BlockPool(device.alloc_device, device_bin, limit=2 * MIB)
    other_size = limited.acquire(MIB)
    limited.release(other_size)
    block = limited.acquire(2 * MIB)
    try:
        assert block.nbytes == 2 * MIB
        assert limited.stats().held_bytes == 0
    finally:
        limited.release(block)
        limited.close()


def test_limit_must_be_positive(pool):
    with pytest.raises(cv.InputError):
        pool.limit = 0


# -- the out-of-memory ladder ----------------------------------------------------------------
def test_ladder_succeeds_once_the_failures_stop(device):
    allocate = FailingAllocate(device, failures=3)
    flaky = BlockPool(allocate, device_bin)
    block = flaky.acquire(MIB)
    try:
        assert block.nbytes == MIB
        assert allocate.calls == 4
    finally:
        flaky.release(block)
        flaky.close()


def test_ladder_frees_held_blocks_before_retrying(device):
    allocate = FailingAllocate(device, failures=0)
    flaky = BlockPool(allocate, device_bin)
    idle = flaky.acquire(MIB)
    flaky.release(idle)
    allocate.failures = allocate.calls + 1  # the next call fails, the retry after trim works
    block = flaky.acquire(2 * MIB)
    try:
        assert flaky.stats().held_bytes == 0
    finally:
        flaky.release(block)
        flaky.close()


def test_ladder_raises_out_of_memory_with_sizes_when_failures_persist(device):
    allocate = FailingAllocate(device, failures=0)
    flaky = BlockPool(allocate, device_bin)
    in_use = flaky.acquire(MIB)
    allocate.failures = 10**9
    try:
        with pytest.raises(cv.OutOfMemoryError) as caught:
            flaky.acquire(3 * MIB)
        error = caught.value
        assert (error.requested, error.in_use, error.limit) == (device_bin(3 * MIB), MIB, None)
    finally:
        flaky.release(in_use)
        flaky.close()


def test_out_of_memory_from_the_pool_survives_pickling(device):
    flaky = BlockPool(FailingAllocate(device, failures=10**9), device_bin, limit=64 * MIB)
    with pytest.raises(cv.OutOfMemoryError) as caught:
        flaky.acquire(5 * MIB)
    copy = pickle.loads(pickle.dumps(caught.value))
    assert (copy.requested, copy.in_use, copy.limit, copy.where) == (
        device_bin(5 * MIB), 0, 64 * MIB, "device"
    )
    assert str(copy) == str(caught.value)


def test_failed_acquire_leaves_the_counters_unchanged(device):
    allocate = FailingAllocate(device, failures=0)
    flaky = BlockPool(allocate, device_bin)
    in_use = flaky.acquire(MIB)
    before = flaky.stats()
    allocate.failures = 10**9
    try:
        with pytest.raises(cv.OutOfMemoryError):
            flaky.acquire(4 * MIB)
        after = flaky.stats()
        assert after.in_use_bytes == before.in_use_bytes == MIB
        assert after.blocks_in_use == before.blocks_in_use == 1
        assert after.peak_in_use_bytes == before.peak_in_use_bytes
    finally:
        flaky.release(in_use)
        flaky.close()


# -- statistics ------------------------------------------------------------------------------
def test_statistics_count_in_use_held_peak_hits_and_misses(pool):
    a = pool.acquire(MIB)
    b = pool.acquire(2 * MIB)
    pool.release(a)
    stats = pool.stats()
    assert stats.in_use_bytes == 2 * MIB
    assert stats.held_bytes == MIB
    assert stats.peak_in_use_bytes == 3 * MIB
    assert (stats.hits, stats.misses, stats.blocks_in_use) == (0, 2, 1)
    pool.release(b)
    pool.reset_peak()
    assert pool.stats().peak_in_use_bytes == 0


def test_trim_returns_the_bytes_it_freed(pool):
    for nbytes in (MIB, 2 * MIB):
        pool.release(pool.acquire(nbytes))
    assert pool.trim() == 3 * MIB
    assert pool.stats().held_bytes == 0
    assert pool.trim() == 0


# -- the keep budget between streams (issue 13, item 6) ---------------------------------------
def _stream_of(pool, *sizes):
    """What a stream does to a pool: acquire its ring, give it back, settle."""
    blocks = [pool.acquire(nbytes) for nbytes in sizes]
    for block in blocks:
        pool.release(block)
    return pool.settle()


def test_settle_keeps_at_most_twice_what_the_largest_recent_stream_used(pool):
    for mib in range(1, 12):  # eleven streams of eleven lengths: one size class each
        _stream_of(pool, mib * MIB, mib * MIB)
        stats = pool.stats()
        assert stats.keep_bytes == KEEP_FACTOR * 2 * mib * MIB
        assert stats.held_bytes <= stats.keep_bytes
    stats = pool.stats()
    assert stats.held_bytes == (11 + 10) * 2 * MIB  # the last two streams; before: 132 MiB
    assert stats.trims == 18 and stats.trimmed_bytes == 90 * MIB


def test_alternating_streams_keep_finding_their_blocks(pool):
    for _ in range(6):
        _stream_of(pool, 4 * MIB)
        _stream_of(pool, MIB, MIB)
    stats = pool.stats()
    assert stats.misses == 3 and stats.trims == 0
    assert stats.held_bytes == 6 * MIB


def test_a_size_class_idle_for_a_while_is_given_back(pool):
    _stream_of(pool, 8 * MIB)
    pool.keep = 100 * MIB  # the budget alone would keep it
    for _ in range(STALE_STREAMS - 1):
        _stream_of(pool, MIB)
    assert pool.stats().held_bytes == 9 * MIB  # idle for STALE_STREAMS - 1 streams: kept
    _stream_of(pool, MIB)
    stats = pool.stats()
    assert stats.held_bytes == MIB
    assert (stats.trims, stats.trimmed_bytes, stats.keep_bytes) == (1, 8 * MIB, 100 * MIB)


def test_a_keep_of_zero_holds_nothing_between_streams(pool):
    pool.keep = 0
    _stream_of(pool, MIB, 3 * MIB)
    stats = pool.stats()
    assert (stats.held_bytes, stats.keep_bytes, stats.trimmed_bytes) == (0, 0, 4 * MIB)


def test_settle_leaves_blocks_in_use_alone(pool):
    kept = pool.acquire(2 * MIB)
    pool.keep = 0
    _stream_of(pool, MIB)
    assert pool.stats().in_use_bytes == 2 * MIB
    # With nothing else in use, an explicit keep holds at once (round twelve: pinned arrays
    # a program dropped were all held until some stream ended).
    pool.release(kept)
    assert pool.stats().held_bytes == 0
    pool.settle()
    assert pool.stats().held_bytes == 0


@pytest.mark.parametrize("bad", [-1, 1.5, "lots", True])
def test_keep_must_be_none_or_bytes(pool, bad):
    with pytest.raises(cv.InputError, match="pool keep"):
        pool.keep = bad


def test_conveyor_pool_keep_sets_every_new_pools_budget(device, monkeypatch):
    monkeypatch.setenv("CONVEYOR_POOL_KEEP", "3MiB")
    made = DevicePool(device)
    try:
        assert made.keep == 3 * MIB
        _stream_of(made, 2 * MIB, 2 * MIB)
        stats = made.stats()
        assert (stats.held_bytes, stats.keep_bytes) == (2 * MIB, 3 * MIB)
    finally:
        made.close()
    monkeypatch.setenv("CONVEYOR_POOL_KEEP", "lots")
    with pytest.raises(cv.InputError, match="CONVEYOR_POOL_KEEP='lots' is not a size"):
        DevicePool(device)


def test_a_stream_settles_both_pools(device):
    a = np.ones(3000, np.float32)
    c = np.empty_like(a)
    pools = (device.memory_pool, device.pinned_pool)
    settled = [pool.stats().trims for pool in pools]
    keeps = [pool.keep for pool in pools]
    for pool in pools:
        pool.keep = 0
    try:
        cv.stream(lambda x, y, queue, offset, n: None, [a], [c], device=device,
                  zero_copy=False, block_bytes=4000)
        for pool, trims in zip(pools, settled, strict=True):
            stats = pool.stats()
            assert (stats.held_bytes, stats.keep_bytes) == (0, 0)
            assert stats.trims > trims
    finally:
        for pool, keep in zip(pools, keeps, strict=True):
            pool.keep = keep


def test_double_release_raises_input_error(pool):
    block = pool.acquire(MIB)
    pool.release(block)
    with pytest.raises(cv.InputError):
        pool.release(block)


def test_release_of_a_foreign_block_raises_input_error(pool, device):
    foreign = device.alloc_device(MIB)
    try:
        with pytest.raises(cv.InputError):
            pool.release(foreign)
    finally:
        foreign.close()


def test_acquire_of_zero_bytes_raises_input_error(pool):
    with pytest.raises(cv.InputError):
        pool.acquire(0)


# -- event-fenced reuse ----------------------------------------------------------------------
def _held_copy(device, queue, block, data):
    """A copy into ``block`` that waits on a user event the test still holds."""
    gate = device.user_event()
    copy_event = queue.copy_in(block, data, wait_for=[gate])
    return gate, copy_event


def test_fenced_block_is_not_reused_while_its_event_is_pending(device, pool):
    data = np.arange(MIB // 4, dtype=np.float32)
    with device.create_queue() as queue:
        block = pool.acquire(MIB)
        gate, copy_event = _held_copy(device, queue, block, data)
        try:
            pool.release(block, after=copy_event)
            other = pool.acquire(MIB)
            assert other is not block
            assert pool.stats().pending_bytes == MIB
            pool.release(other)
        finally:
            gate.set_complete()
            copy_event.wait()


def test_fenced_block_is_reused_once_its_event_completes(device, pool):
    data = np.arange(MIB // 4, dtype=np.float32)
    with device.create_queue() as queue:
        block = pool.acquire(MIB)
        gate, copy_event = _held_copy(device, queue, block, data)
        pool.release(block, after=copy_event)
        gate.set_complete()
        copy_event.wait()
        again = pool.acquire(MIB)
        try:
            assert again is block
            assert pool.stats().pending_bytes == 0
        finally:
            pool.release(again)


def test_data_of_a_fenced_copy_arrives_intact(device, pool):
    data = np.arange(MIB // 4, dtype=np.float32)
    back = np.zeros_like(data)
    with device.create_queue() as queue:
        block = pool.acquire(MIB)
        gate, copy_event = _held_copy(device, queue, block, data)
        try:
            pool.release(block, after=copy_event)
            other = pool.acquire(MIB)  # must not be ``block``: nothing may overwrite it
            with device.create_queue() as other_queue:  # ``queue`` is held by the gate
                other_queue.fill(other, 0xFF, MIB).wait()
            pool.release(other)
        finally:
            gate.set_complete()
        queue.copy_out(back, block, wait_for=[copy_event]).wait()
    np.testing.assert_array_equal(back, data)
