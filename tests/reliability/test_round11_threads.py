"""Round eleven (helper A): concurrency and lifecycle, tried as users and attackers would.

Several Python threads streaming at once on one device and on two, a device closed (or its
``with`` block left) under another thread's stream, streams started from inside a callable
kernel or a ``reduce=`` function, things closed twice or used after their close, arrays kept
page-locked (``cv.keep_pinned``) released, kept again, viewed and overlapped while streams
use them, ``cv.iterate`` generators that fail at odd points, and BaseException subclasses
(not Exceptions: what a KeyboardInterrupt-like signal handler raises) out of a callable or a
generator. After each failure the pools are back at zero and the next stream is right.

Found (each an ``xfail(strict=True)`` test asserting the right behaviour):

- ``Report.timeline`` built on first use is not safe for two threads: one that passed the
  ``_timeline is None`` check while another finished building it found ``timeline_source``
  already cleared and stored an EMPTY timeline over the real one, for good (``overlap`` None,
  ``busy_seconds`` {}, no spans in a saved trace), with no error.
- A kept array's registration is released under a running stream that holds it when the
  array object it was kept through is freed (another array object over the same memory, e.g.
  two ``np.frombuffer`` views of one buffer or shared memory): ``keep._forget`` ignores
  ``holds``. The stream's later blocks fall back to pageable copies: with ``strict=True`` it
  fails mid-stream with a HazardError (on CUDA the memory would be unregistered under copies
  in flight).
"""

from __future__ import annotations

import gc
import inspect
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    add_reference,
    assert_clean,
    data,
    kernel,
    next_stream_right,
    record_paths,
    run_threads,
    stencil_reference,
    store,
    to_host,
)

import conveyor as cv  # noqa: E402
from conveyor.memory import keep  # noqa: E402
from conveyor.pipeline import report as report_module  # noqa: E402

ROWS = 20_000


class Stop(BaseException):
    """What a signal handler of the program might raise: no Exception."""


@pytest.fixture(autouse=True)
def nothing_kept_before_or_after():
    keep.release_pinned()
    old = keep._budget
    yield
    keep.release_pinned()
    keep._budget = old
    assert keep.kept_bytes() == 0


def _paused_stream(device, x, y, *, at, **kw):
    """Start a stream of ``y = 3 * x`` (a callable) on a thread; it pauses in the block at
    element ``at`` until ``go`` is set. Returns (reached, go, thread, result)."""
    reached, go = threading.Event(), threading.Event()
    result: dict[str, object] = {}

    def compute(x_dev, y_dev, queue, offset, n):
        if offset == at:
            reached.set()
            assert go.wait(60)
        store(y_dev, to_host(x_dev, queue) * 3, queue)

    def run():
        try:
            result["report"] = cv.stream(compute, [x], [y], device=device, block_bytes=4000,
                                         warmup=False, **kw)
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    assert reached.wait(60)
    return go, thread, result


# -- 1. threads streaming at once, on two devices ---------------------------------------------
def test_threads_streaming_over_two_devices_at_once_are_each_exact(pair, tmp_path):
    # guard: four threads, each streaming maps, stencils, reductions and file outputs over
    # both devices (both schedules, both device orders) at once; every result exact, no pool
    # left in use, no staging thread left, the switch interval restored.
    for dev in pair:
        kernel(dev, "add"), kernel(dev, "sten"), kernel(dev, "ident", np.int32)
    interval = sys.getswitchinterval()

    def work(index):
        for round_ in range(3):
            seed = 10 * index + round_
            where = pair if (index + round_) % 2 else pair[::-1]
            schedule = ("dynamic", "static")[round_ % 2]
            a, b = data((ROWS,), np.float32, seed), data((ROWS,), np.float32, seed + 1)
            c = np.zeros_like(a)
            cv.stream(kernel(pair[0], "add"), [a, b], [c], device=where, schedule=schedule,
                      block_bytes=4000 + 4 * seed)
            np.testing.assert_array_equal(c, add_reference(a, b))
            x = data((4000, 3), np.float32, seed)
            y = np.zeros_like(x)
            cv.stream(kernel(pair[0], "sten"), [x], [y], device=where, args=(3, 2), halo=2,
                      block_bytes=3 * 4 * (100 + seed), schedule=schedule)
            np.testing.assert_array_equal(y, stencil_reference(x, 2))
            xi = data((ROWS,), np.int32, seed)
            report = cv.stream(kernel(pair[0], "ident", np.int32), [xi], device=where,
                               reduce="sum", block_bytes=4000, schedule=schedule)
            assert int(report.result) == int(xi.astype(np.int64).sum())
            out = tmp_path / f"c{index}.npy"
            cv.stream(kernel(pair[0], "add"), [a, b], [str(out)], device=where,
                      block_bytes=4000)
            np.testing.assert_array_equal(np.load(out), add_reference(a, b))

    run_threads(work, 4)
    for dev in pair:
        assert_clean(dev)
    assert sys.getswitchinterval() == interval
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"c{i}.npy" for i in range(4)]


