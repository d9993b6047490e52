"""Round forty-six: host memory as a resource (pinned arrays, kept arrays, pools, budgets),
tried as a long-lived program and an attacker would.

Tried: ``keep_pinned`` of views, slices of one base, overlapping views, read-only copies,
records, 0-size and 1-byte arrays, kept and released and dropped at random between streams
with the budget changed (a seeded fuzz of 900 steps, /tmp/r46m/fuzz1.py: every stream equal
to NumPy's); the budget as ints, floats, NumPy scalars and strings ("1.5GiB", "-1", "nan",
"1e400", " 1 KiB "); four threads streaming one kept input and one pinned input while a fifth
releases, re-keeps and changes the budget; streams that fail (a callable raising an error,
KeyboardInterrupt or MemoryError on its fourth block, a ``cv.iterate`` generator raising, a
refused stream) with kept arrays (no hold left behind, every byte back, no thread or fd
left); ``memory_limit`` from 1 byte to 2**64 and as strings; the peak device bytes under
random memory limits, depths and halos; CONVEYOR_PREFAULT=touch/madvise with in-place, halo
and adjacent-view outputs; the memory variables' bad values.

Found (strict xfails, each asserting the right behaviour):

- a device whose pinned pool has a ``limit`` too small for ``depth + 2`` one-page staging
  entries streams in blocks of one row (20,000 blocks for 80 KB; 8.7 s against 0.19 s with
  ``block_bytes=4096`` under the same limit): ``plan._fit_staging`` shrinks the block until
  the page-rounded ring fits, which no block size below a page can make it do;
- the same limit cuts the blocks of streams that stage nothing: zero-copy streams and
  streams of ``cv.pinned`` arrays, which take no staging ring at all, run in one-row blocks;
- a stream that ran under a pinned limit on fewer ring entries than it wanted fails the next
  time with OutOfMemoryError: its input ring takes every idle block the first run left
  (``Ring.__init__``'s idle hits, up to the whole target) before the output ring has its one
  entry (also with the default plan: 40 KiB, depth 3, 100,000 float32 rows: ok, then OOM);
- the plan fits the staging rings to the pinned pool's whole limit, not to what pinned arrays
  in use leave of it: a pinned input of 940 KiB under a 1 MiB limit is an OutOfMemoryError
  on the first stream, where blocks of a few KiB fit.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import _first_device_only, add_reference, kernel  # noqa: E402

from conveyor.memory import keep as keeping  # noqa: E402

PAGE = 4096


def _second_context(device: cv.Device) -> cv.Device:
    """Another Device (own context and pools) for the same OpenCL device: the pools whose
    limits a test sets are then its own."""
    if device.backend != "opencl":
        pytest.skip("a second context is made for OpenCL devices only")
    from conveyor.backends import opencl

    platform, index = (int(part) for part in device.spec.split(":")[1:])
    return opencl.Device(device.cl_device, platform, index)  # type: ignore[attr-defined]


@pytest.fixture
def ctx(device, request):
    """A second context on ``device`` (the first device only: the planning under test is
    conveyor's), closed after the test."""
    _first_device_only(request)
    made = _second_context(device)
    yield made
    gc.collect()
    made.close()


# -- the pinned pool's limit and the block size -----------------------------------------------
@pytest.mark.parametrize("limit, depth, n", [("12KiB", 1, 1536), ("24KiB", 2, 2100)])
def test_a_small_pinned_limit_never_cuts_staged_blocks_below_a_page(ctx, limit, depth, n):
    # 3 arrays of float32: one staging entry of one page each is 12 KiB; depth + 2 of them do
    # not fit the limit at any block size, so shrinking below a page cannot help: the ring
    # grows only as far as the limit lets it whatever the block (block_bytes=4096 streams
    # under the same limit, in blocks of a page).
    k = kernel(ctx, "add")
    a = np.arange(n, dtype=np.float32)
    c = np.zeros_like(a)
    ctx.pinned_pool.limit = limit
    report = cv.stream(k, [a, a], [c], device=ctx, zero_copy=False, depth=depth)
    np.testing.assert_array_equal(c, add_reference(a, a))
    assert report.blocks <= -(-a.nbytes // PAGE), report.blocks  # blocks of a page or more


def test_a_stream_that_ran_under_a_pinned_limit_runs_again(ctx):
    # The first stream runs on fewer ring entries than it wants (the growth stops at the
    # limit); the same stream again found 6 idle pages, took all of them for its inputs'
    # ring and had none left for its output's first entry.
    k = kernel(ctx, "add")
    a = np.arange(2100, dtype=np.float32)
    ctx.pinned_pool.limit = "24KiB"
    for _ in range(3):
        c = np.zeros_like(a)
        cv.stream(k, [a, a], [c], device=ctx, zero_copy=False, depth=2, block_bytes=PAGE)
        np.testing.assert_array_equal(c, add_reference(a, a))


@pytest.mark.parametrize("how", ["zero-copy", "pinned arrays"])
def test_a_pinned_limit_does_not_cut_the_blocks_of_streams_that_stage_nothing(ctx, how):
    k = kernel(ctx, "add")
    n = 1536
    if how == "pinned arrays":
        a = cv.pinned.empty(n, np.float32, device=ctx)
        c = cv.pinned.zeros(n, np.float32, device=ctx)
        zero_copy = False
    else:
        if not ctx.host_unified:
            pytest.skip("zero-copy streams need a device in host memory")
        a, c, zero_copy = np.empty(n, np.float32), np.zeros(n, np.float32), True
    a[:] = np.arange(n)
    before = cv.stream(k, [a, a], [c], device=ctx, zero_copy=zero_copy).blocks
    ctx.pinned_pool.limit = "16KiB"  # more than the stream's pinned memory: none
    c[:] = 0
    report = cv.stream(k, [a, a], [c], device=ctx, zero_copy=zero_copy, depth=1)
    np.testing.assert_array_equal(c, add_reference(a, a))
    assert report.blocks == before, (report.blocks, before)


def test_the_staging_rings_fit_what_the_pinned_arrays_in_use_leave_of_the_limit(ctx):
    # A pinned input of 940 KiB under a 1 MiB limit leaves 84 KiB: two staged arrays in
    # blocks of a few KiB fit there. The plan took the whole MiB for three staged arrays.
    k = kernel(ctx, "add")
    n = 240_000
    ctx.pinned_pool.limit = "1MiB"
    p = cv.pinned.empty(n, np.float32, device=ctx)
    p[:] = 1
    a = np.arange(n, dtype=np.float32)
    c = np.zeros_like(a)
    cv.stream(k, [p, a], [c], device=ctx, zero_copy=False)
    np.testing.assert_array_equal(c, add_reference(p, a))


# -- guards --------------------------------------------------------------------------------------
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt, MemoryError])
def test_guard_a_stream_failing_on_its_fourth_block_leaves_no_kept_array_held(device, error):
    # guard: every hold a failed stream took on kept arrays is let go (a hold left behind
    # would keep the registration past release_pinned and the budget for ever)
    if device.backend != "opencl":
        pytest.skip("a PyOpenCL callable")
    a = np.arange(40_000, dtype=np.float32)
    b = np.ones_like(a)
    c = np.zeros_like(a)
    calls = [0]

    def add(x, y, out, *, queue, offset, n):
        calls[0] += 1
        if calls[0] == 4:
            raise error("block 4")
        return x + y

    try:
        with pytest.raises(error):
            cv.stream(add, [a, b], [c], device=device, keep_pinned=True, block_bytes=16_000,
                      warmup=False)
        assert keeping.kept_bytes() == 3 * a.nbytes
        assert all(kept.holds == 0 and not kept.doomed for kept in keeping._kept.values())
        assert cv.release_pinned() == 3 * a.nbytes
        assert keeping.kept_bytes() == 0
    finally:
        cv.release_pinned()
