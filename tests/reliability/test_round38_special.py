"""Round thirty-eight, helper C: files that are not what they seem, handed to conveyor's file
roads (``cv.npy``, ``cv.raw``, ``cv.parquet``, ``cv.arrow``, ``cv.npy_out``, ``cv.raw_out``,
``conveyor.files``, ``conveyor.dask.stream`` over files, ``conveyor map``/``reduce``) as users
and attackers would: FIFOs, ``/dev/full``/``/dev/zero``/``/dev/null``, ``/proc/self/...``,
folders, symlinks (to the input, in a loop, dangling), files made read-only, files that grow,
shrink, are rewritten or replaced while a stream reads them (changed from the stream's own
callable, never by a timed race), hostile ``.npy`` headers, and small tmpfs disks that run
out of space or of inodes mid-stream.

Found (strict xfails, each asserting the right behaviour):

- A Parquet file rewritten in place while it is read is reported as "damaged ... write the
  file again" (PyArrow cannot decode the new bytes against the old metadata); the file is
  whole, it changed: the message must say so, as the Arrow, ``.npy`` and raw roads do.
- An output on a file system with no inode left (ENOSPC from ``mkstemp``) fails with a bare
  ``OSError: [Errno 28] No space left on device: '.../.y.npy.XXXX.new'``, naming a temporary
  file that does not exist and not the output (round seventeen named the output for ENOSPC
  at the header and at the rows only).
- ``conveyor.dask.stream`` on a full disk: the workers' ENOSPC is a bare ``[Errno 28] No
  space left on device`` naming neither the output nor its folder (``RangeSink`` has no
  ``_naming_errors``).
- ``conveyor.dask.stream`` of ``cv.npy("/proc/self/fd/N")`` for a file with no name (a
  ``TemporaryFile``, a deleted file) sends the workers the link's text, ``"/tmp/x.npy
  (deleted)"``: a raw FileNotFoundError on every worker, after the parts were made (and a
  file planted under that name, of the same size and header, would be read instead).
- A Parquet or Arrow input swapped for a FIFO between its check and its open is opened with
  a blocking ``open()``: with no writer, ``cv.parquet``/``cv.arrow`` hang for ever (the
  ``.npy`` road opens with ``O_NONBLOCK`` and refuses non-regular files since round 26).
- An output over a file its owner made read-only (mode 0444) is replaced, silently, where
  ``np.save`` (and ``open(path, "wb")``) refuse with PermissionError.

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and streamkit)
from reliakit import child_env, first_device_only, opencl_c_kernels  # noqa: E402, F401 (autouse)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

SRC = str(Path(cv.__file__).resolve().parents[1])  # the conveyor under test, for children


TWICE = """__kernel void twice(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}
"""


def _returns_x(x, y, *, queue, offset, n):
    """A callable that copies its input to its output (no kernel build)."""
    return x


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _leftovers(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith((".part", ".new")))


@contextlib.contextmanager
def _tmpfs(folder: Path, options: str):
    """A tmpfs mounted at ``folder`` (root with CAP_SYS_ADMIN only; skip otherwise),
    unmounted after."""
    folder.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                          capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.fixture(scope="module")
def client():
    """One in-process Dask worker of one thread: the one cluster of this file."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                       dashboard_address=":0", silence_logs=50)
    with cluster, distributed.Client(cluster, set_as_default=False) as c:
        c.wait_for_workers(1, timeout=60)
        yield c


def _dask_twice():
    import conveyor.dask as cvd

    return cvd.kernel(cv.portable(TWICE), "twice")


# -- files changed while they are read --------------------------------------------------------
def _changing(change):
    """A callable copying its input that runs ``change()`` once, at the first block after
    the first (the stream has read block 0 and the chunks loaded for it)."""
    done: list[int] = []

    def compute(a, y, *, queue, offset, n):
        if offset and not done:
            done.append(offset)
            change()
        return a

    return compute


