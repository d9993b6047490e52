"""Round 4 of trying the command line, file inputs and outputs, and the Dask CLI as a user
and as an attacker would: each test is one finding, run on the real command (PoCL) or a real
LocalCluster, and fails without its fix."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv
from conveyor.cli import main
from conveyor.errors import InputError

SRC = str(Path(__file__).resolve().parents[1] / "src")

TWICE = """__kernel void twice(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}
"""


def _env() -> dict[str, str]:
    path = os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return dict(os.environ, PYTHONPATH=path)


def _command() -> list[str]:
    script = Path(sys.executable).with_name("conveyor")
    return [str(script)] if script.exists() else [sys.executable, "-m", "conveyor.cli"]


def conveyor(*argv, cwd: Path, prefix: tuple[str, ...] = (), **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, *_command(), *(str(a) for a in argv)], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=120, **kw)


@pytest.fixture
def work(tmp_path):
    """A kernel file and a float32 .npy input; the device is PoCL's first (OpenCL)."""
    opencl = [d for d in cv.devices() if d.backend == "opencl"]
    if not opencl:
        pytest.skip("no OpenCL device")
    (tmp_path / "k.cl").write_text(TWICE)
    np.save(tmp_path / "x.npy", np.arange(100, dtype=np.float32))
    return tmp_path, opencl[0].spec


def _map(tmp: Path, spec: str, *extra) -> list[str]:
    return ["map", str(tmp / "k.cl"), "--kernel", "twice", "--device", spec, "-q", *extra]


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip() and "RuntimeWarning" not in line
             and "dir_fd" not in line]
    assert "Traceback" not in err, err
    return lines[-1]


# -- dtypes NumPy parses as Python -----------------------------------------------------------
@pytest.mark.parametrize("option", ["--dtype", "--cast"])
def test_a_dtype_numpy_reads_as_python_is_a_usage_error(work, capsys, option):
    tmp, spec = work
    (tmp / "r.bin").write_bytes(bytes(400))
    given = ["-i", tmp / "r.bin", "--dtype", "f4,("] if option == "--dtype" else \
        ["-i", tmp / "x.npy", "--cast", "x:f4,("]
    code = main(_map(tmp, spec, *map(str, given), "-o", str(tmp / "y.npy")))
    assert code == 2
    assert "'f4,(' is not a NumPy dtype" in capsys.readouterr().err
    assert not (tmp / "y.npy").exists()


def test_npy_out_dtype_and_shape_are_checked(tmp_path):
    with pytest.raises(InputError, match="is not a NumPy dtype"):
        cv.npy_out(tmp_path / "y.npy", dtype="f4,(")
    with pytest.raises(InputError, match="is not a NumPy dtype"):
        cv.npy_out(tmp_path / "y.npy", dtype="floaty")
    with pytest.raises(InputError, match="is not a shape"):
        cv.npy_out(tmp_path / "y.npy", shape=(100.5,))  # was 100 rows, silently
    with pytest.raises(InputError, match="file path"):
        cv.npy_out(3)
    with pytest.raises(InputError, match="name a file"):
        cv.npy_out("")
    with pytest.raises(InputError, match="file path"):
        cv.npy(3)


# -- npy headers that lie --------------------------------------------------------------------
def _header_only(path: Path, shape: tuple[int, ...]) -> None:
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": shape})


def test_a_dimension_past_int64_is_refused(work, capsys):
    tmp, spec = work
    _header_only(tmp / "z.npy", (2**64, 0))  # zero bytes per row: the size matched
    assert main(_map(tmp, spec, "-i", str(tmp / "z.npy"), "-o", str(tmp / "y.npy"))) == 2
    assert "past 2**63 - 1" in capsys.readouterr().err
    (tmp / "e.bin").write_bytes(b"")
    code = main(_map(tmp, spec, "-i", str(tmp / "e.bin"), "--dtype", "float32", "--shape",
                     "99999999999999999999999,0", "-o", str(tmp / "y.npy")))
    assert code == 2
    assert "past 2**63 - 1" in capsys.readouterr().err
    assert not (tmp / "y.npy").exists()


def test_an_unknown_npy_version_is_named(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(10, dtype=np.float32))
    data = bytearray((tmp_path / "x.npy").read_bytes())
    data[6] = 4  # format 4.0: was read as 2.0, "expected 662372470 bytes"
    (tmp_path / "v4.npy").write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"format version 4\.0"):
        cv.npy(tmp_path / "v4.npy")


def test_an_unreadable_input_is_refused_before_any_work(work):
    tmp, spec = work
    (tmp / "r.bin").write_bytes(bytes(400))
    (tmp / "r.bin").chmod(0)
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:  # root reads anything: drop its capabilities for the child
        if shutil.which("setpriv") is None:
            pytest.skip("root, and no setpriv to drop its capabilities")
        prefix = ("setpriv", "--bounding-set=-all", "--inh-caps=-all")
    done = conveyor(*_map(tmp, spec, "-i", "r.bin", "--dtype", "float32", "-o", "y.npy"),
                    cwd=tmp, prefix=prefix)
    assert done.returncode == 2, done.stderr  # was 1, mid-stream, after the kernel's build
    assert "cannot read input file r.bin (Permission denied)" in _one_line(done.stderr)