def test_threads_on_one_device_sharing_kept_inputs_and_one_kept_output(device):
    # guard: threads streaming the same kept inputs at once, each into its own rows of one
    # kept output (DirectIn, DirectOut at offsets of one registration): exact.
    a, b = data((4 * ROWS,), np.float32, 1), data((4 * ROWS,), np.float32, 2)
    c = np.full_like(a, -1)
    for array in (a, b, c):
        assert cv.keep_pinned(array, device=device)
    k = kernel(device, "add")

    def work(index):
        lo, hi = index * ROWS, (index + 1) * ROWS
        for _ in range(3):
            cv.stream(k, [a[lo:hi], b[lo:hi]], [c[lo:hi]], device=device, block_bytes=4000,
                      zero_copy=False, first_row=lo)

    run_threads(work, 4)
    np.testing.assert_array_equal(c, add_reference(a, b))
    assert_clean(device)


# -- 2. a device closed under another thread's stream ------------------------------------------
@pytest.mark.parametrize("kept", [False, True], ids=["pageable", "kept"])
@pytest.mark.parametrize("zero_copy", [None, False], ids=["auto", "copying"])
def test_a_device_closed_by_another_thread_mid_stream(device, zero_copy, kept):
    # guard: the stream pauses in its third block (a callable waiting on an event, so no
    # timing), the main thread closes the device (twice), the stream goes on: exact, kept
    # arrays released only once it ends, pools back at zero, the next stream right.
    x, y = data((ROWS,), np.float32, 3), np.zeros(ROWS, np.float32)
    if kept:
        assert cv.keep_pinned(x, device=device) and cv.keep_pinned(y, device=device)
    go, thread, result = _paused_stream(device, x, y, at=8000, zero_copy=zero_copy)
    try:
        device.close()
        device.close()
        if kept and zero_copy is False:
            assert keep.kept_bytes() == x.nbytes + y.nbytes  # held by the stream
    finally:
        go.set()
        thread.join(60)
    assert "error" not in result, result
    np.testing.assert_array_equal(y, x * 3)
    assert keep.kept_bytes() == 0
    assert_clean(device)
    next_stream_right(device)


def test_a_with_block_of_the_device_left_while_another_thread_streams(device):
    # guard: cv.device(spec) returns the one Device of the process, so a `with` block in one
    # thread closes the device another thread streams on; that stream stays exact.
    x, y = data((ROWS,), np.float32, 4), np.zeros(ROWS, np.float32)
    go, thread, result = _paused_stream(device, x, y, at=4000, zero_copy=False)
    try:
        with cv.device(device.spec) as same:
            assert same is device
            a, b, c = data((5000,), np.float32, 5), data((5000,), np.float32, 6), None
            c = np.zeros_like(a)
            cv.stream(kernel(device, "add"), [a, b], [c], device=same, block_bytes=4000)
            np.testing.assert_array_equal(c, add_reference(a, b))
    finally:
        go.set()
        thread.join(60)
    assert "error" not in result, result
    np.testing.assert_array_equal(y, x * 3)
    assert_clean(device)
    next_stream_right(device)


