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

_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*[<"]([^">\n]+)[">]', re.MULTILINE)
#: Include directories named by more files than this are not followed further (a bound on the
#: work of computing a key, not a limit anyone should meet).
_MAX_HEADERS = 1000


def include_dirs(options: Sequence[str]) -> list[Path]:
    """The directories that ``-I`` options name, in order: ``-Idir``, ``-I dir`` (one option
    or two) and NVRTC's ``--include-path=dir``."""
    words: list[str] = []
    for option in options:
        words += option.split() if option.startswith("-I ") else [option]
    dirs: list[Path] = []
    for i, word in enumerate(words):
        if word == "-I" and i + 1 < len(words):
            dirs.append(Path(words[i + 1]))
        elif word.startswith("-I") and len(word) > 2:
            dirs.append(Path(word[2:]))
        elif word.startswith("--include-path="):
            dirs.append(Path(word.split("=", 1)[1]))
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
    if not dirs:
        return []
    found: list[tuple[str, str, bytes | None]] = []
    seen: set[str] = set()
    pending: list[tuple[bytes, Path | None]] = [(source.encode(), None)]
    while pending and len(found) < _MAX_HEADERS:
        text, beside = pending.pop(0)
        for match in _INCLUDE.finditer(text):
            name = match.group(1).decode(errors="replace").strip()
            search = ([beside] if beside is not None else []) + dirs
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
