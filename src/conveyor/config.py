"""Configuration read from the environment, in one place, parsed strictly.

Nothing else in conveyor reads ``os.environ``: callers get values from here and pass them down.
An unset variable means the default; a set but malformed one is an :class:`InputError` that names
the variable.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from conveyor.errors import InputError

DEVICE_VAR = "CONVEYOR_DEVICE"
CACHE_DIR_VAR = "CONVEYOR_CACHE_DIR"
NO_CACHE_VAR = "CONVEYOR_NO_CACHE"
STRICT_VAR = "CONVEYOR_STRICT"
ICD_VENDORS_VAR = "OCL_ICD_VENDORS"
#: PyOpenCL appends this variable's words to every build's options (outside conveyor's control):
#: the kernel cache key must cover it, or a binary built under it is served to runs without it.
PYOPENCL_BUILD_OPTIONS_VAR = "PYOPENCL_BUILD_OPTIONS"
# gpu, cpu, cuda, opencl, cuda:N, opencl:P, opencl:P:D (the specs backends.device() takes)
_DEVICE_SPEC = re.compile(r"(gpu|cpu|cuda|opencl)|cuda:\d+|opencl:\d+(:\d+)?")


def _get(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def default_device_spec() -> str | None:
    """The device spec in ``CONVEYOR_DEVICE``, or None when unset; InputError (naming the
    variable) when it is not a device spec at all."""
    value = _get(DEVICE_VAR)
    if value is not None and not _DEVICE_SPEC.fullmatch(value.lower()):
        raise InputError(
            f"{DEVICE_VAR}={value!r} is not a device spec: use cuda, cuda:1, opencl, "
            f"opencl:0:1, gpu or cpu (conveyor devices lists them)"
        )
    return value


def pyopencl_build_options() -> str:
    """The words PyOpenCL adds to every OpenCL build (``PYOPENCL_BUILD_OPTIONS``), or ''."""
    return _get(PYOPENCL_BUILD_OPTIONS_VAR) or ""


def parse_bool(name: str, value: str | None, default: bool) -> bool:
    """Parse a boolean environment value strictly: 1/0, true/false, yes/no, on/off."""
    if value is None:
        return default
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise InputError(f"{name}={value!r} is not a boolean: use 1 or 0")


def cache_disabled() -> bool:
    """True when ``CONVEYOR_NO_CACHE`` asks for no kernel cache."""
    return parse_bool(NO_CACHE_VAR, _get(NO_CACHE_VAR), False)


def strict_mode() -> bool:
    """True when ``CONVEYOR_STRICT`` asks streams to raise on hot-path hazards (default off:
    they warn once)."""
    return parse_bool(STRICT_VAR, _get(STRICT_VAR), False)


def cache_dir() -> Path:
    """The kernel cache directory: ``CONVEYOR_CACHE_DIR``, else the user's cache dir."""
    override = _get(CACHE_DIR_VAR)
    if override is not None:
        path = Path(override).expanduser()
        if not path.is_absolute():
            raise InputError(f"{CACHE_DIR_VAR}={override!r} must be an absolute path")
        return path
    xdg = _get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "conveyor"


def icd_vendor_dirs() -> list[Path]:
    """Where the OpenCL ICD loader looks for ``*.icd`` files: ``OCL_ICD_VENDORS`` (a folder,
    or one .icd file) when set, and always /etc/OpenCL/vendors."""
    dirs = [Path("/etc/OpenCL/vendors")]
    override = _get(ICD_VENDORS_VAR)
    if override is not None:
        dirs.insert(0, Path(override))
    return dirs
