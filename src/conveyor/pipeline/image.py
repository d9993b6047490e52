"""Image blocks: a 2-D input read by the kernel through an image and a sampler (OpenCL
``image2d_t`` and ``sampler_t``; CUDA a texture object, ``cudaTextureObject_t``).

``cv.image(a)`` in ``inputs=`` marks array ``a`` (rows, columns) or (rows, columns, channels)
as an image input. Each block of rows, with its halo rows, is staged as any input is (a
pinned ring filled by the staging threads, halo pad rows by ``boundary=``) and then copied
straight into one of the slot's images (``image2d_t``, a format whose channel type is the
array's dtype and whose channels are its last axis: R, RG or RGBA). The kernel takes two
parameters in the input's place, ``read_only image2d_t`` and ``sampler_t``, and reads with
``read_imagef`` (float and half images), ``read_imagei`` / ``read_imageui`` (integers).

The sampler's addressing mode is the boundary rule along the columns, at the array's own
edges (an image holds whole rows). Along the rows, the halo's pad rows give the rule at the
array's first and last row, so the two must agree: ``ADDRESS_FOR_BOUNDARY`` pairs them, and
any other pairing is an InputError before any work. Reads must stay within the block's rows
and its halo (a linear read's 2 x 2 footprint included): past them the image ends where the
array does not.

Image row ``r + halo`` is row ``r`` of the block, which is row ``offset / row_items + r`` of
the whole array (``row_items`` = columns x channels of input 0). With ``normalized=True`` the
kernel divides by ``get_image_width`` / ``get_image_height`` (the height is the same for every
block: ``block_rows + 2 * halo``; the tail block leaves the rows past its own unused).

On CUDA (``backends/cuda_images.py``) an image is a CUDA array and the sampler is bound to
it in a texture object (CUDA has no separate sampler), so the kernel takes ONE parameter in
the input's place, ``cudaTextureObject_t``, and reads with ``tex2D<T>(t, x + 0.5f, y +
0.5f)`` (T the element type, or its vector type for 2 or 4 channels, ``float`` for half).
CUDA kernels cannot ask a texture its size: one that reads normalized coordinates takes the
width and height as args (the height is ``report.block_rows + 2 * halo``; ``block_bytes``
sets the block's rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.backends.base import Device, DeviceImage, Event, ImageLimits, Kernel, Queue
from conveyor.errors import InputError
from conveyor.kernels.signature import Param
from conveyor.pipeline.halo import Boundary, HaloRows
from conveyor.pipeline.io import ArraySource, FileSource, Source, as_source
from conveyor.pipeline.paths import Slot
from conveyor.pipeline.plan import Block
from conveyor.pipeline.staged import StagedIn, StagingRings

#: The sampler addressing mode that reads past the columns' edges what ``boundary=`` makes of
#: the halo's pad rows: np.pad "edge", "symmetric", "wrap" and a constant 0.
ADDRESS_FOR_BOUNDARY = {"nearest": "clamp_to_edge", "reflect": "mirrored_repeat",
                        "periodic": "repeat", 0: "clamp"}
ADDRESSES = tuple(ADDRESS_FOR_BOUNDARY.values())
FILTERS = ("nearest", "linear")
#: OpenCL allows these modes with normalized coordinates only.
NORMALIZED_ONLY = ("repeat", "mirrored_repeat")


@dataclass(frozen=True)
class ImageInput:
    """What ``cv.image`` returns: an input and how its image is read (see ``image``)."""

    value: Any
    address: str | None
    filter: str
    normalized: bool

    def source(self, index: int) -> ImageSource:
        """Input ``index`` as a Source (InputError for a shape or source images cannot be)."""
        return ImageSource(as_source(self.value, index), index, self)


def image(value: Any, *, address: str | None = None, filter: str = "nearest",
          normalized: bool = False) -> ImageInput:
    """Mark ``value`` (an array, a ``.npy`` path, ``cv.npy`` or ``cv.raw``) of shape (rows,
    columns) or (rows, columns, channels of 1, 2 or 4) as an image input of ``cv.stream``
    (OpenCL or CUDA). The kernel takes ``read_only image2d_t img, sampler_t s`` in its place
    on OpenCL, ``cudaTextureObject_t img`` on CUDA.

    ``address`` is the sampler's addressing mode: "clamp_to_edge", "mirrored_repeat",
    "repeat" or "clamp", which must match the stream's ``boundary=`` ("nearest", "reflect",
    "periodic", 0); None (the default) takes the one that matches. ``filter`` is "nearest" or
    "linear" (float and half images only). ``normalized=True`` reads at coordinates in [0, 1)
    (which "repeat" and "mirrored_repeat" need). Raises InputError for a value that is not one
    of these."""
    if address is not None and (not isinstance(address, str) or address not in ADDRESSES):
        why = (" leaves reads past the edges undefined, which matches no boundary= rule"
               if address == "none" else " is not an addressing mode conveyor knows")
        raise InputError(f"address={address!r}{why}: use one of {', '.join(ADDRESSES)} (or "
                         f"None, the one that matches boundary=)")
    if not isinstance(filter, str) or filter not in FILTERS:  # an array: no truth value
        raise InputError(f"filter={filter!r}: use 'nearest' or 'linear'")
    if not isinstance(normalized, bool):
        raise InputError(f"normalized={normalized!r}: pass True or False")
    return ImageInput(value, address, filter, normalized)


class ImageSource(Source):
    """An input streamed through images: the rows of ``inner``, with the image's options."""

    def __init__(self, inner: Source, index: int, options: ImageInput) -> None:
        self.inner = inner
        self.index = index
        self.shape, self.dtype, self.name = inner.shape, inner.dtype, inner.name
        self.beside = inner.beside
        self.filter, self.normalized = options.filter, options.normalized
        self.address = options.address  # None until resolve() matched it to boundary=
        self._asked = options.address
        where = f"input {index} (an image)"
        if not isinstance(inner, ArraySource | FileSource):
            raise InputError(f"{where} is {inner.name}: an image input reads an array or a "
                             f".npy/raw file, whose pad rows can be read at the start")
        if len(self.shape) == 2:
            self.channels = 1
        elif len(self.shape) == 3 and self.shape[2] in (1, 2, 3, 4):
            self.channels = self.shape[2]
        else:
            raise InputError(f"{where} has shape {self.shape}: an image is (rows, columns) or "
                             f"(rows, columns, channels) with 1, 2 or 4 channels")
        self.columns = self.shape[1]
        if self.columns == 0:
            raise InputError(f"{where} has no columns (shape {self.shape})")
        if not self.dtype.isnative:
            from conveyor.pipeline.validate import native_order_fix

            raise InputError(f"{where} has dtype {self.dtype.str}, not in this machine's byte "
                             f"order: {native_order_fix(inner, self.dtype)}")
        if self.filter == "linear" and self.dtype.kind != "f":
            raise InputError(
                f"{where}: filter='linear' interpolates float and half images only (OpenCL "
                f"reads integer images with read_imagei/read_imageui and CUDA integer textures "
                f"as integers, nearest only), and this "
                f"one holds {self.dtype}: use filter='nearest' or pass a.astype(np.float32)")

    def rows(self, lo: int, hi: int) -> Any:
        return self.inner.rows(lo, hi)

    def close(self) -> None:
        self.inner.close()

    def resolve(self, boundary: Boundary, limits: ImageLimits, device: Device) -> None:
        """Check this image against the device and the stream's ``boundary``; settle its
        addressing mode. InputError, naming what to change, for anything that cannot work."""
        where = f"input {self.index} (an image)"
        if (self.channels, self.dtype) not in limits.formats:
            raise InputError(
                f"{where}: {device.name} ({device.spec}) has no image format of "
                f"{self.channels} channel(s) of {self.dtype}; its formats are "
                f"{describe_formats(limits)}: pass an array of one of those (a.astype(...)) "
                f"or stream it as a plain input")
        if self.columns > limits.max_width:
            name = ("CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH" if device.backend == "cuda"
                    else "CL_DEVICE_IMAGE2D_MAX_WIDTH")
            raise InputError(
                f"{where} has {self.columns} columns, more than {device.name}'s largest image "
                f"width ({limits.max_width} pixels, {name}): stream it as "
                f"a plain input, or split its columns into several images")
        matching = _address_for(boundary)
        if matching is None:
            raise InputError(
                f"{where}: boundary={boundary!r} has no sampler addressing mode (clamp reads 0 "
                f"past the edges, no mode another constant): use boundary=0, 'nearest', "
                f"'reflect' or 'periodic' with image inputs")
        if self._asked is not None and self._asked != matching:
            wanted = next(b for b, a in ADDRESS_FOR_BOUNDARY.items() if a == self._asked)
            raise InputError(
                f"{where}: address={self._asked!r} reads past the columns' edges what "
                f"boundary={wanted!r} makes of the rows, but this stream has "
                f"boundary={boundary!r}: pass boundary={wanted!r}, or address={matching!r} "
                f"(or leave address=None)")
        if matching in NORMALIZED_ONLY and not self.normalized:
            size = ("width, height (kernel args: the height is the block's rows + 2 * halo)"
                    if device.backend == "cuda" else
                    "get_image_width(img), get_image_height(img)")
            raise InputError(
                f"{where}: boundary={boundary!r} reads through address={matching!r}, which "
                f"OpenCL and CUDA allow with normalized coordinates only: pass cv.image(..., "
                f"normalized=True) and read at ((x + 0.5f) / width, (y + 0.5f) / height) "
                f"({size})")
        self.address = matching


