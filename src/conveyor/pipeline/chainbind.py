"""A chain checked against one stream (pipeline/chain.py): every link's buffers resolved to
where they are in a ring slot, every problem an InputError naming the link and buffer, before
any work; the links' resident arrays; the plan with the temps counted."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from conveyor.backends.base import Device, Kernel, named_beside
from conveyor.errors import InputError
from conveyor.pipeline import resident, validate
from conveyor.pipeline.chain import REDUCE, Link, Temp, _is_kernel, _label
from conveyor.pipeline.plan import ArraySpec, HaloPastBlocks, Plan, RingPastLimit, make_plan
from conveyor.pipeline.reduce import BUILTIN_OPS


def bind(links: list[Link], temps: list[Temp], device: Device, inputs: Sequence[Any],
         outputs: Sequence[Any], reduce: Any) -> BoundChain:
    """``links`` and ``temps`` (row shapes filled in) checked against the stream's arrays."""
    known: dict[str, tuple[str, int, np.dtype | None]] = {}
    for i, array in enumerate(inputs):
        known[f"in{i}"] = ("in", i, array.dtype)
    for i, array in enumerate(outputs):
        known[f"out{i}"] = ("out", i, array.dtype)
    for i, temp in enumerate(temps):
        if temp.name in known or temp.name == REDUCE:
            raise InputError(f"temp {temp.name!r} has the name of a stream buffer: name "
                             f"temps other than in0.., out0.. and {REDUCE!r}")
        known[temp.name] = ("temp", i, temp.dtype)
    if reduce is not None:
        known[REDUCE] = ("reduce", 0, None)
    bound = [_bind_link(index, item, known, device) for index, item in enumerate(links)]
    _number_titles(bound)
    _check_order(bound, known, len(outputs))
    element = _reduce_element(bound, reduce)
    first_row_items = math.prod(inputs[0].shape[1:])
    return BoundChain(bound, temps, element, reduce is not None, first_row_items)


@dataclass(frozen=True)
class Ref:
    """Where a link's buffer is in a slot: ``kind`` "in", "out", "temp" or "reduce", and the
    index among its kind."""

    name: str
    kind: str
    index: int


@dataclass
class BoundLink:
    """A link checked against one stream: its compute, buffers and args."""

    index: int
    name: str
    compute: Any  # Kernel or callable
    reads: list[Ref]
    writes: list[Ref]
    args: tuple[Any, ...]
    residents: resident.ResidentArgs | None
    #: The link's label in the timeline (its span's ``label``: ``compute:<title>``): its name,
    #: numbered where an earlier link has the same name (``twice``, ``twice#2``).
    title: str = ""

    def __post_init__(self) -> None:
        if not self.title:
            self.title = self.name

    @property
    def is_kernel(self) -> bool:
        """Whether the link launches a kernel (else it calls a callable)."""
        return isinstance(self.compute, Kernel)

    def where(self) -> str:
        """The link as error messages name it."""
        return f"link {self.index} ({self.name!r})"


