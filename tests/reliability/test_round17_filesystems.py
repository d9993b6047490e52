"""Round seventeen, helper D: files and file systems that misbehave, through the library
(``cv.stream`` with file inputs and outputs, ``cv.npy``/``cv.raw``/``cv.npy_out``, ``trace=``)
and the command line (``conveyor map``): a full disk (a small tmpfs, mounted where the test
may), other users' files in sticky folders, ``/proc/self/fd/N`` names, files replaced or cut
under the stream, inputs that are no regular files, hostile ``.npy`` headers, field names
and dtypes that only some ``.npy`` versions or paths carry.

Found (strict xfails, each asserting the right behaviour):

- An output (or ``trace=``) named ``/proc/self/fd/N`` for an open file that has no name any
  more (``tempfile.TemporaryFile``, a deleted file, a memfd) is written to a NEW file named
  after the link's text, ``"/tmp/#123 (deleted)"`` (a memfd: ``"/memfd:NAME (deleted)"``, in
  ``/``); the file behind the descriptor stays empty and the report says it was written.
- A relative ``cv.npy``/``cv.raw`` input is opened again by its relative name when a stream
  starts: after ``os.chdir`` another folder's file of the same size and header is read
  (silently), and a missing one is a raw FileNotFoundError mid-stream.
- A version 3.0 ``.npy`` (NumPy's UTF-8 header, written for non-Latin-1 field names) is read
  with the 2.0 reader (Latin-1): field ``'α'`` becomes ``'Î±'``, and an output copied from it
  is written under that name. An output whose dtype has such a name fails with a raw
  UnicodeEncodeError (only 1.0 and 2.0 headers are tried).
- A ``.npy`` header whose dict text is cut short is a raw ``tokenize.TokenError`` (the
  command: a traceback, exit 1).
- ``datetime64``/``timedelta64`` ``.npy`` inputs and outputs fail mid-stream with NumPy's
  raw ``ValueError: cannot include dtype 'M' in a buffer`` (the same arrays in memory stream).
- A full disk (ENOSPC) while an output is written is a bare ``OSError: [Errno 28] No space
  left on device`` that names no file (at the ``.npy`` header: not even a note); the command
  says "No space left on device: free some space" without naming the output. (The output is
  left out and the old file kept: guarded here.)
- An output replacing another user's file in a sticky folder (``/tmp``) fails only after the
  whole stream, at the rename, with a raw PermissionError naming the temporary ``.part``
  file (the command: exit 1, "check the path and its permissions").
- ``cv.raw`` of a file whose size reads 0 but which holds bytes (``/proc``, some FUSE and
  sysfs files) is taken as 0 rows: the stream runs over nothing, with no error.
- A memmap input whose file was cut after it was mapped kills the process with SIGBUS in a
  staging thread (conveyor maps the pages; the file's size is a cheap check first).
- ``conveyor map --trace T`` whose trace cannot be written (a full disk) exits 0 with a
  warning, where a ``--plot`` that fails after the outputs exits 1 ("wrote y.npy, but then").
- Root replacing a user's output (``--force``, or any library stream) gives the user's file
  to root: the mode is kept, the owner and group are not.

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    kernel,  # noqa: E402
)

import conveyor as cv  # noqa: E402
from conveyor.cli import main  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

SRC = str(Path(cv.__file__).resolve().parents[1])  # the conveyor under test, for children

TWICE = """__kernel void twice(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}
"""


def _scale(device):
    """y = x * k (float32), streamkit's kernel: built once per device for every test."""
    return kernel(device, "scale")


def _parts(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith((".part", ".new")))


def _returns_x(x, y, *, queue, offset, n):
    """A callable that copies its input to its output (no kernel build)."""
    return x