def _address_for(boundary: Boundary) -> str | None:
    if isinstance(boundary, str):
        return ADDRESS_FOR_BOUNDARY.get(boundary)
    return "clamp" if boundary == 0 else None


def describe_formats(limits: ImageLimits) -> str:
    """The formats of ``limits`` as "1 channel: float16, float32; 4 channels: ..."."""
    parts = []
    for channels in sorted({c for c, _ in limits.formats}):
        names = sorted(str(d) for c, d in limits.formats if c == channels)
        parts.append(f"{channels} channel{'s' if channels > 1 else ''}: {', '.join(names)}")
    return "; ".join(parts) or "none"


def indices(sources: Sequence[Any]) -> frozenset[int]:
    """The image inputs among ``sources``."""
    return frozenset(i for i, s in enumerate(sources) if isinstance(s, ImageSource))


def prepare(compute: Any, device: Device, sources: Sequence[Source], boundary: Boundary,
            halo: int) -> int | None:
    """Check the image inputs before any work and settle their samplers; the most rows a
    block may have so that its images (block plus halo rows) fit the device's image height,
    or None without image inputs."""
    images = [s for s in sources if isinstance(s, ImageSource)]
    if not images:
        return None
    if not isinstance(compute, Kernel):
        raise InputError("image inputs are read by a kernel (read_only image2d_t, sampler_t; "
                         "CUDA: cudaTextureObject_t); "
                         "a Python callable gets device arrays: pass a kernel, or stream the "
                         "array as a plain input")
    limits = device.image_limits()  # InputError where the device has no images
    for source in images:
        source.resolve(boundary, limits, device)
    rows = limits.max_height - 2 * halo
    if rows < 1:
        raise InputError(f"halo={halo} leaves no rows of {device.name}'s largest image height "
                         f"({limits.max_height} pixels) for the block: use a smaller halo")
    return rows


