"""How C lays out the structs a kernel source defines, read from the source itself.

A struct's members may be scalars (``int``, ``unsigned long``, a typedef of one), vectors
(OpenCL C's ``float4``, ``int3``, ``uchar16``; CUDA's ``float2``, ``int3``), structs the
source defines (nested, by tag or typedef name), and arrays of any of these. Each is placed
as the compiler places it: at the next multiple of its alignment, the struct's size rounded
up to its largest member's alignment. Anything else (bit fields, attributes, unions, a type
from a header or a macro, a vector whose layout differs between compiler versions) leaves the
struct unread (None), so a layout the kernel really uses is never refused: the build's size
check (kernels/sizecheck.py) then has no size to confirm either.

The vector rules differ by language: an OpenCL C ``float3`` is 16 bytes aligned to 16, a
CUDA ``float3`` 12 bytes aligned to 4. The language is read from the code (a CUDA kernel is
``__global__``, an OpenCL C kernel ``kernel``/``__kernel``); where neither or both show, only
the vectors both languages lay out alike are read.
"""

from __future__ import annotations

import functools
import math
import re
from typing import NamedTuple

import numpy as np

#: Scalar C types of OpenCL C and CUDA C (LP64) whose size is also their alignment.
C_SIZES = {
    "char": 1, "uchar": 1, "signed char": 1, "unsigned char": 1, "int8_t": 1, "uint8_t": 1,
    "bool": 1, "short": 2, "ushort": 2, "unsigned short": 2, "int16_t": 2, "uint16_t": 2,
    "half": 2, "__half": 2, "int": 4, "uint": 4, "unsigned int": 4, "unsigned": 4,
    "int32_t": 4, "uint32_t": 4, "float": 4, "long": 8, "ulong": 8, "unsigned long": 8,
    "long long": 8, "unsigned long long": 8, "int64_t": 8, "uint64_t": 8, "double": 8,
    "size_t": 8,
}  # fmt: skip

#: NumPy's type of each scalar C type of C_SIZES, for the dtype a message advises.
C_DTYPES = {
    "char": "i1", "signed char": "i1", "int8_t": "i1", "uchar": "u1", "unsigned char": "u1",
    "uint8_t": "u1", "bool": "?", "short": "<i2", "int16_t": "<i2", "ushort": "<u2",
    "unsigned short": "<u2", "uint16_t": "<u2", "half": "<f2", "__half": "<f2", "int": "<i4",
    "int32_t": "<i4", "uint": "<u4", "unsigned int": "<u4", "unsigned": "<u4",
    "uint32_t": "<u4", "float": "<f4", "long": "<i8", "long long": "<i8", "int64_t": "<i8",
    "ulong": "<u8", "unsigned long": "<u8", "unsigned long long": "<u8", "uint64_t": "<u8",
    "double": "<f8", "size_t": "<u8",
}  # fmt: skip

#: The element type of each vector name's stem, per language.
_OPENCL_LANES = (2, 3, 4, 8, 16)
_OPENCL_STEMS = ("char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "half",
                 "float", "double")
_CUDA_LANES = (1, 2, 3, 4)
_CUDA_STEMS = {"char": "char", "uchar": "uchar", "short": "short", "ushort": "ushort",
               "int": "int", "uint": "uint", "long": "long", "ulong": "ulong",
               "longlong": "long long", "ulonglong": "unsigned long long", "float": "float",
               "double": "double"}
_VECTOR = re.compile(r"([a-z]+?)(\d+)")

#: Nested structs read at most this deep (a struct cannot hold itself; a source that says
#: so is read no further).
_DEPTH = 8

#: The words of C's integer and floating types, in any order (``long unsigned int``).
_TYPE_WORDS = frozenset({"signed", "unsigned", "char", "short", "int", "long", "float",
                         "double", "half", "bool"})

_DECLARATOR = re.compile(r"\s*(\w+)\s*((?:\[\s*\d+\s*\]\s*)*)")


