"""The interface every backend implements, and the parts all backends share.

A backend (``opencl.py``, ``cuda.py``) supplies queues, events, raw device and pinned
allocations, in-place registration of host memory, and a compiler that turns source into a
binary and a binary into kernels. Pools, the kernel cache and the engine live above this file
and never import a driver module.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from conveyor.closing import Closeable as Closeable  # re-exported for the backends

if TYPE_CHECKING:
    from conveyor.kernels.build import KernelFuture
    from conveyor.kernels.signature import Param
    from conveyor.memory.numa import Place
    from conveyor.memory.pinned import PinnedPool
    from conveyor.memory.pool import DevicePool
    from conveyor.memory.warmup import WarmUp

DeviceKind = Literal["gpu", "cpu", "other"]


class Event(ABC):
    """A point in a queue's work. Complete once the command it stands for has finished."""

    @abstractmethod
    def wait(self) -> None:
        """Block the host until the event completes; raises BackendError if it failed."""

    @abstractmethod
    def is_done(self) -> bool:
        """True when the event has completed (never blocks)."""

    def profile_ns(self) -> tuple[int, int] | None:
        """(start, end) device timestamps in nanoseconds, or None where not recorded."""
        return None

    def detached(self) -> Event:
        """The same point in the queue, holding no reference to the command's host memory:
        what a fence kept for long (a pinned block's last use) may hold without keeping that
        memory alive."""
        return self


class UserEvent(Event):
    """An event the host completes by hand (tests use it to hold a queue back)."""

    @abstractmethod
    def set_complete(self) -> None:
        """Mark the event complete, releasing every command that waits on it."""


class DeviceBuffer(Closeable, ABC):
    """Raw device memory. ``close()`` frees it at once: only pools call it, after a fence."""

    nbytes: int

    @abstractmethod
    def close(self) -> None:
        """Free the memory now. The caller guarantees no queued command still uses it."""


class PinnedBuffer(Closeable, ABC):
    """Page-locked host memory that stays mapped for its whole life.

    ``array`` is a 1-D ``uint8`` view of all ``nbytes``; views of it are real ndarrays.
    """

    nbytes: int
    array: np.ndarray

    @abstractmethod
    def close(self) -> None:
        """Unmap and free the memory now. The caller guarantees no command still uses it."""


class Registration(Closeable, ABC):
    """An existing host array pinned in place until ``close()``."""

    array: np.ndarray

    #: True when the driver really page-locked the memory (copies from it run at pinned speed);
    #: False when the backend could only wrap it (copies are correct but may be staged).
    page_locked: bool


class DeviceImage(Closeable, ABC):
    """A read-only 2-D image on the device (OpenCL ``image2d_t``, a CUDA array read through
    a texture object): ``rows`` x ``columns``
    pixels of ``channels`` channels of ``dtype``. ``close()`` frees it at once: the caller
    guarantees no queued command still uses it."""

    rows: int
    columns: int
    channels: int
    dtype: np.dtype
    nbytes: int

    @abstractmethod
    def close(self) -> None:
        """Free the image now."""


@dataclass(frozen=True)
class ImageLimits:
    """What a device's read-only 2-D images can be: the largest width and height in pixels,
    and the (channels, dtype) pairs it has an image format for (from the driver's list)."""

    max_width: int
    max_height: int
    formats: frozenset[tuple[int, np.dtype]]


def check_nbytes(nbytes: Any, what: str) -> None:
    """InputError unless ``nbytes`` is a whole number of at least 1 (what the pools say for
    0 too): 0 and negative sizes were the driver's INVALID_BUFFER_SIZE, or pybind's TypeError
    for -1, from ``alloc_device``/``alloc_pinned``."""
    import numbers

    from conveyor.errors import InputError

    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral):
        raise InputError(f"{what}: nbytes={nbytes!r} is not a whole number of bytes")
    if nbytes < 1:
        raise InputError(f"{what}: cannot allocate {int(nbytes)} bytes: ask for at least 1")


#: The sampler modes ``Device.image_sampler`` takes (both backends map each to their own).
SAMPLER_ADDRESSES = ("clamp_to_edge", "clamp", "repeat", "mirrored_repeat")
SAMPLER_FILTERS = ("nearest", "linear")


