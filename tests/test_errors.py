"""Errors: messages, the class tree, pickling; configuration parsed strictly."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import conveyor as cv
from conveyor import config


def _round_trip(error):
    return pickle.loads(pickle.dumps(error))


def test_every_error_is_a_conveyor_error():
    for cls in (cv.BackendError, cv.CompileError, cv.OutOfMemoryError, cv.InputError):
        assert issubclass(cls, cv.ConveyorError)
    assert issubclass(cv.InputError, ValueError)


def test_backend_error_message_names_call_and_code():
    error = cv.BackendError("read past the end", call="clEnqueueReadBuffer", code="INVALID_VALUE")
    assert str(error) == "clEnqueueReadBuffer: read past the end [INVALID_VALUE]"
    assert str(cv.BackendError("bare")) == "bare"


def test_backend_error_survives_pickling():
    copy = _round_trip(cv.BackendError("m", call="c", code="X"))
    assert (copy.message, copy.call, copy.code) == ("m", "c", "X")


def test_compile_error_message_carries_the_log():
    error = cv.CompileError("build failed", log="1:3: error: y undeclared", source="src")
    assert str(error) == "build failed\n1:3: error: y undeclared"
    assert str(cv.CompileError("build failed")) == "build failed"


def test_compile_error_log_names_the_users_file():
    log = ("error: /root/.cache/pocl/kcache/tempfile_T5nESS.cl:3:17: use of undeclared x\n"
           "default_program(3): error: identifier \"x\" is undefined\n"
           "<kernel>:3:17: error: use of undeclared identifier 'x'")
    error = _round_trip(cv.CompileError("build failed", log=log, source_name="k.cl"))
    assert error.source_name == "k.cl"
    assert str(error).splitlines()[1:] == [
        "error: k.cl:3:17: use of undeclared x", 'k.cl(3): error: identifier "x" is undefined',
        "k.cl:3:17: error: use of undeclared identifier 'x'"]
    assert "tempfile_" in str(cv.CompileError("build failed", log=log))  # no name: as it was


def test_compile_error_survives_pickling():
    copy = _round_trip(cv.CompileError("build failed", log="the log", source="the source"))
    assert (copy.message, copy.log, copy.source) == ("build failed", "the log", "the source")


def test_out_of_memory_message_gives_sizes_and_the_fix():
    error = cv.OutOfMemoryError(3 * 2**20, 2**20, 2 * 2**20, where="pinned host")
    text = str(error)
    assert "out of pinned host memory" in text
    assert "3.0 MiB" in text and "1.0 MiB in use" in text and "limit 2.0 MiB" in text
    assert "block_bytes" in text
    assert "no limit" in str(cv.OutOfMemoryError(1, 0, None))


def test_out_of_memory_survives_pickling_with_its_fields():
    copy = _round_trip(cv.OutOfMemoryError(3, 2, 1, where="device"))
    assert (copy.requested, copy.in_use, copy.limit, copy.where) == (3, 2, 1, "device")


def test_input_error_survives_pickling():
    copy = _round_trip(cv.InputError("use a smaller block"))
    assert isinstance(copy, cv.InputError) and str(copy) == "use a smaller block"


# -- configuration ------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "expected"), [
    ("1", True), ("true", True), ("YES", True), ("on", True),
    ("0", False), ("false", False), ("No", False), ("off", False),
])
def test_no_cache_accepts_boolean_words(monkeypatch, value, expected):
    monkeypatch.setenv("CONVEYOR_NO_CACHE", value)
    assert config.cache_disabled() is expected


def test_no_cache_unset_or_blank_means_cache_on(monkeypatch):
    monkeypatch.setenv("CONVEYOR_NO_CACHE", "  ")
    assert config.cache_disabled() is False
    monkeypatch.delenv("CONVEYOR_NO_CACHE")
    assert config.cache_disabled() is False


def test_bad_no_cache_value_raises_input_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("CONVEYOR_NO_CACHE", "maybe")
    with pytest.raises(cv.InputError, match="CONVEYOR_NO_CACHE"):
        config.cache_disabled()


def test_cache_dir_override_must_be_absolute(monkeypatch):
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", "relative/dir")
    with pytest.raises(cv.InputError, match="CONVEYOR_CACHE_DIR"):
        config.cache_dir()


def test_cache_dir_override_is_used(monkeypatch, tmp_path):
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path))
    assert config.cache_dir() == tmp_path


def test_cache_dir_defaults_under_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.delenv("CONVEYOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert config.cache_dir() == tmp_path / "conveyor"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    assert config.cache_dir() == Path.home() / ".cache" / "conveyor"


def test_device_spec_comes_from_the_environment_stripped(monkeypatch):
    monkeypatch.setenv("CONVEYOR_DEVICE", "  opencl:0:0 ")
    assert config.default_device_spec() == "opencl:0:0"
    monkeypatch.setenv("CONVEYOR_DEVICE", "")
    assert config.default_device_spec() is None
