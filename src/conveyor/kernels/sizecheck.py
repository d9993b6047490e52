"""The compiler confirms the sizes conveyor read for a kernel's typedef and macro types.

conveyor reads parameter types from the source preprocessed with the device's macros that it
knows (``Device.source_macros``); the compiler predefines more (``__clang__``, ``__x86_64__``,
``FLT_MAX``, ...). A type chosen by one of those (``#ifdef __clang__ typedef double real;
#else typedef float real; #endif``) was read as the other branch's: a float32 array passed
for ``real*`` (8 bytes to the compiler), wrong values, and a kernel writing past its output
(round fourteen). No list of macros is complete, so every build asks the compiler itself: for
each parameter whose type is a name the source defines (a typedef or a macro), the source is
built with a line ``typedef char __conveyor_sizeof_check_N[(sizeof(T) == n) ? 1 : -1];``
appended, ``n`` the bytes conveyor read (for a scalar typedef, on clang, also that ``T`` is
the C type conveyor read: ``typedef int word`` chosen by ``__clang__``, read as float, is 4
bytes too). A mismatch fails that line's array size, and
:func:`build` says which parameter conveyor could not read. A check the compiler cannot
evaluate (a macro that is no type on its own) is dropped: the source is built without it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from conveyor.errors import CompileError, InputError
from conveyor.kernels.signature import code_only, kernel_names, parse_params, resolve, typedefs

if TYPE_CHECKING:
    from conveyor.backends.base import Device

NAME = "__conveyor_sizeof_check_"
# How the compilers word an array of negative size: clang (PoCL, NVIDIA's OpenCL) and EDG
# (NVRTC).
_NEGATIVE = ("negative size", "negative", "greater than zero")

# (kernel.parameter, the type as written, bytes conveyor read, the C names of the scalar type
# conveyor read, or () for a vector or struct)
Check = tuple[str, str, int, tuple[str, ...]]

#: The OpenCL C types a parameter conveyor read as each NumPy scalar type may have: the type
#: itself (``char`` and ``signed char`` are two types of one sign: a typedef of either is
#: int8), the sign too (a typedef of int chosen by ``__clang__`` over uint, read as uint32,
#: made 3e9 into -1294967296) ...
_C_TYPES = {
    "int8": ("char", "signed char"), "uint8": ("uchar",), "int16": ("short",),
    "uint16": ("ushort",), "int32": ("int",), "uint32": ("uint",), "int64": ("long",),
    "uint64": ("ulong",), "float16": ("half",), "float32": ("float",), "float64": ("double",),
    "bool": ("bool",),
}  # fmt: skip
#: ... but an enum, which conveyor reads as int, either sign: it is compatible with its
#: underlying type only, which clang makes unsigned for non-negative values.
_ENUM_C_TYPES = {
    "int8": ("char", "signed char", "uchar"), "uint8": ("uchar", "char", "signed char"),
    "int16": ("short", "ushort"), "uint16": ("ushort", "short"), "int32": ("int", "uint"),
    "uint32": ("uint", "int"), "int64": ("long", "ulong"), "uint64": ("ulong", "long"),
    "float16": ("half",), "float32": ("float",), "float64": ("double",), "bool": ("bool",),
}  # fmt: skip

#: Before the checks: whether two types are one. Clang has a builtin for it; other compilers
#: (NVRTC, which sees no such types) take every type as the one conveyor read.
_SAME = ("\n#ifdef __clang__\n#define __conveyor_same(T, U) __builtin_types_compatible_p(T, U)"
         "\n#else\n#define __conveyor_same(T, U) 1\n#endif")
_SAME_LINES = _SAME.count("\n")


def checks(source: str, expanded: str) -> list[Check]:
    """What to confirm for every kernel of ``source``: each parameter whose type, as written
    in ``source``, is no built-in type, with the bytes of one element as conveyor read it
    from ``expanded`` (the source after its preprocessing)."""
    from conveyor.pipeline.structs import c_layout, packs

    found: list[Check] = []
    seen: set[tuple[str, int]] = set()
    code = code_only(expanded)
    layouts = not packs(code)  # packed structs: conveyor does not lay them out (structs.py)
    # Names the source typedefs are checked even where they are built in elsewhere
    # (``typedef short int32_t;``), as are enums (``enum e : uchar`` is 1 byte, an enum of
    # 2**32 is 8): conveyor reads every enum as int.
    defined = typedefs(code)

    def built_in(name: str) -> bool:
        return resolve(name)[0] is not None and name not in defined and \
            not name.startswith("enum ")

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
            name = ours.base if built_in(raw.base) else raw.base
            if not name or built_in(name):
                continue  # a built-in type: the same for conveyor and the compiler
            if "long long" in f"{ours.base} {ours.spelled}":
                continue  # refused with its own message (128 bits in OpenCL C: argtypes.py)
            names: tuple[str, ...] = ()
            if ours.dtype is not None:
                size = ours.dtype.itemsize * ours.width
                # A scalar named by a typedef: its kind too (a typedef int read as float).
                # Not a macro's type: the driver names the type it expands to, and conveyor
                # takes the driver's reading (argtypes.py), right whatever it read here.
                if ours.width == 1 and re.search(rf"\b{re.escape(name)}\b", code):
                    enum = name.startswith("enum") or ours.spelled.startswith("enum")
                    names = (_ENUM_C_TYPES if enum else _C_TYPES).get(str(ours.dtype), ())
            else:  # a struct: the size of the layout records are checked against
                layout = c_layout(code, ours.struct_name) if layouts else None
                if layout is None:
                    continue  # an opaque type (image2d_t, sampler_t), or one not read
                size = layout[1]
                # sizeof(rec) of a struct known only by its tag is no type: the compiler
                # could not evaluate the check, and the build went on without it
                name = raw.struct_name
            if (name, size) not in seen:
                seen.add((name, size))
                found.append((f"{kernel}.{ours.name or '(unnamed)'}", name, size, names))
    return found


def lines(found: Sequence[Check]) -> str:
    """The text appended to the source for ``found`` (empty for none): one line a check, after
    the ``__conveyor_same`` macro. A scalar's line asks for its size and its type (a typedef
    of int that conveyor read as float is 4 bytes either way)."""
    if not found:
        return ""

    def same(text: str, names: tuple[str, ...]) -> str:
        if not names:
            return ""
        # & and |, not && and ||: the operands are 0 or 1, and clang warns of a logical
        # operator with a constant operand ("Non-empty compiler output" for every build).
        return " & (" + " | ".join(f"__conveyor_same({text}, {n})" for n in names) + ")"

    # After a blank line: a source ending in a backslash would join the first check to it.
    return "\n" + _SAME + "".join(
        f"\ntypedef char {NAME}{i}[((sizeof({text}) == {size}){same(text, names)}) ? 1 : -1];"
        for i, (_, text, size, names) in enumerate(found)) + "\n"


def _long_long_member(struct: Any) -> str | None:
    """The name of the first ``long long`` member of ``struct`` (a clayout.CType, nested
    structs walked), or None."""
    for member in struct.members:
        if member.ctype.scalar in ("long long", "unsigned long long"):
            return str(member.field)
        inner = _long_long_member(member.ctype) if member.ctype.members else None
        if inner is not None:
            return f"{member.field}.{inner}"
    return None


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
    first = (source + "\n\n").count("\n") + 1 + _SAME_LINES  # the line of check 0
    for index, line in _failed(log, first, len(found)):
        if any(word in line for word in _NEGATIVE):
            where, text, size, names = found[index]
            kind, other = (f" ({names[0]})", " or type") if names else ("", "")
            if text.startswith("enum "):
                raise InputError(
                    f"kernel parameter {where}: conveyor reads {text} as a C int (4 bytes), "
                    f"but the compiler makes it another size or type (a value past int's "
                    f"range, or a fixed type conveyor did not read): declare the parameter "
                    f"with a built-in type of the enum's size (int, long, uchar...)")
            from conveyor.pipeline.clayout import struct_type

            struct = struct_type(code_only(expanded), text) if not names else None
            wide = _long_long_member(struct) if struct is not None else None
            if wide is not None:
                raise InputError(
                    f"kernel parameter {where}: {text} has member {wide!r} of type long long, "
                    f"which OpenCL C reserves for 128-bit integers (this compiler makes it "
                    f"other than the 64 bits conveyor lays out): declare the member long "
                    f"(64 bits; NumPy's int64)")
            if struct is not None:
                raise InputError(
                    f"kernel parameter {where}: conveyor laid out {text} from its definition "
                    f"in {size} bytes, but the compiler's sizeof({text}) differs: a macro the "
                    f"compiler predefines (such as __clang__) chooses its members, or the "
                    f"source lays it out in a way conveyor does not read, so conveyor would "
                    f"pass records of the wrong size; choose the members with -D options, "
                    f"or declare the struct __attribute__((packed)) with explicit padding "
                    f"members")
            raise InputError(
                f"kernel parameter {where}: conveyor read its type {text} as {size} bytes"
                f"{kind}, but the compiler's sizeof({text}){other} differs: the source "
                f"chooses that type "
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
