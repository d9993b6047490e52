"""Round forty-three: a review of round forty-two's fixes (ff04d91, 4963a1e, aa5b12a).

Tried (scripts under /tmp, not kept): every pair of 14 NumPy types of a callable's "sum"
partials (scalars and 1-d arrays), and 20,000 seeded random lists of one to four partials of
12 kinds (NumPy types, Python int and float), folded by ``fold.combine`` against np.sum of
the same partials, at this tree and at 7186e09; ``conveyor.dask.reduce`` of float32 partials
against ``cv.stream`` over the whole array; integral floats, inf, nan, True, 1e300, 2**70
and Fraction(4, 2) as ``cv.per_block`` / ``cv.rows`` shapes and ratios (constructed, and
streamed); writable resident tables shared with streams a callable starts.

Found (each a strict xfail asserting the right behaviour):

- float32 and complex64 partials (or bool/int8/float16 with complex64 and a float32) now
  total complex128: ``reduce.widened`` makes the float32 partial float64 (round forty-one),
  and the cast back (round forty-two) is only to float16 or float32, not to the promoted
  complex64 np.sum gives.
- float16 partials with a Python float (or int): np.sum of the partials is float64, the fold
  gives float32 (1.0 + 1e-9 is 1.0): the float16 partial is widened to float32 only, and a
  Python number does not widen a NumPy float32 (NEP 50). ``_dtype_off`` stops the cast back
  but does not widen.
- Signed and unsigned integer partials (int64 and uint8, int32 and uint16...): np.sum gives
  int64 (exact), the fold float64 (2**62 + 1 comes back as 2**62): ``widened`` makes the
  unsigned ones uint64, and int64 + uint64 is float64.
- ``conveyor.dask.reduce`` of a callable's float32 partials casts each chunk's total to
  float32 before the chunks are folded (``halves_kept_wide`` keeps only float16 totals
  wide): 3e38, 3e38, -3e38, -3e38 in chunks of two give nan where ``cv.stream`` gives 0,
  and 2**24, 1, 1, 1 give 16777218 where ``cv.stream`` gives 16777220.
- A stream a callable starts on a thread of its own (a ThreadPoolExecutor) with the outer
  stream's writable table waits for the outer stream, which waits for the callable: a hang
  for ever (the thread has a fresh context, so ``_holder`` names no enclosing stream).
- ``unsafe_reason`` checks the drivers' ``pocl/`` and ``pytools/`` folders but nothing in
  them: ``pocl/kcache`` (PoCL's dlopen'ed kernels) or PyOpenCL's invoker database linked
  into a shared 0777 folder is called safe.
- A chain temp ``(np.float32(3.0), np.int32)`` is a float32 temp of input 0's row shape:
  ``_temp`` takes Python floats as row shapes but not NumPy's other floats, and
  ``np.dtype`` of the pair gives the scalar's type. ``np.float16(3.0)`` is "no dtype".

Held (not kept as tests but for one guard): huge integral floats as shapes and ratios are
refused with a message when streamed; 2.5, inf, nan and True are refused at once;
``conveyor --help | head -c 1`` exits 0 (help fits the pipe: no EPIPE, as for any tool).
"""

from __future__ import annotations

import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (
    HIST,
    assert_clean,
    first_device_only,  # noqa: F401 (autouse: first device only)
    opencl_c_kernels,  # noqa: F401 (autouse: OpenCL C kernels)
)
from reliakit import (  # noqa: E402
    opencl_c_only as _opencl_callable,
)

import conveyor as cv  # noqa: E402
from conveyor import interrupts  # noqa: E402
from conveyor.hazards import HazardWarning  # noqa: E402
from conveyor.pipeline import resident  # noqa: E402
from conveyor.pipeline.fold import combine  # noqa: E402


def _summed(device, partials):
    """A callable's "sum" over one block per partial (block k gives partials[k])."""
    def step(x_dev, queue, offset, n):
        return partials[offset]

    return cv.stream(step, [np.zeros(len(partials), np.float32)], device=device,
                     reduce="sum", block_bytes=4).result


