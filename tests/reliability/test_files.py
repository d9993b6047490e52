"""Files and outputs (issue 13, items 2, 7, 8, 9, 10 and 12): a file that shrinks while it is
read, the temporary file of a killed run, the mode of a replaced output, outputs that are
nodes, links, twice the same file or an input, side files (the trace) checked before the work,
and bad input files refused before any work with an error that names them."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # reliakit (and, through it, streamkit)
from reliakit import add_reference, data, kernel, to_host  # noqa: E402

import conveyor as cv  # noqa: E402

ROWS = 40_000
CHUNK = 2500  # rows per Parquet row group / Arrow record batch
SRC = HERE.parents[1] / "src"


def _parts(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".part"))


def _child_env() -> dict[str, str]:
    path = os.pathsep.join([str(SRC), str(HERE.parent / "pipeline"),
                            os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path.rstrip(os.pathsep))


def _input_file(folder: Path, kind: str):
    """(path, source maker) of ROWS float32 values stored as ``kind``."""
    x = np.arange(ROWS, dtype=np.float32)
    if kind in ("parquet", "arrow"):
        pa = pytest.importorskip("pyarrow", reason="Parquet/Arrow need pyarrow")
        import pyarrow.feather as feather
        import pyarrow.parquet as pq

        path = folder / f"x.{kind}"
        if kind == "parquet":
            pq.write_table(pa.table({"x": x}), path, row_group_size=CHUNK)
            return path, lambda: cv.parquet(path, "x")
        # Uncompressed: batches then stay in the file (a memory map's pages) until read.
        feather.write_feather(pa.table({"x": x}), path, chunksize=CHUNK,
                              compression="uncompressed")
        return path, lambda: cv.arrow(path, "x")
    if kind == "npy":
        path = folder / "x.npy"
        np.save(path, x)
        return path, lambda: cv.npy(path)
    path = folder / "x.bin"
    x.tofile(path)
    return path, lambda: cv.raw(path, np.float32)


def _shrinking(path: Path):
    """A callable compute that cuts ``path`` to a tenth of its size at the second block."""
    size = path.stat().st_size

    def compute(x, y, *, queue, offset, n):
        if offset > 0 and path.stat().st_size == size:
            os.truncate(path, size // 10)

    return compute


# -- item 2: a file that shrinks while it is read -----------------------------------------
@pytest.mark.parametrize("kind", ["npy", "raw", "parquet"])
def test_an_input_that_shrinks_mid_stream_is_an_input_error(device, tmp_path, kind):
    path, make = _input_file(tmp_path, kind)
    out = tmp_path / "y.npy"
    with pytest.raises(cv.InputError, match=f"{path.name} got shorter while it was read"):
        cv.stream(_shrinking(path), [make()], [cv.npy_out(out, np.float32)], device=device,
                  block_bytes=4 * 1000)
    assert not out.exists() and _parts(tmp_path) == []


CHILD_SHRINK = """
import sys
from pathlib import Path
import numpy as np
import conveyor as cv
from test_files import _input_file, _parts, _shrinking
folder = Path(sys.argv[2])
path, make = _input_file(folder, "arrow")
try:
    cv.stream(_shrinking(path), [make()], [cv.npy_out(folder / "y.npy", np.float32)],
              device=cv.device(sys.argv[1]), block_bytes=4 * 1000)
except cv.InputError as exc:
    print("InputError:", exc, _parts(folder), (folder / "y.npy").exists())
