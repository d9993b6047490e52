"""One builder per kernel across processes: an advisory file lock per cache key.

Eight processes that build the same OpenCL source at once on PoCL can abort inside PoCL's
own binary cache (``pocl_binary_get_kernels_metadata: Assertion 'len > 0'``): PoCL keeps a
directory per program under ``POCL_CACHE_DIR`` (``~/.cache/pocl``) and several processes
writing and reading one program's directory at the same moment see each other's half-written
files. It is what a cluster of workers does when it starts. conveyor therefore builds and loads
a kernel only while it holds ``<key>.lock``: the first process builds and stores the binary;
the others wait, then find it in conveyor's cache and load it one at a time.

The lock is ``flock(2)`` on a file of its own, so it is held by an open file description: it
also orders threads of one process, and the kernel drops it when its holder dies (a killed
build never leaves a lock behind). Lock files live in ``locks/`` beside the cache entries, or,
when the disk cache is off or refused, in a private folder under the system's temporary
directory. A folder that fails the same checks as the cache (owned by this user, no group or
other write, not a symlink) is not used: the build then runs unlocked, as it did before, and
says so once.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from conveyor.kernels.cache import KernelCache, make_private_dirs, refusal

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; builds run unlocked
    fcntl = None  # type: ignore[assignment]

#: How long a build waits for another process building the same kernel before it goes ahead
#: without the lock (with a warning): a holder that hangs must not hang every other process.
WAIT_SECONDS = 300.0
_POLL_SECONDS = 0.02
LOCK_FOLDER = "locks"

_warned_lock = threading.Lock()
_warned: set[str] = set()


def _warn_once(what: str, message: str) -> None:
    with _warned_lock:
        if what in _warned:
            return
        _warned.add(what)
    warnings.warn(f"conveyor: {message}", RuntimeWarning, stacklevel=5)


def lock_dir(cache: KernelCache | None) -> Path:
    """Where the lock files of ``cache`` go: its ``locks/`` folder, or, with no usable cache
    (or a read-only one), ``conveyor-<uid>-locks`` in the system's temporary directory."""
    if cache is not None and cache.enabled and not cache.read_only:
        return cache.path / LOCK_FOLDER
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"conveyor-{uid}-locks"


def _usable(folder: Path, temporary: bool = False) -> bool:
    """Whether ``folder`` may hold lock files (made if missing); a warning once where not.
    ``temporary``: it is the one under the system's temporary directory (no usable cache)."""
    fix = ""
    if temporary:
        # The cache's own advice ("keep the cache under folders only you can write") named
        # nothing to change here: the folder is TMPDIR's, whatever the cache's is.
        fix = (f". With the kernel cache off or refused, lock files go under the temporary "
               f"directory {folder.parent} (TMPDIR, else /tmp): set TMPDIR to a folder only "
               f"you (or root) can write, or use the kernel cache")
    try:
        make_private_dirs(folder)
    except OSError as exc:
        _warn_once(str(folder), f"cannot create the build-lock folder {folder} "
                               f"({exc.strerror or exc}); kernels are built without it{fix}")
        return False
    why = refusal(folder)
    if why is not None:
        if temporary:
            why = why.split("; keep the cache", 1)[0]
        _warn_once(str(folder), f"the build-lock folder {folder} {why}; kernels are built "
                               f"without it (processes that build one kernel at once may "
                               f"crash PoCL){fix}")
        return False
    return True


@contextlib.contextmanager
def build_lock(key: str, cache: KernelCache | None) -> Iterator[None]:
    """Hold the cross-process lock of kernel ``key`` for the ``with`` block.

    Waits up to :data:`WAIT_SECONDS` for another holder; then (or when the folder is refused)
    the block runs unlocked after one RuntimeWarning. Never raises for the lock's sake.
    """
    if fcntl is None:
        yield
        return
    folder = lock_dir(cache)
    if not _usable(folder, temporary=cache is None or not cache.enabled or cache.read_only):
        yield
        return
    path = folder / f"{key}.lock"
    try:
        # O_NOFOLLOW: a lock file is ours, never a link planted to make us open something else.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as exc:
        _warn_once(str(path), f"cannot open the build lock {path} ({exc.strerror or exc}); "
                              f"the kernel is built without it")
        yield
        return
    try:
        why = _acquire(fd)
        if why is not None:
            _warn_once(str(path), f"{why} (lock {path}); the kernel is built without the lock")
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def _acquire(fd: int) -> str | None:
    """Take the exclusive flock on ``fd``, polling so that a hung holder is given up on;
    None once held, else why not."""
    assert fcntl is not None
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return None
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return f"waited {WAIT_SECONDS:.0f} s for another process building it"
            time.sleep(_POLL_SECONDS)
        except OSError as exc:  # a filesystem without flock
            return f"the lock cannot be taken ({exc.strerror or exc})"
