"""Round thirty-eight: a review of today's struct layouts (``git diff 304b350 d1b9465``:
pipeline/clayout.py, pipeline/structs.py, kernels/sizecheck.py, Param.struct_name,
validate.py).

Method (seeded generators kept out of the repository, under /tmp/r38d): 500 valid OpenCL C
structs (nested three deep, arrays of structs and of vectors, every vector type and width 2,
3, 4, 8, 16, typedef chains to tags, one name as tag and typedef, ``aligned(N)`` after the
brace for N of 1 to 64, ``const``/``volatile`` members) and 90 hand-written ones (unions,
enums, anonymous structs, attributes before and after the tag, the brace and the declarator,
odd spellings of integer types and array sizes) were laid out by PoCL's compiler (a probe
kernel writing ``sizeof`` and ``__builtin_offsetof``) and compared with ``clayout``; the
generated ones were then streamed in the compiler's layout (``c_dtype``) and in NumPy's
packed and ``align=True`` layouts. Every struct clayout read agreed with the compiler, save
one spelling below (and ``long long``, 16 bytes on PoCL, which is known); every NumPy layout
that differed was refused; by value (``args=``), as a resident table and as an output the
same. Hostile text (200,000 repetitions of each pattern's prefix, 20,000-deep typedef
chains) stayed linear in ``_source``, ``_aligned``, ``structs._attributes`` and
``language``.

Found (each a strict xfail below): ``structs.spell`` writes a vector array member
(``int2 v[2]``) as raw bytes (``'V8'``), so the dtype a message advises is not the struct's
and its fields cannot be filled; records of a struct aligned to more than 16 bytes crash the
process on the zero-copy road when the array's address is 16 past a multiple of 32 (where
``np.zeros(n, dtype)`` often lands); an octal array size (``int b[010]``) is read as
decimal and the legal kernel is refused at its build; a nested struct's (or a vector's)
bytes given as a field of another kind are not judged: wrong values with no error; and (a
regression) any ``_Pragma`` operator, ``_Pragma("unroll")`` too, now leaves every struct of
its source unjudged: NumPy's packed records, refused before, run with wrong values.
"""

from __future__ import annotations

import re
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
from conveyor.pipeline.structs import c_dtype, c_layout, spell, struct_source  # noqa: E402

N = 40


def _use(decl: str, ctype: str, expr: str) -> str:
    """``decl`` then a kernel reading each record ``x[i]`` of ``ctype`` as ``expr``."""
    return decl + f"""
__kernel void use(__global const {ctype} *x, __global double *y, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) y[i] = {expr};
}}"""


def _run(device, source, records):
    k = device.compile(source, "use")
    return cv.stream(k, [records], [np.float64], device=device, zero_copy=False).outputs[0]


# ---------------------------------------------------------------------------------------
# Held (a guard): clayout against the compiler on the new features.

GUARDS = {
    "aligned_after_brace": ("struct rec { char a; short b; } __attribute__((aligned(32)));",
                            "struct rec", ["a", "b"], (32, [0, 2])),
    "typedef_chain_to_tag": ("struct s { char c; float3 p; };\ntypedef struct s t1;\n"
                             "typedef t1 t2;\ntypedef struct { short h; t2 q[2]; } rec;",
                             "rec", ["h", "q"], (80, [0, 16])),
    "tag_and_typedef_of_one_name": ("typedef struct rec { uchar u; long3 v; } rec;", "rec",
                                    ["u", "v"], (64, [0, 32])),
    "vector_arrays": ("typedef struct { char a; float3 b[2][3]; ushort16 c; } rec;", "rec",
                      ["a", "b", "c"], (160, [0, 16, 128])),
    "aligned_inner": ("struct inner { char c; double d; } __attribute__((aligned(32)));\n"
                      "typedef struct { char a; struct inner b[2]; } rec;", "rec",
                      ["a", "b"], (96, [0, 32])),
}


@pytest.mark.parametrize("case", sorted(GUARDS))
def test_clayout_agrees_with_the_compiler_on_nested_vector_and_aligned_structs(device, case):
    opencl_c_only(device)
    decl, ctype, members, known = GUARDS[case]
    values = [f"sizeof({ctype})"] + [f"__builtin_offsetof({ctype}, {m})" for m in members]
    cases = " ".join(f"case {j}: y[i] = {v}; break;" for j, v in enumerate(values))
    source = decl + f"""
__kernel void probe(__global const ulong *x, __global ulong *y, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) switch (x[i]) {{ {cases} }}
}}"""
    k = device.compile(source, "probe")
    y = cv.stream(k, [np.arange(len(values), dtype=np.uint64)], [np.uint64],
                  device=device).outputs[0]
    compiler = (int(y[0]), [int(v) for v in y[1:]])
    assert compiler == known  # PoCL's answer when this test was written
    layout = c_layout(struct_source(k), ctype)
    assert layout is not None and (layout[1], layout[2]) == compiler
    assert c_dtype(struct_source(k), ctype).itemsize == compiler[0]


