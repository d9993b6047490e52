"""Configuration read from the environment, in one place, parsed strictly.

Nothing else in conveyor reads ``os.environ``: callers get values from here and pass them down.
An unset variable means the default; a set but malformed one is an :class:`InputError` that names
the variable.
"""

from __future__ import annotations

import os
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

from conveyor.errors import InputError

DEVICE_VAR = "CONVEYOR_DEVICE"
CACHE_DIR_VAR = "CONVEYOR_CACHE_DIR"
NO_CACHE_VAR = "CONVEYOR_NO_CACHE"
STRICT_VAR = "CONVEYOR_STRICT"
#: Most idle bytes each memory pool keeps between streams (a size: 512MiB, 2GiB, 0); unset:
#: what the last stream used (memory/pool.py).
POOL_KEEP_VAR = "CONVEYOR_POOL_KEEP"
#: How fresh outputs are faulted in ahead of the stage-out: off (default: it measured slower on
#: an H100 host), madvise, touch (memory/prefault.py).
PREFAULT_VAR = "CONVEYOR_PREFAULT"
#: How pinned staging memory is allocated on CUDA and NVIDIA's OpenCL: register (the default:
#: anonymous memory faulted in parallel, then page-locked by cuMemHostRegister or a
#: USE_HOST_PTR buffer: a faster first allocation, warm streams the same) or driver
#: (cuMemHostAlloc, ALLOC_HOST_PTR).
PINNED_ALLOC_VAR = "CONVEYOR_PINNED_ALLOC"
#: 0 allocates a staging ring whole before the first block; 1 (default) grows it beside the
#: stream (pipeline/ring.py).
RING_GROW_VAR = "CONVEYOR_RING_GROW"
#: Pinned bytes a device's warm-up puts in its pool for the first stream (a size of at least
#: one 64 MiB block, per device; 0 or off: no warm-up thread at all; unset or on: up to 1 GiB
#: per device, at most host memory / 16 for all together) (memory/warmup.py).
WARMUP_VAR = "CONVEYOR_WARMUP"
#: The least CONVEYOR_WARMUP may ask for (but 0): one staging block of the planner's default
#: size (pipeline/plan.py DEFAULT_BLOCK_BYTES; a test keeps the two equal).
WARMUP_MIN_BYTES = 64 * 2**20
#: Most host bytes that arrays kept with cv.keep_pinned hold page-locked (memory/keep.py).
PINNED_BUDGET_VAR = "CONVEYOR_PINNED_BUDGET"
#: "auto" (default): pinned memory and staging threads on each GPU's NUMA node; "off".
NUMA_VAR = "CONVEYOR_NUMA"
#: Python's thread switch interval while a stream runs: a duration (0.5ms, the default; 100us,
#: 0.001s) or off (pipeline/switching.py).
SWITCH_INTERVAL_VAR = "CONVEYOR_SWITCH_INTERVAL"
DEFAULT_SWITCH_INTERVAL = 0.0005
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(s|ms|us)", re.IGNORECASE | re.ASCII)
_DURATION_PER_SECOND = {"s": 1.0, "ms": 1e3, "us": 1e6}  # divide: 100us is 100 µs exactly
ICD_VENDORS_VAR = "OCL_ICD_VENDORS"
#: PyOpenCL appends this variable's words to every build's options (outside conveyor's control):
#: the kernel cache key must cover it, or a binary built under it is served to runs without it.
PYOPENCL_BUILD_OPTIONS_VAR = "PYOPENCL_BUILD_OPTIONS"
# gpu, cpu, cuda, opencl, cuda:N, opencl:P, opencl:P:D (the specs backends.device() takes)
_DEVICE_SPEC = re.compile(r"(gpu|cpu|cuda|opencl)|cuda:\d+|opencl:\d+(:\d+)?", re.ASCII)
# A size: a number, then optional unit; KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB of 1024
# (a bare K/M/G/T is refused: it means either).
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(?:e(\d+))?\s*([a-z]*)", re.IGNORECASE | re.ASCII)
#: Digits a size may have before its unit: 10**30 bytes is more than any machine holds; and
#: the cap keeps "1e999999999" from building a billion-digit integer (minutes of CPU).
_SIZE_DIGITS = 30
_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
}
SIZE_FORMS = ("bytes as an int, or a string like '512MiB', '2GiB', '1.5GB' (B, KiB, MiB, "
              "GiB, TiB, PiB = powers of 1024; KB, MB, GB, TB, PB = powers of 1000)")


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
    """The words PyOpenCL adds to every OpenCL build (``PYOPENCL_BUILD_OPTIONS``), or ''.
    InputError where they are not UTF-8 (PyOpenCL's build would fail encoding them)."""
    value = _get(PYOPENCL_BUILD_OPTIONS_VAR) or ""
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InputError(f"{PYOPENCL_BUILD_OPTIONS_VAR}={value!r} holds bytes that are not "
                         f"UTF-8, which PyOpenCL cannot pass to a build: write the options "
                         f"in UTF-8, or unset it") from None
    return value


