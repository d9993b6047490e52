"""Halo rows that an input slot does not copy from the input as it stands.

With ``halo=h`` each input slot holds ``h`` rows before and ``h`` after its block. Two kinds
of those rows come from here instead of from the input at the moment of the copy:

- **Pad rows** past either end repeat the edge row. The device copies a pinned input straight
  from the caller's array, and one copy per pad row took minutes for a large halo (a halo of
  a million rows: two million copies). The ``h`` copies of each edge row are made once, in
  pinned memory, so each end is one copy. (Staged inputs repeat the edge row inside their
  pinned slot instead: ``fill_pads``.)
- **Rows an in-place stream overwrites** (an input that is also an output, see
  pipeline/overlap.py): block ``k`` reads the last ``h`` rows of block ``k - 1``, which block
  ``k - 1`` writes back, and on the pinned path nothing orders the two copies. Those rows
  are saved for every block before the first block runs: ``h`` rows per block of host
  memory, pinned where the device copies from them directly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from conveyor.backends.base import Device, PinnedBuffer
from conveyor.closing import Closeable
from conveyor.pipeline.io import ArraySource, Source
from conveyor.pipeline.plan import Block, Plan
from conveyor.pipeline.stage import copy_rows


class HaloRows(Closeable):
    """Pad rows of the pinned inputs in ``direct`` and saved rows of the inputs in
    ``in_place``, made now (before the first block). ``close()`` gives the pinned memory
    back; call it only once no copy reads it."""

    def __init__(self, device: Device, plan: Plan, sources: Sequence[Source],
                 direct: Sequence[bool], in_place: frozenset[int]) -> None:
        self._pool = device.pinned_pool
        self._pinned: list[PinnedBuffer] = []
        self._pads: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._saved: dict[int, np.ndarray] = {}
        self._halo = h = plan.halo
        try:
            for i, source in enumerate(sources):
                row_shape = source.shape[1:]
                if direct[i] and h:
                    assert isinstance(source, ArraySource)
                    pads = self._empty(True, (2, h, *row_shape), source.dtype)
                    pads[0] = source.array[0]
                    pads[1] = source.array[-1]
                    self._pads[i] = (pads[0], pads[1])
                if i in in_place and h and plan.block_count > 1:
                    saved = self._empty(direct[i], (plan.block_count - 1, h, *row_shape),
                                        source.dtype)
                    _save_rows(saved, source, plan)
                    self._saved[i] = saved
        except BaseException:
            self.close()
            raise

    def _empty(self, pinned: bool, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if not pinned:
            return np.empty(shape, dtype)
        count = int(np.prod(shape, dtype=np.int64))
        block = self._pool.acquire(max(count * dtype.itemsize, 1))
        self._pinned.append(block)
        return block.array[: count * dtype.itemsize].view(dtype).reshape(shape)

    def pads(self, i: int) -> tuple[np.ndarray, np.ndarray] | None:
        """``h`` copies of input ``i``'s first row and of its last row (pinned inputs)."""
        return self._pads.get(i)

    def before(self, i: int, block: Block) -> np.ndarray | None:
        """The ``h`` rows before ``block`` of input ``i`` as they were before the stream began,
        where a block before it writes them back (in place); None otherwise."""
        saved = self._saved.get(i)
        if saved is None or block.index == 0:
            return None
        return saved[block.index - 1]

    def direct_pieces(self, i: int, src: np.ndarray, block: Block, row_bytes: int
                      ) -> list[tuple[int, np.ndarray]]:
        """(byte offset in the slot, pinned rows) that fill pinned input ``i``'s slot for
        ``block``: the pad rows (one copy per end), the saved rows before the block (in
        place), and the rows of ``src`` itself."""
        h, rows = self._halo, len(src)
        lo, hi = max(block.start - h, 0), min(block.stop + h, rows)
        before = lo - (block.start - h)  # pad rows before the first row
        front, back = self._pads[i]
        pieces: list[tuple[int, np.ndarray]] = []
        if before:
            pieces.append((0, front[:before]))
        saved = self.before(i, block)
        if saved is not None:  # before is 0 here: every block but the first starts >= h
            pieces.append((0, saved))
            lo, before = block.start, h
        pieces.append((before * row_bytes, src[lo:hi]))
        after = block.rows + 2 * h - before - (hi - lo)
        if after:
            pieces.append(((before + hi - lo) * row_bytes, back[:after]))
        return pieces

    def close(self) -> None:
        """Give the pinned rows back to the pool."""
        pinned, self._pinned = self._pinned, []
        self._pads, self._saved = {}, {}
        for block in pinned:
            self._pool.release(block)


def _save_rows(saved: np.ndarray, source: Source, plan: Plan) -> None:
    """Rows ``[start - h, start)`` of every block but the first, into ``saved[k - 1]``."""
    h = plan.halo
    if isinstance(source, ArraySource) and h <= 64:  # one gather (its index: 8 bytes a row)
        starts = np.arange(1, plan.block_count, dtype=np.int64) * plan.block_rows
        rows = (starts[:, None] - h + np.arange(h, dtype=np.int64)).reshape(-1)
        np.take(source.array, rows, axis=0, out=saved.reshape(-1, *source.shape[1:]),
                mode="clip")
        return
    for k in range(1, plan.block_count):
        start = k * plan.block_rows
        copy_rows(saved[k - 1], source.rows(start - h, start))


def fill_pads(view: np.ndarray, first: int, end: int, source: Source, rows: int) -> None:
    """Fill the pad rows of a staged slot ``view`` whose rows ``[first, end)`` hold input rows:
    the rows before ``first`` and from ``end`` on lie past an end of the input and repeat its
    edge row, copied once from the source and then repeated within the slot."""
    if first:
        copy_rows(view[first - 1 : first], source.rows(0, 1))
        np.copyto(view[: first - 1], view[first - 1 : first])
    if end < len(view):
        copy_rows(view[end : end + 1], source.rows(rows - 1, rows))
        np.copyto(view[end + 1 :], view[end : end + 1])
