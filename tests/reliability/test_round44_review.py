"""Round forty-four: a review of round forty-three's fold and driver-cache fixes (204f4df).

Tried (scripts under /tmp, not kept): 20,000 seeded random sequences of one to four partials
of 17 kinds (every NumPy bool/int/uint/float/complex type, Python int, float and complex;
scalars, 0-d and 1-d arrays) under "sum", "min" and "max", folded by ``fold.combine`` and
compared with np.sum/np.min/np.max of the partials as one NumPy array, at this tree and at
7186e09; the same kinds through ``cv.stream`` on one device and on two (opencl:0:0 and
opencl:1:0: no difference in 40 random six-block sequences); ``conveyor.dask.reduce`` under
the synchronous scheduler and a LocalCluster(processes=False, n_workers=2,
threads_per_worker=1); kernels' own sum/min/max of float32, int8, uint8, int32 and uint32
(identical at both trees); NumPy float, longdouble, nan, inf, 0, -1 and 1e20 as chain temps'
row shapes.

Found (each a strict xfail asserting the right behaviour):

- bool partials beside unsigned ones are summed in float64 (bool widened to int64, unsigned
  to uint64, int64 + uint64 is float64), where np.sum gives an exact uint64: True and
  2**60 + 1 total 2**60.
- ``conveyor.dask.reduce`` carries a chunk's integer total in its widened type (int64 or
  uint64), not the partials' own: int64 chunks beside uint8 ones total float64 (2**62 + 1
  comes back 2**62, where ``cv.stream`` gives exact int64 since round forty-three), int8 or
  bool chunks beside float16 ones total float64 where ``cv.stream`` gives float16.
- ``reduce="max"``/``"min"`` of a NumPy float16, float32 or complex64 partial and a Python
  number folds in the narrow type (NEP 50: the Python number is weak): float16 1 and 1e5
  give inf where np.max of them gives 100000.0, float32 1 and 1e-50 give 0.
- Tuple partials of Python ints (folded as one object array) and then tuples of float16
  elements: the elements are added in float32 (Python int + float32 stays float32) where
  np.sum gives float64: 2**30 + 1 and 1 give 1073741824.
- ``drivercaches._entry_refusal`` ends its scan at the first entry that vanished between
  listing and stat (an sqlite journal another process removes): the entries after it, a
  symlink to a shared file among them, are not checked.

Held: float32 and complex64 chunk totals kept wide through a LocalCluster (pickled with their
dtype); signed beside unsigned integers in ``cv.stream``; kernels' reductions unchanged;
reduce=f unchanged; the chain temps' NumPy float row shapes.
"""

from __future__ import annotations

import os
import random
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (
    assert_clean,
    first_device_only,  # noqa: F401 (autouse: first device only)
    opencl_c_kernels,  # noqa: F401 (autouse: OpenCL C kernels)
)
from reliakit import (  # noqa: E402
    opencl_c_only as _opencl_callable,
)

import conveyor as cv  # noqa: E402
from conveyor.pipeline.fold import combine  # noqa: E402


def _stepping(partials):
    """A callable whose block k (one float32 row each) returns partials[k]."""
    table = dict(enumerate(partials))

    def step(x_dev, queue, offset, n):
        return table[offset]

    return step


def _streamed(device, partials, op="sum"):
    return cv.stream(_stepping(partials), [np.zeros(len(partials), np.float32)],
                     device=device, reduce=op, block_bytes=4).result


def _np(op, partials):
    return getattr(np, op)(np.array([np.asarray(p) for p in partials]), axis=0)


def _same(got, want) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    return got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)


# -- 1. bool beside unsigned partials ---------------------------------------------------------
def test_bool_and_unsigned_partials_total_exact_uint64_as_np_sum_gives(device):
    _opencl_callable(device)
    for partials in ([np.True_, np.uint64(2**60 + 1)],
                     [np.uint8(200), np.True_, np.uint32(7)],
                     [np.array([True, False]), np.array([2**60 + 1, 3], np.uint64)]):
        want = _np("sum", partials)
        assert want.dtype == np.uint64
        got = _streamed(device, partials)
        assert _same(got, want), (partials, got, want)
    assert_clean(device)


