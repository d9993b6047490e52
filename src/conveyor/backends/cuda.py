"""The CUDA backend, over NVIDIA's cuda.core (>= 1.2) and the cuda.bindings driver API.

A queue is a non-blocking stream. Every command records a timed event before and after itself;
``profile_ns`` turns the pair into nanoseconds since one reference event the device records
when it opens (CUDA events measure intervals, not absolute time), lazily and only on request.

Memory: device buffers come from ``cuMemAlloc`` (immediate, so out-of-memory shows at
allocation), pinned buffers from ``cuMemHostAlloc`` (portable, mapped), and ``register_host``
page-locks an existing array with ``cuMemHostRegister``. Copies are ``cuMemcpy*Async`` on the
queue's stream straight from the array's pointer when it is page-locked, so they are
asynchronous. A pageable source of ``copy_in`` is first copied into a block of the device's
pinned pool (the driver's own pageable path would block the host until the stream is idle); a
pageable destination of ``copy_out`` goes through the driver, which returns only once the data
is there, so that call blocks until the stream reaches it.

Events (a command's start and end, pooled; user events built from a host flag) live in
cuda_events.py.

Arrays for Python compute callables (:meth:`Device.device_array`) speak
``__cuda_array_interface__`` (version 3, with the queue's stream) and DLPack, so CuPy, PyTorch
and Numba take them without a copy.
"""

from __future__ import annotations

import contextlib
import io
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from conveyor import config, hazards
from conveyor.backends import base, cuda_driver, cuda_order
from conveyor.backends.cuda_array import DeviceArray
from conveyor.backends.cuda_driver import (
    _HOST_ALLOC_FLAGS,
    _IMPORT_ERROR,
    _check,
    _code_name,
    _HostMemory,
    _wrap,
    cc,
    driver,
    nvrtc,
)
from conveyor.backends.cuda_events import Event, EventPool, UserEvent
from conveyor.errors import BackendError, CompileError, InputError, OutOfMemoryError
from conveyor.kernels.argtypes import check_sizes
from conveyor.kernels.signature import Param, arg_converters
from conveyor.memory import hostmem

_DEFAULT_BLOCK = 256


# -- memory ------------------------------------------------------------------------------------
_REGISTER_PORTABLE = 0x01
_REGISTER_DEVICEMAP = 0x02
_REGISTER_READ_ONLY = 0x08
#: Pinned allocations of this size or more page-lock anonymous memory faulted in on several
#: threads (memory/hostmem.py) instead of calling cuMemHostAlloc (``CONVEYOR_PINNED_ALLOC``).
_REGISTER_MIN_BYTES = 4 * 2**20
_MEMORYTYPE_HOST = 1  # CU_MEMORYTYPE_HOST
_ACCESS_READWRITE = 3  # CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE


def _free_device(ptr: int) -> None:
    if cuda_driver.forked():  # the parent's memory: the child must not call the driver
        return
    try:
        driver.cuMemFree(ptr)
    except Exception:  # never raise from a finalizer
        pass


def _free_host(ptr: int, spans: dict[int, int]) -> None:
    spans.pop(ptr, None)
    if cuda_driver.forked():
        return
    try:
        driver.cuMemFreeHost(ptr)
    except Exception:  # never raise from a finalizer
        pass


