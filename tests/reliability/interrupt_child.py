"""Run by test_interrupts.py in its own process: ``python interrupt_child.py SPEC SEED ROUNDS
FOLDER``. Streams of several kinds run one after another while a ``threading.Timer`` with a
random delay (seeded; each printed) sends SIGINT to this process. After every round: the pools
are at zero bytes in use, no staging thread is left, a ``.npy`` output is either absent or whole
and right (it exists whenever its stream finished) with no temporary file beside it, and the
next stream is right.
Prints "OK <interrupted> <late>" at the end; any failed check exits non-zero."""

from __future__ import annotations

import gc
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from streamkit import add_reference, kernel, store, to_host

import conveyor as cv
from conveyor.pipeline import staging

# Small blocks would be staged inline; put them on the staging threads, the path whose
# interrupt handling (a thread mid-copy when Ctrl-C lands) these rounds are here to try.
staging.THREAD_MIN_BYTES = 0

ROWS = 1_000_000
BLOCK_BYTES = 4096  # about 1,000 blocks: many points for the interrupt to land on


def _check_clean(dev: cv.Device, what: str) -> None:
    gc.collect()
    for pool in (dev.memory_pool, dev.pinned_pool):
        stats = pool.stats()
        assert stats.in_use_bytes == 0 and stats.blocks_in_use == 0, (what, stats)
    left = [t.name for t in threading.enumerate() if t.name.startswith("conveyor-stage")]
    assert not left, (what, left)


def main() -> None:
    spec, seed, rounds, folder = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    rng = random.Random(seed)
    print(f"seed {seed}", flush=True)
    dev = cv.device(spec)
    k = kernel(dev, "add")
    a = np.arange(ROWS, dtype=np.float32) % 1000
    b = np.ones(ROWS, np.float32)
    expected = add_reference(a, b)
    target = Path(folder) / "c.npy"

    def copying() -> np.ndarray:
        c = np.zeros(ROWS, np.float32)
        cv.stream(k, [a, b], [c], device=dev, block_bytes=BLOCK_BYTES, zero_copy=False,
                  workers=2)
        return c

    def zero_copy() -> np.ndarray:
        c = np.zeros(ROWS, np.float32)
        cv.stream(k, [a, b], [c], device=dev, block_bytes=BLOCK_BYTES, zero_copy=None)
        return c

    def callable_() -> np.ndarray:
        c = np.zeros(ROWS, np.float32)

        def compute(x, y, z, queue, offset, n):
            index = (np.arange(offset, offset + n) % 7).astype(np.float32)
            store(z, to_host(x, queue) + to_host(y, queue) + index, queue)

        cv.stream(compute, [a, b], [c], device=dev, block_bytes=4 * BLOCK_BYTES,
                  zero_copy=False, workers=2)
        return c

    def npy_file() -> None:
        cv.stream(k, [a, b], [cv.npy_out(target)], device=dev, block_bytes=BLOCK_BYTES,
                  workers=2)

    kinds: dict[str, Callable[[], np.ndarray | None]] = {
        "copying": copying, "zero-copy": zero_copy, "callable": callable_, "npy": npy_file,
    }
    seconds = {}
    for name, run in kinds.items():  # uninterrupted: each is right, and how long it runs
        start = time.perf_counter()
        out = run()
        assert np.array_equal(np.load(target) if out is None else out, expected), name
        seconds[name] = time.perf_counter() - start
        target.unlink(missing_ok=True)
    print("seconds", {n: round(s, 3) for n, s in seconds.items()}, flush=True)

    interrupted = late = 0
    names = list(kinds)
    for round_ in range(rounds):
        name = names[round_ % len(names)]
        delay = rng.uniform(0.0, seconds[name])
        print(f"round {round_} {name} delay {delay:.4f}", flush=True)
        timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
        finished = False
        out = None
        try:
            timer.start()
            out = kinds[name]()
            finished = True
            timer.join()  # the interrupt may still come: it lands here, after the stream
        except KeyboardInterrupt:
            pass
        timer.join()
        if finished:
            late += 1
            if name != "npy":
                assert np.array_equal(out, expected), name
        else:
            interrupted += 1
        _check_clean(dev, f"round {round_} {name}")
        leftovers = sorted(p.name for p in Path(folder).iterdir())
        if finished and name == "npy":
            assert leftovers == ["c.npy"], leftovers
        # An interrupt can land after the output was renamed into place (the stream was then
        # all but done): the file may exist, but only whole. Never a temporary beside it.
        assert leftovers in ([[], ["c.npy"]] if name == "npy" else [[]]), leftovers
        if leftovers:
            assert np.array_equal(np.load(target), expected), "a partial output file"
        target.unlink(missing_ok=True)
        c = np.zeros(1000, np.float32)
        cv.stream(k, [a[:1000], b[:1000]], [c], device=dev, block_bytes=400, zero_copy=False)
        assert np.array_equal(c, expected[:1000]), f"the stream after round {round_}"
        _check_clean(dev, f"after round {round_}")
    print(f"OK {interrupted} {late}", flush=True)


if __name__ == "__main__":
    main()
