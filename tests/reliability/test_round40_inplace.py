"""Round forty, helper B: records used in place and file outputs of structs, a review of
round thirty-nine's ``stream._struct_align`` / ``_aligned_in_place``, ``records_dtype`` for
file outputs, ``files._access`` / ``_keep_owner`` and ``dask.arrays._as_declared``.

Method (scripts under /tmp/r40i, not kept): 15 struct shapes (``double4``, ``float8``,
``long16``, ``double16``, ``aligned(32/64/256)`` after the brace, a tag, a typedef of a
vector, a nested over-aligned struct, an array of ``double4``, a member with an attribute, an
attributed typedef, a macro for the member type) with whole-struct copies in the kernel, at
0/4/8/16/32/48/64/128 bytes past a multiple of 256, as input, output and both, under
zero_copy None/True/False (each kind in a child process); 15 placements of an ``aligned(32)``
attribute on a 32-byte struct of 4-byte members (before the brace, on a typedef name, on a
forward declaration, through macros, twice), streamed in place at 16 past 32; records of a
``double4`` struct through two devices, ``cv.iterate``, a resident table, a writable resident
table and a plain table in ``args=``; ``conveyor.dask.map_blocks(halo=1)`` and reductions of
records whose names are reordered, renamed, or nested; outputs over a file of another group,
written by ``nobody``.

Found (strict xfails):

- **A crash**: a struct whose alignment is given on a forward declaration
  (``struct __attribute__((aligned(32))) rec;`` then ``struct rec { float a[8]; };``) is laid
  out by clayout from its definition alone as 4-byte aligned (same 32-byte size, so the size
  check passes); ``_struct_align`` says 4, the records are used in place at 16 past a
  multiple of 32 and the kernel's aligned 32-byte loads kill the process (SIGSEGV).
- **Refused**: records whose fields carry the members' names, at the members' offsets, but
  listed in another order (``{'names': ['b', 'a'], 'offsets': [8, 0]}`` for ``struct { float
  a; double b; }``): ``structs._paired`` pairs fields with members by position, and says
  field 'b' "lies at byte 8, where C puts member 1 at byte 0" (C puts b at byte 8).
- **Refused**: ``zero_copy=True`` for records of an ``aligned(256)`` struct in
  ``cv.pinned.empty`` memory at 128 past a multiple of 256 (the device's own buffers are
  only 128-byte aligned, CL_DEVICE_MEM_BASE_ADDR_ALIGN; round thirty-eight capped the need at
  128, round thirty-nine's struct alignment is not capped).
- **A file's group widened**: an output over a user's own 0640 file of a group the user is not
  in is replaced by a file of the user's primary group, still 0640: that group gains the
  read access the old group had (np.save writes in place and keeps the group).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import first_device_only, opencl_c_kernels  # noqa: E402, F401 (autouse)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

SRC = str(Path(cv.__file__).resolve().parents[1])  # the conveyor under test, for children


def _child(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` run in a fresh interpreter (a fault kills it, not pytest)."""
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [SRC, os.environ.get("PYTHONPATH")])), **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=environ)


def _pocl_in_place(device: cv.Device) -> None:
    if device.backend != "opencl" or not device.host_unified:
        pytest.skip("arrays are used in place only on an OpenCL device in host memory")


# -- a crash ----------------------------------------------------------------------------------
def test_alignment_on_a_forward_declaration_is_not_a_crash(device):
    """``struct __attribute__((aligned(32))) rec;`` before ``struct rec { float a[8]; };``
    makes the struct 32-byte aligned (clang takes the attribute of any declaration of the
    tag); its size stays 32, so the size check passes. ``_struct_align`` reads the
    definition alone and says 4, so NumPy's records at 16 past a multiple of 32 are used in
    place, and the kernel's 32-byte aligned copy of a record faults. (The same attribute
    after ``struct`` in the definition leaves the struct unjudged, and is staged.)"""
    _pocl_in_place(device)
    done = _child(f"""
        import numpy as np, conveyor as cv
        dev = cv.device({device.spec!r})
        k = dev.compile('''struct __attribute__((aligned(32))) rec;
        struct rec {{ float a[8]; }};
        __kernel void cp(__global const struct rec *x, __global struct rec *o, ulong offset,
                         ulong n) {{
            ulong i = get_global_id(0);
            if (i < n) {{ struct rec r = x[i]; o[i] = r; }}
        }}''', "cp")
        dt = np.dtype([("a", "<f4", (8,))])
        n = 20000
        def at16():
            raw = np.zeros(n * 32 + 128, np.uint8)
            start = (-raw.ctypes.data) % 32 + 16
            return raw[start:start + n * 32].view(dt)
        a, o = at16(), at16()
        a["a"] = np.arange(8 * n, dtype=np.float32).reshape(n, 8)
        try:
            cv.stream(k, [a], [o], device=dev, block_bytes="64KiB")
            print("right" if np.array_equal(o["a"], a["a"]) else "wrong")
        except cv.InputError:
            print("refused")
    """)
    assert done.returncode == 0, f"rc {done.returncode}: {done.stderr[-800:]}"
    assert done.stdout.split()[-1:] in (["right"], ["refused"]), done.stdout


