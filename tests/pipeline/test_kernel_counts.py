"""offset and n count elements: a kernel that declares them as a floating type would index the
wrong elements past 2^24 (float) with no error, so it is refused before any work."""

from __future__ import annotations

import numpy as np
import pytest

import conveyor as cv

FLOAT_COUNTS = """
__kernel void idx(__global const float *x, __global double *y, {t} offset, {t} n) {{
    ulong i = get_global_id(0);
    if (i < n) y[i] = (double)offset + i;
}}
"""


@pytest.mark.parametrize("ctype", ["float", "double"])
def test_floating_offset_and_n_are_refused(device, ctype):
    k = device.compile(cv.portable(FLOAT_COUNTS.format(t=ctype)), "idx")
    x = np.zeros(8, np.float32)
    with pytest.raises(cv.InputError, match=r"parameter 'offset' \(" + ctype
                       + r"\) receives offset/n, counts of elements: declare it ulong"):
        cv.stream(k, [x], [np.float64], first_row=2**24 + 1, device=device)
    chain = cv.chain(cv.link(k, reads="in0", writes="out0"))
    with pytest.raises(cv.InputError, match="link 0 .*declare it ulong"):
        cv.stream(chain, [x], [np.float64], device=device)


def test_integer_offset_and_n_index_exactly_past_2_to_the_24(device):
    k = device.compile(cv.portable(FLOAT_COUNTS.format(t="ulong")), "idx")
    y = cv.stream(k, [np.zeros(8, np.float32)], [np.float64], first_row=2**24 + 1,
                  device=device).outputs[0]
    np.testing.assert_array_equal(y, 2**24 + 1 + np.arange(8))
