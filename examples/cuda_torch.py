"""A Python compute stage with PyTorch on conveyor's CUDA stream: y = sqrt(x) * 2.

``torch.from_dlpack`` takes each block's device arrays without a copy; the work runs on
conveyor's stream through ``torch.cuda.ExternalStream``.

    python examples/cuda_torch.py         # needs a CUDA GPU, torch and conveyor[cuda]
"""

from __future__ import annotations

import sys

import numpy as np

import conveyor as cv


def compute(x, y, *, queue, offset, n):
    import torch

    with torch.cuda.stream(torch.cuda.ExternalStream(int(queue.handle))):
        torch.mul(torch.from_dlpack(x).sqrt(), 2, out=torch.from_dlpack(y))


def main() -> int:
    try:
        dev = cv.device("cuda")
    except cv.InputError as exc:
        print(f"this example needs a CUDA GPU: {exc}", file=sys.stderr)
        return 1
    x = np.random.default_rng(0).random(2**26, dtype=np.float32)
    y = np.empty_like(x)
    # PyTorch initialises CUDA and loads its kernels at first use, and a module load waits for
    # the GPU to go idle: warm up on a few rows first, so no load lands while blocks are in
    # flight.
    cv.stream(compute, [x[:1024]], [y[:1024]], device=dev)
    report = cv.stream(compute, [x], [y], device=dev, block_bytes=16 * 2**20)
    print(report)
    print("matches NumPy:", bool(np.allclose(y, np.sqrt(x) * 2, rtol=1e-6)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
