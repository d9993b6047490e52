"""Cut the work into blocks: block size and ring depth from the memory budget; halo; tail.

Every input and output is cut along axis 0. One *row* is everything below axis 0 (one element of
a 1-D array). A block is ``block_rows`` rows of every array at once; the last block may be
shorter. A ring slot holds one block of every input (plus ``halo`` rows on each side) and of
every output in device memory, and the ring holds ``depth`` slots (never more than there are
blocks).

Block size, in order of precedence:

- ``block_bytes``: the bytes of one block of the widest array (most bytes per row);
- else the largest block whose ring fits ``memory_limit`` (default: ``DEFAULT_MEMORY_FRACTION`` of
  the device's global memory), capped at ``DEFAULT_BLOCK_BYTES`` of the widest array, because
  beyond that bigger blocks only lengthen the unoverlapped first copy and last copy.

The ring never exceeds the limit (sizes are counted as the device pool bins them) and no single
buffer exceeds the device's largest allocation.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, overload

import numpy as np

from conveyor.errors import InputError
from conveyor.memory.pinned import page_bin
from conveyor.memory.pool import device_bin

DEFAULT_MEMORY_FRACTION = 0.5
DEFAULT_BLOCK_BYTES = 64 * 2**20
#: Pinned staging entries beyond the device ring's depth: how far staging may run ahead of
#: the device (inputs) and behind it (outputs). Used by pipeline/staged.py.
STAGING_EXTRA = 2


@dataclass(frozen=True)
class ArraySpec:
    """The shape and dtype of one input or output."""

    shape: tuple[int, ...]
    dtype: np.dtype
    #: Output rows per input row of input 0, (p, q) as the caller wrote it (pipeline/shaped.py).
    ratio: tuple[int, int] = (1, 1)
    #: One row (record) per block instead (pipeline/shaped.py: per_block).
    per_block: bool = False
    #: For messages: how to change ``dtype`` where conveyor chose it (a file output given
    #: none, pipeline/sinks.py); "" otherwise.
    dtype_hint: str = field(default="", compare=False)

    def block_rows_of(self, block_rows: int) -> int:
        """Rows of this array in a block of ``block_rows`` rows of input 0."""
        if self.per_block:
            return 1
        p, q = self.ratio
        return block_rows * p // q

    @property
    def rows(self) -> int:
        """Length along axis 0."""
        return self.shape[0]

    @property
    def row_items(self) -> int:
        """Elements in one row (1 for a 1-D array)."""
        return math.prod(self.shape[1:])

    @property
    def row_bytes(self) -> int:
        """Bytes in one row."""
        return self.row_items * self.dtype.itemsize

    def device_bytes(self, rows: int, block_rows: int, first: ArraySpec) -> int:
        """Device bytes of this array's buffer in a slot: its ``rows`` rows, but never fewer
        than ``n`` elements of its type, ``n`` being the elements of ``first`` (input 0) in a
        block of ``block_rows``: what every launch is told. A kernel that keeps to
        ``i < n`` (the documented idiom) then never writes or reads past a buffer whose rows
        are narrower than input 0's (an output of one value per row, a per-block record, a
        ratio output); the copies move only the array's own rows."""
        return max(rows * self.row_bytes, block_rows * first.row_items * self.dtype.itemsize)

    def narrower_than(self, first: ArraySpec, block_rows: int) -> bool:
        """Fewer elements in a block of ``block_rows`` than ``first`` (input 0) has there:
        a kernel's ``n`` would run past this array's rows."""
        return self.block_rows_of(block_rows) * self.row_items < block_rows * first.row_items


@dataclass(frozen=True)
class Block:
    """Rows ``[start, stop)`` of every array; the input slot also holds ``halo`` rows each side.

    ``seq`` is the block's place in the order its engine issues blocks (ring slots and staging
    entries follow it): the index itself on one device; on several (pipeline/multi.py) each
    engine counts its own blocks from 0."""

    index: int
    start: int
    stop: int
    seq: int = -1

    def __post_init__(self) -> None:
        if self.seq < 0:
            object.__setattr__(self, "seq", self.index)

    @property
    def rows(self) -> int:
        """Rows in this block (the tail block may be short)."""
        return self.stop - self.start


