"""Conveyor's modules byte-compiled once, as an installed package has them, for benchmarks
that time a fresh process (the first call, the command line, a warm kernel cache).

On the lent GPU machines the checkout's ``.pyc`` files are not written (bench/NOTES.md,
session 8), so every fresh process compiled conveyor's modules from source, inside the
first stream it timed (its pipeline is imported on first use): 0.14 s of a 0.31 s first
stream on PoCL's 2-core machine in session 11. ``pip install`` compiles them at install
time. ``env()`` compiles them once into a private ``PYTHONPYCACHEPREFIX`` (removed at exit)
and returns an environment that uses it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "src" / "conveyor"
_prefix: Path | None = None


def prefix() -> Path:
    """The folder holding conveyor's compiled modules (compiled on the first call)."""
    global _prefix
    if _prefix is None:
        folder = Path(tempfile.mkdtemp(prefix="conveyor-pycache-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(SOURCE)],
                       env=dict(os.environ, PYTHONPYCACHEPREFIX=str(folder)), check=True,
                       timeout=600)
        _prefix = folder
    return _prefix


def env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with conveyor's bytecode in use."""
    return dict(os.environ if base is None else base, PYTHONPYCACHEPREFIX=str(prefix()))
