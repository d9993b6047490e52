"""Structured NumPy records against the C struct a kernel reads them as.

NumPy packs a structured dtype's fields unless ``align=True``; C pads a struct's members to
their alignment. Records of ``[('a', 'u1'), ('b', 'f4')]`` are 5 bytes, ``struct { uchar a;
float b; }`` is 8: the kernel then reads every record but the first from the wrong bytes,
with no error (OpenCL reports no pointee sizes). :func:`check_struct` compares the two where
the struct can be read from the kernel's source: its definition there, with members of plain
scalar types (arrays of them too). Anything else (a struct from a header or a macro, nested
structs, bit fields, a source that mentions ``pack``) is not judged, so a layout the kernel
really uses is never refused.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

import numpy as np

from conveyor.errors import InputError

#: Scalar C types of OpenCL C and CUDA C (LP64) whose size is also their alignment.
C_SIZES = {
    "char": 1, "uchar": 1, "signed char": 1, "unsigned char": 1, "int8_t": 1, "uint8_t": 1,
    "bool": 1, "short": 2, "ushort": 2, "unsigned short": 2, "int16_t": 2, "uint16_t": 2,
    "half": 2, "__half": 2, "int": 4, "uint": 4, "unsigned int": 4, "unsigned": 4,
    "int32_t": 4, "uint32_t": 4, "float": 4, "long": 8, "ulong": 8, "unsigned long": 8,
    "long long": 8, "unsigned long long": 8, "int64_t": 8, "uint64_t": 8, "double": 8,
    "size_t": 8,
}

#: NumPy's type of each scalar C type of C_SIZES, for the dtype a message advises.
C_DTYPES = {
    "char": "i1", "signed char": "i1", "int8_t": "i1", "uchar": "u1", "unsigned char": "u1",
    "uint8_t": "u1", "bool": "?", "short": "<i2", "int16_t": "<i2", "ushort": "<u2",
    "unsigned short": "<u2", "uint16_t": "<u2", "half": "<f2", "__half": "<f2", "int": "<i4",
    "int32_t": "<i4", "uint": "<u4", "unsigned int": "<u4", "unsigned": "<u4",
    "uint32_t": "<u4", "float": "<f4", "long": "<i8", "long long": "<i8", "int64_t": "<i8",
    "ulong": "<u8", "unsigned long": "<u8", "unsigned long long": "<u8", "uint64_t": "<u8",
    "double": "<f8", "size_t": "<u8",
}

_MEMBER = re.compile(r"((?:(?:unsigned|signed)\s+)?(?:long\s+long|\w+))\s+(.+)", re.S)
_DECLARATOR = re.compile(r"\s*(\w+)\s*((?:\[\s*\d+\s*\]\s*)*)")


def packs(source: str) -> bool:
    """True when ``source`` (its code: see :func:`struct_source`) packs a struct, with
    ``__attribute__((packed))`` or ``#pragma pack``: the word in a comment did not count."""
    return bool(re.search(r"__attribute__\s*\(\(\s*(?:__)?packed(?:__)?\b|"
                          r"#\s*pragma\s+pack\b", source))


def struct_source(kernel: Any) -> str | None:
    """The code of ``kernel``'s source as its compiler reads it, where struct definitions
    are read from: preprocessed with the device's macros and the kernel's options (the
    branch of an ``#ifdef`` the compiler takes), comments and string literals blanked (a
    commented-out old definition decided the layout). None without a source."""
    source = getattr(kernel, "source", None)
    if source is None:
        return None
    from conveyor.kernels.build import expanded_source
    from conveyor.kernels.signature import code_only

    options = getattr(kernel, "options", None) or ()
    return code_only(expanded_source(kernel.device, source, options))


