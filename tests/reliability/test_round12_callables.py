"""Round twelve (helper J): Python callables as the compute, tried as users and attackers would.

A callable gets PyOpenCL arrays of the block's inputs and outputs, then ``args``, then
``queue=``, ``offset=``, ``n=``; it may write its outputs or return device arrays for them, or
with ``reduce=`` return the block's partial. Every result is compared with NumPy.

Bugs (strict xfails, asserting the right behaviour):

- A callable returning its two given outputs swapped, ``(b, a)``, got both outputs equal to
  ``b``: the returned arrays are copied one after another into the outputs, and the copy into
  output 0 overwrote ``a`` before it was copied into output 1. No error. A chain's callable
  link returning its writes swapped: the same.
- A returned array made on a queue of the callable's own (work not yet done) was copied into
  the output without waiting for the array's events: the output held garbage. No error.
- On a device that shares the host's memory, a callable that changes its input array in
  place (``x *= 2; return x``) changed the caller's array (on a GPU it would not).
- ``reduce="sum"`` of tuple partials holding PyOpenCL arrays gave an object array of device
  arrays (a lone device array partial comes back to the host).
- A returned array of another OpenCL context: a ``BackendError`` ``INVALID_CONTEXT`` from
  ``clEnqueueCopyBuffer`` naming neither the output nor what to change.
- A tuple with None for an output the callable wrote (``(x * 2, None)``) was refused with a
  message telling it to return None.
- A callable without ``queue``/``offset``/``n`` keywords: Python's raw ``TypeError``; an
  ``async def`` or a generator function: "something that is not a device array".

Guards: see the "guard:" comments.
"""

from __future__ import annotations

import functools
import sys
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
    kernel,
    next_stream_right,
    zero_copy_where_unified,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import BackendError, InputError  # noqa: E402

cl = pytest.importorskip("pyopencl")
cla = pytest.importorskip("pyopencl.array")

BLOCK = 4000  # bytes: 1000 float32 rows of a 1-D input


@pytest.fixture
def ocl(device, request):
    """The device under test, when it is OpenCL (the callables here use PyOpenCL arrays);
    zero_copy=True cases only where the device shares the host's memory (refused elsewhere)."""
    if device.backend != "opencl":
        pytest.skip("PyOpenCL callables")
    zero_copy_where_unified(device, request)
    return device


def _x(n: int = 10_000) -> np.ndarray:
    return np.arange(n, dtype=np.float32)


# -- 1. signatures ------------------------------------------------------------------------------
class _Doubler:
    def __call__(self, x, y, *, queue, offset, n):
        return x * 2

    def method(self, x, y, **kw):
        return x * 2


def _with_scale(scale, x, y, *, queue, offset, n):
    return x * scale


@pytest.mark.parametrize("make", [
    lambda: (lambda x, y, **kw: x * 2),
    lambda: (lambda *arrays, **kw: arrays[0] * 2),
    lambda: functools.partial(_with_scale, 2),
    lambda: _Doubler(),
    lambda: _Doubler().method,
], ids=["lambda-kwargs", "varargs-kwargs", "partial", "class-call", "bound-method"])
def test_callables_of_every_kind_that_take_the_keywords_are_exact(ocl, make):
    # guard: lambdas, *args, functools.partial, a class's __call__ and a bound method all work
    x = _x()
    y = np.zeros_like(x)
    cv.stream(make(), [x], [y], device=ocl, block_bytes=BLOCK)
    np.testing.assert_array_equal(y, x * 2)
    assert_clean(ocl)


@pytest.mark.parametrize("compute", [
    lambda x, y: x * 2,
    lambda *arrays: arrays[0] * 2,
], ids=["positional-only", "varargs-only"])
def test_a_callable_without_the_keywords_is_an_input_error_saying_so(ocl, compute):
    x = _x()
    y = np.zeros_like(x)
    with pytest.raises(InputError) as caught:
        cv.stream(compute, [x], [y], device=ocl, block_bytes=BLOCK)
    message = str(caught.value)
    assert "queue" in message and "offset" in message and "**" in message
    assert not y.any()
    assert_clean(ocl)


