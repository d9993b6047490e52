"""The disk cache of kernel binaries: one file per (device, compiler, options, source).

An entry is ``<key>.bin``: a fixed header (magic ``CVYK``, format version, payload length,
sha256 of the payload) and the binary. No pickle: a file is only ever bytes we check. A short,
corrupt or foreign entry is a miss and is deleted, so the next build replaces it. Writes go to a
temporary file in the same directory, are fsynced and ``os.replace``d into place, so a reader
sees either the old entry, the new one or none, and concurrent writers of one key are safe.

The directory must be the user's own: mode 0700 when conveyor creates it; a symlink, a directory
owned by someone else, or one that others may write is refused (one RuntimeWarning per
directory) and conveyor runs uncached, because a binary planted there would run as the user.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import struct
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conveyor.backends.base import Device

#: Bump when the entry layout or the key's recipe changes: old entries then simply miss.
#: 2: the key covers the contents of headers included from ``-I`` directories.
FORMAT_VERSION = 2
MAGIC = b"CVYK"
# magic, format version (uint32), payload length (uint64), sha256 of the payload
_HEADER = struct.Struct("<4sIQ32s")
HEADER_BYTES = _HEADER.size
_SUFFIX = ".bin"
_TMP_PREFIX = ".tmp-"
#: A temporary file older than this is left over from a crashed writer; clear() removes it.
STALE_TMP_SECONDS = 60.0

_warned_lock = threading.Lock()
_warned_dirs: set[str] = set()


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


def cache_key(identity: str, options: Sequence[str], source: str) -> str:
    """The hex sha256 naming the entry for ``source`` built with ``options`` by ``identity``.

    ``identity`` is the device's ``compiler_identity()``. The format version and conveyor's
    version are part of the key, so an upgrade never loads an older conveyor's binaries; so
    are the contents of the headers ``source`` includes from ``-I`` directories
    (:func:`included_headers`).
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
    for name, path, contents in included_headers(source, options):
        digest.update(b"\0")
        digest.update(json.dumps([name, path]).encode())
        digest.update(b"\0")
        digest.update(hashlib.sha256(contents).digest() if contents is not None else b"-")
    return digest.hexdigest()


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


def encode_entry(payload: bytes) -> bytes:
    """The bytes of an entry file holding ``payload``."""
    digest = hashlib.sha256(payload).digest()
    return _HEADER.pack(MAGIC, FORMAT_VERSION, len(payload), digest) + payload


