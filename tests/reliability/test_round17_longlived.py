"""Round seventeen, a long-lived process: one that calls ``cv.stream`` many times (a service, a
notebook), after every kind of failure, and keeps what streams give back (reports, exceptions).
After each kind of failure, repeated, the next stream is exact and nothing has piled up: open
files, threads, memory maps, temporary files, pool bytes in use, kept registrations,
builds in flight, the process's switch interval and Ctrl-C handler. Devices are opened and
closed repeatedly. Every result is compared with NumPy's.

Found (strict xfails, each asserting the right behaviour):

- A report that is kept keeps every host array its copies read alive until its timeline is
  read: ``Path._copy_in``/``_copy_out`` (pipeline/paths.py) record PyOpenCL's copy events,
  ``NannyEvent``s, which hold the copy's host array until waited on, and the report's
  ``timeline_source`` closure holds those records. A pinned input (``cv.pinned``) dropped
  by the caller stays in use in the pinned pool for as long as the report lives (a notebook's
  ``Out[n]``, a service's history of reports), and the staging blocks the pools trim stay
  mapped: 40 kept reports of streams of 0.2-0.6 M float32 rows held 108 MiB more RSS than
  40 dropped ones (with ``report.outputs`` emptied), 0 MiB more once the events were detached.
- ``cv.release_pinned()``, ``cv.configure(pinned_budget=...)`` and ``device.close()`` raise a raw
  KeyError when a garbage collection, which Python runs at any allocation (here: while one
  registration is closed), frees another kept array: its finalizer ``keep._forget`` takes
  keep's lock without waiting, which succeeds on the thread that already holds that
  reentrant lock, and deletes the array's entry from ``_kept`` in the middle of the loop that
  is releasing it (``del _kept[kept.key]``: KeyError). The registrations after it stay
  registered, and ``device.close()`` stops before closing its pools (their held bytes stay).
- A pool's ``limit`` lowered at run time below what the pool holds is not kept: the idle
  blocks stay (61,440 bytes held under a 4,096-byte limit) and the next stream takes its ring
  from them, using 15 times the limit with no OutOfMemoryError. The setter only stores the
  value (memory/pool.py), and ``_take_idle`` hands out idle blocks without the limit check
  that ``_allocate_reserved`` makes for new ones.
- ``progress=True`` in a process whose stderr breaks mid-stream (EPIPE: ``| tee`` killed, an
  ssh session closed) fails the whole stream after every block ran: ``Progress.close()``
  (pipeline/progress.py), in ``Engine._run``'s ``finally``, raises tqdm's BrokenPipeError
  before ``commit_all``, so a file output is thrown away (a ``trace=`` that cannot be written
  is only a warning). tqdm's monitor thread is left running as well.
"""

from __future__ import annotations

import errno
import gc
import io
import os
import signal
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    add_reference,
    data,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    in_use,
    kernel,
    next_stream_right,
    stage_threads,
    vadd_arrays,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import CompileError, InputError, OutOfMemoryError  # noqa: E402
from conveyor.kernels import build  # noqa: E402
from conveyor.memory import keep  # noqa: E402


@pytest.fixture
def ctx(device):
    """Another context (own pools) on ``device``, closed after the test."""
    if device.backend != "opencl":
        pytest.skip("a second context is made for OpenCL devices only")
    from conveyor.backends import opencl

    platform, index = (int(part) for part in device.spec.split(":")[1:])
    made = opencl.Device(device.cl_device, platform, index)  # type: ignore[attr-defined]
    yield made
    gc.collect()
    keep.release_device(made)
    made.close()


ROWS = 1000
BLOCK = 800  # bytes: 200 float32 rows, five blocks


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def _maps() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for _ in maps)


def _state(device: cv.Device, folder: Path, tmp: Path) -> dict[str, object]:
    """What a long-lived process must not accumulate from one failed stream to the next."""
    gc.collect()
    return {
        "output folder": sorted(os.listdir(folder)),
        "TMPDIR": sorted(os.listdir(tmp)),
        "kept": len(keep._kept),
        "forgotten": len(keep._forgotten),
        "builds in flight": len(build._in_flight),
        "switch interval": sys.getswitchinterval(),
        "SIGINT handler": signal.getsignal(signal.SIGINT),
    }


