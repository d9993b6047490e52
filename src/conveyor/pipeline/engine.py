"""The engine: a ring of slots whose copy-in, compute and copy-out overlap, on one device.

One block's journey (see DESIGN.md): each input travels on the path chosen for it before the
first block (pipeline/paths.py: staged through a pinned ring, direct from pinned memory, or
zero-copy), the compute step runs (a kernel or a callable, pipeline/step.py), a reduction
folds its values (pipeline/reduce.py), and each output travels back on its own path. Each
stage waits only on the events of the stage before it, in the same slot; the host waits only
for a slot to come free and at the end. The loop below never tests a mode: the paths, the step
and the reduction were all chosen once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from conveyor import hazards, interrupts
from conveyor.backends.base import Device, DeviceBuffer, Event, Queue
from conveyor.closing import Closeable
from conveyor.errors import note_outputs_written
from conveyor.interrupts import deferred_sigint
from conveyor.memory import pinned
from conveyor.pipeline import paths, step, switching
from conveyor.pipeline.io import ArraySource, Source
from conveyor.pipeline.options import StreamOptions
from conveyor.pipeline.paths import Path, Records, Slot
from conveyor.pipeline.plan import BlockSource, Plan
from conveyor.pipeline.progress import Progress
from conveyor.pipeline.reduce import Reduction
from conveyor.pipeline.report import Report
from conveyor.pipeline.resident import ResidentArgs
from conveyor.pipeline.sinks import ArraySink, Sink
from conveyor.pipeline.stage import Stager
from conveyor.pipeline.staged import StagingRings
from conveyor.trace import nvtx as trace_nvtx
from conveyor.trace import timeline as trace_timeline
from conveyor.trace.clock import ClockAnchor
from conveyor.trace.timeline import Span, Timeline

Compute = step.Compute


class Engine(Closeable):
    """Runs one stream on one device. Build it, call ``run()`` once; it cleans up after
    itself.

    ``blocks`` is where it takes its blocks from (default: every block of the plan, in
    order); several engines share one supply of blocks (pipeline/multi.py), and then also
    one ``progress`` bar and a ``started`` hook, called once the engine is built, before its
    first block."""

    def __init__(self, device: Device, plan: Plan, compute: Compute,
                 sources: Sequence[np.ndarray | Source], sinks: Sequence[np.ndarray | Sink],
                 options: StreamOptions, *, reduction: Reduction | None = None,
                 in_place: frozenset[int] = frozenset(),
                 residents: ResidentArgs | None = None, blocks: BlockSource | None = None,
                 progress: Progress | None = None,
                 started: Callable[[], None] | None = None) -> None:
        self.device = device
        self.plan = plan
        self.blocks = blocks if blocks is not None else plan.blocks()
        self.started = started
        self.blocks_done = 0  # blocks this engine issued (several devices: its share)
        self.looped = False  # set up whole, it began issuing blocks
        self.finished_at = 0.0  # perf_counter when its last block had left the device
        self.compute = compute
        self.options = options
        self.reduction = reduction
        self.in_place = in_place  # inputs that are also outputs (pipeline/overlap.py)
        self.residents = residents  # tables in args=, uploaded once (pipeline/resident.py)
        self.sources = [a if isinstance(a, Source) else ArraySource(a) for a in sources]
        self.sinks = [a if isinstance(a, Sink) else ArraySink(a) for a in sinks]
        self.nvtx = trace_nvtx.annotator(device.backend)  # None unless CUDA and nvtx
        self.stager = Stager(options.workers, place=device.host_place)
        self._own_progress = progress is None  # a shared bar is closed by whoever made it
        self.progress = progress if progress is not None else Progress(options.progress, plan)
        self.clock: ClockAnchor | None = None
        self.records: Records = []
        self._compacted = 0  # records before this one hold times, not events (timeline.compact)
        self.host_spans: list[Span] = []
        self.queues: list[Queue] = []
        self.slots: list[Slot] = []
        self.inputs: list[Path] = []
        self.outputs: list[Path] = []
        self.peak_device_bytes = 0

    # -- set-up ---------------------------------------------------------------------------
    def _build(self) -> None:
        """Everything that allocates or compiles, before the first block."""
        dev, plan = self.device, self.plan
        if self.reduction is not None:
            self.reduction.build(dev, plan.block_rows * plan.inputs[0].row_items)
        self.copy_in_q = self._queue()
        self.compute_q = self._queue()
        self.copy_out_q = self._queue()
        args = self.options.args
        if self.residents is not None:
            args = self.residents.upload(dev, self.copy_in_q, args)
            self.peak_device_bytes += self.residents.nbytes
            self.copy_in_q.finish()  # on the device before any launch, whatever its path
        interrupts.checkpoint()
        self.step = step.choose(self.compute, dev, plan, args, self.records,
                                reduce=self.reduction is not None,
                                first_row=self.options.first_row)
        interrupts.checkpoint()
        if self.options.warmup:
            # Before the ring: its buffers are back in the pool when the ring takes what the
            # plan fitted to the pool's limit (taken after it, a callable's warm-up was
            # refused with OutOfMemoryError under device.memory_pool.limit).
            self.step.warm_up(dev, self.compute_q, self.sources, self.options.boundary)
            interrupts.checkpoint()
        # No checkpoint inside: every ring, pinned halo row and slot buffer is owned by the
        # engine (its paths, its slots) from the moment it is taken, so _release gives it back.
        # An interrupt that landed between a path's ring and paths.choose returning, or
        # between a pool handing a buffer over and the slot storing it, left pinned or device
        # blocks in use for good (a CI run's interrupt test: a pool not back at zero).
        self._take_buffers()
        interrupts.checkpoint()

    def _take_buffers(self) -> None:
        """The stream's paths (their staging rings) and every slot's device buffers."""
        dev, plan = self.device, self.plan
        rings = StagingRings(dev, plan, self.sources, self.sinks, self.stager,
                             self.host_spans, self.nvtx, self.records, self.blocks)
        self.inputs, self.outputs = paths.choose(
            dev, plan, self.sources, self.sinks, zero_copy=bool(self.options.zero_copy),
            in_place=self.in_place, staging=rings, records=self.records,
            boundary=self.options.boundary)
        self.peak_device_bytes += sum(path.device_bytes for path in self.inputs)
        for index in range(plan.depth):
            slot = Slot(index, len(self.sources), len(self.sinks))
            self.slots.append(slot)
            for buffers, group, floor in ((slot.dev_in, self.inputs, plan.input_device_bytes),
                                          (slot.dev_out, self.outputs,
                                           plan.output_device_bytes)):
                for path in group:
                    for i, nbytes in zip(path.indices, path.slot_bytes, strict=True):
                        if nbytes:  # never fewer than n elements (ArraySpec.device_bytes)
                            buffers[i] = self._acquire(max(nbytes, floor[i]))
            if self.reduction is not None:
                self.reduction.allocate(slot, self._acquire, dev.pinned_pool,
                                        plan.block_rows * plan.scratch_row_bytes)
            for nbytes in plan.temp_slot_bytes:  # a chain's temps
                slot.temps.append(self._acquire(nbytes))

    def _queue(self) -> Queue:
        queue = self.device.create_queue()
        self.queues.append(queue)
        return queue

    def _acquire(self, nbytes: int) -> DeviceBuffer:
        block = self.device.memory_pool.acquire(max(nbytes, 1))
        self.peak_device_bytes += block.nbytes
        return block

    # -- the run ----------------------------------------------------------------------------
    def run(self) -> Report:
        """Stream every block; return the report. Cleans up on success and on failure."""
        # A shorter thread switch interval while the stream runs: its threads give up the GIL
        # many times per block and would wait 5 ms for each return behind a busy Python thread.
        # The whole stream under one deferral (interrupts.py): a Ctrl-C is raised only where
        # stopping is safe, between blocks and in the engine's waits (checkpoint), never in
        # the middle of taking a buffer or inside threading's locks, where it left pool blocks
        # in use and a staging thread waiting for a lock nobody would release. The switch
        # interval's change is inside it: a Ctrl-C landing as quick_switches' clean-up began
        # left the interval low for good (no later stream restored it; seen on the H100).
        self._tables_written = False
        try:
            with deferred_sigint(), switching.quick_switches():
                return self._run()
        except BaseException as exc:
            if self._tables_written:  # a Ctrl-C held through the copy-back, or one in it
                note_outputs_written(exc)
            raise

    def _run(self) -> Report:
        started = time.perf_counter()
        try:
            self._build()
            # Every engine of a stream over several devices built and warmed up first: an
            # anchor taken before that wait started a fast device's timeline at its own
            # set-up's end, half a second before any block could run beside a slow one's.
            if self.started is not None:
                self.started()
            # One marker timed by host and device puts device spans on the host clock; taken
            # while the queues are idle, before the first block (trace/clock.py).
            self.clock = ClockAnchor.take(self.compute_q)
            with hazards.hot_path(self.device, strict=self.options.strict):
                self._loop()
            for queue in self.queues:
                queue.finish()
            self.finished_at = time.perf_counter()
            if self.residents is not None:
                # A Ctrl-C held since the last block stops the stream here, its tables' writes
                # dropped (it was raised after the copy-back, which had brought them home).
                interrupts.checkpoint()
                # From here a failure says the writable tables were written (a nested
                # stream's, copied back by its outer stream, are not).
                claimed = getattr(self.residents, "claimed", None)
                writes = claimed is not None and any(
                    table not in claimed.nested for table in claimed.tables)
                if writes:
                    # Every output readied (flushed, its place checked again) before the
                    # tables come home: one the commit would refuse (a folder took its
                    # place during the stream) fails the stream here, its writes dropped.
                    for sink in self.sinks:
                        sink.prepare()
                self._tables_written = writes
                self.residents.copy_back(self.copy_out_q)
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
                    self._release()  # whole: run() defers Ctrl-C, and it has no checkpoint
                finally:
                    if self._own_progress:
                        self.progress.close()
        return self._report(time.perf_counter() - started)

    def _loop(self) -> None:
        self.looped = True
        plan = self.plan
        every = (*self.inputs, *self.outputs)
        for path in every:
            path.start()
        issued = 0
        while (block := self.blocks.get(issued)) is not None:
            interrupts.checkpoint()  # a Ctrl-C held since the last block stops the stream here
            issued += 1
            slot = self.slots[block.seq % plan.depth]
            if slot.block is not None:
                self._retire(slot)
            slot.block = block
            for path in every:
                path.take(slot, block)
            in_events: list[Event] = []
            for path in self.inputs:
                in_events += path.enqueue(self.copy_in_q, slot, block, ())
            event = self.step.enqueue(self.compute_q, slot, block, in_events)
            done: list[Event] = []
            if self.reduction is not None:
                event, done = self.reduction.enqueue(
                    self.compute_q, self.copy_out_q, slot.scratch,
                    block.rows * plan.inputs[0].row_items, event, self.records, block.index)
            for path in self.outputs:
                done += path.enqueue(self.copy_out_q, slot, block, [event])
            slot.done = done or [event]
            for queue in self.queues:
                queue.flush()
            for path in self.inputs:
                path.release(block, in_events)
            for path in self.outputs:
                path.release(block, slot.done)
        self.blocks_done = issued
        for index in range(issued, issued + plan.depth):
            slot = self.slots[index % plan.depth]  # in block order: partials combine in order
            if slot.block is not None:
                self._retire(slot)
        for path in every:
            path.finish()

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
        if self.reduction is not None:
            start = time.perf_counter_ns()
            self.reduction.collect(slot.scratch, slot.partial, block.index)
            slot.partial = None
            if slot.scratch is not None:
                self.host_spans.append(Span("combine", block.index, start,
                                            time.perf_counter_ns()))
        if len(self.records) - self._compacted >= trace_timeline.COMPACT_RECORDS:
            # A long stream's events read as its blocks retire: memory per block bounded.
            self._compacted = trace_timeline.compact(self.records, self._compacted, block.index)
        slot.block = None
        slot.done = []
        slot.returned = None
        self.progress.advance(block)

    # -- clean-up ---------------------------------------------------------------------------
    def _close_staging(self) -> None:
        """Stop and join the paths' staging threads, then the workers they use."""
        try:
            for path in (*self.inputs, *self.outputs):
                path.close()
        finally:
            self.stager.close()

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
            scratch = slot.scratch
            owned = [b for b in (*slot.dev_in, *slot.dev_out, *slot.temps)
                     if isinstance(b, DeviceBuffer)]
            for buf in owned + (scratch.device_buffers() if scratch is not None else []):
                if buf is not None:
                    pool.release(buf, after=fence)
            for pin in scratch.pinned_buffers() if scratch is not None else []:
                if pin is not None:
                    pin_pool.release(pin, after=fence)
        # Every queue has finished (run() or _abort()), so no copy still reads the rings.
        for path in (*self.inputs, *self.outputs):
            path.give_back()
        if self.residents is not None:
            self.residents.release()
        self.slots, self.inputs, self.outputs = [], [], []
        # The stream is over: keep only the pools' keep budget of idle blocks (memory/pool.py),
        # so streams of changing lengths do not pile up size classes.
        pool.settle()
        pin_pool.settle()
        svm = pinned.existing_svm_pool(self.device)
        if svm is not None:
            svm.settle()
        for queue in self.queues:
            try:
                queue.close()
            except Exception:  # closing after a device failure must not mask it
                pass
        self.queues = []

    def _report(self, seconds: float) -> Report:
        host_spans, clock = self.host_spans, self.clock
        # Detached: PyOpenCL's copy events hold the host arrays they read until waited on,
        # and a kept report whose timeline was never read held the caller's dropped pinned
        # inputs (in use in the pool) and trimmed staging blocks. Every event is complete.
        records = [(kind, index, event.detached(), nbytes)
                   for kind, index, event, nbytes in self.records]
        self.host_spans, self.records, self._compacted = [], [], 0

        def timeline() -> Timeline:
            return Timeline.from_records(records, host_spans, clock)

        return Report(
            device=self.device.spec,
            seconds=seconds,
            bytes_in=sum(s.nbytes for s in self.sources),
            bytes_out=sum(s.nbytes for s in self.sinks),
            blocks=self.plan.block_count,
            block_rows=self.plan.block_rows,
            rows=self.plan.rows,
            depth=self.plan.depth,
            peak_device_bytes=self.peak_device_bytes,
            zero_copy=bool(self.options.zero_copy),
            result=self.reduction.result() if self.reduction is not None else None,
            outputs=[s.result for s in self.sinks],
            device_name=self.device.name,
            timeline_source=timeline,
        )

