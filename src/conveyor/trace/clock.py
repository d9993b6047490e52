"""One clock for device and host spans: a marker event timed by both, before the first block.

Device timestamps (OpenCL profiling counters, CUDA event times since the device's reference
event) have their own zero. Before the first block is issued, :meth:`ClockAnchor.take` enqueues
a marker, waits for it and notes the host's ``perf_counter_ns`` just before the enqueue (``t0``)
and just after the wait returns (``t1``). The marker completed somewhere in ``[t0, t1]`` on the
host clock, so placing its device timestamp at the midpoint puts every device time within
``(t1 - t0) / 2`` of where it ran on the host clock: that is ``error_ns``. The anchor keeps the
tightest of a few tries. Drift between the two clocks (parts per million) over a stream of a
few seconds adds microseconds at most and is not corrected.

Taking the anchor is the only wait it adds, once per stream and before any block is in flight;
the marker's device timestamp is read later, with the other events.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conveyor.backends.base import Event, Queue

TRIES = 3


@dataclass
class ClockAnchor:
    """A marker ``event`` that completed between host times ``before_ns`` and ``after_ns``."""

    event: Event
    before_ns: int
    after_ns: int

    @classmethod
    def take(cls, queue: Queue, tries: int = TRIES) -> ClockAnchor:
        """Enqueue a marker on ``queue`` and wait for it, ``tries`` times; keep the tightest.

        Call it only while ``queue`` is idle (before the first block): the wait blocks until
        everything queued before the marker is done.
        """
        best: ClockAnchor | None = None
        for _ in range(max(tries, 1)):
            before = time.perf_counter_ns()
            event = queue.marker()
            event.wait()
            after = time.perf_counter_ns()
            if best is None or after - before < best.after_ns - best.before_ns:
                best = cls(event, before, after)
        assert best is not None
        return best

    @property
    def host_ns(self) -> int:
        """The host time the marker is placed at: the midpoint of the wait."""
        return (self.before_ns + self.after_ns) // 2

    @property
    def error_ns(self) -> int:
        """Bound on the alignment error of device spans, in ns (half the wait's length)."""
        return (self.after_ns - self.before_ns + 1) // 2

    def offset_ns(self) -> int | None:
        """What to add to a device timestamp to put it on the host clock; None when the
        marker carries no device timestamp (profiling unavailable)."""
        times = self.event.profile_ns()
        if times is None:
            return None
        return self.host_ns - times[1]
