"""The preprocessor that expands a kernel's source before its parameter types are read
(kernels/preprocess.py): it honours the build's -D and -I options in every spelling."""

from __future__ import annotations

import pytest

from conveyor.kernels.preprocess import expand

SOURCE = '#include "types.h"\n__kernel void f(__global const T *x) {}\n'


@pytest.mark.parametrize("spelling", ["joined", "separate", "one word with a space"])
def test_headers_are_found_in_include_dirs_however_spelled(tmp_path, spelling):
    # "-I DIR" as one option (as a shell user writes it) was searched as " DIR" before, so
    # the header's macro stayed unexpanded and the parameter type unknown.
    (tmp_path / "types.h").write_text("#define T double\n")
    options = {"joined": (f"-I{tmp_path}",), "separate": ("-I", str(tmp_path)),
               "one word with a space": (f"-I {tmp_path}",)}[spelling]
    assert "const double *x" in expand(SOURCE, options)


@pytest.mark.parametrize("options", [("-DT=double",), ("-D", "T=double"), ("-D T=double",)],
                         ids=["joined", "separate", "one word with a space"])
def test_defines_however_spelled(options):
    assert "const double *x" in expand(SOURCE.split("\n", 1)[1], options)


@pytest.mark.parametrize(("options", "expected"), [
    (("-DQ=",), "__global float *x"),  # defined as nothing, as a C compiler does
    (("-D", "Q="), "__global float *x"),
    (("-DQ",), "__global 1 float *x"),  # defined as 1
])
def test_empty_define_is_empty_not_one(options, expected):
    # "-DQ=" defined Q as 1 before, so a qualifier macro switched off with -DQ= read as
    # "__global 1 float *x" and the parameter's type was lost.
    assert expected in expand("__kernel void f(__global Q float *x) {}\n", options)


# Long numeric initializers (lookup tables) are cut before pcpp reads them
# (preprocess.collapse_tables): it tokenizes in Python, and a 1.6 MB table took it 4 s.
def _table(count: int, per_line: int = 8) -> str:
    values = [f"{(-1) ** k * k * 0.37:.5f}f" for k in range(count)]
    lines = [", ".join(values[i:i + per_line]) for i in range(0, count, per_line)]
    return "{\n" + ",\n".join(lines) + "\n}"


def test_a_long_numeric_table_is_cut_to_one_zero_keeping_its_lines():
    from conveyor.kernels.preprocess import TABLE_CHARS, collapse_tables

    table = _table(2000)
    assert len(table) > TABLE_CHARS
    source = (f"__constant float lut[2000] = {table};\n"
              "__kernel void f(__global const T *x, __global float *y) {}\n")
    cut = collapse_tables(source)
    assert "__constant float lut[2000] = {0" in cut and "0.37000f" not in cut
    assert cut.count("\n") == source.count("\n")  # lines where the compiler has them
    expanded = expand(source, ("-DT=double",))
    assert "__global const double *x" in expanded
    assert expanded.count("\n") >= source.count("\n") - 1


@pytest.mark.parametrize("body", [
    "SCALE * 1.0f, 2.0f",       # a name: a macro pcpp must expand
    "'a', 2",                    # a character constant
    "1, /* note */ 2",           # a comment
    "{1, 2}, {3, 4}, x",         # a name after nested braces
])
def test_tables_with_anything_but_numbers_are_left_to_pcpp(body):
    from conveyor.kernels.preprocess import TABLE_CHARS, collapse_tables

    long_body = ", ".join(["1.5f"] * (TABLE_CHARS // 5)) + ", " + body
    source = f"__constant float lut[] = {{{long_body}}};\n"
    assert collapse_tables(source) == source


def test_short_tables_and_the_code_after_a_table_are_untouched():
    from conveyor.kernels.preprocess import collapse_tables

    short = "__constant int t[3] = {1, 2, 3};\n__kernel void f(__global int *x) { x[0] = 1; }\n"
    assert collapse_tables(short) == short
    # Two tables, code between: each cut on its own, nothing past its ";".
    source = (f"__constant float a[2000] = {_table(2000)};\n#define T double\n"
              f"__constant float b[2000] = {_table(2000)};\n"
              "__kernel void f(__global T *x) {}\n")
    cut = collapse_tables(source)
    assert cut.count("= {0") == 2 and "#define T double" in cut
    assert "__global double *x" in expand(source)


def test_a_kernel_reading_a_long_table_streams_right(device):
    import numpy as np

    import conveyor as cv

    if device.backend != "opencl":
        pytest.skip("an OpenCL C kernel (__constant, get_global_id)")
    count = 1500
    values = np.array([(-1) ** k * k * 0.37 for k in range(count)], np.float32)
    table = "{" + ", ".join(f"{v!r}f" for v in values.tolist()) + "}"
    source = (f"#define N {count}\n__constant float lut[N] = {table};\n"
              "__kernel void look(__global const uint *i, __global float *y, ulong offset,"
              " ulong n) {\n size_t g = get_global_id(0);\n if (g < n) y[g] = lut[i[g] % N];\n}\n")
    index = np.arange(5000, dtype=np.uint32) * 7
    y = np.zeros(5000, np.float32)
    cv.stream(device.compile(source, "look"), [index], [y], device=device, block_bytes=4096)
    np.testing.assert_array_equal(y, values[index % count])
