"""The caches of the OpenCL stack under conveyor: kept out of folders others may write.

conveyor's own cache runs nothing from a folder another user could write (kernels/cachedir.py).
Two caches below it did not follow that rule:

- PyOpenCL keeps, for every ``pyopencl.Kernel`` made (each kernel conveyor loads), a pytools
  dictionary of pickled code under ``$XDG_CACHE_HOME/pytools`` (else ``~/.cache/pytools``):
  whoever can write there runs code in the next process (round forty-one).
- PoCL compiles each kernel into a shared object under ``$XDG_CACHE_HOME/pocl`` (else
  ``~/.cache/pocl``) and loads it from there later; with a relative ``XDG_CACHE_HOME`` that is
  under the current folder, and with a ``HOME`` that is a file PoCL lists no device at all.

:func:`guard` runs before PyOpenCL first asks for platforms (which starts PoCL): where the
folder those caches take is not one conveyor would keep binaries in, PyOpenCL's disk caches
are turned off (conveyor's own replaces them) and, unless ``POCL_CACHE_DIR`` names one, PoCL
is given a private folder: ``pocl`` in conveyor's cache folder where that is usable, else a
0700 temporary folder removed at exit. Where the folder is fine, nothing changes.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import tempfile
from pathlib import Path

from conveyor import config
from conveyor.kernels import cachedir


def unsafe_reason(base: str | None) -> str | None:
    """Why the drivers' cache folder ``base`` (what they take as ``XDG_CACHE_HOME``) must not
    hold code this process runs, or cannot hold PoCL's cache, or None where it may: absolute,
    writable by this user, lying (links followed) in folders only we or root can change, and
    so are the ``pytools`` and ``pocl`` folders in it where they exist (a link from a private
    folder to a shared one is the shared one)."""
    if not base:
        return "no cache folder"
    path = Path(base)
    if not path.is_absolute():
        return f"{base!r} is relative (under whatever folder the process is in)"
    probe = path
    while not os.path.lexists(probe):
        if probe.parent == probe:
            return f"{base!r} has no existing folder above it"
        probe = probe.parent
    why = _folder_refusal(probe, own=probe == path)
    if why is None and not os.access(probe, os.W_OK | os.X_OK):
        why = f"{probe} is not writable by this user (PoCL lists no device then)"
    if why is None and probe == path:
        for name in ("pytools", "pocl", "pocl/kcache"):
            if os.path.lexists(path / name):
                why = _folder_refusal(path / name, own=True)
                if why is not None:
                    return why
        why = _entry_refusal(path / "pytools")
    return why


#: Entries of PyOpenCL's cache folder checked one by one (its sqlite files: a few).
_MOST_ENTRIES = 1000


def _entry_refusal(folder: Path) -> str | None:
    """Why an entry of ``folder`` (PyOpenCL's pickles, read as code) may be another user's:
    a symlink (it could name a shared file), or a file not ours or writable by others."""
    try:
        with os.scandir(folder) as entries:
            for count, entry in enumerate(entries):
                if count >= _MOST_ENTRIES:
                    return f"{folder} holds more than {_MOST_ENTRIES} entries, not all checked"
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # removed meanwhile (an sqlite journal): the rest
                    continue
                if entry.is_symlink():
                    return f"{entry.path} is a symbolic link (it could name a shared file)"
                if st.st_uid != os.getuid() or st.st_mode & 0o022:
                    return f"{entry.path} is another user's, or writable by others"
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{folder} cannot be listed ({exc.strerror or exc})"
    return None


def _folder_refusal(folder: Path, own: bool) -> str | None:
    """Why ``folder`` (links followed: what it is, where it really lies) may be changed by
    another user, or None. ``own``: the drivers write into it (else it is a folder above)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        return f"{folder} cannot be opened as a folder ({exc.strerror or exc})"
    try:
        st = os.fstat(fd)
        why = (cachedir.own_refusal(st) if own else cachedir.parent_refusal(st)) \
            or cachedir.parents_refusal(folder, fd)
    except OSError as exc:
        why = f"cannot be checked ({exc.strerror or exc})"
    finally:
        os.close(fd)
    return None if why is None else f"{folder} {why}"


@functools.cache
def guard() -> str | None:
    """Keep PyOpenCL's and PoCL's caches out of an unsafe folder (see the module's
    docstring), once per process, before the first platform query. Returns why they were
    moved, or None where nothing was changed."""
    why = unsafe_reason(config.driver_cache_home())
    if why is None:
        return None
    import pyopencl as cl

    cl._PYOPENCL_NO_CACHE = True  # its pickled invoker cache and build cache: never read
    if not config.pocl_cache_dir_set():
        config.set_pocl_cache_dir(_private_pocl_folder())
    return why


def _private_pocl_folder() -> Path:
    """``pocl`` in conveyor's cache folder where that folder passes conveyor's checks, else a
    new 0700 temporary folder, removed when the process exits."""
    with contextlib.suppress(config.InputError, OSError):
        if not config.cache_disabled():
            ours = config.cache_dir()
            cachedir.make_private_dirs(ours / "pocl")
            if cachedir.refusal(ours / "pocl") is None:
                return ours / "pocl"
    made = Path(tempfile.mkdtemp(prefix="conveyor-pocl-"))
    atexit.register(_remove_in, os.getpid(), made)
    return made


def _remove_in(pid: int, folder: Path) -> None:
    """Remove ``folder`` at exit, in the process that made it only: a forked child inherits
    the exit hook, and removed its parent's live PoCL folder (every later build failed)."""
    if os.getpid() == pid:
        shutil.rmtree(folder, ignore_errors=True)
