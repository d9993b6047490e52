"""Probe (session 8): small-block streams and a 1 GiB stream beside a busy Python thread.

The figures of bench/NOTES.md "Session 8" come from this script (the first H100 run, before
and after the pooled events, printed no "busy thread ran at" figure: it was added for the
switch-interval runs). Run from the repository root, after scripts/gpu-env.sh on the GPU
machine:  python3 bench/gil_probe.py cuda:0 LABEL   (CONVEYOR_SWITCH_INTERVAL picks the
interval; bench/busy_thread.py measures the same in one tidy table).
"""

import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, "tests/pipeline")
sys.path.insert(0, "tests")
from streamkit import kernel  # noqa: E402

import conveyor as cv  # noqa: E402

spec = sys.argv[1]
label = sys.argv[2]
dev = cv.device(spec)
k = kernel(dev, "scale")
x = np.arange(40_000, dtype=np.float32)


def streams(n, src=x):
    for _ in range(n):
        r = cv.stream(k, [src], [np.float32], device=dev, block_bytes=8192, args=(2.0,))
        assert np.array_equal(r.outputs[0], src * 2)


rates = []


def hogging(fn):
    stop = threading.Event()

    def hog():
        n = 0
        t0 = time.perf_counter()
        while not stop.is_set():
            n += 1
        rates.append(n / (time.perf_counter() - t0))

    t = threading.Thread(target=hog, daemon=True)
    t.start()
    try:
        return fn()
    finally:
        stop.set()
        t.join()


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


hogging(lambda: time.sleep(1.0))
alone = rates.pop()
streams(20)
a = timed(lambda: streams(200)) / 200 * 1e3
b = hogging(lambda: timed(lambda: streams(20))) / 20 * 1e3


def three():
    ws = [threading.Thread(target=streams, args=(100,)) for _ in range(3)]
    for w in ws:
        w.start()
    for w in ws:
        w.join()


c = timed(three)
big = np.random.default_rng(0).random(2**28 // 4 * 4, dtype=np.float32)[: 2**28]  # 1 GiB
kb = kernel(dev, "scale")


def one_big():
    cv.stream(kb, [big], [np.float32], device=dev, block_bytes=64 * 2**20, args=(2.0,))


one_big()
d = big.nbytes / timed(one_big) / 1e9
e = big.nbytes / hogging(lambda: timed(one_big)) / 1e9
print(f"{label:5s} switch={os.environ.get('CONVEYOR_SWITCH_INTERVAL', 'default')} {spec}: "
      f"small stream {a:.2f} ms; with a busy thread {b:.2f} ms; "
      f"3 threads x 100 {c:.2f} s; 1 GiB 64 MiB blocks {d:.1f} GB/s, with a busy thread "
      f"{e:.1f} GB/s; busy thread ran at {rates[-1] / alone:.2f} of its rate alone",
      flush=True)
