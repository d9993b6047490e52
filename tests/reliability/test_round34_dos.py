"""Round thirty-four: denial of service by hostile input (kernel sources, build logs).

Each finding was a strict xfail asserting the right RESULT at a size where the code before
its fix took minutes (the round's helper ran them under a SIGALRM so that the file stayed
fast while they failed); fixed in session 20, each is a plain test with no timer: a
regression shows as a hang (the faulthandler's timeout in CI). The one still open, the long
sum, crashes its child process at once.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit

from conveyor.kernels import sizecheck  # noqa: E402
from conveyor.kernels.preprocess import expand_checked  # noqa: E402
from conveyor.kernels.signature import code_only, kernel_names, parse_params  # noqa: E402
from conveyor.kernels.typedefs import declared  # noqa: E402
from conveyor.pipeline.structs import c_layout  # noqa: E402

KERNEL = "__kernel void k(__global float *x) { x[0] = 1; }\n"


def _is_float_pointer_x(params: tuple[Any, ...]) -> bool:
    return (len(params) == 1 and params[0].name == "x" and params[0].is_pointer
            and params[0].dtype == np.float32)


# --- 1. An unclosed comment: each "/*" scans to the end of the source -----------------------

def test_an_unclosed_comment_is_blanked_in_one_pass():
    hostile = KERNEL + "/* " * 200_000
    params = parse_params(hostile, "k")
    assert _is_float_pointer_x(params)


def test_pcpp_is_not_handed_an_unclosed_comment_to_rescan():
    hostile = KERNEL + "/* " * 40_000
    params = parse_params(expand_checked(hostile)[0], "k")
    assert _is_float_pointer_x(params)


# --- 2. Declarations never closed by ';' ---------------------------------------------------

def test_declarations_with_no_semicolon_are_read_in_one_pass():
    assert declared("typedef " * 75_000) == {}
    assert declared("using x = " * 60_000) == {}
    hostile = KERNEL + "typedef " * 75_000
    assert _is_float_pointer_x(parse_params(hostile, "k"))


# --- 3. Kernel heads whose parameter lists never close --------------------------------------

def test_unclosed_kernel_heads_before_the_definition_are_read_in_one_pass():
    hostile = "__kernel void k(" * 20_000 + KERNEL
    assert _is_float_pointer_x(parse_params(hostile, "k"))


# --- 4. A source of many kernels: the size check reads the whole source per kernel -----------

def _kernels(count: int) -> str:
    return "typedef float real;\n" + "".join(
        f"__kernel void k{i}(__global real *x, real s) {{ x[0] = s; }}\n" for i in range(count))


def test_the_size_check_of_many_kernels_reads_the_source_once():
    few = sizecheck.checks(_kernels(3), _kernels(3))
    assert [c[1:] for c in few] == [("real", 4, few[0][3])]
    many = _kernels(3_000)
    assert sizecheck.checks(many, many) == few


# --- 5. A struct's typedef read from a forward declaration with a long gap -------------------

def test_a_struct_typedef_after_a_long_gap_is_laid_out_in_one_pass():
    # Valid C: a forward declaration (typedef struct  Tag T;), then the struct S read.
    source = ("typedef struct" + " " * 400_000 + "Tag T;\n"
              "typedef struct { float a; int b; } S;\n")
    assert c_layout(source, "S") == ("S", 8, [0, 4], [4, 4])


# --- 6. A long expression: the compiler overflows the calling thread's stack ---------------

_LONG_SUM = """
import conveyor as cv
source = "__kernel void k(__global float *x) { x[0] = " + "1+" * 32768 + "1; }"
cv.device("opencl:0:0").compile(source, "k")
print("built")
"""


def test_a_long_sum_builds_instead_of_killing_the_process(tmp_path):
    import os
    import subprocess

    env = {**os.environ, "CONVEYOR_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", _LONG_SUM], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "built", done.returncode


# --- What held (guards) -------------------------------------------------------------------

def test_linear_inputs_that_held():
    """Long runs that each of these reads in one pass today (timed in the round's script):
    kernel heads of unclosed attributes, '<' runs in parameter lists, many '/**/' comments,
    unclosed string literals."""
    big = "__kernel void __attribute__((" + "x" * 300_000 + "\n" + KERNEL
    assert _is_float_pointer_x(parse_params(big, "k"))
    heads = "".join(f"__kernel void k{i}(float x) {{}}\n" for i in range(20_000))
    assert kernel_names(heads) == [f"k{i}" for i in range(20_000)]
    many = "/* */ " * 50_000 + KERNEL
    assert _is_float_pointer_x(parse_params(many, "k"))
    assert code_only('x = "' + "a" * 300_000) == 'x = "' + "a" * 300_000


def test_a_line_of_many_comments_is_read_in_one_pass():
    """Session 20's re-read: deciding whether each comment sat on a directive's line looked
    back to the line's start, quadratic on one long line of comments (not a timing: at this
    size the old reading took minutes)."""
    from conveyor.kernels.signature import without_comments

    hostile = "/**/" * 300_000 + "\n" + KERNEL
    assert without_comments(hostile) == " " * 300_000 + "\n" + KERNEL
    assert without_comments("/**/ #define A /*\n*/ 1\nB\n") == "  #define A   1\n\nB\n"
