"""Ctrl-C that waits for a few lines: starting threads that must always be joined.

``Thread.start()`` first puts the thread in ``threading``'s limbo, then starts it and waits for
it to run. A KeyboardInterrupt that lands inside (the wait is interruptible) leaves a thread
that runs but that ``is_alive()`` calls not started, or one that never leaves limbo and is
listed by ``threading.enumerate()`` for ever; either way the engine's clean-up cannot join it,
and a staging thread outlives the stream that Ctrl-C stopped. ``deferred_sigint()`` holds a
SIGINT that arrives during such a short section and delivers it right after, so the section
runs whole and the interrupt still comes, to whatever handler the program had.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

#: Signals a program may give a Python handler that raises (a timeout on SIGALRM, a clean
#: exit on SIGTERM): held as SIGINT is, where such a handler is set. A SIGALRM handler that
#: raised inside the engine's clean-up left a staging ring's pinned blocks in use for good.
_OTHERS = tuple(getattr(signal, name) for name in (
    "SIGTERM", "SIGALRM", "SIGVTALRM", "SIGPROF", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT")
    if hasattr(signal, name))


@contextlib.contextmanager
def deferred_sigint() -> Iterator[None]:
    """Run the ``with`` block without a SIGINT (or another signal with a Python handler,
    ``_OTHERS``) landing in it; one that arrives is raised (through the program's own
    handler) as the block ends. Only the main thread receives signals, so elsewhere this
    does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = [s for s in _OTHERS if callable(signal.getsignal(s))]
    if signal.getsignal(signal.SIGINT) is not None:  # a handler set outside Python: leave it be
        held.insert(0, signal.SIGINT)
    if not held:
        yield
        return
    caught: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    previous: dict[int, Any] = {}
    try:
        for signum in held:
            previous[signum] = signal.signal(signum, hold)
    except ValueError:  # not the main interpreter
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(caught):  # now to the handlers the program had
            signal.raise_signal(signum)


def start_thread(thread: threading.Thread) -> None:
    """``thread.start()``, whole even when Ctrl-C arrives during it (see the module)."""
    with deferred_sigint():
        thread.start()
