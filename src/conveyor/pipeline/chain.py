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
declares, a temp that does not fit ``memory_limit`` (pipeline/chainbind.py). The step that runs
a bound chain on each block is pipeline/chainstep.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from conveyor.backends.base import Device, Kernel
from conveyor.errors import InputError
from conveyor.pipeline import options

if TYPE_CHECKING:
    from conveyor.pipeline.chainbind import BoundChain

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
    if name is not None and not isinstance(name, str):
        raise InputError(f"name={name!r}: a link's name is a str (it labels its span in the "
                         f"timeline)")
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
        from conveyor.pipeline.chainbind import bind

        if args:
            raise InputError("a chain takes no args= of cv.stream: give each link its own, "
                             "cv.link(kernel, reads=..., writes=..., args=(...))")
        links = self._links(len(inputs), len(outputs), reduce)
        _adopt_types(links, inputs)
        row_shape = tuple(inputs[0].shape[1:])
        temps = [Temp(t.name, t.dtype, row_shape if t.row_shape is None else t.row_shape)
                 for t in self.temps]
        return bind(links, temps, device, inputs, outputs, reduce)

    def output_dtype(self, index: int, inputs: int, outputs: int) -> np.dtype | None:
        """The parameter type of the first kernel link that writes output ``index`` (for a
        file output given no dtype); None where no kernel declares one."""
        from conveyor.kernels.build import KernelFuture

        name = f"out{index}"
        for item in self._links(inputs, outputs, None):
            compute = item.compute
            if isinstance(compute, KernelFuture) and name in item.writes:
                compute = compute.result()  # cv.stream loads it before any block anyway
            if isinstance(compute, Kernel) and name in item.writes:
                position = len(item.reads) + item.writes.index(name)
                if position < len(compute.params) and compute.params[position].is_pointer:
                    param = compute.params[position]
                    if param.dtype is None:  # a struct: its records, where conveyor reads it
                        from conveyor.pipeline.structs import records_dtype

                        return records_dtype(compute, param)
                    return param.dtype
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


def _adopt_types(links: Sequence[Link], inputs: Sequence[Any]) -> None:
    """An iterable that yielded no chunk takes the type of the first kernel parameter that
    reads it (chunks.adopt_types, for a chain): it was refused as float32."""
    from conveyor.kernels.build import KernelFuture
    from conveyor.pipeline.chunks import IterSource, param_dtype

    for index, source in enumerate(inputs):
        if not (isinstance(source, IterSource) and source.untyped):
            continue
        name = f"in{index}"
        for item in links:
            compute = item.compute
            if name not in item.reads:
                continue
            if isinstance(compute, KernelFuture):
                compute = compute.result()  # cv.stream loads it before any block anyway
            if not isinstance(compute, Kernel):
                continue
            position = item.reads.index(name)
            dtype = (param_dtype(compute, compute.params[position])
                     if position < len(compute.params) else None)
            if dtype is not None:
                source.dtype = dtype
                break


def chain(*links: Any, temps: Sequence[Any] | Mapping[str, Any] = ()) -> Chain:
    """Links run in order on each block, with device-only ``temps`` between them: pass the
    chain to ``cv.stream`` in place of a kernel. ``links`` are ``cv.link(...)`` (or, for a
    linear chain, bare kernels and callables; one list of them works too). ``temps`` holds
    a dtype (rows shaped like input 0's) or ``(row_shape, dtype)`` per temp, named ``t0``,
    ``t1``...; a dict names them itself. See ``conveyor.pipeline.chain``."""
    if len(links) == 1 and isinstance(links[0], list | tuple):
        links = tuple(links[0])
    return Chain(links, temps)


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
    if isinstance(value, tuple) and len(value) == 2 and isinstance(
            value[0], tuple | list | range | int | np.integer | float | np.floating) or (
            isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], np.ndarray)
            and value[0].ndim <= 1):
        from conveyor.pipeline.options import _whole

        raw, value = value
        raw = ((raw,) if isinstance(raw, int | np.integer | float | np.floating)
               else (raw.item(),) if isinstance(raw, np.ndarray) and raw.ndim == 0
               else tuple(raw))
        wholes = [_whole(d) for d in raw]  # an integral float taken as meant (2.0 as 2)
        if not all(d is not None and d >= 0 for d in wholes):
            raise InputError(f"temp {name!r}: row shape {raw!r} must be whole numbers of 0 or "
                             f"more, e.g. ((3,), np.float32)")
        shape = tuple(int(d) for d in wholes)  # type: ignore[arg-type]
        if 0 in shape:
            raise InputError(f"temp {name!r}: row shape {raw!r} holds no elements; give each "
                             f"row at least one, e.g. ((3,), np.float32)")
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError, SyntaxError) as exc:
        raise InputError(f"temp {name!r}: {value!r} is no dtype: give a dtype or "
                         f"(row_shape, dtype), e.g. np.float32 or ((3,), np.float32)") from exc
    if value is None or dtype.hasobject or dtype.subdtype is not None:
        raise InputError(f"temp {name!r}: {value!r} is not a numeric dtype; for rows of "
                         f"several elements give (row_shape, dtype), e.g. ((3,), np.float32)")
    return Temp(name, dtype, shape)


def _names(role: str, value: str | Sequence[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        names: tuple[Any, ...] = (value,)
    elif isinstance(value, Sequence):
        names = tuple(value)
    else:  # None, a number, a set (no order): not a list of names
        names = (value,)
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


