"""Pinned NumPy arrays: constructors, pool accounting, async round trips, fenced return of
dropped arrays, in-place registration and fine-grained SVM arrays."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import conveyor as cv
from conveyor.kernels.build import compile_kernel
from conveyor.memory import pinned
from conveyor.memory.pinned import page_bin


def _odd_nbytes() -> int:
    # A size class no other test uses, so hits and misses are this test's own.
    return 37 * 4096 + 8


CONSTRUCTORS = {
    "empty": lambda dev: cv.pinned.empty((6, 7), np.float64, device=dev),
    "zeros": lambda dev: cv.pinned.zeros((6, 7), np.float64, device=dev),
    "empty_like": lambda dev: cv.pinned.empty_like(np.ones((6, 7)), device=dev),
    "zeros_like": lambda dev: cv.pinned.zeros_like(np.ones((6, 7)), device=dev),
    "asarray": lambda dev: cv.pinned.asarray(np.ones((6, 7)), device=dev),
}


@pytest.mark.parametrize("make", CONSTRUCTORS.values(), ids=CONSTRUCTORS.keys())
def test_constructors_return_plain_c_contiguous_pinned_ndarrays(device, make):
    array = make(device)
    assert type(array) is np.ndarray
    assert array.flags.c_contiguous and array.flags.writeable
    assert (array.shape, array.dtype) == ((6, 7), np.dtype(np.float64))
    assert cv.pinned.is_pinned(array, device)
    del array


def test_zeros_are_zero(device):
    array = cv.pinned.zeros((1000,), np.int32, device=device)
    assert not array.any()
    del array


def test_asarray_copies_a_strided_source(device):
    source = np.arange(200, dtype=np.int64)[::2]
    array = cv.pinned.asarray(source, device=device)
    np.testing.assert_array_equal(array, source)
    assert array.flags.c_contiguous
    del array


def test_asarray_of_a_pinned_array_returns_it(device):
    array = cv.pinned.empty((100,), np.float32, device=device)
    assert cv.pinned.asarray(array, device=device) is array
    del array


def test_pool_counts_whole_pages_in_use(device):
    pool = device.pinned_pool
    before = pool.stats().in_use_bytes
    array = cv.pinned.empty((1000,), np.float64, device=device)
    assert pool.stats().in_use_bytes - before == page_bin(8000) == 8192
    del array


@pytest.mark.parametrize(
    "make", [lambda d: cv.pinned.empty((3,), object, device=d),
             lambda d: cv.pinned.asarray(np.array([None, 1], dtype=object), device=d)],
    ids=["empty", "asarray"],
)
def test_object_dtype_raises_input_error(device, make):
    with pytest.raises(cv.InputError):
        make(device)


def test_negative_dimension_raises_input_error(device):
    with pytest.raises(cv.InputError):
        cv.pinned.empty((4, -1), np.float32, device=device)


# Issue 13, item 11: sizes are checked with Python integers. (2**32, 2**32) float32 wrapped to
# 0 bytes in int64 and failed later as "cannot reshape"; a float or str dimension was a raw
# TypeError.
HUGE = (2**32, 2**32)
SIZE_CHECKED = {
    "empty": lambda d, shape: cv.pinned.empty(shape, np.float32, device=d),
    "zeros": lambda d, shape: cv.pinned.zeros(shape, np.float32, device=d),
    "empty_like": lambda d, shape: cv.pinned.empty_like(_Like(shape), device=d),
    "zeros_like": lambda d, shape: cv.pinned.zeros_like(_Like(shape), device=d),
}


class _Like:
    """Something with a shape and a dtype, as empty_like reads them (NumPy cannot make an
    array this big to pass instead)."""

    def __init__(self, shape):
        self.shape = shape
        self.dtype = np.dtype(np.float32)


@pytest.mark.parametrize("make", SIZE_CHECKED.values(), ids=SIZE_CHECKED.keys())
def test_a_shape_too_big_to_address_raises_input_error_naming_its_bytes(device, make):
    with pytest.raises(cv.InputError, match=r"73786976294838206464 bytes, more than any array"):
        make(device, HUGE)


@pytest.mark.parametrize("make", SIZE_CHECKED.values(), ids=SIZE_CHECKED.keys())
@pytest.mark.parametrize(
    ("shape", "phrase"),
    [((4, -1), "negative dimension in shape"), (2.5, r"shape=2\.5 \(float\): pass an int"),
     ((3, "4"), "has a dimension that is not an int"), ((2, 2.0), "not an int")],
    ids=["negative", "float", "str-dim", "float-dim"],
)
def test_bad_shapes_raise_input_error(device, make, shape, phrase):
    with pytest.raises(cv.InputError, match=phrase):
        make(device, shape)


# -- async round trip ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16, np.uint8, np.complex64])
@pytest.mark.parametrize("shape", [(1000,), (7, 33), (3, 4, 5)])
def test_data_survives_an_async_round_trip(device, dtype, shape):
    rng = np.random.default_rng(0)
    expected = (rng.standard_normal(shape) * 100).astype(dtype)
    source = cv.pinned.asarray(expected, device=device)
    result = cv.pinned.zeros_like(expected, device=device)
    block = device.memory_pool.acquire(source.nbytes)
    with device.create_queue() as queue:
        copied_in = queue.copy_in(block, source)
        cv.pinned.record_use(source, copied_in)
        copied_out = queue.copy_out(result, block, wait_for=[copied_in])
        cv.pinned.record_use(result, copied_out)
        device.memory_pool.release(block, after=copied_out)
        # Waiting on both events also drops PyOpenCL's hold on the host arrays (see the report
        # on record_use and NannyEvent).
        copied_in.wait()
        copied_out.wait()
    np.testing.assert_array_equal(result, expected)
    del source, result


# -- dropping an array returns its block --------------------------------------------------
def test_dropping_the_array_returns_its_block_to_the_pool(device):
    pool = device.pinned_pool
    array = cv.pinned.empty((_odd_nbytes(),), np.uint8, device=device)
    held_before = pool.stats().held_bytes
    del array
    gc.collect()
    assert pool.stats().held_bytes - held_before == page_bin(_odd_nbytes())


def test_the_next_same_size_request_is_a_hit(device):
    pool = device.pinned_pool
    array = cv.pinned.empty((_odd_nbytes(),), np.uint8, device=device)
    block = pinned.owner(array).block
    del array
    gc.collect()
    hits = pool.stats().hits
    again = cv.pinned.empty((_odd_nbytes(),), np.uint8, device=device)
    assert pool.stats().hits == hits + 1
    assert pinned.owner(again).block is block
    del again


def test_a_view_keeps_the_block_in_use(device):
    pool = device.pinned_pool
    array = cv.pinned.empty((_odd_nbytes(),), np.uint8, device=device)
    view = array[10:20]
    in_use = pool.stats().in_use_bytes
    del array
    gc.collect()
    assert pool.stats().in_use_bytes == in_use
    assert cv.pinned.is_pinned(view, device)
    del view


def test_return_of_a_dropped_array_is_fenced_by_record_use(device):
    pool = device.pinned_pool
    array = cv.pinned.empty((_odd_nbytes(),), np.uint8, device=device)
    block = pinned.owner(array).block
    gate = device.user_event()
    cv.pinned.record_use(array, gate)
    del array
    gc.collect()
    try:
        assert pool.stats().pending_bytes >= page_bin(_odd_nbytes())
        other = cv.pinned.empty((_odd_nbytes(),), np.uint8, device=device)
        assert pinned.owner(other).block is not block
        del other
    finally:
        gate.set_complete()
    gate.wait()  # on CUDA the gate's event completes on the device a moment after set_complete
    # Once the gate is done the block is free again (which of the two free blocks comes first
    # differs between backends: the other array's release may carry an event of its own).
    assert pool.stats().pending_bytes == 0
    again = [cv.pinned.empty((_odd_nbytes(),), np.uint8, device=device) for _ in range(2)]
    assert any(pinned.owner(a).block is block for a in again)
    del again


# -- registering existing memory in place --------------------------------------------------
def test_register_pins_in_place_for_the_with_block(device):
    array = np.arange(1000, dtype=np.float32)
    with cv.pinned.register(array, device=device) as registration:
        assert registration.array is array
        if device.backend == "opencl":  # NVIDIA's driver page-locks USE_HOST_PTR memory
            assert registration.page_locked is device.locks_host_ptr


def test_registered_array_copies_to_the_device(device):
    array = np.arange(1000, dtype=np.float32)
    result = np.zeros_like(array)
    block = device.memory_pool.acquire(array.nbytes)
    with cv.pinned.register(array, device=device), device.create_queue() as queue:
        copied_in = queue.copy_in(block, array)
        queue.copy_out(result, block, wait_for=[copied_in]).wait()
    device.memory_pool.release(block)
    np.testing.assert_array_equal(result, array)


@pytest.mark.parametrize(
    "bad", [np.arange(100.0)[::2], np.empty(0, np.float32), [1.0, 2.0]],
    ids=["strided", "empty", "list"],
)
def test_register_refuses_what_it_cannot_pin(device, bad):
    with pytest.raises(cv.InputError), cv.pinned.register(bad, device=device):
        pass


# -- fine-grained shared virtual memory ------------------------------------------------------
SCALE = """
__kernel void scale(__global const float *x, __global float *y, float a, ulong n) {
    size_t i = get_global_id(0);
    if (i < n) y[i] = a * x[i];
}
"""


@pytest.fixture
def svm_device(device):
    if not device.svm:
        pytest.skip(f"{device.spec} has no fine-grained SVM")
    return device


def test_svm_array_is_a_plain_ndarray_from_the_svm_pool(svm_device):
    array = cv.pinned.empty((256,), np.float32, device=svm_device, svm=True)
    assert type(array) is np.ndarray
    assert pinned.owner(array).pool is pinned.svm_pool(svm_device)
    del array


def test_kernel_reads_an_svm_array(svm_device):
    n = 1000
    source = cv.pinned.empty((n,), np.float32, device=svm_device, svm=True)
    source[:] = np.arange(n, dtype=np.float32)
    result = np.zeros(n, np.float32)
    kernel = compile_kernel(svm_device, SCALE, "scale", (), cache=None)
    out_block = svm_device.memory_pool.acquire(result.nbytes)
    with svm_device.create_queue() as queue:
        ran = queue.launch(kernel, n, [pinned.owner(source).block, out_block, 2.0, n])
        cv.pinned.record_use(source, ran)
        queue.copy_out(result, out_block, wait_for=[ran]).wait()
    svm_device.memory_pool.release(out_block)
    np.testing.assert_array_equal(result, 2.0 * np.arange(n, dtype=np.float32))
    del source


def test_svm_block_is_not_reused_while_fenced(svm_device):
    array = cv.pinned.empty((_odd_nbytes(),), np.uint8, device=svm_device, svm=True)
    block = pinned.owner(array).block
    gate = svm_device.user_event()
    cv.pinned.record_use(array, gate)
    del array
    gc.collect()
    try:
        other = cv.pinned.empty((_odd_nbytes(),), np.uint8, device=svm_device, svm=True)
        assert pinned.owner(other).block is not block
        del other
    finally:
        gate.set_complete()


def test_a_fence_on_the_copys_own_event_does_not_keep_the_array_alive(device):
    # The copy's event references the host array until waited on; the fence must not keep it.
    queue = device.create_queue()
    x = cv.pinned.empty((1024,), np.float32, device=device)
    buf = device.memory_pool.acquire(x.nbytes)
    try:
        event = queue.copy_in(buf, x)
        cv.pinned.record_use(x, event)
        del x, event
        queue.finish()
        gc.collect()
        assert device.pinned_pool.stats().in_use_bytes == 0
    finally:
        device.memory_pool.release(buf)
        queue.close()
