"""Round sixteen, memory and object lifecycles: the device and pinned pools (limit, keep, trim,
stats) under streams, resident tables and pinned arrays competing for them; the out-of-memory
ladder with tables of several streams at once; objects used and dropped after
``device.close()``; pinned arrays of odd views and sizes; the device options of the memory
helpers. Every result is compared with NumPy's; the pools under test are a second context's
own (``ctx``), closed after each test.

Found (strict xfails, each asserting the right behaviour):

- Two streams in two threads that upload resident tables while the device is out of memory
  deadlock: ``Resident.use`` holds its table's lock through ``pool.acquire``, and the
  ladder's last step asks every other table to ``evict()``, which takes that table's lock.
  Thread A holds table 1 and waits for table 2's lock, thread B the reverse: both hang for
  ever (seen as a hang with the real locks; the test finds the cycle with a lock that
  reports it instead of waiting).
- Two streams in two threads that take the same two writable resident tables in opposite
  orders (``args=(h1, h2)`` and ``args=(h2, h1)``) hang for ever: each holds the first table
  it took (one stream at a time per writable table) and waits for the other's.
- A kept array (``cv.keep_pinned``) freed by a garbage collection that runs while a thread
  holds the device's host lock (Python collects at any allocation, e.g. ``cl.Buffer`` in
  ``alloc_pinned``) runs ``keep._forget``, which waits for keep's lock, while
  ``keep_pinned`` on another thread holds keep's lock and waits for the host lock in
  ``register_host``: both hang for ever (seen with the real locks).
- Blocks that come back to a pool after ``device.close()`` (a pinned array, a resident
  table, dropped or closed after the device) are held by the closed device's pools for good:
  close() freed what was idle then, and nothing trims what comes back later (no stream
  ends), so ``with cv.device() as dev:`` leaks every pinned array that outlives the block.
- A stream with the default ``memory_limit`` on a device whose *pinned* pool has a limit
  plans its staging ring past that limit and fails every time with OutOfMemoryError (the
  device pool's ``limit`` is planned within since round twelve; the pinned pool's is not).
- ``cv.pinned.empty/zeros/zeros_like/asarray``, ``cv.pinned.register`` and
  ``cv.resident(..., device=)`` given a device spec string (which ``cv.stream``,
  ``cv.keep_pinned`` and ``cv.release_pinned`` take) are raw AttributeErrors
  (``'str' object has no attribute 'pinned_pool'``); so is ``cv.pinned.empty_like`` of a
  list (``np.empty_like`` takes one).
- ``pool.keep = "64MiB"`` and ``pool.keep = np.int64(...)`` are refused, while
  ``pool.limit`` takes both (and ``CONVEYOR_POOL_KEEP``, the keep's default, is a size).
"""

from __future__ import annotations

import gc
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
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    in_use,
    kernel,
    next_stream_right,
    vadd_arrays,
)

import conveyor as cv  # noqa: E402
from conveyor import interrupts  # noqa: E402
from conveyor.errors import InputError  # noqa: E402


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
    made.close()


#: y = x + t[i % 4]: one kernel with a read-only resident table (built once per context).
LUT = """
__kernel void lut(__global const float *x, __global float *y, __global const float *t,
                  ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + t[i % 4];
}
__kernel void bump(__global const float *x, __global float *y, __global int *h1,
                   __global int *h2, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i];
    if (i == 0 && offset == 0) { h1[0] += 1; h2[0] += 2; }
}
"""


