"""Struct layouts with nested structs and vector members, against the compiler's own answer.

conveyor lays out the structs a kernel source defines (pipeline/clayout.py) to judge the
records it is given. Here the compiler says where each member lies (``sizeof`` and pointer
differences, written by a real kernel on each device), and conveyor's reading must agree;
records laid out as conveyor advises must then give the right values, and records NumPy lays
out otherwise must be refused before any work.
"""

from __future__ import annotations

import numpy as np
import pytest

import conveyor as cv
from conveyor.errors import InputError
from conveyor.pipeline import clayout, structs

#: Struct definitions (each ending in a struct named ``rec``) and the member paths to locate.
OPENCL_LAYOUTS = {
    "nested": ("typedef struct { uchar a; float b; } inner;\n"
               "typedef struct { inner p; int c; } rec;", ["p", "p.b", "c"]),
    "float4": ("typedef struct { float4 v; float c; } rec;", ["v", "c"]),
    "float3": ("typedef struct { char a; float3 v; short s; } rec;", ["v", "s"]),
    "float3_array": ("typedef struct { char a; float3 v[2]; char z; } rec;",
                     ["v", "v[1]", "z"]),
    "tagged_array": ("struct inner { double d; char c; };\n"
                     "typedef struct { char a; struct inner p[2]; uchar2 u; long l; } rec;",
                     ["p", "p[1].c", "u", "l"]),
    "wide": ("typedef struct { uchar16 u; char c; double2 d; int8 e; } rec;",
             ["c", "d", "e"]),
    "typedef_chain": ("typedef struct { int a; char b; } base_t;\ntypedef base_t alias_t;\n"
                      "typedef struct { char c; alias_t x; short s; } rec;", ["x", "x.b", "s"]),
    "three_deep": ("struct A { char c; short2 h; };\nstruct B { struct A a; double d; };\n"
                   "struct C { char e; struct B b[3]; };\ntypedef struct C rec;",
                   ["b", "b[2].a.h", "b[1].d"]),
}

CUDA_LAYOUTS = {
    "nested": ("struct inner { unsigned char a; float b; };\n"
               "struct rec { inner p; int c; };", ["p", "p.b", "c"]),
    "vectors": ("struct rec { char a; float3 v; char b; float4 w; short3 s; int2 i; };",
                ["v", "b", "w", "s", "i"]),
    "small": ("struct rec { char a; char3 c; double2 d; uchar4 u; };", ["c", "d", "u"]),
}


def _layout_kernel(device: cv.Device, decl: str, paths: list[str]):
    """A kernel writing sizeof(rec) and each path's offset into rec, compiled for ``device``."""
    values = ", ".join(["sizeof(rec)"] + [f"(unsigned long)((char *)&r.{p} - (char *)&r)"
                                          for p in paths])
    if device.backend == "cuda":
        source = decl + f"""
extern "C" __global__ void lay(const unsigned char *x, unsigned long *y,
                               unsigned long offset, unsigned long n) {{
    rec r;
    unsigned long v[] = {{{values}}};
    unsigned long i = blockIdx.x * (unsigned long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = v[i];
}}"""
    else:
        source = decl + f"""
__kernel void lay(__global const uchar *x, __global ulong *y, ulong offset, ulong n) {{
    rec r;
    ulong v[] = {{{values}}};
    ulong i = get_global_id(0);
    if (i < n) y[i] = v[i];
}}"""
    return device.compile(source, "lay")


def _conveyors_offsets(code: str, paths: list[str]) -> list[int]:
    """sizeof(rec) and each path's offset as conveyor lays the struct out."""
    rec = clayout.struct_type(code, "rec")
    assert rec is not None, "conveyor did not read struct rec"
    found = [rec.size]
    for path in paths:
        ctype, at = rec, 0
        for part in path.split("."):
            name, _, index = part.partition("[")
            member = next(m for m in ctype.members if m.field == name)
            at += member.offset + (int(index.rstrip("]")) * member.ctype.size if index else 0)
            ctype = member.ctype
        found.append(at)
    return found


