"""Round thirty-two: one job, every entry point. The same small jobs (maps, stencils with
halos under each boundary, sum/min/max reductions; int8 to uint64, float32/64, bool; lengths
0, 1, primes, block edges) run through every road that applies: NumPy arrays, memmaps, pinned
arrays, ``keep_pinned``, ``zero_copy``, ``first_row``, ``.npy`` paths, ``cv.npy``,
``cv.raw``, ``cv.parquet``, ``cv.arrow``, ``cv.npy_out``, ``cv.raw_out``, memmap outputs,
``cv.iterate``, two-kernel chains, in place, both PoCL devices at once, ``conveyor.dask``
(``map_blocks``, ``reduce``, ``stream``) on a two-worker LocalCluster and the ``conveyor
map|reduce`` command, each compared with NumPy and with the others.

Method (seeded generators and probes kept out of the repository, under /tmp/r32e): about
160 generated jobs through some 30 local roads each (about 4,800 streams), 52 jobs through
``conveyor.dask`` and the command (about 450 calls), and probes of records, callables and
custom folds, resident and writable tables, ``cv.rows``/``cv.per_block`` over two devices,
pinned views, ``cv.pinned.register``, SVM arrays, in place with halos, NaN folds, first_row
(negative, past 2**32) with halos and chains, 3,840 Parquet/Arrow stencils across row
groups, file modes/links/leftovers on every writing road, ``--arg`` and ``--cast`` against
the library. Everything agreed with NumPy and across roads except what is below (strict
xfails asserting the right behaviour); one guard is kept.

Found:

- **Refusal of legal work, misleading message**: a bool ``cv.iterate`` input read through a
  ``bool*`` parameter with ``halo=`` fails at the first block ("read once, in order: rows
  0: are gone"); under ``boundary='periodic'`` it says the same instead of the periodic
  refusal. ``halo.Pads`` tests ``isinstance(source, IterSource)``, and
  ``validate.guard_bools`` has wrapped the source in an ``io.BoolChecked``.
- **Refusal, inconsistent by length**: ``reduce='sum'`` of a kernel writing ``bool`` values
  gives int64 0 for no rows and is refused for any rows (``reduce._C_TYPES`` has no bool,
  though ``partial_dtype`` plans an int64 count for it).
- **Refusal of legal work**: ``conveyor.dask.map_blocks`` refuses a halo longer than the
  array (``cv.stream`` and ``conveyor.dask.stream`` take it).
- **Refusal of legal work**: ``conveyor.dask.reduce`` takes no ``halo=``/``boundary=``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import (  # noqa: E402, F401 (first_device_only: autouse, first device only)
    first_device_only,
    opencl_c_only,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

# Halo 1: rows i-1, i, i+1 weighted 1, 2, 4.
BSTEN = """
__kernel void bsten(__global const bool *x, __global int *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (int)x[i] + 2 * (int)x[i + 1] + 4 * (int)x[i + 2];
}
__kernel void usten(__global const uchar *x, __global int *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (int)x[i] + 2 * (int)x[i + 1] + 4 * (int)x[i + 2];
}
"""
BITS = np.array([1, 0, 0, 1, 1, 0, 1, 0, 0, 0, 1, 1], bool)


def _sten_reference(x: np.ndarray, mode: str, **pad: object) -> np.ndarray:
    p = np.pad(x.astype(np.int32), 1, mode=mode, **pad)  # type: ignore[call-overload]
    return p[:-2] + 2 * p[1:-1] + 4 * p[2:]


# -- refusals of legal work ---------------------------------------------------------------------
def test_an_iterable_of_bools_through_a_bool_pointer_takes_a_halo(device):
    """The same bits and halo as an array, a uchar iterable, and a bool iterable: all must
    agree. Today the bool iterable alone fails: ``halo.Pads`` asks ``isinstance(source,
    IterSource)`` to read the rows after the input late, but ``validate.guard_bools`` has
    wrapped the source in an ``io.BoolChecked``, so the back pad rows are read before the
    first block, the iterable runs to its end and the first block's rows are gone."""
    opencl_c_only(device)
    k = device.compile(BSTEN, "bsten")
    want = _sten_reference(BITS, "edge")
    got = cv.stream(k, [BITS], [np.int32], halo=1, device=device).outputs[0]
    np.testing.assert_array_equal(got, want)  # the array road holds
    ku = device.compile(BSTEN, "usten")
    got = cv.stream(ku, [cv.iterate(iter([BITS[:5].view(np.uint8), BITS[5:].view(np.uint8)]),
                                    len(BITS))], [np.int32], halo=1, device=device).outputs[0]
    np.testing.assert_array_equal(got, want)  # so does a uchar iterable
    got = cv.stream(k, [cv.iterate(iter([BITS[:5], BITS[5:]]), len(BITS))], [np.int32],
                    halo=1, device=device).outputs[0]
    np.testing.assert_array_equal(got, want)


