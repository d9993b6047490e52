"""Round fifty-one (helper D): many streams at once, on threads, after the ring and
pinned-limit changes.

Tried (scripts under /tmp/r51t, not kept): 2-6 threads at once, each running six seeded
streams of eleven kinds (kernel maps, halo stencils, callables, kernel reductions,
``cv.iterate``, chains with a temp, ``.npy`` file outputs, read-only and writable
``cv.resident`` tables shared by every thread, a ``keep_pinned`` array shared by every
thread), copying and zero-copy, depths 1-4, under ``dev.pinned_pool.limit`` of none, 64 KiB,
256 KiB, 1 MiB, 4 MiB and ``dev.memory_pool.limit`` of none, 1 MiB, 4 MiB, with and without
``CONVEYOR_RING_GROW=0`` (a child process), and with a seventh thread that meanwhile closes
the device, releases and keeps the shared array again, sets both pools' ``keep`` to 0 and
back, and trims both pools: every result equal to NumPy's, every writable count exact, both
pools back at zero in use and nothing fenced, no thread left. The same over both PoCL
devices (``device=[d0, d1]`` and one of them, 2-5 threads). Six threads streaming one kernel
with six different scalars; six threads streaming one array with ``keep_pinned=True`` at
once (one registration, released whole). A stream planned while another's ring holds part of
a pinned limit fits what is left. The only refusals were OutOfMemoryError where streams on
threads took the pinned room between one's plan and its first entry (round forty-eight's
"seen, not fixed"), or a device-pool limit the concurrent rings filled (the plan fits the
device pool's whole limit, not what other streams leave of it: the README promises that only
for the pinned pool). Also held: one ``cv.iterate`` streamed by two threads (one is told it
is being read by another stream), one ``cv.npy_out`` sink in two threads (one whole file),
eight threads building one new source at once, two threads writing disjoint halves of one
array with ``keep_pinned=True`` and then reading it whole; descriptors and RSS flat over 20
rounds of the threaded mix.

Found (each a strict xfail asserting the right behaviour):

- A Python callable streamed under ``dev.memory_pool.limit`` (no ``memory_limit=``) fails
  with OutOfMemoryError ("asked for 512 bytes with 1.0 MiB in use") wherever the plan's ring
  fills the limit to the page: the callable's warm-up call (``step.warm_up``) takes its
  scratch buffers from the device pool after the ring has taken every slot's, and the plan
  never counted them (1 MiB with 100,000 float32 rows; a callable reduction of 250,000; 3 MiB
  with 10**6 rows; a chain with a callable link of 250,000 under 3 MiB).
- The same for a callable that returns its outputs swapped (``return b, a``, which
  ``step.unalias`` handles by copying through device temps taken from the pool per block):
  with ``warmup=False`` under a 1 MiB device pool limit, 60,000 rows fail with
  OutOfMemoryError ("asked for 256.0 KiB with 1.0 MiB in use"); 250,000 under 3 and 4 MiB.
- (GPU, CUDA) A read-only ``cv.resident`` table shared by two threads: the first stream
  uploads it on its own copy queue (``Resident.use``) and sets ``buffer`` at once; a second
  stream that starts before that copy has run gets the buffer and launches on its own
  queues, which nothing orders after the first stream's copy (``Engine._build`` finishes
  only its own copy queue). Its kernels read whatever the pool block held. Forced here by
  gating the first stream's upload with a user event (``gpu_device``: skipped on PoCL, where
  PyOpenCL's write of a pageable table waits for itself as its event is dropped, inside the
  table's lock).
- Two streams on two threads, each holding its own writable table, whose callables each
  start a nested stream with the other's table, wait for each other for ever (a lock-order
  deadlock through nesting; ``resident.claim`` takes all of a stream's tables at once to rule
  exactly this out between plain streams).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    HIST,
    add_reference,
    assert_clean,
    data,
    first_device_only,  # noqa: F401 (autouse: first device only)
    kernel,
    opencl_c_kernels,  # noqa: F401 (autouse: OpenCL C kernels)
    store,
    to_host,
)

import conveyor as cv  # noqa: E402
from conveyor import interrupts  # noqa: E402
from conveyor.pipeline import resident  # noqa: E402


def _hist(device: cv.Device) -> cv.Kernel:
    return device.compile(HIST, "hist")


# -- 1. nested streams on two threads, each with the other's writable table --------------------
@pytest.fixture
def claim_deadlocks(monkeypatch):
    """Records a deadlock in ``resident.claim`` instead of hanging: two threads waiting there
    at once in this test can only be each waiting for a table the other holds (each holds one
    and nothing else runs). The second waiter raises, so its stream fails and lets go."""
    real = interrupts.wait
    waiting: list[str] = []
    found: list[str] = []
    lock = threading.Lock()

    def wait(cond, *args, **kwargs):
        if cond is not resident._claims:
            return real(cond, *args, **kwargs)
        with lock:
            if waiting:
                found.append(threading.current_thread().name)
                raise AssertionError("two streams wait for each other's writable table")
            waiting.append(threading.current_thread().name)
        try:
            return real(cond, *args, **kwargs)
        finally:
            with lock:
                waiting.clear()

    monkeypatch.setattr(interrupts, "wait", wait)
    return found


@pytest.mark.filterwarnings("ignore::conveyor.hazards.HazardWarning")
def test_nested_streams_on_two_threads_crossing_writable_tables_do_not_deadlock(
        device, claim_deadlocks):
    # Without the fixture both threads wait in resident.claim for ever (seen: a child process
    # with both threads there after 25 s, its watchdog's traceback). The right behaviour: one
    # of the nested streams is refused (an InputError naming the table the other stream
    # holds, which it waits for), or both finish; never both waiting.
    k = _hist(device)
    counts = [np.zeros(16, np.uint32), np.zeros(16, np.uint32)]
    inside = threading.Barrier(2)
    results: dict[int, object] = {}
    with cv.resident(counts[0], writable=True) as t0, \
            cv.resident(counts[1], writable=True) as t1:
        tables = (t0, t1)

        def outer(me: int) -> None:
            started: list[bool] = []

            def step(x_dev, queue, offset, n):
                if not started:
                    started.append(True)
                    inside.wait(60)  # both outer streams hold their own table now
                    cv.stream(k, [np.full(100, 5, np.uint32)], [], args=(tables[1 - me],),
                              device=device)
                return np.array([n])

            chain = cv.chain(cv.link(k, reads="in0", args=(tables[me],)),
                             cv.link(step, reads="in0"))
            try:
                results[me] = cv.stream(chain, [np.zeros(1000, np.uint32)], device=device,
                                        reduce="sum", warmup=False).result
            except BaseException as exc:  # reported below
                results[me] = exc

        threads = [threading.Thread(target=outer, args=(i,), name=f"outer-{i}")
                   for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads)
    assert claim_deadlocks == [], results
    for me in range(2):  # each stream either ran whole or was refused with an InputError
        assert isinstance(results[me], np.ndarray | cv.InputError), results
    assert_clean(device)


# -- 2. a callable under a device pool limit: its warm-up after the ring ----------------------
@pytest.fixture
def pool_limits(device):
    """Both pools' limits restored (and what they hold trimmed) after the test."""
    yield device
    device.memory_pool.limit = None
    device.pinned_pool.limit = None
    device.memory_pool.trim()
    device.pinned_pool.trim()


