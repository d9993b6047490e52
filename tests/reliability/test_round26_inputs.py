"""Round twenty-six, helper B: a review of how inputs become blocks (validate, plan, chunks,
halo, shaped, structs, constant, supply, and the parts of stream.py and step.py that call
them), each branch tried against NumPy on PoCL.

Found (each a strict xfail asserting the right behaviour, seen failing on the code before
its fix, and a plain test since):

- **Refusal of legal work, with a message that says nothing to change**: a kernel that
  declares a signed ``long offset`` (or ``int offset``) in a stream with a negative
  ``first_row`` (margin rows, as ``conveyor.dask`` passes with a boundary) fails at its
  first launch: ``KernelStep.enqueue`` (step.py:119) wraps the offset modulo 2**64 and passes
  ``np.uint64``, which the cast to ``long`` refuses ("18446744073709551613 cannot be passed
  as kernel parameter 'offset' (long offset)"); ``check_counts_fit`` (step.py:70) skips
  negative offsets, so a narrow unsigned ``uint offset`` is refused the same way, at launch.
- The same through ``conveyor.dask.map_blocks(k, x, halo=1, boundary="reflect")``: every
  chunk that starts at row 0 fails, where the README promises offsets from ``-h``.
- **Partial writes, then a refusal**: a chain link's ``uint offset`` (an ``n`` too narrow
  goes the same way; only offset was run) is never checked before the first block:
  ``check_counts_fit`` runs for a single kernel only (step.py:113), not for ``ChainStep``'s
  links (chainstep.py:47-55). A stream whose later blocks' offsets pass 2**32 writes its
  first blocks, then fails with "pass a uint32 value" (not "declare it ulong"), where the
  same kernel alone is refused before any work.

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit

from reliakit import opencl_c_only  # noqa: E402

import conveyor as cv  # noqa: E402

_OFFSET_SRC = """__kernel void at(__global const float *x, __global long *y, {t} offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) y[i] = (long)offset + (long)i;
}}"""


@pytest.mark.parametrize("ctype", ["long", "int"])
def test_a_signed_offset_parameter_receives_a_negative_first_row_as_is(device, ctype):
    """A kernel declaring ``long offset`` is told the block's element offset; with margin
    rows before the whole array's row 0 (``first_row=-3``, as conveyor.dask passes with a
    boundary) that offset is -3, which a ``long`` (and an ``int``) holds."""
    opencl_c_only(device)
    k = device.compile(_OFFSET_SRC.format(t=ctype), "at")
    x = np.zeros(6, np.float32)
    y = np.zeros(6, np.int64)
    cv.stream(k, [x], [y], first_row=-3, block_bytes=8, device=device)
    np.testing.assert_array_equal(y, np.arange(-3, 3))


def test_a_narrow_unsigned_offset_with_a_negative_first_row_says_declare_ulong(device):
    """``uint offset`` cannot hold -3 (nor its wrap): refused before any block, saying what
    to change, as a too-large offset is."""
    opencl_c_only(device)
    k = device.compile(_OFFSET_SRC.format(t="uint"), "at")
    x = np.zeros(6, np.float32)
    y = np.full(6, 7, np.int64)
    with pytest.raises(cv.InputError, match="declare it ulong"):
        cv.stream(k, [x], [y], first_row=-3, block_bytes=8, device=device)
    np.testing.assert_array_equal(y, 7)


_LINK_A = """__kernel void a(__global const float *x, __global float *t, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) t[i] = x[i] * 2;
}"""
_LINK_B = """__kernel void b(__global const float *t, __global float *y, uint offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = t[i] + (float)(offset % 7);
}"""


def test_a_chain_links_narrow_offset_is_refused_before_any_block(device):
    """The same ``uint offset`` kernel that a single-kernel stream refuses before any work
    (offsets past 2**32) is refused so as a chain's link, and no output row is written."""
    opencl_c_only(device)
    ka, kb = device.compile(_LINK_A, "a"), device.compile(_LINK_B, "b")
    x = np.ones(20, np.float32)
    y = np.full(20, -1, np.float32)
    with pytest.raises(cv.InputError, match="declare it ulong"):
        cv.stream(cv.chain([ka, kb], temps=[np.float32]), [x], [y],
                  first_row=2**32 - 10, block_bytes=20, device=device)
    np.testing.assert_array_equal(y, -1)


def test_guard_a_single_kernels_narrow_offset_is_refused_before_any_block(device):
    """guard: the single-kernel case of the test above (step.check_counts_fit)."""
    opencl_c_only(device)
    kb = device.compile(_LINK_B, "b")
    x = np.ones(20, np.float32)
    y = np.full(20, -1, np.float32)
    with pytest.raises(cv.InputError, match="declare it ulong"):
        cv.stream(kb, [x], [y], first_row=2**32 - 10, block_bytes=20, device=device)
    np.testing.assert_array_equal(y, -1)