# -- 1. the next stream after each kind of failure, repeated ---------------------------------
def _fail_callable(device, a, b, folder):
    def compute(x, y, c, *, queue, offset, n):
        if offset >= 3 * BLOCK // 4:
            raise ZeroDivisionError("injected in a callable")
        return x + y

    cv.stream(compute, [a, b], [np.zeros_like(a)], device=device, block_bytes=BLOCK,
              workers=2)


def _fail_interrupt(device, a, b, folder):
    def compute(x, y, c, *, queue, offset, n):
        if offset >= 3 * BLOCK // 4:
            raise KeyboardInterrupt
        return x + y

    cv.stream(compute, [a, b], [cv.npy_out(folder / "i.npy")], device=device,
              block_bytes=BLOCK, workers=2)


def _fail_refused(device, a, b, folder):
    np.save(folder / "in.npy", a)
    try:
        cv.stream(kernel(device, "add"), [cv.npy(folder / "in.npy"), b[:-1]],
                  [cv.npy_out(folder / "r.npy")], device=device, block_bytes=BLOCK)
    finally:
        os.unlink(folder / "in.npy")


def _fail_write(device, a, b, folder):
    real = os.pwritev
    calls: list[int] = []

    def pwritev(fd, buffers, offset):  # the disk fills up at the second block
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buffers, offset)

    os.pwritev = pwritev
    try:
        cv.stream(kernel(device, "add"), [a, b], [cv.npy_out(folder / "w.npy")], device=device,
                  block_bytes=BLOCK, workers=2)
    finally:
        os.pwritev = real


def _fail_memory(device, a, b, folder):
    pool = device.pinned_pool
    limit = pool.limit
    pool.trim()  # what it holds idle would serve the ring past the limit (see below)
    pool.limit = 4096
    try:
        cv.stream(kernel(device, "add"), [a, b], [np.zeros_like(a)], device=device,
                  block_bytes=BLOCK, zero_copy=False, workers=2)
    finally:
        pool.limit = limit


def _fail_iterable(device, a, b, folder):
    def chunks():
        yield a[:300]
        yield a[300:600]
        raise OSError(errno.EIO, "the reader's disk went away")

    cv.stream(kernel(device, "scale"), [cv.iterate(chunks(), length=ROWS)],
              [np.zeros_like(a)], args=(2.0,), device=device, block_bytes=BLOCK, workers=2)


def _fail_fold(device, a, b, folder):
    folds: list[int] = []

    def fold(x, y):
        folds.append(1)
        if len(folds) == 2:
            raise ValueError("injected in reduce=")
        return x + y

    def partial(x, *, queue, offset, n):
        return float(offset)

    cv.stream(partial, [a], reduce=fold, device=device, block_bytes=BLOCK, workers=2)


BAD_SOURCE = """__kernel void broken(__global const float *x, __global float *y, ulong offset,
                     ulong n) { y[0] = undeclared_name; }"""


def _fail_compile(device, a, b, folder):
    device.compile(BAD_SOURCE, "broken")


FAILURES = {
    "callable": (_fail_callable, ZeroDivisionError, 30),
    "interrupt": (_fail_interrupt, KeyboardInterrupt, 30),
    "refused": (_fail_refused, InputError, 30),
    "write": (_fail_write, OSError, 30),
    "memory": (_fail_memory, OutOfMemoryError, 30),
    "iterable": (_fail_iterable, OSError, 30),
    "fold": (_fail_fold, ValueError, 30),
    "compile": (_fail_compile, CompileError, 4),  # a build each: few
}


