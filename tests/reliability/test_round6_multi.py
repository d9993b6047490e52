"""The sixth round: several devices, resident tables, kept arrays, Dask.

- A read-only ``cv.resident`` table changed on the host without ``refresh()``, streamed over
  two devices: its own device used the table it had uploaded (the old one), the other device
  uploaded the host array (the new one), so the output mixed both answers with no error (a
  one-device stream gives the old answer throughout). Every device now sees the table as its
  own device holds it (read back once per stream), held there for the stream.
- A handle bound to no device, shared by two streams over ``[d0, d1]`` and ``[d1, d0]`` at
  once: each stream took its own first device for the handle's home, the first upload bound
  it there and the other stream failed with "this resident array lives on ...: make a
  cv.resident(...) per device" (the same streams one after the other run). The home is now
  bound as the stream starts, under the handle's lock.
- A closed handle of another device was taken as its array by every device of a stream; a
  closed handle is refused, as on one device.
- ``cv.release_pinned(a)`` while a stream held ``a``, then ``cv.keep_pinned(a)`` again:
  keep_pinned answered True with a second registration, which the stream's end dropped from
  the table without closing it (not used by later streams, not released by release_pinned,
  page-locked for good). The first registration is now kept instead.
- ``cv.configure(pinned_budget=0)`` while a stream held a kept array: once the stream let go
  it stayed page-locked, over the budget, for good. The budget is applied when a stream lets
  go.
- ``conveyor.dask`` with a ``cv.resident`` handle in ``args=``: a raw ``TypeError: Could not
  serialize object of type _HLGExprSequence`` (its locks cannot be pickled), on a threaded
  LocalCluster too. A read-only handle now travels as its table (as its device holds it),
  uploaded by each chunk's stream; a writable one is an InputError (it would be copied back
  into the client's array).
- ``conveyor.dask`` with ``device="opencl:all"`` (or a comma list) made every chunk fail on
  the workers with "no device matches 'opencl:all'", a spec ``cv.stream`` takes. It is
  refused on the client, before any task, saying each worker streams on one device.
"""

from __future__ import annotations

import gc
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import in_use, stage_threads  # noqa: E402
from streamkit import store, to_host  # noqa: E402
from test_multi import _second_context, two_devices  # noqa: E402

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402
from conveyor.memory import keep  # noqa: E402
from conveyor.pipeline import resident as resident_module  # noqa: E402

LOOKUP = cv.portable("""
__kernel void lookup(__global const uint *x, __global float *y, __global const float *table,
                     uint size, float scale, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = table[x[i] % size] * scale + (float)((offset + i) % 3);
}
""")


@pytest.fixture(scope="module")
def pair():
    """Two devices of one backend under test, else an OpenCL device and a second context on
    it (tests/pipeline/test_multi.py's ``two_devices``)."""
    first, second, made = two_devices()
    yield first, second
    if made is not None:
        gc.collect()
        made.close()


@pytest.fixture(autouse=True)
def clean_after(request):
    """Both devices' pools at zero, no staging or device thread, nothing kept."""
    keep.release_pinned()
    yield
    keep.release_pinned()
    if "pair" in request.fixturenames:
        gc.collect()
        for dev in request.getfixturevalue("pair"):
            assert in_use(dev) == (0, 0), dev
    assert stage_threads() == []
    assert [t for t in threading.enumerate() if t.name.startswith("conveyor-device")] == []
    assert keep.kept_bytes() == 0


def _lookup_data(seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**32, 40_000, dtype=np.uint32), rng.random(777).astype(np.float32)


def _lookup_reference(x: np.ndarray, table: np.ndarray, scale: float) -> np.ndarray:
    index = (np.arange(len(x)) % 3).astype(np.float32)
    return (table[x % len(table)] * np.float32(scale) + index).astype(np.float32)


