"""Round fifteen, helper E: the ``conveyor`` command line tried as a demanding user and an
attacker would (odd option values, device strings, paths that normalise to another file,
kernel files outside the current folder, several casts of one input, cluster addresses), on
real PoCL kernels and real files. The command runs in-process through ``conveyor.cli.main``
unless a test needs to see a traceback from outside.

Found (xfail, strict: each asserts the right behaviour and turns red once fixed):

- A kernel file in another folder that includes a header beside it (``conveyor map kd/k.cl``
  with ``#include "common.h"`` and ``kd/common.h``) is compiled against the current folder's
  ``common.h``: another header of that name there is used silently (a wrong result, exit 0),
  and with none there the build fails ("'common.h' file not found"), where every C compiler
  looks beside the including file first.
- ``-o keep.npy/.`` and ``--trace mine.json/.`` (map, reduce, demo) replace an existing
  ``keep.npy`` / ``mine.json`` without ``--force``: the check for an existing file looks at
  the text as given (``lexists`` fails with ENOTDIR) while the writer's ``Path`` drops the
  trailing ``/.``.
- Two ``--cast`` of one input chain (``--cast int32 --cast x:float32`` sends 0.1 through int32:
  the kernel gets 0.0, exit 0), and the advice for a wrong cast ("add --cast x:float32"),
  followed, makes such a chain (float16, then float32: the values are float16's).
- ``--scheduler tls://...`` (no TLS configured) and ``--scheduler ucx://...`` print distributed's
  ``TypeError`` traceback, exit 1.
- ``CONVEYOR_DEVICE=opencl:9`` (well formed, matching nothing) says "no device matches
  'opencl:9'" without naming the variable the user never typed on the command line.
- An abbreviated ``--js`` (argparse takes it for ``--json``) with a usage error prints no JSON
  object on stdout.
- ``--trace -`` writes a file named ``-`` in the current folder.
- ``-i x.npy -o x.npy/.`` replaces the input in place without ``--force``.
- Messages rewrite the user's file names: a missing ``-i block_bytes.npy`` is reported as
  "input file --block-bytes.npy", ``-i 'input 1.npy'`` as "input 1 (x.npy).npy".
- ``MPLBACKEND=bogus`` with ``--plot`` (map, demo): matplotlib's ValueError traceback, exit 1.
- ``demo --device opencl:all`` (or a comma list) says no device matches it, listing the very
  devices it names, not that demo runs on one device.
- ``-i t.parquet:a:b`` (a column named "a:b") is taken for a raw file and told to give --dtype.
- Since commit b274881 a ``.npy`` input of another dtype is told Python code
  (``np.save(... .astype(np.float32))``) instead of ``--cast z:float32``.

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv
from conveyor.cli import main

SRC = str(Path(cv.__file__).resolve().parents[1])  # the conveyor under test, for children

KERNELS = """
__kernel void twice(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}
__kernel void add(__global const float *x, __global const float *z, __global float *y,
                  ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + z[i];
}
__kernel void pos(__global const float *x, __global float *p, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) p[i] = x[i];
}
__kernel void addi(__global const int *x, __global int *y, int a, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + a;
}
__kernel void addu(__global const uint *x, __global uint *y, uint a, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + a;
}
__kernel void sten(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + 10.0f * x[i + 1] + 100.0f * x[i + 2];
}
"""

X = np.arange(100, dtype=np.float32)


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A kernel file and a float32 .npy input in the current folder (relative paths, as a
    person types them); the device is PoCL's first OpenCL one."""
    opencl = [d for d in cv.devices() if d.backend == "opencl"]
    if not opencl:
        pytest.skip("no OpenCL device")
    monkeypatch.delenv("CONVEYOR_DEVICE", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.cl").write_text(KERNELS)
    np.save(tmp_path / "x.npy", X)
    return tmp_path, opencl[0].spec


def _map(spec: str, *extra, kernel: str = "twice") -> list[str]:
    return ["map", "k.cl", "--kernel", kernel, "--device", spec, "-q", *(str(a) for a in extra)]


def _run(argv, capsys) -> tuple[int, str]:
    code, _, err = _run_out(argv, capsys)
    return code, err


def _run_out(argv, capsys) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_line(code: int, err: str, want: int = 2) -> str:
    """The one line of a refusal (exit ``want``); no traceback, no second line."""
    assert code == want, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(" ")
             and not line.startswith("usage:")]
    assert len(lines) == 1, err
    assert lines[0].startswith("conveyor"), err
    return lines[0]


def _leftovers(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith((".part", ".new")))


def _env() -> dict[str, str]:
    path = os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return dict(os.environ, PYTHONPATH=path)


