"""Getting a device ready for its first stream while the caller does something else (issue 17).

A fresh process's first stream paid two set-up costs the later ones do not: importing the
pipeline (``cv.stream`` loads it on first use: ~0.11 s on the H100 host) and allocating its
pinned staging ring (1 GiB for a 2-input map: ~0.1 s on CUDA with registered memory, 0.4-0.7 s
on NVIDIA's OpenCL). Doing both before the first stream brought that stream to the warm rate in
the same process (bench/NOTES.md, "the first stream: what a warm-up buys").

So ``cv.device()`` starts a :class:`WarmUp` for the device it hands out: a daemon thread that
imports the pipeline and, on a device that stages through pinned memory (not one that shares
memory with the host, such as PoCL's CPU device), puts pinned blocks of the default block size
(``DEFAULT_BLOCK_BYTES``, what a stream of 1-D arrays with default options asks for) into the
device's pool, idle. The caller's own work (loading data, building kernels) runs meanwhile.

How much: ``CONVEYOR_WARMUP`` (a size), else min(1 GiB, host memory / 16), in whole blocks;
``CONVEYOR_WARMUP=0`` (or ``off``) turns the warm-up off: no thread, and the first stream
imports the pipeline and allocates its ring itself. What it does not do:

- It never holds up a stream: it stops at the first block any stream asks the pool for (the
  stream takes what is idle and allocates or grows the rest itself), before passing the pool's
  ``limit`` or ``keep``, and at the first failed allocation. A block it made counts as neither
  hit, miss nor use, and the pool's keep budget trims it after later streams like any other
  idle block.
- Its failure is never an error: the stream allocates as it would have, and says what fails.
- ``device.close()`` stops it (after the allocation under way) and waits for it before the
  pools close; so does interpreter exit (for up to ``EXIT_WAIT`` seconds), so no driver call
  of its is under way while the interpreter tears the backends down.

Importing on a second thread is safe because the modules it imports have no import cycle
(tests/pipeline/test_warmup.py checks): Python's per-module import locks then only make one
thread wait for the other.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import TYPE_CHECKING

from conveyor import config

if TYPE_CHECKING:
    from conveyor.backends.base import Device

#: The default amount: at most this many bytes ...
DEFAULT_BYTES = 2**30
#: ... and at most this share of the host's physical memory.
HOST_SHARE = 16
#: At interpreter exit, how long to wait for a warm-up's allocation under way to finish.
EXIT_WAIT = 5.0

_running: weakref.WeakSet[WarmUp] = weakref.WeakSet()


def default_bytes() -> int:
    """``CONVEYOR_WARMUP`` when set, else min(``DEFAULT_BYTES``, host memory / ``HOST_SHARE``)."""
    chosen = config.warmup_bytes()
    if chosen is not None:
        return chosen
    try:
        host = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0  # unknown host memory: pin nothing ahead
    return min(DEFAULT_BYTES, host // HOST_SHARE)


class WarmUp:
    """One device's warm-up thread (started on construction). ``made`` is the pinned blocks
    it put in the pool, ``error`` what stopped it early (None when nothing failed).

    ``nbytes``: pinned bytes to put in the pool (default :func:`default_bytes`), in blocks of
    ``block_bytes`` (default the planner's ``DEFAULT_BLOCK_BYTES``); ``pinned``: whether to
    (default: when the device does not share memory with the host).
    """

    def __init__(self, device: Device, nbytes: int | None = None, *,
                 block_bytes: int | None = None, pinned: bool | None = None) -> None:
        self.device = device
        self.nbytes = default_bytes() if nbytes is None else nbytes
        self.block_bytes = block_bytes
        self.pinned = not device.host_unified if pinned is None else pinned
        self.made = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"conveyor-warmup-{device.spec}",
                                        daemon=True)
        from conveyor.pipeline.interrupts import start_thread

        _running.add(self)
        start_thread(self._thread)  # whole even when Ctrl-C lands during it

    def _run(self) -> None:
        try:
            # Pinned memory first: the driver calls and page faults leave the GIL to the
            # caller's thread, where the imports below would compete with its Python (a kernel
            # build right after cv.device() took 15 ms alone, 49 ms beside the imports).
            from conveyor.pipeline.plan import DEFAULT_BLOCK_BYTES

            block = self.block_bytes or DEFAULT_BLOCK_BYTES
            count = self.nbytes // block
            if count and self.pinned and not self._stop.is_set():
                self.made = self.device.pinned_pool.prepare(block, count, self._stop.is_set)
            # What cv.stream imports on first use (see the module docstring on safety).
            if not self._stop.is_set():
                import conveyor.pipeline.stream  # noqa: F401
        except BaseException as exc:  # an optimisation: the stream will meet any real problem
            self.error = exc

    @property
    def running(self) -> bool:
        """True while the thread works."""
        return self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the warm-up to end; True once it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self) -> None:
        """Stop after the allocation under way, and wait for the thread."""
        from conveyor.closing import join

        self._stop.set()
        join(self._thread)


@atexit.register
def _stop_all_at_exit() -> None:
    for warm in list(_running):
        warm._stop.set()
    for warm in list(_running):
        warm._thread.join(EXIT_WAIT)
