"""Round twenty-three, helper C: Python objects that outlive the block or stream that made
them, and memory conveyor reuses (pooled device buffers, pinned staging rings, pinned pools).

Tried: what a callable receives (kept past its block, past the stream, past ``close()``; plain,
zero-copy, in chains, with halos, under ``reduce=``, over two devices), what it returns (its
input, a view of another output, one array object for every block, per-block records),
partials a callable fills again for every block, ``cv.iterate`` generators that refill one
buffer, ``cv.pinned.empty`` (also SVM) and ``keep_pinned`` arrays after ``device.close()``,
kernels, futures and resident tables outliving their context, and resident tables changed on
the host.

Found (strict xfails, each asserting the right behaviour):

- **Crash**: a device array a callable kept from a ``zero_copy=True`` block (README: "a
  PyOpenCL array kept anyway holds its own reference to the memory ... never a crash") reads
  the caller's array itself, which it does not keep alive: once the caller drops the array,
  ``kept.get()`` reads unmapped memory (SIGSEGV). ``device_array`` (backends/opencl.py)
  retains the driver's buffer, but a zero-copy block's buffer is a ``USE_HOST_PTR``
  registration over the caller's rows.
- **Wrong answer**: a callable that returns, for output 1, a view at an offset of output 0's
  array (output 0 used as scratch) gets output 0's new values in output 1: ``unalias`` knows
  another output's array only by its exact start (step.py ``_address`` includes the offset).
  Round twelve's swap fix for the whole array.
- **Wrong answer**: partials of kinds ``_host_copy`` does not copy (a set, a
  ``SimpleNamespace`` or a dataclass holding an array), which the callable fills again for
  every block, are folded ``depth`` blocks later with later blocks' values (1280 for 780).
  Round twenty-two fixed dicts only. A ``memoryview`` partial is a raw ``TypeError: cannot
  pickle 'memoryview' object`` (the fold's deepcopy of block 0's partial).
- **Wrong answer that depends on memory pressure**: a read-only ``cv.resident`` table changed on
  the host without ``refresh()`` keeps its uploaded values (``Resident.host_copy``: "still has
  its old values there, and a stream on its device sees those") until another stream's
  out-of-memory ladder evicts it; the next stream then uploads the changed host array. The
  same code gives 1.0 or 5.0 depending on what else ran.
- **False refusal**: a NumPy record partial (``(sum, count)`` as a structured 0-d array) with
  ``reduce=f`` is refused as "return a number or a numeric array"; a dict or an object of the
  same numbers is folded.
- **Unclear message**: a kernel built, or a table made resident, on another context of the same
  device (one since closed, say) is refused with "was built for opencl:0:0, the stream runs on
  opencl:0:0" ("lives on opencl:0:0, the stream runs on opencl:0:0").

Noticed, not tested: over several devices a callable runs on every engine's thread at once
(two calls inside it together on ``pair``), which the README does not say: a callable that
fills one host buffer (``a.get(ary=scratch)``) for its return or partial races with itself.
On CUDA, ``device_array`` keeps the ``DeviceBuffer`` object, but the pool's trim or close
frees its memory (``cuMemFree``) whoever holds it: a kept CuPy view then reads freed device
memory (not tried: no GPU here).

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import dataclasses
import gc
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import first_device_only  # noqa: E402, F401 (autouse: first device only)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

X = np.arange(40, dtype=np.float32)  # four blocks of 10 rows at block_bytes=40

DOUBLE = """
__kernel void dbl(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}
__kernel void lut(__global const float *x, __global float *y, __global const float *t,
                  ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + t[i % 4];
}
__kernel void sten(__global const float *x, __global float *y, ulong h, ulong offset,
                   ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { float s = 0.0f; for (ulong k = 0; k <= 2 * h; k++) s += x[i + k]; y[i] = s; }
}
"""


@pytest.fixture
def ocl(device):
    if device.backend != "opencl":
        pytest.skip("PyOpenCL callables and a second OpenCL context")
    return device


@pytest.fixture
def ctx(ocl):
    """Another context (own pools) on the device, closed after the test."""
    from conveyor.backends import opencl

    platform, index = (int(part) for part in ocl.spec.split(":")[1:])
    made = opencl.Device(ocl.cl_device, platform, index)  # type: ignore[attr-defined]
    yield made
    gc.collect()
    made.close()


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                          text=True, timeout=120)


# -- what a callable keeps -------------------------------------------------------------------
KEEP_ZERO_COPY = r'''
import gc, mmap, sys, numpy as np, conveyor as cv
dev = cv.device(sys.argv[1])
memory = mmap.mmap(-1, 1 << 20)  # the caller's memory: unmapped when it is closed
x = np.frombuffer(memory, np.float32)
x[:] = np.arange(len(x))
kept = []
def double(a, b, *, queue, offset, n):
    kept.append(a)
    b[...] = a * 2
y = cv.stream(double, [x], [np.float32], device=dev, block_bytes=1 << 18, zero_copy=True)
assert np.array_equal(y.outputs[0], x * 2)
del x, y
gc.collect()
try:
    memory.close()  # the caller lets go of its memory
except BufferError:  # something still views it (a kept array that holds it): not unmapped
    pass
got = [a.get() for a in kept]
print("read", [float(g[1]) for g in got])
'''


def test_a_device_array_kept_from_a_zero_copy_block_reads_after_the_caller_drops_its_array(
        ocl):
    """README: a PyOpenCL array a callable keeps "holds its own reference to the memory
    (reading it later gives whatever a later block left there, never a crash)". With
    ``zero_copy=True`` (asked for) the memory is the caller's array, which the kept array does
    not hold: once the caller drops it, ``.get()`` reads unmapped pages (SIGSEGV)."""
    if not ocl.host_unified:
        pytest.skip("zero_copy=True needs a device in host memory")
    done = _run(KEEP_ZERO_COPY, ocl.spec)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "read" in done.stdout and "65537.0, 131073.0, 196609.0" in done.stdout, done.stdout


@pytest.mark.parametrize("halo", [0, 2])
def test_guard_device_arrays_kept_past_the_stream_and_close_read_and_write(ctx, halo):
    """guard: a callable's pooled device arrays kept past their block, past the stream and
    past ``close()`` of the device read and write without a crash; the pinned input and
    output and the report made before ``close()`` still read and write; the next stream
    is exact and the pools settle once they are dropped."""
    x = np.arange(5000, dtype=np.float32)
    pin = cv.pinned.asarray(x, device=ctx)
    out = cv.pinned.zeros(5000, np.float32, device=ctx)
    kept = []

    def double(a, b, *, queue, offset, n):
        kept.append((a, b))
        b[...] = a[halo:len(a) - halo] * 2

    report = cv.stream(double, [pin], [out], device=ctx, block_bytes=4000, halo=halo)
    np.testing.assert_array_equal(out, x * 2)
    ctx.close()
    for a, b in kept:
        assert a.get().shape in ((1000 + 2 * halo,), (64 + 2 * halo,))
        b.fill(np.float32(3))
        a.get()
    out += 1
    pin[:] += 1
    assert "blocks" in str(report) and report.outputs[0] is out
    np.testing.assert_array_equal(out, x * 2 + 1)
    kept.clear()
    got = cv.stream(double, [pin], [np.float32], device=ctx, block_bytes=4000,
                    halo=halo).outputs[0]
    np.testing.assert_array_equal(got, (x + 1) * 2)
    del pin, out, report
    gc.collect()
    assert ctx.memory_pool.stats().in_use_bytes == 0
    assert ctx.pinned_pool.stats().in_use_bytes == 0


def test_guard_arrays_kept_over_two_devices_read_after_the_stream(pair):
    """guard: over two devices (two engines, two threads) a callable that keeps its arrays,
    returns a new one per block and a chain's reducing link that returns a tuple with a
    buffer it fills per call are exact; the kept arrays of both devices read afterwards."""
    if any(d.backend != "opencl" for d in pair):
        pytest.skip("PyOpenCL callables")
    x = np.arange(20_000, dtype=np.float32)
    kept = []

    def triple(a, b, *, queue, offset, n):
        kept.append((a, b))
        return a * 3

    y = cv.stream(triple, [x], [np.float32], device=pair, block_bytes=4000).outputs[0]
    np.testing.assert_array_equal(y, x * 3)

    def part(a, *, queue, offset, n):
        kept.append((a, None))
        return a.get().sum(keepdims=True).astype(np.float64), int(n)

    got = cv.stream(cv.chain(cv.link(part, reads="in0")), [x], device=pair, block_bytes=4000,
                    reduce="sum").result
    assert float(got[0][0]) == float(x.sum(dtype=np.float64)) and got[1] == len(x)
    for a, b in kept:
        a.get()
        if b is not None:
            b.get()
    kept.clear()


# -- what a callable returns -----------------------------------------------------------------
@pytest.mark.parametrize("chained", [False, True], ids=["callable", "chain-link"])
def test_a_returned_view_of_another_output_at_an_offset_is_copied_before_that_output(
        ocl, chained):
    """Output 0 used as scratch: the callable writes rows ``[x, 3x]`` into it, returns new
    values for output 0 and, for output 1, the second half of output 0's flat buffer. Round
    twelve copies a returned *whole* other output first (``unalias``); a view at an offset is
    missed (``_address`` compares exact starts) and output 1 gets output 0's new values. The
    same in a chain's callable link (chainstep.py uses ``unalias``)."""
    import pyopencl.array as cla

    n = 100

    def scratch(x, y0, y1, *, queue, offset, n):
        host = x.get()
        y0.set(np.stack([host, host * 3], 1), queue=queue)
        fresh = cla.zeros(queue, y0.shape, np.float32) + np.float32(9)
        return fresh, y0.reshape(-1)[len(host):2 * len(host)]

    x = np.arange(n, dtype=np.float32)
    y0, y1 = np.zeros((n, 2), np.float32), np.zeros(n, np.float32)
    compute = cv.chain(cv.link(scratch, reads="in0", writes=("out0", "out1"))) if chained \
        else scratch
    cv.stream(compute, [x], [y0, y1], device=ocl, block_bytes=1 << 16)  # one block
    assert np.all(y0 == 9)
    np.testing.assert_array_equal(y1, np.stack([x, x * 3], 1).reshape(-1)[n:])


