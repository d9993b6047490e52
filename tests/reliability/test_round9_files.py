"""The ninth round: files, the command line and the Dask side, tried as a demanding user and
as an attacker would. Each test is one finding, on real PoCL kernels, real files and (for
Dask) a real in-process ``LocalCluster``, and fails without its fix, except the guards named
as such.

- An input file rewritten in place while a stream read it (``np.save`` over it from another
  thread or program, or a truncate that grew back) gave a mix of old rows, new rows and zeros
  with no error: only a read past the new end was noticed. Every read now checks the open
  file's size and modification time against those it had when opened: an InputError that
  says the file changed while it was read (a write through this process's own shared
  mapping, an in-place stream, still passes).
- A ``.npy`` whose v2/v3 header length field claims 4 GiB made NumPy allocate them before
  finding the file ends: a bare ``MemoryError`` under a memory limit. The field is checked
  against the file's size first.
- A ``.npy`` whose header descr is a sub-array dtype (``('<f4', (2,))``, shape ``(5,)``)
  failed mid-stream with a bare ``ValueError: rows of shape (5,) do not fit into (5, 2)``; it
  now streams as 5 rows of 2 float32, which is what its bytes are.
- ``conveyor.dask.stream(k, [x], ["c.npy", "sub/../c.npy"])`` renamed both parts over one
  file and reported two outputs: output 0 was lost with no error (``cv.stream`` refuses it).
  Refused now, before any part is made.
- A Dask worker opened the input files by path, with no check that they were still the
  files the client read the shape and dtype from: a file replaced meanwhile (a range run
  again after its worker died, minutes later) was read as the old dtype, no error. Workers
  now check the size and header the client saw.
- ``conveyor.dask.map_blocks(..., dtype="f4,(")`` raised a bare ``SyntaxError``; an input
  with chunks of unknown length along axis 1 (``m[:, mask]``) a bare dask ``ValueError``;
  ``dtype=object`` and object inputs were refused only inside every chunk on the workers
  at ``compute()``, one logged traceback each. All are InputErrors on the client now.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv
from conveyor.cli import main
from conveyor.errors import InputError
from conveyor.kernels.portable import portable

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import compiled  # noqa: E402

SRC = str(Path(cv.__file__).resolve().parents[1])  # the conveyor under test, for children

TWICE = """__kernel void twice(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}
"""

ADD = """__kernel void add(__global const float *x, __global const float *z, __global float *y,
                  ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + z[i];
}
"""

TWO = """__kernel void two(__global const float *x, __global float *y, __global float *z,
                  ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { y[i] = 2.0f * x[i]; z[i] = 3.0f * x[i]; }
}
"""

_kernel = compiled  # reliakit: built once per device, source and name


def _leftovers(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith((".part", ".new")))


# -- an input file rewritten while it is read -------------------------------------------------
@pytest.mark.parametrize("how", ["written over in place", "np.save over it",
                                 "truncated and grown back"])
def test_an_input_rewritten_while_it_is_read_is_an_input_error(device, tmp_path, how):
    n, rows_per_block = 25_000, 1000
    path = tmp_path / "x.npy"
    np.save(path, np.ones(n, np.float32))
    # Written a minute ago: the kernel stamps times in ticks of a few ms, and a rewrite in
    # the tick of the first write leaves the modification time as it was (not detectable).
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns - 60 * 10**9))

    def zeros_that_rewrite_x_at_block_3():
        for block in range(n // rows_per_block):
            if block == 3:  # the engine asks for block 3's rows: later file reads come after
                if how == "written over in place":  # never shorter: no read can fail
                    with open(path, "r+b") as f:
                        f.seek(128)
                        f.write(np.full(n, 7, np.float32).tobytes())
                elif how == "np.save over it":
                    np.save(path, np.full(n, 7, np.float32))  # same shape, other values
                else:
                    size = path.stat().st_size
                    os.truncate(path, 200)
                    os.truncate(path, size)  # zeros where the rows were
            yield np.zeros(rows_per_block, np.float32)

    out = tmp_path / "y.npy"
    # A staging read that lands while the file is short (np.save truncates it first) fails
    # as it did before; the others see the change.
    expected = "changed" if how == "written over in place" else "(changed|got shorter)"
    with pytest.raises(InputError, match=f"{expected} while it was read"):
        # Before: no error, and y held 1s, then 7s (or 0s) from a block on.
        cv.stream(_kernel(device, ADD, "add"),
                  [str(path), cv.iterate(zeros_that_rewrite_x_at_block_3(), length=n)],
                  [str(out)], device=device, block_bytes=4 * rows_per_block)
    assert not out.exists()
    assert _leftovers(tmp_path) == []


# -- .npy headers that lie ---------------------------------------------------------------------
def test_an_npy_header_length_past_the_file_end_is_refused_before_numpy_reads_it(tmp_path):
    path = tmp_path / "h.npy"
    path.write_bytes(b"\x93NUMPY\x02\x00" + (2**32 - 1).to_bytes(4, "little")
                     + b"{'descr': '<f4', ")
    script = textwrap.dedent(f"""
        import resource
        import conveyor as cv
        from conveyor.errors import InputError
        # What this process holds now, and 1 GiB more: not the 4 GiB the header claims.
        with open("/proc/self/statm") as f:
            held = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (held + (1 << 30), resource.RLIM_INFINITY))
        try:
            cv.npy({str(path)!r})
        except InputError as exc:
            print("InputError:", exc)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=env)
    assert "MemoryError" not in done.stderr, done.stderr  # before: a bare MemoryError
    assert done.returncode == 0, done.stderr
    assert "InputError:" in done.stdout and "past the file's end" in done.stdout, done.stdout


