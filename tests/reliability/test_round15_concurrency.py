"""Round fifteen (helper F): concurrency, lifecycle, several devices and Dask.

Threads streaming every kind of stream at once on one device and over the ``pair``, a
``cv.resident`` table shared by streams on several threads (and closed by another thread),
objects dropped unclosed, the first ``cv.device()`` opened by many threads at once, a fork
while another thread streams, spawned children that stream, ``cv.iterate`` generators that
misbehave part way, and ``conveyor.dask`` on an in-process ``LocalCluster`` (several worker
threads sharing one device) with irregular and empty chunks, halos, reductions, a kernel of
two outputs and a chunk that fails. No pass or fail depends on thread timing: interleavings
are forced with events (a generator or callable that waits), or only the final state is
checked.

Found (each an ``xfail(strict=True)`` test asserting the right behaviour):

- A writable ``cv.resident`` table shared by two streams at once: a stream that FAILS leaves
  its partial writes in the shared device buffer, and the other stream's copy-back puts them
  into the host array, with no error (the README: "a failed stream's partial writes are
  dropped"). ``Resident.use`` uploads the host table only when ``users == 0``.
- ``conveyor.dask.map_blocks`` of a kernel with two output parameters is accepted on the
  client and fails in every chunk on the workers (one traceback each) with "takes 5
  parameters; this stream passes 4", which does not say that map_blocks makes one output.
- A BaseException (not an Exception) from a chunk's callable on a Dask worker hangs the
  compute for ever: ``conveyor.dask.worker.run`` catches ``Exception`` only, and Dask's
  worker never finishes a task that raised a BaseException.
- A ragged list yielded as a ``cv.iterate`` chunk is NumPy's raw ValueError ("setting an
  array element with a sequence"): ``chunks.IterSource._next`` calls ``np.asarray`` unguarded.

Noticed, not made a test (a race, not reproduced on demand): a child forked by ``os.fork()``
after the parent streamed, kept arrays and held pinned arrays, that exits through
``sys.exit`` (so the interpreter finalizes) hung once in PoCL's ``clEnqueueUnmapMemObject``
called from ``array_dealloc`` (a NumPy array over a PyOpenCL mapping freed at exit).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    add_reference,
    assert_clean,
    data,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    kernel,
    next_stream_right,
    run_threads,
    stencil_reference,
    store,
    to_host,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

HIST = """__kernel void hist(__global const uint *x, __global uint *counts, ulong offset,
                         ulong n) {
    ulong i = get_global_id(0);
    if (i < n) atomic_inc(&counts[x[i] % 16]);
}"""


LUT = """__kernel void lut(__global const float *x, __global float *y, __global const float *t,
                        ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + t[(offset + i) % 4];
}"""


def _opencl(device: cv.Device) -> None:
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels (atomic_inc) and PyOpenCL arrays")


def _child(script: str, tmp_path: Path, *args: str, timeout: int = 90):
    """Run ``script`` in a fresh Python (the checkout's src first); its CompletedProcess."""
    path = tmp_path / "child.py"
    path.write_text(textwrap.dedent(script))
    path_now = os.environ.get("PYTHONPATH")  # the GPU machine's wheels are found through it
    env = dict(os.environ, CONVEYOR_WARMUP="0",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), *([path_now] if path_now else [])]))
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(tmp_path))


