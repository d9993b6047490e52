"""The CUDA backend on a real GPU (skipped where cuda.core or a CUDA device is absent).

Run on the GPU machine with ``CONVEYOR_TEST_BACKENDS=cuda``. The DLPack capsule and option
parsing are also checked on the CPU, through NumPy, wherever the module imports.
"""

from __future__ import annotations

import ctypes
import gc
import time

import numpy as np
import pytest

import conveyor as cv
from conveyor.backends import cuda as cuda_backend
from conveyor.backends import cuda_array, cuda_events
from conveyor.errors import CompileError, InputError, OutOfMemoryError
from conveyor.kernels.signature import parse_params

AXPY = r"""
extern "C" __global__ void axpy(float* c, const float* a, const float* b, float alpha,
                                unsigned long long offset, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) c[i] = alpha * a[i] + b[i] + (float)offset;
}
"""


@pytest.fixture
def dev(gpu_device: cv.Device) -> cv.Device:
    """Each CUDA GPU; skipped where the GPU devices are OpenCL ones or there are none."""
    if gpu_device.backend != "cuda":
        pytest.skip("not a CUDA device")
    return gpu_device


def _kernel(dev: cv.Device, source: str, name: str):
    return dev.load_kernel(dev.build_binary(source, ()), name, (), parse_params(source, name))


def _pinned(dev: cv.Device, values: np.ndarray):
    """A pinned buffer holding ``values``, and the typed view of it."""
    buf = dev.alloc_pinned(values.nbytes)
    view = buf.array[: values.nbytes].view(values.dtype)
    view[:] = values
    return buf, view


# -- CPU-side: no GPU needed ---------------------------------------------------------------
def test_dlpack_capsule_round_trips_through_numpy():
    host = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    view = cuda_array.DeviceArray(host.ctypes.data, host.shape, host.dtype, (1, 0), None, host)
    back = np.from_dlpack(view)
    assert back.shape == host.shape and np.array_equal(back, host)
    del back
    gc.collect()
    assert not cuda_array._dl_alive


def test_unconsumed_dlpack_capsule_frees_itself():
    host = np.ones(4, np.int32)
    view = cuda_array.DeviceArray(host.ctypes.data, host.shape, host.dtype, (1, 0), None, host)
    capsule = view.__dlpack__()
    assert cuda_array._dl_alive
    del capsule
    gc.collect()
    assert not cuda_array._dl_alive


def test_unknown_compiler_option_is_an_input_error():
    pytest.importorskip("cuda.core")
    with pytest.raises(InputError, match="unsupported CUDA compiler option"):
        cuda_backend._program_options("90", ["-cl-fast-relaxed-math"])


def test_empty_define_reaches_nvrtc_as_empty():
    pytest.importorskip("cuda.core")
    options = cuda_backend._program_options("90", ["-DQ=", "-DR", "-DT=float"])
    assert options.define_macro == [("Q", ""), "R", ("T", "float")]


# -- on a CUDA GPU -------------------------------------------------------------------------
@pytest.mark.gpu
def test_device_info(dev):
    assert dev.spec.startswith("cuda:")
    assert dev.kind == "gpu" and dev.info.platform == "CUDA"
    assert dev.global_mem_bytes > 0 and dev.max_alloc_bytes == dev.global_mem_bytes
    assert dev.compute_units > 0
    assert "cuda" in dev.compiler_identity()


@pytest.mark.gpu
def test_round_trip_with_offsets(dev):
    data = np.arange(1000, dtype=np.float32)
    device_buf = dev.alloc_device(1 << 20)
    src, _ = _pinned(dev, data)
    dst = dev.alloc_pinned(data.nbytes)
    try:
        q = dev.create_queue()
        q.copy_in(device_buf, src.array[: data.nbytes], dst_offset=4096)
        ev = q.copy_out(dst.array, device_buf, src_offset=4096)
        ev.wait()
        assert ev.is_done()
        assert np.array_equal(dst.array.view(np.float32), data)
        q.close()
    finally:
        for b in (device_buf, src, dst):
            b.close()


