"""Event-fenced release (issue 8, items 1 and 3): a block given back with ``after=`` an event
that a queue still holds (the queue waits on a user event the test controls) is not handed out
again until that event completes, and the data of the held command arrives intact.

Every gate is completed in a ``finally`` before anything waits on the commands behind it: a
wait on a gated event (or a queue's close, which finishes it) would never return."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import numpy as np

import conveyor as cv
from conveyor.backends.base import DeviceBuffer
from conveyor.memory import pinned

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import assert_clean  # noqa: E402

# An odd size class of its own (whole pages), so no other test's idle block answers for it.
NBYTES = 37 * 4096
ITEMS = NBYTES // 4


def _pattern(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(ITEMS).astype(np.float32)


def _scribble(device: cv.Device, block) -> None:
    """What a new owner of a block does: overwrite all of it."""
    if isinstance(block, DeviceBuffer):
        with device.create_queue() as queue:
            queue.fill(block, 0xFF, block.nbytes).wait()
    else:
        block.array[:] = 0xFF


def test_pinned_slot_released_behind_a_held_copy_is_not_handed_out(device):
    pool, memory = device.pinned_pool, device.memory_pool
    expected = _pattern(1)
    slot = pool.acquire(NBYTES)
    target = memory.acquire(NBYTES)
    gate = device.user_event()
    try:
        with device.create_queue() as queue:
            try:
                slot.array[:NBYTES].view(np.float32)[:] = expected
                copy = queue.copy_in(target, slot.array[:NBYTES], wait_for=[gate])
                queue.flush()
                pool.release(slot, after=copy)
                assert pool.stats().pending_bytes >= NBYTES
                others = [pool.acquire(NBYTES) for _ in range(3)]
                assert all(other is not slot for other in others)
                for other in others:
                    _scribble(device, other)
                    pool.release(other)
                assert not copy.is_done()  # still held: the slot was never free to take
            finally:
                gate.set_complete()
            copy.wait()
            back = np.zeros(ITEMS, np.float32)
            queue.copy_out(back, target).wait()
        np.testing.assert_array_equal(back, expected)
    finally:
        memory.release(target)


def test_pinned_slot_comes_back_once_its_copy_completes(device):
    pool, memory = device.pinned_pool, device.memory_pool
    slot = pool.acquire(NBYTES)
    target = memory.acquire(NBYTES)
    gate = device.user_event()
    try:
        with device.create_queue() as queue:
            try:
                copy = queue.copy_in(target, slot.array[:NBYTES], wait_for=[gate])
                queue.flush()
                pool.release(slot, after=copy)
            finally:
                gate.set_complete()
            copy.wait()
        again = pool.acquire(NBYTES)
        try:
            assert again is slot
        finally:
            pool.release(again)
    finally:
        memory.release(target)


def test_dropped_pinned_array_goes_back_only_after_its_recorded_event(device):
    # The event is a marker behind the gate, not a copy: on OpenCL a copy's own event keeps
    # the host array alive until it is waited on, so the array could not be dropped early.
    pool = device.pinned_pool
    host = pinned.empty(ITEMS, np.float32, device=device)
    block = pinned.owner(host).block  # type: ignore[union-attr]  (no name kept for it)
    gate = device.user_event()
    with device.create_queue() as queue:
        try:
            fence = queue.marker(wait_for=[gate])
            queue.flush()
            pinned.record_use(host, fence)
            del host
            gc.collect()  # the array is gone; its block is fenced on the marker
            assert pool.stats().pending_bytes >= NBYTES
            other = pool.acquire(NBYTES)
            assert other is not block
            pool.release(other)
        finally:
            gate.set_complete()
        fence.wait()
    again = pool.acquire(NBYTES)
    try:
        assert again is block
    finally:
        pool.release(again)


def test_device_block_released_behind_a_read_on_another_queue_is_not_reused(device):
    pool = device.memory_pool
    expected = _pattern(3)
    block = pool.acquire(NBYTES)
    # Pinned: on CUDA a copy into pageable memory returns only once the data is there,
    # so gated behind a gate this thread sets later it would never return.
    back = cv.pinned.zeros(ITEMS, np.float32, device=device)
    gate = device.user_event()
    with device.create_queue() as writer, device.create_queue() as reader:
        writer.copy_in(block, expected).wait()
        try:
            read = reader.copy_out(back, block, wait_for=[gate])
            reader.flush()
            pool.release(block, after=read)  # released on the writer's side, read pending
            others = [pool.acquire(NBYTES) for _ in range(3)]
            assert all(other is not block for other in others)
            for other in others:
                _scribble(device, other)  # on a third queue, not held by the gate
                pool.release(other)
            assert not read.is_done()
        finally:
            gate.set_complete()
        read.wait()
    np.testing.assert_array_equal(back, expected)
    del back
    gc.collect()
    assert_clean(device)


def test_device_block_comes_back_once_the_read_completes(device):
    pool = device.memory_pool
    block = pool.acquire(NBYTES)
    # Pinned: on CUDA a copy into pageable memory returns only once the data is there,
    # so gated behind a gate this thread sets later it would never return.
    back = cv.pinned.zeros(ITEMS, np.float32, device=device)
    gate = device.user_event()
    with device.create_queue() as reader:
        try:
            read = reader.copy_out(back, block, wait_for=[gate])
            reader.flush()
            pool.release(block, after=read)
            assert pool.stats().pending_bytes >= pool.bin_size(NBYTES)
        finally:
            gate.set_complete()
        read.wait()
    again = pool.acquire(NBYTES)
    try:
        assert again is block
        assert pool.stats().pending_bytes == 0
    finally:
        pool.release(again)
