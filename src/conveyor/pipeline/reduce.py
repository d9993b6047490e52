"""Reductions: per-block partials on the device, combined on the host.

With a kernel, ``reduce="sum" | "min" | "max"``: the user's kernel writes one value per element
into a device-only buffer (its only output parameter), then conveyor's own reduction kernel folds
that buffer into a few thousand partials (``partials_for``), which alone cross the link; the host
folds those. With a
Python callable, the callable returns the block's partial and ``reduce`` may also be any
function ``f(a, b) -> c`` (applied left to right over the blocks' partials, in block order).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from conveyor.errors import InputError

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
}  # fmt: skip
_CUDA_TYPES = {
    "float": "float", "double": "double", "int": "int", "uint": "unsigned int",
    "long": "long long", "ulong": "unsigned long long", "short": "short",
    "ushort": "unsigned short", "char": "signed char", "uchar": "unsigned char",
}  # fmt: skip


def partial_dtype(element: np.dtype, op: str) -> np.dtype:
    """The dtype partials are kept in: 64-bit for integer sums, else the element type."""
    if op == "sum" and element.kind in "iu" and element.itemsize < 8:
        return np.dtype(np.int64 if element.kind == "i" else np.uint64)
    if op == "sum" and element.kind == "b":
        return np.dtype(np.int64)
    return element


def kernel_source(backend: str, element: np.dtype, op: str) -> tuple[str, str]:
    """(source, name) of the built-in kernel folding ``n`` elements into ``parts`` partials
    (arguments: x, partial, has, n, parts; launched over ``parts`` work items)."""
    if op not in BUILTIN_OPS:
        raise InputError(f"reduce={op!r}: with a kernel use 'sum', 'min' or 'max'")
    if element.name not in _C_TYPES:
        raise InputError(f"cannot reduce elements of dtype {element} on the device")
    acc = partial_dtype(element, op)
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
    name = f"conveyor_reduce_{op}_{element.name}"
    body = f"""
    {{
        {t_acc} acc = ({t_acc})0;
        int first = 1;
        for (unsigned long long j = i; j < n; j += parts) {{
            {t_acc} v = ({t_acc})x[j];
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
        head = (
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


def combiner(op: str | Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """The host function that folds two partials for ``op``."""
    if callable(op):
        return op
    if op == "sum":
        return lambda a, b: a + b
    if op == "min":
        return lambda a, b: np.minimum(a, b)
    if op == "max":
        return lambda a, b: np.maximum(a, b)
    raise InputError(f"reduce={op!r}: use 'sum', 'min', 'max' or a function f(a, b)")


def combine(
    op: str | Callable[[Any, Any], Any], partials: list[Any], element: np.dtype | None = None,
    *, kernel: bool = False,
) -> Any:
    """Fold the blocks' partials, in block order. With none: ``sum`` gives
    :func:`empty_sum` of ``element`` (0, as NumPy does), a function gives None."""
    present = [p for p in partials if p is not None]
    if not present:
        return empty_sum(element, kernel=kernel) if op == "sum" else None
    return functools.reduce(combiner(op), present)


def empty_sum(element: np.dtype | None, *, kernel: bool) -> Any:
    """The sum of no elements: 0 in the type a non-empty sum would have (with a kernel:
    float64 for floats, 64-bit for integers; with a callable: the input's dtype, as
    ``np.sum`` of an empty array gives), or int 0 when the type is unknown."""
    if element is None:
        return 0
    if kernel:
        dtype = np.dtype(np.float64) if element.kind == "f" else partial_dtype(element, "sum")
        return dtype.type(0)
    return np.zeros(0, element).sum()


def check_not_empty(op: object, elements: int) -> None:
    """Raise InputError for ``min``/``max`` over no elements (NumPy raises too: the extreme of
    nothing is undefined), before any work."""
    if elements == 0 and op in ("min", "max"):
        raise InputError(
            f"reduce={op!r} over an empty input (0 elements): the {op}imum of nothing is "
            f"undefined (np.{op} raises too); check the input's length first, or use "
            f"reduce='sum' (0 for no elements)"
        )
