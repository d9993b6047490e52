"""Ordering a conveyor stream after the work a Python callable left on other CUDA streams.

A callable gets its block as device arrays and ``queue=``, conveyor's stream, to enqueue on.
Code written for CuPy or PyTorch without that stream runs on the library's current stream:
CUDA's legacy default stream unless the user chose another. ``return cupy.asarray(x) * 2``
then returns an array whose kernel may not have run yet, and conveyor's copy of it into the
block's output, on its own (non-blocking) stream, read it early: wrong values, no error (seen
on the H100: tests/pipeline/test_callable_streams.py). The CUDA Array Interface (version 3)
also says a consumer must wait for the ``stream`` an array names before reading it.

So after each call conveyor's stream waits, without blocking the host, for: the stream each
returned array's ``__cuda_array_interface__`` names; CUDA's legacy default stream and the
calling thread's per-thread default stream; and CuPy's and PyTorch's current streams, where
those libraries are loaded. A stream of another context, which an event of this one cannot
be recorded on, is synchronised from the host instead (what the interface allows too).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from conveyor.backends.cuda_driver import _check, driver

if TYPE_CHECKING:
    from conveyor.backends.cuda import Queue

#: CUDA's legacy default stream and the per-thread default stream, as stream handles.
LEGACY_STREAM = 1
PER_THREAD_STREAM = 2


def after_callable(queue: Queue, result: Any) -> None:
    """Make ``queue`` wait for every stream a callable's work (and ``result``) may be on."""
    streams = dict.fromkeys([*_named_streams(result), LEGACY_STREAM, PER_THREAD_STREAM,
                             *_library_streams(queue.device.index)])
    streams.pop(queue.handle, None)
    pool = queue.device._events
    for stream in streams:
        event = pool.take(False)
        try:
            code = driver.cuEventRecord(event, stream)[0]
            if int(code) == 0:
                _check(driver.cuStreamWaitEvent(queue._handle, event, 0), "cuStreamWaitEvent")
            else:  # another context's stream, say: wait for it from the host
                _check(driver.cuStreamSynchronize(stream), "cuStreamSynchronize")
        finally:
            pool.give(event, False)


def _named_streams(result: Any) -> Iterator[int]:
    """The streams the arrays in ``result`` (an array, or tuples and lists of them) name in
    their ``__cuda_array_interface__``: to be waited for before they are read."""
    values: Iterable[Any] = result if isinstance(result, tuple | list) else (result,)
    for value in values:
        if isinstance(value, tuple | list):
            yield from _named_streams(value)
            continue
        try:
            interface = getattr(value, "__cuda_array_interface__", None)
        except Exception:  # not a device array after all: the copy says so
            continue
        stream = interface.get("stream") if isinstance(interface, dict) else None
        if isinstance(stream, int) and not isinstance(stream, bool) and stream > 0:
            yield stream


def _library_streams(ordinal: int) -> Iterator[int]:
    """The current streams of CuPy and PyTorch where they are loaded (never loads them)."""
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            handle = int(cupy.cuda.get_current_stream().ptr)
        except Exception:  # a CuPy without a usable device here: nothing of it to wait for
            handle = 0
        if handle > 0:  # 0 is CuPy's name for the legacy stream, waited for anyway
            yield handle
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            handle = 0
            if torch.cuda.is_initialized():  # never initialise PyTorch's CUDA for this
                handle = int(torch.cuda.current_stream(ordinal).cuda_stream)
        except Exception:
            handle = 0
        if handle > 0:
            yield handle