class Member(NamedTuple):
    """One member of a struct as C places it."""

    field: str  #: its name
    ctype: CType  #: its type (an array's element type)
    dims: tuple[int, ...]  #: an array's dimensions; () for one element
    offset: int  #: its first byte in the struct

    @property
    def extent(self) -> int:
        """The bytes from its offset to its last byte holding a value (a float3's padding
        lane and a nested struct's tail padding left out)."""
        count = math.prod(self.dims)
        return self.ctype.size * (count - 1) + self.ctype.data if count else 0


class CType(NamedTuple):
    """A member's type as C lays it out."""

    name: str  #: as C names it: ``int``, ``float4``, ``struct inner``, ``rec``
    size: int  #: its sizeof
    align: int  #: its alignment
    data: int  #: its bytes before any tail padding (12 of an OpenCL C float3's 16)
    scalar: str | None = None  #: the C_SIZES key of a scalar type
    element: str | None = None  #: a vector's element type, a C_SIZES key
    lanes: int = 1  #: a vector's lanes (3 for float3)
    members: tuple[Member, ...] = ()  #: a struct's members, in order
    height: int = 0  #: how many structs deep it nests (1: a struct of no structs)

    def dtype(self) -> np.dtype:
        """One element as a NumPy dtype laid out as C lays it out: a scalar's own type, a
        vector's lanes as a sub-array (a float3 as 3 floats), a struct's members at C's
        offsets, padded to its size."""
        if self.scalar is not None:
            return np.dtype(C_DTYPES[self.scalar])
        if self.element is not None:
            return np.dtype((C_DTYPES[self.element], (self.lanes,)))
        return np.dtype({
            "names": [m.field for m in self.members],
            "formats": [_array_dtype(m) for m in self.members],
            "offsets": [m.offset for m in self.members], "itemsize": self.size}, align=True)


def _array_dtype(member: Member) -> np.dtype:
    """``member`` with its dimensions as a NumPy sub-array dtype. A vector whose size holds
    padding lanes (an OpenCL C float3 in an array) takes all its lanes, so its elements stay
    ``size`` bytes apart."""
    ctype = member.ctype
    one = ctype.dtype()
    if not member.dims:
        return one
    if ctype.element is not None and one.itemsize != ctype.size:
        return np.dtype((C_DTYPES[ctype.element], (*member.dims, ctype.size //
                                                   C_SIZES[ctype.element])))
    if one.subdtype is not None:  # a vector's lanes: (2,) of (4,) floats is (2, 4) floats
        return np.dtype((one.subdtype[0], (*member.dims, *one.subdtype[1])))
    return np.dtype((one, member.dims))


def language(code: str) -> str | None:
    """``"cuda"`` or ``"opencl"`` as ``code``'s kernels show it, None where they show
    neither or both."""
    cuda = re.search(r"\b__global__\b", code) is not None
    opencl = re.search(r"\b(?:__)?kernel\b", code) is not None
    return None if cuda == opencl else "cuda" if cuda else "opencl"


def vector(name: str, lang: str | None) -> CType | None:
    """The vector type ``name`` as ``lang`` lays it out (None: as both languages lay it
    out, where they agree), or None where it is no vector of that language."""
    found = _VECTOR.fullmatch(name)
    if found is None:
        return None
    stem, lanes = found.group(1), int(found.group(2))
    layouts = []
    if lang in (None, "opencl") and stem in _OPENCL_STEMS and lanes in _OPENCL_LANES:
        element = C_SIZES[stem]
        size = element * (4 if lanes == 3 else lanes)
        layouts.append((stem, size, size, element * lanes))
    if lang in (None, "cuda") and stem in _CUDA_STEMS and lanes in _CUDA_LANES:
        key = _CUDA_STEMS[stem]
        element = C_SIZES[key]
        if lanes == 4 and element == 8:
            return None  # 16- or 32-byte aligned by CUDA's version (double4_16a, _32a)
        align = element * lanes if lanes in (2, 4) else element
        layouts.append((key, element * lanes, align, element * lanes))
    if not layouts or (lang is None and (len(layouts) < 2 or
                                         layouts[0][1:] != layouts[1][1:])):
        return None
    key, size, align, data = layouts[0]
    return CType(name, size, align, data, element=key, lanes=lanes)