@pytest.mark.parametrize("zero_copy", [None, False], ids=["auto", "copying"])
def test_every_device_closed_from_inside_a_callable_and_a_reduce_function(pair, zero_copy):
    # guard: close() from the stream's own thread (a callable; a reduce= function), on one
    # device and over both: exact, pools back at zero.
    x = data((ROWS,), np.float32, 7)

    def close_all():
        for dev in pair:
            dev.close()

    def compute(x_dev, y_dev, queue, offset, n):
        if offset == 8000:
            close_all()
        store(y_dev, to_host(x_dev, queue) * 2, queue)

    def partial(x_dev, queue, offset, n):
        return np.array([to_host(x_dev, queue).astype(np.float64).sum()])

    def fold(first, second):
        close_all()
        return first + second

    for where in (pair[0], pair):
        y = np.zeros_like(x)
        cv.stream(compute, [x], [y], device=where, block_bytes=4000, zero_copy=zero_copy,
                  warmup=False)
        np.testing.assert_array_equal(y, x * 2)
        report = cv.stream(partial, [x], reduce=fold, device=where, block_bytes=4000,
                           zero_copy=zero_copy)
        assert report.result.tolist() == [x.astype(np.float64).sum()]
        for dev in pair:
            assert_clean(dev)


# -- 3. streams started from inside a stream ---------------------------------------------------
@pytest.mark.filterwarnings("ignore::conveyor.hazards.HazardWarning")  # the inner ring's miss
def test_streams_started_inside_a_callable_and_a_reduce_function_are_exact(device):
    # guard: re-entrancy on the same device, with kept arrays the outer stream holds, which
    # the inner stream reads, and which the callable releases and keeps again meanwhile.
    k = kernel(device, "add")
    x = data((ROWS,), np.float32, 8)
    y, z = np.zeros_like(x), np.zeros_like(x)
    for array in (x, y, z):
        assert cv.keep_pinned(array, device=device)
    inner: list[bool] = []

    def stream_inside():
        z[:] = 0
        cv.stream(k, [x, x], [z], device=device, block_bytes=3000, zero_copy=False)
        inner.append(bool(np.array_equal(z, add_reference(x, x))))

    def compute(x_dev, y_dev, queue, offset, n):
        if offset in (4000, 12000):
            stream_inside()
            assert cv.release_pinned(x) == x.nbytes
            assert cv.keep_pinned(x, device=device)
        store(y_dev, to_host(x_dev, queue) * 2, queue)

    def partial(x_dev, queue, offset, n):
        return np.array([to_host(x_dev, queue).astype(np.float64).sum()])

    def fold(first, second):
        stream_inside()
        return first + second

    for zero_copy in (None, False):
        y[:] = 0
        cv.stream(compute, [x], [y], device=device, block_bytes=4000, zero_copy=zero_copy)
        np.testing.assert_array_equal(y, x * 2)
        report = cv.stream(partial, [x], reduce=fold, device=device, block_bytes=4000,
                           zero_copy=zero_copy)
        assert report.result.tolist() == [x.astype(np.float64).sum()]
    assert inner and all(inner), inner
    assert keep.kept_bytes() == 3 * x.nbytes
    assert_clean(device)


@pytest.mark.parametrize("fail", [False, True], ids=["exact", "inner-raises"])
def test_a_stream_over_two_devices_inside_a_callable_of_one(pair, fail):
    # guard: a stream over both devices started from a callable running on a device thread
    # of another stream over both; a BaseException of the inner callable reaches the outer
    # stream's caller as itself, and every pool is back at zero with no thread left.
    x = data((ROWS,), np.float32, 9)
    inner: list[bool] = []

    def add_one(x_dev, y_dev, queue, offset, n):
        if fail and offset == 1000:
            raise Stop("inner")
        store(y_dev, to_host(x_dev, queue) + 1, queue)

    def outer(x_dev, y_dev, queue, offset, n):
        host = to_host(x_dev, queue)
        if offset in (4000, 12000):
            a = np.repeat(host[:1000], 5)
            z = np.zeros_like(a)
            cv.stream(add_one, [a], [z], device=pair, block_bytes=400)
            inner.append(bool(np.array_equal(z, a + 1)))
        store(y_dev, host * 2, queue)

    y = np.zeros_like(x)
    if fail:
        with pytest.raises(Stop, match="inner"):
            cv.stream(outer, [x], [y], device=pair, block_bytes=4000, warmup=False)
    else:
        cv.stream(outer, [x], [y], device=pair, block_bytes=4000, warmup=False)
        np.testing.assert_array_equal(y, x * 2)
        assert inner == [True, True]
    for dev in pair:
        assert_clean(dev)
    assert not [t for t in threading.enumerate() if t.name.startswith("conveyor-device")]


