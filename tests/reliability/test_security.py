"""Security requirements of issue 8: no pickle (or other code-executing format) on disk; every
CONVEYOR_* variable parsed strictly; no module imported and no kernel replaced because an
environment variable names it; input files checked against their declared sizes before any
allocation."""

from __future__ import annotations

import ast
import contextlib
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv
from conveyor import config
from conveyor.kernels import build
from conveyor.kernels.portable import portable

SRC = Path(cv.__file__).parent
CODE_EXECUTING = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle",
                  "joblib", "copyreg"}
SOURCE = portable("""
#ifndef FACTOR
#define FACTOR 3.0f
#endif
__kernel void scale(__global const float *a, __global float *out, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) out[i] = a[i] * FACTOR;
}
""")


def modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


# -- nothing pickled ------------------------------------------------------------------------
def test_no_module_imports_a_code_executing_serializer():
    found = []
    for path in modules():
        for node in ast.walk(parsed(path)):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [f"{path.relative_to(SRC)}: {n}" for n in names
                      if n.split(".")[0] in CODE_EXECUTING]
    assert found == []


def test_no_numpy_load_allows_pickle():
    found = []
    for path in modules():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.keyword) and node.arg == "allow_pickle":
                if not (isinstance(node.value, ast.Constant) and node.value.value is False):
                    found.append(f"{path.relative_to(SRC)}:{node.value.lineno}")
    assert found == []


# -- the environment, parsed strictly ----------------------------------------------------------
#: For each CONVEYOR_* variable of config.py: a bad value, the call that reads it, its default.
BAD_VALUES = {
    "CONVEYOR_DEVICE": ("my gpu please", config.default_device_spec, None),
    "CONVEYOR_CACHE_DIR": ("relative/cache", config.cache_dir, None),
    "CONVEYOR_NO_CACHE": ("maybe", config.cache_disabled, False),
    "CONVEYOR_STRICT": ("2", config.strict_mode, False),
    "CONVEYOR_POOL_KEEP": ("lots", config.pool_keep, None),
    "CONVEYOR_PREFAULT": ("sometimes", config.prefault_mode, "off"),
    "CONVEYOR_PINNED_ALLOC": ("cudaHostAlloc", config.pinned_alloc_mode, "register"),
    "CONVEYOR_RING_GROW": ("slowly", config.ring_grow, True),
    "CONVEYOR_PINNED_BUDGET": ("most", config.pinned_budget, None),
    "CONVEYOR_WARMUP": ("early", config.warmup_bytes, None),
    "CONVEYOR_NUMA": ("nearest", config.numa_mode, "auto"),
    "CONVEYOR_SWITCH_INTERVAL": ("quick", config.switch_interval, 0.0005),
}


def test_every_conveyor_variable_of_config_is_in_the_table():
    text = (SRC / "config.py").read_text()
    assert set(re.findall(r'"(CONVEYOR_[A-Z_]+)"', text)) == set(BAD_VALUES)


def test_only_config_reads_the_environment():
    readers = []
    for path in modules():
        if path.name == "config.py":
            continue
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
                readers.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert readers == []


@pytest.mark.parametrize("name", list(BAD_VALUES))
def test_bad_value_is_an_input_error_naming_the_variable(monkeypatch, name):
    value, read, _ = BAD_VALUES[name]
    monkeypatch.setenv(name, value)
    with pytest.raises(cv.InputError, match=re.escape(f"{name}={value!r}")):
        read()


@pytest.mark.parametrize("name", list(BAD_VALUES))
def test_unset_or_blank_means_the_default(monkeypatch, name):
    _, read, default = BAD_VALUES[name]
    monkeypatch.delenv(name, raising=False)
    unset = read()
    monkeypatch.setenv(name, "  ")
    assert read() == unset
    if default is not None:
        assert unset == default


def test_bad_device_variable_fails_cv_device_before_looking_for_devices(monkeypatch):
    monkeypatch.setenv("CONVEYOR_DEVICE", "rm -rf /")
    monkeypatch.setattr("conveyor.backends.devices", lambda: pytest.fail("looked for devices"))
    with pytest.raises(cv.InputError, match="CONVEYOR_DEVICE='rm -rf /' is not a device spec"):
        cv.device()


@pytest.mark.parametrize("value", ["1", "0", "TRUE", "off", "Yes", " no "])
def test_boolean_spellings(monkeypatch, value):
    monkeypatch.setenv("CONVEYOR_STRICT", value)
    assert config.strict_mode() is (value.strip().lower() in ("1", "true", "yes", "on"))