def test_a_periodic_iterable_of_bools_is_refused_for_being_periodic(device):
    """An iterable under ``boundary='periodic'`` is refused before any work with a message
    that says why (its last rows would be needed first); a bool one read through ``bool*``
    gets the misleading "read once, in order: rows 0: are gone" instead (same cause:
    ``Pads`` does not see the IterSource inside the ``BoolChecked``)."""
    opencl_c_only(device)
    k = device.compile(BSTEN, "usten")
    with pytest.raises(InputError, match="periodic"):
        cv.stream(k, [cv.iterate(iter([BITS.view(np.uint8)]), len(BITS))], [np.int32],
                  halo=1, boundary="periodic", device=device)
    k = device.compile(BSTEN, "bsten")
    with pytest.raises(InputError, match="periodic"):
        cv.stream(k, [cv.iterate(iter([BITS]), len(BITS))], [np.int32], halo=1,
                  boundary="periodic", device=device)


FLAGS = """
__kernel void flag(__global const int *x, __global bool *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (x[i] % 3) == 0;
}
"""


def test_a_bool_valued_reduction_counts_as_numpy_does(device):
    """A kernel writing per-element flags (``bool*``) reduced with ``"sum"``: the empty input
    gives NumPy's ``np.sum`` of no bools (int64 0), but any input with rows is refused
    ("cannot reduce elements of dtype bool on the device"), on every road (local, two
    devices, conveyor.dask, the command). ``reduce.partial_dtype`` plans an int64 count for a
    bool sum, but ``reduce._C_TYPES`` (reduce.py:40) has no bool, so ``kernel_source``
    refuses it. Right: the count, as ``np.sum`` gives it (and min/max: False/True)."""
    opencl_c_only(device)
    k = device.compile(FLAGS, "flag")
    empty = cv.stream(k, [np.zeros(0, np.int32)], reduce="sum", device=device).result
    assert empty == 0 and np.asarray(empty).dtype == np.int64  # holds today
    x = np.arange(-20, 21, dtype=np.int32)
    want = np.sum((x % 3) == 0)
    got = cv.stream(k, [x], reduce="sum", device=device, block_bytes=64).result
    assert got == want and np.asarray(got).dtype == np.int64
    assert cv.stream(k, [x], reduce="max", device=device).result == np.max((x % 3) == 0)


STEN2 = """
__kernel void sten(__global const int *x, __global int *y, int h, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) {
        int s = 0;
        for (int k = 0; k <= 2 * h; k++) s += (k + 1) * x[i + k];
        y[i] = s + (int)((offset + i) % 7);
    }
}
"""


def _sten2_reference(x: np.ndarray, h: int, mode: str) -> np.ndarray:
    p = np.pad(x, h, mode=mode)  # type: ignore[call-overload]
    s = np.zeros(len(x), np.int32)
    for k in range(2 * h + 1):
        s += (k + 1) * p[k : k + len(x)]
    return s + (np.arange(len(x)) % 7).astype(np.int32)


def test_dask_map_blocks_takes_a_halo_longer_than_the_array(device):
    """``cv.stream(k, [x], halo=3)`` on 2 rows is legal and right (the README: "A halo may
    be longer than the whole array when it fits in one block"); the same job through
    ``conveyor.dask.map_blocks`` is refused at graph time (dask/arrays.py:78), while
    ``conveyor.dask.stream`` over the same rows in a ``.npy`` takes it and is right (tried
    with 1 to 3 rows and halo 3). The array is then one chunk with nothing beside it: its
    stream can take the pad rows of the whole array as its halo (``halo.rows_around`` makes
    them) without dask's overlap."""
    opencl_c_only(device)
    da = pytest.importorskip("dask.array")
    dask = pytest.importorskip("dask")
    import conveyor.dask as cvd

    x = np.array([5, -3], np.int32)
    for mode, boundary in (("edge", "nearest"), ("symmetric", "reflect"), ("wrap", "periodic")):
        want = _sten2_reference(x, 3, mode)
        local = cv.stream(device.compile(STEN2, "sten"), [x], [np.int32], halo=3,
                          boundary=boundary, args=(3,), device=device).outputs[0]
        np.testing.assert_array_equal(local, want)  # the local road holds
        with dask.config.set(scheduler="synchronous"):
            got = cvd.map_blocks(cvd.kernel(STEN2, "sten"), da.from_array(x, chunks=1),
                                 args=(3,), halo=3, boundary=boundary,
                                 device=device.spec).compute()
        np.testing.assert_array_equal(got, want)



