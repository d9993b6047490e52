"""Digests of conveyor's own code that its kernel cache's entries depend on.

A binary's key holds :func:`checks_identity` (the code that reads a kernel's types and has
the compiler confirm them at the build), a ``.sig`` entry's name :func:`reader_identity` (the
code that reads the parameters): a fix to either is never hidden by an entry made before it.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path


@functools.lru_cache(maxsize=1)
def checks_identity() -> str:
    """A digest of the code that reads a kernel's types and makes the compiler confirm them
    at its build (sizecheck.py and what it reads with): part of every binary's cache key, so
    a binary built before a fix to those checks is built (and checked) again, never loaded
    unchecked (a typedef whose sign the compiler chose, read wrong, loaded from the cache
    after the check learnt to refuse it)."""
    import hashlib

    digest = hashlib.sha256()
    here = Path(__file__).resolve().parent
    # pipeline/clayout.py: the struct sizes the build asks the compiler to confirm;
    # pipeline/structs.py: whether the source packs them (then none is asked)
    for name in ("sizecheck.py", "signature.py", "typedefs.py", "clmacros.py", "preprocess.py",
                 "../pipeline/clayout.py", "../pipeline/structs.py"):
        with contextlib.suppress(OSError):
            digest.update((here / name).read_bytes())
    return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def reader_identity() -> str:
    """What read the parameters a ``.sig`` holds: a digest of conveyor's parser and
    preprocessing code and of pcpp's installed files (their sizes and times; pcpp itself is
    not imported: that is what a warm build saves). Part of each ``.sig``'s name, so a fix to
    either is never hidden by parameters read before it."""
    import hashlib
    import importlib.util

    digest = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for name in ("signature.py", "typedefs.py", "clmacros.py", "preprocess.py"):
        with contextlib.suppress(OSError):
            digest.update((here / name).read_bytes())
    with contextlib.suppress(ImportError, ValueError, OSError):
        spec = importlib.util.find_spec("pcpp")
        folder = Path(spec.origin).parent if spec is not None and spec.origin else None
        for path in sorted(folder.glob("*.py")) if folder is not None else ():
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]