class BoundChain:
    """A chain checked against one stream: the links with their buffers resolved, the temps,
    the dtype of a kernel reduction's values (None otherwise) and the links' resident
    arrays. The engine runs it through pipeline/chainstep.py."""

    def __init__(self, links: list[BoundLink], temps: list[Temp], element: np.dtype | None,
                 reduces: bool, first_row_items: int = 1) -> None:
        self.first_row_items = first_row_items  # elements per row of input 0
        self.links = links
        self.temps = temps
        self.element = element
        self.reduces = reduces
        self.residents = ChainResidents(links)

    def bool_inputs(self) -> list[int]:
        """The stream inputs a kernel link reads through a ``bool`` pointer."""
        found: set[int] = set()
        for link in self.links:
            params = getattr(link.compute, "params", None)
            if isinstance(link.compute, Kernel) and params is not None:
                found.update(ref.index for param, ref in zip(params, link.reads, strict=False)
                             if ref.kind == "in" and param.dtype == np.bool_)
        return sorted(found)

    @property
    def has_callables(self) -> bool:
        """Whether any link calls a Python callable (which gets writable device arrays)."""
        return any(not link.is_kernel for link in self.links)

    def temp_row_bytes(self) -> tuple[int, ...]:
        """Device bytes per row of input 0 of each temp: its own row, but never fewer than
        input 0's elements per row of its type, so a link that keeps to ``i < n`` never
        writes past a narrower temp (as ArraySpec.device_bytes for inputs and outputs)."""
        return tuple(max(math.prod(t.row_shape or ()), self.first_row_items) * t.dtype.itemsize
                     for t in self.temps)

    def make_plan(self, inputs: tuple[ArraySpec, ...], outputs: tuple[ArraySpec, ...],
                  **options: Any) -> Plan:
        """``make_plan`` with the temps counted in each slot; when the ring fits without the
        temps but not with them, the InputError names the temps and the links that use
        them."""
        temps = self.temp_row_bytes()
        try:
            return make_plan(inputs, outputs, temp_row_bytes=temps, **options)
        except InputError as exc:
            if not temps or isinstance(exc, HaloPastBlocks):
                # (A halo wider than the blocks the temps cut: make_plan's own message says
                # what helps, block_bytes; "a larger memory_limit" was advised, unset.)
                raise
            try:
                make_plan(inputs, outputs, **options)
            except InputError:
                raise exc from None  # not the temps' fault
            parts = []
            for temp, row_bytes in sorted(zip(self.temps, temps, strict=True),
                                          key=lambda pair: -pair[1]):
                users = [f"link {b.index} ({b.name!r})" for b in self.links
                         if any(r.name == temp.name for r in (*b.reads, *b.writes))]
                parts.append(f"temp {temp.name!r} ({row_bytes} bytes per row, used by "
                             f"{', '.join(users) or 'no link'})")
            if not isinstance(exc, RingPastLimit):
                # (block_bytes smaller than a temp's row, a temp's block past the largest
                # allocation: make_plan's message says what to change; the temps named.)
                raise InputError(f"{exc} (the chain's temps count as a row's bytes: "
                                 f"{'; '.join(parts)})") from None
            raise InputError(f"the chain's temps do not fit the memory limit: "
                             f"{'; '.join(parts)}. Each ring slot holds one block of every "
                             f"temp beside the inputs and outputs: use smaller temps, or "
                             f"what the plan says: {exc}") from None


class ChainResidents:
    """The resident arrays of every link's args, with ResidentArgs' interface for the
    engine: ``upload`` returns each link's args (a tuple of tuples) for the chain's step."""

    def __init__(self, links: list[BoundLink]) -> None:
        self.links = links
        self.claimed = resident.Claim([], [], None)
        for b in links:
            if b.residents is not None:
                b.residents.top = False  # the chain takes and copies back every link's

    @property
    def nbytes(self) -> int:
        """Device bytes of every link's tables."""
        return sum(b.residents.nbytes for b in self.links if b.residents is not None)

    def upload(self, device: Device, queue: Any, args: Sequence[Any]) -> tuple[Any, ...]:
        """Upload every link's tables on ``queue``; ``args`` (the stream's) is empty. Every
        link's writable tables are taken at once first (resident.claim)."""
        self.claimed = resident.claim([h for b in self.links if b.residents is not None
                                       for h in b.residents.handles.values()])
        return tuple(b.args if b.residents is None else b.residents.upload(device, queue, b.args)
                     for b in self.links)

    def copy_back(self, queue: Any) -> None:
        """Writable tables back into their host arrays (after a stream that succeeded), each
        once, but for those a stream this one runs inside holds (resident.copy_back)."""
        resident.copy_back(self.claimed, queue)

    def release(self) -> None:
        """Let go of every link's tables."""
        for b in self.links:
            if b.residents is not None:
                b.residents.release()
        claimed, self.claimed = self.claimed, resident.Claim([], [], None)
        resident.let_go(claimed)


def _number_titles(links: list[BoundLink]) -> None:
    """Give every link a title of its own: the ``k``-th link of a name shared with earlier
    links is ``name#k`` (``twice``, ``twice#2``, ``twice#3``), so the trace, the plot and
    ``Span.title`` tell one kernel run twice in a chain apart; a title another link has as
    its name is skipped (``name#k+1``). Links of distinct names keep their names."""
    names = {b.name for b in links}
    taken: set[str] = set()
    seen: dict[str, int] = {}
    for b in links:
        count = seen.get(b.name, 0) + 1
        title = b.name if count == 1 else f"{b.name}#{count}"
        while count > 1 and (title in names or title in taken):
            count += 1
            title = f"{b.name}#{count}"
        seen[b.name] = count
        taken.add(title)
        b.title = title


