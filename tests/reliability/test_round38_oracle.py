"""Round thirty-eight: conveyor's reading of kernel sources against the compiler's own answer.

Method (seeded generators kept out of the repository, under /tmp/r38o): valid OpenCL C
kernels varying the syntax a programmer uses (macros and typedef chains for types and address
spaces, ``unsigned int``/``uint``/``long unsigned int``, ``__global``/``global``, ``const``
before or after the type, ``restrict``, a ``reqd_work_group_size`` attribute, comments and
line continuations between tokens, ``#if`` branches, several kernels per source), each
parameter compared with PoCL's ``clGetKernelArgInfo`` (``-cl-kernel-arg-info``) and the
generator's truth: 150 sources, every parameter agreed. Structs (scalar, vector, nested and
array members; typedef'd, tagged, and both) were laid out by the compiler (a probe kernel
writing ``sizeof`` and ``__builtin_offsetof`` of every member) and compared with
``structs.c_layout``/``c_dtype``; 300 nested/vector structs and 120 plain ones agreed; then
records laid out both ways (NumPy's packed layout, the compiler's) were streamed.

Found (each a strict xfail below): what stands outside a struct's braces is not read. An
alignment or packing attribute after the closing brace, a ``packed`` that is not the first
word of its attribute, ``_Pragma("pack(1)")``, a typedef name that names another struct
than the tag of the same name, a block-scope struct of the same tag before the file's, and
a typedef that redefines a fixed-width name (``int32_t``): the struct is laid out from the
wrong text. Where the parameter is a typedef name the build's size check refuses the legal
kernel (blaming predefined macros); where it is ``struct rec *``, the size check cannot
evaluate ``sizeof(rec)`` and is dropped, so the compiler's records are refused and records
of conveyor's wrong layout run with wrong values.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import first_device_only, opencl_c_only  # noqa: E402, F401 (autouse)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

N = 50


def _use(decl: str, ctype: str, expr: str) -> str:
    """``decl`` then a kernel reading each record of ``ctype`` as ``expr`` (of ``x[i]``)."""
    return decl + f"""
