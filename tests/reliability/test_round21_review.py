"""Round twenty-one, helper A: a review of round twenty's source changes (b7d2145~1..HEAD).

Round twenty kept ``cv.rows(dtype, ratio=(p, q))`` as written (no longer in lowest terms),
folded tuple and list partials of ``reduce=`` element by element (fold.py ``_fold_parts``),
and added refusals: sets and dicts as shapes, NumPy's whole-array folds as ``reduce=``,
``Device.warm_up``'s arguments, ``conveyor.dask``'s client, pool limit/keep, compile options.
Each change was tried for what it broke, what it missed, and where the same bug lives.

Ratios as written held everywhere tried: (2, 4), (3, 6), (4, 2), (6, 4), (4, 6), (6, 9) over
one device and two (dynamic and static schedules), every block size, chains (kernel and
callable links), callables, ``cv.iterate`` inputs, halos and empty inputs, all equal to NumPy;
``conveyor.dask`` refuses ``cv.rows`` outputs (map_blocks, file streams), so no chunk is cut.
The warm-up, pool, Dask-client and compile-option checks take NumPy integers, size strings and
iterables as before.

Found (strict xfails, each asserting the right behaviour):

- **Wrong answer**: a tuple partial that nests a buffer the callable fills again for every
  block (``return ((hist,), n)``, or a list inside the tuple) folds the last blocks' values:
  ``step.partial_of`` copies only the top level's arrays (step.py:413-414), and the fold runs
  when the block retires, depth blocks later. Nested partials are new with ``_fold_parts``.
- **Raw error**: a named tuple partial (``return Hist(counts, n)``) is a raw
  ``TypeError: __new__() missing 1 required positional argument``: ``partial_of`` rebuilds
  it as ``type(result)(generator)`` (step.py:400 and 414), while ``Fold.result`` was written
  to make named tuples from their fields. Through ``conveyor.dask.reduce`` too.
- **Misleading refusal**: a device array nested in a tuple partial (``return ((a,), n)``) is
  refused as "Array: sum takes numbers", though a device array at the top level is brought to
  the host: ``partial_of``'s ``_to_host`` is one level deep (step.py:400).
- **Raw error / silent nonsense**: whole-array folds that ``options._WHOLE_ARRAY_FOLDS`` does
  not list run every block and then fail in the host fold with NumPy's or Python's TypeError
  (``np.nanmedian``, the sibling of the refused ``np.median``; ``np.ptp``; ``math.fsum``;
  ``statistics.mean``; ``np.add.reduce``), or return nonsense (``np.percentile(total,
  partial)`` is the partial-th percentile of the total).
- **Advice that changes the answer**: ``reduce=np.nanmax`` is refused with "give
  reduce='max'", which propagates NaN partials (the result is NaN); the NaN-skipping fold of
  two partials is ``np.fmax`` (``np.fmin`` for ``np.nanmin``).
- **False refusals**: ``pool.limit = 1e9`` and ``pool.keep = 4e9`` are refused, though every
  other size (``block_bytes``, ``memory_limit``, the new ``warm_up(nbytes=)``) takes an
  integral float and ``pool.keep = "1e9"`` is taken; ``cv.per_block`` and ``cv.rows(shape=)``
  refuse an ndarray shape (and a chain temp a range or ndarray row shape) that ``cv.raw``,
  ``cv.npy_out`` and ``cv.pinned.empty`` take.

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import collections
import functools
import math
import operator
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    compiled,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    opencl_c_only,
    store,
    to_host,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

# One source for every kernel of this file: one build per device.
SRC = """
__kernel void grp(__global const int *x, __global int *y, ulong p, ulong q, ulong h,
                  ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n && i % q == 0) {
        int s = 0;
        for (ulong k = 0; k < q; k++) s += x[i + h + k] * (int)(k + 1);
        for (ulong r = 0; r < p; r++) y[(i / q) * p + r] = s * (int)(r + 1);
    } }