# -- #include beside a kernel file in another folder ------------------------------------------
INCLUDER = """#include "common.h"
__kernel void tri(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = SCALE * x[i];
}
"""


def test_a_header_beside_the_kernel_file_wins_over_one_in_the_current_folder(work, capsys):
    """``conveyor map kd/ki.cl`` with ``#include "common.h"``: kd/common.h defines SCALE 3,
    and the folder the command runs in has another common.h (SCALE 5). Every C compiler reads
    kd/common.h (the including file's folder first); conveyor compiled the source text
    against the current folder's header: the output was 5 * x, exit 0."""
    tmp, spec = work
    (tmp / "kd").mkdir()
    (tmp / "kd" / "ki.cl").write_text(INCLUDER)
    (tmp / "kd" / "common.h").write_text("#define SCALE 3.0f\n")
    (tmp / "common.h").write_text("#define SCALE 5.0f\n")  # a different project's header
    code, err = _run(["map", "kd/ki.cl", "--kernel", "tri", "--device", spec, "-q",
                      "-i", "x.npy", "-o", "y.npy"], capsys)
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp / "y.npy"), 3 * X)


def test_a_header_beside_the_kernel_file_is_found_from_another_folder(work, capsys):
    """The same kernel, no common.h in the current folder: exit 1, "'common.h' file not
    found", though it sits beside kd/ki.cl; run from kd/ it builds."""
    tmp, spec = work
    (tmp / "kd").mkdir()
    (tmp / "kd" / "ki.cl").write_text(INCLUDER)
    (tmp / "kd" / "common.h").write_text("#define SCALE 3.0f\n")
    code, err = _run(["map", "kd/ki.cl", "--kernel", "tri", "--device", spec, "-q",
                      "-i", "x.npy", "-o", "y.npy"], capsys)
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp / "y.npy"), 3 * X)


def test_guard_a_header_beside_the_kernel_file_builds_from_its_folder(work, capsys,
                                                                       monkeypatch):
    """guard: run from the kernel's own folder, the header beside it is the one used."""
    tmp, spec = work
    (tmp / "kd").mkdir()
    (tmp / "kd" / "ki.cl").write_text(INCLUDER)
    (tmp / "kd" / "common.h").write_text("#define SCALE 3.0f\n")
    monkeypatch.chdir(tmp / "kd")
    code, err = _run(["map", "ki.cl", "--kernel", "tri", "--device", spec, "-q",
                      "-i", tmp / "x.npy", "-o", tmp / "y.npy"], capsys)
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp / "y.npy"), 3 * X)


# -- FILE/. names the existing FILE to the writer but not to the --force check ---------------
def test_an_output_spelled_with_a_trailing_slash_dot_is_not_replaced_without_force(work,
                                                                                  capsys):
    """``-o keep.npy/.`` with keep.npy there and no --force: exit 0, keep.npy replaced. The
    check ``os.path.lexists('keep.npy/.')`` is False (ENOTDIR); ``cv.npy_out`` writes
    ``Path('keep.npy/.')``, which is keep.npy. Right: exit 2 (exists, or names a folder)."""
    tmp, spec = work
    np.save(tmp / "keep.npy", np.full(3, 7, np.float32))
    before = (tmp / "keep.npy").read_bytes()
    code, err = _run(_map(spec, "-i", "x.npy", "-o", "keep.npy/."), capsys)
    assert (tmp / "keep.npy").read_bytes() == before
    _one_line(code, err)
    assert _leftovers(tmp) == []


def test_an_input_is_not_replaced_in_place_through_a_trailing_slash_dot_without_force(
        work, capsys):
    """``-i x.npy -o x.npy/.`` without --force: exit 0, the input replaced by 2 * x (in place
    is allowed, but ``-o x.npy`` alone asks for --force first)."""
    tmp, spec = work
    before = (tmp / "x.npy").read_bytes()
    code, err = _run(_map(spec, "-i", "x.npy", "-o", "x.npy/."), capsys)
    assert (tmp / "x.npy").read_bytes() == before
    _one_line(code, err)


@pytest.mark.parametrize("command", ["map", "reduce", "demo"])
def test_a_trace_spelled_with_a_trailing_slash_dot_is_not_replaced_without_force(
        work, capsys, command):
    """``--trace mine.json/.`` with mine.json there and no --force: the user's file became
    the trace, exit 0 (``demo --trace k.cl/.`` replaced a kernel source the same way)."""
    tmp, spec = work
    (tmp / "mine.json").write_text('{"mine": 1}\n')
    argv = {"map": _map(spec, "-i", "x.npy", "-o", "y.npy"),
            "reduce": ["reduce", "k.cl", "--kernel", "pos", "--device", spec, "-q", "-i",
                       "x.npy"],
            "demo": ["demo", "--mib", "1", "--device", spec]}[command]
    code, err = _run([*argv, "--trace", "mine.json/."], capsys)
    assert (tmp / "mine.json").read_text() == '{"mine": 1}\n'
    _one_line(code, err)


