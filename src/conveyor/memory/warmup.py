"""Getting a device ready for its first stream while the caller does something else (issue 17).

A fresh process's first stream paid two set-up costs the later ones do not: importing the
pipeline (``cv.stream`` loads it on first use: ~0.11 s on the H100 host) and allocating its
pinned staging ring (1 GiB for a 2-input map: ~0.1 s on CUDA with registered memory, 0.4-0.7 s
on NVIDIA's OpenCL). Doing both before the first stream brought that stream to the warm rate in
the same process (bench/NOTES.md, "the first stream: what a warm-up buys").

So ``cv.device()`` starts a :class:`WarmUp` for the device it hands out when that device
stages through pinned memory (a GPU; not one that shares memory with the host, such as PoCL's
CPU device, where the imports alone cost a command that streams at once more than they save):
a daemon thread that puts pinned blocks of the default block size (``DEFAULT_BLOCK_BYTES``,
what a stream of 1-D arrays with default options asks for) into the device's pool, idle, and
then imports the pipeline. The caller's own work (loading data, building kernels) runs
meanwhile; the pinned blocks come first because their driver calls and page faults leave the
GIL to the caller (a kernel build right after ``cv.device()`` took 15 ms alone and 49 ms beside
the imports, on the H100 host).

How much: ``CONVEYOR_WARMUP`` (a size, at least one block, per device; ``on``: the default),
else up to 1 GiB per device, all of a process's devices together at most host memory / 16
(claimed as each device starts its warm-up, not given back); never more than a quarter of
the host's memory per device. ``CONVEYOR_WARMUP=0`` (or ``off``) turns the warm-up off: no
thread, and the first stream imports the pipeline and allocates its ring itself. Blocks it
made stay in the pool until streams' keep budget trims them, ``pool.trim()`` or
``device.close()``.

What it does not do:

- It never holds up a stream: it stops at the first block anything asks the pool for after
  ``cv.device()`` (the stream takes what is idle and allocates or grows the rest itself),
  before passing the pool's ``limit`` or ``keep``, and at the first failed allocation. A block
  it made counts as neither hit, miss nor use, so it moves neither statistics nor budget.
- Its failure is never an error: the stream allocates as it would have, and says what fails.
- It does not run on while something else owns the process: ``device.close()`` stops it
  (after the allocation under way) and waits for it before the pools close; so do interpreter
  exit and ``os.fork()`` (a child must not inherit an import lock or a pool lock that its
  thread held), each for at most ``STOP_WAIT`` seconds; ``Device.wait_for_warm_up()`` is for
  code that times the device (``conveyor bench``, ``conveyor devices --measure``).

Importing on a second thread is safe because the modules it imports have no import cycle
(tests/pipeline/test_warmup.py checks): Python's per-module import locks then only make one
thread wait for the other.
"""

from __future__ import annotations

import atexit

# Imported here, before this module registers its fork hook, not first by the warm-up thread:
# logging's own hook takes logging's lock before a fork and so must run after ours (ours waits
# for the thread, whose imports call logging.getLogger); a module that registers its hooks
# while ours runs would get its after-fork hook without its before-fork one
# (concurrent.futures.thread: "release unlocked lock").
import concurrent.futures.thread  # noqa: F401
import logging  # noqa: F401
import os
import threading
import weakref
from typing import TYPE_CHECKING

from conveyor import config
from conveyor.memory.hostmem import physical_bytes

if TYPE_CHECKING:
    from conveyor.backends.base import Device

#: The default amount: at most this many bytes per device ...
DEFAULT_BYTES = 2**30
#: ... and at most this share of the host's physical memory for all devices together.
HOST_SHARE = 16
#: Whatever is asked, at most this share of the host's memory per warm-up.
HOST_CAP_SHARE = 4
#: At interpreter exit and before a fork, how long to wait for a warm-up's allocation under way.
STOP_WAIT = 5.0

_lock = threading.Lock()
_running: weakref.WeakSet[WarmUp] = weakref.WeakSet()
_default_given = 0  # bytes of the shared default handed out to warm-ups so far


def _block_bytes() -> int:
    from conveyor.pipeline.plan import DEFAULT_BLOCK_BYTES

    return DEFAULT_BLOCK_BYTES