def test_an_npy_of_a_sub_array_dtype_streams_as_rows_of_its_elements(device, tmp_path):
    x = np.arange(10, dtype=np.float32)
    path = tmp_path / "sub.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": ("<f4", (2,)), "fortran_order": False, "shape": (5,)})
        f.write(x.tobytes())
    # Before: ValueError: rows of shape (5,) do not fit into (5, 2), mid-stream.
    report = cv.stream(_kernel(device, TWICE, "twice"), [str(path)], [np.float32],
                       device=device)
    np.testing.assert_array_equal(report.outputs[0], 2 * x.reshape(5, 2))


# -- the command line --------------------------------------------------------------------
def test_guard_kernel_files_named_like_options_and_paths_with_newlines(device, tmp_path,
                                                                       monkeypatch, capsys):
    # Guard (already right): "--" before a kernel file named "-k.cl", and an input and an
    # output whose names hold a newline and non-ASCII letters.
    if device.backend != "opencl":
        pytest.skip("the command's .cl kernels run on OpenCL")
    monkeypatch.chdir(tmp_path)
    Path("-k.cl").write_text(TWICE)
    x = np.arange(10, dtype=np.float32)
    np.save("in é\nput.npy", x)
    code = main(["map", "--kernel", "twice", "-i", "in é\nput.npy", "-o", "out é\n.npy",
                 "--device", device.spec, "-q", "--", "-k.cl"])
    assert code == 0, capsys.readouterr().err
    np.testing.assert_array_equal(np.load("out é\n.npy"), 2 * x)
    assert sorted(os.listdir(".")) == ["-k.cl", "in é\nput.npy", "out é\n.npy"]


