"""An input bound to a kernel parameter that is not const is never used in place (zero-copy):
the kernel could write the caller's array, or crash the process where that memory is
read-only (a read-only memmap, NumPy over ``bytes``). It is copied, as on a GPU, and every
device gives the same answer with the caller's inputs unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from streamkit import kernel

import conveyor as cv
from conveyor.pipeline import paths as paths_module
from conveyor.pipeline.stream import inputs_written

# Uses its input as scratch (no const): a common slip.
SCRATCH = """
__kernel void twice(__global float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { x[i] *= 2.0f; y[i] = x[i]; }
}
"""
N = 50_000


@pytest.fixture
def unified(device):
    if not device.host_unified:
        pytest.skip("zero-copy is for devices that share memory with the host")
    return device


def _paths(monkeypatch, run):
    """The classes of the input paths of the one stream ``run()`` makes."""
    chosen: list[list[str]] = []
    real = paths_module.choose

    def choose(*args, **kwargs):
        ins, outs = real(*args, **kwargs)
        chosen.append([type(p).__name__ for p in ins])
        return ins, outs

    monkeypatch.setattr(paths_module, "choose", choose)
    try:
        result = run()
    finally:
        monkeypatch.setattr(paths_module, "choose", real)
    return chosen[0], result


def test_a_kernel_that_writes_its_input_leaves_the_callers_array_alone(unified, monkeypatch):
    k = unified.compile(SCRATCH, "twice")
    x = np.arange(N, dtype=np.float32)
    before = x.copy()
    ins, report = _paths(monkeypatch, lambda: cv.stream(k, [x], [np.float32], device=unified,
                                                        block_bytes=40_000))
    assert ins == ["StagedIn"]
    np.testing.assert_array_equal(report.outputs[0], before * 2)
    np.testing.assert_array_equal(x, before)


def test_read_only_inputs_a_kernel_writes_do_not_crash(unified, tmp_path):
    k = unified.compile(SCRATCH, "twice")
    expected = np.arange(N, dtype=np.float32)
    np.save(tmp_path / "x.npy", expected)
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")  # read-only pages
    raw = expected.tobytes()
    over_bytes = np.frombuffer(raw, np.float32)  # NumPy over an immutable bytes object
    for x in (mapped, over_bytes):
        y = cv.stream(k, [x], [np.float32], device=unified).outputs[0]
        np.testing.assert_array_equal(y, expected * 2)
    assert raw == expected.tobytes()
    np.testing.assert_array_equal(mapped, expected)


def test_zero_copy_true_with_a_written_input_says_what_to_change(unified):
    k = unified.compile(SCRATCH, "twice")
    x = np.arange(N, dtype=np.float32)
    with pytest.raises(cv.InputError, match=r"input 0 \(parameter 'x' of kernel 'twice'\) "
                                            r"is not const"):
        cv.stream(k, [x], [np.float32], device=unified, zero_copy=True)
    np.testing.assert_array_equal(x, np.arange(N, dtype=np.float32))


def test_const_inputs_are_still_used_in_place(unified, monkeypatch):
    a = np.arange(N, dtype=np.float32)
    b = np.ones(N, np.float32)
    c = np.empty_like(a)
    ins, _ = _paths(monkeypatch, lambda: cv.stream(kernel(unified, "add"), [a, b], [c],
                                                   device=unified))
    assert ins == ["ZeroCopy"]


def test_a_chain_link_that_writes_an_input_is_seen(unified, monkeypatch):
    k = unified.compile(SCRATCH, "twice")
    x = np.arange(N, dtype=np.float32)
    before = x.copy()
    chain = cv.chain(cv.link(k, reads="in0", writes="out0"))
    assert inputs_written(chain.bind(unified, [x], [np.empty_like(x)], (), None), 1) == [
        "input 0 (parameter 'x' of link 0 ('twice'))"]
    ins, report = _paths(monkeypatch, lambda: cv.stream(chain, [x], [np.float32],
                                                        device=unified))
    assert ins == ["StagedIn"]
    np.testing.assert_array_equal(report.outputs[0], before * 2)
    np.testing.assert_array_equal(x, before)


def test_a_callable_never_gets_read_only_memory_in_place(unified, monkeypatch):
    def double(x, y, *, queue, offset, n):
        return x * 2

    expected = np.arange(N, dtype=np.float32)
    x = expected.copy()
    x.flags.writeable = False
    ins, report = _paths(monkeypatch, lambda: cv.stream(double, [x], [np.float32],
                                                        device=unified))
    assert ins == ["StagedIn"]
    np.testing.assert_array_equal(report.outputs[0], expected * 2)
    with pytest.raises(cv.InputError, match="callable and a read-only input"):
        cv.stream(double, [x], [np.float32], device=unified, zero_copy=True)
    # A writeable input is copied too unless zero_copy=True is asked for (round twelve: a
    # callable that changes its input in place changed the caller's array).
    writeable = expected.copy()
    ins, _ = _paths(monkeypatch, lambda: cv.stream(double, [writeable], [np.float32],
                                                   device=unified))
    assert ins == ["StagedIn"]
    ins, _ = _paths(monkeypatch, lambda: cv.stream(double, [writeable], [np.float32],
                                                   device=unified, zero_copy=True))
    assert ins == ["ZeroCopy"]
