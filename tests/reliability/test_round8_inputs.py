"""The eighth round: inputs, tried as a demanding user and as an attacker would, on the
ends that do not go through ``cv.stream``'s own input checks.

- A ``np.ma.MaskedArray`` chunk of ``cv.iterate`` streamed the values under its mask (a sum
  of every value, where ``x.sum()`` leaves the masked ones out), with no error; so did a
  masked resident table in ``args=`` (and ``cv.resident(masked)``): the kernel read the
  values under the mask. Both are InputErrors now, as a masked input is.
- PyArrow data with nulls given as an input, a chunk or a resident table became NaN (NumPy's
  ``__array__`` of an Arrow array) with no error, where a Parquet/Arrow file's nulls are
  refused; a null *value* of a dictionary-encoded column (a null in the dictionary, not in
  the indices) slips past ``null_count``. A PyArrow table of columns of different types
  (int64 beside float64) was promoted to float64 by NumPy, rounding integers past 2**53.
  All are InputErrors now; a dictionary-encoded column is decoded (its values stream, as
  ``to_numpy()`` gives them).
- A structured dtype with NumPy's packed layout (``[('a', 'u1'), ('b', 'f4')]``, 5 bytes)
  for a kernel's C struct (8 bytes: C pads ``b`` to byte 4) read every record from the wrong
  bytes, with no error, as a streamed input and as a resident table. An InputError now that
  says to pass ``align=True``; a kernel whose source declares its struct packed is taken at
  its word.
- A ``cv.iterate`` reader that yields ``buf[:0]`` forever at the end of its file (the
  ``f.readinto(buf)`` idiom without ``if not got: return``) hung the stream, spinning, at its
  last row (or, on a file shorter than ``length``, before it): an InputError after
  ``chunks.EMPTY_CHUNKS_LIMIT`` empty chunks in a row now. Fewer empty chunks still pass.
- A 0-d or empty array in ``args=`` for a pointer said "resident(): pass a non-empty numeric
  array", naming neither the argument nor a call the user made; it names ``args[i]`` now.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import Boom, assert_clean, compiled, kernel, rec_kernels  # noqa: E402

import conveyor as cv  # noqa: E402
from conveyor.kernels.portable import portable  # noqa: E402
from conveyor.pipeline import chunks  # noqa: E402

_LUT = """
__kernel void lut(__global const float *x, __global float *y, __global const float *t,
                  ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + t[(offset + i) % 4];
}
"""

_STRUCT = rec_kernels("uchar")

#: The same kernel over a struct its source declares packed: NumPy's packed layout is right.
_PACKED = _STRUCT.replace("typedef struct {", "typedef struct __attribute__((packed)) {")

_kernel = compiled  # reliakit: built once per device, source and name


def _chunks(*parts):
    yield from parts


def test_masked_chunks_of_an_iterable_are_refused(device):
    ident = kernel(device, "ident")
    x = np.arange(100, dtype=np.float32)
    masked = np.ma.masked_array(x, mask=np.arange(100) % 4 == 0)
    with pytest.raises(cv.InputError, match=r"a chunk of iterable of generator \(from row 0\) "
                                            r"is a masked array with 13 masked elements.*"
                                            r"a.filled"):
        cv.stream(ident, [cv.iterate(_chunks(masked[:50], masked[50:]), length=100)],
                  reduce="sum", device=device)  # was 4950.0; masked.sum() is 3750.0
    # A masked chunk after plain ones: refused when it comes, mid-stream; nothing leaks.
    with pytest.raises(cv.InputError, match=r"\(from row 50\) is a masked array with 12"):
        cv.stream(ident, [cv.iterate(_chunks(x[:50], masked[50:]), length=100)],
                  [np.float32], device=device, block_bytes=80)
    assert_clean(device)
    # Nothing masked: the values are the array's.
    report = cv.stream(ident, [cv.iterate(_chunks(np.ma.masked_array(x)), length=100)],
                       reduce="sum", device=device)
    assert report.result == 4950.0


def test_masked_resident_tables_are_refused(device):
    lut = _kernel(device, _LUT, "lut")
    x = np.zeros(8, np.float32)
    t = np.ma.masked_array(np.arange(4, dtype=np.float32) + 1, mask=[0, 1, 0, 0])
    with pytest.raises(cv.InputError, match=r"args\[0\] \(kernel parameter 't'\) is a masked "
                                            r"array with 1 masked elements"):
        cv.stream(lut, [x], [np.float32], args=(t,), device=device)
    with pytest.raises(cv.InputError, match=r"the array given to cv.resident\(\) is a masked "
                                            r"array with 1 masked"):
        cv.resident(t)
    assert_clean(device)
    out = cv.stream(lut, [x], [np.float32], args=(np.ma.masked_array(t.data),),
                    device=device).outputs[0]
    np.testing.assert_array_equal(out, np.tile(t.data, 2))


def test_empty_and_scalar_tables_in_args_name_the_argument(device):
    lut = _kernel(device, _LUT, "lut")
    x = np.zeros(8, np.float32)
    for table, why in ((np.array(1.0, np.float32), "is a scalar"),
                       (np.zeros(0, np.float32), "has no elements")):
        with pytest.raises(cv.InputError, match=rf"args\[0\] \(kernel parameter 't'\) is "
                                                rf"float32 of shape .*{why}.*non-empty"):
            cv.stream(lut, [x], [np.float32], args=(table,), device=device)
    assert_clean(device)


def test_pyarrow_nulls_and_mixed_columns_are_refused_and_dictionaries_decoded(device):
    pa = pytest.importorskip("pyarrow")
    ident = kernel(device, "ident", np.float64)
    lut = _kernel(device, _LUT, "lut")
    with_null = pa.array([1.0, None, 3.0])
    null_value = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int32()),
                                                pa.array([1.0, None]))  # null_count is 0
    for value in (with_null, pa.chunked_array([with_null]), pa.table({"x": with_null}),
                  pa.record_batch([with_null], names=["x"]), null_value):
        with pytest.raises(cv.InputError, match=r"input 0 is PyArrow data with 1 nulls.*"
                                                r"fill_null"):
            cv.stream(ident, [value], [np.float64], device=device)  # was NaN
        with pytest.raises(cv.InputError, match=r"a chunk of .* is PyArrow data with 1 nulls"):
            cv.stream(ident, [cv.iterate([value], length=3)], [np.float64], device=device)
    with pytest.raises(cv.InputError, match=r"cv.resident\(\) is PyArrow data with 1 nulls"):
        cv.resident(pa.array([1.0, None, 2.0, 3.0], pa.float32()))
    # int64 beside float64: NumPy made 2**53 + 1 into 2**53.
    mixed = pa.table({"a": pa.array([2**53 + 1]), "b": pa.array([1.0])})
    with pytest.raises(cv.InputError, match=r"columns have types \('a' int64, 'b' double\) "
                                            r"that NumPy would promote to float64.*table.cast"):
        cv.stream(kernel(device, "ident", np.int64), [mixed], [np.int64], device=device)
    assert_clean(device)
    # Types that promote without changing a value are streamed as NumPy makes them.
    exact = pa.table({"a": pa.array([2**40 + 1], pa.int64()), "b": pa.array([7], pa.int32())})
    out = cv.stream(kernel(device, "ident", np.int64), [exact], [np.int64],
                    device=device).outputs[0]
    np.testing.assert_array_equal(out, np.asarray(exact))
    # A dictionary-encoded column streams its values (as to_numpy() gives them), as an
    # input, a table's column, a chunk and a resident table.
    values = pa.array([1.0, 2.0, 1.0, 5.0])
    coded = values.dictionary_encode()
    expected = values.to_numpy()
    for value in (coded, pa.table({"x": coded}), pa.record_batch([coded], names=["x"])):
        out = cv.stream(ident, [value], [np.float64], device=device).outputs[0]
        np.testing.assert_array_equal(out.reshape(-1), expected)
    out = cv.stream(ident, [cv.iterate([coded[:2], coded[2:]], length=4)], [np.float64],
                    device=device, block_bytes=16).outputs[0]
    np.testing.assert_array_equal(out, expected)
    table = pa.array([1.0, 2.0, 1.0, 5.0], pa.float32()).dictionary_encode()
    with cv.resident(table) as handle:
        out = cv.stream(lut, [np.zeros(4, np.float32)], [np.float32], args=(handle,),
                        device=device).outputs[0]
    np.testing.assert_array_equal(out, expected.astype(np.float32))
    assert_clean(device)


def test_a_packed_structured_dtype_for_a_c_struct_is_refused(device):
    packed = np.dtype([("a", "u1"), ("b", "<f4")])  # 5 bytes; C's struct is 8
    aligned = np.dtype([("a", "u1"), ("b", "<f4")], align=True)
    records = np.zeros(64, packed)
    records["a"], records["b"] = np.arange(64) % 3, np.arange(64) / 4
    expected = (records["a"] + records["b"]).astype(np.float32)
    rec_sum, rec_lut = _kernel(device, _STRUCT, "rec_sum"), _kernel(device, _STRUCT, "rec_lut")
    with pytest.raises(cv.InputError, match=r"kernel parameter 'r' .*receives input 0, has "
                                            r"structured dtype .* of 5 bytes, but field 'b' "
                                            r"\(float32\) lies at byte 1.*align=True"):
        cv.stream(rec_sum, [records], [np.float32], device=device)  # was garbage
    x = np.zeros(8, np.float32)
    with pytest.raises(cv.InputError, match=r"args\[0\] .*of 5 bytes, but field 'b'"):
        cv.stream(rec_lut, [x], [np.float32], args=(records[:4],), device=device)
    # Fields in C's places, but no padding at the end: an array of them strides wrongly.
    short = np.dtype({"names": ["b", "a"], "formats": ["<f4", "u1"], "offsets": [0, 4],
                      "itemsize": 5})
    # (fields paired with members by name since session 21: b's own offset is named first)
    with pytest.raises(cv.InputError, match=r"of 5 bytes, but field 'b' \(float32\) lies at "
                                            r"byte 0, where C puts member 2 of struct 'rec' at "
                                            r"byte 4.*the struct.s own dtype, np.dtype"):
        cv.stream(rec_sum, [np.zeros(8, short)], [np.float32], device=device)
    assert_clean(device)
    # The fix the message gives: NumPy's answer.
    fixed = records.astype(aligned)
    out = cv.stream(rec_sum, [fixed], [np.float32], device=device, block_bytes=128).outputs[0]
    np.testing.assert_array_equal(out, expected)
    out = cv.stream(rec_lut, [x], [np.float32], args=(fixed[:4],), device=device).outputs[0]
    np.testing.assert_array_equal(out, np.tile(expected[:4], 2))
    # A kernel whose struct is packed reads NumPy's packed records as they are.
    out = cv.stream(_kernel(device, _PACKED, "rec_sum"), [records], [np.float32],
                    device=device).outputs[0]
    np.testing.assert_array_equal(out, expected)
    assert_clean(device)


def test_packed_records_that_match_the_kernels_struct_are_not_refused(device):
    """The check compares the dtype with the struct the kernel defines, not with NumPy's own
    alignment: 6-byte records of ``u2`` then ``u4`` (``np.fromfile`` of packed binary) are
    right for ``struct { ushort w[3]; }``, which C also lays out in 6 bytes."""
    source = """
