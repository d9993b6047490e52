"""Copies of memory pinned by another OpenCL context of the same platform (opencl.py
``_pinned_elsewhere``): made directly, as blocking copies on the caller's thread, so the queue
stays in order and a failure raises at the call."""

from __future__ import annotations

import gc

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


def test_another_contexts_pinned_memory_is_copied_blocking_and_in_order(contexts):
    from conveyor.backends.opencl import _pinned_elsewhere

    device, other = contexts
    n = 250_000
    pinned = cv.pinned.empty(n, np.float32, device=other)
    pinned[:] = np.arange(n, dtype=np.float32)
    back = cv.pinned.empty(n, np.float32, device=other)
    back[:] = 0
    own = cv.pinned.empty(n, np.float32, device=device)
    assert _pinned_elsewhere(pinned, device) and not _pinned_elsewhere(pinned, other)
    assert not _pinned_elsewhere(own, device) and not _pinned_elsewhere(np.ones(3), device)
    queue = device.create_queue()
    buffer = device.alloc_device(pinned.nbytes)
    try:
        earlier = queue.fill(buffer, 0, pinned.nbytes)
        copied = queue.copy_in(buffer, pinned)  # after the fill: the queue is in order
        returned = queue.copy_out(back, buffer, wait_for=[copied])
        assert returned.is_done()  # a blocking read: the data is in ``back`` now
        np.testing.assert_array_equal(back, pinned)
        queue.fill(buffer, 0, pinned.nbytes)
        queue.copy_out(own, buffer).wait()  # and after the copy
        assert not own.any()
        start, end = copied.profile_ns()
        assert 0 < start <= end
        del earlier
    finally:
        queue.close()
        buffer.close()
    del pinned, back, own


def test_a_failed_copy_raises_at_the_call(contexts):
    device, other = contexts
    pinned = cv.pinned.empty(1000, np.float32, device=other)
    queue = device.create_queue()
    small = device.alloc_device(100)  # too small: the driver refuses the copy
    try:
        with pytest.raises(BackendError, match="clEnqueueWriteBuffer"):
            queue.copy_in(small, pinned)
        queue.copy_in(small, pinned[:25]).wait()  # the queue goes on
        queue.finish()
    finally:
        queue.close()
        small.close()
    del pinned


def test_other_platforms_and_other_backends_are_not_copied_directly(contexts):
    device, other = contexts
    assert device.copies_pinned_of(other) and other.copies_pinned_of(device)
    assert device.copies_pinned_of(device)
    strangers = [d for d in cv.devices()
                 if d.backend != "opencl"
                 or d.cl_device.platform != device.cl_device.platform]
    for stranger in strangers:
        assert not device.copies_pinned_of(stranger)
