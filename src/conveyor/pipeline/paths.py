"""How each array travels between the host and the device, chosen once per stream.

``choose`` looks at every input and output once, before the first block, and gives each a
*path*; the engine's loop then calls the same few methods on every path for every block and
never tests a mode again:

- **staged** (pipeline/staged.py): rows are copied into a ring of pinned buffers by the
  staging threads, and from there to the device (pageable arrays, files, iterables);
- **direct**: a pinned, C-contiguous array is copied to or from the device as it is;
- **zero-copy**: on a device that shares memory with the host, the block is registered where
  it is and the kernel uses it in place.

Every path has one interface: ``slot_bytes`` (the device bytes each of its arrays needs in a
slot; 0 where it brings its own), ``take(slot, block)`` (wait until the block can be issued;
bind the slot's buffers where the path supplies them), ``enqueue(queue, slot, block,
wait_for)`` (the copies; their events), ``release(block, events)`` (what the block's copies
read may be reused after ``events``), ``close()`` (stop its threads) and ``give_back()`` (its
memory, once every queue has finished). A path may carry several arrays that
travel the same way (staged inputs share one ring and one thread).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from conveyor.backends.base import Device, Event, Queue, Registration
from conveyor.closing import Closeable
from conveyor.memory import keep, pinned
from conveyor.pipeline.halo import Boundary, HaloRows
from conveyor.pipeline.io import ArraySource, Source
from conveyor.pipeline.plan import Block, Plan
from conveyor.pipeline.sinks import ArraySink, Sink

#: (what, block index, event or span, bytes) of every device command, for the timeline.
Records = list[tuple[str, int, Any, int]]


class Slot:
    """One block's device buffers (every input and output, and a reduction's scratch) and
    what is in flight in it."""

    def __init__(self, index: int, inputs: int, outputs: int) -> None:
        self.index = index
        self.dev_in: list[Any] = [None] * inputs  # DeviceBuffer, or Registration (zero-copy)
        self.dev_out: list[Any] = [None] * outputs
        self.scratch: Any = None  # the reduction's buffers (pipeline/reduce.py: Reduction)
        self.temps: list[Any] = []  # a chain's device-only buffers (pipeline/chain.py)
        self.block: Block | None = None
        self.done: list[Event] = []
        self.registrations: list[Registration] = []
        self.partial: Any = None
        #: What a callable returned: kept until the block retires, so a library's allocator
        #: cannot reuse the memory while the copy into the outputs may still read it.
        self.returned: Any = None


class Path(Closeable):
    """The arrays ``indices`` (of the inputs, or of the outputs) and how they travel."""

    #: Device bytes the path holds itself, beside ``slot_bytes`` (the images of image inputs).
    device_bytes = 0

    def __init__(self, indices: Sequence[int], slot_bytes: Sequence[int],
                 records: Records) -> None:
        self.indices = tuple(indices)
        self.slot_bytes = tuple(slot_bytes)
        self.records = records

    def start(self) -> None:
        """Start what runs beside the engine (staging threads); nothing by default."""

    def take(self, slot: Slot, block: Block) -> None:
        """Wait until ``block`` can be issued in ``slot``."""

    def enqueue(self, queue: Queue, slot: Slot, block: Block, wait_for: Sequence[Event]
                ) -> list[Event]:
        """Enqueue the block's copies on ``queue`` after ``wait_for``; return their events."""
        return []

    def release(self, block: Block, events: Sequence[Event]) -> None:
        """What ``block``'s copies read may be reused once ``events`` complete."""

    def finish(self) -> None:
        """After the last block: wait for what still runs beside the engine."""

    def close(self) -> None:
        """Stop what runs beside the engine (its threads); safe to call twice."""

    def give_back(self) -> None:
        """Give back the memory the path holds; called once every queue has finished and
        every staging thread has been joined."""

    def _copy_in(self, queue: Queue, dev: Any, part: np.ndarray, block: Block,
                 wait_for: Sequence[Event], offset: int = 0) -> Event:
        event = queue.copy_in(dev, part, dst_offset=offset, wait_for=wait_for)
        self.records.append(("copy-in", block.index, event, part.nbytes))
        return event

    def _copy_out(self, queue: Queue, dst: np.ndarray, dev: Any, block: Block,
                  wait_for: Sequence[Event]) -> Event:
        event = queue.copy_out(dst, dev, wait_for=wait_for)
        self.records.append(("copy-out", block.index, event, dst.nbytes))
        return event


