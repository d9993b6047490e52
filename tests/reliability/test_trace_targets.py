"""Where a trace (or an output, or a plot) may be written, and how its path may be given.

- ``--trace /dev/stdout >> log.txt`` replaced log.txt with the trace JSON (the job's log was
  lost); with stdout a pipe, ``--force`` exited 0 with a raw RuntimeWarning about
  ``/proc/NNN/fd/.pipe:[N].XXXX.new``. A target that is this process's standard output or
  error (the same file as fd 1 or 2), or that resolves into /proc (a pipe or socket named by
  ``/dev/fd/N``), is now an InputError before any work; /dev/shm stays allowed, FIFOs stay
  refused (``files.output_target``, used by outputs, ``trace=``, ``timeline.save``/``plot``).
- ``trace=pathlib.Path(...)`` was refused though ``timeline.save(Path)`` took one; ``trace=``
  with a NUL was a raw ValueError, ``timeline.save(b"x.json")`` a raw TypeError, and
  ``timeline.save`` into a missing folder a FileNotFoundError naming the internal
  ``.x.json.XXXX.new`` file. Now a Path works and the rest are InputErrors naming the path.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # reliakit (and, through it, streamkit)
from reliakit import kernel  # noqa: E402

import conveyor as cv  # noqa: E402
from conveyor import files  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

SRC = str(HERE.parents[1] / "src")


@contextlib.contextmanager
def fd_pointing_at(fd: int, target: int) -> Iterator[None]:
    """``fd`` (1 or 2) made a copy of ``target`` for the block, then given back."""
    saved = os.dup(fd)
    try:
        os.dup2(target, fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


def _report(device: cv.Device) -> cv.Report:
    x = np.arange(1000, dtype=np.float32)
    return cv.stream(kernel(device, "scale"), [x], [np.float32], args=(2.0,), device=device)


# --- standard output and error, pipes, sockets, /proc --------------------------------------

@pytest.mark.parametrize("fd", [1, 2], ids=["stdout", "stderr"])
def test_the_file_stdout_or_stderr_goes_to_is_refused_and_kept(tmp_path, fd):
    log = tmp_path / "log.txt"
    log.write_text("the job's log\n")
    stream = "standard output" if fd == 1 else "standard error"
    with open(log, "a") as held, fd_pointing_at(fd, held.fileno()):
        for named in (f"/dev/{'stdout' if fd == 1 else 'stderr'}", f"/dev/fd/{fd}", str(log)):
            with pytest.raises(InputError, match=f"is this process's {stream}: name a file"):
                files.output_target(named, f"trace={named!r}")
    assert log.read_text() == "the job's log\n"


def test_a_stdout_pipe_is_refused_before_any_work(device, tmp_path):
    x = np.arange(1000, dtype=np.float32)
    out = tmp_path / "y.npy"
    read, write = os.pipe()
    try:
        with fd_pointing_at(1, write):
            with pytest.raises(InputError, match="is this process's standard output"):
                cv.stream(kernel(device, "scale"), [x], [str(out)], args=(2.0,),
                          device=device, trace="/dev/stdout")
            with pytest.raises(InputError, match="^output /dev/stdout: /dev/stdout is this "
                                                 "process's standard output"):
                cv.stream(kernel(device, "scale"), [x], [cv.npy_out("/dev/stdout")],
                          args=(2.0,), device=device)
    finally:
        os.close(read)
        os.close(write)
    assert not out.exists() and list(tmp_path.iterdir()) == []  # refused before any work


def test_other_pipes_sockets_and_proc_entries_are_refused(device):
    report = _report(device)
    read, write = os.pipe()
    left, right = socket.socketpair()
    try:
        cases = [(f"/dev/fd/{write}", r"/proc/\d+/fd/pipe:\[\d+\], a pipe: name a file"),
                 (f"/dev/fd/{left.fileno()}", r"socket:\[\d+\], a socket: name a file"),
                 ("/proc/self/status", r"/proc/\d+/status, a /proc entry: name a file"),
                 ("/proc/conveyor-trace.json", "a /proc entry: name a file")]
        for named, expected in cases:
            with pytest.raises(InputError, match=expected):
                files.output_target(named, "trace")
            with pytest.raises(InputError, match=rf"^timeline\.save\('{named}'\): .*{expected}"):
                report.timeline.save(named)
            with pytest.raises(InputError, match=expected):  # before drawing: no matplotlib
                report.timeline.plot(named)
    finally:
        for fd in (read, write):
            os.close(fd)
        left.close()
        right.close()


def test_dev_shm_stays_allowed_and_fifos_stay_refused(device, tmp_path):
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm")
    x = np.arange(1000, dtype=np.float32)
    shm = Path("/dev/shm") / f"conveyor-test-{uuid.uuid4().hex}.npy"
    try:
        cv.stream(kernel(device, "scale"), [x], [str(shm)], args=(2.0,), device=device,
                  trace=str(shm.with_suffix(".json")))
        assert np.array_equal(np.load(shm), x * 2)
        assert json.loads(shm.with_suffix(".json").read_text())["traceEvents"]
    finally:
        shm.unlink(missing_ok=True)
        shm.with_suffix(".json").unlink(missing_ok=True)
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="is a FIFO"):
        cv.stream(kernel(device, "scale"), [x], [str(tmp_path / "y.npy")], args=(2.0,),
                  device=device, trace=str(fifo))
    with pytest.raises(InputError, match="is a FIFO"):
        _report(device).timeline.save(fifo)
    assert fifo.is_fifo() and not (tmp_path / "y.npy").exists()


def _command(tmp: Path, device: cv.Device, *extra: str, stdout: object,
             force: bool = True) -> subprocess.Popen:
    source = tmp / ("k.cu" if device.backend == "cuda" else "k.cl")
    source.write_text(cv.portable(
        "__kernel void copyf(__global const float *x, __global float *y, ulong offset, "
        "ulong n) { ulong i = get_global_id(0); if (i < n) y[i] = x[i]; }"))
    np.save(tmp / "x.npy", np.arange(100, dtype=np.float32))
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "map", str(source), "--kernel", "copyf", "-i",
         str(tmp / "x.npy"), "-o", str(tmp / "y.npy"), "--device", device.spec,
         *(["--force"] * force), "--no-progress", *extra], stdout=stdout,
        stderr=subprocess.PIPE, text=True, env=env)


def test_the_command_keeps_the_log_stdout_is_appended_to(device, tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("the job's log\n")
    with open(log, "a") as appended:  # conveyor map ... --trace /dev/stdout >> log.txt
        child = _command(tmp_path, device, "--trace", "/dev/stdout", stdout=appended)
        _, err = child.communicate(timeout=120)
    assert child.returncode == 2, err
    assert err.strip().splitlines() == [
        "conveyor map: --trace /dev/stdout: /dev/stdout is this process's standard output: "
        "name a file (conveyor renames a new file over its target: that would replace the "
        "file standard output is redirected to, losing what was written there, or fail on a "
        "pipe)"], err
    assert log.read_text() == "the job's log\n" and not (tmp_path / "y.npy").exists()
    piped = _command(tmp_path, device, "--trace", "/dev/stdout", stdout=subprocess.PIPE)
    out, err = piped.communicate(timeout=120)
    assert piped.returncode == 2 and out == "", err
    assert "standard output" in err and "Warning" not in err, err


# --- how a trace path may be given ----------------------------------------------------------

def test_trace_takes_a_path_object(device, tmp_path):
    x = np.arange(1000, dtype=np.float32)
    cv.stream(kernel(device, "scale"), [x], [np.float32], args=(2.0,), device=device,
              trace=tmp_path / "run.json")
    assert json.loads((tmp_path / "run.json").read_text())["traceEvents"]


@pytest.mark.parametrize(("trace", "expected"), [
    ("a\x00.json", r"trace= got 'a\\x00.json', which holds a NUL character"),
    (b"x.json", r"trace= takes a file path \(a str or pathlib.Path\), not b'x.json'"),
    (3, r"trace= takes a file path \(a str or pathlib.Path\), not 3"),
], ids=["nul", "bytes", "int"])
def test_trace_paths_that_are_no_paths_are_input_errors(device, tmp_path, monkeypatch, trace,
                                                        expected):
    monkeypatch.chdir(tmp_path)
    x = np.arange(1000, dtype=np.float32)
    with pytest.raises(InputError, match=expected):
        cv.stream(kernel(device, "scale"), [x], ["y.npy"], args=(2.0,), device=device,
                  trace=trace)
    assert list(tmp_path.iterdir()) == []


def test_timeline_save_names_the_users_path(device, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = _report(device)
    report.timeline.save(Path("ok.json"))
    assert json.loads(Path("ok.json").read_text())["traceEvents"]
    with pytest.raises(InputError) as caught:
        report.timeline.save("missing/x.json")
    assert str(caught.value) == (f"timeline.save('missing/x.json'): folder "
                                 f"{tmp_path / 'missing'} does not exist: create it or write "
                                 f"elsewhere")
    with pytest.raises(InputError, match=r"timeline\.save\(b'x.json'\) takes a file path"):
        report.timeline.save(b"x.json")
    with pytest.raises(InputError, match="holds a NUL character"):
        report.timeline.save("x\x00.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.json"]


@pytest.mark.parametrize("option", ["--trace", "--plot"])
def test_the_command_refuses_stdout_before_any_work_with_or_without_force(device, tmp_path,
                                                                          option):
    # Without --force it said "/dev/stdout exists: add --force"; a --plot was checked only
    # when drawn, after the outputs were written.
    if option == "--plot":
        pytest.importorskip("matplotlib")
    for force in (False, True):
        child = _command(tmp_path, device, option, "/dev/stdout", stdout=subprocess.PIPE,
                         force=force)
        out, err = child.communicate(timeout=120)
        assert child.returncode == 2 and "standard output" in err, (force, err)
        assert not (tmp_path / "y.npy").exists(), force