__kernel void use(__global const {ctype} *x, __global double *y, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) y[i] = {expr};
}}"""


def _records(dtype: np.dtype) -> np.ndarray:
    records = np.zeros(N, dtype)
    for number, field in enumerate(dtype.names or ()):
        records[field] = np.arange(N) * (number + 2) + number
    return records


def _expected(records: np.ndarray, weights: dict[str, int]) -> np.ndarray:
    return sum(records[f].astype(np.float64) * w for f, w in weights.items())


def _refused_or_right(device, source, records, weights):
    """A stream of ``records`` through ``use``: refused before any work (at its build or at
    the stream), or right."""
    try:
        k = device.compile(source, "use")
        y = cv.stream(k, [records], [np.float64], device=device).outputs[0]
    except InputError:
        return
    np.testing.assert_array_equal(y, _expected(records, weights))


def _taken_and_right(device, source, records, weights):
    """A stream of ``records`` (the compiler's own layout) through ``use``: right."""
    k = device.compile(source, "use")
    y = cv.stream(k, [records], [np.float64], device=device).outputs[0]
    np.testing.assert_array_equal(y, _expected(records, weights))


XYZ = "struct rec { float x; float y; float z; } __attribute__((aligned(16)));"
XYZ_EXPR = "x[i].x + 2.0 * x[i].y + 3.0 * x[i].z"
XYZ_WEIGHTS = {"x": 1, "y": 2, "z": 3}


def test_aligned_struct_given_numpys_packed_records_is_refused_or_right(device):
    opencl_c_only(device)
    records = _records(np.dtype([("x", "f4"), ("y", "f4"), ("z", "f4")]))
    _refused_or_right(device, _use(XYZ, "struct rec", XYZ_EXPR), records, XYZ_WEIGHTS)


def test_aligned_struct_given_the_compilers_records_runs(device):
    opencl_c_only(device)
    dtype = np.dtype({"names": ["x", "y", "z"], "formats": ["f4"] * 3,
                      "offsets": [0, 4, 8], "itemsize": 16})
    _taken_and_right(device, _use(XYZ, "struct rec", XYZ_EXPR), _records(dtype),
                     XYZ_WEIGHTS)


def test_typedef_struct_with_an_alignment_attribute_builds_and_runs(device):
    opencl_c_only(device)
    decl = "typedef struct rec { float a; int b; } __attribute__((aligned(16))) rec;"
    dtype = np.dtype({"names": ["a", "b"], "formats": ["f4", "i4"], "offsets": [0, 4],
                      "itemsize": 16})
    _taken_and_right(device, _use(decl, "rec", "x[i].a + 2.0 * x[i].b"), _records(dtype),
                     {"a": 1, "b": 2})


PACKED_SPELLINGS = {
    # packed after another attribute in one list: structs.packs matches "((packed" only
    "after_aligned": "__attribute__((aligned(1), packed))",
    # the same attribute with a space between its parentheses
    "spaced": "__attribute__( (packed) )",
}


@pytest.mark.parametrize("spelling", sorted(PACKED_SPELLINGS))
def test_packed_struct_spelled_otherwise_takes_packed_records(device, spelling):
    opencl_c_only(device)
    decl = f"struct rec {{ char a; int b; }} {PACKED_SPELLINGS[spelling]};"
    records = _records(np.dtype([("a", "i1"), ("b", "i4")]))  # 5 bytes, as the compiler
    _taken_and_right(device, _use(decl, "struct rec", "x[i].a + 2.0 * x[i].b"), records,
                     {"a": 1, "b": 2})


def test_pragma_operator_pack_builds_and_takes_packed_records(device):
    opencl_c_only(device)
    decl = '_Pragma("pack(1)")\ntypedef struct { short a; double b; } rec;'
    records = _records(np.dtype([("a", "i2"), ("b", "f8")]))  # 10 bytes, as the compiler
    _taken_and_right(device, _use(decl, "rec", "x[i].a + 2.0 * x[i].b"), records,
                     {"a": 1, "b": 2})


# Held since clayout.py (found failing by the generator against the structs.py before it):
# a typedef name of another struct is laid out as that struct, not the tag of its name.
def test_typedef_of_another_struct_beside_a_tag_of_its_name_builds_and_runs(device):
    opencl_c_only(device)
    decl = ("struct other { char c; int v; };\ntypedef struct other rec;\n"
            "struct rec { double d; double e; };")
    records = _records(np.dtype([("c", "i1"), ("v", "i4")], align=True))
    _taken_and_right(device, _use(decl, "rec", "x[i].c + 2.0 * x[i].v"), records,
                     {"c": 1, "v": 2})


def test_block_scope_struct_of_the_same_tag_does_not_decide_the_layout(device):
    opencl_c_only(device)
    decl = ("float helper(float v) { struct rec { double d; char e; } t; t.d = v; "
            "return (float)t.d; }\nstruct rec { int a; int b; };")
    records = _records(np.dtype([("a", "i4"), ("b", "i4")]))  # 8 bytes, as the compiler
    _taken_and_right(device, _use(decl, "struct rec", "x[i].a + 2.0 * x[i].b"), records,
                     {"a": 1, "b": 2})


SHADOW = "typedef short int32_t;\nstruct rec { int32_t a; int32_t b; };"


def test_member_of_a_source_typedef_shadowing_int32_t_is_laid_out_as_the_typedef(device):
    opencl_c_only(device)
    records = _records(np.dtype([("a", "i4"), ("b", "i4")]))  # NumPy's int32: 8 bytes
    _refused_or_right(device, _use(SHADOW, "struct rec", "x[i].a + 2.0 * x[i].b"), records,
                      {"a": 1, "b": 2})


# Held (a guard): nested structs and OpenCL C vector members in the compiler's layout, the
# layout structs.c_dtype advises (300 generated structs agreed with __builtin_offsetof).
NESTED = """typedef struct { uchar t; float3 p; } inner;
typedef struct { char c; inner q[2]; double2 w; short s; } rec;"""


def test_nested_and_vector_members_in_c_dtypes_layout_run_right(device):
    opencl_c_only(device)
    from conveyor.pipeline.structs import c_dtype, struct_source

    source = _use(NESTED, "rec", "x[i].c + 2.0 * x[i].q[1].p.z + 3.0 * x[i].w.y + 4.0 * x[i].s")
    k = device.compile(source, "use")
    dtype = c_dtype(struct_source(k), "rec")
    assert dtype is not None and dtype.itemsize == 112  # the compiler's sizeof(rec) on PoCL
    records = np.zeros(N, dtype)
    records["c"] = np.arange(N) % 100
    records["q"]["p"][:, 1, 2] = np.arange(N) * 3
    records["w"][:, 1] = np.arange(N) * 5
    records["s"] = np.arange(N) * 7
    y = cv.stream(k, [records], [np.float64], device=device).outputs[0]
    np.testing.assert_array_equal(
        y, np.arange(N) % 100 + 2.0 * np.arange(N) * 3 + 3.0 * np.arange(N) * 5
        + 4.0 * np.arange(N) * 7)


# The size check (kernels/sizecheck.py) appends sizeof(rec) for a parameter of struct rec:
# "rec" alone is no type where only the tag is defined, the compiler cannot evaluate the
# check, and it is dropped. A struct whose members a predefined macro chooses (README: "an
# InputError naming the parameter, never a misread array") is then read from the other branch.
PREDEFINED = {"clang": "#ifdef __clang__", "c_version": "#if __OPENCL_C_VERSION__ >= 200",
              "x86_64": "#ifdef __x86_64__"}


def _chosen(guard: str) -> str:
    return f"struct rec {{\n{guard}\n  double a;\n#else\n  float a;\n#endif\n  float b;\n}};"


@pytest.mark.parametrize("macro", sorted(PREDEFINED))
def test_struct_tag_chosen_by_a_predefined_macro_is_refused_or_right(device, macro):
    opencl_c_only(device)
    records = _records(np.dtype([("a", "f4"), ("b", "f4")], align=True))
    _refused_or_right(device, _use(_chosen(PREDEFINED[macro]), "struct rec",
                                   "x[i].a + 2.0 * x[i].b"), records, {"a": 1, "b": 2})


def test_struct_tag_by_value_chosen_by_a_predefined_macro_is_refused_or_right(device):
    opencl_c_only(device)
    source = _chosen(PREDEFINED["clang"]) + """
__kernel void byval(__global const float *x, __global double *y, struct rec r, ulong offset,
                    ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + r.a + 2.0 * r.b;
}"""
    x = np.arange(N, dtype=np.float32)
    value = np.array((3.0, 5.0), np.dtype([("a", "f4"), ("b", "f4")], align=True))[()]
    try:
        k = device.compile(source, "byval")
        y = cv.stream(k, [x], [np.float64], args=(value,), device=device).outputs[0]
    except InputError:
        return
    np.testing.assert_array_equal(y, x + 13.0)


OUTPUT_SCRIPT = textwrap.dedent("""
    import numpy as np, conveyor as cv
    from conveyor.errors import InputError
    SOURCE = {source!r}
    dev = cv.device("opencl:0:0")
    x = np.arange(40, dtype=np.float32)
    dt = np.dtype([("a", "f4"), ("b", "f4")], align=True)
    try:
        r = cv.stream(dev.compile(SOURCE, "mk"), [x], [dt], device=dev).outputs[0]
    except InputError:
        print("refused")
    else:
        print("right" if np.array_equal(r["a"], x) and np.array_equal(r["b"], 2 * x)
              else "wrong")
""")


def test_struct_tag_output_chosen_by_a_predefined_macro_is_refused_or_right(device, tmp_path):
    opencl_c_only(device)
    source = _chosen(PREDEFINED["clang"]) + """
__kernel void mk(__global const float *x, __global struct rec *r, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { r[i].a = x[i]; r[i].b = 2 * x[i]; }
}"""
    script = tmp_path / "out.py"
    script.write_text(OUTPUT_SCRIPT.format(source=source))
    # its own process: the kernel writes past its buffer, which corrupts the host's heap
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1:] in (["refused"], ["right"]), done.stdout
