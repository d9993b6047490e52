"""Staging beside the engine (pipeline/staging.py): which thread copies, ring entries fenced by
the copies that read them, and both modes (threads, inline) giving the same results."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from streamkit import add_reference, kernel, stencil_reference

import conveyor as cv
from conveyor.pipeline import stream as stream_module
from conveyor.pipeline.plan import Block
from conveyor.pipeline.stage import Stager, StageTask
from conveyor.pipeline.staging import StageAhead, StageBehind

ROWS = 50_000


def _copying_threads(device, monkeypatch) -> dict[str, set[str]]:
    """Run a pageable vadd with one staging worker (pieces copy on the calling thread); return
    the names of the threads that staged inputs and outputs."""
    seen: dict[str, set[str]] = {"input": set(), "output": set()}
    a = np.arange(ROWS, dtype=np.float32)
    b = np.ones(ROWS, np.float32)
    c = np.zeros(ROWS, np.float32)

    class Recording(stream_module.Engine):
        def _build(self) -> None:
            super()._build()
            real = self.stager.copy

            def copy(dst, src):
                side = "output" if np.shares_memory(dst, c) else "input"
                seen[side].add(threading.current_thread().name)
                real(dst, src)

            self.stager.copy = copy

    monkeypatch.setattr(stream_module, "Engine", Recording)
    cv.stream(kernel(device, "add"), [a, b], [c], device=device, block_bytes=16384,
              workers=1, zero_copy=False)
    np.testing.assert_array_equal(c, add_reference(a, b))
    return seen


def test_large_blocks_stage_on_their_own_threads(device, monkeypatch):
    seen = _copying_threads(device, monkeypatch)
    assert seen == {"input": {"conveyor-stage-in"}, "output": {"conveyor-stage-out"}}


@pytest.mark.inline_staging
def test_small_blocks_stage_inline_on_the_callers_thread(device, monkeypatch):
    seen = _copying_threads(device, monkeypatch)
    assert seen["input"] | seen["output"] == {threading.current_thread().name}


@pytest.mark.inline_staging
@pytest.mark.parametrize("halo", [0, 2])
def test_inline_staging_streams_are_right(device, halo):
    x = (np.arange(ROWS, dtype=np.float32) % 97).reshape(-1, 2)
    y = np.zeros_like(x)
    if halo:
        cv.stream(kernel(device, "sten"), [x], [y], device=device, args=(2, halo), halo=halo,
                  block_bytes=8 * 300, zero_copy=False)
        np.testing.assert_array_equal(y, stencil_reference(x, halo))
    else:
        cv.stream(kernel(device, "add"), [x, x], [y], device=device, block_bytes=8 * 300,
                  zero_copy=False)
        np.testing.assert_array_equal(y, add_reference(x, x))


@pytest.mark.inline_staging
def test_inline_stage_out_failure_is_raised_with_pools_at_zero(device, monkeypatch):
    class Boom(Exception):
        pass

    class Faulty(stream_module.Engine):
        def _build(self) -> None:
            super()._build()
            count = [0]
            real = self.stager.copy

            def copy(dst, src):
                count[0] += 1
                if count[0] == 7:
                    raise Boom
                real(dst, src)

            self.stager.copy = copy

    monkeypatch.setattr(stream_module, "Engine", Faulty)
    a = np.ones(ROWS, np.float32)
    c = np.zeros(ROWS, np.float32)
    with pytest.raises(Boom):
        cv.stream(kernel(device, "add"), [a, a], [c], device=device, block_bytes=4096,
                  workers=1, zero_copy=False)


def _held_copy_setup(device):
    """One ring entry, two blocks: block 0's copy-in waits on a gate the test holds."""
    nbytes = 4096 * 4
    pin = device.pinned_pool.acquire(nbytes)
    target = device.memory_pool.acquire(nbytes)
    blocks = [Block(0, 0, 4096), Block(1, 4096, 8192)]
    sources = [np.full(4096, 1.0, np.float32), np.full(4096, 2.0, np.float32)]

    def fill(block, entry):
        view = entry[0].array[:nbytes].view(np.float32)
        return [StageTask(view, sources[block.index], f"block {block.index}")]

    return pin, target, blocks, fill


def test_a_ring_entry_is_refilled_only_after_the_copy_that_read_it(device):
    pin, target, blocks, fill = _held_copy_setup(device)
    stager = Stager(workers=2)
    ahead = StageAhead(stager, [[pin]], blocks, fill, [], None)
    gate = device.user_event()
    queue = device.create_queue()
    try:
        ahead.start()
        entry = ahead.take(0)
        copy = queue.copy_in(target, entry[0].array[: 4096 * 4], wait_for=[gate])
        queue.flush()
        ahead.release(0, [copy])
        time.sleep(0.2)  # time for the thread to (wrongly) refill the entry
        assert not copy.is_done()
        assert (pin.array[: 4096 * 4].view(np.float32) == 1.0).all()  # block 0 still there
    finally:
        gate.set_complete()
    try:
        assert ahead.take(1)[0] is pin
        copy.wait()
        back = np.zeros(4096, np.float32)
        queue.copy_out(back, target).wait()
        assert (back == 1.0).all()  # the held copy read block 0, not block 1
        assert (pin.array[: 4096 * 4].view(np.float32) == 2.0).all()
    finally:
        ahead.close()
        stager.close()
        queue.close()
        device.pinned_pool.release(pin)
        device.memory_pool.release(target)


def test_a_failed_stage_in_is_raised_on_the_engines_thread(device):
    pin, target, blocks, _ = _held_copy_setup(device)

    def fill(block, entry):
        raise RuntimeError(f"cannot read block {block.index}")

    stager = Stager(workers=1)
    ahead = StageAhead(stager, [[pin]], blocks, fill, [], None)
    try:
        ahead.start()
        with pytest.raises(RuntimeError, match="cannot read block 0"):
            ahead.take(0)
    finally:
        ahead.close()
        stager.close()
        device.pinned_pool.release(pin)
        device.memory_pool.release(target)


def test_stage_behind_waits_for_the_copy_out_before_copying(device):
    nbytes = 4096 * 4
    pin = device.pinned_pool.acquire(nbytes)
    source = device.memory_pool.acquire(nbytes)
    out = np.zeros(4096, np.float32)
    stager = Stager(workers=1)
    behind = StageBehind(stager, [[pin]], [], None)
    gate = device.user_event()
    queue = device.create_queue()
    try:
        queue.copy_in(source, np.full(4096, 5.0, np.float32)).wait()
        behind.start()
        entry = behind.entry(0)
        view = entry[0].array[:nbytes].view(np.float32)
        view[:] = -1.0
        copy = queue.copy_out(view, source, wait_for=[gate])
        queue.flush()
        behind.submit(0, Block(0, 0, 4096), [copy], [StageTask(out, view, "output 0")])
        time.sleep(0.2)
        assert (out == 0.0).all()  # not staged out before the copy-out ran
    finally:
        gate.set_complete()
    try:
        behind.drain()
        assert (out == 5.0).all()
    finally:
        behind.close()
        stager.close()
        queue.close()
        device.pinned_pool.release(pin)
        device.memory_pool.release(source)