#: Variables of OpenCL drivers that only log, trace, place threads or name a cache: they do
#: not change what a build makes. Every other ``POCL_*`` variable may (``POCL_EXTRA_BUILD_FLAGS``
#: adds options to every build; others pick the target CPU or the work-group code).
_DRIVER_VARS_NOT_BUILDS = frozenset({
    "POCL_DEBUG", "POCL_DEBUG_LLVM_PASSES", "POCL_CACHE_DIR", "POCL_KERNEL_CACHE",
    "POCL_TRACING", "POCL_TRACING_OPT", "POCL_TRACING_FILTER", "POCL_AFFINITY",
    "POCL_MAX_PTHREAD_COUNT", "POCL_STARTUP_DELAY", "POCL_LEAVE_KERNEL_COMPILER_TEMP_FILES",
    "POCL_VECTORIZER_REMARKS", "POCL_IMPLICIT_FINISH", "POCL_MEMORY_LIMIT",
})
#: Variables other OpenCL drivers read to add options to every build.
_DRIVER_BUILD_VARS = ("AMD_OCL_BUILD_OPTIONS", "AMD_OCL_BUILD_OPTIONS_APPEND")


def driver_build_variables() -> tuple[tuple[str, str], ...]:
    """The environment variables, set now, through which an OpenCL driver may build the same
    source into other code (``POCL_EXTRA_BUILD_FLAGS``, ``AMD_OCL_BUILD_OPTIONS``...), as
    sorted ``(name, value)`` pairs: the kernel cache's key takes them, so a binary built under
    one is never served to a run without it. InputError where they differ from what
    :func:`note_driver_variables` first took."""
    found = _driver_variables_now()
    global _first_driver_variables
    if _first_driver_variables is None:
        _first_driver_variables = found
    elif found != _first_driver_variables:
        # PoCL reads them once (at a library's first build) and keeps them: a binary built
        # after a change would hold the old flags under a key naming the new ones (a
        # later build with -DFACTOR=6 came out x5 once POCL_EXTRA_BUILD_FLAGS had been set).
        then, now = dict(_first_driver_variables), dict(found)
        name = next(n for n in sorted({*then, *now}) if then.get(n) != now.get(n))
        raise InputError(
            f"{name} is {now.get(name, 'unset')!r} now but was {then.get(name, 'unset')!r} "
            f"when this process first used OpenCL (or built a kernel): PoCL keeps a value it "
            f"has seen for the rest of the process, so builds would not follow every change; "
            f"set it before the process starts (start a new one to change it)")
    return found


#: The drivers' build variables as this process's first build saw them.
_first_driver_variables: tuple[tuple[str, str], ...] | None = None