# -- no import and no kernel because a variable names it -----------------------------------------
def test_no_dynamic_import_of_a_computed_module_name():
    found = []
    for path in modules():
        for node in ast.walk(parsed(path)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__", "run_module", "run_path", "exec",
                        "eval", "spec_from_file_location"):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    # The one dynamic import: PyArrow's submodules, named in the code, never by the user.
    assert all("import_module(f'pyarrow.{module}')" in f for f in found), found


def test_variables_naming_a_module_import_nothing(device, monkeypatch, tmp_path):
    planted = tmp_path / "planted_conveyor_module.py"
    marker = tmp_path / "imported"
    planted.write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("CONVEYOR_DEVICE", "CONVEYOR_CACHE_DIR", "CONVEYOR_NO_CACHE",
                 "CONVEYOR_STRICT"):
        monkeypatch.setenv(name, "planted_conveyor_module")
        with contextlib.suppress(cv.InputError):
            cv.device()
        with contextlib.suppress(cv.InputError):
            build.default_cache()
        with contextlib.suppress(cv.InputError):
            config.strict_mode()
        monkeypatch.delenv(name)
    assert not marker.exists() and "planted_conveyor_module" not in sys.modules


def _factor(device: cv.Device) -> float:
    a = np.ones(16, np.float32)
    out = np.zeros_like(a)
    cv.stream(device.compile(SOURCE, "scale"), [a], [out], device=device)
    return float(out[0])


def test_binary_built_under_pyopencl_build_options_is_not_served_without_it(
    device, monkeypatch, tmp_path
):
    if device.backend != "opencl":
        pytest.skip("PYOPENCL_BUILD_OPTIONS is PyOpenCL's")
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CONVEYOR_NO_CACHE", raising=False)
    build.clear_memo()
    monkeypatch.setenv("PYOPENCL_BUILD_OPTIONS", "-DFACTOR=9.0f")
    assert _factor(device) == 9.0  # PyOpenCL honours it; conveyor keys the binary by it
    monkeypatch.delenv("PYOPENCL_BUILD_OPTIONS")
    build.clear_memo()
    assert _factor(device) == 3.0  # not the binary built under the variable
    build.clear_memo()


# -- input files checked before any allocation --------------------------------------------------
@contextlib.contextmanager
def no_allocation(device: cv.Device, monkeypatch: pytest.MonkeyPatch):
    calls: list[int] = []
    for pool in (device.memory_pool, device.pinned_pool):
        real = pool.allocate
        monkeypatch.setattr(pool, "allocate", lambda n, real=real: calls.append(n) or real(n))
    yield
    assert calls == []


def _npy_claiming(path: Path, rows: int, stored: int) -> None:
    """A .npy file whose header says ``rows`` float32 rows of 3 but holds ``stored``."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": (rows, 3)})
        f.write(np.zeros((stored, 3), np.float32).tobytes())


def _identity(x, y, *, queue, offset, n):
    raise AssertionError("no block may run")


@pytest.mark.parametrize("rows", [101, 2**40], ids=["one-row-more", "2^40-rows"])
def test_npy_claiming_more_rows_than_it_holds(device, monkeypatch, tmp_path, rows):
    path = tmp_path / "x.npy"
    _npy_claiming(path, rows, 100)
    with no_allocation(device, monkeypatch), pytest.raises(cv.InputError,
                                                           match="is truncated: its header"):
        cv.stream(_identity, [str(path)], [np.float32], device=device)


def test_npy_holding_more_than_its_header_says(device, monkeypatch, tmp_path):
    path = tmp_path / "x.npy"
    _npy_claiming(path, 100, 101)
    with no_allocation(device, monkeypatch), pytest.raises(cv.InputError,
                                                           match="longer than it should be"):
        cv.stream(_identity, [cv.npy(path)], [str(tmp_path / "y.npy")], device=device)
    assert not (tmp_path / "y.npy").exists()


def test_raw_file_not_a_whole_number_of_rows(device, monkeypatch, tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"\0" * (3 * 4 * 100 + 5))
    with no_allocation(device, monkeypatch), pytest.raises(cv.InputError,
                                                           match="not a whole number"):
        cv.stream(_identity, [cv.raw(path, np.float32, (-1, 3))], [np.float32],
                  device=device)


def test_raw_file_shorter_than_its_declared_shape(device, monkeypatch, tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"\0" * (3 * 4 * 100))
    with no_allocation(device, monkeypatch), pytest.raises(cv.InputError, match="truncated"):
        cv.stream(_identity, [cv.raw(path, np.float32, (101, 3))], [np.float32],
                  device=device)
