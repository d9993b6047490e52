"""Events of the CUDA backend: a command's pair of timed events, the pool they come from, and
user events (gates the host opens).

Every command a queue enqueues records an event before and after itself (its start and end:
the timeline, and what later commands and the host wait on). The events come from a per-device
:class:`EventPool` and go back to it when the :class:`Event` that names them is garbage: creating
and destroying a pair with each command would cost four more driver calls, and every driver
call gives up the GIL. With a busy Python thread in the process, each return of the GIL can
wait a whole switch interval (5 ms), so the number of driver calls per block, not their own
cost, decided how fast small blocks streamed (bench/NOTES.md, session 8). Recording an event
again is safe once no Event refers to it: ``cuStreamWaitEvent`` captures the event's state when
it is called, and only a live Event asks for its completion or its time.

CUDA has no user events. :class:`UserEvent` builds one: a 4-byte flag in mapped pinned memory, a
private stream that waits for the flag (``cuStreamWaitValue32``; a one-thread spin kernel where
stream memory operations are unsupported), and an event recorded after the wait.
``set_complete`` writes the flag. A user event that is dropped unset opens its gate, so nothing
waits forever. Never gate a ``copy_out`` into *pageable* memory on a user event the same thread
sets later: that call waits on the host for its stream and would deadlock.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from conveyor.backends import base
from conveyor.backends.cuda_driver import (
    _HOST_ALLOC_FLAGS,
    _check,
    _HostMemory,
    cc,
    driver,
    forked,
    refuse_if_forked,
)

if TYPE_CHECKING:
    from conveyor.backends.cuda import Device

_TIMED_FLAGS = 0x0  # CU_EVENT_DEFAULT: timing on; the host spins when it waits
_BLOCKING_FLAGS = 0x1  # CU_EVENT_BLOCKING_SYNC: the host sleeps when it waits
_NOT_READY = 600  # CUDA_ERROR_NOT_READY
# Spare events kept per kind. A trace holds every block's Event until the stream ends, so the
# number alive at once can reach thousands; keeping them all after would hold driver handles
# for the rest of the process. A few hundred covers every queue's commands in flight.
_MAX_SPARE = 256


class EventPool:
    """Spare ``CUevent`` handles of one device, by kind: timed (a command's start) and timed
    with blocking sync (its end: what the host waits on sleeps rather than spins).

    ``list.pop`` and ``list.append`` are atomic under the GIL, so the engine's threads and the
    garbage collector (which returns events from any thread) share it without a lock.
    """

    def __init__(self) -> None:
        self._spare: tuple[list[Any], list[Any]] = ([], [])
        self.closed = False

    def take(self, blocking: bool) -> Any:
        """A spare event of the kind, or a new one."""
        try:
            return self._spare[blocking].pop()
        except IndexError:
            flags = _BLOCKING_FLAGS if blocking else _TIMED_FLAGS
            return _check(driver.cuEventCreate(flags), "cuEventCreate")

    def give(self, event: Any, blocking: bool) -> None:
        """Take ``event`` back (no Event refers to it any more). Never raises."""
        spare = self._spare[blocking]
        if self.closed or len(spare) >= _MAX_SPARE:
            _destroy(event)
            return
        spare.append(event)
        if self.closed:  # close() ran between the check and the append: its drain missed it
            self._drain()

    def close(self) -> None:
        """Destroy the spare events; events given back later are destroyed at once."""
        self.closed = True
        self._drain()

    def drain(self) -> None:
        """Destroy the spare events; the pool stays open (a closed device is used again)."""
        self._drain()

    def _drain(self) -> None:
        for spare in self._spare:
            while True:
                try:
                    event = spare.pop()  # atomic: two drains never destroy one event twice
                except IndexError:
                    break
                _destroy(event)


def _destroy(event: Any) -> None:
    if forked():
        return
    try:
        driver.cuEventDestroy(event)
    except Exception:  # interpreter shutdown or a dead context: nothing left to free
        pass


class Event(base.Event):
    """A command's start and end events (``CUevent`` handles); complete once the end event is.

    ``pool``: where both go back when this Event is garbage (None: someone else owns them).
    """

    __slots__ = ("device", "start", "end", "_profile", "_pool")

    def __init__(self, device: Device, start: Any, end: Any,
                 pool: EventPool | None = None) -> None:
        self.device = device
        self.start = start
        self.end = end
        self._profile: tuple[int, int] | None = None
        self._pool = pool

    def __del__(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.give(self.start, False)
            if self.end is not self.start:  # a marker is one event
                pool.give(self.end, True)

    def wait(self) -> None:
        self.device._current()  # staging threads wait too, and the driver needs the context
        _check(driver.cuEventSynchronize(self.end), "cuEventSynchronize")

    def is_done(self) -> bool:
        refuse_if_forked()  # the driver's error read as "done" in a forked child
        try:
            (err,) = driver.cuEventQuery(self.end)
        except Exception:  # a dead context: the command is over; wait() raises the error
            return True
        return int(err) != _NOT_READY  # a failed command is over too; wait() raises its error

    def profile_ns(self) -> tuple[int, int] | None:
        if self._profile is None:
            start = self.device._since_reference(self.start)
            end = self.device._since_reference(self.end)
            if start is None or end is None:
                return None
            self._profile = (start, end)
        return self._profile


class UserEvent(Event, base.UserEvent):
    """A host-set gate (see the module docstring)."""

    __slots__ = ("_flag", "_finalizer", "_core")

    def __init__(self, device: Device) -> None:
        device._current()
        timed = cc.EventOptions(timing_enabled=True)
        blocking = cc.EventOptions(timing_enabled=True, blocking_sync=True)
        host = _check(driver.cuMemHostAlloc(4, _HOST_ALLOC_FLAGS), "cuMemHostAlloc")
        flag = np.asarray(_HostMemory(int(host), 4)).view(np.uint32)
        flag[0] = 0
        stream = device.core.create_stream(options=cc.StreamOptions(nonblocking=True))
        state = [flag, int(host), stream, device]
        try:
            dptr = int(_check(driver.cuMemHostGetDevicePointer(int(host), 0),
                              "cuMemHostGetDevicePointer"))
            start = stream.record(options=timed)
            device._gate(stream, dptr)
            end = stream.record(options=blocking)
        except BaseException:
            _open_gate(state)
            raise
        super().__init__(device, start.handle, end.handle)
        self._core = (start, end)  # cuda.core's events own the handles: keep them alive
        self._flag = flag
        self._finalizer = weakref.finalize(self, _open_gate, state)

    def set_complete(self) -> None:
        refuse_if_forked()  # the child's copy of the flag: no gate opened
        self._flag[0] = 1


def _open_gate(state: list[Any]) -> None:
    """Set the flag, let the gate stream drain, free the flag. Never raises."""
    flag, host, stream, device = state
    try:
        flag[0] = 1
        device._current()
        stream.sync()
        stream.close()
        driver.cuMemFreeHost(host)
    except Exception:  # interpreter shutdown or a dead context
        pass
