"""The ``conveyor`` command on a real device: map and reduce round-trip against NumPy; every
bad input exits 2 with one line saying what to change and writes nothing; Ctrl-C mid-run
leaves no output; ``conveyor demo`` runs green. Then (issue 18) what shell users expect, each
checked by running the real command: help and version, the stream's options, errors in the
command's terms, no clobbering, JSON and quiet output, progress only on a terminal, compile
errors naming the kernel file, bench medians, Ctrl-C at start-up."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
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
                "--device", device.spec, "--memory-limit", "64KiB", "--no-progress",
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
                "--op", "sum", "--device", device.spec, "--no-progress")
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
        "infinite block bytes": ["--kernel", "saxpy", *base, "--block-bytes", "1e400"],
        "infinite memory limit": ["--kernel", "saxpy", *base, "--memory-limit", "1e99999GiB"],
        # One rule with cv.stream: K could be 1000 or 1024, so a bare K is refused.
        "ambiguous size unit": ["--kernel", "saxpy", *base, "--block-bytes", "64K"],
        "no --kernel": [*base],
        "trace onto the output": ["--kernel", "saxpy", *base, "-o", tmp / "out.npy",
                                  "--trace", tmp / "out.npy"],
        "output twice": ["--kernel", "saxpy", *base, "-o", tmp / "out.npy", "-o",
                         tmp / "out.npy"],
    }


@pytest.mark.parametrize("case", [
    "truncated input", "lengths disagree", "output folder missing", "no such kernel",
    "wrong arg count", "not a number", "raw without dtype", "missing input",
    "bad memory limit", "memory limit too small", "infinite block bytes",
    "infinite memory limit", "ambiguous size unit", "no --kernel", "trace onto the output",
    "output twice",
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


@pytest.mark.parametrize(("argv", "phrase"), [
    (["-o", "out.npy", "--trace", "out.npy"], "-o out.npy and --trace out.npy are one file"),
    (["-o", "sub/"], "-o sub/ is a folder: name a .npy file in it, e.g. sub/out.npy"),
], ids=["trace onto the output", "output a folder"])
def test_files_written_twice_or_folders_are_named_in_cli_terms(device, files, capsys,
                                                                 monkeypatch, argv, phrase):
    tmp, _, _ = files
    (tmp / "sub").mkdir()
    monkeypatch.chdir(tmp)
    code = _run(tmp, "map", _kernel_file(device), "--kernel", "saxpy", "-i", "x.npy", "-i",
                "y.npy", "--arg", "2", "--device", device.spec, *argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and phrase in err, err
    assert not (tmp / "out.npy").exists()


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


# -- issue 18: the command as shell users expect it (subprocess runs of the real command) ----
def _command() -> list[str]:
    script = Path(sys.executable).with_name("conveyor")  # the console script, where installed
    return [str(script)] if script.exists() else [sys.executable, "-m", "conveyor.cli"]


def conveyor(*argv, cwd: Path, env: dict[str, str] | None = None, stderr=subprocess.PIPE,
             prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run ``conveyor ARGV`` in ``cwd``; stdout and stderr come back as text."""
    return subprocess.run([*prefix, *_command(), *(str(a) for a in argv)], cwd=cwd,
                          env=env or _env(), stdout=subprocess.PIPE, stderr=stderr, text=True,
                          timeout=120)


def _saxpy(device, tmp: Path, *extra) -> list:
    return ["map", _kernel_file(device), "--kernel", "saxpy", "-i", "x.npy", "-i", "y.npy",
            "--arg", "2", "--device", device.spec, *extra]


