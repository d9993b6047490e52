"""Kernel parameter types from the compiler, not the raw source text (issue 12, items 1, 4, 5).

OpenCL: types come from the driver (-cl-kernel-arg-info), on fresh builds and on binaries
loaded from the disk cache. CUDA: the source is expanded by pcpp (checked here on CUDA-dialect
sources, on the CPU) and cross-checked against the loaded kernel's argument sizes (GPU tests
at the end). Scalar ``args`` are cast or refused before any work; callables receive them.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv
from conveyor.backends import opencl as opencl_backend
from conveyor.errors import InputError
from conveyor.kernels import argtypes, build
from conveyor.kernels.argcast import cast_scalar
from conveyor.kernels.argtypes import DriverArg, check_sizes, from_driver
from conveyor.kernels.preprocess import expand
from conveyor.kernels.signature import Param, parse_params, resolve

N = 1000
# What NVRTC predefines for an sm_90 device pass (cuda.Device.source_macros).
CUDA_MACROS = (("__CUDACC__", "1"), ("__CUDACC_RTC__", "1"), ("__CUDA_ARCH__", "900"))

MACRO_TYPE = """#define T float
__kernel void scale(__global const T *x, __global T *y, T a, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * a;
}"""

TYPEDEF = """typedef double real;
__kernel void scale(__global const real *x, __global real *y, real a, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * a;
}"""

VECTOR = """__kernel void scale(__global const float4 *x, __global float4 *y, float a, ulong offset,
                    ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * a;
}"""

INT_ARG = """__kernel void fill(__global const int *x, __global int *y, int k, ulong offset,
                   ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = k;
}"""


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own cache directory and an empty in-process memo."""
    path = tmp_path / "kernel-cache"
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(path))
    monkeypatch.delenv("CONVEYOR_NO_CACHE", raising=False)
    build.clear_memo()
    yield path
    build.clear_memo()


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The once-per-process warnings of argtypes start unsaid."""
    monkeypatch.setattr(argtypes, "_warned", set())


def opencl(device: cv.Device) -> cv.Device:
    if device.backend != "opencl":
        pytest.skip("OpenCL C source")
    return device


# -- item 1: the types the compiler sees ---------------------------------------------------------
def test_macro_type_refuses_float64_data_naming_parameter_types_and_fix(device):
    k = opencl(device).compile(MACRO_TYPE, "scale")
    x = np.arange(N, dtype=np.float64)
    with pytest.raises(InputError) as info:
        cv.stream(k, [x], [np.empty_like(x)], args=(2.0,), device=device)
    message = str(info.value)
    assert "kernel parameter 'x' is float* (float32)" in message
    assert "input 0 has dtype float64" in message
    assert "pass an array of float32" in message and "declare the parameter double*" in message


def test_macro_type_from_options_runs_on_matching_data(device):
    source = MACRO_TYPE.replace("#define T float\n", "")
    k = opencl(device).compile(source, "scale", ["-DT=double"])
    assert [p.dtype for p in k.params[:3]] == [np.float64] * 3
    x = np.arange(N, dtype=np.float64)
    y = np.empty_like(x)
    cv.stream(k, [x], [y], args=(2.5,), device=device)
    np.testing.assert_array_equal(y, x * 2.5)


def test_typedef_is_resolved_and_checked(device):
    k = opencl(device).compile(TYPEDEF, "scale")
    assert k.params[0].base == "real" and k.params[0].dtype == np.float64
    x32 = np.arange(N, dtype=np.float32)
    with pytest.raises(InputError, match=r"'x' is real\* \(float64\) but input 0 has dtype "
                                         r"float32: pass an array of float64"):
        cv.stream(k, [x32], [np.empty_like(x32)], args=(2.0,), device=device)
    x = np.arange(N, dtype=np.float64)
    y = np.empty_like(x)
    cv.stream(k, [x], [y], args=(3,), device=device)
    np.testing.assert_array_equal(y, x * 3)


def test_vector_pointer_is_refused_with_how_to_write_it(device):
    k = opencl(device).compile(VECTOR, "scale")
    x = np.arange(4 * N, dtype=np.float32)
    with pytest.raises(InputError) as info:
        cv.stream(k, [x], [np.empty_like(x)], args=(2.0,), device=device)
    message = str(info.value)
    assert "'x'" in message and "float4* (4 x float32)" in message
    assert "n in scalars" in message and "declare it as float*" in message
    assert "vload4" in message


def test_local_pointer_for_a_stream_buffer_is_refused(device):
    source = """__kernel void k(__global const float *x, __local float *y, ulong offset,
                                 ulong n) {}"""
    k = opencl(device).compile(source, "k")
    x = np.arange(N, dtype=np.float32)
    with pytest.raises(InputError, match=r"'y' .* is __local memory but receives output 0: "
                                         r"declare it __global"):
        cv.stream(k, [x], [np.empty_like(x)], device=device)


def test_types_come_from_the_driver_also_from_the_disk_cache(device, private_cache):
    k = opencl(device).compile(MACRO_TYPE, "scale")
    assert {p.origin for p in k.params} == {"driver"}
    assert k.params[0].dtype == np.float32 and k.params[0].address == "global"
    build.clear_memo()
    cache = build.default_cache()
    assert cache is not None
    hits = cache.hits
    again = device.compile(MACRO_TYPE, "scale")
    assert cache.hits == hits + 1  # loaded from the stored binary, not rebuilt
    assert again.params == k.params


def test_no_driver_report_falls_back_to_the_source_and_warns_once(fresh_warnings):
    source = parse_params(expand(MACRO_TYPE), "scale")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = from_driver("scale", source, None, "some GPU")
        from_driver("scale", source, None, "some GPU")
    assert first == source and first[0].dtype == np.float32
    messages = [str(w.message) for w in record if "reports no kernel argument" in str(w.message)]
    assert len(messages) == 1 and "some GPU" in messages[0]


def test_driver_builtin_type_wins_over_the_source():
    source = parse_params("__kernel void k(__global const T *x, real b) {}", "k")
    assert source[0].dtype is None
    names = parse_params("typedef int real; __kernel void k(__global T *x, real b) {}", "k")
    reported = [DriverArg("x", "global", "double*", True), DriverArg("b", "private", "real", False)]
    params = from_driver("k", names, reported, "dev")
    assert params[0].dtype == np.float64 and params[0].is_pointer and params[0].is_const
    assert params[1].dtype == np.int32 and not params[1].is_pointer


# -- item 1 on CUDA: the expanded source (pure Python) and the size cross-check ------------------
def test_cuda_source_is_expanded_before_parsing():
    source = r"""