@dataclass(frozen=True)
class Plan:
    """How a stream is cut: rows, block size, depth, halo, and each slot buffer's bytes."""

    rows: int
    block_rows: int
    depth: int
    halo: int
    inputs: tuple[ArraySpec, ...]
    outputs: tuple[ArraySpec, ...]
    memory_limit: int
    #: Device-only buffers of a kernel reduction, per slot: bytes per row of the per-element
    #: buffer, and bytes per partial of each partials buffer (reduce.partials_for says how
    #: many partials a block has). Counted so the ring still fits the limit.
    scratch_row_bytes: int = 0
    partial_bytes: tuple[int, ...] = ()
    #: Device bytes of the resident arrays (pipeline/resident.py), uploaded once; the ring
    #: fits in what the memory limit leaves beside them.
    resident_bytes: int = 0
    #: Bytes per row of each temp of a chain (pipeline/chain.py): device-only buffers of one
    #: block in each slot, counted so the ring still fits the limit.
    temp_row_bytes: tuple[int, ...] = ()

    @property
    def block_count(self) -> int:
        """Blocks in the stream: 0 for zero-length inputs, and for rows that hold no elements
        (shape (5, 0): there is nothing to copy or compute, and a driver refuses 0-byte
        buffers)."""
        if not self.rows or not any(spec.row_bytes for spec in (*self.inputs, *self.outputs)):
            return 0
        return -(-self.rows // self.block_rows)

    def block(self, index: int) -> Block:
        """Block ``index``."""
        start = index * self.block_rows
        return Block(index, start, min(start + self.block_rows, self.rows))

    def blocks(self) -> Blocks:
        """Every block, in order, made on demand (a stream may have millions of blocks)."""
        return Blocks(self)

    @property
    def input_slot_bytes(self) -> tuple[int, ...]:
        """Bytes of each input's buffer in one slot (block plus halo rows)."""
        rows = self.block_rows + 2 * self.halo
        return tuple(rows * spec.row_bytes for spec in self.inputs)

    @property
    def input_device_bytes(self) -> tuple[int, ...]:
        """Device bytes of each input's buffer in one slot (ArraySpec.device_bytes)."""
        rows = self.block_rows + 2 * self.halo
        return tuple(spec.device_bytes(rows, self.block_rows, self.inputs[0])
                     for spec in self.inputs)

    @property
    def output_device_bytes(self) -> tuple[int, ...]:
        """Device bytes of each output's buffer in one slot (ArraySpec.device_bytes)."""
        return tuple(spec.device_bytes(spec.block_rows_of(self.block_rows), self.block_rows,
                                       self.inputs[0]) for spec in self.outputs)

    @property
    def output_slot_bytes(self) -> tuple[int, ...]:
        """Bytes of each output's buffer in one slot."""
        return tuple(spec.block_rows_of(self.block_rows) * spec.row_bytes
                     for spec in self.outputs)

    @property
    def temp_slot_bytes(self) -> tuple[int, ...]:
        """Bytes of each temp's buffer in one slot (a block's rows; temps have no halo)."""
        return tuple(self.block_rows * row_bytes for row_bytes in self.temp_row_bytes)

    def output_rows(self, i: int, block: Block) -> tuple[int, int]:
        """The rows ``[lo, hi)`` of output ``i`` that ``block`` writes."""
        spec = self.outputs[i]
        if spec.per_block:
            return block.index, block.index + 1
        p, q = spec.ratio
        return block.start * p // q, block.stop * p // q

    @property
    def ring_device_bytes(self) -> int:
        """Device bytes the whole ring holds, as the pool bins them."""
        return self.depth * _slot_footprint(self.block_rows, self.halo, self.inputs,
                                            self.outputs, self.scratch_row_bytes,
                                            self.partial_bytes, self.temp_row_bytes)


    def host_bytes(self, host_unified: bool) -> int:
        """About the host memory a stream of this plan holds: its pinned staging rings (every
        array staged, ``depth + STAGING_EXTRA`` entries, each buffer in whole pages, as the
        pinned pool bins it: counted as the device ring, 512-byte bins and ``depth``
        entries, one-row blocks were undercounted 8 times), each input's halo pad rows (and
        the int64 row numbers they are made from), and on a device that shares host memory
        the device's ring too. A stream of no blocks holds none of it (an empty input with an
        output ratio of 2**40 was refused for a ring no block would use)."""
        if not self.block_count:
            return 0
        pads = 2 * self.halo * sum(spec.row_bytes + 8 for spec in self.inputs)
        entries = max(min(self.depth + STAGING_EXTRA, self.block_count), 1)
        staged = entries * sum(page_bin(max(n, 1)) for n in (*self.input_device_bytes,
                                                              *self.output_device_bytes))
        return staged + (self.ring_device_bytes if host_unified else 0) + pads


class BlockSource(Protocol):
    """Where an engine takes its blocks from: ``get(k)`` is its ``k``-th block (``seq`` k), or
    None once there are no more. Called with increasing ``k`` from the engine's thread and
    its staging thread (the same ``k`` gives the same block)."""

    def get(self, position: int) -> Block | None:
        """The ``position``-th block, or None when there are no more."""
        ...


class Blocks(Sequence[Block]):
    """The blocks of a plan as a sequence that makes each block when it is asked for: a list
    of every block of ``iterate(length=2**50)`` took 50 s and ran out of memory."""

    def __init__(self, plan: Plan) -> None:
        self._plan = plan
        self._count = plan.block_count

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> Block: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Block]: ...

    def __getitem__(self, index: int | slice) -> Block | Sequence[Block]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError(f"block {index} of {self._count}")
        return self._plan.block(index)

    def __iter__(self) -> Iterator[Block]:
        return (self._plan.block(i) for i in range(self._count))

    def get(self, position: int) -> Block | None:
        """Block ``position``, or None past the last (a BlockSource over every block)."""
        return self._plan.block(position) if 0 <= position < self._count else None