class _Source(NamedTuple):
    """What one source's struct reading needs, read once: its file-scope struct definitions
    by tag and by typedef name (the first of each, as its members' text and the alignment
    an ``aligned(N)`` after its brace asks for; None for another attribute there), its
    typedefs, its attributed typedef names, the vector language, and the types read so
    far."""

    tagged: dict[str, tuple[str, int] | None]
    typedefs: dict[str, tuple[str, int] | None]
    aliases: dict[str, str]
    attributed: frozenset[str]
    lang: str | None
    read: dict[str, CType | None]


#: What makes a struct's layout other than its members': an attribute or an alignment
#: written after its closing brace (``} __attribute__((aligned(16)));``).
_ATTRIBUTE = re.compile(r"__attribute__|_?[Aa]lignas|__declspec|__align__")


@functools.lru_cache(maxsize=4)
def _source(code: str) -> _Source:
    """``code`` read for its structs (per source, not per member: each read scans all of
    it). Only definitions at file scope count: a function's own ``struct rec`` is not the
    one a kernel parameter names."""
    import bisect

    from conveyor.kernels.typedefs import _depths, declared, without_attributes

    depths = _depths(code)

    def at_file_scope(position: int) -> bool:
        before = bisect.bisect_left(depths, (position, -1))
        return not before or depths[before - 1][1] == 0

    tagged: dict[str, tuple[str, int] | None] = {}
    typedefs: dict[str, tuple[str, int] | None] = {}
    # possessive runs: "typedef struct", 400,000 spaces and a tag tried every split of the
    # spaces between two \s* (17 s for 100 KB)
    for found in re.finditer(r"\bstruct\s++(\w++)\s*+\{([^{}]*+)\}([^;{}]*+)", code):
        if at_file_scope(found.start()):
            aligned = _aligned(found.group(3))
            tagged.setdefault(found.group(1), None if aligned is None
                              else (found.group(2), aligned))
    for found in re.finditer(r"\btypedef\s++struct\b\s*+(?:\w++\s*+)?\{([^{}]*+)\}"
                             r"([^;{}]*+);", code):
        if not at_file_scope(found.start()):
            continue
        after = found.group(2)
        aligned = _aligned(after)
        for declarator in without_attributes(after).split(","):
            name = re.fullmatch(r"\s*(\w+)\s*", declarator)  # not *ptr_t, not arr_t[2]
            if name:
                typedefs.setdefault(name.group(1), None if aligned is None
                                    else (found.group(1), aligned))
    # An attribute given to a tag elsewhere than after its definition's brace (a forward
    # declaration "struct __attribute__((aligned(32))) rec;", or "struct rec
    # __attribute__(...)") applies to the struct all the same: its layout is not read (an
    # alignment read as 4 put 32-byte aligned records in place, and the kernel faulted).
    # (Each match runs to a ";", "{", "}" or the end, never rescanned: linear.)
    for found in re.finditer(r"\bstruct\s++(?=__attribute__|__declspec|_?[Aa]lignas\b)"
                             r"([^;{}]*+)([;{}]|\Z)", code):
        words = re.findall(r"\w+", found.group(1))
        if found.group(2) in (";", "{") and words:
            tagged[words[-1]] = None  # the tag after the attribute
    for found in re.finditer(r"\bstruct\s++(\w++)\s*+(?:__attribute__|__declspec|"
                             r"_?[Aa]lignas)\b", code):
        tagged[found.group(1)] = None
    return _Source(tagged, typedefs, declared(code), _attributed_names(code), language(code),
                   {})


