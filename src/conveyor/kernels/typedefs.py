"""The type names a kernel source declares: typedefs, ``using``, enums of a fixed type.

Read from the source as the compiler would see it (comments blanked, preprocessed): each
``typedef`` statement's declarators (``typedef float other, single;`` declares two names),
with its ``__attribute__`` groups taken out (``typedef int word __attribute__((aligned(4)))``
is an int), a vector made by ``ext_vector_type(N)`` read as that vector (``float4``), and
pointer typedefs (``typedef __global const real *rp;``) kept apart: a parameter of one is a
pointer to their pointee (signature.py). A name declared twice with two types at one brace
depth (scopes conveyor does not follow) is left out rather than guessed; one at file scope
wins over one inside a function.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterator
from typing import NamedTuple

# Possessive quantifiers (``*+``, ``++``: Python 3.11) where a lazy run before optional
# spaces backtracked quadratically: ``enum E : a`` and 20,000 spaces with no ``{`` took 4.6 s.
# Types they capture keep their trailing spaces: read them through ``_words``.
# A declaration that no ";" ends is matched too (and skipped), so that the search goes on
# after it: one that had to end in ";" was sought from each "typedef" of a run of them.
_STATEMENT = re.compile(r"\btypedef\b([^;{}]*+)(;?)")
_TYPEDEF_ENUM = re.compile(
    r"\btypedef\s++enum\s*+(?:\w++\s*+)?(?::\s*+(\w++(?:\s++\w++)*+)\s*+)?\{[^{}]*+\}\s*+(\w++)"
    r"\s*+;")
# ``enum tag : type`` (C23, clang's extension): an enum of a fixed type, not int
_FIXED_ENUM = re.compile(r"\benum\s++(\w++)\s*+:\s*+(\w++(?:\s++\w++)*+)\s*+[{;]")
_USING = re.compile(r"\busing\s++(\w++)\s*+=\s*+([^;{}()]++)(;?)")
# ext_vector_type(N); N may stand in parentheses of its own (``#define VW (4)``)
_EXT_VECTOR = re.compile(r"(?<![A-Za-z0-9])_*ext_vector_type_*\s*\(")
# Qualifiers that may stand between a declarator's type and its name (``* restrict``,
# ``* const``): read by ``_declarator``.
_QUALIFIER_WORDS = frozenset({"const", "volatile", "restrict", "__restrict__", "__restrict"})
# A brace that opens no scope: ``extern "C" {`` (its string emptied by code_only): what is
# declared inside is at file scope. (A namespace's is a scope: its typedef of a built-in
# name is not what a kernel outside it reads.)
_OPEN_SCOPE_LESS = re.compile(r"\bextern\s*\"\"\s*\{")
_LANES = ("2", "3", "4", "8", "16")


def declared(text: str, built_in: Callable[[str], bool] = lambda name: False
             ) -> dict[str, str]:
    """Every type name ``text`` (comments blanked) declares -> the type it stands for: a
    pointer's ends in ``*``, an array's in ``[]``, an enum without a fixed type is
    ``enum``. A ``built_in`` name declared only inside braces (``struct Traits { typedef
    double size_t; }``, a function's ``typedef ushort uint;``) is left out: a kernel's
    parameter list sees the built-in type."""
    found: dict[str, tuple[int, set[str]]] = {}  # name -> (brace depth, types at that depth)
    depths = _depths(text)
    for start, name, target in sorted(_declarations(text)):
        before = bisect.bisect_left(depths, (start, -1))
        depth = depths[before - 1][1] if before else 0
        target = " ".join(target.split())
        known = found.get(name)
        if known is None or depth < known[0]:
            found[name] = (depth, {target})
        elif depth == known[0]:
            known[1].add(target)
    return {name: next(iter(types)) for name, (depth, types) in found.items()
            if len(types) == 1 and (depth == 0 or not built_in(name))}


def _depths(text: str) -> list[tuple[int, int]]:
    """(position, scope depth after it) of each brace of ``text``, in order; the braces of
    ``extern "C" { }`` open no scope."""
    scope_less = {m.end() - 1 for m in _OPEN_SCOPE_LESS.finditer(text)}
    found, opened, depth = [], [], 0
    for match in re.finditer(r"[{}]", text):
        if match.group() == "{":
            transparent = match.start() in scope_less
            opened.append(transparent)
            depth += 0 if transparent else 1
        elif opened:
            depth -= 0 if opened.pop() else 1
        found.append((match.start(), depth))
    return found


def _declarations(text: str) -> list[tuple[int, str, str]]:
    """(position, name, type) of each declaration, in no particular order."""
    found = [(m.start(), m.group(1), _words(m.group(2))) for m in _USING.finditer(text)
             if m.group(3)]
    # typedef enum { A, B } mode; (its braces keep it from _STATEMENT)
    found += [(m.start(), m.group(2), _words(m.group(1) or "enum"))
              for m in _TYPEDEF_ENUM.finditer(text)]
    found += [(m.start(), f"enum {m.group(1)}", _words(m.group(2)))
              for m in _FIXED_ENUM.finditer(text)]
    for match in _STATEMENT.finditer(text):
        if not match.group(2):
            continue
        found += [(match.start(), name, target) for name, target in _statement(match.group(1))]
    return found


def _words(text: str) -> str:
    """``text`` with its runs of white space made one space, and none at its ends."""
    return " ".join(text.split())


def _statement(body: str) -> list[tuple[str, str]]:
    """The (name, type) pairs of one ``typedef`` statement's text (after ``typedef``)."""
    if not _attributes_known(body):
        return []  # mode(DI), vector_size(16)...: another type than the words say
    raw_parts = split_top(body)
    parts = [without_attributes(part) for part in raw_parts]
    if any("(" in part for part in parts):  # a function (pointer) type: not a data type
        return []
    first = _declarator(parts[0])
    if first is None or not first.type:
        return []
    # Qualifiers before the first star are the pointee's (``float const *p``: const data).
    base = _words(f"{first.type} {_stars(first)[0]}")
    # ext_vector_type before the first name is the base type's (every declarator's); after
    # a name, that declarator's own (``typedef float s, v4 __attribute__(...)``: s is float)
    shared = _vector_width(raw_parts[0][:_name_at(raw_parts[0], first.name)])
    pairs = []
    for index, (raw, part) in enumerate(zip(raw_parts, parts, strict=True)):
        match = first if index == 0 else _declarator(part)
        if match is None or (index and match.type):
            return []  # not a declarator list conveyor reads: leave the statement out
        stars, name, array = _stars(match)[1].count("*"), match.name, match.arrays
        lanes = shared or _vector_width(raw[_name_at(raw, name):])
        target = base
        if lanes is not None and not stars and not array:
            # typedef float v4 __attribute__((ext_vector_type(4))): float4 (or unknown)
            # the lanes go on the type's words, not its qualifiers (float const: const float4)
            words = base.split()
            qualifiers = [w for w in words if w in _QUALIFIER_WORDS]
            plain = " ".join(w for w in words if w not in _QUALIFIER_WORDS)
            target = " ".join([*qualifiers, f"{plain}{lanes}" if lanes in _LANES
                               else f"{plain} []"])
        pairs.append((name, target + " *" * stars + (" []" if array else "")))
    return pairs


def _vector_width(text: str) -> str | None:
    """The lane count of the first ``ext_vector_type(N)`` in ``text`` (``N`` a number,
    in parentheses or not), ``"?"`` where ``N`` is anything else (``(4) * 2``: a vector of
    a width conveyor does not evaluate), None where there is none."""
    match = _EXT_VECTOR.search(text)
    if match is None:
        return None
    depth, end = 1, match.end()
    while end < len(text) and depth:
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        end += 1
    inner = re.sub(r"\s+", "", text[match.end() : end - 1])
    while inner.startswith("(") and inner.endswith(")") and _balanced(inner[1:-1]):
        inner = inner[1:-1]
    return inner if inner.isdigit() else "?"


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


class Declarator(NamedTuple):
    """One declarator of a ``typedef``: ``float const * restrict p[4]`` is type ``float``,
    between `` const * restrict ``, name ``p``, arrays ``[4]``."""

    type: str
    between: str
    name: str
    arrays: str


def _declarator(text: str) -> Declarator | None:
    """``text`` read as a type, the stars and qualifiers after it, a name and array
    brackets; None where it is not one. Read from the end in one pass: a regular expression
    with a lazy type before a run of qualifiers backtracked for seconds on a hostile
    ``typedef`` (2,000 ``const`` words and an unclosed ``[``), and its ``.`` stopped at a
    line break (``typedef unsigned\\nint u32;`` was not read)."""
    text = text.strip()
    end = arrays_at = len(text)
    while end and text[end - 1] == "]":  # array brackets, read from the last: "[4][2]"
        arrays_at = text.rfind("[", 0, end - 1)
        if arrays_at < 0 or "]" in text[arrays_at + 1 : end - 1]:
            return None
        end = len(text[:arrays_at].rstrip())
    name_at = end
    while name_at and (text[name_at - 1].isalnum() or text[name_at - 1] == "_"):
        name_at -= 1
    if name_at == end:
        return None
    at = name_at
    while at:
        if text[at - 1].isspace() or text[at - 1] == "*":
            at -= 1
            continue
        word = at
        while word and (text[word - 1].isalnum() or text[word - 1] == "_"):
            word -= 1
        if word == at or text[word:at] not in _QUALIFIER_WORDS:
            break
        at = word
    if "[" in text[:at] or "]" in text[:at]:
        return None
    return Declarator(text[:at].strip(), text[at:name_at], text[name_at:end],
                      text[arrays_at:])


def _stars(match: Declarator) -> tuple[str, str]:
    """A declarator's text between its type and its name, cut at the first ``*``: the
    qualifiers of the type, then the stars with the pointer's own qualifiers."""
    between = match.between
    star = between.find("*")
    return (between, "") if star < 0 else (between[:star], between[star:])


def _name_at(raw: str, name: str) -> int:
    """Where declarator ``name`` stands in ``raw`` (its last occurrence as a word outside
    attributes; the end where not found)."""
    spans = [m.span() for m in re.finditer(r"__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)", raw)]
    for match in reversed(list(re.finditer(rf"\b{re.escape(name)}\b", raw))):
        if not any(lo <= match.start() < hi for lo, hi in spans):
            return match.start()
    return len(raw)


#: Attributes that leave a typedef the type its words say (ext_vector_type is read above).
_HARMLESS = frozenset({"aligned", "unused", "maybe_unused", "used", "deprecated", "may_alias",
                       "ext_vector_type", "nodebug"})


def _attributes_known(text: str) -> bool:
    """Whether every attribute in ``text`` is one :data:`_HARMLESS` (``mode(DI)`` makes an
    int 64 bits, ``vector_size(16)`` a float a vector: such a name is left unresolved, for
    the driver's reading)."""
    for group in re.finditer(r"__attribute__\s*\(\(((?:[^()]|\([^()]*\))*)\)\)", text):
        for item in split_top(group.group(1)):
            word = re.match(r"\s*(\w*)", item)
            name = (word.group(1) if word else "").strip("_")
            if name and name not in _HARMLESS:
                return False
    return True


def without_attributes(text: str) -> str:
    """``text`` less its ``__attribute__((...))`` groups (nested parentheses and all): in an
    unnamed ``float __attribute__((unused))`` the attribute was read as the name, and PoCL,
    asked for an unnamed argument's name, crashed the process."""
    out, at = [], 0
    while (start := text.find("__attribute__", at)) >= 0:
        out.append(text[at:start])
        i = text.find("(", start)
        if i < 0:
            return "".join(out) + text[start:]
        depth = 0
        for j in range(i, len(text)):
            depth += {"(": 1, ")": -1}.get(text[j], 0)
            if depth == 0:
                break
        at = j + 1
        out.append(" ")
    return "".join(out) + text[at:]


def split_default(text: str) -> str:
    """A parameter's text without a C++ default argument (``float w = 0.5f``: ``float w``);
    an ``=`` inside parentheses or template arguments is not one."""
    at = next(_top_level(text, "="), None)
    return text if at is None else text[:at]


def split_top(text: str) -> list[str]:
    """``text`` split at the commas outside parentheses and template arguments (a parameter
    list with ``__attribute__((aligned(16), nosvm))``, ``PASTE(a, b)`` or ``Pair<float, int>``
    in it)."""
    parts, start = [], 0
    for at in _top_level(text, ","):
        parts.append(text[start:at])
        start = at + 1
    parts.append(text[start:])
    return parts


_CLOSES = {")": "(", "]": "[", "}": "{"}


def _top_level(text: str, mark: str) -> Iterator[int]:
    """The positions of ``mark`` in ``text`` outside parentheses, brackets, braces and
    template arguments. A ``<`` opens template arguments only right after a name (``Pair<``,
    not ``1 <<`` or ``a <=``), outside parentheses, and when a ``>`` closes it (``->``,
    ``>>`` of a shift inside ``aligned(64 >> 2)`` and a comparison in ``Flag<(2 > 1)>`` do
    not): one counter for every kind read ``1 << 4`` as two open brackets, and the whole
    parameter list after it as one parameter; a ``<`` never closed (a default argument's
    comparison, ``int s = A < B, float *y``) swallowed the parameters after it."""
    templates = _closed_templates(text)
    stack: list[str] = []
    for i, char in enumerate(text):
        if char in "([{":
            stack.append(char)
        elif char in _CLOSES:
            if stack and stack[-1] == _CLOSES[char]:
                stack.pop()
        elif char == "<":
            if i in templates:
                stack.append("<")
        elif char == ">":
            if stack and stack[-1] == "<" and text[i - 1 : i] != "-" \
                    and text[i + 1 : i + 2] != "=":
                stack.pop()
        elif char == mark and not stack:
            yield i


def _closed_templates(text: str) -> set[int]:
    """The positions of the ``<`` that open template arguments: a ``<`` that may open them
    (``_opens_template``) and that a ``>`` closes before the bracket around it does (not the
    ``>`` of ``->`` or ``>=``: ``int lo = W < 8, int hi = H >= 2`` are two parameters)."""
    stack: list[tuple[str, int]] = []
    closed: set[int] = set()
    for i, char in enumerate(text):
        if char in "([{":
            stack.append((char, i))
        elif char in _CLOSES:
            while stack and stack[-1][0] == "<":  # a "<" that was a comparison after all
                stack.pop()
            if stack and stack[-1][0] == _CLOSES[char]:
                stack.pop()
        elif char == "<":
            if _opens_template(text, i) and (not stack or stack[-1][0] in "<{"):
                stack.append(("<", i))
        elif char == ">":
            if stack and stack[-1][0] == "<" and text[i - 1 : i] != "-" \
                    and text[i + 1 : i + 2] != "=":
                closed.add(stack.pop()[1])
    return closed


def _opens_template(text: str, at: int) -> bool:
    """Whether the ``<`` at ``at`` can open template arguments: right after a name (not a
    number), and not part of ``<<`` or ``<=``."""
    if text[at + 1 : at + 2] in ("<", "=") or text[at - 1 : at] == "<":
        return False
    word = re.search(r"(\w+)\s*$", text[max(0, at - 200) : at])
    return word is not None and not word.group(1)[0].isdigit()
