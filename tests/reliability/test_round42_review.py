"""Round forty-two: a review of round forty-one's fixes (5f906b8, abf1dc3).

Tried (scripts under /tmp/r42rv, not kept): every pair of 13 kinds of a callable's "sum"
partials (float32, float64, float16, Python float and int, int16, int64, bool, 0-d and 1-d
arrays of float32/float16/float64/int16), alternating over four blocks, against np.sum of
the same partials, at this tree and at 7186e09; tuple and list partials of the same; empty
inputs with a cv.rows ratio of (1, 10**6) under a 1 MiB memory_limit on one device, two
devices (both schedules), with warmup, halo and a file output (all ran, 0 blocks); writable
cv.resident tables shared by a stream, its callable's nested stream and its cv.iterate
generator's stream on the staging thread.

Found (each a strict xfail asserting the right behaviour):

- A callable's "sum" partials of float32 and float16 mixed (scalars, 0-d or 1-d arrays,
  or tuple elements) now total float64; np.sum of those partials, and conveyor before
  abf1dc3, give float32. ``fold._singles`` asks for every partial to be float32, so one
  float16 partial turns it off, and ``reduce.widened`` has made every float32 partial
  float64 by then.
- Two sibling streams inside one outer stream that holds a writable table (the outer
  stream's cv.iterate generator streaming on the staging thread, and its callable
  streaming on the engine's thread) share a SECOND writable table that neither the outer
  stream nor either of them holds yet: the second one to claim it takes it as "nested",
  does not copy it back, and its counts never reach the host array (no error).
"""

from __future__ import annotations

import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (
    HIST,
    assert_clean,
    first_device_only,  # noqa: F401 (autouse: first device only)
    opencl_c_kernels,  # noqa: F401 (autouse: OpenCL C kernels)
)
from reliakit import (  # noqa: E402
    opencl_c_only as _opencl_callable,
)

import conveyor as cv  # noqa: E402
from conveyor import interrupts  # noqa: E402
from conveyor.hazards import HazardWarning  # noqa: E402
from conveyor.pipeline import resident  # noqa: E402

# -- 1. float32 and float16 partials of a callable's sum ---------------------------------------
_MIXED = {
    "scalars": lambda i: np.float32(i + 0.5) if i % 2 == 0 else np.float16(i + 0.5),
    "0-d arrays": lambda i: np.array(i + 0.5, np.float32 if i % 2 == 0 else np.float16),
    "1-d arrays": lambda i: np.array([i + 0.5], np.float32 if i % 2 == 0 else np.float16),
    "float16 first": lambda i: np.float16(i + 0.5) if i % 2 == 0 else np.float32(i + 0.5),
}


@pytest.mark.parametrize("kind", sorted(_MIXED))
def test_a_sum_of_float32_and_float16_partials_is_float32_as_np_sum_gives(device, kind):
    _opencl_callable(device)
    partials = [_MIXED[kind](i) for i in range(4)]

    def step(x_dev, queue, offset, n):
        return partials[offset]

    got = cv.stream(step, [np.zeros(4, np.float32)], device=device, reduce="sum",
                    block_bytes=4).result
    want = np.sum(np.stack([np.asarray(p) for p in partials]), axis=0)
    assert want.dtype == np.float32
    assert np.asarray(got).dtype == np.float32, (got, want)
    assert np.array_equal(got, want)
    assert_clean(device)


def test_a_tuple_element_of_float32_and_float16_partials_is_float32(device):
    _opencl_callable(device)

    def step(x_dev, queue, offset, n):
        return (np.float32(1) if offset % 2 else np.float16(1), np.float32(2))

    got = cv.stream(step, [np.zeros(6, np.float32)], device=device, reduce="sum",
                    block_bytes=4).result
    assert [type(g) for g in got] == [np.float32, np.float32], got
    assert_clean(device)


