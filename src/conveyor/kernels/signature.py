"""Read a kernel's parameter list from its OpenCL C or CUDA C source.

conveyor needs the types to cast scalar arguments (``args=(2.5,)`` becomes the kernel's
``float``) and to check that arrays handed to a stream have the element type the kernel expects.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from conveyor.errors import InputError

_SCALARS: dict[str, str] = {
    "char": "int8", "signed char": "int8", "uchar": "uint8", "unsigned char": "uint8",
    "bool": "bool",
    "short": "int16", "ushort": "uint16", "unsigned short": "uint16",
    "int": "int32", "uint": "uint32", "unsigned int": "uint32", "unsigned": "uint32",
    "long": "int64", "ulong": "uint64", "unsigned long": "uint64",
    "long long": "int64", "unsigned long long": "uint64",
    "size_t": "uint64", "ptrdiff_t": "int64",
    "int8_t": "int8", "uint8_t": "uint8", "int16_t": "int16", "uint16_t": "uint16",
    "int32_t": "int32", "uint32_t": "uint32", "int64_t": "int64", "uint64_t": "uint64",
    "half": "float16", "__half": "float16", "float": "float32", "double": "float64",
}  # fmt: skip

_QUALIFIERS = {
    "const", "volatile", "restrict", "__restrict__", "__restrict", "__global", "global",
    "__constant", "constant", "__local", "local", "__private", "private", "__read_only",
    "__write_only", "read_only", "write_only", "struct",
}  # fmt: skip

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its name, whether it is a pointer, and its element/scalar dtype.

    ``dtype`` is None for types conveyor does not know (structs, vector types); such scalars
    must be passed as NumPy values of the right type.
    """

    name: str
    is_pointer: bool
    dtype: np.dtype | None
    is_const: bool
    type_text: str


def parse_params(source: str, name: str) -> tuple[Param, ...]:
    """The parameters of kernel ``name`` in ``source``; InputError if no such kernel."""
    text = _COMMENTS.sub(" ", source)
    pattern = re.compile(
        r"(?:__kernel|\bkernel|__global__)\s+(?:__attribute__\s*\(\(.*?\)\)\s*)?void\s+"
        + re.escape(name)
        + r"\s*\(",
    )
    match = pattern.search(text)
    if match is None:
        found = kernel_names(source)
        listing = ", ".join(found) if found else "none"
        raise InputError(f"no kernel named {name!r} in the source; kernels found: {listing}")
    depth = 1
    i = match.end()
    start = i
    while i < len(text) and depth:
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    body = text[start : i - 1].strip()
    if not body or body == "void":
        return ()
    return tuple(_parse_one(part) for part in body.split(","))


def kernel_names(source: str) -> list[str]:
    """Every kernel name defined in ``source``, in order."""
    text = _COMMENTS.sub(" ", source)
    pattern = r"(?:__kernel|\bkernel|__global__)\s+(?:__attribute__\s*\(\(.*?\)\)\s*)?void\s+(\w+)"
    return re.findall(pattern, text)


def _parse_one(text: str) -> Param:
    text = " ".join(text.replace("*", " * ").split())
    tokens = text.split(" ")
    is_pointer = "*" in tokens
    name = tokens[-1] if tokens[-1] != "*" else ""
    words = [t for t in tokens[:-1] if t != "*"]
    is_const = "const" in words
    base = " ".join(w for w in words if w not in _QUALIFIERS)
    dtype_name = _SCALARS.get(base)
    dtype = np.dtype(dtype_name) if dtype_name else None
    return Param(name=name, is_pointer=is_pointer, dtype=dtype, is_const=is_const, type_text=text)


def arg_converters(
    params: Sequence[Param], pointer: Callable[[Any], Any]
) -> list[Callable[[Any], Any]]:
    """One function per parameter turning a launch argument into what the driver takes:
    ``pointer`` for pointer parameters (the backend's buffer unwrapping), a cast to the declared
    type for known scalars, and the value as given otherwise (it must already be a NumPy
    scalar of the right type)."""
    converters: list[Callable[[Any], Any]] = []
    for param in params:
        if param.is_pointer:
            converters.append(pointer)
        elif param.dtype is not None:
            converters.append(param.dtype.type)
        else:
            converters.append(_as_given)
    return converters


def _as_given(value: Any) -> Any:
    return value