#: The type names a CUDA kernel's parameter of an image input may have.
TEXTURE_TYPES = ("cudaTextureObject_t", "CUtexObject")


def sampler_params(device: Device, sources: Sequence[Any]) -> int:
    """How many parameters the kernel has beyond one per input and output: each image
    input's ``sampler_t`` on OpenCL; none on CUDA (the texture object is the sampler)."""
    return 0 if device.backend == "cuda" else len(indices(sources))


def refuse_plain_for_image(kernel: str, params: Sequence[Param], inputs: int) -> None:
    """InputError, for a stream with no image input, when ``kernel`` takes an image (an
    ``image2d_t`` or a CUDA texture object) among its first ``inputs`` places: the input there
    is a plain array that was meant as ``cv.image(array)`` (the parameter count, or "declare
    it as a pointer to a scalar type", was all the user was told)."""
    for index, param in enumerate(params[:inputs]):  # one parameter per plain input
        kind = param.base.split(" ")[-1]
        # (PoCL reports an image2d_t as a __global pointer: its base type tells it.)
        if kind == "image2d_t" or (kind in TEXTURE_TYPES and not param.is_pointer):
            raise InputError(
                f"kernel {kernel!r} takes an image in input {index}'s place (parameter "
                f"{param.name!r}, {param.type_text}): pass that input as cv.image(array) "
                f"(README \"Image blocks\"), which binds it as an image"
                + (" and its sampler" if kind == "image2d_t" else ""))


