"""Export a timeline as Chrome Trace Event JSON (opens in Perfetto and chrome://tracing)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from conveyor.trace.timeline import DEVICE_LANES, HOST_LANES, Timeline

_LANES = HOST_LANES[:1] + DEVICE_LANES + HOST_LANES[1:]


def chrome_trace(timeline: Timeline) -> dict:
    """The timeline as a Trace Event dict: one thread (track) per lane, one complete event
    (``ph: "X"``) per block and stage, times in microseconds from the first span of its clock.
    Device and host spans are on different clocks: each clock starts at zero."""
    events: list[dict] = []
    for tid, lane in enumerate(_LANES, start=1):
        events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid,
                       "args": {"name": lane}})
    origin = {
        clock: min((s.start_ns for s in timeline.spans if s.lane in lanes), default=0)
        for clock, lanes in (("device", DEVICE_LANES), ("host", HOST_LANES))
    }
    for span in timeline.spans:
        if span.lane not in _LANES:
            continue
        base = origin["device" if span.lane in DEVICE_LANES else "host"]
        events.append({
            "name": f"{span.lane} {span.block}", "cat": span.lane, "ph": "X", "pid": 1,
            "tid": _LANES.index(span.lane) + 1,
            "ts": (span.start_ns - base) / 1000.0, "dur": span.duration_ns / 1000.0,
            "args": {"block": span.block, "bytes": span.nbytes},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def save_chrome_trace(timeline: Timeline, path: str | os.PathLike[str]) -> None:
    """Write the trace to ``path`` atomically (temp file, then rename)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent or ".", prefix=".tmp-trace-")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(chrome_trace(timeline), handle)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
