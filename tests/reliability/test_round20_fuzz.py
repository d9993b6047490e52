"""Round twenty, helper A: differential fuzzing of one-device streams against NumPy.

A seeded generator (kept outside the repository) built thousands of streams that vary
together: dtypes int8..uint64 and float32/64, row shapes of 1 to 3 dimensions, lengths 0, 1,
2, primes and block sizes +- 1, ``block_bytes``, ``depth``, ``workers``, halos (0 to past
the array) with every boundary, reversed, strided, Fortran-ordered, read-only, unaligned
and pinned inputs, aliased inputs (one array twice, overlapping views), outputs given as
arrays, dtypes and pinned arrays, in place (arrays, memory maps, ``.npy`` paths), scalar
``args=`` of every C type at its edges, ``__global const`` and ``__constant`` tables (plain
and ``cv.resident``, writable ones), ``__constant`` inputs cut to the constant buffer,
``first_row``, ``zero_copy``, ``keep_pinned``, ``cv.iterate`` chunks, ``cv.rows`` and
``cv.per_block`` outputs, chains, callables (writing and returning, with halos) and
reductions (kernel and callable; sum, min, max, custom ``f``; NaN, inf, -0.0, integer
wrap-around). Each result was compared with an independent NumPy reference. Kernel maps,
stencils, tables and kernel reductions agreed everywhere; what differed is below.

Found (strict xfails, each asserting the right behaviour):

- **Wrong answer**: ``cv.rows(dtype, ratio=(2, 4))`` is stored in lowest terms, (1, 2)
  (shaped.Rows.__init__), so blocks are cut at multiples of 2 input rows, not 4: a kernel
  that turns each group of 4 rows into 2 (min and max of the group) gets a group split
  across two blocks, and wrong rows come back with no error. The length check uses the
  reduced ``q`` too: 6 rows with ``ratio=(2, 4)`` are taken (and the refusal of 5 rows
  names ``ratio=(1, 2)``, a ratio the caller never wrote).
- **Raw error**: a callable's reduction returning a tuple of an array and a number (``return
  np.bincount(v, minlength=4), v.size``), or arrays of two lengths, raises NumPy's
  ``ValueError: setting an array element with a sequence`` from the host fold: fold.py folds
  a list or tuple partial as ``np.asarray(partial)``.
- **Wrong answer**: for the same reason a tuple of an int64 and a float (``return
  np.int64(total), mean``) is folded as one float64 array: the integer loses its low bits
  past 2**53 (``(2**53 + 1, 0.5)`` comes back as ``array([9.007199254740992e15, 0.5])``),
  and the result is an ndarray, not a tuple, where ``np.sum`` of each element keeps its type.

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    assert_clean,
    compiled,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    opencl_c_only,
    to_host,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

# One source for every kernel of this file: one build.
SRC = """
__kernel void cp_i(__global const int *x, __global int *y, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i]; }
__kernel void cp_f(__global const double *x, __global double *y, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i]; }
__kernel void add_i(__global const int *a, __global const int *b, __global int *c,
                    ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) c[i] = a[i] ^ b[i]; }
__kernel void st_i(__global const int *x, __global int *y, ulong cols, int h,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (int)((uint)x[i] + 2u * (uint)x[i + (ulong)h * cols]
                            + 4u * (uint)x[i + 2 * (ulong)h * cols]); }
__kernel void lut_i(__global const int *x, __global int *y, __constant int *t, ulong m,
                    ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] ^ t[(offset + i) % m]; }
__kernel void minmax4(__global const int *x, __global int *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n && i % 4 == 0) {
        int lo = x[i], hi = x[i];
        for (ulong k = 1; k < 4; k++) { lo = min(lo, x[i + k]); hi = max(hi, x[i + k]); }
        y[i / 2] = lo; y[i / 2 + 1] = hi;
    } }
