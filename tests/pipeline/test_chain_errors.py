"""Chains (issue 19): every bad chain is an InputError naming the link and buffer, before any
work; a link that fails mid-stream surfaces as is, with every buffer (temps included) back
in its pool, no staging thread left, and the device still right."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from streamkit import add_reference, data, in_use, kernel, stage_threads, store, to_host
from test_chain import k

import conveyor as cv


class Boom(RuntimeError):
    """The injected fault."""


def _no_work(device, *arrays):
    """Nothing ran: the outputs are untouched and every pool is at zero."""
    for array in arrays:
        assert not array.any()
    assert in_use(device) == (0, 0)


def _add_scale(device, temps=(np.float32,), reads2="t0", writes1="t0", writes2="out0",
               args2=(2.0,)):
    return cv.chain(cv.link(kernel(device, "add"), ("in0", "in1"), writes1),
                    cv.link(kernel(device, "scale"), reads2, writes2, args=args2),
                    temps=list(temps))


def _arrays(n=4000):
    return data((n,), np.float32, 1), data((n,), np.float32, 2), np.zeros(n, np.float32)


BAD = {
    "temp-dtype": (dict(temps=(np.float64,)),
                   r"link 0 \('add_float32'\) writes 't0'.*double.*float32|"
                   r"link 0 \('add_float32'\) writes 't0'.*float"),
    "unknown-name": (dict(reads2="t9"), r"link 1 \('scale_float32'\) reads 't9', which is no "
                                        r"buffer.*in0, in1, out0, t0"),
    "read-before-write": (dict(temps=(np.float32, np.float32), reads2="t1"),
                          r"link 1 \('scale_float32'\) reads 't1', which no earlier link "
                          r"writes"),
    "output-never-written": (dict(writes2="t0", reads2="t0"), r"out0 is written by no link"),
    "writes-an-input": (dict(writes1="in1"), r"link 0 \('add_float32'\) writes input 'in1'"),
    "reduce-without-reduce": (dict(writes2="reduce"), r"'reduce' is the values that reduce="),
    "too-many-args": (dict(args2=(2.0, 3)), r"link 1 \('scale_float32'\): kernel "
                                            r"'scale_float32' takes 5 parameters; the link "
                                            r"passes 6"),
    "bad-scalar": (dict(args2=("x",)), r"link 1 \('scale_float32'\): args\[0\]"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_chains_are_refused_before_any_work(device, case):
    changes, message = BAD[case]
    a, b, c = _arrays()
    with pytest.raises(cv.InputError, match=message):
        cv.stream(_add_scale(device, **changes), [a, b], [c], device=device)
    _no_work(device, c)


def test_more_bad_chains(device):
    a, b, c = _arrays()
    add, scale = kernel(device, "add"), kernel(device, "scale")
    cases = [
        (cv.chain(add, cv.link(scale, "t0", "out0"), temps=[np.float32]), "mixes cv.link"),
        (cv.chain(cv.link(add, ("in0", "in1"), ("t0", "t0")), temps=[np.float32]),
         "names one buffer twice"),
        (cv.chain(cv.link(add, ("in0", "in1"), "out0"), temps={"in0": np.float32}),
         "has the name of a stream buffer"),
        (cv.chain(cv.link(42, "in0", "out0")), "a link is a Kernel .* or a callable, got int"),
        (cv.chain(cv.link(lambda x, y, queue, offset, n: None, "in0", ("out0", "reduce"))),
         "is a callable and names 'reduce'"),
    ]
    for chain, message in cases:
        with pytest.raises(cv.InputError, match=message):
            cv.stream(chain, [a, b], [c], device=device, **(
                {"reduce": "sum"} if "reduce" in message else {}))
    with pytest.raises(cv.InputError, match="takes no args= of cv.stream"):
        cv.stream(cv.chain(cv.link(add, ("in0", "in1"), "out0")), [a, b], [c],
                  device=device, args=(1,))
    for temps, message in [(["float32x"], "is no dtype"), ([((-1,), np.float32)], "row shape"),
                           ([np.dtype((np.float32, 3))], r"\(row_shape, dtype\)"),
                           ("t0", "temps takes a list"), ([None], "not a numeric dtype")]:
        with pytest.raises(cv.InputError, match=message):
            cv.chain(add, temps=temps)
    with pytest.raises(cv.InputError, match="at least one link"):
        cv.chain()
    for reads in ([0], None, 5):  # None and 5 were a TypeError before
        with pytest.raises(cv.InputError, match="name buffers with strings"):
            cv.link(add, reads=reads)
    with pytest.raises(cv.InputError, match="a link's name is a str"):
        cv.link(add, reads="in0", writes="out0", name=5)
    _no_work(device, c)


def test_bad_reductions_ending_a_chain(device):
    x = data((4000,), np.int32, 3)
    triple, plus_one = k(device, "triple"), k(device, "plus_one")
    cases = [
        (cv.chain(cv.link(triple, "in0", "t0"), cv.link(plus_one, "t0", "t1"),
                  temps=[np.int32, np.int32]), "sum", "does not write 'reduce'"),
        (cv.chain(cv.link(triple, "in0", "reduce"), cv.link(plus_one, "in0", "t0"),
                  temps=[np.int32]), "sum", r"link 0 \('triple'\) writes 'reduce', but only "
                                            r"the last link"),
        (cv.chain(triple, plus_one, temps=[np.int32]), "mean", "reduce='mean' with a kernel"),
    ]
    for chain, op, message in cases:
        with pytest.raises(cv.InputError, match=message):
            cv.stream(chain, [x], device=device, reduce=op)
    assert in_use(device) == (0, 0)


def test_a_write_through_a_const_parameter_is_refused(device):
    a, b, c = _arrays()
    chain = cv.chain(cv.link(kernel(device, "add"), ("in0",), ("in1", "out0")))
    with pytest.raises(cv.InputError, match="writes input 'in1'"):
        cv.stream(chain, [a, b], [c], device=device)
    chain = cv.chain(cv.link(kernel(device, "add"), ("in0",), ("t0", "out0")),
                     temps=[np.float32])
    with pytest.raises(cv.InputError, match=r"link 0 \('add_float32'\) writes 't0' through "
                                            r"parameter 'b'.*const"):
        cv.stream(chain, [a], [c], device=device)
    _no_work(device, c)


def test_a_temp_that_does_not_fit_names_the_temp_and_its_links(device):
    a, b, c = _arrays(100_000)
    chain = _add_scale(device, temps=(((300_000,), np.float32),))
    with pytest.raises(cv.InputError, match=r"temp 't0' \(1200000 bytes per row, used by link 0 "
                                            r"\('add_float32'\), link 1 \('scale_float32'\)\)"):
        cv.stream(chain, [a, b], [c], device=device, memory_limit=2**20)
    _no_work(device, c)


def test_a_callable_returning_the_wrong_shape_is_refused_before_any_work(device):
    a, b, c = _arrays()
    launches = []
    real_create = device.create_queue

    def create_queue():
        queue = real_create()
        real_launch = queue.launch
        queue.launch = lambda *args, **kw: launches.append(1) or real_launch(*args, **kw)
        return queue

    def short(t, u, queue, offset, n):
        return t[:-1] if hasattr(t, "get") else None

    if device.backend != "opencl":
        pytest.skip("returns a PyOpenCL array")
    chain = cv.chain(cv.link(kernel(device, "add"), ("in0", "in1"), "t0"),
                     cv.link(short, "t0", "t1"),
                     cv.link(kernel(device, "scale"), "t1", "out0", args=(1.0,)),
                     temps=[np.float32, np.float32])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(device, "create_queue", create_queue)
        with pytest.raises(cv.InputError, match=r"link 1 \('short'\) returned float32 of shape "
                                                r"\(63,\) for 't1'.*shape \(64,\)"):
            cv.stream(chain, [a, b], [c], device=device, block_bytes=4000)
    assert launches == []  # the warm-up runs no kernel, and no block ran
    _no_work(device, c)


# -- a link that fails mid-stream -------------------------------------------------------------
@pytest.mark.parametrize("zero_copy", [False, None])
@pytest.mark.parametrize("where", ["kernel", "callable"])
def test_a_failing_link_gives_every_buffer_back(device, monkeypatch, where, zero_copy):
    a, b, c = _arrays(20_000)
    boom = Boom(f"{where} link failed at block 3")
    calls = {"kernel": 0, "callable": 0}
    real_create = device.create_queue
    scale = kernel(device, "scale")

    def create_queue():
        queue = real_create()
        real_launch = queue.launch

        def launch(kernel_, *args, **kw):
            if kernel_ is scale and where == "kernel":
                calls["kernel"] += 1
                if calls["kernel"] == 4:
                    raise boom
            return real_launch(kernel_, *args, **kw)

        queue.launch = launch
        return queue

    def negate(t, u, queue, offset, n):
        calls["callable"] += 1
        if where == "callable" and calls["callable"] == 5:  # the warm-up call, then blocks 0..3
            raise boom
        store(u, -to_host(t, queue), queue)

    monkeypatch.setattr(device, "create_queue", create_queue)
    pool = device.memory_pool
    acquired, released = [], []
    real_acquire, real_release = pool.acquire, pool.release
    monkeypatch.setattr(pool, "acquire", lambda n, *x, **kw: acquired.append(n)
                        or real_acquire(n, *x, **kw))
    monkeypatch.setattr(pool, "release", lambda blk, *x, **kw: released.append(1)
                        or real_release(blk, *x, **kw))
    chain = cv.chain(cv.link(kernel(device, "add"), ("in0", "in1"), "t0"),
                     cv.link(negate, "t0", "t1"),
                     cv.link(scale, "t1", "out0", args=(2.0,)),
                     temps=[np.float32, np.float32])
    with pytest.raises(Boom) as caught:
        cv.stream(chain, [a, b], [c], device=device, block_bytes=4000, depth=3,
                  zero_copy=zero_copy)
    assert caught.value is boom
    monkeypatch.undo()
    # 3 slots of 2 temps, and of 2 inputs and 1 output where they are copied
    assert acquired.count(1000 * 4) >= 3 * (2 if zero_copy is None else 5)
    assert len(acquired) == len(released)
    gc.collect()
    assert in_use(device) == (0, 0)
    for stats in (device.memory_pool.stats(), device.pinned_pool.stats()):
        assert stats.pending_bytes == 0 and stats.blocks_in_use == 0, stats
    assert stage_threads() == []
    c[:] = 0
    cv.stream(_add_scale(device), [a, b], [c], device=device, block_bytes=4000)
    np.testing.assert_array_equal(c, add_reference(a, b) * np.float32(2))
