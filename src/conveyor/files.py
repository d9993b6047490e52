"""Writing files safely: one place for every file conveyor writes (outputs, traces, the link
ceiling).

- :func:`output_target` checks a path a call will write, before any work: its folder exists
  and is writable, and it is not a folder, a FIFO or a device node, nor this process's
  standard output or error, nor anything under ``/proc`` (``/dev/stdout`` when stdout is a
  pipe resolves to ``/proc/PID/fd/pipe:[N]``). A symlink is written
  *through*: the file it points to is replaced and the link stays (so an output linked onto
  another disk lands there), except a link that another user may have planted, which is
  refused (:func:`resolve`: Linux's ``fs.protected_symlinks`` rule).
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
import errno
import os
import re
import secrets
import stat
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from conveyor.errors import InputError, advised

try:  # imported now: with no file descriptor left, loading its library fails (EMFILE)
    import resource
except ImportError:  # not Unix
    pass

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; stale parts are left alone
    fcntl = None  # type: ignore[assignment]
try:
    import pwd
except ImportError:  # pragma: no cover - Windows: users shown by number (no sticky folders)
    pwd = None  # type: ignore[assignment]

PathLike = str | os.PathLike[str]

_KINDS = {stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a character device",
          stat.S_ISBLK: "a block device", stat.S_ISSOCK: "a socket", stat.S_ISDIR: "a folder"}


#: Links followed while resolving one path before it is taken for a loop (Linux's MAXSYMLINKS).
_MAX_LINKS = 40

#: A sticky folder anyone may write, such as /tmp: where other users can plant links.
_SHARED = stat.S_ISVTX | stat.S_IWOTH


def output_target(path: PathLike, what: str, *, probe: bool = False) -> Path:
    """The file that writing ``path`` replaces (a symlink resolved to its target, see
    :func:`resolve`); InputError naming ``what`` (e.g. "output 0 c.npy") if a link on the way
    may have been planted by another user, if it is this process's standard output or error
    or lies in /proc, if its folder is missing or not writable, or if it exists and is not a
    regular file or is one this process may not write (read-only)."""
    text = path_text(path, what)
    if os.path.basename(text) in ("", ".", ".."):
        # "keep.npy/." resolves to keep.npy, so it replaced that file, while every check that
        # an existing file is kept (--force) looked for "keep.npy/." and found nothing.
        raise InputError(f"{what}: {text!r} names a folder, not a file: name the file to "
                         f"write, without a trailing '/', '/.' or '/..'")
    if text == "-":  # the shell's "standard output", never a file named "-"
        raise InputError(f"{what}: '-' would be a file named '-' in the current folder: "
                         f"conveyor does not write to standard output; name a file")
    # Standard output or error first, as named: resolving /dev/stdout to a deleted file's
    # /proc link would be refused for that, not for what it is.
    _refuse_streams(path, Path(text), what, proc=False)
    target = resolve(path, what)
    _refuse_streams(path, target, what)
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
    if not _access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{what}: folder {folder} is not writable: write elsewhere or fix "
                         f"its permissions")
    if mode is not None:
        _check_sticky_owner(target, folder, what)
        if not _access(target, os.W_OK):
            # The rename that commits an output needs only the folder's permission, so a
            # result its owner protected (chmod 444) was replaced silently, where np.save and
            # open(path, "w") refuse it. Root passes os.access: unaffected, as with np.save.
            raise InputError(f"{what}: {target} is read-only: chmod u+w it, or remove it, to "
                             f"replace it")
    if probe:
        _probe_folder(folder, what)
    longest = _name_max(folder) - _PART_EXTRA
    if len(os.fsencode(target.name)) > longest:
        # Found only at the end otherwise: the temporary file's name did not fit (exit 1
        # after the work), or a trace was not written.
        raise InputError(f"{what}: the name {target.name[:40]}... is "
                         f"{len(os.fsencode(target.name))} bytes; conveyor writes it through a "
                         f"temporary file named {_PART_EXTRA} bytes longer, and this file "
                         f"system's names hold {longest + _PART_EXTRA}: shorten it to "
                         f"{longest} bytes or fewer")
    return target


def _check_sticky_owner(target: Path, folder: Path, what: str) -> None:
    """InputError when ``target`` exists in a sticky folder (``/tmp``) and belongs to
    another user: only its owner, the folder's or root may rename over it, and the rename
    that commits the output failed after all the work, naming the temporary part."""
    try:
        owner, held = os.stat(target).st_uid, os.stat(folder)
    except OSError:
        return  # gone meanwhile: the write makes it anew
    if not held.st_mode & stat.S_ISVTX or os.geteuid() in (0, owner, held.st_uid):
        return
    raise InputError(f"{what}: {target} belongs to {_user(owner)} in {folder}, a sticky "
                     f"folder, where only a file's owner may replace it: write elsewhere")


def _probe_folder(folder: Path, what: str) -> None:
    """InputError when no file can be made in ``folder``: ``os.access`` says yes to root for
    /sys or a read-only mount, and the output, trace or plot then failed after the work."""
    from conveyor.interrupts import deferred_sigint

    probe = folder / f".conveyor-probe-{os.getpid()}-{secrets.token_hex(6)}"
    # Whole under Ctrl-C: one landing between the close and the unlink left the probe file
    # in the user's folder (held, it is raised once the probe is gone).
    with deferred_sigint():
        _make_and_remove(probe, folder, what)


def _make_and_remove(probe: Path, folder: Path, what: str) -> None:
    ours = True  # until the open says the name was another's (EEXIST)
    try:
        try:
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except OSError as exc:
            ours = exc.errno != errno.EEXIST
            raise_if_too_many_open(exc, what)  # not the folder's permissions
            raise InputError(f"{what}: cannot write in folder {folder} ({exc.strerror}): "
                             f"write elsewhere or fix its permissions") from exc
    finally:  # a Ctrl-C right after the file was made must not leave it
        if ours:
            with contextlib.suppress(OSError):
                os.unlink(probe)


#: Bytes a part file's name adds to its target's: "." + "." + 8 random characters + ".part".
_PART_EXTRA = 15


def _name_max(folder: Path) -> int:
    """The longest file name ``folder``'s file system holds, in bytes (255 where unknown)."""
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return 255


