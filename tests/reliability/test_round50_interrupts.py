"""Round fifty (helper B): Ctrl-C and failures part way, after session 23's changes.

Tried (scripts under /tmp/r50int, not kept): the sweep of tests/pipeline/test_interrupt_sweep.py
(SIGINT raised at the N-th point where CPython runs a handler, counted from ``cv.stream``'s
call) over kinds of stream it does not try: a writable ``cv.resident`` table, a stream nested
in a callable sharing one, ``trace=``, ``CONVEYOR_RING_GROW=0``, a pinned pool limit, a
callable's float and int partials folded, a ``cv.iterate`` generator, a chain into an ``.npy``
file, two devices. After each: pools as before, no stream thread, the SIGINT handler back, no
file left beside the outputs, the table as documented.

Found (each an ``xfail(strict=True)`` test asserting the right behaviour):

- A Ctrl-C that arrives while a stream with a writable table finishes its last blocks (or
  copies the table back) is held until the engine's clean-up ends: the table is copied back
  all the same, and ``cv.stream`` then raises KeyboardInterrupt with no note that it was
  (file outputs, in the same moment, are not committed; a Ctrl-C among their renames is raised
  with ``errors.OUTPUTS_WRITTEN``). A caller who takes the KeyboardInterrupt for a failed
  stream (the README: "a failed stream's partial writes are dropped") and runs it again counts
  every row twice.
- A Ctrl-C inside ``files._probe_folder``'s clean-up (the ``finally`` that removes the probe
  made to check ``trace=``'s folder) leaves ``.conveyor-probe-PID-XXXX`` in the user's folder.
- A Ctrl-C while the trace file is made (``files.atomic_write`` -> ``new_part``, between
  ``mkstemp``'s open and the rename to ``.part``) leaves ``.t.json.XXXXXXXX.new`` (and its fd
  open): no later run removes ``.new`` files. ``sinks.FileSink.open`` holds Ctrl-C over the
  same call; ``atomic_write`` (the trace, ``timeline.save``, plots, the CLI's side files) does
  not.
- A stream with a writable table and a file output whose commit fails (its place taken by a
  folder) raises, but the table was already copied back (the engine copies it back before
  ``commit_all``): a failed stream's writes kept.

Held (run once here, not kept): a ``cv.iterate`` generator raising (its own error, or a
KeyboardInterrupt) with a writable table; a callable raising over two devices into an
``.npy``; a failing ``KernelFuture``; ``reduce=f`` raising over two devices: each raised its
own error, table untouched, pools of both devices at zero, no stream thread, no file, the
next stream right. The sweeps over ``CONVEYOR_RING_GROW=0``, a pinned limit, a callable's
folded partials, ``cv.iterate``, a chain into an ``.npy`` and two devices left nothing.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    HIST,
    assert_clean,
    first_device_only,  # noqa: F401 (autouse: first device only)
    kernel,
    next_stream_right,
    opencl_c_kernels,  # noqa: F401 (autouse: OpenCL C kernels)
)

import conveyor as cv  # noqa: E402
from conveyor import interrupts  # noqa: E402
from conveyor.errors import outputs_written  # noqa: E402
from conveyor.pipeline import engine as engine_module  # noqa: E402

#: Values 0..999 (x 7) counted mod 16 by HIST, in blocks of 256 rows.
XS = (np.arange(6000, dtype=np.uint32) * 7) % 1000
COUNTS = np.bincount(XS % 16, minlength=16).astype(np.uint32)


def _hist(device: cv.Device) -> cv.Kernel:
    return device.compile(HIST, "hist")


def _handler_back() -> None:
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert interrupts._region is None


# -- writable tables: a Ctrl-C at the stream's end ---------------------------------------------


def _table_stream(device: cv.Device, table: Any) -> None:
    cv.stream(_hist(device), [XS], [], args=(table,), device=device, block_bytes=1024,
              zero_copy=False)


def _dropped_or_said(counts: np.ndarray, exc: BaseException) -> None:
    """An interrupted stream either dropped its table writes (the table as before), or kept
    them and says so (the note file outputs get when a Ctrl-C lands among their renames)."""
    if counts.any():
        assert outputs_written(exc), (
            f"KeyboardInterrupt with the table copied back ({counts[:4].tolist()}...) and no "
            f"note saying so: a caller running the stream again counts every row twice")


def test_ctrl_c_as_the_last_block_retires_drops_the_tables_writes_or_says_it_kept_them(
        device, monkeypatch):
    counts = np.zeros(16, np.uint32)
    real = engine_module.Engine._retire

    def retire(self: Any, slot: Any) -> None:
        if slot.block.index == self.plan.block_count - 1:
            signal.raise_signal(signal.SIGINT)  # held: the stream's deferral
        real(self, slot)

    with cv.resident(counts, writable=True) as table:
        monkeypatch.setattr(engine_module.Engine, "_retire", retire)
        with pytest.raises(KeyboardInterrupt) as caught:
            _table_stream(device, table)
        monkeypatch.undo()
        _handler_back()
        _dropped_or_said(counts, caught.value)
        counts[:] = 0
        _table_stream(device, table)  # the next stream is right
        np.testing.assert_array_equal(counts, COUNTS)
    assert_clean(device)


def test_ctrl_c_during_the_copy_back_says_the_table_was_written(device):
    counts = np.zeros(16, np.uint32)
    with cv.resident(counts, writable=True) as table:
        real = table.copy_back

        def copy_back(queue: Any) -> None:
            signal.raise_signal(signal.SIGINT)  # held until the engine's clean-up ends
            real(queue)

        table.copy_back = copy_back  # type: ignore[method-assign]
        with pytest.raises(KeyboardInterrupt) as caught:
            _table_stream(device, table)
        del table.copy_back
        _handler_back()
        _dropped_or_said(counts, caught.value)
    assert_clean(device)


def test_ctrl_c_mid_stream_drops_the_tables_writes(device, monkeypatch):
    # Guard: a Ctrl-C between blocks stops the stream there, and the table is as it was.
    counts = np.zeros(16, np.uint32)
    real = engine_module.Engine._retire

    def retire(self: Any, slot: Any) -> None:
        if slot.block.index == 3:
            signal.raise_signal(signal.SIGINT)
        real(self, slot)

    with cv.resident(counts, writable=True) as table:
        monkeypatch.setattr(engine_module.Engine, "_retire", retire)
        with pytest.raises(KeyboardInterrupt):
            _table_stream(device, table)
        monkeypatch.undo()
        assert not counts.any()
        _table_stream(device, table)
        np.testing.assert_array_equal(counts, COUNTS)
    _handler_back()
    assert_clean(device)


# -- trace=: the folder's probe -----------------------------------------------------------------


class _After:
    """A profile hook that raises SIGINT at the ``skip``-th point (a Python call or a C
    function's return, where CPython runs a handler) after the C function ``builtin`` returned
    inside the Python function ``function`` (its first such return)."""

    def __init__(self, function: str, builtin: str, skip: int) -> None:
        self.function, self.builtin, self.skip = function, builtin, skip
        self.armed = False
        self.count = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event not in ("call", "c_return"):
            return
        if not self.armed:
            self.armed = (event == "c_return" and frame.f_code.co_name == self.function
                          and getattr(arg, "__name__", "") == self.builtin)
            return
        self.count += 1
        if self.count == self.skip:
            sys.setprofile(None)
            signal.raise_signal(signal.SIGINT)


def _traced_streams_left(device: cv.Device, folder: Path, function: str, builtin: str,
                         points: range) -> dict[int, list[str]]:
    """For each point of ``points``: a stream with ``trace=`` interrupted there (see
    :class:`_After`); the files other than the trace it left in ``folder``, by point."""
    a = np.arange(1000, dtype=np.float32)
    left: dict[int, list[str]] = {}
    for skip in points:
        sys.setprofile(_After(function, builtin, skip))
        try:
            cv.stream(kernel(device, "add"), [a, a], [np.float32], device=device,
                      trace=folder / "t.json")
        except KeyboardInterrupt:
            pass
        finally:
            sys.setprofile(None)
        names = sorted(p.name for p in folder.iterdir() if p.name != "t.json")
        if names:
            left[skip] = names
            for name in names:
                (folder / name).unlink()
    return left


def test_ctrl_c_while_the_trace_folder_is_probed_leaves_no_probe_file(device, tmp_path):
    # os.close's return, then the finally's steps up to its unlink
    left = _traced_streams_left(device, tmp_path, "_probe_folder", "open", range(1, 9))
    assert not left, f"Ctrl-C at these points after the probe's open left: {left}"
    _handler_back()
    assert_clean(device)
    next_stream_right(device)


def test_ctrl_c_while_the_trace_file_is_made_leaves_no_temporary(device, tmp_path):
    # From mkstemp's open returning to new_part's rename of the .new file to .part: sinks.open
    # holds Ctrl-C over this (a .new file is never removed by a later run), the trace's
    # atomic_write does not.
    left = _traced_streams_left(device, tmp_path, "_mkstemp_inner", "open", range(1, 12))
    assert not left, f"Ctrl-C at these points after mkstemp's open left: {left}"
    _handler_back()
    assert_clean(device)


# -- a failure after the work: the outputs' commit --------------------------------------------

#: HIST that also copies its input to an output.
HIST_COPY = """__kernel void hist_copy(__global const uint *x, __global uint *y,
                              __global uint *counts, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { y[i] = x[i]; atomic_inc(&counts[x[i] % 16]); }
}"""


def test_a_stream_whose_output_cannot_be_committed_drops_the_tables_writes(device, tmp_path):
    # The output's place is taken by a folder while the stream runs (here by its cv.iterate
    # generator, asked once more after the last row): the commit refuses it, as sinks.commit_all
    # says, and the stream raises. It did not succeed, so its table writes must go.
    target = tmp_path / "y.npy"

    def chunks() -> Any:
        for start in range(0, XS.size, 700):
            yield XS[start:start + 700]
        target.mkdir()

    counts = np.zeros(16, np.uint32)
    k = device.compile(HIST_COPY, "hist_copy")
    with cv.resident(counts, writable=True) as table:
        with pytest.raises((OSError, cv.InputError)):
            cv.stream(k, [cv.iterate(chunks(), XS.size)], [cv.npy_out(target)],
                      args=(table,), device=device, block_bytes=1024)
        assert target.is_dir()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["y.npy"]  # no part left
        np.testing.assert_array_equal(counts, 0)  # the failed stream's writes dropped
    assert_clean(device)
