"""Faults (issue 8, items 4 and 6), injected by wrapping real objects.

Out-of-memory at each allocation site (the device pool's and the pinned pool's ``allocate``,
the backend's ``alloc_device``/``alloc_pinned``, and the OpenCL driver call under them): the
pool climbs its ladder, then raises a picklable ``OutOfMemoryError`` with the sizes, its
counters roll back, and later streams are right.

A failure at each pipeline stage that tests/pipeline/test_stream_errors.py does not cover
(copy-in, copy-out, zero-copy registration and host sync, the device fold and the host
combine of a reduction, a non-OOM allocation failure, staging from and into files): the
original exception surfaces, nothing is left in flight, every pool is back to zero in use,
no staging thread is left, no partial output file exists, and the next stream is right.
"""

from __future__ import annotations

import gc
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import conveyor as cv
from conveyor.memory.pinned import PinnedPool
from conveyor.memory.pool import BlockPool, DevicePool
from conveyor.pipeline import engine as engine_module
from conveyor.pipeline import reduce as reducing
from conveyor.pipeline.stage import Stager

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    Boom,
    add_reference,
    assert_clean,
    data,
    kernel,
    next_stream_right,
    store,
    to_host,
    vadd_arrays,
)

MIB = 1 << 20
ODD = 3 * MIB + 12_345  # a size class no other test holds a block of

# -- out-of-memory at each allocation site --------------------------------------------------

SITES = ["device-pool", "pinned-pool", "backend-alloc_device", "backend-alloc_pinned"]


class Allocator:
    """Wraps a real allocation function: requests of ``failing`` size raise the
    OutOfMemoryError a backend raises, while ``failing`` is set; every call is logged."""

    def __init__(self, real: Callable[[int], Any], where: str, log: list[str]) -> None:
        self.real = real
        self.where = where
        self.log = log
        self.failing: int | None = None

    def __call__(self, nbytes: int) -> Any:
        if nbytes == self.failing:
            self.log.append("allocate")
            raise cv.OutOfMemoryError(nbytes, 0, None, where=self.where)
        return self.real(nbytes)


@pytest.fixture
def site(request, device, monkeypatch):
    """(pool, allocator, log): a pool whose allocations go through a failing wrapper at the
    site named by the test's parameter. Backend sites get a fresh pool over the wrapped
    backend method (a pool binds its allocator when it is made); pool sites wrap the device's
    own pool."""
    log: list[str] = []
    name = request.param
    made: BlockPool | None = None
    if name.startswith("backend-"):
        method = name.removeprefix("backend-")
        where = "device" if method == "alloc_device" else "pinned host"
        allocator = Allocator(getattr(device, method), where, log)
        monkeypatch.setattr(device, method, allocator)
        made = DevicePool(device) if method == "alloc_device" else PinnedPool(device)
        pool = made
    else:
        pool = device.memory_pool if name == "device-pool" else device.pinned_pool
        where = "device" if name == "device-pool" else "pinned host"
        allocator = Allocator(pool.allocate, where, log)
        monkeypatch.setattr(pool, "allocate", allocator)
    real_trim, real_drain, real_gc = pool.trim, pool._drain_pending, gc.collect
    monkeypatch.setattr(pool, "trim", lambda: log.append("trim") or real_trim())
    monkeypatch.setattr(pool, "_drain_pending", lambda: log.append("drain") or real_drain())
    monkeypatch.setattr(gc, "collect", lambda *a: log.append("gc") or real_gc(*a))
    yield pool, allocator, log
    monkeypatch.undo()
    if made is not None:
        made.close()


@pytest.mark.parametrize("site", SITES, indirect=True)
def test_ladder_frees_held_blocks_collects_garbage_retries_then_raises(site):
    pool, allocator, log = site
    pool.release(pool.acquire(MIB))  # an idle block the ladder must give back
    assert pool.stats().held_bytes > 0
    allocator.failing = pool.bin_size(ODD)
    log.clear()
    with pytest.raises(cv.OutOfMemoryError):
        pool.acquire(ODD)
    assert log == ["allocate", "trim", "allocate", "drain", "allocate", "trim", "allocate",
                   "gc", "allocate", "trim", "allocate"]
    assert pool.stats().held_bytes == 0


@pytest.mark.parametrize("site", SITES, indirect=True)
def test_out_of_memory_carries_the_sizes_and_survives_pickling(site):
    pool, allocator, _ = site
    held = pool.acquire(MIB)
    try:
        allocator.failing = pool.bin_size(ODD)
        with pytest.raises(cv.OutOfMemoryError) as caught:
            pool.acquire(ODD)
        in_use = pool.stats().in_use_bytes
    finally:
        pool.release(held)
    copy = pickle.loads(pickle.dumps(caught.value))
    assert (copy.requested, copy.in_use, copy.limit, copy.where) == (
        pool.bin_size(ODD), in_use, None, allocator.where)
    assert copy.in_use >= pool.bin_size(MIB)
    assert str(copy) == str(caught.value)


