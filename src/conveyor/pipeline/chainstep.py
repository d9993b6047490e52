"""The compute step of a chain (pipeline/chain.py): every link in order on the compute queue,
each block's temps in its own slot, each link a span of the compute lane of the timeline
("compute:<link title>": its name, ``name#2`` for the second link of one name)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from conveyor.backends.base import Device, Event, Queue
from conveyor.errors import InputError
from conveyor.interrupts import interruptible
from conveyor.pipeline.chainbind import BoundChain, BoundLink, Ref
from conveyor.pipeline.halo import Boundary, first_block
from conveyor.pipeline.io import Source
from conveyor.pipeline.paths import Records, Slot
from conveyor.pipeline.plan import Block, Plan
from conveyor.pipeline.step import (
    Step,
    _describe,
    _what,
    check_counts_fit,
    offset_arg,
    partial_of,
    release_temps,
    signed_offset,
    unalias,
    warm_up_rows,
)
from conveyor.trace.timeline import Between


class ChainStep(Step):
    """Enqueues the links of ``chain`` on one block. ``args`` holds each link's args (its
    resident arrays already on the device: chain.ChainResidents.upload)."""

    def __init__(self, chain: BoundChain, device: Device, plan: Plan,
                 args: Sequence[Any], records: Records, first_row: int = 0) -> None:
        super().__init__(plan, (), records, first_row)
        self.chain = chain
        self.device = device
        self.link_args = [tuple(a) for a in args] or [b.args for b in chain.links]
        self.last = chain.links[-1]
        for bound in chain.links:  # each kernel link's offset and n, before any block
            if bound.is_kernel:
                check_counts_fit(bound.compute, plan, first_row)
        self.signed = [bound.is_kernel and signed_offset(bound.compute)
                       for bound in chain.links]

    def enqueue(self, queue: Queue, slot: Slot, block: Block, wait_for: Sequence[Event]
                ) -> Event:
        n = block.rows * self.row_items
        offset = (self.first_row + block.start) * self.row_items
        waits: Sequence[Event] = wait_for
        event: Event | None = None
        returned: list[Any] = []
        for bound, args, signed in zip(self.chain.links, self.link_args, self.signed,
                                       strict=True):
            if bound.is_kernel:
                launch = [*(self._buffer(slot, ref) for ref in (*bound.reads, *bound.writes)),
                          *args, offset_arg(signed, offset), np.uint64(n)]
                event = queue.launch(bound.compute, n, launch, wait_for=waits)
                self.records.append((f"compute:{bound.title}", block.index, event, 0))
            else:
                before = queue.marker(wait_for=waits)
                result = self._call(bound, args, queue, slot, block, offset, n)
                if result is not None:
                    returned.append(result)  # kept until the block retires (step.py)
                event = queue.marker()
                self.records.append((f"compute:{bound.title}", block.index,
                                     Between(before, event), 0))
            waits = ()  # one in-order queue: each link starts after the one before
        slot.returned = returned or None
        assert event is not None
        return event

    # -- buffers -----------------------------------------------------------------------------
    def _buffer(self, slot: Slot, ref: Ref) -> Any:
        if ref.kind == "in":
            return slot.dev_in[ref.index]
        if ref.kind == "out":
            return slot.dev_out[ref.index]
        if ref.kind == "temp":
            return slot.temps[ref.index]
        return slot.scratch.values

    def _shape(self, ref: Ref, block: Block) -> tuple[tuple[int, ...], np.dtype]:
        """The shape and dtype of ``ref``'s rows of ``block`` as a callable sees them."""
        plan = self.plan
        if ref.kind == "in":
            spec = plan.inputs[ref.index]
            return (block.rows + 2 * plan.halo, *spec.shape[1:]), spec.dtype
        if ref.kind == "out":
            spec = plan.outputs[ref.index]
            lo, hi = plan.output_rows(ref.index, block)
            return (hi - lo, *spec.shape[1:]), spec.dtype
        temp = self.chain.temps[ref.index]
        return (block.rows, *(temp.row_shape or ())), temp.dtype

    def _call(self, bound: BoundLink, args: tuple[Any, ...], queue: Queue, slot: Any,
              block: Block, offset: int, n: int, buffers: Sequence[Any] | None = None) -> Any:
        """Call a callable link on device arrays of its buffers (``buffers``: in place of the
        slot's, for the warm-up); copy what it returns into its writes, or keep the block's
        partial when it ends a reduction. Returns what it returned."""
        refs = [*bound.reads, *bound.writes]
        found = buffers if buffers is not None else [self._buffer(slot, r) for r in refs]
        arrays = []
        for ref, buf in zip(refs, found, strict=True):
            shape, dtype = self._shape(ref, block)
            arrays.append(self.device.device_array(buf, shape, dtype, queue))
        with interruptible():  # the user's code: Ctrl-C lands in it as usual
            result = bound.compute(*arrays, *args, queue=queue.native, offset=offset, n=n)
        queue.after_callable(result)  # work it left on a library's own stream (CUDA)
        if bound is self.last and self.chain.reduces:
            queue.finish()  # get()/cpu() read on the library's stream (step.py)
            slot.partial = partial_of(result, block)
            return None
        if result is None:
            return None
        given = arrays[len(bound.reads):]
        values = list(result) if isinstance(result, tuple | list) else [result]
        if len(values) != len(bound.writes):
            raise InputError(
                f"{bound.where()} returned {len(values)} value(s) for its {len(bound.writes)} "
                f"write(s) {[r.name for r in bound.writes]}: return None (it wrote them), or "
                f"one device array per write (a tuple for several)")
        copies: list[Any] = []
        sizes: list[int] = []
        for ref, value, out in zip(bound.writes, values, given, strict=True):
            shape, dtype = self._shape(ref, block)
            sizes.append(int(np.prod(shape)) * dtype.itemsize)
            if value is out or (value is None and len(values) > 1):
                copies.append(None)  # written in place
                continue
            got_shape, got_dtype, contiguous = _describe(value)
            if got_shape != shape or got_dtype != dtype or not contiguous:
                hint = self.plan.outputs[ref.index].dtype_hint if ref.kind == "out" else ""
                raise InputError(
                    f"{bound.where()} returned {_what(got_shape, got_dtype, contiguous, value)} "
                    f"for {ref.name!r}, which holds a C-contiguous {dtype} array of shape "
                    f"{shape} for a block of {block.rows} rows: return that, or write into the "
                    f"array it was given and return None{hint}")
            copies.append(value)
        temps = unalias(queue, self.device, copies, given, sizes)  # returned swapped, say
        try:
            for ref, value, buf, nbytes in zip(bound.writes, copies, found[len(bound.reads):],
                                               sizes, strict=True):
                if value is not None:
                    try:
                        queue.copy_from_device(buf, value, nbytes)
                    except InputError as exc:  # another context, say: name the write
                        raise InputError(f"{bound.where()}, write {ref.name!r}: {exc}") \
                            from None
        finally:
            release_temps(self.device, temps, queue)
        return result

    # -- warm-up -----------------------------------------------------------------------------
    def warm_up(self, device: Device, queue: Queue, sources: Sequence[Source],
                boundary: Boundary = "nearest") -> None:
        """Call each callable link once on the first rows (at most ``WARMUP_ROWS``) before
        the stream, so libraries that load modules lazily load them now (step.py), and check
        what each returns. Kernels do not run (a kernel may add into a resident table); the
        buffers a callable reads that no input fills are zeros; inputs are the first block's rows as
        the stream gives them (with a halo, the pad rows under ``boundary`` first). Everything
        is dropped."""
        callables = [b for b in self.chain.links if not b.is_kernel]
        if not callables:
            return
        plan = self.plan
        rows = warm_up_rows(plan)
        first = Block(0, 0, rows)
        pool = device.memory_pool
        held: dict[str, Any] = {}
        try:
            for bound, args in zip(self.chain.links, self.link_args, strict=True):
                if bound.is_kernel:
                    continue
                for ref in (*bound.reads, *bound.writes):
                    if ref.name not in held:
                        held[ref.name] = self._warm_buffer(pool, queue, ref, first, sources,
                                                           boundary)
                found = [held[r.name] for r in (*bound.reads, *bound.writes)]
                self._call(bound, args, queue, _WarmSlot(), first,
                           self.first_row * self.row_items, rows * self.row_items, found)
                queue.finish()
        finally:
            for buffer in held.values():
                pool.release(buffer)

    def _warm_buffer(self, pool: Any, queue: Queue, ref: Ref, block: Block,
                     sources: Sequence[Source], boundary: Boundary) -> Any:
        shape, dtype = self._shape(ref, block)
        if ref.kind == "in":
            host = first_block(sources[ref.index], dtype, shape[1:], self.plan, block.rows,
                               boundary)
        else:
            host = np.zeros(shape, dtype)
        buffer = pool.acquire(max(host.nbytes, 1))
        try:
            if host.nbytes:
                queue.copy_in(buffer, host.reshape(-1).view(np.uint8))
                queue.finish()  # host is a local: copied before it goes
        except BaseException:
            pool.release(buffer)
            raise
        return buffer


class _WarmSlot:
    """Where a warm-up call's partial goes (dropped)."""

    partial: Any = None