# -- refused ----------------------------------------------------------------------------------
REORDERED = """typedef struct { float a; double b; } rec;
__kernel void s(__global const rec *r, __global double *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = r[i].a + 10.0 * r[i].b;
}"""


def test_fields_named_as_the_members_in_another_order_are_taken(device):
    """A dtype made from a dict (``names``, ``offsets``) lists ``b`` before ``a``, each at the
    offset C gives it: the same bytes, named as the members. ``_paired`` checks the names
    are the members' "in any order", then zips fields with members by position, so field
    'b' is compared with member 'a' and refused: "field 'b' (float64) lies at byte 8, where
    C puts member 1 of struct 'rec' at byte 0"."""
    k = device.compile(REORDERED, "s")
    dt = np.dtype({"names": ["b", "a"], "formats": ["<f8", "<f4"], "offsets": [8, 0],
                   "itemsize": 16})
    r = np.zeros(50, dt)
    r["a"], r["b"] = np.arange(50), np.arange(50) * 3
    y = cv.stream(k, [r], [np.float64], device=device).outputs[0]
    np.testing.assert_array_equal(y, r["a"] + 10.0 * r["b"])


def test_fields_named_as_other_members_are_still_refused(device):
    """guard for the fix above: pairing by name must keep refusing a field named as another
    member than the one at its bytes (``b`` at ``a``'s offset), which would run with wrong
    values."""
    k = device.compile("""typedef struct { float a; int b; } rec;
    __kernel void s(__global const rec *r, __global float *y, ulong offset, ulong n) {
        ulong i = get_global_id(0);
        if (i < n) y[i] = r[i].a + 10.0f * r[i].b;
    }""", "s")
    r = np.zeros(5, {"names": ["b", "a"], "formats": ["<i4", "<f4"], "offsets": [0, 4],
                     "itemsize": 8})
    with pytest.raises(InputError, match=r"field 'b' \(int32\) lies at byte 0, where C puts "
                                         r"member 2 of struct 'rec' at byte 4"):
        cv.stream(k, [r], [np.float32], device=device)


ALIGNED256 = """typedef struct { float a; } __attribute__((aligned(256))) rec;
__kernel void twice(__global const rec *x, __global rec *o, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { rec r = x[i]; r.a *= 2.0f; o[i] = r; }
}"""


def test_zero_copy_takes_pinned_records_of_a_256_byte_aligned_struct(device):
    """README: records are used in place where their struct's alignment allows, and
    ``cv.pinned.empty`` gives 128-byte aligned arrays. The device's own buffers are only
    128-byte aligned (PoCL's CL_DEVICE_MEM_BASE_ADDR_ALIGN is 1024 bits), and round
    thirty-eight capped the need at ``_MOST_ALIGN`` (128); round thirty-nine's struct
    alignment is not capped, so ``zero_copy=True`` is refused for pinned records at 128 past
    a multiple of 256 (cv.pinned.empty gives such, depending on its pool), and a plain
    stream stages them, where round thirty-eight used them in place."""
    _pocl_in_place(device)
    k = device.compile(ALIGNED256, "twice")
    dt = np.dtype({"names": ["a"], "formats": ["<f4"], "offsets": [0], "itemsize": 256})
    n = 40

    def at128() -> np.ndarray:
        raw = cv.pinned.empty(n * 256 + 512, np.uint8, device=device)
        start = (-raw.ctypes.data) % 256 + 128
        return raw[start:start + n * 256].view(dt)

    a, o = at128(), at128()
    a["a"] = np.arange(n)
    try:
        cv.stream(k, [a], [o], device=device, zero_copy=True)
        refused = None
    except InputError as exc:  # as text: its traceback would hold the pinned arrays
        refused = str(exc)
    right = np.array_equal(o["a"], 2 * a["a"])
    del a, o  # the pinned blocks back to their pool before the fixture counts them
    assert refused is None, refused
    assert right


