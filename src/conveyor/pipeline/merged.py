"""The one Report of a stream over several devices (pipeline/multi.py), from each engine's.

The merged report has the wall time of the whole stream, the bytes of the whole stream and so
the aggregate GB/s; ``devices`` holds one report per device (its blocks, its share of the
bytes, its own timeline); ``imbalance`` is the latest device's finish minus the earliest's,
as a share of the wall time; the timeline holds every device's spans, each tagged with its
device (one Perfetto process per device in the Chrome trace).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from conveyor.pipeline.io import Source
from conveyor.pipeline.plan import Block, Plan
from conveyor.pipeline.report import Report
from conveyor.pipeline.sinks import Sink
from conveyor.trace.timeline import Timeline


def device_tags(specs: Sequence[str]) -> list[str]:
    """A name per device for the timeline: its spec, with ``#i`` where two share one (two
    contexts on one device)."""
    return [spec if specs.count(spec) == 1 else f"{spec}#{i}" for i, spec in enumerate(specs)]


def _share(plan: Plan, blocks: Sequence[Block]) -> tuple[int, int]:
    """Input and output bytes of ``blocks`` (the caller's data, halo rows not counted)."""
    bytes_in = sum(b.rows * spec.row_bytes for b in blocks for spec in plan.inputs)
    bytes_out = 0
    for i, spec in enumerate(plan.outputs):
        for block in blocks:
            lo, hi = plan.output_rows(i, block)
            bytes_out += (hi - lo) * spec.row_bytes
    return bytes_in, bytes_out


def merge_reports(reports: Sequence[Report], engines: Sequence[Any], feeds: Sequence[Any],
                  plan: Plan, sources: Sequence[Source], sinks: Sequence[Sink],
                  seconds: float, result: Any) -> Report:
    """One Report of the stream from each engine's ``reports`` (engines and their feeds in
    device order)."""
    tags = device_tags([r.device for r in reports])
    per_device = []
    for report, engine, feed in zip(reports, engines, feeds, strict=True):
        ran = feed.blocks(engine.blocks_done)
        bytes_in, bytes_out = _share(plan, ran)
        per_device.append(replace(report, bytes_in=bytes_in, bytes_out=bytes_out,
                                  blocks=engine.blocks_done, outputs=[], result=None,
                                  ranges=[(b.start, b.stop) for b in ran]))
    finishes = [e.finished_at for e in engines]
    imbalance = (max(finishes) - min(finishes)) / seconds if seconds > 0 else 0.0

    def timeline() -> Timeline:
        spans = []
        starts = []
        errors = []
        for tag, report in zip(tags, per_device, strict=True):
            own = report.timeline
            spans += [replace(span, device=tag) for span in own.spans]
            if own.start_ns is not None:
                starts.append(own.start_ns)
            errors.append(own.clock_error_ns)
        error = None if None in errors or not errors else max(e for e in errors if e is not None)
        merged = Timeline(spans, start_ns=min(starts) if starts else None, clock_error_ns=error)
        merged.devices = tags
        return merged

    return Report(
        device=",".join(r.device for r in reports),
        seconds=seconds,
        rows=plan.rows,
        bytes_in=sum(s.nbytes for s in sources),
        bytes_out=sum(s.nbytes for s in sinks),
        blocks=plan.block_count,
        block_rows=plan.block_rows,
        depth=plan.depth,
        peak_device_bytes=sum(r.peak_device_bytes for r in reports),
        zero_copy=all(r.zero_copy for r in reports),
        result=result,
        outputs=[s.result for s in sinks],
        device_name=",".join(r.device_name for r in reports),
        timeline_source=timeline,
        devices=per_device,
        imbalance=imbalance,
    )