# ---------------------------------------------------------------------------------------
# Found: structs.spell writes a member of a vector array type as raw bytes.

VECTOR_ARRAYS = {
    "int2_pair": ("typedef struct { char c; int2 v[2]; } rec;", "x[i].c + 2.0 * x[i].v[1].y",
                  lambda r: r["c"] + 2.0 * r["v"][:, 1, 1]),
    "float4_triple": ("typedef struct { float4 m[3]; short s; } rec;",
                      "x[i].m[2].w + 2.0 * x[i].s", lambda r: r["m"][:, 2, 3] + 2.0 * r["s"]),
    "nested_short2": ("typedef struct { uchar t; short2 p[2]; } inner;\n"
                      "typedef struct { inner q; double d; } rec;",
                      "x[i].q.p[1].x + 2.0 * x[i].d",
                      lambda r: r["q"]["p"][:, 1, 0] + 2.0 * r["d"]),
}


@pytest.mark.parametrize("case", sorted(VECTOR_ARRAYS))
def test_spelled_struct_dtype_evaluates_to_the_struct_dtype(device, case):
    opencl_c_only(device)
    decl, expr, _ = VECTOR_ARRAYS[case]
    k = device.compile(_use(decl, "rec", expr), "use")
    wanted = c_dtype(struct_source(k), "rec")
    assert wanted is not None
    assert eval(spell(wanted), {"np": np}) == wanted


def test_following_the_advised_dtype_for_a_vector_array_member_runs_right(device):
    opencl_c_only(device)
    decl, expr, expect = VECTOR_ARRAYS["int2_pair"]
    source = _use(decl, "rec", expr)
    packed = np.zeros(N, np.dtype([("c", "i1"), ("v", "i4", (2, 2))]))
    with pytest.raises(InputError) as refused:
        _run(device, source, packed)
    advised = re.search(r"own dtype, (np\.dtype\(.*\)) \(its members at", str(refused.value))
    assert advised is not None, str(refused.value)
    records = np.zeros(N, eval(advised.group(1), {"np": np}))
    records["c"] = np.arange(N) % 100
    records["v"][:, 1, 1] = np.arange(N) * 3  # int2 v[2]: v[1].y
    np.testing.assert_array_equal(_run(device, source, records), expect(records))


# ---------------------------------------------------------------------------------------
# Found: records of a struct aligned to 32 bytes, used in place (zero-copy, PoCL's default
# for C-contiguous arrays), at an address 16 past a multiple of 32: the kernel's aligned
# loads fault and the process dies (SIGSEGV). np.zeros(n, dtype) of these 32-byte records
# sat at such an address in 3 of 4 fresh processes tried (n = 100, 1000, 100000), and crashed.

MISALIGNED_SCRIPT = textwrap.dedent("""
    import numpy as np, conveyor as cv
    dev = cv.device("opencl:0:0")
    SRC = '''typedef struct { volatile uint8 a; } rec;
    __kernel void use(__global const rec *x, __global double *y, ulong offset, ulong n) {
        ulong i = get_global_id(0);
        if (i < n) { uint8 v = x[i].a;
            y[i] = v.s0 + 2.0 * v.s1 + 3.0 * v.s2 + 4.0 * v.s3 + 5.0 * v.s4 + 6.0 * v.s5
                   + 7.0 * v.s6 + 8.0 * v.s7; }
    }'''
    n = 1000
    raw = np.zeros(n * 32 + 256, np.uint8)
    start = (-raw.ctypes.data) % 128 + 16  # 16 past a multiple of 128
    records = raw[start:start + n * 32].view(np.dtype([("a", "u4", (8,))]))
    records["a"] = np.arange(8 * n).reshape(n, 8)
    y = cv.stream(dev.compile(SRC, "use"), [records], [np.float64], device=dev).outputs[0]
    a = records["a"].astype(np.float64)
    print("right" if np.array_equal(y, sum((j + 1) * a[:, j] for j in range(8))) else "wrong")
""")


def test_records_of_a_32_byte_aligned_struct_at_any_address_run_right(device, tmp_path):
    opencl_c_only(device)
    if device.spec != "opencl:0:0" or not device.host_unified:
        pytest.skip("the zero-copy road of the first PoCL device")
    script = tmp_path / "misaligned.py"
    script.write_text(MISALIGNED_SCRIPT)
    # its own process: the fault kills it
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"rc {done.returncode}: {done.stderr[-1500:]}"
    assert done.stdout.split()[-1:] == ["right"], done.stdout


# ---------------------------------------------------------------------------------------
# Found: an octal array size is read as decimal (clayout._laid_out: int("010") is 10).

