"""``python -m conveyor.demo`` (what ``make demo`` runs): stream a dataset 8× larger than the
memory limit it sets through a kernel on the default device, check it, say how fast it went.

Runs on the default device: a CUDA or OpenCL GPU where there is one, PoCL's CPU device
elsewhere. ``--device SPEC`` picks another; ``--mib`` sets the size of each input.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import conveyor as cv

OPENCL_SAXPY = """
__kernel void saxpy(__global const float *x, __global const float *y, __global float *out,
                    float a, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) out[i] = a * x[i] + y[i];
}
"""

CUDA_SAXPY = """
extern "C" __global__ void saxpy(const float *x, const float *y, float *out, float a,
                                 unsigned long long offset, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
"""


def main(argv: list[str] | None = None) -> int:
    """Run the demo; return the exit code (0 when the result checks out)."""
    parser = argparse.ArgumentParser(prog="python -m conveyor.demo", description=__doc__)
    parser.add_argument("--device", default=None, help="device spec (default: the best)")
    parser.add_argument("--mib", type=int, default=256, help="MiB per input (default 256)")
    parser.add_argument("--trace", default="conveyor-demo.json", help="Chrome trace to write")
    options = parser.parse_args(argv)

    dev = cv.device(options.device)
    rows = options.mib * 2**20 // 4
    in_bytes = 2 * rows * 4
    memory_limit = in_bytes // 8  # the data is 8x the device memory conveyor may use
    print(f"device: {dev.spec} {dev.name} ({dev.kind}, {dev.backend})")
    print(f"data: 2 inputs x {options.mib} MiB float32 in, {options.mib} MiB out; "
          f"memory limit {memory_limit / 2**20:.0f} MiB")
    rng = np.random.default_rng(0)
    x = rng.random(rows, dtype=np.float32)
    y = rng.random(rows, dtype=np.float32)
    out = np.empty_like(x)
    out.fill(0)  # touch the output's pages now, so the stream does not time page faults
    source = CUDA_SAXPY if dev.backend == "cuda" else OPENCL_SAXPY
    started = time.perf_counter()
    kernel = dev.compile(source, "saxpy")
    print(f"kernel built and loaded in {time.perf_counter() - started:.3f} s")
    report = cv.stream(kernel, [x, y], [out], device=dev, args=(2.0,),
                       memory_limit=memory_limit, trace=options.trace)
    expected = np.float32(2.0) * x + y
    if not np.array_equal(out, expected):
        bad = int(np.count_nonzero(out != expected))
        print(f"FAILED: {bad} of {rows} elements differ from NumPy", file=sys.stderr)
        return 1
    print(report)
    print(f"result checked against NumPy: all {rows} elements equal")
    print(f"peak device memory {report.peak_device_bytes / 2**20:.1f} MiB "
          f"<= limit {memory_limit / 2**20:.0f} MiB; trace written to {options.trace}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