# -- 1. the promoted type of a callable's sum partials -----------------------------------------
_COMPLEX = {
    "float32, complex64": [np.float32(1.5), np.complex64(2 + 1j)],
    "complex64, float32": [np.complex64(2 + 1j), np.float32(1.5)],
    "1-d arrays": [np.array([1.5], np.float32), np.array([2 + 1j], np.complex64)],
    "float16, float32, complex64": [np.float16(1), np.float32(1.5), np.complex64(1j)],
}


@pytest.mark.parametrize("kind", sorted(_COMPLEX))
def test_float32_and_complex64_partials_total_complex64_as_np_sum_gives(device, kind):
    _opencl_callable(device)
    partials = _COMPLEX[kind]
    want = np.sum(np.stack([np.asarray(p) for p in partials]), axis=0)
    assert want.dtype == np.complex64
    got = _summed(device, partials)
    assert np.asarray(got).dtype == np.complex64, (got, want)
    assert np.array_equal(got, want)
    assert_clean(device)


def test_float16_partials_with_python_numbers_total_float64_as_np_sum_gives(device):
    _opencl_callable(device)
    for partials in ([np.float16(1), 1e-9], [1e-9, np.float16(1)],
                     [np.float16(1), 2**30 + 1], [np.float16(0.5), 0.25, np.float16(2)]):
        want = np.sum(np.array(partials))
        assert want.dtype == np.float64
        got = _summed(device, partials)
        assert np.asarray(got).dtype == np.float64 and got == want, (partials, got, want)
    assert_clean(device)


def test_signed_and_unsigned_integer_partials_total_exact_int64_as_np_sum_gives(device):
    _opencl_callable(device)
    for partials in ([np.int64(2**62), np.uint8(1)], [np.uint16(1), np.int32(2)],
                     [np.array([2**62], np.int64), np.array([1], np.uint32)]):
        want = np.sum(np.stack([np.asarray(p) for p in partials]), axis=0)
        assert want.dtype == np.int64
        got = _summed(device, partials)
        assert np.asarray(got).dtype == np.int64 and np.array_equal(got, want), (partials, got)
    assert_clean(device)


def test_the_fold_keeps_np_sums_type_for_float_partials_of_numpy_types():
    # guard (fixed by ff04d91): float16/float32 beside narrow integers and bools give the
    # type np.sum gives (float16 or float32), not float64.
    kinds = (np.float16, np.float32, np.int8, np.int16, np.uint8, np.uint16, np.bool_)
    for a in kinds[:2]:
        for b in kinds:
            partials = [a(1), b(1), a(2)]
            want = np.sum(np.array(partials))
            got = combine("sum", partials)
            assert type(got) is type(want) and got == want, (a, b, got, want)


