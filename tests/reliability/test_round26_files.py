"""Round twenty-six, helper C: a review of files in and out (pipeline/io.py, sinks.py,
ipcfile.py, staging.py, staged.py, files.py, cli/files.py, inputs.py, streaming.py,
commands.py), tried as users and attackers would.

Fuzzed against NumPy and PyArrow first (scripts under /tmp, not kept): .npy inputs of format
1.0, 2.0 and 3.0, raw inputs at byte offsets, Fortran-ordered (N, 1) files, five dtypes, 1-D
to 3-D rows, halos of 0-3, block sizes down to one row, one and two devices, into .npy, raw
and array outputs and in place (the input's own path); in-place streams of an .npy read
through a memmap of its own file, through a hard link, a symlink, /proc/self/fd/N and a raw
view at the header's offset; Parquet and Arrow columns that are dictionary-encoded, bool,
uint64/int64 past 2**53, several columns chunked differently, row groups of one row; and
``conveyor map``/``reduce`` with npy, raw, Parquet and Arrow inputs, ``--cast``, ``--halo``,
two outputs, in place, ``--json``, ``-q``, ``--trace``, ``--block-bytes`` and two devices.
All exact. What was found is below, each a strict xfail asserting the right behaviour, seen
failing on the code before its fix, and a plain test since:

- a rewrite in place mid-stream goes unseen when another stream of the same ``cv.npy``
  object ends meanwhile (the file is closed, reopened and stamped afresh: mixed rows);
- it goes unseen too while the program holds any ``mmap_mode="r+"`` map of the file;
- a Ctrl-C between two outputs' renames leaves one new and one old, and says none was
  written (one output: written, and said not to be);
- a FIFO put in an input's place after ``cv.npy()`` hangs the stream in ``open()``;
- a file output of a sub-array dtype fails mid-stream with a bare ValueError;
- ``conveyor map -o y.npy --force``, y.npy a link to a header the kernel includes, replaces
  the header.

Also found, not deterministic as the helper ran it: streams in two threads over one
``cv.parquet`` object (or one given twice to a stream over two devices) read one
``pq.ParquetFile`` at once: hangs inside PyArrow, segfaults, and false "is damaged ... write
the file again" errors (7 hangs and 2 segfaults in 12 runs of the helper's script; 12 clean
runs after the fix). The test at the end checks the fix deterministically: no two loads of
one source ever run at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import first_device_only, kernel, opencl_c_only  # noqa: E402, F401

import conveyor as cv  # noqa: E402
from conveyor.errors import outputs_written  # noqa: E402

TWO_OUT = """__kernel void two_out(__global const float *x, __global float *y,
                                  __global float *z, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { y[i] = x[i] * 2.0f; z[i] = x[i] * 3.0f; }
}"""


def _rewrite_in_place(path: Path, values: np.ndarray) -> None:
    """Write ``values`` over the data of the .npy at ``path`` (same size, same header), as
    another program would, and move its modification time a second on (past any timestamp
    tick: the README's one blind spot)."""
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - values.nbytes)
        f.write(values.tobytes())
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


@pytest.mark.filterwarnings("ignore::conveyor.hazards.HazardWarning")
def test_a_rewrite_mid_stream_is_seen_when_another_stream_of_the_input_ends(device, tmp_path):
    """README: one cv.npy object may feed several streams at once, in several threads, and
    an input written over in place while it is read is an InputError ("changed while it was
    read"). Stream B pauses after its second block while stream A (another thread, same
    object) runs to its end, then another program rewrites the file; B must not go on
    reading the new rows after the old ones. Without A's stream in between, B raises."""
    path = tmp_path / "x.npy"
    x = np.arange(1000, dtype=np.float32)
    np.save(path, x)
    source = cv.npy(path)
    copy = kernel(device, "scale")
    paused, go_on = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def other() -> None:
        try:
            assert paused.wait(60)
            cv.stream(copy, [source], [np.float32], device=device, args=(1.0,),
                      block_bytes=400)
            _rewrite_in_place(path, -x)
        except BaseException as exc:  # reported by the test's thread
            failures.append(exc)
        finally:
            go_on.set()

    def pausing(a: Any, b: Any, *, queue: Any, offset: int, n: int) -> Any:
        if offset == 100:
            paused.set()
            assert go_on.wait(60)
        return a

    thread = threading.Thread(target=other)
    thread.start()
    try:
        with pytest.raises(cv.InputError, match="changed while it was read"):
            cv.stream(pausing, [source], [np.float32], device=device, block_bytes=400,
                      warmup=False)
    finally:
        paused.set()
        thread.join()
    assert not failures