def kernel_params(kernel: str, params: Sequence[Param], images: frozenset[int],
                  expected: int, backend: str = "opencl") -> list[Param]:
    """``params`` without each image input's ``sampler_t``, after checking that the kernel
    takes ``image2d_t, sampler_t`` in each image input's place (``expected`` parameters are
    what the stream passes besides the samplers); on CUDA (``backend``), after checking that
    it takes a ``cudaTextureObject_t`` there."""
    if backend == "cuda":
        return _texture_params(kernel, params, images, expected)
    if len(params) != expected + len(images):
        raise InputError(
            f"kernel {kernel!r} takes {len(params)} parameters; this stream passes "
            f"{expected + len(images)}: each image input takes two (read_only image2d_t, "
            f"sampler_t), each other input and output one, then args, then offset and n")
    kept: list[Param] = []
    position = 0
    for index in range(max(images) + 1):
        param = params[position]
        if index not in images:
            kept.append(param)
            position += 1
            continue
        sampler = params[position + 1]
        # The type's last word: a driver may spell the access qualifier ("read_only image2d_t").
        if param.base.split(" ")[-1] != "image2d_t" or sampler.base.split(" ")[-1] != "sampler_t":
            raise InputError(
                f"input {index} is an image, so kernel {kernel!r} takes 'read_only image2d_t, "
                f"sampler_t' in its place, not {param.type_text!r}, {sampler.type_text!r}")
        kept.append(param)
        position += 2
    return kept + list(params[position:])


def _texture_params(kernel: str, params: Sequence[Param], images: frozenset[int],
                    expected: int) -> list[Param]:
    if len(params) != expected:
        raise InputError(
            f"kernel {kernel!r} takes {len(params)} parameters; this stream passes "
            f"{expected}: on CUDA each image input takes one (cudaTextureObject_t), each "
            f"other input and output one, then args, then offset and n")
    for index in sorted(images):
        param = params[index]
        if param.is_pointer or param.base.split(" ")[-1] not in TEXTURE_TYPES:
            raise InputError(
                f"input {index} is an image, so CUDA kernel {kernel!r} takes "
                f"'cudaTextureObject_t' in its place (read with tex2D<T>), not "
                f"{param.type_text!r}")
    return list(params)


@dataclass(frozen=True)
class ImageBlock:
    """One slot's image of one input and the kernel's arguments for it: the image and its
    sampler (OpenCL), or the texture object bound to both (CUDA)."""

    image: DeviceImage
    args: tuple[Any, ...]


def launch_inputs(buffers: Sequence[Any]) -> list[Any]:
    """A slot's input buffers as launch arguments: an image input is its image's arguments."""
    args: list[Any] = []
    for buffer in buffers:
        if isinstance(buffer, ImageBlock):
            args += buffer.args
        else:
            args.append(buffer)
    return args


class ImageIn(StagedIn):
    """Image inputs: staged into a pinned ring (halo rows included) as any staged input, then
    copied into the slot's image. ``slot_bytes`` are 0: the images are the slot's device
    memory (as many bytes as a buffer would be, which the plan counts)."""

    def __init__(self, rings: StagingRings, indices: list[int], halo_rows: HaloRows | None,
                 boundary: Boundary) -> None:
        super().__init__(rings, indices, halo_rows, boundary)
        self.slot_bytes = (0,) * len(indices)
        self.held: list[DeviceImage] = []
        self.slots: list[list[ImageBlock]] = []
        plan, device = rings.plan, rings.device
        sources = [s for s in self.sources if isinstance(s, ImageSource)]
        assert len(sources) == len(indices)
        try:
            samplers = [device.image_sampler(s.address or "clamp_to_edge", s.filter,
                                             s.normalized) for s in sources]
            for _ in range(plan.depth):
                blocks = []
                for source, sampler in zip(sources, samplers, strict=True):
                    made = device.alloc_image(plan.block_rows + 2 * plan.halo, source.columns,
                                              source.channels, source.dtype)
                    self.held.append(made)
                    self.device_bytes += made.nbytes
                    blocks.append(ImageBlock(made, device.image_arguments(made, sampler)))
                self.slots.append(blocks)
        except BaseException:
            self.give_back()
            raise

    def take(self, slot: Slot, block: Block) -> None:
        super().take(slot, block)
        for i, bound in zip(self.indices, self.slots[slot.index], strict=True):
            slot.dev_in[i] = bound

    def enqueue(self, queue: Queue, slot: Slot, block: Block, wait_for: Sequence[Event]
                ) -> list[Event]:
        rows = block.rows + 2 * self.plan.halo
        events = []
        for i, pin, bound in zip(self.indices, self.entry, self.slots[slot.index], strict=True):
            assert pin is not None
            view = pin.array[: rows * self.plan.inputs[i].row_bytes]
            event = queue.copy_to_image(bound.image, view, rows, wait_for=wait_for)
            self.records.append(("copy-in", block.index, event, view.nbytes))
            events.append(event)
        return events

    def give_back(self) -> None:
        """The ring's pinned buffers and the images (every queue has finished)."""
        try:
            super().give_back()
        finally:
            held, self.held, self.slots = self.held, [], []
            for made in held:
                made.close()