class DeviceBuffer(base.DeviceBuffer):
    """``cuMemAlloc`` memory; ``ptr`` is the device address (0 once closed)."""

    def __init__(self, device: Device, ptr: int, nbytes: int) -> None:
        self.device = device
        self.ptr = ptr
        self.nbytes = nbytes
        self._finalizer = weakref.finalize(self, _free_device, ptr)

    def close(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            self._finalizer.detach()
            if _forked:  # a forked child closing its device: the parent's memory, left alone
                return
            self.device._current()
            _check(driver.cuMemFree(ptr), "cuMemFree")


class PinnedBuffer(base.PinnedBuffer):
    """``cuMemHostAlloc`` memory (portable, mapped); ``array`` views all of it."""

    def __init__(self, device: Device, ptr: int, nbytes: int) -> None:
        self.device = device
        self.ptr = ptr
        self.nbytes = nbytes
        self.array = np.asarray(_HostMemory(ptr, nbytes))
        device._pinned_spans[ptr] = ptr + nbytes
        self._finalizer = weakref.finalize(self, _free_host, ptr, device._pinned_spans)

    def close(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            self.array = np.empty(0, np.uint8)
            self._finalizer.detach()
            self.device._pinned_spans.pop(ptr, None)
            if _forked:
                return
            self.device._current()
            _check(driver.cuMemFreeHost(ptr), "cuMemFreeHost")


class RegisteredPinned(PinnedBuffer):
    """Pinned memory made by page-locking anonymous memory that several threads faulted in
    (memory/hostmem.py): much faster to make than ``cuMemHostAlloc`` (issue 17)."""

    def __init__(self, device: Device, ptr: int, nbytes: int) -> None:
        self.device = device
        self.ptr = ptr
        self.nbytes = nbytes
        self.array = np.asarray(_HostMemory(ptr, nbytes))
        device._pinned_spans[ptr] = ptr + nbytes
        self._unmapper = weakref.finalize(self, _unregister_and_unmap, ptr, nbytes,
                                          device._pinned_spans)

    def close(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            self.array = np.empty(0, np.uint8)
            self._unmapper.detach()
            self.device._pinned_spans.pop(ptr, None)
            try:
                if not _forked:  # a forked child only unmaps its copy
                    self.device._current()
                    _check(driver.cuMemHostUnregister(ptr), "cuMemHostUnregister")
            finally:
                hostmem.unmap(ptr, self.nbytes)


def _unregister_and_unmap(ptr: int, nbytes: int, spans: dict[int, int]) -> None:
    spans.pop(ptr, None)
    try:
        if not cuda_driver.forked():
            driver.cuMemHostUnregister(ptr)
        hostmem.unmap(ptr, nbytes)
    except Exception:  # never raise from a finalizer
        pass


class Registration(base.Registration):
    """An array page-locked in place with ``cuMemHostRegister``.

    ``page_locked`` is False where the driver refused (memory already registered in part,
    read-only or file-backed pages it cannot lock): copies from the array stay correct.
    """

    def __init__(self, device: Device, array: np.ndarray, ptr: int, page_locked: bool,
                 reason: str = "") -> None:
        self.device = device
        self.array = array
        self.page_locked = page_locked
        self.reason = reason
        self._ptr = ptr if page_locked else 0
        # Dropped without close(), it kept the memory page-locked for good (NumPy then freed
        # memory the driver still held locked), as no other CUDA buffer does.
        self._finalizer = (weakref.finalize(self, _unregister, ptr) if page_locked else None)

    def close(self) -> None:
        if self._ptr:
            ptr, self._ptr = self._ptr, 0
            if self._finalizer is not None:
                self._finalizer.detach()
            if _forked:
                return
            self.device._current()
            _check(driver.cuMemHostUnregister(ptr), "cuMemHostUnregister")


def _unregister(ptr: int) -> None:
    if cuda_driver.forked():
        return
    try:
        driver.cuMemHostUnregister(ptr)
    except Exception:  # never raise from a finalizer
        pass


def _host_pointer(array: np.ndarray, call: str) -> int:
    if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
        raise InputError(f"{call} needs a C-contiguous NumPy array: pass np.ascontiguousarray(a)")
    return hostmem.address(array)


def _device_pointer(buf: base.DeviceBuffer, offset: int, nbytes: int, call: str) -> int:
    ptr = getattr(buf, "ptr", 0)
    if not isinstance(buf, DeviceBuffer) or not ptr:
        raise BackendError("the buffer was freed or is not a CUDA buffer", call=call)
    if offset < 0 or offset + nbytes > buf.nbytes:
        raise InputError(
            f"{call}: bytes {offset}..{offset + nbytes} do not fit in a {buf.nbytes}-byte buffer"
        )
    return int(ptr) + offset


# -- kernels -------------------------------------------------------------------------------------
class Kernel(base.Kernel):
    """A cuda.core Kernel, its module and the converters for its arguments."""

    def __init__(self, device: Device, code: Any, core_kernel: Any, name: str,
                 params: Sequence[Param]) -> None:
        self.device = device
        self.code = code  # the module must outlive the kernel
        self.core_kernel = core_kernel
        self.name = name
        self.params = tuple(params)
        from conveyor.backends.cuda_images import TEXTURE_TYPES, texture_arg

        self.converters: list[Callable[[Any], Any]] = [
            texture_arg if param.base.split(" ")[-1] in TEXTURE_TYPES and not param.is_pointer
            else convert
            for param, convert in zip(self.params, arg_converters(self.params, _pointer_arg),
                                      strict=True)
        ]
        try:
            self.max_block = int(core_kernel.attributes.max_threads_per_block)
        except Exception:  # attribute query unsupported: CUDA's architectural limit
            self.max_block = 1024


def _mapped(registration: Registration, call: str) -> int:
    """The device address of a page-locked (mapped) array; BackendError where the driver did
    not lock it (a kernel cannot use such memory in place)."""
    if not registration._ptr:
        why = registration.reason or "closed"
        raise BackendError(f"an array the driver did not page-lock ({why}) cannot be used by "
                           f"a kernel in place: copy it (zero_copy=False)", call=call)
    registration.device._current()
    return int(_check(driver.cuMemHostGetDevicePointer(registration._ptr, 0),
                      "cuMemHostGetDevicePointer"))


def _pointer_arg(value: Any) -> Any:
    if isinstance(value, Registration):  # an array used in place (pipeline/paths.py ZeroCopy)
        return np.uint64(_mapped(value, "cuLaunchKernel"))
    if isinstance(value, DeviceBuffer):
        if not value.ptr:
            raise BackendError("a kernel argument was a freed buffer", call="cuLaunchKernel")
        return np.uint64(value.ptr)
    if isinstance(value, PinnedBuffer):  # mapped, and UVA makes the host address valid
        if not value.ptr:  # closed: the kernel got NULL (DeviceBuffer's check, above)
            raise BackendError("a kernel argument was a freed buffer", call="cuLaunchKernel")
        return np.uint64(value.ptr)
    interface = getattr(value, "__cuda_array_interface__", None)
    if interface is not None:
        return np.uint64(interface["data"][0])
    if isinstance(value, int | np.integer):
        return np.uint64(value)
    return value


_FLAG_OPTIONS = {
    "--use_fast_math": "use_fast_math", "-use_fast_math": "use_fast_math",
    "-lineinfo": "lineinfo", "--generate-line-info": "lineinfo",
    "-G": "debug", "--device-debug": "debug",
    "--extra-device-vectorization": "extra_device_vectorization",
    "--restrict": "restrict",
}  # fmt: skip


def _option_words(item: str) -> list[str]:
    """``item`` as the options it holds: split at whitespace where every word is an option
    (or it is ``-D``/``-I`` and its value), else the item whole."""
    words = item.split()
    if len(words) > 1 and (all(w.startswith("-") for w in words)
                           or (len(words) == 2 and words[0] in ("-D", "-I"))):
        return words
    return [item]


def _program_options(arch: str, options: Sequence[str]) -> Any:
    """NVRTC flags (-D, -I, -std=, -arch=, and the switches above) as cuda.core ProgramOptions."""
    settings: dict[str, Any] = {"arch": f"sm_{arch}"}
    defines: list[Any] = []
    includes: list[str] = []
    # Split where an item holds several options, as OpenCL's compiler reads them: "-DFLAG
    # -DN=4" was one macro named "FLAG -DN", "-I dir" the folder " dir". One option with a
    # space inside ("-I/data/my dir", "-DE=(a + b)") stays whole, as NVRTC takes it.
    items = iter([word for item in options for word in _option_words(item)])
    for item in items:
        option = item + next(items, "") if item in ("-D", "-I") else item
        if option.startswith("-D") and len(option) > 2:
            name, equals, value = option[2:].partition("=")
            defines.append((name, value) if equals else name)  # -DX= defines X as nothing
        elif option.startswith("-I") and len(option) > 2:
            includes.append(option[2:])
        elif option.startswith(("-std=", "--std=")):
            settings["std"] = option.split("=", 1)[1]
        elif option.startswith(("-arch=", "--gpu-architecture=")):
            settings["arch"] = option.split("=", 1)[1]
        elif option in _FLAG_OPTIONS:
            settings[_FLAG_OPTIONS[option]] = True
        else:
            raise InputError(
                f"unsupported CUDA compiler option {option!r}; conveyor passes -D, -I, -std=, "
                f"-arch= and {', '.join(sorted(_FLAG_OPTIONS))}"
            )
    if defines:
        settings["define_macro"] = defines
    if includes:
        settings["include_path"] = includes
    return cc.ProgramOptions(**settings)


_GATE_SOURCE = r"""
extern "C" __global__ void conveyor_gate(volatile unsigned int* flag) {
    while (*flag == 0) {
#if __CUDA_ARCH__ >= 700
        __nanosleep(1000);
#endif
    }
}
"""


# -- queues --------------------------------------------------------------------------------------
class Queue(base.Queue):
    """A non-blocking stream; ``handle`` is its ``CUstream`` as an int (for CuPy, PyTorch)."""

    device: Device

    def __init__(self, device: Device) -> None:
        self.device = device
        device._current()
        try:
            self.stream: Any = device.core.create_stream(
                options=cc.StreamOptions(nonblocking=True)
            )
        except Exception as exc:
            raise _wrap(exc, "cuStreamCreate") from exc
        self._handle = self.stream.handle
        self.handle = int(self._handle)

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol (version 0, handle)."""
        return (0, self.handle)

    @property
    def native(self) -> Any:
        """The ``cuda.core`` Stream (``int(queue.native.handle)`` for CuPy's ExternalStream)."""
        return self.stream

    def _begin(self, wait_for: Sequence[base.Event]) -> Any:
        """Order the stream after ``wait_for``; record and return the command's start event."""
        if self.stream is None:
            raise BackendError("the queue is closed", call="enqueue")
        self.device._current()
        for event in wait_for:
            if not isinstance(event, Event):
                raise InputError(f"cannot wait for {type(event).__name__} on a CUDA queue")
            _check(driver.cuStreamWaitEvent(self._handle, event.end, 0), "cuStreamWaitEvent")
        return self._record(False)

    def _end(self, start: Any) -> Event:
        return Event(self.device, start, self._record(True), self.device._events)

    @contextlib.contextmanager
    def _command(self, wait_for: Sequence[base.Event]) -> Iterator[Any]:
        """``_begin`` a command; its start event goes back to the pool if the body (the
        command and its ``_end``) raises, since no Event will ever own it."""
        start = self._begin(wait_for)
        try:
            yield start
        except BaseException:
            self.device._events.give(start, False)
            raise

    def _record(self, blocking: bool) -> Any:
        pool = self.device._events
        event = pool.take(blocking)
        try:
            _check(driver.cuEventRecord(event, self._handle), "cuEventRecord")
        except BaseException:
            pool.give(event, blocking)
            raise
        return event

    def copy_in(self, dst: base.DeviceBuffer, src: np.ndarray, *, dst_offset: int = 0,
                wait_for: Sequence[base.Event] = ()) -> Event:
        host = _host_pointer(src, "copy_in")
        dptr = _device_pointer(dst, dst_offset, src.nbytes, "copy_in")
        staging = self._stage(src, host)
        try:
            with self._command(wait_for) as start:
                if staging is not None:
                    host = staging.ptr
                if src.nbytes:
                    _check(driver.cuMemcpyHtoDAsync(dptr, host, src.nbytes, self._handle),
                           "cuMemcpyHtoDAsync")
                event = self._end(start)
        except BaseException:
            if staging is not None:
                self.device.pinned_pool.release(staging)
            raise
        if staging is not None:
            self.device.pinned_pool.release(staging, after=event)
        return event

    def _stage(self, src: np.ndarray, host: int) -> PinnedBuffer | None:
        """A pinned copy of pageable ``src``, or None when ``src`` is pinned already.

        The driver's own pageable path first waits for everything queued on the stream, which
        would block the host (for ever, behind a user event the host sets later). Staging here
        keeps the enqueue non-blocking; the block returns to the pool when the copy is done.
        """
        if not src.nbytes or self.device._is_pinned(host, src.nbytes):
            return None
        hazards.pageable_copy(self.device, "copy_in", src.nbytes)
        try:
            block = self.device.pinned_pool.acquire(src.nbytes)
        except OutOfMemoryError:  # no pinned memory to spare: let the driver stage it
            return None
        assert isinstance(block, PinnedBuffer)
        np.copyto(block.array[: src.nbytes], src.reshape(-1).view(np.uint8))
        return block

    def copy_out(self, dst: np.ndarray, src: base.DeviceBuffer, *, src_offset: int = 0,
                 wait_for: Sequence[base.Event] = ()) -> Event:
        host = _host_pointer(dst, "copy_out")
        if not dst.flags.writeable:
            raise InputError("copy_out needs a writeable array")
        dptr = _device_pointer(src, src_offset, dst.nbytes, "copy_out")
        if (dst.nbytes and hazards.armed(self.device)
                and not self.device._is_pinned(host, dst.nbytes)):
            hazards.pageable_copy(self.device, "copy_out", dst.nbytes)
        with self._command(wait_for) as start:
            if dst.nbytes:
                _check(driver.cuMemcpyDtoHAsync(host, dptr, dst.nbytes, self._handle),
                       "cuMemcpyDtoHAsync")
            return self._end(start)

    def copy_from_device(self, dst: base.DeviceBuffer, src: Any, nbytes: int, *,
                         wait_for: Sequence[base.Event] = ()) -> Event:
        interface = getattr(src, "__cuda_array_interface__", None)
        if interface is None:
            raise InputError(f"a {type(src).__name__} is not a CUDA device array: return an "
                             f"array with __cuda_array_interface__ (CuPy, PyTorch, Numba)")
        source = int(interface["data"][0])
        dptr = _device_pointer(dst, 0, nbytes, "copy_from_device")
        with self._command(wait_for) as start:
            if nbytes and source != dptr:  # the callable may return the output it was given
                _check(driver.cuMemcpyDtoDAsync(dptr, source, nbytes, self._handle),
                       "cuMemcpyDtoDAsync")
            return self._end(start)

    def launch(self, kernel: base.Kernel, global_size: int, args: Sequence[Any], *,
               local_size: int | None = None, wait_for: Sequence[base.Event] = ()) -> Event:
        assert isinstance(kernel, Kernel)
        values = kernel.convert_args(args)
        block = local_size or min(_DEFAULT_BLOCK, kernel.max_block)
        grid = max(-(-global_size // block), 1)
        with self._command(wait_for) as start:
            if any(isinstance(v, np.void) for v in values):
                # A struct passed by value: cuda.core's launch takes no NumPy struct ("the
                # argument is of unsupported type"); the driver takes its bytes.
                self._launch_raw(kernel, grid, block, values)
                return self._end(start)
            try:
                cc.launch(self.stream, cc.LaunchConfig(grid=grid, block=block),
                          kernel.core_kernel, *values)
            except Exception as exc:
                raise _wrap(exc, f"cuLaunchKernel({kernel.name})") from exc
            return self._end(start)

    def _launch_raw(self, kernel: Kernel, grid: int, block: int, values: Sequence[Any]
                    ) -> None:
        """cuLaunchKernel with each argument's bytes (NumPy scalars and structs, as the
        converters give them) behind an array of pointers."""
        held = [np.array(value) for value in values]  # 0-d: each argument's bytes, alive
        pointers = np.array([h.ctypes.data for h in held], dtype=np.uint64)
        handle = getattr(kernel.core_kernel, "handle", None)
        if handle is None:
            handle = kernel.core_kernel._handle
        function = (_check(driver.cuKernelGetFunction(handle), "cuKernelGetFunction")
                    if isinstance(handle, driver.CUkernel) else handle)
        _check(driver.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, 0, self._handle,
                                     int(pointers.ctypes.data), 0),
               f"cuLaunchKernel({kernel.name})")

    def fill(self, dst: base.DeviceBuffer, byte: int, nbytes: int, *, offset: int = 0,
             wait_for: Sequence[base.Event] = ()) -> Event:
        dptr = _device_pointer(dst, offset, nbytes, "fill")
        with self._command(wait_for) as start:
            if nbytes:
                _check(driver.cuMemsetD8Async(dptr, byte & 0xFF, nbytes, self._handle),
                       "cuMemsetD8Async")
            return self._end(start)

    def copy_to_image(self, dst: base.DeviceImage, src: np.ndarray, rows: int, *,
                      wait_for: Sequence[base.Event] = ()) -> Event:
        from conveyor.backends import cuda_images

        return cuda_images.copy_to_image(self, dst, src, rows, wait_for)

    def marker(self, wait_for: Sequence[base.Event] = ()) -> Event:
        start = self._begin(wait_for)
        return Event(self.device, start, start, self.device._events)

    def flush(self) -> None:
        """Nothing to do: CUDA submits every command as it is enqueued."""

    def finish(self) -> None:
        if self.stream is None:
            return
        try:
            self.stream.sync()
        except Exception as exc:
            raise _wrap(exc, "cuStreamSynchronize") from exc

    def after_callable(self, result: Any) -> None:
        """Wait (on the device) for the streams a callable's work may be on: its returned
        arrays' streams, CUDA's default streams, CuPy's and PyTorch's current ones."""
        if self.stream is None:
            raise BackendError("the queue is closed", call="enqueue")
        self.device._current()
        cuda_order.after_callable(self, result)

    def order_before(self, consumer_stream: int) -> None:
        """Make stream ``consumer_stream`` (a handle; 1 legacy, 2 per-thread) wait for this
        queue's work so far, without blocking the host."""
        if self.stream is None or consumer_stream == self.handle:
            return
        self.device._current()
        event = self.stream.record()
        _check(driver.cuStreamWaitEvent(consumer_stream, event.handle, 0), "cuStreamWaitEvent")

    def close(self) -> None:
        if self.stream is not None:
            self.device._current()
            self.stream.sync()
            self.stream.close()
            self.stream = None


# -- devices ---------------------------------------------------------------------------------
class Device(base.Device):
    """One CUDA device, used through its primary context (shared with CuPy, PyTorch, Numba)."""

    portable_pinned = True  # cuMemHostAlloc(PORTABLE), cuMemHostRegister(PORTABLE)

    def __init__(self, index: int) -> None:
        core = cc.Device(index)
        core.set_current()
        self.core = core
        self.index = index
        self.arch = str(core.arch)
        self._events = EventPool()
        #: conveyor's pinned buffers on this device, start address -> end (see _is_pinned).
        self._pinned_spans: dict[int, int] = {}
        self._context = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        self._context_address = int(self._context)
        props = core.properties
        total = int(_check(driver.cuDeviceTotalMem(driver.CUdevice(index)), "cuDeviceTotalMem"))
        info = base.DeviceInfo(
            backend="cuda",
            spec=f"cuda:{index}",
            name=str(core.name),
            kind="gpu",
            global_mem_bytes=total,
            max_alloc_bytes=total,
            compute_units=int(props.multiprocessor_count),
            svm=False,
            host_unified=bool(props.integrated),
            driver_version=_driver_version(),
            platform="CUDA",
        )
        super().__init__(info)
        # The zero of every profile_ns timestamp on this device.
        self._reference_stream = core.create_stream(options=cc.StreamOptions(nonblocking=True))
        self._reference = self._reference_stream.record(options=cc.EventOptions(
            timing_enabled=True))

        self._reference.sync()
        self._gate_kernel: Kernel | None = None
        self._wait_value_ok = True
        self._image_limits: base.ImageLimits | None = None

    def pci_address(self) -> str | None:
        """``domain:bus:device.0`` from the driver's PCI attributes (memory/numa.py)."""
        attribute = driver.CUdevice_attribute
        try:
            domain, bus, slot = (int(_check(driver.cuDeviceGetAttribute(
                getattr(attribute, f"CU_DEVICE_ATTRIBUTE_PCI_{name}_ID"),
                driver.CUdevice(self.index)), "cuDeviceGetAttribute"))
                for name in ("DOMAIN", "BUS", "DEVICE"))
        except (BackendError, AttributeError):
            return None
        return f"{domain:04x}:{bus:02x}:{slot:02x}.0"

    def _in_forked_child(self) -> bool:
        return _forked

    def _current(self) -> None:
        """Make this device's primary context current on the calling thread."""
        if _forked:
            raise BackendError(_FORK_MESSAGE, call="fork", code="CUDA_ERROR_NOT_INITIALIZED")
        ctx = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if int(ctx) != self._context_address:
            _check(driver.cuCtxSetCurrent(self._context), "cuCtxSetCurrent")

    def page_locked(self, array: np.ndarray, *, written: bool = False) -> bool:
        if not isinstance(array, np.ndarray) or not array.nbytes or not array.flags.c_contiguous:
            return False
        self._current()  # the driver answers for the calling thread's context
        return self._is_pinned(_host_pointer(array, "page_locked"), array.nbytes, written)

    def _is_pinned(self, host: int, nbytes: int, written: bool = False) -> bool:
        """True when the whole host range is page-locked (allocated or registered) and, with
        ``written``, writable by the device (``cuMemHostRegister(READ_ONLY)`` memory is not:
        a copy into it fails with "invalid argument").

        Ranges inside conveyor's own pinned buffers (the staging rings) are known without
        asking the driver: two driver calls fewer per copy, each of which gives up the GIL.
        """
        end = host + nbytes
        for start, stop in list(self._pinned_spans.items()):  # a copy: others add and remove
            if start <= host and end <= stop:
                return True
        attribute = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
        try:
            for address in (host, host + nbytes - 1):
                err, kind = driver.cuPointerGetAttribute(attribute, address)
                if int(err) != 0 or int(kind) != _MEMORYTYPE_HOST:
                    return False
            if written:
                access = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_ACCESS_FLAGS
                err, flags = driver.cuPointerGetAttribute(access, host)
                if int(err) != 0 or int(flags) != _ACCESS_READWRITE:
                    return False
        except Exception:  # unknown to the driver: treat it as pageable (always correct)
            return False
        return True

    def _since_reference(self, event: Any) -> int | None:
        err, ms = driver.cuEventElapsedTime(self._reference.handle, event)
        if int(err) != 0:
            return None
        return int(round(ms * 1e6))

    def _gate(self, stream: Any, flag_address: int) -> None:
        """Hold ``stream`` until the 32-bit word at ``flag_address`` becomes nonzero."""
        if self._wait_value_ok:
            geq = int(driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
            err, = driver.cuStreamWaitValue32(stream.handle, flag_address, 1, geq)
            if int(err) == 0:
                return
            self._wait_value_ok = False  # no stream memory operations: spin in a kernel
        if self._gate_kernel is None:
            binary = self.build_binary(_GATE_SOURCE, ())
            flag = Param("flag", True, np.dtype(np.uint32), False, "volatile unsigned int* flag")
            self._gate_kernel = self.load_kernel(binary, "conveyor_gate", (), [flag])
        cc.launch(stream, cc.LaunchConfig(grid=1, block=1), self._gate_kernel.core_kernel,
                  np.uint64(flag_address))

    def create_queue(self) -> Queue:
        return Queue(self)

    def alloc_device(self, nbytes: int) -> DeviceBuffer:
        base.check_nbytes(nbytes, "alloc_device")
        self._current()
        err, ptr = driver.cuMemAlloc(max(nbytes, 1))
        if _code_name(err) == "CUDA_ERROR_OUT_OF_MEMORY":
            raise OutOfMemoryError(nbytes, 0, None, where="device")
        _check((err,), "cuMemAlloc")
        return DeviceBuffer(self, int(ptr), nbytes)

    def alloc_pinned(self, nbytes: int) -> PinnedBuffer:
        base.check_nbytes(nbytes, "alloc_pinned")
        self._current()
        if (nbytes >= _REGISTER_MIN_BYTES and config.pinned_alloc_mode() == "register"
                and hostmem.fits(nbytes)):
            made = self._alloc_registered(nbytes)
            if made is not None:
                return made
        err, ptr = driver.cuMemHostAlloc(max(nbytes, 1), _HOST_ALLOC_FLAGS)
        if _code_name(err) == "CUDA_ERROR_OUT_OF_MEMORY":
            raise OutOfMemoryError(nbytes, 0, None, where="pinned host")
        _check((err,), "cuMemHostAlloc")
        return PinnedBuffer(self, int(ptr), nbytes)

    def _alloc_registered(self, nbytes: int) -> PinnedBuffer | None:
        """Anonymous memory faulted in on several threads, then page-locked; None where the
        driver refuses (the caller falls back to cuMemHostAlloc)."""
        try:
            ptr = hostmem.map_faulted(nbytes)
        except MemoryError:
            return None  # the driver's own allocation says whether there is memory
        (err,) = driver.cuMemHostRegister(ptr, hostmem.round_up(nbytes),
                                          _REGISTER_PORTABLE | _REGISTER_DEVICEMAP)
        if int(err) != 0:
            hostmem.unmap(ptr, nbytes)
            if _code_name(err) == "CUDA_ERROR_OUT_OF_MEMORY":
                raise OutOfMemoryError(nbytes, 0, None, where="pinned host")
            return None
        return RegisteredPinned(self, ptr, nbytes)

    def register_host(self, array: np.ndarray) -> Registration:
        ptr = _host_pointer(array, "register_host")
        # Mapped: a kernel may use it in place (the zero-copy path of a device that shares
        # the host's memory hands the Registration to the kernel: _pointer_arg).
        flags = (_REGISTER_PORTABLE | _REGISTER_DEVICEMAP
                 | (0 if array.flags.writeable else _REGISTER_READ_ONLY))
        self._current()
        (err,) = driver.cuMemHostRegister(ptr, max(array.nbytes, 1), flags)
        name = _code_name(err)
        if int(err) == 0:
            return Registration(self, array, ptr, True)
        if name in ("CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "CUDA_ERROR_NOT_SUPPORTED",
                    "CUDA_ERROR_NOT_PERMITTED", "CUDA_ERROR_INVALID_VALUE"):
            return Registration(self, array, ptr, False, reason=name)
        _check((err,), "cuMemHostRegister")
        raise AssertionError("unreachable")

    def user_event(self) -> UserEvent:
        return UserEvent(self)

    def compiler_identity(self) -> str:
        cuda_driver.refuse_if_forked()  # the key of a build the child cannot make
        try:
            major, minor = _check(nvrtc.nvrtcVersion(), "nvrtcVersion")
            nvrtc_version = f"nvrtc {major}.{minor}"
        except Exception:  # no NVRTC library: building will say so
            nvrtc_version = "nvrtc unknown"
        return "|".join([
            "cuda", self.name, f"sm_{self.arch}", self.info.driver_version, nvrtc_version,
            f"cuda.core {cc.__version__}",
        ])

    def source_macros(self) -> dict[str, str]:
        # What NVRTC predefines for the device pass that decides the kernel's code.
        digits = "".join(c for c in self.arch if c.isdigit()) or "0"
        return {"__CUDACC__": "1", "__CUDACC_RTC__": "1", "__CUDA_ARCH__": str(int(digits) * 10),
                "__cplusplus": "201703L"}

    def build_binary(self, source: str, options: Sequence[str]) -> bytes:
        program_options = _program_options(self.arch, options)
        # NVRTC reads a byte-order mark as a token ("unrecognized token" on line 1): editors
        # save one, and OpenCL's compilers take it.
        source = source.removeprefix("\ufeff")
        logs = io.StringIO()
        try:
            program = cc.Program(source, code_type="c++", options=program_options)
            try:
                code = program.compile("cubin", logs=logs)
            finally:
                program.close()
        except Exception as exc:
            log = "\n".join(t for t in (logs.getvalue().strip(), str(exc).strip()) if t)
            raise CompileError(f"NVRTC build failed for {self.name} (sm_{self.arch})",
                               log=log, source=source) from exc
        return bytes(code.code)

    def load_kernel(self, binary: bytes, name: str, options: Sequence[str],
                    params: Sequence[Param]) -> Kernel:
        self._current()
        try:
            code = cc.ObjectCode.from_cubin(binary)
            core_kernel = code.get_kernel(name)
        except Exception as exc:
            if "NOT_FOUND" in str(exc):  # as OpenCL says it: the kernels the module has
                names = _module_kernel_names(binary)
                listing = ", ".join(names) if names else "none it could list"
                raise InputError(
                    f"no kernel named {name!r} in the module NVRTC built (after its #define "
                    f"and #if; a kernel must be extern \"C\" __global__); kernels found: "
                    f"{listing}") from exc
            raise CompileError(
                f"could not load kernel {name!r} from its binary on {self.name} "
                f"(is it declared extern \"C\" __global__?): {exc}"
            ) from exc
        params = check_sizes(name, params, _argument_sizes(core_kernel), self.name)
        return Kernel(self, code, core_kernel, name, params)

    def device_array(self, buf: base.DeviceBuffer, shape: tuple[int, ...], dtype: np.dtype,
                     queue: base.Queue) -> DeviceArray:
        assert isinstance(queue, Queue)
        dt = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if isinstance(buf, Registration):  # a callable's block, used in place
            if nbytes > buf.array.nbytes:
                raise InputError(f"device_array: {nbytes} bytes do not fit in a "
                                 f"{buf.array.nbytes}-byte array")
            ptr = _mapped(buf, "device_array")
            return DeviceArray(ptr, tuple(shape), dt, (2, self.index), queue, buf)
        ptr = _device_pointer(buf, 0, nbytes, "device_array")
        return DeviceArray(ptr, tuple(shape), dt, (2, self.index), queue, buf)

    # Textures live in cuda_images.py (this file keeps the buffer backend's shape).
    def image_limits(self) -> base.ImageLimits:
        from conveyor.backends import cuda_images

        if self._image_limits is None:
            self._image_limits = cuda_images.limits(self)
        return self._image_limits

    def alloc_image(self, rows: int, columns: int, channels: int, dtype: np.dtype
                    ) -> base.DeviceImage:
        from conveyor.backends import cuda_images

        dtype = np.dtype(dtype)  # np.float32 or "float32" as well as np.dtype("float32")
        base.check_image(self, rows, columns, channels, dtype)
        return cuda_images.alloc(self, rows, columns, channels, dtype)

    def image_sampler(self, address: str, filter: str, normalized: bool) -> Any:
        from conveyor.backends import cuda_images

        base.check_sampler(address, filter, normalized)
        return cuda_images.sampler(self, address, filter, normalized)

    def image_arguments(self, image: base.DeviceImage, sampler: Any) -> tuple[Any, ...]:
        from conveyor.backends import cuda_images

        return (cuda_images.texture(self, image, sampler),)  # no separate sampler on CUDA

    def _release(self) -> None:
        self._current()
        self._reference_stream.sync()
        # The spares only: a device is usable after close() (its pools are made again), and a
        # closed pool destroyed every event given back, two driver calls more per command.
        self._events.drain()


def _module_kernel_names(binary: bytes) -> list[str]:
    """The kernels a cubin holds (cuLibraryEnumerateKernels, CUDA 12.4+), for a message;
    [] where the driver cannot say."""
    library = None
    try:
        err, library = driver.cuLibraryLoadData(binary, None, None, 0, None, None, 0)
        if int(err) != 0:
            return []
        err, count = driver.cuLibraryGetKernelCount(library)
        if int(err) != 0 or not count:
            return []
        err, kernels = driver.cuLibraryEnumerateKernels(count, library)
        if int(err) != 0:
            return []
        names = []
        for kernel in kernels:
            err, name = driver.cuKernelGetName(kernel)
            if int(err) == 0:
                names.append(name.decode() if isinstance(name, bytes) else str(name))
        return names
    except Exception:  # an older driver or binding: the message goes without the list
        return []
    finally:
        if library is not None:
            try:
                driver.cuLibraryUnload(library)
            except Exception:
                pass


def _argument_sizes(core_kernel: Any) -> list[int] | None:
    """The size in bytes of each argument of a loaded kernel (cuKernelGetParamInfo, through
    cuda.core's ``Kernel.arguments_info``); None where the driver cannot say (before 12.4)."""
    try:
        return [int(info.size) for info in core_kernel.arguments_info]
    except Exception:  # NotImplementedError / CUDAError on drivers without cuFuncGetParamInfo
        return None


def _driver_version() -> str:
    version = int(_check(driver.cuDriverGetVersion(), "cuDriverGetVersion"))
    text = f"CUDA {version // 1000}.{version % 1000 // 10}"
    try:
        kernel_mode = cc.system.get_kernel_mode_driver_version()
        text = ".".join(str(v) for v in kernel_mode) + f" ({text})"
    except Exception:  # NVML absent: the CUDA version alone
        pass
    return text


# A child forked after the parent initialised CUDA must not call the driver (cuda_driver.py).
_forked = False
_fork_hook_installed = False
_FORK_MESSAGE = cuda_driver.FORK_MESSAGE


def _mark_forked_child() -> None:
    global _forked
    _forked = True
    cuda_driver._FORK_STATE[0] = True


def discover() -> list[Device]:
    """Every CUDA device, in ordinal order; [] where cuda.core, a driver or a GPU is missing."""
    global _fork_hook_installed
    if _IMPORT_ERROR is not None:
        return []
    try:
        count = len(cc.Device.get_all_devices())
    except Exception:  # no driver library, or the driver found no device
        return []
    if not _fork_hook_installed:
        os.register_at_fork(after_in_child=_mark_forked_child)
        _fork_hook_installed = True
    found: list[Device] = []
    for index in range(count):
        try:
            found.append(Device(index))
        except Exception:  # a device that cannot open (exclusive mode, fallen off the bus)
            continue
    return found