@pytest.mark.parametrize("site", SITES, indirect=True)
def test_failed_acquire_rolls_the_counters_back(site, monkeypatch):
    pool, allocator, _ = site
    held = pool.acquire(MIB)
    try:
        before = pool.stats()
        allocator.failing = pool.bin_size(ODD)
        with pytest.raises(cv.OutOfMemoryError):
            pool.acquire(ODD)
        after = pool.stats()
        assert (after.in_use_bytes, after.blocks_in_use, after.peak_in_use_bytes,
                after.pending_bytes) == (before.in_use_bytes, before.blocks_in_use,
                                         before.peak_in_use_bytes, before.pending_bytes)
        # No reservation is left behind: a limit of exactly what is held plus the request
        # admits the request once memory is there again.
        allocator.failing = None
        monkeypatch.setattr(pool, "limit", after.in_use_bytes + after.held_bytes
                            + after.pending_bytes + pool.bin_size(ODD))
        pool.release(pool.acquire(ODD))
    finally:
        pool.release(held)
        pool.trim()


@pytest.mark.parametrize("where", ["device", "pinned host"])
def test_driver_out_of_memory_in_a_stream_raises_out_of_memory_error(device, monkeypatch, where):
    """The OpenCL driver refuses an allocation (MEM_OBJECT_ALLOCATION_FAILURE) from the second
    one on: the backend says OutOfMemoryError, the pool climbs its ladder and gives up, the
    stream raises it, and the device streams right afterwards."""
    if device.backend != "opencl":
        pytest.skip("injects at the OpenCL driver call")
    import pyopencl as cl

    from conveyor.backends import opencl as backend

    k = kernel(device, "add")
    device.memory_pool.trim()
    device.pinned_pool.trim()  # nothing idle: every acquire of the ring allocates
    real_buffer, calls = cl.Buffer, [0]

    def buffer(context, flags, *args, **kw):
        pinned_host = bool(flags & cl.mem_flags.ALLOC_HOST_PTR)
        wanted = not (flags & cl.mem_flags.USE_HOST_PTR) and (
            pinned_host == (where == "pinned host"))
        if wanted:
            calls[0] += 1
            if calls[0] >= 2:
                code = cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE
                raise cl.MemoryError(cl._cl._ErrorRecord("clCreateBuffer", code, "injected"))
        return real_buffer(context, flags, *args, **kw)

    monkeypatch.setattr(backend.cl, "Buffer", buffer)
    a, b, c = vadd_arrays(4000)
    with pytest.raises(cv.OutOfMemoryError) as caught:
        cv.stream(k, [a, b], [c], device=device, block_bytes=4000, zero_copy=False)
    assert caught.value.where == where and caught.value.in_use > 0
    assert calls[0] == 1 + 6  # one success, then every rung of the ladder tried again
    monkeypatch.undo()
    assert_clean(device)
    next_stream_right(device)


# -- a failure at each pipeline stage -------------------------------------------------------

N = 20 * 250  # 20 blocks of 250 float32
BLOCK = 250 * 4


class Recorder:
    """Wraps every queue the engine makes: logs every event a queue hands out, and raises
    ``boom`` at the ``nth`` call of ``method``."""

    METHODS = ("copy_in", "copy_out", "launch", "marker", "sync_host", "fill")

    def __init__(self, device: cv.Device, boom: BaseException) -> None:
        self.device = device
        self.real_create = device.create_queue
        self.boom = boom
        self.method = ""
        self.nth = 0
        self.calls: dict[str, int] = {}
        self.events: list[cv.Event] = []

    def create_queue(self) -> Any:
        queue = self.real_create()
        for name in self.METHODS:
            setattr(queue, name, self._wrap(name, getattr(queue, name)))
        return queue

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kw: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            if name == self.method and self.calls[name] == self.nth:
                raise self.boom
            event = real(*args, **kw)
            self.events.append(event)
            return event

        return call

    def nothing_in_flight(self) -> bool:
        return all(event.is_done() for event in self.events)


def _nth_call_raises(obj: Any, name: str, nth: int, boom: BaseException, monkeypatch,
                     when: Callable[..., bool] = lambda *a, **k: True) -> list[int]:
    """Wrap ``obj.name``: the ``nth`` call for which ``when(*args)`` holds raises ``boom``."""
    real, count = getattr(obj, name), [0]

    def call(*args: Any, **kw: Any) -> Any:
        if when(*args, **kw):
            count[0] += 1
            if count[0] == nth:
                raise boom
        return real(*args, **kw)

    monkeypatch.setattr(obj, name, call)
    return count


def _map(device, zero_copy):
    a, b, c = vadd_arrays(N)
    cv.stream(kernel(device, "add"), [a, b], [c], device=device, block_bytes=BLOCK,
              zero_copy=zero_copy, workers=2)