typedef struct { ushort w[3]; } rec6;
__kernel void lo_hi(__global const rec6 *r, __global uint *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (uint)r[i].w[0] + ((uint)r[i].w[1] << 16) + (uint)r[i].w[2];
}
"""
    records = np.zeros(32, np.dtype([("a", "<u2"), ("b", "<u4")]))  # 6 bytes, b at byte 2
    records["a"], records["b"] = np.arange(32), np.arange(32) * 1000
    raw = records.view(np.uint16).reshape(32, 3).astype(np.uint32)
    expected = raw[:, 0] + (raw[:, 1] << 16) + raw[:, 2]
    out = cv.stream(_kernel(device, source, "lo_hi"), [records], [np.uint32],
                    device=device).outputs[0]
    np.testing.assert_array_equal(out, expected)
    assert_clean(device)


def test_a_struct_from_a_header_is_taken_as_the_header_lays_it_out(device, tmp_path):
    """The kernel's text neither defines its struct nor says "pack": the header may pack it
    (here it does), so NumPy's packed records are not refused, and the kernel reads them."""
    (tmp_path / "rec.h").write_text(
        "typedef struct __attribute__((packed)) { uchar a; float b; } rec;\n")
    source = '#include "rec.h"\n' + _STRUCT.split("\n", 2)[2]  # the kernels, no typedef
    assert "pack" not in source and "rec;" not in source
    rec_sum = device.compile(portable(source), "rec_sum", ["-I", str(tmp_path)])
    records = np.zeros(64, np.dtype([("a", "u1"), ("b", "<f4")]))
    records["a"], records["b"] = np.arange(64) % 3, np.arange(64) / 4
    out = cv.stream(rec_sum, [records], [np.float32], device=device).outputs[0]
    np.testing.assert_array_equal(out, (records["a"] + records["b"]).astype(np.float32))
    assert_clean(device)


