"""The OpenCL backend, over PyOpenCL: NVIDIA, AMD and Intel GPUs, and PoCL on the CPU.

Pinned host memory is an ``ALLOC_HOST_PTR`` buffer mapped once and kept mapped for its life:
on NVIDIA and AMD that mapping is page-locked, so copies from it run at full link speed.

What OpenCL can promise for :func:`register_host` (pinning an existing array in place): it
wraps the array in a ``USE_HOST_PTR`` buffer. On host-unified devices (PoCL's CPU device,
integrated GPUs) kernels then use the memory in place, with no copy. On discrete GPUs the
standard gives no way to page-lock memory the application allocated: the driver may stage
copies through its own pinned memory, so a registered array is correct but not faster. The
registration reports this as ``page_locked = False``, and a kept array (cv.keep_pinned) is
copied buffer to buffer through its buffer, with the maps the standard asks for.

NVIDIA's OpenCL is the exception that was measured (bench/NOTES.md, session 14): it page-locks
a USE_HOST_PTR buffer's memory when it makes the buffer (a GiB already faulted in: 64 ms), and
plain host-pointer copies to and from that memory then run at the pinned rate (54 GB/s,
against 8-15 pageable), asynchronously. There (``Device.locks_host_ptr``) a registration is
``page_locked``, a kept array is copied from and to its own memory, and pinned blocks of
``_LOCKED_MIN_BYTES`` or more are anonymous memory faulted in on several threads and wrapped
so (``LockedPinned``): ``ALLOC_HOST_PTR`` memory came at 1.2-1.9 GB/s, its pages faulted on
one thread (``CONVEYOR_PINNED_ALLOC=driver`` keeps it). Two such buffers must not overlap: a
second one over part of the same memory made every copy from it pageable again.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from conveyor import config, hazards
from conveyor.backends import base, opencl_kernels
from conveyor.backends.opencl_kernels import ARG_INFO_OPTION, Kernel, _version_number
from conveyor.errors import BackendError, InputError, OutOfMemoryError
from conveyor.kernels.signature import Param
from conveyor.memory import hostmem, keep

_COMPLETE = cl.command_execution_status.COMPLETE
_PROFILE_START = cl.profiling_info.START
_PROFILE_END = cl.profiling_info.END
#: Pinned blocks this large or larger are ``LockedPinned`` on NVIDIA (smaller ones are few,
#: and ALLOC_HOST_PTR makes them as fast), as CUDA's registered blocks.
_LOCKED_MIN_BYTES = 4 * 2**20


def _public_write(queue: Any, mem: Any, hostbuf: Any, **kw: Any) -> Any:
    return cl.enqueue_copy(queue, mem, hostbuf, **kw)


def _public_read(queue: Any, mem: Any, hostbuf: Any, **kw: Any) -> Any:
    return cl.enqueue_copy(queue, hostbuf, mem, **kw)


# enqueue_copy dispatches on its arguments' types at every call; the engine knows them, so it
# calls the two entry points enqueue_copy would pick (same arguments, same NannyEvent), or the
# public path on a PyOpenCL without them.
_write_buffer: Callable[..., Any] = getattr(cl._cl, "_enqueue_write_buffer", _public_write)
_read_buffer: Callable[..., Any] = getattr(cl._cl, "_enqueue_read_buffer", _public_read)
_OOM_CODES = {
    cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE,
    cl.status_code.OUT_OF_RESOURCES,
    cl.status_code.OUT_OF_HOST_MEMORY,
}


def _code_name(code: int) -> str:
    try:
        return str(cl.status_code.to_string(code))
    except Exception:  # unknown codes have no name
        return str(code)


def _backend_error(exc: cl.Error, call: str) -> BackendError:
    what = getattr(exc, "what", None)
    text = what.what() if what is not None and hasattr(what, "what") else ""
    # PyOpenCL's error record often carries an empty message (e.g. a read past the end of a
    # buffer): fall back to the exception's own text so the error never reads as blank.
    text = str(text).strip() or str(exc)
    return BackendError(text, call=call, code=_code_name(exc.code))


class Event(base.Event):
    """A ``cl.Event``."""

    __slots__ = ("cl_event",)

    def __init__(self, cl_event: cl.Event) -> None:
        self.cl_event = cl_event

    def wait(self) -> None:
        _check_not_forked()
        try:
            self.cl_event.wait()
        except cl.Error as exc:
            raise _backend_error(exc, "clWaitForEvents") from exc
        status = self.cl_event.command_execution_status
        if status < 0:
            raise BackendError("a command failed", call="clWaitForEvents", code=_code_name(status))

    def is_done(self) -> bool:
        # A pool asks this of the events its parent left pending: the first driver call a
        # forked child makes on the GPU path, so it must say "fork" too.
        _check_not_forked()
        return bool(self.cl_event.command_execution_status <= _COMPLETE)

    def detached(self) -> Event:
        # PyOpenCL's copy events (NannyEvent) hold the host array until waited on; a plain
        # Event on the same handle holds only the driver's event. Other events hold no
        # host memory: kept as they are (a report detaches every block's records).
        if not isinstance(self.cl_event, cl.NannyEvent):
            return self
        return Event(cl.Event.from_int_ptr(self.cl_event.int_ptr))

    def profile_ns(self) -> tuple[int, int] | None:
        try:
            # get_profiling_info directly: event.profile.start goes through a slow getattr hook.
            info = self.cl_event.get_profiling_info
            return int(info(_PROFILE_START)), int(info(_PROFILE_END))
        except cl.Error:
            return None


class UserEvent(Event, base.UserEvent):
    """A ``cl.UserEvent``."""

    def set_complete(self) -> None:
        _check_not_forked()
        self.cl_event.set_status(_COMPLETE)


class DeviceBuffer(base.DeviceBuffer):
    """A ``cl.Buffer`` in device memory."""

    def __init__(self, cl_buffer: cl.Buffer, nbytes: int) -> None:
        self.cl_buffer: cl.Buffer | None = cl_buffer
        self.nbytes = nbytes

    def close(self) -> None:
        if self.cl_buffer is not None:
            if not _forked:  # a forked child must not call the driver: the parent owns it
                self.cl_buffer.release()
            self.cl_buffer = None


class PinnedBuffer(base.PinnedBuffer):
    """An ``ALLOC_HOST_PTR`` buffer, mapped for its whole life; ``array`` is the mapping."""

    def __init__(self, cl_buffer: cl.Buffer, array: np.ndarray, queue: cl.CommandQueue,
                 host_lock: Any = None) -> None:
        self.cl_buffer: cl.Buffer | None = cl_buffer
        self.array = array
        self.nbytes = array.nbytes
        self._queue = queue
        self._host_lock = host_lock or threading.RLock()

    def close(self) -> None:
        if self.cl_buffer is None:
            return
        mapping = self.array.base
        self.array = np.empty(0, np.uint8)
        if not _forked:  # a forked child must not call the driver (the wait would hang)
            if isinstance(mapping, cl.MemoryMap):
                with self._host_lock:  # the device's host queue: see Device._host_lock
                    unmapped = mapping.release(self._queue)
                unmapped.wait()
            with self._host_lock:
                self.cl_buffer.release()
        self.cl_buffer = None


class LockedPinned(base.PinnedBuffer):
    """Anonymous memory faulted in on several threads (memory/hostmem.py), page-locked by
    NVIDIA's OpenCL through a ``USE_HOST_PTR`` buffer over it (see the module docstring);
    ``array`` is the memory itself. The buffer is released before the memory is unmapped."""

    def __init__(self, cl_buffer: cl.Buffer, address: int, nbytes: int,
                 host_lock: Any = None) -> None:
        self.cl_buffer: cl.Buffer | None = cl_buffer
        self.nbytes = nbytes
        self.array = np.asarray(_LockedMemory(address, nbytes))
        # Also when the block is dropped unclosed (a device let go of without close()):
        # PyOpenCL frees the buffer then, but nothing would unmap the memory.
        self._release = weakref.finalize(self, _release_locked, cl_buffer, address, nbytes,
                                         host_lock or threading.RLock())
        self._release.atexit = False  # at exit the process's memory goes anyway, drivers first

    def close(self) -> None:
        if self.cl_buffer is None:
            return
        self.array = np.empty(0, np.uint8)
        self.cl_buffer = None
        self._release()


def _release_locked(buf: cl.Buffer, address: int, nbytes: int, host_lock: Any) -> None:
    """Release a ``LockedPinned`` block's buffer (the driver unlocks the memory), then unmap
    the memory. Not in a forked child: the parent's driver holds it."""
    if _forked:
        return
    try:
        with host_lock:
            buf.release()
    except cl.Error:  # the context went first (interpreter exit): nothing to unlock
        pass
    hostmem.unmap(address, nbytes)


