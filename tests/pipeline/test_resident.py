"""Resident arrays (issue 14 item 1): tables in ``args=`` where the kernel declares a pointer,
uploaded once, passed to every launch, counted against the memory limit; ``cv.resident``
handles kept across streams, evicted by the pool only while unused."""

from __future__ import annotations

import numpy as np
import pytest
from streamkit import in_use

import conveyor as cv
from conveyor.errors import InputError
from conveyor.pipeline import resident as resident_module

N = 10_000
LOOKUP = cv.portable("""
__kernel void lookup(__global const uint *x, __global float *y, __global const float *table,
                     uint size, float scale, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = table[x[i] % size] * scale + (float)((offset + i) % 3);
}
""")
COUNT = cv.portable("""
__kernel void count(__global const uint *x, __global uint *y, __global uint *hits, uint size,
                    ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { y[i] = x[i]; if (offset + i < size) hits[offset + i] += x[i]; }
}
""")


def _reference(x, table, scale):
    index = np.arange(len(x)) % 3
    return (table[x % len(table)] * np.float32(scale) + index.astype(np.float32)).astype(
        np.float32)


def _data(seed=1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**32, N, dtype=np.uint32), rng.random(777).astype(np.float32)


def _uploads(monkeypatch) -> list[int]:
    """Count the uploads of resident tables (wrapping the real Resident.use)."""
    uploads: list[int] = []
    real = resident_module.Resident.use

    def use(self, device, queue):
        if self.buffer is None:
            uploads.append(self.nbytes)
        return real(self, device, queue)

    monkeypatch.setattr(resident_module.Resident, "use", use)
    return uploads


@pytest.mark.parametrize("zero_copy", [False, None])
def test_an_array_in_args_is_uploaded_once_and_passed_to_every_launch(device, monkeypatch,
                                                                    zero_copy):
    k = device.compile(LOOKUP, "lookup")
    x, table = _data()
    y = np.zeros(N, np.float32)
    uploads = _uploads(monkeypatch)
    report = cv.stream(k, [x], [y], args=(table, len(table), 0.5), device=device,
                       block_bytes=4000, zero_copy=zero_copy)
    assert report.blocks > 1 and uploads == [table.nbytes]
    np.testing.assert_array_equal(y, _reference(x, table, 0.5))
    assert in_use(device) == (0, 0)


def test_constant_address_space_works(device):
    if device.backend != "opencl":
        pytest.skip("__constant parameters are OpenCL C")
    source = LOOKUP.replace("__global const float *table", "__constant float *table")
    k = device.compile(source, "lookup")
    x, table = _data(2)
    y = np.zeros(N, np.float32)
    cv.stream(k, [x], [y], args=(table, len(table), 2.0), device=device, block_bytes=4000)
    np.testing.assert_array_equal(y, _reference(x, table, 2.0))


def test_a_handle_stays_on_the_device_across_streams(device, monkeypatch):
    k = device.compile(LOOKUP, "lookup")
    x, table = _data(3)
    uploads = _uploads(monkeypatch)
    with cv.resident(table) as handle:
        for scale in (1.0, 4.0):
            y = np.zeros(N, np.float32)
            cv.stream(k, [x], [y], args=(handle, len(table), scale), device=device,
                      block_bytes=4000)
            np.testing.assert_array_equal(y, _reference(x, table, scale))
        assert uploads == [table.nbytes] and handle.buffer is not None
    assert handle.buffer is None and in_use(device) == (0, 0)


def test_a_writable_handle_is_copied_back_and_a_plain_array_refused(device):
    k = device.compile(COUNT, "count")
    x = np.arange(N, dtype=np.uint32) % 5
    hits = np.zeros(64, np.uint32)
    with pytest.raises(InputError, match=r"args\[0\].*'hits'.*not const.*writable=True"):
        cv.stream(k, [x], [np.zeros_like(x)], args=(hits, 64), device=device)
    with cv.resident(hits, writable=True) as handle:
        cv.stream(k, [x], [np.zeros_like(x)], args=(handle, 64), device=device,
                  block_bytes=100)
    np.testing.assert_array_equal(hits, x[:64])


def test_a_writable_table_is_the_host_arrays_between_streams(device):
    # A failed stream's partial writes stayed on the device, and a host reset between streams
    # was ignored: the next stream added onto the device's copy (found by trying it).
    k = device.compile(COUNT, "count")
    x = np.arange(N, dtype=np.uint32) % 5
    hits = np.zeros(64, np.uint32)

    def chunks(fail):
        for start in range(0, N, 1000):
            if fail and start >= 5000:
                raise OSError("disk read failed")
            yield x[start:start + 1000]

    with cv.resident(hits, writable=True) as handle:
        with pytest.raises(OSError, match="disk read failed"):
            cv.stream(k, [cv.iterate(chunks(True), length=N)], [np.uint32],
                      args=(handle, 64), device=device, block_bytes=400)
        assert (hits == 0).all()  # not copied back after a failure
        cv.stream(k, [cv.iterate(chunks(False), length=N)], [np.uint32], args=(handle, 64),
                  device=device, block_bytes=400)
        np.testing.assert_array_equal(hits, x[:64])  # the failed stream's writes are gone
        hits[:] = 7  # the host resets the table: the next stream starts from it
        cv.stream(k, [x], [np.zeros_like(x)], args=(handle, 64), device=device,
                  block_bytes=400)
        np.testing.assert_array_equal(hits, x[:64] + 7)
    assert in_use(device) == (0, 0)


