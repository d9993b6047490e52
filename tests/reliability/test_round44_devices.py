"""Round forty-four (helper B): streams over several devices after session 22's changes (the
host fold's promoted types, writable tables held per outermost stream through a ContextVar,
staging threads run in a copy of the stream's context).

Tried (scripts under /tmp/r44, not kept), on PoCL's two OpenCL CPU devices (one per
platform): kernel reductions (sum / min / max of float32, float64, int32, int64, uint8;
0 to 30,000 rows; ``first_row`` 0 and 3) and callable reductions (float16, float32 mixed with
float16, uint8 mixed with int64, Python ints past 2**64, complex64, int32 histograms, tuples
of float16 / int8 / float / float32, lists, None partials, 3e38 float32 partials; ``"sum"``,
``"min"``, ``"max"`` and a function) over both devices in either order and under both
schedules, against one device: every result and its type equal. A device named twice (as
Devices, as spec and Device, in a comma spec) is refused naming it. Four threads each
streaming maps and sums over both devices at once: exact, threads and descriptors flat, pools
at zero. Callables that stream again on the same device, the other, or over both: right.
Ctrl-C at random points (260 rounds in 7 seeded child runs; 222 raised KeyboardInterrupt, in
the stream or the pause after it) of a ``.npy`` output written by both devices, a ``reduce=f``
fold (fast and slow), a kernel sum, a halo, a two-device callable that streams again on one
device and a one-device callable that streams over two: pools at zero, no thread left, the
output absent or whole, the next stream right. Files over two devices (an ``.npy`` written in
place, a halo from ``cv.npy`` into ``cv.npy_out``, ``cv.raw_out`` with ``first_row=7``): equal
to one device's. A callable returning one reused buffer as its partial over two devices:
copied, right.

Found (each an ``xfail(strict=True)`` test asserting the right behaviour):

- The engines of a stream over several devices run on threads started with a fresh
  context, not the stream's (pipeline/multi.py ``_run_engines_held``), unlike a one-device
  stream's engine (the calling thread) and the staging threads (a copy of the context). A
  stream that a two-device stream's callable starts is then not seen as inside the streams
  around it: with a writable table that an enclosing stream holds it waits for that stream,
  which waits for it, for ever (seen: a ``cv.iterate`` generator of a one-device stream holding
  the table streams over two devices, whose callable streams with the table). A callable's own
  ``contextvars`` differ the same way between one device and two.
- A Kernel built for one device under ``POCL_EXTRA_BUILD_FLAGS`` (a driver variable that
  changes what PoCL builds, in the kernel cache's key since round forty-one) is built again
  for the other device under the variables set *now* (pipeline/multi.py ``kernel_for``
  compares headers and ``PYOPENCL_BUILD_OPTIONS``, not these): with the variable unset since,
  half the rows come from ``-DFACTOR=5`` code and half from ``FACTOR=3``, no error. The same
  kernel object alone on its device gives 5 everywhere.
- A Kernel built for the other device is rebuilt for each device of ``device=[d0, d1]``, but
  refused for ``device=[d0]`` (which the README calls the one-device stream), so code that
  streams over ``devices[:k]`` works for k = 2 and fails for k = 1.
"""

from __future__ import annotations

import contextvars
import secrets
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import assert_clean  # noqa: E402
from streamkit import add_reference, data, kernel  # noqa: E402

import conveyor as cv  # noqa: E402
from conveyor.pipeline import resident  # noqa: E402

BUMP = cv.portable("""
__kernel void bump(__global const float *x, __global int *t, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) atomic_inc(&t[0]);
}""")


def _opencl(pair) -> None:
    for dev in pair:
        if dev.backend != "opencl":
            pytest.skip("OpenCL C kernels")


class _WouldWaitForEver(AssertionError):
    """Raised where a writable table's claim would wait: in the test below, whoever holds the
    table waits (through the generator) for the stream that asks, so any wait is for ever."""


class _NoWaiting(threading.Condition):
    """``resident._claims`` (the real condition, wrapped): a wait raises at once instead of
    blocking, so the deadlock is seen without a hang or a timeout."""

    def wait(self, timeout=None):  # noqa: ANN001, ANN201 - threading's signature
        raise _WouldWaitForEver(
            f"resident.claim waits on {threading.current_thread().name}: the table's holder "
            f"is a stream this one runs inside, not seen through the context")