"""


def test_an_arrow_file_that_shrinks_mid_stream_is_an_input_error_not_sigbus(device, tmp_path):
    # In a child: a memory-mapped read past the new end kills the process with SIGBUS.
    done = subprocess.run([sys.executable, "-c", CHILD_SHRINK, device.spec, str(tmp_path)],
                          cwd=HERE, env=_child_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "x.arrow got shorter while it was read" in done.stdout, done.stdout
    assert done.stdout.rstrip().endswith("[] False"), done.stdout  # no .part, no output


# -- item 7: the temporary file of a killed run -------------------------------------------
CHILD_KILLED = """
import os, signal, sys
import numpy as np
import conveyor as cv
sink = cv.npy_out(sys.argv[1], np.float32, (1_000_000,))
sink.open()  # the run's full-size .part exists and is being written ...
os.kill(os.getpid(), signal.SIGKILL)  # ... when the run is killed
"""


def test_the_part_of_a_killed_run_is_removed_by_the_next_run(device, tmp_path):
    target = tmp_path / "c.npy"
    done = subprocess.run([sys.executable, "-c", CHILD_KILLED, str(target)], env=_child_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    (stale,) = _parts(tmp_path)
    assert (tmp_path / stale).stat().st_size > 4_000_000
    a, b = data((1000,), np.float32, 1), data((1000,), np.float32, 2)
    with pytest.warns(RuntimeWarning, match=f"removed .*{stale}.* that did not finish"):
        cv.stream(kernel(device, "add"), [a, b], [str(target)], device=device)
    assert _parts(tmp_path) == []
    np.testing.assert_array_equal(np.load(target), add_reference(a, b))


def test_the_part_of_a_run_still_writing_is_left_alone(device, tmp_path):
    target = tmp_path / "c.npy"
    other = cv.npy_out(target, np.float32, (10,))
    other.open()  # a live writer: it holds the lock on its part
    try:
        a, b = data((1000,), np.float32, 1), data((1000,), np.float32, 2)
        cv.stream(kernel(device, "add"), [a, b], [str(target)], device=device)
        assert len(_parts(tmp_path)) == 1  # the other run's part is still there
    finally:
        other.abort()
    assert _parts(tmp_path) == []


def test_parts_of_another_target_are_not_touched(tmp_path):
    (tmp_path / ".c.npy.x.abcdefgh.part").write_bytes(b"1")  # a part of c.npy.x, not c.npy
    sink = cv.npy_out(tmp_path / "c.npy", np.float32, (4,))
    sink.open()
    sink.abort()
    assert _parts(tmp_path) == [".c.npy.x.abcdefgh.part"]


def test_atomic_writes_of_side_files_remove_stale_parts_too(tmp_path):
    from conveyor.files import atomic_write

    (tmp_path / ".run.json.abcdefgh.part").write_text("{half")  # a killed trace write
    with pytest.warns(RuntimeWarning, match="removed .*run.json.abcdefgh.part"):
        atomic_write(tmp_path / "run.json", lambda handle: handle.write("{}"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


# -- item 8: the mode of a replaced output ------------------------------------------------
@pytest.mark.parametrize("mode", [0o600, 0o640, 0o664], ids=oct)
def test_overwriting_an_output_keeps_its_mode(device, tmp_path, mode):
    target = tmp_path / "c.npy"
    np.save(target, np.zeros(3))
    os.chmod(target, mode)
    a, b = data((1000,), np.float32, 1), data((1000,), np.float32, 2)
    cv.stream(kernel(device, "add"), [a, b], [str(target)], device=device)
    assert stat.S_IMODE(target.stat().st_mode) == mode
    np.testing.assert_array_equal(np.load(target), add_reference(a, b))


def test_a_new_output_gets_the_umask_mode(device, tmp_path):
    target = tmp_path / "c.npy"
    old = os.umask(0o027)
    try:
        cv.stream(kernel(device, "add"), [np.ones(10, np.float32)] * 2, [str(target)],
                  device=device)
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_a_trace_keeps_the_mode_of_the_file_it_replaces(device, tmp_path):
    trace = tmp_path / "run.json"
    trace.write_text("{}")
    os.chmod(trace, 0o640)
    cv.stream(kernel(device, "add"), [np.ones(10, np.float32)] * 2, [np.float32],
              device=device, trace=str(trace))
    assert stat.S_IMODE(trace.stat().st_mode) == 0o640 and "traceEvents" in trace.read_text()


# -- item 9: outputs that are nodes, links, one file twice, or an input -------------------
def test_an_output_onto_a_fifo_is_refused(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(cv.InputError, match="is a FIFO: name a regular file"):
        cv.raw_out(fifo, np.float32)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_node_put_in_the_outputs_place_during_the_run_is_not_replaced(tmp_path):
    target = tmp_path / "y.bin"
    sink = cv.raw_out(target, np.float32, (4,))
    sink.open()
    os.mkfifo(target)
    with pytest.raises(cv.InputError, match="is a FIFO"):
        sink.commit()
    sink.abort()
    assert stat.S_ISFIFO(os.lstat(target).st_mode) and _parts(tmp_path) == []


def test_an_output_through_a_symlink_to_a_device_node_is_refused(tmp_path):
    link = tmp_path / "null.bin"
    link.symlink_to(os.devnull)
    with pytest.raises(cv.InputError, match="is a character device .*through the symlink"):
        cv.raw_out(link, np.float32)
    assert link.is_symlink() and stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_dev_null_itself_is_refused():
    # Refused when the sink is made: as root, committing would replace the system's /dev/null.
    with pytest.raises(cv.InputError, match="is a character device"):
        cv.raw_out(os.devnull, np.float32)
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_an_output_that_is_a_symlink_is_written_through(device, tmp_path):
    (tmp_path / "disk").mkdir()
    real = tmp_path / "disk" / "c.npy"
    np.save(real, np.zeros(3))
    link = tmp_path / "c.npy"
    link.symlink_to(real)
    a, b = data((1000,), np.float32, 1), data((1000,), np.float32, 2)
    report = cv.stream(kernel(device, "add"), [a, b], [str(link)], device=device)
    assert report.outputs == [str(link)] and link.is_symlink()
    np.testing.assert_array_equal(np.load(real), add_reference(a, b))
    assert _parts(tmp_path / "disk") == [] and _parts(tmp_path) == []


def test_a_dangling_symlink_output_creates_its_target(device, tmp_path):
    real = tmp_path / "new.npy"
    link = tmp_path / "c.npy"
    link.symlink_to(real)
    cv.stream(kernel(device, "add"), [np.ones(10, np.float32)] * 2, [str(link)],
              device=device)
    ones = np.ones(10, np.float32)
    assert link.is_symlink() and np.array_equal(np.load(real), add_reference(ones, ones))


def test_two_outputs_naming_one_file_are_refused(device, tmp_path):
    (tmp_path / "sub").mkdir()
    x = np.ones(10, np.float32)

    def two(a, y, z, *, queue, offset, n):
        raise AssertionError("no block may run")

    for second in (str(tmp_path / "sub" / ".." / "c.npy"), cv.npy_out(tmp_path / "c.npy")):
        with pytest.raises(cv.InputError, match="are one file"):
            cv.stream(two, [x], [str(tmp_path / "c.npy"), second], device=device)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub"]


def test_two_outputs_through_a_hard_link_are_refused(device, tmp_path):
    np.save(tmp_path / "c.npy", np.zeros(3))
    os.link(tmp_path / "c.npy", tmp_path / "d.npy")
    with pytest.raises(cv.InputError, match="are one file"):
        cv.stream(lambda *a, **k: None, [np.ones(10, np.float32)],
                  [str(tmp_path / "c.npy"), str(tmp_path / "d.npy")], device=device)


@pytest.mark.parametrize("kind", ["npy", "raw"])
def test_an_output_that_is_its_own_input_is_right(device, tmp_path, kind):
    # The input keeps reading the old file; the output replaces it only at the end.
    x = data((50_000,), np.float32, 3)
    path = tmp_path / f"x.{kind}"
    if kind == "npy":
        np.save(path, x)
        source, sink = str(path), str(path)
    else:
        x.tofile(path)
        source, sink = cv.raw(path, np.float32), cv.raw_out(path)
    cv.stream(kernel(device, "scale"), [source], [sink], device=device, args=(3.0,),
              block_bytes=4 * 1000)
    got = np.load(path) if kind == "npy" else np.fromfile(path, np.float32)
    np.testing.assert_array_equal(got, x * np.float32(3.0))
    assert _parts(tmp_path) == []


# -- item 10: side files checked before the work ------------------------------------------
def test_a_trace_into_a_missing_folder_fails_before_any_work(device, tmp_path):
    out = tmp_path / "c.npy"
    ran = []

    def compute(a, b, c, *, queue, offset, n):
        ran.append(offset)

    with pytest.raises(cv.InputError, match="trace=.*folder .*missing.* does not exist"):
        cv.stream(compute, [np.ones(10, np.float32)] * 2, [str(out)], device=device,
                  trace=str(tmp_path / "missing" / "run.json"))
    assert ran == [] and not out.exists() and _parts(tmp_path) == []


def test_a_trace_onto_a_folder_fails_before_any_work(device, tmp_path):
    with pytest.raises(cv.InputError, match="is a folder"):
        cv.stream(lambda *a, **k: None, [np.ones(10, np.float32)], device=device,
                  trace=str(tmp_path))


def test_a_trace_that_fails_after_the_work_keeps_the_result(device, tmp_path):
    # The trace's folder disappears during the stream: the reduce's result is still returned.
    folder = tmp_path / "traces"
    folder.mkdir()
    x = np.arange(10_000, dtype=np.int32)

    def partial(a, *, queue, offset, n):
        if folder.exists():
            folder.rmdir()
        return int(to_host(a, queue).astype(np.int64).sum())

    with pytest.warns(RuntimeWarning, match="was not written"):
        report = cv.stream(partial, [x], device=device, reduce="sum", block_bytes=4 * 1000,
                           trace=str(folder / "run.json"))
    assert int(report.result) == int(x.astype(np.int64).sum())


# -- item 12: bad input files refused before any work, naming the file --------------------
def test_npy_with_a_negative_shape_names_the_file(tmp_path):
    path = tmp_path / "neg.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": (-2,)})
    with pytest.raises(cv.InputError, match="neg.npy has a header with a negative shape"):
        cv.npy(path)


def test_raw_with_a_negative_row_count_other_than_minus_one_is_refused(tmp_path):
    path = tmp_path / "x.bin"
    np.zeros(12, np.float32).tofile(path)
    with pytest.raises(cv.InputError, match="x.bin: shape .* may have -1 only for axis 0"):
        cv.raw(path, np.float32, (-5, 3))


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_nulls_in_a_later_chunk_are_refused_before_any_work(tmp_path, kind):
    pa = pytest.importorskip("pyarrow", reason="Parquet/Arrow need pyarrow")
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    values = [float(i) for i in range(ROWS)]
    values[-5] = None  # only in the last row group / record batch
    table = pa.table({"name": [str(i) for i in range(ROWS)],
                      "x": pa.array(values, pa.float32())})
    path = tmp_path / f"x.{kind}"
    if kind == "parquet":
        pq.write_table(table, path, row_group_size=CHUNK)
        source = cv.parquet
        where = f"row group {ROWS // CHUNK - 1}"
    else:
        feather.write_feather(table, path, chunksize=CHUNK)
        source = cv.arrow
        where = f"record batch {ROWS // CHUNK - 1}"
    with pytest.raises(cv.InputError, match=rf"'x' of .*x\.{kind} has 1 nulls \({where}\)"):
        source(path, "x")


def test_a_big_endian_input_to_a_callable_is_refused_before_any_work(device):
    x = np.arange(100, dtype=">f4")
    ran = []
    with pytest.raises(cv.InputError, match=r"input 0 .*>f4.*a\.astype\(a\.dtype\."
                                            r"newbyteorder\('='\)\)"):
        cv.stream(lambda a, b, **k: ran.append(1), [x], [np.float32], device=device)
    with pytest.raises(cv.InputError, match=r"output 0 .*>f4"):
        cv.stream(lambda a, b, **k: ran.append(1), [x.astype("<f4")],
                  [np.zeros(100, ">f4")], device=device)
    assert ran == []


def test_a_big_endian_npy_file_to_a_callable_names_the_file(device, tmp_path):
    path = tmp_path / "big.npy"
    np.save(path, np.arange(100, dtype=">i4"))
    with pytest.raises(cv.InputError, match=r"input 0 \(.*big\.npy\) has dtype >i4"):
        cv.stream(lambda a, b, **k: None, [str(path)], [np.int32], device=device)


def test_a_big_endian_array_converted_as_the_error_says_streams(device):
    x = np.arange(1000, dtype=">f4")
    native = x.astype(x.dtype.newbyteorder("="))
    report = cv.stream(kernel(device, "scale"), [native], [np.float32], device=device,
                       args=(2.0,))
    np.testing.assert_array_equal(report.outputs[0], np.arange(1000, dtype=np.float32) * 2)


@pytest.mark.parametrize("which", ["output", "input"])
def test_a_trace_naming_a_file_of_the_stream_is_refused_before_any_work(device, tmp_path,
                                                                         which):
    # Found in review: trace= equal to an output left the output holding the trace's JSON.
    a, b = data((1000,), np.float32, 1), data((1000,), np.float32, 2)
    source = tmp_path / "a.npy"
    np.save(source, a)
    target = tmp_path / "c.npy"
    trace = source if which == "input" else target
    with pytest.raises(cv.InputError, match="same file as"):
        cv.stream(kernel(device, "add"), [str(source), b], [cv.npy_out(target)],
                  device=device, trace=str(trace))
    assert np.array_equal(np.load(source), a)
    assert not target.exists()
