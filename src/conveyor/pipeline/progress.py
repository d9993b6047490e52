"""The progress bar of ``stream(progress=True)``: bytes done and GB/s, through tqdm."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conveyor.backends.base import Closeable

if TYPE_CHECKING:
    from conveyor.pipeline.plan import Block, Plan


class Progress(Closeable):
    """Advances by each block's input and output bytes; does nothing when disabled."""

    def __init__(self, enabled: bool, plan: Plan) -> None:
        self._bar: Any = None
        self._row_bytes = sum(s.row_bytes for s in plan.inputs + plan.outputs)
        if not enabled or plan.block_count == 0:
            return
        from tqdm import tqdm

        self._bar = tqdm(total=plan.rows * self._row_bytes, unit="B", unit_scale=True,
                         unit_divisor=1000, desc="conveyor", leave=False)

    def advance(self, block: Block) -> None:
        """Count a finished block."""
        if self._bar is not None:
            self._bar.update(block.rows * self._row_bytes)

    def close(self) -> None:
        """Remove the bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
