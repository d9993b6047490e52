"""Image blocks against plain buffers: the same 2-D float32 array streamed through a copy
kernel once as a plain input and once as ``cv.image``, input GB/s of each, in the same run
(after one warm run of each). Prediction (bench/NOTES.md): the image path within 20% of the
buffer path on NVIDIA OpenCL.

    python bench/image_copy.py [--mib 2048] [--columns 8192] [--device opencl] [--repeats 3]
"""

from __future__ import annotations

import argparse

import numpy as np

import conveyor as cv

BUFFER = """
__kernel void copy_buffer(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i];
}
"""

IMAGE = """
__kernel void copy_image(read_only image2d_t img, sampler_t s, __global float *y, ulong offset,
                         ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    int w = get_image_width(img);
    y[i] = read_imagef(img, s, (int2)(i % w, i / w)).x;
}
"""


def measure(device: cv.Device, mib: int, columns: int, repeats: int) -> dict[str, float]:
    """Best input GB/s of each path over ``repeats`` runs (after a warm run of each)."""
    rows = max(mib * 2**20 // 4 // columns, 1)
    x = cv.pinned.empty((rows, columns), np.float32, device=device)
    x[:] = np.arange(columns, dtype=np.float32)
    y = cv.pinned.empty((rows, columns), np.float32, device=device)
    kernels = {"buffer": device.compile(BUFFER, "copy_buffer"),
               "image": device.compile(IMAGE, "copy_image")}
    best = {name: 0.0 for name in kernels}
    for run in range(repeats + 1):
        for name, kernel in kernels.items():
            source = cv.image(x) if name == "image" else x
            report = cv.stream(kernel, [source], [y], device=device, zero_copy=False)
            if run:  # run 0 warms both paths up
                best[name] = max(best[name], report.bytes_in / report.seconds / 1e9)
    assert np.array_equal(y[-1], x[-1])
    del x, y
    return best


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=2048)
    parser.add_argument("--columns", type=int, default=8192)
    parser.add_argument("--device", default="opencl")
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    dev = cv.device(options.device)
    figures = measure(dev, options.mib, options.columns, options.repeats)
    print(f"{dev.name}: {options.mib} MiB, {options.columns} columns, input GB/s (best of "
          f"{options.repeats})")
    for name, rate in figures.items():
        print(f"  {name:7s} {rate:7.2f}")
    print(f"  image / buffer = {figures['image'] / figures['buffer']:.2f}")