# -- 2. conveyor.dask.reduce of float32 partials -----------------------------------------------
def test_dask_reduce_of_float32_partials_is_what_cv_stream_gives(device):
    _opencl_callable(device)
    dask = pytest.importorskip("dask")
    da = pytest.importorskip("dask.array")
    cvd = pytest.importorskip("conveyor.dask")

    def step(x_dev, queue, offset, n):
        return np.float32(x_dev.get().sum())

    for values in ([3e38, 3e38, -3e38, -3e38], [2**24, 1, 1, 1]):
        x = np.array(values, np.float32)
        whole = cv.stream(step, [x], device=device, reduce="sum", block_bytes=4).result
        with dask.config.set(scheduler="synchronous"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got = cvd.reduce(step, da.from_array(x, chunks=2), "sum", device=device.spec,
                             block_bytes=4).compute()
        assert type(got) is type(whole) is np.float32, (got, whole)
        assert got == whole, (values, got, whole)
    assert_clean(device)


# -- 3. a writable table and a stream from a thread the callable starts ------------------------
class _WouldWait(RuntimeError):
    """resident.claim was about to wait for a writable table."""


@pytest.mark.filterwarnings("ignore::conveyor.hazards.HazardWarning")
@pytest.mark.xfail(strict=True, reason="a stream a callable starts on its own thread waits "
                   "for the outer stream's writable table, which waits for it: a hang")
def test_a_stream_from_a_thread_the_callable_starts_does_not_wait_for_its_outer_stream(
        device, monkeypatch):
    # Today the inner stream's claim waits for ever (the outer stream holds the table and
    # waits for its callable, which waits for the thread). The wait is turned into an error
    # here, so the test ends at once either way.
    k = device.compile(HIST, "hist")
    real = interrupts.wait

    def wait(cond, *args, **kwargs):
        if cond is resident._claims:
            raise _WouldWait("claim would wait: the outer stream holds the table")
        return real(cond, *args, **kwargs)

    monkeypatch.setattr(interrupts, "wait", wait)
    counts = np.zeros(16, np.uint32)
    with cv.resident(counts, writable=True) as t:
        def outer_step(x_dev, queue, offset, n):
            if offset == 0:
                with ThreadPoolExecutor(1) as pool:
                    pool.submit(cv.stream, k, [np.full(100, 7, np.uint32)], device=device,
                                args=(t,), warmup=False).result()
            return np.array([n])

        outer = cv.chain(cv.link(k, reads="in0", args=(t,)), cv.link(outer_step, reads="in0"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HazardWarning)
            cv.stream(outer, [np.full(1000, 5, np.uint32)], device=device, reduce="sum",
                      warmup=False)
    assert counts[5] == 1000 and counts[7] == 100, counts
    assert_clean(device)


# -- 4. the drivers' folders: a link one level below pocl/ or pytools/ -------------------------
@pytest.mark.parametrize("sub", ["pocl/kcache", "pytools/pdict-v5-pyopencl-invoker-cache-v42"
                                 "-nano-3.11.7.final.0.sqlite"])
def test_a_shared_place_linked_inside_the_drivers_folders_is_unsafe(tmp_path, sub):
    # XDG_CACHE_HOME, its pocl/ and pytools/ are ours and 0700, but PoCL's kcache/ (its
    # dlopen'ed kernels) or PyOpenCL's pickled invoker database is a symlink into a team's
    # shared 0777 folder: another user writes code this process runs, as with pocl/ itself
    # linked there (which round forty-two catches).
    from conveyor.backends.drivercaches import unsafe_reason

    base = tmp_path / "xdg"
    for folder in (base, base / "pocl", base / "pytools"):
        folder.mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    target = shared
    if sub.startswith("pytools/"):
        target = shared / "db.sqlite"
        target.touch()
        target.chmod(0o666)
    (base / sub).symlink_to(target)
    assert unsafe_reason(str(base)) is not None
    (base / sub).unlink()
    assert unsafe_reason(str(base)) is None  # the same folders without the link are safe


# -- 5. a chain temp's row shape given as a NumPy float ----------------------------------------
@pytest.mark.parametrize("raw", [np.float32(3.0), np.float16(3.0)], ids=["float32", "float16"])
def test_a_numpy_float_row_shape_of_a_temp_is_taken_as_meant(raw):
    # 3.0 and np.float64(3.0) are taken as 3 (round forty-two); np.float32(3.0) is not a
    # Python float, so the pair goes to np.dtype((np.float32(3.0), np.int32)), which gives
    # float32 (the scalar's type) and drops both the shape and the int32. np.float16(3.0)
    # is told "is no dtype: give ... (row_shape, dtype)", which is what was given.
    def first(x, t, queue, offset, n):
        pass

    def second(t, queue, offset, n):
        pass

    temp = cv.chain([first, second], temps=[(raw, np.int32)]).temps[0]
    assert (temp.dtype, temp.row_shape) == (np.dtype(np.int32), (3,)), temp
