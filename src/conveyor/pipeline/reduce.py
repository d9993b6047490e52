"""Reductions: per-block partials on the device, combined on the host.

With a kernel, ``reduce="sum" | "min" | "max"``: the user's kernel writes one value per element
into a device-only buffer (its only output parameter), then conveyor's own reduction kernel folds
that buffer into a few thousand partials (``partials_for``), which alone cross the link; the host
folds those. With a
Python callable, the callable returns the block's partial and ``reduce`` may also be any
function ``f(a, b) -> c`` (applied left to right over the blocks' partials, in block order).
``reduce="sum"`` adds NumPy partials as ``np.sum`` would add them: bool and narrow integers
widened to 64 bits (``widened``). Over several devices each engine keeps its partials and the
stream folds them all once, in global block order (``Reduction.share``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from conveyor.errors import InputError
from conveyor.pipeline.fold import Fold, combine, combiner  # noqa: F401 (combine: dask's)

#: The most work items of the built-in reduction kernel, and so partials per block. Each work
#: item folds every ``parts``-th element; fewer than ~64k leaves a big GPU waiting on memory
#: latency (4,096 made the fold, not the link, the bound of an 8 GiB filter-sum on the H100).
PARTIALS = 65536
#: Elements each work item folds, at least (small blocks get fewer work items).
ELEMENTS_PER_PART = 256


def partials_for(elements: int) -> int:
    """Work items (and partials) for blocks of ``elements``: a multiple of 256 up to
    ``PARTIALS``, so each folds at least ``ELEMENTS_PER_PART`` elements."""
    parts = -(-max(elements, 1) // ELEMENTS_PER_PART)
    return min(PARTIALS, -(-parts // 256) * 256)

BUILTIN_OPS = ("sum", "min", "max")

_C_TYPES = {
    "float32": "float", "float64": "double", "int32": "int", "uint32": "uint",
    "int64": "long", "uint64": "ulong", "int16": "short", "uint16": "ushort",
    "int8": "char", "uint8": "uchar",
    "bool": "uchar",  # a bool is one byte of 0 or 1 (a sum folds into int64: a count)
}  # fmt: skip
_CUDA_TYPES = {
    "float": "float", "double": "double", "int": "int", "uint": "unsigned int",
    "long": "long long", "ulong": "unsigned long long", "short": "short",
    "ushort": "unsigned short", "char": "signed char", "uchar": "unsigned char",
}  # fmt: skip


def partial_dtype(element: np.dtype, op: str, *, fp64: bool = True) -> np.dtype:
    """The dtype partials are kept in: 64-bit for integer sums, float64 for float32 sums
    where the device has doubles (``fp64``), else the element type. A float32 accumulator
    made the answer depend on the block size: 3001 values of 2**127 summed to inf in one
    block, exactly in blocks of 250, where each work item held one value."""
    if op == "sum" and element.kind in "iu" and element.itemsize < 8:
        return np.dtype(np.int64 if element.kind == "i" else np.uint64)
    if op == "sum" and element.kind == "b":
        return np.dtype(np.int64)
    if op == "sum" and element == np.float32 and fp64:
        return np.dtype(np.float64)
    return element


def has_fp64(device: Any) -> bool:
    """True when ``device`` computes in double precision (every CUDA device; an OpenCL
    device that lists ``cl_khr_fp64``)."""
    return device.backend == "cuda" or "cl_khr_fp64" in device.source_macros()


def kernel_source(backend: str, element: np.dtype, op: str, acc: np.dtype | None = None
                  ) -> tuple[str, str]:
    """(source, name) of the built-in kernel folding ``n`` elements into ``parts`` partials
    of dtype ``acc`` (default :func:`partial_dtype`; arguments: x, partial, has, n, parts;
    launched over ``parts`` work items)."""
    if op not in BUILTIN_OPS:
        raise InputError(f"reduce={op!r}: with a kernel use 'sum', 'min' or 'max'")
    if element.name not in _C_TYPES:
        raise InputError(
            f"cannot reduce elements of dtype {element} on the device (the built-in fold "
            f"takes {', '.join(sorted(_C_TYPES))}): have the kernel write its values as "
            f"float32 (declare that buffer float*), or reduce with a Python callable")
    acc = partial_dtype(element, op) if acc is None else acc
    t_in, t_acc = _C_TYPES[element.name], _C_TYPES[acc.name]
    if backend == "cuda":
        t_in, t_acc = _CUDA_TYPES[t_in], _CUDA_TYPES[t_acc]
    # NaN wins, as in np.min/np.max: a NaN v replaces acc (v != v), and once acc is NaN
    # no comparison with it is true, so it stays. Integers have no NaN: plain compare.
    nan = " || v != v" if element.kind == "f" else ""
    fold = {
        "sum": "acc += v;",
        "min": f"acc = (v < acc{nan}) ? v : acc;",
        "max": f"acc = (v > acc{nan}) ? v : acc;",
    }
    # a bool byte other than 0 is True, as np.sum counts it (a kernel may store any byte)
    read = "(x[j] != 0)" if element.kind == "b" else "x[j]"
    name = f"conveyor_reduce_{op}_{element.name}_{acc.name}"
    body = f"""
    {{
        {t_acc} acc = ({t_acc})0;
        int first = 1;
        for (unsigned long long j = i; j < n; j += parts) {{
            {t_acc} v = ({t_acc}){read};
            if (first) {{ acc = v; first = 0; }} else {{ {fold[op]} }}
        }}
        partial[i] = acc;
        has[i] = (unsigned char)(first == 0);
    }}"""
    if backend == "cuda":
        head = (
            f'extern "C" __global__ void {name}(const {t_in}* x, {t_acc}* partial, '
            f"unsigned char* has, unsigned long long n, unsigned long long parts) {{\n"
            f"    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x "
            f"+ threadIdx.x;\n    if (i >= parts) return;"
        )
    else:
        head = ("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
                if "double" in (t_in, t_acc) else "")
        head += (
            f"__kernel void {name}(__global const {t_in}* x, __global {t_acc}* partial, "
            f"__global uchar* has, ulong n, ulong parts) {{\n"
            f"    ulong i = get_global_id(0);\n    if (i >= parts) return;"
        )
    return head + body + "\n}\n", name


def fold_partials(op: str, partial: np.ndarray, has: np.ndarray) -> Any:
    """Fold one block's device partials on the host; None when the block had no elements."""
    values = partial[has.astype(bool)]
    if values.size == 0:
        return None
    if op == "sum":
        return values.sum(dtype=np.float64 if values.dtype.kind == "f" else values.dtype)
    return values.min() if op == "min" else values.max()