def _plus_one(x_dev, y_dev, queue, offset, n):
    store(y_dev, to_host(x_dev, queue) + 1, queue)


def _block_sum(x_dev, queue, offset, n):
    return to_host(x_dev, queue).astype(np.float64).sum()


@pytest.mark.parametrize(("limit", "rows", "reduce"), [(2**20, 100_000, None),
                                                        (2**20, 250_000, "sum")],
                         ids=["map-1MiB", "reduce-1MiB"])
def test_a_callable_streams_under_a_device_pool_limit(pool_limits, limit, rows, reduce):
    # README: "With no memory_limit=, a stream plans its ring within the device pool's limit
    # too". The same streams with warmup=False, or with other row counts, run.
    device = pool_limits
    x = data((rows,), np.float32, 5)
    device.memory_pool.limit = limit
    if reduce is None:
        y = np.zeros_like(x)
        cv.stream(_plus_one, [x], [y], device=device)
        np.testing.assert_array_equal(y, x + 1)
    else:
        report = cv.stream(_block_sum, [x], device=device, reduce=reduce)
        assert np.isclose(report.result, x.astype(np.float64).sum())
    assert_clean(device)


def _swapped(x, a, b, *, queue, offset, n):
    a.set(x.get() + 1)
    b.set(x.get() + 2)
    return b, a  # output 0 gets b's values, output 1 a's


@pytest.mark.filterwarnings("ignore::conveyor.hazards.HazardWarning")
@pytest.mark.xfail(strict=True, reason="the temps a callable's swapped outputs are copied "
                   "through are taken from the device pool per block, past the ring the plan "
                   "fitted to its limit: OutOfMemoryError (Known: RELIABILITY.md)")
def test_a_callable_returning_its_outputs_swapped_streams_under_a_device_pool_limit(
        pool_limits):
    device = pool_limits
    x = data((60_000,), np.float32, 1)
    a, b = np.zeros_like(x), np.zeros_like(x)
    device.memory_pool.limit = 2**20
    cv.stream(_swapped, [x], [a, b], device=device, warmup=False)
    np.testing.assert_array_equal(a, x + 2)
    np.testing.assert_array_equal(b, x + 1)
    assert_clean(device)


# -- 3. a read-only table uploaded by one thread's stream, read by another's ----------------
LUT = """__kernel void lut(__global const uint *x, __global uint *y, __global const uint *t,
                  ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = t[x[i] % 64];
}"""


class _GatedQueue:
    """A real queue whose ``copy_in`` waits, on the device, for ``gate`` (a transfer behind
    others on a busy copy engine), and says when it has been enqueued."""

    def __init__(self, inner, gate, enqueued: threading.Event) -> None:
        self._inner, self._gate, self._enqueued = inner, gate, enqueued

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def copy_in(self, dst, src, *, dst_offset=0, wait_for=()):
        event = self._inner.copy_in(dst, src, dst_offset=dst_offset,
                                    wait_for=[*wait_for, self._gate])
        self._enqueued.set()
        return event