def test_guard_one_device_array_returned_for_every_block_and_per_block_records(ocl):
    """guard: the same PyOpenCL array object, refilled on ``queue`` and returned for every
    block (a map and a ``cv.per_block`` record), lands in every block's rows: the copy is
    queued before the next block's refill."""
    import pyopencl.array as cla

    x = np.arange(1000, dtype=np.float32)
    held: dict[str, object] = {}

    def same(a, b, *, queue, offset, n):
        t = held.get(b.shape)
        if t is None:
            t = held[b.shape] = cla.empty(queue, b.shape, np.float32)
        t[...] = a * 3
        return t

    def record(a, b, *, queue, offset, n):
        t = held.get("rec")
        if t is None:
            t = held["rec"] = cla.empty(queue, (1, 2), np.float32)
        t.set(np.array([[offset, n]], np.float32), queue=queue)
        return t

    y = cv.stream(same, [x], [np.float32], device=ocl, block_bytes=400).outputs[0]
    np.testing.assert_array_equal(y, x * 3)
    report = cv.stream(record, [x], [cv.per_block((2,), np.float32)], device=ocl,
                       block_bytes=400)
    starts = report.block_ranges[:, 0]
    np.testing.assert_array_equal(report.outputs[0][:, 0], starts)
    np.testing.assert_array_equal(report.outputs[0][:, 1], np.diff(report.block_ranges)[:, 0])


