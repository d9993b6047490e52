"""Round twelve: memory and resources, tried as users and attackers would.

memory_limit at, below and far above the smallest ring; block_bytes and depth at their ends;
allocation failures injected by wrapping the real pools' ``allocate`` (a failure once, and
failures from the n-th allocation on); pools under a ``limit`` or a ``keep`` budget; devices
opened, used and closed again and again, closed in the middle of a stream, warmed up while a
stream starts; a second context on one device; ``keep_pinned`` at the ends of its budget.
Every result is compared with NumPy's.

Bugs (strict xfails, each asserting the right behaviour):

- an ``OutOfMemoryError`` advises "raise memory_limit", which only makes the ring larger (the
  fix is a lower memory_limit, or a larger pool limit), and prints every size under 52 KiB as
  "0.0 MiB" ("asked for 0.0 MiB with 0.0 MiB in use (limit 0.0 MiB)");
- a stream with the default memory_limit on a device whose pool has a ``limit`` plans a ring
  of half the device's memory and fails with that OutOfMemoryError, where a ring that fits
  the pool's limit streams right;
- ``pool.limit = "64MiB"`` is a raw TypeError; ``True`` and ``1.5`` are taken (``keep``
  refuses all three);
- ``cv.pinned.empty`` past the OpenCL device's largest allocation is a raw
  ``BackendError('clEnqueueMapBuffer: create_buffer failed: INVALID_BUFFER_SIZE')``;
- a pool given ``keep = 0`` ("keeps nothing") holds every pinned array dropped between
  streams, one block per size, until the next stream ends (3.2 MiB held after 40
  arrays of 4-160 KiB, never more than 160 KiB in use);
- ``memory_limit="1PiB"`` is "not a size", with no word of the units there are.
"""

from __future__ import annotations

import gc
import os
import re
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    add_reference,
    assert_clean,
    data,
    in_use,
    kernel,
    next_stream_right,
    stencil_reference,
    vadd_arrays,
)

from conveyor.memory import keep as keeping  # noqa: E402


def _second_context(device: cv.Device) -> cv.Device:
    """Another Device (own context and pools) for the same OpenCL device: the pools under
    test are then this test's own."""
    if device.backend != "opencl":
        pytest.skip("a second context is made for OpenCL devices only")
    from conveyor.backends import opencl

    platform, index = (int(part) for part in device.spec.split(":")[1:])
    return opencl.Device(device.cl_device, platform, index)  # type: ignore[attr-defined]


@pytest.fixture
def ctx(device):
    """A second context on ``device``, closed after the test."""
    made = _second_context(device)
    yield made
    gc.collect()
    made.close()


def _fds() -> list[str]:
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            found.append(os.readlink(f"/proc/self/fd/{name}"))
        except OSError:  # the listing's own descriptor, gone already
            pass
    return sorted(found)


def _threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate())


class FailFrom:
    """Wraps a pool's real ``allocate``: the ``nth`` call (counting from 1) raises the
    OutOfMemoryError a backend raises; with ``persist`` every call from the ``nth`` on."""

    def __init__(self, real, nth: int, persist: bool, where: str) -> None:
        self.real, self.nth, self.persist, self.where = real, nth, persist, where
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, nbytes: int):
        with self.lock:
            self.calls += 1
            call = self.calls
        if call == self.nth or (self.persist and call > self.nth):
            raise cv.OutOfMemoryError(nbytes, 0, None, where=self.where)
        return self.real(nbytes)


# -- memory_limit, block_bytes and depth at their ends ---------------------------------------
@pytest.mark.parametrize("depth", [1, 3, 64])
def test_memory_limit_exactly_the_smallest_ring_streams_and_one_byte_less_is_refused(
        device, depth):
    # guard: the figure the refusal names is enough, and the ring stays within it
    k = kernel(device, "add")
    a, b, c = vadd_arrays(10_000)
    with pytest.raises(cv.InputError, match=r"needs (\d+) device bytes") as caught:
        cv.stream(k, [a, b], [c], device=device, memory_limit=16, depth=depth,
                  zero_copy=False)
    need = int(re.search(r"needs (\d+) device bytes", str(caught.value)).group(1))
    assert "memory_limit" in str(caught.value)
    with pytest.raises(cv.InputError, match="memory limit"):
        cv.stream(k, [a, b], [c], device=device, memory_limit=need - 1, depth=depth,
                  zero_copy=False)
    assert not c.any()  # refused before any work
    device.memory_pool.trim()
    device.memory_pool.reset_peak()
    cv.stream(k, [a, b], [c], device=device, memory_limit=f"{need}B", depth=depth,
              zero_copy=False)
    np.testing.assert_array_equal(c, add_reference(a, b))
    assert device.memory_pool.stats().peak_in_use_bytes <= need


