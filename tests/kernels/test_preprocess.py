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
