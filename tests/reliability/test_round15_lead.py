"""Round fifteen: what the lead found beside the helpers' reports (each test fails on the code
before its fix).

- A ``.npy`` saved from a Fortran-ordered array of shape (N, 1) or (1, N) was refused as
  "Fortran-ordered", though its bytes are the same in either order: only shapes with two or
  more axes longer than 1 have a different layout.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import assert_clean  # noqa: E402

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

INC = """__kernel void inc(__global const float *x, __global float *y, ulong offset, ulong n)
{ ulong i = get_global_id(0); if (i < n) y[i] = x[i] + 1.0f; }"""


@pytest.mark.parametrize("shape", [(12, 1), (1, 12), (12,)])
def test_a_fortran_ordered_npy_with_one_long_axis_streams(device, tmp_path, shape):
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernel")
    values = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(shape))
    path = tmp_path / "f.npy"
    np.save(path, values)
    out = np.zeros(shape, np.float32)
    cv.stream(device.compile(INC, "inc"), [str(path)], [out], device=device)
    np.testing.assert_array_equal(out, values + 1)
    assert_clean(device)


def test_a_fortran_ordered_npy_of_two_long_axes_is_refused(device, tmp_path):
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernel")
    path = tmp_path / "f.npy"
    np.save(path, np.asfortranarray(np.zeros((3, 4), np.float32)))
    with pytest.raises(InputError, match="Fortran-ordered"):
        cv.stream(device.compile(INC, "inc"), [str(path)], [np.zeros((3, 4), np.float32)],
                  device=device)
    assert_clean(device)


@pytest.mark.parametrize("kind", ["npy", "raw"])
def test_a_file_input_of_another_dtype_is_told_how_to_convert_the_file(device, tmp_path, kind):
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernel")
    values = np.arange(12, dtype=np.float64)
    if kind == "npy":
        path = tmp_path / "d.npy"
        np.save(path, values)
        given: object = str(path)
    else:
        path = tmp_path / "d.raw"
        values.tofile(path)
        given = cv.raw(str(path), np.float64)
    with pytest.raises(InputError) as caught:
        cv.stream(device.compile(INC, "inc"), [given], [np.zeros(12, np.float32)],
                  device=device)
    message = str(caught.value)
    assert str(path) in message and "astype(np.float32)" in message, message
    assert "a.astype" not in message, message
    assert_clean(device)
