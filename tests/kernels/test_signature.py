"""parse_params / kernel_names: reading a kernel's parameters from OpenCL C and CUDA C."""

from __future__ import annotations

import numpy as np
import pytest

from conveyor.errors import InputError
from conveyor.kernels.signature import kernel_names, parse_params

OPENCL = """
// a comment mentioning __kernel void fake(int x)
__kernel void vadd(__global float* c, __global const float *a,
                   __global const float* restrict b, ulong offset, ulong n) {}
/* __kernel void hidden(int y) {} */
kernel void scale(global double *out, const float factor, unsigned int count) {}
__kernel __attribute__((reqd_work_group_size(64, 1, 1))) void tiled(__local float* tile) {}
__kernel void nothing(void) {}
__kernel void vec(__global float4* v, int2 pair) {}
"""

CUDA = """
extern "C" __global__ void saxpy(float a, const float* __restrict__ x, float* y, size_t n) {}
"""


def test_pointers_and_scalars():
    params = parse_params(OPENCL, "vadd")
    assert [p.name for p in params] == ["c", "a", "b", "offset", "n"]
    assert [p.is_pointer for p in params] == [True, True, True, False, False]
    assert [p.is_const for p in params] == [False, True, True, False, False]
    assert params[0].dtype == np.float32
    assert params[3].dtype == np.uint64


def test_plain_kernel_keyword_and_multiword_types():
    params = parse_params(OPENCL, "scale")
    assert params[0].dtype == np.float64 and params[0].is_pointer
    assert params[1].dtype == np.float32 and params[1].is_const and not params[1].is_pointer
    assert params[2].dtype == np.uint32


def test_attribute_before_void():
    (tile,) = parse_params(OPENCL, "tiled")
    assert tile.name == "tile" and tile.is_pointer and tile.dtype == np.float32


def test_void_parameter_list_is_empty():
    assert parse_params(OPENCL, "nothing") == ()


def test_vector_types_are_element_type_and_width():
    v, pair = parse_params(OPENCL, "vec")
    assert v.is_pointer and v.dtype == np.float32 and v.width == 4 and v.base == "float4"
    assert pair.dtype == np.int32 and pair.width == 2 and pair.type_text == "int2 pair"


def test_typedefs_and_using_resolve():
    source = """typedef unsigned int count_t; typedef count_t idx;
    using real = double;
    typedef float *fptr;
    __kernel void k(__global real *x, idx i, fptr p, struct s v) {}"""
    x, i, p, v = parse_params(source, "k")
    assert x.dtype == np.float64 and x.base == "real"
    assert i.dtype == np.uint32
    assert p.dtype == np.float32 and p.is_pointer  # a pointer typedef: a pointer to float
    assert v.dtype is None


def test_address_spaces():
    c, a, b, *_ = parse_params(OPENCL, "vadd")
    assert c.address == "global"
    (tile,) = parse_params(OPENCL, "tiled")
    assert tile.address == "local"


def test_cuda_global_kernel():
    params = parse_params(CUDA, "saxpy")
    assert [p.dtype for p in params] == [np.float32, np.float32, np.float32, np.uint64]
    assert params[1].is_const and params[1].is_pointer


def test_kernels_in_comments_are_ignored():
    assert kernel_names(OPENCL) == ["vadd", "scale", "tiled", "nothing", "vec"]


def test_missing_kernel_names_the_ones_found():
    with pytest.raises(InputError, match="no kernel named 'hidden'.*vadd, scale"):
        parse_params(OPENCL, "hidden")


def test_missing_kernel_in_empty_source():
    with pytest.raises(InputError, match="kernels found: none"):
        parse_params("int x;", "vadd")
