"""Kernels and streams for the trace tests, built once per device and process."""

from __future__ import annotations

import numpy as np

import conveyor as cv
from conveyor.kernels.portable import portable

SOURCE = portable("""
__kernel void vadd(__global const float *a, __global const float *b, __global float *c,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}
__kernel void burn(__global const float *x, __global float *y, ulong iters,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) {
        float v = x[i];
        for (ulong k = 0; k < iters; k++) v = v * 0.999f + 0.001f;
        y[i] = v;
    }
}
__kernel void ident(__global const float *x, __global float *r, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) r[i] = x[i];
}
""")

_kernels: dict[tuple[str, str], cv.Kernel] = {}
N, BLOCK = 40_000, 16_000  # 10 blocks of 4000 float32 rows


def kernel(device: cv.Device, name: str) -> cv.Kernel:
    """Kernel ``name`` ("vadd", "burn", "ident") on ``device``, built once."""
    key = (device.spec, name)
    if key not in _kernels:
        _kernels[key] = device.compile(SOURCE, name)
    return _kernels[key]


def vadd_stream(device: cv.Device, *, depth: int = 3, zero_copy: bool | None = False,
                **kw) -> cv.Report:
    """A copying vadd stream of ``N`` float32 rows in 16 kB blocks."""
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((2, N)).astype(np.float32)
    c = np.empty_like(a)
    report = cv.stream(kernel(device, "vadd"), [a, b], [c], device=device, depth=depth,
                       block_bytes=BLOCK, zero_copy=zero_copy, **kw)
    np.testing.assert_array_equal(c, a + b)
    return report