def check_image(device: Device, rows: int, columns: int, channels: int, dtype: Any) -> None:
    """InputError, naming what the device has, for an image ``alloc_image`` cannot make: a
    format not in ``image_limits().formats`` (a bare StopIteration before), or a size past
    ``max_width``/``max_height`` or below one pixel (the driver's INVALID_OPERATION)."""
    from conveyor.errors import InputError

    limits = device.image_limits()
    wanted = (channels, np.dtype(dtype))
    if wanted not in limits.formats:
        have = ", ".join(f"{c} x {d}" for c, d in sorted(limits.formats, key=str))
        raise InputError(f"{device.name} has no image of {channels} channel(s) of "
                         f"{np.dtype(dtype)}; its formats: {have}")
    if not (1 <= rows <= limits.max_height and 1 <= columns <= limits.max_width):
        raise InputError(f"an image of {rows} rows x {columns} columns: {device.name}'s images "
                         f"are 1 to {limits.max_height} rows and 1 to {limits.max_width} "
                         f"columns")


def check_sampler(address: str, filter: str, normalized: bool) -> None:
    """InputError for a sampler mode ``image_sampler`` does not know (a bare KeyError
    before), naming the ones it does, and for "repeat"/"mirrored_repeat" without normalized
    coordinates, which neither OpenCL nor CUDA has (the driver's INVALID_VALUE before)."""
    from conveyor.errors import InputError

    if address not in SAMPLER_ADDRESSES:
        raise InputError(f"image_sampler: address={address!r}: use one of "
                         f"{', '.join(SAMPLER_ADDRESSES)}")
    if filter not in SAMPLER_FILTERS:
        raise InputError(f"image_sampler: filter={filter!r}: use one of "
                         f"{', '.join(SAMPLER_FILTERS)}")
    if address in ("repeat", "mirrored_repeat") and not normalized:
        raise InputError(f"image_sampler: address={address!r} reads normalized coordinates "
                         f"only: pass normalized=True, or address 'clamp_to_edge' or 'clamp'")


def no_images(device: Device) -> Exception:
    """The InputError of a backend without image blocks (the base class's default; OpenCL
    and CUDA both have them)."""
    from conveyor.errors import InputError

    return InputError(
        f"image blocks are OpenCL and CUDA only: {device.spec} runs {device.backend}, whose "
        f"backend in conveyor drives neither images nor texture objects (README: Image "
        f"blocks); stream the array as a plain input (a buffer), or pick an OpenCL device "
        f"(device=cv.device('opencl'))")


class Kernel(ABC):
    """A kernel, built and loaded, ready to launch. ``params`` is its parsed signature;
    ``converters`` turn each launch argument into what the driver takes."""

    name: str
    device: Device
    params: Sequence[Param]
    converters: Sequence[Callable[[Any], Any]]
    #: The source text and build options it was compiled from (set by ``Device.compile``), so
    #: that another process can build the same kernel (``conveyor.dask`` sends these, never
    #: the loaded kernel, to its workers). None for a kernel made some other way.
    source: str | None = None
    options: tuple[str, ...] = ()
    #: The headers the source included when it was built (includes.header_state): another
    #: device's build of it must read the same (pipeline/multi.py).
    headers: tuple[tuple[str, str, str], ...] | None = None

    def convert_args(self, args: Sequence[Any]) -> list[Any]:
        """``args`` as the driver takes them; InputError when their number is wrong."""
        if len(args) != len(self.params):
            from conveyor.errors import InputError

            raise InputError(
                f"kernel {self.name!r} takes {len(self.params)} arguments, got {len(args)}"
            )
        return [convert(a) for convert, a in zip(self.converters, args, strict=True)]