@pytest.mark.parametrize("kind", list(FAILURES))
def test_repeated_failures_leave_nothing_behind_and_the_next_stream_is_right(
        device, tmp_path, monkeypatch, kind):
    # guard: each kind of failure, repeated with the exceptions kept (a service's error log),
    # leaves no file, thread, task, map, temporary file, pool byte, registration or build
    # behind, the process's switch interval and Ctrl-C handler as they were, and the next
    # streams exact.
    if device.backend != "opencl" and kind in ("callable", "interrupt"):
        pytest.skip("these callables add PyOpenCL arrays")
    fail, error, repeats = FAILURES[kind]
    folder, tmp = tmp_path / "out", tmp_path / "tmp"
    folder.mkdir()
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    kernel(device, "add"), kernel(device, "scale")
    a, b, _ = vadd_arrays(ROWS, seed=3)
    for _ in range(2):  # what a first call makes once (warning registries, kernels)
        with pytest.raises(error):
            fail(device, a, b, folder)
    next_stream_right(device)
    before, maps, tasks = _state(device, folder, tmp), _maps(), _tasks()
    fds, threads = _open_fds(), Counter(t.name for t in threading.enumerate())
    kept: list[BaseException] = []
    for _ in range(repeats):
        try:
            fail(device, a, b, folder)
        except error as exc:
            kept.append(exc)
    assert len(kept) == repeats
    gc.collect()
    assert in_use(device) == (0, 0)  # the exceptions kept hold no pool block
    for pool in (device.memory_pool, device.pinned_pool):
        assert pool.stats().pending_bytes == 0
    assert stage_threads() == []
    next_stream_right(device)
    after = _state(device, folder, tmp)
    assert after == before
    assert _open_fds() <= fds
    assert not Counter(t.name for t in threading.enumerate()) - threads  # none new
    # The driver's own threads come and go (PoCL): a margin, where one per failure is 30.
    assert _tasks() <= tasks + 4
    assert _maps() <= maps + 8


def test_one_array_through_many_streams_kept_and_dropped_between_failures(device):
    # guard: one pageable array streamed again and again with keep_pinned=True, a failure
    # every third stream, gc between: registered once, exact every time, released when freed.
    a, b, _ = vadd_arrays(ROWS, seed=5)
    k = kernel(device, "add")
    start = len(keep._kept)

    def compute(x, y, c, *, queue, offset, n):
        raise ZeroDivisionError("injected")

    for index in range(30):
        c = np.zeros_like(a)
        if index % 3 == 2:
            with pytest.raises(ZeroDivisionError):
                cv.stream(compute, [a, b], [c], device=device, block_bytes=BLOCK,
                          keep_pinned=True)
        else:
            cv.stream(k, [a, b], [c], device=device, block_bytes=BLOCK, zero_copy=False,
                      keep_pinned=True)
            np.testing.assert_array_equal(c, add_reference(a, b))
        gc.collect()
        assert len(keep._kept) <= start + 3  # a, b and this stream's c at most
    del a, b, c
    gc.collect()
    assert len(keep._kept) == start
    assert in_use(device) == (0, 0)


# -- 2. devices opened and closed over and over ---------------------------------------------
def test_contexts_opened_used_and_closed_again_and_again_leave_nothing_behind(device):
    # guard: a new context each time (with-statement), a kernel, a pinned input, a kept
    # array and a failed stream on it: every context is freed (none kept alive by a memo),
    # no file, thread or map piles up, and the shared device still streams right.
    if device.backend != "opencl":
        pytest.skip("a second context is made for OpenCL devices only")
    from streamkit import _TEMPLATE

    from conveyor.backends import opencl

    platform, index = (int(part) for part in device.spec.split(":")[1:])
    source = cv.portable(_TEMPLATE.format(name="float32", t="float"))
    a, b, _ = vadd_arrays(ROWS, seed=7)

    def once() -> None:
        with opencl.Device(device.cl_device, platform, index) as made:  # type: ignore[attr-defined]
            k = made.compile(source, "add_float32")
            pinned_a = cv.pinned.asarray(a, device=made)
            kept_b = b.copy()
            assert cv.keep_pinned(kept_b, device=made)
            c = np.zeros_like(a)
            cv.stream(k, [pinned_a, kept_b], [c], device=made, block_bytes=BLOCK,
                      zero_copy=False)
            np.testing.assert_array_equal(c, add_reference(a, b))

            def compute(x, y, c, *, queue, offset, n):
                raise ZeroDivisionError("injected")

            with pytest.raises(ZeroDivisionError):
                cv.stream(compute, [pinned_a, kept_b], [c], device=made, block_bytes=BLOCK)

    for _ in range(3):
        once()
    gc.collect()
    fds, threads, tasks, maps = _open_fds(), threading.active_count(), _tasks(), _maps()
    owners, kept = len(build._memo_owners), len(keep._kept)
    for _ in range(20):
        once()
    gc.collect()
    assert _open_fds() <= fds and threading.active_count() <= threads
    assert _tasks() <= tasks + 4 and _maps() <= maps + 8  # one per context would be 20
    assert len(build._memo_owners) <= owners  # closed contexts are not kept by their kernels
    assert len(keep._kept) == kept
    next_stream_right(device)