class _LockedMemory:
    """What a ``LockedPinned`` array views (``_is_pinned`` knows it by this type)."""

    def __init__(self, address: int, nbytes: int) -> None:
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                    "data": (address, False), "version": 3}


class SvmBuffer(base.PinnedBuffer):
    """Fine-grained shared virtual memory: host and kernels use the same pointer."""

    def __init__(self, allocation: np.ndarray) -> None:
        self.array = allocation
        self.nbytes = allocation.nbytes

    def close(self) -> None:
        alloc = self.array.base
        self.array = np.empty(0, np.uint8)
        if isinstance(alloc, cl.SVMAllocation) and not _forked:
            alloc.release()


class Registration(base.Registration):
    """An array wrapped in a ``USE_HOST_PTR`` buffer (see the module docstring).

    A kept array's buffer (cv.keep_pinned) is used by many queues at once: streams copying
    from it, a stream copying into it (then mapping each block back), new streams telling the
    driver the host changed it (a map that invalidates). OpenCL leaves a map that overlaps any
    other command on the buffer undefined (PoCL aborted the process). So every command on the
    buffer goes
    through :meth:`copy` or :meth:`map_back`, under ``lock``: a copy waits for the last map's
    unmap, and a map waits for every copy enqueued since the map before it. Copies still run
    together; only maps are ordered.
    """

    def __init__(self, array: np.ndarray, cl_buffer: cl.Buffer,
                 queue: cl.CommandQueue | None = None,
                 host_lock: Any = None, page_locked: bool = False) -> None:
        self.array = array
        # True on NVIDIA's OpenCL: the memory itself is copied from and to (no map needed).
        self.page_locked = page_locked
        self.cl_buffer: cl.Buffer | None = cl_buffer
        self._queue = queue
        self._host_lock = host_lock or threading.RLock()  # guards _queue (Device._host_lock)
        self.lock = threading.Lock()
        self.last_unmap: cl.Event | None = None
        self._copies: list[cl.Event] = []  # enqueued since the last map (maybe done)

    def copy(self, enqueue: Callable[[list[cl.Event]], cl.Event]) -> cl.Event:
        """``enqueue(wait_for)`` a command that reads or writes this buffer, after the last
        map's unmap; a later map waits for it."""
        with self.lock:
            event = enqueue([self.last_unmap] if self.last_unmap is not None else [])
            if len(self._copies) >= 64:  # a long stream of reads and no map: drop the done
                self._copies = [e for e in self._copies if not _complete(e)]
            self._copies.append(event)
        return event

    def map_back(self, queue: cl.CommandQueue, flags: int, start: int, nbytes: int,
                 wait_for: Sequence[cl.Event] = (),
                 copy: Callable[[list[cl.Event]], cl.Event] | None = None) -> cl.Event:
        """Map ``nbytes`` from ``start`` with ``flags`` on ``queue`` and unmap them, after every
        command on the buffer before it (and after ``copy``, enqueued first under the same lock
        when given: no map of another thread comes between the two). Returns the unmap's
        event; never blocks."""
        with self.lock:
            last = [self.last_unmap] if self.last_unmap is not None else []
            before = list(wait_for) + self._copies + last
            if copy is not None:
                before.append(copy(last))
            mapped, _ = cl.enqueue_map_buffer(queue, self.cl_buffer, flags, start, (nbytes,),
                                              np.uint8, wait_for=before or None,
                                              is_blocking=False)
            unmapped = mapped.base.release(queue)
            self.last_unmap = unmapped
            self._copies = []
        return unmapped

    def host_changed(self) -> None:
        """Tell the driver the host may have written the array since it last looked (a map
        that invalidates, then an unmap): a kept array read by a new stream
        (memory/keep.py)."""
        if self.cl_buffer is None or self._queue is None or _forked or self.page_locked:
            return  # page-locked: copies read the host's memory itself, never the buffer
        # Waited for outside the lock: the copies it follows may wait on gates that a thread
        # opens only after it has enqueued its own command on this buffer.
        with self._host_lock:
            unmapped = self.map_back(self._queue, cl.map_flags.WRITE_INVALIDATE_REGION, 0,
                                     self.array.nbytes)
        unmapped.wait()

    def close(self) -> None:
        if self.cl_buffer is not None:
            if not _forked:
                self.cl_buffer.release()
            self.cl_buffer = None