class Queue(Closeable, ABC):
    """An in-order queue (OpenCL command queue, CUDA stream) with timestamps on every command.

    Every enqueue takes ``wait_for``, events from any queue of the same device, and returns the
    event of the new command. Host arrays given to copies must be C-contiguous; copies are
    asynchronous only from pinned memory.
    """

    device: Device

    @property
    def native(self) -> Any:
        """The driver's own queue object (``pyopencl.CommandQueue``, ``cuda.core.Stream``), for
        Python compute callables that enqueue work themselves."""
        return self

    @abstractmethod
    def copy_in(
        self,
        dst: DeviceBuffer,
        src: np.ndarray,
        *,
        dst_offset: int = 0,
        wait_for: Sequence[Event] = (),
    ) -> Event:
        """Copy all of ``src`` into ``dst`` at byte ``dst_offset``."""

    @abstractmethod
    def copy_out(
        self,
        dst: np.ndarray,
        src: DeviceBuffer,
        *,
        src_offset: int = 0,
        wait_for: Sequence[Event] = (),
    ) -> Event:
        """Fill all of ``dst`` from ``src`` starting at byte ``src_offset``."""

    @abstractmethod
    def launch(
        self,
        kernel: Kernel,
        global_size: int,
        args: Sequence[Any],
        *,
        local_size: int | None = None,
        wait_for: Sequence[Event] = (),
    ) -> Event:
        """Run ``kernel`` over ``global_size`` work items (rounded up to ``local_size``).

        ``args`` holds DeviceBuffers and scalars; scalars are cast to the kernel's declared
        parameter types.
        """

    @abstractmethod
    def fill(
        self,
        dst: DeviceBuffer,
        byte: int,
        nbytes: int,
        *,
        offset: int = 0,
        wait_for: Sequence[Event] = (),
    ) -> Event:
        """Set ``nbytes`` bytes of ``dst`` from ``offset`` to ``byte``."""

    def copy_from_device(self, dst: DeviceBuffer, src: Any, nbytes: int, *,
                         wait_for: Sequence[Event] = ()) -> Event:
        """Copy the first ``nbytes`` of ``src``, a C-contiguous device array of this driver
        (a ``pyopencl.array.Array``; anything with ``__cuda_array_interface__``), into
        ``dst`` on this queue."""
        raise NotImplementedError(f"{type(self).__name__} cannot copy device arrays")

    def copy_to_image(self, dst: DeviceImage, src: np.ndarray, rows: int, *,
                      wait_for: Sequence[Event] = ()) -> Event:
        """Copy the first ``rows`` rows of pixels of ``src`` (C-contiguous host memory, rows
        of ``dst.columns`` pixels) into rows ``0:rows`` of image ``dst``."""
        raise no_images(self.device)

    @abstractmethod
    def marker(self, wait_for: Sequence[Event] = ()) -> Event:
        """An event that completes when everything before it (and ``wait_for``) has."""

    def after_callable(self, result: Any) -> None:
        """Order this queue after work a Python callable may have enqueued elsewhere than on
        it (``result``: what it returned). Nothing to do on OpenCL, which has no queue a
        library uses by default; CUDA waits for its default streams (backends/cuda_order.py)."""

    def sync_host(self, registration: Registration, wait_for: Sequence[Event] = ()) -> Event:
        """Make the device's writes to a registered host array visible to the host.

        CUDA's registered memory is coherent, so this is a marker; OpenCL maps and unmaps.
        """
        return self.marker(wait_for)

    @abstractmethod
    def flush(self) -> None:
        """Hand queued commands to the device without waiting."""

    @abstractmethod
    def finish(self) -> None:
        """Block until every command in the queue has completed."""


@dataclass(frozen=True)
class DeviceInfo:
    """What a device is and what it can do (the table ``conveyor devices`` prints)."""

    backend: str
    spec: str
    name: str
    kind: DeviceKind
    global_mem_bytes: int
    max_alloc_bytes: int
    compute_units: int
    svm: bool
    host_unified: bool
    driver_version: str
    platform: str