def _members(source: str, type_name: str
             ) -> tuple[str, list[tuple[str, str, tuple[int, ...]]]] | None:
    """(name, members) of the struct ``type_name`` from its definition in ``source``
    (``struct name { ... }`` or ``typedef struct { ... } name;``): each member as (field
    name, C scalar type, array dimensions); None where that cannot be read exactly."""
    name = re.sub(r"^struct\s+", "", type_name.strip())
    if not re.fullmatch(r"\w+", name):
        return None
    body = None
    # possessive runs: "typedef struct", 400,000 spaces and a tag tried every split of the
    # spaces between two \s* (17 s for 100 KB)
    tagged = rf"\bstruct\s++{name}\s*+\{{([^{{}}]*+)\}}"
    typedef = rf"\btypedef\s++struct\b\s*+(?:\w++\s*+)?\{{([^{{}}]*+)\}}\s*+{name}\s*+;"
    # a typedef's name and a struct tag are apart in C: "rec" is the typedef where one is
    # defined, "struct rec" the tag (struct rec {...} beside typedef struct {...} rec)
    for pattern in ((tagged, typedef) if type_name.strip().startswith("struct")
                    else (typedef, tagged)):
        found = re.search(pattern, source)
        if found:
            body = found.group(1)
            break
    if body is None or ":" in body or "(" in body:  # bit fields, attributes: not judged
        return None
    members = []
    aliases: dict[str, str] | None = None
    for member in filter(None, (m.strip() for m in body.split(";"))):
        words = [w for w in member.split() if w not in ("const", "volatile")]
        matched = _MEMBER.fullmatch(" ".join(words))
        if matched is None:
            return None
        ctype, rest = _member_type(words)
        if ctype is not None and ctype not in C_SIZES:  # a typedef's name (count_t c)
            if aliases is None:
                from conveyor.kernels.typedefs import declared

                aliases = declared(source)
            # a typedef with an attribute or an alignment (aligned(16)): its words do not
            # give its layout, and the struct is not judged
            ctype = None if ctype in _attributed_names(source) else _resolved(ctype, aliases)
        if ctype is None or ctype not in C_SIZES:
            return None
        for declarator in rest.split(","):
            parts = _DECLARATOR.fullmatch(declarator)
            if parts is None:
                return None
            dims = tuple(int(n) for n in re.findall(r"\d+", parts.group(2)))
            members.append((parts.group(1), ctype, dims))
    return (name, members) if members else None


#: The words of C's integer and floating types, in any order (``long unsigned int``).
_TYPE_WORDS = frozenset({"signed", "unsigned", "char", "short", "int", "long", "float",
                         "double", "half", "bool"})


def _member_type(words: list[str]) -> tuple[str | None, str]:
    """A member's type as a key of C_SIZES (``long int``: ``long``; ``unsigned``: ``unsigned
    int``), or its one word where it is no C type word (a typedef's name), and the text of
    its declarators; None where the words name no type conveyor reads (``long double``)."""
    count = 0
    while count < len(words) - 1 and words[count] in _TYPE_WORDS:
        count += 1
    if count == 0:
        return words[0], " ".join(words[1:])
    return _c_type(words[:count]), " ".join(words[count:])


def _c_type(words: list[str]) -> str | None:
    """The C_SIZES key that C's type words ``words`` name, in whatever order; None where they
    name none (``long double``, ``unsigned float``)."""
    unsigned, signed = "unsigned" in words, "signed" in words
    base = sorted(w for w in words if w not in ("signed", "unsigned"))
    if unsigned and signed:
        return None
    if base == ["char"]:
        return "unsigned char" if unsigned else "signed char" if signed else "char"
    for key, name in ((["int", "short"], "short"), (["short"], "short"),
                      (["int", "long", "long"], "long long"), (["long", "long"], "long long"),
                      (["int", "long"], "long"), (["long"], "long"), (["int"], "int"), ([], "int")):
        if base == key:
            return f"unsigned {name}" if unsigned else name
    if len(base) == 1 and not (signed or unsigned):
        return base[0]  # float, double, half, bool
    return None


@functools.lru_cache(maxsize=4)
def _attributed_names(source: str) -> frozenset[str]:
    """The names that ``source``'s typedefs with an attribute or an alignment declare (as
    declarators, before ";" or ",": a typedef of real4 from real leaves real out), read once
    per source (per member, each read the whole source)."""
    from conveyor.kernels.typedefs import without_attributes

    found: set[str] = set()
    for match in re.finditer(r"\btypedef\b([^;{}]*+)(;?)", source):
        text = match.group(0)
        if match.group(2) and re.search(r"__attribute__|\b_?[Aa]lignas\b|__declspec|__align__",
                                        text):
            found.update(re.findall(r"(\w+)\s*(?:\[[^\]]*\]\s*)*[;,]", without_attributes(text)))
    return frozenset(found)


def _resolved(name: str, aliases: dict[str, str]) -> str | None:
    """A typedef's name as the C_SIZES key it stands for (through typedefs of typedefs);
    None where it stands for none (a struct, a pointer, a vector)."""
    for _ in range(16):
        target = aliases.get(name)
        if target is None:
            return name if name in C_SIZES else None
        words = [w for w in target.split() if w not in ("const", "volatile")]
        if not words or any(not w.isidentifier() for w in words):
            return None
        found = (_c_type(words) if all(w in _TYPE_WORDS for w in words) else
                 words[0] if len(words) == 1 else None)
        if found is None:
            return None
        name = found
    return None