def _lut_reference(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    return x + table[np.arange(len(x)) % 4]


class _Cycle(Exception):
    """Threads that wait for each other: with the real locks, a hang for ever."""


class _CycleLock:
    """A reentrant lock that raises ``_Cycle`` in the thread whose wait would close a cycle
    of threads, each waiting for a lock another holds, instead of waiting for ever."""

    guard = threading.Condition(threading.Lock())
    waiting: dict[int, _CycleLock] = {}
    found: list[str] = []  # every cycle seen (a finalizer's exception is not raised on)

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.owner: int | None = None
        self.depth = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.get_ident()
        with self.guard:
            if self.owner == me:
                self._lock.acquire()
                self.depth += 1
                return True
            if blocking:
                holder, seen = self.owner, set()
                while holder is not None and holder not in seen:
                    if holder == me:
                        self.found.append(threading.current_thread().name)
                        raise _Cycle("two threads each hold a lock and wait for the other's")
                    seen.add(holder)
                    lock = self.waiting.get(holder)
                    holder = lock.owner if lock is not None else None
                self.waiting[me] = self
                self.guard.notify_all()
        got = self._lock.acquire(blocking, timeout)
        with self.guard:
            self.waiting.pop(me, None)
            if got:
                self.owner, self.depth = me, 1
        return got

    def release(self) -> None:
        with self.guard:
            self.depth -= 1
            if not self.depth:
                self.owner = None
            self._lock.release()

    def _is_owned(self) -> bool:  # what threading.Condition asks of its lock
        return self.owner == threading.get_ident()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


# -- 1. the out-of-memory ladder with tables of two streams at once --------------------------
def test_two_streams_uploading_tables_out_of_memory_fail_cleanly_instead_of_hanging(ctx):
    k = ctx.compile(cv.portable(LUT), "lut")
    x = data((4000,), np.float32, 1)
    tables = [np.arange(4096, dtype=np.float32), np.arange(8192, dtype=np.float32) * 2]
    handles = [cv.resident(t, device=ctx) for t in tables]
    for handle in handles:
        handle.refresh()  # the host changed it: uploaded again by the next stream
        handle._lock = _CycleLock()
        handle._free = threading.Condition(handle._lock)
    pool = ctx.memory_pool
    pool.trim()
    sizes = {pool.bin_size(t.nbytes) for t in tables}
    real = pool.allocate
    both_in = threading.Barrier(2)
    arrived: set[int] = set()

    def allocate(nbytes):  # the device is out of memory for the tables' uploads
        if nbytes in sizes:
            me = threading.get_ident()
            if me not in arrived:
                arrived.add(me)
                both_in.wait(60)  # each stream is inside its table's upload
            raise cv.OutOfMemoryError(nbytes, 0, None, where="device")
        return real(nbytes)

    errors: list[BaseException] = []

    def run(handle):
        try:
            cv.stream(k, [x], [np.float32], args=(handle,), device=ctx, block_bytes=4000)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    pool.allocate = allocate
    try:
        threads = [threading.Thread(target=run, args=(h,)) for h in handles]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        pool.allocate = real
    assert not any(isinstance(e, _Cycle) for e in errors), errors
    assert len(errors) == 2 and all(isinstance(e, cv.OutOfMemoryError) for e in errors)
    for handle, table in zip(handles, tables, strict=True):
        y = cv.stream(k, [x], [np.float32], args=(handle,), device=ctx).outputs[0]
        np.testing.assert_array_equal(y, _lut_reference(x, table))
        handle.close()
    assert_clean(ctx)


BUMP_ONE = """
__kernel void bump_one(__global const float *x, __global float *y, __global int *h,
                       ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i];
    if (i == 0 && offset == 0) { h[0] += 1; }
}
"""


def test_a_stream_waiting_for_a_writable_table_holds_none_of_its_others(ctx, monkeypatch):
    """Round 16: writable tables were taken one by one, each held while the stream waited for
    the next; two streams taking two tables in opposite orders each held one and waited for
    the other, for ever. Now a stream takes all of its writable tables at once: while A waits
    for w2 (held by C, paused mid-stream), it holds no w1, so B (w1 only) runs and finishes."""
    k = ctx.compile(cv.portable(LUT), "bump")
    one = ctx.compile(cv.portable(BUMP_ONE), "bump_one")
    h1, h2 = np.zeros(4, np.int32), np.zeros(4, np.int32)
    w1, w2 = cv.resident(h1, writable=True), cv.resident(h2, writable=True)
    x = data((1000,), np.float32, 1)
    c_holds, c_go, a_waits = threading.Event(), threading.Event(), threading.Event()
    real_wait = interrupts.wait

    def wait(cond):  # the stream waits for tables another thread's stream holds
        if threading.current_thread().name == "A":
            a_waits.set()
        return real_wait(cond)

    monkeypatch.setattr(interrupts, "wait", wait)

    def paused():
        yield x[:500]
        c_holds.set()
        assert c_go.wait(60)
        yield x[500:]

    errors: list[BaseException] = []

    def run(inputs, args):
        try:
            kernel = k if len(args) == 2 else one
            y = cv.stream(kernel, inputs, [np.float32], args=args, device=ctx).outputs[0]
            np.testing.assert_array_equal(y, x)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    c = threading.Thread(target=run, args=([cv.iterate(paused(), length=len(x))], (w2,)),
                         name="C")
    a = threading.Thread(target=run, args=([x], (w1, w2)), name="A")
    b = threading.Thread(target=run, args=([x], (w1,)), name="B")
    try:
        c.start()
        assert c_holds.wait(60)  # C holds w2
        a.start()
        assert a_waits.wait(60)  # A waits for w2
        b.start()
        b.join(60)  # B needs only w1: it must not wait for A, nor A for C's end
        assert not b.is_alive(), "B waited for w1, which A held while waiting for w2"
    finally:
        c_go.set()
        for thread in (c, a, b):
            if thread.ident is not None:
                thread.join(60)
    assert not errors, errors
    # A adds 1 to w1 and 2 to w2; B and C add 1 to their one table each.
    assert h1[0] == 1 + 1 and h2[0] == 1 + 2


def test_the_ladder_collects_a_dropped_pinned_array_in_a_cycle_for_the_ring(ctx):
    # guard: a pinned array only the garbage collector can free (a reference cycle) is
    # freed by the pinned pool's ladder when a stream's staging ring needs its room
    k = kernel(ctx, "add")
    a, b, c = vadd_arrays(20_000)
    ctx.pinned_pool.limit = 64 * 4096

    class Cycle:
        pass

    held = Cycle()
    held.me, held.array = held, cv.pinned.empty(60 * 4096, np.uint8, device=ctx)
    del held
    assert in_use(ctx)[1] == 60 * 4096
    cv.stream(k, [a, b], [c], device=ctx, block_bytes=4000, zero_copy=False)
    np.testing.assert_array_equal(c, add_reference(a, b))
    assert ctx.pinned_pool.stats().peak_in_use_bytes <= 64 * 4096
    assert_clean(ctx)


def test_a_kept_array_collected_inside_the_host_lock_does_not_deadlock_keep_pinned(
        ctx, monkeypatch):
    # Python collects garbage at any allocation, also at those made under the device's host
    # lock (alloc_pinned's cl.Buffer): a kept array freed then runs keep._forget, which takes
    # keep's lock, while keep_pinned on another thread holds keep's lock and waits for the
    # host lock (register_host). Here the collection is made at that point by hand.
    from conveyor.memory import keep as keeping

    _CycleLock.found.clear()
    host = ctx._host_lock = _CycleLock()  # a fresh context: nothing holds the old one
    monkeypatch.setattr(keeping, "_lock", _CycleLock())
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: None)

    class Cycle:
        pass

    garbage = Cycle()
    garbage.me, garbage.array = garbage, np.zeros(4096, np.float32)
    other = np.ones(4096, np.float32)
    kept: list[bool] = []
    try:
        assert cv.keep_pinned(garbage.array, device=ctx)
        del garbage  # only the collector frees it; its finalizer releases the registration
        thread = threading.Thread(target=lambda: kept.append(cv.keep_pinned(other, device=ctx)),
                                  name="keeper")
        with host:
            thread.start()
            with _CycleLock.guard:  # the keeper holds keep's lock and waits for this one
                assert _CycleLock.guard.wait_for(lambda: host in _CycleLock.waiting.values(),
                                                 60)
            gc.collect()
        thread.join(120)
    finally:
        cv.release_pinned(device=ctx)
    assert not _CycleLock.found
    assert kept == [True]


