"""Host staging: copies between the caller's (pageable) arrays and pinned slots, in parallel.

One thread copies about 11 GB/s; the link needs 50+. So every staging copy is cut into pieces
of about ``PIECE_BYTES`` and the pieces run on a pool of worker threads (NumPy releases the GIL
while it copies). A failure in a worker travels back to the caller as the original exception,
with a note saying which stage, block and array it happened in.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from conveyor import interrupts
from conveyor.closing import Closeable, finish_uninterrupted
from conveyor.interrupts import deferred_sigint
from conveyor.memory import numa

PIECE_BYTES = 8 * 2**20


def default_workers() -> int:
    """Staging threads: three per four cores (all of them up to 3), at most 16 (host memcpy
    saturates around there). Not one per core: the engine's and the driver's threads need
    cores too; on a 16-CPU H100 host 12 workers staged pageable filter-sum at a median 40.7
    GB/s against 33.5 with 16 on CUDA (map 27.2 against 26.7; NVIDIA's OpenCL 35.8 against
    37.1, within its noise: bench/NOTES.md, session 7)."""
    cores = os.cpu_count() or 1
    return max(1, min(cores - cores // 4, 16))


class StageTask:
    """One staging copy: ``dst[...] = src`` cut into row pieces; ``where`` names it for errors
    and ``first`` is the caller's array row of the copy's row 0 (for the rows an error names).

    Either side may instead be rows of a file (``pipeline.io.FileRows``): those
    are read or written straight from and into the pinned slot, piece by piece.
    """

    __slots__ = ("dst", "src", "where", "first")

    def __init__(self, dst: Any, src: Any, where: str, first: int = 0) -> None:
        self.dst = dst
        self.src = src
        self.where = where
        self.first = first


def task_bytes(tasks: Sequence[StageTask]) -> int:
    """The bytes ``tasks`` copy: each copies into or out of a pinned slot (an array)."""
    return sum(int(t.dst.nbytes if isinstance(t.dst, np.ndarray) else
                   getattr(t.src, "nbytes", 0)) for t in tasks)


class Batch:
    """The pieces of one ``Stager.submit``: done once every piece is, failed if any piece
    failed (the first failure is kept). ``start_ns``/``end_ns`` bound it on the host clock."""

    def __init__(self, pieces: int, on_done: Callable[[Batch], None] | None) -> None:
        self.start_ns = time.perf_counter_ns()
        self.end_ns = self.start_ns
        self.nbytes = 0  # what its tasks copy (task_bytes), for the timeline's span
        self.error: BaseException | None = None
        self._left = max(pieces, 1)  # an empty batch completes on one piece_done(None)
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._on_done = on_done

    def piece_done(self, error: BaseException | None) -> None:
        """One piece finished (``error`` if it failed); the last one completes the batch."""
        with self._lock:
            if error is not None and self.error is None:
                self.error = error
            self._left -= 1
            last = self._left == 0
        if last:
            self.end_ns = time.perf_counter_ns()
            self._done.set()
            if self._on_done is not None:
                self._on_done(self)

    def done(self) -> bool:
        """True once every piece has finished."""
        return self._done.is_set()

    def wait(self) -> None:
        """Wait for every piece (none still writes after this returns); raise the first
        failure."""
        interrupts.wait_event(self._done)  # a Ctrl-C stops the wait at a safe point
        if self.error is not None:
            raise self.error


class Stager(Closeable):
    """A pool of staging threads. ``run(tasks)`` copies them all in parallel and returns when
    every piece is done, raising the first failure (with where it happened)."""

    def __init__(self, workers: int | None = None, piece_bytes: int = PIECE_BYTES,
                 place: numa.Place | None = None) -> None:
        self.workers = workers or default_workers()
        self.piece_bytes = piece_bytes
        self.place = place  # the workers run on its CPUs and prefer its node (memory/numa.py)
        self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="conveyor-stage",
                                            initializer=numa.bind_thread, initargs=(place,))
        self._closed = False
        self._lock = threading.Lock()
        #: Wraps every piece copy; tests inject faults here by wrapping the real copy.
        self.copy: Callable[[Any, Any], None] = copy_rows

    def run(self, tasks: Sequence[StageTask]) -> None:
        """Copy every task, split into pieces across the workers; wait for all of them."""
        self.submit(tasks).wait()

    def submit(self, tasks: Sequence[StageTask],
               on_done: Callable[[Batch], None] | None = None) -> Batch:
        """Start copying every task (in pieces, on the workers) and return at once; the
        Batch says when all are done. With one piece or one worker, the copies run here."""
        pieces: list[tuple[StageTask, slice]] = []
        for task in tasks:
            pieces.extend((task, rows) for rows in self._split(task))
        batch = Batch(len(pieces), on_done)
        batch.nbytes = task_bytes(tasks)
        if len(pieces) <= 1 or self.workers == 1:
            for task, rows in pieces:
                self._copy_piece(batch, task, rows)
            if not pieces:
                batch.piece_done(None)
            return batch
        # The executor starts its threads inside submit(): a Ctrl-C there could leave a worker
        # that close() cannot join (interrupts.py), and a batch short of pieces.
        with deferred_sigint():
            for task, rows in pieces:
                self._executor.submit(self._copy_piece, batch, task, rows)
        return batch

    def _split(self, task: StageTask) -> list[slice]:
        rows = task.dst.shape[0] if task.dst.ndim else 1
        if rows == 0:
            return []
        row_bytes = max(task.dst.nbytes // rows, 1)
        per_piece = max(self.piece_bytes // row_bytes, 1)
        count = min(-(-rows // per_piece), self.workers * 4)
        step = -(-rows // count)
        return [slice(start, min(start + step, rows)) for start in range(0, rows, step)]

    def _copy_piece(self, batch: Batch, task: StageTask, rows: slice) -> None:
        try:
            self.copy(task.dst[rows], task.src[rows])
        except BaseException as exc:
            lo, hi = task.first + rows.start, task.first + rows.stop
            exc.add_note(f"conveyor: while staging {task.where} (rows {lo}:{hi})")
            batch.piece_done(exc)
        else:
            batch.piece_done(None)

    def close(self) -> None:
        """Join every worker thread (a Ctrl-C meanwhile is raised once they are joined)."""
        # Marking closed and joining happen with SIGINT held: an interrupt between the two
        # left the workers running and every later close() a no-op (seen once under load),
        # and one inside the join would leave workers copying into pinned slots that the
        # engine is about to give back to the pool.
        with deferred_sigint():
            with self._lock:
                if self._closed:
                    return
                self._closed = True
            finish_uninterrupted(lambda: self._executor.shutdown(wait=True, cancel_futures=True))


def copy_rows(dst: Any, src: Any) -> None:
    """``dst[...] = src`` for arrays; a file's rows read into, or written from, an array."""
    if isinstance(dst, np.ndarray) and not isinstance(src, np.ndarray):
        src.read_into(dst)  # a file's rows, read into the pinned slot
    elif not isinstance(dst, np.ndarray):
        dst.write_from(src)  # the pinned slot's rows, written into a file
    else:
        np.copyto(dst, src, casting="no")