def test_a_generator_that_streams_each_chunk_on_either_device(pair):
    # guard: a cv.iterate generator, called on the outer stream's staging thread, makes
    # every chunk with a stream of its own, on the same device or the other: exact, with
    # and without a halo.
    x = data((ROWS,), np.float32, 26)

    def doubled(dev, cols):
        for start in range(0, ROWS, 1500):
            part = x[start : start + 1500]
            out = np.zeros_like(part)
            cv.stream(kernel(dev, "scale"), [part], [out], args=(np.float32(2),), device=dev,
                      block_bytes=400)
            yield out.reshape(-1, cols)

    for outer in pair:
        for inner in pair:
            y = np.zeros_like(x)
            cv.stream(kernel(outer, "ident"), [cv.iterate(doubled(inner, 1), ROWS)],
                      [y.reshape(-1, 1)], device=outer, block_bytes=4000)
            np.testing.assert_array_equal(y, x * 2)
            ys = np.zeros((ROWS // 4, 4), np.float32)
            cv.stream(kernel(outer, "sten"), [cv.iterate(doubled(inner, 4), ROWS // 4)], [ys],
                      args=(4, 1), halo=1, device=outer, block_bytes=4000)
            np.testing.assert_array_equal(ys, stencil_reference((x * 2).reshape(-1, 4), 1))
    for dev in pair:
        assert_clean(dev)


# -- 4. BaseExceptions out of a callable, a reduce function, a generator ------------------------
@pytest.mark.parametrize("exc", [Stop, KeyboardInterrupt, SystemExit])
def test_base_exceptions_from_a_callable_leave_nothing_behind(device, pair, tmp_path, exc):
    # guard: raised in the first, a middle or the last block (and from the warm-up call), on
    # one device and over two, into an array or a file: raised as itself, pools at zero, no
    # output file (nor part) left, the next stream right.
    x = data((ROWS,), np.float32, 10)

    def raising(at):
        def compute(x_dev, y_dev, queue, offset, n):
            if offset == at:
                raise exc("boom")
            store(y_dev, to_host(x_dev, queue) * 2, queue)
        return compute

    def partial(x_dev, queue, offset, n):
        return np.array([to_host(x_dev, queue).sum()])

    def fold(first, second):
        raise exc("fold")

    for where in (device, pair):
        for at, warmup in ((0, True), (0, False), (8000, False), (19000, False)):
            for out in (np.zeros_like(x), str(tmp_path / "y.npy")):
                with pytest.raises(exc):
                    cv.stream(raising(at), [x], [out], device=where, block_bytes=4000,
                              warmup=warmup, zero_copy=False)
                assert list(tmp_path.iterdir()) == []
        with pytest.raises(exc, match="fold"):
            cv.stream(partial, [x], reduce=fold, device=where, block_bytes=4000)
        for dev in pair:
            assert_clean(dev)
    next_stream_right(device)


def test_stop_iteration_from_a_callable_or_a_fold_is_raised_not_taken_for_an_end(device, pair):
    # guard: a StopIteration raised inside conveyor's loops could end one of them quietly
    # (blocks skipped, no error): it is raised as itself, from a map, a partial and a fold.
    x = data((ROWS,), np.float32, 11)

    def compute(x_dev, y_dev, queue, offset, n):
        if offset == 8000:
            raise StopIteration("map")
        store(y_dev, to_host(x_dev, queue), queue)

    def partial(x_dev, queue, offset, n):
        if offset == 12000:
            raise StopIteration("partial")
        return np.array([to_host(x_dev, queue).sum()])

    def fold(first, second):
        raise StopIteration("fold")

    for where in (device, pair):
        with pytest.raises(StopIteration, match="map"):
            cv.stream(compute, [x], [np.zeros_like(x)], device=where, block_bytes=4000)
        with pytest.raises(StopIteration, match="partial"):
            cv.stream(partial, [x], reduce="sum", device=where, block_bytes=4000)
        with pytest.raises(StopIteration, match="fold"):
            cv.stream(partial, [x[:8000]], reduce=fold, device=where, block_bytes=4000)
        for dev in pair:
            assert_clean(dev)


def _chunks(array, sizes, *, fail_at=None, exc=Stop, cast_at=None, closed=None):
    """Chunks of ``array`` of the ``sizes`` in turn; raises ``exc`` instead of chunk
    ``fail_at`` ("end": after the last), yields chunk ``cast_at`` as float64."""
    start, count = 0, 0
    try:
        while start < len(array):
            if count == fail_at:
                raise exc("in the generator")
            size = sizes[count % len(sizes)]
            chunk = array[start : start + size]
            yield chunk.astype(np.float64) if count == cast_at else chunk
            start, count = start + size, count + 1
        if fail_at == "end":
            raise exc("in the generator")
    finally:
        if closed is not None:
            closed.append(True)


@pytest.mark.parametrize("exc", [Stop, KeyboardInterrupt, GeneratorExit])
def test_generators_raising_base_exceptions_at_odd_points(device, exc):
    # guard: a cv.iterate generator raising in its second, a middle or after its last
    # chunk (the stream's final ask), plain and with a halo, staged on threads: raised as
    # itself, its finally run, pools at zero.
    a, b = data((ROWS,), np.float32, 12), data((ROWS,), np.float32, 13)
    for fail_at in (1, 7, "end"):
        for halo in (0, 1):
            closed: list[bool] = []
            chunks = _chunks(a.reshape(-1, 4) if halo else a, [333, 777], fail_at=fail_at,
                             exc=exc, closed=closed)
            source = cv.iterate(chunks, ROWS // 4 if halo else ROWS)
            with pytest.raises(exc, match="in the generator"):
                if halo:
                    cv.stream(kernel(device, "sten"), [source],
                              [np.zeros((ROWS // 4, 4), np.float32)], args=(4, 1), halo=1,
                              device=device, block_bytes=4000)
                else:
                    cv.stream(kernel(device, "add"), [source, b], [np.zeros_like(a)],
                              device=device, block_bytes=4000)
            assert closed == [True]
            assert_clean(device)
    next_stream_right(device)


@pytest.mark.parametrize("cast_at", [1, 5, 30])
def test_a_generator_yielding_another_dtype_part_way_is_refused(device, cast_at):
    # guard: an InputError naming both dtypes, the generator closed, pools at zero, and the
    # output rows the stream wrote are its own (nothing else written).
    a, b = data((ROWS,), np.float32, 14), data((ROWS,), np.float32, 15)
    closed: list[bool] = []
    c = np.zeros_like(a)
    with pytest.raises(cv.InputError, match="float64 rows .* after float32 rows"):
        cv.stream(kernel(device, "add"),
                  [cv.iterate(_chunks(a, [333], cast_at=cast_at, closed=closed), ROWS), b],
                  [c], device=device, block_bytes=4000)
    assert closed == [True]
    written = c != 0
    np.testing.assert_array_equal(c[written], add_reference(a, b)[written])
    assert_clean(device)


def test_one_iterate_input_given_twice_to_one_stream_is_read_once(device):
    # guard: the same cv.iterate object as both inputs of one stream: each block's rows are
    # held for the second read, so the answer is a + a.
    a = data((ROWS,), np.float32, 16)
    source = cv.iterate(_chunks(a, [333, 1234]), ROWS)
    c = np.zeros_like(a)
    cv.stream(kernel(device, "add"), [source, source], [c], device=device, block_bytes=4000)
    np.testing.assert_array_equal(c, add_reference(a, a))
    with pytest.raises(cv.InputError, match="serves one stream"):
        cv.stream(kernel(device, "add"), [source, a], [c], device=device, block_bytes=4000)
    assert_clean(device)


# -- 5. kept arrays: views, overlaps, twice, release under a stream -----------------------------
def _chosen(monkeypatch):
    """Record the path classes each stream chooses (inputs, outputs)."""
    return record_paths(monkeypatch)


def test_views_of_kept_arrays_at_odd_byte_offsets_go_direct_and_exact(device, monkeypatch):
    # guard: views of a kept uint8 input and output starting at odd bytes, copied buffer to
    # buffer at offsets of the registration: exact, and no byte outside the view written.
    chosen = _chosen(monkeypatch)
    base = (np.arange(100_003) % 251).astype(np.uint8)
    other = data((100_003,), np.uint8, 17)
    out = np.zeros(100_003, np.uint8)
    assert cv.keep_pinned(base, device=device) and cv.keep_pinned(out, device=device)
    k = kernel(device, "add", np.uint8)
    for lo, hi in ((3, 50_001), (1, 100_003), (77_777, 99_999), (0, 1)):
        out[:] = 7
        chosen.clear()
        cv.stream(k, [base[lo:hi], other[lo:hi]], [out[lo:hi]], device=device,
                  block_bytes=999, zero_copy=False)
        assert chosen[0][1] == ["DirectOut"] and "DirectIn" in chosen[0][0]
        np.testing.assert_array_equal(out[lo:hi], add_reference(base[lo:hi], other[lo:hi]))
        assert (out[:lo] == 7).all() and (out[hi:] == 7).all()


def test_overlapping_kept_views_and_changes_through_one_of_them(device, monkeypatch):
    # guard: two kept views that overlap; a stream of either, of their common rows, or of
    # rows neither covers alone is exact, also after the host changes the rows through the
    # other view between streams.
    # On the GPU run of round eleven, NVIDIA's OpenCL read rows changed through `second` stale
    # in a stream of `first`: a block's copy went through `second`'s registration, which the
    # stream had not synced. CUDA refuses to register memory already registered in part.
    chosen = _chosen(monkeypatch)
    x = data((40_000,), np.float32, 18)
    first, second = x[:30_000], x[10_000:]
    assert cv.keep_pinned(first, device=device)
    both = cv.keep_pinned(second, device=device)
    assert both == (device.backend != "cuda")
    assert keep.kept_bytes() == first.nbytes + (second.nbytes if both else 0)
    k = kernel(device, "add")
    for view, path in ((x, "StagedIn"), (first, "DirectIn"),
                       (second, "DirectIn" if both else "StagedIn"),
                       (x[5_000:35_000], "StagedIn"), (x[10_000:30_000], "DirectIn")):
        out = np.zeros_like(view)
        chosen.clear()
        cv.stream(k, [view, view], [out], device=device, block_bytes=4000, zero_copy=False)
        assert chosen[0][0][0] == path
        np.testing.assert_array_equal(out, add_reference(view, view))
    out = np.zeros_like(first)
    for _ in range(3):
        second += np.float32(1)  # rows 10,000: of `first` change through `second`
        cv.stream(k, [first, first], [out], device=device, block_bytes=4000, zero_copy=False)
        np.testing.assert_array_equal(out, add_reference(first, first))


def test_keep_twice_release_twice_and_close_twice(device):
    # guard: keeping one array twice (also through a reshaped view of the same bytes) is one
    # registration; a second release frees nothing; closing a device or a resident handle
    # twice is nothing.
    a = data((ROWS,), np.float32, 19)
    assert cv.keep_pinned(a, device=device) and cv.keep_pinned(a, device=device)
    assert cv.keep_pinned(a.reshape(-1, 4), device=device)
    assert keep.kept_bytes() == a.nbytes
    assert cv.release_pinned(a) == a.nbytes
    assert cv.release_pinned(a) == 0
    assert keep.kept_bytes() == 0
    device.close()
    device.close()
    table = np.arange(4, dtype=np.float32)
    handle = cv.resident(table)
    handle.close()
    handle.close()
    assert_clean(device)
    next_stream_right(device)


def test_a_release_by_another_thread_waits_for_the_stream_that_uses_the_array(device):
    # guard: released (and the budget lowered to nothing) while a paused stream reads and
    # writes the kept arrays: they stay registered until it ends, the stream is exact and
    # takes the direct paths to its end, and keeping one again afterwards works.
    x, y = data((ROWS,), np.float32, 20), np.zeros(ROWS, np.float32)
    assert cv.keep_pinned(x, device=device) and cv.keep_pinned(y, device=device)
    go, thread, result = _paused_stream(device, x, y, at=8000, zero_copy=False, strict=True)
    try:
        assert cv.release_pinned() == x.nbytes + y.nbytes
        cv.configure(pinned_budget=0)
        assert keep.kept_bytes() == x.nbytes + y.nbytes
    finally:
        go.set()
        thread.join(60)
    assert "error" not in result, result  # strict: no pageable copy after the release
    np.testing.assert_array_equal(y, x * 3)
    assert keep.kept_bytes() == 0
    cv.configure(pinned_budget="1GiB")
    assert cv.keep_pinned(x, device=device)


def test_a_registration_held_by_a_stream_outlives_the_array_object_it_was_kept_through(device):
    # Two NumPy arrays over one buffer (np.frombuffer twice; shared memory): the first is
    # kept, the stream reads the second (found by address, held). The first is dropped in
    # the middle of the stream: the registration must stay until the stream lets go, as
    # release_pinned's does. Today keep._forget (its weakref finalizer) closes it at once:
    # the later blocks are pageable copies, which strict=True refuses mid-stream.
    memory = bytearray(ROWS * 4)
    kept_through = [np.frombuffer(memory, np.float32)]
    kept_through[0][:] = data((ROWS,), np.float32, 21)
    assert cv.keep_pinned(kept_through[0], device=device)
    x = np.frombuffer(memory, np.float32)
    y = np.zeros_like(x)
    during: list[int] = []

    def compute(x_dev, y_dev, queue, offset, n):
        if offset == 8000:
            kept_through.clear()
            gc.collect()
            during.append(keep.kept_bytes())
        store(y_dev, to_host(x_dev, queue) * 2, queue)

    cv.stream(compute, [x], [y], device=device, block_bytes=4000, zero_copy=False,
              warmup=False, strict=True)
    np.testing.assert_array_equal(y, x * 2)
    assert during == [x.nbytes]  # still held by the stream
    assert keep.kept_bytes() == 0  # released as the stream let go
    assert_clean(device)


# -- 6. reports read by two threads -------------------------------------------------------------
def test_a_report_read_after_its_device_closed(device, tmp_path):
    # guard: a report's timeline is read lazily from the device's events; reading it after
    # device.close() works and its trace saves.
    a, b = data((ROWS,), np.float32, 22), data((ROWS,), np.float32, 23)
    report = cv.stream(kernel(device, "add"), [a, b], [np.zeros_like(a)], device=device,
                       block_bytes=4000, zero_copy=False)
    device.close()
    assert report.timeline.spans and report.busy_seconds
    report.timeline.save(str(tmp_path / "t.json"))
    assert (tmp_path / "t.json").stat().st_size > 0


def test_two_threads_reading_a_report_timeline_at_once_both_get_it(device):
    # Thread B is held (by a trace function on its own thread: no timing) between the
    # property's `_timeline is None` check and its `timeline_source` check, while this thread
    # builds the timeline. B then finds timeline_source cleared, builds Timeline([]) and
    # stores it over the real one: every later figure reads no spans.
    a, b = data((ROWS,), np.float32, 24), data((ROWS,), np.float32, 25)
    report = cv.stream(kernel(device, "add"), [a, b], [np.zeros_like(a)], device=device,
                       block_bytes=4000, zero_copy=False)
    getter = report_module.Report.timeline.fget
    code = getter.__code__
    lines, first = inspect.getsourcelines(getter)
    held_at = [first + i for i, line in enumerate(lines)
               if "if self.timeline_source is not None" in line]
    paused, resume = threading.Event(), threading.Event()

    def tracer(frame, event, arg):
        if frame.f_code is not code:
            return None

        def local(frame, event, arg):
            if event == "line" and frame.f_lineno in held_at and not paused.is_set():
                paused.set()
                resume.wait(0.5)  # the fix holds a lock here: this thread waits it out
            return local
        return local

    seen: dict[str, int] = {}

    def reader():
        sys.settrace(tracer)
        try:
            seen["b"] = len(report.timeline.spans)
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        assert paused.wait(30), "the reader never reached the property's second check"
        seen["a"] = len(report.timeline.spans)
    finally:
        resume.set()
        thread.join(30)
    assert seen["a"] > 0
    assert seen["b"] == seen["a"]
    assert len(report.timeline.spans) == seen["a"]  # not replaced by an empty one
    assert report.busy_seconds
