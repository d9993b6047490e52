"""The ninth round: the in-memory API tried as a demanding user and as an attacker would:
outputs that overlap, shifted and strided views, Fortran and byte-swapped arrays, NumPy
subclasses, zero-stride views, scalars past their types, option extremes.

- Records of a structured dtype with big-endian fields (``[('a', '>i4'), ('b', '>f4')]``,
  as ``np.fromfile`` of a network-order file gives them) for a kernel's C struct were read in
  native order, with no error: every value byte-swapped (as an input, an output, a new
  output and a resident table). A plain ``>f4`` array was already refused; the fields of a
  record were not checked (and NumPy's own ``dtype.isnative`` says True for a ``>u2``
  sub-array field). An InputError now names the field and says to pass
  ``a.astype(a.dtype.newbyteorder('='))``.
- An ndarray subclass whose slicing does not give a view of its memory (its
  ``__getitem__`` copies, or is otherwise overridden) was written through ``out[lo:hi]``: the
  copies got the rows, the caller's array stayed as it was, with no error. Inputs and outputs
  are now read and written through a plain ndarray view of their memory; ``report.outputs``
  still holds the caller's object.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import assert_clean, compiled, kernel, rec_kernels  # noqa: E402

import conveyor as cv  # noqa: E402

_STRUCT = rec_kernels("int")

_kernel = compiled  # reliakit: built once per device, source and name


def test_big_endian_record_fields_for_a_c_struct_are_refused(device):
    swapped = np.dtype([("a", ">i4"), ("b", ">f4")])
    records = np.zeros(64, swapped)
    records["a"], records["b"] = np.arange(64), 0.5
    expected = (records["a"] + records["b"]).astype(np.float32)
    rec_sum = _kernel(device, _STRUCT, "rec_sum")
    with pytest.raises(cv.InputError, match=r"kernel parameter 'r' .*receives input 0.* field "
                                            r"'a' is >i4, not in this machine's byte order.*"
                                            r"newbyteorder\('='\)"):
        cv.stream(rec_sum, [records], [np.float32], device=device)  # was 8.8e-44, 1.7e7, ...
    x = np.arange(8, dtype=np.float32)
    with pytest.raises(cv.InputError, match=r"args\[0\] \(kernel parameter 't'.* field 'a' is "
                                            r">i4, not in this machine's byte order"):
        cv.stream(_kernel(device, _STRUCT, "rec_lut"), [x], [np.float32],
                  args=(records[:4],), device=device)
    rec_make = _kernel(device, _STRUCT, "rec_make")
    for output in (np.zeros(8, swapped), swapped):  # an array, and a new one for the dtype
        with pytest.raises(cv.InputError, match=r"receives output 0.* field 'a' is >i4"):
            cv.stream(rec_make, [x], [output], device=device)
    # Only one field swapped, or a swapped sub-array field (NumPy's isnative misses it).
    mixed = np.dtype([("a", "<i4"), ("b", ">f4")])
    with pytest.raises(cv.InputError, match=r"field 'b' is >f4"):
        cv.stream(rec_sum, [np.zeros(8, mixed)], [np.float32], device=device)
    assert np.dtype([("w", ">u2", 3)]).isnative  # why the fields are walked one by one
    words = _kernel(device, "typedef struct { ushort w[3]; } w3;\n"
                            "__kernel void w_sum(__global const w3 *r, __global uint *y,\n"
                            "                    ulong offset, ulong n) {\n"
                            "    ulong i = get_global_id(0);\n"
                            "    if (i < n) y[i] = r[i].w[0] + r[i].w[1] + r[i].w[2];\n"
                            "}\n", "w_sum")
    with pytest.raises(cv.InputError, match=r"field 'w' is >u2"):
        cv.stream(words, [np.ones(8, np.dtype([("w", ">u2", 3)]))], [np.uint32], device=device)
    assert_clean(device)
    # The fix the message gives: NumPy's answer.
    fixed = records.astype(records.dtype.newbyteorder("="))
    out = cv.stream(rec_sum, [fixed], [np.float32], device=device, block_bytes=128).outputs[0]
    np.testing.assert_array_equal(out, expected)
    out = cv.stream(words, [np.ones(8, np.dtype([("w", ">u2", 3)]).newbyteorder("="))],
                    [np.uint32], device=device).outputs[0]
    np.testing.assert_array_equal(out, np.full(8, 3, np.uint32))
    assert_clean(device)


class _CopyingSlices(np.ndarray):
    """An ndarray subclass whose indexing hands out copies (as some wrappers do)."""

    def __getitem__(self, key):
        return np.ndarray.__getitem__(self, key).copy()


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_a_subclass_whose_slices_are_copies_is_still_written(device):
    ident = kernel(device, "ident")
    x = np.arange(1000, dtype=np.float32)
    for zero_copy in (False, None):
        out = np.zeros(1000, np.float32).view(_CopyingSlices)
        report = cv.stream(ident, [x], [out], device=device, block_bytes=400,
                           zero_copy=zero_copy)
        np.testing.assert_array_equal(np.asarray(out), x)  # was all zeros
        assert report.outputs[0] is out  # the caller's object, as for any array
    # As an input, and in place over such an array.
    y = np.zeros(1000, np.float32)
    cv.stream(ident, [x.copy().view(_CopyingSlices)], [y], device=device, block_bytes=400)
    np.testing.assert_array_equal(y, x)
    both = x.copy().view(_CopyingSlices)
    cv.stream(kernel(device, "scale"), [both], [both], args=(2.0,), device=device,
              block_bytes=400, zero_copy=False)
    np.testing.assert_array_equal(np.asarray(both), x * 2)
    # Guard: np.matrix and np.recarray outputs, as they always were.
    m = np.matrix(np.zeros((100, 10), np.float32))
    report = cv.stream(ident, [x.reshape(100, 10)], [m], device=device, block_bytes=400)
    assert report.outputs[0] is m
    np.testing.assert_array_equal(np.asarray(m), x.reshape(100, 10))
    assert_clean(device)


def test_a_buffer_alone_as_inputs_is_one_input(device):
    """``inputs=memoryview(a)`` alone was taken as a list of inputs, one per number (Python
    counts a memoryview, bytearray or array.array a sequence): "input 0 is a scalar", and a
    2-D memoryview raised NumPy's raw NotImplementedError. One buffer alone is one input now,
    as one array alone is; an output that is such a buffer says what to pass."""
    ident = kernel(device, "ident")
    a = np.arange(300, dtype=np.float32).reshape(100, 3)
    for given in (memoryview(a), memoryview(a.reshape(-1))):  # 2-D: NotImplementedError
        out = cv.stream(ident, given, np.float32, device=device).outputs[0]
        np.testing.assert_array_equal(out.reshape(-1), a.reshape(-1))
    out = cv.stream(kernel(device, "ident", np.uint8), bytearray(b"conveyor"), np.uint8,
                    device=device).outputs[0]
    np.testing.assert_array_equal(out, np.frombuffer(b"conveyor", np.uint8))
    target = np.zeros((100, 3), np.float32)
    with pytest.raises(cv.InputError, match=r"output 0 is a memoryview, not a NumPy array.*"
                                            r"np.asarray\(buffer\)"):
        cv.stream(ident, [a], memoryview(target), device=device)  # was NotImplementedError
    with pytest.raises(cv.InputError, match=r"output 0 is a bytearray.*np.frombuffer"):
        cv.stream(ident, [a], [bytearray(1200)], device=device)  # was "got bytearray"
    assert_clean(device)