@pytest.mark.gpu
def test_pageable_round_trip(dev):
    data = np.random.default_rng(0).random(12345).astype(np.float64)
    out = np.zeros_like(data)
    device_buf = dev.alloc_device(data.nbytes + 8)
    q = dev.create_queue()
    q.copy_in(device_buf, data, dst_offset=8)
    q.copy_out(out, device_buf, src_offset=8).wait()
    assert np.array_equal(out, data)
    q.close()
    device_buf.close()


@pytest.mark.gpu
def test_pinned_memory_is_recognised(dev):
    pinned = dev.alloc_pinned(1 << 16)
    pageable = np.zeros(1 << 16, np.uint8)
    assert dev._is_pinned(pinned.ptr, pinned.nbytes)
    assert not dev._is_pinned(pageable.ctypes.data, pageable.nbytes)
    with cv.pinned.register(pageable, device=dev):
        assert dev._is_pinned(pageable.ctypes.data, pageable.nbytes)
    pinned.close()


@pytest.mark.gpu
def test_own_pinned_buffers_are_known_without_the_driver_and_forgotten_when_freed(dev):
    pinned = dev.alloc_pinned(1 << 16)
    ptr = pinned.ptr
    assert dev._pinned_spans[ptr] == ptr + (1 << 16)
    assert dev._is_pinned(ptr + 4096, 8192)
    assert not dev._is_pinned(ptr + 4096, 1 << 16)  # runs past the end: the driver decides
    pinned.close()
    assert ptr not in dev._pinned_spans
    dropped = dev.alloc_pinned(1 << 16)
    ptr = dropped.ptr
    del dropped  # the finalizer frees it: the span must go with it
    gc.collect()
    assert ptr not in dev._pinned_spans


@pytest.mark.gpu
def test_command_events_are_recorded_again_once_dropped(dev):
    buf = dev.alloc_device(1 << 16)
    src, _ = _pinned(dev, np.ones(1 << 14, np.float32))
    q = dev.create_queue()
    kept = q.copy_in(buf, src.array)
    before = sum(len(s) for s in dev._events._spare)  # earlier tests' streams left some
    handles = set()
    for _ in range(200):  # each event dropped at once: the same few handles come back
        event = q.copy_in(buf, src.array)
        event.wait()
        handles.add((int(event.start), int(event.end)))
        del event
    assert len(handles) <= 4
    assert sum(len(s) for s in dev._events._spare) <= max(before, 2)
    later = q.copy_in(buf, src.array)
    q.finish()
    first, last = kept.profile_ns(), later.profile_ns()
    assert first is not None and last is not None
    assert first[0] <= first[1] <= last[0] <= last[1]  # kept's events were never re-recorded
    assert kept.is_done() and later.is_done()
    q.close()
    src.close()
    buf.close()


@pytest.mark.gpu
def test_the_spare_events_are_bounded(dev):
    """A trace keeps every block's Event until the stream ends: thousands at once. The pool
    keeps a bounded number of them after, and destroys the rest."""
    buf = dev.alloc_device(1 << 12)
    src, _ = _pinned(dev, np.ones(1 << 10, np.float32))
    q = dev.create_queue()
    events = [q.copy_in(buf, src.array) for _ in range(1500)]
    q.finish()
    del events
    gc.collect()
    assert all(len(s) <= cuda_events._MAX_SPARE for s in dev._events._spare)
    q.copy_in(buf, src.array).wait()  # the pool still serves
    q.close()
    src.close()
    buf.close()


@pytest.mark.gpu
def test_a_command_that_fails_to_enqueue_gives_its_start_event_back(dev):
    """A launch the driver refuses (2048 threads per block) after its start event was
    recorded: that event went to no Event, so it was never returned to the pool."""
    k = _kernel(dev, AXPY, "axpy")
    bufs = [dev.alloc_device(1024 * 4) for _ in range(3)]
    q = dev.create_queue()
    q.launch(k, 1024, [bufs[0], bufs[1], bufs[2], 1, 0, 1024]).wait()  # spares exist now
    gc.collect()
    before = [len(s) for s in dev._events._spare]
    assert before[0] >= 1
    for _ in range(5):
        with pytest.raises(cv.BackendError, match="cuLaunchKernel"):
            q.launch(k, 4096, [bufs[0], bufs[1], bufs[2], 1, 0, 4096], local_size=2048)
    assert [len(s) for s in dev._events._spare] == before
    q.launch(k, 1024, [bufs[0], bufs[1], bufs[2], 1, 0, 1024]).wait()  # the queue still works
    q.close()
    for buf in bufs:
        buf.close()


