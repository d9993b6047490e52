"""conveyor: stream data larger than an accelerator's memory through GPU kernels.

See README.md for the tour. The public names are re-exported here.
"""

from __future__ import annotations

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
