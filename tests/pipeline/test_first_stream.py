"""Issue 17, the first stream: staging rings that grow beside the stream, outputs faulted in
ahead of the stage-out (madvise, and the fallback forced by CONVEYOR_PREFAULT=touch), and
outputs conveyor allocates itself."""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import pytest
from streamkit import add_reference, data, kernel

import conveyor as cv
from conveyor.errors import OutOfMemoryError
from conveyor.memory import hostmem, prefault
from conveyor.pipeline import ring as ring_module
from conveyor.pipeline import staged as staged_module

ROWS = 64 * 1024  # 16 blocks of 16 KiB per float32 array
BLOCK = 16 * 1024


def _stream(device, a, b, c, **kw):
    return cv.stream(kernel(device, "add"), [a, b], [c], device=device, block_bytes=BLOCK,
                     zero_copy=False, **kw)


def _rings(monkeypatch) -> list[ring_module.Ring]:
    """Every Ring the streams make (the real class, recorded)."""
    made: list[ring_module.Ring] = []

    class Recorded(ring_module.Ring):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            made.append(self)

    monkeypatch.setattr(staged_module, "Ring", Recorded)
    return made


# -- the growing ring ------------------------------------------------------------------------
def test_a_ring_on_an_empty_pool_starts_with_one_entry_and_grows_to_its_target(device):
    pool = device.pinned_pool
    pool.trim()
    ring = ring_module.Ring(pool, [4096, 8192], 5, grow=True)
    assert len(ring) == 1 and not ring.complete
    added: list[int] = []
    ring.start(added.append)
    assert ring._thread is not None
    ring._thread.join()  # the grower ends once the ring is complete
    assert len(ring) == 5 and ring.complete and added == [1, 2, 3, 4]
    assert all(len(entry) == 2 for entry in ring.entries)
    ring.give_back()
    assert pool.stats().in_use_bytes == 0
    # The pool now holds the entries idle: the next ring takes one when made (every ring of
    # a stream its first before any takes more) and the rest at once when it starts.
    warm = ring_module.Ring(pool, [4096, 8192], 5, grow=True)
    assert len(warm) == 1
    warm.start(lambda index: None)
    assert len(warm) == 5 and warm.complete and warm._thread is None
    hits = pool.stats().hits
    warm.give_back()
    assert hits >= 10


def test_without_growth_the_whole_ring_is_allocated_up_front(device, monkeypatch):
    monkeypatch.setenv("CONVEYOR_RING_GROW", "0")
    device.pinned_pool.trim()
    ring = ring_module.Ring(device.pinned_pool, [4096], 4)
    assert len(ring) == 1  # every ring of a stream takes its first entry before any more
    ring.start(lambda index: None)
    assert len(ring) == 4 and ring.complete and ring._thread is None
    ring.give_back()


def test_a_stream_from_an_empty_pool_is_exact_and_returns_every_buffer(device, monkeypatch):
    made = _rings(monkeypatch)
    device.pinned_pool.trim()
    a, b = data((ROWS,), np.float32, 1), data((ROWS,), np.float32, 2)
    c = np.empty_like(a)
    _stream(device, a, b, c)
    np.testing.assert_array_equal(c, add_reference(a, b))
    assert len(made) == 2  # inputs, outputs
    assert all(len(r) == 0 for r in made)  # given back
    assert device.pinned_pool.stats().in_use_bytes == 0


def test_a_growth_that_runs_out_of_memory_only_stops_the_growth(device, monkeypatch):
    made = _rings(monkeypatch)
    pool = device.pinned_pool
    pool.trim()
    sizes = 2 * pool.bin_size(BLOCK) + pool.bin_size(BLOCK)  # one entry in, one entry out
    old = pool.limit
    pool.limit = sizes + pool.bin_size(BLOCK) // 2  # room for the first entries only
    try:
        a, b = data((ROWS,), np.float32, 3), data((ROWS,), np.float32, 4)
        c = np.empty_like(a)
        _stream(device, a, b, c)
    finally:
        pool.limit = old
    np.testing.assert_array_equal(c, add_reference(a, b))
    errors = [r.error for r in made]
    assert any(isinstance(e, OutOfMemoryError) for e in errors), errors


def test_a_stage_ahead_uses_entries_announced_while_it_runs(device):
    """The staging thread starts on one entry and takes the next as soon as it is added."""
    from conveyor.pipeline.plan import Block
    from conveyor.pipeline.stage import Stager, StageTask
    from conveyor.pipeline.staging import StageAhead

    pins = [device.pinned_pool.acquire(4096) for _ in range(2)]
    ring = [[pins[0]]]
    blocks = [Block(k, k, k + 1) for k in range(4)]
    src = np.arange(4 * 1024, dtype=np.uint8).reshape(4, 1024)
    used: list[int] = []

    def fill(block, entry):
        used.append(id(entry[0]))
        return [StageTask(entry[0].array[:1024], src[block.index], f"block {block.index}")]

    stager = Stager(2)
    ahead = StageAhead(stager, ring, blocks, fill, [], None)
    ahead.start()
    try:
        got = [bytes(ahead.take(0)[0].array[:1024])]
        ring.append([pins[1]])
        ahead.added(1)  # before block 0 is released: block 1 can only be staged into it
        got.append(bytes(ahead.take(1)[0].array[:1024]))
        ahead.release(0, [])
        ahead.release(1, [])
        for k in (2, 3):
            got.append(bytes(ahead.take(k)[0].array[:1024]))
            ahead.release(k, [])
    finally:
        ahead.close()
        stager.close()
        for pin in pins:
            device.pinned_pool.release(pin)
    assert got == [bytes(row) for row in src]
    assert used[:2] == [id(ring[0][0]), id(ring[1][0])]


