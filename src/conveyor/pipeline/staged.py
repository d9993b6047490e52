"""The staged paths: rows pass through rings of pinned buffers filled and emptied by the
staging threads (pipeline/staging.py), for pageable arrays, files and iterables.

The rings are deeper than the device ring (``STAGING_EXTRA``) so staging runs ahead of the
device (inputs) and behind it (outputs); they never hold more entries than there are blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from conveyor.backends.base import Device, Event, PinnedBuffer, Queue
from conveyor.memory.prefault import Faulted, Prefaulter
from conveyor.pipeline import staging
from conveyor.pipeline.halo import Boundary, HaloRows, Pads, fill_pads
from conveyor.pipeline.io import Source
from conveyor.pipeline.paths import Path, Records, Slot
from conveyor.pipeline.plan import STAGING_EXTRA, Block, BlockSource, Plan
from conveyor.pipeline.ring import Ring
from conveyor.pipeline.sinks import ArraySink, Sink
from conveyor.pipeline.stage import Stager, StageTask
from conveyor.pipeline.staging import Entry, StageAhead, StageBehind
from conveyor.trace.timeline import Span

#: Blocks of array outputs faulted in ahead of the stage-out (memory/prefault.py).
PREFAULT_AHEAD = 4


class StagingRings:
    """Makes the staged paths of one stream; what they share (the Stager's workers, the host
    spans, NVTX) is held here."""

    def __init__(self, device: Device, plan: Plan, sources: Sequence[Source],
                 sinks: Sequence[Sink], stager: Stager, spans: list[Span], nvtx: Any,
                 records: Records, blocks: BlockSource | None = None) -> None:
        self.device = device
        self.plan = plan
        self.blocks = blocks if blocks is not None else plan.blocks()  # the engine's blocks
        self.sources = sources
        self.sinks = sinks
        self.stager = stager
        self.spans = spans
        self.nvtx = nvtx
        self.records = records
        self.entries = max(min(plan.depth + STAGING_EXTRA, plan.block_count), 1)
        biggest = max((*plan.input_slot_bytes, *plan.output_slot_bytes))
        # Small blocks stage on the engine's thread: a hand-off costs more than the copy.
        self.inline = biggest < staging.THREAD_MIN_BYTES

    def inputs(self, indices: list[int], halo_rows: HaloRows | None,
               boundary: Boundary = "nearest") -> StagedIn:
        """The staged path of inputs ``indices``."""
        return StagedIn(self, indices, halo_rows, boundary)

    def outputs(self, indices: list[int]) -> StagedOut:
        """The staged path of outputs ``indices``."""
        return StagedOut(self, indices)

    def ring(self, sizes: Sequence[int]) -> Ring:
        """Pinned buffers for up to ``entries`` blocks: one entry now, and when the path
        starts what the pool holds idle, the rest grown beside the stream
        (pipeline/ring.py)."""
        return Ring(self.device.pinned_pool, sizes, self.entries)


class StagedIn(Path):
    """Inputs staged into a pinned ring ahead of the device (halo rows included)."""

    def __init__(self, rings: StagingRings, indices: list[int], halo_rows: HaloRows | None,
                 boundary: Boundary) -> None:
        plan = rings.plan
        sizes = [plan.input_slot_bytes[i] for i in indices]
        super().__init__(indices, sizes, rings.records)
        self.rings = rings
        self.plan = plan
        self.sources = [rings.sources[i] for i in indices]
        self.halo_rows = halo_rows
        h = plan.halo
        self.pads = [Pads(s, plan.rows, h, boundary) if h else None for s in self.sources]
        self.ring = rings.ring(sizes)
        self.ahead: StageAhead | None = None
        self.entry: Entry = []

    def start(self) -> None:
        rings = self.rings
        self.ahead = StageAhead(rings.stager, self.ring, rings.blocks, self._fill,
                                rings.spans, rings.nvtx, inline=rings.inline)
        self.ahead.start()
        self.ring.start(self.ahead.added)

    def take(self, slot: Slot, block: Block) -> None:
        assert self.ahead is not None
        self.entry = self.ahead.take(block.seq, block)

    def enqueue(self, queue: Queue, slot: Slot, block: Block, wait_for: Sequence[Event]
                ) -> list[Event]:
        nbytes = block.rows + 2 * self.plan.halo
        events = []
        for i, pin in zip(self.indices, self.entry, strict=True):
            assert pin is not None
            view = pin.array[: nbytes * self.plan.inputs[i].row_bytes]
            events.append(self._copy_in(queue, slot.dev_in[i], view, block, wait_for))
        return events

    def release(self, block: Block, events: Sequence[Event]) -> None:
        assert self.ahead is not None
        self.ahead.release(block.seq, events)

    def close(self) -> None:
        """Stop the staging thread; the ring goes back in ``give_back`` (after the queues)."""
        ahead, self.ahead = self.ahead, None  # it holds the bound _fill: drop the cycle
        try:
            self.ring.stop()
        finally:
            if ahead is not None:
                ahead.close()

    def give_back(self) -> None:
        """The ring's pinned buffers back to the pool."""
        self.ring.give_back()

    def _fill(self, block: Block, entry: Entry) -> list[StageTask]:
        """The copies that stage one block's inputs into a pinned entry (on StageAhead's
        thread; the few halo pad rows are copied right here)."""
        tasks: list[StageTask] = []
        h = self.plan.halo
        lo = max(block.start - h, 0)
        hi = min(block.stop + h, self.plan.rows)
        for i, source, pin, pads in zip(self.indices, self.sources, entry, self.pads,
                                        strict=True):
            assert pin is not None
            where = f"input {i} of block {block.index}"
            view = _view(pin, block.rows + 2 * h, source.shape[1:], source.dtype)
            pad = lo - (block.start - h)  # rows before the input's first row
            first, at = lo, pad  # input row ``first`` goes to slot row ``at``
            saved = self.halo_rows.before(i, block) if self.halo_rows is not None else None
            if saved is not None:  # in place: rows the block before writes back (pad is 0)
                tasks.append(StageTask(view[:h], saved, where, block.start - h))
                first, at = block.start, h
            end = at + hi - first
            tasks.append(StageTask(view[at:end], source.rows(first, hi), where, first))
            if pads is not None:
                fill_pads(view, pad, end, pads)
        return tasks


