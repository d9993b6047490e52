"""The disk cache of kernel binaries: one file per (device, compiler, options, source).

An entry is ``<key>.bin``: a fixed header (magic ``CVYK``, format version, payload length,
sha256 of the payload, sha256 of the key) and the binary. Beside it, ``<key>-<name digest>.sig``
(same header) holds the parameters of each kernel loaded from it, so a warm build need not
preprocess the source again. The key in the header is checked on
load: an entry renamed or copied under another kernel's name is a miss (with a warning) and is
rebuilt, never run as the other kernel. No pickle: a file is only ever bytes we check. A short,
corrupt or foreign entry is a miss and is deleted, so the next build replaces it. Writes go to a
temporary file in the same directory, are fsynced and ``os.replace``d into place, so a reader
sees either the old entry, the new one or none, and concurrent writers of one key are safe.

An entry is opened ``O_NOFOLLOW | O_NONBLOCK`` and checked on its descriptor: anything but a
regular file under an entry's name (a FIFO, which a plain open would wait on forever, a socket,
a device node, a folder) is a miss with a warning, never read. It is removed where that cannot
touch anything else: a name that is not a folder is unlinked (which never follows it) and an
empty folder is rmdir'ed; a folder with files in it is left alone (conveyor never makes one, so
its contents are someone's, and nothing here recurses into a folder), the warning says to remove
it, and that kernel is rebuilt uncached until it is gone. :meth:`KernelCache.clear_entries`
removes such names by the same rule and reports what it could not remove.

The directory must be the user's own: mode 0700 when conveyor creates it; a symlink, a directory
owned by someone else, one that others may write, or one inside a folder that another user could
rename (cachedir.py has the rule) is refused (one RuntimeWarning per directory) and conveyor runs
uncached, because a binary planted there would run as the user. The checked directory is held
open and every entry is opened relative to it; its owner and mode are checked again before each
use, and a path that no longer names it (the folder was moved or replaced) turns the cache off.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import stat
import struct
import threading
import time
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

# make_private_dirs and refusal are re-exported: buildlock.py checks its lock folder with them.
from conveyor.kernels.cachedir import make_private_dirs as make_private_dirs
from conveyor.kernels.cachedir import open_private_dir, own_refusal
from conveyor.kernels.cachedir import refusal as refusal
from conveyor.kernels.includes import included_headers

if TYPE_CHECKING:
    from conveyor.backends.base import Device

#: Bump when the entry layout or the key's recipe changes: old entries then simply miss.
#: 2: the key covers the contents of headers included from ``-I`` directories.
#: 3: the header holds the sha256 of the entry's key, checked on load.
FORMAT_VERSION = 3
MAGIC = b"CVYK"
# magic, format version (uint32), payload length (uint64), sha256 of the payload, sha256 of
# the key
_HEADER = struct.Struct("<4sIQ32s32s")
HEADER_BYTES = _HEADER.size
_SUFFIX = ".bin"
#: A kernel's parameters as read from its source, beside the binary (``<key>-<name>.sig``).
_SIG_SUFFIX = ".sig"
_TMP_PREFIX = ".tmp-"
#: The names conveyor writes, and the only ones info() counts and clear() removes: a folder
#: given as CONVEYOR_CACHE_DIR may hold the user's own files (``measurements.bin``), which a
#: clear by suffix alone deleted.
_NAMES = {
    _SUFFIX: re.compile(r"[0-9a-f]{64}\.bin"),
    _SIG_SUFFIX: re.compile(r"[0-9a-f]{64}-[0-9a-f]{32}\.sig"),
}
_TMP_NAME = re.compile(r"\.tmp-[0-9a-f]{16}\.(bin|sig)")
#: A temporary file older than this is left over from a crashed writer; clear() removes it.
STALE_TMP_SECONDS = 60.0
#: How entries are opened: never through a symlink (an entry is a plain file we wrote, not a
#: link to somewhere else), and never waiting (a FIFO planted under an entry's name would block
#: a plain open until someone wrote to it: forever).
_ENTRY_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)

_warned_lock = threading.Lock()
_warned_dirs: set[str] = set()


def _warn_read_only(path: Path) -> None:
    """Once per directory per process: a read-only cache is read, and stores nothing."""
    with _warned_lock:
        if f"ro:{path}" in _warned_dirs:
            return
        _warned_dirs.add(f"ro:{path}")
    warnings.warn(
        f"conveyor: kernel cache directory {path} is read-only: the kernels it holds are "
        f"loaded, and kernels built now are not stored (make it writable to keep them)",
        RuntimeWarning, stacklevel=5)


def _warn_once(path: Path, why: str) -> None:
    """One RuntimeWarning per directory per process: a refused cache is news once, not noise."""
    with _warned_lock:
        if str(path) in _warned_dirs:
            return
        _warned_dirs.add(str(path))
    warnings.warn(
        f"conveyor: kernel cache directory {path} {why}; kernels are compiled without a disk "
        f"cache. Fix the directory, or set CONVEYOR_CACHE_DIR to a private directory "
        f"(or CONVEYOR_NO_CACHE=1 to silence this).",
        RuntimeWarning,
        stacklevel=4,
    )


def cache_key(identity: str, options: Sequence[str], source: str,
              forced: Sequence[str] = ()) -> str:
    """The hex sha256 naming the entry for ``source`` built with ``options`` by ``identity``.

    ``identity`` is the device's ``compiler_identity()``. The format version and conveyor's
    version are part of the key, so an upgrade never loads an older conveyor's binaries; so
    are the contents of the headers ``source`` includes from ``-I`` directories
    (``kernels/includes.py``), those of ``options`` and of ``forced``, the options the driver
    adds to every build (``PYOPENCL_BUILD_OPTIONS``, already in ``identity``).
    """
    from conveyor import __version__  # lazy: conveyor/__init__ imports the backends

    # JSON of a list is unambiguous: no two different option lists give the same text.
    header = json.dumps([FORMAT_VERSION, __version__, identity, list(options)])
    digest = hashlib.sha256()
    digest.update(header.encode())
    digest.update(b"\0")
    digest.update(source.encode())
    # A header the source includes from an -I directory is part of what gets compiled: its
    # contents are hashed too, so an edited header misses instead of loading a stale binary.
    for name, path, contents in included_headers(source, [*options, *forced]):
        digest.update(b"\0")
        digest.update(json.dumps([name, path]).encode())
        digest.update(b"\0")
        digest.update(hashlib.sha256(contents).digest() if contents is not None else b"-")
    return digest.hexdigest()


def _signature_key(key: str, name: str) -> str:
    """The key of kernel ``name``'s signature entry beside binary entry ``key``."""
    return f"{key}-{hashlib.sha256(name.encode()).hexdigest()[:32]}"


