"""The timeline of a stream: one span per block and lane, on one clock, read after the fact.

Device spans (copy-in, compute, copy-out) come from the queues' own timestamps, read once the
stream is over, so recording adds no synchronisation to the hot path. Host spans (stage-in,
stage-out, waits for a free slot, the host's fold of reduction partials) come from
``time.perf_counter_ns``. Device times are moved onto the host clock through one
:class:`~conveyor.trace.clock.ClockAnchor` taken before the first block, so every span of a
timeline is in host ``perf_counter_ns`` nanoseconds and lanes can be compared with each other;
``Timeline.clock_error_ns`` bounds the error of that alignment.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.trace.clock import ClockAnchor

DEVICE_LANES = ("copy-in", "compute", "copy-out")
HOST_LANES = ("stage-in", "stage-out", "host-wait", "combine")
#: Every lane, in the order a block passes through them (the order of tracks and plot rows).
LANES = ("stage-in", "copy-in", "compute", "copy-out", "stage-out", "host-wait", "combine")
COPY_LANES = ("copy-in", "copy-out")
#: Lanes that move the stream's data between host and device (host staging and device copies).
TRANSFER_LANES = ("stage-in", "copy-in", "copy-out", "stage-out")
#: Lanes that do the stream's work; the busiest of them is the bound (host-wait is a symptom).
WORK_LANES = ("stage-in", "copy-in", "compute", "copy-out", "stage-out", "combine")


@dataclass(frozen=True, slots=True)
class Span:
    """One stage of one block: ``lane``, block index, start and end in ns, bytes moved, a
    ``label`` within the lane ("" but for the links of a chain: the link's name, its kernel's
    or function's by default, numbered ``name#2``, ``name#3`` for later links of a name an
    earlier link has, so every link of a chain has a title of its own), and the device it
    ran for (set on a stream over several devices, pipeline/merged.py)."""

    lane: str
    block: int
    start_ns: int
    end_ns: int
    nbytes: int = 0
    label: str = ""
    device: str = ""

    @property
    def title(self) -> str:
        """``lane`` or ``lane:label``: the span as a trace names it."""
        return f"{self.lane}:{self.label}" if self.label else self.lane

    @property
    def duration_ns(self) -> int:
        """Length of the span in nanoseconds."""
        return max(self.end_ns - self.start_ns, 0)


#: What the engine records for each device command: (lane, block index, event, bytes); a lane
#: "compute:<title>" is a link of a chain, a span of the compute lane labelled <title>. The
#: event is a backend Event; only its ``profile_ns()`` is read, after the stream (or a
#: :class:`Timed` that already read it: :func:`compact`).
Record = tuple[str, int, Any, int]

#: Records a stream keeps as driver events before it reads the finished ones' times: fewer,
#: and it never reads a time its caller may not ask for; more, and a stream of 10**6 one-row
#: blocks held about 3.4 GB of events (3.2 KB a block on PoCL, against ~0.2 KB read).
COMPACT_RECORDS = 65536


class Timed:
    """A finished command's device times, read from its event (which can then go)."""

    __slots__ = ("times",)

    def __init__(self, times: tuple[int, int] | None) -> None:
        self.times = times

    def profile_ns(self) -> tuple[int, int] | None:
        """(start, end), as the event gave them."""
        return self.times

    def detached(self) -> Timed:
        """Itself: it holds no host memory."""
        return self


def compact(records: list[Record], start: int, through_block: int) -> int:
    """Read the times of ``records[start:]`` up to the first of a block after
    ``through_block`` (records come in block order; every command of those blocks has
    finished), replacing each event by a :class:`Timed`; return where the next call starts."""
    end = start
    while end < len(records) and records[end][1] <= through_block:
        lane, block, event, nbytes = records[end]
        if not isinstance(event, Timed):
            records[end] = (lane, block, Timed(event.profile_ns()), nbytes)
        end += 1
    return end


