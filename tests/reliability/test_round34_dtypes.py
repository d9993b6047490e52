"""Round thirty-four: every dtype on every road.

Method (seeded generators kept out of the repository, under /tmp/r34d): bool, int8 to
uint64, float16/32/64, complex64/128, datetime64/timedelta64 (s, ns, D, ms, Y), bytes ``S``,
unicode ``U``, object, non-native byte orders and void records (packed, aligned, nested, with
sub-arrays) as inputs, outputs (arrays, dtypes, ``.npy``/raw files), ``args=`` scalars,
resident tables (plain and ``cv.resident``, writable), ``reduce=`` (kernel and callable,
NaN, signed zeros, empty inputs), ``cv.rows``/``cv.per_block``, halos under every boundary
and constants, ``cv.iterate`` (chunks of mixed dtypes), Parquet/Arrow columns (dictionaries
per row group, bools across batches, timestamps, decimals), ``conveyor.dask`` (``map_blocks``
and ``reduce`` with halos) and ``conveyor map|reduce --cast`` between every pair of the
integer, float and bool types. Each compared with NumPy. What failed is below, each a
strict xfail asserting the right behaviour.

Found:

- **Wrong answers, no error**: records for a struct the layout check cannot read (a ``const``
  or typedef'd member, ``long int``, a nested struct, a ``float4`` member) are not checked,
  as inputs, resident tables and structs passed by value (``structs._members`` gives up; the
  build's size check then has no size to compare).
- **Wrong values, no error**: ``cv.pinned.zeros`` of bytes/str dtypes holds ``b'0'``/``'0'``
  (``out.fill(0)``); ``cv.pinned.zeros``/``asarray`` of aligned records leave the padding
  bytes as the pool's last user left them. ``zeros`` of a void dtype is a bare TypeError.
- **Refusals of legal work**: ``cv.raw`` refuses record and sub-array dtypes ("not a numeric
  dtype"), though ``cv.raw_out`` writes records and ``cv.npy`` reads them.
- **Messages that do not say what to change**: a struct with a ``long long`` member blames
  predefined macros; a plain array for a struct pointer input/output is "a type conveyor
  cannot resolve ... declare it float*"; records, bytes or str for a scalar pointer are told
  ``a.astype(np.T)``, which NumPy refuses.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import first_device_only, opencl_c_only  # noqa: E402, F401 (autouse)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402


def _struct_kernel(decl: str, expr: str) -> str:
    return decl + f"""
