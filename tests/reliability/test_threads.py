"""Many threads streaming on one device at once (issue 8, item 10): every result is right and
the device's pools stay consistent (zero bytes in use, nothing fenced, at the end). The
threads share the device, its pools, its kernels and its pinned pool; each stream has its own
queues and staging threads."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    add_reference,
    assert_clean,
    data,
    kernel,
    stencil_reference,
    store,
    to_host,
)

THREADS = 6
STREAMS_PER_THREAD = 6
ROWS = 20_000


def _kernel_map(device, seed, pinned_io, zero_copy):
    a, b = data((ROWS,), np.float32, seed), data((ROWS,), np.float32, seed + 1)
    if pinned_io:
        a, b = cv.pinned.asarray(a, device=device), cv.pinned.asarray(b, device=device)
        c = cv.pinned.zeros(ROWS, np.float32, device=device)
    else:
        c = np.zeros(ROWS, np.float32)
    cv.stream(kernel(device, "add"), [a, b], [c], device=device, block_bytes=4096 + 4 * seed,
              zero_copy=zero_copy, workers=2)
    np.testing.assert_array_equal(c, add_reference(a, b))


def _callable_map(device, seed, pinned_io, zero_copy):
    x = data((ROWS, 2), np.int32, seed)
    if pinned_io:
        x = cv.pinned.asarray(x, device=device)
    y = np.zeros_like(x)

    def compute(x_dev, y_dev, queue, offset, n):
        store(y_dev, to_host(x_dev, queue) * 3 + 1, queue)

    cv.stream(compute, [x], [y], device=device, block_bytes=8 * 1000 + 8 * seed,
              zero_copy=zero_copy, workers=2)
    np.testing.assert_array_equal(y, x * 3 + 1)


def _stencil(device, seed, pinned_io, zero_copy):
    x = data((ROWS // 4, 3), np.float32, seed)
    y = cv.pinned.zeros(x.shape, np.float32, device=device) if pinned_io else np.zeros_like(x)
    cv.stream(kernel(device, "sten"), [x], [y], device=device, args=(3, 2), halo=2,
              block_bytes=3 * 4 * (200 + seed), workers=2)
    np.testing.assert_array_equal(y, stencil_reference(x, 2))


def _reduction(device, seed, pinned_io, zero_copy):
    x = data((ROWS,), np.int32, seed)
    if pinned_io:
        x = cv.pinned.asarray(x, device=device)
    report = cv.stream(kernel(device, "ident", np.int32), [x], device=device, reduce="sum",
                       block_bytes=4096, zero_copy=zero_copy)
    assert int(report.result) == int(x.astype(np.int64).sum())


KINDS: list[Callable[..., None]] = [_kernel_map, _callable_map, _stencil, _reduction]


def _worker(device, index, barrier, errors):
    try:
        barrier.wait()
        for round_ in range(STREAMS_PER_THREAD):
            seed = 100 * index + round_
            kind = KINDS[(index + round_) % len(KINDS)]
            kind(device, seed, pinned_io=(index + round_) % 2 == 0,
                 zero_copy=None if (index // 2 + round_) % 3 == 0 else False)
    except BaseException as exc:  # reported by the main thread
        exc.add_note(f"thread {index}")
        errors.append(exc)


def _stream_on_threads(device) -> None:
    for name, dtype in (("add", np.float32), ("sten", np.float32), ("ident", np.int32)):
        kernel(device, name, dtype)  # built once, before the threads share it
    errors: list[BaseException] = []
    barrier = threading.Barrier(THREADS)
    threads = [threading.Thread(target=_worker, args=(device, i, barrier, errors),
                                name=f"streamer-{i}") for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    if errors:
        raise errors[0]


def test_streams_on_many_threads_at_once_are_all_right(device):
    _stream_on_threads(device)
    assert_clean(device)


def test_pools_count_the_same_after_threads_as_after_one(device):
    """Hit and miss counts aside, what the pools hold in use and fenced is back to zero, and
    every block they hold can be handed out again (no block was lost or doubled)."""
    _stream_on_threads(device)
    for pool in (device.memory_pool, device.pinned_pool):
        stats = pool.stats()
        assert stats.in_use_bytes == 0 and stats.pending_bytes == 0
        held = stats.held_bytes
        blocks = []
        with pool._lock:
            sizes = [size for size, free in pool._free.items() for _ in free]
        for size in sizes:
            blocks.append(pool.acquire(size))
        assert len({id(b) for b in blocks}) == len(blocks)  # no block handed out twice
        assert pool.stats().in_use_bytes == held and pool.stats().held_bytes == 0
        for block in blocks:
            pool.release(block)
        assert pool.stats().held_bytes == held


@pytest.mark.parametrize("kind", ["memory_pool", "pinned_pool"])
def test_pool_acquire_and_release_race_keeps_the_books(device, kind):
    """Threads hammering one pool directly: every acquire gets a block nobody else holds."""
    pool = getattr(device, kind)
    owners: dict[int, int] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []
    barrier = threading.Barrier(THREADS)

    def hammer(index):
        try:
            barrier.wait()
            for round_ in range(200):
                block = pool.acquire(4096 * (1 + (index + round_) % 3))
                with lock:
                    assert id(block) not in owners, "a block handed out twice"
                    owners[id(block)] = index
                with lock:
                    del owners[id(block)]
                pool.release(block)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    assert pool.stats().in_use_bytes == 0 and pool.stats().blocks_in_use == 0
