"""A staging ring that starts small and grows beside the stream (issue 17, the first stream).

A staged path wants ``depth + 2`` entries of pinned buffers (pipeline/staged.py). On a warm
pool those are hits of a microsecond each; in a fresh process each is a driver allocation
(``cuMemHostAlloc`` of 64 MiB took 26 ms on the H200, ~1 GiB of ring for a 2-input map),
and allocating them all before the first block put most of a second on the first stream's
critical path. So a :class:`Ring` takes one entry when it is made and, when it starts, what
the pool holds idle; a thread of its own allocates the rest while the first blocks stream, and
announces each new entry (``on_added``) to the staging thread that uses the ring, which starts
using it.

A failed growth allocation (no pinned memory to spare) only stops the growth: the stream goes
on with the entries it has. ``CONVEYOR_RING_GROW=0`` allocates the whole ring when the path
starts, on the engine's thread before its first block is issued (the path's staging thread
may already use the first entry), up to what a pinned limit lets fit (for A/B runs).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from conveyor import config, hazards
from conveyor.closing import join
from conveyor.errors import OutOfMemoryError
from conveyor.interrupts import deferred_sigint, start_thread
from conveyor.memory.pinned import PinnedPool
from conveyor.pipeline.staging import Entry


class Ring:
    """Entries of pinned buffers, one buffer of each of ``sizes`` per entry, up to ``target``
    entries. ``entries`` only ever grows (by appends, so readers may index it without a
    lock); ``give_back()`` returns every buffer."""

    def __init__(self, pool: PinnedPool, sizes: Sequence[int], target: int,
                 grow: bool | None = None) -> None:
        self.pool = pool
        self.sizes = tuple(sizes)
        self.target = max(target, 1)
        self.entries: list[Entry] = []
        self.error: BaseException | None = None  # why the growth stopped early, if it did
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._grow_beside = config.ring_grow() if grow is None else grow
        try:
            first = self._entry(self.pool.acquire)  # the first entry, at once
            assert first is not None  # acquire() raises rather than return None
            self._add(first)
        except BaseException:
            self.give_back()
            raise

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int) -> Entry:
        return self.entries[index]

    @property
    def complete(self) -> bool:
        """True once the ring has every entry it wants."""
        return len(self.entries) >= self.target

    def start(self, on_added: Callable[[int], None]) -> None:
        """Grow to ``target`` entries: what the pool holds idle at once, the rest on a
        thread; ``on_added(index)`` announces each one. The idle entries are taken here, not
        when the ring is made: every ring of a stream takes its first entry before any takes
        more (a second stream under a pinned limit saw its input ring take the whole limit
        in idle entries, and its output ring's first entry fail with OutOfMemoryError)."""
        if self.complete or self._thread is not None:
            return
        # Without growth (CONVEYOR_RING_GROW=0) every entry is allocated here, before the
        # first block, up to what a pinned limit lets fit.
        take = self._hit if self._grow_beside else self._acquire_or_none
        with hazards.unwatched():  # the ring's own allocations, not the user's (strict mode)
            while not self.complete:
                entry = self._entry(take)
                if entry is None:
                    break  # the pool would have to allocate: the thread does that
                self._add(entry)
                on_added(len(self.entries) - 1)
        if self.complete or not self._grow_beside:
            return
        self._thread = threading.Thread(target=self._grow, args=(on_added,),
                                        name="conveyor-ring", daemon=True)
        start_thread(self._thread)

    def _grow(self, on_added: Callable[[int], None]) -> None:
        try:
            while not self._stop.is_set() and not self.complete:
                entry = self._entry(self.pool.acquire)
                if entry is None:
                    return
                if self._stop.is_set():  # the stream ended meanwhile: nobody will use it
                    self._release(entry)
                    return
                self._add(entry)
                on_added(len(self.entries) - 1)
        except BaseException as exc:  # growth is an optimisation: the stream goes on
            self.error = exc

    def _hit(self, nbytes: int) -> object | None:
        return self.pool.try_acquire(nbytes)

    def _acquire_or_none(self, nbytes: int) -> object | None:
        try:
            return self.pool.acquire(nbytes)
        except OutOfMemoryError as exc:  # a pinned limit: the ring runs on what fits
            self.error = exc
            return None

    def _entry(self, acquire: Callable[[int], object | None]) -> Entry | None:
        """One entry's buffers from ``acquire``; None (nothing kept) if any is None."""
        entry: Entry = []
        try:
            for nbytes in self.sizes:
                pin = acquire(nbytes)
                if pin is None:
                    self._release(entry)
                    return None
                entry.append(pin)  # type: ignore[arg-type]
        except BaseException:
            self._release(entry)
            raise
        return entry

    def _add(self, entry: Entry) -> None:
        self.entries.append(entry)

    def _release(self, entry: Entry) -> None:
        for pin in entry:
            if pin is not None:
                self.pool.release(pin)

    def stop(self) -> None:
        """Stop growing and wait for the thread (an allocation under way finishes first)."""
        with deferred_sigint():
            self._stop.set()
            if self._thread is not None:
                join(self._thread)

    def give_back(self) -> None:
        """Stop growing; return every entry's buffers to the pool (no copy still uses them)."""
        self.stop()
        entries, self.entries = self.entries, []
        for entry in entries:
            self._release(entry)