# -- 2. after device.close() ---------------------------------------------------------------
def test_what_comes_back_to_a_closed_devices_pools_is_freed_not_held(ctx):
    k = ctx.compile(cv.portable(LUT), "lut")
    x = data((20_000,), np.float32, 2)
    table = np.arange(4, dtype=np.float32)
    pinned_x = cv.pinned.asarray(x, device=ctx)
    handle = cv.resident(table, device=ctx)
    y = cv.stream(k, [pinned_x], [np.float32], args=(handle,), device=ctx,
                  block_bytes=4000, zero_copy=False).outputs[0]
    np.testing.assert_array_equal(y, _lut_reference(x, table))
    ctx.close()
    del pinned_x
    handle.close()
    gc.collect()
    assert in_use(ctx) == (0, 0)
    assert ctx.memory_pool.stats().held_bytes == 0
    assert ctx.pinned_pool.stats().held_bytes == 0


def test_objects_made_before_close_still_work_after_it(ctx):
    # guard: close() twice, then a kernel, a KernelFuture, a resident table, a pinned input
    # and a kept output made before it all stream exactly; closing the table twice is fine
    # and a closed table is refused by name
    k = ctx.compile(cv.portable(LUT), "lut")
    future = ctx.compile(cv.portable(LUT) + "\n// another build", "lut", wait=False)
    x = data((20_000,), np.float32, 3)
    table = np.arange(4, dtype=np.float32) + 0.5
    handle = cv.resident(table, device=ctx)
    pinned_x = cv.pinned.asarray(x, device=ctx)
    out = np.zeros_like(x)
    try:
        assert cv.keep_pinned(out, device=ctx)
        report = cv.stream(k, [pinned_x], [out], args=(handle,), device=ctx,
                           block_bytes=4000, zero_copy=False)
        ctx.close()
        ctx.close()
        assert "blocks" in str(report)
        for built in (k, future):
            out[:] = 0
            cv.stream(built, [pinned_x], [out], args=(handle,), device=ctx,
                      block_bytes=4000, zero_copy=False, keep_pinned=True)
            np.testing.assert_array_equal(out, _lut_reference(x, table))
        handle.close()
        handle.close()
        with pytest.raises(InputError, match="closed"):
            cv.stream(k, [pinned_x], [out], args=(handle,), device=ctx)
    finally:
        cv.release_pinned(device=ctx)
    del pinned_x
    assert_clean(ctx)


