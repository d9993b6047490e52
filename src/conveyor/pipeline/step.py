"""The compute step of a stream, chosen once: a kernel launch, or a Python callable that
enqueues its own work on the compute queue."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from conveyor.backends.base import Device, Event, Kernel, Queue
from conveyor.pipeline.paths import Records, Slot
from conveyor.pipeline.plan import Block, Plan
from conveyor.trace.timeline import Between

Compute = Kernel | Callable[..., Any]


class Step:
    """Enqueues one block's compute; returns the event that ends it."""

    def __init__(self, plan: Plan, args: Sequence[Any], records: Records) -> None:
        self.plan = plan
        self.args = tuple(args)
        self.records = records
        self.row_items = plan.inputs[0].row_items

    def enqueue(self, queue: Queue, slot: Slot, block: Block, wait_for: Sequence[Event]
                ) -> Event:
        """Enqueue the compute of ``block`` in ``slot`` after ``wait_for``."""
        raise NotImplementedError


class KernelStep(Step):
    """A kernel launched over the block's elements: ``kernel(*inputs, *outputs (or the
    reduction's values), *args, offset, n)``."""

    def __init__(self, kernel: Kernel, plan: Plan, args: Sequence[Any], records: Records
                 ) -> None:
        super().__init__(plan, args, records)
        self.kernel = kernel

    def enqueue(self, queue: Queue, slot: Slot, block: Block, wait_for: Sequence[Event]
                ) -> Event:
        n = block.rows * self.row_items
        outputs = slot.dev_out if slot.scratch is None else [slot.scratch.values]
        args = [*slot.dev_in, *outputs, *self.args, np.uint64(block.start * self.row_items),
                np.uint64(n)]
        event = queue.launch(self.kernel, n, args, wait_for=wait_for)
        self.records.append(("compute", block.index, event, 0))
        return event


class CallableStep(Step):
    """A Python callable given device arrays of the block's inputs and outputs, then
    ``args``, ``queue=``, ``offset=``, ``n=``; with ``reduce=`` its return value is the
    block's partial (kept in ``slot.partial``)."""

    def __init__(self, function: Callable[..., Any], device: Device, plan: Plan,
                 args: Sequence[Any], records: Records, keeps_result: bool) -> None:
        super().__init__(plan, args, records)
        self.function = function
        self.device = device
        self.keeps_result = keeps_result

    def enqueue(self, queue: Queue, slot: Slot, block: Block, wait_for: Sequence[Event]
                ) -> Event:
        # Markers before and after the call: the span between them is the work the
        # callable enqueued on the compute queue (trace/timeline.py: Between).
        before = queue.marker(wait_for=wait_for)
        rows_in = block.rows + 2 * self.plan.halo
        arrays = [self.device.device_array(buf, (rows_in, *spec.shape[1:]), spec.dtype, queue)
                  for buf, spec in zip(slot.dev_in, self.plan.inputs, strict=True)]
        arrays += [self.device.device_array(buf, (block.rows, *spec.shape[1:]), spec.dtype,
                                            queue)
                   for buf, spec in zip(slot.dev_out, self.plan.outputs, strict=True)]
        # args= follow the arrays, as they follow the buffers of a kernel.
        result = self.function(*arrays, *self.args, queue=queue.native,
                               offset=block.start * self.row_items, n=block.rows * self.row_items)
        if self.keeps_result:
            slot.partial = _to_host(result)
        event = queue.marker()
        self.records.append(("compute", block.index, Between(before, event), 0))
        return event


def choose(compute: Compute, device: Device, plan: Plan, args: Sequence[Any],
           records: Records, reduce: bool) -> Step:
    """The step of ``compute``: a kernel launch or a callable."""
    if isinstance(compute, Kernel):
        return KernelStep(compute, plan, args, records)
    return CallableStep(compute, device, plan, args, records, keeps_result=reduce)


def _to_host(value: Any) -> Any:
    """A callable's partial as a host value (syncs on the device array if it is one)."""
    if hasattr(value, "get"):
        return value.get()
    if hasattr(value, "cpu"):
        return value.cpu().numpy()
    return value
