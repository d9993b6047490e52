"""Input blocks page-locked in place (pipeline/inplace.py) next to staged ones.

On CUDA the engine places blocks wherever it can. Here the placing path is switched on for
every device (PoCL's registration wraps the array instead of locking it, which exercises the
same claims, edge pages, fences and clean-up), and the real ``InPlace.place`` is wrapped to
count or fail."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
from streamkit import add_reference, kernel

import conveyor as cv
from conveyor.pipeline import inplace as placing
from conveyor.pipeline.plan import Block

BLOCK = 2**20  # bytes per input block: the threaded staging path


@pytest.fixture
def placed_blocks(monkeypatch):
    """Place on every device; return the list of block indices that were placed."""
    monkeypatch.setattr(placing, "supported", lambda device: True)
    monkeypatch.setattr(placing, "ENABLED", True)
    placed: list[int] = []
    real = placing.InPlace.place

    def place(self, block, edge):
        placed.append(block.index)
        return real(self, block, edge)

    monkeypatch.setattr(placing.InPlace, "place", place)
    return placed


@pytest.mark.parametrize("skew", [0, 3])  # 3: rows start mid-page, so every block has edges
def test_placed_and_staged_blocks_together_are_right(device, placed_blocks, skew):
    rows = 12 * BLOCK // 4 + 1234 + skew  # a short tail block
    a = (np.arange(rows, dtype=np.float32) % 1013)[skew:]
    b = np.ones(rows, np.float32)[skew:]
    c = np.zeros_like(a)
    cv.stream(kernel(device, "add"), [a, b], [c], device=device, block_bytes=BLOCK,
              zero_copy=False)
    np.testing.assert_array_equal(c, add_reference(a, b))
    assert placed_blocks, "no block was placed"


def test_tail_block_smaller_than_a_page(device, placed_blocks):
    rows = 2 * BLOCK // 4 + 100  # the tail block is 400 bytes: edges only, nothing to lock
    a = np.arange(rows, dtype=np.float32)
    c = np.zeros_like(a)
    cv.stream(kernel(device, "add"), [a, a], [c], device=device, block_bytes=BLOCK,
              zero_copy=False)
    np.testing.assert_array_equal(c, add_reference(a, a))


def test_pinned_input_beside_a_placed_one(device, placed_blocks):
    rows = 4 * BLOCK // 4
    a = np.arange(rows, dtype=np.float32) % 17
    b = cv.pinned.asarray(np.full(rows, 2.0, np.float32), device=device)
    c = np.zeros_like(a)
    cv.stream(kernel(device, "add"), [a, b], [c], device=device, block_bytes=BLOCK,
              zero_copy=False)
    np.testing.assert_array_equal(c, add_reference(a, b))


def test_a_failed_placement_is_raised_with_pools_at_zero(device, monkeypatch):
    monkeypatch.setattr(placing, "supported", lambda device: True)
    monkeypatch.setattr(placing, "ENABLED", True)
    real, calls = placing.InPlace.place, [0]

    def place(self, block, edge):
        calls[0] += 1
        if calls[0] == 2:
            raise OSError("cannot lock these pages")
        return real(self, block, edge)

    monkeypatch.setattr(placing.InPlace, "place", place)
    rows = 8 * BLOCK // 4
    a = np.ones(rows, np.float32)
    c = np.zeros_like(a)
    try:
        cv.stream(kernel(device, "add"), [a, a], [c], device=device, block_bytes=BLOCK,
                  zero_copy=False)
    except OSError as exc:
        assert "cannot lock" in str(exc)
    else:  # the staging thread may have claimed every block first: then all was staged
        assert calls[0] < 2
        np.testing.assert_array_equal(c, add_reference(a, a))


def test_place_locks_whole_pages_and_copies_the_ends(device):
    data = np.arange(3 * mmap.PAGESIZE, dtype=np.uint8)[5:]  # starts 5 bytes into a page
    inplace = placing.InPlace(device, [data], [1])
    edge = device.pinned_pool.acquire(inplace.edge_bytes())
    placed = inplace.place(Block(0, 0, data.nbytes), edge)
    try:
        parts = placed.pieces[0]
        assert parts is not None
        covered = sorted((offset, offset + part.nbytes) for offset, part in parts)
        assert covered[0][0] == 0 and covered[-1][1] == data.nbytes
        assert all(x[1] == y[0] for x, y in zip(covered, covered[1:], strict=False))
        for offset, part in parts:
            np.testing.assert_array_equal(part, data[offset : offset + part.nbytes])
            if np.shares_memory(part, data):  # the locked interior: whole pages
                assert part.__array_interface__["data"][0] % mmap.PAGESIZE == 0
                assert part.nbytes % mmap.PAGESIZE == 0
        assert len(placed.registrations) == 1
    finally:
        placed.close()
        device.pinned_pool.release(edge)


def test_memmaps_and_strided_arrays_are_not_placed(tmp_path):
    path = tmp_path / "x.bin"
    np.zeros(4096, np.float32).tofile(path)
    assert not placing.lockable(np.memmap(path, np.float32, "r"))
    assert not placing.lockable(np.memmap(path, np.float32, "r")[10:20])
    assert not placing.lockable(np.zeros((10, 10))[:, ::2])
    assert placing.lockable(np.zeros(100)[3:])