# -- 1. threads streaming every kind of stream at once ----------------------------------------
def test_threads_streaming_every_kind_at_once_on_one_device_and_over_the_pair(pair):
    # guard: six threads, each streaming a map (copying and zero-copy), a halo stencil, a
    # callable reduction with a fold, a chain and a cv.iterate input, on device 0, device 1
    # or both at once: every result exact, every pool back at zero, no staging thread.
    for dev in pair:
        _opencl(dev)
    wheres = [pair[0], pair[1], list(pair), pair[0], list(pair), pair[1]]

    def work(index):
        where = wheres[index]
        one = where[0] if isinstance(where, list) else where
        a, b = data((9001,), np.float32, 20 + index), data((9001,), np.float32, 40 + index)
        for zero_copy in (False, None):
            c = np.zeros_like(a)
            cv.stream(kernel(one, "add") if not isinstance(where, list) else
                      [kernel(d, "add") for d in where][0], [a, b], [c], device=where,
                      block_bytes=2000, zero_copy=zero_copy)
            np.testing.assert_array_equal(c, add_reference(a, b))
        x = data((1500, 3), np.float32, 60 + index)
        y = np.zeros_like(x)
        cv.stream(kernel(one, "sten"), [x], [y], device=where, args=(3, 2), halo=2,
                  block_bytes=3 * 4 * 200)
        np.testing.assert_array_equal(y, stencil_reference(x, 2))

        def partial(x_dev, queue, offset, n):
            return np.array([offset, to_host(x_dev, queue).astype(np.float64).sum()])

        seen: list[int] = []

        def fold(first, second):
            seen.append(int(second[0]))
            return np.array([first[0], first[1] + second[1]])

        report = cv.stream(partial, [a], reduce=fold, device=where, block_bytes=2000)
        assert seen == sorted(seen) and len(seen) == report.blocks - 1
        assert report.result[1] == pytest.approx(a.astype(np.float64).sum(), rel=1e-12)

        def twice(x_dev, t_dev, queue, offset, n):
            store(t_dev, to_host(x_dev, queue) * 2, queue)

        def plus_one(t_dev, y_dev, queue, offset, n):
            store(y_dev, to_host(t_dev, queue) + 1, queue)

        chain = cv.chain(cv.link(twice, reads="in0", writes="t"),
                         cv.link(plus_one, reads="t", writes="out0"),
                         temps={"t": np.float32})
        out = np.zeros_like(a)
        cv.stream(chain, [a], [out], device=where, block_bytes=2000)
        np.testing.assert_array_equal(out, a * 2 + 1)

        buf = np.empty(700, np.float32)

        def reused():  # one buffer filled again for every chunk
            for lo in range(0, len(a), 700):
                part = a[lo:lo + 700]
                buf[:len(part)] = part
                yield buf[:len(part)]

        out[:] = 0
        cv.stream(kernel(one, "sten"), [cv.iterate(reused(), length=len(a))], [out],
                  device=one, args=(1, 1), halo=1, block_bytes=1600)
        np.testing.assert_array_equal(out, stencil_reference(a, 1))

    run_threads(work, len(wheres))
    for dev in pair:
        assert_clean(dev)
    # The page-faulting and compiling pools (memory/hostmem.py, kernels/build.py) are the
    # process's, kept between streams; a stream's own threads must be gone.
    assert not [t for t in threading.enumerate() if t.name.startswith("conveyor-")
                and not t.name.startswith(("conveyor-fault", "conveyor-compile"))]


# -- 2. a resident table shared by threads ----------------------------------------------------
def test_a_failed_streams_writes_to_a_shared_writable_table_are_dropped(device):
    # Stream B (a thread) holds a writable table: its generator yields one chunk, then
    # waits. Stream A uses the same table, writes two chunks' counts and fails. B goes on
    # and copies the table back: the host array must hold B's counts only (or B, or A, must
    # be refused for sharing a writable table), never A's partial writes.
    _opencl(device)
    k = device.compile(HIST, "hist")
    x = np.arange(40_000, dtype=np.uint32)
    counts = np.zeros(16, np.uint32)
    started, go = threading.Event(), threading.Event()

    def waits():
        yield x[:10_000]
        started.set()
        assert go.wait(60)
        yield x[10_000:]

    def fails():
        yield x[:10_000]
        yield x[10_000:20_000]
        raise RuntimeError("the reader failed")

    result: dict[str, object] = {}
    table = cv.resident(counts, writable=True)

    def run_b():
        try:
            cv.stream(k, [cv.iterate(waits(), length=len(x))], [], args=(table,),
                      device=device, block_bytes=40_000)
        except BaseException as exc:
            result["b"] = exc

    def run_a():
        try:
            cv.stream(k, [cv.iterate(fails(), length=len(x))], [], args=(table,),
                      device=device, block_bytes=40_000)
        except BaseException as exc:
            result["a"] = exc

    thread = threading.Thread(target=run_b)
    thread.start()
    other = threading.Thread(target=run_a)
    try:
        assert started.wait(60)  # B holds the table now
        other.start()  # A waits for the table (round 15), or shares it (before)
    finally:
        go.set()
        thread.join(60)
        if other.ident is not None:
            other.join(60)
    table.close()
    assert not thread.is_alive() and not other.is_alive()
    assert isinstance(result.get("a"), RuntimeError), result
    assert "b" not in result, result
    np.testing.assert_array_equal(counts, np.bincount(x % 16, minlength=16))
    assert_clean(device)