def test_guard_trailing_slash_dot_of_an_input_or_the_kernel_is_still_refused(work, capsys):
    """guard: ``--trace x.npy/.`` and ``--trace k.cl/.`` (with --force) are refused as the
    files the command reads (``same_file`` follows the spelling); ``--plot p.png/.`` names a
    folder."""
    tmp, spec = work
    kernel, data = (tmp / "k.cl").read_bytes(), (tmp / "x.npy").read_bytes()
    for target in ("x.npy/.", "k.cl/."):
        code, err = _run(_map(spec, "-i", "x.npy", "-o", "y.npy", "--force", "--trace",
                              target), capsys)
        assert "which the command reads" in _one_line(code, err)
    code, err = _run(_map(spec, "-i", "x.npy", "-o", "y.npy", "--force", "--plot",
                          "p.png/."), capsys)
    assert "names a folder" in _one_line(code, err)
    assert (tmp / "k.cl").read_bytes() == kernel and (tmp / "x.npy").read_bytes() == data
    assert not (tmp / "y.npy").exists() and _leftovers(tmp) == []


# -- several --cast of one input ----------------------------------------------------------------
D = np.array([0.1, 3.7, 1e-3, 700.5], np.float64)


@pytest.mark.parametrize("casts", [("int32", "x:float32"), ("float16", "x:float32")])
def test_two_casts_of_one_input_do_not_chain_silently(work, capsys, casts):
    """``--cast int32 --cast x:float32`` over float64 [0.1, 3.7, 0.001, 700.5] ran with the
    kernel seeing [0, 3, 0, 700] (int32, then float32), exit 0. ``--cast float16`` alone is
    told "add --cast x:float32"; following that gives a float16-rounded input, exit 0. Right:
    the input reaches the kernel as float32 of its values (the named cast wins), or exit 2
    saying one input has two casts."""
    tmp, spec = work
    np.save(tmp / "d.npy", D)
    code, err = _run(_map(spec, "-i", "d.npy", "-o", "y.npy", "--cast", casts[0], "--cast",
                          casts[1]), capsys)
    if code == 0:
        np.testing.assert_array_equal(np.load(tmp / "y.npy"), 2 * D.astype(np.float32))
    else:
        assert "--cast" in _one_line(code, err)
        assert not (tmp / "y.npy").exists()


def test_guard_one_cast_of_each_input_is_exact(work, capsys):
    """guard: one --cast per input, by parameter name and by -i text, over small blocks."""
    tmp, spec = work
    np.save(tmp / "d.npy", D)
    np.save(tmp / "di.npy", np.arange(4, dtype=np.int64))
    code, err = _run(_map(spec, "-i", "d.npy", "-i", "di.npy", "-o", "y.npy", "--cast",
                          "x:float32", "--cast", "di.npy:float32", "--block-bytes", "8",
                          kernel="add"), capsys)
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp / "y.npy"),
                                  D.astype(np.float32) + np.arange(4, dtype=np.float32))


# -- --scheduler addresses distributed cannot use ----------------------------------------------
@pytest.mark.parametrize("address", ["tls://127.0.0.1:1", "ucx://127.0.0.1:1"])
def test_a_scheduler_address_distributed_cannot_open_is_one_line(work, address):
    """``distributed.Client('tls://...')`` with no TLS configured raises TypeError ("TLS
    expects a `ssl_context` argument"), and 'ucx://' without UCX raises TypeError ("Can't
    instantiate abstract class UCXConnector"); ``dask/cluster.connect`` catches only
    ValueError and OSError. Right: exit 2, one line naming --scheduler."""
    pytest.importorskip("distributed")
    tmp, spec = work
    done = subprocess.run([sys.executable, "-m", "conveyor.cli", *_map(spec, "-i", "x.npy",
                           "-o", "y.npy", "--scheduler", address)], cwd=tmp, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "--scheduler" in _one_line(done.returncode, done.stderr)
    assert not (tmp / "y.npy").exists()


# -- CONVEYOR_DEVICE --------------------------------------------------------------------------
def test_a_default_device_from_the_environment_that_matches_nothing_names_the_variable(
        work, capsys, monkeypatch):
    """No --device, ``CONVEYOR_DEVICE=opencl:9``: "no device matches 'opencl:9'; devices
    here: ...", a spec the user never typed on this command line. (A malformed value is
    named: "CONVEYOR_DEVICE='opencl:all' is not a device spec".)"""
    tmp, _ = work
    monkeypatch.setenv("CONVEYOR_DEVICE", "opencl:9")
    code, err = _run(["map", "k.cl", "--kernel", "twice", "-q", "-i", "x.npy", "-o", "y.npy"],
                     capsys)
    line = _one_line(code, err)
    assert "CONVEYOR_DEVICE" in line, line
    assert not (tmp / "y.npy").exists()


def test_guard_a_device_option_overrides_a_bad_environment_default(work, capsys,
                                                                    monkeypatch):
    """guard: --device decides when CONVEYOR_DEVICE names no device here."""
    tmp, spec = work
    monkeypatch.setenv("CONVEYOR_DEVICE", "opencl:9")
    code, err = _run(_map(spec, "-i", "x.npy", "-o", "y.npy"), capsys)
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp / "y.npy"), 2 * X)


