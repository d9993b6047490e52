"""Chains: several kernels (or callables) run in order on each block, with device-only
intermediate buffers (*temps*), so an intermediate result never crosses the link.

``cv.chain(link, link, ..., temps=...)`` is passed to ``cv.stream`` in place of a kernel. Every
buffer a link touches has a name: ``in0``, ``in1``, ... are the stream's inputs, ``out0``, ...
its outputs, the temps are ``t0``, ``t1``, ... (or the names of a ``temps={...}`` dict), and
``reduce`` is the per-element values that ``reduce=`` folds (a kernel reduction). Each link
says what it reads and writes: ``cv.link(kernel, reads=("in0",), writes=("t0",), args=(...))``
launches ``kernel(*reads, *writes, *args, offset, n)`` (a callable gets device arrays of the
same buffers, then ``args``, ``queue=``, ``offset=``, ``n=``, as ``cv.stream``'s callables do).
Links of bare kernels (no ``cv.link``) make a linear chain: the first reads every input, each
writes the next temp in order, the next link reads it, the last writes every output.

Everything is checked by :meth:`Chain.bind` before any work, and each problem is an InputError
that names the link and the buffer: an unknown name, a write to an input, a buffer read before
any link wrote it, an output no link writes, a buffer whose dtype is not the one the kernel
declares, a temp that does not fit ``memory_limit`` (:meth:`BoundChain.make_plan`).
The step that runs a bound chain on each block is pipeline/chainstep.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from conveyor.backends.base import Device, Kernel
from conveyor.errors import InputError
from conveyor.pipeline import options, resident, validate
from conveyor.pipeline.plan import ArraySpec, Plan, make_plan
from conveyor.pipeline.reduce import BUILTIN_OPS

#: The name of the per-element values buffer that ``reduce=`` folds (kernel reductions).
REDUCE = "reduce"


@dataclass(frozen=True)
class Link:
    """One link of a chain: ``compute`` (a Kernel, a KernelFuture or a callable), the buffers
    it reads, then those it writes (by name, in the order the kernel takes them), its own
    ``args`` and a ``name`` for the timeline (default: the kernel's or function's name)."""

    compute: Any
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    args: tuple[Any, ...] = ()
    name: str = ""


def link(compute: Any, reads: str | Sequence[str] = (), writes: str | Sequence[str] = (), *,
         args: Sequence[Any] = (), name: str | None = None) -> Link:
    """A link of a chain: ``compute`` reads the buffers ``reads`` and writes ``writes`` (names:
    ``in0``..., ``out0``..., the temps' names, ``reduce``), with its own scalar or resident
    ``args``. InputError for names that are not strings."""
    label = name if name is not None else _label(compute)
    return Link(compute, _names("reads", reads), _names("writes", writes),
                options.scalar_args(args), label)


@dataclass(frozen=True)
class Temp:
    """A device-only buffer of a chain: ``row_shape`` elements of ``dtype`` per row of input 0,
    one block of rows per ring slot (``row_shape`` None: input 0's row shape)."""

    name: str
    dtype: np.dtype
    row_shape: tuple[int, ...] | None


class Chain:
    """Links run in order on each block (see the module); pass it to ``cv.stream``."""

    def __init__(self, links: Sequence[Any], temps: Sequence[Any] | Mapping[str, Any] = ()
                 ) -> None:
        if not links:
            raise InputError("cv.chain() needs at least one link: cv.chain(link1, link2, ...)")
        self.links = list(links)
        self.temps = _temps(temps)

    @property
    def has_callables(self) -> bool:
        """Whether any link is a Python callable (whose device arrays need native order)."""
        return any(not _is_kernel(_compute(item)) for item in self.links)

    def bind(self, device: Device, inputs: Sequence[Any], outputs: Sequence[Any],
             args: Sequence[Any], reduce: Any) -> BoundChain:
        """Check the chain against the stream's arrays (anything with ``shape`` and
        ``dtype``) before any work; InputError naming the link and buffer otherwise."""
        if args:
            raise InputError("a chain takes no args= of cv.stream: give each link its own, "
                             "cv.link(kernel, reads=..., writes=..., args=(...))")
        links = self._links(len(inputs), len(outputs), reduce)
        row_shape = tuple(inputs[0].shape[1:])
        temps = [Temp(t.name, t.dtype, row_shape if t.row_shape is None else t.row_shape)
                 for t in self.temps]
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
        _check_order(bound, known, len(outputs))
        element = _reduce_element(bound, reduce)
        return BoundChain(bound, temps, element, reduce is not None)

    def output_dtype(self, index: int, inputs: int, outputs: int) -> np.dtype | None:
        """The parameter type of the first kernel link that writes output ``index`` (for a
        file output given no dtype); None where no kernel declares one."""
        name = f"out{index}"
        for item in self._links(inputs, outputs, None):
            compute = item.compute
            if isinstance(compute, Kernel) and name in item.writes:
                position = len(item.reads) + item.writes.index(name)
                if position < len(compute.params) and compute.params[position].is_pointer:
                    return compute.params[position].dtype
        return None

    def _links(self, inputs: int, outputs: int, reduce: Any) -> list[Link]:
        """Every link as a Link: bare computes make a linear chain (see the module)."""
        bare = [not isinstance(item, Link) for item in self.links]
        if not any(bare):
            return list(self.links)
        if not all(bare):
            raise InputError("a chain mixes cv.link(...) links and bare kernels: give every "
                             "link its buffers with cv.link(compute, reads=..., writes=...)")
        count = len(self.links)
        if len(self.temps) != count - 1:
            raise InputError(
                f"a chain of {count} bare links is linear and needs {count - 1} temp(s), one "
                f"between each two links; it has {len(self.temps)}: pass temps=[...] of "
                f"{count - 1}, or name each link's buffers with cv.link(...)")
        names = [t.name for t in self.temps]
        last: tuple[str, ...] = tuple(f"out{i}" for i in range(outputs))
        if reduce is not None and _is_kernel(_compute(self.links[-1])):
            last += (REDUCE,)
        made = []
        for index, compute in enumerate(self.links):
            reads = (tuple(f"in{i}" for i in range(inputs)) if index == 0
                     else (names[index - 1],))
            writes = last if index == count - 1 else (names[index],)
            made.append(Link(compute, reads, writes, (), _label(compute)))
        return made


def chain(*links: Any, temps: Sequence[Any] | Mapping[str, Any] = ()) -> Chain:
    """Links run in order on each block, with device-only ``temps`` between them: pass the
    chain to ``cv.stream`` in place of a kernel. ``links`` are ``cv.link(...)`` (or, for a
    linear chain, bare kernels and callables; one list of them works too). ``temps`` holds
    a dtype (rows shaped like input 0's) or ``(row_shape, dtype)`` per temp, named ``t0``,
    ``t1``...; a dict names them itself. See ``conveyor.pipeline.chain``."""
    if len(links) == 1 and isinstance(links[0], list | tuple):
        links = tuple(links[0])
    return Chain(links, temps)


# -- a bound chain ---------------------------------------------------------------------------
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
                 reduces: bool) -> None:
        self.links = links
        self.temps = temps
        self.element = element
        self.reduces = reduces
        self.residents = ChainResidents(links)

    def temp_row_bytes(self) -> tuple[int, ...]:
        """Bytes of one row of each temp (one row of input 0)."""
        return tuple(math.prod(t.row_shape or ()) * t.dtype.itemsize for t in self.temps)

    def make_plan(self, inputs: tuple[ArraySpec, ...], outputs: tuple[ArraySpec, ...],
                  **options: Any) -> Plan:
        """``make_plan`` with the temps counted in each slot; when the ring fits without the
        temps but not with them, the InputError names the temps and the links that use
        them."""
        temps = self.temp_row_bytes()
        try:
            return make_plan(inputs, outputs, temp_row_bytes=temps, **options)
        except InputError as exc:
            if not temps:
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
            raise InputError(f"the chain's temps do not fit: {'; '.join(parts)} are device "
                             f"buffers of one block in each ring slot, beside the inputs and "
                             f"outputs. {exc}") from None


class ChainResidents:
    """The resident arrays of every link's args, with ResidentArgs' interface for the
    engine: ``upload`` returns each link's args (a tuple of tuples) for the chain's step."""

    def __init__(self, links: list[BoundLink]) -> None:
        self.links = links

    @property
    def nbytes(self) -> int:
        """Device bytes of every link's tables."""
        return sum(b.residents.nbytes for b in self.links if b.residents is not None)

    def upload(self, device: Device, queue: Any, args: Sequence[Any]) -> tuple[Any, ...]:
        """Upload every link's tables on ``queue``; ``args`` (the stream's) is empty."""
        return tuple(b.args if b.residents is None else b.residents.upload(device, queue, b.args)
                     for b in self.links)

    def copy_back(self, queue: Any) -> None:
        """Writable tables back into their host arrays (after a stream that succeeded)."""
        for b in self.links:
            if b.residents is not None:
                b.residents.copy_back(queue)

    def release(self) -> None:
        """Let go of every link's tables."""
        for b in self.links:
            if b.residents is not None:
                b.residents.release()


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
    return BoundLink(index, item.name or _label(compute), compute, reads, writes, item.args,
                     residents)


def _check_kernel_link(where: str, kernel: Kernel, device: Device, reads: list[Ref],
                       writes: list[Ref], args: tuple[Any, ...],
                       known: dict[str, tuple[str, int, np.dtype | None]]
                       ) -> resident.ResidentArgs:
    """The kernel's parameters against the link's buffers and args (as validate.check_kernel
    checks a single kernel's), naming the link and buffer."""
    if kernel.device is not device:
        raise InputError(f"{where}: kernel {kernel.name!r} was built for {kernel.device.spec}, "
                         f"the stream runs on {device.spec}: compile it with that device")
    buffers = len(reads) + len(writes)
    params = list(kernel.params)
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
            validate.check_buffer(kernel.name, param, f"buffer {ref.name!r}", dtype)
        except InputError as exc:
            raise InputError(f"{where} {role} {ref.name!r}: {exc}") from None
        if role == "writes" and (param.is_const or param.address == "constant"):
            raise InputError(f"{where} writes {ref.name!r} through parameter {param.name!r} "
                             f"({param.type_text}), which is const: drop const, or read it "
                             f"(reads=) instead")
    try:
        validate.check_args(params[buffers:], args)
        for param in params[buffers + len(args):]:
            if param.is_pointer:
                raise InputError(f"kernel parameter {param.name!r} is a pointer but receives "
                                 f"offset/n: a link's kernel takes its reads, its writes, its "
                                 f"args, then ulong offset, ulong n")
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


def _temps(temps: Sequence[Any] | Mapping[str, Any]) -> list[Temp]:
    if isinstance(temps, Mapping):
        items = list(temps.items())
    elif isinstance(temps, Sequence) and not isinstance(temps, str | bytes):
        items = [(f"t{i}", value) for i, value in enumerate(temps)]
    else:
        raise InputError(f"temps={temps!r}: temps takes a list of dtypes or (row_shape, dtype) "
                         f"pairs (named t0, t1, ...), or a dict of them by name")
    return [_temp(name, value) for name, value in items]


def _temp(name: Any, value: Any) -> Temp:
    if not isinstance(name, str) or not name.isidentifier():
        raise InputError(f"temp name {name!r}: name temps with identifiers, e.g. 'flags'")
    shape: tuple[int, ...] | None = None
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], tuple | list | int):
        raw, value = value
        raw = (raw,) if isinstance(raw, int) else tuple(raw)
        if not all(isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0
                   for d in raw):
            raise InputError(f"temp {name!r}: row shape {raw!r} must be whole numbers of 0 or "
                             f"more, e.g. ((3,), np.float32)")
        shape = tuple(int(d) for d in raw)
    try:
        dtype = np.dtype(value)
    except TypeError as exc:
        raise InputError(f"temp {name!r}: {value!r} is no dtype: give a dtype or "
                         f"(row_shape, dtype), e.g. np.float32 or ((3,), np.float32)") from exc
    if value is None or dtype.hasobject or dtype.subdtype is not None:
        raise InputError(f"temp {name!r}: {value!r} is not a numeric dtype; for rows of "
                         f"several elements give (row_shape, dtype), e.g. ((3,), np.float32)")
    return Temp(name, dtype, shape)


def _names(role: str, value: str | Sequence[str]) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) else tuple(value)
    for name in names:
        if not isinstance(name, str):
            raise InputError(f"{role}={value!r}: name buffers with strings such as 'in0', "
                             f"'out0' or a temp's name")
    return names


def _compute(item: Any) -> Any:
    return item.compute if isinstance(item, Link) else item


def _is_kernel(compute: Any) -> bool:
    from conveyor.kernels.build import KernelFuture

    return isinstance(compute, Kernel | KernelFuture)


def _label(compute: Any) -> str:
    name = getattr(compute, "name", None) or getattr(compute, "__name__", None)
    return str(name) if name else type(compute).__name__


