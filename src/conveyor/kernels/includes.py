"""The headers a kernel source includes from its ``-I`` directories, for the cache key.

A header found in an ``-I`` directory is part of what gets compiled, so the kernel cache's key
covers its contents (``kernels/cache.py``): an edited header misses instead of loading a stale
binary. The preprocessor that reads parameter types (``kernels/preprocess.py``) searches the
same directories. So is a quoted header of the source found in the current directory, where
the compilers look too (PoCL found ``#include "h.h"`` there with no ``-I``, and an edited
``h.h`` loaded the binary of its old text). A computed ``#include NAME`` is followed through a
``#define NAME "h.h"`` of the source or a ``-DNAME=...`` option; one that cannot be resolved
makes every key unique (the kernel is rebuilt each time, with a warning once): the key cannot
know which header the compiler reads.
"""

from __future__ import annotations

import os
import re
import secrets
import warnings
from collections.abc import Sequence
from pathlib import Path

# Comments may stand between the words of a directive (``#include /* why */ "h.h"``).
_GAP = rb"(?:[ \t]|/\*(?:[^*\n]|\*(?!/))*\*/)*"  # each comment ends at its first */
# A line starts a directive after a UTF-8 byte-order mark too (editors save one): a header
# included on such a first line was left out of the key (a stale kernel after its edit).
_LINE = rb"^(?:\xef\xbb\xbf)?" + _GAP + rb"#" + _GAP
# A quoted name ends at its quote only, an angled one at its '>' only: a folder named "k>d"
# was read as the name "/.../k".
_NAME = rb'(?:"(?P<quoted>[^"\n]+)"|<(?P<angled>[^>\n]+)>)'
_INCLUDE = re.compile(_LINE + rb"include" + _GAP + _NAME, re.MULTILINE)
#: ``#include NAME``: a macro that names the header.
_COMPUTED = re.compile(_LINE + rb"include(?:[ \t]|/\*(?:[^*\n]|\*(?!/))*\*/)+"
                       rb"([A-Za-z_]\w*)", re.MULTILINE)  # not #include_next
_DEFINE = re.compile(_LINE + rb"define[ \t]+([A-Za-z_]\w*)" + _GAP
                     + rb'("[^"\n]+"|<[^>\n]+>)', re.MULTILINE)
# The compiler joins a line ending in a backslash to the next before it reads a directive.
_CONTINUATION = re.compile(rb"\\\r?\n")
#: Include directories named by more files than this are not followed further (a bound on the
#: work of computing a key, not a limit anyone should meet).
_MAX_HEADERS = 1000


def include_dirs(options: Sequence[str]) -> list[Path]:
    """The directories that ``-I`` options name, in order: ``-Idir``, ``-I dir`` (one option
    or two) and NVRTC's ``--include-path=dir``."""
    words: list[str] = []
    for option in options:
        words += option.split() if option.startswith("-I ") else [option]
    # An OpenCL driver splits the options at spaces (PyOpenCL joins them with spaces), so an
    # -I inside another option ("-DX=1 -Idir") is honoured there: its folder is searched too,
    # after the ones named as written (NVRTC takes each option whole).
    words += [w for option in options if " " in option.strip()
              for w in option.split()[1 if option.startswith("-I ") else 0:]]
    dirs: list[Path] = []
    for i, word in enumerate(words):
        if word == "-I" and i + 1 < len(words):
            found = Path(words[i + 1])
        elif word.startswith("-I") and len(word) > 2:
            found = Path(word[2:])
        elif word.startswith("--include-path="):
            found = Path(word.split("=", 1)[1])
        else:
            continue
        if found not in dirs:
            dirs.append(found)
    return dirs


