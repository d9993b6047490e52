"""Copies to and from host memory pinned by another OpenCL context, off the caller's thread.

A stream over several OpenCL devices reads pinned inputs (and writes pinned outputs) that were
allocated in the first device's context. To every other context that memory is not pinned:
NVIDIA's driver then copies it synchronously inside the enqueue call, at the pinned rate, and
PyOpenCL holds the GIL through a non-blocking enqueue, so every other thread (the other
devices' engines) stalls for the copy. A *blocking* enqueue releases the GIL (measured on
2 x H200: GIL gaps of 12-30 ms non-blocking, 1.1 ms blocking, 53 GB/s either way).

So such a copy is made blocking, on a thread of the queue's own (``ElsewhereCopier``): the
caller gets a user event at once, which completes when the copy has; commands that wait on it
(the kernel, the pool's fences) wait as they would on the copy itself, and the engine goes on
issuing the next block, so this device's copies in and out and its kernels still overlap.
Copies run one at a time, in the order they were asked for (each also waits for its own
``wait_for`` events).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import pyopencl as cl

from conveyor.backends import opencl
from conveyor.closing import join
from conveyor.errors import BackendError

_FAILED = -1  # a negative status fails the commands that wait on the event


class ElsewhereEvent(opencl.Event):
    """A user event that stands for one copy made on an ``ElsewhereCopier``'s thread: waiting
    on it waits for the copy; its profile is the copy's; a failed copy raises its error."""

    __slots__ = ("copy_event", "error")

    def __init__(self, user_event: cl.UserEvent) -> None:
        super().__init__(user_event)
        self.copy_event: opencl.Event | None = None
        self.error: BaseException | None = None

    def wait(self) -> None:
        try:
            super().wait()
        except BackendError:
            if self.error is None:
                raise
        if self.error is not None:
            raise self.error

    def detached(self) -> ElsewhereEvent:
        return self  # it holds no host array: the copy's event is detached already

    def profile_ns(self) -> tuple[int, int] | None:
        return self.copy_event.profile_ns() if self.copy_event is not None else None


class ElsewhereCopier:
    """One thread that makes blocking copies for one queue, in order (see the module
    docstring). ``drain()`` waits for every copy asked for so far; ``close()`` also ends the
    thread."""

    def __init__(self, context: cl.Context) -> None:
        self._context = context
        self._jobs: queue.Queue[tuple[Callable[[], cl.Event], ElsewhereEvent] | None] = (
            queue.Queue())
        self._thread = threading.Thread(target=self._main, name="conveyor-copy-elsewhere",
                                        daemon=True)
        self._thread.start()

    def submit(self, copy: Callable[[], cl.Event]) -> ElsewhereEvent:
        """Queue ``copy`` (a blocking enqueue that returns its event); its stand-in event."""
        done = ElsewhereEvent(cl.UserEvent(self._context))
        self._jobs.put((copy, done))
        return done

    def _main(self) -> None:
        while (job := self._jobs.get()) is not None:
            copy, done = job
            try:
                event = copy()
                done.copy_event = opencl.Event(cl.Event.from_int_ptr(event.int_ptr))
                status = opencl._COMPLETE
            except BaseException as exc:  # raised by whoever waits on the event
                if isinstance(exc, cl.Error):
                    exc = opencl._backend_error(exc, "clEnqueueReadWriteBuffer (blocking)")
                done.error = exc
                status = _FAILED
            try:
                done.cl_event.set_status(status)
            finally:
                self._jobs.task_done()
        self._jobs.task_done()

    def drain(self) -> None:
        """Wait until every copy asked for so far has been made (or has failed)."""
        self._jobs.join()

    def close(self) -> None:
        """Make the copies still asked for, then end the thread."""
        if self._thread.is_alive():
            self._jobs.put(None)
            join(self._thread)
