"""Check a stream's arguments before anything is allocated; every problem is an InputError
that says what to change."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from conveyor.backends.base import Device, Kernel
from conveyor.errors import InputError
from conveyor.pipeline.plan import ArraySpec
from conveyor.pipeline.reduce import BUILTIN_OPS


def as_input(value: Any, index: int) -> np.ndarray:
    """Input ``index`` as an ndarray (memmaps stay memmaps); InputError if unusable."""
    if not isinstance(value, np.ndarray):
        try:
            value = np.asarray(value)
        except Exception as exc:
            raise InputError(
                f"input {index} ({type(value).__name__}) is not an array: pass a NumPy array"
            ) from exc
    if value.dtype.hasobject:
        raise InputError(
            f"input {index} has dtype {value.dtype}, which holds Python objects: "
            f"convert it to a numeric dtype first"
        )
    if value.ndim == 0:
        raise InputError(f"input {index} is a scalar: pass scalars in args=, arrays in inputs=")
    return value


def as_output(value: Any, index: int, rows: int, row_shape: tuple[int, ...]) -> np.ndarray:
    """Output ``index``: the caller's array (checked) or a new one for a dtype."""
    if not isinstance(value, np.ndarray):
        try:
            dtype = np.dtype(value)
        except TypeError as exc:
            raise InputError(
                f"output {index} must be a NumPy array or a dtype, got {type(value).__name__}"
            ) from exc
        if dtype.hasobject:
            raise InputError(f"output {index} asks for dtype {dtype}: use a numeric dtype")
        return np.empty((rows, *row_shape), dtype)
    if value.dtype.hasobject:
        raise InputError(f"output {index} has dtype {value.dtype}: use a numeric dtype")
    if value.ndim == 0:
        raise InputError(f"output {index} is a scalar: outputs must be arrays")
    if not value.flags.writeable:
        raise InputError(f"output {index} is read-only: pass a writable array")
    if not value.flags.c_contiguous:
        raise InputError(
            f"output {index} is not C-contiguous: pass np.empty(shape, dtype) and copy "
            f"into your view afterwards"
        )
    return value


def spec(array: Any) -> ArraySpec:
    """The ArraySpec of an array, or of anything with ``shape`` and ``dtype`` (a source or
    sink of pipeline/io.py)."""
    return ArraySpec(tuple(int(s) for s in array.shape), array.dtype)


def check_kernel(
    kernel: Kernel,
    device: Device,
    inputs: Sequence[Any],
    outputs: Sequence[Any],
    args: Sequence[Any],
    reduce: str | Callable[[Any, Any], Any] | None,
) -> np.dtype | None:
    """Check ``kernel`` against the stream's arrays; return the reduce element dtype, if any."""
    if kernel.device is not device:
        raise InputError(
            f"kernel {kernel.name!r} was built for {kernel.device.spec}, the stream runs on "
            f"{device.spec}: compile it with that device"
        )
    buffers = len(inputs) + len(outputs) + (1 if reduce is not None else 0)
    expected = buffers + len(args) + 2
    params = list(kernel.params)
    if len(params) != expected:
        what = "1 partial buffer, " if reduce is not None else f"{len(outputs)} outputs, "
        raise InputError(
            f"kernel {kernel.name!r} takes {len(params)} parameters; this stream passes "
            f"{expected}: {len(inputs)} inputs, {what}{len(args)} args, then offset and n"
        )
    arrays: list[tuple[str, np.dtype | None]] = [
        (f"input {i}", a.dtype) for i, a in enumerate(inputs)
    ]
    arrays += [(f"output {i}", a.dtype) for i, a in enumerate(outputs)]
    if reduce is not None:
        arrays.append(("the per-element reduce buffer", None))
    for param, (what, dtype) in zip(params, arrays, strict=False):
        if not param.is_pointer:
            raise InputError(
                f"kernel parameter {param.name!r} ({param.type_text}) receives {what}, so it "
                f"must be a pointer; the convention is buffers, then args, then offset, n"
            )
        if dtype is not None and param.dtype is not None and param.dtype != dtype:
            raise InputError(
                f"kernel parameter {param.name!r} is {param.type_text} but {what} has dtype "
                f"{dtype}: pass an array of {param.dtype} (e.g. a.astype(np.{param.dtype}))"
            )
    for param in params[buffers:]:
        if param.is_pointer:
            raise InputError(
                f"kernel parameter {param.name!r} is a pointer but receives a scalar from "
                f"args= or offset/n: list every buffer in inputs= or outputs="
            )
    for param, value in zip(params[buffers:], args, strict=False):
        if param.dtype is None:
            continue
        try:
            param.dtype.type(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InputError(
                f"args: {value!r} cannot be passed as kernel parameter {param.name!r} "
                f"({param.type_text}): pass a {param.dtype} value"
            ) from exc
    if reduce is None:
        return None
    if not isinstance(reduce, str) or reduce not in BUILTIN_OPS:
        raise InputError(
            f"reduce={reduce!r} with a kernel: use 'sum', 'min' or 'max'; for another "
            f"combine, pass a Python callable that returns each block's partial"
        )
    element = params[len(inputs)].dtype
    if element is None:
        raise InputError(
            f"cannot tell the element type of kernel parameter {params[len(inputs)].name!r}: "
            f"declare it as a pointer to a numeric type"
        )
    return element


def check_byte_order(inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
    """InputError for an input or output (anything with ``dtype`` and ``name``) whose dtype is
    not in the machine's byte order: a Python callable gets device arrays, which have none."""
    for kind, arrays in (("input", inputs), ("output", outputs)):
        for index, array in enumerate(arrays):
            dtype = array.dtype
            if dtype is not None and not dtype.isnative:
                raise InputError(
                    f"{kind} {index} ({array.name}) has dtype {dtype.str}, not in this "
                    f"machine's byte order, which a Python callable's device arrays need: "
                    f"pass a.astype(a.dtype.newbyteorder('='))"
                )
