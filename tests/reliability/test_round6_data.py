"""The sixth round: data (dtypes, shapes, memory layouts, aliasing), tried as a demanding
user and as an attacker would.

- A ``cv.resident(t, writable=True)`` table that is also an output (``outputs=[t]``): the
  stream wrote its rows, then the table's copy-back replaced them with the device's table,
  with no error (the output held the kernel's writes to the table, not its results). Two
  writable handles of one array lost one's writes the same way. Both are InputErrors now.
- An input or output with rows but no bytes in a row (shape ``(n, 0)``, ``outputs=[np.void]``
  with a callable) beside arrays with data: an InputError from the pool mid-setup, "cannot
  allocate 0 bytes: ask for at least 1", which names neither the array nor the fix. It is
  refused before any work now, naming the array; a stream whose arrays are all empty still
  returns at once.
- ``outputs=[np.float32]`` (or ``cv.per_block``) for ``cv.iterate(..., length=2**62)``: a raw
  NumPy ``ValueError`` / ``MemoryError`` ("array is too big"). An InputError with the size now.
- ``args=(Decimal('1e400'),)`` for a ``float`` parameter ran the kernel with inf (a float too
  large for float32 is refused, and Decimal's ``complex()`` is inf, so it passed as "not
  finite"); ``boundary=np.longdouble('1e4000')`` padded with inf, ``boundary=Fraction(10**400)``
  raised a raw OverflowError. All are InputErrors now; inf and NaN themselves still pass.
- A ``np.ma.MaskedArray`` input streamed the values under its mask (a sum of 45.0 where
  ``x.sum()`` is 27.0), and a masked output kept its mask over the results: refused now when
  any element is masked. ``inputs=[b"..."]`` said "input 0 is a scalar"; it now says to use
  ``np.frombuffer``.
"""

from __future__ import annotations

import sys
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import assert_clean, kernel, next_stream_right  # noqa: E402
from streamkit import store, to_host  # noqa: E402

import conveyor as cv  # noqa: E402
from conveyor.kernels.portable import portable  # noqa: E402

_TABLE = """
__kernel void mark(__global const float *x, __global float *y, __global float *t,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { y[i] = x[i] + t[offset + i]; t[offset + i] = -1.0f; }
}
__kernel void mark2(__global const float *x, __global float *y, __global float *t,
                    __global float *u, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { y[i] = x[i]; t[offset + i] += 1.0f; u[offset + i] += 2.0f; }
}
"""

_built: dict[tuple[int, str], cv.Kernel] = {}


def _table_kernel(device: cv.Device, name: str) -> cv.Kernel:
    key = (id(device), name)
    if key not in _built:
        _built[key] = device.compile(portable(_TABLE), name)
    return _built[key]


def test_a_writable_table_that_is_also_an_output_is_refused(device):
    x = np.ones(1000, np.float32)
    t = np.arange(1000, dtype=np.float32)
    with pytest.raises(cv.InputError, match=r"args\[0\] is a cv.resident.*writable=True.*"
                                            r"shares memory with output 0"):
        cv.stream(_table_kernel(device, "mark"), [x], [t], device=device, block_bytes=400,
                  args=(cv.resident(t, writable=True),))
    np.testing.assert_array_equal(t, np.arange(1000, dtype=np.float32))  # nothing ran
    with pytest.raises(cv.InputError, match="shares memory with output 0"):  # a view of it
        cv.stream(_table_kernel(device, "mark"), [x[:500]], [t[500:]], device=device,
                  args=(cv.resident(t, writable=True),))
    a = np.zeros(1000, np.float32)  # two writable handles of one array
    with pytest.raises(cv.InputError, match=r"args\[0\].*shares memory with args\[1\]"):
        cv.stream(_table_kernel(device, "mark2"), [x], [np.float32], device=device,
                  args=(cv.resident(a, writable=True), cv.resident(a, writable=True)))
    assert_clean(device)
    # Separate arrays: the output holds the results, the table the kernel's writes.
    y = np.zeros(1000, np.float32)
    cv.stream(_table_kernel(device, "mark"), [x], [y], device=device, block_bytes=400,
              args=(cv.resident(t, writable=True),))
    np.testing.assert_array_equal(y, 1 + np.arange(1000, dtype=np.float32))
    np.testing.assert_array_equal(t, np.full(1000, -1, np.float32))
    # One handle given twice is one table: both parameters write the same device buffer.
    h = cv.resident(a, writable=True)
    cv.stream(_table_kernel(device, "mark2"), [x], [np.float32], device=device, args=(h, h))
    np.testing.assert_array_equal(a, np.full(1000, 3, np.float32))
    h.close()
    next_stream_right(device)


