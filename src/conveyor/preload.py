"""Load the streaming modules beside device discovery, so the first ``cv.stream`` does not.

``import conveyor`` imports nothing heavy, and ``cv.stream`` loads the pipeline on first use:
about 0.13 s of the first stream of a process on the H100 host (cProfile, issue 17). A
process that looks for devices is about to stream, and discovery spends most of its time in
driver calls that release the GIL (0.6 s to find an H100's CUDA and OpenCL devices). So
discovery starts :func:`start`: one daemon thread that imports the pipeline while the driver
works. Python's per-module import locks make the main thread's own import wait for it, or
find it done. A fork waits for the thread first (``os.register_at_fork``), so no child starts
with a module lock held by a thread it has not got.
"""

from __future__ import annotations

import os
import threading

_thread: threading.Thread | None = None
_lock = threading.Lock()


def start() -> None:
    """Start loading the pipeline on a thread of its own (once per process)."""
    global _thread
    with _lock:
        if _thread is not None:
            return
        _thread = threading.Thread(target=_load, name="conveyor-preload", daemon=True)
        os.register_at_fork(before=wait)
        _thread.start()


def wait() -> None:
    """Wait until the thread has finished (at once when it has, or never started)."""
    thread = _thread
    if thread is not None and thread is not threading.current_thread() and thread.ident:
        thread.join()


def _load() -> None:
    try:
        import conveyor.pipeline.stream  # noqa: F401  (what cv.stream needs)
    except BaseException:  # the caller's own import raises it again, where it can be seen
        pass