def included_headers(
    source: str, options: Sequence[str]
) -> list[tuple[str, str, bytes | None]]:
    """Headers that ``source`` includes (directly or through other headers) and that are found
    in the ``-I`` directories of ``options``: ``(name, resolved path, contents)`` in the order
    met. A header the compiler finds elsewhere (its own or the system's, part of the compiler
    identity) is left out; a named header found nowhere is listed with contents None, so that
    creating it later changes the key too. A quoted include inside a header is also looked up
    beside that header first, as compilers do."""
    dirs = include_dirs(options)
    found: list[tuple[str, str, bytes | None]] = []
    seen: set[str] = set()
    pending: list[tuple[bytes, Path | None]] = [(source.encode(), None)]
    defines = _option_defines(options)
    while pending and len(found) < _MAX_HEADERS:
        text, beside = pending.pop(0)
        joined = _CONTINUATION.sub(b"", text)
        texts = [text, joined] if joined != text else [text]
        for body in texts:
            defines.update({m.group(1): m.group(2) for m in _DEFINE.finditer(body)})
        matches = [(b'"', m["quoted"]) if m["quoted"] is not None else (b"<", m["angled"])
                   for body in texts for m in _INCLUDE.finditer(body)]
        for body in texts:
            for m in _COMPUTED.finditer(body):
                named = defines.get(m.group(1))
                if named is None:
                    found.append(_unresolved(m.group(1).decode(errors="replace")))
                else:
                    matches.append((named[:1], named[1:-1]))
        for quote, raw in matches:
            name = os.fsdecode(raw).strip()  # a name of non-UTF-8 bytes is found as it is
            if Path(name).is_absolute():  # found by its path, with or without -I
                search = [Path("/")]
            else:
                # A quoted include: beside the including header, or (in the source itself)
                # in the current directory, where the compiler looks before the -I folders.
                # <k.h> is looked for in the -I folders only, from a header too.
                here = ((beside if beside is not None else Path.cwd()) if quote == b'"'
                        else None)
                search = ([here] if here is not None else []) + dirs
            if not search:
                continue  # the compiler's own or the system's header (no -I to find it in)
            for directory in search:
                candidate = directory / name
                if os.path.isfile(candidate):  # Path.is_file raised for a name too long
                    resolved = str(candidate.resolve())
                    # The compiler looks for a header's own quoted includes in the folder it
                    # was named in, not its link's target's: one reached through two folders
                    # is walked from each.
                    named_in = candidate.absolute().parent
                    if f"{resolved}\0{named_in}" in seen:
                        break
                    seen.add(f"{resolved}\0{named_in}")
                    try:
                        contents: bytes | None = candidate.read_bytes()
                    except OSError:
                        contents = None
                    found.append((name, resolved, contents))
                    if contents is not None:
                        pending.append((contents, named_in))
                    break
            else:
                if name not in seen:
                    seen.add(name)
                    found.append((name, "", None))
    return found


def _option_defines(options: Sequence[str]) -> dict[bytes, bytes]:
    """``-DNAME="h.h"`` (or ``<h.h>``) options: headers a computed include may name."""
    defines: dict[bytes, bytes] = {}
    for option in options:
        for word in option.split():
            if word.startswith("-D") and "=" in word:
                key, value = word[2:].split("=", 1)
                if value[:1] in ('"', "<") and len(value) > 2:
                    defines[key.encode()] = value.encode()
    return defines


def header_state(source: str, options: Sequence[str]) -> tuple[tuple[str, str, str], ...]:
    """The headers ``source`` includes as they are now: (name, where it was found, a digest
    of its contents, "-" for none found), in the order met. Two builds of one source read
    the same code where these are equal."""
    import hashlib

    # An include conveyor cannot follow has a key of its own each time (_unresolved): one
    # entry here, the same each time (what it includes is unknown either way).
    return tuple((name, "unresolved" if path.startswith("unresolved:") else path,
                  hashlib.sha256(contents).hexdigest() if contents is not None else "-")
                 for name, path, contents in included_headers(source, options))


_warned_unresolved = False


def _unresolved(macro: str) -> tuple[str, str, bytes | None]:
    """The key entry of a computed include conveyor cannot follow: unique to this call (the
    kernel is built again each time rather than loaded stale), with a warning once."""
    global _warned_unresolved
    if not _warned_unresolved:
        _warned_unresolved = True
        warnings.warn(f"conveyor: the kernel source has '#include {macro}', whose header "
                      f"conveyor cannot tell (write #define {macro} \"file.h\" in the source, or "
                      f"#include \"file.h\"): it is built each time, never from the cache",
                      RuntimeWarning, stacklevel=4)
    return (f"#include {macro}", f"unresolved:{secrets.token_hex(16)}", None)