def test_float32_partials_with_python_numbers_total_as_np_sum_does(device):
    # guard (fixed by abf1dc3): float32 with Python floats/ints was float32, np.sum float64;
    # float32 alone stays float32.
    _opencl_callable(device)
    for partials, want in (([np.float32(0.5), 1.5, np.float32(2.5), 3.5], np.float64),
                           ([np.float32(0.5), 1, np.float32(2.5), 3], np.float64),
                           ([np.float32(0.5)] * 4, np.float32)):
        def step(x_dev, queue, offset, n, partials=partials):
            return partials[offset]

        got = cv.stream(step, [np.zeros(4, np.float32)], device=device, reduce="sum",
                        block_bytes=4).result
        assert type(got) is want and got == np.sum(np.array(partials)), (partials, got)
    assert_clean(device)


# -- 2. sibling streams inside one outer stream, and a table neither outer stream holds -------
@pytest.fixture
def claim_waits(monkeypatch):
    """An event set whenever a stream waits for a writable table (``resident.claim``'s wait),
    then the real wait."""
    waited = threading.Event()
    real = interrupts.wait

    def wait(cond, *args, **kwargs):
        if cond is resident._claims:
            waited.set()
        return real(cond, *args, **kwargs)

    monkeypatch.setattr(interrupts, "wait", wait)
    return waited


@pytest.mark.filterwarnings("ignore::conveyor.hazards.HazardWarning")
def test_sibling_streams_inside_one_stream_do_not_share_a_table_it_does_not_hold(
        device, claim_waits):
    # The outer stream O holds table T (so its context names it). Its cv.iterate generator,
    # on O's staging thread, streams G with table T2; while G runs, O's callable (on O's
    # thread) streams N with T2. O never held T2: G and N are two streams of their own on two
    # threads, and N must wait for G (or the other way round), each copying T2 back.
    # Here G claims T2 first; its callable waits until N has either claimed T2 too (today)
    # or waits for it (claim_waits: the right behaviour), and N's callable waits until G has
    # ended (N's later blocks write after G copied T2 back), so no order is left to timing.
    k = device.compile(HIST, "hist")
    rows = 3000
    g_claimed, g_done = threading.Event(), threading.Event()
    n_claimed = claim_waits  # set by N's callable (shared) or by N's wait in claim
    t_counts = np.zeros(16, np.uint32)
    t2_counts = np.zeros(16, np.uint32)
    errors: list[BaseException] = []
    with cv.resident(t_counts, writable=True) as t, \
            cv.resident(t2_counts, writable=True) as t2:
        def g_step(x_dev, queue, offset, n):
            if offset == 0:
                g_claimed.set()
                if not n_claimed.wait(60):
                    errors.append(AssertionError("N neither claimed T2 nor waited for it"))
            return np.array([n])

        def n_step(x_dev, queue, offset, n):
            n_claimed.set()
            if offset == 0 and not g_done.wait(60):  # N ends after G (at once where N waited for G)
                errors.append(AssertionError("G never ended"))
            return np.array([n])

        g = cv.chain(cv.link(k, reads="in0", args=(t2,)), cv.link(g_step, reads="in0"))
        nested = cv.chain(cv.link(k, reads="in0", args=(t2,)), cv.link(n_step, reads="in0"))

        def chunks():
            yield np.zeros(1000, np.uint32)  # pulled on O's thread, before O starts
            cv.stream(g, [np.full(100, 5, np.uint32)], device=device, reduce="sum",
                      warmup=False)  # on the staging thread, inside O
            g_done.set()
            yield np.zeros(1000, np.uint32)
            yield np.zeros(1000, np.uint32)

        def outer_step(x_dev, queue, offset, n):
            if offset == 0:
                if not g_claimed.wait(60):
                    errors.append(AssertionError("G never started"))
                    return np.array([n])
                cv.stream(nested, [np.full(1000, 7, np.uint32)], device=device,
                          reduce="sum", warmup=False, block_bytes=400)
            return np.array([n])

        outer = cv.chain(cv.link(k, reads="in0", args=(t,)), cv.link(outer_step, reads="in0"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HazardWarning)
            cv.stream(outer, [cv.iterate(chunks(), length=rows)], device=device,
                      block_bytes=4000, reduce="sum", warmup=False)
    assert not errors, errors
    assert g_done.is_set()
    assert t_counts[0] == rows, t_counts
    assert t2_counts[5] == 100, t2_counts  # G's counts
    assert t2_counts[7] == 1000, t2_counts  # N's counts
    assert_clean(device)
