"""Ctrl-C at every point of a stream where Python can run a signal handler (interrupts.py).

A real Ctrl-C at a random moment (tests/pipeline/test_interrupts.py) finds a bad moment about
once in many CI runs: a KeyboardInterrupt raised between a pool marking a block in use and the
stream owning it left the block in use for good, and one raised just after
``Condition.__enter__`` took its lock left the lock held, so the stream hung in its clean-up.
Here the moment is chosen instead of drawn. CPython runs a pending handler at the start of a
Python function and right after a C function returns; a profile hook (``sys.setprofile``) sees
exactly those points, and raises SIGINT at the N-th one counted from the engine's start, for N
across the whole stream. Each stream must then either finish or raise KeyboardInterrupt, leave
every pool at zero, and leave no conveyor thread running; the next stream must be exact.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

import numpy as np
import pytest
from streamkit import in_use, kernel

import conveyor as cv
from conftest import DEVICES

#: Threads a stream starts and must join (the compile and pre-fault pools outlive streams).
_STREAM_THREADS = ("conveyor-stage", "conveyor-ring", "conveyor-device")

#: Points where CPython 3.11 runs a pending signal handler (RESUME; CALL's eval-breaker check).
_POINTS = ("call", "c_return")

#: Set-up and clean-up points tried (each band evenly spread; each point is one stream), and
#: samples over the blocks between. ``CONVEYOR_SWEEP_ALL=1`` tries every point (some 4,000
#: a stream: minutes).
SWEEP_ALL = os.environ.get("CONVEYOR_SWEEP_ALL") == "1"
SETUP_POINTS = 10**9 if SWEEP_ALL else 300
RUN_SAMPLES = 10**9 if SWEEP_ALL else 40


class _Shot:
    """A profile hook that counts handler points from the engine's ``_run`` and raises SIGINT
    at point ``at`` (None: only count; ``setup`` then ends at the first block)."""

    def __init__(self, at: int | None) -> None:
        self.at = at
        self.count = 0
        self.setup = 0  # points before the engine's loop began (counting run)
        self.loop_end = 0  # points up to the loop's end; the clean-up follows (counting run)
        self.on = False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        code = frame.f_code
        if event == "return" and self.on and self.at is None and code.co_name == "_loop" \
                and code.co_filename.endswith("engine.py"):
            self.loop_end = self.count
        if event not in _POINTS:
            return
        if not self.on:
            self.on = event == "call" and code.co_name == "_run" \
                and code.co_filename.endswith("engine.py")
            if not self.on:
                return
        self.count += 1
        if self.at is None:
            if not self.setup and event == "call" and code.co_name == "_loop":
                self.setup = self.count
        elif self.count == self.at:
            sys.setprofile(None)
            signal.raise_signal(signal.SIGINT)


def _band(first: int, last: int, most: int) -> list[int]:
    """Points ``first`` to ``last``: all of them, or ``most`` evenly spread."""
    step = max(1, -(-(last - first + 1) // most))
    return list(range(first, last + 1, step))


def _points(total: int, setup: int, loop_end: int) -> list[int]:
    """The set-up and the clean-up (from the loop's end to the stream's, where the engine
    gives everything back and the stream's deferral ends) densely, the blocks sampled."""
    return sorted({*_band(1, setup, SETUP_POINTS),
                   *_band(setup + 1, loop_end, RUN_SAMPLES),
                   *_band(loop_end + 1, total, SETUP_POINTS)})


# One device: the points are the engine's, the same on every device (and each costs a stream).
@pytest.mark.skipif(not DEVICES, reason="no usable device")
# Past the stream's deferral a point can fall in a weakref callback the garbage collector runs;
# Python prints a KeyboardInterrupt raised there as unraisable and drops it, as it would a
# real Ctrl-C at that moment.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("shape", ["map", "halo", "sum"])
def test_ctrl_c_at_every_point_leaves_nothing_behind(shape: str) -> None:
    device = DEVICES[0]
    a = np.arange(6_000, dtype=np.float32)
    b = np.ones_like(a)
    if shape == "halo":
        k = kernel(device, "sten")

        def run(c: np.ndarray) -> Any:
            return cv.stream(k, [a], [c], args=(1, 1), halo=1,
                             device=device, block_bytes=4096, zero_copy=False, workers=2)
    elif shape == "sum":
        k = kernel(device, "ident")

        def run(c: np.ndarray) -> Any:
            return cv.stream(k, [a], reduce="sum", device=device, block_bytes=4096,
                             zero_copy=False, workers=2)
    else:
        k = kernel(device, "add")

        def run(c: np.ndarray) -> Any:
            return cv.stream(k, [a, b], [c], device=device, block_bytes=4096,
                             zero_copy=False, workers=2)

    reference = np.zeros_like(a)
    expected = run(reference)  # first: the points are counted with every kernel built
    counter = _Shot(None)
    sys.setprofile(counter)
    try:
        run(np.zeros_like(a))
    finally:
        sys.setprofile(None)
    assert 0 < counter.setup < counter.loop_end < counter.count, "the sweep counts nothing"
    print(f"{shape}: {counter.setup} set-up points, {counter.count - counter.loop_end} "
          f"clean-up points, {counter.count} in all")
    interrupted = 0
    interval = sys.getswitchinterval()
    for at in _points(counter.count, counter.setup, counter.loop_end):
        c = np.zeros_like(a)
        try:
            sys.setprofile(_Shot(at))
            try:
                run(c)
            finally:
                sys.setprofile(None)
        except KeyboardInterrupt:
            interrupted += 1
        left = [t.name for t in threading.enumerate() if t.name.startswith(_STREAM_THREADS)]
        assert not left, f"Ctrl-C at point {at}: threads left running: {left}"
        assert in_use(device) == (0, 0), f"Ctrl-C at point {at}: (device, pinned) bytes in use"
        assert sys.getswitchinterval() == interval, f"Ctrl-C at point {at}: interval left low"
    assert interrupted, "no stream was interrupted: the sweep tried nothing"
    c = np.zeros_like(a)
    again = run(c)
    if shape == "sum":
        assert again.result == expected.result
    else:
        np.testing.assert_array_equal(c, reference)