@dataclass(frozen=True)
class Between:
    """The device time between two markers on one in-order queue: from the end of ``before``
    (the queue reached the work) to the end of ``after`` (the work is done). It times what a
    Python callable enqueued between them, which no event of conveyor's own covers; it reads
    like an event, through ``profile_ns()``."""

    before: Any
    after: Any

    def profile_ns(self) -> tuple[int, int] | None:
        """(start, end) in device ns, or None when either marker has no timestamps."""
        first = self.before.profile_ns()
        last = self.after.profile_ns()
        if first is None or last is None:
            return None
        return first[1], max(last[1], first[1])

    def detached(self) -> Between:
        """The same markers, detached (``Event.detached``)."""
        return Between(self.before.detached(), self.after.detached())


def _merge(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _intersection_ns(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """The time two unions of intervals share; each as :func:`_merge` gives it (sorted,
    disjoint). One sweep over both: measuring each copy against every kernel took seconds
    to print the report of a few thousand blocks, and minutes for tens of thousands."""
    total = i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def one_per_block(spans: Iterable[Span]) -> list[Span]:
    """Join the spans of each (device, lane, block) into one: from the first start to the last
    end, bytes summed, the device kept. A block's two input copies (or its kernel and its
    reduction kernel) run back to back on one in-order queue, so the joined span is what the
    lane spent on that block. Labelled spans (the links of a chain) stay a span each, even
    where two links share a label (one kernel used twice); spans of different devices are
    never joined."""
    joined: dict[tuple[str, str, int], Span] = {}
    kept: list[Span] = []
    for span in spans:
        if span.label:
            kept.append(span)
            continue
        key = (span.device, span.lane, span.block)
        seen = joined.get(key)
        if seen is None:
            joined[key] = span
        else:
            joined[key] = Span(span.lane, span.block, min(seen.start_ns, span.start_ns),
                               max(seen.end_ns, span.end_ns), seen.nbytes + span.nbytes,
                               span.label, span.device)
    return [*joined.values(), *kept]


def device_order(timeline: Timeline) -> list[str]:
    """The devices of ``timeline``'s spans: ``timeline.devices`` in their order, then any other
    span's device, sorted ("" for the spans of a stream on one device)."""
    named = list(timeline.devices)
    return named + sorted({s.device for s in timeline.spans} - set(named))


class Timeline:
    """Every span of a stream on one clock, with busy time per lane and the overlap figures.

    ``start_ns`` is when the stream's first block began (host clock; the first span's start
    when not given); ``clock_error_ns`` bounds how far device spans may sit from where they
    really ran on the host clock (None: device and host spans could not be aligned).
    """

    def __init__(self, spans: Iterable[Span] = (), *, start_ns: int | None = None,
                 clock_error_ns: int | None = None) -> None:
        order = {lane: i for i, lane in enumerate(LANES)}
        self.spans: list[Span] = sorted(
            spans, key=lambda s: (order.get(s.lane, len(order)), s.lane, s.start_ns, s.block))
        self.start_ns = start_ns
        self.clock_error_ns = clock_error_ns
        #: The devices of a stream over several (each span's ``device``), in their order.
        self.devices: list[str] = []

    @classmethod
    def from_records(cls, records: Sequence[Record], host_spans: Sequence[Span],
                     anchor: ClockAnchor | None) -> Timeline:
        """The timeline of a finished stream: device ``records`` (timestamps read now, moved
        onto the host clock through ``anchor``) and ``host_spans``, one span per block and
        lane."""
        device: list[Span] = []
        for lane, block, event, nbytes in records:
            times = event.profile_ns()
            if times is not None:
                lane, _, label = lane.partition(":")
                device.append(Span(lane, block, times[0], times[1], nbytes, label))
        offset = anchor.offset_ns() if anchor is not None else None
        error = anchor.error_ns if offset is not None and anchor is not None else None
        if offset is None and device:
            # No marker timing: line the first device span up with the stream's start; the
            # lanes keep their shape but their place against the host lanes is a guess.
            first = min(s.start_ns for s in device)
            origin = anchor.host_ns if anchor is not None else min(
                (s.start_ns for s in host_spans), default=first)
            offset = origin - first
        shift = offset or 0
        device = [Span(s.lane, s.block, s.start_ns + shift, s.end_ns + shift, s.nbytes,
                       s.label) for s in device]
        start = anchor.host_ns if anchor is not None else None
        return cls(one_per_block([*host_spans, *device]), start_ns=start, clock_error_ns=error)

    # -- lanes -------------------------------------------------------------------------------
    @property
    def lanes(self) -> list[str]:
        """The lanes that have spans, in journey order."""
        present = {s.lane for s in self.spans}
        return [lane for lane in LANES if lane in present] + sorted(present - set(LANES))

    def lane(self, name: str) -> list[Span]:
        """The spans of one lane, in start order."""
        return [s for s in self.spans if s.lane == name]

    def busy_ns(self, name: str) -> int:
        """Time the lane was busy (overlapping spans counted once), in ns; on several devices
        each device's own busy time, summed, as :attr:`bound` weighs the lanes (the union
        over the devices made the report's busy times name another lane than its bound)."""
        return sum(_busy(spans, name) for spans in self._by_device())

    def _by_device(self) -> list[list[Span]]:
        """The spans of each device (one list on a stream of one device)."""
        found: dict[str, list[Span]] = {}
        for span in self.spans:
            found.setdefault(span.device, []).append(span)
        return list(found.values()) or [[]]

    # -- extent ------------------------------------------------------------------------------
    @property
    def origin_ns(self) -> int:
        """The zero of exported times: ``start_ns``, or the first span's start (0 if none)."""
        first = min((s.start_ns for s in self.spans), default=0)
        return first if self.start_ns is None else min(self.start_ns, first)

    @property
    def end_ns(self) -> int:
        """When the last span ended (host clock)."""
        return max((s.end_ns for s in self.spans), default=self.origin_ns)

    @property
    def wall_ns(self) -> int:
        """The stream's wall time on the timeline: from its start to the end of its last span
        (set-up before the first block, and returning buffers after, are not in it)."""
        return max(self.end_ns - self.origin_ns, 0)

    # -- figures -----------------------------------------------------------------------------
    @property
    def overlap(self) -> float | None:
        """The share of copy time that ran while the compute lane was busy, in [0, 1].

        With CI, CO and C the time covered by the copy-in, copy-out and compute lanes (each the
        union of its spans, so a moment counts once per lane)::

            overlap = (|CI ∩ C| + |CO ∩ C|) / (|CI| + |CO|)

        1 means every copy was hidden under some kernel; 0 means copies and kernels took turns.
        None when there was no copy (zero-copy streams) or no compute span (no device timing).
        On a stream over several devices each device's copies count against its own kernels
        only (a copy on one device is not hidden by a kernel on another), and the hidden and
        the total copy time are each summed over the devices that have compute spans before
        the one division: the devices' figures pooled by copy time, not averaged and not
        weighed by bytes. ``Report.overlap`` is this figure (less the spans of zero-copy
        devices).
        """
        hidden = total = 0
        for device in {s.device for s in self.spans}:
            spans = [s for s in self.spans if s.device == device]
            compute = _merge((s.start_ns, s.end_ns) for s in spans if s.lane == "compute")
            if not compute:
                continue
            for lane in COPY_LANES:
                copies = _merge((s.start_ns, s.end_ns) for s in spans if s.lane == lane)
                total += sum(end - start for start, end in copies)
                hidden += _intersection_ns(copies, compute)
        if total == 0:
            return None
        return hidden / total

    @property
    def bound(self) -> str | None:
        """The busiest work lane (stage-in, copy-in, compute, copy-out, stage-out, combine):
        what limits the stream. None for an empty timeline."""
        # Several devices: each device's own busy time per lane, summed (the union over
        # devices made two compute-bound devices with staggered copies "copy-in" bound).
        busy = {lane: self.busy_ns(lane) for lane in WORK_LANES}
        lane = max(busy, key=lambda name: busy[name])
        return lane if busy[lane] > 0 else None

    @property
    def idle_ns(self) -> int | None:
        """Wall time minus compute busy time, in ns: how long the stream ran with no kernel
        running (the device waited for data, or for the host to issue work); on several
        devices, the mean of each device's own figure. None when there is no compute span."""
        if not self.lane("compute"):
            return None
        # Several devices: each device's idle time against its own kernels, averaged over the
        # devices that ran any (one device's kernel does not keep another's busy).
        idle = [max(self.wall_ns - _busy(spans, "compute"), 0) for spans in self._by_device()
                if any(s.lane == "compute" for s in spans)]
        return round(sum(idle) / len(idle))

    @property
    def exposed_transfer_ns(self) -> int | None:
        """:attr:`idle_ns` of a stream that moved data: when compute is the bound this is the
        transfer (and host) time that was not hidden under compute, pipeline fill and drain
        included; 0 is perfect overlap. When a copy or staging lane is the bound it is at least
        that lane's excess over compute. None when there is no compute span, or when nothing
        was staged or copied (then the idle time is no transfer's)."""
        if not any(self.lane(lane) for lane in TRANSFER_LANES):
            return None
        return self.idle_ns

    @property
    def host_stall_ns(self) -> int:
        """Time the host thread spent blocked waiting for a slot to come free (the host-wait
        lane's busy time, its spans' union over every device's engine), in ns."""
        return _busy(self.spans, "host-wait")

    # -- export ------------------------------------------------------------------------------
    def to_chrome_trace(self) -> dict[str, Any]:
        """The timeline as a Chrome Trace Event dict (see :mod:`conveyor.trace.export`)."""
        from conveyor.trace.export import chrome_trace

        return chrome_trace(self)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write Chrome Trace Event JSON to ``path`` (opens in Perfetto and chrome://tracing):
        one track per lane, one slice per block and stage, block index and bytes in the args.
        InputError for a path that is no str or Path, holds a NUL, or names a missing folder,
        a node (FIFO, device), this process's stdout or stderr or a /proc entry (see
        :func:`conveyor.files.output_target`): the message names ``path``, not the temporary
        file the JSON goes to first."""
        from conveyor import files
        from conveyor.trace.export import save_chrome_trace

        files.output_target(path, _call("save", path), probe=True)
        save_chrome_trace(self, path)

    def plot(self, path: str | os.PathLike[str], *, title: str | None = None,
             span_ms: float | None = None) -> None:
        """Draw the timeline as a Gantt chart (one row per lane, and per link of a chain)
        into an image file, e.g. PNG; ``span_ms`` fixes the time axis' length (to compare two
        charts).

        Needs matplotlib (``pip install conveyor[plot]``): InputError without it. The path is
        checked as :meth:`save` checks it, before anything is drawn; a path with no suffix
        is written as ``path.png`` (as matplotlib names it), so that file is checked too,
        and the name as given only where it is no folder: ``plot("runs")`` beside a folder
        ``runs`` writes ``runs.png``. A name that ends with a separator (``runs/``) names a
        folder: InputError. InputError for a ``span_ms`` that is not None or a number of ms
        above 0.
        """
        from conveyor.trace.plot import check_span, plot_file, plot_timeline

        check_span(span_ms)
        plot_timeline(self, plot_file(path, _call("plot", path)), title=title, span_ms=span_ms)

    def __len__(self) -> int:
        return len(self.spans)


def _call(method: str, path: object) -> str:
    """``timeline.save('run.json')``: how errors name a call, with the path as the user wrote
    it (a Path shown as its text, not ``PosixPath(...)``)."""
    shown = os.fspath(path) if isinstance(path, (str, os.PathLike)) else path
    return f"timeline.{method}({shown!r})"


def _busy(spans: list[Span], lane: str) -> int:
    """Time the spans of ``lane`` among ``spans`` covered (overlaps counted once), in ns."""
    return sum(end - start for start, end in _merge(
        (s.start_ns, s.end_ns) for s in spans if s.lane == lane))