class StagedOut(Path):
    """Outputs copied out into a pinned ring and staged into the sinks behind the device."""

    def __init__(self, rings: StagingRings, indices: list[int]) -> None:
        plan = rings.plan
        sizes = [plan.output_slot_bytes[i] for i in indices]
        super().__init__(indices, sizes, rings.records)
        self.rings = rings
        self.sinks = [rings.sinks[i] for i in indices]
        self.ring = rings.ring(sizes)
        self.behind: StageBehind | None = None
        self.entry: Entry = []
        # Array outputs are faulted in a few blocks ahead of the stage-out (a fresh
        # np.empty_like output would otherwise take its page faults on the staging workers).
        self.faulting = [(i, s) for i, s in zip(indices, self.sinks, strict=True)
                         if isinstance(s, ArraySink) and s.array.flags.c_contiguous]
        self.prefaulter: Prefaulter | None = None

    def start(self) -> None:
        rings = self.rings
        self.behind = StageBehind(rings.stager, self.ring, rings.spans, rings.nvtx,
                                  inline=rings.inline)
        if self.faulting and not rings.inline:
            prefaulter = Prefaulter()
            if prefaulter.enabled:
                self.prefaulter = prefaulter
                # The engine's own first blocks (on several devices, only this engine
                # writes them: the touch fallback must not race another's stage-out).
                for seq in range(PREFAULT_AHEAD):
                    block = rings.blocks.get(seq)
                    if block is None:
                        break
                    self._prefault(block)
            else:
                prefaulter.close()
        self.behind.start()
        self.ring.start(self.behind.added)

    def _prefault(self, block: Block) -> None:
        assert self.prefaulter is not None
        parts = [self.rings.plan.output_rows(i, block) for i, _ in self.faulting]
        self.prefaulter.submit(block.seq, [
            np.asarray(sink.rows(lo, hi)) for (_, sink), (lo, hi) in
            zip(self.faulting, parts, strict=True)])

    def take(self, slot: Slot, block: Block) -> None:
        assert self.behind is not None
        self.entry = self.behind.entry(block.seq)

    def enqueue(self, queue: Queue, slot: Slot, block: Block, wait_for: Sequence[Event]
                ) -> list[Event]:
        events = []
        for i, sink, pin in zip(self.indices, self.sinks, self.entry, strict=True):
            assert pin is not None
            lo, hi = self.rings.plan.output_rows(i, block)
            dst = _view(pin, hi - lo, sink.shape[1:], sink.dtype)
            events.append(self._copy_out(queue, dst, slot.dev_out[i], block, wait_for))
        return events

    def release(self, block: Block, events: Sequence[Event]) -> None:
        """Stage the block out of its entry once ``events`` (every copy of its slot) end."""
        assert self.behind is not None
        tasks = []
        for i, sink, pin in zip(self.indices, self.sinks, self.entry, strict=True):
            assert pin is not None
            lo, hi = self.rings.plan.output_rows(i, block)
            view = _view(pin, hi - lo, sink.shape[1:], sink.dtype)
            tasks.append(StageTask(sink.rows(lo, hi), view,
                                   f"output {i} of block {block.index}", lo))
        waits = list(events)
        if self.prefaulter is not None:
            waits.append(Faulted(self.prefaulter, block.seq))  # type: ignore[arg-type]
            ahead = self.rings.blocks.get(block.seq + PREFAULT_AHEAD)
            if ahead is not None:
                self._prefault(ahead)
        self.behind.submit(block.seq, block, waits, tasks)

    def finish(self) -> None:
        assert self.behind is not None
        self.behind.drain()

    def close(self) -> None:
        behind, self.behind = self.behind, None
        try:
            self.ring.stop()
            if behind is not None:
                behind.close()
        finally:
            prefaulter, self.prefaulter = self.prefaulter, None
            if prefaulter is not None:  # after the thread that waits on it
                prefaulter.close()

    def give_back(self) -> None:
        """The ring's pinned buffers back to the pool."""
        self.ring.give_back()


def _view(block: PinnedBuffer, rows: int, row_shape: tuple[int, ...], dtype: np.dtype
          ) -> np.ndarray:
    count = rows * int(np.prod(row_shape, dtype=np.int64))
    return block.array[: count * dtype.itemsize].view(dtype).reshape((rows, *row_shape))