@pytest.mark.parametrize("outputs", [1, 2])
def test_a_ctrl_c_while_outputs_are_renamed_leaves_all_or_says_so(device, tmp_path, outputs):
    """README: a failed or interrupted run leaves no partial output, and the command says
    "interrupted; no output was written" unless the outputs were written. A Ctrl-C that
    lands just after the first output's rename (a real SIGINT, raised at the point where
    CPython runs handlers) must leave either every old file or every new one, and when the
    new ones are there the interrupt must say so (``outputs_written``), as one after the
    commit does. Today the first output is new, the second old, and nothing says so."""
    opencl_c_only(device)
    k = device.compile(TWO_OUT, "two_out")
    x = np.arange(100, dtype=np.float32)
    paths = [tmp_path / "y.npy", tmp_path / "z.npy"]
    for p in paths:
        np.save(p, np.zeros(3, np.float32))
    outs: list[Any] = [str(paths[0]), str(paths[1]) if outputs == 2 else np.float32]

    def shot(frame: Any, event: str, arg: Any) -> None:
        if event == "c_return" and arg is os.replace:
            sys.setprofile(None)
            signal.raise_signal(signal.SIGINT)

    sys.setprofile(shot)
    try:
        cv.stream(k, [x], outs, device=device)
    except KeyboardInterrupt as exc:
        told = outputs_written(exc)
    else:
        told = True
    finally:
        sys.setprofile(None)
    new = [np.load(p).shape == (100,) for p in paths[:outputs]]
    assert all(new) or not any(new), f"outputs replaced: {new}"
    assert told == all(new), "the interrupt must say whether the outputs were written"


class _Hung(Exception):
    """Raised by the alarm that ends a blocked call (a hang made a failure)."""


def test_an_input_replaced_by_a_fifo_is_refused_not_waited_on(device, tmp_path):
    """README: an input that is no regular file is refused at once, and one whose size
    changed since the input was made is an InputError. Each stream opens the file again by
    path (the command line opens its inputs before it builds the kernel; a Dask worker
    opens the client's path), so a FIFO planted there meanwhile must be refused, not opened
    for reading (which waits for a writer that never comes). An alarm ends the wait."""
    path = tmp_path / "x.npy"
    np.save(path, np.arange(10, dtype=np.float32))
    source = cv.npy(path)
    copy = kernel(device, "scale")
    path.unlink()
    os.mkfifo(path)

    def hung(signum: int, frame: Any) -> None:
        raise _Hung

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        with pytest.raises(cv.InputError):
            cv.stream(copy, [source], [np.float32], device=device, args=(1.0,))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_file_output_of_a_sub_array_dtype_is_rows_of_its_elements_or_refused(device,
                                                                               tmp_path):
    """``cv.npy_out(path, dtype=np.dtype((np.float32, (2,))))``: NumPy makes such a dtype
    rows of 2 float32 (``np.empty(5, that).shape == (5, 2)``), and cv.npy reads an .npy
    header of one as such rows. Streamed from a callable, the output must be written as
    (rows, 2) float32, or refused with an InputError before any work; today the stream
    fails at the first block's copy-out with "Changing the dtype to a subarray type is only
    supported if the total itemsize is unchanged"."""
    x = np.arange(10, dtype=np.float32)
    path = tmp_path / "y.npy"

    def nothing(a: Any, b: Any, *, queue: Any, offset: int, n: int) -> None:
        return None  # its output array (of a broken shape today) is left as it is

    try:
        cv.stream(nothing, [x], [cv.npy_out(path, dtype=np.dtype((np.float32, (2,))))],
                  device=device, warmup=False)
    except cv.InputError:
        return
    y = np.load(path)
    assert y.dtype == np.float32 and y.shape == (10, 2)


