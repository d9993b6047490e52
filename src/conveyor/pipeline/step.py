"""The compute step of a stream, chosen once: a kernel launch, or a Python callable that
enqueues its own work on the compute queue."""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from conveyor.backends.base import Device, Event, Kernel, Queue
from conveyor.errors import InputError
from conveyor.interrupts import interruptible
from conveyor.pipeline import image
from conveyor.pipeline.chainbind import BoundChain
from conveyor.pipeline.halo import Boundary, first_block
from conveyor.pipeline.io import Source
from conveyor.pipeline.paths import Records, Slot
from conveyor.pipeline.plan import Block, Plan
from conveyor.trace.timeline import Between

Compute = Kernel | Callable[..., Any] | BoundChain

#: Rows a callable is warmed up on before the stream (at most a block, at most the input).
WARMUP_ROWS = 64


#: Every element offset a stream passes (``offset``, and ``offset + n`` at the end of its last
#: block) lies in [-2**63, 2**63]: a signed 64-bit integer, so a kernel's ``ulong offset``
#: (a negative first_row wraps, pipeline/options.py) is each row's index in two's complement
#: and no offset is repeated, and a callable's int fits the int64 of CuPy, PyTorch or Numba.
OFFSET_LIMIT = 1 << 63


def check_offsets(first_row: int, rows: int, row_items: int) -> None:
    """InputError when the element offsets of a stream of ``rows`` rows (``row_items``
    elements each) starting at row ``first_row`` of the whole array leave a signed 64-bit
    integer: past it a kernel's ``ulong offset`` wraps around and gives rows the offsets of
    other rows, silently. The message gives the first_row values that fit."""
    first, end = first_row * row_items, (first_row + rows) * row_items
    if -OFFSET_LIMIT <= first and end <= OFFSET_LIMIT:
        return
    lowest = -(OFFSET_LIMIT // row_items)  # row_items > 0 here: with 0, every offset is 0
    highest = OFFSET_LIMIT // row_items - rows
    per_row = f" of {row_items} elements" if row_items != 1 else ""
    fits = (f"pass a first_row from {lowest} to {highest}" if lowest <= highest else
            f"no first_row fits {rows} rows{per_row}: stream fewer rows at a time")
    raise InputError(
        f"first_row={first_row} with {rows} rows{per_row}: the element offsets would run from "
        f"{first} to {end}, past a signed 64-bit integer (-2**63 to 2**63), where a kernel's "
        f"ulong offset wraps around and gives rows the offsets of other rows; {fits}")


def check_counts_fit(kernel: Kernel, plan: Plan, first_row: int) -> None:
    """InputError, before any block, when the kernel's ``offset`` or ``n`` parameter (its
    last two) is an integer type too narrow for the values this stream passes (a ``uchar n``
    with blocks of 300 elements; a ``uint offset`` or ``int offset`` below a negative
    ``first_row``'s offsets): found at the launch of the block that needs it before, after
    earlier blocks had written their rows. A ``ulong offset`` takes a negative offset modulo
    2**64 (unsigned arithmetic gives ``offset + i`` right)."""
    params = list(getattr(kernel, "params", ()))
    if len(params) < 2 or not plan.block_count:
        return
    row_items = plan.inputs[0].row_items
    largest = {"offset": (first_row + (plan.block_count - 1) * plan.block_rows) * row_items,
               "n": min(plan.block_rows, plan.rows) * row_items}
    smallest = first_row * row_items  # block 0's offset
    for param, (what, value) in zip(params[-2:], largest.items(), strict=True):
        dtype = param.dtype
        if dtype is None or dtype.kind not in "iu":
            continue
        info = np.iinfo(dtype)
        where = f"kernel {kernel.name!r}: parameter {param.name!r} ({param.type_text})"
        if value > info.max:
            raise InputError(
                f"{where} receives {what}, up to {value} in this stream, past its type's "
                f"largest value {info.max}: declare it ulong")
        if what == "offset" and smallest < info.min and not (dtype.kind == "u"
                                                             and dtype.itemsize == 8):
            fix = ("declare it ulong (a negative offset wraps modulo 2**64) or long"
                   if dtype.kind == "u" else "declare it long")
            raise InputError(
                f"{where} receives offset, down to {smallest} in this stream (first_row="
                f"{first_row}), below its type's smallest value {info.min}: {fix}")


def signed_offset(kernel: Kernel) -> bool:
    """Whether the kernel's ``offset`` parameter (its last but one) is a signed integer
    (``long offset``): read once per step, not per block."""
    params: Sequence[Any] = getattr(kernel, "params", ())
    dtype = params[-2].dtype if len(params) >= 2 else None
    return dtype is not None and dtype.kind == "i"


def offset_arg(signed: bool, offset: int) -> np.integer:
    """Block ``offset`` as the kernel's ``offset`` parameter takes it (``signed``: see
    :func:`signed_offset`): a signed one gets the offset itself, negative for rows before the
    whole array's row 0 (a negative ``first_row``); any other, the offset modulo 2**64, so a
    ``ulong offset``'s unsigned arithmetic still gives ``offset + i`` right.
    :func:`check_counts_fit` has checked that it fits."""
    return np.int64(offset) if signed else np.uint64(offset % (1 << 64))


class Step:
    """Enqueues one block's compute; returns the event that ends it. ``first_row`` is known
    to keep every offset within a signed 64-bit integer (``cv.stream`` checks it with
    :func:`check_offsets` before any work)."""

    def __init__(self, plan: Plan, args: Sequence[Any], records: Records,
                 first_row: int = 0) -> None:
        self.plan = plan
        # Row of the whole array that row 0 of these inputs is (cv.stream's first_row): the
        # offsets a step passes count from there (conveyor.dask streams one chunk at a time).
        self.first_row = first_row
        self.args = tuple(args)
        self.records = records
        self.row_items = plan.inputs[0].row_items

    def enqueue(self, queue: Queue, slot: Slot, block: Block, wait_for: Sequence[Event]
                ) -> Event:
        """Enqueue the compute of ``block`` in ``slot`` after ``wait_for``."""
        raise NotImplementedError

    def warm_up(self, device: Device, queue: Queue, sources: Sequence[Source],
                boundary: Boundary = "nearest") -> None:
        """Run what must run once before the stream (callables: see CallableStep)."""


class KernelStep(Step):
    """A kernel launched over the block's elements: ``kernel(*inputs, *outputs (or the
    reduction's values), *args, offset, n)``."""

    def __init__(self, kernel: Kernel, plan: Plan, args: Sequence[Any], records: Records,
                 first_row: int = 0) -> None:
        super().__init__(plan, args, records, first_row)
        self.kernel = kernel
        check_counts_fit(kernel, plan, first_row)
        self.signed_offset = signed_offset(kernel)

    def enqueue(self, queue: Queue, slot: Slot, block: Block, wait_for: Sequence[Event]
                ) -> Event:
        n = block.rows * self.row_items
        outputs = slot.dev_out if slot.scratch is None else [slot.scratch.values]
        offset = offset_arg(self.signed_offset,
                            (self.first_row + block.start) * self.row_items)
        inputs = image.launch_inputs(slot.dev_in)  # an image input: its image and sampler
        args = [*inputs, *outputs, *self.args, offset, np.uint64(n)]
        event = queue.launch(self.kernel, n, args, wait_for=wait_for)
        self.records.append(("compute", block.index, event, 0))
        return event


class CallableStep(Step):
    """A Python callable given device arrays of the block's inputs and outputs, then
    ``args``, ``queue=``, ``offset=``, ``n=``. With ``reduce=`` its return value is the
    block's partial (kept in ``slot.partial``); without, it may return device arrays (one per
    output, or a tuple), copied into the block's outputs on the compute queue."""

    def __init__(self, function: Callable[..., Any], device: Device, plan: Plan,
                 args: Sequence[Any], records: Records, keeps_result: bool,
                 first_row: int = 0) -> None:
        super().__init__(plan, args, records, first_row)
        self.function = function
        self.device = device
        self.keeps_result = keeps_result
        check_signature(function, len(plan.inputs) + len(plan.outputs) + len(self.args))

    def enqueue(self, queue: Queue, slot: Slot, block: Block, wait_for: Sequence[Event]
                ) -> Event:
        # Markers before and after the call: the span between them is the work the
        # callable enqueued on the compute queue (trace/timeline.py: Between).
        before = queue.marker(wait_for=wait_for)
        rows_in = block.rows + 2 * self.plan.halo
        arrays = [self.device.device_array(buf, (rows_in, *spec.shape[1:]), spec.dtype, queue)
                  for buf, spec in zip(slot.dev_in, self.plan.inputs, strict=True)]
        arrays += self._outputs(slot.dev_out, block, queue)
        # args= follow the arrays, as they follow the buffers of a kernel.
        offset = (self.first_row + block.start) * self.row_items
        with interruptible():  # the user's code: Ctrl-C lands in it as usual
            result = self.function(*arrays, *self.args, queue=queue.native, offset=offset,
                                   n=block.rows * self.row_items)
        queue.after_callable(result)  # work it left on a library's own stream (CUDA)
        temps: list[Any] = []
        if self.keeps_result:
            # A device array's get() (CuPy) or cpu() (PyTorch) reads on its library's current
            # stream, which does not wait for this queue: the work is finished first (a CuPy
            # sum returned from queue's stream read early on the H100, under load).
            queue.finish()
            slot.partial = partial_of(result, block)
        elif result is not None:
            slot.returned = result
            outputs = arrays[len(self.plan.inputs):]
            values = self._returned(result, outputs, block)
            sizes = [(hi - lo) * spec.row_bytes for (lo, hi), spec in zip(
                (self.plan.output_rows(i, block) for i in range(len(values))),
                self.plan.outputs, strict=True)]
            temps = unalias(queue, self.device, values, outputs, sizes)
            try:
                for i, value in enumerate(values):
                    if value is not None:
                        try:
                            queue.copy_from_device(slot.dev_out[i], value, sizes[i])
                        except InputError as exc:  # another context, say: name the output
                            raise InputError(f"output {i}: {exc}") from None
            finally:
                release_temps(self.device, temps, queue)
        event = queue.marker()
        self.records.append(("compute", block.index, Between(before, event), 0))
        return event


    def _outputs(self, buffers: Sequence[Any], block: Block, queue: Queue) -> list[Any]:
        """Device arrays of the output buffers, each as many rows as ``block`` writes."""
        arrays = []
        for i, (buf, spec) in enumerate(zip(buffers, self.plan.outputs, strict=True)):
            lo, hi = self.plan.output_rows(i, block)
            arrays.append(self.device.device_array(buf, (hi - lo, *spec.shape[1:]), spec.dtype,
                                                   queue))
        return arrays

    def _returned(self, result: Any, given: Sequence[Any], block: Block) -> list[Any]:
        """The device arrays a callable returned, one per output (None where it returned the
        output it was given); InputError for a count, shape or dtype that does not fit."""
        values = list(result) if isinstance(result, tuple | list) else [result]
        specs = self.plan.outputs
        if len(values) != len(specs):
            raise InputError(
                f"the callable returned {len(values)} value(s) for {len(specs)} output(s): "
                f"return None (it wrote its outputs), one device array per output (a tuple "
                f"for several), or pass reduce= if the value is a partial result")
        found: list[Any] = []
        for i, (value, out, spec) in enumerate(zip(values, given, specs, strict=True)):
            if value is out or (value is None and len(values) > 1):
                found.append(None)  # None in a tuple: that output was written in place
                continue
            shape, dtype, contiguous = _describe(value)
            lo, hi = self.plan.output_rows(i, block)
            expected = (hi - lo, *spec.shape[1:])
            if shape != expected or dtype != spec.dtype or not contiguous:
                raise InputError(
                    f"output {i}: the callable returned "
                    f"{_what(shape, dtype, contiguous, value)} for "
                    f"a block of {block.rows} rows, which needs a C-contiguous {spec.dtype} "
                    f"array of "
                    f"shape {expected}: return that (or write into the output array it was "
                    f"given and return None){spec.dtype_hint}")
            found.append(value)
        return found

    def warm_up(self, device: Device, queue: Queue, sources: Sequence[Source],
                boundary: Boundary = "nearest") -> None:
        """Call the function once on the first ``WARMUP_ROWS`` rows (into scratch outputs)
        before the stream starts, so libraries that load modules lazily load them now, not
        while blocks are in flight (a module load waits for the busy device); check what it
        returns. Its inputs are the first block's rows as the stream gives them (with a halo,
        the pad rows under ``boundary`` first); its outputs are dropped."""
        plan = self.plan
        rows = warm_up_rows(plan)
        first = Block(0, 0, rows)
        pool = device.memory_pool
        held: list[Any] = []
        arrays = []
        try:
            for source, spec in zip(sources, plan.inputs, strict=True):
                host = first_block(source, spec.dtype, spec.shape[1:], plan, rows, boundary)
                buffer = pool.acquire(max(host.nbytes, 1))
                held.append(buffer)
                queue.copy_in(buffer, host.reshape(-1).view(np.uint8))
                queue.finish()  # host is a local: copied before it goes
                arrays.append(device.device_array(buffer, host.shape, spec.dtype, queue))
            for spec in plan.outputs:
                buffer = pool.acquire(max(spec.block_rows_of(rows) * spec.row_bytes, 1))
                held.append(buffer)
            arrays += self._outputs(held[len(plan.inputs):], first, queue)
            with interruptible():  # the user's code: Ctrl-C lands in it as usual
                result = self.function(*arrays, *self.args, queue=queue.native,
                                       offset=self.first_row * self.row_items,
                                       n=rows * self.row_items)
            queue.after_callable(result)
            if not self.keeps_result and result is not None:
                self._returned(result, arrays[len(plan.inputs):], first)
            queue.finish()
        finally:
            arrays.clear()
            for buffer in held:
                pool.release(buffer)


def check_signature(function: Callable[..., Any], positional: int) -> None:
    """InputError, before any work, when ``function`` cannot take ``positional`` arrays and
    args and the ``queue=``, ``offset=``, ``n=`` keywords (Python's own TypeError, from the
    first call, named neither conveyor's convention nor the fix). A function whose
    signature Python cannot read is left to its first call."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*([None] * positional), queue=None, offset=0, n=0)
    except TypeError as exc:
        name = getattr(function, "__name__", type(function).__name__)
        raise InputError(
            f"the callable {name}{signature} cannot take this stream's call ({exc}): it gets "
            f"{positional} positional arrays and args (inputs, outputs, then args=), then the "
            f"keywords queue=, offset= and n=; declare them, e.g. "
            f"def f(x, y, *, queue, offset, n), or take **kwargs") from None


def unalias(queue: Queue, device: Device, values: list[Any], given: Sequence[Any],
            sizes: Sequence[int]) -> list[Any]:
    """Copy into temporary device buffers (first, in queue order) each returned value whose
    memory overlaps an output's: returned swapped (``return b, a``), the copy of ``b`` into
    output 0 overwrote ``a`` before ``a`` was copied into output 1; a view of output 0 at an
    offset, returned for output 1, was overwritten the same way (or overlapped its own
    output's copy). ``values`` is changed in place to the temporaries' arrays; the
    temporaries are returned, for the caller to release after the block's copies."""
    outputs = [_span(array, size) for array, size in zip(given, sizes, strict=True)]
    temps: list[Any] = []
    try:
        for i, value in enumerate(values):
            span = _span(value, sizes[i]) if value is not None and sizes[i] else None
            if span is None or span[:3] == (outputs[i] or ())[:3] or not any(
                    _overlap(span, other) for other in outputs):
                continue  # the output itself (no copy), or memory no output holds
            temp = device.memory_pool.acquire(sizes[i])
            temps.append(temp)
            queue.copy_from_device(temp, value, sizes[i])
            values[i] = device.device_array(temp, given[i].shape, np.dtype(given[i].dtype),
                                            queue)
    except BaseException:
        release_temps(device, temps, queue)
        raise
    return temps


def release_temps(device: Device, temps: list[Any], queue: Queue) -> None:
    """Give ``unalias``'s temporaries back once the queue's work so far has finished (also on
    a failure: a copy that raised left them taken, and the pool never back at zero)."""
    if temps:
        done = queue.marker()
        for temp in temps:
            device.memory_pool.release(temp, after=done)


def _span(array: Any, nbytes: int) -> tuple[str, int, int, int] | None:
    """(backend, memory, start, end) of the ``nbytes`` a device array's data starts with:
    memory is the OpenCL buffer's handle (0 for CUDA's one address space), start and end byte
    positions in it; None for anything else."""
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is not None:
        start = int(interface["data"][0])
        return ("cuda", 0, start, start + nbytes)
    data = getattr(array, "base_data", None)
    if data is not None and hasattr(data, "int_ptr"):
        start = int(getattr(array, "offset", 0))
        return ("opencl", int(data.int_ptr), start, start + nbytes)
    return None


def _overlap(a: tuple[str, int, int, int], b: tuple[str, int, int, int] | None) -> bool:
    """Whether two spans share a byte."""
    return b is not None and a[:2] == b[:2] and a[2] < b[3] and b[2] < a[3]


def warm_up_rows(plan: Plan) -> int:
    """Rows of input 0 a warm-up call gets: at most ``WARMUP_ROWS``, a block and the input,
    in whole rows of every output (a multiple of each ``cv.rows`` ratio's ``q``: 64 rows for
    a ratio of 1/3 made a callable that pools threes fail before any block, in a chain)."""
    step = math.lcm(*(spec.ratio[1] for spec in plan.outputs)) if plan.outputs else 1
    rows = min(WARMUP_ROWS, plan.block_rows, plan.rows)
    return max(rows // step * step, min(step, plan.block_rows))


def _describe(value: Any) -> tuple[tuple[int, ...], np.dtype | None, bool]:
    """(shape, dtype, C-contiguous) of a device array; dtype None for anything else."""
    interface = getattr(value, "__cuda_array_interface__", None)
    try:
        if interface is not None:
            shape = tuple(int(d) for d in interface["shape"])
            dtype = np.dtype(interface["typestr"])
            strides = interface.get("strides")
            contiguous = strides is None or tuple(strides) == _c_strides(shape, dtype)
            return shape, dtype, contiguous
        flags = getattr(value, "flags", None)
        return (tuple(int(d) for d in value.shape), np.dtype(value.dtype),
                bool(getattr(flags, "c_contiguous", False)))
    except (AttributeError, TypeError, KeyError):
        return (), None, False


def _c_strides(shape: tuple[int, ...], dtype: np.dtype) -> tuple[int, ...]:
    strides, step = [], dtype.itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


def _what(shape: tuple[int, ...], dtype: np.dtype | None, contiguous: bool,
          value: Any = None) -> str:
    if dtype is None:
        if inspect.iscoroutine(value) or inspect.isgenerator(value):
            return (f"a {type(value).__name__} (conveyor calls the function synchronously: "
                    f"define it with def, not async def, and return, not yield)")
        kind = f" ({type(value).__name__})" if value is not None else ""
        return f"something that is not a device array{kind}"
    return f"{dtype} of shape {shape}" + ("" if contiguous else " (not C-contiguous)")


def choose(compute: Compute, device: Device, plan: Plan, args: Sequence[Any],
           records: Records, reduce: bool, first_row: int = 0) -> Step:
    """The step of ``compute``: a kernel launch, a callable or a chain."""
    if isinstance(compute, BoundChain):
        from conveyor.pipeline.chainstep import ChainStep

        return ChainStep(compute, device, plan, args, records, first_row)
    if isinstance(compute, Kernel):
        return KernelStep(compute, plan, args, records, first_row)
    return CallableStep(compute, device, plan, args, records, keeps_result=reduce,
                        first_row=first_row)


def partial_of(result: Any, block: Block) -> Any:
    """What a reducing callable returned for ``block``, on the host. InputError for None (a
    missing ``return`` would otherwise count as a block with no elements and the total
    would silently leave its rows out) and for text (which no fold adds up)."""
    if inspect.iscoroutine(result) or inspect.isgenerator(result) or inspect.isasyncgen(result):
        close = getattr(result, "close", None) or getattr(result, "aclose", None)
        if inspect.isasyncgen(result):
            close = None  # aclose() is itself a coroutine: dropping the generator ends it
        if close is not None:
            close()  # never awaited or run: closed now, not warned about at collection
        raise InputError(
            f"with reduce=, the callable returned {_what((), None, True, result)} for block "
            f"{block.index}, not its partial value")
    if result is None:
        raise InputError(
            f"with reduce=, the callable returns each block's partial value; it returned None "
            f"for block {block.index} (rows {block.start}..{block.stop}): return the block's "
            f"value, a number or a NumPy array made from the block's arrays")
    # A tuple or list of device arrays (one partial per figure), nested too: each brought to
    # the host, and each ndarray copied (below).
    value = _host_copy(result, block)
    # Records (kind V) are left to the fold: a function folds them, "sum" says it cannot.
    # Text is refused; an object array is taken unless it holds text (Python ints past int64,
    # Fractions: np.sum adds them exactly, as it adds a list of them).
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    if isinstance(value, str | bytes) or kind in ("S", "U") or kind == "O" and any(
            isinstance(one, str | bytes) for one in np.asarray(value).flat):
        raise InputError(
            f"with reduce=, the callable returned {type(value).__name__} {value!r:.60} for "
            f"block {block.index}: return a number or a numeric array")
    return value


#: Values no later block can change: kept as returned.
_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, range)


def _host_copy(value: Any, block: Block) -> Any:
    """``value`` on the host, with every ndarray copied, at every level of tuples, lists and
    dicts (a named tuple rebuilt from its fields), and any other object deep-copied. Copied
    now: a callable that returns one buffer it fills again for every block (or a CPU tensor's
    .numpy() view of one), bare or inside a tuple, a dataclass or a set, made every partial
    that one object, and the fold (when the block retires, depth blocks later) added the last
    blocks' values, with no error. InputError for what cannot be copied (a memoryview)."""
    if isinstance(value, tuple | list):
        items = [_host_copy(v, block) for v in value]
        kind = type(value)
        return kind(*items) if hasattr(kind, "_fields") else kind(items)
    if isinstance(value, dict):  # a custom reduce=f's partial: its values, as a tuple's
        copied = copy.copy(value)  # the same kind (a defaultdict keeps its factory)
        for key in copied:
            copied[key] = _host_copy(value[key], block)
        return copied
    value = _to_host(value)
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, _IMMUTABLE) or isinstance(value, np.generic) and \
            not isinstance(value, np.void):  # a record scalar may view its array
        return value
    try:
        return copy.deepcopy(value)
    except Exception as exc:
        raise InputError(
            f"with reduce=, the callable's partial of block {block.index} holds a "
            f"{type(value).__name__}, which cannot be copied ({exc}); a later block could "
            f"change it before it is folded: return a number, an array, or a tuple, dict or "
            f"object of those") from None


def _to_host(value: Any) -> Any:
    """A callable's partial as a host value (syncs on the device array if it is one: CuPy and
    PyOpenCL arrays have ``get()``, PyTorch tensors ``cpu()``). Anything else is the value
    itself: a dict (which has a ``get`` too) or a tuple is the partial a custom ``reduce=f``
    folds."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        if callable(getattr(value, "get", None)) and not isinstance(value, np.ndarray):
            return value.get()
        if callable(getattr(value, "cpu", None)):
            return value.cpu().numpy()
    return value
