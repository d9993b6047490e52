"""Export a timeline as Chrome Trace Event JSON (opens in Perfetto and chrome://tracing)."""

from __future__ import annotations

import json
import os
from typing import Any

from conveyor.files import atomic_write
from conveyor.trace.timeline import LANES, Timeline, device_order


def chrome_trace(timeline: Timeline, process: str = "conveyor") -> dict[str, Any]:
    """The timeline as a Trace Event dict: one thread (track) per lane in journey order, one
    complete event (``ph: "X"``) per block and stage with its block index and bytes in
    ``args``; ``ts`` and ``dur`` in microseconds from the stream's start, on the one clock of
    the timeline (host ``perf_counter``, device spans aligned to it). A stream over several
    devices has one process per device, named ``process: device``, each with its lanes."""
    lanes = list(LANES) + [lane for lane in timeline.lanes if lane not in LANES]
    tids = {lane: tid for tid, lane in enumerate(lanes, start=1)}
    tagged = device_order(timeline) or [""]
    pids = {device: pid for pid, device in enumerate(tagged, start=1)}
    events: list[dict[str, Any]] = []
    for device, pid in pids.items():
        name = f"{process}: {device}" if device else process
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": name}})
        if len(pids) > 1:
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                           "args": {"sort_index": pid}})
        present = {s.lane for s in timeline.spans if s.device == device}
        for lane in timeline.lanes:
            if lane not in present:
                continue
            tid = tids[lane]
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": lane}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                           "args": {"sort_index": tid}})
    origin = timeline.origin_ns
    for span in timeline.spans:
        events.append({
            "name": f"{span.title} {span.block}", "cat": span.lane, "ph": "X",
            "pid": pids[span.device], "tid": tids[span.lane],
            "ts": (span.start_ns - origin) / 1000.0, "dur": span.duration_ns / 1000.0,
            "args": {"block": span.block, "bytes": span.nbytes},
        })
    metadata: dict[str, Any] = {"clock": "host perf_counter, device spans aligned"}
    if timeline.clock_error_ns is not None:
        metadata["clock_error_us"] = timeline.clock_error_ns / 1000.0
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": metadata}


def save_chrome_trace(timeline: Timeline, path: str | os.PathLike[str]) -> None:
    """Write the trace to ``path`` atomically (temp file, then rename; keeps the mode of a
    file it replaces). Raises OSError when it cannot be written, a target that
    :func:`conveyor.files.output_target` refuses included (a PermissionError with its
    message): the stream writes its trace after the work, and only warns then."""
    document = chrome_trace(timeline)
    atomic_write(path, lambda handle: json.dump(document, handle), durable=False)
