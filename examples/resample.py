"""Bilinear downscale of an image larger than the memory limit, read through OpenCL images
or CUDA texture objects.

The input streams as ``cv.image(x, filter="linear")``: each block of rows is copied into an
``image2d_t`` and the kernel reads it with ``read_imagef`` through a linear sampler, so the
device's texture unit does the interpolation and the sampler's clamp_to_edge is the boundary
rule (boundary="nearest", the default, for the rows). The output is ``cv.rows`` with ratio
(p, q): ``rows * p / q`` rows of ``columns * p / q`` pixels, blocks cut at multiples of q
rows, so every block writes whole output rows and needs no halo (a downscale's samples stay
inside its block).

Output pixel ``o`` samples the input at ``(o + 0.5) * q / p`` (pixel centres aligned, as
OpenCV's INTER_LINEAR and PIL's bilinear do). With the default factor 1.5 every weight is 1/4
or 3/4, which GPU texture units (8-bit fixed-point weights) hold exactly, so the result agrees
with the NumPy reference to float rounding on every device.

On CUDA the kernel (CUDA_SOURCE) takes the block's texture object, ``cudaTextureObject_t``,
in the image's place (the linear filter and clamp are bound to it) and reads with
``tex2D<float>``; a CUDA kernel cannot ask a texture its width, so it takes the input's
columns as one more arg.

    python examples/resample.py [--rows 6000] [--columns 6000] [--ratio 2 3] [--device SPEC]
"""

from __future__ import annotations

import argparse

import numpy as np

import conveyor as cv

SOURCE = """
__kernel void downscale(read_only image2d_t img, sampler_t linear, __global float *out,
                        uint p, uint q, uint out_columns, ulong offset, ulong n) {
    /* n counts input elements of this block: rows x columns of the image */
    ulong out_rows = n / get_image_width(img) * p / q;
    ulong i = get_global_id(0);
    if (i >= out_rows * out_columns) return;
    float scale = (float)q / (float)p;
    float2 at = (float2)(((float)(i % out_columns) + 0.5f) * scale,
                         ((float)(i / out_columns) + 0.5f) * scale);
    out[i] = read_imagef(img, linear, at).x;
}
"""

CUDA_SOURCE = """
extern "C" __global__ void downscale(cudaTextureObject_t img, float *out, unsigned int p,
                                     unsigned int q, unsigned int out_columns,
                                     unsigned int in_columns, unsigned long long offset,
                                     unsigned long long n) {
    /* n counts input elements of this block: rows x in_columns of the image */
    unsigned long long out_rows = n / in_columns * p / q;
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i >= out_rows * out_columns) return;
    float scale = (float)q / (float)p;
    out[i] = tex2D<float>(img, ((float)(i % out_columns) + 0.5f) * scale,
                          ((float)(i / out_columns) + 0.5f) * scale);
}
"""


def reference(x: np.ndarray, p: int, q: int) -> np.ndarray:
    """Bilinear downscale in NumPy: the same sample points, edges clamped."""

    def axis(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        at = (np.arange(size * p // q) + 0.5) * q / p - 0.5
        low = np.floor(at).astype(np.int64)
        weight = (at - low).astype(np.float32)
        return np.clip(low, 0, size - 1), np.clip(low + 1, 0, size - 1), weight

    r0, r1, wr = axis(x.shape[0])
    c0, c1, wc = axis(x.shape[1])
    top = x[r0][:, c0] * (1 - wc) + x[r0][:, c1] * wc
    bottom = x[r1][:, c0] * (1 - wc) + x[r1][:, c1] * wc
    return top * (1 - wr)[:, None] + bottom * wr[:, None]


def run(device: cv.Device, rows: int, columns: int, *, ratio: tuple[int, int] = (2, 3),
        memory_limit: int | None = None, seed: int = 0) -> tuple[bool, cv.Report]:
    """Downscale a random ``rows`` x ``columns`` image by ``q / p``; (matches NumPy, report).
    An upscale (p > q) is refused: its last output rows in a block sample the next block's
    first row, which a block without a halo does not hold (the clamp would give its own)."""
    p, q = ratio
    if not 0 < p <= q:
        raise cv.InputError(f"--ratio {p} {q}: this example downscales (0 < P <= Q); an "
                            f"upscale would sample rows past its block's end")
    x = np.random.default_rng(seed).random((rows, columns), dtype=np.float32)
    out_columns = columns * p // q
    cuda = device.backend == "cuda"
    kernel = device.compile(CUDA_SOURCE if cuda else SOURCE, "downscale")
    args = (p, q, out_columns, columns) if cuda else (p, q, out_columns)
    report = cv.stream(kernel, [cv.image(x, filter="linear")],
                       [cv.rows(np.float32, ratio=(p, q), shape=(out_columns,))],
                       args=args, device=device,
                       memory_limit=memory_limit or x.nbytes // 4)
    exact = bool(np.allclose(report.outputs[0], reference(x, p, q), rtol=1e-5, atol=1e-6))
    return exact, report


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=6000)
    parser.add_argument("--columns", type=int, default=6000)
    parser.add_argument("--ratio", type=int, nargs=2, default=(2, 3), metavar=("P", "Q"))
    parser.add_argument("--device", default="opencl")
    options = parser.parse_args()
    dev = cv.device(options.device)
    matches, result = run(dev, options.rows, options.columns, ratio=tuple(options.ratio))
    print(result)
    print(f"{result.blocks} blocks of {result.block_rows} rows; matches NumPy: {matches}")
    raise SystemExit(0 if matches else 1)
