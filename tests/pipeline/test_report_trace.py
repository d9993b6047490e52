"""The report: byte counts, blocks, rates, the timeline and its Chrome-trace export."""

from __future__ import annotations

import json
from itertools import pairwise

import numpy as np
import pytest
from streamkit import data, kernel

import conveyor as cv
from conveyor.trace.timeline import DEVICE_LANES, HOST_LANES

ZERO_COPY = pytest.mark.parametrize("zero_copy", [False, None], ids=["copying", "auto"])
N, BLOCK = 20_000, 4000


def _run(device, zero_copy=False, depth=3, **kw):
    a, b = data((N,), np.float32, 1), data((N,), np.float32, 2)
    return cv.stream(kernel(device, "add"), [a, b], [np.float32], device=device, depth=depth,
                     block_bytes=BLOCK, zero_copy=zero_copy, **kw)


@ZERO_COPY
def test_report_counts_bytes_and_blocks(device, zero_copy):
    report = _run(device, zero_copy)
    assert (report.bytes_in, report.bytes_out) == (2 * N * 4, N * 4)
    assert report.blocks == N * 4 // BLOCK and report.block_rows == BLOCK // 4


@ZERO_COPY
def test_report_rates_are_positive(device, zero_copy):
    report = _run(device, zero_copy)
    assert report.seconds > 0 and report.gbps_in > 0 and report.gbps_out > 0


@ZERO_COPY
def test_timeline_has_one_compute_span_per_block(device, zero_copy):
    report = _run(device, zero_copy)
    assert sorted(s.block for s in report.timeline.lane("compute")) == list(range(report.blocks))


@ZERO_COPY
def test_timeline_lanes_are_known_lanes(device, zero_copy):
    report = _run(device, zero_copy)
    assert {s.lane for s in report.timeline.spans} <= set(DEVICE_LANES + HOST_LANES)


def test_device_lane_spans_do_not_overlap_at_depth_one(device):
    report = _run(device, zero_copy=False, depth=1)
    for lane in DEVICE_LANES:
        spans = report.timeline.lane(lane)
        assert spans
        for first, second in pairwise(spans):
            assert first.end_ns <= second.start_ns, (lane, first, second)


@ZERO_COPY
def test_overlap_is_a_share_or_none(device, zero_copy):
    overlap = _run(device, zero_copy).overlap
    assert overlap is None or 0.0 <= overlap <= 1.0


@ZERO_COPY
def test_trace_file_is_chrome_trace_json(device, zero_copy, tmp_path):
    path = tmp_path / "run.json"
    report = _run(device, zero_copy, trace=str(path))
    events = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == len(report.timeline.spans)
    for event in spans:
        assert {"ph", "ts", "dur", "pid", "tid"} <= event.keys()
        assert event["dur"] >= 0


@ZERO_COPY
def test_trace_timestamps_are_monotone_per_lane(device, zero_copy, tmp_path):
    path = tmp_path / "run.json"
    _run(device, zero_copy, trace=str(path))
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    for tid in {e["tid"] for e in events}:
        stamps = [e["ts"] for e in events if e["tid"] == tid]
        assert stamps == sorted(stamps), tid


@ZERO_COPY
def test_str_mentions_the_device(device, zero_copy):
    assert device.spec in str(_run(device, zero_copy))


def test_str_of_an_empty_stream_mentions_the_device(device):
    report = cv.stream(kernel(device, "add"), [np.zeros(0, np.float32)] * 2, [np.float32],
                       device=device)
    assert device.spec in str(report) and "nothing to do" in str(report)
