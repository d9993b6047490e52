"""Exactly once: a stream that fails part-way (a staging copy, a kernel launch or a Python
callable raising at a random block) and is then retried by the caller with the fault gone gives
outputs equal to NumPy's exactly, over random block sizes, depths 1-4, halos 0-3, dtypes,
pinned or pageable arrays and zero_copy False/auto. After the failed try every pool is at zero
in use, and what the failed try wrote is either untouched or already the right value (never
garbage). Faults are injected by wrapping the real stager copy, the real queue's launch, and by
a real callable; every example injects exactly one fault (asserted).

500 examples in all (derandomized, so CI is reproducible); ``-s`` prints the counts.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parents[1] / "pipeline"))
from streamkit import (  # noqa: E402
    DTYPES,
    add_reference,
    data,
    in_use,
    kernel,
    stage_threads,
    stencil_reference,
    store,
    to_host,
)

import conveyor as cv  # noqa: E402
from conveyor.pipeline import stream as stream_module  # noqa: E402

SENTINEL = 0x5A  # every byte of an output before the first try


def _settings(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


#: Examples run and faults injected, by kind, in this process (printed at module teardown).
COUNTS: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    print(f"\nexactly-once: {dict(COUNTS)}")


class Boom(RuntimeError):
    """The injected fault."""


@st.composite
def cases(draw: st.DrawFn, *, staged: bool = False) -> dict:
    """A stream: op (add: 2 inputs, halo 0; sten: 1 input, halo 0-3), dtype, shape, block
    rows, depth, which arrays are pinned, zero_copy, and the block (1-based) to fail at."""
    op = draw(st.sampled_from(["add", "sten"]))
    halo = draw(st.integers(0, 3)) if op == "sten" else 0
    dtype = draw(st.sampled_from(DTYPES))
    rows = draw(st.integers(1, 120))
    row_shape = draw(st.sampled_from([(), (3,)]))
    block_rows = draw(st.integers(max(halo, 1), max(rows, halo, 1) + 2))
    arrays = 3 if op == "add" else 2
    pinned = draw(st.lists(st.booleans(), min_size=arrays, max_size=arrays))
    zero_copy = draw(st.sampled_from([False, None]))
    if staged:  # the staging fault needs a staging copy: one pageable array, no zero-copy
        zero_copy = False
        pinned[draw(st.integers(0, arrays - 1))] = False
    blocks = -(-rows // min(block_rows, rows))
    return {
        "op": op, "halo": halo, "dtype": dtype, "shape": (rows, *row_shape),
        "block_rows": block_rows, "depth": draw(st.integers(1, 4)), "pinned": pinned,
        "zero_copy": zero_copy, "fail_at": draw(st.integers(1, blocks)),
        "seed": draw(st.integers(0, 2**32 - 1)),
    }  # fmt: skip


class Arrays:
    """A case's inputs and output (pinned or pageable), and the output NumPy computes."""

    def __init__(self, device: cv.Device, case: dict) -> None:
        dtype, shape, seed = case["dtype"], case["shape"], case["seed"]
        host = [data(shape, dtype, seed + i) for i in range(2 if case["op"] == "add" else 1)]
        self.expected = (add_reference(*host) if case["op"] == "add"
                         else stencil_reference(host[0], case["halo"]))
        wanted = [*host, np.empty(shape, dtype)]
        self.arrays = [cv.pinned.asarray(a, device=device) if pin else a
                       for a, pin in zip(wanted, case["pinned"], strict=True)]
        self.inputs, self.output = self.arrays[:-1], self.arrays[-1]
        self.output.view(np.uint8).reshape(-1)[:] = SENTINEL
        self.untouched = self.output.copy()

    def written_is_right_or_untouched(self) -> bool:
        """Every element of the output is the sentinel or the right value (bit for bit)."""
        bits = np.dtype(f"u{self.output.dtype.itemsize}")
        out, ok, old = (a.view(bits) for a in (self.output, self.expected, self.untouched))
        return bool(np.all((out == ok) | (out == old)))


def _stream(device: cv.Device, case: dict, arrays: Arrays, compute=None) -> cv.Report:
    dtype, halo = case["dtype"], case["halo"]
    row_bytes = int(np.prod(case["shape"][1:], dtype=np.int64)) * dtype.itemsize
    extra: dict = {}
    if case["op"] == "sten":
        extra = {"args": (int(np.prod(case["shape"][1:], dtype=np.int64)), halo),
                 "halo": halo}
    if compute is not None:
        extra.pop("args", None)
    return cv.stream(compute or kernel(device, case["op"], dtype), arrays.inputs,
                     [arrays.output], device=device, depth=case["depth"],
                     block_bytes=case["block_rows"] * row_bytes, zero_copy=case["zero_copy"],
                     **extra)


