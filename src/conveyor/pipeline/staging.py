"""Staging that runs beside the engine instead of inside its loop.

Pageable blocks must pass through pinned memory, and those host copies are the slowest part of
a pageable stream (one batch at a time on the engine's thread left the link idle half the
time: bench/NOTES.md). Here two threads keep the staging workers busy on their own:

- ``StageAhead`` fills a ring of pinned input buffers with the blocks to come, reusing a buffer
  only once the device has finished the copy that read it;
- ``StageBehind`` empties a ring of pinned output buffers into the caller's outputs as each
  block's copy-out completes.

The engine's thread only issues device work, waiting for a block to be staged (ahead) or for an
output buffer to come free (behind). Both rings are deeper than the device ring, so a slow
block does not stall the next one. Either thread's first failure is raised on the engine's
thread, as is, at its next call; ``close()`` stops the thread and waits for it, so no copy
into a pinned buffer outlives the stream.

Blocks smaller than ``THREAD_MIN_BYTES`` are staged ``inline`` on the engine's thread instead:
there a thread hand-off costs more than the copy it would hide (bench/NOTES.md).
"""

from __future__ import annotations

import collections
import contextvars
import functools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from conveyor import interrupts
from conveyor.backends.base import Event, PinnedBuffer
from conveyor.closing import Closeable, join
from conveyor.interrupts import deferred_sigint, start_thread
from conveyor.memory import numa
from conveyor.pipeline.plan import Block, BlockSource, ListedBlocks
from conveyor.pipeline.stage import Batch, Stager, StageTask, task_bytes
from conveyor.trace.timeline import Span

#: Below this many bytes per block, staging runs on the engine's thread (``inline``).
THREAD_MIN_BYTES = 2**20

#: Pinned buffers of one ring entry: one per input (or output), None where no staging is needed.
Entry = list[PinnedBuffer | None]