# -- pre-faulting outputs ----------------------------------------------------------------------
def _prefaulters(monkeypatch) -> list[prefault.Prefaulter]:
    made: list[prefault.Prefaulter] = []

    class Recorded(prefault.Prefaulter):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            made.append(self)

    monkeypatch.setattr(staged_module, "Prefaulter", Recorded)
    return made


@pytest.mark.parametrize("mode", ["madvise", "touch"])
def test_a_fresh_output_is_faulted_ahead_and_exact(device, monkeypatch, mode):
    monkeypatch.setenv("CONVEYOR_PREFAULT", mode)
    made = _prefaulters(monkeypatch)
    a, b = data((ROWS,), np.float32, 5), data((ROWS,), np.float32, 6)
    c = np.empty_like(a)
    _stream(device, a, b, c)
    np.testing.assert_array_equal(c, add_reference(a, b))
    (faulter,) = made
    if mode == "touch":
        assert faulter.ways == {"touch"}  # the fallback ran, forced
    else:
        assert faulter.ways and faulter.ways <= {"madvise", "touch"}


def test_prefault_off_makes_no_prefaulter_and_stays_exact(device, monkeypatch):
    monkeypatch.setenv("CONVEYOR_PREFAULT", "off")
    made = _prefaulters(monkeypatch)
    a, b = data((ROWS,), np.float32, 7), data((ROWS,), np.float32, 8)
    c = np.empty_like(a)
    _stream(device, a, b, c)
    np.testing.assert_array_equal(c, add_reference(a, b))
    assert all(not p.enabled for p in made)


def test_an_in_place_output_is_faulted_without_changing_its_rows(device, monkeypatch):
    monkeypatch.setenv("CONVEYOR_PREFAULT", "touch")
    a, b = data((ROWS,), np.float32, 9), data((ROWS,), np.float32, 10)
    want = add_reference(a, b)
    _stream(device, a, b, a)
    np.testing.assert_array_equal(a, want)


@pytest.mark.parametrize("mode", ["madvise", "touch"])
def test_populate_keeps_what_memory_holds(mode):
    held = np.arange(3 * mmap.PAGESIZE + 5, dtype=np.uint8)[3:]  # not page-aligned
    before = held.copy()
    assert prefault.populate(held, mode) in ("madvise", "touch")
    np.testing.assert_array_equal(held, before)
    fresh = np.empty(64 * 2**20, np.uint8)  # mmapped: no page resident yet
    assert prefault.populate(fresh, mode) == mode
    assert _resident_share(fresh) >= 0.9  # every page is there now
    fresh[:] = 1
    assert int(fresh.sum()) == fresh.nbytes


def _resident_share(array: np.ndarray) -> float:
    """The share of ``array``'s pages in memory, asked of the kernel page by page (mincore),
    not read off the process's resident size (/proc/self/statm), a counter that read the same
    before and after populating 64 MiB once on the H100's host."""
    libc = ctypes.CDLL(None, use_errno=True)
    start = array.ctypes.data // mmap.PAGESIZE * mmap.PAGESIZE
    length = array.ctypes.data + array.nbytes - start
    pages = -(-length // mmap.PAGESIZE)
    flags = (ctypes.c_ubyte * pages)()
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), flags) == 0
    return sum(flag & 1 for flag in flags) / pages


def test_a_bad_prefault_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv("CONVEYOR_PREFAULT", "sometimes")
    with pytest.raises(cv.InputError, match="CONVEYOR_PREFAULT"):
        prefault.Prefaulter()


def test_an_output_conveyor_allocates_is_exact(device):
    a, b = data((ROWS,), np.float32, 11), data((ROWS,), np.float32, 12)
    report = cv.stream(kernel(device, "add"), [a, b], [np.float32], device=device,
                       block_bytes=BLOCK, zero_copy=False)
    np.testing.assert_array_equal(report.outputs[0], add_reference(a, b))
    big = prefault.empty((4 * 2**20,), np.dtype(np.float32))
    assert big.shape == (4 * 2**20,) and big.dtype == np.float32


def test_faulted_anonymous_memory_reads_as_zeros_and_is_given_back():
    assert hostmem.fits(4096) and not hostmem.fits(1 << 60)  # more than any host: the driver's
    address = hostmem.map_faulted(5 * 2**20 + 3)
    try:
        view = hostmem.view(address, hostmem.round_up(5 * 2**20 + 3))
        assert view.nbytes % mmap.PAGESIZE == 0 and not view.any()
        view[:] = 7
        assert int(view[-1]) == 7
    finally:
        hostmem.unmap(address, 5 * 2**20 + 3)