def _aligned(after: str) -> int | None:
    """The alignment that the text after a struct's closing brace asks for: 1 where it
    holds no attribute, N for ``__attribute__((aligned(N)))``, None for any other attribute
    or alignment (its layout is not read)."""
    if _ATTRIBUTE.search(after) is None:
        return 1
    found = re.fullmatch(r"\s*__attribute__\s*\(\(\s*(?:__)?aligned(?:__)?\s*\(\s*(\d+)\s*\)"
                         r"\s*\)\)\s*(?:\w+\s*)?", after)
    if found is None:
        return None
    value = int(found.group(1))
    return value if 0 < value <= 4096 and value & (value - 1) == 0 else None


def _attributed_names(code: str) -> frozenset[str]:
    """The names that ``code``'s typedefs with an attribute or an alignment declare (as
    declarators, before ";" or ",": a typedef of real4 from real leaves real out)."""
    from conveyor.kernels.typedefs import without_attributes

    found: set[str] = set()
    for match in re.finditer(r"\btypedef\b([^;{}]*+)(;?)", code):
        text = match.group(0)
        if match.group(2) and re.search(r"__attribute__|\b_?[Aa]lignas\b|__declspec|__align__",
                                        text):
            found.update(re.findall(r"(\w+)\s*(?:\[[^\]]*\]\s*)*[;,]", without_attributes(text)))
    return frozenset(found)


class _TooDeep(Exception):
    """A struct nested deeper than _DEPTH: the outermost one is not read."""


def struct_type(code: str, type_name: str) -> CType | None:
    """The struct ``type_name`` (``rec``, ``struct rec``) as ``code`` (comments blanked)
    defines it, its members placed as C places them; None where that cannot be read
    exactly."""
    try:
        found = _named(_source(code), " ".join(type_name.split()), -1, set())
    except _TooDeep:
        return None
    return found if found is not None and found.members else None


def _struct(src: _Source, type_name: str, depth: int, reading: set[str]) -> CType | None:
    """:func:`struct_type` at nesting ``depth``, memoized per source. ``reading``: the
    structs being read around this one (one that holds itself is not read). Only whole
    readings are kept, so streams on other threads never see one half done."""
    if type_name in src.read:
        found = src.read[type_name]
        # a struct read before at a shallower depth: as deep here as when read afresh
        if found is not None and depth + found.height > _DEPTH:
            raise _TooDeep(type_name)
        return found
    if type_name in reading:
        return None
    if depth >= _DEPTH:
        raise _TooDeep(type_name)
    name = re.sub(r"^struct\s+", "", type_name)
    body = None
    if re.fullmatch(r"\w+", name):
        # a typedef's name and a struct tag are apart in C: "rec" is the typedef where one
        # is defined, "struct rec" the tag (struct rec {...} beside typedef struct {...} rec)
        tables = ((src.tagged, src.typedefs) if type_name.startswith("struct")
                  else (src.typedefs, src.tagged))
        # None: another attribute after its brace, or no definition at all
        body = next((table[name] for table in tables if name in table), None)
    reading.add(type_name)
    found = None if body is None else _laid_out(src, name, *body, depth, reading)
    reading.discard(type_name)
    src.read[type_name] = found
    return found