#include <cuda_fp16.h>
#define T float
#define KERNEL(name) extern "C" __global__ void name
#if __CUDA_ARCH__ >= 700
typedef double real;
#else
typedef float real;
#endif
using index_t = unsigned long long;
KERNEL(axpy)(const T* __restrict__ x, real* y, T a, index_t offset, index_t n) {}
"""
    params = parse_params(expand(source, (), CUDA_MACROS), "axpy")
    assert [p.name for p in params] == ["x", "y", "a", "offset", "n"]
    assert [p.dtype for p in params] == [np.float32, np.float64, np.float32, np.uint64,
                                         np.uint64]
    old = parse_params(expand(source, (), ()), "axpy")  # no __CUDA_ARCH__: the other branch
    assert old[1].dtype == np.float32


def test_cuda_defines_from_options_are_honoured():
    source = 'extern "C" __global__ void k(const T* x, unsigned long long n) {}'
    assert parse_params(expand(source, ("-D", "T=double"), CUDA_MACROS), "k")[0].dtype == \
        np.float64
    assert parse_params(expand(source, ("-DT=int",), CUDA_MACROS), "k")[0].dtype == np.int32


def test_cuda_sizes_that_disagree_are_an_input_error():
    params = parse_params('extern "C" __global__ void k(float* x, float a, '
                          'unsigned long long n) {}', "k")
    checked = check_sizes("k", params, [8, 4, 8], "GPU")
    assert {p.origin for p in checked} == {"source+sizes"}
    with pytest.raises(InputError, match=r"parameter 'a'.*float \(float32\), 4 bytes.*"
                                         r"argument is 8 bytes.*-D defines in options="):
        check_sizes("k", params, [8, 8, 8], "GPU")
    with pytest.raises(InputError, match="has 2 parameters but conveyor read 3"):
        check_sizes("k", params, [8, 8], "GPU")


def test_cuda_without_sizes_warns_once(fresh_warnings):
    params = parse_params('extern "C" __global__ void k(float* x) {}', "k")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert check_sizes("k", params, None, "old GPU") == params
        check_sizes("k", params, None, "old GPU")
    assert len([w for w in record if "reports no kernel argument sizes" in str(w.message)]) == 1


def test_vector_types_resolve_to_element_and_width():
    assert resolve("float4") == (np.dtype(np.float32), 4)
    assert resolve("uchar16") == (np.dtype(np.uint8), 16)
    assert resolve("longlong2") == (np.dtype(np.int64), 2)
    assert resolve("vec", {"vec": "double3"}) == (np.dtype(np.float64), 3)
    assert resolve("a", {"a": "b", "b": "a"}) == (None, 1)  # a typedef loop resolves to nothing


# -- item 4: arguments no cast means -------------------------------------------------------------
@pytest.mark.parametrize(("value", "phrase"), [
    (None, "None has no value"),
    ("2.5", "a string is not a number"),
    (np.ones(3, np.float32), r"an array of shape \(3,\) is not a scalar"),
    ([1.0], "a list is not a number"),
    (1j, "a complex number has no real-valued cast"),
], ids=["none", "string", "array", "list", "complex"])
def test_args_that_no_cast_means_are_refused_before_any_work(device, monkeypatch, value,
                                                             phrase):
    k = opencl(device).compile(MACRO_TYPE, "scale")
    x = np.arange(N, dtype=np.float32)
    y = np.full_like(x, 7.0)
    launches: list[object] = []
    queue_type = opencl_backend.Queue
    real_launch = queue_type.launch
    monkeypatch.setattr(queue_type, "launch",
                        lambda *a, **kw: launches.append(a) or real_launch(*a, **kw))
    with pytest.raises(InputError, match=rf"args\[0\]: .*kernel parameter 'a' \(float a\): "
                                         rf"{phrase}"):
        cv.stream(k, [x], [y], args=(value,), device=device)
    assert launches == [] and (y == 7.0).all()


def test_scalar_for_a_pointer_parameter_in_args_is_refused(device):
    # Issue 14 item 1: an array there is now a resident table (tests/pipeline/test_resident.py);
    # a scalar is still refused, naming what to pass.
    source = """__kernel void add(__global const float *x, __global float *y,
                                   __global const float *table, ulong offset, ulong n) {}"""
    k = opencl(device).compile(source, "add")
    x = np.arange(N, dtype=np.float32)
    with pytest.raises(InputError, match=r"'table' is a pointer .* receives float.*"
                                         r"pass an array .*cv.resident"):
        cv.stream(k, [x], [np.empty_like(x)], args=(1.0,), device=device)


def test_documented_casts_still_work(device):
    k = opencl(device).compile(INT_ARG, "fill")
    x = np.zeros(N, np.int32)
    for value, expected in [(3.7, 3), (-3.7, -3), (np.float64(5.0), 5), (np.array(9), 9),
                            (True, 1), (np.int64(11), 11)]:
        y = np.zeros(N, np.int32)
        cv.stream(k, [x], [y], args=(value,), device=device)
        assert (y == expected).all(), value


def test_scalar_casts():
    f32 = Param("a", False, np.dtype(np.float32), False, "float a")
    i32 = Param("k", False, np.dtype(np.int32), False, "int k")
    u8 = Param("b", False, np.dtype(np.uint8), False, "uchar b")
    assert cast_scalar(f32, 2) == np.float32(2.0)
    assert cast_scalar(f32, np.array(2.5, np.float64)) == np.float32(2.5)
    assert np.isnan(cast_scalar(f32, float("nan")))  # NaN is a float value, passed as one
    assert cast_scalar(i32, 3.7) == 3 and cast_scalar(i32, -3.7) == -3
    with pytest.raises(InputError, match="NaN value has no integer cast"):
        cast_scalar(i32, float("nan"))
    with pytest.raises(InputError, match="does not fit"):
        cast_scalar(u8, 300)
    with pytest.raises(InputError, match="does not fit"):
        cast_scalar(f32, 1e40)
    with pytest.raises(InputError, match="does not fit.*; pass an int32 value$"):
        cast_scalar(i32, np.uint64(2**40))
    with pytest.raises(InputError, match="; pass a uint8 value$"):
        cast_scalar(u8, -1)


def test_launch_refuses_none_for_a_scalar(device):
    k = opencl(device).compile(INT_ARG, "fill")
    queue = device.create_queue()
    buf = device.memory_pool.acquire(4 * N)
    try:
        with pytest.raises(InputError, match="None has no value"):
            queue.launch(k, N, [buf, buf, None, 0, N])
    finally:
        queue.finish()
        device.memory_pool.release(buf)
        queue.close()


# -- item 5: a callable receives args -------------------------------------------------------------
def test_callable_receives_args_after_the_arrays(device):
    seen: list[tuple] = []

    def scale(x, y, k, label, *, queue, offset, n):
        seen.append((k, label))
        y.set((x.get(queue) * k).astype(np.float32), queue)

    opencl(device)  # the callable uses PyOpenCL arrays
    x = np.arange(N, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(scale, [x], [y], args=(5, "tag"), device=device)
    assert seen and all(s == (5, "tag") for s in seen)
    np.testing.assert_array_equal(y, x * 5)


# -- GPU: NVRTC's kernel checked by its own argument sizes ----------------------------------------
@pytest.mark.gpu
def test_cuda_macro_type_is_checked_against_the_kernel(gpu_device):
    if gpu_device.backend != "cuda":
        pytest.skip("not a CUDA device")
    source = """#define T float