# -- --json spelled short -----------------------------------------------------------------------
def test_an_abbreviated_json_flag_still_gets_the_json_failure(work, capsys):
    """argparse takes ``--js`` for ``--json`` (allow_abbrev), but ``commands.run`` looks for
    the literal "--json" in argv before printing a usage error as JSON: a script gets an
    empty stdout. Right: the one JSON object, as with --json (or --js refused)."""
    tmp, spec = work
    code, out, err = _run_out(_map(spec, "-i", "x.npy", "-o", "y.npy", "--js", "--depth",
                                   "0"), capsys)
    assert code == 2, err
    failure = json.loads(out)
    assert failure["exit_code"] == 2 and "--depth" in failure["error"]


def test_guard_json_usage_failure_is_one_json_object(work, capsys):
    """guard: with --json spelled out, a usage error is one JSON object on stdout."""
    tmp, spec = work
    code, out, err = _run_out(_map(spec, "-i", "x.npy", "-o", "y.npy", "--json", "--depth",
                                   "0"), capsys)
    assert code == 2, err
    assert json.loads(out)["exit_code"] == 2


# -- "-" as a file name -------------------------------------------------------------------------
def test_a_trace_named_dash_is_not_a_file_named_dash(work, capsys):
    """``--trace -`` (stdout to most tools; the command refuses stdout as a trace target)
    exits 0 having written ./- . Right: refused in one line (or the trace on stdout), and no
    file named '-'."""
    tmp, spec = work
    code, err = _run(_map(spec, "-i", "x.npy", "-o", "y.npy", "--trace", "-"), capsys)
    assert not (tmp / "-").exists()
    _one_line(code, err)


def test_guard_dash_as_kernel_input_or_output_is_refused_in_one_line(work, capsys):
    """guard: '-' as the kernel file, an input or an output is no stdin/stdout: each is a
    one-line refusal saying what to name."""
    tmp, spec = work
    for argv, phrase in [
        (["map", "-", "--kernel", "twice", "--device", spec, "-i", "x.npy", "-o", "y.npy"],
         ".cl"),
        (_map(spec, "-i", "-", "-o", "y.npy"), "--dtype"),
        (_map(spec, "-i", "x.npy", "-o", "-"), ".npy"),
    ]:
        code, err = _run(argv, capsys)
        assert phrase in _one_line(code, err)
    assert sorted(os.listdir(tmp)) == ["k.cl", "x.npy"]


# -- messages that rewrite the user's file names --------------------------------------------
@pytest.mark.parametrize("name", ["block_bytes.npy", "input 1.npy", "halo=2.npy"])
def test_a_missing_input_is_named_as_given(work, capsys, name):
    """``-i block_bytes.npy`` (missing) said "input file --block-bytes.npy does not exist";
    ``-i 'input 1.npy' -i x.npy`` said "input file input 1 (x.npy).npy": ``words.cli_terms``
    rewrites Python names and "input N" anywhere in the message, the user's paths included."""
    tmp, spec = work
    code, err = _run(_map(spec, "-i", name, "-i", "x.npy", "-o", "y.npy", kernel="add"),
                     capsys)
    assert f"input file {name} does not exist" in _one_line(code, err)


