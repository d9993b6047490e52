"""The compiler confirms the sizes conveyor read for a kernel's typedef and macro types.

conveyor reads parameter types from the source preprocessed with the device's macros that it
knows (``Device.source_macros``); the compiler predefines more (``__clang__``, ``__x86_64__``,
``FLT_MAX``, ...). A type chosen by one of those (``#ifdef __clang__ typedef double real;
#else typedef float real; #endif``) was read as the other branch's: a float32 array passed
for ``real*`` (8 bytes to the compiler), wrong values, and a kernel writing past its output
(round fourteen). No list of macros is complete, so every build asks the compiler itself: for
each parameter whose type is a name the source defines (a typedef or a macro), the source is
built with a line ``typedef char __conveyor_sizeof_check_N[(sizeof(T) == n) ? 1 : -1];``
appended, ``n`` the bytes conveyor read. A mismatch fails that line's array size, and
:func:`build` says which parameter conveyor could not read. A check the compiler cannot
evaluate (a macro that is no type on its own) is dropped: the source is built without it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from conveyor.errors import CompileError, InputError
from conveyor.kernels.signature import code_only, kernel_names, parse_params, resolve

if TYPE_CHECKING:
    from conveyor.backends.base import Device

NAME = "__conveyor_sizeof_check_"
# How the compilers word an array of negative size: clang (PoCL, NVIDIA's OpenCL) and EDG
# (NVRTC).
_NEGATIVE = ("negative size", "negative", "greater than zero")

Check = tuple[str, str, int]  # (kernel.parameter, the type as written, bytes conveyor read)


def checks(source: str, expanded: str) -> list[Check]:
    """What to confirm for every kernel of ``source``: each parameter whose type, as written
    in ``source``, is no built-in type, with the bytes of one element as conveyor read it
    from ``expanded`` (the source after its preprocessing)."""
    from conveyor.pipeline.structs import c_layout, packs

    found: list[Check] = []
    seen: set[tuple[str, int]] = set()
    code = code_only(expanded)
    layouts = not packs(code)  # packed structs: conveyor does not lay them out (structs.py)
    for kernel in dict.fromkeys(kernel_names(expanded)):
        try:
            read = parse_params(expanded, kernel)
        except InputError:
            continue
        try:
            written: list[Any] | None = list(parse_params(source, kernel))
        except InputError:
            written = None  # its head comes from a macro (#define KERNEL __kernel)
        if written is None or len(written) != len(read):
            written = list(read)  # nothing to line up: the types as conveyor read them
        for raw, ours in zip(written, read, strict=True):
            if raw.is_pointer != ours.is_pointer or not raw.base:
                raw = ours  # the * or the type comes from a macro: conveyor's reading
            name = raw.base if resolve(raw.base)[0] is None else ours.base
            if not name or resolve(name)[0] is not None:
                continue  # a built-in type: the same for conveyor and the compiler
            if "long long" in f"{ours.base} {ours.spelled}":
                continue  # refused with its own message (128 bits in OpenCL C: argtypes.py)
            if ours.dtype is not None:
                size = ours.dtype.itemsize * ours.width
            else:  # a struct: the size of the layout records are checked against
                layout = c_layout(code, ours.base) if layouts else None
                if layout is None:
                    continue  # an opaque type (image2d_t, sampler_t), or one not read
                size = layout[1]
            if (name, size) not in seen:
                seen.add((name, size))
                found.append((f"{kernel}.{ours.name or '(unnamed)'}", name, size))
    return found


def lines(found: Sequence[Check]) -> str:
    """The text appended to the source for ``found`` (empty for none)."""
    # After a blank line: a source ending in a backslash would join the first check to it.
    return "\n" + "".join(f"\ntypedef char {NAME}{i}[(sizeof({text}) == {size}) ? 1 : -1];"
                          for i, (_, text, size) in enumerate(found)) + "\n" if found else ""


def build(device: Device, source: str, expanded: str, options: Sequence[str]) -> bytes:
    """``device.build_binary`` of ``source``, with the compiler confirming the sizes conveyor
    read (see the module docstring); InputError naming the parameter when it does not."""
    found = checks(source, expanded)
    if not found:
        return device.build_binary(source, options)
    try:
        return device.build_binary(source + lines(found), options)
    except CompileError as exc:
        log = f"{exc.message}\n{exc.log}"
    # The source alone: its own error, if it has one, is the one to raise.
    binary = device.build_binary(source, options)
    first = (source + "\n\n").count("\n") + 1  # the line of check 0
    for index, line in _failed(log, first, len(found)):
        if any(word in line for word in _NEGATIVE):
            where, text, size = found[index]
            raise InputError(
                f"kernel parameter {where}: conveyor read its type {text} as {size} bytes, "
                f"but the compiler's sizeof({text}) differs: the source chooses that type "
                f"with a macro the compiler predefines and conveyor's preprocessor does not "
                f"know (such as __clang__), so conveyor would pass the wrong data; declare "
                f"the parameter with a built-in type (float*, double*), or choose the type "
                f"with -D options")
    return binary  # checks the compiler could not evaluate (no type alone): built without


def _failed(log: str, first: int, count: int) -> list[tuple[int, str]]:
    """(check index, log line) for each line of ``log`` that names a check: by its line
    number (``file:23:48: error``, ``default_program(23): error``) or its name."""
    found = []
    for line in log.splitlines():
        numbers = {int(n) for n in re.findall(r"[:(](\d+)[:)]", line)}
        for index in range(count):
            if first + index in numbers or f"{NAME}{index}" in line:
                found.append((index, line))
    return found