class ListedBlocks:
    """A BlockSource over a list of blocks (a test's, or a static share of a plan's)."""

    def __init__(self, blocks: Sequence[Block]) -> None:
        self._blocks = blocks

    def get(self, position: int) -> Block | None:
        """The ``position``-th block of the list, or None past its end."""
        return self._blocks[position] if 0 <= position < len(self._blocks) else None


def _slot_footprint(
    block_rows: int, halo: int, inputs: tuple[ArraySpec, ...], outputs: tuple[ArraySpec, ...],
    scratch_row_bytes: int = 0, partial_bytes: tuple[int, ...] = (),
    temp_row_bytes: tuple[int, ...] = (),
) -> int:
    total = 0
    for row_bytes in temp_row_bytes:
        total += device_bin(max(block_rows * row_bytes, 1))
    if scratch_row_bytes:
        total += device_bin(max(block_rows * scratch_row_bytes, 1))
    if partial_bytes:
        from conveyor.pipeline.reduce import partials_for

        parts = partials_for(block_rows * inputs[0].row_items)
        for nbytes in partial_bytes:
            total += device_bin(max(nbytes * parts, 1))
    first = inputs[0]
    for spec in inputs:
        total += device_bin(max(spec.device_bytes(block_rows + 2 * halo, block_rows, first), 1))
    for spec in outputs:
        total += device_bin(max(spec.device_bytes(spec.block_rows_of(block_rows), block_rows,
                                                  first), 1))
    return total


class HaloPastBlocks(InputError):
    """The halo is longer than the blocks a plan can make (an InputError, told apart by the
    callers that reword a plan's other refusals: chainbind's temps)."""


class RingPastLimit(InputError):
    """The ring of the fewest rows the plan could cut is larger than the memory limit (an
    InputError that chainbind's temps reword, naming the temps, and no other)."""