# -- the command line ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_kernel_file_that_is_no_regular_file_is_refused(work, capsys, kind):
    tmp, spec = work
    if kind == "fifo":
        os.mkfifo(tmp / "k2.cl")  # blocked the command forever
    else:
        (tmp / "k2.cl").symlink_to("/dev/zero")  # read until MemoryError
    code = main(["map", str(tmp / "k2.cl"), "--kernel", "twice", "--device", spec, "-i",
                 str(tmp / "x.npy"), "-o", str(tmp / "y.npy")])
    assert code == 2
    assert "is not a regular file" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["demo", "bench"])
def test_mib_past_host_memory_is_a_usage_error(tmp_path, command):
    done = conveyor(command, "--mib", "99999999999999", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "give a smaller --mib" in _one_line(done.stderr)


def test_a_negative_size_says_so(work, capsys):
    tmp, spec = work
    with pytest.raises(SystemExit):
        main(_map(tmp, spec, "-i", str(tmp / "x.npy"), "-o", str(tmp / "y.npy"),
                  "--block-bytes=-4MiB"))
    assert "'-4MiB' is negative" in capsys.readouterr().err


def test_a_file_size_limit_gets_its_own_advice(work):
    tmp, spec = work
    np.save(tmp / "big.npy", np.zeros(1_000_000, np.float32))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    done = conveyor(*_map(tmp, spec, "-i", "big.npy", "-o", "y.npy"), cwd=tmp,
                    preexec_fn=limit)
    assert done.returncode == 1, done.stderr
    assert "ulimit -f" in _one_line(done.stderr)  # was "check the path and its permissions"
    assert sorted(p.name for p in tmp.iterdir()) == ["big.npy", "k.cl", "x.npy"]


def test_a_table_named_with_an_empty_column_asks_for_one(work, capsys):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    tmp, spec = work
    pq.write_table(pa.table({"x": np.arange(10, dtype=np.float32)}), tmp / "t.parquet")
    code = main(_map(tmp, spec, "-i", f"{tmp / 't.parquet'}:", "-o", str(tmp / "y.npy")))
    assert code == 2
    assert "say which column to read" in capsys.readouterr().err  # was "give --dtype"
    code = main(_map(tmp, spec, "-i", f"{tmp / 't.parquet'}:", "--column", "x", "-o",
                     str(tmp / "y.npy")))
    assert code == 0
    assert np.array_equal(np.load(tmp / "y.npy"), 2 * np.arange(10, dtype=np.float32))


# -- the command on a cluster ----------------------------------------------------------------
@pytest.mark.parametrize("address", ["garbage", "", "foo://host:1"])
def test_a_malformed_scheduler_address_is_a_usage_error(work, capsys, address):
    pytest.importorskip("distributed")
    tmp, spec = work
    code = main(_map(tmp, spec, "-i", str(tmp / "x.npy"), "-o", str(tmp / "y.npy"),
                     "--scheduler", address))
    assert code == 2  # was a ValueError traceback (or, for '', a local run)
    assert "is not a scheduler address" in capsys.readouterr().err


def test_table_inputs_on_a_cluster_are_refused_in_the_commands_terms(work, capsys):
    pytest.importorskip("distributed")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    tmp, spec = work
    pq.write_table(pa.table({"x": np.arange(10, dtype=np.float32)}), tmp / "t.parquet")
    code = main(_map(tmp, spec, "-i", f"{tmp / 't.parquet'}:x", "-o", str(tmp / "y.npy"),
                     "--cluster", "local"))
    assert code == 2
    err = capsys.readouterr().err
    assert "Parquet/Arrow inputs" in err and "map_blocks" not in err


def test_a_worker_failure_on_the_local_cluster_is_one_line(work):
    pytest.importorskip("distributed")
    tmp, spec = work
    np.save(tmp / "be.npy", np.arange(100, dtype=">f4"))
    done = conveyor(*_map(tmp, spec, "-i", "be.npy", "-o", "y.npy", "--cluster", "local"),
                    cwd=tmp)
    assert done.returncode == 2, done.stderr
    # Was preceded by the workers' "Compute Failed" logs, each with a task traceback.
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "byte order" in lines[0], done.stderr
    assert not (tmp / "y.npy").exists()
    assert not list(tmp.glob(".y.npy.*"))


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_two_columns_of_one_name_are_refused_by_name(tmp_path, kind):
    pyarrow = pytest.importorskip("pyarrow")
    table = pyarrow.Table.from_arrays([pyarrow.array([1.0, 2.0]), pyarrow.array([3.0, 4.0])],
                                      names=["x", "x"])
    path = tmp_path / f"dup.{kind}"
    if kind == "parquet":
        pytest.importorskip("pyarrow.parquet").write_table(table, path)
        opener = cv.parquet
    else:
        pytest.importorskip("pyarrow.feather").write_feather(table, path)
        opener = cv.arrow
    with pytest.raises(cv.InputError, match="2 columns named 'x'"):
        opener(path, "x")


def test_a_negative_block_size_is_refused_where_it_is_given():
    from conveyor.pipeline.options import StreamOptions

    with pytest.raises(cv.InputError, match="block_bytes=-1 is negative"):
        StreamOptions.parse(block_bytes=-1)