def test_a_stream_inside_a_two_device_callable_shares_an_enclosing_streams_table(
        pair, monkeypatch):
    """A one-device stream holds a writable table; its ``cv.iterate`` generator (on a staging
    thread, in the stream's context) streams over both devices with a callable that streams
    again with the table: that innermost stream is inside the outer one, as the README says
    of a callable's stream, and shares the table. On one device (``device=pair[0]`` for the
    middle stream) it does. Over two devices it waits for good (seen without the wrapper: a
    child process stuck in ``resident.claim`` on ``conveyor-device-0``)."""
    _opencl(pair)
    d0, d1 = pair
    bump = d0.compile(BUMP, "bump")
    monkeypatch.setattr(resident, "_claims", _NoWaiting())
    table = np.zeros(4, np.int32)
    calls = []
    x = np.ones(1000, np.float32)

    with cv.resident(table, writable=True) as shared:
        def inner(a, *, queue, offset, n):
            calls.append(offset)  # list.append: safe from both engine threads
            cv.stream(bump, [np.ones(10, np.float32)], device=d0, args=(shared,))
            return np.int64(n)

        def chunks():
            yield np.ones(50, np.float32)
            total = cv.stream(inner, [x], device=[d0, d1], reduce="sum", block_bytes=400)
            assert total.result == x.size
            yield np.ones(50, np.float32)

        cv.stream(bump, [cv.iterate(chunks(), length=100)], device=d0, args=(shared,))
    assert table[0] == 100 + 10 * len(calls)
    assert table[1:].tolist() == [0, 0, 0]
    for dev in pair:
        assert_clean(dev)


_tag: contextvars.ContextVar[str] = contextvars.ContextVar("round44_tag", default="unset")


def test_a_callable_sees_the_callers_context_on_two_devices_as_on_one(pair):
    """A callable that reads a ``contextvars.ContextVar`` its caller set (a request id, a
    tracing span, decimal's context): one device runs it on the calling thread and it sees the
    caller's value; two devices run it on engine threads that start with an empty context."""
    x = np.arange(4000, dtype=np.float32)
    seen: dict[str, set[str]] = {}
    current = ["one"]

    def tagged(a, *, queue, offset, n):
        seen.setdefault(current[0], set()).add(_tag.get())
        return np.int64(n)

    token = _tag.set("caller")
    try:
        for current[0], device in (("one", pair[0]), ("two", list(pair))):
            report = cv.stream(tagged, [x], device=device, reduce="sum", block_bytes=400)
            assert report.result == x.size
    finally:
        _tag.reset(token)
    assert seen["one"] == {"caller"}
    assert seen["two"] == {"caller"}, seen


def test_a_kernel_of_the_other_device_runs_on_a_list_of_one_device_as_on_two(pair):
    """``device=list_of_devices`` with a Kernel built for ``pair[1]``: over both devices it is
    built for each from its source (README, Several devices: Kernels); a list of one device
    "is the one-device stream", which refuses the kernel, so ``devices[:k]`` works for k = 2
    and not for k = 1."""
    _opencl(pair)
    d0, d1 = pair
    a, b = data((5001,), np.float32, 1), data((5001,), np.float32, 2)
    of_d1 = kernel(d1, "add")
    c = np.zeros_like(a)
    cv.stream(of_d1, [a, b], [c], device=[d0, d1], block_bytes=4000)
    np.testing.assert_array_equal(c, add_reference(a, b))
    c[:] = 0
    cv.stream(of_d1, [a, b], [c], device=[d0], block_bytes=4000)
    np.testing.assert_array_equal(c, add_reference(a, b))


FACTORED = """
#ifndef FACTOR
#define FACTOR 3.0f
#endif
__kernel void factored(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * FACTOR;
}
"""


def test_a_kernel_built_under_a_driver_variable_since_unset_never_mixes_two_builds(
        pair, monkeypatch):
    """A notebook sets ``POCL_EXTRA_BUILD_FLAGS=-DFACTOR=5.0f``, compiles a kernel for the
    first device, unsets it, and streams the kernel over both devices. Right: every row from
    one build (5 everywhere, the kernel given), or an InputError saying to compile again, as
    for an edited header or a changed ``PYOPENCL_BUILD_OPTIONS`` (round twenty-two). PoCL
    reads the variable once per process, so a change after the process's first build is
    refused before anything is built. A nonce in the source keeps conveyor's and PoCL's
    caches out of it: both builds are real."""
    _opencl(pair)
    d0, d1 = pair
    for dev in pair:
        if "Portable Computing Language" not in dev.info.platform:
            pytest.skip("POCL_EXTRA_BUILD_FLAGS is PoCL's")
    source = cv.portable(f"// round44 {secrets.token_hex(8)}\n{FACTORED}")
    d0.compile(cv.portable(FACTORED), "factored")  # a first build: the variables as they are
    monkeypatch.setenv("POCL_EXTRA_BUILD_FLAGS", "-DFACTOR=5.0f")
    # PoCL reads the variable once per process and keeps it: a kernel built after it was
    # set (and every one after, set or unset) would not match the key. The change is
    # refused before anything is built, so PoCL never reads it here (an earlier version of
    # this test built under it, and later tests' kernels of the same process came out x5).
    with pytest.raises(cv.InputError, match="POCL_EXTRA_BUILD_FLAGS.*rest of the process"):
        d0.compile(source, "factored")
    monkeypatch.delenv("POCL_EXTRA_BUILD_FLAGS")
    built = d0.compile(source, "factored")
    x = np.ones(100_000, np.float32)
    y = np.zeros_like(x)
    cv.stream(built, [x], [y], device=[d0, d1], block_bytes=40_000, schedule="static")
    assert np.unique(y).tolist() == [3.0], np.unique(y, return_counts=True)
