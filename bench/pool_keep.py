"""Pools between streams of changing lengths (issue 13, item 6): RSS and held bytes after many
copying streams of random lengths on one device (``python bench/pool_keep.py``).

Each stream adds two float32 arrays of a random length (seeded) into a third, copying through
the device pool and the pinned staging ring (``zero_copy=False``). Before the keep budget every
new length left one more set of size classes held for ever; now each pool keeps at most its
keep budget of idle blocks (``CONVEYOR_POOL_KEEP``, else what the largest recent stream used).
Prints RSS after the warm-up and at the end, the peak RSS, and each pool's statistics.

    python bench/pool_keep.py [--streams 1000] [--max-rows 2000000] [--warm 20] [--seed 13]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import conveyor as cv

ADD = """
__kernel void add(__global const float *a, __global const float *b, __global float *c,
                  ulong offset, ulong n) {
    size_t i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}
"""
MIB = 2**20


def rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/statm."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def one_stream(dev: cv.Device, kernel: cv.Kernel, rows: int) -> None:
    a = np.ones(rows, np.float32)
    b = np.full(rows, 2, np.float32)
    c = np.empty(rows, np.float32)
    cv.stream(kernel, [a, b], [c], device=dev, zero_copy=False)
    assert c[0] == 3 and c[-1] == 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--max-rows", type=int, default=2_000_000)
    parser.add_argument("--warm", type=int, default=20)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--device", default=None)
    options = parser.parse_args()
    dev = cv.device(options.device)
    kernel = dev.compile(ADD, "add")
    lengths = np.random.default_rng(options.seed).integers(1, options.max_rows + 1,
                                                             options.streams)
    start_rss = rss_bytes()
    warm_rss = peak_rss = start_rss
    started = time.perf_counter()
    for index, rows in enumerate(lengths):
        one_stream(dev, kernel, int(rows))
        rss = rss_bytes()
        peak_rss = max(peak_rss, rss)
        if index + 1 == options.warm:
            warm_rss = rss
    seconds = time.perf_counter() - started
    end_rss = rss_bytes()
    budget = 0
    print(f"device {dev.spec} ({dev.name}); {options.streams} streams of 1..{options.max_rows} "
          f"float32 rows (a + b -> c), seed {options.seed}, {seconds:.1f} s")
    for name in ("memory_pool", "pinned_pool"):
        stats = getattr(dev, name).stats()
        budget += stats.keep_bytes or 0
        print(f"  {name}: held {stats.held_bytes / MIB:.1f} MiB, keep budget "
              f"{(stats.keep_bytes or 0) / MIB:.1f} MiB, in use {stats.in_use_bytes}, "
              f"trims {stats.trims} blocks ({stats.trimmed_bytes / MIB:.0f} MiB), "
              f"hits {stats.hits}, misses {stats.misses}")
    print(f"  RSS: start {start_rss / MIB:.0f} MiB, after {options.warm} streams "
          f"{warm_rss / MIB:.0f} MiB, peak {peak_rss / MIB:.0f} MiB, end {end_rss / MIB:.0f} MiB")
    print(f"  RSS growth after the warm-up: {(end_rss - warm_rss) / MIB:+.0f} MiB; "
          f"end RSS above start: {(end_rss - start_rss) / MIB:.0f} MiB against keep budgets "
          f"of {budget / MIB:.0f} MiB (both pools)")


if __name__ == "__main__":
    main()
