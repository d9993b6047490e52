"""What a fresh output's page faults cost a copy, and what pre-faulting costs (issue 17).

    python3 -m bench.prefault_probe [--mib 512] [--threads 4]

Copies ``--mib`` MiB into: a fresh ``np.empty`` (faults taken by the copy), one pre-faulted
with MADV_POPULATE_WRITE, one pre-faulted by touching a byte per page, and one filled before;
and times the pre-faulting itself on ``--threads`` threads. Also a pinned block of the device
(``--device``) allocated fresh vs from the pool. Best of ``--repeats``; prints one line each.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from conveyor.memory import hostmem, prefault


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        best = min(best, fn())
    return best


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=512)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default=None)
    o = p.parse_args()
    n = o.mib * 2**20
    src = np.ones(n, np.uint8)
    pool = ThreadPoolExecutor(o.threads)

    def copy_into(prepare: str) -> tuple[float, float]:
        dst = np.empty(n, np.uint8)
        start = time.perf_counter()
        if prepare in ("madvise", "touch"):
            step = prefault.PIECE_BYTES
            list(pool.map(lambda s: prefault.populate(dst[s : s + step], prepare),
                          range(0, n, step)))
        elif prepare == "filled":
            dst.fill(0)
        faulted = time.perf_counter() - start
        start = time.perf_counter()
        np.copyto(dst, src)
        return faulted, time.perf_counter() - start

    for prepare in ("fresh", "madvise", "touch", "filled"):
        runs = [copy_into(prepare) for _ in range(o.repeats)]
        fault = min(r[0] for r in runs)
        copy = min(r[1] for r in runs)
        print(f"{prepare:8} pre-fault {n / fault / 1e9 if fault else float('inf'):7.2f} GB/s "
              f"({o.threads} threads)  then copy {n / copy / 1e9:6.2f} GB/s (1 thread)")

    def anonymous() -> float:
        start = time.perf_counter()
        address = hostmem.map_faulted(n)
        took = time.perf_counter() - start
        hostmem.unmap(address, n)
        return took

    print(f"anonymous memory faulted on {hostmem.THREADS} threads: "
          f"{n / _best(anonymous, o.repeats) / 1e9:.2f} GB/s")
    if o.device:
        import conveyor as cv

        dev = cv.device(o.device)

        def fresh_pinned() -> float:
            start = time.perf_counter()
            block = dev.alloc_pinned(n)
            took = time.perf_counter() - start
            block.close()
            return took

        took = _best(fresh_pinned, o.repeats)
        print(f"{dev.spec} alloc_pinned {o.mib} MiB fresh: {took * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