def test_a_parquet_file_rewritten_mid_stream_is_said_to_have_changed(device, tmp_path):
    """``pq.write_table`` over the input (same path, same inode: truncate and write) while
    the stream reads it, injected from the source's own load of row group 3. PyArrow then
    fails to decode that row group against the old metadata, and ``tables._read_guard``
    sees no shorter file and calls it damaged: the user is told to write a file that is
    whole. The change must be named, as Arrow, .npy and raw files name it ("changed while
    it was read")."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    x = np.arange(20_000, dtype=np.float32)
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"x": x}), path, row_group_size=2000)
    source = cv.parquet(path, "x")
    load = source._load

    def rewritten_before_group_3(index: int) -> np.ndarray:
        if index == 3:  # the real read of row group 3 then meets the new bytes
            pq.write_table(pa.table({"x": -x}), path, row_group_size=2000)
        return load(index)

    source._load = rewritten_before_group_3
    with pytest.raises(InputError) as caught:
        cv.stream(_returns_x, [source], [np.float32], device=device, block_bytes=16_000,
                  warmup=False)
    said = str(caught.value)
    assert "changed while it was read" in said and "damaged" not in said, said


@pytest.mark.parametrize("kind", ["raw", "parquet", "arrow"])
def test_guard_an_input_replaced_by_rename_mid_stream_is_read_whole(device, tmp_path, kind):
    """guard (round seventeen guards .npy): ``os.replace(new, input)`` at the second block
    leaves the stream on the file it opened: every row is the old file's."""
    x = np.arange(20_000, dtype=np.float32)
    path, new = tmp_path / f"x.{kind}", tmp_path / f"new.{kind}"
    if kind == "raw":
        x.tofile(path)
        (-x).tofile(new)
        source = cv.raw(path, np.float32)
    else:
        pa = pytest.importorskip("pyarrow")
        if kind == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(pa.table({"x": x}), path, row_group_size=2000)
            pq.write_table(pa.table({"x": -x}), new, row_group_size=5000)
            source = cv.parquet(path, "x")
        else:
            import pyarrow.feather as feather

            def batched(v: np.ndarray):
                return pa.Table.from_batches([pa.record_batch({"x": v[i:i + 2000]})
                                              for i in range(0, len(v), 2000)])

            feather.write_feather(batched(x), path, compression="uncompressed")
            feather.write_feather(batched(-x), new, compression="uncompressed")
            source = cv.arrow(path, "x")
    y = cv.stream(_changing(lambda: os.replace(new, path)), [source], [np.float32],
                  device=device, block_bytes=16_000, warmup=False).outputs[0]
    np.testing.assert_array_equal(y, x)


# -- non-regular files put in an input's place -------------------------------------------------
@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_a_table_input_swapped_for_a_fifo_after_its_check_is_refused_not_waited_on(
        tmp_path, monkeypatch, kind):
    """The check (``io._existing``) opens the path without waiting and finds a regular file;
    a FIFO then takes its place (an attacker's swap). ``pq.ParquetFile(path)`` and
    ``ipcfile.record_batches``/``pyarrow.OSFile`` open it by path, blocking until a writer
    comes: for ever (seen: ``cv.arrow`` still waiting after 60 s). The ``.npy`` road opens
    with ``O_NONBLOCK`` and refuses what is no longer a regular file (``io.open_regular``).
    Here a writer thread opens the FIFO again and again, so the blocking open returns (EOF)
    and the test cannot hang: the error it gets must be the refusal of a non-regular file,
    not PyArrow's "lseek failed" or "no Arrow IPC file magic"."""
    pa = pytest.importorskip("pyarrow")
    from conveyor.pipeline import tables

    path = tmp_path / f"t.{kind}"
    if kind == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"x": np.arange(100, dtype=np.float32)}), path)
    else:
        import pyarrow.feather as feather

        feather.write_feather(pa.table({"x": np.arange(100, dtype=np.float32)}), path)
    real = tables._existing
    stop = threading.Event()

    def writer() -> None:  # lets a blocking open of the FIFO return (then EOF)
        while not stop.is_set():
            os.close(os.open(path, os.O_WRONLY))

    thread = threading.Thread(target=writer, daemon=True)

    def checked_then_swapped(given):
        target = real(given)
        os.unlink(path)
        os.mkfifo(path)
        thread.start()
        return target

    monkeypatch.setattr(tables, "_existing", checked_then_swapped)
    make = cv.parquet if kind == "parquet" else cv.arrow
    try:
        with pytest.raises(InputError) as caught:
            make(path, "x")
    finally:
        stop.set()
        if thread.is_alive():  # blocked in open(): a reader lets it through
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            thread.join(10)
            os.close(fd)
    assert not thread.is_alive()
    assert "regular file" in str(caught.value), str(caught.value)