def _child_env() -> dict[str, str]:
    path = os.pathsep.join([SRC, str(Path(__file__).resolve().parents[1] / "pipeline"),
                            os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path.rstrip(os.pathsep))


def _run_child(code: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=_child_env(),
                          capture_output=True, text=True, timeout=timeout)


def _cli(device, folder: Path, *args: str) -> int:
    kfile = folder / "twice.cl"
    if not kfile.exists():
        kfile.write_text(TWICE)
    return main(["map", str(kfile), "--kernel", "twice", "--device", device.spec, "-q",
                 *args])


# -- a full disk (ENOSPC) --------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs at ``tmp_path / "disk"`` (root with CAP_SYS_ADMIN only), unmounted
    after the test."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)],
                          capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _fill(disk: Path) -> None:
    """Fill ``disk`` to the last byte."""
    with open(disk / "filler", "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
            f.flush()


def test_guard_a_full_disk_mid_stream_keeps_the_old_output_and_leaves_no_part(device,
                                                                             small_disk):
    """guard: rows that no longer fit (ENOSPC at the third block of 800 KB into 256 KiB)
    fail the stream; the existing output keeps its old contents, no part file is left."""
    x = np.arange(200_000, dtype=np.float32)
    old = np.zeros(10, np.float32)
    np.save(small_disk / "y.npy", old)
    with pytest.raises(OSError) as caught:
        cv.stream(_scale(device), [x], [small_disk / "y.npy"], device=device, args=(2.0,),
                  block_bytes=64 * 1024)
    assert caught.value.errno == 28  # ENOSPC
    assert os.listdir(small_disk) == ["y.npy"]
    np.testing.assert_array_equal(np.load(small_disk / "y.npy"), old)


@pytest.mark.parametrize("when", ["rows mid-stream", "npy header"])
def test_a_full_disk_error_names_the_output(device, small_disk, when):
    """A full disk is the environment (an OSError, as EFBIG is), but like EFBIG it must say
    which output did not fit: with several outputs and a trace on several file systems,
    "[Errno 28] No space left on device" alone does not say where to free space."""
    if when == "npy header":
        _fill(small_disk)  # not even the header fits: raised from FileSink.open, no note
        x = np.arange(1000, dtype=np.float32)
    else:
        x = np.arange(200_000, dtype=np.float32)
    with pytest.raises(OSError) as caught:
        cv.stream(_scale(device), [x], [small_disk / "y.npy"], device=device, args=(2.0,),
                  block_bytes=64 * 1024)
    said = " ".join([str(caught.value), *getattr(caught.value, "__notes__", [])])
    assert "y.npy" in said, said
    assert [n for n in os.listdir(small_disk) if n != "filler"] == []


def test_the_command_on_a_full_disk_names_the_output(device, small_disk, tmp_path, capsys):
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels, PyOpenCL arrays in callables")
    np.save(tmp_path / "x.npy", np.arange(200_000, dtype=np.float32))
    code = _cli(device, tmp_path, "-i", str(tmp_path / "x.npy"), "-o",
                str(small_disk / "y.npy"), "--block-bytes", "64KiB")
    err = capsys.readouterr().err
    assert code == 1
    assert os.listdir(small_disk) == []
    assert "y.npy" in err, err  # "conveyor map: [Errno 28] No space left on device: free..."


def test_the_command_exits_1_when_the_trace_it_was_asked_for_is_not_written(device,
                                                                            small_disk,
                                                                            tmp_path, capsys):
    """The library only warns (its report is the result); the command was asked for the
    file. A ``--plot`` that fails after the outputs are written exits 1 with "wrote y.npy,
    but then: ..."; a ``--trace`` onto a full disk exits 0 with a warning line, and a
    script that checks the exit code goes on without its trace."""
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels, PyOpenCL arrays in callables")
    np.save(tmp_path / "x.npy", np.arange(1000, dtype=np.float32))
    _fill(small_disk)
    code = _cli(device, tmp_path, "-i", str(tmp_path / "x.npy"), "-o",
                str(tmp_path / "y.npy"), "--trace", str(small_disk / "t.json"))
    err = capsys.readouterr().err
    assert (tmp_path / "y.npy").exists()
    assert "t.json" in err
    assert code == 1, err


# -- the file-size limit ---------------------------------------------------------------------
def test_guard_a_trace_over_the_file_size_limit_only_warns(device, tmp_path):
    """guard: a trace past ``ulimit -f`` (EFBIG: Python ignores SIGXFSZ) is not written, the
    stream warns and returns its report, and no part of the trace is left."""
    import resource

    x = np.arange(1000, dtype=np.float32)
    y = np.empty_like(x)
    k = _scale(device)
    cv.stream(k, [x], [y], device=device, args=(2.0,))  # built before the limit
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (300, hard))
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            report = cv.stream(k, [x], [y], device=device, args=(2.0,),
                               trace=tmp_path / "t.json")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert report.trace_file is None
    assert any("t.json was not written" in str(w.message) for w in seen)
    np.testing.assert_array_equal(y, x * 2)
    assert os.listdir(tmp_path) == []


# -- /proc/self/fd/N ------------------------------------------------------------------------
@pytest.mark.parametrize("what", ["output", "trace"])
def test_proc_fd_of_a_file_with_no_name_is_refused(device, tmp_path, what):
    """``/proc/self/fd/N`` of a ``TemporaryFile`` reads as a link to ``"/tmp/#123
    (deleted)"``; files.resolve takes that text as the path, so conveyor writes a new file of
    that name beside where the file was (for a memfd: ``"/memfd:NAME (deleted)"``, in ``/``),
    the report names the fd, and the file behind it stays empty. Such a name cannot be
    replaced by a rename: it must be refused before any work."""
    x = np.arange(1000, dtype=np.float32)
    with tempfile.TemporaryFile(dir=tmp_path) as held:
        name = f"/proc/self/fd/{held.fileno()}"
        assert os.readlink(name).endswith(" (deleted)")
        with pytest.raises(InputError, match=f"/proc/self/fd/{held.fileno()}"):
            if what == "output":
                cv.stream(_scale(device), [x], [cv.raw_out(name, np.float32)],
                          device=device, args=(2.0,))
            else:
                cv.stream(_scale(device), [x], [np.float32], device=device, args=(2.0,),
                          trace=name)
        assert os.fstat(held.fileno()).st_size == 0
    assert os.listdir(tmp_path) == []  # no "#123 (deleted)"


# -- relative input paths ---------------------------------------------------------------------
@pytest.mark.parametrize("make", ["npy", "raw"])
def test_a_relative_input_reads_the_file_it_named_when_it_was_made(device, tmp_path,
                                                                   monkeypatch, make):
    """``cv.npy("x.npy")`` checks the file of the current folder; the stream opens
    ``"x.npy"`` again, in whatever folder is current then (FileSource keeps the relative
    Path). A file of the same size and header there is read instead, with no error; none
    there is a raw FileNotFoundError (outputs resolve their target when made)."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    x = np.arange(1000, dtype=np.float32)
    for folder, values in ((first, x), (second, -x)):
        np.save(folder / "x.npy", values)
        values.tofile(folder / "x.bin")
    monkeypatch.chdir(first)
    source = cv.npy("x.npy") if make == "npy" else cv.raw("x.bin", np.float32)
    monkeypatch.chdir(second)
    y = np.empty_like(x)
    cv.stream(_scale(device), [source], [y], device=device, args=(2.0,))
    np.testing.assert_array_equal(y, x * 2)  # got -x * 2: second/x.npy


# -- .npy headers ----------------------------------------------------------------------------
def _npy(path: Path, header: str, version: tuple[int, int] = (1, 0), body: bytes = b"") -> Path:
    """A .npy file of ``header`` (the dict's text, padded to 64 bytes with its newline)."""
    text = header.encode("utf8" if version == (3, 0) else "latin1")
    fixed = 10 if version == (1, 0) else 12
    text += b" " * ((64 - (fixed + len(text) + 1) % 64) % 64) + b"\n"
    width = "<H" if version == (1, 0) else "<I"
    path.write_bytes(b"\x93NUMPY" + bytes(version) + struct.pack(width, len(text)) + text
                     + body)
    return path


def test_an_npy_3_0_file_keeps_its_field_names(device, tmp_path):
    """NumPy writes version 3.0 (a UTF-8 header) for field names Latin-1 cannot hold; npy()
    reads 3.0 with ``read_array_header_2_0``, which decodes Latin-1: ``'α'`` is ``'Î±'``, and
    a stream copying the records writes the mangled name into its output, with no error."""
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels, PyOpenCL arrays in callables")
    a = np.arange(10, dtype=np.float32).view([("α", "<f4")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Stored array in format 3.0"
        np.save(tmp_path / "a.npy", a)
    assert (tmp_path / "a.npy").read_bytes()[6:8] == b"\x03\x00"
    assert cv.npy(tmp_path / "a.npy").dtype == a.dtype  # [('Î±', '<f4')]
    cv.stream(_returns_x, [tmp_path / "a.npy"], [tmp_path / "b.npy"], device=device)
    assert np.load(tmp_path / "b.npy").dtype.names == ("α",)


def test_an_output_with_non_latin1_field_names_is_written_as_numpy_writes_it(device,
                                                                            tmp_path):
    """np.save writes such a dtype as version 3.0; FileSink.open tries 1.0 then 2.0 (both
    Latin-1) and lets the second UnicodeEncodeError out."""
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels, PyOpenCL arrays in callables")
    a = np.arange(10, dtype=np.float32).view([("α", "<f4")])
    cv.stream(_returns_x, [a], [cv.npy_out(tmp_path / "b.npy")], device=device)
    got = np.load(tmp_path / "b.npy")
    assert got.dtype == a.dtype
    np.testing.assert_array_equal(got, a)


def test_an_npy_header_cut_short_is_an_input_error(tmp_path):
    """NumPy's header filter tokenizes the text first: an unclosed ``{`` is
    ``tokenize.TokenError``, which is neither ValueError nor SyntaxError (npy() catches
    those)."""
    path = _npy(tmp_path / "cut.npy", "{'descr': '<f4', 'fortran_or")
    with pytest.raises(InputError, match="cut.npy"):
        cv.npy(path)


def test_the_command_with_an_npy_header_cut_short_exits_2(device, tmp_path, capsys):
    path = _npy(tmp_path / "cut.npy", "{'descr': '<f4', 'fortran_order': False, 'sha")
    try:
        code = _cli(device, tmp_path, "-i", str(path), "-o", str(tmp_path / "y.npy"))
    except BaseException as exc:  # the TokenError escapes main()
        code = f"raised {type(exc).__name__}"
    assert code == 2
    assert "cut.npy" in capsys.readouterr().err
    assert not (tmp_path / "y.npy").exists()


@pytest.mark.parametrize("header, says", [
    ("{'descr': [('a', '<f4'), ('b', '|O')], 'fortran_order': False, 'shape': (1,), }",
     "Python objects"),
    ("{'descr': '<f4', 'fortran_order': True, 'shape': (0, 3, 2), }", "Fortran"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (10**30,), }", "not a .npy"),
    ("{'descr': ('<f4', (2**40,)), 'fortran_order': False, 'shape': (0,), }", "not a .npy"),
    ("{'descr': " + "[" * 150 + "'<f4'" + "]" * 150 + ", 'fortran_order': False, "
     "'shape': (1,), }", "not a .npy"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (1.0,), }", "not a .npy"),
], ids=["object-field", "fortran-empty", "shape-expression", "huge-subarray", "deep-descr",
        "float-shape"])
def test_guard_hostile_npy_headers_are_input_errors(tmp_path, header, says):
    """guard: headers no np.save writes (an object field, arithmetic in the shape, a
    sub-array of 2**40 elements, 150 nested lists) are InputErrors naming the file, never a
    NumPy error, an allocation or a recursion error."""
    path = _npy(tmp_path / "h.npy", header)
    with pytest.raises(InputError, match=f"h.npy.*{says}|{says}.*h.npy"):
        cv.npy(path)


@pytest.mark.parametrize("version", [(2, 0), (3, 0)])
def test_guard_npy_2_0_and_3_0_headers_stream(device, tmp_path, version):
    """guard: a plain float32 array under a 2.0 or 3.0 header (4-byte length) streams."""
    x = np.arange(96, dtype=np.float32)
    path = _npy(tmp_path / "v.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': "
                                    "(96,), }", version, x.tobytes())
    y = np.empty_like(x)
    cv.stream(_scale(device), [path], [y], device=device, args=(2.0,))
    np.testing.assert_array_equal(y, x * 2)


# -- dtypes files cannot carry ---------------------------------------------------------------
@pytest.mark.parametrize("side", ["input", "output"])
def test_datetime_npy_files_stream_as_arrays_do(device, tmp_path, side):
    """``memoryview(array.data)`` refuses datetime64/timedelta64 (io.FileSource.read_into,
    sinks.FileSink.write_from): such a file fails mid-stream with NumPy's ValueError, while
    the same array in memory streams through a callable."""
    a = np.arange(100).astype("M8[s]")
    np.save(tmp_path / "d.npy", a)
    cv.stream(_returns_x, [a], [a.dtype], device=device)  # in memory: right
    if side == "input":
        got = cv.stream(_returns_x, [tmp_path / "d.npy"], [a.dtype], device=device).outputs[0]
    else:
        cv.stream(_returns_x, [a], [tmp_path / "o.npy"], device=device)
        got = np.load(tmp_path / "o.npy")
    np.testing.assert_array_equal(got, a)


# -- inputs that are no regular files --------------------------------------------------------
@pytest.mark.parametrize("node", ["fifo", "socket", "folder", "/dev/zero"])
def test_guard_inputs_that_are_no_regular_files_are_refused_at_once(tmp_path, node):
    """guard: a FIFO (whose open would block), a socket, a folder and /dev/zero (endless)
    named as ``.npy`` or raw inputs are InputErrors when the input is made."""
    path = tmp_path / "in.npy"
    held = None
    if node == "fifo":
        os.mkfifo(path)
    elif node == "socket":
        held = socket.socket(socket.AF_UNIX)
        held.bind(str(path))
    elif node == "folder":
        path.mkdir()
    else:
        path = Path(node)
    try:
        for make in (cv.npy, lambda p: cv.raw(p, np.float32)):
            with pytest.raises(InputError, match="is not a file"):
                make(path)
    finally:
        if held is not None:
            held.close()


def test_a_raw_input_whose_size_says_zero_but_holds_bytes_is_refused():
    """``/proc/self/status`` has st_size 0 and a few hundred bytes: ``cv.raw`` takes its
    size for the truth, so a stream over it runs over no rows and returns an empty output
    with no error (sysfs files say 4096 and are refused as "got shorter" mid-stream)."""
    with open("/proc/self/status", "rb") as f:
        assert os.fstat(f.fileno()).st_size == 0 and f.read(1)
    with pytest.raises(InputError, match="/proc/self/status"):
        cv.raw("/proc/self/status", np.uint8)


# -- files changed under the stream ---------------------------------------------------------
def test_guard_an_input_replaced_by_rename_mid_stream_is_read_whole(device, tmp_path):
    """guard: ``os.replace(new, input)`` at the second block (a writer's atomic save) leaves
    the stream on the file it opened: every row is the old file's."""
    x = np.arange(20_000, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "new.npy", -x)

    def compute(a, y, *, queue, offset, n):
        if offset and (tmp_path / "new.npy").exists():
            os.replace(tmp_path / "new.npy", tmp_path / "x.npy")
        return a

    y = cv.stream(compute, [tmp_path / "x.npy"], [np.float32], device=device,
                  block_bytes=16_000).outputs[0]
    np.testing.assert_array_equal(y, x)
    assert np.load(tmp_path / "x.npy")[1] == -1


def test_a_memmap_input_cut_after_it_was_mapped_is_an_input_error_not_sigbus(device,
                                                                             tmp_path):
    """The user maps the file, then it is cut (another program, or the user's own
    ``np.save`` elsewhere) before the stream: conveyor's staging copy touches pages past the
    file's end and the process dies of SIGBUS. Its size is known before any work."""
    path = tmp_path / "m.npy"
    child = _run_child(f"""
        import os, numpy as np, conveyor as cv
        np.save({str(path)!r}, np.arange(100_000, dtype=np.float32))
        m = np.load({str(path)!r}, mmap_mode="r")
        os.truncate({str(path)!r}, 128)

        def compute(x, y, *, queue, offset, n):
            return x

        try:
            cv.stream(compute, [m], [np.float32], device=cv.device({device.spec!r}))
        except cv.InputError as exc:
            print("InputError", exc)
    """)
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    assert "InputError" in child.stdout and "m.npy" in child.stdout


# -- outputs over other people's files -------------------------------------------------------
@pytest.fixture
def sticky():
    """A sticky, world-writable folder (``/tmp``'s mode 1777) under /tmp, which uid 65534 can
    reach, holding ``root.npy`` (root's, mode 0644); removed after the test."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a file of another user")
    base = Path(tempfile.mkdtemp(prefix="r17_d_", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        share = base / "share"
        share.mkdir()
        os.chmod(share, 0o1777)
        np.save(share / "root.npy", np.zeros(4, np.float32))
        os.chmod(share / "root.npy", 0o644)
        yield share
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_an_output_over_another_users_file_in_a_sticky_folder_is_refused_before_any_work(
        device, sticky):
    """The sticky bit lets only a file's owner (or the folder's) rename over it. The folder is
    writable, so output_target lets it through, the part file is made and filled, and the
    whole stream's work ends in ``PermissionError: [Errno 1] Operation not permitted:
    '.../.root.npy.XXXX.part' -> '.../root.npy'`` (the command: exit 1, "check the path and
    its permissions"). The child streams as uid 65534 (saved uid 0)."""
    child = _run_child(f"""
        import os, numpy as np, conveyor as cv
        dev = cv.device({device.spec!r})

        def compute(x, y, *, queue, offset, n):
            return x

        x = np.arange(1000, dtype=np.float32)
        cv.stream(compute, [x], [np.float32], device=dev)  # every import made as root
        os.setresgid(65534, 65534, 0)
        os.setresuid(65534, 65534, 0)
        calls = []

        def counted(x, y, *, queue, offset, n):
            calls.append(offset)
            return x

        try:
            cv.stream(counted, [x], [{str(sticky / "root.npy")!r}], device=dev, warmup=False)
            print("written")
        except cv.InputError as exc:
            print("InputError", exc)
        except OSError as exc:
            print("OSError", exc)
        print("blocks", len(calls))
    """)
    assert child.returncode == 0, child.stderr[-2000:]
    assert "InputError" in child.stdout and "root.npy" in child.stdout, child.stdout
    assert "blocks 0" in child.stdout
    assert sorted(os.listdir(sticky)) == ["root.npy"]
    np.testing.assert_array_equal(np.load(sticky / "root.npy"), np.zeros(4, np.float32))


def test_root_replacing_a_users_output_keeps_its_owner(device, tmp_path):
    """The part is made by the process (root) and renamed over the file: the user (uid
    65534 here) finds a file of root's, mode 0644, that they can no longer write. The mode
    is carried over (files.ready_part); the owner and group can be too (``fchown`` of the
    part, where the process may)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a file of another user")
    x = np.arange(1000, dtype=np.float32)
    np.save(tmp_path / "y.npy", x)
    os.chown(tmp_path / "y.npy", 65534, 65534)
    cv.stream(_scale(device), [x], [tmp_path / "y.npy"], device=device, args=(2.0,))
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), x * 2)
    st = os.stat(tmp_path / "y.npy")
    assert (st.st_uid, st.st_gid) == (65534, 65534)


# -- the same file in and out ----------------------------------------------------------------
@pytest.mark.parametrize("how", ["symlink", "hard link", "/proc/self/fd"])
def test_guard_an_output_naming_a_memmap_inputs_file_another_way_is_right(device, tmp_path,
                                                                        how):
    """guard: a memmap input and an output that is its file through a symlink or
    ``/proc/self/fd/N`` of an open descriptor (written through: the file is replaced, the
    link stays) or a hard link (that name replaced, the other keeps the old rows): the stream
    reads the old rows everywhere, over several blocks."""
    x = np.arange(20_000, dtype=np.float32)
    np.save(tmp_path / "m.npy", x)
    m = np.load(tmp_path / "m.npy", mmap_mode="r")
    other = tmp_path / "other.npy"
    held = None
    if how == "symlink":
        other.symlink_to(tmp_path / "m.npy")
    elif how == "hard link":
        os.link(tmp_path / "m.npy", other)
    else:
        held = os.open(tmp_path / "m.npy", os.O_RDONLY)
        other = Path(f"/proc/self/fd/{held}")
    try:
        cv.stream(_scale(device), [m], [cv.npy_out(other)], device=device, args=(2.0,),
                  block_bytes=16_000)
    finally:
        if held is not None:
            os.close(held)
    np.testing.assert_array_equal(m, x)  # the mapping is of the old file
    if how == "hard link":
        np.testing.assert_array_equal(np.load(other), x * 2)
        np.testing.assert_array_equal(np.load(tmp_path / "m.npy"), x)
    else:
        np.testing.assert_array_equal(np.load(tmp_path / "m.npy"), x * 2)
    if how == "symlink":
        assert (tmp_path / "other.npy").is_symlink()
    assert _parts(tmp_path) == []


def test_guard_a_read_only_mount_is_refused_before_any_work_even_for_root(device, small_disk):
    """guard: root may write anywhere ``chmod`` allows, but not on a read-only mount:
    outputs and ``trace=`` there are InputErrors naming the folder, before any work, and the
    file there is untouched."""
    (small_disk / "old.npy").write_bytes(b"old")
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    x = np.arange(1000, dtype=np.float32)
    try:
        for target in (small_disk / "y.npy", small_disk / "old.npy"):
            with pytest.raises(InputError, match="is not writable"):
                cv.stream(_scale(device), [x], [target], device=device, args=(2.0,))
        with pytest.raises(InputError, match="trace=.*is not writable"):
            cv.stream(_scale(device), [x], [np.float32], device=device, args=(2.0,),
                      trace=small_disk / "t.json")
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    assert os.listdir(small_disk) == ["old.npy"]
    assert (small_disk / "old.npy").read_bytes() == b"old"