# -- a plotting environment matplotlib refuses ----------------------------------------------
@pytest.mark.parametrize("command", ["map", "demo"])
def test_a_plot_under_a_backend_matplotlib_refuses_is_one_line(work, command):
    """``MPLBACKEND=bogus conveyor map ... --plot p.png``: ``import matplotlib`` raises
    ValueError ("Key backend: 'bogus' is not a valid value"), and ``trace/plot._matplotlib``
    catches only ImportError: a traceback (before any work, so nothing is written). Right:
    exit 2, one line naming --plot (and MPLBACKEND)."""
    pytest.importorskip("matplotlib")
    tmp, spec = work
    argv = (_map(spec, "-i", "x.npy", "-o", "y.npy") if command == "map"
            else ["demo", "--mib", "1", "--device", spec])
    done = subprocess.run([sys.executable, "-m", "conveyor.cli", *argv, "--plot", "p.png"],
                          cwd=tmp, env=dict(_env(), MPLBACKEND="bogus"), capture_output=True,
                          text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "--plot" in _one_line(done.returncode, done.stderr)
    assert sorted(os.listdir(tmp)) == ["k.cl", "x.npy"]


# -- demo and bench take one device ------------------------------------------------------------
@pytest.mark.parametrize("given", ["opencl:all", "SPEC,SPEC2"])
def test_demo_given_several_devices_says_it_takes_one(work, capsys, given):
    """``demo --device opencl:all`` (or a comma list, which map takes) said "no device matches
    'opencl:all'; devices here: opencl:0:0 ...; opencl:1:0 ...": the devices listed are the
    ones it names. Right: say that demo (and bench) runs on one device."""
    tmp, spec = work
    specs = [d.spec for d in cv.devices() if d.backend == "opencl"]
    given = given.replace("SPEC2", specs[-1]).replace("SPEC", spec)
    code, err = _run(["demo", "--mib", "1", "--device", given], capsys)
    line = _one_line(code, err)
    assert "one device" in line, line


# -- a table column whose name holds ":" --------------------------------------------------------
def test_a_table_column_named_with_a_colon(work, capsys):
    """``-i t.parquet:a:b`` for the column "a:b": ``Input`` splits at the last ':' (head
    "t.parquet:a", no table suffix), so the text is a raw file "t.parquet:a:b" and the
    message asks for --dtype. Right: read column "a:b" (split after the table's suffix), or
    say to use --column."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    tmp, spec = work
    pq.write_table(pa.table({"a:b": X, "c": X + 1}), tmp / "t.parquet")
    code, err = _run(_map(spec, "-i", "t.parquet:a:b", "-o", "y.npy"), capsys)
    if code == 0:
        np.testing.assert_array_equal(np.load(tmp / "y.npy"), 2 * X)
    else:
        assert "--column" in _one_line(code, err)


def test_guard_a_table_column_with_a_colon_through_the_column_option(work, capsys):
    """guard: ``--column a:b`` reads it."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    tmp, spec = work
    pq.write_table(pa.table({"a:b": X, "c": X + 1}), tmp / "t.parquet")
    code, err = _run(_map(spec, "-i", "t.parquet", "--column", "a:b", "-o", "y.npy"), capsys)
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp / "y.npy"), 2 * X)


# -- guards: sizes, devices, failures that leave nothing ----------------------------------------
@pytest.mark.parametrize(("value", "phrase"), [
    ("0", "at least 1 byte"), ("-5", "negative"), ("-0", "at least 1 byte"), ("64M", "not a size"),
    ("0x40", "not a size"), ("1_000", "not a size"), ("inf", "not a size"),
    ("1e30", "larger than any memory"), ("2**10", "not a size"),
])
def test_guard_block_bytes_values_that_are_no_size_are_usage_errors(work, capsys, value,
                                                                     phrase):
    """guard: 0, negatives (given as a separate word too), a bare M, hex, underscores, inf,
    1e30 and Python expressions: exit 2, argparse's line naming --block-bytes."""
    tmp, spec = work
    code, err = _run(_map(spec, "-i", "x.npy", "-o", "y.npy", "--block-bytes", value), capsys)
    line = _one_line(code, err)
    assert "--block-bytes" in line and phrase in line, line
    assert not (tmp / "y.npy").exists()


@pytest.mark.parametrize("value", ["1e3", "1.5e3", "1 KiB", "1KIB", "4", "1e29", "0.5KiB"])
def test_guard_block_bytes_values_that_are_sizes_stream_exactly(work, capsys, value):
    """guard: exponents, spaces before units, a one-row block and a block past any memory
    (capped by the plan) all stream 2 * x exactly."""
    tmp, spec = work
    code, err = _run(_map(spec, "-i", "x.npy", "-o", "y.npy", "--block-bytes", value), capsys)
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp / "y.npy"), 2 * X)


def test_guard_block_bytes_below_one_row_says_the_row_size(work, capsys):
    """guard: --block-bytes 3 of 4-byte rows: exit 2 naming --block-bytes 4."""
    tmp, spec = work
    code, err = _run(_map(spec, "-i", "x.npy", "-o", "y.npy", "--block-bytes", "3"), capsys)
    assert "--block-bytes 4" in _one_line(code, err)
    assert not (tmp / "y.npy").exists()


