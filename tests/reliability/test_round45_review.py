"""Round forty-five: a review of round forty-four's fixes (9ab8501, 6a63c32, 112ed1c).

Tried (scripts under /tmp/r45rev, not kept): 20,000 seeded sequences of one to four partials
of every NumPy bool/int/uint/float/complex scalar type (and, in a second run, Python float and
complex) under "sum", "min" and "max", folded by ``fold.combine`` and compared with
np.sum/np.min/np.max of the partials as one NumPy array, at this tree and at 7186e09 (696
mismatches there, 15 here, every one an integer total that wrapped before a float partial
came); a Kernel, a chain of kernels and a chain of links built for opencl:1:0 streamed with
``device=`` [d0, d1], [d0], ("opencl:0:0",) and "opencl:0:0,"; a writable and a read-only
``cv.resident`` handle in a callable's args, flat and nested, on one device and on two, and in
a callable link's args; POCL_EXTRA_BUILD_FLAGS set after ``cv.device()`` but before the first
build (honoured by PoCL: x5), and set after a PyOpenCL elementwise build inside a callable
(honoured too); PyOpenCL alone: a build with the variable unset, then one with it set, gives
3 then 5, and an unset after that still 5 (PoCL keeps a value once it has seen one set).

Found (each a strict xfail asserting the right behaviour):

- ``device=[d0]`` (or a tuple, or a comma spec, of one device) refuses a chain whose kernels
  were built for d1, which ``device=[d0, d1]`` runs (round forty-four made a bare Kernel work
  on a list of one, not a chain's kernels).
- A writable ``cv.resident`` handle in a callable's args is refused on one device but taken
  over two devices (the callable gets the handle; nothing is copied back), the very case
  6a63c32 refuses.
- min/max of float32/float16/complex64 partials beside a Python bool come back float64 /
  complex128 where np.max of them is float32 (7186e09 gave float32): 9ab8501 widens beside
  any non-NumPy value, a Python bool among them, which NumPy does not let widen a float.
- Integer partials that wrap before a float partial arrives: np.sum promotes the whole array
  to float64 first (no wrap); the fold adds the integers in int64/uint64 first (a sign flip).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import assert_clean  # noqa: E402

import conveyor as cv  # noqa: E402
from conveyor.pipeline.fold import combine  # noqa: E402

SCALE = cv.portable("""
__kernel void scale(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}""")


def _opencl(pair) -> None:
    for dev in pair:
        if dev.backend != "opencl":
            pytest.skip("OpenCL C kernels and PyOpenCL arrays")


def _np(op, partials):
    with np.errstate(all="ignore"):
        return getattr(np, op)(np.array(partials))


def _same(got, want) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    return got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)


# -- 1. a chain of another device's kernels on a list of one device -----------------------------
@pytest.mark.parametrize("linked", [False, True], ids=["bare-kernels", "links"])
def test_a_chain_of_the_other_devices_kernels_runs_on_a_list_of_one_as_on_two(pair, linked):
    """Code that streams a chain over ``devices[:k]``: for k = 2 each device gets the chain's
    kernels built for it (multi._chain_for); for k = 1 (a list of one, "the one-device
    stream") the same chain is an InputError, as a bare Kernel was before round forty-four."""
    _opencl(pair)
    d0, d1 = pair
    of_d1 = d1.compile(SCALE, "scale")
    x = np.arange(3001, dtype=np.float32)

    def made():
        if linked:
            return cv.chain(cv.link(of_d1, "in0", "t0"), cv.link(of_d1, "t0", "out0"),
                            temps=[np.float32])
        return cv.chain(of_d1, of_d1, temps=[np.float32])

    y = np.zeros_like(x)
    cv.stream(made(), [x], [y], device=[d0, d1], block_bytes=4000)
    np.testing.assert_array_equal(y, 4 * x)
    for one in ([d0], (d0.spec,), f"{d0.spec},"):
        y[:] = 0
        cv.stream(made(), [x], [y], device=one, block_bytes=4000)
        np.testing.assert_array_equal(y, 4 * x)
    for dev in pair:
        assert_clean(dev)


# -- 2. a writable resident handle in a callable's args over two devices ------------------------
def test_a_writable_table_in_a_callables_args_is_refused_over_two_devices_as_on_one(pair):
    """6a63c32: a writable handle in a callable's args is an InputError (the callable gets
    the handle itself, and the copy-back the table promises would never happen). The check
    sits on the one-device path only (stream.py, ``refuse_in_callable_args``); over two
    devices the stream runs and hands the handle to the callable on each device."""
    _opencl(pair)
    d0, d1 = pair
    x = np.ones(1000, np.float32)
    seen = []

    def count(a, *args, queue, offset, n):
        seen.append(type(args[0]).__name__)
        return np.int64(n)

    table = np.zeros(4, np.int32)
    with cv.resident(table, writable=True) as handle:
        with pytest.raises(cv.InputError, match="writable cv.resident"):
            cv.stream(count, [x], device=d0, reduce="sum", args=(handle,), block_bytes=400)
        with pytest.raises(cv.InputError, match="writable cv.resident"):
            cv.stream(count, [x], device=[d0, d1], reduce="sum", args=(handle,),
                      block_bytes=400)
    assert not seen, seen


# -- 3. min/max of narrow floats beside a Python bool -------------------------------------------
@pytest.mark.parametrize("op, partials", [
    ("max", [np.float32(0.0), True]),
    ("min", [True, np.float32(200.0)]),
    ("max", [np.float16(-1.0), np.uint16(100), False]),
    ("min", [np.complex64(100), True]),
], ids=["f32-max", "f32-min", "f16-u16-max", "c64-min"])
def test_min_max_of_narrow_floats_beside_a_python_bool_keep_numpys_type(op, partials):
    """A callable returning ``bool(flag)`` for an empty block beside float32 values: NumPy's
    array of them is float32 (a Python bool widens nothing), and 7186e09 gave float32. Since
    9ab8501 ``Fold._fold`` marks any non-NumPy partial as a Python number (``_dtype_off``)
    and compares everything as float64."""
    want = _np(op, partials)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = combine(op, list(partials))
    assert _same(got, want), (got, want)


def test_min_max_of_narrow_floats_beside_python_numbers_stay_wide():
    # guard (9ab8501): a Python int or float beside float16/float32 compares as float64.
    for op, partials in (("max", [np.float16(1), 1e5]), ("max", [np.float32(2.5), 7]),
                         ("max", [np.float16(1), 3])):
        assert _same(combine(op, list(partials)), _np(op, partials)), partials


# -- 4. integer totals that wrap before a float partial -----------------------------------------
@pytest.mark.parametrize("partials", [
    [np.int64(-2**63 + 5), np.int64(-7), np.float64(1.0)],
    [np.uint64(200), np.uint64(2**64 - 1), np.float64(200.0)],
], ids=["int64-sign-flip", "uint64-wrap"])
def test_integer_partials_then_a_float_sum_as_np_sum_gives(partials):
    """np.sum of the partials is float64 with no wrap (-9.2e18; 1.8e19); the fold wrapped
    the integers first (+9.2e18, a sign flip; 399.0). The same at 7186e09. Fixed in session
    23: the fold keeps the integer partials' float64 sum for a float partial that comes."""
    want = _np("sum", partials)
    with np.errstate(all="ignore"):
        got = combine("sum", list(partials))
    assert _same(got, want), (got, want)
