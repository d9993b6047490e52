"""Resource leaks (issue 8, item 13): a thousand short streams on one device leave the pools'
held bytes where they were after the first ten, nothing in use after each, and no more
threads or open file descriptors than after the first ten."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import add_reference, kernel, stage_threads  # noqa: E402

STREAMS = 1000
WARM = 10
ROWS = 600  # three blocks of 200 rows: the ring's every slot is used


def _open_fds() -> int | None:
    fds = Path("/proc/self/fd")
    return len(os.listdir(fds)) if fds.is_dir() else None


def _one_stream(device, index: int, tmp_path: Path) -> None:
    """A short stream; every few, the inputs are fresh pinned arrays or the output a file."""
    a = np.arange(ROWS, dtype=np.float32) + index
    b = np.ones(ROWS, np.float32)
    if index % 4 == 1:
        a, b = cv.pinned.asarray(a, device=device), cv.pinned.asarray(b, device=device)
    if index % 100 == 7:
        target = tmp_path / "c.npy"
        cv.stream(kernel(device, "add"), [a, b], [cv.npy_out(target)], device=device,
                  block_bytes=800)
        out = np.load(target)
    else:
        out = np.zeros(ROWS, np.float32)
        cv.stream(kernel(device, "add"), [a, b], [out], device=device, block_bytes=800,
                  zero_copy=False, workers=2)
    if index % 97 == 0:
        np.testing.assert_array_equal(out, add_reference(a, b))


@pytest.mark.parametrize("kind", ["memory_pool", "pinned_pool"])
def test_a_thousand_streams_keep_held_bytes_flat(device, tmp_path, kind):
    pool = getattr(device, kind)
    kernel(device, "add")
    held_after_warmup = None
    for index in range(STREAMS):
        _one_stream(device, index, tmp_path)
        stats = pool.stats()
        assert stats.in_use_bytes == 0 and stats.pending_bytes == 0, (index, stats)
        if index + 1 == WARM:
            held_after_warmup = stats.held_bytes
    assert pool.stats().held_bytes == held_after_warmup


def test_a_thousand_streams_leave_no_threads_or_files_open(device, tmp_path):
    kernel(device, "add")
    for index in range(WARM):
        _one_stream(device, index, tmp_path)
    threads, fds = threading.active_count(), _open_fds()
    for index in range(WARM, STREAMS):
        _one_stream(device, index, tmp_path)
        assert stage_threads() == [], index
    assert threading.active_count() == threads
    assert _open_fds() == fds