def test_threads_adding_into_one_writable_table_count_every_stream(device):
    # guard: four threads, five streams each, atomics into one writable cv.resident:
    # after all, the host table holds all twenty streams' counts.
    _opencl(device)
    k = device.compile(HIST, "hist")
    x = np.arange(30_000, dtype=np.uint32)
    counts = np.zeros(16, np.uint32)
    with cv.resident(counts, writable=True) as table:
        def work(index):
            for _ in range(5):
                cv.stream(k, [x], [], args=(table,), device=device, block_bytes=20_000)

        run_threads(work, 4)
    np.testing.assert_array_equal(counts, 20 * np.bincount(x % 16, minlength=16))
    assert_clean(device)


def test_a_resident_table_closed_by_another_thread_under_a_stream(device):
    # guard: while a kernel stream (paused: its cv.iterate generator waits for an event)
    # uses a read-only resident table, close() and refresh() from the main thread are
    # InputErrors saying to wait; the stream stays exact; close() after it works, and a
    # closed table is refused by the next stream.
    _opencl(device)
    k = device.compile(LUT, "lut")
    x = data((12_000,), np.float32, 5)
    table = np.array([1.5, -2.0, 3.25, 0.5], np.float32)
    handle = cv.resident(table, device=device)
    reached, go = threading.Event(), threading.Event()
    result: dict[str, object] = {}

    def chunks():
        yield x[:4000]
        reached.set()
        assert go.wait(60)
        yield x[4000:]

    y = np.zeros_like(x)

    def run():
        try:
            cv.stream(k, [cv.iterate(chunks(), length=len(x))], [y], args=(handle,),
                      device=device, block_bytes=4000)
        except BaseException as exc:
            result["error"] = exc
        finally:
            reached.set()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert reached.wait(60) and "error" not in result, result
        with pytest.raises(InputError, match="after the stream returns"):
            handle.close()
        with pytest.raises(InputError, match="after the stream returns"):
            handle.refresh()
    finally:
        go.set()
        thread.join(60)
    assert "error" not in result, result
    np.testing.assert_array_equal(y, x + table[np.arange(len(x)) % 4])
    handle.close()
    with pytest.raises(InputError, match="closed"):
        cv.stream(k, [x], [y], args=(handle,), device=device, block_bytes=4000)
    assert_clean(device)


SQ = """__kernel void sq(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * 2.0f + (float)(offset + i);
}"""


def test_one_kernel_future_first_loaded_by_many_threads_at_once(device):
    # guard: a KernelFuture (compile(wait=False)) whose module no stream loaded yet, given
    # to six threads' streams at once: every result exact.
    _opencl(device)
    future = device.compile(SQ.replace("sq", "sq_future"), "sq_future", wait=False)
    x = data((20_000,), np.float32, 14)
    reference = x * 2 + np.arange(len(x)).astype(np.float32)

    def work(index):
        y = np.zeros_like(x)
        cv.stream(future, [x], [y], device=device, block_bytes=4000)
        np.testing.assert_array_equal(y, reference)

    run_threads(work, 6)
    assert_clean(device)