__kernel void inc(__global const int *x, __global int *y, ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] + 1; }
"""


def _k(device, name):
    opencl_c_only(device)
    return compiled(device, SRC, name)


def _grouped(x, p, q):
    """Output row o = (sum_k x[q*(o//p) + k] * (k + 1)) * (o % p + 1): ``p`` rows made from
    each whole group of ``q`` input rows, so a group split by a block cut shows."""
    g = x.reshape(-1, q).astype(np.int64) @ np.arange(1, q + 1)
    return (g[:, None] * np.arange(1, p + 1)[None, :]).reshape(-1).astype(np.int32)


def _args(p, q, h=0):
    return (np.uint64(p), np.uint64(q), np.uint64(h))


# -- cv.rows(ratio=(p, q)) kept as written ----------------------------------------------------

RATIOS = [(2, 4), (3, 6), (4, 2), (6, 4)]


def test_guard_ratios_as_written_over_one_and_two_devices(device, pair):
    """guard: ratios not in lowest terms, with blocks that are no multiple of the reduced q
    (``block_bytes`` of 3 groups and a row), on one device and on two (both schedules):
    every group whole, equal to NumPy."""
    for p, q in RATIOS:
        x = ((np.arange(q * 23, dtype=np.int32) * 7 + 3) % 101).astype(np.int32)
        want = _grouped(x, p, q)
        for block_bytes in (None, 4 * (3 * q + 1)):
            got = cv.stream(_k(device, "grp"), [x], [cv.rows(np.int32, ratio=(p, q))],
                            device=device, block_bytes=block_bytes, args=_args(p, q))
            np.testing.assert_array_equal(got.outputs[0], want, err_msg=f"{(p, q)}")
            for schedule in ("dynamic", "static"):
                got = cv.stream(_k(pair[0], "grp"), [x],
                                [cv.rows(np.int32, ratio=(p, q))], device=pair,
                                block_bytes=block_bytes, args=_args(p, q), schedule=schedule)
                np.testing.assert_array_equal(got.outputs[0], want,
                                              err_msg=f"{(p, q)} {schedule}")


def test_guard_ratio_as_written_in_a_chain_with_a_callable_link_and_a_halo(device):
    """guard: ``ratio=(3, 6)`` written by a callable link after a kernel link (the warm-up
    call and every block get whole groups of 6), and by a kernel with ``halo=``."""
    p, q = 3, 6
    x = ((np.arange(q * 23, dtype=np.int32) * 5 + 1) % 97).astype(np.int32)
    want = _grouped(x, p, q)
    seen = []

    def pool(t, y, *, queue, offset, n):
        v = to_host(t, queue)
        seen.append(len(v))
        store(y, _grouped(v, p, q), queue)

    chain = cv.chain(cv.link(_k(device, "inc"), reads="in0", writes="t"),
                     cv.link(pool, reads="t", writes="out0"), temps={"t": np.int32})
    got = cv.stream(chain, [x - 1], [cv.rows(np.int32, ratio=(p, q))], device=device,
                    block_bytes=4 * (2 * q + 4)).outputs[0]
    np.testing.assert_array_equal(got, want)
    assert seen and all(rows % q == 0 for rows in seen), seen
    got = cv.stream(_k(device, "grp"), [x], [cv.rows(np.int32, ratio=(p, q))], device=device,
                    halo=3, block_bytes=4 * (2 * q + 4), args=_args(p, q, 3)).outputs[0]
    np.testing.assert_array_equal(got, want)


# -- tuple and list partials folded element by element ---------------------------------------

def _hist(a, queue):
    return np.bincount(to_host(a, queue).astype(np.int64) % 4, minlength=4)


WANT_HIST = np.bincount(np.arange(40) % 4, minlength=4)


def test_guard_tuple_partials_fold_the_same_over_two_devices(device, pair):
    """guard: a tuple of a histogram, a count and an int64 past 2**53 folds element by
    element, the same over two devices as over one, each element its own total's type."""
    def parts(a, *, queue, offset, n):
        return _hist(a, queue), int(n), np.int64(2**53 + 1)

    x = np.arange(40, dtype=np.float32)
    one = cv.stream(parts, [x], device=device, reduce="sum", block_bytes=40).result
    two = cv.stream(parts, [x], device=pair, reduce="sum", block_bytes=40).result
    for got in (one, two):
        assert isinstance(got, tuple) and len(got) == 3
        np.testing.assert_array_equal(got[0], WANT_HIST)
        assert got[1] == 40
        assert got[2] == 4 * (2**53 + 1) and isinstance(got[2], np.int64)


def test_a_buffer_nested_in_a_tuple_partial_is_copied_when_the_block_returns_it(device):
    """``return ((hist,), n)`` with one histogram buffer the callable fills again for each
    block: each block's values must be folded, not the buffer as it is when the block retires
    (depth blocks later). The flat ``return hist, n`` is right (round fifteen)."""
    buf = np.zeros(4, np.int64)

    def nested(a, *, queue, offset, n):
        buf[:] = _hist(a, queue)
        return (buf,), int(n)

    x = np.arange(40, dtype=np.float32)
    got = cv.stream(nested, [x], device=device, reduce="sum", block_bytes=40, depth=3).result
    np.testing.assert_array_equal(got[0][0], WANT_HIST)  # [8, 8, 12, 12] today
    assert got[1] == 40


Hist = collections.namedtuple("Hist", "counts rows")


def test_a_named_tuple_partial_folds_to_a_named_tuple(device):
    """``return Hist(counts, n)``: a tuple, folded element by element; the total a Hist
    (fold.py's result makes named tuples from their fields). Today ``partial_of`` calls
    ``Hist(generator)``: TypeError, missing 'rows'."""
    def named(a, *, queue, offset, n):
        return Hist(_hist(a, queue), int(n))

    x = np.arange(40, dtype=np.float32)
    got = cv.stream(named, [x], device=device, reduce="sum", block_bytes=40).result
    assert isinstance(got, Hist)
    np.testing.assert_array_equal(got.counts, WANT_HIST)
    assert got.rows == 40


def test_a_device_array_nested_in_a_tuple_partial_is_brought_to_the_host(device):
    """A device array at the top of a tuple partial is brought to the host (``_to_host``);
    one level down it reaches the fold as a device array and is refused as no number.
    (PyOpenCL's arrays have ``get()``; the CUDA backend's bare DeviceArray has no host copy
    at any level, and is refused as no number there, nested or not.)"""
    if device.backend != "opencl":
        pytest.skip("a PyOpenCL array's get()")

    def nested(a, *, queue, offset, n):
        return (a,), int(n)

    x = np.arange(8, dtype=np.float32)
    got = cv.stream(nested, [x], device=device, reduce="sum").result
    np.testing.assert_array_equal(got[0][0], x)
    assert got[1] == 8


# -- reduce= refusals -------------------------------------------------------------------------

@pytest.mark.parametrize("fold", [np.nanmedian, np.ptp, np.percentile, math.fsum,
                                  statistics.mean, np.add.reduce],
                         ids=["nanmedian", "ptp", "percentile", "fsum", "statistics.mean",
                              "add.reduce"])
def test_whole_array_folds_not_listed_are_refused_before_any_block(device, fold):
    """Like ``np.median`` and ``np.prod`` (refused since round twenty): each folds one array
    (a second argument is an axis, a percentile, or too many), so ``reduce=fold`` must be an
    InputError before any block. Today: a TypeError after every block, or (np.percentile) the
    partial-th percentile of the total as the result."""
    calls = []

    def part(a, *, queue, offset, n):
        calls.append(offset)
        return float(n)

    x = np.arange(40, dtype=np.float32)
    with pytest.raises(InputError, match="reduce="):
        cv.stream(part, [x], device=device, reduce=fold, block_bytes=40)
    assert calls == []


def test_the_advice_for_nanmax_keeps_its_nan_skipping():
    """``np.nanmax`` is refused with what to give instead: 'max' folds with np.maximum, which
    returns NaN for a NaN partial, where nanmax's caller wanted NaN skipped; ``np.fmax`` (and
    ``np.fmin`` for nanmin) is the two-partial fold that does."""
    from conveyor.pipeline.options import reduce_op

    for fold, fix in ((np.nanmax, "fmax"), (np.nanmin, "fmin")):
        with pytest.raises(InputError, match=fix):
            reduce_op(fold)


def test_guard_two_partial_folds_and_names_are_taken():
    """guard: np.multiply, operator.add, np.fmax, functools.partial(np.add) and a lambda are
    taken as they are; sum, np.max, np.amin as their names (no false refusal)."""
    from conveyor.pipeline.options import reduce_op

    added = functools.partial(np.add)
    for fold in (np.multiply, operator.add, np.fmax, added, np.logical_and):
        assert reduce_op(fold) is fold
    assert (reduce_op(sum), reduce_op(np.max), reduce_op(np.amin)) == ("sum", "max", "min")


# -- sizes and shapes -------------------------------------------------------------------------

def test_pool_limit_and_keep_take_an_integral_float_as_other_sizes_do(device):
    """``block_bytes=1e9``, ``memory_limit=4e9`` and the new ``warm_up(nbytes=65536.0)``
    take an integral float, and ``pool.keep = "1e9"`` its string; ``pool.limit = 1e9`` is
    refused ("an int or a size like '64MiB'")."""
    pool = device.memory_pool
    old_limit, old_keep = pool.limit, pool.keep
    try:
        pool.keep = "1e9"
        assert pool.keep == 10**9
        pool.limit = 4e9
        pool.keep = 1e9
        assert (pool.limit, pool.keep) == (4 * 10**9, 10**9)
    finally:
        pool.limit, pool.keep = old_limit, old_keep


@pytest.mark.parametrize("make", ["per_block", "rows", "temp"])
def test_an_ndarray_shape_is_taken_by_every_shape_argument(make):
    """``np.array([2, 3])`` is a shape for NumPy and for ``cv.raw``, ``cv.npy_out`` and
    ``cv.pinned.empty``; ``cv.per_block``, ``cv.rows(shape=)`` (shaped._dims: not a
    Sequence) and a chain temp's row shape (chain._temp: tuple or list only, then "is no
    dtype") refuse it."""
    shape = np.array([2, 3])
    if make == "per_block":
        assert cv.per_block(shape, np.float32).shape == (2, 3)
    elif make == "rows":
        assert cv.rows(np.float32, shape=shape).shape == (2, 3)
    else:
        def link(a, t, *, queue, offset, n):
            return None

        temps = cv.chain(link, link, temps=[(shape, np.float32)]).temps
        assert temps[0].row_shape == (2, 3)


def test_guard_shapes_sizes_and_warm_up_take_numpy_values(device, tmp_path):
    """guard: the new set/dict refusals leave a range, an ndarray and NumPy integers as
    shapes of cv.raw, cv.npy_out and cv.pinned.empty; warm_up takes NumPy sizes and a NumPy
    bool; the pool takes NumPy integers; compile options an array of str."""
    raw = tmp_path / "x.bin"
    np.arange(24, dtype=np.float32).tofile(raw)
    for shape in (range(4, 7, 2), np.array([4, 6]), (np.int64(4), np.uint8(6))):
        assert cv.raw(raw, np.float32, shape).shape == (4, 6)
        assert cv.npy_out(tmp_path / "o.npy", np.float32, shape).shape == (4, 6)
        assert cv.pinned.empty(shape, np.float32, device=device).shape == (4, 6)
    for bad in ({4, 6}, {4: 0, 6: 0}):
        with pytest.raises(InputError, match="order of axes"):
            cv.raw(raw, np.float32, bad)
    device.warm_up(np.int64(1 << 14), block_bytes=np.uint16(4096), pinned=np.False_)
    device.wait_for_warm_up(np.float32(5.0))
    pool = device.memory_pool
    old = pool.keep
    try:
        pool.keep = np.uint64(1 << 20)
        assert pool.keep == 1 << 20 and type(pool.keep) is int
    finally:
        pool.keep = old
    from conveyor.backends.base import _build_options

    assert _build_options("k", "k", np.array(["-DN=4"])) == ("-DN=4",)


def test_guard_dask_reduce_folds_tuple_chunk_results(device):
    """guard: ``conveyor.dask.reduce`` folds each chunk's tuple total element by element
    (chunks of 7 rows, blocks of 2 inside them), in the synchronous scheduler: the summed
    histogram and count, as ``cv.stream`` gives them."""
    dask = pytest.importorskip("dask")
    da = pytest.importorskip("dask.array")
    import conveyor.dask as cvd

    def parts(a, *, queue, offset, n):
        return _hist(a, queue), int(n)

    x = np.arange(40, dtype=np.float32)
    with dask.config.set(scheduler="synchronous"):
        got = cvd.reduce(parts, da.from_array(x, chunks=7), "sum", device=device.spec,
                         block_bytes=8).compute()
    hist, count = got[()]
    np.testing.assert_array_equal(hist, WANT_HIST)
    assert count == 40


# -- beside the fixes (the lead) ---------------------------------------------------------------
def test_list_partials_of_one_number_type_fold_as_one_array_with_the_same_totals():
    """Lists of Python ints (a histogram's ``tolist()``) fold as one object array: exact past
    int64 and fast; a later block of other types (or length) turns it into a fold per
    element that goes on from the totals so far."""
    from conveyor.pipeline.fold import Fold, combine

    parts = [[2**62, 1, 7], [2**62, 2, 8], [5, 3, 9]]
    assert combine("sum", parts) == [2**63 + 5, 6, 24]
    assert combine("max", parts) == [2**62, 3, 9]
    mixed = combine("sum", [(1, 2), (3, 4), (0.5, np.int8(1))])  # ints, then other types
    assert mixed == (4.5, 7) and isinstance(mixed, tuple)
    halves = combine("sum", [[np.float16(2048), np.float16(1)], [np.float16(1), np.float16(1)]])
    assert [h.dtype for h in halves] == [np.float16] * 2 and halves[1] == 2
    fold = Fold("sum")
    fold.add([1, 2], 0)
    with pytest.raises(InputError, match="block 1 has 3 elements, block 0's 2"):
        fold.add([1, 2, 3], 1)


_FILES_CHILD = """
import os, resource, sys
import numpy as np
resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))
import conveyor as cv
os.chdir(sys.argv[2])
dev = cv.device(sys.argv[1], warm_up=False)
for i in range(80):
    np.save(f"x{i}.npy", np.arange(4, dtype=np.float32))
def one(*blocks, queue, offset, n):
    return 1.0
for what in ("inputs", "outputs"):
    try:
        if what == "inputs":
            cv.stream(one, [cv.npy(f"x{i}.npy") for i in range(80)], reduce="sum", device=dev)
        else:
            cv.stream(lambda a, *o, queue, offset, n: None, [np.zeros(4, np.float32)],
                      [cv.npy_out(f"o{i}.npy", np.float32) for i in range(80)], device=dev)
        print(what, "ran")
    except OSError as exc:
        print(what, exc)
print("left", sorted(f for f in os.listdir(".") if f.startswith((".", "o"))))
"""


def test_too_many_open_files_are_named_with_what_to_do(device, tmp_path):
    """80 file inputs (or outputs) past ``ulimit -n`` 48: an OSError naming the file, the
    limit and what to change (it was "[Errno 24] Too many open files" with only a path), and
    no part file left. In a child: the limit is the process's."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", _FILES_CHILD, device.spec, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("inputs ") and ".npy: Too many open files" in line
               and "ulimit -n" in line for line in lines), done.stdout
    assert any(line.startswith("outputs ") and "output o" in line and "Too many open files" in line
               for line in lines), done.stdout
    assert lines[-1] == "left []", done.stdout
