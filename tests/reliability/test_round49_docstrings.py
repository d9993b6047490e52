"""Round forty-nine: the docstrings and ``--help`` texts taken at their word, again (round
twenty-eight's reading, twenty rounds of fixes later).

Read as a user reads them and tried on PoCL against NumPy (probe scripts kept in /tmp, not
here): ``conveyor.__all__`` (``cv.stream``'s long docstring, ``cv.chain``/``cv.link`` and the
chain module's list of refusals, ``cv.rows``/``cv.per_block``, ``cv.keep_pinned``,
``cv.release_pinned``, ``cv.configure``, the file sources and sinks, ``cv.resident``),
``conveyor.dask.__all__`` (map_blocks and reduce against ``cv.stream``, every boundary), the
methods of Device, Report and the pools, ``cv.pinned``, and every ``conveyor ... --help``.
Nearly all held. What did not is a strict xfail below asserting the right behaviour:

- ``Device.alloc_svm(0)`` hands back a buffer and ``alloc_svm(-1)`` raises pybind's
  TypeError, where ``alloc_device``/``alloc_pinned`` (round twenty-eight) and the pools say
  "ask for at least 1".
- ``Device.register_host`` of a non-contiguous array raises PyOpenCL's bare ValueError, of an
  empty one a BackendError ``INVALID_BUFFER_SIZE``; ``cv.pinned.register`` (the same call one
  level up) says what to change in an InputError.
- ``device.pinned_pool.acquire(1.0)`` is refused as "alloc_pinned: nbytes=4096.0 is not a
  whole number of bytes" (a size the caller never gave, from a call it never made), while
  ``device.memory_pool.acquire(1.0)`` hands a block; ``acquire("64")`` is a raw TypeError.
- ``BlockPool.prepare`` says it stops "at the first failed allocation (no error ...)"; a size
  past the device's largest allocation raises InputError.
- ``Report.devices``' doc comment says a device's ``block_ranges`` "do not apply"; they do
  (``Report.ranges`` is set for each device, and they are right).

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import conveyor as cv
from conveyor.errors import InputError
from conveyor.memory import keep

SPEC = "opencl:0:0"

COPY = """__kernel void copy(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i];
}"""


@pytest.fixture(scope="module")
def dev() -> cv.Device:
    return cv.device(SPEC, warm_up=False)


# -- Device's allocations ---------------------------------------------------------------------


@pytest.mark.parametrize("nbytes", [0, -1])
def test_alloc_svm_of_no_bytes_is_an_input_error(dev: cv.Device, nbytes: int) -> None:
    """``alloc_device(0)``, ``alloc_pinned(0)`` and ``pool.acquire(0)`` say 'ask for at least
    1' (round twenty-eight); ``alloc_svm``, of the same family, should too."""
    if not dev.svm:
        pytest.skip("no fine-grained SVM on this device")
    with pytest.raises(InputError, match="at least 1"):
        dev.alloc_svm(nbytes)


@pytest.mark.parametrize("kind", ["strided", "empty"])
def test_register_host_refuses_what_it_cannot_pin_with_an_input_error(dev: cv.Device,
                                                                      kind: str) -> None:
    """``cv.pinned.register`` refuses both with an InputError that says what to pass;
    ``Device.register_host`` ('Pin array's memory in place') should not leak the driver's
    words for the same mistakes."""
    array = np.ones((8, 8))[:, ::2] if kind == "strided" else np.ones(0)
    with pytest.raises(InputError):
        with cv.pinned.register(array, device=dev):
            pass  # pragma: no cover
    with pytest.raises(InputError):
        dev.register_host(array).close()


# -- the pools --------------------------------------------------------------------------------


def _acquire(pool, nbytes) -> BaseException | None:
    """What ``pool.acquire(nbytes)`` does: None (a block, given back at once) or the error."""
    try:
        block = pool.acquire(nbytes)
    except Exception as exc:  # noqa: BLE001 - the error is the answer
        return exc
    pool.release(block)
    return None