def _refuse_streams(path: PathLike, target: Path, what: str, *, proc: bool = True) -> None:
    """InputError when writing ``path`` (resolved: ``target``) would write this process's
    standard output or error (the same file as fd 1 or 2), or into /proc (a pipe or socket
    named by ``/dev/stdout``, ``/dev/fd/N``). Conveyor replaces the file it writes: a file
    stdout is redirected to (``>> log.txt``) would lose the job's log, and a pipe or a /proc
    entry cannot be replaced at all (not checked unless ``proc``)."""
    for fd, stream in ((1, "standard output"), (2, "standard error")):
        try:
            held = os.fstat(fd)
        except OSError:
            continue  # closed
        for named in (path, target):  # as named: the kernel follows /proc's links to the pipe
            try:
                st = os.stat(named)
            except OSError:
                continue  # a new file: no stream's
            if (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino):
                raise InputError(f"{what}: {os.fspath(path)} is this process's {stream}: name "
                                 f"a file (conveyor renames a new file over its target: that "
                                 f"would replace the file {stream} is redirected to, losing "
                                 f"what was written there, or fail on a pipe)")
    if proc and target.parts[1:2] == ("proc",):
        kind = next((f"a {k}" for k in ("pipe", "socket") if target.name.startswith(f"{k}:[")),
                    "a /proc entry")
        raise InputError(f"{what}: {os.fspath(path)} resolves to {target}, {kind}: name a file "
                         f"(conveyor writes a temporary file beside its target and renames it "
                         f"over it)")


def joined(path: PathLike) -> str:
    """``path`` made absolute by joining the current folder to it, not normalised
    (``os.path.abspath`` drops ``link/..`` as text, where the OS follows the link first); an
    absolute path as it is (the current folder may have been removed)."""
    text = os.fspath(path)
    return text if os.path.isabs(text) else os.path.join(current_folder(text), text)