_STEN = """__kernel void sten(__global const int *x, __global int *y, ulong cols, ulong h,
                           ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    int s = 0;
    for (ulong k = 0; k <= 2 * h; k++) s = s * 3 + x[i + k * cols];
    y[i] = s;
}"""


def _stencil(x: np.ndarray, h: int, boundary) -> np.ndarray:
    mode = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}.get(boundary,
                                                                                "constant")
    extra = {"constant_values": boundary} if mode == "constant" else {}
    p = np.pad(x, [(h, h)] + [(0, 0)] * (x.ndim - 1), mode=mode, **extra)
    out = np.zeros_like(x)
    for k in range(2 * h + 1):
        out = out * 3 + p[k : k + len(x)]
    return out


def test_guard_halos_past_the_data_on_every_path_equal_np_pad(device):
    """guard: halos longer than the data (one block) and near the block size (several), every
    boundary, staged, pinned and in place, rows of one and of three elements: np.pad's rows."""
    opencl_c_only(device)
    k = device.compile(_STEN, "sten")
    rng = np.random.default_rng(26)
    cases = [(1, 3, None), (3, 7, None), (5, 2, 2), (7, 3, 3), (16, 2, 3), (9, 1, 1)]
    for (rows, h, blocks), boundary, cols in zip(
            cases * 4, ["nearest", "reflect", "periodic", -5] * 6, [1, 3] * 12, strict=False):
        x = rng.integers(-3, 4, (rows, cols) if cols > 1 else (rows,)).astype(np.int32)
        want = _stencil(x, h, boundary)
        kw = dict(halo=h, boundary=boundary, args=(cols, h), device=device)
        if blocks:
            kw["block_bytes"] = blocks * 4 * cols
        y = np.zeros_like(x)
        cv.stream(k, [x], [y], zero_copy=False, **kw)
        np.testing.assert_array_equal(y, want)
        xp = cv.pinned.empty(x.shape, x.dtype, device=device)
        xp[...] = x
        y = np.zeros_like(x)
        cv.stream(k, [xp], [y], **kw)
        np.testing.assert_array_equal(y, want)
        cv.stream(k, [xp], [xp], **kw)  # pinned, in place
        np.testing.assert_array_equal(xp, want)
        del xp


_ADD = """__kernel void f(__global const float *a, __global const float *b, __global float *c,
                      ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) c[i] = a[i] + 2.0f * b[i] + (float)((offset + i) % 5);
}"""


def test_guard_inputs_of_unusual_strides_stream_as_numpy_reads_them(device):
    """guard: negative strides, steps, broadcast (zero) strides, unaligned and record-field
    views (strides not a multiple of the item size), Fortran order and (n, 1) rows, on the
    default path and in one-row blocks."""
    opencl_c_only(device)
    k = device.compile(_ADD, "f")
    rng = np.random.default_rng(7)
    for shape in [(7,), (5, 3), (4, 1), (3, 2, 2)]:
        n, rest = shape[0], shape[1:]
        base = rng.integers(-9, 9, (2 * n + 3, *[2 * r + 1 for r in rest])).astype(np.float32)
        cut = (slice(None), *(slice(0, r) for r in rest))
        raw = np.zeros(int(np.prod(shape)) * 4 + 8, np.uint8)
        rec = np.zeros(shape, np.dtype([("p", "u1"), ("v", "f4")]))
        rec["v"] = rng.integers(-9, 9, shape)
        views = [base[::-1][:n][cut], base[::2][:n][cut],
                 np.broadcast_to(base[0][cut[1:]], shape),
                 np.frombuffer(raw.data, np.float32, int(np.prod(shape)), 1).reshape(shape),
                 rec["v"], np.asfortranarray(base[:n][cut])]
        b = base[:n][cut].copy()
        for a in views:
            want = a + 2 * b + (np.arange(a.size) % 5).reshape(shape).astype(np.float32)
            for kw in ({}, {"block_bytes": 4 * max(int(np.prod(rest)), 1)}):
                c = np.full(shape, np.nan, np.float32)
                cv.stream(k, [a, b], [c], device=device, **kw)
                np.testing.assert_array_equal(c, want)


def test_dask_map_blocks_with_a_boundary_gives_a_long_offset_its_negative_rows(device):
    """A kernel that declares ``long offset`` under conveyor.dask with a boundary: each row
    gets its own offset. (Found when the first chunk's stream ran over dask's pad rows with
    offsets from -h, which a ``long offset`` refused at launch; since round 26 a chunk's
    stream runs over its own rows only, its neighbours given as its halo.)"""
    opencl_c_only(device)
    dask = pytest.importorskip("dask")
    import dask.array as da

    import conveyor.dask as cvd

    k = device.compile(_OFFSET_SRC.format(t="long"), "at")
    x = da.from_array(np.zeros(12, np.float32), chunks=4)
    with dask.config.set(scheduler="synchronous"):
        got = cvd.map_blocks(k, x, dtype=np.int64, halo=1, boundary="reflect",
                             device=device.spec).compute()
    np.testing.assert_array_equal(got, np.arange(12))