def _buffer_arg(value: Any) -> Any:
    if isinstance(value, DeviceBuffer | PinnedBuffer | LockedPinned | Registration):
        # A closed buffer has cl_buffer None, which PyOpenCL would pass as a NULL pointer:
        # the kernel would write through it. Refuse instead.
        if value.cl_buffer is None:
            raise BackendError("a kernel argument is a freed buffer", call="clSetKernelArg",
                               code="INVALID_MEM_OBJECT")
        return value.cl_buffer
    if isinstance(value, SvmBuffer):
        return cl.SVM(value.array)
    return value


class Queue(base.Queue):
    """An in-order ``cl.CommandQueue`` with profiling enabled."""

    def __init__(self, device: Device) -> None:
        _check_not_forked()
        self.device = device
        try:
            self.cl_queue: cl.CommandQueue | None = cl.CommandQueue(
                device.context, device.cl_device,
                properties=cl.command_queue_properties.PROFILING_ENABLE,
            )
        except cl.Error as exc:
            raise _backend_error(exc, "clCreateCommandQueue") from exc

    @property
    def native(self) -> cl.CommandQueue:
        """The ``pyopencl.CommandQueue``."""
        return self._q

    @property
    def _q(self) -> cl.CommandQueue:
        _check_not_forked()
        if self.cl_queue is None:
            raise BackendError("the queue is closed", call="enqueue")
        return self.cl_queue

    def copy_in(self, dst: base.DeviceBuffer, src: np.ndarray, *, dst_offset: int = 0,
                wait_for: Sequence[base.Event] = ()) -> Event:
        kept = keep.find(self.device, src) if keep._kept else None
        if kept is not None and not kept.registration.page_locked:
            # an array kept registered (cv.keep_pinned): buffer to buffer
            return self._copy_registered(dst, src, kept, dst_offset, wait_for)
        if hazards.armed(self.device) and kept is None and not _is_pinned(src):
            hazards.pageable_copy(self.device, "copy_in", src.nbytes)
        try:
            ev = _write_buffer(self._q, _cl_buf(dst), src, dst_offset=dst_offset,
                               wait_for=_events(wait_for),
                               is_blocking=_pinned_elsewhere(src, self.device))
        except cl.Error as exc:
            raise _backend_error(exc, "clEnqueueWriteBuffer") from exc
        return Event(ev)

    def _copy_registered(self, dst: base.DeviceBuffer, src: np.ndarray, kept: Any,
                         dst_offset: int, wait_for: Sequence[base.Event]) -> Event:
        start = hostmem.address(src) - kept.address
        registration = kept.registration
        try:
            ev = registration.copy(lambda before: cl.enqueue_copy(
                self._q, _cl_buf(dst), registration.cl_buffer, byte_count=src.nbytes,
                src_offset=start, dst_offset=dst_offset,
                wait_for=(_events(wait_for) or []) + before or None))
        except cl.Error as exc:
            raise _backend_error(exc, "clEnqueueCopyBuffer") from exc
        return Event(ev)

    def _copy_to_registered(self, dst: np.ndarray, src: base.DeviceBuffer, kept: Any,
                            src_offset: int, wait_for: Sequence[base.Event]) -> Event:
        """Copy into a kept array's ``USE_HOST_PTR`` buffer, then map those bytes for reading
        and unmap them: only then are the device's writes defined in the host's memory (a
        driver may hold the buffer's contents elsewhere). The unmap's event is the copy's."""
        if not dst.nbytes:
            return self.marker(wait_for)
        start = hostmem.address(dst) - kept.address
        registration = kept.registration
        buf = registration.cl_buffer
        try:
            unmapped = registration.map_back(
                self._q, cl.map_flags.READ, start, dst.nbytes,
                copy=lambda before: cl.enqueue_copy(
                    self._q, buf, _cl_buf(src), byte_count=dst.nbytes, src_offset=src_offset,
                    dst_offset=start, wait_for=(_events(wait_for) or []) + before or None))
            return Event(unmapped)
        except cl.Error as exc:
            raise _backend_error(exc, "clEnqueueCopyBuffer") from exc

    def copy_out(self, dst: np.ndarray, src: base.DeviceBuffer, *, src_offset: int = 0,
                 wait_for: Sequence[base.Event] = ()) -> Event:
        kept = keep.find(self.device, dst, written=True) if keep._kept else None
        if kept is not None and not kept.registration.page_locked:
            # an array kept registered (cv.keep_pinned): buffer to buffer
            return self._copy_to_registered(dst, src, kept, src_offset, wait_for)
        if hazards.armed(self.device) and kept is None and not _is_pinned(dst):
            hazards.pageable_copy(self.device, "copy_out", dst.nbytes)
        try:
            ev = _read_buffer(self._q, _cl_buf(src), dst, src_offset=src_offset,
                              wait_for=_events(wait_for),
                              is_blocking=_pinned_elsewhere(dst, self.device))
        except cl.Error as exc:
            raise _backend_error(exc, "clEnqueueReadBuffer") from exc
        return Event(ev)

    def launch(self, kernel: base.Kernel, global_size: int, args: Sequence[Any], *,
               local_size: int | None = None, wait_for: Sequence[base.Event] = ()) -> Event:
        assert isinstance(kernel, Kernel)
        values = kernel.convert_args(args)
        if local_size is None:
            local_size = kernel.default_local_size
        global_size = max(-(-global_size // local_size) * local_size, local_size)
        try:
            with kernel.lock:
                kernel.cl_kernel.set_args(*values)
                ev = cl.enqueue_nd_range_kernel(
                    self._q, kernel.cl_kernel, (global_size,), (local_size,),
                    wait_for=_events(wait_for),
                )
        except cl.Error as exc:
            raise _backend_error(exc, f"clEnqueueNDRangeKernel({kernel.name})") from exc
        return Event(ev)

    def copy_from_device(self, dst: base.DeviceBuffer, src: Any, nbytes: int, *,
                         wait_for: Sequence[base.Event] = ()) -> Event:
        data = getattr(src, "base_data", None)
        if not isinstance(data, cl.MemoryObjectHolder):
            if data is not None and "SVM" in type(data).__name__:
                raise InputError(f"the callable returned a {type(src).__name__} in shared "
                                 f"virtual memory ({type(data).__name__}): return one of a "
                                 f"buffer (PyOpenCL's default allocator), or write into the "
                                 f"output array it is given")
            raise InputError(f"a {type(src).__name__} is not an OpenCL device array: return a "
                             f"pyopencl.array.Array")
        offset = int(getattr(src, "offset", 0))
        target = _cl_buf(dst)
        if data.context.int_ptr != target.context.int_ptr:
            raise InputError(f"the callable returned a {type(src).__name__} of another OpenCL "
                             f"context than {self.device.spec}'s: make it on the queue it is "
                             f"given (its context)")
        if (data.int_ptr, offset) == (target.int_ptr, 0) or not nbytes:
            return self.marker(wait_for)  # the callable returned the output it was given
        # PyOpenCL arrays carry the events of the work that made them (enqueued on a queue of
        # the callable's own, say): the copy waits for them, as PyOpenCL's own operations do.
        made = [e for e in getattr(src, "events", ()) if isinstance(e, cl.Event)]
        try:
            ev = cl.enqueue_copy(self._q, target, data, byte_count=nbytes, src_offset=offset,
                                 wait_for=(_events(wait_for) or []) + made or None)
        except cl.Error as exc:
            raise _backend_error(exc, "clEnqueueCopyBuffer") from exc
        return Event(ev)

    def fill(self, dst: base.DeviceBuffer, byte: int, nbytes: int, *, offset: int = 0,
             wait_for: Sequence[base.Event] = ()) -> Event:
        try:
            ev = cl.enqueue_fill_buffer(self._q, _cl_buf(dst), np.uint8(byte), offset, nbytes,
                                        wait_for=_events(wait_for))
        except cl.Error as exc:
            raise _backend_error(exc, "clEnqueueFillBuffer") from exc
        return Event(ev)

    def copy_to_image(self, dst: base.DeviceImage, src: np.ndarray, rows: int, *,
                      wait_for: Sequence[base.Event] = ()) -> Event:
        from conveyor.backends import opencl_images

        return opencl_images.copy_to_image(self, dst, src, rows, wait_for)

    def marker(self, wait_for: Sequence[base.Event] = ()) -> Event:
        return Event(cl.enqueue_marker(self._q, wait_for=_events(wait_for) or None))

    def sync_host(self, registration: base.Registration,
                  wait_for: Sequence[base.Event] = ()) -> Event:
        # A USE_HOST_PTR buffer's contents are only defined for the host after a map; on
        # host-unified devices the map is free, elsewhere it copies back.
        buf = getattr(registration, "cl_buffer", None)
        if buf is None:
            raise BackendError("the registration is closed", call="clEnqueueMapBuffer")
        array = registration.array
        try:
            mapped, _ = cl.enqueue_map_buffer(
                self._q, buf, cl.map_flags.READ, 0, (array.nbytes,), np.uint8,
                wait_for=_events(wait_for), is_blocking=False,
            )
            return Event(mapped.base.release(self._q))
        except cl.Error as exc:
            raise _backend_error(exc, "clEnqueueMapBuffer") from exc

    def flush(self) -> None:
        self._q.flush()

    def finish(self) -> None:
        try:
            self._q.finish()
        except cl.Error as exc:
            raise _backend_error(exc, "clFinish") from exc

    def close(self) -> None:
        if self.cl_queue is not None and not _forked:  # finish() would hang in a forked child
            self.cl_queue.finish()
        self.cl_queue = None


def _is_pinned(array: np.ndarray) -> bool:
    """True when ``array`` views mapped or shared memory: a pinned buffer's mapping, an SVM
    allocation, or an array of conveyor's pinned pool."""
    kinds = _pinned_kinds()
    holder: Any = array
    while holder is not None:
        if isinstance(holder, kinds):
            return True
        holder = getattr(holder, "base", None)
    return False


def _pinned_elsewhere(array: np.ndarray, device: base.Device) -> bool:
    """True when ``array`` is conveyor pinned memory of another OpenCL context that
    ``device`` copies directly (``Device.copies_pinned_of``; another device of a stream over
    several). NVIDIA's driver copies such memory at the pinned rate but synchronously, inside
    the enqueue call, and PyOpenCL holds the GIL through a non-blocking enqueue: every other
    thread (the other devices' engines) stalls for the copy. A blocking enqueue releases the
    GIL (measured on 2 x H200: GIL gaps of 12-30 ms non-blocking, 1.1 ms blocking, 53 GB/s
    either way), so these copies are made blocking, on the caller's thread: such a
    ``copy_in``/``copy_out`` returns once the copy is done, so its ``wait_for`` must not hold
    events that only the caller completes later. (A copier thread
    that answered with user events was tried: no faster on 2 x H200, and a dropped PyOpenCL
    copy event waiting on such a user event deadlocked under the GIL.)"""
    from conveyor.memory.pinned import owner

    found = owner(array)
    return (found is not None and found.device is not device
            and device.copies_pinned_of(found.device))


@functools.cache
def _pinned_kinds() -> tuple[type, ...]:
    # Imported on first use (memory imports the backends' interface), then kept: this runs at
    # every copy while a stream is watched for hazards.
    from conveyor.memory.pinned import PinnedOwner

    return (cl.MemoryMap, cl.SVMAllocation, _LockedMemory, PinnedOwner)


def _cl_buf(buf: base.DeviceBuffer) -> cl.Buffer:
    cl_buffer = getattr(buf, "cl_buffer", None)
    if cl_buffer is None:
        raise BackendError("the buffer was freed or is not an OpenCL buffer", call="enqueue",
                           code="INVALID_MEM_OBJECT")
    return cl_buffer


def _complete(event: cl.Event) -> bool:
    """Whether ``event``'s command is over (complete, or failed: a negative status)."""
    try:
        return int(event.command_execution_status) <= _COMPLETE
    except cl.Error:  # a released event
        return True


def _events(events: Sequence[base.Event]) -> list[cl.Event] | None:
    if not events:
        return None
    return [e.cl_event for e in events if isinstance(e, Event)]


_KIND = {cl.device_type.GPU: "gpu", cl.device_type.CPU: "cpu"}


class Device(base.Device):
    """One OpenCL device, with its own context and a queue for mapping host memory."""

    def __init__(self, cl_device: cl.Device, platform_index: int, device_index: int) -> None:
        kind = "other"
        for flag, name in _KIND.items():
            if cl_device.type & flag:
                kind = name
                break
        svm_caps = 0
        try:
            svm_caps = int(cl_device.svm_capabilities)
        except (cl.Error, AttributeError):
            svm_caps = 0
        self.fine_grain_svm = bool(svm_caps & cl.device_svm_capabilities.FINE_GRAIN_BUFFER)
        info = base.DeviceInfo(
            backend="opencl",
            spec=f"opencl:{platform_index}:{device_index}",
            name=cl_device.name.strip(),
            kind=kind,  # type: ignore[arg-type]
            global_mem_bytes=int(cl_device.global_mem_size),
            max_alloc_bytes=int(cl_device.max_mem_alloc_size),
            compute_units=int(cl_device.max_compute_units),
            # Only fine-grained SVM is usable here (alloc_svm, pinned.empty(svm=True)); a
            # coarse-grain-only device (NVIDIA's OpenCL) must not advertise svm.
            svm=self.fine_grain_svm,
            host_unified=bool(cl_device.host_unified_memory) or kind == "cpu",
            driver_version=str(cl_device.driver_version),
            platform=cl_device.platform.name.strip(),
        )
        _check_not_forked()
        super().__init__(info)
        self.cl_device = cl_device
        #: NVIDIA's discrete GPUs: a USE_HOST_PTR buffer page-locks its memory (module
        #: docstring), so registrations are page-locked and pinned blocks are made that way.
        self.locks_host_ptr = "NVIDIA" in info.platform and not info.host_unified
        self._image_limits: base.ImageLimits | None = None
        _install_fork_hook()  # from the first context on, a forked child cannot use OpenCL
        try:
            self.context = cl.Context([cl_device])
            self._host_queue = cl.CommandQueue(self.context, cl_device)
            # One thread at a time enqueues on the host queue and makes or frees buffers of
            # the context through it (the waits happen outside): NVIDIA's OpenCL crashed in
            # one of its own threads (one run in about 20) while streams' threads mapped
            # new pinned blocks, migrated new device blocks and synced kept arrays at once.
            # Reentrant: a pinned block's finalizer (its unmap) may run in a garbage
            # collection inside the lock, on the same thread.
            self._host_lock = threading.RLock()
        except cl.Error as exc:
            raise _backend_error(exc, "clCreateContext") from exc

    def create_queue(self) -> Queue:
        return Queue(self)

    def pci_address(self) -> str | None:
        """From NVIDIA's ``cl_nv_device_attribute_query`` (bus; slot, which driver 580 on an
        H100 gave as the device number, the form CUDA's attributes give, and which tools such
        as clinfo read as device << 3 | function: the form sysfs has is taken; domain where
        the driver has it) or AMD's topology query; None elsewhere."""
        info = cl.device_info
        extensions = self.cl_device.extensions
        try:
            if "cl_nv_device_attribute_query" in extensions:
                bus = int(self.cl_device.get_info(info.PCI_BUS_ID_NV)) & 0xFF
                slot = int(self.cl_device.get_info(info.PCI_SLOT_ID_NV)) & 0xFF
                try:
                    domain = int(self.cl_device.get_info(info.PCI_DOMAIN_ID_NV)) & 0xFFFF
                except (cl.Error, AttributeError, TypeError, ValueError):
                    domain = 0  # drivers before the domain query: one domain
                forms = [f"{domain:04x}:{bus:02x}:{slot:02x}.0",
                         f"{domain:04x}:{bus:02x}:{slot >> 3:02x}.{slot & 7:x}"]
                present = [f for f in forms if os.path.exists(f"/sys/bus/pci/devices/{f}")]
                return (present or forms)[0]
            if "cl_amd_device_attribute_query" in extensions:
                topology = self.cl_device.get_info(info.TOPOLOGY_AMD)
                # PyOpenCL reads the fields as signed chars: bus 0x85 comes back as -123.
                return f"0000:{int(topology.bus) & 0xFF:02x}:" \
                       f"{int(topology.device) & 0xFF:02x}.{int(topology.function) & 0xFF:x}"
        except (cl.Error, AttributeError, TypeError, ValueError):
            return None
        return None

    def copies_pinned_of(self, other: base.Device) -> bool:
        """Pinned memory of another context of the same platform is copied directly, with
        blocking copies (``_pinned_elsewhere``), where that was measured to pay: NVIDIA's
        driver runs them at the pinned rate (53 GB/s on an H200, against a host memcpy into
        this device's own ring, which also takes the host memory bandwidth the other devices'
        copies need), and on a CPU device a copy is one memcpy instead of the ring's two.
        Other platforms' GPUs stage it, as they would pageable memory."""
        if other is self:
            return True
        theirs = getattr(other, "cl_device", None)
        if theirs is None or theirs.platform != self.cl_device.platform:
            return False
        return self.kind == "cpu" or "NVIDIA" in self.cl_device.platform.name

    def alloc_device(self, nbytes: int) -> DeviceBuffer:
        _check_not_forked()
        base.check_nbytes(nbytes, "alloc_device")
        if nbytes > self.max_alloc_bytes:
            raise InputError(
                f"{nbytes} bytes is more than {self.name}'s largest allocation "
                f"({self.max_alloc_bytes} bytes): use smaller blocks"
            )
        try:
            with self._host_lock:
                buf = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, nbytes)
                # Make it resident now, so out-of-memory shows here and not at first use.
                migrated = cl.enqueue_migrate_mem_objects(
                    self._host_queue, [buf], cl.mem_migration_flags.CONTENT_UNDEFINED)
            migrated.wait()
        except cl.Error as exc:
            if exc.code in _OOM_CODES:
                raise OutOfMemoryError(nbytes, 0, None, where="device") from exc
            raise _backend_error(exc, "clCreateBuffer") from exc
        return DeviceBuffer(buf, nbytes)

    @property
    def max_pinned_bytes(self) -> int | None:
        """Pinned memory here is a buffer (``ALLOC_HOST_PTR``): the device's largest
        allocation bounds it."""
        return self.max_alloc_bytes

    def alloc_pinned(self, nbytes: int) -> base.PinnedBuffer:
        _check_not_forked()
        base.check_nbytes(nbytes, "alloc_pinned")
        if nbytes > self.max_alloc_bytes:
            raise InputError(
                f"{nbytes} bytes of pinned memory is more than {self.name}'s largest "
                f"allocation ({self.max_alloc_bytes} bytes): use a smaller array, or keep a "
                f"pageable one page-locked (cv.keep_pinned)")
        if (self.locks_host_ptr and nbytes >= _LOCKED_MIN_BYTES
                and config.pinned_alloc_mode() == "register" and hostmem.fits(nbytes)):
            made = self._alloc_locked(nbytes)
            if made is not None:
                return made
        flags = cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR
        try:
            with self._host_lock:
                buf = cl.Buffer(self.context, flags, nbytes)
                array, mapped = cl.enqueue_map_buffer(
                    self._host_queue, buf, cl.map_flags.READ | cl.map_flags.WRITE, 0,
                    (nbytes,), np.uint8, is_blocking=False,
                )
            mapped.wait()
        except cl.Error as exc:
            if exc.code in _OOM_CODES:
                raise OutOfMemoryError(nbytes, 0, None, where="pinned host") from exc
            raise _backend_error(exc, "clEnqueueMapBuffer") from exc
        return PinnedBuffer(buf, array, self._host_queue, self._host_lock)

    def _alloc_locked(self, nbytes: int) -> LockedPinned | None:
        """Anonymous memory faulted in on several threads, then wrapped in a USE_HOST_PTR
        buffer that page-locks it; None where that fails (the caller falls back to
        ALLOC_HOST_PTR, which says whether there is memory)."""
        try:
            address = hostmem.map_faulted(nbytes)
        except MemoryError:
            return None
        try:
            with self._host_lock:
                buf = cl.Buffer(self.context, cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR,
                                hostbuf=hostmem.view(address, nbytes))
        except BaseException:
            hostmem.unmap(address, nbytes)
            return None
        return LockedPinned(buf, address, nbytes, self._host_lock)

    def alloc_svm(self, nbytes: int) -> SvmBuffer:
        """Fine-grained SVM host memory; BackendError where the device has none, InputError
        for a size no allocation has (0, negative, past the device's largest)."""
        _check_not_forked()
        base.check_nbytes(nbytes, "alloc_svm")
        if nbytes > self.max_alloc_bytes:
            raise InputError(
                f"{nbytes} bytes of shared virtual memory is more than {self.name}'s largest "
                f"allocation ({self.max_alloc_bytes} bytes): use a smaller array")
        if not self.fine_grain_svm:
            raise BackendError(
                f"{self.name} has no fine-grained SVM: use conveyor.pinned.empty instead",
                call="clSVMAlloc", code="INVALID_OPERATION",
            )
        flags = cl.svm_mem_flags.READ_WRITE | cl.svm_mem_flags.SVM_FINE_GRAIN_BUFFER
        try:
            array = cl.svm_empty(self.context, flags, (nbytes,), np.uint8, alignment=4096)
        except cl.Error:
            # PoCL refuses alignments above its largest data type (128 bytes) with
            # OUT_OF_RESOURCES; the driver's default alignment suits every dtype.
            try:
                array = cl.svm_empty(self.context, flags, (nbytes,), np.uint8)
            except cl.Error as exc:
                if exc.code in _OOM_CODES:
                    raise OutOfMemoryError(nbytes, 0, None, where="shared virtual") from exc
                raise _backend_error(exc, "clSVMAlloc") from exc
        if array is None or array.base is None:
            raise OutOfMemoryError(nbytes, 0, None, where="shared virtual")
        return SvmBuffer(array)

    def register_host(self, array: np.ndarray) -> Registration:
        _check_not_forked()
        # As cv.pinned.register says (PyOpenCL's bare ValueError, the driver's
        # INVALID_BUFFER_SIZE named neither the array nor what to pass).
        if not array.flags.c_contiguous:
            raise InputError("register_host needs a C-contiguous array: pass "
                             "np.ascontiguousarray(a)")
        if not array.nbytes:
            raise InputError("register_host needs a non-empty array")
        access = cl.mem_flags.READ_WRITE if array.flags.writeable else cl.mem_flags.READ_ONLY
        flags = access | cl.mem_flags.USE_HOST_PTR
        try:
            with self._host_lock:
                buf = cl.Buffer(self.context, flags, hostbuf=array)
        except cl.Error as exc:
            raise _backend_error(exc, "clCreateBuffer(USE_HOST_PTR)") from exc
        return Registration(array, buf, self._host_queue, self._host_lock,
                            page_locked=self.locks_host_ptr)

    def user_event(self) -> UserEvent:
        _check_not_forked()
        return UserEvent(cl.UserEvent(self.context))

    def compiler_identity(self) -> str:
        _check_not_forked()  # NVIDIA's driver answers a forked child with INVALID_DEVICE
        platform = self.cl_device.platform
        return "|".join([
            "opencl", platform.name, platform.version, self.cl_device.name,
            self.cl_device.version, self.info.driver_version,
            ".".join(str(v) for v in cl.VERSION),
            ARG_INFO_OPTION,  # every build adds it, and it changes the binary
        ])

    def source_macros(self) -> dict[str, str]:
        _check_not_forked()
        from conveyor.kernels.clmacros import predefined

        macros = predefined()  # the specification's: CLK_LOCAL_MEM_FENCE, INT_MAX, M_PI...
        macros.update({"__OPENCL_VERSION__": _version_number(self.cl_device.version),
                       "__ENDIAN_LITTLE__": "1" if self.cl_device.endian_little else "0"})
        try:
            macros["__OPENCL_C_VERSION__"] = _version_number(self.cl_device.opencl_c_version)
        except (cl.Error, AttributeError):  # OpenCL 1.0 devices have no such query
            pass
        for extension in str(self.cl_device.extensions).split():
            macros[extension] = "1"
        # What OpenCL C compilers predefine besides (a typedef chosen by "#ifdef
        # __opencl_c_fp64" or "#if defined(CL_VERSION_1_2)" was read as the #else type).
        for version in ("1_0", "1_1", "1_2", "2_0", "3_0"):
            macros[f"CL_VERSION_{version}"] = version.replace("_", "") + "0"
        try:
            if self.cl_device.image_support:
                macros["__IMAGE_SUPPORT__"] = "1"
        except cl.Error:
            pass
        try:  # OpenCL 3.0 devices list their optional features: __opencl_c_fp64, ...
            for feature in self.cl_device.opencl_c_features:
                macros[str(feature.name)] = "1"
        except (cl.Error, AttributeError):
            pass
        return macros

    def build_binary(self, source: str, options: Sequence[str]) -> bytes:
        _check_not_forked()
        return opencl_kernels.build_binary(self, source, options)

    def load_kernel(self, binary: bytes, name: str, options: Sequence[str],
                    params: Sequence[Param]) -> Kernel:
        _check_not_forked()
        return opencl_kernels.load_kernel(self, binary, name, options, params)

    def device_array(self, buf: base.DeviceBuffer, shape: tuple[int, ...], dtype: np.dtype,
                     queue: base.Queue) -> Any:
        import pyopencl.array as cl_array

        assert isinstance(queue, Queue)
        # A Buffer object of its own, holding its own reference to the memory: conveyor
        # releases its buffer when the block retires or the pool trims, and an array the
        # callable kept (or a traceback's repr of it) then read freed memory: a SIGSEGV.
        own = cl.Buffer.from_int_ptr(_cl_buf(buf).int_ptr, retain=True)
        if isinstance(buf, base.Registration):
            # A zero-copy block's buffer is the caller's own rows (USE_HOST_PTR): the buffer
            # (and every view of the array, which shares it) keeps them alive too.
            own.conveyor_host = buf.array
        return cl_array.Array(queue._q, shape, dtype, data=own)

    @property
    def max_constant_bytes(self) -> int | None:
        return int(self.cl_device.max_constant_buffer_size)

    # Images live in opencl_images.py (this file keeps the buffer backend's shape).
    def image_limits(self) -> base.ImageLimits:
        from conveyor.backends import opencl_images

        if self._image_limits is None:
            self._image_limits = opencl_images.limits(self)
        return self._image_limits

    def alloc_image(self, rows: int, columns: int, channels: int, dtype: np.dtype
                    ) -> base.DeviceImage:
        from conveyor.backends import opencl_images

        dtype = np.dtype(dtype)  # np.float32 or "float32" as well as np.dtype("float32")
        base.check_image(self, rows, columns, channels, dtype)
        return opencl_images.alloc(self, rows, columns, channels, dtype)

    def image_sampler(self, address: str, filter: str, normalized: bool) -> Any:
        from conveyor.backends import opencl_images

        base.check_sampler(address, filter, normalized)
        return opencl_images.sampler(self, address, filter, normalized)

    def _in_forked_child(self) -> bool:
        return _forked

    def _release(self) -> None:
        if not _forked:  # finish() would hang in a forked child
            self._host_queue.finish()


# PoCL (and other drivers) keep threads and state that do not survive fork(): a child forked
# after the parent made an OpenCL context hangs in its first wait (the clock anchor of its
# first stream) or gets undefined behaviour. Mark such a child and say what to do instead. A
# child forked before any context exists is unaffected (the hook is installed with the first).
_forked = False
_fork_hook_installed = False
_fork_lock = threading.Lock()
_FORK_MESSAGE = (
    "this process was forked after conveyor's OpenCL backend made a context in its parent, "
    "and OpenCL cannot be used in a forked child (it would hang): start worker processes with "
    "multiprocessing.get_context('spawn') (or 'forkserver') instead of fork, or fork before "
    "the parent first uses conveyor"
)


def _mark_forked_child() -> None:
    global _forked
    _forked = True


def _install_fork_hook() -> None:
    global _fork_hook_installed
    with _fork_lock:
        if not _fork_hook_installed:
            os.register_at_fork(after_in_child=_mark_forked_child)
            _fork_hook_installed = True


def _check_not_forked() -> None:
    """BackendError in a child forked after this process's parent used OpenCL."""
    if _forked:
        raise BackendError(_FORK_MESSAGE, call="fork", code="INVALID_CONTEXT")


def discover() -> list[Device]:
    """Every OpenCL device on every platform, in platform then device order; BackendError in
    a child forked after its parent used OpenCL."""
    _check_not_forked()
    from conveyor.backends import drivercaches

    drivercaches.guard()  # before PoCL starts: its cache, and PyOpenCL's, in a safe folder
    config.note_driver_variables()  # what PoCL's first build will see, whoever builds
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        return []
    found: list[Device] = []
    for p_index, platform in enumerate(platforms):
        try:
            cl_devices = platform.get_devices()
        except cl.Error:
            continue
        for d_index, cl_device in enumerate(cl_devices):
            try:
                found.append(Device(cl_device, p_index, d_index))
            except BackendError:
                continue
    return found
