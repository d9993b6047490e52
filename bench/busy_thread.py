"""Streams beside a busy Python thread (the GIL "convoy effect", pipeline/switching.py).

conveyor's threads give up the GIL at every driver call, copy and lock wait. Behind a thread
that runs pure Python, each must wait for the GIL to come back, up to one switch interval
(5 ms by Python's default) every time. This measures, for each ``CONVEYOR_SWITCH_INTERVAL``
setting, a large pageable stream and a small-block stream, alone and beside a thread counting
in a Python loop, in one process; the figure is the ratio busy / alone of the same run.

On the GPU machine (after scripts/gpu-env.sh):  python3 bench/busy_thread.py --device cuda:0
Here: python3 bench/busy_thread.py --device opencl:0:0 --gib 0.25
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable

import numpy as np

import conveyor as cv

SOURCE = cv.portable("""
__kernel void scale(__global const float *x, __global float *y, float k, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * k;
}
""")


def beside_a_busy_thread(run: Callable[[], float]) -> tuple[float, float]:
    """``run()``'s result while another thread counts in a Python loop, and that thread's
    count rate during it as a fraction of its rate alone (measured just before)."""
    def count(stop: threading.Event, rates: list[float]) -> None:
        n, started = 0, time.perf_counter()
        while not stop.is_set():
            n += 1
        rates.append(n / (time.perf_counter() - started))

    rates: list[float] = []
    for job in (lambda: time.sleep(0.5), run):
        stop = threading.Event()
        thread = threading.Thread(target=count, args=(stop, rates))
        thread.start()
        try:
            result = job()
        finally:
            stop.set()
            thread.join()
    return float(result), rates[1] / rates[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None)
    parser.add_argument("--gib", type=float, default=1.0, help="the large stream's input size")
    parser.add_argument("--intervals", default="off,0.5ms,0.1ms")
    parser.add_argument("--repeats", type=int, default=3, help="best of, per figure")
    args = parser.parse_args()
    dev = cv.device(args.device)
    kernel = dev.compile(SOURCE, "scale")
    big = np.random.default_rng(0).random(int(args.gib * 2**30) // 4, dtype=np.float32)
    small = np.arange(40_000, dtype=np.float32)

    def large() -> float:  # GB/s of input, best of --repeats
        best = 0.0
        for _ in range(args.repeats):
            started = time.perf_counter()
            out = cv.stream(kernel, [big], [np.float32], device=dev, block_bytes=64 * 2**20,
                            args=(2.0,)).outputs[0]
            best = max(best, big.nbytes / (time.perf_counter() - started) / 1e9)
            assert out[-1] == big[-1] * 2
        return best

    def little() -> float:  # ms per stream of 20 blocks of 8 KiB, best of --repeats x 10
        best = float("inf")
        for _ in range(args.repeats):
            started = time.perf_counter()
            for _ in range(10):
                cv.stream(kernel, [small], [np.float32], device=dev, block_bytes=8192,
                          args=(2.0,))
            best = min(best, (time.perf_counter() - started) / 10 * 1e3)
        return best

    large(), little()  # warm: pools, kernel, staging threads
    print(f"# {dev.spec} {dev.name}; {args.gib:g} GiB pageable map (64 MiB blocks) and a "
          f"20-block stream of 8 KiB blocks; best of {args.repeats}")
    print("| switch interval | large alone GB/s | beside a busy thread | ratio | busy thread's "
          "rate | small alone ms | beside a busy thread | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for interval in args.intervals.split(","):
        os.environ["CONVEYOR_SWITCH_INTERVAL"] = interval
        alone = large()
        busy, rate = beside_a_busy_thread(large)
        small_alone = little()
        small_busy, _ = beside_a_busy_thread(little)
        print(f"| {interval} | {alone:.1f} | {busy:.1f} | {busy / alone:.2f} | {rate:.2f} | "
              f"{small_alone:.2f} | {small_busy:.1f} | {small_busy / small_alone:.0f} × |",
              flush=True)


if __name__ == "__main__":
    main()