__kernel void sr(__global const rec *x, __global int *y, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) y[i] = (int)({expr});
}}"""


# Records NumPy lays out otherwise than C lays out the kernel's struct: the kernel reads each
# record but the first from the wrong bytes. Members of plain scalar types are checked
# (structs.py); these are not judged, and the stream runs.
STRUCT_MISFITS = {
    # a const member: `const int c` is no "plain scalar type" to structs._MEMBER
    "const_member": ("typedef struct { char a; const int c; } rec;",
                     np.dtype([("a", "i1"), ("c", "i4")]), "c"),
    # a member of a typedef'd scalar type
    "typedef_member": ("typedef int count_t;\ntypedef struct { char a; count_t c; } rec;",
                       np.dtype([("a", "i1"), ("c", "i4")]), "c"),
    # a two-word type name: `long int c` is read as type "long", declarator "int c"
    "long_int_member": ("typedef struct { char a; long int c; int d; } rec;",
                        np.dtype([("a", "i1"), ("c", "i8"), ("d", "i4")]), "d"),
    # a nested struct, NumPy's packed nesting (9 bytes; C: 12)
    "nested_packed": ("typedef struct { uchar a; float b; } inner;\n"
                      "typedef struct { inner p; int c; } rec;",
                      np.dtype([("p", [("a", "u1"), ("b", "f4")]), ("c", "i4")]), "c"),
    # a vector member: float4 is 16-aligned in C, a (4,) float32 sub-array 4-aligned in NumPy
    "float4_member": ("typedef struct { float4 v; float c; } rec;",
                      np.dtype([("v", "f4", (4,)), ("c", "f4")], align=True), "c"),
}


# const, typedef'd and two-word members are read since session 20 (structs._member_type)
# nested structs and vector members are laid out since session 21 (pipeline/clayout.py)
@pytest.mark.parametrize("case", sorted(STRUCT_MISFITS))
def test_records_that_misfit_the_struct_are_refused_or_read_right(device, case):
    opencl_c_only(device)
    decl, dtype, field = STRUCT_MISFITS[case]
    k = device.compile(_struct_kernel(decl, f"x[i].{field}"), "sr")
    records = np.zeros(40, dtype)
    records[field] = np.arange(40)
    try:
        out = cv.stream(k, [records], [np.int32], device=device).outputs[0]
    except InputError:
        return  # refused before any work: right
    np.testing.assert_array_equal(out, np.arange(40, dtype=np.int32))


REC_SRC = """
typedef struct { int a; float b; } rec;
__kernel void mk(__global const float *x, __global rec *r, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { r[i].a = (int)x[i]; r[i].b = x[i] * 0.5f; }
}
__kernel void rd(__global const rec *r, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (float)r[i].a + r[i].b;
}"""
REC = np.dtype([("a", "i4"), ("b", "f4")], align=True)


def test_raw_reads_back_the_records_raw_out_wrote(device, tmp_path):
    opencl_c_only(device)
    x = np.arange(30, dtype=np.float32)
    path = tmp_path / "r.bin"
    cv.stream(device.compile(REC_SRC, "mk"), [x], [cv.raw_out(path, REC)], device=device)
    assert np.fromfile(path, REC)["a"].tolist() == list(range(30))  # written right
    y = cv.stream(device.compile(REC_SRC, "rd"), [cv.raw(path, REC)], [np.float32],
                  device=device).outputs[0]
    np.testing.assert_array_equal(y, x * 1.5)


def test_raw_takes_a_sub_array_dtype_as_rows(device, tmp_path):
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    path = tmp_path / "x.bin"
    x.tofile(path)

    def ident(a, b, *, queue, offset, n):
        return a

    y = cv.stream(ident, [cv.raw(path, np.dtype((np.float32, (2,))))], [np.float32],
                  device=device).outputs[0]
    np.testing.assert_array_equal(y, x)


def test_a_record_table_that_misfits_the_struct_is_refused_or_read_right(device):
    opencl_c_only(device)
    src = """typedef struct { char a; const int c; } rec;
__kernel void tb(__global const int *q, __global int *y, __global const rec *t, ulong offset,
                 ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = t[q[i]].c;
}"""
    table = np.zeros(20, [("a", "i1"), ("c", "i4")])  # packed: 5 bytes, C's struct is 8
    table["c"] = np.arange(20) * 3
    q = np.arange(20, dtype=np.int32)
    try:
        out = cv.stream(device.compile(src, "tb"), [q], [np.int32], args=(table,),
                        device=device).outputs[0]
    except InputError:
        return
    np.testing.assert_array_equal(out, table["c"])


def test_a_long_long_struct_member_is_named_in_the_refusal(device):
    opencl_c_only(device)
    if "Portable Computing Language" not in device.info.platform:
        pytest.skip("PoCL's long long is 128 bits")
    src = """typedef struct { char a; long long c; int d; } rec;
__kernel void sr(__global const rec *x, __global int *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i].d;
}"""
    with pytest.raises(InputError) as refused:
        device.compile(src, "sr")
    message = str(refused.value)
    assert "long long" in message, message
    assert "__clang__" not in message, message


def test_a_struct_arg_that_misfits_is_refused_or_passed_right(device):
    opencl_c_only(device)
    src = """typedef struct { char a; const int c; } rec;
