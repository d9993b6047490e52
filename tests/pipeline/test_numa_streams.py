"""A stream's staging threads and pinned blocks on its device's NUMA node (memory/numa.py).

This host has one node, where ``host_place`` is None and nothing is placed; here each test
sets a device's place by hand (``device.host_place = Place(0, cpus)``, what the sysfs reading
gives on a host with several nodes) to a subset of this process's CPUs, and checks on real
threads that the stream's staging copies ran there, that pinned blocks were allocated there,
and that the caller's thread was left as it was.
"""

from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest
from streamkit import add_reference, data, in_use, kernel, stage_threads

import conveyor as cv
from conveyor.memory import numa
from conveyor.pipeline import multi
from conveyor.pipeline import stream as stream_module

ALLOWED = frozenset(os.sched_getaffinity(0))
ROWS = 6 * 2**20  # 24 MiB per float32 array: blocks of 8 MiB, cut in two pieces each


Seen = list[tuple[int, str, frozenset[int]]]


def _recording_engine(monkeypatch, seen: Seen) -> None:
    """Engines (of one device and of several) whose staging copies record (id of the device,
    thread name, the CPUs the thread may run on)."""

    class Recording(stream_module.Engine):
        def _build(self) -> None:
            super()._build()
            real, device = self.stager.copy, id(self.device)

            def copy(dst, src):
                seen.append((device, threading.current_thread().name,
                             frozenset(os.sched_getaffinity(0))))
                real(dst, src)

            self.stager.copy = copy

    monkeypatch.setattr(stream_module, "Engine", Recording)
    monkeypatch.setattr(multi, "Engine", Recording)


@pytest.fixture
def placed(device):
    """``device`` with its place set to one of this process's CPUs; restored after."""
    saved = device.host_place
    device.host_place = numa.Place(0, frozenset({min(ALLOWED)}))
    yield device
    device.host_place = saved


def test_staging_copies_run_on_the_devices_cpus(placed, monkeypatch):
    seen: Seen = []
    _recording_engine(monkeypatch, seen)
    a, b = data((ROWS,), np.float32, 1), data((ROWS,), np.float32, 2)
    c = np.empty_like(a)
    before = os.sched_getaffinity(0)
    cv.stream(kernel(placed, "add"), [a, b], [c], device=placed, block_bytes=8 * 2**20,
              workers=2, zero_copy=False)
    np.testing.assert_array_equal(c, add_reference(a, b))
    assert os.sched_getaffinity(0) == before  # the caller's thread is not moved
    assert seen, "nothing was staged"
    assert {cpus for _, _, cpus in seen} == {placed.host_place.cpus}
    assert any(name.startswith("conveyor-stage_") for _, name, _ in seen)  # the workers too


def test_with_no_place_staging_threads_keep_every_cpu(device, monkeypatch):
    if device.host_place is not None:
        pytest.skip("this host gives the device a place")
    seen: Seen = []
    _recording_engine(monkeypatch, seen)
    a, b = data((ROWS,), np.float32, 1), data((ROWS,), np.float32, 2)
    c = np.empty_like(a)
    cv.stream(kernel(device, "add"), [a, b], [c], device=device, block_bytes=8 * 2**20,
              workers=2, zero_copy=False)
    np.testing.assert_array_equal(c, add_reference(a, b))
    assert {cpus for _, _, cpus in seen} == {ALLOWED}


def _fresh_context(dev: cv.Device) -> cv.Device:
    from conveyor.backends import opencl

    platform, index = (int(part) for part in dev.spec.split(":")[1:])
    return opencl.Device(dev.cl_device, platform, index)  # type: ignore[attr-defined]


def test_pinned_blocks_are_allocated_on_the_devices_node(device, monkeypatch):
    """A fresh context (its pools empty, so the stream allocates): every pinned block is made
    inside numa.on_node of its place, and the warm-up's blocks too."""
    if device.backend != "opencl":
        pytest.skip("a fresh context with empty pools is made for OpenCL devices")
    dev = _fresh_context(device)
    made: list[tuple[numa.Place | None, frozenset[int]]] = []
    real = dev.alloc_pinned

    def alloc_pinned(nbytes: int):
        made.append((numa.current(), frozenset(os.sched_getaffinity(0))))
        return real(nbytes)

    dev.alloc_pinned = alloc_pinned  # type: ignore[method-assign]
    place = dev.host_place = numa.Place(0, frozenset({max(ALLOWED)}))
    try:
        a, b = data((ROWS,), np.float32, 3), data((ROWS,), np.float32, 4)
        c = np.empty_like(a)
        cv.stream(kernel(dev, "add"), [a, b], [c], device=dev, block_bytes=8 * 2**20,
                  zero_copy=False)
        np.testing.assert_array_equal(c, add_reference(a, b))
        assert made and set(made) == {(place, place.cpus)}
        streamed = len(made)
        dev.warm_up(64 * 2**20, pinned=True)
        dev.wait_for_warm_up()
        assert len(made) > streamed and set(made) == {(place, place.cpus)}
        assert os.sched_getaffinity(0) == ALLOWED and numa.current() is None
    finally:
        gc.collect()
        assert in_use(dev) == (0, 0)
        dev.close()


def test_each_device_of_a_stream_stages_on_its_own_cpus(device, monkeypatch):
    """Two devices (the device and a second context on it) given different CPUs: each one's
    staging copies ran on its own."""
    if len(ALLOWED) < 2:
        pytest.skip("this process may run on one CPU only")
    if device.backend != "opencl":
        pytest.skip("the second device is a second OpenCL context")
    second = _fresh_context(device)
    saved = device.host_place
    low, high = min(ALLOWED), max(ALLOWED)
    device.host_place = numa.Place(0, frozenset({low}))
    second.host_place = numa.Place(0, frozenset({high}))
    seen: Seen = []
    _recording_engine(monkeypatch, seen)
    try:
        a, b = data((ROWS,), np.float32, 5), data((ROWS,), np.float32, 6)
        c = np.empty_like(a)
        cv.stream(kernel(device, "add"), [a, b], [c], device=[device, second],
                  block_bytes=4 * 2**20, workers=4, zero_copy=False, schedule="static")
        np.testing.assert_array_equal(c, add_reference(a, b))
        by_device: dict[int, set[frozenset[int]]] = {}
        for dev, _, cpus in seen:
            by_device.setdefault(dev, set()).add(cpus)
        assert by_device == {id(device): {frozenset({low})}, id(second): {frozenset({high})}}
        assert os.sched_getaffinity(0) == ALLOWED
    finally:
        device.host_place = saved
        gc.collect()
        assert stage_threads() == []
        second.close()