@pytest.mark.parametrize("limit", ["1MiB", "12KiB", "1e29", 10**29 - 1, 3.5e9])
def test_memory_limits_from_tiny_to_past_any_device_stream_right(device, limit):
    # guard: strings, floats and integers past any memory all plan a ring that fits
    k = kernel(device, "add")
    a, b, c = vadd_arrays(10_000, seed=3)
    for zero_copy in (False, None):
        c[:] = 0
        cv.stream(k, [a, b], [c], device=device, memory_limit=limit, zero_copy=zero_copy)
        np.testing.assert_array_equal(c, add_reference(a, b))


@pytest.mark.parametrize("limit", ["0", "0B", 0, "-1MiB", -5, "1G", "1.5B", "12 furlongs"])
def test_memory_limits_of_nothing_or_nonsense_are_refused_naming_the_option(device, limit):
    # guard
    k = kernel(device, "add")
    a, b, c = vadd_arrays(1000)
    with pytest.raises(cv.InputError, match="memory_limit"):
        cv.stream(k, [a, b], [c], device=device, memory_limit=limit)
    assert not c.any()


def test_a_size_in_pebibytes_is_taken_or_the_message_names_the_units(device):
    k = kernel(device, "add")
    a, b, c = vadd_arrays(1000)
    try:
        cv.stream(k, [a, b], [c], device=device, memory_limit="1PiB")
    except cv.InputError as exc:
        assert "TiB" in str(exc), str(exc)  # the largest unit there is, so the user knows
    else:
        np.testing.assert_array_equal(c, add_reference(a, b))


@pytest.mark.parametrize("shape", [(1000,), (300, 3)])
def test_block_bytes_below_one_row_is_refused_and_one_row_or_past_the_input_streams(
        device, shape):
    # guard: 1 byte is refused with the row size; exactly one row, one row and a byte, and
    # more than the whole input stream right (one row per block; one block)
    x = data(shape, np.float32, 5)
    row = x[0:1].nbytes
    k = kernel(device, "scale")
    y = np.zeros_like(x)
    with pytest.raises(cv.InputError, match=rf"block_bytes >= {row}"):
        cv.stream(k, [x], [y], args=(np.float32(2),), device=device, block_bytes=1)
    assert not y.any()
    for block_bytes, blocks in ((row, shape[0]), (row + 1, shape[0]), ("1GiB", 1),
                                (x.nbytes * 1000, 1)):
        for zero_copy in (False, None):
            y[:] = 0
            r = cv.stream(k, [x], [y], args=(np.float32(2),), device=device,
                          block_bytes=block_bytes, zero_copy=zero_copy, depth=64)
            np.testing.assert_array_equal(y, x * np.float32(2))
            assert r.blocks == blocks


@pytest.mark.parametrize("depth", [1, 64, 10**6])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_depth_at_its_ends_with_halos_in_place_and_one_row_blocks(device, depth, rows):
    # guard: every halo up to more than the rows, in place and not, copying and zero-copy
    k = kernel(device, "sten")
    for halo in (0, 1, 9):
        x = data((rows, 3), np.float32, rows + halo)
        ref = stencil_reference(x, halo)
        for block_bytes in (12, 10**6):
            if halo > 1 and halo > rows and block_bytes == 12 and rows > 1:
                continue  # a halo past the rows needs one block (refused, tested elsewhere)
            for zero_copy, in_place in ((False, False), (None, False), (None, True)):
                y = x.copy() if in_place else np.zeros_like(x)
                source = y if in_place else x
                if halo > 1 and block_bytes == 12 and rows > 1:
                    with pytest.raises(cv.InputError, match="halo"):
                        cv.stream(k, [source], [y], args=(3, halo), halo=halo, depth=depth,
                                  block_bytes=block_bytes, zero_copy=zero_copy,
                                  device=device)
                    continue
                cv.stream(k, [source], [y], args=(3, halo), halo=halo, depth=depth,
                          block_bytes=block_bytes, zero_copy=zero_copy, device=device)
                np.testing.assert_array_equal(y, ref)