def decode_entry(data: bytes) -> bytes | None:
    """The payload of entry file contents ``data``, or None if it is short, corrupt or foreign."""
    if len(data) < HEADER_BYTES:
        return None
    magic, version, length, digest = _HEADER.unpack_from(data)
    if magic != MAGIC or version != FORMAT_VERSION or length != len(data) - HEADER_BYTES:
        return None
    payload = data[HEADER_BYTES:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    return payload


@dataclass(frozen=True)
class CacheInfo:
    """What a cache directory holds: entry count and their total size in bytes."""

    path: Path
    entries: int
    total_bytes: int
    enabled: bool


class KernelCache:
    """A directory of kernel binaries keyed by :func:`cache_key`.

    ``hits``, ``misses``, ``stores`` and ``discarded`` count this object's lookups, writes and
    deleted bad entries (tests and benchmarks read them). The directory is checked on first
    use; if it is refused the cache stays disabled (``enabled`` is False) for this object.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.hits = 0
        self.misses = 0
        self.stores = 0
        self.discarded = 0
        self._lock = threading.Lock()
        self._usable: bool | None = None

    def __repr__(self) -> str:
        return (
            f"<KernelCache {self.path} hits={self.hits} misses={self.misses} "
            f"stores={self.stores}>"
        )

    # -- the directory ----------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        """True when the directory is usable (created or checked now, on first use)."""
        with self._lock:
            if self._usable is None:
                self._usable = self._prepare()
            return self._usable

    def _disable(self, why: str) -> None:
        with self._lock:
            self._usable = False
        _warn_once(self.path, why)

    def _prepare(self) -> bool:
        try:
            make_private_dirs(self.path)
        except OSError as exc:
            _warn_once(self.path, f"cannot be created ({exc.strerror or exc})")
            return False
        why = refusal(self.path)
        if why is not None:
            _warn_once(self.path, why)
            return False
        return True

    # -- entries ----------------------------------------------------------------------------
    def entry_path(self, key: str) -> Path:
        """The file that holds (or would hold) entry ``key``."""
        return self.path / f"{key}{_SUFFIX}"

    def key(self, device: Device, source: str, options: Sequence[str]) -> str:
        """The key of ``source`` built with ``options`` on ``device``."""
        from conveyor.kernels.build import build_identity  # build imports this module

        return cache_key(build_identity(device), options, source)

    def load(self, key: str) -> bytes | None:
        """The binary stored under ``key``, or None on a miss (a bad entry is deleted)."""
        if not self.enabled:
            self._count("misses")
            return None
        entry = self.entry_path(key)
        try:
            # O_NOFOLLOW: an entry is a plain file we wrote, never a link to somewhere else.
            fd = os.open(entry, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            self._count("misses")
            return None
        except OSError:
            self.discard(key)
            self._count("misses")
            return None
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        payload = decode_entry(data)
        if payload is None:
            self.discard(key)
            self._count("misses")
            return None
        self._count("hits")
        return payload

    def store(self, key: str, binary: bytes) -> bool:
        """Write ``binary`` under ``key`` atomically; False (and one warning) if it cannot."""
        if not self.enabled:
            return False
        tmp_name: str | None = None
        try:
            fd, tmp_name = tempfile.mkstemp(dir=self.path, prefix=_TMP_PREFIX, suffix=_SUFFIX)
            with os.fdopen(fd, "wb") as f:
                f.write(encode_entry(binary))
                f.flush()
                # Durable before visible: a crash must never leave a renamed, half-written entry.
                os.fsync(f.fileno())
            os.replace(tmp_name, self.entry_path(key))
            tmp_name = None
        except OSError as exc:
            self._disable(f"is not writable ({exc.strerror or exc})")
            return False
        finally:
            if tmp_name is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_name)
        self._count("stores")
        return True

    def discard(self, key: str) -> None:
        """Delete entry ``key`` if it exists (a bad entry, so the next build rewrites it)."""
        try:
            os.unlink(self.entry_path(key))
        except FileNotFoundError:
            return
        except OSError:
            return
        self._count("discarded")

    def info(self) -> CacheInfo:
        """How many entries the directory holds and their total bytes."""
        entries = 0
        total = 0
        if self.enabled:
            for entry in self._entries():
                with contextlib.suppress(OSError):
                    total += entry.stat().st_size
                    entries += 1
        return CacheInfo(self.path, entries, total, self._usable is True)

    def clear(self) -> int:
        """Delete every entry, and temporary files older than a minute; return the count."""
        if not self.enabled:
            return 0
        removed = 0
        for entry in self._entries():
            with contextlib.suppress(OSError):
                entry.unlink()
                removed += 1
        cutoff = time.time() - STALE_TMP_SECONDS
        # A younger temporary file may belong to a writer that is still running: leave it.
        for tmp in self.path.glob(f"{_TMP_PREFIX}*"):
            with contextlib.suppress(OSError):
                if tmp.lstat().st_mtime < cutoff:
                    tmp.unlink()
                    removed += 1
        return removed

    def _entries(self) -> list[Path]:
        return [p for p in self.path.glob(f"*{_SUFFIX}") if not p.name.startswith(_TMP_PREFIX)]

    def _count(self, counter: str) -> None:
        with self._lock:
            setattr(self, counter, getattr(self, counter) + 1)


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
        os.chmod(directory, 0o700)


def refusal(path: Path) -> str | None:
    """Why ``path`` must not hold binaries we will run, or None when it is fine."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link (refused: it could point anywhere)"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        mode = stat.S_IMODE(st.st_mode)
        return f"is writable by group or others (mode {mode:04o}; run chmod 700 on it)"
    if not os.access(path, os.W_OK | os.X_OK):
        return "is not writable"
    return None