def test_the_command_never_writes_a_header_it_reads_through_an_output_link(
        device, tmp_path, monkeypatch, capsys):
    """README: a file the command reads is never written, even with --force and through a
    link (the kernel file, an -i input; round twenty-one added the headers it includes, for
    --trace and --plot). ``-o y.npy`` where y.npy links to ``inc/defs.h``, which k.cl
    includes, must exit 2 naming both; today it exits 0 and defs.h holds the .npy."""
    from conveyor.cli import main

    if device.backend != "opencl":
        pytest.skip("an OpenCL C kernel file")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inc").mkdir()
    header = tmp_path / "inc" / "defs.h"
    header.write_text("#define K 2.0f\n")
    (tmp_path / "k.cl").write_text(
        '#include "inc/defs.h"\n__kernel void sc(__global const float *x, __global float *y,'
        ' ulong offset, ulong n) { ulong i = get_global_id(0); if (i < n) y[i] = x[i] * K; }\n')
    np.save(tmp_path / "x.npy", np.arange(8, dtype=np.float32))
    (tmp_path / "y.npy").symlink_to("inc/defs.h")
    code = main(["map", "k.cl", "--kernel", "sc", "-i", "x.npy", "-o", "y.npy", "--force",
                 "-q", "--device", device.spec])
    err = capsys.readouterr().err
    assert header.read_bytes() == b"#define K 2.0f\n", "the header was replaced"
    assert code == 2 and "defs.h" in err


def test_a_writable_map_held_elsewhere_does_not_hide_a_rewrite_mid_stream(device, tmp_path):
    """README: an input written over in place while it is read is an InputError; only a
    memmap of the input written by its own in-place stream is not such a change. Here the
    program merely holds ``np.load(path, mmap_mode="r+")`` (given to no stream) while the
    file is rewritten in place by a plain write mid-stream: the stream must still raise,
    as it does when no map is held."""
    path = tmp_path / "x.npy"
    x = np.arange(1000, dtype=np.float32)
    np.save(path, x)
    held = np.load(path, mmap_mode="r+")  # noqa: F841 - held, never written

    def rewriting(a: Any, b: Any, *, queue: Any, offset: int, n: int) -> Any:
        if offset == 100:
            _rewrite_in_place(path, -x)
        return a

    with pytest.raises(cv.InputError, match="changed while it was read"):
        cv.stream(rewriting, [cv.npy(path)], [np.float32], device=device, block_bytes=400,
                  warmup=False)


@pytest.mark.usefixtures("first_device_only")
def test_two_streams_never_load_one_parquet_sources_chunks_at_once(device, tmp_path):
    """Two threads stream one ``cv.parquet`` object: its row groups are decoded one at a time
    (``ChunkedSource``'s lock). The first load waits (up to 1 s) for a second to enter beside
    it; with the lock none can, so the wait always runs out and the check cannot fail where
    the lock holds."""
    opencl_c_only(device)
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    x = np.arange(4000, dtype=np.float64)
    pq.write_table(pa.table({"x": x}), tmp_path / "c.parquet", row_group_size=500)
    source = cv.parquet(tmp_path / "c.parquet", "x")
    load = source._load
    inside, overlapped, second, waited = [0], [False], threading.Event(), [False]
    guard = threading.Lock()

    def watched(index: int) -> np.ndarray:
        with guard:
            inside[0] += 1
            if inside[0] > 1:
                overlapped[0] = True
                second.set()
            first, waited[0] = not waited[0], True
        if first:
            second.wait(1.0)  # a second load beside this one, if the source lets it in
        try:
            return load(index)
        finally:
            with guard:
                inside[0] -= 1

    source._load = watched
    k = device.compile(
        "__kernel void cp(__global const double *x, __global double *y, ulong offset, "
        "ulong n) { ulong i = get_global_id(0); if (i < n) y[i] = x[i]; }", "cp")
    results: list[Any] = [None, None]

    def run(slot: int) -> None:
        results[slot] = cv.stream(k, [source], [np.float64], device=device,
                                  block_bytes=4000).outputs[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not overlapped[0], "two row groups of one source were loaded at once"
    for got in results:
        np.testing.assert_array_equal(got, x)


@pytest.mark.usefixtures("first_device_only")
def test_an_npy_of_many_fields_written_by_np_save_is_read(device, tmp_path):
    """np.save writes a header past NumPy's default 10,000-byte limit for a record of 800
    fields; cv.npy said "is not a .npy file (... adjust max_header_size or allow_pickle ...):
    write it with np.save", which it was."""
    opencl_c_only(device)
    fields = np.dtype([(f"f{i}", "<f4") for i in range(800)])
    a = np.zeros(4, fields)
    a["f5"] = [1, 2, 3, 4]
    np.save(tmp_path / "r.npy", a)
    source = cv.npy(tmp_path / "r.npy")
    assert source.shape == (4,) and source.dtype == fields
    got = cv.stream(lambda x, y, *, queue, offset, n: y.set(
        x.get(queue=queue)["f5"].copy(), queue=queue), [source], [np.float32], device=device,
        warmup=False).outputs[0]
    np.testing.assert_array_equal(got, [1, 2, 3, 4])
