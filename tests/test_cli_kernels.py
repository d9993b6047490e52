"""The command with kernel files and caches as users have them: a kernel file that is not
UTF-8, kernels named by a macro or hidden in ``#if 0``, the library's Python advice put in the
command's options (``--op``, ``--arg``), ``cache info/clear`` on a refused folder or with
entries that are not files, ``bench --max-spread`` values, and ``demo --mib 1``'s sizes.
Each failure is one line and exit 2 (or 1 where it is not the input's fault)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conveyor.cli import main

SRC = str(Path(__file__).resolve().parents[1] / "src")

MACRO_KERNELS = """
#define MAKE(T) __kernel void add_##T(__global const T *x, __global T *y, ulong offset, \\
                                      ulong n) { ulong i = get_global_id(0); \\
                                                 if (i < n) y[i] = x[i] + (T)1; }
MAKE(float)
#if 0
__kernel void hidden(__global const float *x, __global float *y, ulong offset, ulong n) {}
#endif
"""

PLAIN_KERNELS = """
__kernel void add(__global const float *x, __global float *y, __global const float *table,
                  ulong offset, ulong n) {}
__kernel void positive(__global const float *x, __global float *r, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) r[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
"""


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A scratch folder with x.npy (float32), empty.npy, and a private kernel cache."""
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CONVEYOR_NO_CACHE", raising=False)
    np.save(tmp_path / "x.npy", np.arange(1000, dtype=np.float32))
    np.save(tmp_path / "empty.npy", np.zeros(0, np.float32))
    (tmp_path / "m.cl").write_text(MACRO_KERNELS)
    (tmp_path / "p.cl").write_text(PLAIN_KERNELS)
    return tmp_path


def _opencl(device) -> None:
    if device.backend != "opencl":
        pytest.skip("the kernels here are OpenCL C (.cl)")


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return dict(os.environ, PYTHONPATH=path, **extra)


def conveyor(*argv: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """The real command in a new process (its stderr as a user sees it, warnings included)."""
    return subprocess.run([sys.executable, "-m", "conveyor.cli", *argv], cwd=cwd,
                          env=_env(**env), capture_output=True, text=True, timeout=120)


# -- 2: a kernel file that is not UTF-8 -------------------------------------------------------
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_kernel_file_that_is_not_utf8_is_one_line(folder, capsys, as_json):
    kernel = folder / "latin1.cl"
    kernel.write_bytes(b"// caf\xf6 au lait\n__kernel void k(__global const float *x, "
                       b"__global float *y, ulong offset, ulong n) {}\n")
    argv = ["map", str(kernel), "--kernel", "k", "-i", str(folder / "x.npy"), "-o",
            str(folder / "out.npy"), *(["--json"] if as_json else [])]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    line = _one_line(err)
    assert str(kernel) in line and "not UTF-8" in line and "offset 6" in line, line
    assert "0xf6" in line and "save it as UTF-8" in line, line
    if as_json:
        failure = json.loads(out)
        assert failure["type"] == "InputError" and failure["exit_code"] == 2
    assert not (folder / "out.npy").exists()


# -- 3: kernel names as the compiler sees them --------------------------------------------------
def test_a_kernel_named_by_a_macro_runs(device, folder, capsys):
    _opencl(device)
    code = main(["map", str(folder / "m.cl"), "--kernel", "add_float", "-i",
                 str(folder / "x.npy"), "-o", str(folder / "out.npy"), "--device", device.spec,
                 "-q", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    np.testing.assert_array_equal(np.load(folder / "out.npy"),
                                  np.arange(1000, dtype=np.float32) + 1)


def test_a_kernel_inside_if_0_is_not_a_kernel(device, folder, capsys):
    _opencl(device)
    code = main(["map", str(folder / "m.cl"), "--kernel", "hidden", "-i",
                 str(folder / "x.npy"), "-o", str(folder / "out.npy"), "--device", device.spec])
    assert code == 2
    line = _one_line(capsys.readouterr().err)
    assert "no kernel named 'hidden'" in line and "kernels found: add_float" in line, line
    assert "INVALID_KERNEL_NAME" not in line and not (folder / "out.npy").exists()


def test_a_wrong_kernel_name_lists_the_expanded_names_before_reading_inputs(folder, capsys):
    # No #if in the source: settled before any device opens or any input is read (the input
    # named does not even exist).
    (folder / "n.cl").write_text(MACRO_KERNELS.split("#if 0")[0] + "MAKE(int)\n")
    code = main(["map", str(folder / "n.cl"), "--kernel", "add_", "-i",
                 str(folder / "missing.npy"), "-o", str(folder / "out.npy")])
    assert code == 2
    line = _one_line(capsys.readouterr().err)
    assert "no kernel named 'add_'" in line and "kernels found: add_float, add_int" in line


# -- 4: the library's Python advice in the command's options ----------------------------------
def test_reduce_min_of_nothing_says_op_sum(device, folder, capsys):
    _opencl(device)
    code = main(["reduce", str(folder / "p.cl"), "--kernel", "positive", "-i",
                 str(folder / "empty.npy"), "--op", "min", "--device", device.spec])
    assert code == 2
    line = _one_line(capsys.readouterr().err)
    assert "--op min over an empty input" in line and "use --op sum" in line, line
    assert "reduce=" not in line


def test_arg_for_a_pointer_says_what_the_command_can_do(device, folder, capsys):
    _opencl(device)
    code = main(["map", str(folder / "p.cl"), "--kernel", "add", "-i", str(folder / "x.npy"),
                 "-o", str(folder / "out.npy"), "--arg", "1.5", "--device", device.spec])
    assert code == 2
    line = _one_line(capsys.readouterr().err)
    assert "'table' is a pointer" in line and "--arg passes numbers only" in line, line
    assert "-i or -o file" in line and "cv.resident" not in line, line
    assert not (folder / "out.npy").exists()


# -- 5 and 1: cache clear / info --------------------------------------------------------------
def test_cache_clear_of_a_refused_folder_says_so_without_python_lines(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (cache / ("a" * 64 + ".bin")).write_bytes(b"entry")
    os.chmod(cache, 0o770)  # refused whoever runs it, root included
    done = conveyor("cache", "clear", cwd=tmp_path, CONVEYOR_CACHE_DIR=str(cache))
    assert done.returncode == 2, done
    line = _one_line(done.stderr)
    assert line.startswith("conveyor cache: cannot clear the kernel cache"), line
    assert "writable by group or others" in line and "removed" not in done.stdout
    assert "RuntimeWarning" not in done.stderr
    assert (cache / ("a" * 64 + ".bin")).exists()
    info = conveyor("cache", "info", cwd=tmp_path, CONVEYOR_CACHE_DIR=str(cache))
    assert info.returncode == 0 and info.stderr == "", info.stderr
    assert "off (the directory is writable by group or others" in info.stdout


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a mode-0500 folder anyway")
def test_cache_clear_of_a_read_only_folder_says_so(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (cache / ("a" * 64 + ".bin")).write_bytes(b"entry")
    os.chmod(cache, 0o500)
    try:
        done = conveyor("cache", "clear", cwd=tmp_path, CONVEYOR_CACHE_DIR=str(cache))
    finally:
        os.chmod(cache, 0o700)
    assert done.returncode == 2 and "not writable" in _one_line(done.stderr), done
    assert "RuntimeWarning" not in done.stderr


def test_cache_clear_removes_entries_that_are_folders(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (cache / ("a" * 64 + ".bin")).mkdir()
    (cache / ("a" * 64 + "-" + "1" * 32 + ".sig")).mkdir()
    full = cache / ("b" * 64 + ".bin")
    full.mkdir()
    (full / "kept").write_text("someone's")
    env = {"CONVEYOR_CACHE_DIR": str(cache)}
    info = conveyor("cache", "info", cwd=tmp_path, **env)
    assert info.returncode == 0 and "0 entries" in info.stdout, info
    assert "2 not a regular file" in info.stdout, info.stdout
    done = conveyor("cache", "clear", cwd=tmp_path, **env)
    assert done.returncode == 1, done  # the folder with a file in it stays, and it says so
    line = _one_line(done.stderr)
    assert "removed 1 entries" in line and full.name in line and "not empty" in line, line
    assert sorted(p.name for p in cache.iterdir()) == [full.name]
    assert (full / "kept").exists()
    (full / "kept").unlink()
    again = conveyor("cache", "clear", cwd=tmp_path, **env)
    assert again.returncode == 0 and "removed 1 entries" in again.stdout, again
    assert list(cache.iterdir()) == []


# -- 6: bench --max-spread, demo sizes ---------------------------------------------------------
@pytest.mark.parametrize("value", ["nan", "-5", "inf", "-inf"])
def test_bench_refuses_a_max_spread_that_is_no_finite_percentage(tmp_path, capsys, value):
    # Refused before any device opens; "=" because argparse takes "-inf" for an option.
    assert main(["bench", f"--max-spread={value}", "--runs", "1"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"--max-spread {value}" in line and "finite number >= 0" in line, line


def test_sizes_below_a_mib_print_in_kib():
    from conveyor.demo import size_text

    assert size_text(256 * 1024) == "256 KiB"
    assert size_text(0) == "0 KiB"
    assert size_text(64 * 2**20) == "64 MiB"
    assert size_text(1.25 * 2**20) == "1.2 MiB"


def test_demo_with_one_mib_prints_its_limit_in_kib(device, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--mib", "1", "--device", device.spec]) == 0
    out = capsys.readouterr().out
    assert "memory limit 256 KiB" in out and "<= limit 256 KiB" in out, out
    assert "limit 0 MiB" not in out