class EntryRing(Protocol):
    """A ring of entries: a list, or a ring that grows (pipeline/ring.py)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Entry: ...


class _Stopped(Exception):
    """The engine stopped the stream; the staging thread leaves quietly."""


class _StagingThread(Closeable):
    """What both stagers share: a thread, a stop flag, and the first failure to hand back."""

    lane = ""

    def __init__(self, stager: Stager, spans: list[Span], nvtx: Any, inline: bool) -> None:
        self.inline = inline
        self.stager = stager
        self.spans = spans
        self.nvtx = nvtx
        self._cond = threading.Condition()
        self._stop = False
        self._error: BaseException | None = None
        self._lane_end = 0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (none when ``inline``). Threads are made only when started: one
        never started keeps its target, and through it the engine's arrays, alive until the
        garbage collector runs."""
        if not self.inline:
            # In the stream's context: a cv.iterate generator that streams again on this
            # thread is inside the stream, and shares its writable tables (resident.claim).
            self._thread = threading.Thread(target=contextvars.copy_context().run,
                                            args=(self._main, self._work),
                                            name=f"conveyor-{self.lane}", daemon=True)
            start_thread(self._thread)

    def _main(self, work: Callable[[], None]) -> None:
        try:
            numa.bind_thread(self.stager.place)  # it copies too, when a block is one piece
            work()
        except _Stopped:
            pass
        except BaseException as exc:  # handed to the engine's thread, which raises it
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _work(self) -> None:
        raise NotImplementedError

    def _copy(self, tasks: Sequence[StageTask], block: Block) -> None:
        """Inline: copy ``tasks`` on this thread's workers and wait."""
        if not tasks:
            return
        if self.nvtx is not None:
            self.nvtx.push(f"{self.lane} {block.index}", "stage")
        start = time.perf_counter_ns()
        try:
            self.stager.run(tasks)
        finally:
            if self.nvtx is not None:
                self.nvtx.pop()
        self.spans.append(Span(self.lane, block.index, start, time.perf_counter_ns(),
                               task_bytes(tasks)))

    def _record(self, batch: Batch, block: Block) -> None:
        """A finished batch's span on this lane, called in block order (NVTX cannot mark it:
        it ran on workers). Batches overlap (the next is queued before the last piece of this
        one ends): each span starts where the lane's previous one ended, so the lane shows
        one block at a time and its busy time counts no moment twice."""
        start = max(batch.start_ns, self._lane_end)
        self._lane_end = max(batch.end_ns, start)
        self.spans.append(Span(self.lane, block.index, start, self._lane_end, batch.nbytes))

    def _wait_until(self, ready: Callable[[], bool]) -> None:
        """Wait (holding ``_cond``) until ``ready()``; raise the thread's failure or a stop."""
        while True:
            if self._error is not None:
                raise self._error
            if self._stop:
                raise _Stopped
            if ready():
                return
            interrupts.wait(self._cond)

    def _raise_failure(self) -> None:
        """On the engine's thread: raise the staging thread's failure, if it had one."""
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Stop the thread and join it. Copies it already handed to the workers may still run:
        the engine closes the Stager (joining the workers) before any pinned buffer goes back.
        A Ctrl-C meanwhile is raised once the thread is joined: between the stop and the join
        it would leave the thread running (interrupts.py)."""
        with deferred_sigint():
            with self._cond:
                self._stop = True
                self._cond.notify_all()
            self._on_stop()
            if self._thread is not None:
                join(self._thread)

    def _on_stop(self) -> None:
        pass


class StageAhead(_StagingThread):
    """Stages blocks ahead of the engine into ``ring``, in order.

    ``fill(block, entry)`` returns the staging copies of one block into one ring entry.
    The engine calls ``take(k)`` before issuing its block ``k`` (``seq``; ``blocks.get(k)``)
    and ``release(k, events)`` once the copies that read what ``take`` gave are enqueued;
    those buffers are reused after ``events``. Entries are handed out as they come free, so
    the ring may grow while the stream runs (``added``: pipeline/ring.py).
    """

    lane = "stage-in"

    def __init__(self, stager: Stager, ring: EntryRing,
                 blocks: BlockSource | Sequence[Block],
                 fill: Callable[[Block, Entry], list[StageTask]], spans: list[Span],
                 nvtx: Any, inline: bool = False) -> None:
        super().__init__(stager, spans, nvtx, inline)
        self.ring = ring
        self.blocks: BlockSource = (ListedBlocks(blocks) if isinstance(blocks, list | tuple)
                                    else blocks)  # type: ignore[assignment]
        self._taken: dict[int, Block] = {}  # claimed blocks, until the engine takes them
        self.fill = fill
        self._claimed = 0  # the next block to claim
        self._ready: dict[int, tuple[int, Batch]] = {}  # staged: (entry, copies)
        # Entries free to stage into, with the events that last read them, oldest first.
        self._free: collections.deque[tuple[int, list[Event]]] = collections.deque(
            (index, []) for index in range(len(ring)))
        self._entry_of: dict[int, int] = {}  # block -> the entry it was staged into

    def added(self, index: int) -> None:
        """The ring grew: entry ``index`` is free to use (first: no copy still reads it)."""
        with self._cond:
            self._free.appendleft((index, []))
            self._cond.notify_all()

    def _claim(self) -> int | None:
        """The next block to stage, or None when all are claimed."""
        with self._cond:
            if self._stop:
                return None
            block = self.blocks.get(self._claimed)
            if block is None:
                return None
            k, self._claimed = self._claimed, self._claimed + 1
            self._taken[k] = block
            return k

    def _free_entry(self, k: int) -> int:
        """Wait for a free entry (the engine released the block that used it, or the ring
        grew); wait for the copies that read it; return it, now block ``k``'s."""
        with self._cond:
            self._wait_until(lambda: bool(self._free))
            index, fences = self._free.popleft()
            self._entry_of[k] = index
        for event in fences:
            event.wait()
        return index

    def _work(self) -> None:
        while (k := self._claim()) is not None:
            index = self._free_entry(k)
            # Hand the copies over without waiting for them: the workers always have the next
            # block queued, so no worker idles while a block's last pieces finish.
            block = self._taken[k]
            batch = self.stager.submit(self.fill(block, self.ring[index]))
            with self._cond:
                self._ready[k] = (index, batch)
                self._cond.notify_all()

    def take(self, k: int, block: Block | None = None) -> Entry:
        """Wait until block ``k`` (``block``, as the engine got it) is staged; return its ring
        entry."""
        if self.inline:  # every block before k is released: an entry is free
            entry = self.ring[self._free_entry(k)]
            block = block if block is not None else self.blocks.get(k)
            assert block is not None, f"block {k} was never claimed"
            self._copy(self.fill(block, entry), block)
            return entry
        with self._cond:
            while k not in self._ready:
                self._raise_failure()
                interrupts.wait(self._cond)
            index, batch = self._ready.pop(k)
            block = self._taken.pop(k)
        batch.wait()
        self._record(batch, block)
        return self.ring[index]

    def release(self, k: int, events: Sequence[Event]) -> None:
        """What block ``k`` was read from may be reused once ``events`` (its copy-in) complete."""
        with self._cond:
            self._free.append((self._entry_of.pop(k), list(events)))
            self._cond.notify_all()