# -- 3. what a long-lived process keeps: reports --------------------------------------------
def test_a_kept_report_holds_no_pinned_input_the_caller_dropped(device):
    # A service keeps its reports (a history, a notebook's Out[n]); the caller drops the
    # pinned inputs once the stream returns. Their blocks must go back to the pinned pool.
    x = data((20_000,), np.float32, 9)
    y = np.ones_like(x)
    reports = []
    for _ in range(3):
        pinned_x = cv.pinned.asarray(x, device=device)
        pinned_y = cv.pinned.asarray(y, device=device)
        reports.append(cv.stream(kernel(device, "add"), [pinned_x, pinned_y], [np.float32],
                                 device=device, block_bytes=4000, zero_copy=False))
        del pinned_x, pinned_y
    gc.collect()
    held = device.pinned_pool.stats().in_use_bytes
    for report in reports:
        np.testing.assert_array_equal(report.outputs[0], add_reference(x, y))
        assert len(report.timeline.spans) > 0  # the timeline is still there to read
    del reports, report
    gc.collect()
    assert held == 0  # was 3 streams x 2 inputs x 81920 bytes = 491,520


# -- 4. kept arrays freed by a collection while others are released -------------------------
class _Cycle:
    """An object in a reference cycle: only the collector frees it (and its array)."""


class _CollectsOnClose:
    """A kept array's real registration, whose close() meets a garbage collection (Python
    collects at any allocation: one made while the driver's buffer is released)."""

    def __init__(self, real) -> None:
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def close(self) -> None:
        gc.collect()
        self._real.close()


def _keep_two_and_lose_one(dev: cv.Device) -> tuple[np.ndarray, np.ndarray]:
    """Keep ``first`` (whose release meets a collection), then an array only a cycle holds
    (dropped: the next collection frees it), then ``last``; return ``first`` and ``last``."""
    first = np.ones(1024, np.float32)
    assert cv.keep_pinned(first, device=dev)
    entry = keep._kept[keep._key(first, dev)]
    entry.registration = _CollectsOnClose(entry.registration)
    garbage = _Cycle()
    garbage.me, garbage.array = garbage, np.ones(1024, np.float32)  # type: ignore[attr-defined]
    assert cv.keep_pinned(garbage.array, device=dev)  # type: ignore[attr-defined]
    last = np.ones(1024, np.float32)
    assert cv.keep_pinned(last, device=dev)
    return first, last


@pytest.mark.parametrize("how", ["release_pinned", "pinned_budget"])
def test_releasing_kept_arrays_while_a_collection_frees_another(ctx, how):
    gc.collect()
    gc.disable()  # the one collection is the registration's, at its close
    budget = keep.configure()["pinned_budget"]
    raised: BaseException | None = None
    try:
        first, last = _keep_two_and_lose_one(ctx)
        try:
            if how == "release_pinned":
                cv.release_pinned(device=ctx)
            else:
                cv.configure(pinned_budget=0)
        except KeyError as exc:  # what it raises today
            raised = exc
        left = [k for k in keep._kept.values() if k.device is ctx]
    finally:
        gc.enable()
        keep.configure(pinned_budget=budget)
        keep.release_device(ctx)
    assert raised is None
    assert left == []


