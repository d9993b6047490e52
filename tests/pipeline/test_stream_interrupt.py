"""Ctrl-C mid-stream: a real SIGINT at block k leaves every pool at zero and no staging thread,
and the next stream on the same device is right. Runs in a subprocess (its own signal)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")
HERE = str(Path(__file__).resolve().parent)  # streamkit, for the child

SCRIPT = textwrap.dedent("""
    import os, signal, sys, threading
    import numpy as np
    import conveyor as cv
    from streamkit import store, to_host

    dev = cv.device({spec!r})
    ZERO_COPY = {zero_copy!r}
    blocks = []

    def compute(x, y, queue, offset, n):
        blocks.append(offset)
        if len(blocks) == 5:
            os.kill(os.getpid(), signal.SIGINT)
        store(y, to_host(x, queue) * 2, queue)

    x = np.arange(400_000, dtype=np.float32)
    y = np.zeros_like(x)
    try:
        cv.stream(compute, [x], [y], device=dev, block_bytes=4000, zero_copy=ZERO_COPY,
                  workers=2)
    except KeyboardInterrupt:
        pass
    else:
        sys.exit("the stream was not interrupted")
    assert len(blocks) < 100, len(blocks)
    for pool in (dev.memory_pool, dev.pinned_pool):
        assert pool.stats().in_use_bytes == 0, pool.stats()
    left = [t.name for t in threading.enumerate() if t.name.startswith("conveyor-stage")]
    assert not left, left

    src = cv.pinned.asarray(np.arange(100_000, dtype=np.float32) % 1000, device=dev)
    out = np.zeros(100_000, np.float32)
    cv.stream(lambda a, b, queue, offset, n: store(b, to_host(a, queue) * 2, queue),
              [src], [out], device=dev, block_bytes=8000, zero_copy=ZERO_COPY)
    assert np.array_equal(out, src + src)
    print("OK")
""")


@pytest.mark.parametrize("zero_copy", [False, None], ids=["copying", "auto"])
def test_sigint_mid_stream_cleans_up_and_the_next_stream_is_right(device, zero_copy):
    # Prepend: the GPU machine's carried wheels are on the inherited PYTHONPATH.
    path = os.pathsep.join([SRC, HERE, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = dict(os.environ, PYTHONPATH=path)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(spec=device.spec, zero_copy=zero_copy)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("OK")
