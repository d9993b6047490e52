"""The exceptions conveyor raises. Every one is a :class:`ConveyorError`."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])


class ConveyorError(Exception):
    """Base class of every error conveyor raises on purpose."""


def advised(error: OSError) -> OSError:
    """``error`` (the environment, not the arguments: a full disk, too many open files, a
    file-size limit) marked as one whose message names the file and says what to change: the
    command line adds no advice of its own (:func:`is_advised`). Still a plain OSError."""
    error.conveyor_advised = True  # type: ignore[attr-defined]
    return error


def is_advised(error: BaseException) -> bool:
    """Whether :func:`advised` marked ``error``."""
    return getattr(error, "conveyor_advised", False) is True


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
    """A kernel failed to build. ``log`` holds the compiler's log, with line numbers.

    ``source_name`` (e.g. the kernel file's path), when set, replaces the compiler's name for
    the source in the printed log (PoCL's ``.../kcache/tempfile_XXXX.cl``, NVRTC's
    ``default_program``, NVIDIA OpenCL's ``<kernel>``), so each line points at the user's file.
    """

    def __init__(self, message: str, log: str = "", source: str = "",
                 source_name: str = "") -> None:
        super().__init__(message, log, source, source_name)
        self.message = message
        # NVRTC's log ends in the C string's NUL: no terminal should print it.
        self.log = log.replace("\0", "").rstrip()
        self.source = source
        self.source_name = source_name

    def __str__(self) -> str:
        log = name_source(self.log, self.source_name) if self.source_name else self.log
        return f"{self.message}\n{log}" if log else self.message


# The names compilers give the source they were handed: PoCL writes it to a temporary file
# (tempfile_XXXX.cl in its kernel cache), NVRTC calls it default_program, NVIDIA's OpenCL
# <kernel>, AMD's comgr .../CompileSource; each is followed by a line number (NVRTC's summary
# line also quotes it: 'in the compilation of "default_program"'). A file name's folders are
# found by name_source, not here: a path before the name, read by the expression, made each
# position of a long word in the log (a source line the compiler quotes) scan to the word's
# end: a 40,000-character line took 2 minutes.
_COMPILER_SOURCE_NAMES = re.compile(
    r"(?<!\w)\w++\.cl(?=[:(])"  # a word ending .cl: its tempfile_ part, if any
    r"|\bdefault_program(?=\(\d)"
    r'|(?<=")default_program(?=")'
    r"|<kernel>(?=:\d)"
    r"|CompileSource(?=:\d)"
)
#: What ends the folders before a compiler's file name (tempfile_*.cl, CompileSource).
_NOT_PATH = ":'\""


def name_source(log: str, source_name: str) -> str:
    """``log`` with the compiler's name for the source (with its folders) replaced by
    ``source_name``."""
    out, done = [], 0
    for match in _COMPILER_SOURCE_NAMES.finditer(log):
        start, text = match.start(), match.group()
        if text.endswith(".cl"):
            inside = text.find("tempfile_")
            if inside < 0 or inside + len("tempfile_.cl") == len(text):
                continue
            start += inside
        if text[0] != "<" and not text.startswith("default_program") and start > done \
                and log[start - 1] == "/":
            while start > done and not (log[start - 1].isspace() or log[start - 1] in _NOT_PATH):
                start -= 1
        out += [log[done:start], source_name]
        done = match.end()
    out.append(log[done:])
    return "".join(out)


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
        #: What to do, where the stream's advice (below) does not apply: set by callers that
        #: allocate outside a stream (``cv.pinned.empty``).
        self.advice: str | None = None

    def __str__(self) -> str:
        limit = "no limit" if self.limit is None else f"limit {_size(self.limit)}"
        if self.advice is not None:
            return (f"out of {self.where} memory: asked for {_size(self.requested)} with "
                    f"{_size(self.in_use)} in use ({limit}); {self.advice}")
        # A larger memory_limit plans a larger ring: the fix is a smaller one (or more room).
        room = (" or raise the pool's limit (device.memory_pool.limit / "
                "device.pinned_pool.limit)" if self.limit is not None else "")
        return (
            f"out of {self.where} memory: asked for {_size(self.requested)} with "
            f"{_size(self.in_use)} in use ({limit}); use a lower memory_limit, smaller "
            f"blocks (block_bytes=) or a lower depth{room}"
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


def _size(nbytes: int) -> str:
    """``nbytes`` readable at any size: bytes, KiB, MiB, GiB ("0.0 MiB" said nothing)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} bytes"


#: The note on an exception raised after a stream's outputs were renamed into place (a Ctrl-C
#: while its trace or plot was written): the outputs are whole, and a caller must not say
#: otherwise.
OUTPUTS_WRITTEN = "conveyor: raised after the stream's outputs were written"


def note_outputs_written(exc: BaseException) -> None:
    """Add :data:`OUTPUTS_WRITTEN` to ``exc``'s notes (once)."""
    if OUTPUTS_WRITTEN not in getattr(exc, "__notes__", ()):
        exc.add_note(OUTPUTS_WRITTEN)


def outputs_written(exc: BaseException) -> bool:
    """True when ``exc`` was raised after the stream's outputs were written."""
    return OUTPUTS_WRITTEN in getattr(exc, "__notes__", ())


#: conveyor's own source files start with this (its frames in a traceback).
_PACKAGE = __file__[: -len("errors.py")]


def release_locals(exc: BaseException) -> None:
    """Clear the local variables of conveyor's own finished frames in ``exc``'s traceback
    and in those of the exceptions it chains (context, cause, a group's members). A kept
    exception (an error log, a Future's result, a notebook's ``sys.last_value``) held a
    failed stream's outputs and pinned staging blocks through those frames, long after the
    pools had counted them back (a 64 MB stream: 96-125 MiB kept per exception). The
    user's frames keep theirs; a frame still running (the caller's) is left as it is."""
    todo: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while todo and len(seen) < 1000:
        error = todo.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        tb = error.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if frame.f_code.co_filename.startswith(_PACKAGE):
                try:
                    frame.clear()
                except RuntimeError:  # still executing (or a suspended generator's)
                    pass
            tb = tb.tb_next
        todo += [error.__context__, error.__cause__]
        todo += list(getattr(error, "exceptions", ()) or ())


def releasing_locals(function: _F) -> _F:
    """``function`` (a public entry point: ``cv.stream``) with :func:`release_locals` called
    on what it raises, once its own frame and those below it have finished."""
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except BaseException as exc:
            release_locals(exc)
            raise

    return call  # type: ignore[return-value]