# What may stand between a directive's words as the compiler reads them: blanks, comments and
# line continuations (a BOM before the first line's '#': editors save one).
_TEXT_GAP = r"(?:[ \t]|\\\r?\n|/\*(?:[^*\n]|\*(?!/))*\*/)*"
# A line that continues the one before (after a backslash) starts no directive; without this
# each of 50,000 continued lines read every line after it as a gap (136 s for one source).
_DIRECTIVE = r"^(?<!\\\n)(?<!\\\r\n)\ufeff?" + _TEXT_GAP + r"#" + _TEXT_GAP
_QUOTED_INCLUDE = re.compile(r"(?P<lead>" + _DIRECTIVE + r"include" + _TEXT_GAP
                             + r')"(?P<name>[^"\n]+)"', re.MULTILINE)
_MACRO_INCLUDE = re.compile(_DIRECTIVE + r"include(?:[ \t]|\\\r?\n|/\*(?:[^*\n]|\*(?!/))*\*/)+"
                            r"(?P<macro>[A-Za-z_]\w*)", re.MULTILINE)
_QUOTED_DEFINE = re.compile(r"(?P<lead>" + _DIRECTIVE + r"define(?:[ \t]|\\\r?\n)+"
                            r"(?P<macro>[A-Za-z_]\w*)"
                            + _TEXT_GAP + r')"(?P<name>[^"\n]+)"', re.MULTILINE)


def anchor_includes(source: str, folder: Path, what: str = "the kernel") -> str:
    """``source``, read from a file in ``folder``, with each ``#include "name"`` whose header
    lies in ``folder`` written as that header's absolute path (and each ``#define NAME
    "name"`` that an ``#include NAME`` uses). A compiler looks for a quoted include beside the
    including file first; the source reaches it as text, so it looked in the process's current
    folder instead (another project's header of the same name: wrong values, exit 0). Other
    includes are left as written (the -I folders, the compiler's). A path that cannot be
    written between quotes (a folder named with a backslash) is written between angle
    brackets; InputError where neither holds it (a quote or '>' in the folder's name), or
    where the path is not UTF-8 (the source reaches the compiler as UTF-8 text). ``what``
    names the including file in those messages."""
    from conveyor.errors import InputError

    folder = folder.absolute()

    def spelled(name: str, macro: bool) -> str | None:
        beside = folder / name
        if Path(name).is_absolute() or not os.path.isfile(beside):
            return None
        text = str(beside)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            # A folder named on a Latin-1 system: its bytes have no UTF-8 text to write in
            # the source (source.encode() was a UnicodeEncodeError traceback).
            shown = os.fsencode(folder).decode("utf-8", "backslashreplace")
            raise InputError(f"{what} includes {name!r}, beside it in {shown}, whose name is "
                             f"not UTF-8: the compiler reads the source as UTF-8 text, so that "
                             f"path cannot be written in an #include; rename the folder in "
                             f"UTF-8, or move the kernel and its headers to a folder that "
                             f"is") from None
        if '"' not in text and "\\" not in text:
            return f'"{text}"'
        if not macro and not any(c in text for c in '">\n'):
            # An absolute path: no search folder applies. (A quote in it would end the name
            # where the kernel cache's key reads the header: a stale kernel after an edit.)
            return f"<{text}>"
        raise InputError(f"{what} includes {name!r}, beside it in {folder}, whose path "
                         f"cannot be written in an #include: move the kernel and its headers "
                         f"to a folder without quotes, backslashes or '>' in its name")

    def anchored(match: re.Match[str]) -> str:
        path = spelled(match.group("name"), False)
        return match.group(0) if path is None else match.group("lead") + path

    macros = {m.group("macro") for m in _MACRO_INCLUDE.finditer(source)}

    def anchored_define(match: re.Match[str]) -> str:
        if match.group("macro") not in macros:
            return match.group(0)
        path = spelled(match.group("name"), True)
        return match.group(0) if path is None else match.group("lead") + path

    source = _QUOTED_INCLUDE.sub(anchored, source)
    return _QUOTED_DEFINE.sub(anchored_define, source) if macros else source

