"""Ctrl-C at every point of a stream where Python can run a signal handler (interrupts.py).

A real Ctrl-C at a random moment (tests/pipeline/test_interrupts.py) finds a bad moment about
once in many CI runs: a KeyboardInterrupt raised between a pool marking a block in use and the
stream owning it left the block in use for good, and one raised just after
``Condition.__enter__`` took its lock left the lock held, so the stream hung in its clean-up.
Here the moment is chosen instead of drawn. CPython runs a pending handler at the start of a
Python function and right after a C function returns; a profile hook (``sys.setprofile``) sees
exactly those points on the calling thread, and raises SIGINT at the N-th one counted from the
stream's start, for N across the whole stream, for several kinds of stream. Each stream must
then either finish or raise KeyboardInterrupt, and leave every pool at zero, no stream thread
running, the switch interval, the SIGINT handler and NumPy's error state as they were, and no
temporary or partial output file; the next stream must be exact.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest
from streamkit import in_use, kernel, store, to_host

import conveyor as cv
from conftest import DEVICES
from conveyor import interrupts

#: Threads a stream starts and must join (the compile and pre-fault pools outlive streams).
_STREAM_THREADS = ("conveyor-stage", "conveyor-ring", "conveyor-device")

#: Points where CPython 3.11 runs a pending signal handler (RESUME; CALL's eval-breaker check).
_POINTS = ("call", "c_return")

#: Set-up and clean-up points tried (each band evenly spread; each point is one stream), and
#: samples over the blocks between. ``CONVEYOR_SWEEP_ALL=1`` tries every point (some 4,000
#: a stream: minutes).
SWEEP_ALL = os.environ.get("CONVEYOR_SWEEP_ALL") == "1"
SETUP_POINTS = 10**9 if SWEEP_ALL else 150
RUN_SAMPLES = 10**9 if SWEEP_ALL else 25


class _Shot:
    """A profile hook that counts handler points from the call of ``start`` (a function name
    and the file it is in) and raises SIGINT at point ``at``. Counting (``at`` None), it also
    notes where the engine's loop began (``setup``) and ended (``loop_end``), when that loop
    runs on this thread."""

    def __init__(self, at: int | None, start: tuple[str, str]) -> None:
        self.at = at
        self.start = start
        self.count = 0
        self.setup = 0
        self.loop_end = 0
        self.on = False
        self.frame: FrameType | None = None  # start's frame: counting ends as it returns

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        code = frame.f_code
        if event == "return" and frame is self.frame:
            sys.setprofile(None)  # past the stream (reading its output is NumPy's business)
            self.frame = None  # a frame keeps its locals (a pinned array) alive
            return
        if self.at is None and self.on and code.co_name == "_loop" \
                and code.co_filename.endswith("engine.py"):
            if event == "call" and not self.setup:
                self.setup = self.count + 1
            elif event == "return":
                self.loop_end = self.count
        if event not in _POINTS:
            return
        if not self.on:
            name, file = self.start
            self.on = event == "call" and code.co_name == name \
                and code.co_filename.endswith(file)
            if not self.on:
                return
            self.frame = frame
        self.count += 1
        if self.count == self.at:
            sys.setprofile(None)
            signal.raise_signal(signal.SIGINT)


def _band(first: int, last: int, most: int) -> list[int]:
    """Points ``first`` to ``last``: all of them, or ``most`` evenly spread."""
    step = max(1, -(-(last - first + 1) // most))
    return list(range(first, last + 1, step))


def _points(counter: _Shot, scale: float) -> list[int]:
    """The set-up and the clean-up (from the loop's end to the stream's: the engine gives
    everything back, the stream's deferral ends, outputs are committed) densely, the blocks
    sampled; where the loop ran on another thread, all points evenly."""
    dense, sampled = max(int(SETUP_POINTS * scale), 1), max(int(RUN_SAMPLES * scale), 1)
    if not 0 < counter.setup < counter.loop_end < counter.count:
        return _band(1, counter.count, 2 * dense)
    return sorted({*_band(1, counter.setup, dense),
                   *_band(counter.setup + 1, counter.loop_end, sampled),
                   *_band(counter.loop_end + 1, counter.count, dense)})


class _Case:
    """One kind of stream to interrupt: ``run()`` streams and returns what to compare, ``start``
    is where counting begins, ``scale`` the share of the default points it tries, ``left()``
    what an interrupted stream must not leave (files)."""

    def __init__(self, shape: str, device: cv.Device, folder: Path) -> None:
        self.scale = 1.0
        self.start = ("_run", "engine.py")
        self.folder = folder
        a = np.arange(6_000, dtype=np.float32)
        b = np.ones_like(a)
        self.out = folder / "c.npy"
        opts: dict[str, Any] = dict(device=device, block_bytes=4096, zero_copy=False, workers=2)
        if shape == "map":
            self.stream = lambda: cv.stream(kernel(device, "add"), [a, b], [np.float32], **opts)
        elif shape == "halo":
            self.stream = lambda: cv.stream(kernel(device, "sten"), [a], [np.float32],
                                            args=(1, 1), halo=1, **opts)
        elif shape == "sum":
            self.stream = lambda: cv.stream(kernel(device, "ident"), [a], reduce="sum", **opts)
        elif shape == "callable":
            def twice(x: Any, y: Any, *, queue: Any, offset: int, n: int) -> None:
                store(y, to_host(x, queue) * 2, queue)

            self.scale = 0.4
            self.stream = lambda: cv.stream(twice, [a], [np.float32], **opts)
        elif shape == "chain":
            self.scale = 0.4
            chain = cv.chain(cv.link(kernel(device, "ident"), "in0", "t0"),
                             cv.link(kernel(device, "scale"), "t0", "out0", args=(3.0,)),
                             temps=[np.float32])
            self.stream = lambda: cv.stream(chain, [a], [np.float32], **opts)
        elif shape == "files":  # an .npy in, an .npy out: the output is committed at the end
            np.save(folder / "a.npy", a)
            self.scale = 0.4
            self.start = ("stream", "stream.py")
            self.stream = lambda: cv.stream(kernel(device, "scale"), [folder / "a.npy"],
                                            [self.out], args=(2.0,), **opts)
        elif shape == "zero-copy":  # the device reads host memory: nothing staged
            if not device.host_unified:
                pytest.skip("zero-copy needs a host-unified device")
            self.scale = 0.4
            self.stream = lambda: cv.stream(kernel(device, "add"), [a, b], [np.float32],
                                            **{**opts, "zero_copy": True})
        elif shape == "two-devices":
            pair = [d for d in DEVICES if d.backend == device.backend][:2]
            if len(pair) < 2:
                pytest.skip("needs two devices of one backend (this machine's two PoCLs)")
            self.scale = 0.4
            self.start = ("_run_engines", "multi.py")
            self.stream = lambda: cv.stream(kernel(device, "add"), [a, b], [np.float32],
                                            **{**opts, "device": pair})
        else:
            raise AssertionError(shape)

    def run(self) -> Any:
        report = self.stream()
        if report.result is not None:
            return report.result
        if self.out.exists():
            return np.load(self.out)
        return report.outputs[0]

    def left(self, expected: Any) -> str | None:
        """What an interrupted stream left that it must not: a temporary file, or an output
        that is there but not whole."""
        names = sorted(p.name for p in self.folder.iterdir())
        extra = [n for n in names if n not in ("a.npy", "c.npy")]
        if extra:
            return f"files left: {extra}"
        if self.out.exists():
            if not np.array_equal(np.load(self.out), expected):
                return "c.npy is there but not whole"
            self.out.unlink()
        return None


SHAPES = ["map", "halo", "sum", "callable", "chain", "files", "zero-copy", "two-devices"]


# One device: the points are the engine's, the same on every device (and each costs a stream).
@pytest.mark.skipif(not DEVICES, reason="no usable device")
# Past the stream's deferral a point can fall in a weakref callback the garbage collector runs;
# Python prints a KeyboardInterrupt raised there as unraisable and drops it, as it would a
# real Ctrl-C at that moment.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("shape", SHAPES)
def test_ctrl_c_at_every_point_leaves_nothing_behind(shape: str, tmp_path: Path) -> None:
    device = DEVICES[0]
    case = _Case(shape, device, tmp_path)
    expected = case.run()  # first: the points are counted with every kernel built
    assert case.left(expected) is None
    counter = _Shot(None, case.start)
    sys.setprofile(counter)
    try:
        again = case.run()
    finally:
        sys.setprofile(None)
    np.testing.assert_array_equal(again, expected)
    case.left(expected)
    points = _points(counter, case.scale)
    print(f"{shape}: {counter.count} points, {len(points)} tried "
          f"(set-up {counter.setup}, loop end {counter.loop_end})")
    interrupted = 0
    interval = sys.getswitchinterval()
    handler = signal.getsignal(signal.SIGINT)
    errors = np.geterr()
    for at in points:
        try:
            sys.setprofile(_Shot(at, case.start))
            try:
                case.run()
            finally:
                sys.setprofile(None)
        except KeyboardInterrupt:
            interrupted += 1
        threads = [t.name for t in threading.enumerate() if t.name.startswith(_STREAM_THREADS)]
        assert not threads, f"Ctrl-C at point {at}: threads left running: {threads}"
        for dev in DEVICES:
            assert in_use(dev) == (0, 0), f"Ctrl-C at point {at}: {dev.spec} bytes in use"
        assert sys.getswitchinterval() == interval, f"Ctrl-C at point {at}: interval left low"
        assert signal.getsignal(signal.SIGINT) == handler and interrupts._region is None, \
            f"Ctrl-C at point {at}: a deferral was left in place (a later Ctrl-C is lost)"
        assert np.geterr() == errors, f"Ctrl-C at point {at}: NumPy's error state left changed"
        problem = case.left(expected)
        assert problem is None, f"Ctrl-C at point {at}: {problem}"
    assert interrupted, "no stream was interrupted: the sweep tried nothing"
    np.testing.assert_array_equal(case.run(), expected)


@pytest.mark.skipif(not DEVICES, reason="no usable device")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_ctrl_c_at_every_point_of_a_pinned_allocation_leaves_no_block_in_use() -> None:
    # A Ctrl-C between the pool handing the block over and its owner (whose finalizer gives
    # it back) being made left it in use for good.
    device = DEVICES[0]
    start = ("empty", "pinned.py")

    def allocate() -> None:
        cv.pinned.empty((1000, 3), np.float32, device=device)  # dropped at once

    allocate()
    counter = _Shot(None, start)
    sys.setprofile(counter)
    try:
        allocate()
    finally:
        sys.setprofile(None)
    assert counter.count > 10, "the sweep counts nothing"
    interrupted = 0
    for at in range(1, counter.count + 1):
        try:
            sys.setprofile(_Shot(at, start))
            try:
                allocate()
            finally:
                sys.setprofile(None)
        except KeyboardInterrupt:
            interrupted += 1
        gc.collect()  # an array made before the interrupt gives its block back as it goes
        assert in_use(device) == (0, 0), f"Ctrl-C at point {at}: a pinned block in use"
    assert interrupted