def test_struct_with_an_octal_array_size_builds_and_runs(device):
    opencl_c_only(device)
    source = _use("typedef struct { char a; int b[010]; } rec;", "rec",
                  "x[i].a + 2.0 * x[i].b[7]")
    dtype = np.dtype({"names": ["a", "b"], "formats": ["i1", ("i4", (8,))],
                      "offsets": [0, 4], "itemsize": 36})  # the compiler's sizeof: 36
    records = np.zeros(N, dtype)
    records["a"] = np.arange(N)
    records["b"][:, 7] = np.arange(N) * 3
    np.testing.assert_array_equal(_run(device, source, records),
                                  records["a"] + 6.0 * np.arange(N))


# ---------------------------------------------------------------------------------------
# Found: a nested struct's bytes given as a plain numeric field (or a vector's as a record)
# are not compared with the members they stand for (structs._member_misfit skips a member
# of struct type whose field has no fields, and a field with fields for a member of none).

KINDS = {
    # struct { float a; int b; } q given as two float32: b read from a float's bits
    "struct_as_floats": (
        "typedef struct { float a; int b; } inner;\ntypedef struct { inner q; int c; } rec;",
        "x[i].q.a + x[i].q.b + x[i].c", np.dtype([("q", "f4", (2,)), ("c", "i4")]),
        lambda r: r["q"][:, 0] + r["q"][:, 1] + r["c"]),
    # int4 v given as a record of four float32
    "vector_as_float_record": (
        "typedef struct { int4 v; int c; } rec;", "x[i].v.x + x[i].v.w + x[i].c",
        np.dtype([("v", np.dtype([("x", "f4"), ("y", "f4"), ("z", "f4"), ("w", "f4")])),
                  ("c", "i4"), ("pad", "V12")]),
        lambda r: r["v"]["x"] + r["v"]["w"] + r["c"]),
}


def _filled(dtype: np.dtype) -> np.ndarray:
    records = np.zeros(N, dtype)
    if dtype["q" if "q" in dtype.names else "v"].names:
        records["v"]["x"] = np.arange(N)
        records["v"]["w"] = np.arange(N) * 2
    else:
        records["q"][:, 0] = np.arange(N)
        records["q"][:, 1] = np.arange(N) * 2
    records["c"] = 1
    return records


@pytest.mark.parametrize("case", sorted(KINDS))
def test_member_given_a_field_of_another_kind_is_refused_or_right(device, case):
    opencl_c_only(device)
    decl, expr, dtype, expect = KINDS[case]
    records = _filled(dtype)
    try:
        y = _run(device, _use(decl, "rec", expr), records)
    except InputError:
        return
    np.testing.assert_array_equal(y, expect(records))


def test_flattened_nested_record_of_other_kinds_is_refused_or_right(device):
    opencl_c_only(device)
    decl = "typedef struct { float a; int b; } inner;\ntypedef struct { inner q; int c; } rec;"
    records = np.zeros(N, np.dtype([("a", "i4"), ("b", "f4"), ("c", "i4")]))
    records["a"] = np.arange(N)
    records["b"] = np.arange(N) * 2
    records["c"] = 1
    try:
        y = _run(device, _use(decl, "rec", "x[i].q.a + x[i].q.b + x[i].c"), records)
    except InputError:
        return
    np.testing.assert_array_equal(y, records["a"] + records["b"] + records["c"])


# ---------------------------------------------------------------------------------------
# Found (a regression of d1b9465): structs.packs takes any _Pragma operator for a packing
# one (struct_source has blanked its text), so a source that unrolls a loop with
# _Pragma("unroll") leaves every struct unjudged: NumPy's packed records, refused at
# 304b350, run with wrong values (and the build's size check of its structs is dropped).

PRAGMAS = {"unroll": '_Pragma("unroll")', "clang_loop": '_Pragma("clang loop unroll(full)")'}


@pytest.mark.parametrize("pragma", sorted(PRAGMAS))
def test_a_pragma_that_packs_nothing_leaves_the_struct_judged(device, pragma):
    opencl_c_only(device)
    source = f"#define UNROLL {PRAGMAS[pragma]}\n" + """
typedef struct { char a; int b; } rec;
__kernel void use(__global const rec *x, __global double *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    double s = 0;
    UNROLL
    for (int j = 0; j < 2; j++) s += j;
    if (i < n) y[i] = x[i].a + 2.0 * x[i].b + s;
}"""
    # NumPy's packed fields padded to the struct's 8 bytes (no read past the records)
    records = np.zeros(N, np.dtype({"names": ["a", "b"], "formats": ["i1", "i4"],
                                    "offsets": [0, 1], "itemsize": 8}))
    records["a"] = np.arange(N)
    records["b"] = np.arange(N) * 3
    try:
        y = _run(device, source, records)
    except InputError:
        return
    np.testing.assert_array_equal(y, records["a"] + 2.0 * records["b"] + 1)
