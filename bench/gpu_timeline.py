"""Depth 1 against depth 3 on the same data: the timeline of each and its overlap figure.

A compute-heavy kernel (``--iters`` dependent multiply-adds per element, so a block's kernel
outlasts its copies) streams the same pinned input through ``cv.stream`` at depth 1 (copy-in,
compute and copy-out take turns) and at depth 3 (copies run under the previous and next
blocks' kernels). Writes ``<out>/timeline-depth1.png`` and ``<out>/timeline-depth3.png`` on
one time scale, and prints the figures of each run as a markdown table.

Run on the GPU machine:  python3 bench/gpu_timeline.py            (default device: the GPU)
On PoCL, small:          python3 bench/gpu_timeline.py --device cpu --mib 8 --block-mib 1 \
                             --iters 64 --out /tmp/timeline
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import numpy as np

import conveyor as cv
from conveyor.kernels.portable import portable

SOURCE = portable("""
__kernel void burn(__global const float *x, __global float *y, ulong iters,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) {
        float v = x[i];
        for (ulong k = 0; k < iters; k++) v = v * 0.999f + 0.001f;
        y[i] = v;
    }
}
""")


def expected(x: np.ndarray, iters: int) -> np.ndarray:
    """What the kernel computes, in float32 NumPy (for a sample of elements)."""
    v = x.astype(np.float32)
    for _ in range(iters):
        v = v * np.float32(0.999) + np.float32(0.001)
    return v


def main() -> None:
    """Run both depths (each after a warm-up run), check a sample, plot, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="device spec (default: cv.device())")
    parser.add_argument("--mib", type=int, default=1024, help="input size in MiB")
    parser.add_argument("--block-mib", type=int, default=64, help="block size in MiB")
    parser.add_argument("--iters", type=int, default=4096, help="multiply-adds per element")
    parser.add_argument("--out", default="docs", help="folder for the PNGs")
    parser.add_argument("--trace", action="store_true", help="also write Chrome trace JSON")
    options = parser.parse_args()

    dev = cv.device(options.device) if options.device else cv.device()
    kernel = dev.compile(SOURCE, "burn")
    rows = options.mib * 2**20 // 4
    x = cv.pinned.asarray(np.random.default_rng(0).random(rows, dtype=np.float32), device=dev)
    y = cv.pinned.empty(rows, np.float32, device=dev)
    sample = np.random.default_rng(1).integers(0, rows, 1000)
    reports: dict[int, cv.Report] = {}
    for depth in (1, 3):
        for _ in range(2):  # the first run warms the pools and the kernel up
            y.fill(0)
            reports[depth] = cv.stream(kernel, [x], [y], device=dev, depth=depth,
                                       block_bytes=options.block_mib * 2**20,
                                       args=(options.iters,), zero_copy=False)
        np.testing.assert_allclose(y[sample], expected(x[sample], options.iters), rtol=1e-3)

    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    span_ms = max(r.timeline.wall_ns for r in reports.values()) / 1e6
    day = datetime.date.today().isoformat()
    print(f"{dev.name} ({dev.spec}), {options.mib} MiB in {options.block_mib} MiB blocks, "
          f"{options.iters} iterations per element, pinned input and output, {day}\n")
    print("| depth | blocks | seconds | overlap | exposed transfer ms | bound | GB/s in |")
    print("|---|---|---|---|---|---|---|")
    for depth, report in reports.items():
        timeline = report.timeline
        name = out / f"timeline-depth{depth}.png"
        timeline.plot(name, title=f"{dev.name}, depth {depth}", span_ms=span_ms)
        if options.trace:
            timeline.save(out / f"timeline-depth{depth}.json")
        overlap = "n/a" if report.overlap is None else f"{report.overlap:.2f}"
        exposed = report.exposed_transfer_seconds
        print(f"| {depth} | {report.blocks} | {report.seconds:.3f} | {overlap} | "
              f"{'n/a' if exposed is None else f'{exposed * 1e3:.1f}'} | {report.bound} | "
              f"{report.gbps_in:.2f} |")
    print(f"\nclock alignment error bound: {reports[3].timeline.clock_error_ns} ns; "
          f"charts: {out / 'timeline-depth1.png'}, {out / 'timeline-depth3.png'}")
    del x, y


if __name__ == "__main__":
    main()