def widened(partial: Any) -> Any:
    """A NumPy partial of ``reduce="sum"`` in the type ``np.sum`` adds it in: bool and
    integers narrower than 64 bits as int64 (uint64 for unsigned), as a NumPy sum of the
    partials would; float16 as float32 (``combine`` gives the total back as float16). Added
    as they are, ``np.bool_`` partials were or-ed (``True + True`` is ``True``: 20 blocks
    summed to True), int8/int16/int32 ones wrapped around (int8 arrays silently) and float16
    ones rounded each partial away (2048 + 1.0 is 2048 in float16); float32 as float64
    (``combine`` gives float32 back: 2**24 + 1.0 + 1.0 ... stayed 2**24, where np.sum's
    pairwise sum kept most of the ones). Anything else (Python numbers, float64, dicts) is
    returned as it is."""
    if isinstance(partial, bool):  # Python's: True is 1, as np.sum counts it
        return int(partial)
    dtype = getattr(partial, "dtype", None)
    if not isinstance(partial, np.ndarray | np.generic) or dtype is None:
        return partial
    if dtype.kind == "b" or (dtype.kind in "iu" and dtype.itemsize < 8) or \
            dtype in (np.float16, np.float32, np.complex64):
        wider = np.dtype(np.uint64 if dtype.kind == "u" else np.float32 if dtype == np.float16
                         else np.float64 if dtype.kind == "f" else np.complex128
                         if dtype.kind == "c" else np.int64)
        return wider.type(partial) if isinstance(partial, np.generic) else partial.astype(wider)
    return partial


def empty_sum(element: np.dtype | None, *, kernel: bool) -> Any:
    """The sum of no elements: 0 in the type a non-empty sum would have (with a kernel:
    float64 for floats, 64-bit for integers; with a callable: the input's dtype, as
    ``np.sum`` of an empty array gives), or int 0 when the type is unknown or has no sum
    (datetime64, records, strings: a callable's partials over them are its own numbers, and
    NumPy's UFuncTypeError reached the caller only when the input was empty)."""
    if element is None:
        return 0
    if kernel:
        dtype = np.dtype(np.float64) if element.kind == "f" else partial_dtype(element, "sum")
        return dtype.type(0)
    try:
        return np.zeros(0, element).sum()
    except TypeError:  # numpy's UFuncTypeError: no add loop for the type
        return 0


def check_not_empty(op: object, elements: int) -> None:
    """Raise InputError for ``min``/``max`` over no elements (NumPy raises too: the extreme of
    nothing is undefined), before any work."""
    if elements == 0 and op in ("min", "max"):
        raise InputError(
            f"reduce={op!r} over an empty input (0 elements): the {op}imum of nothing is "
            f"undefined (np.{op} raises too); check the input's length first, or use "
            f"reduce='sum' (0 for no elements)"
        )


class Scratch:
    """One slot's buffers of a kernel reduction: the per-element values the user's kernel
    writes, the partials the fold kernel makes of them, and their pinned copies."""

    def __init__(self) -> None:
        self.values: Any = None
        self.partial: Any = None
        self.has: Any = None
        self.pin_partial: Any = None
        self.pin_has: Any = None

    def device_buffers(self) -> list[Any]:
        """The device buffers (some None when an allocation failed half-way)."""
        return [self.values, self.partial, self.has]

    def pinned_buffers(self) -> list[Any]:
        """The pinned buffers."""
        return [self.pin_partial, self.pin_has]


