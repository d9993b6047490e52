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


@contextlib.contextmanager
def deferred_sigint() -> Iterator[None]:
    """Run the ``with`` block without a SIGINT landing in it; one that arrives is raised
    (through the program's own handler) as the block ends. Only the main thread receives
    signals, so elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGINT) is None:  # a handler set outside Python: leave it be
        yield
        return
    caught: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    try:
        previous = signal.signal(signal.SIGINT, hold)
    except ValueError:  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            signal.raise_signal(signal.SIGINT)  # now to the handler the program had


def start_thread(thread: threading.Thread) -> None:
    """``thread.start()``, whole even when Ctrl-C arrives during it (see the module)."""
    with deferred_sigint():
        thread.start()
