"""Pools of device and pinned memory: binned reuse, event-fenced release, a limit, statistics.

A block goes back to its pool with ``release(block, after=event)`` and is handed out again only
once ``event`` has completed, so no queued command can still be reading or writing it. When an
allocation fails (or would pass the limit) the pool climbs a ladder: free the idle blocks it
holds, wait for fenced blocks and free them, collect garbage (which returns the blocks of
dropped pinned arrays), give back resident arrays no stream is using (uploaded again when
next used), retry, and only then raise :class:`OutOfMemoryError`.

Between streams a pool keeps a budget of idle blocks, not everything it ever held: when a
stream ends, the engine calls :meth:`BlockPool.settle`, which gives back blocks of size classes
idle for ``STALE_STREAMS`` streams, then the least recently used idle blocks until the idle
bytes fit the keep budget: ``pool.keep`` (default ``CONVEYOR_POOL_KEEP``) or, when that is
None, ``KEEP_FACTOR`` times the most bytes in use at once during any of the last
``STALE_STREAMS`` streams (twice what the largest recent ring used, so two kinds of streams
taking turns both keep their blocks). So streams of ever-changing lengths no longer pile up one
set of size classes each.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from conveyor import config, hazards
from conveyor.errors import ConveyorError, InputError, OutOfMemoryError
from conveyor.interrupts import deferred_sigint

if TYPE_CHECKING:
    from conveyor.backends.base import Device, DeviceBuffer, Event  # noqa: F401


class Evictable(Protocol):
    """Something that holds pool blocks and can give them back while unused."""

    def evict(self) -> bool: ...


class _Block(Protocol):
    nbytes: int

    def close(self) -> None: ...


B = TypeVar("B", bound=_Block)


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool's counters. Bytes are the rounded (binned) sizes."""

    in_use_bytes: int
    held_bytes: int
    pending_bytes: int
    peak_in_use_bytes: int
    hits: int
    misses: int
    blocks_in_use: int
    limit: int | None
    #: Most idle bytes kept between streams: ``pool.keep`` when set, else ``KEEP_FACTOR`` times
    #: the most bytes in use at once during the last ``STALE_STREAMS`` streams; None until a
    #: stream has ended.
    keep_bytes: int | None = None
    #: Blocks (and their bytes) given back by settle() and trim() so far.
    trims: int = 0
    trimmed_bytes: int = 0


#: A size class no stream has acquired or released for this many streams is given back; the
#: default keep budget looks back as many streams.
STALE_STREAMS = 8
#: The default keep budget is this many times the largest recent stream's bytes in use.
KEEP_FACTOR = 2