# -- partials a callable fills again ---------------------------------------------------------
@dataclasses.dataclass
class _Held:
    v: np.ndarray


def _namespace(buf):
    return types.SimpleNamespace(v=buf), lambda a, b: types.SimpleNamespace(v=a.v + b.v)


def _dataclass(buf):
    return _Held(buf), lambda a, b: _Held(a.v + b.v)


@pytest.mark.parametrize("make", [_namespace, _dataclass], ids=["namespace", "dataclass"])
def test_an_object_partial_holding_a_refilled_buffer_folds_each_blocks_values(ocl, make):
    """The callable fills one buffer for every block and returns it inside its own object;
    ``reduce=f`` adds them. Block k's partial is folded when block k retires, ``depth``
    blocks later: the buffer then holds a later block's sum (1280 for 780)."""
    buf = np.zeros(1)

    def part(a, *, queue, offset, n):
        buf[0] = a.get().sum()
        return make(buf)[0]

    got = cv.stream(part, [X], device=ocl, reduce=make(buf)[1], block_bytes=40).result
    assert float(got.v[0]) == float(X.sum())


def test_a_set_partial_filled_again_for_every_block_unions_every_blocks_values(ocl):
    seen: set[int] = set()

    def part(a, *, queue, offset, n):
        seen.clear()
        seen.update(a.get().astype(int).tolist())
        return seen

    got = cv.stream(part, [X], device=ocl, reduce=lambda a, b: a | b, block_bytes=40).result
    assert got == set(range(40))


