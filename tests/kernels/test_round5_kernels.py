"""Kernel parameters and arguments written in unusual but valid OpenCL C (fifth round).

An unnamed parameter crashed the process (PoCL segfaults when asked its name); OpenCL C's
128-bit ``long long`` was passed 8 bytes; ``reqd_work_group_size`` failed mid-stream with
INVALID_WORK_GROUP_SIZE. Real PoCL builds, each test with its own cache directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv
from conveyor.errors import InputError
from conveyor.kernels.argcast import cast_scalar
from conveyor.kernels.signature import Param, kernel_names, parse_params

pytestmark = pytest.mark.usefixtures("fresh_memo")  # tests/conftest.py


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "kernel-cache"
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(path))
    return path


def opencl(device: cv.Device) -> cv.Device:
    if device.backend != "opencl":
        pytest.skip("OpenCL C source")
    return device


BODY = "ulong offset, ulong n) { ulong i = get_global_id(0); if (i < n) y[i] = "


def test_parse_params_reads_a_lone_type_as_an_unnamed_parameter():
    source = ("__kernel void f(__global const float *x, float, const unsigned int, real, "
              "__global float *, ulong offset, ulong n) {}")
    params = parse_params(source, "f")
    assert [p.name for p in params] == ["x", "", "", "", "", "offset", "n"]
    assert [p.base for p in params[1:5]] == ["float", "unsigned int", "real", "float"]
    assert str(params[2].dtype) == "uint32"
    named = parse_params("__kernel void f(unsigned x, float y) {}", "f")
    assert [(p.name, str(p.dtype)) for p in named] == [("x", "uint32"), ("y", "float32")]


def test_unnamed_parameter_compiles_and_runs_fresh_and_from_the_disk_cache(device, tmp_path):
    """Asking PoCL the name of an unnamed argument was a segmentation fault in compile.
    OpenCL C (C99) does not allow the form, so a compiler may refuse it instead (NVIDIA's
    does, "parameter name omitted"): then compile raises CompileError, never a crash."""
    opencl(device)
    script = textwrap.dedent(f"""
        import sys
        import numpy as np, conveyor as cv
        from conveyor.errors import CompileError
        from conveyor.kernels import build
        SRC = ("__kernel void f(__global const float *x, __global float *y, float, "
               "{BODY}x[i] * 2.0f; }}")
        dev = cv.device({device.spec!r})
        for _ in range(2):  # built, then loaded from the disk cache
            try:
                k = dev.compile(SRC, "f")
            except CompileError as exc:
                assert "name omitted" in (exc.log or ""), exc.log
                print("refused")
                sys.exit(0)
            x = np.arange(100, dtype=np.float32)
            y = np.zeros_like(x)
            cv.stream(k, inputs=[x], outputs=[y], args=(1.0,), device=dev)
            assert np.array_equal(y, x * 2), y
            build.clear_memo()
        print("ran")
    """)
    env = {**os.environ, "CONVEYOR_CACHE_DIR": str(tmp_path / "sub-cache")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ran" in done.stdout or "refused" in done.stdout


@pytest.mark.parametrize("type_", ["long long", "unsigned long long", "__global long long *"])
def test_opencl_long_long_parameter_is_refused_at_compile(device, type_):
    """OpenCL C's long long is 128 bits: passed as an int64 the kernel read garbage."""
    source = (f"__kernel void f(__global const float *x, __global float *y, {type_} k, "
              f"{BODY}x[i]; }}")
    with pytest.raises(InputError) as info:
        opencl(device).compile(source, "f")
    message = str(info.value)
    assert "parameter 'k'" in message and "128 bits" in message
    assert "declare it long or ulong" in message


