"""Round fifty-two, helper B: file outputs after the folder-held part file (``FileSink``
holding its part's folder open: ``files.hold_folder``, ``files.same_folder``; the commit
refusing an output whose folder moved; the part renamed and removed through the folder's
descriptor; outputs readied before a writable table's copy-back).

Tried (scripts under /tmp/r52f, not kept): outputs through a symlinked folder and a
symlinked file, the link re-pointed or removed mid-stream (a ``cv.iterate`` generator doing
it at its fourth chunk) and between two streams of one ``cv.npy_out`` object; a folder
renamed and renamed back, replaced by a new folder, by a symlink to another; a relative path
with ``os.chdir`` mid-stream; folders of mode 0o300, 0o100, 0o200, 0o600, 0o500 written by
``nobody`` (a forked child); ``/dev/shm``; two outputs in one folder and in two (the second's
folder moved); two outputs aliased through a symlinked folder, ``..`` and a hard link; one
target from three threads at once; ``conveyor.dask.stream`` on a two-worker LocalCluster with
the output folder moved, moved and made again, and its symlink re-pointed, before the workers
open the part; an ``OSError`` and a ``KeyboardInterrupt`` before and after each of
``FileSink.open``, ``write_from``, ``prepare``, ``commit`` for the first and the second of two
outputs (part files, descriptors and the outputs' contents checked after each).

Found (strict xfails):

- **Wrong file, no error**: an output named through a symlink (``latest/y.npy`` with
  ``latest -> run1``, or ``y.npy -> real.npy``) is resolved once, when the ``cv.npy_out`` is
  made: a link re-pointed (or removed) during the stream, or between two streams of one
  ``cv.npy_out`` object, leaves the stream writing the link's old destination. The stream
  succeeds and reports ``latest/y.npy``, which then holds another run's file, or nothing.
- **A raw error naming a temporary file**: a ``cv.npy_out`` whose folder was removed after it
  was made fails with ``FileNotFoundError: ... out/.y.npy.XXXXXXXX.new`` (a fresh one says
  "folder ... does not exist: create it or write elsewhere").
- **A raw error naming the part**: ``conveyor.dask.stream`` whose output folder is moved
  before the workers open the part fails with ``FileNotFoundError: ...
  out/.y.npy.XXXXXXXX.part`` (a local stream says the folder was moved and what to do).

Held: every other case above (the outputs right or refused by name, no ``.part``/``.new``
file anywhere, the moved folders included, no descriptor left, the old outputs untouched
where a failure came before the first rename).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    first_device_only,  # noqa: F401 (autouse: first device only)
    kernel,
    opencl_c_kernels,  # noqa: F401 (autouse: OpenCL C kernels)
    two_worker_client,  # noqa: F401 (the dask_client fixture)
)

import conveyor as cv  # noqa: E402

N = 1000
BLOCK = 800  # bytes: 200 float32 rows, five blocks


def _x() -> np.ndarray:
    return np.random.default_rng(52).standard_normal(N).astype(np.float32)


def _stream_changing(device, outputs, change) -> cv.Report:
    """Stream ``x * 2`` into ``outputs``, calling ``change()`` before the fourth chunk."""
    x = _x()

    def chunks():
        for index, lo in enumerate(range(0, N, 100)):
            if index == 3:
                change()
            yield x[lo:lo + 100]

    return cv.stream(kernel(device, "scale"), [cv.iterate(chunks(), length=N)], outputs,
                     args=(2.0,), device=device, block_bytes=BLOCK)


def _parts(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.name.endswith((".part", ".new")))


def _relink(link: Path, to: str) -> None:
    link.unlink()
    if to:
        os.symlink(to, link)


def _links(root: Path, case: str) -> tuple[Path, Path, str]:
    """(the output's name, the file the name means once ``case`` is done, the link's new
    text) for a folder link ``out -> A`` or a file link ``y.npy -> real.npy``."""
    (root / "A").mkdir()
    (root / "B").mkdir()
    np.save(root / "real.npy", np.zeros(3, np.float32))
    np.save(root / "other.npy", np.ones(3, np.float32))
    if case == "folder link re-pointed":
        os.symlink("A", root / "out")
        return root / "out" / "y.npy", root / "B" / "y.npy", "B"
    os.symlink("real.npy", root / "y.npy")
    if case == "file link re-pointed":
        return root / "y.npy", root / "other.npy", "other.npy"
    return root / "y.npy", root / "y.npy", ""  # removed: the name is a new file


@pytest.mark.parametrize("case", ["folder link re-pointed", "file link re-pointed",
                                  "file link removed"])
def test_an_output_whose_link_changes_mid_stream_is_written_at_its_name_or_refused(
        device, tmp_path, case):
    # `results/latest -> run41` re-pointed to run42 by another job while a stream writes
    # latest/y.npy: the stream succeeds and reports latest/y.npy, yet wrote run41/y.npy;
    # latest/y.npy is run42's old file (or no file). The folder-held part made a folder
    # *replaced* by a link refused; a link re-pointed is the same change, seen one step on.
    name, means, to = _links(tmp_path, case)
    try:
        report = _stream_changing(device, [cv.npy_out(name)],
                                  lambda: _relink(name if to != "B" else name.parent, to))
    except cv.InputError as exc:
        assert str(name.parent) in str(exc) or str(name) in str(exc)
    else:
        assert report.outputs == [str(name)]
        np.testing.assert_array_equal(np.load(means), _x() * 2)
    assert _parts(tmp_path) == []


def test_a_reused_npy_out_writes_where_its_link_points_when_streamed(device, tmp_path):
    (tmp_path / "run1").mkdir()
    (tmp_path / "run2").mkdir()
    os.symlink("run1", tmp_path / "latest")
    out = cv.npy_out(tmp_path / "latest" / "y.npy")  # made once, streamed each day
    x = _x()
    cv.stream(kernel(device, "scale"), [x], [out], args=(2.0,), device=device,
              block_bytes=BLOCK)
    _relink(tmp_path / "latest", "run2")
    report = cv.stream(kernel(device, "scale"), [x], [out], args=(3.0,), device=device,
                       block_bytes=BLOCK)
    assert report.outputs == [str(tmp_path / "latest" / "y.npy")]
    np.testing.assert_array_equal(np.load(tmp_path / "latest" / "y.npy"), x * 3)
    np.testing.assert_array_equal(np.load(tmp_path / "run1" / "y.npy"), x * 2)


def test_a_reused_npy_out_whose_folder_was_removed_names_the_folder(device, tmp_path):
    (tmp_path / "out").mkdir()
    out = cv.npy_out(tmp_path / "out" / "y.npy")
    shutil.rmtree(tmp_path / "out")
    with pytest.raises(cv.InputError) as caught:
        cv.stream(kernel(device, "scale"), [_x()], [out], args=(2.0,), device=device,
                  block_bytes=BLOCK)
    said = str(caught.value)
    assert "does not exist" in said and str(tmp_path / "out") in said and ".new" not in said


class _ChangingClient:
    """A real Dask client whose first ``submit`` first calls ``change()``: the output's
    folder moved after the client made the part, before any worker opened it."""

    def __init__(self, client, change) -> None:
        self._client, self._change = client, change

    def submit(self, *args, **kwargs):
        change, self._change = self._change, None
        if change is not None:
            change()
        return self._client.submit(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._client, name)


@pytest.mark.parametrize("then", ["moved", "moved and made again"])
def test_a_dask_output_whose_folder_moved_is_refused_by_name(dask_client, tmp_path, then):
    import conveyor.dask as cvd

    spec = "opencl:0:0"
    (tmp_path / "out").mkdir()
    x = _x()
    np.save(tmp_path / "x.npy", x)

    def move():
        (tmp_path / "out").rename(tmp_path / "old")
        if then != "moved":
            (tmp_path / "out").mkdir()

    k = cvd.kernel(kernel(cv.device(spec), "scale").source, "scale_float32")
    with pytest.raises(cv.InputError) as caught:
        cvd.stream(k, [str(tmp_path / "x.npy")], [str(tmp_path / "out" / "y.npy")],
                   client=_ChangingClient(dask_client, move), args=(2.0,), device=spec,
                   block_bytes=BLOCK)
    said = str(caught.value)
    assert "y.npy" in said and "moved" in said and ".part" not in said
    assert _parts(tmp_path) == []


# -- held: guards ---------------------------------------------------------------------------


def test_guard_a_folder_renamed_and_renamed_back_mid_stream_commits(device, tmp_path):
    out = tmp_path / "out"
    out.mkdir()

    def away_and_back():
        out.rename(tmp_path / "old")
        (tmp_path / "old").rename(out)

    _stream_changing(device, [cv.npy_out(out / "y.npy")], away_and_back)
    np.testing.assert_array_equal(np.load(out / "y.npy"), _x() * 2)
    assert _parts(tmp_path) == []


def test_guard_a_folder_replaced_by_a_link_is_refused_leaving_both_folders_clean(
        device, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "B").mkdir()
    np.save(tmp_path / "B" / "y.npy", np.ones(3, np.float32))
    fds = len(os.listdir("/proc/self/fd"))

    def replace():
        out.rename(tmp_path / "old")
        os.symlink("B", out)

    with pytest.raises(cv.InputError, match="was moved or replaced"):
        _stream_changing(device, [cv.npy_out(out / "y.npy")], replace)
    assert _parts(tmp_path) == [] and sorted(os.listdir(tmp_path / "old")) == []
    np.testing.assert_array_equal(np.load(tmp_path / "B" / "y.npy"), np.ones(3, np.float32))
    assert len(os.listdir("/proc/self/fd")) == fds


def test_guard_a_relative_output_with_a_chdir_mid_stream_lands_where_it_was_named(
        device, tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    report = _stream_changing(device, ["y.npy"], lambda: os.chdir(tmp_path / "b"))
    assert report.outputs == [str(tmp_path / "a" / "y.npy")]
    np.testing.assert_array_equal(np.load(tmp_path / "a" / "y.npy"), _x() * 2)
    assert os.listdir(tmp_path / "b") == []