# -- 2. conveyor.dask.reduce: a chunk's integer total ------------------------------------------
def test_dask_reduce_of_integer_chunk_totals_is_what_cv_stream_gives(device):
    _opencl_callable(device)
    dask = pytest.importorskip("dask")
    da = pytest.importorskip("dask.array")
    cvd = pytest.importorskip("conveyor.dask")
    bad = []
    for partials in ([np.int64(2**62), np.uint8(1)],   # cv.stream: int64 2**62 + 1
                     [np.int8(1), np.float16(0.5)],    # cv.stream: float16 1.5
                     [np.True_, np.float16(0.5)],
                     [np.uint8(200), np.int8(-1)]):    # cv.stream: int64 199
        x = np.zeros(len(partials), np.float32)
        whole = _streamed(device, partials)
        with dask.config.set(scheduler="synchronous"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got = cvd.reduce(_stepping(partials), da.from_array(x, chunks=1), "sum",
                             device=device.spec, block_bytes=4).compute()
        if type(got) is not type(whole) or got != whole:
            bad.append((partials, got, whole))
    assert not bad, bad
    assert_clean(device)


# -- 3. min/max of a narrow NumPy float beside a Python number ---------------------------------
@pytest.mark.parametrize("op, partials", [
    ("max", [np.float16(1), 1e5]),
    ("max", [1e5, np.float16(1)]),
    ("max", [np.True_, np.float16(1), 1073741825.0]),
    ("min", [np.float32(1), 1e-50]),
    ("max", [1073741825 + 0j, np.complex64(1)]),
], ids=["f16-then-float", "float-then-f16", "bool-f16-float", "f32-tiny", "complex-c64"])
def test_min_max_of_narrow_floats_beside_python_numbers_as_np_gives(device, op, partials):
    _opencl_callable(device)
    want = _np(op, partials)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # float16's overflow in the cast
        got = _streamed(device, partials, op)
    assert _same(got, want), (got, want)
    assert_clean(device)


# -- 4. tuples of Python ints, then of float16 --------------------------------------------------
def test_python_int_tuples_then_float16_tuples_total_float64_as_np_sum_gives(device):
    _opencl_callable(device)
    partials = [(2**30 + 1, 5), (np.float16(1), np.float16(1))]
    want = tuple(np.sum(np.array([p[i] for p in partials])) for i in range(2))
    assert want == (np.float64(2**30 + 2), np.float64(6))
    got = _streamed(device, partials)
    assert type(got) is tuple and all(_same(g, w) for g, w in zip(got, want, strict=True)), got
    # the same elements one by one (not tuples) are right today:
    assert _same(_streamed(device, [2**30 + 1, np.float16(1)]), np.float64(2**30 + 2))
    assert_clean(device)


# -- 5. PyOpenCL's cache entries: one that vanishes mid-scan -----------------------------------
def test_an_entry_removed_mid_scan_does_not_end_the_check(tmp_path, monkeypatch):
    # XDG_CACHE_HOME and its pytools/ are ours and 0700. pytools/ holds an sqlite journal
    # that another process removes as the scan reaches it (listed, gone at its stat), and a
    # symlink to a 0666 file in a shared folder: the scan must still see the link.
    from conveyor.backends import drivercaches

    base = tmp_path / "xdg"
    (base / "pytools").mkdir(parents=True, mode=0o700)
    base.chmod(0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "db.sqlite").touch()
    (shared / "db.sqlite").chmod(0o666)
    journal = base / "pytools" / "pdict-v5-a.sqlite-journal"
    journal.touch()
    (base / "pytools" / "pdict-v5-b.sqlite").symlink_to(shared / "db.sqlite")
    # seen when nothing vanishes:
    assert "symbolic link" in (drivercaches.unsafe_reason(str(base)) or "")

    real_scandir = os.scandir

    class _Vanishing:
        """os.scandir's entries, the journal first, removed just before it is handed out."""

        def __init__(self, folder):
            self._real = real_scandir(folder)
            self._entries = sorted(self._real, key=lambda e: e.name != journal.name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._real.close()

        def __iter__(self):
            for entry in self._entries:
                if entry.name == journal.name:
                    journal.unlink()
                yield entry

    monkeypatch.setattr(drivercaches.os, "scandir", _Vanishing)
    assert "symbolic link" in (drivercaches.unsafe_reason(str(base)) or "")


# -- guards -------------------------------------------------------------------------------------
_KINDS = (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
          np.float16, np.float32, np.float64, np.complex64, np.complex128)


def test_numpy_sum_partials_fold_as_np_sum_over_random_sequences():
    # guard: 400 seeded sequences of NumPy partials (no bool beside unsigned: finding 1) in
    # np.sum's type, and its value (floats: the fold adds wider, so to within rounding).
    rng = random.Random(44)
    for _ in range(400):
        kinds = [rng.choice(_KINDS) for _ in range(rng.randint(1, 4))]
        shape = rng.choice([(), (3,)])
        partials = [np.array([rng.choice([0, 1, 3, 100]) for _ in range(3)],
                             k)[:shape[0] if shape else 1].reshape(shape) for k in kinds]
        partials = [p[()] if p.ndim == 0 and rng.random() < 0.7 else p for p in partials]
        want = _np("sum", partials)
        got = np.asarray(combine("sum", list(partials)))
        assert got.dtype == want.dtype and np.allclose(got, want), (partials, got, want)


def test_int64_partials_wrap_as_np_sum_wraps():
    # guard: an int64 total past 2**63 wraps as np.sum's does, with uint8 beside it too.
    for partials in ([np.int64(2**63 - 1), np.int64(1)], [np.int64(2**63 - 1), np.uint8(1)]):
        with np.errstate(over="ignore"):
            want = _np("sum", partials)
        assert _same(combine("sum", partials), want), partials
