"""What owns a resource closes it: the ``Closeable`` mixin, and joins that Ctrl-C cannot cut.

Shared by the backends (buffers, queues, devices) and the pipeline (staging threads, paths,
the engine), so it lives below both. A join is the last thing standing between a worker thread
and the pinned buffer it copies into going back to its pool: ``finish_uninterrupted`` finishes
it even when a KeyboardInterrupt lands inside, then raises the interrupt.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any


class Closeable:
    """Mixin: ``close()`` plus the context-manager protocol."""

    def close(self) -> None:  # pragma: no cover - overridden
        """Release what this object holds. Safe to call twice."""

    def __enter__(self) -> Any:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def finish_uninterrupted(wait: Callable[[], None]) -> None:
    """Call ``wait()`` (a join) until it returns; a KeyboardInterrupt that lands inside is
    raised only after it has returned, so no thread outlives the caller's clean-up."""
    interrupted: KeyboardInterrupt | None = None
    while True:
        try:
            wait()
            break
        except KeyboardInterrupt as exc:  # join anyway, then raise it
            interrupted = exc
    if interrupted is not None:
        raise interrupted


def join(thread: threading.Thread) -> None:
    """Join ``thread`` even through Ctrl-C (see ``finish_uninterrupted``)."""
    if thread.is_alive():
        finish_uninterrupted(thread.join)
