"""conveyor: stream data larger than an accelerator's memory through GPU kernels.

See README.md for the tour. The public names are re-exported here, loaded on first use
(PEP 562): ``import conveyor`` itself imports nothing heavy, so the ``conveyor`` command can
catch a Ctrl-C that lands while NumPy and the backends load (it would otherwise escape as a
traceback before the command's own code runs).
"""

from __future__ import annotations

import importlib

# Not typing.TYPE_CHECKING: importing typing costs milliseconds of that window (mypy reads
# any constant of this name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from conveyor.backends import device, devices
    from conveyor.backends.base import Device, Kernel
    from conveyor.errors import (
        BackendError,
        CompileError,
        ConveyorError,
        HazardError,
        InputError,
        OutOfMemoryError,
    )
    from conveyor.kernels.portable import portable
    from conveyor.memory import pinned
    from conveyor.pipeline.io import arrow, iterate, npy, parquet, raw
    from conveyor.pipeline.report import Report
    from conveyor.pipeline.sinks import npy_out, raw_out
    from conveyor.pipeline.stream import stream

__version__ = "0.1.0"

# Each public name and the module it comes from (a name None: the module itself).
_HOMES: dict[str, tuple[str, str | None]] = {
    "device": ("conveyor.backends", "device"),
    "devices": ("conveyor.backends", "devices"),
    "Device": ("conveyor.backends.base", "Device"),
    "Kernel": ("conveyor.backends.base", "Kernel"),
    "BackendError": ("conveyor.errors", "BackendError"),
    "CompileError": ("conveyor.errors", "CompileError"),
    "ConveyorError": ("conveyor.errors", "ConveyorError"),
    "HazardError": ("conveyor.errors", "HazardError"),
    "InputError": ("conveyor.errors", "InputError"),
    "OutOfMemoryError": ("conveyor.errors", "OutOfMemoryError"),
    "portable": ("conveyor.kernels.portable", "portable"),
    "pinned": ("conveyor.memory.pinned", None),
    "arrow": ("conveyor.pipeline.io", "arrow"),
    "iterate": ("conveyor.pipeline.io", "iterate"),
    "npy": ("conveyor.pipeline.io", "npy"),
    "parquet": ("conveyor.pipeline.io", "parquet"),
    "raw": ("conveyor.pipeline.io", "raw"),
    "Report": ("conveyor.pipeline.report", "Report"),
    "npy_out": ("conveyor.pipeline.sinks", "npy_out"),
    "raw_out": ("conveyor.pipeline.sinks", "raw_out"),
    "stream": ("conveyor.pipeline.stream", "stream"),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'conveyor' has no attribute {name!r}")
    module = importlib.import_module(home[0])
    value = module if home[1] is None else getattr(module, home[1])
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))


__all__ = [
    "BackendError",
    "CompileError",
    "ConveyorError",
    "Device",
    "HazardError",
    "InputError",
    "Kernel",
    "OutOfMemoryError",
    "Report",
    "__version__",
    "arrow",
    "device",
    "devices",
    "iterate",
    "npy",
    "npy_out",
    "parquet",
    "pinned",
    "portable",
    "raw",
    "raw_out",
    "stream",
]
