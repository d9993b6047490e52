"""The link ceiling of a device: pinned copy bandwidth measured once and cached as JSON.

``conveyor devices --measure`` measures it and stores it with :func:`save_link_ceiling`; a
report reads it with :func:`link_ceiling` to give its rates as a ratio to the ceiling. The file
is ``<cache dir>/link-bandwidth.json`` (the kernel cache's directory)::

    {"format": 1,
     "devices": {"cuda:0|NVIDIA H200": {"pinned_h2d_gbps": 55.5, "pinned_d2h_gbps": 55.1,
                                        "pinned_both_gbps": 101.7, "measured_at": "..."}}}

Keys are the device spec and name, so a cache carried to another machine does not apply a
ceiling to a different device. Reading is tolerant: no file, an unreadable or malformed one,
or a device missing from it all mean "ceiling unknown" (None), never an error.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor import config
from conveyor.errors import ConveyorError, InputError
from conveyor.files import atomic_write

FILE_NAME = "link-bandwidth.json"
FORMAT = 1
_H2D_KEYS = ("pinned_h2d_gbps", "h2d_gbps", "h2d")
_D2H_KEYS = ("pinned_d2h_gbps", "d2h_gbps", "d2h")


@dataclass(frozen=True)
class LinkCeiling:
    """Measured pinned copy bandwidth of one device, in GB/s (1e9 bytes/s) each way."""

    h2d_gbps: float | None
    d2h_gbps: float | None


def device_key(spec: str, name: str) -> str:
    """The key of a device in the cache file."""
    return f"{spec}|{name}"


def ceiling_path(cache_dir: Path | None = None) -> Path | None:
    """Where the ceiling file lives (None when the cache directory is misconfigured)."""
    if cache_dir is not None:
        return cache_dir / FILE_NAME
    try:
        return config.cache_dir() / FILE_NAME
    except ConveyorError:
        return None


def _number(entry: dict[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = entry.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        try:
            figure = float(value)
        except OverflowError:  # an integer of 400 digits: past every float, as 1e999 is
            continue
        # json reads Infinity, NaN and 1e999 (inf): no measured figure, so no ceiling.
        if figure > 0 and math.isfinite(figure):
            return figure
    return None


def _read(path: Path) -> Any:
    """The JSON document in ``path``; None when it cannot be read or parsed (nesting too deep
    for the parser included: json raises RecursionError, no ValueError, for it)."""
    try:
        # Non-blocking, and only a regular file of at most 1 MiB: a FIFO put in its place
        # hung every str(report), and a link to /dev/zero would read until memory ran out.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > 1 << 20:
            return None
        with os.fdopen(os.dup(fd), "rb") as handle:
            return json.loads(handle.read(1 << 20).decode())
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)


def link_ceiling(spec: str, name: str, cache_dir: Path | None = None) -> LinkCeiling | None:
    """The cached ceiling of device ``spec``/``name``, or None when it is not known."""
    path = ceiling_path(cache_dir)
    if path is None:
        return None
    from conveyor.kernels.cachedir import refusal

    if refusal(path.parent) is not None:
        # A folder the kernel cache refuses (others may write it, a link, another owner):
        # a figure planted there would change every report's ratios, so none is read.
        return None
    document = _read(path)
    devices = document.get("devices") if isinstance(document, dict) else None
    if not isinstance(devices, dict):
        return None
    entry = devices.get(device_key(spec, name))
    if not isinstance(entry, dict):
        return None
    found = LinkCeiling(_number(entry, _H2D_KEYS), _number(entry, _D2H_KEYS))
    return found if found.h2d_gbps or found.d2h_gbps else None


def save_link_ceiling(spec: str, name: str, figures: dict[str, float],
                      cache_dir: Path | None = None) -> Path:
    """Store measured ``figures`` (e.g. ``pinned_h2d_gbps``, ``pinned_d2h_gbps``) for the
    device, keeping other devices' entries; written atomically. Returns the file's path.
    Raises InputError when the cache directory is misconfigured, OSError when unwritable."""
    path = cache_dir / FILE_NAME if cache_dir is not None else config.cache_dir() / FILE_NAME
    from conveyor.kernels.cachedir import refusal

    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:  # mkdir's "[Errno 17] File exists" said nothing of a file
        raise InputError(f"the cache folder {path.parent} is a file, not a folder: set "
                         f"CONVEYOR_CACHE_DIR to a folder") from None
    why = refusal(path.parent)
    if why is not None:  # load_link_ceiling would never read it back: say so now
        raise InputError(f"the cache folder {path.parent} {why}: set CONVEYOR_CACHE_DIR to "
                         f"a private folder")
    document = _read(path)
    devices = document.get("devices") if isinstance(document, dict) else None
    if not isinstance(devices, dict):
        devices = {}
    # Infinity or NaN (a copy timed at zero) would make the file no standard JSON.
    entry: dict[str, Any] = {key: float(value) for key, value in figures.items()
                             if math.isfinite(value)}
    entry["measured_at"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    devices[device_key(spec, name)] = entry
    document = {"format": FORMAT, "devices": devices}
    atomic_write(path, lambda handle: json.dump(document, handle, indent=1))
    return path
