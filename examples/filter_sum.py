"""Sum of x[x > t] over a column far larger than the memory conveyor may use, in one call.

The kernel writes one value per element into its output buffer (x or 0); with reduce="sum"
conveyor folds each block on the device, so only a few KiB of partials cross the link.

    python examples/filter_sum.py [--mib 512] [--device SPEC]
"""

from __future__ import annotations

import argparse

import numpy as np

import conveyor as cv

SOURCE = cv.portable("""
__kernel void keep_above(__global const float *x, __global float *y, float t,
                         ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] > t ? x[i] : 0.0f;
}
""")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--device", default=None)
    options = parser.parse_args()
    dev = cv.device(options.device)
    x = np.random.default_rng(0).random(options.mib * 2**20 // 4, dtype=np.float32)
    kernel = dev.compile(SOURCE, "keep_above")
    report = cv.stream(kernel, [x], reduce="sum", args=(0.5,), device=dev,
                       memory_limit=x.nbytes // 8)
    expected = x[x > 0.5].sum(dtype=np.float64)
    print(report)
    print(f"sum of x[x > 0.5] = {report.result:.6g} (NumPy: {expected:.6g})")
