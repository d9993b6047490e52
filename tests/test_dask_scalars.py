"""conveyor.dask given a 0-d array: ``map_blocks`` and ``reduce`` raised a raw IndexError
(``a.chunks[0]`` of a 0-d array) while building the graph; now the InputError a local stream
gives. Refused on the client, so no cluster is needed."""

from __future__ import annotations

import numpy as np
import pytest

from conveyor.errors import InputError

da = pytest.importorskip("dask.array")
cvd = pytest.importorskip("conveyor.dask")

SQ = """__kernel void sq(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * x[i];
}"""


def test_a_0d_array_is_an_input_error():
    scalar = da.from_array(np.float32(3))
    with pytest.raises(InputError, match=r"^input 0 is a scalar \(0-d\)"):
        cvd.map_blocks(cvd.kernel(SQ, "sq"), scalar)
    with pytest.raises(InputError, match=r"^input 0 is a scalar \(0-d\)"):
        cvd.reduce(cvd.kernel(SQ, "sq"), scalar, "sum")
    rows = da.from_array(np.ones(4, np.float32))
    with pytest.raises(InputError, match=r"^input 1 is a scalar \(0-d\)"):
        cvd.map_blocks(cvd.kernel(SQ, "sq"), rows, scalar)