# -- Dask ------------------------------------------------------------------------------------
@pytest.fixture
def cluster_client():
    """One in-process worker (starts in well under a second); always closed."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                       dashboard_address=":0", silence_logs=50)
    with cluster, distributed.Client(cluster) as client:
        yield client


def test_two_outputs_of_a_dask_file_stream_naming_one_file_are_refused(device, tmp_path,
                                                                      cluster_client):
    import conveyor.dask as cvd

    (tmp_path / "sub").mkdir()
    np.save(tmp_path / "x.npy", np.arange(100, dtype=np.float32))
    compute = cvd.kernel(portable(TWO), "two")
    with pytest.raises(InputError, match="are one file"):
        # Before: both parts renamed over c.npy, reported as two outputs: output 0 lost.
        cvd.stream(compute, [str(tmp_path / "x.npy")],
                   [str(tmp_path / "c.npy"), str(tmp_path / "sub" / ".." / "c.npy")],
                   client=cluster_client, device=device.spec)
    assert sorted(os.listdir(tmp_path)) == ["sub", "x.npy"]


def test_a_dask_worker_refuses_an_input_replaced_since_the_client_read_it(device, tmp_path):
    pytest.importorskip("distributed")
    from conveyor.dask.files import _source_ref, _stream_range
    from conveyor.dask.worker import as_job, kernel

    path = tmp_path / "x.npy"
    np.save(path, np.arange(1000, dtype=np.float32))
    source = cv.npy(path)
    refs = [_source_ref(source, 0)]  # what the client sends each worker
    source.close()
    np.save(path, np.arange(1000, dtype=np.int32))  # same size, another dtype
    job = as_job(kernel(portable(TWICE), "twice"), device.spec, (), {})
    with pytest.raises(InputError, match="changed since"):
        # Before: the int32 bytes read as float32, summed with no error.
        _stream_range(job, refs, [], 0, 1000, 0, "sum")


def test_dask_map_blocks_refuses_what_no_chunk_can_stream_on_the_client(device):
    da = pytest.importorskip("dask.array")
    import conveyor.dask as cvd

    compute = cvd.kernel(portable(TWICE), "twice")
    x = da.from_array(np.arange(20, dtype=np.float32), chunks=5)
    with pytest.raises(InputError, match="not a NumPy dtype"):
        cvd.map_blocks(compute, x, dtype="f4,(")  # before: a bare SyntaxError
    with pytest.raises(InputError, match="Python objects"):
        cvd.map_blocks(compute, x, dtype=object)  # before: refused per chunk at compute()
    objects = da.from_array(np.ones(20, dtype=object), chunks=5)
    for call in (cvd.map_blocks, cvd.reduce):
        with pytest.raises(InputError, match="Python objects"):
            call(compute, objects)  # before: refused per chunk at compute()
    m = da.from_array(np.arange(60, dtype=np.float32).reshape(6, 10), chunks=(3, 5))
    filtered = m[:, da.from_array(np.arange(10) % 2 == 0, chunks=5)]  # chunks (nan, nan)
    for call in (cvd.map_blocks, cvd.reduce):
        with pytest.raises(InputError, match="unknown length along axis 1"):
            call(compute, filtered)  # before: dask's bare ValueError
    for call in (cvd.map_blocks, cvd.reduce):
        for bad in ({"workers": 10**11}, {"depth": 0}, {"block_bytes": "lots"}):
            with pytest.raises(InputError):
                call(compute, x, **bad)  # guard: options are checked on the client


# -- an output over the process's file-size limit ------------------------------------------------
def test_an_output_over_the_file_size_limit_says_so_and_leaves_no_part(device, tmp_path):
    import resource

    kernel = device.compile(portable("""
__kernel void copy(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i];
}"""), "copy")
    x = np.ones(1 << 20, np.float32)  # 4 MiB out, over a 1 MiB limit
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    try:
        # Was a bare "OSError: [Errno 27] File too large", from os.ftruncate.
        with pytest.raises(OSError, match=r"output .*y\.npy needs \d+ bytes.*ulimit -f"):
            cv.stream(kernel, [x], [tmp_path / "y.npy"], device=device)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_a_table_file_written_over_in_place_while_it_is_read_is_an_input_error(device, tmp_path,
                                                                              kind):
    pa = pytest.importorskip("pyarrow")
    n, rows = 8000, 1000
    path = tmp_path / f"x.{kind}"
    table = pa.table({"x": np.ones(n, np.float32)})
    if kind == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path, row_group_size=rows, compression="none")
        source = cv.parquet(path, "x")
    else:
        import pyarrow.feather as feather

        feather.write_feather(table, path, chunksize=rows, compression="uncompressed")
        source = cv.arrow(path, "x")
    # A minute back: a rewrite in the tick of the write would leave the time as it was.
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns - 60 * 10**9))
    data = path.read_bytes()

    def zeros_that_rewrite_the_file_at_block_3():
        for block in range(n // rows):
            if block == 3:  # the same bytes back, in place: same size, a new time
                with open(path, "r+b") as f:
                    f.write(data)
            yield np.zeros(rows, np.float32)

    # Before: no error (row groups of the new file read against the old metadata).
    with pytest.raises(InputError, match="changed while it was read"):
        cv.stream(_kernel(device, ADD, "add"),
                  [source, cv.iterate(zeros_that_rewrite_the_file_at_block_3(), length=n)],
                  [np.float32], device=device, block_bytes=4 * rows)
