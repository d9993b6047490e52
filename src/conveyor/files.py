"""Writing files safely: one place for every file conveyor writes (outputs, traces, the link
ceiling).

- :func:`output_target` checks a path a call will write, before any work: its folder exists
  and is writable, and it is not a folder, a FIFO or a device node. A symlink is written
  *through*: the file it points to is replaced and the link stays (so an output linked onto
  another disk lands there).
- :func:`new_part` makes the temporary ``.NAME.XXXX.part`` file beside the target, holding an
  ``flock`` on it while it is written. The lock lets :func:`remove_stale_parts` tell a part of
  a run that was killed (its lock died with it) from one being written now; a part appears
  under its ``.part`` name only once it is locked.
- :func:`commit_part` (outputs) and :func:`atomic_write` (text files: the trace, the link
  ceiling) fsync, give the file the mode of the file it replaces (else ``0666 & ~umask``) and
  rename it over the target.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import IO

from conveyor.errors import InputError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; stale parts are left alone
    fcntl = None  # type: ignore[assignment]

PathLike = str | os.PathLike[str]

_KINDS = {stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a character device",
          stat.S_ISBLK: "a block device", stat.S_ISSOCK: "a socket", stat.S_ISDIR: "a folder"}


def output_target(path: PathLike, what: str) -> Path:
    """The file that writing ``path`` replaces (a symlink resolved to its target); InputError
    naming ``what`` (e.g. "output 0 c.npy") if its folder is missing or not writable, or if it
    exists and is not a regular file."""
    target = Path(os.path.realpath(path))
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise InputError(f"{what}: cannot look at {target} ({exc.strerror}): write "
                         f"elsewhere") from exc
    if mode is not None and not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS.items() if test(mode)), "not a file")
        via = f" (through the symlink {path})" if str(target) != os.path.abspath(path) else ""
        raise InputError(f"{what}: {target} is {kind}{via}: name a regular file; conveyor "
                         f"replaces the file it writes, which would replace the node")
    folder = target.parent
    if not folder.is_dir():
        raise InputError(f"{what}: folder {folder} does not exist: create it or write "
                         f"elsewhere")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{what}: folder {folder} is not writable: write elsewhere or fix "
                         f"its permissions")
    return target


def same_file(a: PathLike, b: PathLike) -> bool:
    """True if ``a`` and ``b`` name one file (through links, hard links included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def new_part(target: Path) -> tuple[int, Path]:
    """A new, empty, locked ``.NAME.XXXX.part`` file beside ``target``: (fd, path). The lock
    lasts as long as the fd is open (and dies with the process)."""
    fd, staging = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                   suffix=".new")
    part = Path(staging[: -len(".new")] + ".part")
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # Shown as .part only once locked, so no cleaner can take it for a dead run's part.
        os.rename(staging, part)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(staging)
        raise
    return fd, part


def remove_stale_parts(target: Path) -> list[Path]:
    """Delete the ``.part`` files of ``target`` whose writer is gone (nobody holds their
    lock), with a warning naming each; return them. Parts being written are left alone."""
    if fcntl is None:  # pragma: no cover
        return []
    removed = []
    # mkstemp's names: "." + target name + "." + 8 random characters + ".part".
    pattern = re.compile(rf"\.{re.escape(target.name)}\.[a-z0-9_]{{8}}\.part")
    try:
        names = os.listdir(target.parent)
    except OSError:
        return []
    for part in (target.parent / n for n in names if pattern.fullmatch(n)):
        try:
            fd = os.open(part, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # gone already, a link, or not ours to read
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live run is writing it
            size = os.fstat(fd).st_size
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
                removed.append(part)
                warnings.warn(f"conveyor: removed {part} ({size} bytes), the temporary file of "
                              f"an earlier run of {target} that did not finish",
                              RuntimeWarning, stacklevel=5)  # the caller of cv.stream
        finally:
            os.close(fd)
    return removed


def commit_part(fd: int, part: Path, target: Path, durable: bool = True) -> None:
    """Make ``part`` (open as ``fd``, which this closes) the file ``target``: fsync (when
    ``durable``), the mode of the file it replaces, rename."""
    try:
        if durable:
            os.fsync(fd)
        os.fchmod(fd, target_mode(target))
    finally:
        os.close(fd)
    # Checked when the sink was made; checked again in case a node took the file's place since.
    output_target(target, f"output {target}")
    os.replace(part, target)


def target_mode(target: Path) -> int:
    """The permission bits a new version of ``target`` gets: those of the regular file it
    replaces (never set-id bits), else ``0666 & ~umask``."""
    try:
        st = os.stat(target)
    except OSError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode):
        return stat.S_IMODE(st.st_mode) & 0o777
    return 0o666 & ~_umask()


def atomic_write(path: PathLike, write: Callable[[IO[str]], None], durable: bool = True) -> None:
    """Write a text file atomically: ``write(handle)`` fills a part file beside it (see
    :func:`new_part`), which is fsynced (when ``durable``) and renamed over ``path``, keeping
    its mode. Parts of ``path`` left by killed writers are removed first."""
    target = Path(os.path.realpath(path))
    remove_stale_parts(target)
    fd, part = new_part(target)
    try:
        try:
            with os.fdopen(os.dup(fd), "w") as handle:
                write(handle)
        except BaseException:
            os.close(fd)
            raise
        commit_part(fd, part, target, durable)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