def test_closing_a_device_while_a_collection_frees_a_kept_array(ctx):
    gc.collect()
    held = cv.pinned.zeros(16, device=ctx)  # one idle pinned block for close() to free
    del held
    assert ctx.pinned_pool.stats().held_bytes > 0
    gc.disable()
    raised: BaseException | None = None
    try:
        first, last = _keep_two_and_lose_one(ctx)
        try:
            ctx.close()
        except KeyError as exc:  # what it raises today
            raised = exc
        left = [k for k in keep._kept.values() if k.device is ctx]
    finally:
        gc.enable()
        keep.release_device(ctx)
    assert raised is None
    assert left == []
    assert ctx.pinned_pool.stats().held_bytes == 0


# -- 5. a pool's limit lowered while it holds more -------------------------------------------
def test_a_pool_limit_lowered_at_run_time_is_kept_from_then_on(ctx):
    # A service lowers the pinned pool's limit (to leave room for another library) after
    # streams filled it. limit is "most bytes the pool may hold from the backend (in use +
    # held)": the idle blocks over it go back, and no later stream uses more than it.
    from streamkit import _TEMPLATE

    k = ctx.compile(cv.portable(_TEMPLATE.format(name="float32", t="float")), "add_float32")
    a, b, c = vadd_arrays(ROWS, seed=13)
    pool = ctx.pinned_pool
    cv.stream(k, [a, b], [c], device=ctx, block_bytes=BLOCK, zero_copy=False)
    assert pool.stats().held_bytes > 4096  # its staging ring, idle now
    pool.limit = 4096
    held = pool.stats().held_bytes
    pool.reset_peak()
    c[:] = 0
    try:
        cv.stream(k, [a, b], [c], device=ctx, block_bytes=BLOCK, zero_copy=False)
    except OutOfMemoryError:
        pass  # what a stream that does not fit the limit gets (after a trim(): this)
    else:
        np.testing.assert_array_equal(c, add_reference(a, b))
    peak = pool.stats().peak_in_use_bytes
    pool.limit = None
    assert held <= 4096  # was 61,440 (15 idle blocks kept)
    assert peak <= 4096  # was 61,440: the ring taken from the idle blocks, past the limit


# -- 6. the progress bar's stderr goes away mid-stream ---------------------------------------
class _Stderr(io.StringIO):
    """A process's stderr whose reader goes away (``| tee log`` killed, an ssh session
    closed): every write and flush from then on is EPIPE, as Python's own stderr gives."""

    gone = False

    def write(self, text: str) -> int:
        if self.gone:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")
        return super().write(text)

    def flush(self) -> None:
        if self.gone:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")


def test_a_progress_bar_whose_stderr_breaks_does_not_lose_the_stream(device, tmp_path,
                                                                      monkeypatch):
    # The bar is a side channel, as trace= is (a trace that cannot be written is a warning):
    # every block ran, so the output must be committed, not thrown away with the bar.
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels, PyOpenCL arrays in callables")
    a, b, _ = vadd_arrays(10_000, seed=17)
    stderr = _Stderr()
    monkeypatch.setattr(sys, "stderr", stderr)

    def compute(x, y, c, *, queue, offset, n):
        if offset >= 4000:
            stderr.gone = True  # the terminal goes away while the stream runs
        return x + y

    from tqdm import tqdm

    monitor = getattr(tqdm, "monitor", None)
    target = tmp_path / "y.npy"
    raised: str | None = None
    try:
        with pytest.warns(RuntimeWarning, match="progress bar turned off"):
            cv.stream(compute, [a, b], [cv.npy_out(target)], device=device,
                      block_bytes=4000, progress=True, workers=2)
    except BrokenPipeError as exc:  # what it raised before, from Progress.close()
        raised = repr(exc)
    finally:
        monkeypatch.setattr(sys, "stderr", sys.__stderr__)
        gc.collect()
        # The bar whose close failed is never taken off tqdm's list, and tqdm's monitor
        # thread stays: stopped here, so that no later test counts it.
        if monitor is None and getattr(tqdm, "monitor", None) is not None:
            tqdm.monitor.exit()
            tqdm.monitor = None
    assert in_use(device) == (0, 0)
    assert raised is None
    np.testing.assert_array_equal(np.load(target), a + b)