"""


def _k(device, name):
    opencl_c_only(device)
    return compiled(device, SRC, name)


# -- cv.rows(ratio=(p, q)) taken in lowest terms ---------------------------------------------

def test_a_ratio_of_2_to_4_cuts_blocks_at_whole_groups_of_4_rows(device):
    """``ratio=(2, 4)``: two output rows (min, max) per group of four input rows. Blocks of
    six rows (``block_bytes=24``) must be cut at a multiple of four (the README: "blocks cut
    at multiples of q rows"); cut at six, the second block starts mid-group."""
    x = np.array([5, 1, 7, 3, 9, 2, 8, 6, 0, 4, 11, 10], np.int32)
    got = cv.stream(_k(device, "minmax4"), [x], [cv.rows(np.int32, ratio=(2, 4))],
                    device=device, block_bytes=24).outputs[0]
    groups = x.reshape(-1, 4)
    want = np.stack([groups.min(axis=1), groups.max(axis=1)], axis=1).reshape(-1)
    np.testing.assert_array_equal(got, want)


def test_a_ratio_of_2_to_4_refuses_rows_that_are_no_whole_groups(device):
    """Six rows hold one and a half groups of four: refused before any work, naming the
    ratio as given."""
    x = np.arange(6, dtype=np.int32)
    with pytest.raises(InputError, match=r"ratio=\(2, 4\)"):
        cv.stream(_k(device, "minmax4"), [x], [cv.rows(np.int32, ratio=(2, 4))],
                  device=device)


def test_guard_a_ratio_in_lowest_terms_pools_across_block_cuts(device):
    """guard: ``ratio=(1, 2)`` as before: 12 rows, blocks of 6 rows, each pair of rows
    pooled (the minmax4 kernel's group of four, two output rows, is one block's worth)."""
    x = np.arange(16, dtype=np.int32)[::-1].copy()
    got = cv.stream(_k(device, "minmax4"), [x], [cv.rows(np.int32, ratio=(1, 2))],
                    device=device, block_bytes=32).outputs[0]
    groups = x.reshape(-1, 4)
    np.testing.assert_array_equal(
        got, np.stack([groups.min(axis=1), groups.max(axis=1)], axis=1).reshape(-1))


# -- a callable's tuple partials folded as one NumPy array -----------------------------------

def _hist_and_count(a, *, queue, offset, n):
    v = to_host(a, queue).astype(np.int64) % 4
    return np.bincount(v, minlength=4), v.size


def test_a_tuple_partial_of_a_histogram_and_a_count_folds_element_by_element(device):
    """``return hist, count``: the README's "List and tuple partials fold element by
    element" gives the summed histogram and the summed count, over one block and over
    several."""
    x = np.arange(40, dtype=np.float32)
    for block_bytes in (None, 40):
        got = cv.stream(_hist_and_count, [x], device=device, reduce="sum",
                        block_bytes=block_bytes).result
        hist, count = got
        np.testing.assert_array_equal(hist, np.bincount(np.arange(40) % 4, minlength=4))
        assert count == 40
    assert_clean(device)


def test_a_tuple_partial_of_an_int64_and_a_float_keeps_the_integer_exact(device):
    """``(np.int64(2**53 + 1), 0.5)`` per block, two blocks: element by element, as
    ``np.sum`` adds each, the integer total is 2**54 + 2 exactly and the float 1.0."""
    x = np.arange(8, dtype=np.float32)

    def partial(a, *, queue, offset, n):
        return np.int64(2**53 + 1), 0.5

    got = cv.stream(partial, [x], device=device, reduce="sum", block_bytes=16).result
    assert int(got[0]) == 2 * (2**53 + 1)
    assert got[1] == 1.0


def test_guard_a_tuple_partial_of_numbers_of_one_kind_folds_as_numpy(device):
    """guard: a tuple of two ints (the case round nineteen's sweep holds) stays exact."""
    x = np.arange(40, dtype=np.float32)

    def partial(a, *, queue, offset, n):
        return n, 2 * n

    got = cv.stream(partial, [x], device=device, reduce="sum", block_bytes=40).result
    assert [int(v) for v in got] == [40, 80]


# -- guards ----------------------------------------------------------------------------------

def test_guard_views_of_the_output_in_another_order_are_refused_as_inputs(device):
    """guard: reversed rows, reversed columns, a transpose and a step-2 view of the output
    overlap it without being its rows: refused (copying and zero-copy), never read after
    being written."""
    k = _k(device, "cp_i")
    a = np.arange(40, dtype=np.int32)
    m = np.arange(40, dtype=np.int32).reshape(20, 2)
    sq = np.arange(36, dtype=np.int32).reshape(6, 6)
    for zero_copy in (None, True):
        for view, out in ((a[::-1], a), (m[:, ::-1], m), (sq.T, sq), (a[::2], a[20:])):
            with pytest.raises(InputError, match="overlap"):
                cv.stream(k, [view], [out], device=device, block_bytes=16,
                          zero_copy=zero_copy)
    np.testing.assert_array_equal(a, np.arange(40))


def test_guard_a_table_and_a_kept_input_changed_between_streams_are_read_again(device):
    """guard: a ``__constant`` table in ``args=`` and a ``keep_pinned`` input, changed in
    place between two streams, are read as they are now (no upload or buffer kept from the
    first stream)."""
    x = np.arange(1000, dtype=np.int32)
    t = np.arange(7, dtype=np.int32)
    for zero_copy in (None, False):
        t[:] = np.arange(7)
        cv.stream(_k(device, "lut_i"), [x], [np.int32], device=device, args=(t, 7),
                  zero_copy=zero_copy, block_bytes=400)
        t[:] = 100
        y = cv.stream(_k(device, "lut_i"), [x], [np.int32], device=device, args=(t, 7),
                      zero_copy=zero_copy, block_bytes=400).outputs[0]
        np.testing.assert_array_equal(y, x ^ 100)
    kept = np.arange(1000, dtype=np.int32)
    out = np.zeros_like(kept)
    try:
        cv.stream(_k(device, "cp_i"), [kept], [out], device=device, keep_pinned=True,
                  block_bytes=400)
        kept[:] = 7
        cv.stream(_k(device, "cp_i"), [kept], [out], device=device, keep_pinned=True,
                  block_bytes=400)
        np.testing.assert_array_equal(out, kept)
    finally:
        cv.release_pinned()


def _pad(x, h, boundary):
    if h == 0 or x.shape[0] == 0:
        return x
    widths = [(h, h)] + [(0, 0)] * (x.ndim - 1)
    modes = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}
    if boundary in modes:
        return np.pad(x, widths, mode=modes[boundary])
    return np.pad(x, widths, mode="constant", constant_values=boundary)


