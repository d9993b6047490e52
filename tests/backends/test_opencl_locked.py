"""NVIDIA's OpenCL page-locks a USE_HOST_PTR buffer's memory (backends/opencl.py, session 14):
there pinned blocks are anonymous memory wrapped so (``LockedPinned``), and kept arrays are
copied from and to their own memory instead of buffer to buffer.

On the GPU machine these run on NVIDIA's OpenCL as it is. In CI (PoCL) the same code paths
run on a second context of the device under test whose ``locks_host_ptr`` is set, as a
device of NVIDIA's would have it: PoCL copies from a host pointer correctly whether or not
the memory is locked, so every result is checked exactly; the rate is the bench's business
(bench/suite's iterative table, bench/first_call.py)."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))  # streamkit
from streamkit import add_reference, data, in_use, kernel  # noqa: E402

import conveyor as cv  # noqa: E402
from conveyor.memory import keep  # noqa: E402

ROWS = 3 * 2**20 + 123  # float32: 12 MiB per array, blocks of 4 MiB (LockedPinned's least)
BLOCK = 4 * 2**20


@pytest.fixture
def locked(device):
    """A device whose registrations and pinned blocks are NVIDIA's kind: the device itself
    on NVIDIA's OpenCL, else a second context of an OpenCL device with the flag set."""
    if device.backend != "opencl":
        pytest.skip("USE_HOST_PTR page-locking is an OpenCL notion")
    keep.release_pinned()
    if device.locks_host_ptr:
        yield device
        keep.release_pinned()
        return
    from conveyor.backends import opencl

    platform, index = (int(part) for part in device.spec.split(":")[1:])
    other = opencl.Device(device.cl_device, platform, index)
    other.locks_host_ptr = True
    try:
        yield other
    finally:
        keep.release_pinned()
        gc.collect()
        other.close()


def test_pinned_blocks_are_locked_anonymous_memory_and_stream_exactly(locked, monkeypatch):
    from conveyor.backends.opencl import LockedPinned, PinnedBuffer

    monkeypatch.delenv("CONVEYOR_PINNED_ALLOC", raising=False)
    block = locked.alloc_pinned(BLOCK)
    small = locked.alloc_pinned(BLOCK // 2)
    try:
        assert isinstance(block, LockedPinned) and isinstance(small, PinnedBuffer)
        block.array[:] = 7  # the memory is there, writable, and faulted in
        assert int(block.array.sum()) == 7 * BLOCK
    finally:
        block.close()
        small.close()
    block.close()  # twice: nothing happens
    a, b = data((ROWS,), np.float32, 1), data((ROWS,), np.float32, 2)
    c = np.empty_like(a)
    report = cv.stream(kernel(locked, "add"), [a, b], [c], device=locked, block_bytes=BLOCK,
                       zero_copy=False)
    np.testing.assert_array_equal(c, add_reference(a, b))
    assert "stage-in" in {s.lane for s in report.timeline.spans}  # staged through the ring
    assert in_use(locked) == (0, 0)


def test_driver_alloc_keeps_alloc_host_ptr(locked, monkeypatch):
    from conveyor.backends.opencl import PinnedBuffer

    monkeypatch.setenv("CONVEYOR_PINNED_ALLOC", "driver")
    block = locked.alloc_pinned(BLOCK)
    try:
        assert isinstance(block, PinnedBuffer)
    finally:
        block.close()


def test_pinned_empty_of_locked_memory_is_pinned_for_its_device(locked):
    p = cv.pinned.empty(ROWS, np.float32, device=locked)
    try:
        assert cv.pinned.is_pinned(p, locked)
        p[:] = data((ROWS,), np.float32, 3)
        out = np.empty_like(p)
        report = cv.stream(kernel(locked, "ident"), [p], [out], device=locked,
                           block_bytes=BLOCK, zero_copy=False)
        np.testing.assert_array_equal(out, p)
        assert "stage-in" not in {s.lane for s in report.timeline.spans}  # direct
    finally:
        del p
        gc.collect()


def test_kept_arrays_are_page_locked_and_copied_from_their_own_memory(locked):
    a, b = data((ROWS,), np.float32, 4), data((ROWS,), np.float32, 5)
    c = np.empty_like(a)
    assert cv.keep_pinned(a, device=locked) and cv.keep_pinned(c, device=locked)
    kept = keep.find(locked, a)
    assert kept is not None and kept.registration.page_locked
    for round_ in range(3):  # the host changes a kept input between streams: seen each time
        a[::7] += np.float32(round_ + 1)
        report = cv.stream(kernel(locked, "add"), [a, b], [c], device=locked,
                           block_bytes=BLOCK, zero_copy=False)
        np.testing.assert_array_equal(c, add_reference(a, b))
        lanes = {s.lane for s in report.timeline.spans}
        assert "stage-out" not in lanes  # the kept output is written directly
    assert in_use(locked) == (0, 0)


def test_a_kept_view_and_the_whole_array_stay_exact(locked):
    """Two registrations over the same memory (a view kept, then the whole array) undo
    NVIDIA's page-locking, so copies go at the pageable rate; they must still be exact."""
    a = data((ROWS,), np.float32, 6)
    out = np.empty_like(a)
    assert cv.keep_pinned(a[: ROWS // 2], device=locked)
    assert cv.keep_pinned(a, device=locked)
    a[1::3] = -1
    cv.stream(kernel(locked, "ident"), [a], [out], device=locked, block_bytes=BLOCK,
              zero_copy=False)
    np.testing.assert_array_equal(out, a)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_locked_block_closed_in_a_forked_child_leaves_the_parents_memory(locked):
    """A forked child must not call the driver, nor unmap memory its parent's driver holds
    locked: closing a copied block there does nothing."""
    block = locked.alloc_pinned(BLOCK)
    try:
        block.array[:8] = 5
        pid = os.fork()
        if pid == 0:  # the child: mark it as conveyor's fork hook does, then close
            from conveyor.backends import opencl

            opencl._forked = True
            try:
                block.close()
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert list(block.array[:8]) == [5] * 8
    finally:
        block.close()


def test_a_locked_block_dropped_unclosed_is_unmapped(locked):
    """A block let go of without close() (its device dropped unclosed): the buffer is freed
    by PyOpenCL, and the memory must be unmapped too."""
    block = locked.alloc_pinned(BLOCK)
    address = int(block.array.__array_interface__["data"][0])

    def mapped() -> bool:
        with open("/proc/self/maps") as maps:
            spans = [line.split()[0].split("-") for line in maps]
        return any(int(lo, 16) <= address < int(hi, 16) for lo, hi in spans)

    assert mapped()
    del block
    gc.collect()
    assert not mapped()