def test_an_event_given_back_while_the_pool_closes_is_destroyed_not_kept():
    """give() checked ``closed``, close() drained the spares, then give() appended: an event
    kept for ever. Here the race is forced: close() runs between give's check and its
    append (a list that closes the pool when appended to). No driver call is needed to see
    it; the events are stand-ins that destroying ignores (cuEventDestroy fails quietly)."""
    pool = cuda_events.EventPool()

    class Closing(list):
        def append(self, item):
            pool.close()  # as another thread's close() would, just before this append lands
            super().append(item)

    pool._spare = (Closing(), [])
    pool.give(object(), False)
    assert pool._spare == ([], [])
    pool.give(object(), True)
    assert pool._spare == ([], [])


@pytest.mark.gpu
def test_pageable_copy_in_behind_a_user_event_does_not_block(dev):
    data = np.arange(1 << 16, dtype=np.float32)
    expected = data.copy()
    back = np.zeros_like(data)
    buf = dev.alloc_device(data.nbytes)
    q = dev.create_queue()
    gate = dev.user_event()
    copied = q.copy_in(buf, data, wait_for=[gate])  # returns at once: staged through pinned
    data[:] = -1  # the source may be reused as soon as copy_in returns
    assert not copied.is_done()
    gate.set_complete()
    q.copy_out(back, buf, wait_for=[copied]).wait()
    assert np.array_equal(back, expected)
    q.close()
    buf.close()


@pytest.mark.gpu
def test_copies_check_their_inputs(dev):
    device_buf = dev.alloc_device(64)
    q = dev.create_queue()
    with pytest.raises(InputError):
        q.copy_in(device_buf, np.zeros((4, 4), np.float32)[:, ::2])
    with pytest.raises(InputError):
        q.copy_in(device_buf, np.zeros(32, np.float32))
    q.close()
    device_buf.close()


@pytest.mark.gpu
def test_launch_vadd_with_scalar_casting(dev):
    n = 1000
    a = np.arange(n, dtype=np.float32)
    b = np.full(n, 0.5, np.float32)
    k = _kernel(dev, AXPY, "axpy")
    bufs = [dev.alloc_device(n * 4) for _ in range(3)]
    out = np.zeros(n, np.float32)
    q = dev.create_queue()
    q.copy_in(bufs[1], a)
    q.copy_in(bufs[2], b)
    q.launch(k, n, [bufs[0], bufs[1], bufs[2], 2, 7, n])  # Python ints cast to float/u64
    q.copy_out(out, bufs[0]).wait()
    assert np.allclose(out, 2 * a + b + 7)
    q.close()
    for buf in bufs:
        buf.close()


@pytest.mark.gpu
def test_wait_for_across_queues_and_fill(dev):
    n = 4096
    buf = dev.alloc_device(n)
    fill_q, copy_q = dev.create_queue(), dev.create_queue()
    filled = fill_q.fill(buf, 7, n)
    out = np.zeros(n, np.uint8)
    copy_q.copy_out(out, buf, wait_for=[filled]).wait()
    assert (out == 7).all()
    done = copy_q.marker(wait_for=[filled])
    done.wait()
    for q in (fill_q, copy_q):
        q.close()
    buf.close()


@pytest.mark.gpu
def test_profile_ns_is_monotone(dev):
    buf = dev.alloc_device(1 << 22)
    src, _ = _pinned(dev, np.ones(1 << 20, np.float32))
    q = dev.create_queue()
    events = [q.copy_in(buf, src.array), q.fill(buf, 0, 1 << 22), q.copy_in(buf, src.array)]
    q.finish()
    stamps = [ev.profile_ns() for ev in events]
    assert all(s is not None for s in stamps)
    flat = [t for pair in stamps for t in pair]
    assert flat == sorted(flat)
    assert stamps[0][1] > stamps[0][0]  # 4 MiB takes more than a nanosecond
    q.close()
    src.close()
    buf.close()


