"""Round forty-one: a review of session 21's last fixes (``git diff dfed835 9f8970e -- src/``
and ``git show 71a4623 -- src/``): ``recordvalues.check_nesting`` / ``c_values`` (cached per
struct) / ``value_misfit``, ``stream._aligned_in_place`` / ``_struct_align``, the
forward-declaration attribute rule of ``clayout._source``, ``structs._paired`` and
``files._keep_owner``.

Probes under /tmp/r41 (not part of the suite): ``alignprobe.py`` (14 ways to give a struct
its alignment, the compiler's ``sizeof``/``__alignof__`` against clayout's), ``crash.py``
(records at 16 past 32 in place), ``packed.py``, ``mem.py``/``memcal.py`` (memory the value
cache keeps, this tree against dfed835), ``roads.py`` (records of 2**17 to 2**23 fields
through every road: an input, an output dtype, a chain, ``cv.resident``, a plain table in
``args=``, a callable), ``wide.py``/``hash.py`` (wide nested structs, this tree against
dfed835), ``vec.py``.

Found (strict xfails):

- **A crash**: ``__attribute`` (GCC's and clang's other spelling of ``__attribute__``) is not
  read: ``struct rec { float a[8]; } __attribute((aligned(32)));`` is laid out 4-byte
  aligned, so NumPy's records at 16 past 32 are used in place and the kernel faults
  (SIGSEGV), after the brace and on a forward declaration alike.
- **Refused**: ``__attribute((packed))`` is not taken as packing: the legal packed kernel is
  refused at its build, advising ``__attribute__((packed))``, which it has.
- **Memory kept**: ``c_values``' cache keeps each struct's map of values (about 13 MiB for a
  struct of 64,513 values, one per distinct struct, 16 kept) after its streams end.
- **Refused**: records of the struct's own dtype (which ``records_dtype`` gives) are refused
  when the struct names more than 65,536 members counted where they stand, saying no C struct
  a kernel reads has so many.
- **A dtype printed**: records of more than 65,536 fields given for a ``float*`` resident
  table are named in full in the message (130 MB, 22 s, for 2**23 fields; with 2**23 fields
  an ``args=`` plain table and a callable ran past 40 s, in NumPy's ``__array_interface__``
  descr of every field), which the field-count check was to prevent for every buffer given
  records.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import child_env, first_device_only, opencl_c_kernels  # noqa: E402, F401 (autouse)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402
from conveyor.pipeline import structs  # noqa: E402

SRC = str(Path(cv.__file__).resolve().parents[1])  # the conveyor under test, for children


def _pocl_in_place(device: cv.Device) -> None:
    if device.backend != "opencl" or not device.host_unified:
        pytest.skip("arrays are used in place only on an OpenCL device in host memory")


# -- a crash ----------------------------------------------------------------------------------
def test_attribute_spelled_without_underscores_is_not_a_crash(device):
    """``__attribute`` is GCC's and clang's other keyword for ``__attribute__``: PoCL makes
    ``struct rec { float a[8]; } __attribute((aligned(32)));`` 32 bytes aligned (its kernel's
    ``__alignof__``), and on a forward declaration too. ``clayout._ATTRIBUTE``, ``_aligned``
    and round forty's forward-declaration rule look for ``__attribute__`` only, so the
    struct is read as 4-byte aligned (its size, 32, passes the size check), ``_struct_align``
    says 4 and records at 16 past a multiple of 32 are used in place: the kernel's aligned
    copy of a record kills the process."""
    _pocl_in_place(device)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import numpy as np, conveyor as cv
        dev = cv.device({device.spec!r})
        dt = np.dtype([("a", "<f4", (8,))])
        n = 20000
        def at16():
            raw = np.zeros(n * 32 + 128, np.uint8)
            start = (-raw.ctypes.data) % 32 + 16
            return raw[start:start + n * 32].view(dt)
        for defs in ("struct rec {{ float a[8]; }} __attribute((aligned(32)));",
                     "struct __attribute((aligned(32))) rec; struct rec {{ float a[8]; }};"):
            k = dev.compile(defs + '''
            __kernel void cp(__global const struct rec *x, __global struct rec *o,
                             ulong offset, ulong n) {{
                ulong i = get_global_id(0);
                if (i < n) {{ struct rec r = x[i]; o[i] = r; }}
            }}''', "cp")
            a, o = at16(), at16()
            a["a"] = np.arange(8 * n, dtype=np.float32).reshape(n, 8)
            try:
                cv.stream(k, [a], [o], device=dev, block_bytes="64KiB")
                print("right" if np.array_equal(o["a"], a["a"]) else "wrong")
            except cv.InputError:
                print("refused")
    """)], capture_output=True, text=True, timeout=120, env=child_env(SRC))
    assert done.returncode == 0, f"rc {done.returncode}: {done.stderr[-800:]}"
    assert set(done.stdout.split()) <= {"right", "refused"} and len(done.stdout.split()) == 2, \
        done.stdout


