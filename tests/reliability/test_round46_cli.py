"""Round forty-six, the command line as its users meet it: ``conveyor map``/``reduce`` taken at
their ``--help``'s word, against ``cv.stream`` on the same data.

Tried and held (a seeded script kept outside the repository, /tmp/r46cli/fuzz.py: about 750
``map``/``reduce --json`` commands against ``cv.stream``: float, int and 2-D (rows of 3)
stencils and folds, 0 to 4,097 rows, halos 0 to 5 under every boundary mode and numbers,
``--op sum|min|max``, .npy and raw inputs, ``--cast`` (with and without ``NAME:``) from
float64, float16, int8, int16, int64 and uint16 files, ``--device`` one, ``opencl:all``, a
comma list and repeated in either order, ``--schedule dynamic|static``, ``--block-bytes``
64 B to 1 MiB, ``--depth`` 1 to 5): every output exact, every sum within float rounding, every
integer fold exact. Also held: struct outputs (``conveyor map`` writing a kernel's records)
and struct inputs with a halo under nearest/reflect/periodic on two devices; ``map``/``reduce``
of Parquet and Feather columns (``FILE:A,B``, ``--column`` twice, ``--cast`` of an int64
column) over two devices; in-place runs (``-o`` the ``-i`` file, ``--force``) with halos over
one and two devices; new files' modes under umasks 027/022/077 and kept modes under
``--force`` for ``-o``, ``--trace`` and ``--plot``; ``--trace``/``--plot`` without a suffix;
``--arg`` fractions, ``-0.5`` and ``4294967295.9`` for ``uint``, ``-128.7`` for ``char``,
``1_0``; ``--json`` of ``map`` over two devices agreeing with its table (blocks, rows, depth,
per-device blocks); device specs that match nothing, ``opencl:all``, ``cpu:all``, listed
twice; ``--memory-limit`` too small for one ring; wrong counts of ``-o``/``--arg``.

Found (strict xfails, each asserting the right behaviour):

- **Refused legal work**: ``--boundary -inf`` and ``--boundary -1e3`` (a negative number
  ``--help`` allows, "or a number") are usage errors, "argument --boundary: expected one
  argument": argparse takes a value that starts with ``-`` and is not a plain decimal for an
  option. ``--shape`` and ``--arg`` are joined to their values for this; ``--boundary`` is not.
- **JSON that does not parse**: ``conveyor reduce --json --scheduler ADDRESS`` (and
  ``--cluster local``) prints a NaN or infinite result as the bare tokens ``NaN`` /
  ``Infinity``, which no JSON parser but Python's takes (``jq`` refuses them); the local
  command writes them as the strings ``"nan"``/``"inf"``, as the README says.
- **Message**: ``--boundary 0`` for an input of records says "pass --boundary nearest,
  'reflect' or 'periodic'": one word rewritten into the option, the other two left as Python
  strings.

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import (  # noqa: E402, F401 (autouse, and the dask_client fixture)
    child_env,
    compiling_opencl_spec,
    two_worker_client,
)

import conveyor as cv  # noqa: E402
from conveyor.cli import main  # noqa: E402

SRC = str(Path(cv.__file__).resolve().parents[1])  # the conveyor under test, for children
SPEC = compiling_opencl_spec()
pytestmark = pytest.mark.skipif(SPEC is None, reason="no usable OpenCL device")

KERNELS = """
typedef struct { float x; int k; double w; } rec;
__kernel void sten(__global const float *x, __global float *y, ulong h, ulong offset, ulong n)
{ ulong i = get_global_id(0); if (i < n) y[i] = x[i] + 10.0f * x[i + 2 * h] + 100.0f * x[i + h]; }
__kernel void same(__global const float *x, __global float *r, ulong offset, ulong n)
{ ulong i = get_global_id(0); if (i < n) r[i] = x[i]; }
__kernel void mk(__global const float *a, __global rec *r, ulong h, ulong offset, ulong n)
{ ulong i = get_global_id(0);
  if (i < n) { r[i].x = a[i] + a[i + 2 * h]; r[i].k = (int)(offset + i); r[i].w = a[i + h]; } }
__kernel void rh(__global const rec *r, __global double *s, ulong h, ulong offset, ulong n)
{ ulong i = get_global_id(0);
  if (i < n) s[i] = r[i].x + 10.0 * r[i + 2 * h].k + 100.0 * r[i + h].w; }
"""


@pytest.fixture
def work(tmp_path, monkeypatch):
    """k.cl and a float32 x.npy in the current folder (tmp_path)."""
    monkeypatch.delenv("CONVEYOR_DEVICE", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.cl").write_text(KERNELS)
    x = np.random.default_rng(46).standard_normal(300).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    return tmp_path, x


def _run(argv, capsys) -> tuple[int, str, str]:
    """The command in this process (as ``main`` runs it for the console script)."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _child(argv, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conveyor", *map(str, argv)], cwd=cwd,
                          env=child_env(SRC), capture_output=True, text=True, timeout=120)


