"""Python's thread switch interval, shortened while a stream runs.

conveyor's engine and staging threads make many short calls that give up the GIL (every CUDA
or OpenCL call, every NumPy copy, every lock wait). When another thread in the process runs
pure Python, each of those threads must then wait for the GIL to come back, and CPython makes a
waiting thread wait one whole switch interval (``sys.getswitchinterval()``, 5 ms by default)
before it asks the running thread to let go: the "convoy effect". On an H100 one busy Python
thread made a 1 GiB stream 20 times slower (bench/NOTES.md, session 8).

While at least one stream runs, the interval is lowered to ``CONVEYOR_SWITCH_INTERVAL``
(default 0.5 ms; ``off`` leaves it alone), and restored when the last stream ends, unless
someone else changed it meanwhile (then theirs stays). An interval already shorter is kept.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from conveyor import config
from conveyor.interrupts import deferred_sigint

_lock = threading.Lock()
_running = 0  # streams inside quick_switches()
_saved: float | None = None  # the interval to restore, when we changed it
_ours: float | None = None  # the interval we set (restored only if still in place)


@contextmanager
def quick_switches() -> Iterator[None]:
    """Run the body with the switch interval lowered (see the module docstring)."""
    global _running, _saved, _ours
    wanted = config.switch_interval()
    counted = False
    # Each half whole (a Ctrl-C after the interval was lowered but before it was counted left
    # it lowered for good, and no later stream restored it); the interrupt comes after.
    try:
        with deferred_sigint():
            with _lock:
                if _running == 0 and wanted is not None:
                    current = sys.getswitchinterval()
                    if current > wanted:
                        sys.setswitchinterval(wanted)
                        _saved, _ours = current, sys.getswitchinterval()
                _running += 1
                counted = True
        yield
    finally:
        if counted:
            with deferred_sigint(), _lock:
                _running -= 1
                if _running == 0 and _saved is not None:
                    if sys.getswitchinterval() == _ours:
                        sys.setswitchinterval(_saved)
                    _saved = _ours = None
