"""Conveyor as an installed package has it, byte-compiled, for benchmarks that time a fresh
process (the first call, the command line, a warm kernel cache).

This machine and the lent GPU machines set ``PYTHONDONTWRITEBYTECODE`` (bench/NOTES.md,
sessions 8 and 11), so no ``.pyc`` is ever written and every fresh process compiled
conveyor's modules from source, inside the first stream it timed (the pipeline is imported
on first use): 0.23 s of a 0.62 s first stream on PoCL's 2-core machine in session 11.
``pip install`` compiles them at install time. :func:`env` copies ``src/conveyor`` into a
private folder (removed at exit), compiles it there (``__pycache__`` beside the copy: a
``PYTHONPYCACHEPREFIX`` would also hide NumPy's and every other package's bytecode) and
puts that folder first on ``PYTHONPATH``; ``compiled=False`` gives a copy without bytecode,
for the comparison.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_copies: dict[bool, Path] = {}


def source_root(compiled: bool = True) -> Path:
    """A folder holding a copy of conveyor's package (compiled, or not), made once."""
    if compiled not in _copies:
        folder = Path(tempfile.mkdtemp(prefix="conveyor-bytecode-" if compiled
                                       else "conveyor-source-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        shutil.copytree(ROOT / "src" / "conveyor", folder / "conveyor",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        if compiled:
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(folder / "conveyor")],
                           check=True, timeout=600)
        _copies[compiled] = folder
    return _copies[compiled]


def env(base: dict[str, str] | None = None, *, compiled: bool = True) -> dict[str, str]:
    """``base`` (default: this process's environment) with the copy of conveyor first on
    ``PYTHONPATH`` and the checkout's root after it (for ``bench``)."""
    out = dict(os.environ if base is None else base)
    out["PYTHONPATH"] = os.pathsep.join(
        [str(source_root(compiled)), str(ROOT), *filter(None, [out.get("PYTHONPATH")])])
    if not compiled:
        out["PYTHONDONTWRITEBYTECODE"] = "1"
    return out