def test_reductions_at_depth_64_and_one_element_blocks_equal_numpy(device):
    # guard
    k = kernel(device, "ident")
    for n in (1, 5, 200):
        x = data((n,), np.float32, n)
        for zero_copy in (False, None):
            for op, ref in (("sum", x.astype(np.float64).sum()), ("min", x.min()),
                            ("max", x.max())):
                r = cv.stream(k, [x], reduce=op, device=device, depth=64, block_bytes=4,
                              zero_copy=zero_copy)
                assert r.result == ref, (n, op, zero_copy)


# -- out of memory --------------------------------------------------------------------------
def _cases(device):
    """(name, run, check) of streams that allocate from both pools."""
    a, b, c = vadd_arrays(20_000)
    xs = data((3000, 3), np.float32, 13)
    ys = np.zeros_like(xs)
    x1 = data((20_000,), np.float32, 4)
    k, ks, ki = kernel(device, "add"), kernel(device, "sten"), kernel(device, "ident")
    state = {}

    def in_place():
        state["xx"] = xs.copy()
        return cv.stream(ks, [state["xx"]], [state["xx"]], device=device, args=(3, 2),
                         halo=2, block_bytes=1200)

    return [
        ("map", lambda: cv.stream(k, [a, b], [c], device=device, block_bytes=4000,
                                  zero_copy=False),
         lambda r: np.array_equal(c, add_reference(a, b)), lambda: c.fill(0)),
        ("halo", lambda: cv.stream(ks, [xs], [ys], device=device, args=(3, 2), halo=2,
                                   block_bytes=1200, zero_copy=False),
         lambda r: np.array_equal(ys, stencil_reference(xs, 2)), lambda: ys.fill(0)),
        ("in-place-halo", in_place,
         lambda r: np.array_equal(state["xx"], stencil_reference(xs, 2)), lambda: None),
        ("reduce", lambda: cv.stream(ki, [x1], reduce="sum", device=device, block_bytes=4000,
                                     zero_copy=False),
         lambda r: r.result == x1.astype(np.float64).sum(), lambda: None),
        ("new-output", lambda: cv.stream(k, [a, b], [np.float32], device=device,
                                         block_bytes=4000, zero_copy=False),
         lambda r: np.array_equal(r.outputs[0], add_reference(a, b)), lambda: None),
    ]


@pytest.mark.parametrize("which", ["memory_pool", "pinned_pool"])
def test_one_failed_allocation_anywhere_in_a_stream_is_survived_by_the_ladder(
        device, monkeypatch, which):
    # guard: the ladder retries and every stream is exact and leaves nothing in use
    pool = getattr(device, which)
    where = "device" if which == "memory_pool" else "pinned host"
    for name, run, check, reset in _cases(device):
        nth = 1
        while True:
            pool.trim()  # nothing idle: every acquire allocates
            fail = FailFrom(pool.allocate, nth, False, where)
            monkeypatch.setattr(pool, "allocate", fail)
            reset()
            report = run()
            monkeypatch.undo()
            assert check(report), (name, nth)
            assert_clean(device)
            if fail.calls < nth or nth > 12:
                break
            nth += 1