class _OpensGateWhenBlocked:
    """The table's real lock; a thread other than "first" that finds it held (the first
    stream finishing its upload inside it) opens the gate, then waits for it. One that finds
    it free (the upload handed over unfinished) leaves the gate shut: its kernels must then
    be ordered after the upload by other means."""

    def __init__(self, real, gate) -> None:
        self._real, self._gate, self.opened = real, gate, False

    def acquire(self, blocking=True):
        if threading.current_thread().name == "first" or not blocking:
            return self._real.acquire(blocking)
        if not self._real.acquire(False):
            self.open()
            self._real.acquire()
        return True

    def release(self):
        self._real.release()

    def open(self):
        if not self.opened:
            self.opened = True
            self._gate.set_complete()

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


@pytest.mark.gpu
def test_a_shared_read_only_table_is_uploaded_before_another_threads_stream_reads_it(
        gpu_device, monkeypatch):
    device = gpu_device
    if device.backend != "cuda":
        pytest.skip("PyOpenCL's upload of a pageable table waits for itself inside the "
                    "table's lock: no window on OpenCL")
    k = device.compile(cv.portable(LUT), "lut")
    table = np.arange(64, dtype=np.uint32) * 7 + 1
    x = np.arange(5000, dtype=np.uint32)
    # The pool block the table's upload gets holds other values first.
    block = device.memory_pool.acquire(table.nbytes)
    queue = device.create_queue()
    queue.copy_in(block, np.full(64, 0xDEAD, np.uint32).view(np.uint8))
    queue.finish()
    queue.close()
    device.memory_pool.release(block)
    handle = cv.resident(table)
    gate, enqueued = device.user_event(), threading.Event()
    lock = handle._lock = _OpensGateWhenBlocked(handle._lock, gate)
    first: dict[str, object] = {}
    real_create = device.create_queue

    def create_queue():
        made = real_create()
        if threading.current_thread().name == "first" and "queue" not in first:
            first["queue"] = made
            return _GatedQueue(made, gate, enqueued)  # its copy-in queue: made first
        return made

    monkeypatch.setattr(device, "create_queue", create_queue)

    def run_first():
        try:
            y = np.zeros_like(x)
            cv.stream(k, [x], [y], args=(handle,), device=device)
            first["y"] = y
        except BaseException as exc:  # reported below
            first["error"] = exc
        finally:
            enqueued.set()

    thread = threading.Thread(target=run_first, name="first")
    thread.start()
    try:
        assert enqueued.wait(60)
        y = np.zeros_like(x)
        cv.stream(k, [x], [y], args=(handle,), device=device)  # the table is on the device
    finally:
        lock.open()
        thread.join(60)
        handle.close()
    assert not thread.is_alive() and "error" not in first, first
    np.testing.assert_array_equal(first["y"], table[x % 64])
    np.testing.assert_array_equal(y, table[x % 64])
    assert_clean(device)


# -- 4. guard: a stream planned beside another thread's ring fits the pinned room left -------
def test_a_stream_beside_another_threads_ring_fits_the_pinned_room_left(pool_limits,
                                                                      monkeypatch):
    # paths.pinned_room: B is planned while A (a callable, held inside its second block)
    # holds most of a 256 KiB pinned limit in its rings (all made before its first block:
    # CONVEYOR_RING_GROW=0); B's rings fit what is left.
    monkeypatch.setenv("CONVEYOR_RING_GROW", "0")
    device = pool_limits
    add = kernel(device, "add")
    device.pinned_pool.limit = 256 * 1024
    inside, go = threading.Event(), threading.Event()
    x = data((40_000, 2), np.int32, 1)
    y = np.zeros_like(x)
    failed: list[BaseException] = []

    def compute(x_dev, y_dev, queue, offset, n):
        store(y_dev, to_host(x_dev, queue) * 3 + 1, queue)
        if offset > 0 and not inside.is_set():
            inside.set()
            assert go.wait(60)

    def run_a():
        try:
            cv.stream(compute, [x], [y], device=device)
        except BaseException as exc:  # reported below
            failed.append(exc)
        finally:
            inside.set()

    thread = threading.Thread(target=run_a)
    thread.start()
    try:
        assert inside.wait(60)
        held = device.pinned_pool.stats().in_use_bytes
        assert held > 128 * 1024  # A's rings hold most of the limit
        a, b = data((30_000,), np.float32, 2), data((30_000,), np.float32, 3)
        c = np.zeros_like(a)
        cv.stream(add, [a, b], [c], device=device, zero_copy=False)
        np.testing.assert_array_equal(c, add_reference(a, b))
    finally:
        go.set()
        thread.join(60)
    assert not thread.is_alive() and not failed, failed
    np.testing.assert_array_equal(y, x * 3 + 1)
    stats = device.pinned_pool.stats()
    assert stats.in_use_bytes + stats.held_bytes <= 256 * 1024, stats
    assert_clean(device)