@pytest.mark.parametrize("make", ["npy", "raw", "parquet", "arrow"])
@pytest.mark.parametrize("what", ["/proc/self/status", "folder", "symlink loop", "dangling"])
def test_guard_inputs_that_are_not_data_files_are_input_errors(tmp_path, make, what):
    """guard: a /proc file (size 0, bytes inside), a folder, a loop of links and a dangling
    link, on every file input road: an InputError naming the path, no descriptor left."""
    if make in ("parquet", "arrow"):
        pytest.importorskip("pyarrow")
    if what == "folder":
        path = tmp_path / "d"
        path.mkdir()
    elif what == "symlink loop":
        path = tmp_path / "a.npy"
        path.symlink_to(tmp_path / "b.npy")
        (tmp_path / "b.npy").symlink_to(path)
    elif what == "dangling":
        path = tmp_path / "a.npy"
        path.symlink_to(tmp_path / "gone.npy")
    else:
        path = Path(what)
    before = _fds()
    with pytest.raises(InputError, match=str(path)):
        if make == "npy":
            cv.npy(path)
        elif make == "raw":
            cv.raw(path, np.uint8)
        else:
            getattr(cv, make)(path, "x")
    assert _fds() == before


# -- outputs that are not plain files ---------------------------------------------------------
@pytest.mark.parametrize("target", ["/dev/full", "/dev/zero", "/dev/null", "fifo",
                                    "symlink loop", "link to /dev/full"])
def test_guard_outputs_that_are_no_regular_files_are_refused_before_any_work(device, tmp_path,
                                                                            target):
    """guard: raw and .npy outputs onto device nodes, a FIFO, a loop of links or a link to
    /dev/full: an InputError before any block, nothing made."""
    if target == "fifo":
        path = tmp_path / "f.npy"
        os.mkfifo(path)
    elif target == "symlink loop":
        path = tmp_path / "a.npy"
        path.symlink_to(tmp_path / "b.npy")
        (tmp_path / "b.npy").symlink_to(path)
    elif target == "link to /dev/full":
        path = tmp_path / "full.npy"
        path.symlink_to("/dev/full")
    else:
        path = Path(target)
    calls: list[int] = []

    def counted(x, y, *, queue, offset, n):
        calls.append(offset)
        return x

    x = np.arange(1000, dtype=np.float32)
    with pytest.raises(InputError, match="/dev/full" if target == "link to /dev/full"
                       else str(path)):
        out = cv.raw_out(path) if target.startswith("/dev") else path
        cv.stream(counted, [x], [out], device=device, warmup=False)
    assert calls == []
    assert _leftovers(tmp_path) == []


def test_guard_an_output_linked_to_its_input_is_written_through_right(device, tmp_path):
    """guard: the output is a symlink to the input file (``-o link.npy`` of ``-i x.npy``):
    the input reads the old file to its end, the file is replaced, the link stays."""
    x = np.arange(20_000, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "link.npy").symlink_to(tmp_path / "x.npy")
    cv.stream(_returns_x_twice, [tmp_path / "x.npy"], [tmp_path / "link.npy"], device=device,
              block_bytes=16_000)
    np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), 2 * x)
    assert (tmp_path / "link.npy").is_symlink()
    assert _leftovers(tmp_path) == []


def _returns_x_twice(x, y, *, queue, offset, n):
    return x * 2


def test_an_output_over_a_read_only_file_is_refused_as_np_save_refuses_it(device, tmp_path):
    """A user (not root: root may write any file) marks a result read-only (``chmod 444``)
    to keep it. ``np.save`` over it, ``open(path, "wb")``, ``cp`` all refuse
    (PermissionError); conveyor renames a new file over it (the folder is writable) and
    keeps the read-only mode, so the result that was protected is gone with no error. The
    output check (``files.output_target``) should refuse a file this user may not write,
    naming it and what to change (``chmod u+w``, or remove it first)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the child as another user")
    base = Path(tempfile.mkdtemp(prefix="r38_c_", dir="/tmp"))
    try:
        os.chmod(base, 0o777)
        child = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            import os, numpy as np
            import conveyor as cv
            cv.npy_out({str(base / "first.npy")!r})  # every import made as root
            os.setresgid(65534, 65534, 0)
            os.setresuid(65534, 65534, 0)
            path = {str(base / "kept.npy")!r}
            np.save(path, np.zeros(4, np.float32))
            os.chmod(path, 0o444)
            try:
                np.save(path, np.ones(4, np.float32))
            except PermissionError:
                print("np.save refused")
            try:
                cv.npy_out(path)
                print("conveyor took it")
            except cv.InputError as exc:
                print("InputError", exc)
        """)], env=child_env(SRC), capture_output=True, text=True,
            timeout=120)
        assert child.returncode == 0, child.stderr[-2000:]
        assert "np.save refused" in child.stdout
        assert "InputError" in child.stdout and "kept.npy" in child.stdout, child.stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- small disks ------------------------------------------------------------------------------