@pytest.mark.parametrize("nbytes", [1.0, 0.5, "64"])
def test_pools_take_or_refuse_a_size_alike_naming_what_was_given(dev: cv.Device,
                                                                 nbytes: object) -> None:
    """Both pools' ``acquire`` share one docstring ('A block of at least nbytes'): they should
    agree on a size, and a refusal should be an InputError naming the value the caller gave
    (not one the pool rounded it to)."""
    got = [_acquire(pool, nbytes) for pool in (dev.memory_pool, dev.pinned_pool)]
    assert (got[0] is None) == (got[1] is None), got
    for exc in got:
        if exc is not None:
            assert isinstance(exc, InputError), repr(exc)
            assert repr(nbytes) in str(exc), str(exc)


@pytest.mark.parametrize("pool", ["memory_pool", "pinned_pool"])
def test_prepare_stops_at_an_allocation_that_cannot_be_made(dev: cv.Device, pool: str) -> None:
    """``prepare``: 'It also stops ... at the first failed allocation (no error: the stream
    will meet it and say so)'. A block past the device's largest allocation raised an
    InputError the docstring did not name: it names it now (a size no allocation can have),
    and a failed allocation of a size that can be still stops with no error."""
    with pytest.raises(cv.InputError, match="largest allocation"):
        getattr(dev, pool).prepare(dev.max_alloc_bytes + 1, 2)
    assert "InputError" in type(getattr(dev, pool)).prepare.__doc__
    with pytest.raises(cv.InputError, match="prepare"):
        getattr(dev, pool).prepare(0, 2)


# -- Report -------------------------------------------------------------------------------------


def test_device_reports_block_ranges_apply_as_documented() -> None:
    """A stream over two devices: each device's report's ``block_ranges`` are exactly the rows
    its blocks covered (``Report.ranges``), so the comment on ``Report.devices`` ('its blocks
    are not contiguous, so its block_ranges do not apply') is false and should change."""
    d0, d1 = cv.device("opencl:0:0", warm_up=False), cv.device("opencl:1:0", warm_up=False)
    x = np.arange(20_000, dtype=np.float32)
    report = cv.stream(COPY, [x], [np.float32], device=[d0, d1], block_bytes=4096,
                       schedule="static")
    assert np.array_equal(report.outputs[0], x)
    ranges = np.concatenate([r.block_ranges for r in report.devices])
    assert sorted(map(tuple, ranges.tolist())) == sorted(map(tuple,
                                                           report.block_ranges.tolist()))
    assert int((ranges[:, 1] - ranges[:, 0]).sum()) == len(x)
    assert "do not apply" not in inspect.getsource(cv.Report)


# -- guards -------------------------------------------------------------------------------------


def test_guard_keep_release_and_budget_do_what_their_docstrings_say(
        dev: cv.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """guard: ``cv.configure``: an int or a size string, 'lowering it releases the least
    recently used ones at once'; ``cv.keep_pinned``: False for an array larger than the
    budget, True for one kept (already or now); ``cv.release_pinned``: by a spec string,
    returns the bytes released."""
    monkeypatch.setattr(keep, "_budget", keep._budget)  # restored after the test
    cv.release_pinned()
    try:
        assert cv.configure(pinned_budget="8KiB") == {"pinned_budget": 8192}
        assert cv.configure(pinned_budget=8192.0) == {"pinned_budget": 8192}
        with pytest.raises(InputError):
            cv.configure(pinned_budget=-1)
        big = np.ones(4096, np.float32)  # 16 KiB: past the budget
        assert cv.keep_pinned(big, device=dev) is False
        a, b = np.ones(1024, np.float32), np.ones(1024, np.float32)  # 4 KiB each
        assert cv.keep_pinned(a, device=dev) and cv.keep_pinned(a, device=SPEC)
        assert cv.keep_pinned(b, device=dev)
        cv.configure(pinned_budget=4096)  # a (older) released at once
        assert cv.release_pinned(a, device=SPEC) == 0
        assert cv.release_pinned(b, device=SPEC) == b.nbytes
        y = np.empty_like(b)
        cv.configure(pinned_budget="1MiB")
        cv.stream(COPY, [b], [y], device=dev, keep_pinned=True)
        assert np.array_equal(y, b)
        assert cv.release_pinned() == b.nbytes + y.nbytes
    finally:
        cv.release_pinned()
