"""The exceptions conveyor raises. Every one is a :class:`ConveyorError`."""

from __future__ import annotations


class ConveyorError(Exception):
    """Base class of every error conveyor raises on purpose."""


class BackendError(ConveyorError):
    """A driver call failed. ``call`` names the call, ``code`` the driver's symbolic code."""

    def __init__(self, message: str, call: str = "", code: str = "") -> None:
        super().__init__(message, call, code)
        self.message = message
        self.call = call
        self.code = code

    def __str__(self) -> str:
        where = f"{self.call}: " if self.call else ""
        what = f" [{self.code}]" if self.code else ""
        return f"{where}{self.message}{what}"


class CompileError(ConveyorError):
    """A kernel failed to build. ``log`` holds the compiler's log, with line numbers."""

    def __init__(self, message: str, log: str = "", source: str = "") -> None:
        super().__init__(message, log, source)
        self.message = message
        self.log = log
        self.source = source

    def __str__(self) -> str:
        return f"{self.message}\n{self.log}" if self.log else self.message


class OutOfMemoryError(ConveyorError):
    """An allocation failed even after the pool freed what it held and collected garbage.

    ``requested``, ``in_use`` and ``limit`` are in bytes (``limit`` is None when unlimited).
    Survives pickling, so it crosses process boundaries intact.
    """

    def __init__(
        self, requested: int, in_use: int, limit: int | None, where: str = "device"
    ) -> None:
        super().__init__(requested, in_use, limit, where)
        self.requested = requested
        self.in_use = in_use
        self.limit = limit
        self.where = where

    def __str__(self) -> str:
        limit = "no limit" if self.limit is None else f"limit {_mib(self.limit)}"
        return (
            f"out of {self.where} memory: asked for {_mib(self.requested)} with "
            f"{_mib(self.in_use)} in use ({limit}); use smaller blocks (block_bytes=), "
            f"a lower depth, or raise memory_limit"
        )


class HazardError(ConveyorError):
    """Strict async mode: something on a running stream's hot path would silently block.

    ``hazard`` is "pageable-copy", "pool-allocation" or "kernel-build"; the message says the
    fix (see :mod:`conveyor.hazards`). Survives pickling.
    """

    def __init__(self, hazard: str, message: str) -> None:
        super().__init__(hazard, message)
        self.hazard = hazard
        self.message = message

    def __str__(self) -> str:
        return self.message


class InputError(ConveyorError, ValueError):
    """The caller's input cannot be used; the message says what to change."""


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"
