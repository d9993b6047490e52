"""Probe (session 8): the switch interval's cost with no busy thread, A/B interleaved.

Six rounds of: 50 small-block streams (20 blocks of 8 KiB) and one 1 GiB stream (64 MiB
blocks), once with ``CONVEYOR_SWITCH_INTERVAL=off`` and once at ``0.5ms``; prints medians and
every run. bench/NOTES.md "Session 8" has the H100 figures.
    python3 bench/switch_ab.py cuda:0
"""

import os
import sys
import time

import numpy as np

sys.path.insert(0, "tests/pipeline")
sys.path.insert(0, "tests")
from streamkit import kernel  # noqa: E402

import conveyor as cv  # noqa: E402

dev = cv.device(sys.argv[1])
k = kernel(dev, "scale")
x = np.arange(40_000, dtype=np.float32)
big = np.ones(2**28, np.float32)
for _ in range(20):
    cv.stream(k, [x], [np.float32], device=dev, block_bytes=8192, args=(2.0,))
res = {"off": [], "0.5ms": []}
resb = {"off": [], "0.5ms": []}
for _rep in range(6):
    for v in res:
        os.environ["CONVEYOR_SWITCH_INTERVAL"] = v
        t0 = time.perf_counter()
        for _ in range(50):
            cv.stream(k, [x], [np.float32], device=dev, block_bytes=8192, args=(2.0,))
        res[v].append((time.perf_counter() - t0) / 50 * 1e3)
        t0 = time.perf_counter()
        cv.stream(k, [big], [np.float32], device=dev, block_bytes=64 * 2**20, args=(2.0,))
        resb[v].append(big.nbytes / (time.perf_counter() - t0) / 1e9)
for v in res:
    print(v, f"small ms median {np.median(res[v]):.2f}",
          f"big GB/s median {np.median(resb[v]):.2f}",
          [round(a, 2) for a in res[v]], [round(a, 2) for a in resb[v]])