def c_layout(source: str, type_name: str
             ) -> tuple[str, int, list[int], list[int]] | None:
    """(name, size, member offsets, member sizes) of the struct ``type_name`` as C lays it
    out, from its definition in ``source`` (``struct name { ... }`` or ``typedef struct { ...
    } name;``); None where that cannot be read exactly."""
    found = _members(source, type_name)
    if found is None:
        return None
    name, members = found
    offset, largest, offsets, sizes = 0, 1, [], []
    for _, ctype, dims in members:
        size = C_SIZES[ctype]
        count = math.prod(dims)
        offset = -(-offset // size) * size
        offsets.append(offset)
        sizes.append(size * count)
        offset += size * count
        largest = max(largest, size)
    return name, -(-offset // largest) * largest, offsets, sizes


def c_dtype(source: str, type_name: str) -> np.dtype | None:
    """The structured dtype of the struct ``type_name`` as ``source`` defines it, its fields
    named as the members and padded as C pads them (``align=True``; NumPy's packed layout
    where the source mentions ``pack``); None where :func:`c_layout` cannot read it."""
    found = _members(source, type_name)
    if found is None:
        return None
    fields = [(field, C_DTYPES[ctype], dims) if dims else (field, C_DTYPES[ctype])
              for field, ctype, dims in found[1]]
    try:
        return np.dtype(fields, align=not packs(source))
    except (TypeError, ValueError):  # a member named twice: the kernel would not build
        return None


def spell(dtype: np.dtype) -> str:
    """``dtype`` (structured) as the ``np.dtype(...)`` call that makes it, for messages."""
    described: Any = dtype.fields or {}
    fields: list[tuple[Any, ...]] = []
    for field in dtype.names or ():
        ftype = described[field][0]
        if ftype.subdtype is not None:
            fields.append((field, ftype.subdtype[0].str.lstrip("|"), ftype.subdtype[1]))
        else:
            fields.append((field, ftype.str.lstrip("|")))
    return f"np.dtype({fields}{', align=True' if dtype.isalignedstruct else ''})"


def _member_misfit(name: str, fields: list[tuple[str, np.dtype, int]], source: str,
                   type_name: str, offsets: list[int], sizes: list[int]) -> str | None:
    """What, beside the offsets and the size, keeps records of ``fields`` (name, dtype,
    offset) from being read as the struct's members, or None: a member no field covers (a
    view of some fields keeps the stride but not the others: the kernel read the hidden or
    stale bytes), a field named as another member than the one at its bytes, or a numeric
    field of another kind or size than its member (a float32 for an int: its bits)."""
    found = _members(source, type_name)
    if found is None:
        return None
    members = found[1]
    covered = sorted((at, at + ftype.itemsize) for _, ftype, at in fields)
    for (member, _, _), at, size in zip(members, offsets, sizes, strict=True):
        reach = at
        for lo, hi in covered:
            if lo <= reach < hi:
                reach = hi
        if reach < at + size:
            return (f"no field covers member {member!r} (bytes {at} to {at + size - 1}), so "
                    f"the kernel would read bytes the records do not hold")
    if len(fields) != len(members):
        return None
    names = {member: number for number, (member, _, _) in enumerate(members)}
    for number, ((field, ftype, _), (member, ctype, dims)) in enumerate(
            zip(fields, members, strict=True)):
        other = names.get(field)
        if other is not None and other != number:
            return (f"field {field!r} lies where C puts member {member!r}, and member "
                    f"{field!r} is elsewhere in struct {name!r}")
        base = ftype.subdtype[0] if ftype.subdtype is not None else ftype
        want = np.dtype(C_DTYPES[ctype])
        count = math.prod(ftype.subdtype[1]) if ftype.subdtype is not None else 1
        if base.kind in "biuf" and (base.kind != want.kind or base.itemsize != want.itemsize
                                    or count != math.prod(dims)):
            return (f"field {field!r} holds {ftype} where member {member!r} of struct "
                    f"{name!r} is {ctype}{''.join(f'[{d}]' for d in dims)}, so the kernel "
                    f"would read its bytes as another type")
    return None


def check_fields(where: str, dtype: np.dtype, source: str | None, type_name: str) -> None:
    """InputError when ``dtype`` has no fields but ``where`` (a kernel parameter) points to
    the struct ``type_name`` that ``source`` defines: the kernel would read the array's
    elements as the bytes of records. Not judged where the source is unknown or does not
    define the struct so that :func:`c_layout` reads it (a header, a macro)."""
    if dtype.names or source is None:
        return
    layout = c_layout(source, type_name)
    wanted = c_dtype(source, type_name)
    if layout is None or wanted is None:
        return
    name, size = layout[0], wanted.itemsize
    if packs(source):  # #pragma pack(2), a packed struct: conveyor does not lay them out
        raise InputError(
            f"{where} points to struct {name!r}, but the array holds {dtype}, which has no "
            f"fields, so the kernel would read its bytes as records: pass a structured array "
            f"laid out as the compiler lays out the struct (the source packs structs, which "
            f"conveyor does not lay out), with the fields filled in")
    raise InputError(
        f"{where} points to struct {name!r} of {size} bytes, but the array holds {dtype}, "
        f"which has no fields, so the kernel would read its bytes as records: pass a "
        f"structured array of the struct's members, e.g. np.zeros(n, {spell(wanted)}), with "
        f"the fields filled in (or a.view() of that dtype, for an array of the records' raw "
        f"bytes)")


def check_struct(where: str, dtype: np.dtype, source: str | None, type_name: str = "",
                 output: bool = False) -> None:
    """InputError when structured ``dtype``, for a pointer to struct ``type_name`` (``where``
    names the parameter), is not laid out as C lays out that struct in ``source``: other
    record size, or, with as many fields as members, a field at another offset. Not judged
    (no error) where :func:`c_layout` cannot read the struct, the source is unknown (None),
    or it mentions ``pack`` (``__attribute__((packed))``, ``#pragma pack``). ``output``: the
    records are a stream's output (the kernel writes them; asked for by dtype, not
    converted)."""
    if not dtype.names or source is None or packs(source):
        return
    layout = c_layout(source, type_name)
    if layout is None:
        return
    name, size, offsets, sizes = layout
    described: Any = dtype.fields or {}
    fields = [(field, described[field][0], described[field][1]) for field in dtype.names]
    misfit = None
    if len(fields) == len(offsets):
        for number, ((field, ftype, at), want) in enumerate(zip(fields, offsets, strict=True)):
            if at != want:
                misfit = (f"field {field!r} ({ftype}) lies at byte {at}, where C puts member "
                          f"{number + 1} of struct {name!r} at byte {want}")
                break
    if misfit is None and size != dtype.itemsize:
        misfit = f"C lays out struct {name!r} in {size} bytes"
    if misfit is None:
        members = _member_misfit(name, fields, source, type_name, offsets, sizes)
        wanted = c_dtype(source, type_name)
        if members is None or wanted is None:
            return
        verb = "ask for" if output else "pass"
        raise InputError(f"{where} has structured dtype {dtype}, but {members}: {verb} "
                         f"records of the struct's own dtype, {spell(wanted)}, with each "
                         f"field filled by its name")
    aligned = np.dtype([(field, ftype) for field, ftype, _ in fields], align=True)
    placed: Any = aligned.fields or {}
    same_members = [ftype.itemsize for _, ftype, _ in fields] == sizes
    if same_members and aligned.itemsize == size and \
            [placed[field][1] for field, _, _ in fields] == offsets:
        plain = all(not ftype.names and ftype.subdtype is None for _, ftype, _ in fields)
        listed = ([(field, ftype.str) for field, ftype, _ in fields] if plain
                  else "<the same fields>")
        padded = f"np.dtype({listed}, align=True)"
        fix = (f"ask for {padded} as the output's dtype (outputs=[dt], cv.per_block(1, dt) "
               f"or np.empty(shape, dt)), which pads the fields as C does" if output else
               f"pass a.astype({padded}), which pads the fields as C does")
    else:
        fix = (f"give the dtype the struct's members in order (byte sizes {sizes} at offsets "
               f"{offsets}, {size} bytes in all; np.dtype(..., align=True) pads as C does)")
    raise InputError(
        f"{where} has structured dtype {dtype} of {dtype.itemsize} bytes, but {misfit}, so "
        f"the kernel would {'write' if output else 'read'} each record "
        f"{'to' if output else 'from'} the wrong bytes: {fix} (or declare the "
        f"struct __attribute__((packed)) if the kernel means NumPy's layout)")