def make_plan(
    inputs: tuple[ArraySpec, ...],
    outputs: tuple[ArraySpec, ...],
    *,
    depth: int,
    block_bytes: int | None,
    memory_limit: int | None,
    halo: int,
    global_mem_bytes: int,
    max_alloc_bytes: int,
    scratch_row_bytes: int = 0,
    partial_bytes: tuple[int, ...] = (),
    resident_bytes: int = 0,
    temp_row_bytes: tuple[int, ...] = (),
    max_block_rows: int | None = None,
    pool_limit: int | None = None,
    pinned_limit: int | None = None,
    block_cap: str = "image",
    windowed: bool = False,
    staged: tuple[tuple[bool, ...], tuple[bool, ...]] | None = None,
) -> Plan:
    """Choose block rows for these arrays; InputError when no block fits (beside
    ``resident_bytes`` of resident arrays, counted against the same limit). Blocks have at
    most ``max_block_rows`` rows where given (``block_cap`` says why, a key of ``_CAPS``: the
    device's image height for image inputs, its constant buffer for ``__constant`` inputs).
    Without a ``memory_limit``, the ring fits half the device's memory and the device
    pool's own ``limit`` (``pool_limit``), where one is set, and the pinned staging rings fit
    the pinned pool's ``limit`` (``pinned_limit``: what of it is free), counting the inputs
    and outputs ``staged`` marks (all where None; pinned arrays and zero-copy streams stage
    nothing). ``windowed``: the inputs are a window
    of a larger input, with the rows around it given beside them (``Source.beside``), so a
    halo longer than the window reaches real rows, not only the boundary's."""
    if not inputs:
        raise InputError("a stream needs at least one input array")
    if depth < 1:
        raise InputError(f"depth must be at least 1, got {depth}")
    if halo < 0:
        raise InputError(f"halo must be 0 or more rows, got {halo}")
    rows = inputs[0].rows
    for name, specs in (("input", inputs), ("output", outputs)):
        for i, spec in enumerate(specs):
            if not spec.per_block and spec.rows != rows * spec.ratio[0] // spec.ratio[1]:
                raise InputError(
                    f"arrays disagree in length along axis 0: input 0 has {rows} rows, "
                    f"{name} {i} has {spec.rows}"
                    + (f" (ratio={spec.ratio})" if spec.ratio != (1, 1) else "")
                    + (_ratio_hint(spec, inputs[0]) if name == "output"
                       and spec.ratio == (1, 1) else "")
                )
    if halo and any(spec.per_block for spec in outputs):
        raise InputError(
            f"a per-block output with halo={halo}: a block's record would also count the "
            f"halo rows of its neighbours, so records could not say which rows they belong "
            f"to; use halo=0 (records that straddle blocks: see examples/bloom_filter.py)")
    # Every block must map to whole output rows: block rows a multiple of each ratio's q.
    step = math.lcm(*(spec.ratio[1] for spec in outputs)) if outputs else 1
    limit = memory_limit
    by_pool = False  # the limit is the device pool's own (no memory_limit= given)
    by_pinned = False  # the pinned pool's limit cut the blocks (_fit_staging)
    if limit is None:
        limit = int(global_mem_bytes * DEFAULT_MEMORY_FRACTION)
        if pool_limit is not None and pool_limit < limit:  # planned past it: OOM each time
            limit, by_pool = pool_limit, True
    if limit <= 0:
        raise InputError(f"memory_limit must be a positive number of bytes, got {limit}")
    total_limit, limit = limit, limit - resident_bytes
    if limit <= 0:
        what, fix = (("the device pool's limit", "raise device.memory_pool.limit")
                     if by_pool else ("the memory limit", "use a larger memory_limit"))
        raise InputError(
            f"the resident arrays in args= need {resident_bytes} device bytes, which leaves "
            f"nothing of {what} of {total_limit} for the blocks: {fix}, or stream the "
            f"largest table as an input")
    widest = max([spec.row_bytes for spec in inputs]
                 + [-(-spec.row_bytes * spec.ratio[0] // spec.ratio[1])
                    for spec in outputs if not spec.per_block]
                 + list(temp_row_bytes)) or 1
    if block_bytes is not None:
        if block_bytes < widest:
            raise InputError(
                f"block_bytes={block_bytes} is smaller than one row ({widest} bytes): "
                f"use block_bytes >= {widest}"
            )
        block_rows = max(block_bytes // widest // step * step, step)
    else:
        block_rows = max(DEFAULT_BLOCK_BYTES // widest, 1)
        block_rows = min(block_rows, max(max_alloc_bytes // widest - 2 * halo, 1))
        if rows:
            block_rows = min(block_rows, rows)
        block_rows = max(block_rows // step * step, step)
        block_rows = _fit(block_rows, depth, halo, inputs, outputs, limit, scratch_row_bytes,
                          partial_bytes, rows, step, temp_row_bytes)
        if memory_limit is None and pinned_limit is not None:
            marks = staged or ((True,) * len(inputs), (True,) * len(outputs))
            fitted = _fit_staging(block_rows, depth, halo, inputs, outputs, pinned_limit, rows,
                                  step, marks)
            by_pinned = fitted < block_rows
            block_rows = fitted
    if rows:
        block_rows = min(block_rows, rows)  # rows is a multiple of step (shaped.Rows)
    block_rows = max(block_rows, 1)
    if block_cap == "constant" and max_block_rows is not None and max_block_rows < step:
        # Fewer rows than an output's ratio needs fit the constant buffer: stream as asked
        # (constant.py: some drivers fail such a launch; PoCL and NVIDIA's run it).
        import warnings

        warnings.warn(f"conveyor: a __constant input's blocks cannot fit the device's constant "
                      f"buffer ({max_block_rows} rows) and hold the {step} rows an output's "
                      f"ratio needs: some OpenCL drivers fail such a launch (PoCL and "
                      f"NVIDIA's run it); declare it __global const to be safe",
                      RuntimeWarning, stacklevel=4)
        max_block_rows = None
    if max_block_rows is not None and block_rows > max_block_rows:
        if max_block_rows < step:
            raise InputError(f"blocks may have at most {max_block_rows} rows (the device's "
                             f"{_CAPS[block_cap][0]} less the halo), fewer than the {step} "
                             f"rows an output's ratio needs: use a smaller halo or ratio")
        block_rows = max_block_rows // step * step
    if rows:
        # No more slots than blocks: depth=10**6 on a short stream held 781 MiB of slots
        # that no block would ever use.
        depth = min(depth, -(-rows // block_rows))
    footprint = depth * _slot_footprint(block_rows, halo, inputs, outputs, scratch_row_bytes,
                                        partial_bytes, temp_row_bytes)
    if halo > rows > 0 and not windowed and (
            (halo > block_rows and rows > block_rows) or footprint > limit):
        # halo=2**40 on 1000 rows was "more than a block (1 rows)": the blocks had shrunk to
        # one row for the halo's sake, and a larger block_bytes was no help.
        why = (f"blocks with that many rows on either side do not fit the memory limit of "
               f"{total_limit} bytes" if footprint > limit else
               f"more than a block ({block_rows} rows)")
        raise HaloPastBlocks(
            f"halo={halo} rows is more than the input's {rows} rows, and {why}: use a smaller "
            f"halo (halo={rows} already reaches every row of the input from every block; the "
            f"rows past its ends are the boundary's)"
            + ("" if footprint > limit else ", or a block_bytes that holds the whole input")
        )
    if halo and halo > block_rows and rows > block_rows:
        if max_block_rows is not None and block_rows >= max_block_rows // step * step:
            # Cut by the device's image height or constant buffer: a larger block_bytes
            # cannot help.
            what, other = _CAPS[block_cap]
            raise HaloPastBlocks(
                f"halo={halo} rows is more than a block ({block_rows} rows), and the "
                f"device's {what} (with the halo on both sides) caps a block there: "
                f"use a halo of at most {(max_block_rows + 2 * halo) // 3} rows, or {other}")
        raise HaloPastBlocks(
            f"halo={halo} rows is more than a block ({block_rows} rows): "
            + ("the pinned pool's limit (device.pinned_pool.limit) cut the blocks: raise it, "
               "or use a smaller halo" if by_pinned else
               "use a larger block_bytes or memory_limit, or a smaller halo")
        )
    # A stream of no rows has no block, and allocates no ring (stream.open_sinks returns
    # first): its ring is not measured against the limits (an empty input with a ratio of
    # (1, 10**6) was refused for a ring of 10**6 rows).
    if footprint > limit and rows:
        # Only what can help: a block already of the fewest rows cannot shrink, one slot is
        # the least depth, and a limit that is the pool's is raised there (a larger
        # memory_limit= was advised, and then failed with OutOfMemoryError under the pool).
        fixes = (["a smaller block_bytes"] if block_rows > step else []) \
            + (["a lower depth"] if depth > 1 else []) \
            + (["a higher device.memory_pool.limit"] if by_pool else ["a larger memory_limit"])
        raise RingPastLimit(
            f"one ring of {depth} slots of {block_rows} rows needs {footprint} device bytes, "
            + (f"more than the device pool's limit of {total_limit} (device.memory_pool.limit)"
               if by_pool else f"more than the memory limit of {total_limit}")
            + (f" less {resident_bytes} of resident arrays" if resident_bytes else "")
            + f": use {', or '.join(fixes)}"
        )
    biggest = max([spec.device_bytes(block_rows + 2 * halo, block_rows, inputs[0])
                   for spec in inputs]
                  + [spec.device_bytes(spec.block_rows_of(block_rows), block_rows, inputs[0])
                     for spec in outputs]
                  + [block_rows * row_bytes for row_bytes in temp_row_bytes])
    if biggest > max_alloc_bytes and rows:
        raise InputError(
            f"a block buffer of {biggest} bytes is more than the device's largest allocation "
            f"({max_alloc_bytes} bytes): use a smaller block_bytes"
        )
    return Plan(rows, block_rows, depth, halo, inputs, outputs, total_limit, scratch_row_bytes,
                partial_bytes, resident_bytes, temp_row_bytes)


#: What caps a block's rows (make_plan's ``block_cap``): the device's limit, and what else
#: the user can do than a smaller halo.
_CAPS = {
    "image": ("image height", "stream the array as a plain input (not cv.image)"),
    "constant": ("constant buffer size (CL_DEVICE_MAX_CONSTANT_BUFFER_SIZE)",
                 "declare the kernel's parameter __global const instead of __constant"),
}


def _ratio_hint(output: ArraySpec, first: ArraySpec) -> str:
    """For an output array whose rows are a simple ratio of input 0's (a pooling kernel's
    half): the ``cv.rows`` output of its shape that makes it."""
    from fractions import Fraction

    if output.rows <= 0 or first.rows <= 0:
        return ""
    ratio = Fraction(output.rows, first.rows)
    if ratio.numerator > 64 or ratio.denominator > 64:
        return ""
    dtype = output.dtype
    named = f"np.{dtype}" if dtype.isbuiltin and dtype.isnative else "dt"
    shape = "" if output.shape[1:] == first.shape[1:] else f", shape={output.shape[1:]}"
    return (f": an output of {ratio.numerator}/{ratio.denominator} of input 0's rows is "
            f"cv.rows({named}, ratio=({ratio.numerator}, {ratio.denominator}){shape})"
            + (" (dt: the output's dtype)" if named == "dt" else ""))


def _fit_staging(block_rows: int, depth: int, halo: int, inputs: tuple[ArraySpec, ...],
                 outputs: tuple[ArraySpec, ...], limit: int, rows: int, step: int,
                 marks: tuple[tuple[bool, ...], tuple[bool, ...]]) -> int:
    """Shrink ``block_rows`` until pinned staging rings for the inputs and outputs ``marks``
    says are staged (each entry as the pinned pool bins it, ``depth + STAGING_EXTRA``
    entries, fewer where there are fewer blocks) fit the pinned pool's ``limit``: a default
    plan past it failed with OutOfMemoryError every time. Never below the smallest entry any
    block size gives (a page per buffer, and the halo rows): smaller blocks save no pinned
    memory there (each buffer is binned in whole pages), and a limit below even that shrank
    the blocks to one row (20,000 blocks of 4 bytes); the ring then runs on the entries that
    fit (pipeline/ring.py)."""
    first = inputs[0]
    ins = [spec for spec, mark in zip(inputs, marks[0], strict=True) if mark]
    outs = [spec for spec, mark in zip(outputs, marks[1], strict=True) if mark]
    if not ins and not outs:
        return block_rows  # nothing staged: the pinned pool holds no ring

    def entry(block_rows: int) -> int:
        found = sum(page_bin(spec.device_bytes(block_rows + 2 * halo, block_rows, first))
                    for spec in ins)
        return found + sum(page_bin(spec.device_bytes(spec.block_rows_of(block_rows),
                                                      block_rows, first)) for spec in outs)

    def staged(block_rows: int) -> int:
        blocks = -(-rows // block_rows) if rows else depth
        return max(min(depth + STAGING_EXTRA, blocks), 1) * entry(block_rows)

    least = entry(step)  # the smallest entry any block size gives (a page per buffer)
    while block_rows > step and staged(block_rows) > limit and entry(block_rows) > least:
        smaller = block_rows * 7 // 8 if block_rows > 8 * step else block_rows - step
        block_rows = max(smaller // step * step, step)
    return block_rows


def _fit(
    block_rows: int,
    depth: int,
    halo: int,
    inputs: tuple[ArraySpec, ...],
    outputs: tuple[ArraySpec, ...],
    limit: int,
    scratch_row_bytes: int = 0,
    partial_bytes: tuple[int, ...] = (),
    rows: int = 0,
    step: int = 1,
    temp_row_bytes: tuple[int, ...] = (),
) -> int:
    """Shrink ``block_rows`` (a multiple of ``step``) until the ring fits ``limit`` (or
    reaches ``step`` rows). The ring has ``depth`` slots, or fewer where ``rows`` make fewer
    blocks."""

    def slots(block_rows: int) -> int:
        return min(depth, -(-rows // block_rows)) if rows else depth

    while block_rows > step and slots(block_rows) * _slot_footprint(
        block_rows, halo, inputs, outputs, scratch_row_bytes, partial_bytes, temp_row_bytes
    ) > limit:
        smaller = block_rows * 7 // 8 if block_rows > 8 * step else block_rows - step
        block_rows = max(smaller // step * step, step)
    return block_rows
