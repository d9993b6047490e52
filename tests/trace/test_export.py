"""Chrome Trace Event export: the file parses, follows the format and opens in Perfetto."""

from __future__ import annotations

import json

import pytest
from tracekit import vadd_stream

from conveyor.trace.timeline import LANES

ZERO_COPY = pytest.mark.parametrize("zero_copy", [False, None], ids=["copying", "auto"])


def _events(path):
    document = json.loads(path.read_text())
    assert document["displayTimeUnit"] in ("ms", "ns")
    return document["traceEvents"]


@ZERO_COPY
def test_saved_trace_follows_the_trace_event_format(device, zero_copy, tmp_path):
    report = vadd_stream(device, zero_copy=zero_copy)
    path = tmp_path / "run.json"
    report.timeline.save(path)
    events = _events(path)
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == len(report.timeline.spans)
    for event in slices:
        assert {"name", "ph", "ts", "dur", "pid", "tid", "args"} <= event.keys()
        assert isinstance(event["ts"], float) and event["ts"] >= 0 and event["dur"] >= 0
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
        assert {"block", "bytes"} <= event["args"].keys()
    for event in events:
        assert event["ph"] in ("X", "M")


@ZERO_COPY
def test_one_named_track_per_lane(device, zero_copy, tmp_path):
    report = vadd_stream(device, zero_copy=zero_copy)
    path = tmp_path / "run.json"
    report.timeline.save(path)
    events = _events(path)
    names = {e["tid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(names.values(), key=LANES.index) == report.timeline.lanes
    for event in events:
        if event["ph"] == "X":
            assert names[event["tid"]] == event["cat"]


def test_timestamps_are_monotone_and_blocks_once_per_track(device, tmp_path):
    report = vadd_stream(device, trace=str(tmp_path / "run.json"))
    slices = [e for e in _events(tmp_path / "run.json") if e["ph"] == "X"]
    for tid in {e["tid"] for e in slices}:
        track = [e for e in slices if e["tid"] == tid]
        stamps = [e["ts"] for e in track]
        assert stamps == sorted(stamps), tid
        assert sorted(e["args"]["block"] for e in track) == list(range(report.blocks))
        for first, second in zip(track, track[1:], strict=False):
            assert first["ts"] + first["dur"] <= second["ts"] + 1e-3, (first, second)


def test_trace_is_written_atomically(device, tmp_path):
    report = vadd_stream(device)
    report.timeline.save(tmp_path / "run.json")
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]