# -- checks ----------------------------------------------------------------------------------
def _bind_link(index: int, item: Link, known: dict[str, tuple[str, int, np.dtype | None]],
               device: Device) -> BoundLink:
    from conveyor.kernels.build import KernelFuture

    compute = item.compute
    if isinstance(compute, KernelFuture):
        compute = compute.result()  # load now, before any block is in flight
    where = f"link {index} ({item.name!r})"
    if not _is_kernel(compute) and not callable(compute):
        raise InputError(f"{where}: a link is a Kernel (device.compile) or a callable, got "
                         f"{type(compute).__name__}")
    refs = []
    for role, names in (("reads", item.reads), ("writes", item.writes)):
        found = []
        for name in names:
            if name not in known:
                extra = (f" ({REDUCE!r} is the values that reduce= folds: pass reduce=)"
                         if name == REDUCE else "")
                raise InputError(f"{where} {role} {name!r}, which is no buffer of this "
                                 f"stream{extra}; the names are {', '.join(known)}")
            kind, position, _ = known[name]
            if role == "writes" and kind == "in":
                raise InputError(f"{where} writes input {name!r}: inputs are read-only in a "
                                 f"chain; write a temp (temps=[...]) or an output instead")
            found.append(Ref(name, kind, position))
        refs.append(found)
    reads, writes = refs
    if not _is_kernel(compute) and any(r.kind == "reduce" for r in (*reads, *writes)):
        raise InputError(f"{where} is a callable and names {REDUCE!r}: a callable that ends a "
                         f"chain with reduce= returns the block's partial instead")
    if len({r.name for r in writes}) != len(writes):
        raise InputError(f"{where} names one buffer twice in writes={item.writes}")
    residents = None
    if isinstance(compute, Kernel):
        residents = _check_kernel_link(where, compute, device, reads, writes, item.args, known)
    else:
        from conveyor.pipeline.step import check_signature

        resident.refuse_in_callable_args(item.args, f"{where} is a callable: its")
        try:  # called with its reads, its writes, its args, then queue=, offset=, n=
            check_signature(compute, len(reads) + len(writes) + len(item.args))
        except InputError as exc:
            raise InputError(f"{where}: {exc} (a link gets its reads, then its writes, then "
                             f"its args)") from None
    return BoundLink(index, item.name or _label(compute), compute, reads, writes, item.args,
                     residents)


def _check_kernel_link(where: str, kernel: Kernel, device: Device, reads: list[Ref],
                       writes: list[Ref], args: tuple[Any, ...],
                       known: dict[str, tuple[str, int, np.dtype | None]]
                       ) -> resident.ResidentArgs:
    """The kernel's parameters against the link's buffers and args (as validate.check_kernel
    checks a single kernel's), naming the link and buffer."""
    if kernel.device is not device:
        raise InputError(f"{where}: kernel {kernel.name!r} was built for "
                         f"{named_beside(kernel.device, device)}, the stream runs on "
                         f"{device.spec}: compile it with that device")
    buffers = len(reads) + len(writes)
    params = list(kernel.params)
    from conveyor.pipeline.image import TEXTURE_TYPES

    for param in params:  # the count below would be all a user was told
        if param.base.split(" ")[-1] in ("image2d_t", "sampler_t", *TEXTURE_TYPES):
            raise InputError(
                f"{where}: kernel {kernel.name!r} takes an image ({param.name!r}, "
                f"{param.type_text}), and a chain's links read buffers, not images: stream "
                f"the image through that kernel alone (cv.stream(kernel, [cv.image(a)], ...)), "
                f"then chain the rest on its output")
    expected = buffers + len(args) + 2
    if len(params) != expected:
        raise InputError(
            f"{where}: kernel {kernel.name!r} takes {len(params)} parameters; the link passes "
            f"{expected}: {len(reads)} read(s), {len(writes)} write(s), {len(args)} args, "
            f"then offset and n")
    for param, ref, role in zip(params, [*reads, *writes],
                                ["reads"] * len(reads) + ["writes"] * len(writes),
                                strict=False):
        dtype = known[ref.name][2]
        try:
            # (A temp is the chain's own, not an array the caller holds: its fix is in temps=.)
            validate.check_buffer(kernel.name, param, f"buffer {ref.name!r}", dtype,
                                  validate.struct_source(kernel) if param.dtype is None
                                  else None, temp=ref.name if ref.kind == "temp" else "")
        except InputError as exc:
            text = str(exc)
            if ref.kind == "temp" and "in temps=" not in text:
                # The message's fix is for an array the caller holds (a.astype, a.view):
                # a temp is declared in temps= instead.
                text = _temp_misfit(kernel, param, ref.name, dtype)
            raise InputError(f"{where} {role} {ref.name!r}: {text}") from None
        if role == "writes" and (param.is_const or param.address == "constant"):
            raise InputError(f"{where} writes {ref.name!r} through parameter {param.name!r} "
                             f"({param.type_text}), which is const: drop const, or read it "
                             f"(reads=) instead")
    try:
        validate.check_args(params[buffers:], args, kernel)
        for param in params[buffers + len(args):]:
            if param.is_pointer:
                raise InputError(f"kernel parameter {param.name!r} is a pointer but receives "
                                 f"offset/n: a link's kernel takes its reads, its writes, its "
                                 f"args, then ulong offset, ulong n")
            validate.check_count(param)
        return resident.bind(kernel, buffers, args)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None