class Device(Closeable, ABC):
    """One compute device. Subclasses are the backends; the shared parts live here.

    Attributes come from :class:`DeviceInfo` (``dev.name``, ``dev.kind``, ...). Pools are made on
    first use and belong to the device, so every stream on a device shares them.
    """

    info: DeviceInfo

    def __init__(self, info: DeviceInfo) -> None:
        self.info = info
        self._lock = threading.Lock()
        self._memory_pool: DevicePool | None = None
        self._pinned_pool: PinnedPool | None = None
        self._warmup: WarmUp | None = None
        self._host_place: Place | None | Literal[False] = False  # False: not read yet
        self._closed = False

    # -- what the device is ---------------------------------------------------------------
    @property
    def backend(self) -> str:
        """"opencl" or "cuda"."""
        return self.info.backend

    @property
    def spec(self) -> str:
        """The spec string that selects this device, e.g. "opencl:0:0" or "cuda:0"."""
        return self.info.spec

    @property
    def name(self) -> str:
        """The driver's name of the device."""
        return self.info.name

    @property
    def kind(self) -> DeviceKind:
        """"gpu", "cpu" or "other"."""
        return self.info.kind

    @property
    def global_mem_bytes(self) -> int:
        """Global memory in bytes."""
        return self.info.global_mem_bytes

    @property
    def max_alloc_bytes(self) -> int:
        """The largest single allocation the device allows, in bytes."""
        return self.info.max_alloc_bytes

    @property
    def max_pinned_bytes(self) -> int | None:
        """The largest single allocation of pinned host memory, in bytes, or None where the
        backend sets none of its own (CUDA's cuMemHostAlloc is bounded by the host alone;
        OpenCL's pinned memory is a buffer, bounded by ``max_alloc_bytes``)."""
        return None

    @property
    def max_constant_bytes(self) -> int | None:
        """The most bytes a kernel's ``__constant`` buffer arguments may have (OpenCL's
        ``CL_DEVICE_MAX_CONSTANT_BUFFER_SIZE``), or None where parameters have no such
        address space (CUDA)."""
        return None

    @property
    def compute_units(self) -> int:
        """Compute units (OpenCL) or streaming multiprocessors (CUDA)."""
        return self.info.compute_units

    @property
    def svm(self) -> bool:
        """True when the device supports fine-grained shared virtual memory."""
        return self.info.svm

    #: Pinned host memory of this backend is page-locked for every device of the backend (CUDA
    #: allocates it portable), so an array pinned for one device is copied directly by another.
    portable_pinned: bool = False

    def copies_pinned_of(self, other: Device) -> bool:
        """True when this device copies host memory pinned for ``other`` directly, without
        staging it through its own pinned ring (a pinned input of a stream over several
        devices)."""
        return other is self or (self.portable_pinned and other.backend == self.backend)

    def page_locked(self, array: np.ndarray, *, written: bool = False) -> bool:
        """True when the driver says all of ``array``'s memory is page-locked host memory this
        device copies directly: memory conveyor did not allocate, such as CuPy's
        ``cupyx.empty_pinned``, PyTorch's ``pin_memory()`` or a range the caller registered
        with the driver; with ``written``, also that the device may write it (a range
        registered read-only may not). False where the backend cannot tell (OpenCL has no
        such query)."""
        return False

    @property
    def host_unified(self) -> bool:
        """True when device and host share physical memory (CPU devices, integrated GPUs)."""
        return self.info.host_unified

    def pci_address(self) -> str | None:
        """The device's PCI address as its driver reports it (``"0000:17:00.0"``), or None
        where the driver does not say (CPU devices, other vendors' OpenCL)."""
        return None

    @property
    def host_place(self) -> Place | None:
        """The host NUMA node (and its CPUs) nearest this device, where pinned blocks of its
        pools are allocated and its streams' staging threads run (memory/numa.py); None where
        there is nothing to do: one node, a CPU device, ``CONVEYOR_NUMA=off``. Read once; set
        it to a ``conveyor.memory.numa.Place`` (or None) to override, before the first
        stream."""
        with self._lock:
            if self._host_place is False:
                from conveyor.memory import numa

                self._host_place = numa.place_for(self)
            return self._host_place

    @host_place.setter
    def host_place(self, place: Place | None) -> None:
        from conveyor.memory.numa import Place

        if place is not None and not isinstance(place, Place):
            from conveyor.errors import InputError

            raise InputError(f"host_place={place!r}: use a conveyor.memory.numa.Place(node, "
                             f"cpus) or None")
        with self._lock:
            self._host_place = place

    def __repr__(self) -> str:
        return f"<conveyor.Device {self.spec} {self.name!r} ({self.kind})>"

    # -- what every backend implements ----------------------------------------------------
    @abstractmethod
    def create_queue(self) -> Queue:
        """A new in-order queue with timestamps enabled."""

    @abstractmethod
    def alloc_device(self, nbytes: int) -> DeviceBuffer:
        """Allocate ``nbytes`` (at least 1) of device memory now and make it resident;
        InputError for a size below 1 or past the device's largest allocation,
        OutOfMemoryError if the device has not the memory."""

    @abstractmethod
    def alloc_pinned(self, nbytes: int) -> PinnedBuffer:
        """Allocate ``nbytes`` (at least 1) of page-locked host memory, mapped for its whole
        life; InputError for a size below 1 (or, on OpenCL, past the device's largest
        allocation), OutOfMemoryError if the host has not the memory."""

    def alloc_svm(self, nbytes: int) -> PinnedBuffer:
        """Fine-grained shared virtual memory; BackendError where the device has none."""
        from conveyor.errors import BackendError

        raise BackendError(
            f"{self.name} ({self.backend}) has no fine-grained shared virtual memory: "
            "use conveyor.pinned.empty instead",
            call="alloc_svm",
        )

    @abstractmethod
    def register_host(self, array: np.ndarray) -> Registration:
        """Pin ``array``'s memory in place until the registration is closed."""

    @abstractmethod
    def user_event(self) -> UserEvent:
        """A new incomplete user event."""

    @abstractmethod
    def compiler_identity(self) -> str:
        """Everything besides source and options that changes a built binary (cache key)."""

    def source_macros(self) -> dict[str, str]:
        """The macros this device's compiler predefines (``__OPENCL_VERSION__``,
        ``__CUDA_ARCH__``, extensions): conveyor's preprocessor defines them too before it
        reads a kernel's parameter types, so ``#if`` picks the branch the compiler picks."""
        return {}

    @abstractmethod
    def build_binary(self, source: str, options: Sequence[str]) -> bytes:
        """Compile ``source``; CompileError with the log on failure."""

    @abstractmethod
    def load_kernel(
        self, binary: bytes, name: str, options: Sequence[str], params: Sequence[Param]
    ) -> Kernel:
        """Load ``binary`` and return its kernel ``name``; CompileError if it is missing.

        ``params`` are read from the preprocessed source; the kernel's own ``params`` take the
        driver's report where it gives one (``kernels/argtypes.py``), and InputError says
        where the two disagree in a way the driver can tell (CUDA's argument sizes)."""

    @abstractmethod
    def device_array(
        self, buf: DeviceBuffer, shape: tuple[int, ...], dtype: np.dtype, queue: Queue
    ) -> Any:
        """A view of ``buf`` as an array object for Python compute callables.

        OpenCL: a ``pyopencl.array.Array`` on ``queue``. CUDA: an object that speaks DLPack and
        ``__cuda_array_interface__`` (with ``queue``'s stream), for CuPy, PyTorch and Numba.
        """

    def image_limits(self) -> ImageLimits:
        """The sizes and formats of read-only 2-D images this device has; InputError where it
        has none."""
        raise no_images(self)

    def alloc_image(self, rows: int, columns: int, channels: int, dtype: np.dtype
                    ) -> DeviceImage:
        """A read-only 2-D image of ``rows`` x ``columns`` pixels (a format of
        ``image_limits().formats``, within its sizes: InputError otherwise);
        OutOfMemoryError if the device has not the memory."""
        raise no_images(self)

    def image_sampler(self, address: str, filter: str, normalized: bool) -> Any:
        """A sampler (OpenCL ``sampler_t``): ``address`` "clamp_to_edge", "clamp", "repeat" or
        "mirrored_repeat"; ``filter`` "nearest" or "linear"; ``normalized`` coordinates."""
        raise no_images(self)

    def image_arguments(self, image: DeviceImage, sampler: Any) -> tuple[Any, ...]:
        """The launch arguments that stand for ``image`` read through ``sampler`` (a value
        of ``image_sampler``): OpenCL's are the two (``image2d_t``, ``sampler_t``); CUDA's the
        one texture object bound to both (closed with the image)."""
        return (image, sampler)

    @abstractmethod
    def _release(self) -> None:
        """Free the backend's own objects (context, primary queue)."""

    # -- shared -------------------------------------------------------------------------------
    @overload
    def compile(
        self, source: str, name: str, options: Sequence[str] = (), *, wait: Literal[True] = True
    ) -> Kernel: ...

    @overload
    def compile(
        self, source: str, name: str, options: Sequence[str] = (), *, wait: Literal[False]
    ) -> KernelFuture: ...

    def compile(
        self, source: str, name: str, options: Sequence[str] = (), *, wait: bool = True
    ) -> Kernel | KernelFuture:
        """Build and load kernel ``name`` from ``source`` now, through the disk cache.

        With ``wait=False`` the compiler runs on a host thread and a KernelFuture comes back at
        once; its ``result()`` loads the module (``cv.stream`` accepts the future and loads it
        before its first block, so no load stalls a running stream).

        Raises CompileError (with the build log) when the source does not build, and
        InputError when ``name`` is not a kernel in ``source``.
        """
        from conveyor.kernels.build import KernelFuture, compile_kernel

        options = _build_options(source, name, options)
        from conveyor.config import flag

        if not flag("wait", wait):
            return KernelFuture(self, source, name, options)
        return compile_kernel(self, source, name, options)

    @property
    def memory_pool(self) -> DevicePool:
        """This device's pool of device memory (made on first use)."""
        with self._lock:
            if self._memory_pool is None:
                from conveyor.memory.pool import DevicePool

                self._memory_pool = DevicePool(self)
            return self._memory_pool

    @property
    def pinned_pool(self) -> PinnedPool:
        """This device's pool of pinned host memory (made on first use)."""
        with self._lock:
            if self._pinned_pool is None:
                from conveyor.memory.pinned import PinnedPool

                self._pinned_pool = PinnedPool(self)
            return self._pinned_pool

    def warm_up(self, nbytes: int | None = None, *, block_bytes: int | None = None,
                pinned: bool | None = None) -> WarmUp | None:
        """Start getting ready for a first stream on a thread (memory/warmup.py: put ``nbytes``
        of pinned staging blocks in the pool, import the pipeline), unless one was started
        already or the device is closed; the WarmUp, or None when there is none: the device
        was closed first, ``nbytes`` or ``CONVEYOR_WARMUP`` is 0, or the device shares memory
        with the host and ``pinned`` is not True (nothing to pin: the imports alone cost a
        command that streams at once more than they save, 14 ms of a 0.3 s ``conveyor map``
        on PoCL). ``cv.device()`` calls it with the defaults for the device it returns."""
        from conveyor.memory.warmup import WarmUp, default_bytes

        nbytes, block_bytes, pinned = _warm_up_arguments(nbytes, block_bytes, pinned)
        stages = not self.host_unified if pinned is None else pinned
        if not stages or (default_bytes() if nbytes is None else nbytes) <= 0:
            return self._warmup
        with self._lock:
            if self._warmup is not None or self._closed:
                return self._warmup
            # Recorded before its thread starts, so close() always finds it and stops it.
            warm = self._warmup = WarmUp(self, nbytes, block_bytes=block_bytes, pinned=pinned)
        return warm.start()  # outside the lock: it reads the pinned pool, which takes it

    def _in_forked_child(self) -> bool:
        """True in a child forked after this backend was set up (the backends say)."""
        return False

    def wait_for_warm_up(self, timeout: float | None = None) -> None:
        """Wait until this device's warm-up (if any) has ended (at most ``timeout`` seconds,
        when given): before timing anything on it, so its allocations do not share the
        measured time."""
        if timeout is not None:
            timeout = _seconds("wait_for_warm_up(timeout=)", timeout)
        warm = self._warmup
        if warm is not None:
            warm.wait(timeout)

    def close(self) -> None:
        """Free the pools' held memory and the backend's objects. Safe to call twice.

        The device stays usable: ``cv.device(spec)`` returns this same object, so a stream
        after ``close()`` runs, and its pools hold memory again; a later ``close()`` frees that
        too (it did nothing once the device had been closed, and the memory stayed held)."""
        with self._lock:
            first = not self._closed
            self._closed = True
            pools = [p for p in (self._memory_pool, self._pinned_pool) if p is not None]
            warmup = self._warmup
        if self._in_forked_child():
            # The parent's memory and driver objects: a child must not wait on, free or
            # release them (CUDA raised its fork error out of close(); NVIDIA's OpenCL hung
            # the parent's next stream). They go with the child's process.
            return
        if warmup is not None and first:
            warmup.stop()  # before the pools close: it may be adding to one
            if self._pinned_pool is not None and self._pinned_pool not in pools:
                pools.append(self._pinned_pool)  # made by the warm-up after the list above
        from conveyor.memory import keep, pinned

        keep.release_device(self)  # arrays kept page-locked on it (cv.keep_pinned)
        svm = pinned.existing_svm_pool(self)
        if svm is not None and svm not in pools:
            pools.append(svm)  # cv.pinned.empty(..., svm=True) blocks: held memory too
        for pool in pools:
            pool.close()
        if first:
            self._release()


