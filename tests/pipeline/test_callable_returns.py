"""Callables that return their blocks (issue 14 item 3): device arrays returned are copied into
the block's outputs; a wrong count, shape or dtype is an InputError at the warm-up, before any
work; the warm-up call runs on the first rows before the stream (``warmup=False``: none)."""

from __future__ import annotations

import numpy as np
import pytest
from streamkit import _cupy_stream, in_use, to_host

import conveyor as cv
from conveyor.errors import InputError

N = 5000


def _op(device, queue, fn):
    """Run ``fn(lib_asarray)`` with the backend's array library on ``queue``."""
    if device.backend == "opencl":
        return fn(lambda a: a)
    cupy = pytest.importorskip("cupy")
    with _cupy_stream(queue):
        return fn(cupy.asarray)


def _doubling(device, calls=None):
    def compute(x, y, *, queue, offset, n):
        if calls is not None:
            calls.append((offset, n))
        return _op(device, queue, lambda asarray: asarray(x) * 2)

    return compute


@pytest.mark.parametrize("halo", [0, 2])
def test_a_returned_array_is_copied_into_the_output(device, halo):
    x = np.arange(N, dtype=np.float32)
    y = np.zeros_like(x)

    def compute(x, y, *, queue, offset, n):  # with a halo, return the block's own rows
        def rows(asarray):  # a CUDA device array has a shape but no len()
            whole = asarray(x)
            return whole[halo : whole.shape[0] - halo] * 2

        return _op(device, queue, rows)

    if halo:  # a slice of a device array: copied from its offset
        cv.stream(compute, [x], [y], device=device, block_bytes=4000, halo=halo)
    else:
        cv.stream(_doubling(device), [x], [y], device=device, block_bytes=4000)
    np.testing.assert_array_equal(y, x * 2)
    assert in_use(device) == (0, 0)


def test_a_tuple_fills_each_output(device):
    x = np.arange(N, dtype=np.float32)
    y, z = np.zeros_like(x), np.zeros_like(x)

    def compute(x, y, z, *, queue, offset, n):
        return _op(device, queue, lambda asarray: (asarray(x) + 1, asarray(x) * 3))

    cv.stream(compute, [x], [y, z], device=device, block_bytes=4000)
    np.testing.assert_array_equal(y, x + 1)
    np.testing.assert_array_equal(z, x * 3)


def test_returning_the_output_it_was_given_is_not_a_copy(device):
    x = np.arange(N, dtype=np.float32)
    y = np.zeros_like(x)

    def compute(x, y, *, queue, offset, n):
        _op(device, queue, lambda asarray: asarray(y).__setitem__(slice(None), asarray(x)))
        return y

    cv.stream(compute, [x], [y], device=device, block_bytes=4000)
    np.testing.assert_array_equal(y, x)


def test_the_warm_up_runs_on_the_first_rows_before_the_stream(device):
    calls: list[tuple[int, int]] = []
    x = np.arange(N, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(_doubling(device, calls), [x], [y], device=device, block_bytes=4000)
    assert calls[0] == (0, 64) and calls[1:] == [(k * 1000, min(1000, N - k * 1000))
                                                 for k in range(5)]
    calls.clear()
    cv.stream(_doubling(device, calls), [x], [y], device=device, block_bytes=4000,
              warmup=False)
    assert calls == [(k * 1000, 1000) for k in range(5)]


@pytest.mark.parametrize("boundary", ["nearest", "periodic", 7.5])
def test_the_warm_up_sees_the_first_blocks_rows_where_the_stream_puts_them(device, boundary):
    """Round fourteen: with ``halo=h`` the warm-up put the input's first rows at index 0 of
    its halo'd input, where the first block has the ``h`` pad rows, and zeros for the pads: a
    callable that checks its rows failed in the warm-up, and one with effects saw other data."""
    h = 3
    x = np.arange(N, dtype=np.float32) + 1
    y = np.zeros_like(x)
    seen: list[np.ndarray] = []

    def compute(x, y, *, queue, offset, n):
        seen.append(to_host(x, queue))
        return _op(device, queue, lambda asarray: asarray(x)[h : asarray(x).shape[0] - h])

    cv.stream(compute, [x], [y], device=device, block_bytes=4000, halo=h, boundary=boundary)
    np.testing.assert_array_equal(y, x)
    warm, first = seen[0], seen[1]
    assert len(warm) == 64 + 2 * h and len(first) == 1000 + 2 * h
    np.testing.assert_array_equal(warm, first[: 64 + 2 * h])
    front = {"nearest": x[:1].repeat(h), "periodic": x[-h:], 7.5: np.full(h, 7.5)}[boundary]
    np.testing.assert_array_equal(warm[:h], front)
    np.testing.assert_array_equal(warm[h:], x[: 64 + h])


@pytest.mark.parametrize("wrong", ["shape", "dtype", "count"])
def test_a_wrong_return_is_an_input_error_before_any_work(device, tmp_path, wrong):
    calls: list[int] = []
    x = np.arange(N, dtype=np.float32)
    target = tmp_path / "y.npy"

    def compute(x, y, *, queue, offset, n):
        calls.append(offset)
        if wrong == "shape":
            return _op(device, queue, lambda asarray: asarray(x)[1:])
        if wrong == "dtype":
            return _op(device, queue, lambda asarray: asarray(x).astype(np.float64))
        return _op(device, queue, lambda asarray: (asarray(x), asarray(x)))

    message = {"shape": r"output 0: .*float32 of shape \(63,\).*shape \(64,\)",
               "dtype": r"output 0: .*float64 of shape \(64,\).*float32",
               "count": r"returned 2 value\(s\) for 1 output"}[wrong]
    with pytest.raises(InputError, match=message):
        cv.stream(compute, [x], [str(target)], device=device, block_bytes=4000)
    assert calls == [0] and not target.exists()  # only the warm-up ran
    assert in_use(device) == (0, 0)