def test_guard_bad_and_duplicate_device_strings_are_one_line(work, capsys):
    """guard: a missing index, a negative or huge index, empty and blank specs, the same
    device named two ways (a spec and its platform, 'cpu' and its spec, ':all' and one of
    its devices): exit 2, one line, nothing written."""
    tmp, spec = work
    cases = [["opencl:9"], ["opencl:0:9"], ["opencl:-1"], ["opencl:99999999999999999999"],
             [""], [" "], ["opencl:0:0:0"], [f"{spec},{spec}"], ["opencl:all", spec], [",,"]]
    if cv.device(spec).kind == "cpu":  # "cpu" names the same device only where it is one
        cases.append(["cpu", spec])
    for specs in cases:
        argv = ["map", "k.cl", "--kernel", "twice", "-q", "-i", "x.npy", "-o", "y.npy"]
        for item in specs:
            argv += [f"--device={item}"]
        code, err = _run(argv, capsys)
        line = _one_line(code, err)
        assert "device" in line, (specs, line)
    assert not (tmp / "y.npy").exists() and _leftovers(tmp) == []


def test_guard_device_lists_stream_exactly(work, capsys):
    """guard: two devices as a comma list (with a stray comma), as two --device options and
    as opencl:all give the one-device result, in place and with a halo too."""
    tmp, spec = work
    specs = [d.spec for d in cv.devices() if d.backend == "opencl"]
    if len(specs) < 2:
        pytest.skip("needs two OpenCL devices")
    for given in ([f"--device={specs[0]},{specs[1]},"],
                  ["--device", specs[1], "--device", specs[0]], ["--device", "opencl:all"]):
        code, err = _run(["map", "k.cl", "--kernel", "twice", "-q", "-i", "x.npy", "-o",
                          "y.npy", "--force", "--block-bytes", "64", *given], capsys)
        assert code == 0, (given, err)
        np.testing.assert_array_equal(np.load(tmp / "y.npy"), 2 * X)
    h = np.arange(1000, dtype=np.float32)
    np.save(tmp / "h.npy", h)
    code, err = _run(["map", "k.cl", "--kernel", "sten", "-q", "-i", "h.npy", "-o", "h.npy",
                      "--halo", "1", "--force", "--device", "opencl:all", "--block-bytes",
                      "256"], capsys)
    assert code == 0, err
    padded = np.pad(h, 1, mode="edge")
    np.testing.assert_array_equal(np.load(tmp / "h.npy"),
                                  padded[:-2] + 10 * padded[1:-1] + 100 * padded[2:])


def test_guard_a_failed_in_place_run_leaves_the_input_and_nothing_else(work, capsys):
    """guard: -i big.npy -o big.npy --force with --trace and --plot, failing mid-stream (a
    --cast value float32 cannot hold at row 900 of 1000, blocks of 64 rows): exit 2, the
    input byte for byte, no trace, no plot, no temporary file."""
    tmp, spec = work
    values = np.arange(1000, dtype=np.float64)
    values[900] = 1e300
    np.save(tmp / "big.npy", values)
    before = (tmp / "big.npy").read_bytes()
    plot = ["--plot", "p.png"] if _has_matplotlib() else []
    code, err = _run(_map(spec, "-i", "big.npy", "--cast", "float32", "-o", "big.npy",
                          "--force", "--block-bytes", "256", "--trace", "t.json", *plot),
                     capsys)
    assert "row 900" in _one_line(code, err)
    assert (tmp / "big.npy").read_bytes() == before
    assert sorted(os.listdir(tmp)) == ["big.npy", "k.cl", "x.npy"]


def _has_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def test_guard_a_kernel_that_does_not_build_leaves_the_old_output(work, capsys):
    """guard: a build error with --force: exit 1 with the log naming the file, the old output
    and trace as they were, no temporary file."""
    tmp, spec = work
    (tmp / "bad.cl").write_text("__kernel void twice(__global const float *x, __global float"
                                " *y, ulong offset, ulong n) { y[0] = q; }\n")
    (tmp / "y.npy").write_bytes(b"old output")
    (tmp / "t.json").write_text("old trace")
    code, err = _run(["map", "bad.cl", "--kernel", "twice", "--device", spec, "-i", "x.npy",
                      "-o", "y.npy", "--trace", "t.json", "--force"], capsys)
    assert code == 1 and "bad.cl:1:" in err and "Traceback" not in err, err
    assert (tmp / "y.npy").read_bytes() == b"old output"
    assert (tmp / "t.json").read_text() == "old trace"
    assert _leftovers(tmp) == []


