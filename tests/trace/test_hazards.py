"""Strict async mode: each hot-path hazard raises under strict=True and warns once by default;
a clean stream passes. Hazards are injected by wrapping real objects: a compute callable that
allocates or compiles mid-stream, and a pageable copy on a real queue inside the context."""

from __future__ import annotations

import uuid
import warnings

import numpy as np
import pytest
from tracekit import BLOCK, N, kernel, vadd_stream

import conveyor as cv
from conveyor import hazards
from conveyor.hazards import HazardWarning
from conveyor.kernels.portable import portable

MIB = 2**20


@pytest.fixture(autouse=True)
def fresh_warnings():
    hazards.reset_warnings()
    yield
    hazards.reset_warnings()


def _callable_stream(device, during_block, **kw):
    """A stream of a Python callable that runs ``during_block(device)`` at block 2 (after the
    ring was built and the first blocks were sent); it computes nothing else."""

    def compute(x, y, *, queue, offset, n):
        if offset == 2 * (BLOCK // 4):
            during_block(device)

    x = np.arange(N, dtype=np.float32)
    return cv.stream(compute, [x], [np.float32], device=device, block_bytes=BLOCK,
                     zero_copy=False, **kw)


def _allocate(device):
    pool = device.memory_pool
    pool.trim()  # nothing held: the acquire below must allocate
    block = pool.acquire(3 * MIB + 4096)
    pool.release(block)


def _compile(device):
    source = portable(f"// {uuid.uuid4()}\n__kernel void fresh(__global float *x) "
                      "{ x[0] = 1.0f; }")
    device.compile(source, "fresh")


@pytest.mark.parametrize("inject, hazard", [
    (_allocate, hazards.POOL_ALLOCATION),
    (_compile, hazards.KERNEL_BUILD),
], ids=["pool-allocation", "kernel-build"])
def test_strict_raises_on_a_hazard_mid_stream(device, inject, hazard):
    with pytest.raises(cv.HazardError) as caught:
        _callable_stream(device, inject, strict=True)
    assert caught.value.hazard == hazard and "fix:" in str(caught.value)


def test_strict_raises_on_a_load_of_a_prebuilt_kernel(device):
    source = portable(f"// {uuid.uuid4()}\n__kernel void late(__global float *x) "
                      "{ x[0] = 2.0f; }")
    future = device.compile(source, "late", wait=False)
    while not future.done():
        pass
    with pytest.raises(cv.HazardError, match="loaded"):
        _callable_stream(device, lambda dev: future.result(), strict=True)


@pytest.mark.parametrize("call", ["copy_in", "copy_out"])
def test_strict_raises_on_a_pageable_copy(device, call):
    queue = device.create_queue()
    buffer = device.alloc_device(4096)
    host = np.zeros(1024, np.float32)
    try:
        with hazards.hot_path(device, strict=True), pytest.raises(cv.HazardError) as caught:
            if call == "copy_in":
                queue.copy_in(buffer, host)
            else:
                queue.copy_out(host, buffer)
        assert caught.value.hazard == hazards.PAGEABLE_COPY and call in str(caught.value)
        queue.finish()
    finally:
        buffer.close()
        queue.close()


def test_pinned_copies_pass_in_strict_mode(device):
    queue = device.create_queue()
    buffer = device.alloc_device(4096)
    pooled = cv.pinned.empty(1024, np.float32, device=device)
    raw = device.alloc_pinned(4096)
    try:
        with hazards.hot_path(device, strict=True):
            queue.copy_in(buffer, pooled[:512])
            queue.copy_out(raw.array[:1024], buffer)
            queue.finish()
    finally:
        del pooled
        buffer.close()
        raw.close()
        queue.close()


def test_pageable_copy_outside_a_stream_is_fine(device):
    queue = device.create_queue()
    buffer = device.alloc_device(4096)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", HazardWarning)
            queue.copy_in(buffer, np.zeros(1024, np.float32)).wait()
    finally:
        buffer.close()
        queue.close()


@pytest.mark.parametrize("zero_copy", [False, None], ids=["copying", "auto"])
def test_clean_stream_passes_in_strict_mode(device, zero_copy):
    with warnings.catch_warnings():
        warnings.simplefilter("error", HazardWarning)
        vadd_stream(device, zero_copy=zero_copy, strict=True)
        x = cv.pinned.asarray(np.arange(N, dtype=np.float32), device=device)
        out = cv.pinned.empty(N, np.float32, device=device)
        cv.stream(kernel(device, "ident"), [x], [out], device=device, block_bytes=BLOCK,
                  zero_copy=False, strict=True)
        np.testing.assert_array_equal(out, x)
        del x, out


def test_default_mode_warns_once_per_hazard(device):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _callable_stream(device, _allocate)
        _callable_stream(device, _allocate)
        _callable_stream(device, _compile)
    found = [w for w in caught if issubclass(w.category, HazardWarning)]
    assert len(found) == 2, [str(w.message) for w in found]
    assert "memory pool allocated" in str(found[0].message)
    assert "CONVEYOR_STRICT" in str(found[0].message)
    assert "kernel 'fresh'" in str(found[1].message)


def test_environment_turns_strict_mode_on(device, monkeypatch):
    monkeypatch.setenv("CONVEYOR_STRICT", "1")
    with pytest.raises(cv.HazardError):
        _callable_stream(device, _allocate)
    monkeypatch.setenv("CONVEYOR_STRICT", "1")
    with warnings.catch_warnings(record=True):  # strict=False wins over the environment
        warnings.simplefilter("always")
        _callable_stream(device, _allocate, strict=False)


def test_malformed_strict_variable_is_an_input_error(device, monkeypatch):
    monkeypatch.setenv("CONVEYOR_STRICT", "maybe")
    with pytest.raises(cv.InputError, match="CONVEYOR_STRICT"):
        vadd_stream(device)


def test_hazard_error_survives_pickling():
    import pickle

    error = pickle.loads(pickle.dumps(cv.HazardError(hazards.KERNEL_BUILD, "msg")))
    assert error.hazard == hazards.KERNEL_BUILD and str(error) == "msg"
