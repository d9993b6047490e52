"""The timeline of a stream: one span per block and stage, read after the fact.

Device spans (copy-in, compute, copy-out) come from the queues' own timestamps, read once the
stream is over, so recording adds no synchronisation to the hot path. Host spans (stage-in,
stage-out, waits for a free slot) come from ``time.perf_counter_ns``. The two clocks differ;
``overlap`` uses device spans only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DEVICE_LANES = ("copy-in", "compute", "copy-out")
HOST_LANES = ("stage-in", "stage-out", "host-wait")


@dataclass(frozen=True)
class Span:
    """One stage of one block: ``lane``, block index, start and end in ns, bytes moved."""

    lane: str
    block: int
    start_ns: int
    end_ns: int
    nbytes: int = 0

    @property
    def duration_ns(self) -> int:
        """Length of the span in nanoseconds."""
        return max(self.end_ns - self.start_ns, 0)


def _merge(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _covered(start: int, end: int, busy: list[tuple[int, int]]) -> int:
    total = 0
    for b_start, b_end in busy:
        lo, hi = max(start, b_start), min(end, b_end)
        if hi > lo:
            total += hi - lo
    return total


class Timeline:
    """Every span of a stream, with the busy time of each lane and the overlap figure."""

    def __init__(self, spans: Iterable[Span] = ()) -> None:
        self.spans: list[Span] = sorted(spans, key=lambda s: (s.lane, s.start_ns))

    def lane(self, name: str) -> list[Span]:
        """The spans of one lane, in start order."""
        return [s for s in self.spans if s.lane == name]

    def busy_ns(self, name: str) -> int:
        """Time the lane was busy (overlapping spans counted once), in ns."""
        return sum(end - start for start, end in _merge(
            (s.start_ns, s.end_ns) for s in self.lane(name)))

    @property
    def overlap(self) -> float | None:
        """The share of copy time (copy-in and copy-out lanes, each counted once) that ran while
        the compute lane was busy, in [0, 1]; None when there was no copy or no device timing."""
        compute = _merge((s.start_ns, s.end_ns) for s in self.lane("compute"))
        copies = [
            interval
            for lane in ("copy-in", "copy-out")
            for interval in _merge((s.start_ns, s.end_ns) for s in self.lane(lane))
        ]
        total = sum(end - start for start, end in copies)
        if total == 0 or not compute:
            return None
        hidden = sum(_covered(start, end, compute) for start, end in copies)
        return hidden / total

    def __len__(self) -> int:
        return len(self.spans)