def test_a_memoryview_partial_folds_or_is_an_input_error(ocl):
    def part(a, *, queue, offset, n):
        return memoryview(a.get().sum(keepdims=True))

    try:
        got = cv.stream(part, [X], device=ocl, block_bytes=40,
                        reduce=lambda a, b: np.asarray(a) + np.asarray(b)).result
    except InputError as exc:
        assert "block 0" in str(exc)
    else:
        assert float(np.asarray(got)[0]) == float(X.sum())


def test_a_record_partial_folds_with_a_function(ocl):
    """A (sum, count) record per block, folded by ``reduce=f``: refused before the fold
    (partial_of refuses dtype kinds "OSUV" for every ``reduce=``; a dict or an object of
    the same two numbers is taken)."""
    rec = np.dtype([("s", "f8"), ("n", "i8")])

    def part(a, *, queue, offset, n):
        host = a.get()
        out = np.zeros((), rec)
        out["s"], out["n"] = host.sum(), len(host)
        return out

    def fold(a, b):
        out = np.zeros((), rec)
        out["s"], out["n"] = a["s"] + b["s"], a["n"] + b["n"]
        return out

    got = cv.stream(part, [X], device=ocl, reduce=fold, block_bytes=40).result
    assert (float(got["s"]), int(got["n"])) == (780.0, 40)


# -- cv.iterate: one buffer refilled --------------------------------------------------------
def _refilled(x: np.ndarray, rows: int):
    """Chunks of ``x`` in one buffer, overwritten with garbage as soon as the next chunk is
    asked for, then refilled."""
    buf = np.empty(rows, x.dtype)
    for start in range(0, len(x), rows):
        part = x[start:start + rows]
        buf[:len(part)] = part
        yield buf[:len(part)]
        buf[:] = -7


@pytest.mark.parametrize("rows, block_bytes, halo", [(7, 40, 1), (64, 400, 3), (333, 16, 0)])
def test_guard_iterate_of_one_refilled_buffer_is_exact_for_kernels_callables_and_sums(
        ocl, rows, block_bytes, halo):
    """guard: chunks that share one buffer, refilled as soon as the next is asked for, give
    NumPy's answer for a stencil kernel, a halo callable (and its warm-up) and a reduction."""
    x = np.arange(1000, dtype=np.float32) * 0.5
    pad = np.pad(x, halo, mode="edge")
    want = sum(pad[k:k + len(x)] for k in range(2 * halo + 1))
    k = ocl.compile(cv.portable(DOUBLE), "sten")
    y = np.zeros_like(x)
    cv.stream(k, [cv.iterate(_refilled(x, rows), len(x))], [y], args=(halo,), halo=halo,
              device=ocl, block_bytes=block_bytes)
    np.testing.assert_array_equal(y, want)

    def sten(a, b, *, queue, offset, n):
        host = a.get()
        b.set(sum(host[j:j + len(host) - 2 * halo] for j in range(2 * halo + 1)), queue=queue)

    y[:] = 0
    cv.stream(sten, [cv.iterate(_refilled(x, rows), len(x))], [y], halo=halo, device=ocl,
              block_bytes=block_bytes)
    np.testing.assert_array_equal(y, want)
    total = cv.stream(lambda a, *, queue, offset, n: a.get()[halo:len(a) - halo].sum(
        dtype=np.float64), [cv.iterate(_refilled(x, rows), len(x))], halo=halo, device=ocl,
        block_bytes=block_bytes, reduce="sum").result
    assert total == x.sum(dtype=np.float64)


