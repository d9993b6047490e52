"""conveyor: stream data larger than an accelerator's memory through GPU kernels.

See README.md for the tour. The public names are re-exported here, loaded on first use
(PEP 562): ``import conveyor`` itself imports nothing heavy, so the ``conveyor`` command can
catch a Ctrl-C that lands while NumPy and the backends load (it would otherwise escape as a
traceback before the command's own code runs).
"""

from __future__ import annotations

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
    from conveyor.memory.keep import configure, keep_pinned, release_pinned
    from conveyor.pipeline.chain import Chain, chain, link
    from conveyor.pipeline.chunks import iterate
    from conveyor.pipeline.image import image
    from conveyor.pipeline.io import arrow, npy, parquet, raw
    from conveyor.pipeline.report import Report
    from conveyor.pipeline.resident import Resident, resident
    from conveyor.pipeline.shaped import per_block, rows
    from conveyor.pipeline.sinks import npy_out, raw_out
    from conveyor.pipeline.stream import stream

__version__ = "0.1.0"

_ERRORS = ("BackendError", "CompileError", "ConveyorError", "HazardError", "InputError",
           "OutOfMemoryError")


def __getattr__(name: str) -> Any:
    # Static imports only (no import_module of a computed name: see test_security.py).
    value: Any
    if name in ("device", "devices"):
        from conveyor import backends

        value = getattr(backends, name)
    elif name in ("Device", "Kernel"):
        from conveyor.backends import base

        value = getattr(base, name)
    elif name in _ERRORS:
        from conveyor import errors

        value = getattr(errors, name)
    elif name in ("Chain", "chain", "link"):
        from conveyor.pipeline import chain as chain_module

        value = getattr(chain_module, name)
    elif name == "portable":
        from conveyor.kernels.portable import portable as value
    elif name in ("arrow", "iterate", "npy", "parquet", "raw"):
        from conveyor.pipeline import io

        value = getattr(io, name)
    elif name == "image":
        from conveyor.pipeline.image import image as value
    elif name == "Report":
        from conveyor.pipeline.report import Report as value
    elif name in ("per_block", "rows"):
        from conveyor.pipeline import shaped

        value = getattr(shaped, name)
    elif name in ("Resident", "resident"):
        from conveyor.pipeline import resident as resident_module

        value = getattr(resident_module, name)
    elif name in ("npy_out", "raw_out"):
        from conveyor.pipeline import sinks

        value = getattr(sinks, name)
    elif name == "stream":
        from conveyor.pipeline.stream import stream as value
    elif name == "pinned":
        from conveyor.memory import pinned as value
    elif name in ("configure", "keep_pinned", "release_pinned"):
        from conveyor.memory import keep

        value = getattr(keep, name)
    else:
        raise AttributeError(f"module 'conveyor' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "BackendError",
    "Chain",
    "CompileError",
    "ConveyorError",
    "Device",
    "HazardError",
    "InputError",
    "Kernel",
    "OutOfMemoryError",
    "Report",
    "Resident",
    "__version__",
    "arrow",
    "chain",
    "configure",
    "device",
    "devices",
    "image",
    "iterate",
    "keep_pinned",
    "link",
    "npy",
    "npy_out",
    "parquet",
    "per_block",
    "pinned",
    "portable",
    "raw",
    "raw_out",
    "release_pinned",
    "resident",
    "rows",
    "stream",
]
