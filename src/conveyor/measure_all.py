"""The aggregate link ceiling of several devices: pinned copies on every device at once.

A stream over several devices (pipeline/multi.py) is bound by the sum of their links, if the
host (its memory, its PCIe root complex) can feed them all at once: measured on a 2 x H200
host, one node, pinned host-to-device 55.3 GB/s alone, 105.7 on both at once. So the ceiling
of a stream over several devices is measured with every device copying at the same moment:
each round, every device waits at a barrier, then copies ``nbytes`` from its own pinned
buffer; the round's figure is the bytes of every device over the round's wall time; the best
round counts. ``conveyor devices --measure`` stores it under the devices' joined spec and
names, the key a stream's merged report looks up (``report.ceiling``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from conveyor.backends.base import Device
from conveyor.closing import Closeable, join
from conveyor.memory import numa


@dataclass(frozen=True)
class AggregateFigures:
    """Pinned copy bandwidth of several devices at once, in GB/s (1e9 bytes/s)."""

    pinned_h2d_gbps: float
    pinned_d2h_gbps: float

    def as_dict(self) -> dict[str, float]:
        """The figures by name (the keys of the cached JSON)."""
        return {"pinned_h2d_gbps": self.pinned_h2d_gbps, "pinned_d2h_gbps": self.pinned_d2h_gbps}


def group_key(devices: Sequence[Device]) -> tuple[str, str]:
    """(spec, name) under which the ceiling of ``devices`` together is cached: what the
    merged report of a stream over them looks up, in whatever order they were given (the
    devices sorted by spec: a stream over ``[d1, d0]`` found no ceiling measured for
    ``[d0, d1]``)."""
    return sorted_key([(d.spec, d.name) for d in devices])


def sorted_key(pairs: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """The (spec, name) key of devices given as (spec, name) pairs, sorted by spec."""
    ordered = sorted(pairs)
    return ",".join(spec for spec, _ in ordered), ",".join(name for _, name in ordered)


def groups(devices: Sequence[Device]) -> list[list[Device]]:
    """The sets of devices to measure together: every backend's devices of one kind, where
    there are two or more (``cuda:all``, ``opencl:gpu:all``)."""
    found: dict[tuple[str, str], list[Device]] = {}
    for dev in devices:
        found.setdefault((dev.backend, dev.kind), []).append(dev)
    return [group for group in found.values() if len(group) > 1]


def aggregate_bandwidth(devices: Sequence[Device], nbytes: int = 64 * 2**20,
                        repeats: int = 3, copies: int = 4) -> AggregateFigures:
    """Measure pinned copies on every device of ``devices`` at once, each way; best of
    ``repeats`` rounds (after one warm-up round). Each device makes ``copies`` copies of
    ``nbytes`` per round, back to back: one copy per round came out low on 2 x H200 (82.9
    GB/s both at once, while a stream moved 102.2)."""
    copies = max(copies, 1)
    for dev in devices:
        dev.wait_for_warm_up()  # its allocations would share the measured time
    queues = [dev.create_queue() for dev in devices]
    held: list[Closeable] = []
    try:
        buffers = []
        for dev in devices:
            device_buffer = dev.alloc_device(nbytes)
            held.append(device_buffer)
            pinned = numa.allocate_near(dev, dev.alloc_pinned, nbytes)  # as a stream's
            held.append(pinned)
            pinned.array[:nbytes].fill(1)
            buffers.append((device_buffer, pinned.array[:nbytes]))
        figures = []
        for inward in (True, False):
            best = float("inf")
            for _ in range(repeats + 1):  # the first round pays for driver set-up
                best = min(best, _round(queues, buffers, inward, copies))
            figures.append(len(devices) * copies * nbytes / best / 1e9 if best > 0 else 0.0)
    except BaseException:
        _release(queues, held)  # the first error is the one to raise
        raise
    failure = _release(queues, held)
    if failure is not None:
        raise failure
    return AggregateFigures(figures[0], figures[1])


def _release(queues: list, held: list[Closeable]) -> BaseException | None:
    """Finish and close every queue, close every buffer, even after one fails; the first
    failure."""
    failure: BaseException | None = None
    for queue in queues:
        try:
            try:
                queue.finish()
            finally:
                queue.close()
        except BaseException as exc:
            failure = failure or exc
    for buffer in held:
        buffer.close()
    return failure


def _round(queues: list, buffers: list, inward: bool, copies: int) -> float:
    """One round: every device makes ``copies`` copies at once; the seconds from the common
    start to the last copy's end."""
    barrier = threading.Barrier(len(queues) + 1)
    ends = [0.0] * len(queues)
    failures: list[BaseException] = []

    def copy(index: int) -> None:
        queue, (device_buffer, host) = queues[index], buffers[index]
        try:
            barrier.wait()
            # In order on one queue: the last ends the round. Every event is kept until then:
            # dropping a PyOpenCL copy event waits for its copy.
            events = [queue.copy_in(device_buffer, host) if inward
                      else queue.copy_out(host, device_buffer) for _ in range(copies)]
            queue.flush()
            events[-1].wait()
            del events
        except BaseException as exc:  # raised on the calling thread below
            failures.append(exc)
            barrier.abort()
        ends[index] = time.perf_counter()

    threads = [threading.Thread(target=copy, args=(i,), name="conveyor-measure", daemon=True)
               for i in range(len(queues))]
    for thread in threads:
        thread.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    started = time.perf_counter()
    for thread in threads:
        join(thread)
    if failures:
        raise failures[0]
    return max(ends) - started