def test_reqd_work_group_size_is_the_launch_work_group_size(device):
    """A kernel declaring reqd_work_group_size(7, 1, 1) failed its first launch with
    INVALID_WORK_GROUP_SIZE; it now runs with work groups of 7 (n not a multiple of 7)."""
    source = ("__kernel __attribute__((reqd_work_group_size(7, 1, 1))) void f("
              f"__global const float *x, __global float *y, {BODY}x[i] * 3.0f; }}")
    k = opencl(device).compile(source, "f")
    x = np.arange(1000, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(k, inputs=[x], outputs=[y], device=device, block_bytes=1024)
    assert np.array_equal(y, x * 3)


def test_two_dimensional_reqd_work_group_size_is_refused_at_compile(device):
    source = ("__kernel __attribute__((reqd_work_group_size(8, 2, 1))) void f("
              f"__global const float *x, __global float *y, {BODY}x[i]; }}")
    with pytest.raises(InputError, match=r"reqd_work_group_size\(N, 1, 1\)"):
        opencl(device).compile(source, "f")


DEFAULT_SCALE = """#ifndef SCALE
#define SCALE 1.0f
#endif
__kernel void f(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * SCALE;
}"""


@pytest.mark.parametrize("wait", [True, False])
def test_nul_in_an_option_is_refused_not_the_rest_dropped(device, wait):
    """The compiler reads options as one C string: a NUL ended it, so -DSCALE=2.0f after it
    was dropped and the kernel multiplied by 1 with no error."""
    with pytest.raises(InputError, match=r"options\[0\].*NUL character.*remove it"):
        opencl(device).compile(DEFAULT_SCALE, "f", ["-DUNUSED\0", "-DSCALE=2.0f"], wait=wait)
    k = device.compile(DEFAULT_SCALE, "f", ["-DUNUSED", "-DSCALE=2.0f"])
    x = np.arange(100, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(k, inputs=[x], outputs=[y], device=device)
    assert np.array_equal(y, x * 2)


def test_nul_in_the_source_is_refused_naming_its_line(device):
    with pytest.raises(InputError, match=r"NUL character \(line 5\)"):
        opencl(device).compile(DEFAULT_SCALE.replace("{\n", "{\n\0", 1), "f")


# -- the cache key follows every header the compiler reads ---------------------------------------
def _include_cases(folder: Path) -> dict[str, tuple[str, list[str]]]:
    return {
        "absolute path, no -I": (f'#include "{folder}/h.h"\n', []),
        "-I inside another option": ('#include "h.h"\n', [f"-DQ=1 -I{folder}"]),
        "comment inside the directive": ('# /* why */ include /* it */ "h.h"\n',
                                         [f"-I{folder}"]),
        "continued line": ('#include \\\n"h.h"\n', [f"-I{folder}"]),
    }


@pytest.mark.parametrize("case", ["absolute path, no -I", "-I inside another option",
                                  "comment inside the directive", "continued line"])
def test_cache_key_changes_when_a_header_the_compiler_reads_changes(tmp_path, case):
    from conveyor.kernels.cache import cache_key

    folder = tmp_path / "inc"
    folder.mkdir()
    header = folder / "h.h"
    include, options = _include_cases(folder)[case]
    source = include + "__kernel void f(__global float *y) { y[0] = SCALE; }"
    header.write_text("#define SCALE 2.0f\n")
    before = cache_key("identity", options, source)
    header.write_text("#define SCALE 3.0f\n")
    assert cache_key("identity", options, source) != before


def test_edited_header_included_by_absolute_path_is_rebuilt_not_loaded_stale(device, tmp_path):
    """``#include "/abs/h.h"`` with no -I: the key left the header out and the disk cache
    served the binary of its old text."""
    from conveyor.kernels import build

    header = tmp_path / "h.h"
    source = (f'#include "{header}"\n__kernel void f(__global const float *x, '
              f"__global float *y, {BODY}x[i] * SCALE; }}")
    x = np.arange(100, dtype=np.float32)
    for scale in (2.0, 3.0):
        header.write_text(f"#define SCALE {scale}f\n")
        build.clear_memo()  # as a new process would: through the disk cache
        y = np.zeros_like(x)
        cv.stream(opencl(device).compile(source, "f"), inputs=[x], outputs=[y], device=device)
        assert np.array_equal(y, x * scale)


def test_kernel_names_read_void_before_the_kernel_keyword_and_attributes_around_it():
    source = ("__kernel void a(int x) {}\nvoid __kernel b(int y) {}\nvoid kernel c(int z) {}\n"
              "kernel __attribute__((reqd_work_group_size(1, 1, 1))) "
              "__attribute__((vec_type_hint(float))) void d(int w) {}\nvoid helper(int v) {}")
    assert kernel_names(source) == ["a", "b", "c", "d"]
    assert [p.name for p in parse_params(source, "b")] == ["y"]


def test_void_before_kernel_keyword_compiles_and_runs(device):
    """``void __kernel f(...)`` builds (C takes specifiers in any order) but conveyor said
    "no kernel named 'f' in the source; kernels found: none"."""
    source = f"void __kernel f(__global const float *x, __global float *y, {BODY}x[i] * 2.0f; }}"
    k = opencl(device).compile(source, "f")
    x = np.arange(100, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(k, inputs=[x], outputs=[y], device=device)
    assert np.array_equal(y, x * 2)


# -- scalar args of NumPy's extended types -------------------------------------------------------
def _param(dtype: str) -> Param:
    return Param("k", False, np.dtype(dtype), False, f"{dtype} k", base=dtype)


def test_longdouble_to_an_int_parameter_is_truncated_not_a_raw_type_error():
    """np.longdouble's .item() stays a NumPy scalar without __trunc__: math.trunc raised
    TypeError out of cast_scalar."""
    assert cast_scalar(_param("int32"), np.longdouble(2.5)) == np.int32(2)
    assert cast_scalar(_param("int64"), np.longdouble(-2.5)) == np.int64(-2)
    with pytest.raises(InputError, match="'k'"):
        cast_scalar(_param("int32"), np.longdouble("1e30"))


def test_longdouble_beyond_float64_is_refused_not_passed_as_inf():
    huge = np.longdouble("1e4000")
    if not np.isfinite(huge):
        pytest.skip("np.longdouble is float64 on this platform")
    with pytest.raises(InputError, match="does not fit"):
        cast_scalar(_param("float64"), huge)


def test_clongdouble_to_a_real_parameter_is_refused_not_its_imaginary_part_dropped():
    value = np.clongdouble(3 + 4j)
    for dtype in ("int32", "float64"):
        with pytest.raises(InputError, match="complex number"):
            cast_scalar(_param(dtype), value)
    assert cast_scalar(_param("complex128"), value) == 3 + 4j


def test_typedef_inside_a_function_does_not_retype_the_kernels_file_scope_typedef(device):
    """``typedef float T;`` at file scope and ``typedef int T;`` inside a helper: the last
    one read won, so the kernel's T* took int32 arrays (read as floats) and refused float32."""
    source = ("typedef float T;\nfloat helper(float v) { typedef int T; T k = 2; return v * k; }\n"
              f"__kernel void f(__global const T *x, __global float *y, {BODY}x[i] * 2.0f; }}")
    k = opencl(device).compile(source, "f")
    assert str(k.params[0].dtype) == "float32"
    x = np.arange(100, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(k, inputs=[x], outputs=[y], device=device)
    assert np.array_equal(y, x * 2)
    with pytest.raises(InputError, match="T\\* \\(float32\\)"):
        cv.stream(k, inputs=[x.astype(np.int32)], outputs=[y], device=device)


def test_a_run_of_attributes_before_a_non_kernel_is_read_in_linear_time():
    """Kernel heads now take any number of attributes; skipping each with ``.*?`` would give
    a run of them not followed by ``void`` exponentially many readings to backtrack through
    (20: 0.2 s, 40: hours). A subprocess, so that such a regression fails at the timeout
    instead of hanging the suite."""
    script = ("from conveyor.kernels.signature import kernel_names\n"
              "src = '__kernel ' + '__attribute__((a(1))) ' * 40 + 'int g(void) {}\\n'\n"
              "src += 'kernel __attribute__((reqd_work_group_size(1, 1, 1))) void f(int k) {}'\n"
              "print(kernel_names(src))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['f']"