# -- refused ----------------------------------------------------------------------------------
def test_packed_attribute_spelled_without_underscores_is_taken(device):
    """``struct rec { char c; float f; } __attribute((packed));`` is 5 bytes to the compiler.
    ``packs`` misses the attribute, clayout lays the struct out in 8 bytes, and the size
    check refuses the build: "conveyor laid out struct rec ... in 8 bytes ... or declare the
    struct __attribute__((packed))" (it is packed). NumPy's packed records are right."""
    source = """struct rec { char c; float f; } __attribute((packed));
    __kernel void g(__global const struct rec *r, __global float *y, ulong offset, ulong n) {
        ulong i = get_global_id(0);
        if (i < n) y[i] = r[i].f + r[i].c;
    }"""
    r = np.zeros(16, [("c", "i1"), ("f", "<f4")])
    r["f"], r["c"] = np.arange(16), 1
    k = device.compile(source, "g")
    y = cv.stream(k, [r], [np.float32], device=device).outputs[0]
    np.testing.assert_array_equal(y, r["f"] + 1)


def _wide_struct(members: int) -> str:
    """A struct of 65 x 64 x ``members`` float members (nested structs, no arrays)."""
    inner = " ".join(f"float a{i};" for i in range(members))
    middle = " ".join(f"s0 m{i};" for i in range(64))
    outer = " ".join(f"s1 m{i};" for i in range(65))
    return (f"typedef struct {{ {inner} }} s0;\ntypedef struct {{ {middle} }} s1;\n"
            f"typedef struct {{ {outer} }} rec;\n")



def test_records_of_a_struct_of_many_members_are_advised_what_runs():
    """A struct of 65 structs of 64 structs of 16 floats (66,560 members where they stand)
    builds and runs; ``c_dtype`` gives its records (no field of an array of records counts
    more than once, so this takes members named one by one). Round forty's field count
    refused them as "more than 65536 fields ... which no C struct a kernel reads has",
    which is false. The count bounds what conveyor judges and prints: the message now says
    so, and its advice (the records as their bytes) is taken."""
    source = _wide_struct(16) + "__kernel void k(__global const rec *r) {}"
    wanted = structs.c_dtype(source, "rec")
    assert wanted is not None and wanted.itemsize == 65 * 64 * 16 * 4
    with pytest.raises(InputError, match=r"more than conveyor judges.*np\.void") as caught:
        structs.check_struct("kernel parameter 'r'", wanted, source, "rec")
    assert "no C struct" not in str(caught.value)
    structs.check_struct("kernel parameter 'r'", np.dtype((np.void, wanted.itemsize)),
                         source, "rec")

def test_records_of_a_struct_just_under_the_field_count_are_taken():
    """guard: 65 x 64 x 15 = 62,400 members, under the count, are taken."""
    source = _wide_struct(15) + "__kernel void k(__global const rec *r) {}"
    wanted = structs.c_dtype(source, "rec")
    assert wanted is not None
    structs.check_struct("kernel parameter 'r'", wanted, source, "rec")


# -- memory kept ------------------------------------------------------------------------------
def _big_struct(tag: str) -> str:
    return f"""typedef struct {{ float sample[16]; }} t0;
typedef struct {{ t0 channel[64]; }} t1;
typedef struct {{ t1 frame[63]; int {tag}; }} rec;
__kernel void g(__global const rec *r, __global float *y, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) y[i] = r[i].frame[62].channel[63].sample[15] + r[i].{tag};
}}"""