def _key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def encode_entry(payload: bytes, key: str) -> bytes:
    """The bytes of the entry file of ``key`` holding ``payload``."""
    digest = hashlib.sha256(payload).digest()
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, len(payload), digest, _key_digest(key))
    return header + payload


def _decode(data: bytes, key: str) -> tuple[bytes | None, bool]:
    """(payload or None, whether the entry is whole but was written for another key)."""
    if len(data) < HEADER_BYTES:
        return None, False
    magic, version, length, digest, key_digest = _HEADER.unpack_from(data)
    if magic != MAGIC or version != FORMAT_VERSION or length != len(data) - HEADER_BYTES:
        return None, False
    payload = data[HEADER_BYTES:]
    if hashlib.sha256(payload).digest() != digest:
        return None, False
    if key_digest != _key_digest(key):
        return None, True
    return payload, False


def decode_entry(data: bytes, key: str) -> bytes | None:
    """The payload of entry file contents ``data`` read as the entry of ``key``, or None if
    it is short, corrupt, foreign or written for another key."""
    return _decode(data, key)[0]


def _kind(mode: int) -> str:
    """What a file of ``mode`` is, for messages about names that should be regular files."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _remove(name: str, dir_fd: int) -> None:
    """Remove ``name`` from the directory ``dir_fd`` without following or recursing into it:
    unlink a file, FIFO, socket, device node or symlink (unlink never follows), rmdir a
    folder (only an empty one goes). OSError when it cannot."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        # Linux says EISDIR for a folder, macOS EPERM: ask what it is, not the errno.
        if not stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise
        os.rmdir(name, dir_fd=dir_fd)  # ENOTEMPTY for a folder with files in it: left alone