def test_guard_inputs_of_mismatched_lengths_are_one_line(work, capsys):
    """guard: 100 rows beside 50: exit 2 naming both files; a (100, 2) input beside a 1-D
    one has rows that agree and streams."""
    tmp, spec = work
    np.save(tmp / "z.npy", np.arange(50, dtype=np.float32))
    np.save(tmp / "x2.npy", np.arange(200, dtype=np.float32).reshape(100, 2))
    code, err = _run(_map(spec, "-i", "x.npy", "-i", "z.npy", "-o", "y.npy", kernel="add"),
                     capsys)
    assert "z.npy) has 50" in _one_line(code, err)
    assert not (tmp / "y.npy").exists()
    code, err = _run(_map(spec, "-i", "x.npy", "-i", "x2.npy", "-o", "y.npy", kernel="add"),
                     capsys)
    assert code == 0, err


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_an_input_file_of_another_dtype_is_told_the_cast_option(work, capsys, dtype):
    """``-i x.npy -i other.npy`` with other.npy float64 (or int32) for a float parameter: the
    library's advice for a file input is now "write a copy of it as float32 and pass that:
    np.save('as_float32.npy', np.load(...).astype(np.float32))", which ``words._ASTYPE`` (it
    wants "pass an array of float32 (e.g. a.astype(...))") no longer turns into "add --cast
    z:float32": the command tells Python code where one option converts the input."""
    tmp, spec = work
    np.save(tmp / "other.npy", np.arange(100, dtype=dtype))
    code, err = _run(_map(spec, "-i", "x.npy", "-i", "other.npy", "-o", "y.npy",
                          kernel="add"), capsys)
    line = _one_line(code, err)
    assert "--cast z:float32" in line and "np." not in line, line
    assert not (tmp / "y.npy").exists()


@pytest.mark.parametrize(("kernel", "dtype", "value", "want"), [
    ("addi", np.int32, "2147483648", "out of range for int"),
    ("addi", np.int32, "1e10", "out of range for int"),
    ("addi", np.int32, "nan", "no integer cast"),
    ("addi", np.int32, "0x10", "is not a number"),
    ("addu", np.uint32, "-1", "out of range for uint"),
    ("addu", np.uint32, "4294967296", "out of range for uint"),
])
def test_guard_int_args_the_parameter_cannot_hold_are_refused(work, capsys, kernel, dtype,
                                                              value, want):
    """guard: --arg past an int/uint parameter, NaN for an int, hex text: exit 2 naming
    --arg."""
    tmp, spec = work
    np.save(tmp / "i.npy", np.arange(10, dtype=dtype))
    code, err = _run(_map(spec, "-i", "i.npy", "-o", "y.npy", f"--arg={value}", kernel=kernel),
                     capsys)
    line = _one_line(code, err)
    assert "--arg" in line and want in line, line
    assert not (tmp / "y.npy").exists()


@pytest.mark.parametrize(("kernel", "dtype", "value", "add"), [
    ("addi", np.int32, "2.7", 2), ("addi", np.int32, "-2.7", -2), ("addi", np.int32, " 3 ", 3),
    ("addi", np.int32, "+3", 3), ("addu", np.uint32, "4294967295", 4294967295),
])
def test_guard_int_args_that_fit_are_passed_truncated(work, capsys, kernel, dtype, value, add):
    """guard: fractions truncate toward zero, spaces and '+' are read, uint32's largest
    wraps as C's addition does."""
    tmp, spec = work
    data = np.arange(10, dtype=dtype)
    np.save(tmp / "i.npy", data)
    code, err = _run(_map(spec, "-i", "i.npy", "-o", "y.npy", f"--arg={value}", kernel=kernel),
                     capsys)
    assert code == 0, err
    with np.errstate(over="ignore"):
        want = (data.astype(np.int64) + add).astype(dtype)
    np.testing.assert_array_equal(np.load(tmp / "y.npy"), want)


def test_guard_halo_past_the_input_and_past_any_memory(work, capsys):
    """guard: --halo 10**20 is exit 2 naming --halo; --halo 1000 over 100 rows streams (every
    row is the boundary's beyond the ends); a halo over an empty input writes an empty one."""
    tmp, spec = work
    code, err = _run(_map(spec, "-i", "x.npy", "-o", "y.npy", "--halo", "10" * 10,
                          kernel="sten"), capsys)
    assert "--halo" in _one_line(code, err)
    code, err = _run(_map(spec, "-i", "x.npy", "-o", "y.npy", "--halo", "1000",
                          kernel="sten"), capsys)
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp / "y.npy")[:3], [0, 0, 0])  # rows -1000..-998
    np.save(tmp / "e.npy", np.zeros(0, np.float32))
    code, err = _run(_map(spec, "-i", "e.npy", "-o", "e_out.npy", "--halo", "5",
                          kernel="sten"), capsys)
    assert code == 0, err
    assert np.load(tmp / "e_out.npy").shape == (0,)


@pytest.mark.parametrize(("shape", "want"), [("0", (0,)), ("5,0", (5, 0)), ("0,3", (0, 3)),
                                             ("-1", (0,))])