extern "C" __global__ void scale(const T* x, T* y, T a, unsigned long long offset,
                                 unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * a;
}"""
    k = gpu_device.compile(source, "scale")
    assert {p.origin for p in k.params} == {"source+sizes"}
    assert k.params[0].dtype == np.float32
    x = np.arange(N, dtype=np.float64)
    with pytest.raises(InputError, match=r"'x' is float\* \(float32\) but input 0 has dtype "
                                         r"float64"):
        cv.stream(k, [x], [np.empty_like(x)], args=(2.0,), device=gpu_device)


@pytest.mark.gpu
def test_cuda_type_conveyor_cannot_see_is_caught_by_size(gpu_device):
    if gpu_device.backend != "cuda":
        pytest.skip("not a CUDA device")
    # conveyor's preprocessor does not know __CUDACC_VER_MAJOR__ (0 there): it reads float,
    # NVRTC compiles double. The build's sizeof check (kernels/sizecheck.py) says so first,
    # at x; the kernel's argument size (8) said it at a before the check existed.
    source = """#if __CUDACC_VER_MAJOR__ >= 11
typedef double real;
#else
typedef float real;
#endif
extern "C" __global__ void scale(const real* x, real* y, real a, unsigned long long offset,
                                 unsigned long long n) {}"""
    with pytest.raises(InputError, match=r"kernel parameter scale\.x: conveyor read its type "
                                         r"real as 4 bytes( \(float\))?, but the "
                                         r"compiler's sizeof\(real\)"):
        gpu_device.compile(source, "scale")
