"""Copies of memory pinned by another OpenCL context (backends/opencl_elsewhere.py): made
blocking on the queue's copier thread, each answered at once by a stand-in event."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import conveyor as cv
from conveyor.errors import BackendError


@pytest.fixture
def contexts(device):
    """``device`` and a second context on the same OpenCL device."""
    if device.backend != "opencl":
        pytest.skip("contexts are an OpenCL notion")
    from conveyor.backends import opencl

    platform, index = (int(part) for part in device.spec.split(":")[1:])
    other = opencl.Device(device.cl_device, platform, index)
    yield device, other
    gc.collect()
    other.close()


def _copier_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "conveyor-copy-elsewhere"]


def test_a_copy_waits_for_its_events_and_the_caller_does_not(contexts):
    device, other = contexts
    pinned = cv.pinned.empty(250_000, np.float32, device=other)
    pinned[:] = np.arange(pinned.size, dtype=np.float32)
    back = cv.pinned.empty(pinned.size, np.float32, device=other)
    back[:] = 0
    queue = device.create_queue()
    buffer = device.alloc_device(pinned.nbytes)
    try:
        gate = device.user_event()
        copied = queue.copy_in(buffer, pinned, wait_for=[gate])  # returns with the gate shut
        assert not copied.is_done()
        returned = queue.copy_out(back, buffer, wait_for=[copied])
        assert not returned.is_done() and _copier_threads()
        gate.set_complete()
        returned.wait()
        assert copied.is_done()
        np.testing.assert_array_equal(back, pinned)
        start, end = returned.profile_ns()
        assert 0 < start <= end
    finally:
        queue.close()
        buffer.close()
    assert _copier_threads() == []  # close() ends the copier thread
    del pinned, back


def test_a_failed_copy_raises_where_it_is_waited_on_and_at_finish(contexts):
    device, other = contexts
    pinned = cv.pinned.empty(1000, np.float32, device=other)
    queue = device.create_queue()
    small = device.alloc_device(100)  # too small: the driver refuses the copy on the thread
    try:
        event = queue.copy_in(small, pinned)
        with pytest.raises(BackendError, match="blocking"):
            event.wait()
        with pytest.raises(BackendError, match="pinned by another context failed"):
            queue.finish()  # a failure nobody waited on would not pass silently either
        queue.finish()  # raised once
        later = queue.copy_in(small, pinned[:25])  # the copier goes on after a failure
        later.wait()
    finally:
        queue.close()
        small.close()
    assert _copier_threads() == []
    del pinned


def test_the_queue_stays_in_order_around_a_copy_made_on_the_copier(contexts):
    device, other = contexts
    n = 100_000
    pinned = cv.pinned.empty(n, np.float32, device=other)
    pinned[:] = 7
    own = cv.pinned.empty(n, np.float32, device=device)
    queue = device.create_queue()
    buffer = device.alloc_device(pinned.nbytes)
    try:
        gate = device.user_event()
        # Events kept: PyOpenCL's copy events wait for their copy when dropped.
        held = [queue.copy_in(buffer, pinned, wait_for=[gate])]  # held back
        held.append(queue.fill(buffer, 0, pinned.nbytes))  # issued after it: runs after it
        held.append(queue.copy_out(own, buffer))
        gate.set_complete()
        queue.finish()
        assert not own.any()  # the fill came last
        queue.copy_in(buffer, pinned)
        queue.copy_out(own, buffer).wait()  # no wait_for: order alone
        np.testing.assert_array_equal(own, pinned)
        earlier = device.user_event()
        held.append(queue.fill(buffer, 0, pinned.nbytes, wait_for=[earlier]))  # before the copy
        copied = queue.copy_in(buffer, pinned)
        assert not copied.is_done()
        earlier.set_complete()
        queue.copy_out(own, buffer).wait()
        np.testing.assert_array_equal(own, pinned)  # the copy ran after the earlier fill
    finally:
        queue.close()
        buffer.close()
    del pinned, own


def test_a_queue_dropped_without_close_ends_its_copier(contexts):
    device, other = contexts
    pinned = cv.pinned.empty(1000, np.float32, device=other)
    queue = device.create_queue()
    buffer = device.alloc_device(pinned.nbytes)
    queue.copy_in(buffer, pinned).wait()
    assert _copier_threads()
    queue.finish()
    del queue
    gc.collect()
    for thread in _copier_threads():
        thread.join(30)  # the finalizer posted the end; the thread finishes at once
    assert _copier_threads() == []
    buffer.close()
    del pinned


def test_own_pinned_memory_needs_no_copier(contexts):
    device, _ = contexts
    pinned = cv.pinned.empty(1000, np.float32, device=device)
    queue = device.create_queue()
    buffer = device.alloc_device(pinned.nbytes)
    try:
        queue.copy_in(buffer, pinned).wait()
        assert _copier_threads() == []
    finally:
        queue.close()
        buffer.close()
    del pinned
