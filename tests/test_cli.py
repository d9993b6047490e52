"""The ``conveyor`` command on a real device: map and reduce round-trip against NumPy; every
bad input exits 2 with one line saying what to change and writes nothing; Ctrl-C mid-run
leaves no output; ``conveyor demo`` runs green."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conveyor.cli import main
from conveyor.kernels.portable import PRELUDE

SRC = str(Path(__file__).resolve().parents[1] / "src")

KERNELS = PRELUDE + """
__kernel void saxpy(__global const float *x, __global const float *y, __global float *out,
                    float a, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) out[i] = a * x[i] + y[i];
}
__kernel void positive(__global const float *x, __global float *r, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) r[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
__kernel void slow(__global const float *x, __global float *y, int reps, ulong offset,
                   ulong n) {
    ulong i = get_global_id(0);
    if (i < n) {
        float s = x[i];
        for (int k = 0; k < reps; k++) s = s * 0.9999f + 0.0001f;
        y[i] = s;
    }
}
"""


@pytest.fixture
def files(tmp_path):
    """A kernel file and two float32 .npy inputs in a scratch folder."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(50_000).astype(np.float32)
    y = rng.standard_normal(50_000).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    # One portable source (conveyor.kernels.portable) under both names: k.cl for OpenCL
    # devices, k.cu for CUDA ones (the CLI tells the language by the extension).
    (tmp_path / "k.cl").write_text(KERNELS)
    (tmp_path / "k.cu").write_text(KERNELS)
    return tmp_path, x, y


def _kernel_file(device):
    return "k.cu" if device.backend == "cuda" else "k.cl"


def _run(tmp_path, *argv):
    return main([str(a) if isinstance(a, Path) else a for a in argv])


def test_map_round_trip(device, files, capsys):
    tmp, x, y = files
    code = _run(tmp, "map", tmp / _kernel_file(device), "--kernel", "saxpy", "-i",
                tmp / "x.npy", "-i", tmp / "y.npy", "-o", tmp / "out.npy", "--arg", "2.5",
                "--device", device.spec, "--memory-limit", "64KiB", "--quiet",
                "--trace", tmp / "run.json")
    assert code == 0, capsys.readouterr().err
    assert np.allclose(np.load(tmp / "out.npy"), np.float32(2.5) * x + y, rtol=1e-6, atol=1e-6)
    assert (tmp / "run.json").exists()
    assert "GB/s" in capsys.readouterr().out


def test_map_raw_and_parquet_inputs(device, files):
    tmp, x, y = files
    x.tofile(tmp / "x.bin")
    code = _run(tmp, "map", tmp / _kernel_file(device), "--kernel", "saxpy", "-i", tmp / "x.bin",
                "-i", tmp / "y.npy", "-o", tmp / "raw.npy", "--arg", "2",
                "--dtype", "float32", "--device", device.spec, "--quiet")
    assert code == 0
    assert np.array_equal(np.load(tmp / "raw.npy"), np.float32(2) * x + y)
    pa = pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (conveyor[parquet])")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"v": x}), tmp / "x.parquet", row_group_size=7000)
    code = _run(tmp, "map", tmp / _kernel_file(device), "--kernel", "saxpy", "-i",
                tmp / "x.parquet",
                "-i", tmp / "y.npy", "-o", tmp / "pq.npy", "--arg", "2", "--column", "v",
                "--device", device.spec, "--quiet")
    assert code == 0
    assert np.array_equal(np.load(tmp / "pq.npy"), np.float32(2) * x + y)


def test_reduce_sum(device, files, capsys):
    tmp, x, _ = files
    code = _run(tmp, "reduce", tmp / _kernel_file(device), "--kernel", "positive", "-i",
                tmp / "x.npy",
                "--op", "sum", "--device", device.spec, "--quiet")
    assert code == 0
    line = [s for s in capsys.readouterr().out.splitlines() if s.startswith("sum = ")][0]
    assert float(line.split("=")[1]) == pytest.approx(float(x[x > 0].sum(dtype=np.float64)),
                                                      rel=1e-4)


def _bad_cases(tmp: Path) -> dict[str, list]:
    np.save(tmp / "short.npy", np.ones(10, np.float32))
    np.save(tmp / "cut.npy", np.ones(1000, np.float32))
    with open(tmp / "cut.npy", "r+b") as f:
        f.truncate(1000)
    (tmp / "k.cu").write_text(KERNELS)
    (tmp / "k.txt").write_text(KERNELS)
    base = ["-i", tmp / "x.npy", "-i", tmp / "y.npy", "--arg", "2", "--quiet"]
    return {
        "truncated input": ["--kernel", "saxpy", "-i", tmp / "cut.npy", *base[2:]],
        "lengths disagree": ["--kernel", "saxpy", "-i", tmp / "x.npy", "-i",
                             tmp / "short.npy", "--arg", "2"],
        "output folder missing": ["--kernel", "saxpy", *base, "-o", tmp / "no" / "out.npy"],
        "no such kernel": ["--kernel", "saxpie", *base],
        "wrong arg count": ["--kernel", "saxpy", "-i", tmp / "x.npy", "-i", tmp / "y.npy"],
        "not a number": ["--kernel", "saxpy", *base[:4], "--arg", "two"],
        "raw without dtype": ["--kernel", "saxpy", "-i", tmp / "k.txt", "-i", tmp / "y.npy",
                              "--arg", "2"],
        "missing input": ["--kernel", "saxpy", "-i", tmp / "none.npy", "-i", tmp / "y.npy"],
        "bad memory limit": ["--kernel", "saxpy", *base, "--memory-limit", "lots"],
        "memory limit too small": ["--kernel", "saxpy", *base, "--memory-limit", "100"],
        "no --kernel": [*base],
    }


@pytest.mark.parametrize("case", [
    "truncated input", "lengths disagree", "output folder missing", "no such kernel",
    "wrong arg count", "not a number", "raw without dtype", "missing input",
    "bad memory limit", "memory limit too small", "no --kernel",
])
def test_bad_input_exits_2_with_one_line_and_no_output(device, files, capsys, case):
    tmp, _, _ = files
    argv = _bad_cases(tmp)[case]
    out = tmp / "out.npy"
    if "-o" not in argv:
        argv = [*argv, "-o", out]
    try:
        code = _run(tmp, "map", tmp / _kernel_file(device), *argv, "--device", device.spec)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 or err.startswith("usage:"), err
    assert not out.exists() and not list(tmp.glob("*.part")) and not list(tmp.glob(".*part"))


def test_kernel_language_must_match_the_device(device, files, capsys):
    tmp, _, _ = files
    (tmp / "k.cu").write_text(KERNELS)
    (tmp / "k.txt").write_text(KERNELS)
    for kernel_file in ("k.txt", "k.cu" if device.backend == "opencl" else "k.cl"):
        code = _run(tmp, "map", tmp / kernel_file, "--kernel", "saxpy", "-i", tmp / "x.npy",
                    "-i", tmp / "y.npy", "-o", tmp / "out.npy", "--arg", "2",
                    "--device", device.spec)
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1, err
        assert ".cl" in err and ".cu" in err
    assert not (tmp / "out.npy").exists()


def test_plot_without_matplotlib_exits_2(device, files, capsys):
    if importlib.util.find_spec("matplotlib") is not None:
        pytest.skip("matplotlib is installed here")
    tmp, _, _ = files
    code = _run(tmp, "map", tmp / _kernel_file(device), "--kernel", "saxpy", "-i", tmp / "x.npy",
                "-i", tmp / "y.npy", "-o", tmp / "out.npy", "--arg", "2", "--plot",
                tmp / "p.png", "--device", device.spec)
    assert code == 2 and "conveyor[plot]" in capsys.readouterr().err
    assert not (tmp / "out.npy").exists()


def test_devices_cache_and_measure(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["devices"]) == 0
    assert "SPEC" in capsys.readouterr().out
    assert main(["cache", "info"]) == 0
    assert "entries" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0


def _env() -> dict[str, str]:
    path = os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return dict(os.environ, PYTHONPATH=path)


def test_sigint_mid_map_leaves_no_output(device, tmp_path):
    np.save(tmp_path / "x.npy", np.ones(200_000, np.float32))
    kernel_file = _kernel_file(device)
    (tmp_path / kernel_file).write_text(KERNELS)
    out = tmp_path / "y.npy"
    reps = "200000000" if device.kind == "gpu" else "20000"  # a few seconds on either
    child = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "map", kernel_file, "--kernel", "slow", "-i",
         "x.npy", "-o", "y.npy", "--arg", reps, "--memory-limit", "64KiB", "--quiet",
         "--device", device.spec],
        cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".y.npy.*.part")) and child.poll() is None:
        assert time.monotonic() < deadline, "the run never started"
        time.sleep(0.02)
    time.sleep(0.3)  # a few blocks in
    assert child.poll() is None, "the run finished before it could be interrupted"
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=60)
    assert child.returncode == 130, stdout + stderr
    assert "interrupted" in stderr
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([kernel_file, "x.npy"])


def test_demo_runs_green(device, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "demo", "--device", device.spec, "--mib", "32",
         "--trace", str(tmp_path / "demo.json"), "--plot", str(tmp_path / "demo.png")],
        env=_env(), capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "result checked against NumPy" in done.stdout
    assert (tmp_path / "demo.json").exists()
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "demo.png").stat().st_size > 0