class StageBehind(_StagingThread):
    """Copies finished blocks out of ``ring`` into the caller's outputs, in order.

    The engine calls ``entry(k)`` for the pinned buffers block ``k`` may copy out into (waiting
    until the block that used them before has been staged out), then ``submit(k, block,
    events, tasks)``: once ``events`` complete, ``tasks`` copy the entry into the outputs.
    ``drain()`` waits for everything submitted. Entries are handed out as they come free,
    so the ring may grow while the stream runs (``added``: pipeline/ring.py).
    """

    lane = "stage-out"

    def __init__(self, stager: Stager, ring: EntryRing, spans: list[Span], nvtx: Any,
                 inline: bool = False) -> None:
        super().__init__(stager, spans, nvtx, inline)
        self.ring = ring
        self._pending: collections.deque[tuple[int, Block, list[Event], list[StageTask]]] = (
            collections.deque())  # inline: submitted, not yet staged out
        self._queue: queue.SimpleQueue[tuple[Block, list[Event], list[StageTask]] | None] = (
            queue.SimpleQueue())
        self._done = -1  # every block up to this one is staged out
        self._submitted = -1
        # Staged out beyond _done, with their batches (batches can end out of order).
        self._finished: dict[int, tuple[Batch, Block]] = {}
        self._free: collections.deque[int] = collections.deque(range(len(ring)))
        self._entry_of: dict[int, int] = {}  # block -> its entry, until staged out

    def added(self, index: int) -> None:
        """The ring grew: entry ``index`` is free to use."""
        with self._cond:
            self._free.append(index)
            self._cond.notify_all()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            block, events, tasks = item
            for event in events:
                event.wait()
            with self._cond:
                if self._stop:
                    return
            self.stager.submit(tasks, on_done=functools.partial(self._finish, block=block))

    def _finish(self, batch: Batch, *, block: Block) -> None:
        """On the worker that finished a block's last piece: mark the block staged out."""
        with self._cond:
            if batch.error is not None and self._error is None:
                self._error = batch.error
            self._finished[block.seq] = (batch, block)
            self._free.append(self._entry_of.pop(block.seq))
            while self._done + 1 in self._finished:
                self._done += 1
                self._record(*self._finished.pop(self._done))
            self._cond.notify_all()

    def _on_stop(self) -> None:
        self._queue.put(None)
        self._pending.clear()

    def _stage_out_inline(self, through: int) -> None:
        """Inline: stage out every pending block up to ``through``, in order."""
        while self._pending and self._pending[0][0] <= through:
            k, block, events, tasks = self._pending.popleft()
            for event in events:
                event.wait()
            self._copy(tasks, block)
            self._done = k
            with self._cond:
                self._free.append(self._entry_of.pop(k))

    def entry(self, k: int) -> Entry:
        """A ring entry for block ``k``, once one is free (the block that used it last has
        been staged out, or the ring grew)."""
        if self.inline:
            while not self._free and self._pending:
                self._stage_out_inline(self._pending[0][0])
        with self._cond:
            while not self._free:
                self._raise_failure()
                interrupts.wait(self._cond)
            self._raise_failure()
            index = self._free.popleft()
            self._entry_of[k] = index
        return self.ring[index]

    def submit(self, k: int, block: Block, events: Sequence[Event],
               tasks: list[StageTask]) -> None:
        """Stage block ``k`` out with ``tasks`` once ``events`` complete (blocks go in order)."""
        assert k == self._submitted + 1, "blocks are staged out in order"
        self._submitted = k
        if self.inline:
            self._pending.append((k, block, list(events), tasks))
        else:
            self._queue.put((block, list(events), tasks))

    def drain(self) -> None:
        """Wait until every submitted block is staged out; raise the first failure."""
        if self.inline:
            self._stage_out_inline(self._submitted)
        with self._cond:
            while self._done < self._submitted:
                self._raise_failure()
                interrupts.wait(self._cond)
            self._raise_failure()
