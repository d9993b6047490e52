"""Python callables on CUDA whose work is not on conveyor's stream (backends/cuda_order.py).

The README has callables enqueue on ``queue``; code written for CuPy or PyTorch without it
runs on the library's current stream (CUDA's legacy default stream), which conveyor's
non-blocking streams do not wait for. Each test delays the callable's work with a spin
kernel first, so that a copy or read that does not wait for it reads the block early. They
need a CUDA GPU and CuPy (PyTorch for its own test) and skip elsewhere. On OpenCL a callable's
PyOpenCL arrays carry conveyor's queue, and PyOpenCL refuses an operation on them with another
queue, so none of this applies.
"""

from __future__ import annotations

import numpy as np
import pytest
from streamkit import _cupy_stream

import conveyor as cv

pytestmark = pytest.mark.gpu

ROWS = 1 << 20  # 4 MiB of float32: 16 blocks of 256 KiB
BLOCK = 1 << 18
CYCLES = 2_000_000  # about a millisecond of one thread's spinning on an H100

SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}
"""


@pytest.fixture
def cuda_device(gpu_device):
    if gpu_device.backend != "cuda":
        pytest.skip("a CUDA device's streams")
    pytest.importorskip("cupy")
    return gpu_device


def _spin():
    """Delay the work after it on CuPy's current stream by about a millisecond."""
    import cupy

    kernel = cupy.RawKernel(SPIN, "spin")
    kernel((1,), (1,), (np.int64(CYCLES),))


def _data():
    return np.random.default_rng(7).random(ROWS, dtype=np.float32)


def test_an_array_returned_from_cupys_default_stream_is_waited_for(cuda_device):
    import cupy

    def double(x, y, *, queue, offset, n):  # no stream given: CuPy's default stream
        _spin()
        return cupy.asarray(x) * 2

    x = _data()
    y = np.zeros_like(x)
    cv.stream(double, [x], [y], device=cuda_device, block_bytes=BLOCK)
    np.testing.assert_array_equal(y, x * 2)


def test_an_output_written_on_cupys_default_stream_is_waited_for(cuda_device):
    import cupy

    def triple(x, y, *, queue, offset, n):
        _spin()
        cupy.asarray(y)[...] = cupy.asarray(x) * 3

    x = _data()
    y = np.zeros_like(x)
    cv.stream(triple, [x], [y], device=cuda_device, block_bytes=BLOCK)
    np.testing.assert_array_equal(y, x * 3)


def test_a_partial_computed_on_conveyors_stream_is_read_after_its_work(cuda_device):
    import cupy

    # The partial's get() runs outside the stream context, on CuPy's default stream: on the
    # H100 it read the sum early under load only (5 runs of 12 beside OpenCL tests on the
    # code before the fix, none alone), so this test catches the race now and then.
    def total(x, *, queue, offset, n):  # as the README has it, then get() outside
        with _cupy_stream(queue):
            _spin()
            return cupy.asarray(x).sum(dtype=cupy.float64)

    x = _data()
    got = cv.stream(total, [x], [], device=cuda_device, block_bytes=BLOCK, reduce="sum").result
    assert got == pytest.approx(float(x.sum(dtype=np.float64)), rel=1e-9)


def test_a_chain_link_on_cupys_default_stream_is_waited_for(cuda_device):
    import cupy

    def double(x, t, *, queue, offset, n):
        _spin()
        return cupy.asarray(x) * 2

    def plus_one(t, y, *, queue, offset, n):
        with _cupy_stream(queue):
            return cupy.asarray(t) + 1

    x = _data()
    y = np.zeros_like(x)
    chain = cv.chain(cv.link(double, reads="in0", writes="t"),
                     cv.link(plus_one, reads="t", writes="out0"),
                     temps={"t": np.float32})
    cv.stream(chain, [x], [y], device=cuda_device, block_bytes=BLOCK)
    np.testing.assert_array_equal(y, x * 2 + 1)


def test_a_cupy_stream_made_current_by_the_user_is_waited_for(cuda_device):
    import cupy

    def double(x, y, *, queue, offset, n):
        _spin()
        return cupy.asarray(x) * 2

    x = _data()
    y = np.zeros_like(x)
    with cupy.cuda.Stream(non_blocking=True):  # the callable's work goes on this stream
        cv.stream(double, [x], [y], device=cuda_device, block_bytes=BLOCK)
    np.testing.assert_array_equal(y, x * 2)


def test_a_tensor_returned_from_pytorchs_default_stream_is_waited_for(cuda_device):
    torch = pytest.importorskip("torch")

    def double(x, y, *, queue, offset, n):
        torch.cuda._sleep(CYCLES)
        return torch.from_dlpack(x) * 2

    x = _data()
    y = np.zeros_like(x)
    cv.stream(double, [x], [y], device=cuda_device, block_bytes=BLOCK)
    np.testing.assert_array_equal(y, x * 2)
