"""The sixth round: files, sources and sinks, and the command line, tried as a demanding user
and as an attacker would. Each test is one finding, on real PoCL kernels and real files, and
fails without its fix.

- One ``cv.npy_out`` object given to two streams at once (threads): they shared its open part
  file, so the second's ``open()`` replaced the first's, the second committed, and the first
  failed mid-stream with a bare ``AssertionError: open() first`` (or a ``FileNotFoundError``
  from its rename), leaving its locked ``.part`` file and descriptor behind. The same object
  reused by a later stream kept the first stream's dtype (a kernel writing ``int`` was refused
  with "output 0 has dtype float32", a dtype the user never gave). Each stream now writes its
  own copy of the sink (``FileSink.for_stream``): both succeed, the last to finish replaces
  the file, no part is left.
- ``cv.npy_out(path, shape=())``: a raw ``IndexError`` from the planner; now an InputError.
- ``cv.parquet(path, None)`` / ``cv.arrow(path, 3)``: a raw ``TypeError``; ``columns=[]`` was
  said to hold "columns of different types []"; ``b"x"`` looked for column 120. Now an
  InputError saying what ``columns`` takes.
- ``conveyor map``: a warning (a dead run's part removed, a cache folder refused) was printed
  as Python shows it, the library's file and line and a line of its source
  (``stream.py:218: RuntimeWarning: conveyor: removed ...`` then ``report = _run(...)``); it
  is now one line, ``conveyor map: warning: ...``.
- ``conveyor map ... --trace k.cl --force`` (or ``reduce``) replaced the kernel's source
  file with the trace, and ``--plot d.raw`` a raw input with the picture, exit 0 (the library
  refuses a trace naming an input, but the kernel file is the command's, and the plot is
  drawn by the command); ``-o y.npy`` through a symlink to the kernel file replaced it too.
  Refused now, before ``--force`` is even advised, exit 2.
- ``conveyor map -o NAME.npy`` with a name longer than the file system allows exited 1 with
  ``[Errno 36] File name too long: ... check the path and its permissions`` (pathlib's
  ``is_dir`` raised); it is bad input: exit 2, naming the option.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))
from streamkit import store, to_host  # noqa: E402

import conveyor as cv  # noqa: E402
import test_round4_cli  # noqa: E402
from conveyor.cli import main  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")

_command = test_round4_cli._command
work = test_round4_cli.work  # the CLI tests' fixture: a kernel file and an input

TWICE = """__kernel void twice(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}
"""

TRUNC = """__kernel void trunc_(__global const float *x, __global int *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (int)x[i];
}
"""


def _parts(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith((".part", ".new")))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- one cv.npy_out object, several streams -------------------------------------------------
def test_one_npy_out_object_written_by_two_streams_at_once(device, tmp_path):
    twice = device.compile(cv.portable(TWICE), "twice")
    target = tmp_path / "shared.npy"
    out = cv.npy_out(target)
    xa = np.arange(4000, dtype=np.float32)
    xb = -np.arange(4000, dtype=np.float32)
    second_done = threading.Event()
    results: dict[str, str] = {}

    def slow_twice(x, y, *, queue, offset, n):
        # Stream A's first block waits (its part is open) while stream B runs to the end.
        second_done.wait(timeout=60)
        store(y, to_host(x, queue) * 2, queue)

    def stream_a():
        try:
            cv.stream(slow_twice, [xa], [out], device=device, block_bytes=4 * 1000,
                      warmup=False)
            results["a"] = "ok"
        except Exception as exc:  # noqa: BLE001 - reported below
            results["a"] = f"{type(exc).__name__}: {exc}"

    fds = _open_fds()
    first = threading.Thread(target=stream_a)
    first.start()
    try:
        try:
            while not _parts(tmp_path) and first.is_alive():
                first.join(0.01)  # until stream A's part file exists
            cv.stream(twice, [xb], [out], device=device, block_bytes=4 * 1000)
            results["b"] = "ok"
        except Exception as exc:  # noqa: BLE001
            results["b"] = f"{type(exc).__name__}: {exc}"
    finally:
        second_done.set()
        first.join(120)
    assert results == {"a": "ok", "b": "ok"}, results
    np.testing.assert_array_equal(np.load(target), 2 * xa)  # A finished last
    assert _parts(tmp_path) == []
    assert _open_fds() == fds
    assert out.shape == () and out.dtype is None  # the caller's object was never opened


def test_one_npy_out_object_reused_with_a_kernel_of_another_type(device, tmp_path):
    target = tmp_path / "y.npy"
    out = cv.npy_out(target)
    x = np.arange(100, dtype=np.float32) + 0.5
    cv.stream(device.compile(cv.portable(TWICE), "twice"), [x], [out], device=device)
    assert np.load(target).dtype == np.float32
    cv.stream(device.compile(cv.portable(TRUNC), "trunc_"), [x[:60]], [out], device=device)
    written = np.load(target)
    assert written.dtype == np.int32 and written.shape == (60,)
    np.testing.assert_array_equal(written, x[:60].astype(np.int32))


def test_an_output_shape_with_no_axis_is_an_input_error(device, tmp_path):
    x = np.arange(100, dtype=np.float32)
    with pytest.raises(InputError, match=r"shape=\(\) has no axis: give the rows first"):
        cv.stream(device.compile(cv.portable(TWICE), "twice"), [x], [cv.npy_out(tmp_path / "y.npy",
                                                                    shape=())],
                  device=device)
    assert os.listdir(tmp_path) == []


# -- Parquet / Arrow columns= ------------------------------------------------------------------
@pytest.mark.parametrize("columns", [None, 3, b"x", []], ids=repr)
def test_columns_that_name_no_column_are_input_errors(tmp_path, columns):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    feather = pytest.importorskip("pyarrow.feather")
    table = pa.table({"x": pa.array(np.arange(10, dtype=np.float32))})
    pq.write_table(table, tmp_path / "t.parquet")
    feather.write_feather(table, tmp_path / "t.arrow")
    for make, path in ((cv.parquet, "t.parquet"), (cv.arrow, "t.arrow")):
        with pytest.raises(InputError, match=r"columns=.*(name a column|names no column)"):
            make(tmp_path / path, columns)


# -- the command line --------------------------------------------------------------------------
def test_a_warning_of_the_command_is_one_line(work):
    tmp, spec = work
    stale = tmp / ".y.npy.abcdefgh.part"  # a dead run's part: removed with a warning
    stale.write_bytes(b"x" * 100)
    path = os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run([*_command(), "map", str(tmp / "k.cl"), "--kernel", "twice",
                           "--device", spec, "-q", "-i", str(tmp / "x.npy"), "-o",
                           str(tmp / "y.npy")], cwd=tmp, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=path))
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("conveyor map: warning: removed "), lines
    assert "RuntimeWarning" not in done.stderr and not stale.exists()
    np.testing.assert_array_equal(np.load(tmp / "y.npy"), 2 * np.arange(100, dtype=np.float32))


def test_an_output_name_too_long_exits_2_naming_the_option(work, capsys):
    tmp, spec = work
    name = str(tmp / ("y" * 300 + ".npy"))
    code = main(["map", str(tmp / "k.cl"), "--kernel", "twice", "--device", spec, "-q",
                 "-i", str(tmp / "x.npy"), "-o", name])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"conveyor map: -o {name}: cannot look at") and "too long" in err
    assert sorted(os.listdir(tmp)) == ["k.cl", "x.npy"]


@pytest.mark.parametrize("case", ["trace-kernel", "reduce-trace-kernel", "plot-raw-input",
                                  "output-linked-to-kernel"])
def test_the_command_never_writes_a_file_it_reads(work, capsys, case):
    tmp, spec = work
    kernel, raw = tmp / "k.cl", tmp / "d.raw"
    np.arange(100, dtype=np.float32).tofile(raw)
    before = {p: p.read_bytes() for p in (kernel, raw)}
    head = ["--kernel", "twice", "--device", spec, "-q", "--force"]
    argv = {
        "trace-kernel": ["map", kernel, *head, "-i", tmp / "x.npy", "-o", tmp / "y.npy",
                         "--trace", kernel],
        "reduce-trace-kernel": ["reduce", kernel, *head, "-i", tmp / "x.npy", "--op", "sum",
                                "--trace", kernel],
        "plot-raw-input": ["map", kernel, *head, "-i", raw, "--dtype", "float32", "-o",
                           tmp / "y.npy", "--plot", raw],
        "output-linked-to-kernel": ["map", kernel, *head, "-i", tmp / "x.npy", "-o",
                                    tmp / "link.npy"],
    }[case]
    if case == "plot-raw-input":
        pytest.importorskip("matplotlib")
    (tmp / "link.npy").symlink_to(kernel)
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "which the command reads: writing it would replace it" in err, err
    assert {p: p.read_bytes() for p in (kernel, raw)} == before
    assert not (tmp / "y.npy").exists() and _parts(tmp) == []


# -- a file source rewritten between streams ------------------------------------------------
def _twice(device):
    return device.compile(cv.portable(TWICE), "twice")


def test_a_source_file_rewritten_between_streams_is_never_read_with_its_old_header(
        device, tmp_path):
    path = tmp_path / "s.npy"
    x = np.arange(1000, dtype=np.float32)
    np.save(path, x)
    source = cv.npy(path)
    out = cv.stream(_twice(device), [source], [np.float32], device=device).outputs[0]
    np.testing.assert_array_equal(out, 2 * x)
    np.save(path, np.arange(2000, dtype=np.float16))  # the same byte size, another dtype
    with pytest.raises(InputError, match="changed since this input was made .*header"):
        cv.stream(_twice(device), [source], [np.float32], device=device)
    np.save(path, np.arange(500, dtype=np.float32))  # another size
    with pytest.raises(InputError, match="changed since this input was made"):
        cv.stream(_twice(device), [source], [np.float32], device=device)
    np.save(path, x + 1)  # new values, the same header: read as the file is now
    out = cv.stream(_twice(device), [source], [np.float32], device=device).outputs[0]
    np.testing.assert_array_equal(out, 2 * (x + 1))
    raw = cv.raw(path, np.uint8)
    with open(path, "ab") as f:
        f.write(b"more")
    with pytest.raises(InputError, match="changed since .*size"):
        cv.stream(lambda a, **k: a, [raw], [np.uint8], device=device)


def test_an_input_path_too_long_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="input file .*: check the path"):
        cv.npy(tmp_path / ("x" * 300 + ".npy"))


def test_an_npy_header_shape_numpy_cannot_make_is_refused_at_once(tmp_path):
    path = tmp_path / "huge.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": (2**62, 0)})
    with pytest.raises(InputError, match="spans more than 2\\*\\*63 - 1 bytes"):
        cv.npy(path)


def test_a_file_output_larger_than_any_file_is_refused_before_its_part(device, tmp_path):
    def chunk():
        yield np.zeros(10, np.float32)

    with pytest.raises(InputError, match="more than any file holds"):
        cv.stream(lambda a, **k: a, [cv.iterate(chunk(), length=2**62)],
                  [cv.npy_out(tmp_path / "big.npy")], device=device)
    assert os.listdir(tmp_path) == []