def note_driver_variables() -> None:
    """Take the drivers' build variables as set now for the ones this process's builds have,
    where nothing has taken them yet: when conveyor first lists OpenCL devices. A build of
    anyone's after that (PyOpenCL's elementwise code in a callable: ``a * 2``) is PoCL's
    first, and PoCL keeps what it saw: a variable unset after such a build, before conveyor's
    own first build, made every kernel of the process come out with its flags (x5 for a
    source of x3), and the cache kept them under a key naming no variable."""
    global _first_driver_variables
    if _first_driver_variables is None:
        _first_driver_variables = _driver_variables_now()


def _driver_variables_now() -> tuple[tuple[str, str], ...]:
    return tuple(sorted(
        (name, value) for name, value in os.environ.items()
        if (name.startswith("POCL_") and name not in _DRIVER_VARS_NOT_BUILDS)
        or name in _DRIVER_BUILD_VARS))


def driver_cache_home() -> str | None:
    """The folder PyOpenCL (through platformdirs) and PoCL keep their caches under, as they
    read it: ``XDG_CACHE_HOME`` as given (a relative one included), else ``~/.cache``
    (``HOME``, else the password database); None where there is no home at all."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg.strip():
        return xdg
    home = os.path.expanduser("~")
    return None if home == "~" or not home else os.path.join(home, ".cache")


def pocl_devices() -> str | None:
    """``POCL_DEVICES``: the kinds of device PoCL lists (``cpu``, ``pthread``...), or None."""
    value = os.environ.get("POCL_DEVICES", "").strip()
    return value or None


def pocl_cache_dir_set() -> bool:
    """Whether ``POCL_CACHE_DIR`` names PoCL's cache folder (PoCL's own setting, kept)."""
    return bool(os.environ.get("POCL_CACHE_DIR", "").strip())


def set_pocl_cache_dir(path: Path) -> None:
    """Point PoCL's cache at ``path`` for this process: PoCL reads ``POCL_CACHE_DIR`` when it
    starts (backends/drivercaches.py says when conveyor does this)."""
    os.environ["POCL_CACHE_DIR"] = str(path)


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


def flag(name: str, value: object) -> bool:
    """``value`` as a bool: True or False (a NumPy bool too); InputError for anything else,
    since ``bool()`` would take ``"off"``, ``"no"`` or a callback for True."""
    numpy_bool = (type(value).__module__ == "numpy"
                  and type(value).__name__ in ("bool", "bool_"))  # not imported here
    if isinstance(value, bool) or numpy_bool:
        return bool(value)
    raise InputError(f"{name}={value!r}: {name} takes True or False")


def check_ordered(value: object, what: str) -> None:
    """InputError when ``value``, given as a shape, is a set or a mapping: iterating it gives
    no order of axes (a set's own order, a dict's keys), which NumPy refuses too."""
    from collections.abc import Mapping, Set

    if isinstance(value, Set | Mapping):
        raise InputError(f"{what}: shape={value!r} is a {type(value).__name__}, which has no "
                         f"order of axes: give a tuple, e.g. (2, 8)")


def dtype_of(value: object, what: str) -> Any:
    """``np.dtype(value)``; InputError naming ``what`` for anything NumPy cannot make one of:
    it raises TypeError, ValueError or SyntaxError ("f4,(") by the kind of text."""
    import numpy as np

    try:
        return np.dtype(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, SyntaxError) as exc:
        raise InputError(f"{what}: {value!r} is not a NumPy dtype ({exc}): give one such as "
                         f"np.float32 or 'f4'") from None


def parse_size(name: str, value: str) -> int:
    """Bytes in a size string such as "512MiB", "1.5GB", "4096" or "1e5"; InputError naming
    ``name`` for anything else (a bare K/M/G/T, a fraction of a byte, a negative size)."""
    match = _SIZE.fullmatch(value.strip())
    unit = match.group(3).lower() if match else ""
    negative = _SIZE.fullmatch(value.strip()[1:]) if value.strip()[:1] == "-" else None
    if negative is not None and negative.group(3).lower() in _SIZE_UNITS:
        if not parse_size(name, value.strip()[1:]):
            return 0  # "-0" is zero, not negative: what takes no 0 says so itself
        raise InputError(f"{name}={value!r} is negative: give a size such as "
                         f"'64MiB'")
    if match is None or unit not in _SIZE_UNITS:
        raise InputError(f"{name}={value!r} is not a size: use {SIZE_FORMS}")
    whole, _, fraction = match.group(1).partition(".")
    whole, fraction = whole.lstrip("0"), fraction.rstrip("0")
    exponent = (match.group(2) or "0").lstrip("0") or "0"
    if len(exponent) > 2 or len(whole) + int(exponent) > _SIZE_DIGITS:
        raise InputError(f"{name}={value!r} is larger than any memory (10**"
                         f"{_SIZE_DIGITS} bytes or more): use {SIZE_FORMS}")
    if len(fraction) > 60:  # Python refuses int() of 4,300 digits or more
        raise InputError(f"{name}={value!r} has more digits after its point than any size "
                         f"needs: use {SIZE_FORMS}")
    number = (Fraction(f"{whole or 0}.{fraction or 0}") * 10 ** int(exponent)
              * _SIZE_UNITS[unit])
    if number.denominator != 1:
        raise InputError(f"{name}={value!r} is not a whole number of bytes: use {SIZE_FORMS}")
    return check_size_cap(name, value, int(number))


def check_size_cap(name: str, value: object, number: int) -> int:
    """``number`` (bytes); InputError naming ``name`` when it is 10**30 or more, the cap a
    size string's digits have, whatever its unit or form (an int, '...GiB')."""
    if number >= 10**_SIZE_DIGITS:
        raise InputError(f"{name}={value!r} is larger than any memory (10**"
                         f"{_SIZE_DIGITS} bytes or more): use {SIZE_FORMS}")
    return number