def _fail_then_retry(device: cv.Device, case: dict, kind: str, faulty, compute=None) -> None:
    """Run the case with the fault (``faulty``: a context manager), check the failure left
    nothing behind, then retry without it and compare with NumPy exactly."""
    kernel(device, case["op"], case["dtype"])  # compiled before any fault is armed
    gc.collect()  # earlier examples' pinned arrays go back to the pool now, not mid-check
    arrays = Arrays(device, case)
    held = in_use(device)  # the caller's own pinned arrays, nothing of the stream's
    with pytest.raises(Boom), faulty:
        _stream(device, case, arrays, compute and compute(fail=True))
    COUNTS[f"{kind} faults"] += 1
    assert in_use(device) == held
    assert stage_threads() == []
    assert arrays.written_is_right_or_untouched()
    report = _stream(device, case, arrays, compute and compute(fail=False))
    assert report.block_rows == min(case["block_rows"], case["shape"][0])
    np.testing.assert_array_equal(arrays.output, arrays.expected, strict=True)
    COUNTS["retries equal to NumPy"] += 1


# -- a staging copy fails ----------------------------------------------------------------------
@contextlib.contextmanager
def staging_fault(fail_at: int):
    """The engine's stager copy raises at its ``fail_at``-th copy (stage-in or stage-out)."""
    real_engine = stream_module.Engine

    class FaultyEngine(real_engine):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            real, count = self.stager.copy, [0]

            def copy(dst, src):
                count[0] += 1
                if count[0] == fail_at:
                    raise Boom(f"staging copy {fail_at} failed")
                real(dst, src)

            self.stager.copy = copy

    stream_module.Engine = FaultyEngine
    try:
        yield
    finally:
        stream_module.Engine = real_engine


@_settings(80)
@given(case=cases(staged=True))
def test_retry_after_a_staging_fault_equals_numpy(device, case):
    _fail_then_retry(device, case, "staging", staging_fault(case["fail_at"]))


# -- a kernel launch fails ---------------------------------------------------------------------
@contextlib.contextmanager
def launch_fault(device: cv.Device, fail_at: int):
    """Every queue the stream creates raises at its ``fail_at``-th kernel launch... counted
    across queues, so exactly one launch of the stream fails."""
    real_create, count = device.create_queue, [0]

    def create_queue():
        queue = real_create()
        real_launch = queue.launch

        def launch(*args, **kw):
            count[0] += 1
            if count[0] == fail_at:
                raise Boom(f"launch {fail_at} failed")
            return real_launch(*args, **kw)

        queue.launch = launch
        return queue

    device.create_queue = create_queue  # type: ignore[method-assign]
    try:
        yield
    finally:
        del device.create_queue


@_settings(60)
@given(case=cases())
def test_retry_after_a_kernel_launch_fault_equals_numpy(device, case):
    _fail_then_retry(device, case, "launch", launch_fault(device, case["fail_at"]))


# -- a Python callable raises --------------------------------------------------------------------
def callable_for(case: dict):
    """A callable computing what the case's kernel computes; ``fail=True`` makes it raise at
    block ``fail_at``."""
    halo, row_items = case["halo"], int(np.prod(case["shape"][1:], dtype=np.int64))

    def make(fail: bool):
        calls = [0]

        def add(a, b, c, *, queue, offset, n):
            calls[0] += 1
            if fail and calls[0] == case["fail_at"]:
                raise Boom(f"callable failed at block {calls[0]}")
            x, y = to_host(a, queue), to_host(b, queue)
            index = ((offset + np.arange(n, dtype=np.int64)) % 7).astype(x.dtype)
            store(c, (x + y + index.reshape(x.shape)).reshape(c.shape), queue)

        def sten(x, y, *, queue, offset, n):
            calls[0] += 1
            if fail and calls[0] == case["fail_at"]:
                raise Boom(f"callable failed at block {calls[0]}")
            host = to_host(x, queue).reshape(-1, row_items)
            rows = host.shape[0] - 2 * halo
            out = host[0:rows].copy()
            for k in range(1, 2 * halo + 1):
                out = out + host[k : k + rows]
            store(y, out.reshape(y.shape), queue)

        return add if case["op"] == "add" else sten

    return make


@_settings(60)
@given(case=cases())
def test_retry_after_a_callable_fault_equals_numpy(device, case):
    _fail_then_retry(device, case, "callable", contextlib.nullcontext(), callable_for(case))
