"""A 5-point 1-D stencil with halo=2: every block sees two extra rows each side.

Rows past either end of the array repeat the edge row, so the reference is NumPy on
np.pad(x, 2, mode="edge").

    python examples/stencil.py [--mib 256] [--device SPEC]
"""

from __future__ import annotations

import argparse

import numpy as np

import conveyor as cv

SOURCE = cv.portable("""
__kernel void smooth5(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);   /* element i of the block is x[i + 2] */
    if (i < n) y[i] = (x[i] + x[i + 1] + x[i + 2] + x[i + 3] + x[i + 4]) * 0.2f;
}
""")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--device", default=None)
    options = parser.parse_args()
    dev = cv.device(options.device)
    x = np.random.default_rng(0).random(options.mib * 2**20 // 4, dtype=np.float32)
    y = np.empty_like(x)
    kernel = dev.compile(SOURCE, "smooth5")
    report = cv.stream(kernel, [x], [y], halo=2, device=dev, memory_limit=x.nbytes // 4)
    p = np.pad(x, 2, mode="edge")
    expected = (p[:-4] + p[1:-3] + p[2:-2] + p[3:-1] + p[4:]) * np.float32(0.2)
    print(report)
    print("matches NumPy:", bool(np.allclose(y, expected, rtol=1e-6)))
