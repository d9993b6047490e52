"""The shared supply of blocks of a stream over several devices (pipeline/multi.py).

``schedule="dynamic"``: an engine takes the next *run* of ``RUN_BLOCKS`` consecutive blocks
whenever it asks for a block beyond those it holds, which it does when its staging ring or its
device ring has room; so a device behind a slower link, or busy with another job, takes fewer
runs. ``schedule="static"``: engine ``i`` of ``n`` takes the blocks ``[i * blocks // n,
(i + 1) * blocks // n)``. Each engine sees its blocks through a :class:`Feed`, a BlockSource
(pipeline/plan.py) in which its ``k``-th block has ``seq`` k.
"""

from __future__ import annotations

import bisect
import threading

from conveyor.pipeline.plan import Block, Plan

#: Blocks an engine takes at once under the dynamic schedule: consecutive blocks keep file
#: reads sequential; few enough that the devices finish within a few blocks of each other.
RUN_BLOCKS = 4

SCHEDULES = ("dynamic", "static")


class Supply:
    """The blocks of one plan, handed out to ``engines`` engines (see the module)."""

    def __init__(self, plan: Plan, engines: int, schedule: str,
                 run_blocks: int = RUN_BLOCKS) -> None:
        self.plan = plan
        self.schedule = schedule
        count = plan.block_count
        # Runs no longer than a share of the blocks: a short stream still uses every device.
        self.run_blocks = max(1, min(run_blocks, count // (2 * engines)))
        self._bounds = [count * i // engines for i in range(engines + 1)]
        self._next = 0
        self._lock = threading.Lock()
        self.stopped = False

    def feed(self, engine: int) -> Feed:
        """The BlockSource of engine ``engine``."""
        return Feed(self, engine)

    def stop(self) -> None:
        """No engine takes another block (a failure, or Ctrl-C)."""
        with self._lock:
            self.stopped = True

    def claim(self, engine: int, taken: int) -> tuple[int, int]:
        """The next run ``[first, stop)`` of block indices for ``engine``, which has taken
        ``taken`` blocks so far; an empty run when none is left."""
        with self._lock:
            if self.stopped:
                return 0, 0
            if self.schedule == "static":
                first = self._bounds[engine] + taken
                return first, self._bounds[engine + 1] if taken == 0 else first
            first = self._next
            self._next = min(first + self.run_blocks, self.plan.block_count)
            return first, self._next


class Feed:
    """One engine's blocks from a :class:`Supply`: its ``k``-th block has ``seq`` k. The
    engine's thread and its staging thread both ask, each in increasing order."""

    def __init__(self, supply: Supply, engine: int) -> None:
        self.supply = supply
        self.engine = engine
        self._starts: list[int] = []  # the seq of each run's first block
        self._runs: list[tuple[int, int]] = []  # each run's [first, stop) block indices
        self._count = 0
        self._handed = 0  # positions up to this one were returned to someone
        self._lock = threading.Lock()

    def get(self, position: int) -> Block | None:
        """This engine's block ``position``, claiming runs as needed; None once the supply
        is empty, or stopped and no caller has had this position yet (once the engine's
        thread or its staging thread has had a block, the other gets it too: both see the
        same blocks)."""
        with self._lock:
            if self.supply.stopped and position >= self._handed:
                return None
            while position >= self._count:
                first, stop = self.supply.claim(self.engine, self._count)
                if stop <= first:
                    return None
                self._starts.append(self._count)
                self._runs.append((first, stop))
                self._count += stop - first
            self._handed = max(self._handed, position + 1)
            run = bisect.bisect_right(self._starts, position) - 1
            index = self._runs[run][0] + position - self._starts[run]
        block = self.supply.plan.block(index)
        return Block(block.index, block.start, block.stop, position)

    def blocks(self, count: int) -> list[Block]:
        """The first ``count`` blocks this engine took (for its report)."""
        found = []
        for position in range(count):
            with self._lock:
                run = bisect.bisect_right(self._starts, position) - 1
                index = self._runs[run][0] + position - self._starts[run]
            found.append(self.supply.plan.block(index))
        return found