class Reduction:
    """A stream's ``reduce=``: its checks, the scratch each slot needs, the fold enqueued after
    each block's compute, and the host combine of the blocks' partials in block order.

    ``element`` is the dtype of the kernel's per-element values (None for a callable, whose
    return value is each block's partial)."""

    def __init__(self, op: str | Callable[[Any, Any], Any], element: np.dtype | None,
                 fallback: np.dtype) -> None:
        self.op = op
        self.element = element
        self.fallback = fallback  # the type of an empty callable sum (the input's)
        self.kernel: Any = None
        #: The partials' dtype (a float32 sum's falls back from float64 at ``build`` on a
        #: device without doubles; sized for float64 until then).
        self.acc = None if element is None else partial_dtype(element, str(op))
        self.parts = 0
        #: The blocks' partials, folded in block order as they retire (pipeline/fold.py).
        self.fold = Fold(op, element or fallback, kernel=element is not None)
        #: One engine's share of a stream over several devices (multi._fresh): it adds its
        #: partials to the stream's one fold, shared by every engine, and has no result of
        #: its own (folding a share alone too called a custom ``reduce=f`` on some partials
        #: twice: an ``f`` that adds into its first argument, ``a += b``, counted blocks twice).
        self.share = False

    @classmethod
    def make(cls, op: Any, element: np.dtype | None, fallback: np.dtype, elements: int,
             with_kernel: bool) -> Reduction | None:
        """The reduction of ``op`` (None without one); InputError for an op that cannot work
        (the kernel's own parameter checks are in validate.check_kernel)."""
        if op is None:
            return None
        if not with_kernel and not callable(op) and op not in BUILTIN_OPS:
            raise InputError(f"reduce={op!r}: use 'sum', 'min', 'max' or a function f(a, b)")
        check_not_empty(op, elements)
        return cls(op, element, fallback)

    def scratch_sizes(self, row_items: int) -> dict[str, Any]:
        """The plan's arguments for the device buffers each slot adds (the engine allocates
        exactly these), so they count against the memory limit."""
        if self.element is None:
            return {}
        assert self.acc is not None
        return {"scratch_row_bytes": row_items * self.element.itemsize,
                "partial_bytes": (self.acc.itemsize, 1)}

    def build(self, device: Any, block_elements: int) -> None:
        """Compile the fold kernel (before the first block)."""
        if self.element is not None:
            self.acc = partial_dtype(self.element, str(self.op), fp64=has_fp64(device))
            source, name = kernel_source(device.backend, self.element, str(self.op), self.acc)
            self.kernel = device.compile(source, name)
            self.parts = partials_for(block_elements)

    def allocate(self, slot: Any, acquire: Callable[[int], Any], pin_pool: Any,
                 value_bytes: int) -> None:
        """One slot's scratch (``slot.scratch``), from ``acquire`` (device) and
        ``pin_pool``; each buffer is stored as it is made, so a failed allocation leaves the
        others where the engine's release finds them."""
        if self.element is None:
            return
        acc = self.acc
        assert acc is not None
        slot.scratch = scratch = Scratch()
        scratch.values = acquire(value_bytes)
        scratch.partial = acquire(self.parts * acc.itemsize)
        scratch.has = acquire(self.parts)
        scratch.pin_partial = pin_pool.acquire(self.parts * acc.itemsize)
        scratch.pin_has = pin_pool.acquire(self.parts)

    def enqueue(self, compute_q: Any, copy_out_q: Any, scratch: Scratch | None, n: int,
                after: Any, records: list[Any], block: int) -> tuple[Any, list[Any]]:
        """The fold of one block's values after ``after`` and the copies of its partials;
        return (the fold's event, the copies' events)."""
        if self.kernel is None or scratch is None:
            return after, []
        event = compute_q.launch(
            self.kernel, self.parts,
            [scratch.values, scratch.partial, scratch.has, np.uint64(n), np.uint64(self.parts)],
            wait_for=[after])
        records.append(("compute", block, event, 0))
        assert self.acc is not None
        nbytes = self.parts * self.acc.itemsize
        copies = []
        for dst, src in ((scratch.pin_partial.array[:nbytes], scratch.partial),
                         (scratch.pin_has.array[: self.parts], scratch.has)):
            copy = copy_out_q.copy_out(dst, src, wait_for=[event])
            copies.append(copy)
            records.append(("copy-out", block, copy, dst.nbytes))
        return event, copies

    def collect(self, scratch: Scratch | None, partial: Any, index: int) -> None:
        """Fold block ``index``'s partial (after its copies completed) into the total, in
        block order: the callable's return value, or the fold of the kernel's partials on
        the host."""
        if self.element is not None:
            assert scratch is not None
            acc = self.acc
            assert acc is not None
            values = scratch.pin_partial.array[: self.parts * acc.itemsize].view(acc)
            has = scratch.pin_has.array[: self.parts]
            partial = fold_partials(str(self.op), values, has)
        self.fold.add(partial, index)

    def result(self) -> Any:
        """The folded result of every block's partial (None for one engine's share of a
        stream over several devices: the stream's own Reduction gives it)."""
        return None if self.share else self.fold.result()
