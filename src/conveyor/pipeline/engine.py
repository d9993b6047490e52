"""The engine: a ring of slots whose copy-in, compute and copy-out overlap.

One block's journey (see DESIGN.md): the caller's rows are staged into the slot's pinned buffer
by host workers (skipped when the input is already pinned), copied in on the copy-in queue,
computed on the compute queue, copied out on the copy-out queue into pinned memory (or straight
into a pinned output), and staged out into the caller's array. Each stage waits only on the
events of the stage before it, in the same slot; the host waits only for a slot to come free
and at the end. On host-unified devices the copies vanish: blocks are used in place.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from conveyor import hazards
from conveyor.backends.base import (
    Closeable,
    Device,
    DeviceBuffer,
    Event,
    Kernel,
    PinnedBuffer,
    Registration,
)
from conveyor.backends.base import Queue as BaseQueue
from conveyor.memory import pinned
from conveyor.pipeline import inplace as placing
from conveyor.pipeline import reduce as reducing
from conveyor.pipeline import staging
from conveyor.pipeline.halo import HaloRows
from conveyor.pipeline.inplace import InPlace, Placed
from conveyor.pipeline.io import ArraySource, Source
from conveyor.pipeline.plan import Block, Plan
from conveyor.pipeline.progress import Progress
from conveyor.pipeline.report import Report
from conveyor.pipeline.sinks import ArraySink, Sink
from conveyor.pipeline.stage import Stager, StageTask, copy_rows
from conveyor.pipeline.staging import Entry, StageAhead, StageBehind
from conveyor.trace import nvtx as trace_nvtx
from conveyor.trace.clock import ClockAnchor
from conveyor.trace.timeline import Between, Span, Timeline

Compute = Kernel | Callable[..., Any]

#: Pinned staging entries beyond the device ring's depth: how far staging may run ahead of
#: the device (inputs) and behind it (outputs).
STAGING_EXTRA = 2


class Slot:
    """One block's device buffers (every input and output, the reduction's scratch) and what
    is in flight in it. Pinned staging lives in rings of its own (pipeline/staging.py)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.dev_in: list[DeviceBuffer | None] = []
        self.dev_out: list[DeviceBuffer | None] = []
        self.dev_red: DeviceBuffer | None = None
        self.dev_partial: DeviceBuffer | None = None
        self.dev_has: DeviceBuffer | None = None
        self.pin_partial: PinnedBuffer | None = None
        self.pin_has: PinnedBuffer | None = None
        self.block: Block | None = None
        self.done: list[Event] = []
        self.registrations: list[Registration] = []
        self.partial: Any = None


def _view(block: PinnedBuffer, rows: int, row_shape: tuple[int, ...], dtype: np.dtype
          ) -> np.ndarray:
    count = rows * int(np.prod(row_shape, dtype=np.int64))
    return block.array[: count * dtype.itemsize].view(dtype).reshape((rows, *row_shape))


