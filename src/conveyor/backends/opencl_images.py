"""Read-only 2-D images on OpenCL (``image2d_t``, ``sampler_t``): the backend half of image
blocks (pipeline/image.py).

A block of rows is copied from a pinned staging buffer straight into an image
(``clEnqueueWriteImage`` with an origin and a region), with no device buffer between. Only
the channel orders whose channels are the array's last axis in order (R, RG, RGBA) and the
channel types that hold the array's values as they are (FLOAT, HALF_FLOAT, SIGNED_INT8/16/32,
UNSIGNED_INT8/16/32) are used; what a device supports of them comes from
``clGetSupportedImageFormats``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from conveyor import hazards
from conveyor.backends import base, opencl
from conveyor.errors import BackendError, InputError, OutOfMemoryError

_ORDERS = {cl.channel_order.R: 1, cl.channel_order.RG: 2, cl.channel_order.RGBA: 4}
_CHANNEL_TYPES = {
    cl.channel_type.FLOAT: "float32", cl.channel_type.HALF_FLOAT: "float16",
    cl.channel_type.SIGNED_INT8: "int8", cl.channel_type.SIGNED_INT16: "int16",
    cl.channel_type.SIGNED_INT32: "int32", cl.channel_type.UNSIGNED_INT8: "uint8",
    cl.channel_type.UNSIGNED_INT16: "uint16", cl.channel_type.UNSIGNED_INT32: "uint32",
}  # fmt: skip
_ADDRESS_MODES = {
    "clamp_to_edge": cl.addressing_mode.CLAMP_TO_EDGE, "clamp": cl.addressing_mode.CLAMP,
    "repeat": cl.addressing_mode.REPEAT,
    "mirrored_repeat": cl.addressing_mode.MIRRORED_REPEAT,
}  # fmt: skip
_FILTER_MODES = {"nearest": cl.filter_mode.NEAREST, "linear": cl.filter_mode.LINEAR}
#: Channel types a platform lists but reads wrong, left out so that an image of them is an
#: InputError instead of wrong numbers. PoCL 3.1 (its CPU device): read_imagef of a HALF_FLOAT
#: image returns one same wrong value for every pixel, while writing and reading the image back
#: from the host is right (tests/pipeline/test_image.py shows it when the entry is removed).
_BROKEN = {"Portable Computing Language": (cl.channel_type.HALF_FLOAT,)}


class DeviceImage(base.DeviceImage):
    """A read-only ``cl.Image`` (``image2d_t``)."""

    def __init__(self, cl_image: cl.Image, rows: int, columns: int, channels: int,
                 dtype: np.dtype) -> None:
        self.cl_image: cl.Image | None = cl_image
        self.rows, self.columns, self.channels, self.dtype = rows, columns, channels, dtype
        self.nbytes = rows * columns * channels * dtype.itemsize

    def close(self) -> None:
        if self.cl_image is not None:
            if not opencl._forked:  # a forked child must not call the driver
                self.cl_image.release()
            self.cl_image = None


def limits(device: opencl.Device) -> base.ImageLimits:
    """The device's largest image2d and its read-only formats conveyor can use."""
    opencl._check_not_forked()
    if not device.cl_device.image_support:
        raise InputError(f"{device.name} ({device.spec}) has no image support: stream the "
                         f"array as a plain input (a buffer)")
    try:
        found = cl.get_supported_image_formats(device.context, cl.mem_flags.READ_ONLY,
                                               cl.mem_object_type.IMAGE2D)
    except cl.Error as exc:
        raise opencl._backend_error(exc, "clGetSupportedImageFormats") from exc
    broken = _BROKEN.get(device.info.platform, ())
    formats = frozenset(
        (_ORDERS[f.channel_order], np.dtype(_CHANNEL_TYPES[f.channel_data_type]))
        for f in found
        if f.channel_order in _ORDERS and f.channel_data_type in _CHANNEL_TYPES
        and f.channel_data_type not in broken)
    return base.ImageLimits(int(device.cl_device.image2d_max_width),
                            int(device.cl_device.image2d_max_height), formats)


def alloc(device: opencl.Device, rows: int, columns: int, channels: int, dtype: np.dtype
          ) -> DeviceImage:
    """A read-only image of ``rows`` x ``columns`` pixels; OutOfMemoryError if it cannot be
    made."""
    opencl._check_not_forked()
    order = next(o for o, count in _ORDERS.items() if count == channels)
    kind = next(t for t, name in _CHANNEL_TYPES.items() if name == dtype.name)
    try:
        image = cl.create_image(device.context, cl.mem_flags.READ_ONLY,
                                cl.ImageFormat(order, kind), shape=(columns, rows))
    except cl.Error as exc:
        if exc.code in opencl._OOM_CODES:
            nbytes = rows * columns * channels * dtype.itemsize
            raise OutOfMemoryError(nbytes, 0, None, where="device image") from exc
        raise opencl._backend_error(exc, "clCreateImage") from exc
    return DeviceImage(image, rows, columns, channels, dtype)


def sampler(device: opencl.Device, address: str, filter: str, normalized: bool) -> cl.Sampler:
    """A ``cl.Sampler`` of these modes."""
    opencl._check_not_forked()
    try:
        return cl.Sampler(device.context, bool(normalized), _ADDRESS_MODES[address],
                          _FILTER_MODES[filter])
    except cl.Error as exc:
        raise opencl._backend_error(exc, "clCreateSampler") from exc


def copy_to_image(queue: opencl.Queue, dst: base.DeviceImage, src: np.ndarray, rows: int,
                  wait_for: Sequence[base.Event]) -> opencl.Event:
    """Enqueue the copy of ``rows`` rows of host pixels into rows ``0:rows`` of ``dst``."""
    if hazards.armed(queue.device) and not opencl._is_pinned(src):
        hazards.pageable_copy(queue.device, "copy_to_image", src.nbytes)
    image = getattr(dst, "cl_image", None)
    if image is None:
        raise BackendError("the image was freed or is not an OpenCL image", call="enqueue",
                           code="INVALID_MEM_OBJECT")
    try:
        event = cl.enqueue_copy(queue._q, image, src, origin=(0, 0), region=(dst.columns, rows),
                                wait_for=opencl._events(wait_for), is_blocking=False)
    except cl.Error as exc:
        raise opencl._backend_error(exc, "clEnqueueWriteImage") from exc
    return opencl.Event(event)


def _image_arg(value: Any) -> Any:
    if isinstance(value, DeviceImage):
        if value.cl_image is None:  # as for buffers: never pass a freed image
            raise BackendError("a kernel argument is a freed image", call="clSetKernelArg",
                               code="INVALID_MEM_OBJECT")
        return value.cl_image
    return value


def _sampler_arg(value: Any) -> Any:
    if not isinstance(value, cl.Sampler):
        raise InputError(f"a sampler_t parameter takes a sampler (conveyor passes each image "
                         f"input's own after its image), got {type(value).__name__}")
    return value


#: Launch-argument converters of the opaque types a kernel may take, by type name.
OPAQUE_ARGS: dict[str, Callable[[Any], Any]] = {
    "image2d_t": _image_arg, "sampler_t": _sampler_arg,
}