@pytest.mark.parametrize("which", ["memory_pool", "pinned_pool"])
def test_every_allocation_failing_from_the_nth_on_raises_out_of_memory_and_leaks_nothing(
        device, monkeypatch, which):
    # guard: OutOfMemoryError (or the right result, where only the ring's growth failed),
    # pools at zero, no staging thread, and the device streams right afterwards
    pool = getattr(device, which)
    where = "device" if which == "memory_pool" else "pinned host"
    for name, run, check, reset in _cases(device):
        nth = 1
        while True:
            pool.trim()
            fail = FailFrom(pool.allocate, nth, True, where)
            monkeypatch.setattr(pool, "allocate", fail)
            reset()
            try:
                report = run()
            except cv.OutOfMemoryError as exc:
                assert exc.where == where
            else:
                assert check(report), (name, nth)
            finally:
                monkeypatch.undo()
            assert_clean(device)
            if fail.calls < nth or nth > 12:
                break
            nth += 1
    next_stream_right(device)


def test_a_writable_table_is_left_as_it_was_when_the_device_runs_out(device, monkeypatch):
    # guard: no copy-back of a stream that never ran; the handle works afterwards
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernel (atomic_add)")
    src = cv.portable("""
__kernel void count8(__global const float *x, __global float *y, __global int *h,
                     ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { y[i] = x[i]; atomic_add(&h[(offset + i) % 8], 1); }
}""")
    k = device.compile(src, "count8")
    x = data((20_000,), np.float32, 5)
    y = np.zeros_like(x)
    h = np.zeros(8, np.int32)
    pool = device.memory_pool
    with cv.resident(h, writable=True, device=device) as table:
        for nth in (1, 2, 3):
            pool.trim()
            monkeypatch.setattr(pool, "allocate",
                                FailFrom(pool.allocate, nth, True, "device"))
            with pytest.raises(cv.OutOfMemoryError):
                cv.stream(k, [x], [y], args=(table,), device=device, block_bytes=4000,
                          zero_copy=False)
            monkeypatch.undo()
            assert h.tolist() == [0] * 8
        cv.stream(k, [x], [y], args=(table,), device=device, block_bytes=4000,
                  zero_copy=False)
        assert h.tolist() == [2500] * 8
        np.testing.assert_array_equal(y, x)
    assert_clean(device)


