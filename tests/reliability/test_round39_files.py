"""Round thirty-nine, helper B: a review of round thirty-eight's stream, file and Dask fixes
(304b350..339753e): records used in place (``stream._aligned_in_place``), file outputs of a
struct pointer (``stream._file_dtype``), Parquet and Arrow opened once and handed to PyArrow
as a Python file (``tables._open``), read-only output targets (``files.output_target``),
ENOSPC naming (``sinks.naming_errors``, ``RangeSink``), ``dask.files._source_ref``.

Method (scripts under /tmp/r39f, not kept): descriptors counted around 5 streams (each
twice) of ``cv.parquet``/``cv.arrow`` objects, refusals (non-numeric, missing, nulls, junk,
an IPC stream, each kind for the other) with ``gc`` off and the errors kept, and streams
failing mid-way; one source of each streamed from 4 threads at once (3 block sizes) and
given twice to one stream; a 1 GiB Parquet (128 row groups) and Arrow file reduced old
(304b350) against new: same time within noise (1.4-1.9 s), same peak RSS (~470 MB);
records of a ``double4`` struct in place at 0/8/16/32 bytes off, on the heap, in
``cv.pinned`` memory and in memmaps, under zero_copy None/True/False; 20 struct shapes for a
file output named by path (checked against the values the kernel wrote); a chain's file
output; a two-worker Dask file stream with two outputs (one of records) and a symlinked
input, three times; outputs over read-only, group-writable and symlinked files, run as
``nobody``.

Found (strict xfails):

- **A crash**: records given as unstructured bytes (``np.dtype('V32')``, which the struct
  check takes for a 32-byte struct) are used in place at any address: ``_aligned_in_place``
  looks at ``dtype.names`` only, and a ``double4`` struct's aligned loads at 16 bytes past
  a multiple of 32 kill the process (SIGSEGV).
- **Refused**: ``zero_copy=True`` with records whose address is a multiple of their struct's
  alignment but not of the largest power of two dividing their size (``struct { float
  a[8]; }``: 4-byte aligned, 32 bytes, at 16 past a multiple of 32, as NumPy places them).
- **Refused, with advice that does not fit**: a chain's file output, named by path, for a
  kernel link writing a struct: ``Chain.output_dtype`` does not lay the struct out as
  ``_file_dtype`` does for one kernel, so input 0's float64 is taken and the check advises
  "pass a structured array ... np.zeros(n, ...)", for a path.
- **Advice the command cannot follow**: ``conveyor map`` of a kernel writing a packed struct
  to ``-o o.npy`` is told to give ``cv.npy_out(path, dtype=np.dtype(...))``.
- **A read-only file replaced**: the read-only check asks ``os.access`` for the real uid; a
  process whose effective uid differs (root acting for a user, ``os.seteuid``) replaces a
  0444 file of that user that ``np.save`` refuses.
- **A shared file taken from its group**: an output over a group-writable file of another
  user (the user is in its group) is replaced by the user's own new file in the user's
  group: the group loses write access (``np.save`` writes in place and keeps it; a user may
  give a file any group they are in).
"""

from __future__ import annotations

import gc
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
from reliakit import child_env, first_device_only, opencl_c_kernels  # noqa: E402, F401 (autouse)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

SRC = str(Path(cv.__file__).resolve().parents[1])  # the conveyor under test, for children



def _child(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run in a fresh interpreter (a fault kills it, not pytest)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=child_env(SRC))


def _pocl_in_place(device: cv.Device) -> None:
    if device.backend != "opencl" or not device.host_unified:
        pytest.skip("arrays are used in place only on an OpenCL device in host memory")


# -- a crash ----------------------------------------------------------------------------------
def test_bytes_records_for_a_32_byte_aligned_struct_do_not_crash(device):
    """A user holding records as raw bytes (``np.fromfile(f, 'V32')``) passes them for a
    ``struct { double4 v; }`` pointer: the struct check takes bytes of the struct's size.
    Round thirty-eight stages records whose address misfits their size's alignment, but only
    arrays with field names: ``'V32'`` has none, so it is used in place at NumPy's 16-byte
    alignment and the kernel's aligned vector loads fault. Such bytes should be staged (or
    refused), never crash."""
    _pocl_in_place(device)
    done = _child(f"""
        import numpy as np, conveyor as cv
        dev = cv.device({device.spec!r})
        k = dev.compile('''typedef struct {{ double4 v; }} rec;
        __kernel void twice(__global const rec *x, __global rec *o, ulong offset, ulong n) {{
            ulong i = get_global_id(0);
            if (i < n) o[i].v = x[i].v * 2.0;
        }}''', "twice")
        def at16(nbytes):  # 16 bytes past a multiple of 32, as np.zeros may place it
            raw = np.zeros(nbytes + 128, np.uint8)
            start = (-raw.ctypes.data) % 32 + 16
            return raw[start:start + nbytes]
        n = 1000
        a, o = at16(n * 32), at16(n * 32)
        a.view(np.float64)[:] = np.arange(4 * n)
        try:
            cv.stream(k, [a.view("V32")], [o.view("V32")], device=dev)
            print("right" if np.array_equal(o.view(np.float64), 2.0 * np.arange(4 * n))
                  else "wrong")
        except cv.InputError:
            print("refused")
    """)
    assert done.returncode == 0, f"rc {done.returncode}: {done.stderr[-800:]}"
    assert done.stdout.split()[-1:] in (["right"], ["refused"]), done.stdout