# -- resident tables over several devices --------------------------------------------------
@pytest.mark.parametrize("schedule", ["dynamic", "static"])
def test_a_table_changed_without_refresh_is_one_table_on_every_device(pair, schedule):
    x, table = _lookup_data()
    k = pair[0].compile(LOOKUP, "lookup")
    old = table.copy()
    with cv.resident(table, device=pair[0]) as handle:  # uploaded now
        table[:] = 7.0  # changed on the host, no refresh(): a stream sees the old table
        one = np.zeros(len(x), np.float32)
        cv.stream(k, [x], [one], device=pair[0], args=(handle, len(table), 2.0),
                  block_bytes=4000)
        np.testing.assert_array_equal(one, _lookup_reference(x, old, 2.0))
        y = np.zeros(len(x), np.float32)
        report = cv.stream(k, [x], [y], device=list(pair), args=(handle, len(table), 2.0),
                           block_bytes=4000, schedule=schedule)
        if schedule == "static":  # dynamic: a device that starts late may get no run
            assert all(r.blocks > 0 for r in report.devices)
        # Before: the blocks of the second device used the new table (a mix of both).
        np.testing.assert_array_equal(y, one)
        assert handle.users == 0
        handle.refresh()  # and after refresh(), the new table everywhere
        cv.stream(k, [x], [y], device=list(pair), args=(handle, len(table), 2.0),
                  block_bytes=4000, schedule=schedule)
        np.testing.assert_array_equal(y, _lookup_reference(x, table, 2.0))


def test_an_unbound_table_shared_by_streams_over_devices_in_either_order(pair, monkeypatch):
    """Stream B (devices reversed) runs to its end just as stream A first uploads the shared
    handle (the real Resident.use, wrapped to run B there): both are exact."""
    x, table = _lookup_data(4)
    k = pair[0].compile(LOOKUP, "lookup")
    handle = cv.resident(table)  # bound to no device yet
    real = resident_module.Resident.use
    ran: list[str] = []
    ys = [np.zeros(len(x), np.float32) for _ in range(2)]
    errors: list[BaseException] = []

    def stream_b() -> None:
        try:
            cv.stream(k, [x], [ys[1]], device=[pair[1], pair[0]],
                      args=(handle, len(table), 4.0), block_bytes=4000)
        except BaseException as exc:
            errors.append(exc)

    def use(self, device, queue):
        if self is handle and not ran:
            ran.append("B")
            other = threading.Thread(target=stream_b)
            other.start()
            other.join()
        return real(self, device, queue)

    monkeypatch.setattr(resident_module.Resident, "use", use)
    try:
        cv.stream(k, [x], [ys[0]], device=list(pair), args=(handle, len(table), 2.0),
                  block_bytes=4000)
    finally:
        monkeypatch.undo()
        if not handle.users:
            handle.close()
    assert ran == ["B"] and errors == []
    np.testing.assert_array_equal(ys[0], _lookup_reference(x, table, 2.0))
    np.testing.assert_array_equal(ys[1], _lookup_reference(x, table, 4.0))
    assert handle.users == 0 and handle.closed


def test_a_closed_table_of_a_device_outside_the_stream_is_refused(pair):
    x, table = _lookup_data(5)
    k = pair[0].compile(LOOKUP, "lookup")
    if pair[0].backend != "opencl":
        pytest.skip("the table's device is a second OpenCL context")
    elsewhere = _second_context(pair[0])  # its own device, in no stream here
    handle = cv.resident(table, device=elsewhere)
    handle.close()
    elsewhere.close()
    y = np.zeros(len(x), np.float32)
    with pytest.raises(InputError, match="was closed"):
        cv.stream(k, [x], [y], device=[pair[0], pair[1]], args=(handle, len(table), 1.0),
                  block_bytes=4000)
    assert (y == 0).all()


# -- kept arrays ----------------------------------------------------------------------------
def _held_stream(device: cv.Device, a: np.ndarray, during) -> np.ndarray:
    """A callable stream over kept ``a`` (copying path); ``during()`` runs at its third block,
    while the stream holds ``a``."""
    calls = [0]

    def double(x, y, *, queue, offset, n):
        calls[0] += 1
        if calls[0] == 3:  # the warm-up call, then two blocks
            during()
        store(y, to_host(x, queue) * 2, queue)

    y = np.zeros_like(a)
    cv.stream(double, [a], [y], device=device, block_bytes=4000, zero_copy=False)
    return y