def test_an_output_on_a_disk_with_no_inode_left_names_the_output(device, tmp_path):
    """A file system out of inodes (a tmpfs of ``nr_inodes=3``, filled) with bytes to spare:
    ``mkstemp`` of the part is ENOSPC. ``FileSink.open`` names only EACCES/EPERM/EROFS
    there; this one escapes as ``[Errno 28] No space left on device: '<folder>/.y.npy.
    k3j2x9q1.new'``, a file that does not exist. Round seventeen names the output (and its
    folder, and "free some space") for ENOSPC at the header and at the rows; the same is
    right here."""
    with _tmpfs(tmp_path / "disk", "size=1m,nr_inodes=3") as disk:
        with contextlib.suppress(OSError):
            for i in range(10):
                (disk / f"f{i}").touch()
        x = np.arange(1000, dtype=np.float32)
        before = _fds()
        with pytest.raises(OSError) as caught:
            cv.stream(_returns_x, [x], [disk / "y.npy"], device=device)
        assert _fds() == before
        said = str(caught.value)
        assert "output" in said and "y.npy" in said and ".new" not in said, said
        assert _leftovers(disk) == []


def test_a_dask_file_stream_on_a_full_disk_names_the_output(device, tmp_path, client):
    """The client makes the part at full size (sparse), the worker's rows then find no space:
    ``RangeSink.write_from`` lets ``[Errno 28] No space left on device`` out bare (its notes
    name the input's rows and the block). ``cv.stream`` names the output, its folder and
    what to do (``FileSink._naming_errors``); a cluster's user needs that more. The part is
    removed (guarded here too)."""
    if device.backend != "opencl":
        pytest.skip("an OpenCL C kernel")
    np.save(tmp_path / "x.npy", np.arange(200_000, dtype=np.float32))
    with _tmpfs(tmp_path / "disk", "size=256k") as disk:
        import conveyor.dask as cvd

        with pytest.raises(OSError) as caught:
            cvd.stream(_dask_twice(), [str(tmp_path / "x.npy")], [str(disk / "y.npy")],
                       client=client, device=device.spec, block_bytes=64 * 1024)
        assert os.listdir(disk) == []
        said = " ".join([str(caught.value), *getattr(caught.value, "__notes__", [])])
        assert "y.npy" in said and str(disk) in said, said


def test_a_dask_file_stream_of_an_unnamed_proc_fd_input_is_refused_on_the_client(
        device, tmp_path, client):
    """``cv.npy("/proc/self/fd/N")`` of a file removed after it was opened streams locally
    (the link opens the open file). ``dask.files._source_ref`` resolves the path for the
    workers to its link text, ``".../x.npy (deleted)"``: no such file, so each worker fails
    with a bare FileNotFoundError, after the output's part was made; a file planted under
    that name, of the same size and header, would be read instead. It should be an
    InputError on the client, before any part is made, saying the workers cannot open a file
    with no name (copy it to a path they can read)."""
    if device.backend != "opencl":
        pytest.skip("an OpenCL C kernel")
    path = tmp_path / "x.npy"
    np.save(path, np.arange(100, dtype=np.float32))
    with open(path, "rb") as held:
        os.unlink(path)
        source = cv.npy(f"/proc/self/fd/{held.fileno()}")
        import conveyor.dask as cvd

        with pytest.raises(InputError, match="/proc/self/fd"):
            cvd.stream(_dask_twice(), [source], [str(tmp_path / "y.npy")], client=client,
                       device=device.spec)
    assert sorted(os.listdir(tmp_path)) == []


def test_guard_the_command_on_a_full_standard_output_exits_1(tmp_path):
    """guard: ``conveyor reduce ... > /dev/full`` prints nothing it could not write and exits
    1 naming standard output (the result is not lost silently with exit 0)."""
    (tmp_path / "twice.cl").write_text(TWICE)
    np.save(tmp_path / "x.npy", np.arange(100, dtype=np.float32))
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "conveyor.cli", "reduce", str(tmp_path / "twice.cl"),
             "--kernel", "twice", "-i", str(tmp_path / "x.npy"), "--op", "sum", "-q",
             "--device", "opencl:0:0"], stdout=full, stderr=subprocess.PIPE, text=True,
            env=child_env(SRC), timeout=120)
    assert done.returncode == 1
    assert "standard output" in done.stderr
