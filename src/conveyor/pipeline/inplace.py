"""Input blocks page-locked where they are, instead of copied into pinned staging.

The host has two ways to make a pageable block copyable by the DMA engines: copy it into pinned
memory (memory bandwidth, which the DMA engines share) or page-lock it in place
(``cuMemHostRegister``: page-table work on one core, about 31 GB/s to lock and 47 GB/s to
unlock on the H100 machine, and the driver serialises it). Neither alone keeps up with the
link; together they can (bench/NOTES.md). ``StageAhead`` runs a second thread that places
blocks this way while its first stages others, each thread claiming the next block when it is
free, so each path takes the share of blocks its speed earns.

Only whole pages are locked: two blocks that share a page could not both be registered. The
partial pages at a block's two ends (under a page each) are copied into a small pinned edge
buffer instead.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence

import numpy as np

from conveyor.backends.base import Device, PinnedBuffer, Registration
from conveyor.pipeline.plan import Block

PAGE = mmap.PAGESIZE

#: Off by default: measured on the H100 (bench/inplace_ab.py, bench/NOTES.md), placing blocks
#: beside staging lowered pageable vadd from 25.8 to 21.1 GB/s: registration holds the driver
#: while the engine's thread enqueues. Kept, tested, for drivers and hosts where it pays.
ENABLED = False


def supported(device: Device) -> bool:
    """True where ``register_host`` page-locks memory in place (CUDA). OpenCL's registration
    wraps the array in a buffer that the driver may copy through, which saves nothing."""
    return device.backend == "cuda"


def lockable(array: np.ndarray) -> bool:
    """True for a C-contiguous array in anonymous memory (a memmap's file pages may not lock,
    and a refused block would fall back to the driver's slow pageable copy)."""
    if not array.flags.c_contiguous:
        return False
    base: object = array
    while base is not None:
        if isinstance(base, (np.memmap, mmap.mmap)):
            return False
        base = getattr(base, "base", None)
    return True

#: Per input of a placed block: (byte offset in the device buffer, host bytes to copy there).
Pieces = list[tuple[int, np.ndarray]]


class Placed:
    """One block's inputs, ready to copy: the pieces of each input (None for inputs the device
    copies from directly) and the registrations to undo once those copies are done."""

    def __init__(self, block: Block, pieces: list[Pieces | None],
                 registrations: list[Registration]) -> None:
        self.block = block
        self.pieces = pieces
        self.registrations = registrations

    def close(self) -> None:
        """Unlock the pages (only after every copy that reads them has completed)."""
        registrations, self.registrations = self.registrations, []
        for registration in registrations:
            registration.close()


class InPlace:
    """Places blocks of ``arrays`` (C-contiguous pageable arrays; None for inputs copied
    directly) on ``device``. ``edge_bytes()`` is the size of the pinned edge buffer that each
    block in flight needs."""

    def __init__(self, device: Device, arrays: Sequence[np.ndarray | None],
                 row_bytes: Sequence[int]) -> None:
        self.device = device
        self.flat = [None if a is None else a.reshape(-1).view(np.uint8) for a in arrays]
        self.row_bytes = list(row_bytes)
        #: Set when the driver would not lock some pages: later blocks are staged instead.
        self.refused = ""

    def edge_bytes(self) -> int:
        """Pinned bytes one placed block needs for its inputs' partial end pages."""
        return max(2 * PAGE * sum(1 for f in self.flat if f is not None), 1)

    def place(self, block: Block, edge: PinnedBuffer) -> Placed:
        """Lock block ``block``'s whole pages in place and copy its partial end pages into
        ``edge``; return what to copy from where."""
        pieces: list[Pieces | None] = []
        registrations: list[Registration] = []
        used = 0
        try:
            for flat, row_bytes in zip(self.flat, self.row_bytes, strict=True):
                if flat is None:
                    pieces.append(None)
                    continue
                data = flat[block.start * row_bytes : block.stop * row_bytes]
                address = data.__array_interface__["data"][0]
                head = min(-address % PAGE, data.nbytes)
                body = (data.nbytes - head) // PAGE * PAGE
                parts: Pieces = []
                for offset, length in ((0, head), (head + body, data.nbytes - head - body)):
                    if length:
                        staged = edge.array[used : used + length]
                        np.copyto(staged, data[offset : offset + length])
                        used += length
                        parts.append((offset, staged))
                if body:
                    interior = data[head : head + body]
                    registration = self.device.register_host(interior)
                    registrations.append(registration)
                    if not getattr(registration, "page_locked", True):
                        self.refused = getattr(registration, "reason", "refused")
                    parts.append((head, interior))
                pieces.append(parts)
        except BaseException:
            Placed(block, pieces, registrations).close()
            raise
        return Placed(block, pieces, registrations)
