"""Round thirty-five: a review of round thirty-four's fixes (``git diff 4903064 7bdc8c3``).

Each finding is a strict xfail asserting the right behaviour.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import first_device_only, opencl_c_only  # noqa: E402, F401 (autouse)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

# NumPy's packed records of { char a; double v; } (9 bytes): C lays the struct out in 16.
PACKED = np.dtype([("a", "i1"), ("v", "f8")])


def _rec_kernel(decl: str) -> str:
    return decl + """
__kernel void sr(__global const rec *x, __global int *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (int)x[i].v;
}"""


def _misfit_refused_or_read_right(device, source: str) -> None:
    k = device.compile(source, "sr")
    records = np.zeros(40, PACKED)
    records["v"] = np.arange(40)
    try:
        out = cv.stream(k, [records], [np.int32], device=device).outputs[0]
    except InputError:
        return  # refused before any work: right
    np.testing.assert_array_equal(out, np.arange(40, dtype=np.int32))


# Comments are blanked before pcpp (preprocess._expand: without_comments) into " " and the
# line breaks they held, so a comment over two lines inside a directive ends the directive
# early: the compiler reads the comment as one space.
def test_a_macro_type_after_a_two_line_comment_still_judges_the_struct(device):
    opencl_c_only(device)
    decl = ("#define REAL /* float or\n              double */ double\n"
            "typedef struct { char a; REAL v; } rec;")
    _misfit_refused_or_read_right(device, _rec_kernel(decl))


def test_an_if_with_a_two_line_comment_takes_the_compilers_branch(device):
    opencl_c_only(device)
    decl = ("#if 0 /* the old layout,\n       kept for reference */ || 1\n"
            "typedef struct { char a; double v; } rec;\n"
            "#else\n"
            "typedef struct __attribute__((packed)) { char a; double v; } rec;\n"
            "#endif")
    _misfit_refused_or_read_right(device, _rec_kernel(decl))


# structs._resolved reads a member's typedef through typedefs.declared, which drops the
# declaration's attributes: `typedef float vfloat __attribute__((aligned(16)))` reads as a
# 4-aligned float, so the struct is laid out in 8 bytes where the compiler has 32.
def test_a_member_of_an_aligned_typedef_builds_and_reads_right(device):
    opencl_c_only(device)
    src = """typedef float vfloat __attribute__((aligned(16)));
typedef struct { char a; vfloat v; } rec;
__kernel void sr(__global const rec *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i].v;
}"""
    k = device.compile(src, "sr")
    dt = np.dtype({"names": ["a", "v"], "formats": ["i1", "f4"], "offsets": [0, 16],
                   "itemsize": 32})
    records = np.zeros(5, dt)
    records["v"] = np.arange(5)
    out = cv.stream(k, [records], [np.float32], device=device).outputs[0]
    np.testing.assert_array_equal(out, np.arange(5, dtype=np.float32))


# Not a regression (the old pcpp read "//" inside <...> as a comment too), but in this area:
# C reads `<sub//t.h>` as one header name; without_comments blanks "//t.h>" and the header's
# typedefs and structs are never read.
def test_an_angle_include_with_a_double_slash_is_read(device, tmp_path):
    opencl_c_only(device)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "t.h").write_text("typedef struct { char a; double v; } rec;\n")
    source = "#include <sub//t.h>\n" + _rec_kernel("")
    k = device.compile(source, "sr", options=[f"-I{tmp_path}"])
    records = np.zeros(40, PACKED)
    records["v"] = np.arange(40)
    try:
        out = cv.stream(k, [records], [np.int32], device=device).outputs[0]
    except InputError:
        return  # refused before any work: right (as for "sub/t.h")
    np.testing.assert_array_equal(out, np.arange(40, dtype=np.int32))


_PACK_CASES = {
    # #pragma pack(2): the compiler's sizeof(rec) is 6; c_dtype packs to 1 (5 bytes)
    "pragma_pack_2": "#pragma pack(push, 2)\ntypedef struct { char a; int v; } rec;\n"
                     "#pragma pack(pop)",
    # another struct of the source is packed: packs(source) packs rec's advice too (5 bytes;
    # the compiler's 8)
    "other_struct_packed": "typedef struct __attribute__((packed)) { char a; int v; } wire;\n"
                           "typedef struct { char a; int v; } rec;",
}


@pytest.mark.parametrize("case", sorted(_PACK_CASES))
def test_the_dtype_a_plain_array_is_advised_reads_right(device, case):
    opencl_c_only(device)
    k = device.compile(_PACK_CASES[case] + """
__kernel void sr(__global const rec *x, __global int *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i].v;
}""", "sr")
    with pytest.raises(InputError) as refused:
        cv.stream(k, [np.arange(40, dtype=np.int32)], [np.int32], device=device)
    advice = re.search(r"np\.zeros\(n, (np\.dtype\(.*?\))\), with", str(refused.value))
    if advice is None:
        return  # no dtype advised: nothing to follow wrongly
    records = np.zeros(40, eval(advice.group(1), {"np": np}))  # noqa: S307 (our message)
    records["v"] = np.arange(40)
    try:
        out = cv.stream(k, [records], [np.int32], device=device).outputs[0]
    except InputError:
        return  # the advice refused in turn: not a wrong answer
    np.testing.assert_array_equal(out, np.arange(40, dtype=np.int32))


# Not a regression (the old patterns were tried in the same order): C keeps struct tags apart
# from typedef names, but structs._members strips "struct " and tries `struct rec {` first.
def test_a_typedef_name_is_not_judged_by_a_struct_tag_of_that_name(device):
    opencl_c_only(device)
    k = device.compile("""struct rec { char a; char b; float v; };
typedef struct { char a; float v; } rec;
__kernel void sr(__global const rec *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i].v;
}""", "sr")
    records = np.zeros(6, np.dtype([("a", "i1"), ("v", "<f4")], align=True))
    records["v"] = np.arange(6)
    out = cv.stream(k, [records], [np.float32], device=device).outputs[0]
    np.testing.assert_array_equal(out, np.arange(6, dtype=np.float32))