def current_folder(relative: str) -> str:
    """``os.getcwd()``, for making the relative path ``relative`` absolute; InputError naming
    it when the current folder was removed: getcwd's bare "[Errno 2] No such file or
    directory" named neither the path nor the folder (``conveyor map -o y.npy`` run from a
    folder another shell deleted)."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise InputError(f"{relative} is relative to the current folder, which no longer "
                         f"exists (it was removed): give an absolute path, or cd to a folder "
                         f"that exists") from None


def raise_if_too_many_open(exc: OSError, what: str) -> None:
    """Raise ``exc`` named (``what``: "input 3 x.npy") where it is EMFILE or ENFILE: a stream
    of hundreds of files past ``ulimit -n`` raised "[Errno 24] Too many open files" naming
    only the path. An OSError still (the environment, not the arguments). Returns for any
    other error, which the caller raises as it was."""
    if exc.errno == errno.ENFILE:  # the whole system's table: no ulimit of ours raises it
        raise advised(OSError(exc.errno, (
            f"{what}: {os.strerror(exc.errno)}: the system as a whole holds as many files "
            f"open as it may (fs.file-max); close other programs' files, or stream fewer "
            f"files at once"))) from exc
    if exc.errno != errno.EMFILE:
        return
    try:
        limit = f" (this process may hold {resource.getrlimit(resource.RLIMIT_NOFILE)[0]})"
    except (OSError, ValueError, NameError):  # no resource module (not Unix)
        limit = ""
    raise advised(OSError(exc.errno, f"{what}: {os.strerror(exc.errno)}{limit}: raise the "
                                     f"limit (ulimit -n), or stream fewer files at once")) \
        from exc


def path_text(path: object, what: str) -> str:
    """``path`` (a str or os.PathLike) as a str; InputError naming ``what`` for anything else
    (bytes included) and for a NUL character, which no file name can hold (the OS calls would
    raise a bare ValueError)."""
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(text, str):
        raise InputError(f"{what} takes a file path (a str or pathlib.Path), not {path!r}")
    if "\0" in text:
        raise InputError(f"{what} got {text!r}, which holds a NUL character (\\x00): no file "
                         f"name can; name the file without it")
    if not text:  # '' is no file; os.path calls take it as the current folder
        raise InputError(f"{what} got an empty file name ''; name a file")
    return text


def resolve(path: PathLike, what: str) -> Path:
    """``os.path.realpath(path)`` (every link followed, a missing tail taken as named), except
    that a symlink in a sticky folder anyone may write (``/tmp``) is followed only if the
    process's effective user or the folder's owner owns it: InputError naming ``what``
    otherwise, and for a loop of links.

    This is Linux's ``fs.protected_symlinks`` rule, checked here for every link of the path (a
    chain included) because realpath resolves links itself, in user space, where the kernel's
    rule never applies; and it holds whether the kernel has it on or not. Without it, a user
    who plants ``/tmp/share/out.npy -> /home/you/data.npy`` makes conveyor, run by you (or by
    root), replace that file when it commits the output."""
    text = path_text(path, what)
    pending = text.split("/")[::-1]  # names still to walk, the next one last
    resolved = "/" if text.startswith("/") else current_folder(text)
    followed = 0
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":  # resolved is a real path here, so its parent is its dirname
            resolved = os.path.dirname(resolved)
            continue
        step = os.path.join(resolved, name)
        try:
            st = os.lstat(step)
            link = os.readlink(step) if stat.S_ISLNK(st.st_mode) else None
        except OSError:
            link = None  # missing (a new file) or unreadable: taken as named, as realpath does
        if link is None:
            resolved = step
            continue
        followed += 1
        if followed > _MAX_LINKS:
            raise InputError(f"{what}: {text} goes through more than {_MAX_LINKS} symlinks (a "
                             f"loop of links?): name the file itself")
        _may_follow(step, st, resolved, what)
        if step.startswith("/proc/") and link.startswith("/"):  # pipe:[..]: not a name
            _check_proc_link(step, link, what)
        if link.startswith("/"):
            resolved = "/"
        pending.extend(link.split("/")[::-1])
    return Path(resolved)


def _check_proc_link(step: str, link: str, what: str) -> None:
    """InputError unless the /proc link ``step`` (``/proc/self/fd/N``) names its file by a
    path that is that file. The kernel opens such a link as the open file itself, but its
    text is only a description for a file with no name (a ``TemporaryFile``, one removed
    after it was opened: "/tmp/#123 (deleted)", a memfd: "/memfd:x (deleted)"): followed as a
    path, conveyor wrote a new file of that name and left the open file empty."""
    try:
        same = os.path.samefile(step, os.path.join(os.path.dirname(step), link))
    except OSError:
        same = False
    if not same:
        raise InputError(f"{what}: {step} is an open file with no name of its own ({link!r}): "
                         f"conveyor writes a new file and renames it over the name it "
                         f"replaces, so it cannot write into it; name a file")


def _may_follow(link: str, st: os.stat_result, folder: str, what: str) -> None:
    """InputError unless the kernel's ``fs.protected_symlinks`` would follow ``link`` (whose
    lstat is ``st``) in the real folder ``folder``."""
    try:
        held = os.stat(folder)
    except OSError as exc:  # it held the link a moment ago: refuse rather than guess
        raise InputError(f"{what}: cannot look at folder {folder} ({exc.strerror}), which "
                         f"holds the symlink {link}: write elsewhere") from exc
    if (held.st_mode & _SHARED) != _SHARED or st.st_uid in (os.geteuid(), held.st_uid):
        return
    raise InputError(
        f"{what}: {link} is a symlink in {folder}, a sticky folder anyone may write, and its "
        f"owner ({_user(st.st_uid)}) is neither you ({_user(os.geteuid())}) nor the folder's "
        f"owner ({_user(held.st_uid)}): it may have been planted to make conveyor replace a "
        f"file of yours, so it is not followed (Linux's fs.protected_symlinks rule). Write to "
        f"another path, or remove the link if you meant to write there")


def _user(uid: int) -> str:
    """``name, uid N``, or ``uid N`` where the user has no name."""
    try:
        return f"{pwd.getpwuid(uid).pw_name}, uid {uid}"
    except (AttributeError, KeyError):  # no pwd module, or no such user
        return f"uid {uid}"


def same_file(a: PathLike, b: PathLike) -> bool:
    """True if ``a`` and ``b`` name one file (through links, hard links included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        # Joined first: realpath's own getcwd raised a bare FileNotFoundError for a relative
        # name in a removed current folder, naming nothing (joined names the path).
        return os.path.realpath(joined(a)) == os.path.realpath(joined(b))


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


def hold_folder(fd: int, part: Path) -> int | None:
    """A descriptor of the folder ``part`` (open as ``fd``) was made in, checked to hold it,
    for :func:`same_folder` and for removing or renaming the part where the folder went if it
    was moved; None where the platform has no such descriptors (the part named by path)."""
    if not hasattr(os, "O_DIRECTORY") or os.unlink not in os.supports_dir_fd:
        return None  # pragma: no cover
    try:  # O_PATH: a folder this user may write but not list (mode 0o300) opens too
        folder = os.open(part.parent, getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY
                         | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        inside = os.stat(part.name, dir_fd=folder, follow_symlinks=False)
        made = os.fstat(fd)
        held = os.path.samestat(inside, made)
    except OSError:
        held = False
    if not held:
        os.close(folder)
        return None  # moved already, between the part's making and now: named by path
    return folder


def same_folder(folder_fd: int, folder: Path) -> bool:
    """Whether ``folder`` (a path) is still the folder held open as ``folder_fd``."""
    try:
        now, held = os.stat(folder), os.fstat(folder_fd)
    except OSError:
        return False
    return os.path.samestat(now, held)


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
            # O_NONBLOCK: a FIFO planted under a part's name would block the open for ever.
            fd = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
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
            try:
                os.unlink(part)
            except FileNotFoundError:
                continue
            except OSError as exc:  # another user's, say: this run writes a part of its own
                warnings.warn(f"conveyor: could not remove {part}, the temporary file of an "
                              f"earlier run of {target} that did not finish ({exc.strerror})",
                              RuntimeWarning, stacklevel=5)
                continue
            removed.append(part)
            warnings.warn(f"conveyor: removed {part} ({size} bytes), the temporary file of "
                          f"an earlier run of {target} that did not finish",
                          RuntimeWarning, stacklevel=5)  # the caller of cv.stream
        finally:
            os.close(fd)
    return removed


def commit_part(fd: int, part: Path, target: Path, durable: bool = True) -> None:
    """Make ``part`` (open as ``fd``, which this closes) the file ``target``: fsync (when
    ``durable``), the mode of the file it replaces, rename. ``fd`` (its lock) is closed only
    after the rename: another writer of ``target``, removing the parts of dead runs first,
    took an unlocked part for one and deleted it (FileNotFoundError after all the work)."""
    try:
        ready_part(fd, target, durable)
        os.replace(part, target)
    finally:
        os.close(fd)


def ready_part(fd: int, target: Path, durable: bool = True) -> None:
    """Everything of :func:`commit_part` but the rename (which can then hardly fail): fsync
    (when ``durable``), the mode of the file it replaces, and ``target`` checked again in
    case a node took the file's place since the output was opened. A stream readies every
    output before it renames the first, so a refused one leaves the others as they were."""
    if durable:
        os.fsync(fd)
    mode = target_mode(target)
    if not _keep_owner(fd, target):
        # The file's group could not be kept (the user is not in it, or a setgid folder
        # gave another): that group gets no more than others had, so no group gains what
        # only the old one could do (vim's rule for the files it writes anew).
        mode = (mode & 0o707) | ((mode & 0o007) << 3)
    os.fchmod(fd, mode)
    output_target(target, f"output {target}")


def _access(path: Path, mode: int) -> bool:
    """``os.access`` for the effective user (a root process acting as a user with seteuid,
    or a set-uid program), as the writes it predicts are made; the real user's where the
    platform cannot ask."""
    if os.access in os.supports_effective_ids:
        return os.access(path, mode, effective_ids=True)
    return os.access(path, mode)


def _keep_owner(fd: int, target: Path) -> bool:
    """Give the new file the owner (run by root) and the group of the regular file it
    replaces: a user's output rewritten by root became root's, and its user could no longer
    write it. Anyone else cannot give a file away, but keeps its group where allowed. False
    where the group could not be kept (the new file's group is another)."""
    if not hasattr(os, "geteuid"):
        return True
    try:
        st = os.stat(target)
    except OSError:
        return True  # no file replaced: the new one is the user's own
    if not stat.S_ISREG(st.st_mode):
        return True
    # Anyone else keeps the file's group where they belong to it (a group-writable shared
    # file stayed writable by its group, as np.save's write in place keeps it); EPERM where
    # they do not: the new file is theirs, as with any editor.
    owner = st.st_uid if os.geteuid() == 0 else -1
    with contextlib.suppress(OSError):
        os.fchown(fd, owner, st.st_gid)
    return os.fstat(fd).st_gid == st.st_gid


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


def atomic_write(path: PathLike, write: Callable[[IO[Any]], None], durable: bool = True,
                 *, binary: bool = False) -> None:
    """Write a text file (``binary``: bytes) atomically: ``write(handle)`` fills a part file
    beside it (see
    :func:`new_part`), which is fsynced (when ``durable``) and renamed over ``path``, keeping
    its mode. Parts of ``path`` left by killed writers are removed first. A target that
    :func:`output_target` refuses (a planted link, a missing folder, stdout, a FIFO...) is a
    PermissionError with its message (an OSError, as the kernel's EACCES would be: callers of
    a side file warn on OSError, the trace after its stream's work); public callers run
    :func:`output_target` first for an InputError."""
    try:
        target = output_target(path, f"file {path_text(path, 'file')}")
    except InputError as exc:
        raise PermissionError(errno.EACCES, str(exc)) from exc
    remove_stale_parts(target)
    from conveyor.interrupts import deferred_sigint

    fd, part = -1, None  # -1: no descriptor of ours open
    try:
        # Whole under Ctrl-C up to here: one landing in new_part (or as it returned) left a
        # .new or .part file beside the target, and its descriptor open (FileSink.open holds
        # it the same way); held, it is raised inside this try, which removes both.
        with deferred_sigint():
            fd, part = new_part(target)
        try:
            with os.fdopen(os.dup(fd), "wb" if binary else "w") as handle:
                write(handle)
        except BaseException:
            os.close(fd)
            fd = -1
            raise
        held, fd = fd, -1
        commit_part(held, part, target, durable)  # closes it, whatever happens
    except BaseException:
        if fd != -1:
            os.close(fd)
        if part is not None:
            part.unlink(missing_ok=True)
        raise


_umask_lock = threading.Lock()


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (``Umask:`` in
    /proc/self/status, 4.7+). Elsewhere it is set and put back, under a lock: two threads
    doing that at once without one left the umask 0 for good (the second read the first's
    0 and restored it), and every file made after was 0666."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _umask_lock:
        mask = os.umask(0)
        os.umask(mask)
    return mask
