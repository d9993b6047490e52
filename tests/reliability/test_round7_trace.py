"""Round seven: traces, reports and their figures, strict mode and configuration (each test
fails without its fix)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv
from conveyor.trace.ceiling import FILE_NAME, device_key, link_ceiling, save_link_ceiling
from conveyor.trace.timeline import Span, Timeline

sys.path.insert(0, str(Path(__file__).parent.parent / "trace"))
from tracekit import BLOCK, N, vadd_stream  # noqa: E402

TWO = [d for d in cv.devices() if d.spec in ("opencl:0:0", "opencl:1:0")]


def _pooled_overlap(timeline: Timeline) -> float | None:
    """The overlap formula on each device's own spans, summed over devices."""
    hidden = total = 0.0
    for device in timeline.devices:
        own = Timeline([s for s in timeline.spans if s.device == device])
        figure = own.overlap
        if figure is None:
            continue
        copies = sum(own.busy_ns(lane) for lane in ("copy-in", "copy-out"))
        hidden += figure * copies
        total += copies
    return hidden / total if total else None


def test_a_copy_on_one_device_is_not_hidden_by_a_kernel_on_another():
    # Device a copies while device b computes; a's own kernel runs after its copy.
    spans = [Span("copy-in", 0, 0, 100, 64, device="a"),
             Span("compute", 0, 200, 300, device="a"),
             Span("compute", 0, 0, 100, device="b")]
    timeline = Timeline(spans)
    timeline.devices = ["a", "b"]
    assert timeline.overlap == 0.0  # was 1.0: a's copy counted as hidden under b's kernel


@pytest.mark.skipif(len(TWO) < 2, reason="needs PoCL's two devices")
def test_timeline_overlap_of_a_stream_over_two_devices_is_each_devices_own():
    x = np.arange(N * 4, dtype=np.float32)

    def copy(a, b, *, queue, offset, n):
        b[...] = a

    report = cv.stream(copy, [x], [np.float32], device=TWO, block_bytes=BLOCK,
                       zero_copy=False)
    timeline = report.timeline
    assert len(timeline.devices) == 2
    overlap = timeline.overlap
    assert overlap is not None and 0.0 <= overlap <= 1.0
    assert overlap == pytest.approx(_pooled_overlap(timeline))


@pytest.mark.parametrize("text", ["Infinity", "1e999", "NaN"])
def test_a_ceiling_file_with_an_infinite_figure_gives_no_ceiling(device, text, tmp_path,
                                                                  monkeypatch):
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path))
    key = device_key(device.spec, device.name)
    (tmp_path / FILE_NAME).write_text(
        f'{{"format": 1, "devices": {{"{key}": {{"pinned_h2d_gbps": {text}, '
        f'"pinned_d2h_gbps": {text}}}}}}}')
    report = vadd_stream(device)
    assert report.ceiling is None  # was LinkCeiling(inf, inf): ratios of 0.00 "x ceiling (inf)"
    assert report.ceiling_ratio_in is None and report.ceiling_ratio_out is None
    assert "ceiling" not in str(report)


def test_a_saved_ceiling_is_standard_json(tmp_path):
    path = save_link_ceiling("opencl:9:9", "x", {"pinned_h2d_gbps": float("inf"),
                                                 "pinned_d2h_gbps": 3.5}, tmp_path)

    def refuse(constant):
        raise ValueError(f"{constant} is not standard JSON")

    entry = json.loads(path.read_text(), parse_constant=refuse)["devices"]["opencl:9:9|x"]
    assert "pinned_h2d_gbps" not in entry and entry["pinned_d2h_gbps"] == 3.5
    found = link_ceiling("opencl:9:9", "x", tmp_path)
    assert found is not None and found.h2d_gbps is None and found.d2h_gbps == 3.5
