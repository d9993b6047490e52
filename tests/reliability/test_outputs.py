"""Outputs are complete when ``cv.stream`` returns (issue 8, item 2): read at once, with no
wait of any kind, they equal NumPy's; and nothing the stream wrote depends on the inputs any
more, so changing the inputs afterwards changes no output. Copying path (pageable and pinned
outputs, pageable and pinned inputs), the zero-copy path, reductions and file outputs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import add_reference, data, kernel  # noqa: E402

ROWS = 60_000
BLOCK_BYTES = 4 * 4096  # 15 blocks: the last ones are still in flight when the loop ends

PATHS = pytest.mark.parametrize(
    ("zero_copy", "pinned_in", "pinned_out"),
    [
        (False, False, False),
        (False, False, True),
        (False, True, False),
        (False, True, True),
        (None, False, False),
    ],
    ids=["copying-pageable", "copying-pinned-out", "copying-pinned-in", "copying-pinned",
         "zero-copy"],
)


def _arrays(device, pinned_in: bool, pinned_out: bool):
    a, b = data((ROWS,), np.float32, 21), data((ROWS,), np.float32, 22)
    if pinned_in:
        a, b = cv.pinned.asarray(a, device=device), cv.pinned.asarray(b, device=device)
    if pinned_out:
        c = cv.pinned.zeros(ROWS, np.float32, device=device)
    else:
        c = np.zeros(ROWS, np.float32)
    return a, b, c


def _stream(device, a, b, c, zero_copy):
    report = cv.stream(kernel(device, "add"), [a, b], [c], device=device,
                       block_bytes=BLOCK_BYTES, zero_copy=zero_copy)
    assert report.zero_copy == (zero_copy is None and device.host_unified)
    return report


@PATHS
def test_outputs_equal_numpy_the_moment_stream_returns(device, zero_copy, pinned_in, pinned_out):
    a, b, c = _arrays(device, pinned_in, pinned_out)
    expected = add_reference(a, b)
    _stream(device, a, b, c, zero_copy)
    np.testing.assert_array_equal(c, expected)  # first touch after the return: no wait


@PATHS
def test_changing_the_inputs_afterwards_changes_no_output(device, zero_copy, pinned_in,
                                                          pinned_out):
    a, b, c = _arrays(device, pinned_in, pinned_out)
    expected = add_reference(a, b)
    _stream(device, a, b, c, zero_copy)
    a[:] = 1e6
    b[:] = -1e6
    assert device.memory_pool.stats().in_use_bytes == 0  # nothing of the stream left to run
    np.testing.assert_array_equal(c, expected)


def test_changing_the_output_afterwards_is_not_undone(device):
    # No copy of the stream may land after it returned and overwrite what the caller wrote.
    a, b, c = _arrays(device, pinned_in=False, pinned_out=True)
    _stream(device, a, b, c, zero_copy=False)
    c[:] = 7.0
    cv.stream(kernel(device, "add"), [a[:100], b[:100]], [np.zeros(100, np.float32)],
              device=device, block_bytes=64, zero_copy=False)  # the queues run again
    assert (c == 7.0).all()


@pytest.mark.parametrize("zero_copy", [False, None], ids=["copying", "zero-copy"])
def test_reduction_result_is_final_when_stream_returns(device, zero_copy):
    x = data((ROWS,), np.int32, 23)
    report = cv.stream(kernel(device, "ident", np.int32), [x], device=device, reduce="sum",
                       block_bytes=BLOCK_BYTES, zero_copy=zero_copy)
    assert int(report.result) == int(x.astype(np.int64).sum())


def test_npy_output_is_complete_on_disk_when_stream_returns(device, tmp_path):
    a, b, _ = _arrays(device, pinned_in=False, pinned_out=False)
    expected = add_reference(a, b)
    target = tmp_path / "c.npy"
    report = cv.stream(kernel(device, "add"), [a, b], [cv.npy_out(target)], device=device,
                       block_bytes=BLOCK_BYTES)
    assert report.outputs == [str(target)]
    a[:] = 0
    np.testing.assert_array_equal(np.load(target), expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npy"]  # no temporary left
