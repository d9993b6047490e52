"""Pool hits against fresh allocations, on the default device (``python bench/pools.py``).

(a) device pool hit (acquire + release of a 64 MiB block the pool already holds) against
    ``device.alloc_device`` + ``close`` of the same size; target: at least 50x faster.
(b) pinned pool hit against ``device.alloc_pinned`` + ``close`` (64 MiB); target: 100x.
Medians over repetitions after a warm-up, timed with ``time.perf_counter``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import conveyor as cv
from conveyor.memory.pool import BlockPool

NBYTES = 64 << 20
WARMUP = 3
FRESH_REPEATS = 15
HIT_REPEATS = 2000


def median_seconds(step: Callable[[], None], repeats: int) -> float:
    """Median wall time of ``step`` over ``repeats`` runs, after ``WARMUP`` untimed runs."""
    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def pool_hit(pool: BlockPool) -> Callable[[], None]:
    pool.release(pool.acquire(NBYTES))  # the pool now holds one block of the size class

    def step() -> None:
        pool.release(pool.acquire(NBYTES))

    return step


def fresh(allocate: Callable[[int], object]) -> Callable[[], None]:
    def step() -> None:
        allocate(NBYTES).close()  # type: ignore[attr-defined]

    return step


def main() -> None:
    dev = cv.device()
    rows = []
    for label, pool, allocate, target in (
        ("device", dev.memory_pool, dev.alloc_device, 50),
        ("pinned", dev.pinned_pool, dev.alloc_pinned, 100),
    ):
        hits_before = pool.stats().hits
        hit = median_seconds(pool_hit(pool), HIT_REPEATS)
        assert pool.stats().hits - hits_before >= HIT_REPEATS  # every timed step was a hit
        pool.trim()
        new = median_seconds(fresh(allocate), FRESH_REPEATS)
        rows.append((label, new, hit, new / hit, target))
    print(f"device: {dev.spec} {dev.name} ({dev.kind}); block 64 MiB; medians")
    print()
    print("| memory | fresh alloc + close | pool hit (acquire + release) | ratio | target |")
    print("|---|---:|---:|---:|---:|")
    for label, new, hit, ratio, target in rows:
        verdict = "met" if ratio >= target else "MISSED"
        print(f"| {label} | {new * 1e6:,.1f} us | {hit * 1e6:,.2f} us | {ratio:,.0f}x "
              f"| >= {target}x ({verdict}) |")


if __name__ == "__main__":
    main()
