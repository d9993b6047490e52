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
        self._plan = plan
        if not enabled or plan.block_count == 0:
            return
        from tqdm import tqdm

        total = sum(self._bytes(block) for block in plan.blocks()[-2:])
        total += (plan.block_count - min(plan.block_count, 2)) * self._bytes(plan.block(0))
        self._bar = tqdm(total=total, unit="B", unit_scale=True,
                         unit_divisor=1000, desc="conveyor", leave=False)

    def advance(self, block: Block) -> None:
        """Count a finished block."""
        if self._bar is not None:
            self._bar.update(self._bytes(block))

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
        if self._bar is not None:
            self._bar.close()
            self._bar = None
