"""Engine benchmarks on the default device (PoCL's CPU device where there is no GPU).

1. Per-block engine overhead with tiny blocks: conveyor's copying path (pinned inputs, so no
   staging) against raw PyOpenCL enqueues of the same commands (two copies in, one kernel, one
   copy out, the same events between queues), in the same run. Target: <= 1.5x.
2. Zero-copy against the copying path on a host-unified device (same data, same kernel).

Run: .venv/bin/python bench/engine.py  (prints a markdown table)
"""

from __future__ import annotations

import datetime
import statistics
import time

import numpy as np
import pyopencl as cl

import conveyor as cv

SRC = """
__kernel void vadd(__global const float *a, __global const float *b, __global float *c,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}
"""


def raw_pyopencl(dev: cv.Device, a: np.ndarray, b: np.ndarray, c: np.ndarray,
                 rows: int, depth: int) -> float:
    """The same commands as conveyor's ring, enqueued by hand; seconds for the whole array."""
    ctx = cl.Context([dev.cl_device])
    prof = cl.command_queue_properties.PROFILING_ENABLE
    q_in, q_k, q_out = (cl.CommandQueue(ctx, properties=prof) for _ in range(3))
    kernel = cl.Program(ctx, SRC).build().vadd
    nbytes = rows * 4
    bufs = [[cl.Buffer(ctx, cl.mem_flags.READ_WRITE, nbytes) for _ in range(3)]
            for _ in range(depth)]
    done: list[cl.Event | None] = [None] * depth
    start = time.perf_counter()
    for index, first in enumerate(range(0, a.shape[0], rows)):
        slot = index % depth
        if done[slot] is not None:
            done[slot].wait()
        ba, bb, bc = bufs[slot]
        n = min(rows, a.shape[0] - first)
        e1 = cl.enqueue_copy(q_in, ba, a[first:first + n], is_blocking=False)
        e2 = cl.enqueue_copy(q_in, bb, b[first:first + n], is_blocking=False)
        kernel.set_args(ba, bb, bc, np.uint64(first), np.uint64(n))
        ek = cl.enqueue_nd_range_kernel(q_k, kernel, (-(-n // 256) * 256,), (256,),
                                        wait_for=[e1, e2])
        done[slot] = cl.enqueue_copy(q_out, c[first:first + n], bc, is_blocking=False,
                                     wait_for=[ek])
        for q in (q_in, q_k, q_out):
            q.flush()
    for q in (q_in, q_k, q_out):
        q.finish()
    return time.perf_counter() - start


def median_of(fn, repeats: int) -> float:
    fn()  # warm up: pools, caches, first-touch
    return statistics.median(fn() for _ in range(repeats))


def main() -> None:
    dev = cv.device()
    kernel = dev.compile(SRC, "vadd")
    print(f"# conveyor engine benchmarks — {datetime.date.today()} — {dev.spec} {dev.name}\n")

    rows, blocks, depth = 1024, 2000, 3  # 4 KiB blocks: the per-block cost dominates
    a = cv.pinned.asarray(np.random.rand(rows * blocks).astype(np.float32), device=dev)
    b = cv.pinned.asarray(np.random.rand(rows * blocks).astype(np.float32), device=dev)
    c = cv.pinned.empty_like(a, device=dev)

    def run_conveyor() -> float:
        start = time.perf_counter()  # the whole call, set-up and report included
        cv.stream(kernel, [a, b], [c], device=dev, depth=depth, block_bytes=rows * 4,
                  zero_copy=False)
        return time.perf_counter() - start

    # Paired and interleaved: this machine's speed drifts, so each conveyor run is compared
    # with the raw run right after it, and the median of those ratios is the figure.
    run_conveyor()
    raw_pyopencl(dev, a, b, c, rows, depth)
    pairs = []
    for _ in range(9):
        t_conv = run_conveyor()
        assert np.array_equal(c, a + b)
        c.fill(0)
        t_raw = raw_pyopencl(dev, a, b, c, rows, depth)
        assert np.array_equal(c, a + b)
        pairs.append((t_conv, t_raw))
    per_conv = statistics.median(p[0] for p in pairs) / blocks * 1e6
    per_raw = statistics.median(p[1] for p in pairs) / blocks * 1e6
    ratios = sorted(p[0] / p[1] for p in pairs)
    print("| figure | conveyor | raw PyOpenCL | ratio | target |")
    print("|---|---|---|---|---|")
    print(f"| per-block time, {blocks} blocks of 4 KiB, depth {depth} (medians of 9 paired runs; "
          f"ratios {ratios[0]:.2f}-{ratios[-1]:.2f}) | {per_conv:.1f} µs | {per_raw:.1f} µs | "
          f"{statistics.median(ratios):.2f}x | <= 1.5x |")

    n = 64 * 2**20
    x = np.random.rand(n).astype(np.float32)
    y = np.random.rand(n).astype(np.float32)
    out = np.empty_like(x)
    out.fill(0)
    figures = {}
    for zero_copy in (False, True):
        def run(zc: bool = zero_copy) -> float:
            return cv.stream(kernel, [x, y], [out], device=dev, zero_copy=zc,
                             block_bytes=16 * 2**20).seconds
        figures[zero_copy] = median_of(run, 5)
        assert np.array_equal(out, x + y)
    gbps = {k: 2 * x.nbytes / v / 1e9 for k, v in figures.items()}
    print(f"| vadd 2 x 256 MiB in, 16 MiB blocks: input GB/s | zero-copy {gbps[True]:.2f} | "
          f"copying {gbps[False]:.2f} | {gbps[True] / gbps[False]:.2f}x | zero-copy faster |")


if __name__ == "__main__":
    main()
