"""Reductions agree with NumPy at the edges: NaN in min/max, and inputs with no elements."""

from __future__ import annotations

import numpy as np
import pytest
from streamkit import kernel, to_host

import conveyor as cv

ZERO_COPY = pytest.mark.parametrize("zero_copy", [False, None], ids=["copying", "auto"])
FLOATS = pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
OPS = pytest.mark.parametrize("op", ["min", "max"])


def _with_nan(dtype, where: int, n: int = 20_000) -> np.ndarray:
    x = np.linspace(1.0, 2.0, n).astype(dtype)
    x[where] = np.nan
    return x


@ZERO_COPY
@FLOATS
@OPS
@pytest.mark.parametrize("where", [0, 5000, 19_999], ids=["first", "middle", "last"])
def test_kernel_min_max_propagate_nan(device, zero_copy, dtype, op, where):
    # Several blocks and many work items per block: the NaN is met mid-fold by one work item,
    # in one block's partials, and in the host's combine of the blocks.
    x = _with_nan(dtype, where)
    report = cv.stream(kernel(device, "ident", dtype), [x], reduce=op, device=device,
                       block_bytes=x.nbytes // 3, zero_copy=zero_copy)
    assert report.blocks > 1
    assert np.isnan(getattr(np, op)(x))
    assert np.isnan(report.result)


@ZERO_COPY
@OPS
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_callable_min_max_propagate_nan(device, zero_copy, op, dtype):
    x = _with_nan(dtype, 5000)

    def block_extreme(x, queue, offset, n):
        return getattr(to_host(x, queue), op)()

    report = cv.stream(block_extreme, [x], reduce=op, device=device,
                       block_bytes=x.nbytes // 4, zero_copy=zero_copy)
    assert report.blocks > 1
    assert np.isnan(report.result)


@FLOATS
def test_kernel_min_max_without_nan_are_exact(device, dtype):
    x = np.random.default_rng(3).standard_normal(20_000).astype(dtype)
    x[7000] = -np.inf
    x[9000] = np.inf
    for op in ("min", "max"):
        report = cv.stream(kernel(device, "ident", dtype), [x], reduce=op, device=device,
                           block_bytes=x.nbytes // 3)
        assert report.result == getattr(np, op)(x)


@ZERO_COPY
@pytest.mark.parametrize("dtype", [np.float32, np.int32], ids=["f32", "i32"])
def test_kernel_sum_of_nothing_is_zero(device, zero_copy, dtype):
    x = np.zeros(0, dtype)
    report = cv.stream(kernel(device, "ident", dtype), [x], reduce="sum", device=device,
                       zero_copy=zero_copy)
    assert report.blocks == 0
    assert report.result == 0
    # The type a non-empty kernel sum has: float64 for floats, 64-bit for integers.
    assert report.result.dtype == (np.float64 if dtype == np.float32 else np.int64)


def test_callable_sum_of_nothing_is_numpys_zero(device):
    x = np.zeros((0, 3), np.float32)
    report = cv.stream(lambda *a, **k: 1.0, [x], reduce="sum", device=device)
    assert report.result == 0 and report.result.dtype == np.sum(x).dtype


def test_a_function_fold_of_nothing_is_none(device):
    """reduce=f has no identity: over no elements the result is None (README), and f and the
    callable are never called."""
    calls = []
    report = cv.stream(lambda *a, **k: calls.append("block") or 1.0,
                       [np.zeros(0, np.float32)],
                       reduce=lambda a, b: calls.append("fold") or a + b, device=device)
    assert report.result is None and calls == []


@OPS
@pytest.mark.parametrize("shape", [(0,), (0, 3), (5, 0)], ids=["0", "0x3", "5x0"])
def test_min_max_of_nothing_refused_before_any_work(device, op, shape):
    calls = []
    x = np.zeros(shape, np.float32)
    with pytest.raises(cv.InputError, match=f"reduce='{op}' over an empty input"):
        cv.stream(lambda *a, **k: calls.append(k), [x], reduce=op, device=device)
    assert calls == []
    with pytest.raises(cv.InputError, match="empty input"):
        cv.stream(kernel(device, "ident", np.float32), [x.reshape(-1)], reduce=op,
                  device=device)