def test_a_type_error_raised_inside_the_callable_reaches_the_caller_as_it_is(ocl):
    # guard: a TypeError of the callable's own code is not taken for a signature problem
    def compute(x, y, *, queue, offset, n):
        if offset >= 3000:
            raise TypeError("my own bug")
        return x * 2

    x = _x()
    with pytest.raises(TypeError, match="my own bug"):
        cv.stream(compute, [x], [np.zeros_like(x)], device=ocl, block_bytes=BLOCK)
    assert_clean(ocl)


async def _coroutine(x, y, **kw):
    return x * 2


def _generator(x, y, **kw):
    yield x * 2


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
@pytest.mark.parametrize("compute", [_coroutine, _generator], ids=["async-def", "generator"])
def test_an_async_or_generator_callable_is_refused_naming_what_it_returned(ocl, compute):
    x = _x()
    y = np.zeros_like(x)
    with pytest.raises(InputError) as caught:
        cv.stream(compute, [x], [y], device=ocl, block_bytes=BLOCK)
    assert ("coroutine" if compute is _coroutine else "generator") in str(caught.value)
    assert not y.any()
    assert_clean(ocl)


# -- 2. what a callable returns -----------------------------------------------------------------
@pytest.mark.parametrize("zero_copy", [None, False])
def test_a_callable_returning_its_outputs_swapped_gives_each_output_its_array(ocl, zero_copy):
    x = _x()
    first, second = np.zeros_like(x), np.zeros_like(x)

    def compute(x, a, b, *, queue, offset, n):
        a[...] = x * 3
        b[...] = x * 2
        return b, a  # output 0 gets x * 2, output 1 gets x * 3

    cv.stream(compute, [x], [first, second], device=ocl, block_bytes=BLOCK,
              zero_copy=zero_copy)
    np.testing.assert_array_equal(first, x * 2)
    np.testing.assert_array_equal(second, x * 3)
    assert_clean(ocl)


def test_returning_the_given_outputs_in_order_or_one_twice_is_exact(ocl):
    # guard: (a, b) as given, and (b, b), copy nothing wrong
    x = _x()
    for order in ("ab", "bb"):
        first, second = np.zeros_like(x), np.zeros_like(x)

        def compute(x, a, b, *, queue, offset, n, order=order):
            a[...] = x * 3
            b[...] = x * 2
            return (a if order == "ab" else b), b

        cv.stream(compute, [x], [first, second], device=ocl, block_bytes=BLOCK)
        np.testing.assert_array_equal(first, x * (3 if order == "ab" else 2))
        np.testing.assert_array_equal(second, x * 2)
    assert_clean(ocl)


def test_returning_an_input_or_a_halo_view_of_it_is_copied_exactly(ocl):
    # guard: the input array itself, and (with a halo) its inner rows, an offset view
    x = data((3000, 3), np.float32, 5)
    y = np.zeros_like(x)
    cv.stream(lambda x, y, **kw: x, [x], [y], device=ocl, block_bytes=3 * 4 * 700)
    np.testing.assert_array_equal(y, x)
    y[:] = 0
    cv.stream(lambda x, y, **kw: x[2:-2], [x], [y], device=ocl, halo=2,
              block_bytes=3 * 4 * 700)
    np.testing.assert_array_equal(y, x)
    assert_clean(ocl)


def test_none_on_some_blocks_and_arrays_on_others_is_exact(ocl):
    # guard: a callable that writes its output on even blocks and returns it on odd ones
    x = _x()
    y = np.zeros_like(x)

    def compute(x, y, *, queue, offset, n):
        if offset // 1000 % 2 == 0:
            y[...] = x * 2
            return None
        return x * 2

    cv.stream(compute, [x], [y], device=ocl, block_bytes=BLOCK, warmup=False)
    np.testing.assert_array_equal(y, x * 2)
    assert_clean(ocl)


