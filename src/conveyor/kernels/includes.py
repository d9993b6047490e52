"""The headers a kernel source includes from its ``-I`` directories, for the cache key.

A header found in an ``-I`` directory is part of what gets compiled, so the kernel cache's key
covers its contents (``kernels/cache.py``): an edited header misses instead of loading a stale
binary. The preprocessor that reads parameter types (``kernels/preprocess.py``) searches the
same directories.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

# Comments may stand between the words of a directive (``#include /* why */ "h.h"``).
_GAP = rb"(?:[ \t]|/\*(?:[^*\n]|\*(?!/))*\*/)*"  # each comment ends at its first */
_INCLUDE = re.compile(rb"^" + _GAP + rb"#" + _GAP + rb"include" + _GAP + rb'[<"]([^">\n]+)[">]',
                      re.MULTILINE)
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
    while pending and len(found) < _MAX_HEADERS:
        text, beside = pending.pop(0)
        joined = _CONTINUATION.sub(b"", text)
        matches = [*_INCLUDE.finditer(text), *(_INCLUDE.finditer(joined) if joined != text else ())]
        for match in matches:
            name = match.group(1).decode(errors="replace").strip()
            if Path(name).is_absolute():  # found by its path, with or without -I
                search = [Path("/")]
            else:
                search = ([beside] if beside is not None else []) + dirs
            if not search:
                continue  # the compiler's own or the system's header (no -I to find it in)
            for directory in search:
                candidate = directory / name
                if candidate.is_file():
                    resolved = str(candidate.resolve())
                    if resolved in seen:
                        break
                    seen.add(resolved)
                    try:
                        contents: bytes | None = candidate.read_bytes()
                    except OSError:
                        contents = None
                    found.append((name, resolved, contents))
                    if contents is not None:
                        pending.append((contents, candidate.resolve().parent))
                    break
            else:
                if name not in seen:
                    seen.add(name)
                    found.append((name, "", None))
    return found