def _kernel_sum(device, zero_copy):
    x = data((N,), np.int32, 5)
    cv.stream(kernel(device, "ident", np.int32), [x], device=device, reduce="sum",
              block_bytes=BLOCK, zero_copy=zero_copy)


def _files(tmp_path):
    a, b, _ = vadd_arrays(N)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    return [tmp_path / "a.npy", tmp_path / "b.npy"], tmp_path / "c.npy", add_reference(a, b)


def _file_map(device, tmp_path):
    inputs, target, _ = _files(tmp_path)
    cv.stream(kernel(device, "add"), [str(p) for p in inputs], [cv.npy_out(target)],
              device=device, block_bytes=BLOCK, workers=2)


class _FaultyStager(Stager):
    """The real stager; its real piece copy raises ``boom`` at the ``nth`` copy whose
    destination (``side`` "out") or source (``side`` "in") is a file's rows."""

    boom: BaseException = RuntimeError("unset")
    side = "in"
    nth = 3

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        real, count = self.copy, [0]

        def copy(dst, src):
            file_side = src if self.side == "in" else dst
            if not isinstance(file_side, np.ndarray):
                count[0] += 1
                if count[0] == self.nth:
                    raise self.boom
            real(dst, src)

        self.copy = copy


def _inject(stage: str, device, monkeypatch, boom, recorder, tmp_path) -> Callable[[], None]:
    """Set up the fault for ``stage``; return the stream that hits it."""
    if stage in ("copy-in", "copy-out"):
        recorder.method, recorder.nth = stage.replace("-", "_"), 4
        return lambda: _map(device, zero_copy=False)
    if stage == "zero-copy-sync":
        recorder.method, recorder.nth = "sync_host", 4
        return lambda: _map(device, zero_copy=True)
    if stage == "zero-copy-register":
        _nth_call_raises(device, "register_host", 5, boom, monkeypatch)
        return lambda: _map(device, zero_copy=True)
    if stage.startswith("device-fold"):
        _nth_call_raises(reducing, "fold_partials", 3, boom, monkeypatch)
        return lambda: _kernel_sum(device, zero_copy=stage.endswith("zero-copy"))
    if stage == "host-combine":
        def combine(x, y):
            if x > 1000:  # after a few blocks: the first partials fold fine
                raise boom
            return x + y

        def compute(x, y, queue, offset, n):
            store(y, to_host(x, queue), queue)
            return 1000

        def run() -> None:
            x = data((N,), np.float32, 6)
            cv.stream(compute, [x], [np.zeros_like(x)], device=device, reduce=combine,
                      block_bytes=BLOCK, zero_copy=False)

        return run
    if stage == "allocation":
        pool = device.memory_pool
        pool.trim()
        _nth_call_raises(pool, "allocate", 3, boom, monkeypatch)
        return lambda: _map(device, zero_copy=False)
    if stage in ("stage-in-file", "stage-out-file"):
        monkeypatch.setattr(_FaultyStager, "boom", boom)
        monkeypatch.setattr(_FaultyStager, "side", stage.split("-")[1])
        monkeypatch.setattr(engine_module, "Stager", _FaultyStager)
        return lambda: _file_map(device, tmp_path)
    raise AssertionError(stage)


STAGES = ["copy-in", "copy-out", "zero-copy-register", "zero-copy-sync", "device-fold",
          "device-fold-zero-copy", "host-combine", "allocation", "stage-in-file",
          "stage-out-file"]


@pytest.mark.parametrize("stage", STAGES)
def test_failure_at_a_stage_surfaces_as_is_and_leaves_nothing_behind(device, monkeypatch,
                                                                     tmp_path, stage):
    if "zero-copy" in stage and not device.host_unified:
        pytest.skip("zero-copy needs a device that shares memory with the host")
    kernel(device, "add")  # both built before any fault
    kernel(device, "ident", np.int32)
    boom = Boom(f"injected at {stage}")
    recorder = Recorder(device, boom)
    monkeypatch.setattr(device, "create_queue", recorder.create_queue)
    run = _inject(stage, device, monkeypatch, boom, recorder, tmp_path)
    with pytest.raises(Boom) as caught:
        run()
    assert caught.value is boom
    assert recorder.nothing_in_flight()
    monkeypatch.undo()
    assert_clean(device)
    assert not (tmp_path / "c.npy").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["a.npy", "b.npy"])
    next_stream_right(device)


def test_file_stream_after_a_staging_failure_writes_the_whole_output(device, monkeypatch,
                                                                     tmp_path):
    monkeypatch.setattr(_FaultyStager, "boom", Boom("staging"))
    monkeypatch.setattr(engine_module, "Stager", _FaultyStager)
    with pytest.raises(Boom):
        _file_map(device, tmp_path)
    monkeypatch.undo()
    _, target, expected = _files(tmp_path)
    _file_map(device, tmp_path)
    np.testing.assert_array_equal(np.load(target), expected)
