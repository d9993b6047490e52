"""A/B of page-locking pageable input blocks in place (pipeline/inplace.py) on CUDA: vadd over
2 x --gib GiB float32 from pageable NumPy arrays, with placing on and off, alternating runs.

Run on the GPU machine: python3 bench/inplace_ab.py [--gib 4] [--runs 3]
Prints input GB/s of each run and the best of each side; every result is checked.
"""

from __future__ import annotations

import argparse

import numpy as np

import conveyor as cv
from conveyor.pipeline import inplace
from gpu_vadd import SOURCE


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    n = int(options.gib * 2**30) // 4
    a = np.arange(n, dtype=np.float32) % 1000
    b = np.ones(n, np.float32)
    c = np.zeros(n, np.float32)
    dev = next(d for d in cv.devices() if d.backend == "cuda")
    kernel = dev.compile(SOURCE, "vadd")
    best = {True: 0.0, False: 0.0}
    for run in range(2 * options.runs + 2):
        inplace.ENABLED = run % 2 == 0
        c.fill(0)
        report = cv.stream(kernel, [a, b], [c], device=dev, block_bytes=64 * 2**20)
        if not (c[:: 4096] == a[:: 4096] + b[:: 4096]).all() or c[-1] != a[-1] + b[-1]:
            raise SystemExit("wrong result")
        if run >= 2:  # the first pair warms up
            best[inplace.ENABLED] = max(best[inplace.ENABLED], report.gbps_in)
        busy = report.busy_seconds
        print(f"in place {'on ' if inplace.ENABLED else 'off'}: {report.gbps_in:6.1f} GB/s in, "
              f"stage-in busy {busy.get('stage-in', 0) / report.seconds:.0%}, "
              f"copy-in {busy.get('copy-in', 0) / report.seconds:.0%}", flush=True)
    print(f"best: in place on {best[True]:.1f} GB/s, off {best[False]:.1f} GB/s")


if __name__ == "__main__":
    main()
