"""Read-only 2-D textures on CUDA (``cudaTextureObject_t``): the CUDA half of image blocks
(pipeline/image.py), over cuda.core's texture API (``cuda.core.texture``, 1.1 and newer).

An image is a CUDA array (``OpaqueArray``, the driver's own 2-D layout) of the array's
element type and 1, 2 or 4 channels. CUDA has no separate sampler object: the addressing
mode, filter and coordinate normalization are fixed when a texture object is made over the
array, so :func:`texture` binds each slot's image to its input's sampling options once, and
the kernel takes that texture object (a 64-bit handle) alone in the image input's place. The
texture is read as the element type (integers stay integers: ``CU_TRSF_READ_AS_INTEGER``;
half is read as float), as OpenCL's ``read_imagei`` / ``read_imageui`` / ``read_imagef`` do.

A block of rows is copied from a pinned staging buffer straight into the array
(``cuMemcpy2DAsync``, host to array, rows ``0:rows``) on the queue's stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from conveyor import hazards
from conveyor.backends import base, cuda
from conveyor.errors import BackendError, InputError, OutOfMemoryError

#: Every element type a CUDA array holds (CUarray_format), each with 1, 2 or 4 channels.
DTYPES = ("float32", "float16", "int8", "int16", "int32", "uint8", "uint16", "uint32")
CHANNELS = (1, 2, 4)
#: conveyor's addressing modes (OpenCL's names) as cuda.core's AddressModeType values:
#: clamp_to_edge is CUDA's clamp, clamp (0 past the edges) CUDA's border (colour 0).
ADDRESS_MODES = {"clamp_to_edge": "clamp", "clamp": "border", "repeat": "wrap",
                 "mirrored_repeat": "mirror"}
FILTER_MODES = {"nearest": "point", "linear": "linear"}


class DeviceImage(base.DeviceImage):
    """A CUDA array of ``rows`` x ``columns`` pixels and the texture objects made over it
    (closed with it)."""

    def __init__(self, device: cuda.Device, array: Any, rows: int, columns: int,
                 channels: int, dtype: np.dtype) -> None:
        self.device = device
        self.array: Any = array
        self.handle = int(array.handle)
        self.rows, self.columns, self.channels, self.dtype = rows, columns, channels, dtype
        self.nbytes = rows * columns * channels * dtype.itemsize
        self.textures: list[Texture] = []

    def close(self) -> None:
        if self.array is None:
            return
        textures, self.textures = self.textures, []
        array, self.array, self.handle = self.array, None, 0
        if cuda._forked:  # a forked child must not call the driver
            return
        self.device._current()
        failure: BaseException | None = None
        for made in textures:  # every texture, even after one fails to close
            try:
                made.close()
            except BaseException as exc:
                failure = failure or exc
        array.close()
        if failure is not None:
            raise failure


class Texture:
    """A texture object over a DeviceImage: the kernel's ``cudaTextureObject_t`` argument."""

    def __init__(self, core_texture: Any) -> None:
        self.core_texture: Any = core_texture
        self.handle = int(core_texture.handle)

    def close(self) -> None:
        if self.core_texture is not None:
            made, self.core_texture, self.handle = self.core_texture, None, 0
            made.close()


def limits(device: cuda.Device) -> base.ImageLimits:
    """The largest 2-D texture over a CUDA array (``MAXIMUM_TEXTURE2D_WIDTH`` / ``_HEIGHT``)
    and every format a CUDA array has (all of DTYPES with 1, 2 or 4 channels)."""
    _check_texture_api()
    device._current()
    formats = frozenset((c, np.dtype(d)) for c in CHANNELS for d in DTYPES)
    props = device.core.properties  # cuDeviceGetAttribute(MAXIMUM_TEXTURE2D_WIDTH, ...)
    return base.ImageLimits(int(props.maximum_texture2d_width),
                            int(props.maximum_texture2d_height), formats)


def _check_texture_api() -> None:
    try:
        from cuda.core import texture  # noqa: F401  (binds no local name ``cuda``)
    except ImportError as exc:
        raise InputError(
            f"image blocks on CUDA need cuda.core 1.1 or newer (cuda.core.texture), and this "
            f"cuda.core is {cuda.cc.__version__}: pip install -U cuda-core, or stream the "
            f"array as a plain input") from exc