# -- refused ----------------------------------------------------------------------------------
FLOATS8 = """typedef struct { float a[8]; } rec;
__kernel void twice(__global const rec *x, __global rec *o, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) for (int j = 0; j < 8; j++) o[i].a[j] = 2.0f * x[i].a[j];
}"""


def test_zero_copy_takes_records_at_their_structs_own_alignment(device):
    """``struct { float a[8]; }`` is 32 bytes, 4-byte aligned. NumPy places such records at
    16 past a multiple of 32 (np.zeros does, often): a legal buffer for the kernel, which
    assumes 4 bytes. ``_aligned_in_place`` asks 32 (the largest power of two dividing the
    size), so ``zero_copy=True`` is refused, and a plain stream is staged on PoCL, where it
    was used in place before (a copy per block more). The struct's own alignment, which
    conveyor lays out (clayout), is what the address must meet."""
    _pocl_in_place(device)
    k = device.compile(FLOATS8, "twice")
    dtype = np.dtype([("a", "<f4", (8,))])
    n = 100

    def at16() -> np.ndarray:
        raw = np.zeros(n * 32 + 128, np.uint8)
        start = (-raw.ctypes.data) % 32 + 16
        return raw[start:start + n * 32].view(dtype)

    a, o = at16(), at16()
    a["a"] = np.arange(8 * n, dtype=np.float32).reshape(n, 8)
    cv.stream(k, [a], [o], device=device, zero_copy=True)
    np.testing.assert_array_equal(o["a"], 2 * a["a"])


CHAIN = """typedef struct { char c; double v; } rec;
__kernel void pre(__global const double *x, __global double *t, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) t[i] = x[i] + 1.0;
}
__kernel void make(__global const double *t, __global rec *o, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { o[i].c = 5; o[i].v = 3.0 * t[i]; }
}"""


def test_a_chains_struct_file_output_by_path_takes_the_structs_records(device, tmp_path):
    """Round thirty-eight made a file output of a struct pointer, named by path, take the
    struct's records as conveyor lays them out (``stream._file_dtype``); the same kernel as a
    chain's last link is refused: ``Chain.output_dtype`` returns the parameter's dtype,
    None for a struct, so the file takes input 0's float64 and the struct check says
    "pass a structured array ... np.zeros(n, ...)", which a path cannot be."""
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels")
    pre, make = device.compile(CHAIN, "pre"), device.compile(CHAIN, "make")
    x = np.arange(100, dtype=np.float64)
    out = tmp_path / "o.npy"
    cv.stream(make, [x], [str(tmp_path / "one.npy")], device=device)  # guard: one kernel
    one = np.load(tmp_path / "one.npy")
    cv.stream(cv.chain(pre, make, temps=[np.float64]), [x], [str(out)], device=device)
    got = np.load(out)
    assert got.dtype == one.dtype
    np.testing.assert_array_equal(got["v"], 3.0 * (x + 1.0))


PACKED = """typedef struct __attribute__((packed)) { char c; double v; } rec;
__kernel void make(__global const double *x, __global rec *o, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { o[i].c = 5; o[i].v = 3.0 * x[i]; }
}"""


def test_the_command_is_not_advised_a_library_call_for_packed_records(device, tmp_path,
                                                                        capsys):
    """``conveyor map k.cl -o o.npy`` where ``k.cl`` writes a packed struct: the file's
    records cannot be laid out (``packs``), and ``stream._file_dtype`` says "give their
    dtype, cv.npy_out(path, dtype=np.dtype(...))": the command line has no option for an
    output's dtype (round thirty-eight made the laid-out case work for that reason). The
    command's user should be told something they can do (the command cannot write these
    records: stream them from Python with cv.npy_out), not a call they cannot make."""
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels")
    from conveyor.cli import main

    np.save(tmp_path / "x.npy", np.arange(10.0))
    (tmp_path / "k.cl").write_text(PACKED)
    try:
        code = main(["map", str(tmp_path / "k.cl"), "--kernel", "make", "-i",
                     str(tmp_path / "x.npy"), "-o", str(tmp_path / "o.npy"), "--device",
                     device.spec, "-q"])
    except SystemExit as exc:
        code = exc.code
    said = capsys.readouterr().err
    assert code != 0 and "records" in said, said
    assert "dtype=np.dtype" not in said or "Python" in said, said