def _cases(device: cv.Device) -> dict[str, tuple[str, list[str]]]:
    return CUDA_LAYOUTS if device.backend == "cuda" else OPENCL_LAYOUTS


@pytest.mark.parametrize("case", sorted(set(OPENCL_LAYOUTS) | set(CUDA_LAYOUTS)))
def test_conveyor_lays_out_structs_as_the_compiler_does(device, case):
    cases = _cases(device)
    if case not in cases:
        pytest.skip(f"no {device.backend} case {case!r}")
    decl, paths = cases[case]
    kernel = _layout_kernel(device, decl, paths)
    out = cv.stream(kernel, [np.zeros(len(paths) + 1, np.uint8)], [np.uint64],
                    device=device).outputs[0]
    assert _conveyors_offsets(structs.struct_source(kernel), paths) == out.tolist()


READ_SRC = """typedef struct { char a; float3 v; int c; } vec_t;
typedef struct { uchar tag; vec_t p[2]; } rec;
__kernel void rd(__global const rec *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i].p[1].v.z + (float)x[i].p[0].c + (float)x[i].tag;
}"""


def test_records_of_the_advised_dtype_read_right(device):
    if device.backend == "cuda":
        pytest.skip("an OpenCL C kernel")
    kernel = device.compile(READ_SRC, "rd")
    dtype = structs.c_dtype(structs.struct_source(kernel), "rec")
    assert dtype is not None and dtype.itemsize == 112
    records = np.zeros(300, dtype)
    records["tag"] = np.arange(300) % 7
    records["p"]["c"][:, 0] = np.arange(300)
    records["p"]["v"][:, 1, 2] = np.arange(300) * 0.5
    out = cv.stream(kernel, [records], [np.float32], device=device, block_bytes=64 * 112).outputs[0]
    want = (np.arange(300) * 0.5 + np.arange(300) + np.arange(300) % 7).astype(np.float32)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("dtype", [
    # NumPy's packed nesting: 9-byte inner records
    np.dtype([("tag", "u1"), ("p", [("a", "i1"), ("v", "f4", (3,)), ("c", "i4")], (2,))]),
    # aligned by NumPy's rules: float3 4-aligned, 20-byte inner records
    np.dtype([("tag", "u1"), ("p", [("a", "i1"), ("v", "f4", (3,)), ("c", "i4")], (2,))],
             align=True),
])
def test_records_numpy_lays_out_otherwise_are_refused(device, dtype):
    if device.backend == "cuda":
        pytest.skip("an OpenCL C kernel")
    kernel = device.compile(READ_SRC, "rd")
    with pytest.raises(InputError, match="struct 'rec'") as refused:
        cv.stream(kernel, [np.zeros(10, dtype)], [np.float32], device=device)
    advised = structs.spell(structs.c_dtype(structs.struct_source(kernel), "rec"))
    assert advised in str(refused.value)
    assert eval(advised, {"np": np}) == structs.c_dtype(structs.struct_source(kernel), "rec")


def test_a_nested_record_placed_right_outside_but_packed_inside_is_refused(device):
    if device.backend == "cuda":
        pytest.skip("an OpenCL C kernel")
    src = """typedef struct { uchar a; float b; } inner;
typedef struct { inner p; int c; } rec;
__kernel void rd(__global const rec *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i].p.b;
}"""
    # the outer fields sit where C puts them (c at 8, 12 bytes), the inner b at 1, not 4
    dtype = np.dtype({"names": ["p", "c"], "formats": [[("a", "u1"), ("b", "f4")], "i4"],
                      "offsets": [0, 8], "itemsize": 12})
    with pytest.raises(InputError, match="in field 'p'.*field 'b'"):
        cv.stream(device.compile(src, "rd"), [np.zeros(10, dtype)], [np.float32],
                  device=device)