def _laid_out(src: _Source, name: str, body: str, aligned: int, depth: int,
              reading: set[str]) -> CType | None:
    """The struct ``name`` of members ``body`` placed as C places them, aligned to at least
    ``aligned``, or None."""
    if ":" in body or "(" in body:  # bit fields, attributes: not judged
        return None
    members: list[Member] = []
    offset, align = 0, aligned
    for text in filter(None, (m.strip() for m in body.split(";"))):
        words = [w for w in text.split() if w not in ("const", "volatile")]
        if not words:
            return None
        ctype, rest = _member_type(src, words, depth, reading)
        if ctype is None:
            return None
        for declarator in rest.split(","):
            parts = _DECLARATOR.fullmatch(declarator)
            if parts is None:
                return None
            # C's integer literals: a leading 0 is octal (int b[010] holds 8)
            digits = re.findall(r"\d+", parts.group(2))
            if any(n.startswith("0") and len(n) > 1 and not set(n) <= set("01234567")
                   for n in digits):
                return None  # no C number: the kernel would not build
            dims = tuple(int(n, 8 if n.startswith("0") else 10) for n in digits)
            offset = -(-offset // ctype.align) * ctype.align
            members.append(Member(parts.group(1), ctype, dims, offset))
            offset += ctype.size * math.prod(dims)
            align = max(align, ctype.align)
    size = -(-offset // align) * align
    if not members or size == 0:
        return None
    data = max(m.offset + m.extent for m in members)
    height = 1 + max(m.ctype.height for m in members)
    return CType(f"struct {name}", size, align, data, members=tuple(members), height=height)


def _member_type(src: _Source, words: list[str], depth: int, reading: set[str]
                 ) -> tuple[CType | None, str]:
    """A member's type from its words (``const`` left out) and the text of its
    declarators; None for the type where conveyor does not read it."""
    if words[0] == "struct" and len(words) > 2:
        return _struct(src, f"struct {words[1]}", depth + 1, reading), " ".join(words[2:])
    key, rest = c_type_words(words)
    if key is None:
        return None, rest
    return _named(src, key, depth, reading), rest


def _named(src: _Source, name: str, depth: int, reading: set[str]) -> CType | None:
    """The type that the one name ``name`` stands for: a scalar, a vector, a struct, through
    the source's typedefs (of typedefs); None where it stands for another thing."""
    for _ in range(16):
        if name.startswith("struct "):
            return _struct(src, name, depth + 1, reading)
        if name in src.attributed:
            return None  # aligned(16), a vector extension: its words do not give its layout
        # the source's own typedef first: "typedef short int32_t" is 2 bytes
        target = src.aliases.get(name)
        if target is None and name in C_SIZES:
            return CType(name, C_SIZES[name], C_SIZES[name], C_SIZES[name], scalar=name)
        if target is None:
            return vector(name, src.lang) or _struct(src, name, depth + 1, reading)
        words = [w for w in target.split() if w not in ("const", "volatile")]
        if len(words) == 2 and words[0] == "struct" and words[1].isidentifier():
            name = f"struct {words[1]}"
        elif words and all(w in _TYPE_WORDS for w in words):
            found = c_type(words)
            if found is None:
                return None
            name = found
        elif len(words) == 1 and words[0].isidentifier():
            name = words[0]
        else:
            return None
    return None


def c_type_words(words: list[str]) -> tuple[str | None, str]:
    """A member's type as a key of C_SIZES (``long int``: ``long``; ``unsigned``: ``unsigned
    int``), or its one word where it is no C type word (a typedef's name), and the text of
    its declarators; None where the words name no type conveyor reads (``long double``)."""
    count = 0
    while count < len(words) - 1 and words[count] in _TYPE_WORDS:
        count += 1
    if count == 0:
        return words[0], " ".join(words[1:])
    return c_type(words[:count]), " ".join(words[count:])


def c_type(words: list[str]) -> str | None:
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


def c_layout(code: str, type_name: str) -> tuple[str, int, list[int], list[int]] | None:
    """(name, size, member offsets, member extents) of the struct ``type_name`` as C lays
    it out, from its definition in ``code`` (``struct name { ... }`` or ``typedef struct {
    ... } name;``); an extent runs from a member's offset to its last byte holding a value.
    None where that cannot be read exactly."""
    found = struct_type(code, type_name)
    if found is None:
        return None
    return (found.name.removeprefix("struct "), found.size, [m.offset for m in found.members],
            [m.extent for m in found.members])


def c_dtype(code: str, type_name: str) -> np.dtype | None:
    """The structured dtype of the struct ``type_name`` as ``code`` defines it, its fields
    named as the members and placed as C places them; None where :func:`c_layout` cannot
    read it, or two members share a name (the kernel would not build)."""
    found = struct_type(code, type_name)
    if found is None:
        return None
    try:
        return found.dtype()
    except (TypeError, ValueError):
        return None