def test_arrays_with_no_bytes_in_a_row_beside_data_are_refused_before_any_work(device):
    add = kernel(device, "add")
    a = np.arange(1000, dtype=np.float32)
    cases = [
        ([a, a], [np.zeros((1000, 0), np.float32)], r"output 0 has shape \(1000, 0\)"),
        ([np.zeros((1000, 0), np.float32), a], [np.float32], r"input 0 has shape \(1000, 0\)"),
        ([a, np.zeros((1000, 0), np.float32)], [a.copy()], r"input 1 has shape \(1000, 0\)"),
    ]
    for inputs, outputs, message in cases:
        for zero_copy in (None, False):
            with pytest.raises(cv.InputError, match=message + ".*hold no elements.*drop it"):
                cv.stream(add, inputs, outputs, device=device, zero_copy=zero_copy)

    def nothing(x, y, *, queue, offset, n):
        return None

    with pytest.raises(cv.InputError, match=r"output 0 has shape \(1000,\) of \|V0: dtype "
                                            r"\|V0 has no size"):
        cv.stream(nothing, [a], [np.void], device=device, zero_copy=False)
    assert_clean(device)
    # Every array empty: nothing to move, the stream returns at once, as before.
    z = np.zeros((10, 0), np.float32)
    report = cv.stream(kernel(device, "ident"), [z], [np.float32], device=device)
    assert report.outputs[0].shape == (10, 0) and report.blocks == 0
    next_stream_right(device)


def test_a_new_output_larger_than_any_host_is_an_input_error(device):
    x = np.arange(1000, dtype=np.float32)
    ident = kernel(device, "ident")
    for length in (2**62, 2**63):
        with pytest.raises(cv.InputError, match=rf"output 0 asks for a new float32 array of "
                                                rf"{length} rows .*more than this host"):
            cv.stream(ident, [cv.iterate(iter([x]), length=length)], [np.float32],
                      device=device)

    def total(x, y, *, queue, offset, n):
        return None

    # 4 KiB blocks: 2**50 records, more than any host's address space (with the default
    # blocks a GPU's 64 MiB, the records fit in a host that overcommits memory).
    with pytest.raises(cv.InputError, match=r"output 0 \(per_block\) would hold \d+ records"
                                            r".*more than this host"):
        cv.stream(total, [cv.iterate(iter([x]), length=2**62)],
                  [cv.per_block(1, np.float32)], device=device, warmup=False,
                  block_bytes=4096)
    assert_clean(device)
    next_stream_right(device)


def test_masked_arrays_with_masked_elements_are_refused(device):
    x = np.ma.masked_array(np.arange(10, dtype=np.float32), mask=np.arange(10) % 3 == 0)
    ident = kernel(device, "ident")
    with pytest.raises(cv.InputError, match=r"input 0 is a masked array with 4 masked "
                                            r"elements.*a.filled\(0\)"):
        cv.stream(ident, [x], reduce="sum", device=device)  # was 45.0; x.sum() is 27.0
    y = np.ma.masked_array(np.zeros(10, np.float32), mask=np.arange(10) % 2 == 0)
    with pytest.raises(cv.InputError, match=r"output 0 is a masked array with 5 masked"):
        cv.stream(ident, [x.filled(0)], [y], device=device)  # the mask hid half the results
    with pytest.raises(cv.InputError, match=r"input 0 is bytes.*np.frombuffer"):
        cv.stream(ident, [b"\0\0\0\0"], [np.float32], device=device)
    # Nothing masked: the values are the array's, as NumPy's answer.
    report = cv.stream(ident, [np.ma.masked_array(x.data)], reduce="sum", device=device)
    assert report.result == 45.0
    assert_clean(device)


def test_scalars_past_a_float_range_are_refused_and_inf_nan_pass(device):
    x = np.arange(100, dtype=np.float32)
    scale = kernel(device, "scale")
    for value in (Decimal("1e400"), Decimal("-1e400")):
        with pytest.raises(cv.InputError, match=r"cannot be passed as kernel parameter 'k' "
                                                r"\(float k\): it does not fit"):
            cv.stream(scale, [x], [np.float32], args=(value,), device=device)
    for value, factor in ((Decimal("2.5"), 2.5), (Decimal("Infinity"), np.inf)):
        out = cv.stream(scale, [x[1:]], [np.float32], args=(value,), device=device).outputs[0]
        np.testing.assert_array_equal(out, x[1:] * np.float32(factor))

    def edge(x, y, *, queue, offset, n):  # y = the block's rows shifted up by the halo
        store(y, to_host(x, queue)[: y.shape[0]], queue)

    b = np.ones(10, np.float64)
    for boundary in (np.longdouble("1e4000"), np.longdouble("-1e4000"), Fraction(10**400)):
        with pytest.raises(cv.InputError, match=r"lies past float64's range"):
            cv.stream(edge, [b], [np.float64], halo=2, boundary=boundary, device=device)
    for boundary, pad in ((Fraction(1, 4), 0.25), (float("inf"), np.inf),
                          (np.longdouble("inf"), np.inf), (np.longdouble("0.5"), 0.5)):
        out = cv.stream(edge, [b], [np.float64], halo=2, boundary=boundary,
                        device=device).outputs[0]
        np.testing.assert_array_equal(out, [pad, pad, *b[:8]])
    assert_clean(device)