def test_a_device_pool_limit_of_exactly_the_ring_streams_changing_lengths(device, monkeypatch):
    # guard: blocks held from the stream before are given back by the ladder, never counted
    # against the next stream's ring
    k, ks = kernel(device, "add"), kernel(device, "sten")
    device.memory_pool.trim()
    device.memory_pool.reset_peak()
    monkeypatch.setattr(device.memory_pool, "limit", 4608)  # 3 slots x 3 buffers x 512
    for n in (10_000, 3000, 777, 10_000, 50):
        a, b, c = vadd_arrays(n, seed=n)
        for zero_copy in (False, None):
            c[:] = 0
            cv.stream(k, [a, b], [c], device=device, memory_limit=4608, zero_copy=zero_copy)
            np.testing.assert_array_equal(c, add_reference(a, b))
        x = data((n // 3 + 3, 3), np.float32, n)
        y = np.zeros_like(x)
        cv.stream(ks, [x], [y], device=device, args=(3, 1), halo=1, memory_limit=4608,
                  depth=2, zero_copy=False)
        np.testing.assert_array_equal(y, stencil_reference(x, 1))
    assert device.memory_pool.stats().peak_in_use_bytes <= 4608
    monkeypatch.undo()
    assert_clean(device)


def test_out_of_memory_under_a_pool_limit_does_not_advise_a_larger_memory_limit(
        device, monkeypatch):
    k = kernel(device, "add")
    a, b, c = vadd_arrays(200_000)
    device.memory_pool.trim()
    monkeypatch.setattr(device.memory_pool, "limit", 64 * 1024)
    with pytest.raises(cv.OutOfMemoryError) as caught:
        cv.stream(k, [a, b], [c], device=device, memory_limit="1MiB", zero_copy=False)
    monkeypatch.undo()
    assert_clean(device)
    # A ring of 1 MiB does not fit a pool of 64 KiB: memory_limit must come down (or the
    # pool's limit go up), never up.
    assert "raise memory_limit" not in str(caught.value), str(caught.value)
    cv.stream(k, [a, b], [c], device=device, memory_limit="48KiB", zero_copy=False)
    np.testing.assert_array_equal(c, add_reference(a, b))


def test_out_of_memory_sizes_are_readable_when_they_are_small(device, monkeypatch):
    k = kernel(device, "add")
    a, b, c = vadd_arrays(20_000)
    device.memory_pool.trim()
    monkeypatch.setattr(device.memory_pool, "limit", 2048)
    with pytest.raises(cv.OutOfMemoryError) as caught:
        # memory_limit given: the default one fits the pool's limit now (refused as a plan)
        cv.stream(k, [a, b], [c], device=device, block_bytes=4000, zero_copy=False,
                  memory_limit="1MiB")
    monkeypatch.undo()
    assert_clean(device)
    assert caught.value.limit == 2048
    assert "0.0 MiB" not in str(caught.value), str(caught.value)


def test_a_stream_with_the_default_memory_limit_fits_the_pools_limit(device, monkeypatch):
    k = kernel(device, "add")
    a, b, c = vadd_arrays(200_000)
    device.memory_pool.trim()
    monkeypatch.setattr(device.memory_pool, "limit", 256 * 1024)
    try:
        cv.stream(k, [a, b], [c], device=device, zero_copy=False)
    finally:
        monkeypatch.undo()
    np.testing.assert_array_equal(c, add_reference(a, b))
    assert_clean(device)


@pytest.mark.parametrize("value", ["64MiB", True, 1.5])
def test_a_pool_limit_that_is_no_whole_number_of_bytes_is_refused_or_read_as_a_size(
        ctx, value):
    pool = ctx.memory_pool
    try:
        pool.limit = value
    except cv.InputError as exc:
        assert "limit" in str(exc)
        assert pool.limit is None
    else:  # taken only as the size it says
        assert value == "64MiB" and pool.limit == 64 * 2**20


def test_a_pinned_array_past_the_devices_largest_allocation_says_so(device):
    if device.backend != "opencl":
        pytest.skip("OpenCL devices have a largest allocation")
    nbytes = device.max_alloc_bytes + 4096
    with pytest.raises((cv.InputError, cv.OutOfMemoryError)) as caught:
        cv.pinned.empty(nbytes, np.uint8, device=device)  # the driver refuses: no memory used
    assert str(device.max_alloc_bytes) in str(caught.value) or "largest" in str(caught.value)
    assert_clean(device)


# -- pools between streams -------------------------------------------------------------------
def test_a_pool_that_keeps_nothing_holds_nothing_after_pinned_arrays_are_dropped(ctx):
    pool = ctx.pinned_pool
    pool.keep = 0
    for i in range(1, 41):
        array = cv.pinned.empty(i * 4096, np.uint8, device=ctx)
        array[:] = i
        del array
    gc.collect()
    stats = pool.stats()
    assert stats.in_use_bytes == 0
    assert stats.held_bytes <= 0, stats  # "0 keeps nothing"


@pytest.mark.parametrize("keep", ["0", "64KiB"])
def test_conveyor_pool_keep_holds_between_streams_of_changing_sizes(device, monkeypatch,
                                                                    keep):
    # guard: every stream exact, what both pools hold never past the budget, and the same
    # sizes again are pool hits under a budget that holds them
    monkeypatch.setenv("CONVEYOR_POOL_KEEP", keep)
    made = _second_context(device)
    try:
        budget = {"0": 0, "64KiB": 64 * 1024}[keep]
        k = kernel(made, "add")
        for n in (1000, 5000, 1000, 3000, 5000, 1000, 700):
            a, b, c = vadd_arrays(n, seed=n)
            cv.stream(k, [a, b], [c], device=made, block_bytes=1200, zero_copy=False)
            np.testing.assert_array_equal(c, add_reference(a, b))
            for pool in (made.memory_pool, made.pinned_pool):
                stats = pool.stats()
                assert stats.keep_bytes == budget
                assert stats.held_bytes <= budget, stats
        hits = made.memory_pool.stats().hits
        a, b, c = vadd_arrays(700, seed=1)
        cv.stream(k, [a, b], [c], device=made, block_bytes=1200, zero_copy=False)
        assert (made.memory_pool.stats().hits > hits) == bool(budget)
        assert_clean(made)
    finally:
        made.close()


# -- devices opened, closed, reopened ----------------------------------------------------------
def test_a_device_used_and_closed_thirty_times_leaks_no_thread_or_descriptor(device):
    # guard
    k = kernel(device, "add")
    a, b, c = vadd_arrays(20_000)
    cv.stream(k, [a, b], [c], device=device, block_bytes=4000, zero_copy=False)
    gc.collect()
    fds, threads = _fds(), _threads()
    for _ in range(30):
        same = cv.device(device.spec)
        assert same is device
        c[:] = 0
        cv.stream(k, [a, b], [c], device=same, block_bytes=4000, zero_copy=False)
        np.testing.assert_array_equal(c, add_reference(a, b))
        same.close()
        assert device.memory_pool.stats().held_bytes == 0
        assert device.pinned_pool.stats().held_bytes == 0
    gc.collect()
    assert _fds() == fds
    assert _threads() == threads
    next_stream_right(device)


def test_new_contexts_made_used_and_closed_leak_no_thread_or_descriptor(device):
    # guard (PoCL: NVIDIA's OpenCL opens driver device files per context, kept by the
    # driver, which this descriptor count would take for a leak)
    if device.kind != "cpu":
        pytest.skip("descriptors counted on PoCL's CPU device")
    a, b, c = vadd_arrays(20_000)

    def one() -> None:
        made = _second_context(device)
        try:
            c[:] = 0
            cv.stream(kernel(made, "add"), [a, b], [c], device=made, block_bytes=4000,
                      zero_copy=False)
            np.testing.assert_array_equal(c, add_reference(a, b))
            assert_clean(made)
        finally:
            made.close()

    one()
    gc.collect()
    fds, threads = _fds(), _threads()
    for _ in range(10):
        one()
    gc.collect()
    assert _fds() == fds
    assert _threads() == threads


def test_a_device_closed_in_the_middle_of_its_stream_finishes_it_right(ctx):
    # guard: close() from the stream's own callable: the blocks in flight stay valid, the
    # result is exact, everything is given back; the device streams again
    x = data((20_000,), np.float32, 5)

    def twice(xa, ya, *, queue, offset, n):
        if offset == 4000:
            ctx.close()
            gc.collect()
        return xa * 2

    for zero_copy in (False, None):
        y = np.zeros_like(x)
        cv.stream(twice, [x], [y], device=ctx, block_bytes=4000, zero_copy=zero_copy)
        np.testing.assert_array_equal(y, x * 2)
        assert_clean(ctx)
    next_stream_right(ctx)


def test_a_stream_after_close_reopens_with_pinned_and_kept_arrays_made_before(ctx):
    # guard: close() is not the end of a device; arrays made on it before still stream
    k = kernel(ctx, "add")
    a, b, _ = vadd_arrays(20_000)
    pinned_a = cv.pinned.asarray(a, device=ctx)
    assert cv.keep_pinned(b, device=ctx)
    c = np.zeros_like(a)
    cv.stream(k, [pinned_a, b], [c], device=ctx, block_bytes=4000, zero_copy=False)
    ctx.close()
    assert keeping.kept_bytes() == 0 or all(kept.device is not ctx
                                            for kept in keeping._kept.values())
    c[:] = 0
    cv.stream(k, [pinned_a, b], [c], device=ctx, block_bytes=4000, zero_copy=False,
              keep_pinned=True)
    np.testing.assert_array_equal(c, add_reference(a, b))
    del pinned_a
    gc.collect()
    cv.release_pinned(device=ctx)
    assert_clean(ctx)
    ctx.close()
    assert ctx.pinned_pool.stats().held_bytes == 0


def test_a_stream_that_starts_while_the_warm_up_allocates_is_exact_and_stops_it(ctx):
    # guard: the warm-up's allocation waits until the stream has asked the pool for a block:
    # the warm-up then stops after that one block, the stream is exact, nothing in use
    pool = ctx.pinned_pool
    real = pool.allocate
    started, go = threading.Event(), threading.Event()

    def gated(nbytes):
        if threading.current_thread().name.startswith("conveyor-warmup"):
            started.set()
            assert go.wait(60)
        return real(nbytes)

    real_acquire = pool.acquire

    def acquire(nbytes):
        block = real_acquire(nbytes)
        go.set()
        return block

    k = kernel(ctx, "add")
    a, b, c = vadd_arrays(20_000)
    pool.allocate = gated
    try:
        warm = ctx.warm_up(8 << 20, block_bytes=1 << 20, pinned=True)
        assert warm is not None and started.wait(60)
        pool.acquire = acquire
        cv.stream(k, [a, b], [c], device=ctx, block_bytes=4000, zero_copy=False)
        assert warm.wait(60)
    finally:
        go.set()
        pool.allocate = real
        pool.acquire = real_acquire
    np.testing.assert_array_equal(c, add_reference(a, b))
    assert warm.made == 1 and warm.error is None
    assert_clean(ctx)
    ctx.close()
    assert pool.stats().held_bytes == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("conveyor-warmup")]


def test_two_contexts_of_one_device_keep_their_own_arrays_and_close_their_own(device, ctx):
    # guard: an array kept on both; closing one releases only its registration; both stream
    # it exactly, also after the host changed it
    k0, k1 = kernel(device, "add"), kernel(ctx, "add")
    a, b, c = vadd_arrays(20_000)
    try:
        assert cv.keep_pinned(a, device=device) and cv.keep_pinned(a, device=ctx)
        ctx.close()
        assert keeping.find(device, a) is not None and keeping.find(ctx, a) is None
        a += 1
        for dev, k in ((device, k0), (ctx, k1), (device, k0)):
            c[:] = 0
            cv.stream(k, [a, b], [c], device=dev, block_bytes=4000, zero_copy=False,
                      keep_pinned=True)
            np.testing.assert_array_equal(c, add_reference(a, b))
            a -= 2
    finally:
        cv.release_pinned()
    assert_clean(ctx)


# -- keep_pinned at the ends of its budget -------------------------------------------------------
@pytest.fixture
def budget():
    """The pinned budget as it was, restored after the test (with every kept array released)."""
    before = cv.configure()["pinned_budget"]
    yield
    cv.release_pinned()
    cv.configure(pinned_budget=before)


def test_a_budget_of_exactly_the_array_keeps_it_and_zero_keeps_nothing(device, budget):
    # guard
    k = kernel(device, "add")
    a, b, c = vadd_arrays(4096)
    cv.configure(pinned_budget=a.nbytes)
    assert cv.keep_pinned(a, device=device) and keeping.kept_bytes() == a.nbytes
    assert cv.keep_pinned(b, device=device)  # a, the least recently used, makes room
    assert keeping.kept_bytes() == b.nbytes and keeping.find(device, a) is None
    cv.configure(pinned_budget=f"{a.nbytes - 1}B")
    assert keeping.kept_bytes() == 0
    assert not cv.keep_pinned(a, device=device)
    cv.configure(pinned_budget=0)
    assert not cv.keep_pinned(a, device=device) and keeping.kept_bytes() == 0
    for zero_copy in (False, None):
        c[:] = 0
        cv.stream(k, [a, b], [c], device=device, keep_pinned=True, block_bytes=4000,
                  zero_copy=zero_copy)
        np.testing.assert_array_equal(c, add_reference(a, b))
        assert keeping.kept_bytes() == 0


def test_a_budget_lowered_between_streams_releases_and_later_streams_stay_exact(
        device, budget):
    # guard: three kept, the budget lowered to one, the host changes every array
    k = kernel(device, "add")
    a, b, c = vadd_arrays(4096)
    cv.configure(pinned_budget=3 * a.nbytes)
    cv.stream(k, [a, b], [c], device=device, keep_pinned=True, block_bytes=4000,
              zero_copy=False)
    assert keeping.kept_bytes() == 3 * a.nbytes
    cv.configure(pinned_budget="16KiB")
    assert keeping.kept_bytes() == a.nbytes
    for step in range(3):
        a += 1
        b -= 2
        c[:] = 0
        cv.stream(k, [a, b], [c], device=device, keep_pinned=True, block_bytes=4000,
                  zero_copy=False if step % 2 else None)
        np.testing.assert_array_equal(c, add_reference(a, b))
        assert keeping.kept_bytes() <= 16 * 1024
    cv.release_pinned()
    assert in_use(device) == (0, 0)
