"""The progress bar of ``stream(progress=True)``: bytes done and GB/s, through tqdm.

The bar is a side channel, as a trace is: a standard error that fails (a closed pipe after a
killed ``| tee``, an ssh session gone) turns the bar off with one warning, and the stream goes
on. tqdm raised the pipe's BrokenPipeError out of the stream's clean-up, after every block had
run, and the finished stream's output files were thrown away.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from conveyor.backends.base import Closeable

if TYPE_CHECKING:
    from conveyor.pipeline.plan import Block, Plan


class Progress(Closeable):
    """Advances by each block's input and output bytes; does nothing when disabled."""

    def __init__(self, enabled: bool, plan: Plan) -> None:
        self._bar: Any = None
        self._plan = plan
        if not enabled or plan.block_count == 0:
            return
        from tqdm import tqdm

        total = sum(self._bytes(block) for block in plan.blocks()[-2:])
        total += (plan.block_count - min(plan.block_count, 2)) * self._bytes(plan.block(0))
        self._guarded(lambda: setattr(self, "_bar", tqdm(
            total=total, unit="B", unit_scale=True, unit_divisor=1000, desc="conveyor",
            leave=False)))

    def advance(self, block: Block) -> None:
        """Count a finished block."""
        bar = self._bar
        if bar is not None:
            self._guarded(lambda: bar.update(self._bytes(block)))

    def _guarded(self, call: Callable[[], object]) -> None:
        """``call()``; a failure to write the bar turns it off with a warning (module doc)."""
        try:
            call()
        except (OSError, ValueError) as exc:  # ValueError: "I/O operation on closed file"
            bar, self._bar = self._bar, None
            warnings.warn(f"conveyor: progress bar turned off ({type(exc).__name__}: {exc}); "
                          f"the stream goes on", RuntimeWarning, stacklevel=2)
            if bar is not None:
                try:
                    bar.close()  # leaves tqdm's instance list (and monitor) before it writes
                except (OSError, ValueError):
                    pass

    def _bytes(self, block: Block) -> int:
        """The input and output bytes of one block (outputs of other lengths included)."""
        plan = self._plan
        count = sum(block.rows * spec.row_bytes for spec in plan.inputs)
        for i, spec in enumerate(plan.outputs):
            lo, hi = plan.output_rows(i, block)
            count += (hi - lo) * spec.row_bytes
        return count

    def close(self) -> None:
        """Remove the bar."""
        bar = self._bar
        if bar is not None:
            self._guarded(bar.close)
            self._bar = None
