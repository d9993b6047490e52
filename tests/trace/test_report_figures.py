"""Every figure the report prints means what README "Seeing what happened" says (issue 12,
items 9 and 10): a Python callable's compute span covers the work it enqueued, and a zero-copy
stream reports no overlap and no exposed transfer, because it copied nothing."""

from __future__ import annotations

import numpy as np
import pytest
from tracekit import kernel

import conveyor as cv
from conveyor.pipeline.report import Report
from conveyor.trace.timeline import Span, Timeline

SPIN = """
__kernel void spin(__global const float *x, __global float *y, uint reps) {
    size_t i = get_global_id(0);
    float v = x[i];
    for (uint r = 0; r < reps; r++) v = v * 0.999f + 0.001f;
    y[i] = v;
}
"""
_programs: dict[object, object] = {}


def _spin_kernel(queue):
    import pyopencl as cl

    if queue.context not in _programs:
        _programs[queue.context] = cl.Kernel(cl.Program(queue.context, SPIN).build(), "spin")
    return _programs[queue.context]


# -- item 9: a callable's compute time -------------------------------------------------------
@pytest.mark.parametrize("zero_copy", [False, None], ids=["copying", "auto"])
def test_callable_compute_span_covers_the_work_it_enqueued(device, zero_copy):
    if device.backend != "opencl":
        pytest.skip("the callable enqueues a PyOpenCL kernel")
    kernel_times: dict[int, tuple[int, int]] = {}
    events = []

    def spin(x, y, *, queue, offset, n):
        # A real kernel of the caller's, enqueued on conveyor's compute queue; its own
        # profiling times say how long the device worked for this block.
        event = _spin_kernel(queue)(queue, (n,), None, x.data, y.data, np.uint32(400))
        events.append((offset // n if n else 0, event))

    x = np.random.default_rng(1).standard_normal(120_000).astype(np.float32)
    y = np.empty_like(x)
    report = cv.stream(spin, [x], [y], device=device, block_bytes=x.nbytes // 4,
                       zero_copy=zero_copy)
    for block, event in events:
        kernel_times[block] = (event.profile.start, event.profile.end)
    spans = {s.block: s for s in report.timeline.lane("compute")}
    assert sorted(spans) == list(range(report.blocks)) == sorted(kernel_times)
    for block, (start, end) in kernel_times.items():
        # The span runs from the marker before the call to the marker after it, so it holds
        # the whole kernel (device clock and host clock differ by one offset: lengths compare).
        assert spans[block].duration_ns >= end - start > 0, block
    busy = report.busy_seconds["compute"]
    assert busy * 1e9 >= sum(end - start for start, end in kernel_times.values())


# -- item 10: zero-copy figures ---------------------------------------------------------------
def _zero_copy_device(device: cv.Device) -> None:
    if not device.host_unified:
        pytest.skip("zero-copy needs a device that shares memory with the host")


@pytest.mark.parametrize("reduce", [None, "sum"], ids=["map", "reduction"])
def test_zero_copy_reports_no_overlap_and_no_exposed_transfer(device, reduce):
    _zero_copy_device(device)
    x = np.random.default_rng(2).standard_normal(200_000).astype(np.float32)
    outputs = [] if reduce else [np.empty_like(x)]
    name = "ident" if reduce else "burn"
    args = () if reduce else (200,)
    report = cv.stream(kernel(device, name), [x], outputs, device=device, zero_copy=True,
                       block_bytes=x.nbytes // 4, reduce=reduce, args=args)
    assert report.zero_copy and report.blocks == 4
    assert report.overlap is None
    assert report.exposed_transfer_seconds is None
    idle = report.device_idle_seconds
    assert idle is not None and idle >= 0
    text = str(report)
    assert "overlap" not in text and "exposed transfer" not in text
    assert "zero-copy (no data copies)" in text and "device idle" in text
    assert "host-wait" not in text  # not a work lane: it is the host stall of the last line
    assert "host stall" in text


def test_exposed_transfer_needs_a_transfer():
    compute_only = Timeline([Span("compute", 0, 10, 20), Span("host-wait", 0, 0, 30)])
    assert compute_only.idle_ns == 30 - 10 and compute_only.exposed_transfer_ns is None
    assert compute_only.overlap is None
    copied = Timeline([Span("copy-in", 0, 0, 10), Span("compute", 0, 10, 20)])
    assert copied.exposed_transfer_ns == copied.idle_ns == 10
    staged = Timeline([Span("stage-in", 0, 0, 10), Span("compute", 0, 10, 20)])
    assert staged.exposed_transfer_ns == 10


def test_zero_copy_report_made_by_hand_prints_no_transfer_figures():
    # A zero-copy reduction copies its partials: the copy-out lane has spans, yet the
    # stream's data crossed no link, so no overlap or exposed transfer is claimed.
    timeline = Timeline([Span("compute", 0, 0, 10), Span("copy-out", 0, 10, 12),
                         Span("host-wait", 0, 0, 12)])
    report = Report(device="d", seconds=1.0, blocks=1, block_rows=1, zero_copy=True,
                    timeline_source=lambda: timeline)
    assert timeline.overlap == 0.0 and timeline.exposed_transfer_ns == 2
    assert report.overlap is None and report.exposed_transfer_seconds is None
    assert report.device_idle_seconds == pytest.approx(2e-9)
    assert "exposed transfer" not in str(report) and "overlap" not in str(report)