@dataclass(frozen=True)
class CacheInfo:
    """What a cache directory holds: entry count and their total size in bytes; ``bad``
    counts names of entries that are not regular files (folders, FIFOs, symlinks: never read,
    and removed by :meth:`KernelCache.clear`)."""

    path: Path
    entries: int
    total_bytes: int
    enabled: bool
    bad: int = 0


@dataclass(frozen=True)
class Cleared:
    """What :meth:`KernelCache.clear_entries` did: ``removed`` entries and stale temporary
    files; ``failed``, one "NAME (why)" per name it could not remove; ``refused``, why the
    directory itself was not touched (completes "the directory ..."), or None."""

    removed: int
    failed: tuple[str, ...] = ()
    refused: str | None = None


class KernelCache:
    """A directory of kernel binaries keyed by :func:`cache_key`.

    ``hits``, ``misses``, ``stores`` and ``discarded`` count this object's lookups, writes and
    deleted bad entries (tests and benchmarks read them). The directory is checked and opened
    on first use and held open until :meth:`close`; if it is refused, or later fails its
    checks, the cache stays disabled (``enabled`` is False) for this object, and ``refused``
    says why (it completes "the directory ...", as the warning does).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.hits = 0
        self.misses = 0
        self.stores = 0
        self.discarded = 0
        self.refused: str | None = None
        self._lock = threading.Lock()
        self._usable: bool | None = None
        self._fd: int | None = None
        #: True when the folder is ours but cannot be written: entries are loaded, not stored.
        self.read_only = False
        self._closer: weakref.finalize | None = None

    def __repr__(self) -> str:
        return (
            f"<KernelCache {self.path} hits={self.hits} misses={self.misses} "
            f"stores={self.stores}>"
        )

    def close(self) -> None:
        """Close the held directory; the cache is disabled from then on."""
        with self._lock:
            self._usable = False
            self._fd = None
            if self._closer is not None:
                self._closer()

    def __enter__(self) -> KernelCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the directory ----------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        """True when the directory is usable: created or checked on first use, and checked
        again (owner, mode, what the path names) at every call."""
        return self._dir_fd() is not None

    def removed(self) -> bool:
        """True when the held folder has been deleted (no name links to it any more)."""
        with self._lock:
            fd = self._fd
            try:
                return fd is not None and os.fstat(fd).st_nlink == 0
            except OSError:
                return True

    def _disable(self, why: str) -> None:
        with self._lock:
            self._usable = False
            self.refused = self.refused or why
        _warn_once(self.path, why)

    def _prepare(self) -> bool:
        # Called under self._lock (from _dir_fd), so self.refused is set here directly.
        try:
            make_private_dirs(self.path)
        except OSError as exc:
            self.refused = f"cannot be created ({exc.strerror or exc})"
            _warn_once(self.path, self.refused)
            return False
        # A read-only folder of ours (a cache warmed when an image was built, mounted
        # read-only) is as safe to read as a writable one: its binaries are loaded, and only
        # new builds are not stored.
        fd, why = open_private_dir(self.path, writable=False)
        if fd is None:
            self.refused = why or "is refused"
            _warn_once(self.path, self.refused)
            return False
        self._fd = fd
        self.read_only = not os.access(self.path, os.W_OK | os.X_OK)
        if self.read_only:
            _warn_read_only(self.path)
        # A finalizer, not __del__: the descriptor closes once whether close() or the
        # collector gets there first, and never raises at interpreter shutdown.
        self._closer = weakref.finalize(self, os.close, fd)
        return True

    def _dir_fd(self) -> int | None:
        """The held directory, checked again now: still ours and private, and still the one
        ``path`` names. None (and the cache off, with one warning) when it is not."""
        with self._lock:
            if self._usable is None:
                self._usable = self._prepare()
            fd = self._fd if self._usable else None
        if fd is None:
            return None
        try:
            held = os.fstat(fd)
            why = own_refusal(held)
            if why is None:
                named = os.stat(self.path, follow_symlinks=False)
                if (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
                    why = ("was moved or replaced after conveyor checked it (the path names "
                           "another folder now)")
        except OSError as exc:
            why = f"cannot be checked ({exc.strerror or exc})"
        if why is not None:
            self._disable(why)
            return None
        return fd

    # -- entries ----------------------------------------------------------------------------
    def entry_path(self, key: str) -> Path:
        """The file that holds (or would hold) entry ``key``."""
        return self.path / f"{key}{_SUFFIX}"

    def key(self, device: Device, source: str, options: Sequence[str]) -> str:
        """The key of ``source`` built with ``options`` on ``device``."""
        from conveyor.kernels.build import device_key  # build imports this module

        return device_key(device, options, source)

    def load(self, key: str) -> bytes | None:
        """The binary stored under ``key``, or None on a miss (a bad entry is deleted)."""
        payload = self._read(key, _SUFFIX, binary=True)
        self._count("misses" if payload is None else "hits")
        return payload

    def store(self, key: str, binary: bytes) -> bool:
        """Write ``binary`` under ``key`` atomically; False (and one warning) if it cannot."""
        stored = self._write(key, _SUFFIX, binary)
        if stored:
            self._count("stores")
        return stored

    def load_signature(self, key: str, name: str) -> bytes | None:
        """What :meth:`store_signature` stored for kernel ``name`` of entry ``key``, or None.
        Not counted as a hit or miss: it rides along with the binary's lookup."""
        return self._read(_signature_key(key, name), _SIG_SUFFIX, binary=False)

    def store_signature(self, key: str, name: str, payload: bytes) -> bool:
        """Store kernel ``name``'s parameters (``payload``: signature.py's JSON) beside entry
        ``key``, so a warm build need not preprocess the source again to read them."""
        return self._write(_signature_key(key, name), _SIG_SUFFIX, payload)

    def _read(self, key: str, suffix: str, *, binary: bool) -> bytes | None:
        dir_fd = self._dir_fd()
        if dir_fd is None:
            return None
        try:
            # dir_fd: in the directory we checked, whatever its path names now.
            fd = os.open(f"{key}{suffix}", _ENTRY_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError:
            self._drop(key, suffix)  # a symlink (ELOOP), or unreadable: rebuilt over
            return None
        try:
            # Checked on the descriptor, so it is the file read: a folder would raise
            # IsADirectoryError below, a FIFO or device would give whatever its writer sends.
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self._not_a_file(key, suffix, st.st_mode)
                return None
            with os.fdopen(fd, "rb", closefd=False) as f:
                # The header first, and the rest only where the file is as long as the
                # header says: a huge file under an entry's name (an 8 TiB sparse one raised
                # MemoryError) is a miss, not read whole.
                data = f.read(HEADER_BYTES)
                if len(data) == HEADER_BYTES:
                    length = _HEADER.unpack_from(data)[2]
                    if st.st_size != HEADER_BYTES + length:
                        data = b""
                    else:
                        data += f.read(length + 1)
        except OSError:
            self._drop(key, suffix)
            return None
        finally:
            os.close(fd)
        payload, other_key = _decode(data, key)
        if payload is None:
            if other_key and binary:
                warnings.warn(
                    f"conveyor: kernel cache entry {self.entry_path(key)} holds the binary of "
                    f"another kernel (the key in its header is not its name's: it was renamed "
                    f"or copied there); it is not run, and the kernel is rebuilt",
                    RuntimeWarning,
                    stacklevel=5,
                )
            self._drop(key, suffix)
            return None
        return payload

    def _not_a_file(self, key: str, suffix: str, mode: int) -> None:
        """Warn about, and remove where safe (see the module's docstring), an entry that is
        not a regular file."""
        dir_fd = self._dir_fd()
        name = f"{key}{suffix}"
        try:
            if dir_fd is None:
                raise OSError(errno.EBADF, "the cache directory is off")
            _remove(name, dir_fd)
        except OSError as exc:
            outcome = (f"it could not be removed ({exc.strerror or exc}): remove it yourself; "
                       f"until then this kernel is built without the disk cache")
        else:
            outcome = "it was removed"
            if suffix == _SUFFIX:
                self._count("discarded")
        warnings.warn(
            f"conveyor: kernel cache entry {self.path / name} is {_kind(mode)}, not a file "
            f"conveyor wrote; it is not read, the kernel is rebuilt, and {outcome}",
            RuntimeWarning,
            stacklevel=6,
        )

    def _write(self, key: str, suffix: str, payload: bytes) -> bool:
        dir_fd = self._dir_fd()
        if dir_fd is None or self.read_only:
            return False
        tmp_name: str | None = None
        try:
            tmp_name = f"{_TMP_PREFIX}{secrets.token_hex(8)}{suffix}"
            fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                         | getattr(os, "O_NOFOLLOW", 0), 0o600, dir_fd=dir_fd)
            with os.fdopen(fd, "wb") as f:
                f.write(encode_entry(payload, key))
                f.flush()
                # Durable before visible: a crash must never leave a renamed, half-written entry.
                os.fsync(f.fileno())
            try:
                os.replace(tmp_name, f"{key}{suffix}", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                    raise
                # A folder with files holds the entry's name (_read warned when it found it):
                # this one entry cannot be stored, the rest of the cache works.
                return False
            tmp_name = None
        except OSError as exc:
            self._disable(f"is not writable ({exc.strerror or exc})")
            return False
        finally:
            if tmp_name is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_name, dir_fd=dir_fd)
        return True

    def discard(self, key: str) -> None:
        """Delete entry ``key`` if it exists (a bad entry, so the next build rewrites it)."""
        self._drop(key, _SUFFIX)

    def _drop(self, key: str, suffix: str) -> None:
        """Delete a bad file (a binary is counted in ``discarded``; a signature is not)."""
        dir_fd = self._dir_fd()
        if dir_fd is None:
            return
        try:
            _remove(f"{key}{suffix}", dir_fd)
        except OSError:
            return
        if suffix == _SUFFIX:
            self._count("discarded")

    def info(self) -> CacheInfo:
        """How many entries the directory holds and their total bytes (names of entries that
        are not regular files are counted apart, in ``bad``)."""
        entries = 0
        total = 0
        bad = 0
        dir_fd = self._dir_fd()
        if dir_fd is not None:
            for name in self._entries(dir_fd):
                with contextlib.suppress(OSError):
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    if not stat.S_ISREG(st.st_mode):
                        bad += 1
                        continue
                    total += st.st_size
                    entries += 1
        return CacheInfo(self.path, entries, total, self._usable is True, bad)

    def clear(self) -> int:
        """Delete every entry (and its kernels' signatures), and temporary files older than a
        minute; return the count of entries and temporary files (:meth:`clear_entries` says
        what could not be removed, and why)."""
        return self.clear_entries().removed

    def clear_entries(self) -> Cleared:
        """:meth:`clear`, reporting the names it could not remove and a refused directory.

        Names of entries that are not regular files go too, by the rule of the module's
        docstring: unlinked (never followed), or rmdir'ed when an empty folder; nothing is
        recursed into. The ``locks/`` folder stays (README: removing a lock another process
        waits on would let two builders in at once)."""
        dir_fd = self._dir_fd()
        if dir_fd is None:
            return Cleared(0, refused=self.refused or "is closed (KernelCache.close())")
        failed: list[str] = []

        def remove(name: str) -> bool:
            try:
                _remove(name, dir_fd)
            except FileNotFoundError:
                return False  # another process cleared it first
            except OSError as exc:
                failed.append(f"{name} ({exc.strerror or exc})")
                return False
            return True

        for name in self._entries(dir_fd, _SIG_SUFFIX):  # signatures go with their entries
            remove(name)
        removed = sum(remove(name) for name in self._entries(dir_fd))
        cutoff = time.time() - STALE_TMP_SECONDS
        # A younger temporary file may belong to a writer that is still running: leave it.
        for name in os.listdir(dir_fd):
            if not _TMP_NAME.fullmatch(name):
                continue
            with contextlib.suppress(OSError):
                if os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mtime < cutoff:
                    removed += remove(name)
        return Cleared(removed, tuple(failed))

    def _entries(self, dir_fd: int, suffix: str = _SUFFIX) -> list[str]:
        """The names of the directory's entries (or signatures) as conveyor names them."""
        pattern = _NAMES[suffix]
        return [name for name in os.listdir(dir_fd) if pattern.fullmatch(name)]

    def _count(self, counter: str) -> None:
        with self._lock:
            setattr(self, counter, getattr(self, counter) + 1)