def _warm_up_arguments(nbytes: Any, block_bytes: Any, pinned: Any
                       ) -> tuple[int | None, int | None, bool | None]:
    """``warm_up``'s arguments checked: sizes as a stream's options take them (an int, an
    integral float or "64MiB"), a block of at least one byte, ``pinned`` True or False (``"no"``
    was taken as True)."""
    from conveyor import config
    from conveyor.errors import InputError
    from conveyor.pipeline.options import size

    if pinned is not None:
        pinned = config.flag("pinned", pinned)
    nbytes = size("nbytes", nbytes)
    block_bytes = size("block_bytes", block_bytes)
    if block_bytes == 0:  # a warm-up that silently did nothing
        raise InputError("block_bytes=0: give the staging block's size in bytes (at least 1), "
                         "or None for the default")
    return nbytes, block_bytes, pinned


def _seconds(what: str, value: Any) -> float:
    """``value`` as a number of seconds, 0 or more (an int or a float, not a bool or text)."""
    import math
    import numbers

    from conveyor.errors import InputError

    if (not isinstance(value, numbers.Real) or isinstance(value, bool)
            or not math.isfinite(float(value)) or float(value) < 0):
        raise InputError(f"{what}={value!r}: give a number of seconds, 0 or more, or None to "
                         f"wait until it ends")
    return float(value)