def _no_bare_constants(text: str) -> object:
    """JSON as RFC 8259 reads it: NaN, Infinity and -Infinity are no JSON."""

    def refuse(token: str) -> object:
        raise ValueError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


# --- Refused legal work ----------------------------------------------------------------------

def test_a_negative_boundary_written_as_inf_or_with_an_exponent_is_taken(work, capsys):
    tmp, x = work
    dev = cv.device(SPEC)
    kernel = dev.compile(KERNELS, "sten")
    failures = []
    for text, value in (("-2.5", -2.5), ("-inf", -np.inf), ("-1e3", -1000.0),
                        ("-1.5E1", -15.0)):
        code, _, err = _run(["map", "k.cl", "--kernel", "sten", "-i", "x.npy", "-o", "y.npy",
                             "--force", "--halo", 2, "--boundary", text, "--arg", 2,
                             "--device", SPEC, "--block-bytes", 256, "-q"], capsys)
        if code != 0:
            failures.append(f"--boundary {text}: exit {code}: {err.strip().splitlines()[-1]}")
            continue
        want = np.zeros_like(x)
        cv.stream(kernel, [x], [want], device=dev, halo=2, boundary=value, args=[2],
                  block_bytes=256)
        if not np.array_equal(np.load(tmp / "y.npy"), want):
            failures.append(f"--boundary {text}: not cv.stream's rows")
    assert not failures, failures


# --- JSON that must parse --------------------------------------------------------------------

def test_json_of_a_cluster_reduce_with_nan_or_inf_parses_as_the_local_one_does(work, capsys,
                                                                              dask_client):
    tmp, _ = work
    np.save(tmp / "odd.npy", np.array([1.0, np.inf, 2.0, 3.0], np.float32))
    np.save(tmp / "nan.npy", np.array([1.0, np.nan, 2.0, 3.0], np.float32))
    address = dask_client.scheduler.address
    seen = {}
    for name, op in (("nan.npy", "sum"), ("odd.npy", "max")):
        for where in ([], ["--scheduler", address]):
            code, out, err = _run(["reduce", "k.cl", "--kernel", "same", "-i", name, "--op", op,
                                   "--device", SPEC, "--json", *where], capsys)
            assert code == 0, err
            try:
                seen[name, bool(where)] = _no_bare_constants(out)["result"]
            except ValueError as exc:
                seen[name, bool(where)] = f"{exc}: {out.strip()[-60:]}"
    assert seen == {("nan.npy", False): "nan", ("nan.npy", True): "nan",
                    ("odd.npy", False): "inf", ("odd.npy", True): "inf"}


# --- Messages that say what to change --------------------------------------------------------

def test_a_number_boundary_for_records_names_the_modes_in_the_commands_words(work, capsys):
    tmp, _ = work
    records = np.zeros(20, [("x", "<f4"), ("k", "<i4"), ("w", "<f8")])
    np.save(tmp / "r.npy", records)
    code, out, err = _run(["map", "k.cl", "--kernel", "rh", "-i", "r.npy", "-o", "s.npy",
                           "--halo", 1, "--boundary", 0, "--arg", 1, "--device", SPEC],
                          capsys)
    assert code == 2 and not (tmp / "s.npy").exists()
    line = err.strip().splitlines()[-1]
    assert "--boundary nearest, reflect or periodic" in line, line
    assert "'" not in line.split("not numbers", 1)[1], line


# --- Guards ----------------------------------------------------------------------------------

def test_guard_records_written_then_read_with_a_halo_over_two_devices_match_the_library(work):
    """guard: ``conveyor map`` writes a kernel's struct records (halo, reflect, two devices),
    then a map of those records with a halo (periodic) reads them back; both exactly
    ``cv.stream``'s rows on one device, and nothing else is left in the folder."""
    tmp, x = work
    script = (
        "import sys\nfrom conveyor.cli import main\n"
        "common = ['--halo', '2', '--arg', '2', '--block-bytes', '512', '--device', "
        "'opencl:all', '-q']\n"
        "a = main(['map', 'k.cl', '--kernel', 'mk', '-i', 'x.npy', '-o', 'r.npy', "
        "'--boundary', 'reflect', *common])\n"
        "b = main(['map', 'k.cl', '--kernel', 'rh', '-i', 'r.npy', '-o', 's.npy', "
        "'--boundary', 'periodic', *common])\n"
        "sys.exit(a * 10 + b)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp, env=child_env(SRC),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    dev = cv.device(SPEC)
    records = np.zeros(len(x), np.load(tmp / "r.npy").dtype)
    cv.stream(dev.compile(KERNELS, "mk"), [x], [records], device=dev, halo=2,
              boundary="reflect", args=[2], block_bytes=512)
    np.testing.assert_array_equal(np.load(tmp / "r.npy"), records)
    sums = np.zeros(len(x))
    cv.stream(dev.compile(KERNELS, "rh"), [records], [sums], device=dev, halo=2,
              boundary="periodic", args=[2], block_bytes=512)
    np.testing.assert_array_equal(np.load(tmp / "s.npy"), sums)
    assert sorted(p.name for p in tmp.iterdir()) == ["k.cl", "r.npy", "s.npy", "x.npy"]