def test_iterables_that_fail_or_change_midway_leave_nothing_behind(device):
    ident = kernel(device, "ident")
    x = np.arange(1000, dtype=np.float32)

    def failing():
        yield x[:300]
        yield x[300:600]
        raise Boom("the reader failed")

    with pytest.raises(Boom, match="the reader failed"):  # the iterable's own error
        cv.stream(ident, [cv.iterate(failing(), length=1000)], [np.float32], device=device,
                  block_bytes=400)
    assert_clean(device)
    for late, what in ((x[300:].astype(np.float64), "float64 rows ()"),
                       (x[300:].astype(">f4"), ">f4 rows ()"),
                       (x[300:].reshape(-1, 2), "float32 rows (2,)")):
        with pytest.raises(cv.InputError, match=re.escape(f"yielded a chunk of {what} after "
                                                          f"float32 rows (): every chunk")):
            cv.stream(ident, [cv.iterate(_chunks(x[:300], late), length=1000)],
                      [np.float32], device=device, block_bytes=400)
        assert_clean(device)
    # Strided, reversed and transposed chunks: NumPy's rows.
    grid = np.arange(3000, dtype=np.float32).reshape(3, 1000)
    parts = (grid[:, :500:2].T, grid[:, 500:][:, ::-1].T)
    out = cv.stream(ident, [cv.iterate(_chunks(*parts), length=750)], [np.float32],
                    device=device, block_bytes=480).outputs[0]
    np.testing.assert_array_equal(out, np.concatenate(parts))