def pool_keep() -> int | None:
    """Idle bytes a memory pool keeps between streams (``CONVEYOR_POOL_KEEP``, a size), or
    None when unset: then each pool keeps what the last stream used."""
    value = _get(POOL_KEEP_VAR)
    return None if value is None else parse_size(POOL_KEEP_VAR, value)


def prefault_mode() -> str:
    """``CONVEYOR_PREFAULT``: "off" (default), "madvise", or "touch" (the fallback,
    forced)."""
    return _choice(PREFAULT_VAR, ("off", "madvise", "touch"))


def pinned_alloc_mode() -> str:
    """``CONVEYOR_PINNED_ALLOC``: "register" (default) or "driver" (CUDA, NVIDIA's OpenCL)."""
    return _choice(PINNED_ALLOC_VAR, ("register", "driver"))


def pinned_budget() -> int | None:
    """``CONVEYOR_PINNED_BUDGET`` (a size), or None when unset."""
    value = _get(PINNED_BUDGET_VAR)
    return None if value is None else parse_size(PINNED_BUDGET_VAR, value)


def numa_mode() -> str:
    """``CONVEYOR_NUMA``: "auto" (default: memory/numa.py places pinned memory and staging
    threads on each device's node where the host has several) or "off"."""
    return _choice(NUMA_VAR, ("auto", "off"))


def ring_grow() -> bool:
    """``CONVEYOR_RING_GROW`` (default on): staging rings grow beside the stream."""
    return parse_bool(RING_GROW_VAR, _get(RING_GROW_VAR), True)


def warmup_bytes() -> int | None:
    """``CONVEYOR_WARMUP``: the pinned bytes a device's warm-up allocates ahead (0 for none;
    ``off``/``no``/``false`` read as 0), or None when unset or ``on``/``yes``/``true`` (the
    warm-up's own default)."""
    value = _get(WARMUP_VAR)
    if value is None or value.lower() in ("on", "yes", "true"):
        return None
    if value.lower() in ("off", "no", "false"):
        return 0
    size = parse_size(WARMUP_VAR, value)
    if 0 < size < WARMUP_MIN_BYTES:
        raise InputError(
            f"{WARMUP_VAR}={value!r} is less than one {WARMUP_MIN_BYTES >> 20} MiB staging "
            f"block: use a size such as 512MiB, 'on' for the default, or 'off'")
    return size