@pytest.mark.gpu
def test_user_event_gates_a_copy(dev):
    data = np.arange(256, dtype=np.int32)
    src, _ = _pinned(dev, data)
    dst = dev.alloc_pinned(data.nbytes)
    buf = dev.alloc_device(data.nbytes)
    q = dev.create_queue()
    gate = dev.user_event()
    copied = q.copy_in(buf, src.array[: data.nbytes], wait_for=[gate])
    back = q.copy_out(dst.array[: data.nbytes], buf)
    time.sleep(0.05)
    assert not gate.is_done() and not copied.is_done() and not back.is_done()
    gate.set_complete()
    back.wait()
    assert gate.is_done()
    assert np.array_equal(dst.array[: data.nbytes].view(np.int32), data)
    q.close()
    for b in (src, dst, buf):
        b.close()


@pytest.mark.gpu
def test_dropped_user_event_opens_its_gate(dev):
    buf = dev.alloc_device(64)
    q = dev.create_queue()
    gate = dev.user_event()
    filled = q.fill(buf, 1, 64, wait_for=[gate])
    del gate
    gc.collect()
    filled.wait()
    q.close()
    buf.close()


@pytest.mark.gpu
def test_register_host_page_locks_in_place(dev):
    data = np.arange(1 << 18, dtype=np.float32)
    out = np.zeros_like(data)
    buf = dev.alloc_device(data.nbytes)
    q = dev.create_queue()
    with cv.pinned.register(data, device=dev) as reg, cv.pinned.register(out, device=dev):
        assert reg.page_locked
        q.copy_in(buf, data)
        q.copy_out(out, buf).wait()
    assert np.array_equal(out, data)
    q.close()
    buf.close()


@pytest.mark.gpu
def test_absurd_allocation_is_out_of_memory(dev):
    with pytest.raises(OutOfMemoryError):
        dev.alloc_device(4 * dev.global_mem_bytes)


@pytest.mark.gpu
def test_compile_error_carries_the_log(dev):
    with pytest.raises(CompileError) as info:
        dev.build_binary('extern "C" __global__ void broken(float* x) { x[0] = y; }', ())
    assert "y" in info.value.log


@pytest.mark.gpu
def test_a_missing_kernel_is_an_input_error_listing_the_module_s(dev):
    """As OpenCL says it (round twenty-two): the kernels the module holds."""
    binary = dev.build_binary(AXPY, ("-DUNUSED=1",))
    with pytest.raises(InputError, match="no kernel named 'nope'.*kernels found"):
        dev.load_kernel(binary, "nope", (), ())


def _device_array(dev, values: np.ndarray):
    buf = dev.alloc_device(values.nbytes)
    q = dev.create_queue()
    q.copy_in(buf, values).wait()
    return buf, q, dev.device_array(buf, values.shape, values.dtype, q)


@pytest.mark.gpu
def test_device_array_interface(dev):
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    buf, q, view = _device_array(dev, values)
    cai = view.__cuda_array_interface__
    assert cai["version"] == 3 and cai["shape"] == (3, 4) and cai["typestr"] == "<f4"
    assert cai["stream"] == q.handle and view.__dlpack_device__() == (2, int(dev.spec[5:]))
    q.close()
    buf.close()


@pytest.mark.gpu
def test_device_array_with_cupy(dev):
    cp = pytest.importorskip("cupy")
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    buf, q, view = _device_array(dev, values)
    arr = cp.asarray(view)
    assert arr.shape == (3, 4)
    assert np.array_equal(cp.asnumpy(arr * 2), values * 2)
    via_dlpack = cp.from_dlpack(view)
    assert np.array_equal(cp.asnumpy(via_dlpack), values)
    del arr, via_dlpack
    cp.cuda.Device().synchronize()
    q.close()
    buf.close()