@pytest.fixture
def budget_restored():
    old = keep._budget
    yield
    keep._budget = old


def test_keeping_again_an_array_released_while_a_stream_holds_it(device, budget_restored):
    a = np.arange(20_000, dtype=np.float32)
    assert cv.keep_pinned(a, device=device)
    answers: list[object] = []

    def release_and_keep_again() -> None:
        answers.append(cv.release_pinned(a))  # held: released when the stream lets go
        answers.append(cv.keep_pinned(a, device=device))  # ... unless kept again

    y = _held_stream(device, a, release_and_keep_again)
    np.testing.assert_array_equal(y, 2 * a)
    assert answers == [a.nbytes, True]
    # Before: the stream's end dropped the second registration from the table, unclosed.
    assert keep.kept_bytes() == a.nbytes
    found = keep.find(device, a)
    assert found is not None and not found.doomed and found.holds == 0
    assert cv.release_pinned(a) == a.nbytes and keep.kept_bytes() == 0


def test_a_budget_lowered_while_a_stream_holds_an_array_applies_when_it_lets_go(
        device, budget_restored):
    a = np.arange(20_000, dtype=np.float32)
    b = np.arange(10_000, dtype=np.float32)
    assert cv.keep_pinned(a, device=device) and cv.keep_pinned(b, device=device)
    during: list[int] = []

    def lower() -> None:
        cv.configure(pinned_budget=0)  # b goes at once, a is held by the stream
        during.append(keep.kept_bytes())

    y = _held_stream(device, a, lower)
    np.testing.assert_array_equal(y, 2 * a)
    assert during == [a.nbytes]
    assert keep.kept_bytes() == 0  # before: a stayed page-locked, over the budget, for good
    assert keep.find(device, a) is None


# -- Dask -----------------------------------------------------------------------------------
def test_dask_refuses_a_spec_of_several_devices_on_the_client():
    da = pytest.importorskip("dask.array")
    import conveyor.dask as cvd

    source = """__kernel void twice(__global const float *x, __global float *y, ulong offset,
                                    ulong n) {
        ulong i = get_global_id(0);
        if (i < n) y[i] = 2 * x[i];
    }"""
    x = da.from_array(np.arange(100, dtype=np.float32), chunks=50)
    for spec in ("opencl:all", "all", "opencl:0:0,opencl:1:0", "cuda:gpu:all"):
        with pytest.raises(InputError, match="names several devices"):
            cvd.map_blocks(cvd.kernel(source, "twice"), x, device=spec)
        with pytest.raises(InputError, match="names several devices"):
            cvd.reduce(cvd.kernel(source, "twice"), x, "sum", device=spec)


def test_dask_takes_a_resident_table_as_its_table(device):
    distributed = pytest.importorskip("distributed")
    da = pytest.importorskip("dask.array")
    import conveyor.dask as cvd

    if device.backend != "opencl":
        pytest.skip("an OpenCL C kernel")
    x, table = _lookup_data(6)
    k = cvd.kernel(LOOKUP, "lookup")
    chunks = da.from_array(x, chunks=15_000)
    with cv.resident(table, device=device) as handle:
        table[:] = 7.0  # no refresh(): the table as the device holds it, as cv.stream sees it
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                      dashboard_address=":0") as cluster, \
                distributed.Client(cluster):
            y = cvd.map_blocks(k, chunks, args=(handle, len(table), 2.0),
                               device=device.spec).compute()
            local = cv.stream(device.compile(LOOKUP, "lookup"), [x], [np.float32],
                              device=device, args=(handle, len(table), 2.0)).outputs[0]
            np.testing.assert_array_equal(y, local)
            with pytest.raises(InputError, match="writable=True"):
                cvd.map_blocks(k, chunks, args=(cv.resident(np.zeros(3, np.float32),
                                                            writable=True), 3, 2.0),
                               device=device.spec)
        assert handle.users == 0