# -- permissions ------------------------------------------------------------------------------
def test_an_output_over_a_group_writable_file_keeps_its_group(device):
    """A shared result: ``root:1234``, mode 0664, in a folder the group may write. A member
    of group 1234 (not root) streams over it: ``os.access`` says yes (round thirty-eight's
    read-only check passes, rightly). The new file, renamed over it, is the member's, in
    the member's own group, so the other members can no longer write it. ``np.save`` writes
    in place and keeps ``root:1234``; a non-root user may still give their new file any
    group they belong to (``fchown(fd, -1, gid)``): ``files._keep_owner`` does so for root
    only."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the child as another user")
    base = Path(tempfile.mkdtemp(prefix="r39_g_", dir="/tmp"))
    try:
        os.chmod(base, 0o777)  # not sticky: the rename is allowed
        shared = base / "shared.npy"
        np.save(shared, np.zeros(4, np.float32))
        os.chown(shared, 0, 1234)
        os.chmod(shared, 0o664)
        done = _child(f"""
            import os, numpy as np, conveyor as cv
            import conveyor.pipeline.stream  # every import made as root
            dev = cv.device({device.spec!r})
            def copy(x, y, *, queue, offset, n):
                return x
            os.setgroups([1234])
            os.setresgid(65534, 65534, 0)
            os.setresuid(65534, 65534, 0)
            cv.stream(copy, [np.full(4, 7, np.float32)], [{str(shared)!r}], device=dev)
            print("written")
        """)
        assert done.returncode == 0 and "written" in done.stdout, done.stderr[-1500:]
        np.testing.assert_array_equal(np.load(shared), np.full(4, 7, np.float32))
        st = os.stat(shared)
        assert (st.st_gid, st.st_mode & 0o777) == (1234, 0o664)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_read_only_check_is_made_for_the_effective_user(device):
    """A service running as root that acts for a user (``os.seteuid(user)``, the real uid
    left root) writes that user's output over a file the user made read-only: ``np.save``
    (as the effective user) refuses, conveyor's check (``os.access``, which asks for the
    real uid, root) passes and the rename replaces the file. The reverse (a set-uid
    program) refuses a file its effective user may write. ``os.access(...,
    effective_ids=True)`` asks for the user the writes are made as."""
    if os.geteuid() != 0:
        pytest.skip("needs root to change the effective user")
    base = Path(tempfile.mkdtemp(prefix="r39_e_", dir="/tmp"))
    try:
        os.chmod(base, 0o777)
        kept = base / "kept.npy"
        done = _child(f"""
            import os, numpy as np, conveyor as cv
            import conveyor.pipeline.stream  # every import made as root
            dev = cv.device({device.spec!r})
            def copy(x, y, *, queue, offset, n):
                return x
            os.setegid(65534)
            os.seteuid(65534)  # the real ids stay root's
            path = {str(kept)!r}
            np.save(path, np.zeros(4, np.float32))
            os.chmod(path, 0o444)
            try:
                np.save(path, np.ones(4, np.float32))
            except PermissionError:
                print("np.save refused")
            try:
                cv.stream(copy, [np.full(4, 7, np.float32)], [path], device=dev)
                print("conveyor replaced it")
            except cv.InputError as exc:
                print("InputError", exc)
        """)
        assert done.returncode == 0, done.stderr[-1500:]
        assert "np.save refused" in done.stdout
        assert "InputError" in done.stdout and "read-only" in done.stdout, done.stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- guards -----------------------------------------------------------------------------------
def _copy(x, y, *, queue, offset, n):
    return x


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_guard_table_inputs_leave_no_descriptor_open(device, tmp_path, kind):
    """guard: since round thirty-eight a table input holds a Python file of its own
    (``tables._open``): streamed twice, refused at every check, or failing mid-stream, no
    descriptor outlives the source (with the refusals kept, and before any gc; an error
    raised mid-stream holds its source, and the file, in its traceback, as before)."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    n = 5000
    table = pa.table({"x": np.arange(n, dtype=np.float32),
                      "s": pa.array([str(i) for i in range(n)]),
                      "z": pa.array([1.0, None] * (n // 2), pa.float32())})
    path = tmp_path / f"t.{kind}"
    if kind == "parquet":
        pq.write_table(table, path, row_group_size=1000)
    else:
        feather.write_feather(table, path, chunksize=1000)
    (tmp_path / "junk").write_bytes(b"PAR1" + b"\0" * 64 + b"ARROW1")
    make = getattr(cv, kind)

    def boom(x, y, *, queue, offset, n):
        if offset:
            raise RuntimeError("the compute's fault")
        return x

    gc.disable()
    try:
        before = len(os.listdir("/proc/self/fd"))
        kept = []
        for _ in range(3):
            source = make(path, "x")
            for _ in range(2):
                got = cv.stream(_copy, [source], [np.float32], device=device,
                                block_bytes=4096).outputs[0]
                np.testing.assert_array_equal(got, np.arange(n, dtype=np.float32))
            del source
            for columns in ("s", "nope", "z", ["x", "s"], None):
                with pytest.raises(InputError) as caught:
                    make(path, columns)
                kept.append(caught.value)
            with pytest.raises(InputError) as caught:
                make(tmp_path / "junk", "x")
            kept.append(caught.value)
            with pytest.raises(RuntimeError):  # its traceback holds the source: not kept
                cv.stream(boom, [make(path, "x")], [np.float32], device=device,
                          block_bytes=4096)
        assert len(os.listdir("/proc/self/fd")) == before
    finally:
        gc.enable()
