"""The fourth round of trying the public API as a demanding user would (chains, shaped outputs,
resident tables, what an output or input may be):

- A chain run in place (``inputs=[a], outputs=[a, b]``) whose later link reads the input after
  an earlier link wrote that output: on the zero-copy path the input's buffer is the
  output's, so the later link read the new values (``b`` came out ``2a + 1``, not ``a + 1``)
  with no error. Such a stream now copies (NumPy's answer), and ``zero_copy=True`` is an
  InputError naming both links.
- An output that is not a NumPy array but has a ``dtype`` (a PyOpenCL or CuPy array, a
  ``cv.resident`` handle, a NumPy scalar) was taken as a dtype: a new array went into
  ``report.outputs`` and the object was never written. Now an InputError that says what to
  pass; the same objects as inputs name themselves instead of "dtype object".
- ``cv.resident`` of a strided or Fortran-order table uploads a contiguous copy; after the
  host array changed, ``refresh()`` uploaded the old copy again (stale values, no error).
- ``cv.rows(shape=3)`` and ``shape="ab"`` raised TypeError/ValueError, ``shape=(2.5,)`` was
  truncated to 2, ``shape=(-1,)`` blamed the ratio; ``cv.per_block(2.0)`` raised TypeError;
  ``ratio=(True, True)`` and ``per_block(True)`` were taken as 1. All InputErrors now.
- ``temps=[(np.int64(3), np.float32)]`` in a chain raised NumPy's ValueError.
- ``keep_pinned="no"`` was taken as True.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import data, kernel  # noqa: E402

import conveyor as cv  # noqa: E402

ROWS = 4_000


def _in_place_chain(device):
    scale = kernel(device, "scale")
    return cv.chain(cv.link(scale, reads="in0", writes="out0", args=(2.0,)),
                    cv.link(scale, reads="in0", writes="out1", args=(3.0,)))


@pytest.mark.parametrize("block_bytes", [None, 4 * 512], ids=["one-block", "blocks"])
def test_chain_in_place_later_link_reads_the_input_as_it_was(device, block_bytes):
    x = data((ROWS,), np.float32, 41)
    a, b = x.copy(), np.zeros_like(x)
    report = cv.stream(_in_place_chain(device), [a], [a, b], device=device,
                       block_bytes=block_bytes)
    np.testing.assert_array_equal(a, x * np.float32(2))
    np.testing.assert_array_equal(b, x * np.float32(3))  # not 6x: the input, not out0
    assert not report.zero_copy


def test_chain_in_place_zero_copy_true_is_refused(device):
    if not device.host_unified:
        pytest.skip("zero-copy needs a device that shares memory with the host")
    a, b = data((ROWS,), np.float32, 42), np.zeros(ROWS, np.float32)
    with pytest.raises(cv.InputError, match=r"link 1 .* reads input in0 after link 0"):
        cv.stream(_in_place_chain(device), [a], [a, b], device=device, zero_copy=True)


def test_chain_in_place_map_runs_zero_copy_when_asked(device):
    """One link reading and writing the same array (a map) runs on the zero-copy path when
    asked (zero_copy=True); unset, an in-place stream copies (round eleven: a kernel that
    reads its input again after writing its output would read its own result)."""
    x = data((ROWS,), np.float32, 43)
    chain = cv.chain(cv.link(kernel(device, "scale"), reads="in0", writes="out0",
                             args=(2.0,)))
    for wanted in (None, True) if device.host_unified else (None,):
        a = x.copy()
        report = cv.stream(chain, [a], [a], device=device, zero_copy=wanted)
        np.testing.assert_array_equal(a, x * np.float32(2))
        assert report.zero_copy == bool(wanted)


class _DeviceArrayLike:
    """Anything with a dtype and a shape that is no NumPy array (a CuPy or PyTorch array)."""

    dtype = np.dtype(np.float32)
    shape = (ROWS,)


@pytest.mark.parametrize("make", [
    lambda: _DeviceArrayLike(),
    lambda: cv.resident(np.zeros(ROWS, np.float32)),
    lambda: np.float32(0),
], ids=["device-array", "resident", "numpy-scalar"])
def test_output_with_a_dtype_that_is_no_array_is_refused(device, make):
    out = make()
    with pytest.raises(cv.InputError, match=r"output 0 is a"):
        cv.stream(kernel(device, "scale"), [data((ROWS,), np.float32, 44)], [out],
                  device=device, args=(2.0,))


def test_dtypes_still_make_new_outputs(device):
    x = data((ROWS,), np.float32, 45)
    for wanted in (np.float32, np.dtype(np.float32)):
        report = cv.stream(kernel(device, "scale"), [x], [wanted], device=device,
                           args=(2.0,))
        np.testing.assert_array_equal(report.outputs[0], x * np.float32(2))


def test_resident_handle_as_input_names_itself(device):
    handle = cv.resident(data((ROWS,), np.float32, 46))
    with pytest.raises(cv.InputError, match=r"input 0 is a cv.resident.*args="):
        cv.stream(kernel(device, "scale"), [handle], [np.float32], device=device,
                  args=(2.0,))


def test_resident_refresh_of_a_strided_table_uploads_the_new_values(device):
    source = """__kernel void pick(__global const int *x, __global float *y,
                                   __global const float *t, ulong offset, ulong n) {
        ulong i = get_global_id(0);
        if (i < n) y[i] = t[x[i]];
    }"""
    pick = device.compile(cv.portable(source), "pick")
    x = (np.arange(100) % 10).astype(np.int32)
    base = np.zeros((10, 2), np.float32)
    table = base[:, 0]  # every other float: not contiguous
    table[:] = np.arange(10)
    with cv.resident(table) as handle:
        first = cv.stream(pick, [x], [np.float32], args=(handle,), device=device)
        np.testing.assert_array_equal(first.outputs[0], table[x])
        table[:] = -np.arange(10)
        handle.refresh()
        second = cv.stream(pick, [x], [np.float32], args=(handle,), device=device)
        np.testing.assert_array_equal(second.outputs[0], table[x])


@pytest.mark.parametrize("make", [
    lambda: cv.rows(np.float32, ratio=(1, 4), shape=3.5),
    lambda: cv.rows(np.float32, ratio=(1, 4), shape="ab"),
    lambda: cv.rows(np.float32, ratio=(1, 4), shape=(2.5,)),
    lambda: cv.rows(np.float32, ratio=(1, 4), shape=(-1,)),
    lambda: cv.rows(np.float32, ratio=(1, 4), shape=(0,)),
    lambda: cv.rows(np.float32, ratio=(True, True)),
    lambda: cv.per_block(2.5, np.float32),  # 2.0 is taken as 2 (round forty-two)
    lambda: cv.per_block(True, np.float32),
    lambda: cv.per_block((2, None), np.float32),
], ids=["rows-float", "rows-str", "rows-fraction", "rows-negative", "rows-zero",
        "ratio-bools", "per-block-float", "per-block-bool", "per-block-none"])
def test_shaped_output_shapes_are_input_errors(make):
    with pytest.raises(cv.InputError, match=r"(rows|per_block)\((shape|ratio)="):
        make()


def test_shaped_output_int_shapes_still_work():
    assert cv.rows(np.float32, ratio=(1, 4), shape=3).shape == (3,)
    assert cv.rows(np.float32, ratio=(1, 4), shape=(np.int64(2), 3)).shape == (2, 3)
    assert cv.per_block(np.int32(2), np.float32).shape == (2,)


def test_chain_temp_row_shape_may_be_a_numpy_int(device):
    x = data((ROWS,), np.float32, 47)
    scale = kernel(device, "scale")
    chain = cv.chain(cv.link(scale, reads="in0", writes="t0", args=(2.0,)),
                     cv.link(scale, reads="t0", writes="out0", args=(3.0,)),
                     temps=[(np.int64(1), np.float32)])
    report = cv.stream(chain, [x], [np.float32], device=device)
    np.testing.assert_array_equal(report.outputs[0], x * np.float32(2) * np.float32(3))
    with pytest.raises(cv.InputError, match=r"temp 't0'"):
        cv.chain([scale, scale], temps=[("f4", "x")])


@pytest.mark.parametrize("value", ["no", 1, None])
def test_keep_pinned_takes_a_bool(device, value):
    with pytest.raises(cv.InputError, match=r"keep_pinned="):
        cv.stream(kernel(device, "scale"), [data((ROWS,), np.float32, 48)], [np.float32],
                  device=device, args=(2.0,), keep_pinned=value)