def _check_order(links: list[BoundLink], known: dict[str, tuple[str, int, np.dtype | None]],
                 outputs: int) -> None:
    """Every temp and output is written by a link before a later link reads it; every
    output (and a kernel reduction's values) is written by some link."""
    written: set[str] = set()
    for bound in links:
        for ref in bound.reads:
            if ref.kind in ("temp", "out", "reduce") and ref.name not in written:
                raise InputError(
                    f"{bound.where()} reads {ref.name!r}, which no earlier link writes: its "
                    f"device buffer would hold whatever the last block left there; write it "
                    f"in an earlier link (writes=) or read an input")
        written.update(ref.name for ref in bound.writes)
    for i in range(outputs):
        if f"out{i}" not in written:
            raise InputError(f"output out{i} is written by no link of the chain: add it to a "
                             f"link's writes=, or drop the output")


def _reduce_element(links: list[BoundLink], reduce: Any) -> np.dtype | None:
    """The element dtype of a kernel reduction (the last link writes ``reduce``); None for a
    callable last link (it returns the block's partial) and without ``reduce=``."""
    for bound in links[:-1]:
        if any(r.kind == "reduce" for r in bound.writes):
            raise InputError(f"{bound.where()} writes {REDUCE!r}, but only the last link of a "
                             f"chain makes the values that reduce= folds")
    last = links[-1]
    if reduce is None or not last.is_kernel:
        return None
    if not isinstance(reduce, str) or reduce not in BUILTIN_OPS:
        raise InputError(f"reduce={reduce!r} with a kernel last link: use 'sum', 'min' or "
                         f"'max'; for another combine, end the chain with a callable that "
                         f"returns each block's partial")
    position = [r.kind for r in last.writes]
    if "reduce" not in position:
        raise InputError(f"{last.where()} ends a chain with reduce={reduce!r} but does not "
                         f"write {REDUCE!r}: add {REDUCE!r} to its writes= (the per-element "
                         f"values that conveyor folds)")
    param = last.compute.params[len(last.reads) + position.index("reduce")]
    if param.dtype is None:
        raise InputError(f"{last.where()}: cannot tell the element type of kernel parameter "
                         f"{param.name!r}: declare it as a pointer to a numeric type")
    return param.dtype


def _temp_misfit(kernel: Kernel, param: Any, name: str, dtype: np.dtype | None) -> str:
    """What a temp of ``dtype`` that kernel parameter ``param`` does not take should be
    declared as in ``temps=``: the parameter's scalar type, or its struct's records as the
    compiler lays them out, in this machine's byte order."""
    from conveyor.pipeline.chunks import param_dtype
    from conveyor.pipeline.structs import spell

    wanted = param_dtype(kernel, param)
    if wanted is None or wanted == np.dtype("V1"):  # no type conveyor can name
        return (f"kernel parameter {param.name!r} ({param.type_text}) does not take temp "
                f"{name!r} of {dtype}: declare the temp in temps= with the type the "
                f"parameter points to")
    shown = spell(wanted) if wanted.names else str(wanted)
    return (f"kernel parameter {param.name!r} ({param.type_text}) takes {shown}, not temp "
            f"{name!r}'s {dtype}: declare temp {name!r} in temps= as {shown}")