def test_guard_an_empty_raw_file_with_zero_sized_shapes(work, capsys, shape, want):
    """guard: an empty raw file read with shapes of no elements writes that shape."""
    tmp, spec = work
    (tmp / "r0.bin").write_bytes(b"")
    code, err = _run(_map(spec, "-i", "r0.bin", "--dtype", "float32", f"--shape={shape}",
                          "-o", "y.npy"), capsys)
    assert code == 0, err
    assert np.load(tmp / "y.npy").shape == want


def test_guard_zero_byte_rows_of_a_raw_file_are_refused(work, capsys):
    """guard: --shape -1,0 (rows of no bytes: any number of them) is exit 2 naming
    --shape."""
    tmp, spec = work
    (tmp / "r0.bin").write_bytes(b"")
    code, err = _run(_map(spec, "-i", "r0.bin", "--dtype", "float32", "--shape=-1,0", "-o",
                          "y.npy"), capsys)
    assert "--shape" in _one_line(code, err)


def test_guard_output_paths_that_are_no_file_are_refused(work, capsys):
    """guard: an output under a file, in a missing folder, that is a folder named .npy, or
    two spellings of one file: exit 2, nothing written."""
    tmp, spec = work
    (tmp / "dir.npy").mkdir()
    for outputs, phrase in [(["x.npy/y.npy"], "Not a directory"),
                            (["nodir/y.npy"], "does not exist"),
                            (["dir.npy"], "is a folder"), (["dir.npy/"], "is a folder"),
                            (["y.npy", "./y.npy"], "one file")]:
        argv = _map(spec, "-i", "x.npy")
        for out in outputs:
            argv += ["-o", out]
        code, err = _run(argv, capsys)
        assert phrase in _one_line(code, err), outputs
    assert sorted(os.listdir(tmp)) == ["dir.npy", "k.cl", "x.npy"]
    assert os.listdir(tmp / "dir.npy") == []


def test_guard_cache_commands_on_a_cache_dir_that_is_a_file(work, capsys, monkeypatch):
    """guard: CONVEYOR_CACHE_DIR naming a file: ``cache info`` says the cache is off (exit 0),
    ``cache clear`` exit 2 saying it neither reads nor changes it; the file is untouched, and
    a map still streams (one warning line)."""
    tmp, spec = work
    (tmp / "notadir").write_text("mine")
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp / "notadir"))
    code, out, err = _run_out(["cache", "info"], capsys)
    assert code == 0 and "off" in out and "Traceback" not in err, (out, err)
    code, err = _run(["cache", "clear"], capsys)
    assert "neither reads nor changes it" in _one_line(code, err)
    code, err = _run(_map(spec, "-i", "x.npy", "-o", "y.npy"), capsys)
    assert code == 0 and "Traceback" not in err, err
    assert (tmp / "notadir").read_text() == "mine"
    np.testing.assert_array_equal(np.load(tmp / "y.npy"), 2 * X)


@pytest.mark.parametrize(("value", "phrase"), [("relcache", "absolute path"),
                                               ("~nosuchuser15/x", "no home directory")])
def test_guard_cache_dirs_that_are_no_place_are_one_line(work, capsys, monkeypatch, value,
                                                         phrase):
    """guard: a relative CONVEYOR_CACHE_DIR or one under an unknown user's ~: exit 2 naming
    the variable, and no folder made."""
    tmp, _ = work
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", value)
    for action in ("info", "clear"):
        code, err = _run(["cache", action], capsys)
        line = _one_line(code, err)
        assert "CONVEYOR_CACHE_DIR" in line and phrase in line, line
    assert sorted(os.listdir(tmp)) == ["k.cl", "x.npy"]


def test_guard_cache_and_devices_take_no_extra_words(work, capsys):
    """guard: ``cache info extra``, ``cache clear --force`` and ``devices --json`` are usage
    errors (exit 2), not ignored."""
    for argv in (["cache", "info", "extra"], ["cache", "clear", "--force"],
                 ["devices", "--json"]):
        code, err = _run(argv, capsys)
        assert "unrecognized arguments" in _one_line(code, err), argv


def test_guard_demo_and_bench_refuse_sizes_before_any_work(work, capsys):
    """guard: demo --mib 0/-1, bench --runs 0, --mib past host memory, --max-spread nan:
    exit 2, one line each."""
    tmp, _ = work
    for argv, phrase in [(["demo", "--mib", "0"], "--mib 0"), (["demo", "--mib", "-1"], "--mib"),
                         (["bench", "--runs", "0"], "--runs"),
                         (["bench", "--mib", "99999999999", "--runs", "1"], "host memory"),
                         (["bench", "--mib", "1", "--max-spread", "nan"], "--max-spread")]:
        code, err = _run(argv, capsys)
        assert phrase in _one_line(code, err), argv
    assert sorted(os.listdir(tmp)) == ["k.cl", "x.npy"]