def test_a_stream_of_a_large_struct_keeps_no_memory_after_it_ends(device):
    """Records of a struct of 64,513 values (63 frames of 64 channels of 16 floats, a tag)
    are judged value by value. ``c_values`` now caches each struct's map of values by byte,
    with a path string per value (``frame[12].channel[3].sample[7]``), 16 structs at a time:
    after a stream of a second such struct ends, 12.8 MiB stay allocated (dfed835: 0.001
    MiB); 16 distinct structs keep about 200 MiB, and longer member names more (two structs
    of 1,000-character names: 395 MiB). The map could be kept only while a stream runs, or
    hold no paths (build a path only for the message that names it)."""
    first, second = (device.compile(_big_struct(tag), "g") for tag in ("tag", "label"))
    recs = [np.zeros(2, structs.records_dtype(k, k.params[0])) for k in (first, second)]
    cv.stream(first, [recs[0]], [np.float32], device=device)  # every other cache warmed
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        out = cv.stream(second, [recs[1]], [np.float32], device=device).outputs[0]
        assert out.shape == (2,)
        del out
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 2**20, f"{kept / 2**20:.1f} MiB kept after the stream ended"


# -- a dtype printed --------------------------------------------------------------------------
def _many_fields() -> np.dtype:
    """Records of 257 x 256 = 65,792 fields (one 256-field dtype shared by 257 fields)."""
    inner = np.dtype([(f"f{i}", "u1") for i in range(256)])
    return np.dtype([(f"r{i}", inner) for i in range(257)])


def test_a_resident_table_of_too_many_fields_is_refused_without_printing_them(device):
    """Round forty's final fix: "every buffer given records checks their nesting and field
    count before any message prints the dtype". A resident table for a ``float*`` parameter
    is refused by ``resident._check`` with "takes float32 elements but the array holds
    <the dtype>" (and ``resident._table``'s message for an empty one names it too): every
    field printed. The message should stay short, as for an input."""
    k = device.compile("""__kernel void f(__global const float *x, __global float *y,
        __global const float *t, ulong offset, ulong n) {
        ulong i = get_global_id(0);
        if (i < n) y[i] = x[i] + t[0];
    }""", "f")
    x = np.zeros(8, np.float32)
    with pytest.raises(InputError) as caught:
        cv.stream(k, [x], [np.float32], args=[cv.resident(np.zeros(1, _many_fields()))],
                  device=device)
    assert len(str(caught.value)) < 2000, f"{len(str(caught.value))} characters"


def test_an_input_of_too_many_fields_is_refused_without_printing_them(device):
    """guard: the input road (``validate.check_buffer``) refuses before any print."""
    k = device.compile("""__kernel void g(__global const float *x, __global float *y,
        ulong offset, ulong n) {
        ulong i = get_global_id(0);
        if (i < n) y[i] = x[i];
    }""", "g")
    with pytest.raises(InputError, match="more than 65536 fields") as caught:
        cv.stream(k, [np.zeros(1, _many_fields())], [np.float32], device=device)
    assert len(str(caught.value)) < 2000


# -- held -------------------------------------------------------------------------------------
def test_the_value_cache_follows_the_struct_a_kernel_is_built_with(device):
    """guard for ``c_values``' cache: one source under ``-DT=float`` and ``-DT=int`` lays
    ``rec`` out with the same offsets and other types; records of floats are taken by the
    first build and refused by the second, in either order (the cache's key is the whole
    laid-out struct)."""
    source = """typedef struct { float w; T v[2]; } rec;
    __kernel void g(__global const rec *r, __global float *y, ulong offset, ulong n) {
        ulong i = get_global_id(0);
        if (i < n) y[i] = r[i].w + (float)r[i].v[1];
    }"""
    r = np.zeros(8, [("w", "<f4"), ("v", "<f4", (2,))])
    r["v"][:, 1] = 3
    as_float, as_int = (device.compile(source, "g", options=[f"-DT={t}"])
                        for t in ("float", "int"))
    for kernel in (as_float, as_int, as_float):
        if kernel is as_int:
            with pytest.raises(InputError, match="'v"):
                cv.stream(kernel, [r], [np.float32], device=device)
        else:
            y = cv.stream(kernel, [r], [np.float32], device=device).outputs[0]
            np.testing.assert_array_equal(y, 3)
