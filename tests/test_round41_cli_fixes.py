"""Round forty-one's command-line and message fixes, beyond the hunter's tests
(tests/reliability/test_round41_environment.py): the compiler's stderr passed on as it comes,
standard streams that cannot encode a name, a kernel folder whose name is not UTF-8, a removed
current folder, and messages that name the variable to change (PYOPENCL_BUILD_OPTIONS, TMPDIR,
OCL_ICD_VENDORS, HOME). Real files, real PoCL devices, real child processes.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv
from conveyor import InputError
from conveyor.backends import diagnose
from conveyor.cli import main
from conveyor.kernels import build, buildlock
from conveyor.kernels.includes import anchor_includes

SRC = str(Path(cv.__file__).resolve().parents[1])
TWICE = """__kernel void twice(__global const float *a, __global float *out, ulong offset,
                    ulong n) {
    ulong i = get_global_id(0);
    if (i < n) out[i] = a[i] * 2.0f;
}
"""


@pytest.fixture(autouse=True)
def _opencl_c_only(request):
    """The kernels here are OpenCL C: a test given a CUDA device skips."""
    if "device" in request.fixturenames and request.getfixturevalue("device").backend != "opencl":
        pytest.skip("an OpenCL C kernel")


def _env(**extra: str) -> dict[str, str]:
    """The environment of a child running the conveyor under test."""
    path = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **extra)


def _files(tmp_path: Path) -> tuple[Path, Path]:
    kernel = tmp_path / "k.cl"
    kernel.write_text(TWICE)
    x = tmp_path / "x.npy"
    np.save(x, np.arange(100, dtype=np.float32))
    return kernel, x


# -- the compiler's stderr ---------------------------------------------------------------------
def test_compiler_lines_reach_stderr_when_the_process_ends_inside_the_block(tmp_path):
    # What a compiler writes before it ends the process from C (exit(1): no finally runs)
    # reaches stderr, less the summary line; the child's own line after the block too.
    code = ("import os\nfrom conveyor.cli.words import compiler_output\n"
            "with compiler_output():\n"
            "    os.write(2, b'1 error generated.\\nLLVM ERROR: said before the end\\n')\n"
            "    os._exit(3)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60,
                          env=_env())
    assert done.returncode == 3
    assert b"LLVM ERROR: said before the end\n" in done.stderr
    assert b"generated" not in done.stderr


def test_compiler_lines_come_before_what_the_command_says_after(tmp_path):
    # The filter has passed everything on when the block ends: a line printed after it
    # follows the compiler's, in order.
    code = ("import os, sys\nfrom conveyor.cli.words import compiler_output\n"
            "with compiler_output():\n"
            "    os.write(2, b'first\\n2 warnings generated.\\nsecond\\n')\n"
            "print('after', file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=_env())
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["first", "second", "after"]


def test_a_kernel_that_fails_to_build_shows_its_log_without_the_summary(device, tmp_path):
    kernel, x = _files(tmp_path)
    kernel.write_text(TWICE.replace("* 2.0f", "* undeclared_q"))
    done = subprocess.run([sys.executable, "-m", "conveyor", "map", str(kernel), "--kernel",
                           "twice", "-i", str(x), "-o", str(tmp_path / "y.npy"), "--device",
                           device.spec], capture_output=True, text=True, timeout=120,
                          env=_env(CONVEYOR_NO_CACHE="1"))
    assert done.returncode == 1
    assert "undeclared_q" in done.stderr
    assert "generated." not in done.stderr


# -- standard streams that cannot encode a name ------------------------------------------------
def test_the_command_prints_a_name_an_ascii_stdout_cannot_encode(device, tmp_path):
    kernel, x = _files(tmp_path)
    out = tmp_path / "y\u00e9.npy"
    done = subprocess.run([sys.executable, "-m", "conveyor", "map", str(kernel), "--kernel",
                           "twice", "-i", str(x), "-o", str(out), "--device", device.spec],
                          capture_output=True, timeout=120,
                          env=_env(PYTHONIOENCODING="ascii", CONVEYOR_NO_CACHE="1"))
    assert done.returncode == 0, done.stderr
    assert b"wrote " in done.stdout and b"y\\xe9.npy" in done.stdout
    np.testing.assert_array_equal(np.load(out), np.arange(100, dtype=np.float32) * 2)


def test_a_callers_strict_stdout_is_strict_again_after_the_command(tmp_path, monkeypatch):
    # In-process, the command escapes what the caller's stream cannot encode (a cache folder
    # named in Latin-1 under an ASCII stdout) and gives the stream back as it was.
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path / "cach\u00e9"))
    monkeypatch.delenv("CONVEYOR_NO_CACHE", raising=False)
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")
    monkeypatch.setattr(sys, "stdout", stdout)
    assert main(["cache", "info"]) == 0
    assert sys.stdout is stdout and stdout.errors == "strict"
    stdout.flush()
    assert b"cach\\xe9" in stdout.buffer.getvalue()


# -- a kernel folder whose name is not UTF-8 ----------------------------------------------------
def test_an_include_beside_a_kernel_in_a_latin1_folder_is_an_input_error(tmp_path):
    folder = tmp_path / os.fsdecode(b"caf\xe9")
    folder.mkdir()
    (folder / "h.h").write_text("#define F 2.0f\n")
    with pytest.raises(InputError) as caught:
        anchor_includes('#include "h.h"\n', folder, "kernel file k.cl")
    message = str(caught.value)
    assert message.startswith("kernel file k.cl includes 'h.h'")
    assert "caf\\xe9" in message and "UTF-8" in message
    # No include to anchor: the source is left as it is (it builds from any folder).
    assert anchor_includes("#define F 2.0f\n", folder) == "#define F 2.0f\n"


# -- the current folder removed ------------------------------------------------------------------
def test_a_relative_trace_in_a_removed_current_folder_is_named(device, tmp_path, monkeypatch,
                                                                capsys):
    kernel, x = _files(tmp_path)
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    code = main(["map", str(kernel), "--kernel", "twice", "-i", str(x), "-o",
                 str(tmp_path / "y.npy"), "--trace", "t.json", "--device", device.spec])
    err = capsys.readouterr().err
    assert code == 2
    assert "t.json is relative to the current folder, which no longer exists" in err
    assert not (tmp_path / "y.npy").exists()


# -- messages that name the variable ------------------------------------------------------------
def test_a_failed_build_without_pyopencl_build_options_names_no_variable(device, monkeypatch):
    if device.backend != "opencl":
        pytest.skip("PyOpenCL's variable")
    monkeypatch.delenv("PYOPENCL_BUILD_OPTIONS", raising=False)
    monkeypatch.setenv("CONVEYOR_NO_CACHE", "1")
    build.clear_memo()
    try:
        with pytest.raises(cv.CompileError) as caught:
            device.compile(TWICE.replace("2.0f", "q"), "twice")
    finally:
        build.clear_memo()
    assert "PYOPENCL_BUILD_OPTIONS" not in str(caught.value)


def test_a_lock_folder_that_is_a_file_under_tmpdir_names_tmpdir(tmp_path, monkeypatch):
    # TMPDIR names a folder where the lock folder cannot be (a file stands at its name).
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setattr(buildlock, "_warned", set())
    (tmp_path / f"conveyor-{os.getuid()}-locks").write_text("")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with buildlock.build_lock("k" * 64, None):
            pass
    said = [str(w.message) for w in record if "build-lock" in str(w.message)]
    assert len(said) == 1 and "set TMPDIR" in said[0]


def test_hidden_devices_names_ocl_icd_vendors_and_a_home_that_is_a_file(tmp_path,
                                                                        monkeypatch):
    monkeypatch.delenv("OCL_ICD_VENDORS", raising=False)
    monkeypatch.delenv("POCL_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert diagnose.hidden_devices() == []
    monkeypatch.setenv("OCL_ICD_VENDORS", str(tmp_path / "none"))
    [said] = diagnose.hidden_devices()
    assert "OCL_ICD_VENDORS=" in said and "does not exist" in said
    monkeypatch.delenv("OCL_ICD_VENDORS")
    home = tmp_path / "home"
    home.write_text("")
    monkeypatch.setenv("HOME", str(home))
    [said] = diagnose.hidden_devices()
    assert "HOME" in said and f"{home} is not a folder" in said and "POCL_CACHE_DIR" in said
    monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path / "pocl"))
    assert diagnose.hidden_devices() == []


def test_conveyor_devices_names_ocl_icd_vendors(tmp_path):
    if any(d.backend == "cuda" for d in cv.devices()):
        pytest.skip("CUDA's devices do not go through the OpenCL ICD loader")
    done = subprocess.run([sys.executable, "-m", "conveyor", "devices"], capture_output=True,
                          text=True, timeout=120,
                          env=_env(OCL_ICD_VENDORS=str(tmp_path / "no-icd-here")))
    assert done.returncode == 0, done.stderr
    assert "no device found: OCL_ICD_VENDORS=" in done.stdout
    assert "pocl-binary-distribution" not in done.stdout  # it is installed
