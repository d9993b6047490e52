"""A Numba CUDA kernel as conveyor's compute stage, on conveyor's stream: y = sqrt(x) * 2.

Numba compiles at a kernel's first call, and loading a module waits for the GPU to go idle, so
the kernel is compiled (called once on a tiny array) before the stream starts.

    python examples/cuda_numba.py         # needs a CUDA GPU, numba-cuda and conveyor[cuda]
"""

from __future__ import annotations

import math
import sys

import numpy as np

import conveyor as cv


def make_kernel():
    from numba import cuda

    @cuda.jit
    def sqrt2(x, y):
        i = cuda.grid(1)
        if i < x.size:
            y[i] = math.sqrt(x[i]) * 2

    warm = cuda.to_device(np.ones(1, np.float32))
    sqrt2[1, 32](warm, warm)  # compile and load now, not while blocks are in flight
    cuda.synchronize()
    return sqrt2


def main() -> int:
    try:
        dev = cv.device("cuda")
    except cv.InputError as exc:
        print(f"this example needs a CUDA GPU: {exc}", file=sys.stderr)
        return 1
    from numba import cuda

    sqrt2 = make_kernel()

    def compute(x, y, *, queue, offset, n):
        stream = cuda.external_stream(int(queue.handle))
        sqrt2[-(-n // 256), 256, stream](cuda.as_cuda_array(x), cuda.as_cuda_array(y))

    x = np.random.default_rng(0).random(2**26, dtype=np.float32)
    y = np.empty_like(x)
    report = cv.stream(compute, [x], [y], device=dev, block_bytes=16 * 2**20)
    print(report)
    print("matches NumPy:", bool(np.allclose(y, np.sqrt(x) * 2, rtol=1e-6)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