def test_a_tuple_with_none_for_a_written_output_works_or_says_none_is_not_taken(ocl):
    x = _x()
    first, second = np.zeros_like(x), np.zeros_like(x)

    def compute(x, a, b, *, queue, offset, n):
        b[...] = x * 3
        return x * 2, None  # output 1: written in place

    try:
        cv.stream(compute, [x], [first, second], device=ocl, block_bytes=BLOCK)
    except InputError as exc:  # refusing is right too, if the message does not say "None"
        assert "return None" not in str(exc) and "None" in str(exc), exc
    else:
        np.testing.assert_array_equal(first, x * 2)
        np.testing.assert_array_equal(second, x * 3)
    assert_clean(ocl)


@pytest.mark.parametrize("bad", ["count", "dtype", "shape", "list-of-two"])
def test_a_wrong_return_is_refused_before_any_output_row_is_written(ocl, bad):
    # guard: wrong count / dtype / shape are InputErrors from the warm-up call
    x = _x()
    y = np.full_like(x, -1)
    returns = {
        "count": lambda x, y, **kw: (x * 2, x * 2),
        "dtype": lambda x, y, **kw: (x * 2).astype(np.float64),
        "shape": lambda x, y, **kw: (x * 2)[1:],
        "list-of-two": lambda x, y, **kw: [x * 2, x * 2],
    }
    with pytest.raises(InputError):
        cv.stream(returns[bad], [x], [y], device=ocl, block_bytes=BLOCK)
    assert (y == -1).all()
    assert_clean(ocl)


def test_a_host_numpy_array_returned_is_an_input_error_saying_to_return_a_device_array(ocl):
    # guard: NumPy instead of a PyOpenCL array is refused (at block 0: nothing written)
    x = _x()
    y = np.full_like(x, -1)
    with pytest.raises(InputError, match="pyopencl.array.Array"):
        cv.stream(lambda x, y, **kw: x.get() * 2, [x], [y], device=ocl, block_bytes=BLOCK)
    assert (y == -1).all()
    assert_clean(ocl)
    next_stream_right(ocl)


def test_an_array_of_another_context_returned_is_an_input_error_naming_the_output(ocl):
    other = cl.Context([ocl.cl_device])
    other_queue = cl.CommandQueue(other)
    x = _x()
    y = np.full_like(x, -1)
    try:
        with pytest.raises(InputError) as caught:
            cv.stream(lambda x, y, **kw: cla.to_device(other_queue, x.get() * 2), [x], [y],
                      device=ocl, block_bytes=BLOCK)
        assert "output 0" in str(caught.value) and "context" in str(caught.value)
    finally:
        other_queue.finish()
    assert_clean(ocl)


def test_an_array_of_another_context_returned_fails_without_leaks(ocl):
    # guard: whatever the error's class, the stream stops cleanly and the next one is right
    other = cl.Context([ocl.cl_device])
    other_queue = cl.CommandQueue(other)
    x = _x()
    with pytest.raises((InputError, BackendError)):
        cv.stream(lambda x, y, **kw: cla.to_device(other_queue, x.get() * 2), [x],
                  [np.zeros_like(x)], device=ocl, block_bytes=BLOCK)
    other_queue.finish()
    assert_clean(ocl)
    next_stream_right(ocl)


# -- 3. work the callable enqueues, waits, sleeps -------------------------------------------------
def test_an_array_returned_from_a_queue_of_the_callables_own_is_waited_for(ocl):
    x = _x(2000)
    y = np.zeros_like(x)
    own: dict = {}
    pending: list = []  # (timer, array): the arrays are kept (a buffer released with a gated
    # write pending blocks PoCL's clReleaseMemObject while the GIL is held)

    def compute(x, y, *, queue, offset, n):
        q = own.setdefault("queue", cl.CommandQueue(queue.context))
        result = cla.empty(q, x.shape, x.dtype)
        gate = cl.UserEvent(queue.context)
        result.add_event(cl.enqueue_copy(q, result.data, x.get() * 2, wait_for=[gate],
                                         is_blocking=False))
        timer = threading.Timer(1.0, gate.set_status, (cl.command_execution_status.COMPLETE,))
        timer.start()
        pending.append((timer, result))
        return result  # its events say when it holds the block

    try:
        cv.stream(compute, [x], [y], device=ocl, block_bytes=BLOCK, warmup=False)
    finally:
        for timer, _ in pending:
            timer.join()
        if "queue" in own:
            own["queue"].finish()
    np.testing.assert_array_equal(y, x * 2)
    assert_clean(ocl)