def test_refresh_uploads_a_changed_read_only_table(device, monkeypatch):
    k = device.compile(LOOKUP, "lookup")
    x, table = _data(6)
    uploads = _uploads(monkeypatch)
    with cv.resident(table) as handle:
        y = np.zeros(N, np.float32)
        cv.stream(k, [x], [y], args=(handle, len(table), 1.0), device=device, block_bytes=4000)
        table *= 2
        handle.refresh()
        cv.stream(k, [x], [y], args=(handle, len(table), 1.0), device=device, block_bytes=4000)
        np.testing.assert_array_equal(y, _reference(x, table, 1.0))
        assert uploads == [table.nbytes, table.nbytes]


def test_bad_resident_arguments_are_input_errors_before_any_work(device):
    k = device.compile(LOOKUP, "lookup")
    x, table = _data(4)
    y = np.full(N, 7, np.float32)
    cases = [
        ((1.0, len(table), 0.5), r"'table' is a pointer .* receives float"),  # no array
        ((table, table, 0.5), r"args\[1\].*'size'.*not a scalar"),  # an array for a scalar
        ((table, cv.resident(table), 0.5), r"'size' is a scalar .* resident array"),
        ((table.astype(np.float64), 7, 0.5), r"'table'.*float32.*float64"),
    ]
    for args, message in cases:
        with pytest.raises(InputError, match=message):
            cv.stream(k, [x], [y], args=args, device=device)
    assert (y == 7).all() and in_use(device) == (0, 0)


def test_a_table_larger_than_the_memory_limit_is_an_input_error(device):
    k = device.compile(LOOKUP, "lookup")
    x, _ = _data(5)
    table = np.zeros(2**20, np.float32)
    with pytest.raises(InputError, match=r"resident arrays .* 4194304 device bytes.*memory_limit"):
        cv.stream(k, [x], [np.zeros(N, np.float32)], args=(table, 7, 1.0), device=device,
                  memory_limit=2**20)
    assert in_use(device) == (0, 0)


def test_the_plan_counts_the_table_against_the_limit(device):
    k = device.compile(LOOKUP, "lookup")
    x, _ = _data(6)
    y = np.zeros(N, np.float32)
    table = np.ones(2**16, np.float32)  # 256 KiB
    alone = cv.stream(k, [x], [y], args=(table[:4], 4, 1.0), device=device,
                      memory_limit=320 * 1024)
    beside = cv.stream(k, [x], [y], args=(table, 4, 1.0), device=device,
                       memory_limit=320 * 1024)
    assert beside.block_rows < alone.block_rows
    assert beside.peak_device_bytes <= 320 * 1024


def test_the_pools_ladder_evicts_only_unused_handles(device):
    x, table = _data(7)
    pool = device.memory_pool
    handle = cv.resident(np.ones(2**18, np.float32), device=device)  # 1 MiB, uploaded now
    assert handle.buffer is not None
    saved = pool.limit
    try:
        pool.trim()
        pool.limit = pool.stats().in_use_bytes + 2**19  # no room for 1 MiB more beside it
        handle.users += 1  # as while a stream uses it
        with pytest.raises(cv.OutOfMemoryError):
            pool.acquire(2**20)
        assert handle.buffer is not None
        handle.users -= 1
        block = pool.acquire(2**20)  # the ladder gives the idle table back
        assert handle.buffer is None
        pool.release(block)
    finally:
        pool.limit = saved
    k = device.compile(LOOKUP, "lookup")
    y = np.zeros(N, np.float32)
    cv.stream(k, [x], [y], args=(handle, 2**18, 1.0), device=device)  # uploaded again
    np.testing.assert_array_equal(y, _reference(x, np.ones(2**18, np.float32), 1.0))
    handle.close()
    with pytest.raises(InputError, match="closed"):
        cv.stream(k, [x], [y], args=(handle, 4, 1.0), device=device)


def test_a_device_array_in_args_is_passed_as_it_is(device, monkeypatch):
    k = device.compile(LOOKUP, "lookup")
    x, table = _data(8)
    y = np.zeros(N, np.float32)
    if device.backend == "opencl":
        import pyopencl as cl
        import pyopencl.array as cl_array

        queue = cl.CommandQueue(device.context)
        on_device = cl_array.to_device(queue, table)
        queue.finish()
    else:  # CUDA: anything with __cuda_array_interface__ (CuPy here)
        cupy = pytest.importorskip("cupy")
        on_device = cupy.asarray(table)
        cupy.cuda.runtime.deviceSynchronize()
    uploads = _uploads(monkeypatch)
    cv.stream(k, [x], [y], args=(on_device, len(table), 0.5), device=device, block_bytes=4000)
    assert uploads == []
    np.testing.assert_array_equal(y, _reference(x, table, 0.5))