class Engine(Closeable):
    """Runs one stream. Build it, call ``run()`` once; it cleans up after itself."""

    def __init__(
        self,
        device: Device,
        plan: Plan,
        compute: Compute,
        inputs: Sequence[np.ndarray | Source],
        outputs: Sequence[np.ndarray | Sink],
        *,
        args: Sequence[Any],
        reduce: str | Callable[[Any, Any], Any] | None,
        reduce_dtype: np.dtype | None,
        zero_copy: bool,
        workers: int | None,
        progress: bool,
        strict: bool = False,
        in_place: frozenset[int] = frozenset(),
        first_row: int = 0,
    ) -> None:
        self.device = device
        # Row of the whole array that row 0 of these inputs is (cv.stream's first_row): kernels
        # and callables see offsets in the whole array when a stream runs over one part of it.
        self.first_row = first_row
        self.strict = strict  # hot-path hazards raise (True) or warn once (conveyor/hazards.py)
        self.clock: ClockAnchor | None = None
        self.nvtx = trace_nvtx.annotator(device.backend)  # None unless CUDA and nvtx
        self.plan = plan
        self.compute = compute
        # Sources and sinks (pipeline/io.py): rows come from and go to arrays or files. The
        # zero-copy and pinned-direct paths use the arrays of ArraySource/ArraySink.
        self.sources = [a if isinstance(a, Source) else ArraySource(a) for a in inputs]
        self.sinks = [a if isinstance(a, Sink) else ArraySink(a) for a in outputs]
        self.inputs = [s.array if isinstance(s, ArraySource) else None for s in self.sources]
        self.outputs = [s.array if isinstance(s, ArraySink) else None for s in self.sinks]
        self.args = tuple(args)
        self.reduce = reduce
        self.reduce_dtype = reduce_dtype
        self.zero_copy = zero_copy
        self.in_place = in_place  # inputs that are also outputs (pipeline/overlap.py)
        self.halo_rows: HaloRows | None = None  # pad and saved halo rows (pipeline/halo.py)
        self.stager = Stager(workers)
        self.progress = Progress(progress, plan)
        self.direct_in = [self._direct(a) for a in self.inputs]
        self.direct_out = [self._direct(a) for a in self.outputs]
        # The caller's pinned arrays need no pinned.record_use fence: the engine finishes every
        # queue before it returns, on failure too. Per-array constants are looked up once: the
        # per-block path runs thousands of times.
        self.in_row_bytes = [spec.row_bytes for spec in plan.inputs]
        self.row_items = plan.inputs[0].row_items
        self.slots: list[Slot] = []
        # Pinned staging rings, deeper than the device ring so staging runs ahead (and behind)
        # of the device; empty when nothing needs staging.
        self.ring_in: list[Entry] = []
        self.ring_out: list[Entry] = []
        self.ahead: StageAhead | None = None
        self.inplace: InPlace | None = None  # page-locks input blocks in place (CUDA)
        self.edges: list[PinnedBuffer] = []  # pinned end pages of placed blocks
        self.behind: StageBehind | None = None
        self.queues: list[BaseQueue] = []
        self.records: list[tuple[str, int, Event | Between, int]] = []
        self.host_spans: list[Span] = []
        self.partials: list[Any] = []
        self.peak_device_bytes = 0
        self.reduce_kernel: Kernel | None = None
        #: Partials per block of the built-in reduction (work items of its kernel).
        self.parts = reducing.partials_for(plan.block_rows * plan.inputs[0].row_items)

    # -- set-up ---------------------------------------------------------------------------
    def _direct(self, array: np.ndarray | None) -> bool:
        """True when the device can copy this array without staging (never for files)."""
        if array is None:
            return False
        return pinned.is_pinned(array, self.device) and array.flags.c_contiguous

    def _build(self) -> None:
        """Everything that allocates or compiles, before the first block."""
        dev = self.device
        if self.reduce_dtype is not None:
            source, name = reducing.kernel_source(dev.backend, self.reduce_dtype, str(self.reduce))
            self.reduce_kernel = dev.compile(source, name)
        self.copy_in_q = dev.create_queue()
        self.queues.append(self.copy_in_q)
        self.compute_q = dev.create_queue()
        self.queues.append(self.compute_q)
        self.copy_out_q = dev.create_queue()
        self.queues.append(self.copy_out_q)
        pin_pool = dev.pinned_pool
        plan = self.plan
        for index in range(plan.depth):
            slot = Slot(index)
            self.slots.append(slot)
            if not self.zero_copy:
                for nbytes in plan.input_slot_bytes:
                    slot.dev_in.append(self._acquire(nbytes))
                for nbytes in plan.output_slot_bytes:
                    slot.dev_out.append(self._acquire(nbytes))
            if self.reduce_dtype is not None:
                acc = reducing.partial_dtype(self.reduce_dtype, str(self.reduce))
                # The kernel writes one value per element (n = rows * row_items), not per row.
                slot.dev_red = self._acquire(plan.block_rows * plan.scratch_row_bytes)
                slot.dev_partial = self._acquire(self.parts * acc.itemsize)
                slot.dev_has = self._acquire(self.parts)
                slot.pin_partial = pin_pool.acquire(self.parts * acc.itemsize)
                slot.pin_has = pin_pool.acquire(self.parts)
        if not self.zero_copy:
            entries = max(min(plan.depth + STAGING_EXTRA, plan.block_count), 1)
            if not all(self.direct_in):
                self._fill_ring(self.ring_in, entries, self.direct_in, plan.input_slot_bytes)
            if not all(self.direct_out):
                self._fill_ring(self.ring_out, entries, self.direct_out, plan.output_slot_bytes)
            self.inplace = self._inplace()
            if self.inplace is not None:
                for _ in range(entries):
                    self.edges.append(pin_pool.acquire(self.inplace.edge_bytes()))
            if plan.halo and (any(self.direct_in) or self.in_place):
                self.halo_rows = HaloRows(dev, plan, self.sources, self.direct_in,
                                          self.in_place)

    def _inplace(self) -> InPlace | None:
        """Page-locking in place, where it can work: a CUDA device (OpenCL has no in-place
        page-locking), threaded staging, no halo, and every staged input an ordinary
        C-contiguous array in anonymous memory (not a file, not a memmap)."""
        plan = self.plan
        if (not placing.ENABLED or not placing.supported(self.device) or plan.halo
                or not self.ring_in
                or max((*plan.input_slot_bytes, *plan.output_slot_bytes))
                < staging.THREAD_MIN_BYTES):
            return None
        arrays: list[np.ndarray | None] = []
        for array, direct in zip(self.inputs, self.direct_in, strict=True):
            if direct:
                arrays.append(None)
            elif array is None or not placing.lockable(array):
                return None
            else:
                arrays.append(array)
        return InPlace(self.device, arrays, self.in_row_bytes)

    def _fill_ring(self, ring: list[Entry], entries: int, direct: list[bool],
                   sizes: tuple[int, ...]) -> None:
        """Pinned staging buffers for ``entries`` blocks, appended one by one so that a failed
        allocation leaves every earlier one where ``_release`` finds it."""
        for _ in range(entries):
            entry: Entry = []
            ring.append(entry)
            for is_direct, nbytes in zip(direct, sizes, strict=True):
                entry.append(None if is_direct else self.device.pinned_pool.acquire(nbytes))

    def _acquire(self, nbytes: int) -> DeviceBuffer:
        block = self.device.memory_pool.acquire(max(nbytes, 1))
        self.peak_device_bytes += block.nbytes
        return block

    # -- the run ----------------------------------------------------------------------------
    def run(self) -> Report:
        """Stream every block; return the report. Cleans up on success and on failure."""
        started = time.perf_counter()
        try:
            self._build()
            # One marker timed by host and device puts device spans on the host clock; taken
            # while the queues are idle, before the first block (trace/clock.py).
            self.clock = ClockAnchor.take(self.compute_q)
            with hazards.hot_path(self.device, strict=self.strict):
                self._loop()
            for queue in self.queues:
                queue.finish()
        except BaseException:
            self._abort()
            raise
        finally:
            # Join the staging threads first: no worker may still copy into a pinned buffer
            # once it is back in the pool (an interrupt can land inside Stager.run). An
            # interrupt during a join is raised by close() only after the threads have
            # finished, and the buffers must go back even then.
            try:
                self._close_staging()
            finally:
                try:
                    self._release()
                finally:
                    self.progress.close()
        seconds = time.perf_counter() - started
        return self._report(seconds)

    def _loop(self) -> None:
        plan = self.plan
        blocks = plan.blocks()
        biggest = max((*plan.input_slot_bytes, *plan.output_slot_bytes))
        inline = biggest < staging.THREAD_MIN_BYTES
        if self.ring_in:
            self.ahead = StageAhead(self.stager, self.ring_in, blocks, self._fill,
                                    self.host_spans, self.nvtx, inline=inline,
                                    inplace=self.inplace, edges=self.edges)
            self.ahead.start()
        if self.ring_out:
            self.behind = StageBehind(self.stager, self.ring_out, self.host_spans, self.nvtx,
                                      inline=inline)
            self.behind.start()
        no_in: Entry = [None] * len(self.sources)
        no_out: Entry = [None] * len(self.sinks)
        for block in blocks:
            slot = self.slots[block.index % plan.depth]
            if slot.block is not None:
                self._retire(slot)
            pin_in = self.ahead.take(block.index) if self.ahead is not None else no_in
            pin_out = self.behind.entry(block.index) if self.behind is not None else no_out
            in_events = self._issue(slot, block, pin_in, pin_out)
            if self.ahead is not None:
                self.ahead.release(block.index, in_events)
            if self.behind is not None:
                self.behind.submit(block.index, block, slot.done,
                                   self._stage_out_tasks(block, pin_out))
        for index in range(plan.block_count, plan.block_count + plan.depth):
            slot = self.slots[index % plan.depth]  # in block order: partials combine in order
            if slot.block is not None:
                self._retire(slot)
        if self.behind is not None:
            self.behind.drain()

    def _close_staging(self) -> None:
        """Stop and join the staging threads, then the workers they use."""
        try:
            if self.ahead is not None:
                self.ahead.close()
        finally:
            try:
                if self.behind is not None:
                    self.behind.close()
            finally:
                self._drop_staging_threads()

    def _drop_staging_threads(self) -> None:
        # StageAhead holds the engine's bound _fill: drop the cycle so that the caller's arrays
        # (pinned ones hold pool blocks) are freed as soon as the stream returns.
        self.ahead = self.behind = None
        self.stager.close()

    def _retire(self, slot: Slot) -> None:
        """Wait for the slot's block to leave the device, so its buffers can take the next."""
        block = slot.block
        assert block is not None
        if self.nvtx is not None:
            self.nvtx.push(f"host-wait {block.index}", "host-wait")
        start = time.perf_counter_ns()
        try:
            for event in slot.done:
                event.wait()
        finally:
            if self.nvtx is not None:
                self.nvtx.pop()
        self.host_spans.append(Span("host-wait", block.index, start, time.perf_counter_ns()))
        for registration in slot.registrations:
            registration.close()
        slot.registrations = []
        self._collect_partial(slot, block)
        slot.block = None
        slot.done = []
        self.progress.advance(block)

    def _stage_out_tasks(self, block: Block, pin_out: Entry) -> list[StageTask]:
        """The copies of one block's results from its pinned entry into the outputs."""
        tasks: list[StageTask] = []
        for i, sink in enumerate(self.sinks):
            pin = pin_out[i]
            if pin is not None:
                view = _view(pin, block.rows, sink.shape[1:], sink.dtype)
                tasks.append(StageTask(sink.rows(block.start, block.stop), view,
                                       f"output {i} of block {block.index}"))
        return tasks

    def _collect_partial(self, slot: Slot, block: Block) -> None:
        if self.reduce is None:
            return
        if self.reduce_dtype is None:
            self.partials.append(slot.partial)
            slot.partial = None
            return
        start = time.perf_counter_ns()
        assert slot.pin_partial is not None and slot.pin_has is not None
        acc = reducing.partial_dtype(self.reduce_dtype, str(self.reduce))
        values = slot.pin_partial.array[: self.parts * acc.itemsize].view(acc)
        has = slot.pin_has.array[: self.parts]
        self.partials.append(reducing.fold_partials(str(self.reduce), values, has))
        self.host_spans.append(Span("combine", block.index, start, time.perf_counter_ns()))

    # -- issuing ----------------------------------------------------------------------------
    def _fill(self, block: Block, pin_in: Entry) -> list[StageTask]:
        """The copies that stage one block's inputs into a pinned entry (on StageAhead's
        thread; the few halo pad rows are copied right here)."""
        tasks: list[StageTask] = []
        h = self.plan.halo
        for i, source in enumerate(self.sources):
            pin = pin_in[i]
            if pin is None:
                continue
            where = f"input {i} of block {block.index}"
            view = _view(pin, block.rows + 2 * h, source.shape[1:], source.dtype)
            lo, hi, before = self._halo_range(block)
            saved = self.halo_rows.before(i, block) if self.halo_rows is not None else None
            if saved is not None:  # in place: rows the block before writes back (before is 0)
                tasks.append(StageTask(view[:h], saved, where))
                lo = block.start
            start = h if saved is not None else before  # the slot row that row lo goes to
            tasks.append(StageTask(view[start : start + hi - lo], source.rows(lo, hi), where))
            end = start + hi - lo
            # Pad rows repeat the edge row: copied once, then repeated within the slot.
            if before:
                copy_rows(view[before - 1 : before], source.rows(0, 1))
                np.copyto(view[: before - 1], view[before - 1 : before])
            if end < len(view):
                last = self.plan.rows - 1
                copy_rows(view[end : end + 1], source.rows(last, last + 1))
                np.copyto(view[end + 1 :], view[end : end + 1])
        return tasks

    def _halo_range(self, block: Block) -> tuple[int, int, int]:
        """Rows [lo, hi) of the source that the block's input slot holds, and the pad rows
        before them (rows past either end repeat the edge row)."""
        h = self.plan.halo
        lo = max(block.start - h, 0)
        hi = min(block.stop + h, self.plan.rows)
        return lo, hi, lo - (block.start - h)

    def _issue(self, slot: Slot, block: Block, pin_in: Entry | Placed, pin_out: Entry
               ) -> list[Event]:
        """Enqueue one block's copy-in, compute and copy-out; return the copy-in events."""
        slot.block = block
        if self.zero_copy:
            in_events: list[Event] = []
            in_bufs: list[Any] = []
            for src in self.inputs:
                assert src is not None  # stream() allows zero-copy for arrays only
                registration = self.device.register_host(src[block.start : block.stop])
                slot.registrations.append(registration)
                in_bufs.append(registration)
            out_bufs: list[Any] = []
            for out in self.outputs:
                assert out is not None
                registration = self.device.register_host(out[block.start : block.stop])
                slot.registrations.append(registration)
                out_bufs.append(registration)
        else:
            in_events = self._copy_in(slot, block, pin_in)
            in_bufs = list(slot.dev_in)
            out_bufs = list(slot.dev_out)
        compute_event = self._compute(slot, block, in_events, in_bufs, out_bufs)
        slot.done = self._copy_out(slot, block, compute_event, out_bufs, pin_out)
        for queue in self.queues:
            queue.flush()
        return in_events

    def _copy_in(self, slot: Slot, block: Block, pin_in: Entry | Placed) -> list[Event]:
        events: list[Event] = []
        if isinstance(pin_in, Placed):
            return self._copy_in_placed(slot, block, pin_in)
        h = self.plan.halo
        rows_in_slot = block.rows + 2 * h
        for i, src in enumerate(self.inputs):
            dev = slot.dev_in[i]
            assert dev is not None
            row_bytes = self.in_row_bytes[i]
            pin = pin_in[i]
            if pin is not None:
                view = pin.array[: rows_in_slot * row_bytes]
                event = self.copy_in_q.copy_in(dev, view)
                events.append(event)
                self.records.append(("copy-in", block.index, event, view.nbytes))
                continue
            assert src is not None  # only pinned arrays are copied from directly
            if h:
                assert self.halo_rows is not None  # made in _build for pinned inputs with halo
                pieces = self.halo_rows.direct_pieces(i, src, block, row_bytes)
            else:
                pieces = [(0, src[block.start : block.stop])]
            for offset, part in pieces:
                event = self.copy_in_q.copy_in(dev, part, dst_offset=offset)
                events.append(event)
                self.records.append(("copy-in", block.index, event, part.nbytes))
        return events

    def _copy_in_placed(self, slot: Slot, block: Block, placed: Placed) -> list[Event]:
        """Copy-in of a block page-locked in place: its whole pages straight from the
        caller's array, its partial end pages from the edge buffer."""
        events: list[Event] = []
        for i, src in enumerate(self.inputs):
            dev = slot.dev_in[i]
            assert dev is not None and src is not None
            parts = placed.pieces[i]
            if parts is None:  # pinned already: copied from directly
                parts = [(0, src[block.start : block.stop])]
            for offset, part in parts:
                event = self.copy_in_q.copy_in(dev, part, dst_offset=offset)
                events.append(event)
                self.records.append(("copy-in", block.index, event, part.nbytes))
        return events

    def _compute(self, slot: Slot, block: Block, in_events: list[Event],
                 in_bufs: list[Any], out_bufs: list[Any]) -> Event:
        offset = (self.first_row + block.start) * self.row_items
        n = block.rows * self.row_items
        if isinstance(self.compute, Kernel):
            buffers = in_bufs + (out_bufs if self.reduce_dtype is None else [slot.dev_red])
            # Modulo 2**64: a negative first_row (margin rows before the whole array's row 0)
            # wraps as the kernel's unsigned arithmetic expects, so offset + i is still right.
            args = [*buffers, *self.args, np.uint64(offset % (1 << 64)), np.uint64(n)]
            event = self.compute_q.launch(self.compute, n, args, wait_for=in_events)
            timed: Event | Between = event
        else:
            # Markers before and after the call: the span between them is the work the
            # callable enqueued on the compute queue (trace/timeline.py: Between).
            before = self.compute_q.marker(wait_for=in_events)
            arrays = [self._device_array(buf, spec.shape[1:], spec.dtype,
                                         block.rows + 2 * self.plan.halo)
                      for buf, spec in zip(in_bufs, self.plan.inputs, strict=True)]
            arrays += [self._device_array(buf, spec.shape[1:], spec.dtype, block.rows)
                       for buf, spec in zip(out_bufs, self.plan.outputs, strict=True)]
            # args= follow the arrays, as they follow the buffers of a kernel.
            result = self.compute(*arrays, *self.args, queue=self.compute_q.native,
                                  offset=offset, n=n)
            if self.reduce is not None:
                slot.partial = _to_host(result)
            event = self.compute_q.marker()
            timed = Between(before, event)
        self.records.append(("compute", block.index, timed, 0))
        if self.reduce_kernel is not None:
            event = self.compute_q.launch(
                self.reduce_kernel, self.parts,
                [slot.dev_red, slot.dev_partial, slot.dev_has, np.uint64(n),
                 np.uint64(self.parts)],
                wait_for=[event],
            )
            self.records.append(("compute", block.index, event, 0))
        return event

    def _device_array(self, buf: Any, row_shape: tuple[int, ...], dtype: np.dtype,
                      rows: int) -> Any:
        return self.device.device_array(buf, (rows, *row_shape), dtype, self.compute_q)

    def _copy_out(self, slot: Slot, block: Block, compute_event: Event,
                  out_bufs: list[Any], pin_out: Entry) -> list[Event]:
        events: list[Event] = []
        if self.zero_copy:
            for registration in out_bufs:
                events.append(self.compute_q.sync_host(registration, wait_for=[compute_event]))
        else:
            for i, out in enumerate(self.outputs):
                dev = slot.dev_out[i]
                assert dev is not None
                pin = pin_out[i]
                if pin is None:
                    assert out is not None  # only pinned arrays are copied into directly
                    dst = out[block.start : block.stop]
                else:
                    sink = self.sinks[i]
                    dst = _view(pin, block.rows, sink.shape[1:], sink.dtype)
                event = self.copy_out_q.copy_out(dst, dev, wait_for=[compute_event])
                events.append(event)
                self.records.append(("copy-out", block.index, event, dst.nbytes))
        if self.reduce_kernel is not None:
            assert slot.pin_partial is not None and slot.pin_has is not None
            assert slot.dev_partial is not None and slot.dev_has is not None
            acc = reducing.partial_dtype(self.reduce_dtype or np.dtype(np.float32),
                                         str(self.reduce))
            nbytes = self.parts * acc.itemsize
            for dst, src in ((slot.pin_partial.array[:nbytes], slot.dev_partial),
                             (slot.pin_has.array[: self.parts], slot.dev_has)):
                event = self.copy_out_q.copy_out(dst, src, wait_for=[compute_event])
                events.append(event)
                self.records.append(("copy-out", block.index, event, dst.nbytes))
        if not events:
            events.append(compute_event)
        return events

    # -- clean-up ---------------------------------------------------------------------------
    def _abort(self) -> None:
        """After a failure: stop issuing and let everything in flight finish."""
        for queue in self.queues:
            try:
                queue.finish()
            except Exception:  # the original error is the one to raise
                pass

    def _release(self) -> None:
        """Return every slot buffer to its pool, fenced by the slot's last events."""
        pool, pin_pool = self.device.memory_pool, self.device.pinned_pool
        for slot in self.slots:
            fence = slot.done[-1] if slot.done else None
            for registration in slot.registrations:
                registration.close()
            for buf in (*slot.dev_in, *slot.dev_out, slot.dev_red, slot.dev_partial,
                        slot.dev_has):
                if buf is not None:
                    pool.release(buf, after=fence)
            for pin in (slot.pin_partial, slot.pin_has):
                if pin is not None:
                    pin_pool.release(pin, after=fence)
        # Every queue has finished (run() or _abort()), so no copy still reads the rings.
        entries: list[list[PinnedBuffer | None]] = [*self.ring_in, *self.ring_out, [*self.edges]]
        for entry in entries:
            for pin in entry:
                if pin is not None:
                    pin_pool.release(pin)
        if self.halo_rows is not None:
            self.halo_rows.close()
            self.halo_rows = None
        self.slots, self.ring_in, self.ring_out, self.edges = [], [], [], []
        # The stream is over: keep only the pools' keep budget of idle blocks (memory/pool.py),
        # so streams of changing lengths do not pile up size classes.
        pool.settle()
        pin_pool.settle()
        for queue in self.queues:
            try:
                queue.close()
            except Exception:  # closing after a device failure must not mask it
                pass
        self.queues = []

    def _report(self, seconds: float) -> Report:
        host_spans, records, clock = self.host_spans, self.records, self.clock
        self.host_spans, self.records = [], []

        def timeline() -> Timeline:
            return Timeline.from_records(records, host_spans, clock)

        return Report(
            device=self.device.spec,
            seconds=seconds,
            bytes_in=sum(s.nbytes for s in self.sources),
            bytes_out=sum(s.nbytes for s in self.sinks),
            blocks=self.plan.block_count,
            block_rows=self.plan.block_rows,
            depth=self.plan.depth,
            peak_device_bytes=self.peak_device_bytes,
            zero_copy=self.zero_copy,
            result=reducing.combine(self.reduce, self.partials,
                                    self.reduce_dtype or self.plan.inputs[0].dtype,
                                    kernel=self.reduce_dtype is not None)
            if self.reduce else None,
            outputs=[s.result for s in self.sinks],
            device_name=self.device.name,
            timeline_source=timeline,
        )


def _to_host(value: Any) -> Any:
    """A callable's partial as a host value (syncs on the device array if it is one)."""
    if hasattr(value, "get"):
        return value.get()
    if hasattr(value, "cpu"):
        return value.cpu().numpy()
    return value
