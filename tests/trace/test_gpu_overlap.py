"""On a GPU: with a compute-heavy kernel, depth 1 takes turns (overlap near 0) and depth 3
hides the copies under compute (overlap clearly higher). Skipped where there is no GPU."""

from __future__ import annotations

import numpy as np
import pytest
from tracekit import kernel

import conveyor as cv

ROWS = 32 * 2**20 // 4  # 32 MiB of float32 in, 32 MiB out
BLOCK = 4 * 2**20       # 8 blocks
ITERS = 4096            # kernel time per block well above its copy time


@pytest.mark.gpu
def test_overlap_grows_with_depth(gpu_device):
    burn = kernel(gpu_device, "burn")
    x = cv.pinned.asarray(np.random.default_rng(0).random(ROWS, dtype=np.float32),
                          device=gpu_device)
    y = cv.pinned.empty(ROWS, np.float32, device=gpu_device)
    overlaps = {}
    for depth in (1, 3, 1, 3):  # the first pair warms the pools and the kernel up
        report = cv.stream(burn, [x], [y], device=gpu_device, depth=depth, block_bytes=BLOCK,
                           args=(ITERS,), zero_copy=False)
        overlaps[depth] = report.overlap
    del x, y
    assert overlaps[1] is not None and overlaps[3] is not None
    assert overlaps[1] < 0.15, overlaps
    assert overlaps[3] > 0.5 and overlaps[3] > overlaps[1] + 0.35, overlaps