def _layout(rng, base, how, device):
    if how == "rev":
        return base[::-1].copy()[::-1]
    if how == "step":
        big = np.zeros((base.shape[0] * 2, *base.shape[1:]), base.dtype)
        big[::2] = base
        return big[::2]
    if how == "F":
        return np.asfortranarray(base)
    if how == "pinned":
        p = cv.pinned.empty(base.shape, base.dtype, device=device)
        p[...] = base
        return p
    if how == "ro":
        a = base.copy()
        a.setflags(write=False)
        return a
    if how == "unaligned":
        a = np.zeros(base.nbytes + 1, np.uint8)[1:].view(base.dtype).reshape(base.shape)
        a[...] = base
        return a
    return base.copy()


def test_guard_a_small_seeded_sweep_of_layouts_halos_tables_and_folds_equals_numpy(device):
    """guard: 48 seeded streams of the fuzzer's kinds (copies, xors of two inputs, stencils
    with every boundary, ``__constant`` tables with ``first_row``, kernel sums, mins and
    maxes), over lengths 0 to 257, row shapes of 1 to 3 dimensions, every input layout, odd
    block sizes and ``zero_copy``, each equal to NumPy."""
    failures = []
    for seed in range(48):
        r = random.Random(seed)
        rng = np.random.default_rng(seed)
        n = r.choice([0, 1, 2, 7, 31, 64, 65, 257])
        row = r.choice([(), (3,), (2, 2)])
        cols = int(np.prod(row)) if row else 1
        how = r.choice(["c", "rev", "step", "pinned", "ro", "unaligned"]
                       + (["F"] if row else []))
        kind = r.choice(["cp", "add", "st", "lut", "sum", "min", "max"])
        base = rng.integers(-2**31, 2**31 - 1, (n, *row), dtype=np.int32, endpoint=True)
        x = _layout(rng, base, how, device)
        opts = {"block_bytes": r.choice([1, 2, 3, 16, 63]) * cols * 4,
                "zero_copy": r.choice([None, False]), "depth": r.choice([1, 2, 3])}
        what = f"seed {seed}: {kind} n={n} row={row} {how} {opts}"
        if kind == "cp":
            got = cv.stream(_k(device, "cp_i"), [x], [np.int32], device=device,
                            **opts).outputs[0]
            want = base
        elif kind == "add":
            y = _layout(rng, base[::-1].copy(), r.choice(["c", "rev", "step"]), device)
            got = cv.stream(_k(device, "add_i"), [x, y], [np.int32], device=device,
                            **opts).outputs[0]
            want = base ^ base[::-1]
        elif kind == "st":
            h = r.choice([0, 1, 2, n, n + 1])
            boundary = r.choice(["nearest", "reflect", "periodic", 0, -5])
            if h > 2 and n > opts["block_bytes"] // (cols * 4):
                h = 1  # a halo past a block of several is refused: not this sweep's check
            what += f" h={h} {boundary}"
            got = cv.stream(_k(device, "st_i"), [x], [np.int32], device=device,
                            args=(cols, h), halo=h, boundary=boundary, **opts).outputs[0]
            p = _pad(base, h, boundary).astype(np.uint32)
            want = base if n == 0 else (p[:n] + 2 * p[h:h + n] + 4 * p[2 * h:2 * h + n]
                                        ).astype(np.int32)
        elif kind == "lut":
            m = r.choice([1, 7, 100])
            fr = r.choice([0, 5])
            t = rng.integers(-100, 100, m).astype(np.int32)
            got = cv.stream(_k(device, "lut_i"), [x], [np.int32], device=device,
                            args=(t, m), first_row=fr, **opts).outputs[0]
            idx = (np.arange(base.size) + fr * cols) % m
            want = (base.reshape(-1) ^ t[idx]).reshape(base.shape)
        else:
            if n == 0 and kind != "sum":
                continue
            got = cv.stream(_k(device, "cp_i"), [x], device=device, reduce=kind,
                            **opts).result
            want = getattr(base.reshape(-1), kind)(
                **({"dtype": np.int64} if kind == "sum" else {}))
            if np.asarray(got).dtype != np.asarray(want).dtype:
                failures.append(f"{what}: dtype {np.asarray(got).dtype}")
        if not np.array_equal(np.asarray(got), want):
            failures.append(what)
        if not np.array_equal(x, base):
            failures.append(f"{what}: input changed")
    assert not failures, "\n".join(failures)


# -- beside the fixes (the lead): tuple partials fold element by element ----------------------
def test_tuple_partials_keep_their_kind_length_and_nesting():
    """Element by element, each element a partial of its own: a named tuple stays one, a list
    a list, a nested tuple nested; another length or kind at a later block is an InputError
    naming that block."""
    import collections

    from conveyor.pipeline.fold import combine

    Pair = collections.namedtuple("Pair", "hits total")
    got = combine("sum", [Pair(1, 0.5), Pair(2, 0.25)])
    assert isinstance(got, Pair) and got == Pair(3, 0.75)
    got = combine("max", [[np.int8(3), (1, 2.5)], [np.int8(-4), (7, 0.5)]])
    assert isinstance(got, list) and got[0] == 3 and got[1] == (7, 2.5)
    with pytest.raises(InputError, match="block 1 has 3 elements, block 0's 2"):
        combine("sum", [(1, 2), (1, 2, 3)])
    with pytest.raises(InputError, match="block 1 is int"):
        combine("sum", [(1, 2), 3])
    with pytest.raises(InputError, match="block 1 is tuple"):
        combine("sum", [3, (1, 2)])
