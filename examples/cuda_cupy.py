"""A Python compute stage with CuPy on conveyor's CUDA stream: y = sqrt(x) * 2.

conveyor hands each block's device arrays (``__cuda_array_interface__`` with the stream) and
its stream; CuPy computes on them in place, on that stream, with no copy.

    python examples/cuda_cupy.py          # needs a CUDA GPU, cupy and conveyor[cuda]
"""

from __future__ import annotations

import sys

import numpy as np

import conveyor as cv


def compute(x, y, *, queue, offset, n):
    import cupy as cp

    with cp.cuda.Stream.from_external(queue):  # conveyor's stream (the CUDA stream protocol)
        cp.multiply(cp.sqrt(cp.asarray(x)), 2, out=cp.asarray(y))


def main() -> int:
    try:
        dev = cv.device("cuda")
    except cv.InputError as exc:
        print(f"this example needs a CUDA GPU: {exc}", file=sys.stderr)
        return 1
    x = np.random.default_rng(0).random(2**26, dtype=np.float32)
    y = np.empty_like(x)
    # CuPy compiles its elementwise kernels at first use, and a module load waits for the GPU to go
    # idle: warm up on a few rows first, so no load lands while blocks are in flight.
    cv.stream(compute, [x[:1024]], [y[:1024]], device=dev)
    report = cv.stream(compute, [x], [y], device=dev, block_bytes=16 * 2**20)
    print(report)
    print("matches NumPy:", bool(np.allclose(y, np.sqrt(x) * 2, rtol=1e-6)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