def test_a_vector_member_given_too_few_lanes_is_refused(device):
    if device.backend == "cuda":
        pytest.skip("an OpenCL C kernel")
    src = """typedef struct { float4 v; float c; } rec;
__kernel void rd(__global const rec *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i].v.w;
}"""
    # 16-byte v, c at 16, 32 bytes: placed right, but v holds 2 floats, not 4
    dtype = np.dtype({"names": ["v", "c"], "formats": [("f4", (2,)), "f4"],
                      "offsets": [0, 16], "itemsize": 32})
    with pytest.raises(InputError, match=r"no field covers member 'v\.s2' \(bytes 8 to 11\)"):
        cv.stream(device.compile(src, "rd"), [np.zeros(10, dtype)], [np.float32],
                  device=device)


@pytest.mark.parametrize("dtype", [
    np.dtype([("a", "u1"), ("b", "<f4")]),
    np.dtype([("a", "u1"), ("b", "<f4")], align=True),
    np.dtype([("a", "u1"), ("p", [("x", "<i2"), ("y", "<f8")], (2,)), ("v", "<f4", (3,))],
             align=True),
    np.dtype({"names": ["v", "c"], "formats": [("<f4", (3,)), "<i4"], "offsets": [0, 16],
              "itemsize": 32}, align=True),
    np.dtype({"names": ["p", "c"], "formats": [[("a", "u1"), ("b", "<f4")], "<i4"],
              "offsets": [0, 8], "itemsize": 12}),
])
def test_a_spelled_dtype_makes_the_same_dtype(dtype):
    assert eval(structs.spell(dtype), {"np": np}) == dtype


def test_a_struct_nested_too_deep_or_holding_itself_is_not_read():
    deep = "".join(f"struct s{i} {{ char c; struct s{i + 1} n; }};\n" for i in range(9))
    deep += "struct s9 { int x; };\n"
    # read from the inside out first: the outer ones stay unread, as when read first
    assert clayout.struct_type(deep, "struct s2") is not None
    assert clayout.struct_type(deep, "struct s0") is None
    assert clayout.struct_type(deep + " ", "struct s0") is None
    assert clayout.struct_type(deep + "  ", "struct s2") is not None
    looped = "struct a { char c; struct b x; };\nstruct b { int i; struct a y; };\n"
    assert clayout.struct_type(looped, "struct a") is None
    assert clayout.struct_type(looped, "struct b") is None


@pytest.mark.parametrize(("name", "lang", "want"), [
    ("float3", "opencl", (16, 16, 12)), ("float3", "cuda", (12, 4, 12)),
    ("float3", None, None), ("float4", None, (16, 16, 16)), ("char3", "cuda", (3, 1, 3)),
    ("double4", "cuda", None), ("double4", "opencl", (32, 32, 32)), ("int16", "cuda", None),
    ("long2", None, (16, 16, 16)), ("float1", "opencl", None), ("float5", "opencl", None),
])
def test_vector_layouts_by_language(name, lang, want):
    found = clayout.vector(name, lang)
    assert (None if found is None else (found.size, found.align, found.data)) == want


def test_a_struct_tag_the_compiler_lays_out_otherwise_is_refused_at_its_build(device):
    # sizeof(struct rec), not sizeof(rec) (no type where only the tag is defined, so the
    # compiler could not evaluate the check and the build went on without it)
    if device.backend == "cuda" or "Portable Computing Language" not in device.info.platform:
        pytest.skip("PoCL's compiler defines __clang__, which conveyor's preprocessor does not")
    src = """struct rec {
#ifdef __clang__
  double a;
#else
  float a;
#endif
  float b;
};
__kernel void use(__global const struct rec *x, __global double *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i].a;
}"""
    with pytest.raises(InputError, match=r"use\.x: conveyor laid out struct rec from its "
                                         r"definition in 8 bytes, but the compiler's "
                                         r"sizeof\(struct rec\) differs"):
        device.compile(src, "use")