def _build_options(source: Any, name: Any, options: Any, call: str = "compile()"
                   ) -> tuple[str, ...]:
    """``options`` as a tuple of strings; InputError naming ``call`` for a source, name or
    options of the wrong type (a bare string of options would be split into its
    characters)."""
    from conveyor.errors import InputError

    if isinstance(source, bytes | bytearray):
        raise InputError(f"{call} takes the source as a str: decode it first "
                         f"(source.decode('utf-8'))")
    if not isinstance(source, str):
        raise InputError(f"{call} takes the kernel's source as a str, got "
                         f"{type(source).__name__}")
    if not isinstance(name, str) or not name:
        raise InputError(f"{call} takes the kernel's name as a non-empty str, got {name!r}")
    if isinstance(options, str | bytes | bytearray):
        text = options if isinstance(options, str) else bytes(options).decode("utf-8", "replace")
        kind = "" if isinstance(options, str) else " (each a str, not bytes)"
        raise InputError(f"options={options!r}: pass a list of options, e.g. "
                         f"{text.split()!r}{kind}")
    from collections.abc import Mapping, Set

    if isinstance(options, Mapping | Set):  # a dict's keys or a set's order, taken silently
        raise InputError(f"options={options!r} ({type(options).__name__}): pass a list of "
                         f"strings in the order the compiler should read them, e.g. ['-DN=4']")
    try:
        found = tuple(options)
    except TypeError:
        raise InputError(f"options={options!r}: pass a list of strings, e.g. "
                         f"['-DN=4']") from None
    bad = [o for o in found if not isinstance(o, str)]
    if bad:
        raise InputError(f"options={list(found)!r}: every option is a str ({bad[0]!r} is "
                         f"not)")
    return found


def named_beside(device: Device, other: Device) -> str:
    """``device``'s spec in a message about ``other``: where both have one spec (two contexts
    of one device: one closed since, or opened apart from ``cv.device()``), what tells
    them apart ("was built for opencl:0:0, the stream runs on opencl:0:0" said nothing)."""
    if device.spec != other.spec:
        return device.spec
    state = "a closed" if getattr(device, "_closed", False) else "another"
    return f"{state} context of {device.spec} (not the stream's)"
