"""What ``conveyor.stream`` returns: the figures of one stream."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conveyor.trace.timeline import Span, Timeline


@dataclass
class Report:
    """The figures of one stream. Bytes count the caller's data (not halo re-reads);
    GB/s are 1e9 bytes per second of wall time."""

    device: str
    seconds: float = 0.0
    bytes_in: int = 0
    bytes_out: int = 0
    blocks: int = 0
    block_rows: int = 0
    depth: int = 0
    peak_device_bytes: int = 0
    zero_copy: bool = False
    result: Any = None
    outputs: list[Any] = field(default_factory=list)
    #: Makes the spans on first use of ``timeline``: reading device timestamps costs a few
    #: microseconds per command, which a caller who never looks should not pay.
    spans_source: Callable[[], list[Span]] | None = field(default=None, repr=False)
    _timeline: Timeline | None = field(default=None, repr=False)

    @property
    def timeline(self) -> Timeline:
        """Every span of the stream (built on first access)."""
        if self._timeline is None:
            spans = self.spans_source() if self.spans_source is not None else []
            self._timeline = Timeline(spans)
            self.spans_source = None
        return self._timeline

    @property
    def gbps_in(self) -> float:
        """Input bytes per second of wall time, in GB/s."""
        return self.bytes_in / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def gbps_out(self) -> float:
        """Output bytes per second of wall time, in GB/s."""
        return self.bytes_out / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def overlap(self) -> float | None:
        """Share of copy time hidden under compute (see Timeline.overlap)."""
        return self.timeline.overlap

    def __str__(self) -> str:
        if self.blocks == 0:
            return f"conveyor stream on {self.device}: nothing to do (zero-length inputs)"
        overlap = "n/a" if self.overlap is None else f"{self.overlap:.0%}"
        mode = "zero-copy" if self.zero_copy else f"depth {self.depth}"
        return (
            f"conveyor stream on {self.device}: {self.blocks} blocks of {self.block_rows} rows "
            f"({mode}) in {self.seconds:.3f} s\n"
            f"  in  {self.bytes_in / 1e9:8.3f} GB  {self.gbps_in:7.2f} GB/s\n"
            f"  out {self.bytes_out / 1e9:8.3f} GB  {self.gbps_out:7.2f} GB/s\n"
            f"  peak device memory {self.peak_device_bytes / 2**20:.1f} MiB, overlap {overlap}"
        )
