"""A private directory for binaries we will run: created 0700, checked, and held open.

A folder holds binaries safely only if no other user can change what its path names: the
folder itself must be ours (not a symlink, no group or other write) and so must every folder
above it, since whoever can rename a parent can put a folder of their own in its place. The
rule is ssh's for ``~/.ssh``: every parent is owned by this user or root and is not writable by
group or others, except that a parent with the sticky bit (``/tmp``, mode 1777) is accepted,
because in a sticky folder only an entry's owner (or root) may rename or delete it, so the
folder of ours inside it cannot be swapped.

The checks are made on a descriptor (:func:`open_private_dir`), and the parents found by
walking ``..`` from it, so the folder checked is the folder used: the cache opens its entries
relative to that descriptor (``dir_fd=``), and a rename of the path afterwards cannot make it
read someone else's folder.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

#: Open a directory without following a symlink at its last component.
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)


def _uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def make_private_dirs(path: Path) -> None:
    """Create ``path`` and any missing parents with mode 0700 (exactly, whatever the umask)."""
    missing: list[Path] = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue  # another process made it first; refusal() still checks the leaf
        # 0700 exactly, whatever the umask, on the folder just made: through a descriptor
        # that follows no link, so a symlink swapped in for it meanwhile (by whoever can write
        # the parent) never has its target's mode changed. Such a swap fails the open here
        # and is refused by refusal() afterwards.
        try:
            fd = os.open(directory, _DIR_FLAGS)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == (_uid() if _uid() is not None
                                                           else st.st_uid):
                os.fchmod(fd, 0o700)
        finally:
            os.close(fd)


def own_refusal(st: os.stat_result) -> str | None:
    """Why a directory with status ``st`` is not privately ours, or None."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link (refused: it could point anywhere)"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    uid = _uid()
    if uid is not None and st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        mode = stat.S_IMODE(st.st_mode)
        return f"is writable by group or others (mode {mode:04o}; run chmod 700 on it)"
    return None


def parent_refusal(st: os.stat_result) -> str | None:
    """Why a folder above the cache with status ``st`` lets another user swap what is below
    it, or None: owned by someone but this user and root, or group/other-writable without
    the sticky bit."""
    uid = _uid()
    if uid is not None and st.st_uid not in (uid, 0):
        return (f"is owned by uid {st.st_uid} (not this user, uid {uid}, nor root), who "
                f"could rename what is inside it")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        mode = stat.S_IMODE(st.st_mode)
        return (f"is writable by group or others without the sticky bit (mode {mode:04o}), "
                f"so another user could rename what is inside it")
    return None


def _parent_name(path: Path, level: int, st: os.stat_result) -> str:
    """A name for the ``level``-th folder above ``path`` (1: its parent) whose status is
    ``st``: its real path where that still names it, else ``path/../..``."""
    real = Path(os.path.realpath(path))
    parents = [real, *real.parents]
    if level < len(parents):
        candidate = parents[level]
        with contextlib.suppress(OSError):
            found = os.stat(candidate)
            if (found.st_dev, found.st_ino) == (st.st_dev, st.st_ino):
                return str(candidate)
    return str(path) + "/.." * level


def parents_refusal(path: Path, fd: int) -> str | None:
    """Why a folder above the directory open as ``fd`` (named ``path``) is unsafe, or None.
    The parents are found from the descriptor (``..`` after ``..``), not from the name, so
    they are the folders that contain the directory now."""
    here = os.fstat(fd)
    current = os.open("..", _DIR_FLAGS, dir_fd=fd)
    try:
        level = 1
        while True:
            st = os.fstat(current)
            why = parent_refusal(st)
            if why is not None:
                return (f"is inside {_parent_name(path, level, st)}, which {why}; keep the "
                        f"cache under folders only you (or root) can write")
            if (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino):
                return None  # "/" is its own parent
            above = os.open("..", _DIR_FLAGS, dir_fd=current)
            os.close(current)
            current, here, level = above, st, level + 1
    finally:
        os.close(current)


def open_private_dir(path: Path, writable: bool = True) -> tuple[int | None, str | None]:
    """Open directory ``path`` and check it and its parents: ``(descriptor, None)`` when it
    may hold binaries we run (and, with ``writable``, we may write it), else ``(None, why)``
    (``why`` completes "the directory ...")."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as exc:
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.lstat(path).st_mode):
                return None, "is a symbolic link (refused: it could point anywhere)"
        return None, f"cannot be read ({exc.strerror or exc})"
    try:
        why = own_refusal(os.fstat(fd)) or parents_refusal(path, fd)
        if why is None and writable and not os.access(path, os.W_OK | os.X_OK):
            why = "is not writable"
    except OSError as exc:
        why = f"cannot be checked ({exc.strerror or exc})"
    if why is not None:
        os.close(fd)
        return None, why
    return fd, None


def refusal(path: Path) -> str | None:
    """Why ``path`` must not hold binaries we will run, or None when it is fine."""
    fd, why = open_private_dir(path)
    if fd is not None:
        os.close(fd)
    return why