@pytest.mark.gpu
def test_device_array_with_torch(dev):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    values = np.arange(10, dtype=np.int64)
    buf, q, view = _device_array(dev, values)
    tensor = torch.from_dlpack(view)
    assert tensor.is_cuda and tuple(tensor.shape) == (10,)
    tensor += 1  # writes land in conveyor's buffer
    torch.cuda.synchronize()
    out = np.zeros_like(values)
    q.copy_out(out, buf).wait()
    assert np.array_equal(out, values + 1)
    del tensor
    q.close()
    buf.close()


@pytest.mark.gpu
def test_device_array_with_numba(dev):
    numba_cuda = pytest.importorskip("numba.cuda")
    values = np.linspace(0, 1, 64, dtype=np.float64)
    buf, q, view = _device_array(dev, values)
    arr = numba_cuda.as_cuda_array(view)
    assert np.array_equal(arr.copy_to_host(), values)
    del arr
    q.close()
    buf.close()


@pytest.mark.gpu
def test_fork_after_init_gives_a_clear_error_in_the_child(dev):
    import os

    dev.alloc_device(16).close()  # the backend is initialised in this (parent) process
    pid = os.fork()
    if pid == 0:  # the child: any CUDA use must fail with the fix, not hang or crash
        code = 1
        try:
            dev.alloc_device(16)
        except cv.BackendError as exc:
            code = 0 if "spawn" in str(exc) and "forked" in str(exc) else 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    dev.alloc_device(16).close()  # the parent is unaffected


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["register", "driver"])
def test_large_pinned_blocks_are_registered_memory_and_copy_exactly(dev, monkeypatch, mode):
    """Issue 17: pinned blocks of 4 MiB or more page-lock anonymous memory faulted in on
    several threads (CONVEYOR_PINNED_ALLOC=driver: cuMemHostAlloc); both copy exactly and
    both count as page-locked."""
    monkeypatch.setenv("CONVEYOR_PINNED_ALLOC", mode)
    nbytes = 8 * 2**20 + 12
    values = np.arange(nbytes // 4, dtype=np.float32)
    buf, view = _pinned(dev, values)
    try:
        assert isinstance(buf, cuda_backend.RegisteredPinned) is (mode == "register")
        assert dev._is_pinned(buf.array.ctypes.data, nbytes)
        q = dev.create_queue()
        dbuf = dev.alloc_device(values.nbytes)
        out = np.empty_like(values)
        q.copy_in(dbuf, view).wait()
        q.copy_out(out, dbuf).wait()
        assert np.array_equal(out, values)
        q.close()
        dbuf.close()
    finally:
        buf.close()
    small = dev.alloc_pinned(4096)  # below 4 MiB: the driver's allocation
    assert not isinstance(small, cuda_backend.RegisteredPinned)
    small.close()


@pytest.mark.gpu
def test_kept_arrays_are_page_locked_and_stream_exactly(dev):
    """Issue 17: cv.keep_pinned page-locks a pageable array (cuMemHostRegister) and streams
    of it take the direct path."""
    a = np.arange(1 << 20, dtype=np.float32)
    try:
        assert cv.keep_pinned(a, device=dev)
        assert dev._is_pinned(a.ctypes.data, a.nbytes)
        kernel = dev.compile(cv.portable("""
__kernel void twice(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}"""), "twice")
        y = np.empty_like(a)
        cv.stream(kernel, [a], [y], device=dev, block_bytes=2**20)
        assert np.array_equal(y, 2 * a)
    finally:
        cv.release_pinned()


class _DriverPinned:
    """Page-locked memory conveyor did not allocate (cuMemHostAlloc called directly, as CuPy's
    ``empty_pinned`` and PyTorch's ``pin_memory()`` do), as a float32 NumPy array."""

    def __init__(self, dev: cv.Device, n: int, flags: int = 0) -> None:
        from conveyor.backends.cuda_driver import driver

        dev._current()
        err, ptr = driver.cuMemHostAlloc(n * 4, flags)
        assert int(err) == 0, err
        self.ptr, self.driver = int(ptr), driver
        buffer = (ctypes.c_char * (n * 4)).from_address(self.ptr)
        self.array = np.frombuffer(buffer, np.float32)

    def close(self) -> None:
        self.array = None
        (err,) = self.driver.cuMemFreeHost(self.ptr)
        assert int(err) == 0, err


@pytest.mark.gpu
def test_page_locked_memory_of_other_libraries_is_recognised(dev):
    foreign = _DriverPinned(dev, 1 << 16)
    try:
        assert dev.page_locked(foreign.array)
        assert not dev.page_locked(foreign.array[::2])  # not contiguous: no direct copy
        assert not dev.page_locked(foreign.array[:0])
        pageable = np.zeros(1 << 16, np.float32)
        assert not dev.page_locked(pageable)
        with cv.pinned.register(pageable, device=dev):
            assert dev.page_locked(pageable)  # registered by the caller
        assert not dev.page_locked(pageable)
    finally:
        foreign.close()


@pytest.mark.gpu
@pytest.mark.parametrize("flags", [0, 0x01], ids=["default", "portable"])
def test_page_locked_arrays_of_other_libraries_stream_direct(dev, flags):
    """Session 11: CuPy's and PyTorch's pinned arrays were staged through conveyor's pinned
    ring like pageable ones (half the rate); they are copied directly now, exactly."""
    n = 3 << 18
    a, b, out = (_DriverPinned(dev, n, flags) for _ in range(3))
    try:
        a.array[:] = np.arange(n, dtype=np.float32)
        b.array[:] = 1.5
        kernel = dev.compile(cv.portable("""
__kernel void add(__global const float *x, __global const float *y, __global float *z,
                  ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) z[i] = x[i] + y[i];
}"""), "add")
        report = cv.stream(kernel, [a.array, b.array], [out.array], device=dev,
                           block_bytes=2**20)
        assert np.array_equal(out.array, a.array + 1.5)
        lanes = report.timeline.lanes
        assert "stage-in" not in lanes and "stage-out" not in lanes, lanes
        assert "copy-in" in lanes and "copy-out" in lanes
    finally:
        for memory in (a, b, out):
            memory.close()


@pytest.mark.gpu
def test_keep_pinned_of_memory_locked_elsewhere_registers_nothing(dev):
    foreign = _DriverPinned(dev, 1 << 16)
    try:
        from conveyor.memory import keep

        before = keep.kept_bytes()
        assert cv.keep_pinned(foreign.array, device=dev)  # was False: the driver refused
        assert keep.kept_bytes() == before  # nothing registered, nothing counted
    finally:
        foreign.close()


@pytest.mark.gpu
def test_memory_registered_read_only_is_staged_as_an_output(dev):
    """An output the caller registered read-only with the driver went direct, and the copy
    failed with ``cuMemcpyDtoHAsync: invalid argument`` (round nine): such memory is an input
    the device copies directly, and an output staged like pageable memory."""
    from conveyor.backends.cuda_driver import driver

    n = 1 << 18
    out = np.zeros(n + 1024, np.float32)[1024:]  # a host range of its own to register
    dev._current()
    (err,) = driver.cuMemHostRegister(out.ctypes.data, out.nbytes, 0x08)  # READ_ONLY
    if int(err) != 0:
        pytest.skip(f"cuMemHostRegister(READ_ONLY) refused here: {err}")
    try:
        assert dev.page_locked(out) and not dev.page_locked(out, written=True)
        foreign = _DriverPinned(dev, 1 << 10)
        try:
            assert dev.page_locked(foreign.array, written=True)  # cuMemHostAlloc: writable
        finally:
            foreign.close()
        a = np.arange(n, dtype=np.float32)
        kernel = dev.compile(cv.portable("""
__kernel void twice(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2 * x[i];
}"""), "twice")
        report = cv.stream(kernel, [a], [out], device=dev, block_bytes=2**18)
        assert np.array_equal(out, 2 * a)
        assert "stage-out" in report.timeline.lanes
    finally:
        (err,) = driver.cuMemHostUnregister(out.ctypes.data)
        assert int(err) == 0, err