def check_all() -> None:
    """Read every ``CONVEYOR_*`` setting a stream may use: InputError naming the first one
    that is malformed, wherever (or whether) a stream would read it."""
    for reader in (pool_keep, warmup_bytes, prefault_mode, pinned_alloc_mode, pinned_budget,
                   numa_mode, ring_grow, switch_interval, strict_mode, cache_disabled):
        reader()


def switch_interval() -> float | None:
    """``CONVEYOR_SWITCH_INTERVAL``: seconds Python may run one thread before switching while
    a stream runs (default 0.5 ms), or None for ``off`` (Python's own interval stays)."""
    value = _get(SWITCH_INTERVAL_VAR)
    if value is None:
        return DEFAULT_SWITCH_INTERVAL
    if value.strip().lower() in ("off", "no", "false"):
        return None
    found = _DURATION.fullmatch(value.strip())
    seconds = float(found.group(1)) / _DURATION_PER_SECOND[found.group(2).lower()] if found else 0.0
    if not 1e-6 <= seconds <= 1.0:
        raise InputError(f"{SWITCH_INTERVAL_VAR}={value!r}: give a duration from 1us to 1s, "
                         f"such as 0.5ms or 100us, or off")
    return seconds


def _choice(name: str, allowed: tuple[str, ...]) -> str:
    value = _get(name)
    if value is None:
        return allowed[0]
    if value.lower() not in allowed:
        raise InputError(f"{name}={value!r}: use one of {', '.join(allowed)}")
    return value.lower()


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
        try:
            path = _expand_home(Path(override))
        except (RuntimeError, NoHomeError) as exc:  # "~nosuchuser/x", or no home at all
            raise InputError(f"{CACHE_DIR_VAR}={override!r}: its ~ names no home directory "
                             f"here ({exc}): give an absolute path") from None
        if not path.is_absolute():
            raise InputError(f"{CACHE_DIR_VAR}={override!r} must be an absolute path")
        return path
    xdg = _get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else _home() / ".cache"
    return base / "conveyor"


def _expand_home(path: Path) -> Path:
    """``path`` with a leading ``~`` (this user) read as :func:`_home` reads the home (HOME
    when absolute, else the password database): ``Path.expanduser`` took HOME='' as '/' and
    a relative HOME as relative. ``~user`` is the password database's, as expanduser has it."""
    parts = path.parts
    if parts and parts[0] == "~":
        return _home().joinpath(*parts[1:])
    return path.expanduser()


class NoHomeError(InputError):
    """No absolute home directory to keep the kernel cache under, and none was named."""


def _home() -> Path:
    """The user's home: ``HOME`` when it is absolute, else the password database's entry.
    A relative ``HOME`` would put the cache (binaries conveyor runs) under whatever folder
    the process is in; a user with neither (``docker run -u 54321``) gets NoHomeError."""
    home = os.environ.get("HOME", "")
    if home and Path(home).is_absolute():
        return Path(home)
    try:
        import pwd

        entry = pwd.getpwuid(os.getuid()).pw_dir
    except (ImportError, KeyError):  # no password database, or no entry for this user
        entry = ""
    if entry and Path(entry).is_absolute():
        return Path(entry)
    raise NoHomeError(f"no home directory to keep the kernel cache in (HOME is "
                      f"{'unset' if not home else repr(home) + ', not absolute'}, and user "
                      f"{os.getuid()} has no entry in the password database): set "
                      f"{CACHE_DIR_VAR} to an absolute folder, or {NO_CACHE_VAR}=1")


def icd_vendor_dirs() -> list[Path]:
    """Where the OpenCL ICD loader looks for ``*.icd`` files: ``OCL_ICD_VENDORS`` (a folder,
    or one .icd file) when set, and always /etc/OpenCL/vendors."""
    dirs = [Path("/etc/OpenCL/vendors")]
    override = _get(ICD_VENDORS_VAR)
    if override is not None:
        dirs.insert(0, Path(override))
    return dirs
