"""What ``conveyor.stream`` returns: the figures of one stream."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conveyor.trace.ceiling import LinkCeiling, link_ceiling
from conveyor.trace.timeline import WORK_LANES, Span, Timeline

_UNREAD: Any = object()
#: Held while a report builds its timeline: two threads reading ``timeline`` at once could
#: otherwise have one find the sources already cleared by the other and store an empty
#: timeline over the real one (reentrant: a merged report builds its devices' timelines).
_TIMELINE_LOCK = threading.RLock()


@dataclass
class Report:
    """The figures of one stream. Bytes count the caller's data (not halo re-reads);
    GB/s are 1e9 bytes per second of wall time (``seconds``, set-up included).

    Figures drawn from the timeline (busy time per lane, overlap, exposed transfer time, host
    stall time) read the device timestamps on first use; see :class:`Timeline` for each
    definition.
    """

    device: str
    seconds: float = 0.0
    #: Rows of input 0 (block k covers rows k × block_rows up to the next, or ``rows``).
    rows: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    blocks: int = 0
    block_rows: int = 0
    depth: int = 0
    peak_device_bytes: int = 0
    zero_copy: bool = False
    result: Any = None
    outputs: list[Any] = field(default_factory=list)
    #: The driver's name of the device (keys the cached link ceiling with ``device``).
    device_name: str = ""
    #: Makes the timeline on first use of ``timeline``: reading device timestamps costs a few
    #: microseconds per command, which a caller who never looks should not pay.
    timeline_source: Callable[[], Timeline] | None = field(default=None, repr=False)
    #: Older form of ``timeline_source``: the spans alone (one clock assumed).
    spans_source: Callable[[], list[Span]] | None = field(default=None, repr=False)
    #: Several devices (pipeline/multi.py): one report per device, in the order given (its
    #: block count, its share of the bytes, its own seconds and timeline; its blocks are not
    #: contiguous, so its ``block_ranges`` are its own blocks' rows, from ``ranges``); empty
    #: on one device.
    devices: list[Report] = field(default_factory=list)
    #: Several devices: the latest device's finish minus the earliest's, as a share of wall
    #: time (0 is perfectly even); None on one device.
    imbalance: float | None = None
    #: The Chrome trace file written (``trace=``); None when none was asked for or it could
    #: not be written (a warning said why).
    trace_file: str | None = None
    #: The input rows ``(start, stop)`` of each block this report's device ran, where they are
    #: not blocks 0, 1, ... of ``block_rows`` (a device of a stream over several).
    ranges: list[tuple[int, int]] | None = field(default=None, repr=False)
    _timeline: Timeline | None = field(default=None, repr=False)
    _ceiling: Any = field(default=_UNREAD, repr=False)

    @property
    def timeline(self) -> Timeline:
        """Every span of the stream on one clock (built on first access)."""
        with _TIMELINE_LOCK:
            if self._timeline is None:
                if self.timeline_source is not None:
                    self._timeline = self.timeline_source()
                else:
                    spans = self.spans_source() if self.spans_source is not None else []
                    self._timeline = Timeline(spans)
                self.timeline_source = None
                self.spans_source = None
            return self._timeline

    def __getstate__(self) -> dict[str, Any]:
        """For pickle and copy: the timeline made now (its source is a closure over the
        stream's events, which neither pickles nor outlives the process), and the ceiling
        read again where the copy is used (it is the device's cached measurement)."""
        _ = self.timeline
        state = dict(self.__dict__)
        del state["_ceiling"]  # its "not read yet" marker is this process's own object
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._ceiling = _UNREAD

    @property
    def block_ranges(self) -> Any:
        """The input rows ``[start, stop)`` each block covered, as a ``blocks × 2`` int64
        array (row k is block k: the rows of record k of a per-block output)."""
        import numpy as np

        if self.ranges is not None:
            return np.array(self.ranges, dtype=np.int64).reshape(-1, 2)
        starts = np.arange(self.blocks, dtype=np.int64) * self.block_rows
        return np.stack([starts, np.minimum(starts + self.block_rows, self.rows)], axis=1)

    # -- rates -------------------------------------------------------------------------------
    @property
    def gbps_in(self) -> float:
        """Input bytes per second of wall time, in GB/s."""
        return self.bytes_in / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def gbps_out(self) -> float:
        """Output bytes per second of wall time, in GB/s."""
        return self.bytes_out / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def ceiling(self) -> LinkCeiling | None:
        """The device's measured pinned copy bandwidth (``conveyor devices --measure`` caches
        it), or None when it was never measured on this machine."""
        if self._ceiling is _UNREAD:
            if self.devices:  # several: the devices' ceiling together, in any order given
                from conveyor.measure_all import sorted_key

                spec, name = sorted_key([(r.device, r.device_name) for r in self.devices])
                self._ceiling = link_ceiling(spec, name) or link_ceiling(self.device,
                                                                         self.device_name)
            else:
                self._ceiling = link_ceiling(self.device, self.device_name)
        found: LinkCeiling | None = self._ceiling
        return found

    @property
    def ceiling_ratio_in(self) -> float | None:
        """``gbps_in`` as a share of the host-to-device ceiling; None when the ceiling is
        unknown or no block crossed the link (zero-copy)."""
        ceiling = self.ceiling
        if ceiling is None or not ceiling.h2d_gbps or self.zero_copy or not self.bytes_in:
            return None
        return self.gbps_in / ceiling.h2d_gbps

    @property
    def ceiling_ratio_out(self) -> float | None:
        """``gbps_out`` as a share of the device-to-host ceiling (None as for ``_in``)."""
        ceiling = self.ceiling
        if ceiling is None or not ceiling.d2h_gbps or self.zero_copy or not self.bytes_out:
            return None
        return self.gbps_out / ceiling.d2h_gbps

    # -- figures from the timeline -------------------------------------------------------------
    @property
    def overlap(self) -> float | None:
        """The share of copy time that ran while the compute lane was busy, in [0, 1]:
        ``(|CI ∩ C| + |CO ∩ C|) / (|CI| + |CO|)`` over the time covered by the copy-in (CI),
        copy-out (CO) and compute (C) lanes: :attr:`Timeline.overlap` of :attr:`timeline`.
        None without copies or device timing, and for a zero-copy stream (its data is not
        copied; a reduction's partials are, and show in the copy-out lane).

        On several devices it is the same figure, each device's copies against its own
        kernels, pooled by copy time (a device that copied for longer weighs more, not one
        that moved more bytes), over the devices that copied their data: a zero-copy
        device's spans are left out, as on one device. With every device copying it equals
        ``report.timeline.overlap``."""
        if self.zero_copy:
            return None
        timeline = self.timeline
        if self.devices and len(timeline.devices) == len(self.devices):
            copying = {tag for tag, report in zip(timeline.devices, self.devices, strict=True)
                       if not report.zero_copy}
            if len(copying) < len(self.devices):
                return Timeline([s for s in timeline.spans if s.device in copying]).overlap
        return timeline.overlap

    @property
    def busy_seconds(self) -> dict[str, float]:
        """Busy time of each lane that ran, in seconds (overlapping spans counted once); on
        several devices each device's own, summed (``Timeline.busy_ns``), but for
        ``host-wait``: the union of the engines' waits (``host_stall_seconds``)."""
        timeline = self.timeline
        # host-wait: the union over the devices' engines, as host_stall_seconds says it
        return {lane: (timeline.host_stall_ns if lane == "host-wait" else timeline.busy_ns(lane))
                / 1e9 for lane in timeline.lanes}

    @property
    def bound(self) -> str | None:
        """The busiest work lane ("compute", "copy-in", "stage-in", ...): what limits it."""
        return self.timeline.bound

    @property
    def exposed_transfer_seconds(self) -> float | None:
        """Stream wall time minus compute busy time, in seconds: when compute is the bound,
        the transfer time not hidden under compute (fill and drain included). None without a
        compute span, and when no data was staged or copied (zero-copy): then the time with
        no kernel running is :attr:`device_idle_seconds`, not a transfer's."""
        exposed = None if self.zero_copy else self.timeline.exposed_transfer_ns
        return None if exposed is None else exposed / 1e9

    @property
    def device_idle_seconds(self) -> float | None:
        """Stream wall time minus compute busy time, in seconds, whatever the reason (waiting
        for data, or for the host to issue work); None without a compute span."""
        idle = self.timeline.idle_ns
        return None if idle is None else idle / 1e9

    @property
    def host_stall_seconds(self) -> float:
        """Time the host blocked waiting for a free slot, in seconds."""
        return self.timeline.host_stall_ns / 1e9

    # -- the table -----------------------------------------------------------------------------
    def __str__(self) -> str:
        if self.blocks == 0 and self.ranges is not None:  # one device of several (merged.py)
            return (f"conveyor stream on {self.device}: ran no block (the other devices took "
                    f"them) in {self.seconds:.3f} s")
        if self.blocks == 0:
            why = ("the inputs' rows hold no bytes" if self.rows else "zero-length inputs")
            return f"conveyor stream on {self.device}: nothing to do ({why})"
        timeline = self.timeline
        mode = "zero-copy" if self.zero_copy else f"depth {self.depth}"
        ceiling = self.ceiling
        lines = [
            f"conveyor stream on {self.device}: {self.blocks} block{'s' * (self.blocks != 1)} "
            f"of {self.block_rows} row{'s' * (self.block_rows != 1)} ({mode}) in "
            f"{self.seconds:.3f} s",
            f"  in  {self.bytes_in / 1e9:8.3f} GB  {self.gbps_in:7.2f} GB/s"
            + _ratio(self.ceiling_ratio_in, ceiling.h2d_gbps if ceiling else None),
            f"  out {self.bytes_out / 1e9:8.3f} GB  {self.gbps_out:7.2f} GB/s"
            + _ratio(self.ceiling_ratio_out, ceiling.d2h_gbps if ceiling else None),
        ]
        wall = timeline.wall_ns
        # The work lanes only: host-wait is the host blocked on the device, not work; it is
        # the host stall below.
        busy = [(lane, timeline.busy_ns(lane)) for lane in WORK_LANES if timeline.lane(lane)]
        if busy and wall > 0:
            lines.append("  lane        busy ms  share of wall" + (
                " (each device's, summed)" if len(self.devices) > 1 else ""))
            for lane, ns in busy:
                lines.append(f"  {lane:<10} {ns / 1e6:8.2f}  {ns / wall:6.0%}")
        stall = self.host_stall_seconds
        stall_text = f"host stall {stall * 1e3:.2f} ms" + (
            f" ({stall * 1e9 / wall:.0%} of wall)" if wall > 0 else "")
        if self.zero_copy:
            idle = self.device_idle_seconds
            lines.append(
                f"  zero-copy (no data copies): bound {self.bound or 'n/a'}, device idle "
                + ("n/a" if idle is None else f"{idle * 1e3:.2f} ms") + f", {stall_text}"
            )
        else:
            overlap = "n/a" if self.overlap is None else f"{self.overlap:.0%}"
            exposed = self.exposed_transfer_seconds
            lines.append(
                f"  overlap {overlap}, bound {self.bound or 'n/a'}, exposed transfer "
                + ("n/a" if exposed is None else f"{exposed * 1e3:.2f} ms")
                + f", {stall_text}"
            )
        lines.append(f"  peak device memory {self.peak_device_bytes / 2**20:.1f} MiB")
        if self.devices:
            lines.append(f"  {len(self.devices)} devices, imbalance {self.imbalance or 0:.1%} "
                         f"of wall")
            for report in self.devices:
                lines.append(f"    {report.device:<14} {report.blocks:6d} blocks  "
                             f"{report.bytes_in / 1e9:8.3f} GB in  {report.seconds:.3f} s")
        return "\n".join(lines)


def _ratio(ratio: float | None, ceiling: float | None) -> str:
    if ratio is None or not ceiling:
        return ""
    return f" = {ratio:.2f} x ceiling ({ceiling:.1f})"