class DirectIn(Path):
    """Pinned inputs, copied from the caller's array (halo pad and saved rows from
    ``halo_rows``)."""

    def __init__(self, indices: Sequence[int], plan: Plan, arrays: Sequence[np.ndarray],
                 halo_rows: HaloRows | None, records: Records) -> None:
        super().__init__(indices, [plan.input_slot_bytes[i] for i in indices], records)
        self.arrays = list(arrays)
        self.row_bytes = [plan.inputs[i].row_bytes for i in indices]
        self.halo_rows = halo_rows

    def enqueue(self, queue: Queue, slot: Slot, block: Block, wait_for: Sequence[Event]
                ) -> list[Event]:
        events = []
        for i, src, row_bytes in zip(self.indices, self.arrays, self.row_bytes, strict=True):
            if self.halo_rows is not None:
                pieces = self.halo_rows.direct_pieces(i, src, block, row_bytes)
            else:
                pieces = [(0, src[block.start : block.stop])]
            for offset, part in pieces:
                events.append(self._copy_in(queue, slot.dev_in[i], part, block, wait_for,
                                            offset))
        return events


class DirectOut(Path):
    """Pinned outputs, copied straight into the caller's array."""

    def __init__(self, indices: Sequence[int], plan: Plan, arrays: Sequence[np.ndarray],
                 records: Records) -> None:
        super().__init__(indices, [plan.output_slot_bytes[i] for i in indices], records)
        self.arrays = list(arrays)
        self.plan = plan

    def enqueue(self, queue: Queue, slot: Slot, block: Block, wait_for: Sequence[Event]
                ) -> list[Event]:
        events = []
        for i, out in zip(self.indices, self.arrays, strict=True):
            lo, hi = self.plan.output_rows(i, block)
            events.append(self._copy_out(queue, out[lo:hi], slot.dev_out[i], block, wait_for))
        return events


class ZeroCopy(Path):
    """Arrays used in place on a host-unified device: each block registered where it is (the
    registration is the slot's buffer); outputs made visible to the host after the compute."""

    def __init__(self, indices: Sequence[int], arrays: Sequence[np.ndarray], device: Device,
                 output: bool, records: Records, plan: Plan) -> None:
        super().__init__(indices, [0] * len(indices), records)
        self.arrays = list(arrays)
        self.device = device
        self.output = output
        self.plan = plan

    def take(self, slot: Slot, block: Block) -> None:
        buffers = slot.dev_out if self.output else slot.dev_in
        for i, array in zip(self.indices, self.arrays, strict=True):
            lo, hi = self.plan.output_rows(i, block) if self.output else (block.start,
                                                                          block.stop)
            registration = self.device.register_host(array[lo:hi])
            slot.registrations.append(registration)
            buffers[i] = registration

    def enqueue(self, queue: Queue, slot: Slot, block: Block, wait_for: Sequence[Event]
                ) -> list[Event]:
        if not self.output:
            return []
        events = []
        for i in self.indices:
            registration = slot.dev_out[i]
            assert isinstance(registration, Registration)
            events.append(queue.sync_host(registration, wait_for=wait_for))
        return events