def default_bytes() -> int:
    """What ``CONVEYOR_WARMUP`` asks for (config refuses less than one block but more than 0),
    else min(``DEFAULT_BYTES``, host memory / ``HOST_SHARE``); 0 where host memory is unknown."""
    chosen = config.warmup_bytes()
    if chosen is not None:
        return chosen
    host = physical_bytes()
    return 0 if host is None else min(DEFAULT_BYTES, host // HOST_SHARE)


def _claim_default() -> int:
    """This warm-up's share of the process's default amount (what others have not taken);
    ``CONVEYOR_WARMUP``'s size as it is, when set (it is per device)."""
    global _default_given
    chosen = config.warmup_bytes()
    if chosen is not None:
        return chosen
    host = physical_bytes() or 0
    with _lock:
        share = max(0, min(DEFAULT_BYTES, host // HOST_SHARE - _default_given))
        _default_given += share
    return share


class WarmUp:
    """One device's warm-up; :meth:`start` starts its thread. ``made`` counts the pinned
    blocks it has put in the pool; ``error`` is what stopped it early (None if nothing failed).

    ``nbytes``: pinned bytes to put in the pool (default: :func:`default_bytes`, shared by the
    process's devices), in blocks of ``block_bytes`` (default the planner's
    ``DEFAULT_BLOCK_BYTES``); ``pinned``: whether to (default: when the device does not share
    memory with the host). Never more than a quarter of the host's memory.
    """

    def __init__(self, device: Device, nbytes: int | None = None, *,
                 block_bytes: int | None = None, pinned: bool | None = None) -> None:
        self.device = device
        self.block_bytes = block_bytes or _block_bytes()
        self.pinned = not device.host_unified if pinned is None else pinned
        asked = (_claim_default() if self.pinned else 0) if nbytes is None else nbytes
        host = physical_bytes()
        self.nbytes = asked if host is None else min(asked, host // HOST_CAP_SHARE)
        self.made = 0
        self.error: BaseException | None = None
        self._since: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"conveyor-warmup-{device.spec}",
                                        daemon=True)

    def start(self) -> WarmUp:
        """Start the thread (once; not after :meth:`stop`). A request the pool gets from now
        on stops the pinned part, even one made before the thread gets going."""
        from conveyor.interrupts import start_thread

        if self._stop.is_set() or self._thread.ident is not None:
            return self
        try:
            if self.pinned and self.nbytes >= self.block_bytes:
                self._since = self.device.pinned_pool.requests
            with _lock:
                _running.add(self)
            start_thread(self._thread)  # whole even when Ctrl-C lands during it
        except Exception as exc:  # no thread to be had ("can't start new thread"): no warm-up
            self.error = exc
            self._stop.set()
        return self

    def _run(self) -> None:
        try:
            count = self.nbytes // self.block_bytes
            if count and self.pinned and not self._stop.is_set():
                self.device.pinned_pool.prepare(self.block_bytes, count, self._stop.is_set,
                                                since=self._since, on_block=self._count)
            # What cv.stream imports on first use (see the module docstring on safety).
            if not self._stop.is_set():
                import conveyor.pipeline.stream  # noqa: F401
        except BaseException as exc:  # an optimisation: the stream will meet any real problem
            self.error = exc

    def _count(self) -> None:
        self.made += 1

    @property
    def running(self) -> bool:
        """True while the thread works."""
        return self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the warm-up to end; True once it has (or when it never started)."""
        if self._thread.ident is not None:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the allocation under way, and wait for the thread (at most
        ``timeout`` seconds when given)."""
        from conveyor.closing import join

        self._stop.set()
        if self._thread.ident is None:
            return  # never started
        if timeout is None:
            join(self._thread)
        else:
            self._thread.join(timeout)


def _stop_all() -> None:
    """Stop every running warm-up and wait for each (bounded): at exit, and before a fork."""
    with _lock:
        running = list(_running)
    for warm in running:
        warm._stop.set()
    for warm in running:
        warm.stop(STOP_WAIT)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread of the parent may have held it


atexit.register(_stop_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_stop_all, after_in_child=_after_fork_in_child)