def test_a_callable_that_finishes_the_queue_or_sleeps_on_one_block_is_exact(ocl):
    # guard: queue.finish() inside the call, and one slow block (a short sleep), change nothing
    x = _x()
    y = np.zeros_like(x)

    def compute(x, y, *, queue, offset, n):
        out = x * 2
        queue.finish()
        if offset == 3000:
            time.sleep(0.2)
        return out

    cv.stream(compute, [x], [y], device=ocl, block_bytes=BLOCK, depth=3)
    np.testing.assert_array_equal(y, x * 2)
    assert_clean(ocl)


def test_a_callable_writing_via_its_own_queue_and_waiting_is_exact(ocl):
    # guard: work on a queue of its own that the callable waits for itself
    x = _x()
    y = np.zeros_like(x)
    own: dict = {}

    def compute(x, y, *, queue, offset, n):
        q = own.setdefault("queue", cl.CommandQueue(queue.context))
        host = x.get() * 2
        cl.enqueue_copy(q, y.data, host, is_blocking=True)

    cv.stream(compute, [x], [y], device=ocl, block_bytes=BLOCK)
    np.testing.assert_array_equal(y, x * 2)
    assert_clean(ocl)


# -- 4. inputs written, zero-copy, kept arrays --------------------------------------------------
def test_a_callable_that_writes_its_input_leaves_the_callers_array_alone(ocl):
    x = _x()
    original = x.copy()
    y = np.zeros_like(x)

    def compute(x, y, *, queue, offset, n):
        x *= 2  # CuPy-style in-place work on the block's input
        return x

    cv.stream(compute, [x], [y], device=ocl, block_bytes=BLOCK)
    np.testing.assert_array_equal(y, original * 2)
    np.testing.assert_array_equal(x, original)  # as on a GPU, where the block is a copy
    assert_clean(ocl)


def test_a_callable_that_writes_its_input_with_copies_forced_is_exact(ocl):
    # guard: zero_copy=False keeps the caller's array; zero_copy=True is the documented in-place
    x = _x()
    original = x.copy()
    y = np.zeros_like(x)

    def compute(x, y, *, queue, offset, n):
        x *= 2
        return x

    cv.stream(compute, [x], [y], device=ocl, block_bytes=BLOCK, zero_copy=False)
    np.testing.assert_array_equal(y, original * 2)
    np.testing.assert_array_equal(x, original)
    assert_clean(ocl)


@pytest.mark.parametrize("zero_copy", [True, None, False])
def test_arrays_kept_past_their_block_read_without_crashing_after_the_stream(ocl, zero_copy):
    # guard: round eleven's fix; every kept input array reads as some block's rows, the
    # output arrays read, nothing crashes, and the pools settle once the arrays are dropped
    x = _x()
    y = np.zeros_like(x)
    kept = []

    def compute(x, y, *, queue, offset, n):
        kept.append((offset, x, y))
        y[...] = x * 2

    cv.stream(compute, [x], [y], device=ocl, block_bytes=BLOCK, zero_copy=zero_copy)
    np.testing.assert_array_equal(y, x * 2)
    for _offset, xa, ya in kept:
        assert xa.get().shape == (1000,) or xa.get().shape == (64,)
        ya.get()
    if zero_copy:  # used in place (asked for): each kept input is the caller's rows
        for offset, xa, _ya in kept[1:]:
            np.testing.assert_array_equal(xa.get(), x[offset:offset + 1000])
    kept.clear()
    assert_clean(ocl)