def alloc(device: cuda.Device, rows: int, columns: int, channels: int, dtype: np.dtype
          ) -> DeviceImage:
    """A CUDA array of ``rows`` x ``columns`` pixels; OutOfMemoryError if it cannot be made."""
    from cuda.core.texture import OpaqueArrayOptions

    device._current()
    options = OpaqueArrayOptions(shape=(columns, rows), format=np.dtype(dtype).name,
                                 num_channels=channels)
    try:
        array = device.core.create_opaque_array(options)
    except Exception as exc:
        if "OUT_OF_MEMORY" in str(exc):
            nbytes = rows * columns * channels * np.dtype(dtype).itemsize
            raise OutOfMemoryError(nbytes, 0, None, where="device image") from exc
        raise cuda._wrap(exc, "cuArray3DCreate") from exc
    return DeviceImage(device, array, rows, columns, channels, np.dtype(dtype))


def sampler(device: cuda.Device, address: str, filter: str, normalized: bool) -> Any:
    """The sampling options of a texture (cuda.core ``TextureObjectOptions``): CUDA's
    sampler, which :func:`texture` binds to each image."""
    from cuda.core.texture import TextureObjectOptions

    return TextureObjectOptions(address_mode=ADDRESS_MODES[address],
                                filter_mode=FILTER_MODES[filter], read_mode="element_type",
                                normalized_coords=bool(normalized))


def texture(device: cuda.Device, image: base.DeviceImage, options: Any) -> Texture:
    """A texture object over ``image`` with sampling ``options``; it lives as long as the
    image (``image.close()`` closes it)."""
    from cuda.core.texture import ResourceDescriptor

    if not isinstance(image, DeviceImage) or image.array is None:
        raise BackendError("the image was freed or is not a CUDA image", call="cuTexObjectCreate")
    device._current()
    try:
        made = device.core.create_texture_object(
            resource=ResourceDescriptor.from_opaque_array(image.array), options=options)
    except Exception as exc:
        raise cuda._wrap(exc, "cuTexObjectCreate") from exc
    bound = Texture(made)
    image.textures.append(bound)
    return bound


def copy_to_image(queue: cuda.Queue, dst: base.DeviceImage, src: np.ndarray, rows: int,
                  wait_for: Sequence[base.Event]) -> cuda.Event:
    """Enqueue the copy of ``rows`` rows of host pixels into rows ``0:rows`` of ``dst``."""
    if not isinstance(dst, DeviceImage) or dst.array is None:
        raise BackendError("the image was freed or is not a CUDA image", call="enqueue",
                           code="CUDA_ERROR_INVALID_HANDLE")
    host = cuda._host_pointer(src, "copy_to_image")
    row_bytes = dst.columns * dst.channels * dst.dtype.itemsize
    if rows * row_bytes > src.nbytes or rows > dst.rows:
        raise InputError(f"copy_to_image: {rows} rows of {row_bytes} bytes do not fit in a "
                         f"{src.nbytes}-byte source and a {dst.rows}-row image")
    if (rows and hazards.armed(queue.device)
            and not queue.device._is_pinned(host, rows * row_bytes)):
        hazards.pageable_copy(queue.device, "copy_to_image", rows * row_bytes)
    driver = cuda.driver
    copy = driver.CUDA_MEMCPY2D()
    copy.srcMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_HOST
    copy.srcHost = host
    copy.srcPitch = row_bytes
    copy.dstMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_ARRAY
    copy.dstArray = driver.CUarray(dst.handle)
    copy.WidthInBytes = row_bytes
    copy.Height = rows
    with queue._command(wait_for) as start:
        if rows:
            cuda._check(driver.cuMemcpy2DAsync(copy, queue._handle), "cuMemcpy2DAsync")
        return queue._end(start)


def texture_arg(value: Any) -> Any:
    """A ``cudaTextureObject_t`` launch argument: a Texture's handle (never a closed one's),
    or a handle given as a NumPy uint64."""
    if isinstance(value, Texture):
        if not value.handle:
            raise BackendError("a kernel argument is a closed texture object",
                               call="cuLaunchKernel")
        return np.uint64(value.handle)
    if isinstance(value, np.uint64):
        return value
    raise InputError(f"a cudaTextureObject_t parameter takes a texture object (conveyor "
                     f"passes each image input's own), got {type(value).__name__}")


#: The type names of a kernel parameter that takes a texture object.
TEXTURE_TYPES = ("cudaTextureObject_t", "CUtexObject")