SREDUCE = """
__kernel void sr(__global const int *x, __global long *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (long)x[i] * 3 + (long)x[i + 1] * 5 + (long)x[i + 2] * 7;
}
"""


def test_dask_reduce_takes_a_halo_as_the_other_roads_do(device):
    """A stencil reduction (halo 1) is one call on every other road: ``cv.stream(k, [x],
    reduce="sum", halo=1, boundary=...)`` (array, file, iterable, two devices) and
    ``conveyor.dask.stream(k, [path], reduce="sum", halo=1)`` agree with NumPy; the same job
    over a dask array, ``conveyor.dask.reduce``, is an InputError ("unknown option(s)
    boundary, halo": dask/arrays.py ``reduce`` has no ``halo``/``boundary`` and passes the
    rest to ``_stream_options``), and the message does not say what to use instead.
    ``map_blocks`` already gives each chunk its neighbours' rows (``Source.beside``); the
    reduction's chunks can take them the same way."""
    opencl_c_only(device)
    da = pytest.importorskip("dask.array")
    dask = pytest.importorskip("dask")
    import conveyor.dask as cvd

    x = np.random.default_rng(7).integers(-100, 100, 11).astype(np.int32)
    p = np.pad(x, 1, mode="symmetric").astype(np.int64)
    want = np.sum(p[:-2] * 3 + p[1:-1] * 5 + p[2:] * 7)
    local = cv.stream(device.compile(SREDUCE, "sr"), [x], reduce="sum", halo=1,
                      boundary="reflect", device=device).result
    assert local == want  # the local road holds
    with dask.config.set(scheduler="synchronous"):
        got = cvd.reduce(cvd.kernel(SREDUCE, "sr"), da.from_array(x, chunks=4), "sum",
                         halo=1, boundary="reflect", device=device.spec).compute()
    assert got == want

# -- guards: roads that agreed, kept because each takes another path through the engine ------------
def test_one_stencil_agrees_on_every_local_road(pair, tmp_path):
    """One stencil (halo 2, each boundary, first_row 5, blocks of 3 rows) through an array, a
    ``.npy`` by path and by ``cv.npy``, a memmap, a pinned array, ``cv.iterate`` (not
    periodic) and both devices at once (the ``pair`` fixture): all equal NumPy's."""
    device = pair[0]
    x = np.random.default_rng(32).integers(-100, 100, 23).astype(np.int32)
    np.save(tmp_path / "x.npy", x)
    k = device.compile(STEN2, "sten")
    for mode, boundary in (("edge", "nearest"), ("symmetric", "reflect"), ("wrap", "periodic"),
                           ("constant", -4)):
        pad = {"constant_values": boundary} if mode == "constant" else {}
        p = np.pad(x, 2, mode=mode, **pad)  # type: ignore[call-overload]
        want = sum((j + 1) * p[j : j + len(x)] for j in range(5)) + (np.arange(5, 28) % 7)
        pinned = cv.pinned.empty(x.shape, x.dtype, device=device)
        pinned[:] = x
        roads = {"array": [x], "path": [str(tmp_path / "x.npy")],
                 "cv.npy": [cv.npy(tmp_path / "x.npy")],
                 "memmap": [np.load(tmp_path / "x.npy", mmap_mode="r")], "pinned": [pinned]}
        if boundary != "periodic":
            roads["iterate"] = [cv.iterate(iter([x[:4], x[4:]]), len(x))]
        for road, inputs in roads.items():
            got = cv.stream(k, inputs, [np.int32], halo=2, boundary=boundary, args=(2,),
                            first_row=5, block_bytes=12, device=device).outputs[0]
            np.testing.assert_array_equal(got, want, err_msg=f"{road} {boundary}")
        del pinned
        got = cv.stream(k, [x], [np.int32], halo=2, boundary=boundary, args=(2,), first_row=5,
                        block_bytes=12, device=pair).outputs[0]
        np.testing.assert_array_equal(got, want, err_msg=f"two devices {boundary}")