def test_threads_streaming_into_one_output_file_and_one_trace_file(device, tmp_path):
    # guard: four threads, three streams each, all into the same .npy output and the same
    # trace file: none fails, the file is whole and right, the trace is valid JSON, and no
    # temporary or part file is left in the folder.
    import json

    _opencl(device)
    k = device.compile(SQ, "sq")
    x = data((20_000,), np.float32, 15)
    out, trace = tmp_path / "y.npy", tmp_path / "trace.json"

    def work(index):
        for _ in range(3):
            cv.stream(k, [x], [str(out)], device=device, block_bytes=4000, trace=str(trace))

    run_threads(work, 4)
    np.testing.assert_array_equal(np.load(out), x * 2 + np.arange(len(x)).astype(np.float32))
    assert "traceEvents" in json.loads(trace.read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json", "y.npy"]
    assert_clean(device)


def test_pools_trimmed_and_limited_by_another_thread_mid_stream(device):
    # guard: while a stream is paused (its generator waits), the main thread trims both
    # pools, sets keep=0 and a limit of one byte: the stream goes on exact with the ring it
    # has, every block comes back, and the pools work again once the limit is lifted.
    _opencl(device)
    k = device.compile(SQ, "sq")
    x = data((20_000,), np.float32, 16)
    reached, go = threading.Event(), threading.Event()
    result: dict[str, object] = {}

    def chunks():
        yield x[:8000]
        reached.set()
        assert go.wait(60)
        yield x[8000:]

    y = np.zeros_like(x)

    def run():
        try:
            cv.stream(k, [cv.iterate(chunks(), length=len(x))], [y], device=device,
                      block_bytes=4000, zero_copy=False)
        except BaseException as exc:
            result["error"] = exc
        finally:
            reached.set()

    pools = (device.memory_pool, device.pinned_pool)
    saved = [(pool.limit, pool.keep) for pool in pools]
    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert reached.wait(60)
        for pool in pools:
            pool.trim()
            pool.keep = 0
            pool.limit = 1
    finally:
        go.set()
        thread.join(60)
        for pool, (limit, keep) in zip(pools, saved, strict=True):
            pool.limit, pool.keep = limit, keep
    assert "error" not in result, result
    np.testing.assert_array_equal(y, x * 2 + np.arange(len(x)).astype(np.float32))
    assert_clean(device)
    next_stream_right(device)


# -- 3. objects dropped unclosed ---------------------------------------------------------------
def test_objects_dropped_unclosed_give_everything_back(device):
    # guard: an uploaded resident table, a writable one, a pinned array, a half-read
    # cv.iterate generator, a KernelFuture never waited for and a report, all dropped
    # without close(): after a collection every pool is at zero and the device streams right.
    _opencl(device)
    closed: list[bool] = []

    def gen():
        try:
            for _ in range(10):
                yield np.ones(100, np.float32)
        finally:
            closed.append(True)

    x = data((5000,), np.float32, 8)
    made = [cv.resident(np.ones(64, np.float32), device=device),
            cv.resident(np.zeros(16, np.uint32), writable=True),
            cv.pinned.empty(4096, np.float32, device=device),
            cv.iterate(gen(), length=1000),
            device.compile(HIST.replace("hist", "hist_future"), "hist_future", wait=False)]
    counts = np.zeros(16, np.uint32)
    made.append(cv.stream(device.compile(HIST, "hist"), [x.view(np.uint32)], [],
                          args=(cv.resident(counts, writable=True),), device=device,
                          block_bytes=4000))
    assert counts.sum() == len(x)
    del made
    gc.collect()
    assert closed == [True]
    assert_clean(device)
    next_stream_right(device)


# -- 4. processes -------------------------------------------------------------------------------
def test_many_threads_opening_the_first_device_at_once_share_one(tmp_path):
    # guard: in a fresh process, eight threads call cv.device(spec) at the same moment (the
    # first discovery of the drivers) and all get the one Device, then stream on it at once.
    spec = next(d.spec for d in cv.devices() if d.backend == "opencl")
    done = _child("""
        import sys, threading
        import numpy as np
        import conveyor as cv
        SRC = '''__kernel void sq(__global const float *x, __global float *y, ulong offset,
                                  ulong n) {
            ulong i = get_global_id(0); if (i < n) y[i] = x[i] * x[i]; }'''
        barrier, got, errors = threading.Barrier(8), [], []
        def main(i):
            try:
                barrier.wait()
                dev = cv.device(sys.argv[1])
                got.append(dev)
                x = np.arange(5000, dtype=np.float32) + i
                y = np.zeros_like(x)
                cv.stream(dev.compile(SRC, "sq"), [x], [y], device=dev, block_bytes=4000)
                assert np.array_equal(y, x * x)
            except BaseException as exc:
                errors.append(repr(exc))
        threads = [threading.Thread(target=main, args=(i,)) for i in range(8)]
        [t.start() for t in threads]
        [t.join(60) for t in threads]
        print(len({id(d) for d in got}), len(got), errors)
        """, tmp_path, spec)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[0] == "1 8 []", done.stdout + done.stderr[-3000:]


def test_a_fork_while_another_thread_streams_leaves_the_parents_stream_exact(tmp_path):
    # guard: a thread's stream is paused in a callable; the main thread forks (a fork-context
    # multiprocessing child), whose stream gets the BackendError that says to spawn, and
    # which then exits normally (atexit handlers run in the child): no hang there; the
    # parent's stream then finishes exact, with its pools at zero.
    spec = next(d.spec for d in cv.devices() if d.backend == "opencl")
    done = _child("""
        import multiprocessing as mp, sys, threading
        import numpy as np
        import conveyor as cv
        from conveyor.errors import BackendError

        def child(queue):
            try:
                y = np.zeros(100, np.float32)
                cv.stream(lambda x, y, *, queue, offset, n: None, [np.ones(100, np.float32)],
                          [y], device=cv.device(sys.argv[1]))
                queue.put("streamed")
            except BackendError as exc:
                queue.put("spawn" if "spawn" in str(exc) else repr(exc))
            except BaseException as exc:
                queue.put(repr(exc))
            sys.exit(0)

        if __name__ == "__main__":
            dev = cv.device(sys.argv[1])
            x = np.arange(20000, dtype=np.float32)
            y = np.zeros_like(x)
            reached, go, result = threading.Event(), threading.Event(), {}
            def compute(x_dev, y_dev, *, queue, offset, n):
                if offset == 8000:
                    reached.set()
                    assert go.wait(60)
                y_dev.set(x_dev.get() * 3)
            def run():
                try:
                    cv.stream(compute, [x], [y], device=dev, block_bytes=4000, warmup=False)
                except BaseException as exc:
                    result["error"] = repr(exc)
            t = threading.Thread(target=run); t.start()
            assert reached.wait(60)
            ctx = mp.get_context("fork")
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q,)); p.start()
            answer = q.get(timeout=60)
            p.join(60)
            go.set(); t.join(60)
            stats = [pool.stats().in_use_bytes for pool in (dev.memory_pool, dev.pinned_pool)]
            print(answer, p.exitcode, result, bool(np.array_equal(y, x * 3)), stats)
        """, tmp_path, spec)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[0] == "spawn 0 {} True [0, 0]", done.stdout + done.stderr


def test_spawned_children_stream_exact_while_the_parent_streams(tmp_path):
    # guard: a spawn-context pool of two children streams chunks while the parent streams
    # too: every chunk exact in the child, the parent's stream exact.
    spec = next(d.spec for d in cv.devices() if d.backend == "opencl")
    done = _child("""
        import multiprocessing as mp, sys
        import numpy as np
        import conveyor as cv
        SRC = '''__kernel void sq(__global const float *x, __global float *y, ulong offset,
                                  ulong n) {
            ulong i = get_global_id(0); if (i < n) y[i] = x[i] * x[i] + (float)(offset + i); }'''

        def square(args):
            spec, lo = args
            dev = cv.device(spec, warm_up=False)
            rows = np.arange(lo, lo + 3000)
            x = (rows % 97).astype(np.float32)
            y = np.zeros_like(x)
            cv.stream(dev.compile(SRC, "sq"), [x], [y], device=dev, block_bytes=4000,
                      first_row=lo)
            return bool(np.array_equal(y, x * x + rows.astype(np.float32)))

        if __name__ == "__main__":
            dev = cv.device(sys.argv[1])
            rows = np.arange(9000)
            x = (rows % 97).astype(np.float32)
            y = np.zeros_like(x)
            with mp.get_context("spawn").Pool(2) as pool:
                pending = pool.map_async(square, [(sys.argv[1], lo) for lo in (0, 3000, 6000)])
                cv.stream(dev.compile(SRC, "sq"), [x], [y], device=dev, block_bytes=4000)
                print(pending.get(60), bool(np.array_equal(y, x * x + rows.astype(np.float32))))
        """, tmp_path, spec)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[0] == "[True, True, True] True", done.stdout + done.stderr


# -- 5. generators that misbehave part way ------------------------------------------------------
@pytest.mark.parametrize("bad", ["row shape", "0-d", "objects"])
def test_a_generator_yielding_a_wrong_chunk_part_way_is_an_input_error(device, bad):
    # guard: a chunk of another row shape, a 0-d value or an object array after good
    # chunks: an InputError naming the iterable, pools at zero, no thread left.
    _opencl(device)
    wrong = {"row shape": np.ones((100, 4), np.float32), "0-d": np.float32(1),
             "objects": np.array([object()] * 100)}

    def gen():
        for _ in range(3):
            yield np.ones((100, 3), np.float32)
        yield wrong[bad]
        yield np.ones((100, 3), np.float32)

    y = np.zeros((500, 3), np.float32)
    with pytest.raises(InputError, match="iterable"):
        cv.stream(kernel(device, "sten"), [cv.iterate(gen(), length=500)], [y],
                  device=device, args=(3, 1), halo=1, block_bytes=3 * 4 * 50)
    assert_clean(device)
    next_stream_right(device)


@pytest.mark.parametrize("first", [True, False], ids=["first-chunk", "later-chunk"])
def test_a_ragged_list_as_a_chunk_is_an_input_error(device, first):
    # A plain list input is refused ("input 0 (list) is not an array"); a ragged list
    # yielded as a chunk (first, when cv.iterate reads it; later, on the staging thread)
    # raised NumPy's "setting an array element with a sequence ... inhomogeneous shape".
    _opencl(device)

    def gen():
        if not first:
            yield np.ones(2, np.float32)
        yield [[1.0, 2.0], [3.0]]

    y = np.zeros(4, np.float32)
    with pytest.raises(InputError, match="iterable"):
        cv.stream(kernel(device, "scale"), [cv.iterate(gen(), length=4)], [y],
                  device=device, args=(2.0,))
    assert_clean(device)


def test_odd_chunks_from_a_generator_are_read_as_their_values(device):
    # guard: non-contiguous, Fortran-order, read-only and zero-row chunks mixed in one
    # iterable over two-column rows, with a halo across chunk edges: exact.
    _opencl(device)
    x = data((1200, 2), np.float32, 12)

    def gen():
        yield x[:100]
        big = np.zeros((400, 2), np.float32)
        big[::2] = x[100:300]
        yield big[::2]                             # strided rows
        yield np.asfortranarray(x[300:500])        # Fortran order
        yield x[500:500]                           # no rows
        ro = x[500:900].copy()
        ro.flags.writeable = False
        yield ro                                   # read-only
        yield x[900:].T.copy().T                   # a transposed copy's view

    y = np.zeros_like(x)
    cv.stream(kernel(device, "sten"), [cv.iterate(gen(), length=len(x))], [y], device=device,
              args=(2, 1), halo=1, block_bytes=2 * 4 * 64)
    np.testing.assert_array_equal(y, stencil_reference(x, 1))
    assert_clean(device)


# -- 6. re-entrancy -----------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::conveyor.hazards.HazardWarning")  # the inner copy-back
def test_a_callable_that_streams_with_the_table_its_own_stream_holds(device):
    # guard: the outer stream's callable, on its device thread, streams a kernel that adds
    # into the same writable cv.resident table the outer kernel stream holds (the outer one
    # adds too, through a chain link): every count arrives once the outer stream ends.
    _opencl(device)
    k = device.compile(HIST, "hist")
    x = np.arange(8000, dtype=np.uint32)
    inner = np.arange(1000, dtype=np.uint32)
    counts = np.zeros(16, np.uint32)
    with cv.resident(counts, writable=True) as table:
        def count_inner(x_dev, queue, offset, n):
            cv.stream(k, [inner], [], args=(table,), device=device, block_bytes=2000)
            return np.array([n])

        chain = cv.chain(cv.link(k, reads="in0", args=(table,)),
                         cv.link(count_inner, reads="in0"))
        report = cv.stream(chain, [x], device=device, block_bytes=8000, reduce="sum",
                           warmup=False)  # a warm-up call would stream once more
        blocks = report.blocks
    assert report.result[0] == len(x)
    expected = np.bincount(x % 16, minlength=16) + blocks * np.bincount(inner % 16,
                                                                          minlength=16)
    np.testing.assert_array_equal(counts, expected)
    assert_clean(device)


# -- 7. conveyor.dask on an in-process cluster ------------------------------------------------
AXPY = """
__kernel void axpy(__global const float* x, __global float* y, float a, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = a * x[i] + (float)(offset + i);
}
"""
STEN = """
__kernel void sten(__global const float* x, __global float* y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] - 2.0f * x[i + 2] + 3.0f * x[i + 4] + (float)((offset + i) % 7);
}
"""
TWO = """
__kernel void two(__global const float *x, __global float *y, __global float *z, ulong offset,
                  ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { y[i] = x[i] * 2.0f; z[i] = x[i] + 1.0f; }
}
"""
CHUNKS = (0, 1, 3000, 0, 2, 5000, 2001, 0, 3)


def _dask_spec() -> str:
    return next(d.spec for d in cv.devices() if d.backend == "opencl")


@pytest.fixture(scope="module")
def inproc():
    """Two workers of two threads each, in this process: four threads may stream on one
    device (the process's one Device per spec) at once."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=False,
                                       dashboard_address=":0", silence_logs=50)
    with cluster, distributed.Client(cluster) as client:
        yield client


def _idle(client) -> None:
    """Wait until every task is over: a failed compute returns while the other chunks'
    streams still run on the worker threads (the scheduler forgets them at once, so it
    cannot say), so wait for the final state, the pools of every device at zero."""
    devices = [d for d in cv.devices() if d.backend == "opencl"]
    for _ in range(600):
        gc.collect()
        if not any(client.processing().values()) and all(
                pool.stats().in_use_bytes == 0
                for d in devices for pool in (d.memory_pool, d.pinned_pool)):
            return
        time.sleep(0.05)


def test_dask_threads_map_irregular_and_empty_chunks_as_one_local_stream(inproc):
    # guard: irregular chunks with empty ones, four worker threads on one device: equal to
    # NumPy and to one local stream (offsets of the whole array).
    da = pytest.importorskip("dask.array")
    import conveyor.dask as cvd

    x = data((sum(CHUNKS),), np.float32, 30)
    dx = da.from_array(x, chunks=(CHUNKS,))
    y = cvd.map_blocks(cvd.kernel(AXPY, "axpy"), dx, args=(2.0,), device=_dask_spec(),
                       block_bytes=4000).compute()
    np.testing.assert_array_equal(y, (2 * x + np.arange(len(x))).astype(np.float32))
    twice = cvd.map_blocks(cvd.kernel(AXPY, "axpy"), dx, args=(2.0,), device=_dask_spec(),
                           block_bytes=4000)
    both = da.stack([twice, twice * 0 + twice]).compute()  # one graph, chunks twice at once
    np.testing.assert_array_equal(both[0], y)
    np.testing.assert_array_equal(both[1], y)
    _idle(inproc)


@pytest.mark.parametrize("boundary,mode", [("nearest", "edge"), ("reflect", "symmetric"),
                                           ("periodic", "wrap"), (0.0, "constant")])
def test_dask_threads_halo_over_irregular_chunks_is_numpy_on_pad(inproc, boundary, mode):
    # guard: a halo of 2 over chunks of 0, 1, 2 and 3 rows among large ones.
    da = pytest.importorskip("dask.array")
    import conveyor.dask as cvd

    x = data((sum(CHUNKS),), np.float32, 31)
    dx = da.from_array(x, chunks=(CHUNKS,))
    y = cvd.map_blocks(cvd.kernel(STEN, "sten"), dx, halo=2, boundary=boundary,
                       device=_dask_spec(), block_bytes=4000).compute()
    p = np.pad(x, 2, mode=mode)
    ref = (p[:-4] - 2 * p[2:-2] + 3 * p[4:] + np.arange(len(x)) % 7).astype(np.float32)
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-5)
    _idle(inproc)


@pytest.mark.parametrize("op", ["sum", "min", "max"])
def test_dask_threads_reduce_over_irregular_chunks_is_one_local_stream(inproc, op):
    # guard: kernel reductions over chunks with empty ones: the local stream's value.
    da = pytest.importorskip("dask.array")
    import conveyor.dask as cvd

    spec = _dask_spec()
    x = data((sum(CHUNKS),), np.float32, 32)
    dx = da.from_array(x, chunks=(CHUNKS,))
    got = cvd.reduce(cvd.kernel(AXPY, "axpy"), dx, op, args=(1.0,), device=spec).compute()
    dev = cv.device(spec)
    local = cv.stream(dev.compile(AXPY, "axpy"), [x], device=dev, args=(1.0,),
                      reduce=op).result
    values = (x + np.arange(len(x))).astype(np.float32).astype(np.float64)
    reference = {"sum": values.sum(), "min": values.min(), "max": values.max()}[op]
    assert got == pytest.approx(local, rel=1e-12)
    assert got == pytest.approx(reference, rel=1e-9)
    _idle(inproc)


def test_dask_map_blocks_of_a_kernel_with_two_outputs_is_refused_on_the_client(inproc):
    da = pytest.importorskip("dask.array")
    import conveyor.dask as cvd

    dx = da.from_array(np.ones(100, np.float32), chunks=30)
    with pytest.raises(InputError, match="one output"):
        cvd.map_blocks(cvd.kernel(TWO, "two"), dx, device=_dask_spec())
    _idle(inproc)


class Stop(BaseException):
    """What a signal handler of the program might raise: no Exception."""


def test_dask_a_base_exception_from_a_chunk_reaches_the_client(inproc):
    # Locally a BaseException out of a callable is raised as itself. On a Dask worker,
    # conveyor.dask's run() catches Exception only: the Stop went raw into Dask's worker,
    # whose event loop logged it, and the task never finished (the compute hung; here it
    # times out after 10 s). It should reach the client as an error naming the chunk.
    da = pytest.importorskip("dask.array")
    import conveyor.dask as cvd

    x = np.arange(10_000, dtype=np.float32)
    dx = da.from_array(x, chunks=2500)

    def stops(x_dev, y_dev, *, queue, offset, n):
        if offset == 5000:
            raise Stop("stop here")
        store(y_dev, to_host(x_dev, queue), queue)

    future = inproc.compute(cvd.map_blocks(stops, dx, device=_dask_spec(), block_bytes=4000))
    try:
        with pytest.raises(BaseException) as caught:
            future.result(timeout=10)
    finally:
        future.cancel()
        _idle(inproc)
    assert "stop here" in str(caught.value), repr(caught.value)


def test_dask_a_chunk_that_fails_on_a_worker_thread_leaves_the_device_usable(inproc):
    # guard: a callable that fails on the last chunks: its own exception type, with a note
    # naming a chunk and the worker; once every task is over the pools are at zero, and the
    # next compute on the same workers is exact.
    da = pytest.importorskip("dask.array")
    import conveyor.dask as cvd

    spec = _dask_spec()
    x = data((sum(CHUNKS),), np.float32, 33)
    dx = da.from_array(x, chunks=(CHUNKS,))

    def fails_late(x_dev, y_dev, *, queue, offset, n):
        if offset >= 8003:
            raise ZeroDivisionError("late chunk")
        store(y_dev, to_host(x_dev, queue) * 2, queue)

    with pytest.raises(ZeroDivisionError, match="late chunk") as caught:
        cvd.map_blocks(fails_late, dx, device=spec, block_bytes=4000).compute()
    assert any("conveyor.dask: chunk" in note and "worker" in note
               for note in getattr(caught.value, "__notes__", [])), caught.value
    del caught
    _idle(inproc)
    assert_clean(cv.device(spec))
    y = cvd.map_blocks(cvd.kernel(AXPY, "axpy"), dx, args=(3.0,), device=spec,
                       block_bytes=4000).compute()
    np.testing.assert_allclose(y, (3 * x + np.arange(len(x))).astype(np.float32), rtol=1e-6)
    _idle(inproc)


def test_dask_on_spawned_worker_processes_reduces_irregular_chunks_in_order():
    # guard: processes=True (one spawned worker of two threads): a callable's partials over
    # chunks with empty ones, folded by a non-commutative function, in row order; and a
    # chunk that fails there reaches the client as its own type with the chunk's note.
    distributed = pytest.importorskip("distributed")
    da = pytest.importorskip("dask.array")
    cloudpickle = pytest.importorskip("cloudpickle")
    import conveyor.dask as cvd

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spec = _dask_spec()
    x = np.arange(sum(CHUNKS), dtype=np.float32)
    dx = da.from_array(x, chunks=(CHUNKS,))

    def first_rows(x_dev, *, queue, offset, n):
        if offset < 0:
            raise ZeroDivisionError("never")
        return [offset]

    def fails(x_dev, *, queue, offset, n):
        if offset >= 8003:
            raise ZeroDivisionError("late chunk")
        return [offset]

    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                                       dashboard_address=":0", silence_logs=50)
    with cluster, distributed.Client(cluster):
        got = cvd.reduce(first_rows, dx, lambda a, b: a + b, device=spec,
                         block_bytes=4000).compute()
        with pytest.raises(ZeroDivisionError, match="late chunk") as caught:
            cvd.reduce(fails, dx, lambda a, b: a + b, device=spec, block_bytes=4000).compute()
    starts = list(got[()] if isinstance(got, np.ndarray) else got)
    chunk_starts = np.concatenate([[0], np.cumsum(CHUNKS)])
    expected = [int(lo) + k for lo, rows in zip(chunk_starts, CHUNKS, strict=False)
                for k in range(0, rows, 1000)]  # 1000-row blocks in every chunk
    assert starts == expected
    assert any("conveyor.dask: chunk" in note for note in caught.value.__notes__)
