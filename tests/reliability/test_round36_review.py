"""Round thirty-six: a review of round thirty-five's fixes (``git diff 7bdc8c3 2acbd9d``).

Each finding is a strict xfail asserting the right behaviour.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import first_device_only, opencl_c_only  # noqa: E402, F401 (autouse)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402
from conveyor.kernels.preprocess import expand  # noqa: E402
from conveyor.kernels.signature import parse_params  # noqa: E402

# NumPy's packed records of { char a; float v; } (5 bytes): C lays the struct out in 8.
PACKED = np.dtype([("a", "i1"), ("v", "f4")])


# structs._attributed(source, "real") (since folded into _attributed_names) was True where
# ANY typedef mentioning the word "real"
# carries an attribute, also one that merely names real as its target (typedef real vreal
# __attribute__((aligned(16))), typedef real __attribute__((ext_vector_type(4))) real4).
# Then every struct with a plain `real` member is unjudged: 5-byte records run as 8-byte
# structs with no error. Before 2acbd9d they were refused.
@pytest.mark.parametrize("other", [
    "typedef real vreal __attribute__((aligned(16)));",
    "typedef real __attribute__((ext_vector_type(4))) real4;",
])
def test_an_attributed_typedef_of_a_member_type_leaves_the_struct_judged(device, other):
    opencl_c_only(device)
    src = "typedef float real;\n" + other + """
typedef struct { char a; real v; } rec;
__kernel void sr(__global const rec *x, __global int *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (int)x[i].v;
}"""
    k = device.compile(src, "sr")
    records = np.zeros(40, PACKED)
    records["v"] = np.arange(40)
    try:
        out = cv.stream(k, [records], [np.int32], device=device).outputs[0]
    except InputError:
        return  # refused before any work: right
    np.testing.assert_array_equal(out, np.arange(40, dtype=np.int32))


# without_comments moves the line breaks of a two-line comment after the NEXT line break, so
# the code after "*/" on the comment's last line is read on the comment's first line: its
# __LINE__ is one less than gcc's and clang's (and than before 2acbd9d).
def test_line_after_the_end_of_a_two_line_comment():
    text = expand("int a; /* x\ny */ int b = __LINE__;\nint c = __LINE__;\n")
    assert "int b = 2;" in text
    assert "int c = 3;" in text


# The same, where it picks a kernel parameter's type (the expanded text is what conveyor
# reads where the driver reports no types: CUDA).
def test_a_type_pasted_from_line_after_a_two_line_comment():
    src = ("#define PASTE_(a, b) a##b\n#define PASTE(a, b) PASTE_(a, b)\n"
           "typedef float real4; typedef double real5;\n"
           "/* element type:\n */ __kernel void k(__global PASTE(real, __LINE__) *x) {}\n")
    (param,) = parse_params(expand(src), "k")
    assert param.dtype == np.float64


# _NOT_CODE keeps "#include <sub//t.h>" only where "<" follows "include" after blanks; with a
# comment between them (which the compiler skips), "//t.h>" is still blanked as a comment and
# the header's macros are never read.
def test_an_angle_include_with_a_comment_before_its_name_is_read(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "t.h").write_text("#define T double\n")
    src = ("#include /* the element type */ <sub//t.h>\n"
           "__kernel void k(__global T *x) { x[0] = 1; }\n")
    (param,) = parse_params(expand(src, [f"-I{tmp_path}"]), "k")
    assert param.dtype == np.float64


# signature._read (lru_cache of 8) keeps each source with its code text and a dict of EVERY
# parenthesis pair of it (about 14 times the source's size) after the build: a 1.5 MB kernel
# keeps ~20 MB alive, eight of them ~170 MB. Before e03a848 nothing was kept.
def test_parsing_a_large_source_keeps_little_alive():
    src = ("__kernel void k(__global float* x) { int i = 0;\n"
           + "x[(i)] += (1);\n" * 100_000 + "}\n")
    size = len(src)
    gc.collect()
    tracemalloc.start()
    try:
        parse_params(src, "k")
        del src
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert kept < 2 * size, f"{kept / 1e6:.1f} MB kept for a {size / 1e6:.1f} MB source"


# Held (guards 2acbd9d): include spellings that now read "<sub//t.h>" as one name.
@pytest.mark.parametrize("line", ["#include <sub//t.h>", "#include<sub//t.h>",
                                  "# include <sub//t.h>", "#\tinclude\t<sub///t.h>",
                                  "/* c */ #include <sub//t.h>",
                                  "#include /* a\nb */ <sub/t.h>"])
def test_include_spellings_are_read(tmp_path, line):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "t.h").write_text("#define T double\n")
    src = line + "\n__kernel void k(__global T *x) { x[0] = 1; }\n"
    (param,) = parse_params(expand(src, [f"-I{tmp_path}"]), "k")
    assert param.dtype == np.float64