# -- 3. pool limits and the plan -------------------------------------------------------------
def test_a_stream_with_the_default_memory_limit_fits_the_pinned_pools_limit(ctx):
    k = kernel(ctx, "add")
    a, b, c = vadd_arrays(400_000)
    ctx.pinned_pool.limit = "1MiB"
    cv.stream(k, [a, b], [c], device=ctx, zero_copy=False)
    np.testing.assert_array_equal(c, add_reference(a, b))
    assert ctx.pinned_pool.stats().peak_in_use_bytes <= 2**20


@pytest.mark.parametrize("value, expected", [("64MiB", 64 << 20), (np.int64(4096), 4096)])
def test_a_pool_keep_takes_what_its_limit_takes(ctx, value, expected):
    for pool in (ctx.memory_pool, ctx.pinned_pool):
        pool.limit = value
        assert pool.limit == expected
        pool.limit = None
        pool.keep = value
        assert pool.keep == expected


# -- 4. the memory helpers' device= ------------------------------------------------------------
_HELPERS = {
    "pinned.empty": lambda spec: cv.pinned.empty(10, np.float32, device=spec),
    "pinned.zeros": lambda spec: cv.pinned.zeros((2, 3), device=spec),
    "pinned.zeros_like": lambda spec: cv.pinned.zeros_like(np.ones(3), device=spec),
    "pinned.asarray": lambda spec: cv.pinned.asarray(np.ones(3), device=spec),
    "resident": lambda spec: cv.resident(np.ones(3, np.float32), device=spec),
}


@pytest.mark.parametrize("helper", sorted(_HELPERS))
def test_the_memory_helpers_take_a_device_spec_as_cv_stream_does(device, helper):
    made = _HELPERS[helper](device.spec)
    if helper == "resident":
        assert made.device is cv.device(device.spec) and made.buffer is not None
        made.close()
    else:
        assert cv.pinned.is_pinned(made)


def test_pinned_register_takes_a_device_spec(device):
    array = np.ones(1000, np.float32)
    with cv.pinned.register(array, device=device.spec) as registration:
        assert registration is not None


def test_pinned_empty_like_of_a_list_is_like_numpys_or_refused_by_name(device):
    try:
        made = cv.pinned.empty_like([1.0, 2.0], device=device)
    except InputError:
        return
    assert made.shape == (2,) and made.dtype == np.float64


# -- 5. pinned arrays of odd views and sizes -------------------------------------------------
def test_pinned_views_unaligned_offset_and_reversed_stream_exactly(ctx):
    # guard: pinned memory seen through a byte-shifted float view, an offset slice and a
    # reversed (non-contiguous) view, as inputs and outputs, copying and zero-copy
    k = kernel(ctx, "ident")
    n = 10_000
    raw = cv.pinned.empty(4 * n + 1, np.uint8, device=ctx)
    raw[:] = np.arange(4 * n + 1) % 251
    unaligned = raw[1:].view(np.float32)
    shifted_out = cv.pinned.zeros(4 * n + 1, np.uint8, device=ctx)[1:].view(np.float32)
    values = cv.pinned.asarray(data((n + 10,), np.float32, 4), device=ctx)
    pageable = data((n,), np.float32, 5)
    cases = [(unaligned, np.zeros(n, np.float32)), (pageable, shifted_out),
             (values[7 : 7 + n], np.zeros(n, np.float32)),
             (pageable, cv.pinned.zeros(n + 10, np.float32, device=ctx)[3 : 3 + n]),
             (values[::-1][:n], np.zeros(n, np.float32))]
    for source, target in cases:
        for zero_copy in (False, None):
            target[...] = 0
            cv.stream(k, [source], [target], device=ctx, block_bytes=4096,
                      zero_copy=zero_copy)
            np.testing.assert_array_equal(target, source)
    del raw, unaligned, shifted_out, values, cases, source, target
    assert_clean(ctx)
    next_stream_right(ctx)