# -- files ------------------------------------------------------------------------------------
def test_a_replaced_file_gives_no_new_group_access(device):
    """``nobody`` owns ``o.npy`` (0640, group ``audio``, which ``nobody`` is not in: root
    gave it that group so that audio's members may read it). A stream writes it again:
    ``_keep_owner`` cannot give the new file group audio (EPERM, suppressed), so it keeps
    nobody's primary group, and ``target_mode`` gives it 0640: members of that group can now
    read what only audio's could (np.save writes in place and keeps group audio). Where the
    group cannot be kept, the group's bits should be no more than the others' (as vim does
    for its backups)."""
    if device.backend != "opencl" or not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("needs root to make the file and to become nobody")
    import grp

    try:
        audio = grp.getgrnam("audio").gr_gid
    except KeyError:
        pytest.skip("no group audio")
    top = Path(tempfile.mkdtemp(prefix="r40-inplace-", dir="/tmp"))  # nobody reaches it
    top.chmod(0o755)
    try:
        _replaced_by_nobody(device, top, audio)
    finally:
        shutil.rmtree(top)


def _replaced_by_nobody(device: cv.Device, top: Path, audio: int) -> None:
    folder = top / "d"
    folder.mkdir()
    folder.chmod(0o777)
    target = folder / "o.npy"
    np.save(target, np.zeros(10, np.float32))
    os.chown(target, 65534, audio)
    target.chmod(0o640)
    pocl = top / "pocl"
    pocl.mkdir()
    pocl.chmod(0o777)
    done = _child(f"""
        import os, numpy as np, conveyor as cv
        dev = cv.device({device.spec!r})
        k = dev.compile('''__kernel void c(__global const float *x, __global float *y,
                                            ulong offset, ulong n) {{
            ulong i = get_global_id(0);
            if (i < n) y[i] = 2 * x[i];
        }}''', "c")
        x = np.arange(10, dtype=np.float32)
        cv.stream(k, [x], [np.float32], device=dev)  # linked by root, before the switch
        os.setgroups([]); os.setgid(65534); os.setuid(65534)
        cv.stream(k, [x], [{str(target)!r}], device=dev)
        print("written", np.load({str(target)!r})[2])
    """, POCL_CACHE_DIR=str(pocl))
    assert done.returncode == 0, done.stderr[-800:]
    assert done.stdout.split()[-2:] == ["written", "4.0"], done.stdout
    st = os.stat(target)
    if st.st_gid != audio:  # the group could not be kept: it may not gain the old group's
        assert not st.st_mode & 0o070 & ~((st.st_mode & 0o007) << 3), oct(st.st_mode)


# -- held -------------------------------------------------------------------------------------
def test_dask_halo_blocks_of_reordered_records_keep_their_values(device):
    """guard: dask's overlap joins records with np.concatenate, which packs them (their
    names' order kept); ``_as_declared`` casts back with ``astype``, which matches fields by
    position: right while concatenate keeps the order, for renamed and nested records."""
    pytest.importorskip("dask.array")
    from conveyor.dask.arrays import _as_declared

    inner = np.dtype({"names": ["q", "p"], "formats": ["<f8", "<f4"], "offsets": [8, 0],
                      "itemsize": 16})
    for dt in (inner, np.dtype({"names": ["w"], "formats": [inner], "offsets": [0],
                                "itemsize": 16})):
        r = np.zeros(9, dt)
        flat = r["w"] if dt.names == ("w",) else r
        flat["q"], flat["p"] = np.arange(9) * 3, np.arange(9)
        joined = np.concatenate([r[:4], r[4:]])
        assert joined.dtype != dt  # re-laid out: the cast is needed
        (back,) = _as_declared([joined], [dt])
        assert back.dtype == dt
        got = back["w"] if dt.names == ("w",) else back
        np.testing.assert_array_equal(got["q"], flat["q"])
        np.testing.assert_array_equal(got["p"], flat["p"])