def test_a_reader_that_yields_empty_chunks_forever_is_refused(device, monkeypatch):
    monkeypatch.setattr(chunks, "EMPTY_CHUNKS_LIMIT", 50)  # a million in use: seconds
    ident = kernel(device, "ident")
    x = np.arange(100, dtype=np.float32)

    def reader(rows):  # f.readinto(buf) at the end of the file, with no `if not got: return`
        buf = np.empty(40, np.float32)
        at = 0
        while True:
            got = min(len(buf), rows - at)
            buf[:got] = x[at : at + got]
            at += got
            yield buf[:got]

    with pytest.raises(cv.InputError, match=r"yielded 50 empty chunks in a row after its last "
                                            r"row, and has not ended.*return there"):
        cv.stream(ident, [cv.iterate(reader(100), length=100)], [np.float32], device=device,
                  block_bytes=160)  # was a hang, one core spinning
    with pytest.raises(cv.InputError, match=r"yielded 50 empty chunks in a row after 60 rows "
                                            r"of length=100"):
        cv.stream(ident, [cv.iterate(reader(60), length=100)], [np.float32], device=device,
                  block_bytes=160)  # a short file: was a hang too
    assert_clean(device)
    # Empty chunks, fewer than the limit, anywhere: NumPy's rows.
    parts = [x[:0]] * 49 + [x[:30]] + [x[:0]] * 49 + [x[30:]] + [x[:0]] * 49
    out = cv.stream(ident, [cv.iterate(iter(parts), length=100)], [np.float32],
                    device=device, block_bytes=160).outputs[0]
    np.testing.assert_array_equal(out, x)


def test_a_dictionary_encoded_column_of_an_arrow_or_parquet_file_is_decoded(device, tmp_path):
    """``cv.arrow`` / ``cv.parquet`` refused a dictionary-encoded float column as "not
    numeric"; its values are streamed now, and a null among its dictionary's values (which
    ``null_count`` does not count) is refused as any null is."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    values = np.array([2.0, 4.0, 2.0, 10.0, 4.0, 10.0, 14.0], np.float32)
    column = pa.array(values).dictionary_encode()
    table = pa.table({"x": column})
    feather.write_feather(table, tmp_path / "d.arrow", chunksize=3)  # several batches
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=3)
    ident = kernel(device, "ident")
    for source in (cv.arrow(tmp_path / "d.arrow", "x"), cv.parquet(tmp_path / "d.parquet", "x")):
        out = cv.stream(ident, [source], [np.float32], device=device, block_bytes=8).outputs[0]
        np.testing.assert_array_equal(out, values)
    dictionary = pa.array([1.0, None], pa.float32())
    nulled = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int32()), dictionary)
    assert nulled.null_count == 0  # the null is in the dictionary, not in the indices
    feather.write_feather(pa.table({"x": nulled}), tmp_path / "n.arrow")
    with pytest.raises(cv.InputError, match=r"column 'x' .* has 1 nulls"):
        cv.stream(ident, [cv.arrow(tmp_path / "n.arrow", "x")], [np.float32], device=device)
    assert_clean(device)


def test_an_array_given_to_iterate_is_refused_with_what_to_pass_instead():
    """``cv.iterate(a, length=len(a))`` iterated ``a`` row by row (each row a chunk of one
    dimension less) and failed later with "yielded at least ... rows"."""
    a = np.zeros((10, 3), np.float32)
    with pytest.raises(cv.InputError, match=r"array of shape \(10, 3\).*pass the array itself"):
        cv.iterate(a, length=10)
    with pytest.raises(cv.InputError, match=r"array of shape \(\)"):
        cv.iterate(np.float32(1), length=1)
    chunks = cv.iterate(np.array_split(a, 3), length=10)  # a list of arrays still is fine
    assert chunks.shape == (10, 3)
    # An array whose items are the chunks (a[k]: chunk k of 3 rows) is meant as such.
    assert cv.iterate(a, length=30).shape == (30,)
