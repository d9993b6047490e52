"""The fifth round: interruption, concurrency and the lifecycle of what a stream makes.

- A Ctrl-C landing in ``files.new_part`` between ``mkstemp`` and the rename to ``.part`` (seen
  with a SIGALRM handler that raised, swept over a file stream's duration) left a
  ``.NAME.XXXXXXXX.new`` file beside the output for ever: no later run removes it (stale
  parts are ``.part``), and the fd stayed open. The part file is now made whole, with SIGINT
  held, and the interrupt raised once the sink holds it (so ``abort()`` deletes it).
- A Ctrl-C landing in the engine's clean-up (``Engine._release``: slot buffers, staging rings,
  resident tables, queues) left everything after that point in use for good (a SIGALRM
  sweep left the staging ring's pinned blocks in use). It now runs whole, the interrupt
  raised after. The same for a program's own signal handler that raises (a timeout on
  SIGALRM, SIGTERM...): ``interrupts.deferred_sigint`` now holds those signals too where a
  Python handler is set (a SIGALRM sweep left pinned ring blocks in use, and ``.new`` files).
- A Ctrl-C just after a stream lowered the switch interval (``switching.quick_switches``),
  before it counted the stream, left the interval at 0.5 ms for good. Each half now runs
  whole.
- Two streams writing one output file (threads, or processes): ``files.commit_part`` closed
  the part's fd, dropping its lock, before the rename, so the other stream's clean-up of
  dead runs' parts deleted it (with a warning that it "did not finish") and the stream that
  had done all the work failed with a raw ``FileNotFoundError``. The sink now hands
  ``commit_part`` a duplicate fd and keeps the lock until the rename is done.
- Two threads streaming from one kept array at once (``keep_pinned=True``, copying path)
  aborted the process on PoCL: both streams' ``host_changed()`` mapped the array's buffer
  together, the second unmap failed with ``INVALID_VALUE`` (a LogicError out of
  ``cv.stream``) and the map left open made PyOpenCL call ``std::terminate`` when it was
  collected. One ``host_changed()`` per kept array runs at a time now, and a failing one no
  longer leaves the stream's holds taken (the arrays could never be released).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

from conveyor import files
from conveyor.memory import keep

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import assert_clean, kernel, next_stream_right, vadd_arrays  # noqa: E402

import conveyor as cv  # noqa: E402


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_ctrl_c_while_the_part_file_is_made_leaves_no_file(device, tmp_path, monkeypatch):
    a, b, _ = vadd_arrays(5000)
    target = tmp_path / "c.npy"
    real = files.tempfile.mkstemp

    def mkstemp(*args, **kw):  # the real file is made; Ctrl-C arrives just after
        made = real(*args, **kw)
        signal.raise_signal(signal.SIGINT)
        return made

    cv.stream(kernel(device, "add"), [a, b], [str(tmp_path / "warm.npy")], device=device,
              block_bytes=4000)  # whatever a first stream opens for good
    (tmp_path / "warm.npy").unlink()
    before = _open_fds()
    monkeypatch.setattr(files.tempfile, "mkstemp", mkstemp)
    with pytest.raises(KeyboardInterrupt):
        cv.stream(kernel(device, "add"), [a, b], [str(target)], device=device,
                  block_bytes=4000)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert _open_fds() == before
    assert_clean(device)
    cv.stream(kernel(device, "add"), [a, b], [str(target)], device=device, block_bytes=4000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npy"]
    np.testing.assert_array_equal(np.load(target), cv.stream(
        kernel(device, "add"), [a, b], [np.float32], device=device).outputs[0])
    next_stream_right(device)


class _Trying:
    """A lock that says when a thread starts waiting for it."""

    def __init__(self, lock, trying: threading.Event) -> None:
        self.lock, self.trying = lock, trying

    def __enter__(self):
        self.trying.set()
        return self.lock.__enter__()

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)


def test_two_streams_reading_one_kept_array_never_sync_it_together(device):
    a, b, _ = vadd_arrays(20_000)
    assert cv.keep_pinned(a, device=device)
    try:
        kept = keep.find(device, a)
        real = getattr(kept.registration, "host_changed", None)
        if real is None:
            pytest.skip("this backend page-locks the array itself: a stream never syncs it")
        inside, trying, other_inside = [0], threading.Event(), threading.Event()
        outputs = [np.zeros_like(a), np.zeros_like(a)]
        errors: list[BaseException] = []

        def stream(c):
            try:
                cv.stream(kernel(device, "add"), [a, b], [c], device=device,
                          block_bytes=8000, zero_copy=False)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        second = threading.Thread(target=stream, args=(outputs[1],))

        def host_changed():
            inside[0] += 1
            if inside[0] > 1:  # another stream's sync while the first one's runs
                other_inside.set()
            elif not second.is_alive():
                second.start()  # the second stream reaches its sync while this one runs
                while not (trying.is_set() or other_inside.is_set()):
                    threading.Event().wait(0.001)
                assert not other_inside.is_set(), "two syncs of one kept array at once"
            try:
                real()
            finally:
                inside[0] -= 1

        kept.registration.host_changed = host_changed
        if hasattr(kept, "sync"):
            kept.sync = _Trying(kept.sync, trying)
        stream(outputs[0])
        second.join(30)
        assert not second.is_alive()
        assert errors == [] and not other_inside.is_set()
        want = a + b + (np.arange(a.size) % 7).astype(np.float32)  # what "add" computes
        for c in outputs:
            np.testing.assert_array_equal(c, want)
    finally:
        cv.release_pinned()
    assert_clean(device)


def test_ctrl_c_while_the_stream_gives_its_buffers_back_leaks_none(device, monkeypatch):
    a, b, c = vadd_arrays(20_000)
    pool = device.memory_pool
    real, calls = pool.release, [0]

    def release(*args, **kw):  # the first slot buffer goes back; Ctrl-C arrives just after
        real(*args, **kw)
        calls[0] += 1
        if calls[0] == 1:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(pool, "release", release)
    with pytest.raises(KeyboardInterrupt):
        cv.stream(kernel(device, "add"), [a, b], [c], device=device, block_bytes=8000,
                  zero_copy=False)
    monkeypatch.undo()
    assert calls[0] > 1  # every buffer went back, not only the first
    assert_clean(device)
    next_stream_right(device)


class _InterruptedSwitches:
    """``sys`` for switching.py: Ctrl-C arrives right after the interval is lowered."""

    def __init__(self) -> None:
        self.calls = 0

    def getswitchinterval(self) -> float:
        return sys.getswitchinterval()

    def setswitchinterval(self, value: float) -> None:
        sys.setswitchinterval(value)
        self.calls += 1
        if self.calls == 1:
            signal.raise_signal(signal.SIGINT)


def test_ctrl_c_just_after_the_switch_interval_is_lowered_restores_it(device, monkeypatch):
    from conveyor.pipeline import switching

    a, b, c = vadd_arrays(5000)
    before = sys.getswitchinterval()
    monkeypatch.setenv("CONVEYOR_SWITCH_INTERVAL", "0.5ms")
    shim = _InterruptedSwitches()
    monkeypatch.setattr(switching, "sys", shim)
    try:
        with pytest.raises(KeyboardInterrupt):
            cv.stream(kernel(device, "add"), [a, b], [c], device=device, block_bytes=4000)
        assert sys.getswitchinterval() == before
        monkeypatch.undo()
        cv.stream(kernel(device, "add"), [a, b], [c], device=device, block_bytes=4000)
        assert sys.getswitchinterval() == before  # later streams restore it as well
    finally:
        sys.setswitchinterval(before)
    assert shim.calls >= 1
    assert_clean(device)


def test_another_stream_cleaning_up_while_one_commits_keeps_its_part(device, tmp_path,
                                                                     monkeypatch):
    a, b, _ = vadd_arrays(5000)
    target = tmp_path / "c.npy"
    real = files.output_target

    def output_target(path, what):  # another stream of the target starts: it cleans up first
        files.remove_stale_parts(target)
        return real(path, what)

    monkeypatch.setattr(files, "output_target", output_target)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "conveyor: removed")  # a live part taken as dead
        cv.stream(kernel(device, "add"), [a, b], [str(target)], device=device,
                  block_bytes=4000)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npy"]
    want = cv.stream(kernel(device, "add"), [a, b], [np.float32], device=device).outputs[0]
    np.testing.assert_array_equal(np.load(target), want)
    assert_clean(device)


class _Timeout(Exception):
    """What the program's SIGALRM handler raises."""