__kernel void sa(__global const int *x, __global long *y, rec r, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = r.c;
}"""
    value = np.zeros(1, [("a", "i1"), ("c", "i4")])  # packed: 5 bytes, C's struct is 8
    value["c"] = 77
    try:
        out = cv.stream(device.compile(src, "sa"), [np.zeros(4, np.int32)], [np.int64],
                        args=(value[0],), device=device).outputs[0]
    except InputError:
        return
    np.testing.assert_array_equal(out, 77)


@pytest.mark.parametrize("dtype", ["S3", "U2", [("s", "S2"), ("x", "i4")]], ids=str)
def test_pinned_zeros_of_text_are_empty_as_numpy_makes_them(device, dtype):
    got = cv.pinned.zeros(3, dtype, device=device)
    values, raw = got.tolist(), got.tobytes()
    del got  # back to the pool whatever the outcome (the pools-at-zero check)
    want = np.zeros(3, dtype)
    assert values == want.tolist()
    assert raw == want.tobytes()


@pytest.mark.parametrize("dtype", ["V7", [("v", "V2"), ("x", "i2")]], ids=str)
def test_pinned_zeros_of_void_dtypes(device, dtype):
    raw: bytes | str
    try:
        got = cv.pinned.zeros_like(np.zeros(5, dtype), device=device)
    except TypeError as exc:  # caught here: its traceback holds the pinned block
        raw = f"TypeError: {exc}"
    else:
        raw = got.tobytes()
        del got
    assert raw == np.zeros(5, dtype).tobytes()


@pytest.mark.parametrize("make", ["zeros", "asarray"])
def test_pinned_records_hold_no_stale_padding(device, make):
    import gc

    dtype = np.dtype([("a", "i1"), ("b", "f4")], align=True)
    # Every idle block of this size class (earlier tests may have left some) is taken and
    # filled, then all go back to the pinned pool, to be handed out again.
    old = [cv.pinned.empty(4096, np.uint8, device=device) for _ in range(32)]
    for block in old:
        block.fill(0xAB)
    del old, block
    gc.collect()
    if make == "zeros":
        got = cv.pinned.zeros(512, dtype, device=device)
    else:
        got = cv.pinned.asarray(np.zeros(512, dtype), device=device)
    first = got.view(np.uint8)[:8].tolist()
    del got
    assert first == [0] * 8, first


_COPY = """__kernel void cp(__global const {t} *x, __global {t} *y, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i];
}}"""


@pytest.mark.parametrize(("ctype", "array"), [
    ("float", np.zeros(4, [("a", "<f4"), ("b", "<f4")])),
    ("uchar", np.array([b"a", b"b", b"c", b"d"], "S1")),
], ids=["records_for_float", "bytes_for_uchar"])
def test_the_advice_for_a_non_numeric_input_works(device, ctype, array):
    import re

    opencl_c_only(device)
    k = device.compile(_COPY.format(t=ctype), "cp")
    with pytest.raises(InputError) as refused:
        cv.stream(k, [array], [np.dtype(np.float32 if ctype == "float" else np.uint8)],
                  device=device)
    message = str(refused.value)
    for target in re.findall(r"\.astype\(np\.(\w+)\)", message):
        try:
            array.astype(target)
        except (TypeError, ValueError) as exc:
            pytest.fail(f"the message advises a.astype(np.{target}), which raises "
                        f"{type(exc).__name__}: {exc} ({message})")


STRUCT_IO = """typedef struct { char a; int c; } rec;
__kernel void rd(__global const rec *t, __global int *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = t[i].c;
}
__kernel void mk(__global const int *x, __global rec *t, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { t[i].a = 1; t[i].c = x[i]; }
}"""


@pytest.mark.parametrize("road", ["input", "output"])
def test_a_plain_array_for_a_struct_pointer_is_told_the_records_dtype(device, road):
    opencl_c_only(device)
    with pytest.raises(InputError) as refused:
        if road == "input":
            cv.stream(device.compile(STRUCT_IO, "rd"), [np.zeros(8, np.float32)], [np.int32],
                      device=device)
        else:
            cv.stream(device.compile(STRUCT_IO, "mk"), [np.zeros(8, np.int32)], [np.float32],
                      device=device)
    message = str(refused.value)
    assert "cannot resolve" not in message, message
    assert "align=True" in message, message  # the records dtype of struct rec, as for tables
