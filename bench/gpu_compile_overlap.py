"""A stream's throughput with and without another kernel compiling at the same time.

``dev.compile(..., wait=False)`` runs the compiler (NVRTC, or the OpenCL build) on a host
thread while streams run; the module is loaded only at ``result()``, after the streams. Target:
throughput with a compile in flight within 5% of without. Pinned vadd, 2 x 2 GiB in, on every
GPU device; each compile uses a fresh source (a nonce) so no cache answers it.

Run on the GPU machine: python3 bench/gpu_compile_overlap.py
"""

from __future__ import annotations

import datetime
import statistics
import time
import uuid

import numpy as np

import conveyor as cv
from conveyor.kernels.portable import PRELUDE

VADD = PRELUDE + """
__kernel void vadd(__global const float *a, __global const float *b, __global float *c,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}
"""

# Heavy enough for the compiler to take a while: many unrolled loops of math built-ins.
HEAVY = PRELUDE + """
// nonce {nonce}
__kernel void heavy(__global const float *x, __global float *y, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i >= n) return;
    float v = x[i];
{body}
    y[i] = v;
}}
"""


def heavy_source() -> str:
    body = "\n".join(
        f"    #pragma unroll\n    for (int k{j} = 0; k{j} < 32; ++k{j}) "
        f"v = sin(v * {1.0 + j / 100:.3f}f + k{j}) * cos(v + {j}.0f);"
        for j in range(16)
    )
    return HEAVY.format(nonce=uuid.uuid4().hex, body=body)


def measure(dev: cv.Device, n: int) -> tuple[float, float, float, int]:
    """(median GB/s without, median GB/s with a compile in flight, compile s, streams during)."""
    a = cv.pinned.asarray(np.ones(n, np.float32), device=dev)
    b = cv.pinned.asarray(np.full(n, 2, np.float32), device=dev)
    c = cv.pinned.zeros_like(a, device=dev)
    kernel = dev.compile(VADD, "vadd")

    def once() -> float:
        report = cv.stream(kernel, [a, b], [c], device=dev, block_bytes=64 * 2**20)
        assert c[0] == 3 and c[-1] == 3
        return report.gbps_in

    once()
    base = [once() for _ in range(5)]
    during: list[float] = []
    started = time.perf_counter()
    future = dev.compile(heavy_source(), "heavy", wait=False)
    while not future.done() or not during:
        during.append(once())
    future.result()  # load after the streams
    seconds = time.perf_counter() - started
    return statistics.median(base), statistics.median(during), seconds, len(during)


def main() -> None:
    n = 2**29  # 2 GiB per input
    print(f"# stream throughput with a compile in flight — {datetime.date.today()}\n")
    print("| device | without compile GB/s | with compile GB/s | ratio | compile s | streams "
          "during compile |")
    print("|---|---|---|---|---|---|")
    for dev in [d for d in cv.devices() if d.kind == "gpu"]:
        without, with_, seconds, count = measure(dev, n)
        print(f"| {dev.spec} {dev.name} | {without:.1f} | {with_:.1f} | {with_ / without:.3f} | "
              f"{seconds:.2f} | {count} |", flush=True)


if __name__ == "__main__":
    main()