@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", 0.0])
@pytest.mark.parametrize("zero_copy", [None, False])
def test_a_halo_callable_sees_the_halo_rows_and_the_blocks_offset(ocl, boundary, zero_copy):
    # guard: rows block + 2h in each call, offset and n of the block itself, np.pad's rows
    x = data((3000, 3), np.float32, 3)
    y = np.zeros_like(x)
    seen = []

    def compute(x, y, *, queue, offset, n):
        h = x.get()
        seen.append((offset, n, h.shape[0]))
        y.set(h[2:-2] + h[:-4] + h[4:])

    cv.stream(compute, [x], [y], device=ocl, halo=2, boundary=boundary,
              block_bytes=3 * 4 * 700, zero_copy=zero_copy, warmup=False)
    mode = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}.get(boundary,
                                                                             "constant")
    p = np.pad(x, ((2, 2), (0, 0)), mode=mode)
    np.testing.assert_array_equal(y, p[2:-2] + p[:-4] + p[4:])
    rows = [s[2] - 4 for s in seen]
    assert [s[0] for s in seen] == [3 * sum(rows[:k]) for k in range(len(rows))]
    assert [s[1] for s in seen] == [3 * r for r in rows] and sum(rows) == 3000


# -- 5. two devices -----------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["dynamic", "static"])
def test_a_returning_callable_over_two_devices_gets_each_blocks_offset_and_context(
        pair, schedule):
    # guard: each call's arrays are on the queue's context, offsets are the block's, exact
    if pair[0].backend != "opencl":
        pytest.skip("PyOpenCL callables")
    x = _x(20_000)
    y = np.zeros_like(x)
    same = []

    def compute(x, y, *, queue, offset, n):
        same.append(x.context == queue.context and y.context == queue.context)
        return x * 2 + np.float32(offset)

    cv.stream(compute, [x], [y], device=pair, block_bytes=BLOCK, schedule=schedule)
    np.testing.assert_array_equal(y, x * 2 + (np.arange(20_000) // 1000 * 1000)
                                  .astype(np.float32))
    assert all(same)
    for dev in pair:
        assert_clean(dev)


def test_a_reducing_callable_over_two_devices_with_device_partials(pair):
    # guard: PyOpenCL 0-d partials from both devices fold to NumPy's sum
    if pair[0].backend != "opencl":
        pytest.skip("PyOpenCL callables")
    x = _x(20_000)

    def compute(x, *, queue, offset, n):
        return cla.to_device(queue, np.array(x.get().astype(np.float64).sum()))

    report = cv.stream(compute, [x], device=pair, block_bytes=BLOCK, reduce="sum")
    assert report.result == x.astype(np.float64).sum()
    for dev in pair:
        assert_clean(dev)


# -- 6. reduce= partials ------------------------------------------------------------------------
def _host_sum(x):
    return x.get().astype(np.float64).sum()


@pytest.mark.parametrize("kind", ["numpy-scalar", "python-float", "0-d", "1-element",
                                  "device-0-d", "device-1-element", "python-int", "bool"])
def test_sum_partials_of_every_kind_equal_numpy(ocl, kind):
    # guard: NumPy scalars, Python floats/ints/bools, 0-d arrays, PyOpenCL arrays
    x = _x()
    make = {
        "numpy-scalar": lambda x, q: np.float64(_host_sum(x)),
        "python-float": lambda x, q: float(_host_sum(x)),
        "0-d": lambda x, q: np.array(_host_sum(x)),
        "1-element": lambda x, q: np.array([_host_sum(x)]),
        "device-0-d": lambda x, q: cla.to_device(q, np.array(_host_sum(x))),
        "device-1-element": lambda x, q: cla.to_device(q, np.array([_host_sum(x)])),
        "python-int": lambda x, q: int(_host_sum(x)),
        "bool": lambda x, q: bool(x.get()[0] > 4000),
    }[kind]
    report = cv.stream(lambda x, *, queue, offset, n: make(x, queue), [x], device=ocl,
                       block_bytes=BLOCK, reduce="sum")
    if kind == "bool":
        expected = sum(bool(x[k] > 4000) for k in range(0, 10_000, 1000))
    else:
        expected = x.astype(np.float64).sum()
    assert np.shape(report.result) == ((1,) if "1-element" in kind else ())
    assert float(np.asarray(report.result).reshape(-1)[0]) == expected
    assert_clean(ocl)


@pytest.mark.parametrize("op", ["min", "max"])
def test_min_max_of_device_partials_equal_numpy(ocl, op):
    # guard: PyOpenCL 1-element partials folded by min/max
    x = data((10_000,), np.float32, 9)

    def compute(x, *, queue, offset, n):
        h = x.get()
        return cla.to_device(queue, np.array([h.min() if op == "min" else h.max()]))

    report = cv.stream(compute, [x], device=ocl, block_bytes=BLOCK, reduce=op)
    assert report.result.tolist() == [getattr(x, op)()]
    assert_clean(ocl)


def test_dict_partials_fold_with_a_function_and_are_refused_by_sum(ocl):
    # guard: dicts with reduce=f are the user's fold; reduce="sum" of dicts is an InputError
    x = _x()

    def compute(x, *, queue, offset, n):
        h = x.get()
        return {"sum": float(h.astype(np.float64).sum()), "count": h.size}

    report = cv.stream(compute, [x], device=ocl, block_bytes=BLOCK,
                       reduce=lambda a, b: {k: a[k] + b[k] for k in a})
    assert report.result == {"sum": x.astype(np.float64).sum(), "count": 10_000}
    with pytest.raises(InputError, match="dict"):
        cv.stream(compute, [x], device=ocl, block_bytes=BLOCK, reduce="sum")
    assert_clean(ocl)


def test_tuple_partials_of_device_arrays_sum_to_numbers(ocl):
    x = _x()

    def compute(x, *, queue, offset, n):
        h = x.get()
        return (cla.to_device(queue, np.array(h.astype(np.float64).sum())),
                cla.to_device(queue, np.array(h.size)))

    report = cv.stream(compute, [x], device=ocl, block_bytes=BLOCK, reduce="sum")
    result = np.asarray(report.result)
    assert result.dtype.kind in "fiu", result.dtype
    assert result.tolist() == [x.astype(np.float64).sum(), 10_000]
    assert_clean(ocl)


def test_a_reducing_callable_that_returns_none_on_one_block_is_refused(ocl):
    # guard: None on block 4 only is an InputError naming block 4
    x = _x()

    def compute(x, *, queue, offset, n):
        return None if offset == 4000 else float(_host_sum(x))

    with pytest.raises(InputError, match="block 4"):
        cv.stream(compute, [x], device=ocl, block_bytes=BLOCK, reduce="sum")
    assert_clean(ocl)


def test_a_kernel_stream_is_right_after_the_callable_failures(ocl):
    # guard: after the failures above, kernels still stream exactly
    a = _x()
    c = np.zeros_like(a)
    cv.stream(kernel(ocl, "add"), [a, a], [c], device=ocl, block_bytes=BLOCK)
    np.testing.assert_array_equal(c, add_reference(a, a))
    next_stream_right(ocl)


def test_a_chain_link_returning_its_writes_swapped_gives_each_write_its_array(ocl):
    x = _x()
    first, second = np.zeros_like(x), np.zeros_like(x)

    def compute(x, a, b, *, queue, offset, n):
        a[...] = x * 3
        b[...] = x * 2
        return b, a  # out0 gets x * 2, out1 gets x * 3

    chain = cv.chain(cv.link(compute, reads="in0", writes=("out0", "out1")))
    cv.stream(chain, [x], [first, second], device=ocl, block_bytes=BLOCK)
    np.testing.assert_array_equal(first, x * 2)
    np.testing.assert_array_equal(second, x * 3)
    assert_clean(ocl)