def test_version_and_bare_commands_print_help(tmp_path):
    done = conveyor("--version", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "conveyor 0.1.0"
    bare = conveyor(cwd=tmp_path)
    assert bare.returncode == 2, bare.stderr
    assert "usage: conveyor" in bare.stderr and "reduce" in bare.stderr
    assert "Exit codes" in bare.stderr and "error" not in bare.stderr
    cache = conveyor("cache", cwd=tmp_path)
    assert cache.returncode == 2 and "info" in cache.stderr and "clear" in cache.stderr
    assert "error" not in cache.stderr


@pytest.mark.parametrize("command", ["devices", "map", "reduce", "demo", "bench", "cache"])
def test_every_option_has_help_with_its_default(tmp_path, command):
    done = conveyor(command, "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("options:")[1].splitlines()
    for i, line in enumerate(lines):
        if line.startswith("  -"):
            same_line = len(line.strip().split("  ")) > 1
            next_line = i + 1 < len(lines) and lines[i + 1].startswith(" " * 10)
            assert same_line or next_line, f"{command}: {line.strip()} has no help"
    text = " ".join(done.stdout.split())
    expected = {"map": ["--depth N blocks in flight at once (default: 3)"],
                "reduce": ["(default: sum)", "(default: 3)"], "bench": ["(default: 5)"],
                "demo": ["(default: 256)"]}
    for needle in expected.get(command, []):
        assert needle in text, text


@pytest.mark.parametrize("argv", [["devices"], ["cache", "info"]], ids=["devices", "cache"])
def test_a_closed_stdout_pipe_exits_141_without_a_message(tmp_path, argv):
    # As `conveyor devices | head -1`, deterministically: the pipe's reader is gone before
    # the command starts. Before: exit 1 and "Broken pipe: check the path and its permissions".
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([*_command(), *argv], cwd=tmp_path, env=_env(), stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert done.returncode == 141 and done.stderr == "", done.stderr


def test_cache_info_does_not_create_the_folder(tmp_path):
    folder = tmp_path / "no" / "cache"
    env = dict(_env(), CONVEYOR_CACHE_DIR=str(folder))
    for action in ("info", "clear"):
        done = conveyor("cache", action, cwd=tmp_path, env=env)
        assert done.returncode == 0 and "does not exist yet" in done.stdout, done.stderr
    assert not (tmp_path / "no").exists()


def test_depth_block_bytes_and_workers_reach_the_stream(device, files):
    tmp, x, y = files
    done = conveyor(*_saxpy(device, tmp, "-o", "out.npy", "--depth", "2", "--block-bytes",
                            "64KiB", "--workers", "2", "--json"), cwd=tmp)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["depth"] == 2 and figures["block_rows"] == 65536 // 4
    assert np.array_equal(np.load(tmp / "out.npy"), np.float32(2) * x + y)


def test_json_failure_is_one_json_object_on_stdout(device, files):
    # With --json a script reads stdout; a failure printed only a line on stderr, so the
    # script got an empty stdout and a JSON decode error instead of the reason.
    tmp, _, _ = files
    bad = conveyor(*_saxpy(device, tmp, "-o", "out.npy", "--depth", "2", "--block-bytes",
                           "64K", "--json"), cwd=tmp)
    assert bad.returncode == 2
    failure = json.loads(bad.stdout)
    assert failure["exit_code"] == 2 and failure["type"] == "UsageError"  # argparse's
    assert "64K" in failure["error"] and "64K" in bad.stderr
    assert not (tmp / "out.npy").exists()
    missing = conveyor(*_saxpy(device, tmp, "-o", "out.npy", "--json"), "--kernel", "nope",
                       cwd=tmp)
    assert missing.returncode == 2, missing.stderr
    failure = json.loads(missing.stdout)
    assert failure["type"] == "InputError" and "nope" in failure["error"]
    assert failure["error"] in missing.stderr


_PYTHON_WORDS = ("block_bytes", "memory_limit", "astype", "args=", "inputs=", "outputs=",
                 "halo=", "np.", "depth must")


def test_cast_converts_an_input_and_errors_say_so(device, files):
    tmp, x, y = files
    np.save(tmp / "x64.npy", x.astype(np.float64))
    argv = ["map", _kernel_file(device), "--kernel", "saxpy", "-i", "x64.npy", "-i", "y.npy",
            "--arg", "2", "--device", device.spec, "-o", "out.npy"]
    refused = conveyor(*argv, cwd=tmp)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert "--cast x:float32" in refused.stderr and "x64.npy" in refused.stderr
    assert "or declare the parameter double* in the kernel" in refused.stderr, refused.stderr
    assert not any(word in refused.stderr for word in _PYTHON_WORDS), refused.stderr
    done = conveyor(*argv, "--cast", "x:float32", "--block-bytes", "16KiB", cwd=tmp)
    assert done.returncode == 0, done.stderr
    assert np.array_equal(np.load(tmp / "out.npy"), np.float32(2) * x + y)


@pytest.mark.parametrize(("argv", "expected"), [
    (["--arg", "1e40", "-o", "out.npy"], "--arg 1e+40 cannot be passed as kernel parameter"),
    (["--arg", "2", "-o", "out.npy", "--trace", "no/t.json"],
     "--trace no/t.json: folder"),
], ids=["arg out of range", "trace folder missing"])
def test_late_checked_errors_name_the_options_too(device, files, capsys, monkeypatch, argv,
                                                   expected):
    tmp, _, _ = files
    monkeypatch.chdir(tmp)
    code = _run(tmp, "map", _kernel_file(device), "--kernel", "saxpy", "-i", "x.npy", "-i",
                "y.npy", "--device", device.spec, *argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and expected in err, err
    assert "args[" not in err and "trace=" not in err, err


@pytest.mark.parametrize("extra, expected", [
    (["--memory-limit", "100"], "--memory-limit"),
    (["--block-bytes", "2"], "--block-bytes 4 or more"),
    (["--halo", "100000", "--block-bytes", "4KiB"], "--halo"),
    (["--arg", "3"], "--arg values"),
], ids=["memory limit", "block bytes", "halo", "arg count"])
def test_errors_name_the_options_that_fix_them(device, files, extra, expected):
    tmp, _, _ = files
    done = conveyor(*_saxpy(device, tmp, "-o", "out.npy", *extra), cwd=tmp)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert expected in done.stderr
    assert not any(word in done.stderr for word in _PYTHON_WORDS), done.stderr
    assert not (tmp / "out.npy").exists()


@pytest.mark.parametrize("extra", [["--dtype", "float32"], ["--shape", "-1,1"],
                                   ["--column", "v"], ["-i", "x.npy:v"]])
def test_options_that_would_be_ignored_are_errors(device, files, extra):
    tmp, _, _ = files
    done = conveyor(*_saxpy(device, tmp, "-o", "out.npy", *extra), cwd=tmp)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp / "out.npy").exists()


def test_shape_with_a_leading_minus_parses(device, files):
    tmp, x, _ = files
    rows = x[: 3 * (len(x) // 3)].reshape(-1, 3)
    rows.tofile(tmp / "rows.bin")
    done = conveyor("reduce", _kernel_file(device), "--kernel", "positive", "-i", "rows.bin",
                    "--dtype", "float32", "--shape", "-1,3", "-q", "--device", device.spec,
                    cwd=tmp)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) == pytest.approx(float(rows[rows > 0].sum(dtype=np.float64)),
                                               rel=1e-4)


def test_parquet_columns_as_separate_inputs(device, files):
    tmp, x, y = files
    pa = pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (conveyor[parquet])")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": x, "y": y}), tmp / "t.parquet", row_group_size=7000)
    done = conveyor("map", _kernel_file(device), "--kernel", "saxpy", "-i", "t.parquet:x",
                    "-i", "t.parquet:y", "-o", "out.npy", "--arg", "2", "--device",
                    device.spec, cwd=tmp)
    assert done.returncode == 0, done.stderr
    assert np.array_equal(np.load(tmp / "out.npy"), np.float32(2) * x + y)


def test_existing_files_are_replaced_only_with_force(device, files):
    tmp, x, y = files
    np.save(tmp / "out.npy", np.zeros(3, np.float32))
    (tmp / "run.json").write_text("keep")
    for argv in (["-o", "out.npy"], ["-o", "new.npy", "--trace", "run.json"]):
        done = conveyor(*_saxpy(device, tmp, *argv), cwd=tmp)
        assert done.returncode == 2 and "add --force" in done.stderr, done.stderr
    assert np.load(tmp / "out.npy").shape == (3,) and not (tmp / "new.npy").exists()
    assert (tmp / "run.json").read_text() == "keep"
    done = conveyor(*_saxpy(device, tmp, "-o", "out.npy", "--trace", "run.json", "--force"),
                    cwd=tmp)
    assert done.returncode == 0, done.stderr
    assert np.array_equal(np.load(tmp / "out.npy"), np.float32(2) * x + y)
    assert "traceEvents" in (tmp / "run.json").read_text()


def test_json_and_quiet_print_the_result(device, files):
    tmp, x, _ = files
    expected = float(x[x > 0].sum(dtype=np.float64))
    argv = ["reduce", _kernel_file(device), "--kernel", "positive", "-i", "x.npy",
            "--device", device.spec]
    figures = json.loads(conveyor(*argv, "--json", cwd=tmp).stdout)
    assert figures["result"] == pytest.approx(expected, rel=1e-4)
    assert figures["bytes_in"] == x.nbytes and figures["gbps_in"] > 0 and figures["blocks"] >= 1
    quiet = conveyor(*argv, "-q", cwd=tmp)
    assert quiet.returncode == 0 and float(quiet.stdout) == pytest.approx(expected, rel=1e-4)
    assert len(quiet.stdout.splitlines()) == 1
    mapped = conveyor(*_saxpy(device, tmp, "-o", "out.npy", "-q"), cwd=tmp)
    assert mapped.returncode == 0 and mapped.stdout == "" and (tmp / "out.npy").exists()
    mapped = conveyor(*_saxpy(device, tmp, "-o", "out.npy", "--json", "--force"), cwd=tmp)
    assert json.loads(mapped.stdout)["outputs"] == ["out.npy"]


def _stderr_on_a_terminal(argv, cwd: Path) -> str:
    """Run ``conveyor ARGV`` with stderr on a pseudo-terminal (80 columns); return what it
    wrote there."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    chunks: list[bytes] = []

    def drain() -> None:  # read as it comes, so a full terminal buffer never blocks the child
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the child closed its end
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        done = conveyor(*argv, cwd=cwd, stderr=slave)
    finally:
        os.close(slave)
        reader.join(timeout=60)
        os.close(master)
    assert done.returncode == 0
    return b"".join(chunks).decode(errors="replace")


def test_progress_bar_only_where_a_person_looks(device, files):
    tmp, _, _ = files
    argv = ["reduce", _kernel_file(device), "--kernel", "positive", "-i", "x.npy",
            "--block-bytes", "16KiB", "--device", device.spec]
    bar = re.compile(r"conveyor:\s+\d+%\|")
    piped = conveyor(*argv, cwd=tmp)
    assert piped.returncode == 0 and "\r" not in piped.stderr and not bar.search(piped.stderr)
    assert bar.search(conveyor(*argv, "--progress", cwd=tmp).stderr)
    assert bar.search(_stderr_on_a_terminal(argv, tmp))
    assert not bar.search(_stderr_on_a_terminal([*argv, "--no-progress"], tmp))


def test_demo_writes_only_what_it_is_asked_with_the_mode_of_outputs(device, files):
    tmp, _, _ = files
    before = sorted(p.name for p in tmp.iterdir())
    done = conveyor("demo", "--device", device.spec, "--mib", "4", cwd=tmp)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp.iterdir()) == before
    umask = ("sh", "-c", 'umask 027 && exec "$@"', "sh")
    done = conveyor("demo", "--device", device.spec, "--mib", "4", "--trace", "demo.json",
                    "--plot", "demo.png", cwd=tmp, prefix=umask)
    assert done.returncode == 0, done.stderr
    done = conveyor(*_saxpy(device, tmp, "-o", "out.npy", "--trace", "map.json"), cwd=tmp,
                    prefix=umask)
    assert done.returncode == 0, done.stderr
    written = ["out.npy", "map.json", "demo.json"]
    if importlib.util.find_spec("matplotlib") is not None:
        written.append("demo.png")
    assert {name: (tmp / name).stat().st_mode & 0o777 for name in written} == \
        {name: 0o640 for name in written}


def test_compile_error_names_the_kernel_file(device, files):
    tmp, _, _ = files
    bad = "bad" + Path(_kernel_file(device)).suffix
    # The prelude only where NVRTC needs it: NVIDIA's OpenCL ignores its "#line 1" and would
    # (rightly) count the file's own lines.
    prelude = PRELUDE if device.backend == "cuda" else ""
    (tmp / bad).write_text(prelude + "__kernel void k(__global const float *x, __global float "
                           "*y, ulong offset, ulong n) {\n  y[0] = x[0] + undefined_thing;\n}\n")
    done = conveyor("map", bad, "--kernel", "k", "-i", "x.npy", "-o", "out.npy", "--device",
                    device.spec, cwd=tmp)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("conveyor map: "), done.stderr  # nothing stray before it
    assert f"{bad}:2:" in done.stderr or f"{bad}(2)" in done.stderr, done.stderr
    assert "tempfile_" not in done.stderr and "default_program" not in done.stderr


def test_bench_reports_medians_and_says_when_too_noisy(device, tmp_path):
    argv = ["bench", "--device", device.spec, "--mib", "1", "--runs", "3"]
    noisy = conveyor(*argv, "--max-spread", "0", cwd=tmp_path)
    assert noisy.returncode == 0, noisy.stderr
    assert "median of 3 runs" in noisy.stdout and "spread" in noisy.stdout
    assert "too noisy to compare" in noisy.stdout
    calm = conveyor(*argv, "--max-spread", "1e12", cwd=tmp_path)
    assert calm.returncode == 0 and "too noisy" not in calm.stdout, calm.stdout


# Imported at start-up by any Python whose path holds this folder: it stops the import of
# $HOLD_IMPORT, says so on stderr, and waits there for the test's Ctrl-C.
HOLD_IMPORT = '''
import os, sys, time
class _Hold:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ.get("HOLD_IMPORT"):
            os.write(2, b"holding import\\n")
            # Short sleeps: a Ctrl-C that lands between the write and one long sleep was
            # only seen when that sleep ended (a CI run under load waited the whole 60 s).
            for _ in range(600):
                time.sleep(0.1)
        return None
sys.meta_path.insert(0, _Hold())
'''


@pytest.mark.parametrize("module", ["argparse", "numpy", "pyopencl"],
                         ids=["parsing", "imports", "device discovery"])
def test_ctrl_c_during_start_up_exits_130_in_one_line(tmp_path, module):
    (tmp_path / "sitecustomize.py").write_text(HOLD_IMPORT)
    env = _env()
    env.update(PYTHONPATH=os.pathsep.join([str(tmp_path), env["PYTHONPATH"]]),
               HOLD_IMPORT=module)
    child = subprocess.Popen([*_command(), "devices"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stderr is not None
    assert child.stderr.readline() == "holding import\n"
    child.send_signal(signal.SIGINT)
    _, stderr = child.communicate(timeout=60)
    assert child.returncode == 130, stderr
    assert re.fullmatch(r"conveyor( devices)?: interrupted\n", stderr), stderr
