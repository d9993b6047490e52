"""Copies to and from host memory pinned by another OpenCL context, off the caller's thread.

A stream over several OpenCL devices reads pinned inputs (and writes pinned outputs) that were
allocated in the first device's context. To every other context that memory is not pinned:
NVIDIA's driver then copies it synchronously inside the enqueue call, at the pinned rate, and
PyOpenCL holds the GIL through a non-blocking enqueue, so every other thread (the other
devices' engines) stalls for the copy. A *blocking* enqueue releases the GIL (measured on
2 x H200: GIL gaps of 12-30 ms non-blocking, 1.1 ms blocking, 53 GB/s either way).

So such a copy is made blocking, by a thread of the queue's own (``ElsewhereCopier``) on a
command queue of its own, and the caller gets a user event at once (``ElsewhereEvent``),
completed once the copy's own event has completed. The owning ``Queue`` keeps its in-order
promise around these copies (backends/opencl.py): each one waits for a marker of everything
queued before it, and later commands wait for the latest one.

A copy that fails still completes its user event (a failed user event left PoCL's waiting
commands hanging): the error is raised by the event's ``wait()`` and by the queue's
``finish()``, so a stream that depends on the copy fails at its end at the latest.
Copies run one at a time, in the order they were asked for.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable

import pyopencl as cl

from conveyor.backends import opencl
from conveyor.closing import join
from conveyor.errors import BackendError

Copy = Callable[[cl.CommandQueue], cl.Event]  # a blocking enqueue on the queue it is given


class ElsewhereEvent(opencl.Event):
    """A user event that stands for one copy made on an ``ElsewhereCopier``'s thread: waiting
    on it waits for the copy; its profile is the copy's; a failed copy raises its error."""

    __slots__ = ("copy_event", "error")

    def __init__(self, user_event: cl.UserEvent) -> None:
        super().__init__(user_event)
        self.copy_event: opencl.Event | None = None
        self.error: BaseException | None = None

    def wait(self) -> None:
        super().wait()
        if self.error is not None:
            raise _failure(self.error, "")  # a new exception each time, caused by the copy's

    def detached(self) -> ElsewhereEvent:
        return self  # it holds no host array: the copy's event is detached already

    def profile_ns(self) -> tuple[int, int] | None:
        return self.copy_event.profile_ns() if self.copy_event is not None else None


class ElsewhereCopier:
    """One thread and one command queue that make blocking copies for one ``Queue``, in order
    (see the module docstring). ``drain()`` waits for every copy asked for so far and raises
    the first failure not yet raised; ``close()`` also ends the thread."""

    def __init__(self, context: cl.Context, device: cl.Device) -> None:
        self._context = context
        try:
            self._queue = cl.CommandQueue(
                context, device, properties=cl.command_queue_properties.PROFILING_ENABLE)
        except cl.Error as exc:
            raise opencl._backend_error(exc, "clCreateCommandQueue") from exc
        self._jobs: queue.Queue[tuple[Copy, ElsewhereEvent] | None] = queue.Queue()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=_main,
                                        args=(self._jobs, self._queue, weakref.ref(self)),
                                        name="conveyor-copy-elsewhere", daemon=True)
        self._thread.start()
        # A Queue dropped without close(): the thread ends with it, not with the process.
        self._finalizer = weakref.finalize(self, self._jobs.put, None)

    def submit(self, copy: Copy) -> ElsewhereEvent:
        """Queue ``copy``; its stand-in event, at once."""
        if not self._thread.is_alive():
            raise BackendError("the copier of this queue has stopped (the queue was closed)",
                               call="enqueue")
        try:
            done = ElsewhereEvent(cl.UserEvent(self._context))
        except cl.Error as exc:
            raise opencl._backend_error(exc, "clCreateUserEvent") from exc
        self._jobs.put((copy, done))
        return done

    def failed(self, error: BaseException) -> None:
        """Called on the thread: keep the first failure for ``drain()``."""
        if self._failure is None:
            self._failure = error

    def drain(self) -> None:
        """Wait until every copy asked for so far has been made or has failed; raise the
        first failure not raised yet."""
        if self._thread.is_alive():
            self._jobs.join()
        failure, self._failure = self._failure, None
        if failure is not None:
            raise _failure(failure, "a copy of memory pinned by another context failed: ")

    def close(self) -> None:
        """Make the copies still asked for, then end the thread (failures are dropped: they
        were raised by ``finish()`` or the events' ``wait()``, or nobody asked)."""
        self._finalizer.detach()
        if self._thread.is_alive():
            self._jobs.put(None)
            join(self._thread)
        self._queue.finish()


def _failure(error: BaseException, prefix: str) -> BackendError:
    """A BackendError for a copy's ``error`` (raise it ``from error``)."""
    if isinstance(error, BackendError):
        raised = BackendError(prefix + error.message, call=error.call, code=error.code)
    else:
        raised = BackendError(f"{prefix}{type(error).__name__}: {error}",
                              call="clEnqueueReadWriteBuffer (blocking)")
    raised.__cause__ = error
    return raised


def _main(jobs: queue.Queue, cq: cl.CommandQueue,
          owner_ref: weakref.ref[ElsewhereCopier]) -> None:
    """The copier's thread: holds the copier only weakly (so a dropped queue's copier can be
    collected, and its finalizer ends this loop)."""
    while (job := jobs.get()) is not None:
        copy, done = job
        del job
        try:
            event = copy(cq)
            event.wait()  # a blocking write only promises the host memory is free again
            status = event.command_execution_status
            if status < 0:
                raise BackendError("the copy failed", call="clEnqueueReadWriteBuffer",
                                   code=opencl._code_name(status))
            done.copy_event = opencl.Event(cl.Event.from_int_ptr(event.int_ptr))
            del event
        except BaseException as exc:  # raised where the copy is waited on, and by drain()
            if isinstance(exc, cl.Error):
                exc = opencl._backend_error(exc, "clEnqueueReadWriteBuffer (blocking)")
            done.error = exc
            copier = owner_ref()
            if copier is not None:
                copier.failed(exc)
            del copier
        try:
            done.cl_event.set_status(opencl._COMPLETE)  # also after a failure: see above
        except BaseException:  # the thread must not die: drain() would wait for ever
            pass
        finally:
            del copy, done
            jobs.task_done()
    jobs.task_done()
