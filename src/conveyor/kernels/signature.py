"""Read a kernel's parameter list from its OpenCL C or CUDA C source.

conveyor needs the types to cast scalar arguments (``args=(2.5,)`` becomes the kernel's
``float``) and to check that arrays handed to a stream have the element type the kernel expects.
The text read here is the source after ``kernels/preprocess.py`` expanded its macros; typedef
names (``typedef double real;``, ``using real = double;``) are resolved to what they name, and
vector types (``float4``) are recognised as their element type and width. What the driver
reports about the loaded kernel overrides this where it can (``kernels/argtypes.py``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from conveyor.errors import InputError
from conveyor.kernels.typedefs import declared, split_default, split_top, without_attributes

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
    "__write_only", "read_only", "write_only", "struct", "__grid_constant__",
}  # fmt: skip

# Comments, and string and character literals (whose text may look like code: a printf of
# "kernel void s(" was read as kernel s's parameters), blanked by code_only.
# An unclosed comment runs to the end of the source, as the compiler reads it: a comment
# that had to close rescanned the rest of the source from each "/*" (600 KB of "/* ": minutes).
# An #include's <name> is kept as it is: "//" in <sub//t.h> is no comment.
# Comments may stand between "include" and "<" (the compiler reads them as spaces).
_INCLUDE_HEAD = r'#[ \t]*include(?:[ \t]++|/\*(?:[^*]++|\*(?!/))*+\*/)*+'
_INCLUDE_RUN = _INCLUDE_HEAD + r'<[^>\n]*+'
_NOT_CODE = re.compile(_INCLUDE_RUN + r'>'
                       r'|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?(?:\*/|\Z)',
                       re.S)
_INCLUDE_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_INCLUDE_NAME_AT = re.compile(_INCLUDE_HEAD, re.S)
_PRAGMA_OPEN = re.compile(r"\b_Pragma\Z")
# Where each kind of _NOT_CODE match may start, and the run each would take before its
# closing character (possessive: one reading). A run that stops short of its close (a string
# unclosed at its line's end, an include's "<" with no ">") makes every later start of the
# same kind inside the run fail too: a quote inside it was escaped ("\""), and an include's
# "<" in it has no ">" before the line ends. So each is tried once, not from every quote
# (an unclosed line of 40 KB of \" took 5 s, rescanned from each quote).
_STARTS = re.compile(r'#|"|\'|/[/*]')
_RUNS = {"#": re.compile(_INCLUDE_RUN, re.S),
         '"': re.compile(r'"(?:\\.|[^"\\\n])*+', re.S),
         "'": re.compile(r"'(?:\\.|[^'\\\n])*+", re.S)}
_CLOSES = {"#": ">", '"': '"', "'": "'"}


def _not_code(source: str) -> Iterator[re.Match[str]]:
    """The matches of ``_NOT_CODE`` in ``source``, as ``_NOT_CODE.finditer`` finds them, in
    time linear in the source (see _RUNS)."""
    dead = {"#": -1, '"': -1, "'": -1}  # below it, a start of that kind cannot match
    at = 0
    while True:
        start = _STARTS.search(source, at)
        if start is None:
            return
        where, kind = start.start(), start.group()[0]
        if kind == "/":
            found = _NOT_CODE.match(source, where)
            assert found is not None  # "//" and "/*" always match
            yield found
            at = found.end()
            continue
        if where < dead[kind]:
            at = where + 1
            continue
        run = _RUNS[kind].match(source, where)
        if run is None:  # "#" that is no include
            at = where + 1
        elif source.startswith(_CLOSES[kind], run.end()):
            found = _NOT_CODE.match(source, where)
            assert found is not None and found.end() == run.end() + 1
            yield found
            at = found.end()
        else:
            dead[kind] = run.end()
            at = where + 1


def without_comments(source: str) -> str:
    """``source`` (its continued lines joined) with each comment made one space, string and
    character literals and include names kept: what a preprocessor reads, in one pass (pcpp's
    lexer rescanned an unclosed comment from each "/*": 100 KB took 486 s). The line breaks
    a comment held follow the first line break after it, so a comment inside a directive
    (``#define REAL /* a\\n b */ double``) does not end the directive, and the lines after
    it keep their numbers."""
    out, at, pending = [], 0, 0
    line = _Line()
    for match in _not_code(source):
        code = source[at : match.start()]
        out.append(_after_break(code, pending))
        if pending and "\n" in code:
            pending = 0
        line.read(code)
        text = match.group(0)
        if text[0] == "#":  # <sub//t.h> is <sub/t.h>, which pcpp's lexer reads as a name
            name_at = _INCLUDE_NAME_AT.match(text).end()  # type: ignore[union-attr]
            head = _INCLUDE_COMMENT.sub(" ", text[:name_at])  # its breaks after the line
            pending += text.count("\n", 0, name_at)
            out.append(head + re.sub(r"/{2,}", "/", text[name_at:]))
            line.read(head + text[name_at:])
        elif text[0] in "\"'":
            out.append(text)
            line.read(text)
        elif pending or line.directive:  # on a directive's line: it goes on after it
            out.append(" ")
            pending += text.count("\n")
        else:  # in code, its line breaks where they were (__LINE__ after it)
            out.append(" " + "\n" * text.count("\n"))
            if "\n" in text:
                line.read("\n")
        at = match.end()
    rest = source[at:]
    out.append(_after_break(rest, pending) if "\n" in rest else rest + "\n" * pending)
    return "".join(out)


class _Line:
    """Whether the line being read is a directive (its first token, comments aside, a
    ``#``), kept as text is read: looking back to each comment's line start was quadratic
    on one long line of comments."""

    def __init__(self) -> None:
        self.started, self.directive = False, False

    def read(self, text: str) -> None:
        """Read ``text`` (code, a literal, an include name) on from the line so far."""
        if "\n" in text:
            self.started, self.directive = False, False
            text = text[text.rindex("\n") + 1 :]
        if not self.started:
            head = text.lstrip()
            if head:
                self.started, self.directive = True, head.startswith("#")


def _after_break(text: str, breaks: int) -> str:
    """``text`` with ``breaks`` more line breaks after its first one (as it is without one)."""
    if not breaks or "\n" not in text:
        return text
    first = text.index("\n") + 1
    return text[:first] + "\n" * breaks + text[first:]


def _after_pragma_open(text: str, at: int) -> bool:
    """Whether the string literal at ``at`` is ``_Pragma``'s: before it (and its prefix,
    ``L``, ``u``, ``U`` or ``u8``) ``(``, and before that the word ``_Pragma``, blanks
    allowed between. Blanks are stepped over one by one: each string looks back only over
    the blanks before it, which no other string shares (linear, however wide the gaps)."""
    end = at
    for prefix in ("u8", "L", "u", "U"):
        if text.startswith(prefix, max(0, end - len(prefix))) and end >= len(prefix):
            end -= len(prefix)
            break
    while end and text[end - 1].isspace():
        end -= 1
    if not end or text[end - 1] != "(":
        return False
    end -= 1
    while end and text[end - 1].isspace():
        end -= 1
    return _PRAGMA_OPEN.search(text, max(0, end - 8), end) is not None


def code_only(source: str) -> str:
    """``source`` with its comments blanked and its string and character literals emptied."""
    def blank(match: re.Match[str]) -> str:
        text = match.group(0)
        return ('""' if text[0] == '"' else "' '" if text[0] == "'" else
                _INCLUDE_COMMENT.sub(" ", text) if text[0] == "#" else " ")
    # Lines ending in a backslash joined first, as C does before it finds comments: a "//"
    # comment so continued swallows the next line.
    joined = re.sub(r"\\\r?\n", "", source)
    out, at = [], 0
    for match in _not_code(joined):
        start = match.start()
        # _Pragma("pack(1)") keeps its text: it packs structs (structs.packs reads it)
        kept = match.group(0)[0] == '"' and _after_pragma_open(joined, start)
        out += [joined[at:start], match.group(0) if kept else blank(match)]
        at = match.end()
    # GCC and clang take "__attribute" as "__attribute__": one spelling for every reader
    # (a struct aligned(32) by the short one was laid out at 4, and its records put in place
    # at 16 faulted). The lengths differ, but no line break moves.
    return _SHORT_ATTRIBUTE.sub("__attribute__", "".join(out) + joined[at:])


_SHORT_ATTRIBUTE = re.compile(r"\b__attribute\b")

# OpenCL C's (2, 3, 4, 8, 16 lanes) and CUDA's (1 to 4 lanes) vector types.
_VECTOR = re.compile(
    r"(char|uchar|short|ushort|int|uint|long|ulong|longlong|ulonglong|half|float|double)"
    r"(1|2|3|4|8|16)"
)
_VECTOR_ELEMENTS = {"longlong": "long long", "ulonglong": "unsigned long long"}
# What stands before a kernel's name: ``__kernel void``, or ``void __kernel`` (C takes the
# specifiers in either order), with ``__attribute__((...))`` before or after ``void``.
# An attribute's parentheses are matched (two levels inside its own), never skipped over with
# ``.*?``: a run of attributes then has one reading, not exponentially many to backtrack.
_PARENS = r"\((?:[^()]|\([^()]*\))*\)"
_ATTRIBUTES = (rf"(?:(?:__attribute__\s*\(\((?:[^()]|{_PARENS})*\)\)"
               rf"|__launch_bounds__\s*{_PARENS})\s*)*")  # CUDA's __launch_bounds__(256, 2)
_KERNEL_WORD = r"(?:__kernel|\bkernel|__global__)"
_KERNEL_HEAD = (rf"(?:{_KERNEL_WORD}\s+{_ATTRIBUTES}void|\bvoid\s+{_ATTRIBUTES}{_KERNEL_WORD})"
                rf"\s+{_ATTRIBUTES}")


#: Bump when Param's fields change: older ``.sig`` entries then read as absent.
_SIGNATURE_VERSION = 3  # 2: ``spelled``; "* const" no longer const; OpenCL's predefined macros
# 3: the source's typedefs before built-in names


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its name, whether it is a pointer, and its element/scalar dtype.

    ``dtype`` is None for types conveyor does not know (structs); such scalars must be passed
    as NumPy values of the right type. For a vector type (``float4``) ``dtype`` is the element
    type and ``width`` the number of lanes. ``base`` is the type's name as written, without
    qualifiers or ``*`` (``real`` for a typedef). ``address`` is the OpenCL address space
    ("global", "local", "constant", "private") where known, else "". ``origin`` says where
    the type came from: "source" (the preprocessed text), "driver" (OpenCL's argument info)
    or "source+sizes" (the text, checked against the CUDA kernel's argument sizes).
    ``spelled`` is the builtin type a typedef name in ``base`` stands for (``long long`` for
    ``typedef long long wide``: 128 bits in OpenCL C), "" where ``base`` is not a typedef.
    """

    name: str
    is_pointer: bool
    dtype: np.dtype | None
    is_const: bool
    type_text: str
    width: int = 1
    base: str = ""
    address: str = ""
    origin: str = "source"
    spelled: str = ""

    @property
    def type_name(self) -> str:
        """The type as a short C spelling: ``float*``, ``real*``, ``ulong``."""
        return (self.base or "?") + ("*" if self.is_pointer else "")

    @property
    def struct_name(self) -> str:
        """The pointee's or value's type as C names it for ``sizeof``: ``struct rec`` where
        written with its tag (a tag is no type name on its own in C, and a typedef of the
        same name may be another type), else ``base``."""
        if self.base and re.search(rf"\bstruct\s+{re.escape(self.base)}\b", self.type_text):
            return f"struct {self.base}"
        return self.base

    def describe(self) -> str:
        """The type with what conveyor resolved it to, for messages: ``real* (float64)``."""
        if self.dtype is None:
            resolved = "a type conveyor cannot resolve"
        elif self.width > 1:
            resolved = f"{self.width} x {self.dtype}"
        else:
            resolved = str(self.dtype)
        return f"{self.type_name} ({resolved})"


def parse_params(source: str, name: str) -> tuple[Param, ...]:
    """The parameters of kernel ``name`` in ``source``; InputError if no such kernel."""
    read = _read(source)
    heads = read.heads.get(name, ())
    # The definition (its ")" followed by "{"), not a prototype before it, whose parameters
    # may be named where the definition's are not (PoCL, asked an unnamed one's name, crashed).
    head = next((h for h in heads if h[1]), heads[0] if heads else None)
    if head is None:
        found = kernel_names(source)
        listing = ", ".join(found) if found else "none"
        raise InputError(f"no kernel named {name!r} in the source; kernels found: {listing}")
    body = head[0].strip()
    if not body or body == "void":
        return ()
    return tuple(_parse_one(part, read.names, read.pointers) for part in split_top(body))


class _Source(NamedTuple):
    """What parse_params reads of a source once for all its kernels: each kernel head's
    parameter text and whether a body follows it, by name, and the typedef tables (not the
    source's code: the cache would keep it)."""

    heads: dict[str, tuple[tuple[str, bool], ...]]
    names: dict[str, str]
    pointers: dict[str, str]


@functools.lru_cache(maxsize=4)
def _read(source: str) -> _Source:
    """``source`` read for parse_params, once: the size check reads every kernel of a source
    twice, and read the whole source again each time (751 small kernels: 28 s)."""
    text = code_only(source)
    pairs = _paren_pairs(text)
    heads: dict[str, list[tuple[str, bool]]] = {}
    for match in re.finditer(_KERNEL_HEAD + r"(\w+)\s*\(", text):
        close = pairs.get(match.end() - 1)
        body = text[match.end() : len(text) - 1 if close is None else close]  # unclosed: all
        heads.setdefault(match.group(1), []).append(
            (body, _defines_body(text, match.end(), pairs)))
    table = declared(text, _built_in)  # read once for both kinds of typedef
    return _Source({k: tuple(v) for k, v in heads.items()}, _element_typedefs(table),
                   _pointer_typedefs(table))


def typedefs(source: str) -> dict[str, str]:
    """Every type name ``source`` declares as another element type (``typedef TYPE NAME;``,
    ``using NAME = TYPE;``, enums), NAME -> TYPE (kernels/typedefs.py); pointer and array
    typedefs are left out: a parameter of one is not an element type."""
    return _element_typedefs(declared(code_only(source), _built_in))


def pointer_typedefs(source: str) -> dict[str, str]:
    """Every pointer typedef of ``source`` (``typedef __global const real *rp;``), NAME ->
    the type it points to, with its qualifiers (``__global const real``)."""
    return _pointer_typedefs(declared(code_only(source), _built_in))


def _element_typedefs(table: dict[str, str]) -> dict[str, str]:
    return {name: target for name, target in table.items()
            if "*" not in target and "[" not in target}


#: What may stand beside a pointer typedef's name without changing where it points
#: (``typedef const fp0 fp;``, ``typedef fp0 __restrict__ fp;``, ``float * __restrict__``).
_POINTER_QUALIFIERS = frozenset({"const", "volatile", "restrict", "__restrict__", "__restrict"})


def _pointee(target: str) -> str | None:
    """The type a pointer type's text points to (``__global const real *``, ``float *
    __restrict__``: its qualifiers after the star are the pointer's own); None unless it is
    one pointer, not an array."""
    if "[" in target or target.count("*") != 1:
        return None
    before, after = target.split("*")
    if any(word not in _POINTER_QUALIFIERS for word in after.split()):
        return None
    return before.strip()


def _pointer_typedefs(table: dict[str, str]) -> dict[str, str]:
    pointers = {name: p for name, target in table.items()
                if (p := _pointee(target)) is not None}
    # typedef wp wp2 (or const wp, wp __restrict__): wp2 points where wp does. Each name's
    # answer is kept, so a long chain is walked once, not once from every name in it.
    known: dict[str, str | None] = {}
    for name in table:
        chain: list[str] = []
        current, found = name, None
        while True:
            if current in pointers:
                found = pointers[current]
                break
            if current in known:
                found = known[current]
                break
            if current not in table or current in chain:
                break
            chain.append(current)
            current = " ".join(w for w in table[current].split()
                               if w not in _POINTER_QUALIFIERS)
        for link in chain:
            known[link] = found
    return {**{name: p for name, p in known.items() if p is not None}, **pointers}


def _built_in(name: str) -> bool:
    return resolve(name)[0] is not None


def resolve(base: str, names: dict[str, str] | None = None) -> tuple[np.dtype | None, int]:
    """The element dtype and lane count of type ``base`` (a scalar, a vector such as
    ``float4``, or a typedef in ``names``); (None, 1) when it is none of these."""
    names = names or {}
    seen: set[str] = set()
    for _ in range(16):  # typedef chains; a loop of them resolves to nothing
        words = [w for w in base.split() if w not in _QUALIFIERS]
        base = " ".join(words)
        if base in names and base not in seen:
            seen.add(base)  # ``typedef size_t size_t;`` then is the built-in size_t
            # The source's own typedef first: a name that is no keyword may be one
            # (``typedef short int32_t;``, ``typedef double float1;``), and was read as
            # the built-in type: int32 data for a kernel reading shorts.
            base = names[base]
            continue
        known = _SCALARS.get(base) or _SCALARS.get(_integer_name(words))
        if known is not None:
            return np.dtype(known), 1
        if base == "enum" or base.startswith("enum "):
            # An enum's values are C ints (OpenCL C and CUDA C): cast to int32, as the driver
            # passes it; as no type, any NumPy scalar was passed as its bytes.
            return np.dtype(np.int32), 1
        vector = _VECTOR.fullmatch(base)
        if vector is not None:
            element = _VECTOR_ELEMENTS.get(vector.group(1), vector.group(1))
            return np.dtype(_SCALARS[element]), int(vector.group(2))
        break
    return None, 1


_INTEGER_WORDS = frozenset({"signed", "unsigned", "char", "short", "long", "int"})


def _integer_name(words: Sequence[str]) -> str:
    """The one spelling ``_SCALARS`` knows of a C integer type written in words in any order
    (``long int``, ``short int``, ``unsigned short int``, ``signed int``, ``long unsigned
    int``), or "" for anything else (a typedef of such a spelling was refused as a type
    conveyor cannot resolve, where the same words in a parameter list were read)."""
    if not words or not set(words) <= _INTEGER_WORDS:
        return ""
    unsigned = "unsigned" in words
    longs = words.count("long")
    if "char" in words:
        return "unsigned char" if unsigned else "signed char" if "signed" in words else "char"
    if "short" in words:
        return "unsigned short" if unsigned else "short"
    if longs:
        return ("unsigned " if unsigned else "") + " ".join(["long"] * min(longs, 2))
    return "unsigned int" if unsigned else "int"


def spelling(base: str, names: dict[str, str]) -> str:
    """The type a chain of typedefs in ``names`` from ``base`` ends at (``base`` itself when
    it is no typedef), without qualifiers."""
    for _ in range(16):
        base = " ".join(w for w in base.split() if w not in _QUALIFIERS)
        if base not in names:
            break
        base = names[base]
    return base


def kernel_names(source: str) -> list[str]:
    """Every kernel name defined in ``source``, in order."""
    text = code_only(source)
    return re.findall(_KERNEL_HEAD + r"(\w+)", text)


_ADDRESS = {
    "__global": "global", "global": "global", "__constant": "constant",
    "constant": "constant", "__local": "local", "local": "local",
}  # fmt: skip


def _paren_pairs(text: str) -> dict[int, int]:
    """Where each ``(`` of ``text`` closes, for those that close: found once for all of a
    source's kernel heads (each head walked to its own close, and an unclosed head to the
    end: a run of them took 45 s for 100 KB)."""
    pairs, opened = {}, []
    for match in re.finditer(r"[()]", text):
        if match.group() == "(":
            opened.append(match.start())
        elif opened:
            pairs[opened.pop()] = match.start()
    return pairs


_BODY = re.compile(r"\s*\{")


def _defines_body(text: str, start: int, pairs: dict[int, int]) -> bool:
    """Whether the parameter list opened just before ``start`` is followed by a body."""
    close = pairs.get(start - 1)
    return close is not None and _BODY.match(text, close + 1) is not None


def _parse_one(text: str, names: dict[str, str], pointers: dict[str, str] | None = None
               ) -> Param:
    # A C++ default argument (``float w = 0.5f``) is no part of the type or the name.
    text = split_default(without_attributes(text))
    text = " ".join(text.replace("*", " * ").split())
    text = _unwrap_pointer_typedef(text, pointers or {})
    if text.endswith("]") and "[" in text:
        # An array parameter is a pointer: "float x[4]" is "float * x"; "float []" has no name.
        words = text[:text.index("[")].split()
        if words and not _unnamed(words[:-1], words[-1]):
            words = [*words[:-1], "*", words[-1]]
        else:
            words = [*words, "*"]
        text = " ".join(words)
    tokens = text.split(" ")
    is_pointer = "*" in tokens
    name = tokens[-1] if tokens[-1] != "*" else ""
    words = [t for t in tokens[:-1] if t != "*"]
    if name and _unnamed(words, name):
        # ``float,`` or ``const real,``: the last word is the type, and there is no name (an
        # OpenCL driver asked for such an argument's name crashes: backends/opencl.py).
        words, name = [*words, name], ""
    # The data is const where "const" comes before the first "*" ("const float *x", "float
    # const *x"); "float * const y" is a const pointer to data the kernel may write.
    is_const = "const" in (tokens[:tokens.index("*")] if is_pointer else words)
    base = " ".join(w for w in words if w not in _QUALIFIERS)
    dtype, width = resolve(base, names)
    address = next((_ADDRESS[w] for w in words if w in _ADDRESS), "")
    final = spelling(base, names)
    return Param(name=name, is_pointer=is_pointer, dtype=dtype, is_const=is_const,
                 type_text=text, width=width, base=base, address=address,
                 spelled=final if final != base else "")


def _unwrap_pointer_typedef(text: str, pointers: dict[str, str]) -> str:
    """``rp x`` with ``typedef __global const real *rp;`` as ``__global const real * x``:
    read as the pointer it is (the driver reports ``real*``; ``rp`` was a type conveyor
    could not resolve). ``const`` before the name qualifies the pointer, not the data."""
    words = text.split()
    for i, word in enumerate(words[:-1] if len(words) > 1 else words):
        if word in pointers:
            before = [w for w in words[:i] if w not in ("const", "volatile", "restrict")]
            return " ".join([*before, pointers[word], "*", *words[i + 1:]])
        if word == "*" or word not in _QUALIFIERS:
            break  # past the type's first word: a name after it is the parameter's
    return text


def _unnamed(words: list[str], last: str) -> bool:
    """Whether ``last``, the final word of a parameter without ``*``, is part of its type."""
    base = [w for w in words if w not in _QUALIFIERS]
    if not base or last in _QUALIFIERS or last in _SCALARS or _VECTOR.fullmatch(last):
        return True
    if base[-1] in ("struct", "union", "enum"):  # ``union U``: the tag, not a name
        return True
    return " ".join([*base, last]) in _SCALARS  # ``unsigned int``, ``long long``


def arg_converters(
    params: Sequence[Param], pointer: Callable[[Any], Any]
) -> list[Callable[[Any], Any]]:
    """One function per parameter turning a launch argument into what the driver takes:
    ``pointer`` for pointer parameters (the backend's buffer unwrapping), a cast to the declared
    type for known scalars, and for other types a NumPy scalar as given. A value no cast
    means (None, a string, an array for a scalar) is an InputError (``kernels/argcast.py``)."""
    from conveyor.kernels.argcast import caster

    converters: list[Callable[[Any], Any]] = []
    for param in params:
        converters.append(pointer if param.is_pointer else caster(param))
    return converters


def params_to_json(params: Sequence[Param]) -> bytes | None:
    """``params`` as JSON bytes for the kernel cache (kernels/cache.py, ``.sig`` entries), or
    None when a dtype would not read back as itself."""
    rows = []
    for p in params:
        dtype = None if p.dtype is None else p.dtype.str
        if dtype is not None and np.dtype(dtype) != p.dtype:
            return None
        rows.append([p.name, p.is_pointer, dtype, p.is_const, p.type_text, p.width, p.base,
                     p.address, p.origin, p.spelled])
    return json.dumps([_SIGNATURE_VERSION, rows]).encode()


def params_from_json(data: bytes) -> tuple[Param, ...] | None:
    """What :func:`params_to_json` wrote, or None for anything else (it is then read from the
    source again)."""
    try:
        version, rows = json.loads(data)
        if version != _SIGNATURE_VERSION:
            return None
        params = []
        for (name, is_pointer, dtype, is_const, type_text, width, base, address, origin,
             spelled) in rows:
            fields = (name, type_text, base, address, origin, spelled)
            if not all(isinstance(f, str) for f in fields) or not isinstance(width, int):
                return None
            if not isinstance(is_pointer, bool) or not isinstance(is_const, bool):
                return None
            resolved = None if dtype is None else np.dtype(dtype)
            if resolved is not None and (resolved.kind not in "biufc" or resolved.fields):
                return None  # never a dtype source reading makes (object, structured, ...)
            params.append(Param(name, is_pointer, resolved, is_const, type_text, width, base,
                                address, origin, spelled))
        return tuple(params)
    except (ValueError, TypeError, RecursionError):
        return None