def choose(device: Device, plan: Plan, sources: Sequence[Source], sinks: Sequence[Sink], *,
           zero_copy: bool, in_place: frozenset[int], staging: Any, records: Records,
           boundary: Boundary = "nearest") -> tuple[list[Path], list[Path]]:
    """The input paths and the output paths of a stream, each array on exactly one.
    ``staging`` makes the staged paths (pipeline/staged.py: StagingRings)."""
    from conveyor.pipeline.image import ImageIn, ImageSource  # it builds on the staged path

    if zero_copy:  # stream() allows it for C-contiguous arrays only
        arrays_in = [_array(s) for s in sources]
        arrays_out = [_array(s) for s in sinks]
        return ([ZeroCopy(range(len(sources)), arrays_in, device, False, records, plan)],
                [ZeroCopy(range(len(sinks)), arrays_out, device, True, records, plan)])
    direct_in = [i for i, s in enumerate(sources) if _pinned(s, device)]
    direct_out = [i for i, s in enumerate(sinks) if _pinned(s, device)]
    # Pageable arrays kept page-locked between streams (cv.keep_pinned) go direct too.
    holds = None
    if keep.kept_bytes():
        pageable_in = [i for i, s in enumerate(sources)
                       if i not in direct_in and isinstance(s, ArraySource)]
        pageable_out = [i for i, s in enumerate(sinks)
                        if i not in direct_out and isinstance(s, ArraySink)]
        found, holds = keep.hold(
            device, [_array(sources[i]) for i in pageable_in]
            + [_array(sinks[i]) for i in pageable_out],
            [False] * len(pageable_in) + [True] * len(pageable_out))
        kept_in, kept_out = found[:len(pageable_in)], found[len(pageable_in):]
        direct_in = sorted(direct_in + [i for i, ok in zip(pageable_in, kept_in, strict=True)
                                        if ok])
        direct_out = sorted(direct_out + [i for i, ok in zip(pageable_out, kept_out,
                                                             strict=True) if ok])
    # Page-locked memory of other libraries (CuPy's, PyTorch's: the driver says so) goes direct
    # too; staging it again halved the rate (bench/NOTES.md, session 11). Asked after the
    # kept arrays, which the driver also calls page-locked but a stream must hold.
    direct_in = sorted(direct_in + [i for i, s in enumerate(sources)
                                    if i not in direct_in and _locked_elsewhere(s, device)])
    direct_out = sorted(direct_out + [i for i, s in enumerate(sinks)
                                      if i not in direct_out and _locked_elsewhere(s, device)])
    halo_rows = None
    if plan.halo and (direct_in or in_place):
        direct = [i in direct_in for i in range(len(sources))]
        halo_rows = HaloRows(device, plan, sources, direct, in_place, boundary)
    inputs: list[Path] = []
    outputs: list[Path] = []
    try:
        if direct_in:
            inputs.append(DirectIn(direct_in, plan, [_array(sources[i]) for i in direct_in],
                                   halo_rows, records))
        if direct_out:
            outputs.append(DirectOut(direct_out, plan, [_array(sinks[i]) for i in direct_out],
                                     records))
        images = [i for i, s in enumerate(sources) if isinstance(s, ImageSource)]
        staged_in = [i for i in range(len(sources)) if i not in direct_in and i not in images]
        staged_out = [i for i in range(len(sinks)) if i not in direct_out]
        if staged_in:
            inputs.append(staging.inputs(staged_in, halo_rows, boundary))
        if staged_out:
            outputs.append(staging.outputs(staged_out))
        if images:  # pipeline/image.py: staged, then copied into the slot's images
            inputs.append(ImageIn(staging, images, halo_rows, boundary))
    except BaseException:
        for path in (*inputs, *outputs):
            path.give_back()
        if halo_rows is not None:
            halo_rows.close()
        if holds is not None:
            holds.close()
        raise
    if halo_rows is not None:
        inputs.append(_Owner(halo_rows))
    if holds is not None:
        inputs.append(_Owner(holds))
    return inputs, outputs


class _Owner(Path):
    """Holds the halo rows until the stream ends (every queue has finished by close())."""

    def __init__(self, held: Closeable) -> None:
        super().__init__((), (), [])
        self.held = held

    def give_back(self) -> None:
        self.held.close()


def staged_marks(device: Device, sources: Sequence[Source], sinks: Sequence[Sink],
                 zero_copy: bool | None) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """Which inputs and outputs may take a pinned staging ring, for the plan (before
    :func:`choose`): none with ``zero_copy=True``; not pinned arrays, nor other libraries'
    page-locked ones, which go direct (arrays kept by ``cv.keep_pinned`` are counted: whether
    a stream may hold them is known only then)."""
    if zero_copy:
        return (False,) * len(sources), (False,) * len(sinks)
    return (tuple(not (_pinned(s, device) or _locked_elsewhere(s, device)) for s in sources),
            tuple(not (_pinned(s, device) or _locked_elsewhere(s, device)) for s in sinks))


def pinned_room(device: Device) -> int | None:
    """What the device's pinned pool's ``limit`` leaves beside the blocks in use now (pinned
    arrays of ``cv.pinned.empty``, other streams' rings); None without a limit. The plan's
    staging rings fit this, not the whole limit (a 940 KiB pinned input under a 1 MiB limit
    left 84 KiB, and a plan for the whole MiB failed with OutOfMemoryError)."""
    pool = device.pinned_pool
    if pool.limit is None:
        return None
    stats = pool.stats()
    return max(pool.limit - stats.in_use_bytes - stats.pending_bytes, 0)


def _array(end: Source | Sink) -> np.ndarray:
    assert isinstance(end, ArraySource | ArraySink)
    return end.array


def _pinned(end: Source | Sink, device: Device) -> bool:
    """True when the device can copy this array without staging (never for files)."""
    if not isinstance(end, ArraySource | ArraySink):
        return False
    return pinned.is_pinned_for(end.array, device) and end.array.flags.c_contiguous


def _locked_elsewhere(end: Source | Sink, device: Device) -> bool:
    """True for an array in page-locked memory conveyor did not pin (memory/keep.py:
    ``locked_elsewhere``); an output also needs it writeable."""
    if not isinstance(end, ArraySource | ArraySink) or not end.array.flags.c_contiguous:
        return False
    written = isinstance(end, ArraySink)
    if written and not end.array.flags.writeable:
        return False
    return keep.locked_elsewhere(device, end.array, written=written)
