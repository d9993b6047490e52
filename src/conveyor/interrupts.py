"""Ctrl-C that lands only where stopping is safe.

CPython runs a Python signal handler (KeyboardInterrupt, for Ctrl-C) at the start of any
Python function and right after any C function returns, so a Ctrl-C can land between any two
steps of taking a resource and recording its owner. Found that way (RELIABILITY.md, "Ctrl-C
at every point of a stream"): a pool block marked in use and never handed over, a staging ring
made and never given to the engine, a ``Condition``'s lock taken by ``Condition.__enter__``
(Python code around a C lock) and never released, so the stream hung in its clean-up, and a
thread stuck in ``threading``'s limbo by an interrupt inside ``Thread.start()``.

``deferred_sigint()`` holds such a signal for the ``with`` block and raises it, through the
program's own handler, as the block ends. The engine runs a whole stream in one
(pipeline/engine.py), and calls :func:`checkpoint` where stopping is safe: between blocks and,
through :func:`wait` and :func:`wait_event`, in its waits, which on the main thread wait in
slices of ``WAIT_SLICE_S``. So a Ctrl-C still stops a stream within milliseconds, always at
a point its clean-up knows, and code that runs only inside a stream (its rings, slots, halo
rows, warm-up buffers) needs no deferral of its own. A user's function runs with the
program's handlers back (:func:`interruptible`): a loop in it stops on Ctrl-C as it would
anywhere. Deferrals nest (an inner one does nothing), and they swap handlers through
``_signal``, the C module under ``signal``: ``signal.signal`` wraps each handler in an enum
(12 us a call against 0.4 us).
Only signals with a Python handler are held: under ``SIG_DFL`` Ctrl-C ends the process at
once, as it should, and under ``SIG_IGN`` it does nothing.
"""

from __future__ import annotations

import _signal
import signal
import sys
import threading
from types import FrameType
from typing import Any