def _raise_timeout(signum, frame):
    raise _Timeout


def test_a_raising_alarm_handler_in_the_clean_up_leaks_nothing(device, monkeypatch):
    a, b, c = vadd_arrays(20_000)
    pool = device.memory_pool
    real, calls = pool.release, [0]

    def release(*args, **kw):  # the program's timeout fires just after the first buffer
        real(*args, **kw)
        calls[0] += 1
        if calls[0] == 1:
            signal.raise_signal(signal.SIGALRM)

    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    try:
        monkeypatch.setattr(pool, "release", release)
        with pytest.raises(_Timeout):
            cv.stream(kernel(device, "add"), [a, b], [c], device=device, block_bytes=8000,
                      zero_copy=False)
        monkeypatch.undo()
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert calls[0] > 1
    assert_clean(device)
    next_stream_right(device)


_KEPT_RACE = r"""
import sys, threading
import numpy as np
import conveyor as cv
sys.path.insert(0, sys.argv[2])
from streamkit import kernel
dev = cv.device(sys.argv[1])
k = kernel(dev, "scale")
x = np.arange(1 << 16, dtype=np.float32)
y = np.zeros_like(x)
cv.keep_pinned(x, device=dev)
cv.keep_pinned(y, device=dev)
errors = []
def run(inputs, outputs, scale):
    for _ in range(60):
        try:
            cv.stream(k, inputs, outputs, device=dev, block_bytes=16384, args=(scale,),
                      zero_copy=False)
        except Exception as exc:
            errors.append(repr(exc))
threads = [threading.Thread(target=run, args=([x], [y], 2.0)),
           threading.Thread(target=run, args=([y], [np.float32], 1.0)),
           threading.Thread(target=run, args=([y], [np.float32], 1.0))]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("errors", len(errors), errors[:2])
"""


def test_a_stream_writing_a_kept_array_while_others_read_it_never_crashes(device):
    """One thread streams into a kept array while two stream from it (racy, as the user's
    own code is): the per-block maps of the writer and the readers' syncs mapped one buffer at
    once, and PoCL aborted the process (two runs of three). Run apart: an abort would take
    pytest with it."""
    import subprocess

    streamkit = str(Path(__file__).resolve().parents[1] / "pipeline")
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _KEPT_RACE, device.spec, streamkit],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "errors 0 " in done.stdout, done.stdout
