"""Python's switch interval while streams run (pipeline/switching.py): lowered for the stream,
restored after it (also after a failure), left alone when set lower or changed meanwhile, and
kept low until the last of several concurrent streams ends."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import conveyor as cv
from conveyor.errors import InputError

N = 4000


@pytest.fixture(autouse=True)
def python_interval(monkeypatch):
    """Each test starts at Python's default interval and gives back what it found."""
    before = sys.getswitchinterval()
    monkeypatch.delenv("CONVEYOR_SWITCH_INTERVAL", raising=False)
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def _recording(seen, action=None):
    def compute(x, y, *, queue, offset, n):
        seen.append(sys.getswitchinterval())
        if action is not None:
            action()
        return x

    return compute


def _stream(device, compute):
    x = np.arange(N, dtype=np.float32)
    out = cv.stream(compute, [x], [np.float32], device=device, block_bytes=4000).outputs[0]
    assert np.array_equal(out, x)


def test_a_stream_runs_at_half_a_millisecond_and_restores_the_interval(device):
    seen: list[float] = []
    _stream(device, _recording(seen))
    assert seen and all(s == pytest.approx(0.0005) for s in seen)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_the_interval_comes_back_after_a_failed_stream(device):
    def fail():
        raise RuntimeError("the callable failed")

    with pytest.raises(RuntimeError, match="the callable failed"):
        _stream(device, _recording([], fail))
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_a_shorter_interval_and_off_are_left_alone(device, monkeypatch):
    sys.setswitchinterval(0.0001)
    seen: list[float] = []
    _stream(device, _recording(seen))
    assert all(s == pytest.approx(0.0001) for s in seen)
    sys.setswitchinterval(0.005)
    monkeypatch.setenv("CONVEYOR_SWITCH_INTERVAL", "off")
    seen.clear()
    _stream(device, _recording(seen))
    assert all(s == pytest.approx(0.005) for s in seen)


def test_a_configured_interval_is_used(device, monkeypatch):
    monkeypatch.setenv("CONVEYOR_SWITCH_INTERVAL", "100us")
    seen: list[float] = []
    _stream(device, _recording(seen))
    assert seen and all(s == pytest.approx(0.0001) for s in seen)


def test_an_interval_set_during_the_stream_stays(device):
    _stream(device, _recording([], lambda: sys.setswitchinterval(0.002)))
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_concurrent_streams_keep_it_low_until_the_last_ends(device):
    first_inside = threading.Event()
    let_first_end = threading.Event()
    seen_second: list[float] = []

    def hold():
        first_inside.set()
        assert let_first_end.wait(30)

    errors: list[BaseException] = []

    def first():
        try:
            _stream(device, _recording([], hold))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert first_inside.wait(30)
        _stream(device, _recording(seen_second))  # starts and ends inside the first
        assert sys.getswitchinterval() == pytest.approx(0.0005)  # the first still runs
    finally:
        let_first_end.set()
        thread.join(30)
    assert not errors
    assert all(s == pytest.approx(0.0005) for s in seen_second)
    assert sys.getswitchinterval() == pytest.approx(0.005)


@pytest.mark.parametrize("value", ["fast", "0", "5", "2s", "-1ms", "0.1ns", "1e-3s"])
def test_a_bad_interval_names_the_variable(device, monkeypatch, value):
    monkeypatch.setenv("CONVEYOR_SWITCH_INTERVAL", value)
    with pytest.raises(InputError, match="CONVEYOR_SWITCH_INTERVAL"):
        _stream(device, _recording([]))
    assert sys.getswitchinterval() == pytest.approx(0.005)
