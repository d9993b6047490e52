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


def test_a_failed_copy_raises_where_it_is_waited_on(contexts):
    device, other = contexts
    pinned = cv.pinned.empty(1000, np.float32, device=other)
    queue = device.create_queue()
    small = device.alloc_device(100)  # too small: the driver refuses the copy on the thread
    try:
        event = queue.copy_in(small, pinned)
        with pytest.raises(BackendError, match="blocking"):
            event.wait()
        queue.finish()  # the copier is drained; the failure was the copy's, not the queue's
        later = queue.copy_in(small, pinned[:25])  # the copier goes on after a failure
        later.wait()
    finally:
        queue.close()
        small.close()
    assert _copier_threads() == []
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
