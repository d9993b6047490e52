"""Export a timeline as Chrome Trace Event JSON (opens in Perfetto and chrome://tracing)."""

from __future__ import annotations

import json
import os
from typing import Any

from conveyor.files import atomic_write
from conveyor.trace.timeline import LANES, Timeline


def chrome_trace(timeline: Timeline, process: str = "conveyor") -> dict[str, Any]:
    """The timeline as a Trace Event dict: one thread (track) per lane in journey order, one
    complete event (``ph: "X"``) per block and stage with its block index and bytes in
    ``args``; ``ts`` and ``dur`` in microseconds from the stream's start, on the one clock of
    the timeline (host ``perf_counter``, device spans aligned to it)."""
    lanes = list(LANES) + [lane for lane in timeline.lanes if lane not in LANES]
    tids = {lane: tid for tid, lane in enumerate(lanes, start=1)}
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": process}},
    ]
    for lane in timeline.lanes:
        tid = tids[lane]
        events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid,
                       "args": {"name": lane}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": tid,
                       "args": {"sort_index": tid}})
    origin = timeline.origin_ns
    for span in timeline.spans:
        events.append({
            "name": f"{span.title} {span.block}", "cat": span.lane, "ph": "X", "pid": 1,
            "tid": tids[span.lane],
            "ts": (span.start_ns - origin) / 1000.0, "dur": span.duration_ns / 1000.0,
            "args": {"block": span.block, "bytes": span.nbytes},
        })
    metadata: dict[str, Any] = {"clock": "host perf_counter, device spans aligned"}
    if timeline.clock_error_ns is not None:
        metadata["clock_error_us"] = timeline.clock_error_ns / 1000.0
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": metadata}


def save_chrome_trace(timeline: Timeline, path: str | os.PathLike[str]) -> None:
    """Write the trace to ``path`` atomically (temp file, then rename; keeps the mode of a
    file it replaces). Raises OSError when it cannot be written."""
    document = chrome_trace(timeline)
    atomic_write(path, lambda handle: json.dump(document, handle), durable=False)