def test_guard_outputs_conveyor_allocates_are_not_reused_by_the_next_stream(ocl):
    """guard: ``outputs=[np.float32]``, ``cv.rows``, ``cv.per_block`` and a kernel sum of
    one stream keep their values through a second stream of other values (none is backed by a
    pool or ring a later stream reuses)."""
    k = ocl.compile(cv.portable(DOUBLE), "dbl")
    x = np.arange(4000, dtype=np.float32)

    def shaped(a, b, c, *, queue, offset, n):
        host = a.get()
        return (host.reshape(-1, 2).sum(axis=1),
                np.array([[offset, host.sum()]], np.float32))

    def run(values):
        import pyopencl.array as cla

        plain = cv.stream(k, [values], [np.float32], device=ocl, block_bytes=4000,
                          zero_copy=False).outputs[0]
        total = cv.stream(k, [values], device=ocl, block_bytes=4000, reduce="sum").result

        def dev(a, b, c, *, queue, offset, n):
            one, two = shaped(a, b, c, queue=queue, offset=offset, n=n)
            return cla.to_device(queue, one), cla.to_device(queue, two)

        rep = cv.stream(dev, [values], [cv.rows(np.float32, ratio=(1, 2)),
                                        cv.per_block((2,), np.float32)], device=ocl,
                        block_bytes=4000)
        return plain, total, rep.outputs[0], rep.outputs[1]

    first = run(x)
    kept = [np.copy(a) for a in first]
    run(x * -3 + 1)
    for got, want in zip(first, kept, strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(first[0], x * 2)
    np.testing.assert_array_equal(first[2], x.reshape(-1, 2).sum(axis=1))


# -- resident tables and objects of another context ------------------------------------------
def test_a_resident_table_changed_without_refresh_does_not_depend_on_memory_pressure(ctx):
    """``t1`` is uploaded (1.0), then changed on the host without ``refresh()``: the next
    stream sees 1.0, as ``Resident.host_copy`` documents. A stream of another table under a
    tight pool limit evicts ``t1`` (the ladder); the stream after it uploads the changed host
    array: 5.0, with no error and no refresh."""
    k = ctx.compile(cv.portable(DOUBLE), "lut")
    x = np.zeros(4000, np.float32)
    t1 = np.full(1 << 16, 1.0, np.float32)
    t2 = np.full(1 << 16, 2.0, np.float32)
    with cv.resident(t1, device=ctx) as h1, cv.resident(t2, device=ctx) as h2:
        def run(table, rows=x):
            return cv.stream(k, [rows], [np.float32], args=(table,), device=ctx,
                             zero_copy=False, block_bytes=16000).outputs[0]

        assert run(h1)[0] == 1.0
        t1[:] = 5.0  # no refresh(): the device keeps the table it was given
        assert run(h1)[0] == 1.0
        ctx.memory_pool.limit = ctx.memory_pool.stats().in_use_bytes + 64 * 1024
        try:
            assert run(h2, np.zeros(40000, np.float32))[0] == 2.0  # evicts h1
        finally:
            ctx.memory_pool.limit = None
        assert run(h1)[0] == 1.0


@pytest.mark.parametrize("what", ["kernel", "resident"])
def test_an_object_of_another_context_of_the_same_device_is_refused_saying_so(ctx, what):
    """A kernel compiled, or a table made resident, on a context since closed, given to a
    stream on the device's default context: refused (right), with a message that names one
    device twice ("was built for opencl:0:0, the stream runs on opencl:0:0"; "lives on
    opencl:0:0, the stream runs on opencl:0:0") and not that they are two contexts."""
    dev = cv.device(ctx.spec)
    assert dev is not ctx
    if what == "kernel":
        k, args = ctx.compile(cv.portable(DOUBLE), "dbl"), ()
    else:
        k = dev.compile(cv.portable(DOUBLE), "lut")
        args = (cv.resident(np.ones(4, np.float32), device=ctx),)
    ctx.close()
    with pytest.raises(InputError) as info:
        cv.stream(k, [X], [np.float32], args=args, device=dev)
    message = str(info.value)
    assert f"{ctx.spec}, the stream runs on {ctx.spec}" not in message
    assert "context" in message