def device_bin(nbytes: int) -> int:
    """Round a device request up to its size class: powers of two up to 1 MiB, then eight
    classes per octave (at most 12.5% waste)."""
    if nbytes <= 512:
        return 512
    if nbytes <= 1 << 20:
        return 1 << (nbytes - 1).bit_length()
    step = 1 << max((nbytes - 1).bit_length() - 4, 0)
    return -(-nbytes // step) * step



def _index(value: Any) -> Any:
    """A whole number of bytes as an int: a NumPy integer, a 0-d integer array, an integral
    float (``4e9``, as every other size conveyor takes); anything else as it is, for the caller
    to refuse (a float array's ``__index__`` raised NumPy's own TypeError)."""
    from conveyor.pipeline.options import _whole

    if value is None or isinstance(value, bool | int):
        return value
    whole = _whole(value)
    if whole is not None:
        return whole
    if hasattr(value, "__index__"):
        try:
            return int(value.__index__())
        except TypeError:
            pass
    return value


def _done(event: Event) -> bool:
    """Whether ``event`` has completed; False where the backend cannot say (a forked child's
    CUDA event raises its fork error: a block returned there by a finalizer printed it)."""
    try:
        return event.is_done()
    except Exception:
        return False


class BlockPool(Generic[B]):
    """A thread-safe pool of blocks made by ``allocate(nbytes)`` and freed by ``block.close()``.

    ``bin_size`` maps a request to its size class; a block serves any later request of the same
    class. ``limit`` caps the bytes the pool holds from the backend (in use + held), or None.
    """

    def __init__(
        self,
        allocate: Callable[[int], B],
        bin_size: Callable[[int], int],
        *,
        limit: int | None = None,
        keep: int | None = None,
        where: str = "device",
    ) -> None:
        self.allocate = allocate
        self._bin_size = bin_size
        self._where = where
        self._lock = threading.RLock()
        self._evictable: weakref.WeakSet[Any] = weakref.WeakSet()
        self._free: dict[int, list[B]] = {}
        self._pending: list[tuple[Event, B]] = []
        self._in_use: dict[int, B] = {}
        self._in_use_bytes = 0
        self._held_bytes = 0
        self._pending_bytes = 0
        self._peak = 0
        self._reserved_bytes = 0  # being allocated right now, outside the lock
        self._hits = 0
        self._misses = 0
        self._limit: int | None = None
        self._keep: int | None = None
        self._streams = 0  # settle() calls: the pool's clock for "not used for a while"
        self._last_used: dict[int, int] = {}  # size class -> stream count at its last use
        self._stream_peak = 0  # most bytes in use since the last settle()
        self._recent_peaks: deque[int] = deque(maxlen=STALE_STREAMS)
        self._keep_bytes: int | None = None
        self._trims = 0
        self._trimmed_bytes = 0
        # close() was called and no block has been asked for since: what comes back is freed,
        # not held (a pinned array or a table dropped after device.close() was held for good).
        self._closed = False
        self.limit = limit  # the setters last: the limit's trims use the counters above
        self.keep = keep

    # -- configuration --------------------------------------------------------------------
    @property
    def limit(self) -> int | None:
        """Most bytes the pool may hold from the backend (in use + held), or None."""
        return self._limit

    @limit.setter
    def limit(self, value: int | str | None) -> None:
        if isinstance(value, str):  # "64MiB", as every size conveyor takes
            value = config.parse_size("pool limit", value)
        value = _index(value)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value <= 0):
            raise InputError(f"pool limit must be None or a positive number of bytes (an int "
                             f"or a size like '64MiB'), got {value!r}")
        if value is not None:
            config.check_size_cap("pool limit", value, value)
        with self._lock:
            self._limit = value
            # Idle blocks past a lowered limit go back now: they were kept, and handed to the
            # next stream, whatever the limit said.
            doomed: list[B] = []
            if value is not None:
                self._collect_done()
                doomed = self._over_budget(max(value - self._in_use_bytes
                                               - self._pending_bytes, 0))
        for idle in doomed:
            idle.close()

    @property
    def keep(self) -> int | None:
        """Most idle bytes kept between streams, or None: ``KEEP_FACTOR`` times the most any
        of the last ``STALE_STREAMS`` streams had in use at once."""
        return self._keep

    @keep.setter
    def keep(self, value: int | str | None) -> None:
        if isinstance(value, str):  # "64MiB", as the limit and CONVEYOR_POOL_KEEP take
            value = 0 if value.strip() == "0" else config.parse_size("pool keep", value)
        value = _index(value)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise InputError(f"pool keep must be None or 0 or more bytes (an int or a size "
                             f"like '64MiB'), got {value!r}")
        if value is not None:
            config.check_size_cap("pool keep", value, value)
        self._keep = value

    def bin_size(self, nbytes: int) -> int:
        """The size class (bytes actually held) for a request of ``nbytes``."""
        return self._bin_size(nbytes)

    # -- acquire / release ----------------------------------------------------------------
    def acquire(self, nbytes: int) -> B:
        """A block of at least ``nbytes`` (exactly its size class). OutOfMemoryError if none.

        Whole under Ctrl-C (interrupts.py): a KeyboardInterrupt raised between marking a
        block in use and handing it over left it in use for good (a CI run's interrupt test
        found a pool not back at zero); one that arrives meanwhile is raised as acquire
        returns, with the block given back first."""
        if type(nbytes) is not int:  # (the pools' every block: one test on the usual path)
            nbytes = _whole_bytes(nbytes, "acquire")
        if nbytes <= 0:
            raise InputError(f"cannot allocate {nbytes} bytes: ask for at least 1")
        _fits_one_allocation(self, nbytes, "acquire")  # named as asked, before its size class
        size = self._bin_size(nbytes)
        block: B | None = None
        try:
            with deferred_sigint():
                block = self._take_idle(size)
                if block is None:
                    hazards.pool_allocation(getattr(self, "device", None), self._where, size)
                    block = self._allocate_with_ladder(size)
        except BaseException:
            if block is not None:
                self.release(block)
            raise
        return block

    def try_acquire(self, nbytes: int) -> B | None:
        """A block of at least ``nbytes`` if one is idle in the pool, else None (never
        allocates: what a growing staging ring takes at once, pipeline/ring.py). Whole under
        Ctrl-C, as :meth:`acquire` is."""
        size = self._bin_size(max(nbytes, 1))
        block: B | None = None
        try:
            with deferred_sigint():
                block = self._take_idle(size, count=False)
        except BaseException:
            if block is not None:
                self.release(block)
            raise
        return block

    def _take_idle(self, size: int, count: bool = True) -> B | None:
        """An idle block of ``size`` marked in use, or None (a miss, counted if ``count``)."""
        with self._lock:
            self._closed = False  # in use again: hold what comes back, as before close()
            self._collect_done()
            free = self._free.get(size)
            if not free or (self._limit is not None
                            and self._in_use_bytes + self._pending_bytes + size > self._limit):
                if count:
                    self._misses += 1
                return None
            block = free.pop()
            self._held_bytes -= size
            self._hits += 1
            return self._mark_in_use(block, size)

    @property
    def requests(self) -> int:
        """Requests so far (hits + misses): what :meth:`prepare` watches for."""
        with self._lock:
            return self._hits + self._misses

    def prepare(self, nbytes: int, count: int, stop: Callable[[], bool] | None = None, *,
                since: int | None = None, on_block: Callable[[], None] | None = None) -> int:
        """Allocate up to ``count`` idle blocks of ``nbytes`` ahead of any request (a device's
        warm-up, memory/warmup.py); return how many it made (``on_block()`` after each).
        Blocks made are kept even when it stops early, which it does once the pool has had a
        request since ``since`` (a :attr:`requests` count; default: now): a stream has begun,
        takes what is idle and grows its own ring. It also stops before passing the limit or
        the keep budget, at the first failed allocation (no error: the stream will meet it and
        say so; a size no allocation can have, 0 or past the device's largest, is an
        InputError), and when ``stop()`` returns true. Not counted as hits, misses or bytes in
        use, so it moves neither the statistics nor the keep budget."""
        nbytes = _whole_bytes(nbytes, "prepare")
        if nbytes <= 0:
            raise InputError(f"prepare: cannot allocate {nbytes} bytes: ask for at least 1")
        _fits_one_allocation(self, nbytes, "prepare")
        size = self._bin_size(nbytes)
        requests = self.requests if since is None else since
        with self._lock:
            self._closed = False  # made ready for use: held as before close()

        def admit() -> bool:  # no request since, and within the keep budget
            return (self._hits + self._misses == requests
                    and (self._keep is None or self._held_bytes + size <= self._keep))

        def idle(block: B) -> None:
            self._free.setdefault(size, []).append(block)
            self._held_bytes += size
            self._last_used[size] = self._streams

        made = 0
        while made < count and not (stop is not None and stop()):
            if self._allocate_reserved(size, admit, idle) is None:
                break
            made += 1
            if on_block is not None:
                on_block()
        return made

    def release(self, block: B, after: Event | None = None) -> None:
        """Give ``block`` back; it is reused only once ``after`` (if any) has completed.
        Whole under Ctrl-C (an interrupt between taking it out of use and filing it as idle
        lost it); a caller giving back several blocks defers Ctrl-C around its loop, or one
        raised as the first returns leaves the rest in use."""
        size = block.nbytes
        with deferred_sigint():
            self._give_back(block, size, after)

    def _give_back(self, block: B, size: int, after: Event | None) -> None:
        with self._lock:
            if self._in_use.pop(id(block), None) is None:
                raise InputError("block released twice, or to a pool it did not come from")
            self._in_use_bytes -= size
            self._last_used[size] = self._streams
            if after is not None and not _done(after):
                self._pending.append((after, block))
                self._pending_bytes += size
            else:
                self._free.setdefault(size, []).append(block)
                self._held_bytes += size
            # An explicit keep budget holds between streams too, not only when one ends: with
            # nothing in use (no stream runs), pinned arrays a program makes and drops were
            # all held, one block per size (keep=0 held megabytes). Within a stream some block
            # is always in use, so its ring is never trimmed before its own settle().
            doomed: list[B] = []
            if self._closed:
                self._collect_done()
                doomed = self._over_budget(0)
            elif self._keep is not None and not self._in_use_bytes \
                    and self._held_bytes > self._keep:
                doomed = self._over_budget(self._keep)
        for idle in doomed:
            idle.close()

    def _over_budget(self, budget: int) -> list[B]:
        """Idle blocks taken out (lock held), least recently used sizes first, until the idle
        bytes fit ``budget``; the caller closes them."""
        doomed: list[B] = []
        for size in sorted(self._free, key=lambda s: (self._last_used.get(s, 0), s)):
            blocks = self._free[size]
            while blocks and self._held_bytes > budget:
                doomed.append(blocks.pop())
                self._held_bytes -= size
            if not blocks:
                del self._free[size]
            if self._held_bytes <= budget:
                break
        self._trims += len(doomed)
        self._trimmed_bytes += sum(block.nbytes for block in doomed)
        return doomed

    def trim(self) -> int:
        """Free every idle block the pool holds; return the bytes freed."""
        with self._lock:
            self._collect_done()
            blocks = [b for free in self._free.values() for b in free]
            self._free.clear()
            freed = self._held_bytes
            self._held_bytes = 0
        with self._lock:
            self._trims += len(blocks)
            self._trimmed_bytes += freed
        for block in blocks:
            block.close()
        return freed

    def settle(self) -> int:
        """A stream has ended: give back idle blocks of classes unused for ``STALE_STREAMS``
        streams, then the least recently used ones until the idle bytes fit the keep budget
        (``keep``, else ``KEEP_FACTOR`` times the most bytes in use at once during the last
        ``STALE_STREAMS`` streams). Returns the bytes freed.
        """
        with self._lock:
            self._collect_done()
            self._streams += 1
            self._recent_peaks.append(self._stream_peak)
            budget = self._keep
            if budget is None:
                budget = KEEP_FACTOR * max(self._recent_peaks)
            if self._limit is not None:  # never more than the limit leaves beside what is used
                budget = min(budget, max(self._limit - self._in_use_bytes
                                         - self._pending_bytes, 0))
            self._keep_bytes = budget
            self._stream_peak = self._in_use_bytes
            newest_first = sorted(self._free, key=lambda s: (self._last_used.get(s, 0), s),
                                  reverse=True)
            doomed: list[B] = []
            kept = 0
            for size in newest_first:
                blocks = self._free[size]
                stale = self._streams - self._last_used.get(size, 0) > STALE_STREAMS
                fit = 0 if stale else min(len(blocks), max(budget - kept, 0) // size)
                kept += fit * size
                doomed.extend(blocks[fit:])
                del blocks[fit:]
                if not blocks:
                    del self._free[size]
            freed = sum(block.nbytes for block in doomed)
            self._held_bytes -= freed
            self._trims += len(doomed)
            self._trimmed_bytes += freed
            # Forget classes with nothing idle; a block in use sets its class again on release.
            for size in [s for s in self._last_used if s not in self._free]:
                del self._last_used[size]
        for block in doomed:
            block.close()
        return freed

    def stats(self) -> PoolStats:
        """Current counters."""
        self._free_if_closed()
        with self._lock:
            self._collect_done()
            return PoolStats(
                in_use_bytes=self._in_use_bytes,
                held_bytes=self._held_bytes,
                pending_bytes=self._pending_bytes,
                peak_in_use_bytes=self._peak,
                hits=self._hits,
                misses=self._misses,
                blocks_in_use=len(self._in_use),
                limit=self._limit,
                keep_bytes=self._keep if self._keep is not None else self._keep_bytes,
                trims=self._trims,
                trimmed_bytes=self._trimmed_bytes,
            )

    def reset_peak(self) -> None:
        """Start peak tracking afresh from the bytes in use now."""
        with self._lock:
            self._peak = self._in_use_bytes

    def close(self) -> None:
        """Wait for fenced blocks and free everything held. Blocks still in use stay valid;
        those given back later are freed as they come back (once their fence completes),
        until a block is asked for again."""
        with self._lock:
            self._closed = True
        self._drain_pending()
        self.trim()

    def _free_if_closed(self) -> None:
        """After close(): free blocks whose fences have completed since they came back."""
        with self._lock:
            if not self._closed:
                return
            self._collect_done()
            doomed = self._over_budget(0)
        for idle in doomed:
            idle.close()

    # -- internals --------------------------------------------------------------------------
    def _mark_in_use(self, block: B, size: int) -> B:
        self._in_use[id(block)] = block
        self._in_use_bytes += size
        self._peak = max(self._peak, self._in_use_bytes)
        self._stream_peak = max(self._stream_peak, self._in_use_bytes)
        self._last_used[size] = self._streams
        return block

    def _collect_done(self) -> None:
        if not self._pending:
            return
        # Detach the list first: a pinned array's finalizer may run during this loop (the GC
        # can fire on any allocation) and re-enter release() on this thread (RLock); with the
        # old `self._pending = still` its entry would be dropped and its block lost.
        pending, self._pending = self._pending, []
        still: list[tuple[Event, B]] = []
        for event, block in pending:
            if _done(event):  # an event that cannot answer stays pending (_done)
                self._free.setdefault(block.nbytes, []).append(block)
                self._held_bytes += block.nbytes
                self._pending_bytes -= block.nbytes
            else:
                still.append((event, block))
        self._pending.extend(still)

    def _drain_pending(self) -> None:
        with self._lock:
            pending = list(self._pending)
        for event, _ in pending:
            try:
                event.wait()
            except ConveyorError:
                pass  # a failed command is over too: its block is free to reuse
        with self._lock:
            self._collect_done()

    def add_evictable(self, holder: Evictable) -> None:
        """``holder`` keeps blocks of this pool that it can give back when it is not in use
        (a resident array: pipeline/resident.py); the out-of-memory ladder asks it to. Held
        weakly."""
        with self._lock:
            self._evictable.add(holder)

    def _evict_idle(self) -> bool:
        """Holders added by ``add_evictable`` that no stream uses give their blocks back (a
        resident array is uploaded again when next used), and those are freed; False when
        none gave anything back."""
        with self._lock:
            holders = list(self._evictable)
        if not sum(1 for holder in holders if holder.evict()):
            return False
        self.trim()
        return True

    def _try_allocate(self, size: int) -> B | None:
        return self._allocate_reserved(size, lambda: True,
                                       lambda block: self._mark_in_use(block, size))

    def _allocate_reserved(self, size: int, admit: Callable[[], bool],
                           place: Callable[[B], object]) -> B | None:
        """A new block of ``size``, or None when ``admit()`` says no, the limit would be
        passed or memory ran out. The bytes are reserved under the lock before allocating
        outside it, so two threads cannot both pass the limit check and exceed it together;
        ``place(block)`` runs under the lock as the reservation ends (it becomes use, or an
        idle block, in one step)."""
        with self._lock:
            if not admit():
                return None
            if self._limit is not None:
                total = (self._in_use_bytes + self._held_bytes + self._pending_bytes
                         + self._reserved_bytes)
                if total + size > self._limit:
                    return None
            self._reserved_bytes += size
        try:
            block = self.allocate(size)
        except BaseException as exc:
            with self._lock:
                self._reserved_bytes -= size
            if isinstance(exc, OutOfMemoryError):
                return None
            raise
        with self._lock:
            self._reserved_bytes -= size
            place(block)
        return block

    def _allocate_with_ladder(self, size: int) -> B:
        steps: list[Callable[[], object]] = [
            lambda: None,
            self.trim,
            self._drain_pending,
            self.trim,
            gc.collect,
            self.trim,
            self._evict_idle,
        ]
        for step in steps:
            if step() is False:
                continue  # nothing was freed: no point retrying
            block = self._try_allocate(size)
            if block is not None:
                return block
        with self._lock:
            in_use = self._in_use_bytes
        raise OutOfMemoryError(size, in_use, self._limit, where=self._where)


class DevicePool(BlockPool["DeviceBuffer"]):
    """The device's memory pool: ``device.memory_pool``."""

    def __init__(self, device: Device, limit: int | None = None) -> None:
        super().__init__(device.alloc_device, device_bin, limit=limit, keep=config.pool_keep(),
                         where="device")
        self.device = device


def _whole_bytes(nbytes: Any, call: str) -> int:
    """``nbytes`` as an int: a NumPy integer is one; InputError naming ``call`` and the value
    given for anything else (a float was taken by the device pool and refused by the pinned
    pool as 4096.0 bytes of alloc_pinned, a string was a raw TypeError)."""
    import numbers

    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral):
        raise InputError(f"{call}: nbytes={nbytes!r} is not a whole number of bytes")
    return int(nbytes)


def _fits_one_allocation(pool: Any, nbytes: int, call: str) -> None:
    """InputError, naming ``nbytes`` as asked, where it is more than the pool's device's
    largest allocation (its size class was named: 2**64 + 5 came out as 18446744073709555712;
    in a strict stream it was a hazard "allocated" first). A pool of host memory
    (``host_memory``) is bounded by the device's ``max_pinned_bytes`` instead, where it has
    one: CUDA's largest device allocation does not bound cuMemHostAlloc."""
    device = getattr(pool, "device", None)
    host = getattr(pool, "host_memory", False)
    largest = getattr(device, "max_pinned_bytes" if host else "max_alloc_bytes", None)
    if isinstance(largest, int) and nbytes > largest:
        raise InputError(f"{call}: {nbytes} bytes is more than "
                         f"{getattr(device, 'name', 'the device')}'s largest allocation"
                         f"{' of pinned memory' if host else ''} ({largest} bytes): ask "
                         f"for less")