#: Signals a program may give a Python handler that raises (a timeout on SIGALRM, a clean
#: exit on SIGTERM): held as SIGINT is, where such a handler is set. A SIGALRM handler that
#: raised inside the engine's clean-up left a staging ring's pinned blocks in use for good.
_OTHERS = tuple(getattr(signal, name) for name in (
    "SIGTERM", "SIGALRM", "SIGVTALRM", "SIGPROF", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT")
    if hasattr(signal, name))


class _Region:
    """The outermost deferral the main thread is in: the handlers it replaced and the signals
    it caught (a deferral inside it does nothing)."""

    def __init__(self, previous: dict[int, Any]) -> None:
        self.previous = previous
        self.caught: list[int] = []

    def hold(self, signum: int, frame: FrameType | None) -> None:
        self.caught.append(signum)

    def holding(self) -> bool:
        """True while its hold is the handler (not inside :func:`interruptible`, and not a
        region whose end a Ctrl-C skipped: then a new deferral starts a region of its own)."""
        return any(_signal.getsignal(s) == self.hold for s in self.previous)


#: The main thread's deferral, while it is in one (only the main thread receives signals).
_region: _Region | None = None


def _on_main() -> bool:
    return threading.current_thread() is threading.main_thread()


class deferred_sigint:  # noqa: N801 - used as a function: ``with deferred_sigint():``
    """Run the ``with`` block without a SIGINT (or another signal with a Python handler,
    ``_OTHERS``) landing in it; one that arrives is raised (through the program's own
    handler) as the block ends, or earlier at a :func:`checkpoint` inside it. Deferrals
    nest: an inner one does nothing. Only the main thread receives signals, so elsewhere
    this does nothing."""

    def __enter__(self) -> None:
        global _region
        self._mine: _Region | None = None  # the region this deferral made, if it made one
        if not _on_main() or (_region is not None and _region.holding()):
            return
        self._parent = _region
        # SIGINT last: restored last (see __exit__).
        held = [s for s in (*_OTHERS, signal.SIGINT) if callable(_signal.getsignal(s))]
        if not held:
            return
        region = _Region({})
        try:
            for signum in held:
                # Kept before the swap: a Ctrl-C as the swap returns (where CPython runs
                # handlers) must find it to put back.
                region.previous[signum] = _signal.getsignal(signum)
                _signal.signal(signum, region.hold)
        except ValueError:  # not the main interpreter
            for signum, handler in region.previous.items():
                _signal.signal(signum, handler)
            return
        except BaseException:
            # A Ctrl-C between two swaps (the SIGINT handler still the program's): every
            # handler swapped so far goes back before it is raised, or the program's own
            # SIGTERM/SIGUSR1 handler stayed replaced by ``hold`` for good.
            for signum, handler in region.previous.items():
                _signal.signal(signum, handler)
            raise
        _region = self._mine = region

    def __exit__(self, *exc: object) -> None:
        global _region
        region = self._mine
        if region is None:
            return
        _region = self._parent
        # SIGINT last: once its handler is back, a new Ctrl-C may raise here, and every other
        # handler must be back by then.
        for signum, handler in region.previous.items():
            _signal.signal(signum, handler)
        for signum in dict.fromkeys(region.caught):  # now to the handlers the program had
            signal.raise_signal(signum)


def checkpoint() -> None:
    """Inside a deferral on the main thread: run the program's handler now (KeyboardInterrupt,
    for Ctrl-C) for each signal held so far. The engine calls it where stopping is safe (between
    blocks, in its waits), so a Ctrl-C still stops a long stream at once while no
    KeyboardInterrupt lands inside ``threading``'s own code: one raised just after
    ``Condition.__enter__`` took its lock left the lock held and the stream hung in its
    clean-up. A handler that raises leaves the other held signals to the deferral's end."""
    region = _region
    if region is None or not region.caught or not _on_main():
        return
    frame = sys._getframe(1)
    for signum in dict.fromkeys(region.caught):
        region.caught = [s for s in region.caught if s != signum]
        region.previous[signum](signum, frame)


#: How long one wait in a deferral lasts before it looks for a held Ctrl-C (seconds): how
#: late a Ctrl-C may stop a stream that waits. At 50 ms, two H100 engines ran 96 more blocks
#: after one (tests/pipeline/test_multi.py); a wake-up costs microseconds.
WAIT_SLICE_S = 0.005


def wait(cond: threading.Condition) -> None:
    """``cond.wait()`` (its lock held) that a held Ctrl-C interrupts: inside a deferral on the
    main thread it waits at most ``WAIT_SLICE_S``, then runs :func:`checkpoint`. The caller
    loops on its condition, as ``Condition.wait`` wants anyway."""
    if _region is not None and _on_main():
        cond.wait(WAIT_SLICE_S)
        checkpoint()
    else:
        cond.wait()


def wait_event(event: threading.Event) -> None:
    """``event.wait()``, interrupted as :func:`wait` is."""
    if _region is not None and _on_main():
        while not event.wait(WAIT_SLICE_S):
            checkpoint()
        checkpoint()
    else:
        event.wait()


class interruptible:  # noqa: N801 - used as a function: ``with interruptible():``
    """Inside a deferral, let signals land as usual for the ``with`` block (a user's function,
    which may loop for as long as it likes): what was held is delivered first, the program's
    handlers are back for the block, and the deferral's hold returns after it, if that
    deferral is still the one the main thread is in. (A class, not a generator: a generator's
    clean-up skipped by a Ctrl-C ran when it was collected, after its deferral had ended, and
    put a dead hold back for good: every later Ctrl-C was swallowed.)"""

    def __enter__(self) -> None:
        self._region = region = _region if _on_main() else None
        if region is None:
            return
        checkpoint()
        for signum, handler in region.previous.items():
            _signal.signal(signum, handler)

    def __exit__(self, *exc: object) -> None:
        region = self._region
        if region is not None and region is _region:
            for signum in region.previous:
                _signal.signal(signum, region.hold)


def start_thread(thread: threading.Thread) -> None:
    """``thread.start()``, whole even when Ctrl-C arrives during it (see the module)."""
    with deferred_sigint():
        thread.start()
