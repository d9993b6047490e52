"""The ``conveyor`` command: devices, map, reduce, demo, bench, cache.

Exit codes: 0 success; 2 bad usage or input (argparse errors, a bare ``conveyor`` or
``conveyor cache``, and every InputError: the one-line message says what to change, in the
command's own options); 1 a runtime failure (a kernel that does not build, a driver error,
standard output that cannot be written: ``> /dev/full``);
130 interrupted (Ctrl-C or SIGTERM, at any point after the interpreter started: while NumPy or a
driver loads, while devices are found, or mid-stream); 141, silently, when the reader of stdout
went away (``conveyor devices | head -1``), as for a tool that SIGPIPE ended. A failed or
interrupted ``map`` leaves no output file behind: outputs are renamed into place only when the
whole stream has succeeded.

This module imports nothing but ``sys`` (and ``signal``, built in) before :func:`main` is inside
its ``try``: everything heavy loads under the Ctrl-C handler (``import conveyor`` is lazy for
the same reason).
"""

from __future__ import annotations

import sys
import threading

TYPE_CHECKING = False  # not typing's: see conveyor/__init__.py
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, TextIO


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    import signal

    # SIGTERM is a Ctrl-C from here on (exit 130, "interrupted"): installed only once the
    # command's modules had loaded, it killed the process silently (-15) during start-up.
    # Only the main thread may set a handler (called on another, main() raised ValueError).
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if on_main else None
    guard = None
    strict: list[TextIO] = []
    try:
        try:
            _open_closed_std_streams()
            strict = _tolerant_std_streams()
            with _GUARDING:  # two calls on two threads: neither wraps a guard going away
                guard = sys.stdout = GuardedStdout(sys.stdout)
            from conveyor.cli.commands import run

            return run(sys.argv[1:] if argv is None else list(argv))
        finally:
            sys.stdout.flush()  # a reader gone early (| head -1) shows here, not at exit
    except StdoutError as exc:
        # The last flush of what the command printed failed (``> /dev/full``), after the
        # command itself had succeeded.
        print(f"conveyor: {exc}", file=sys.stderr)
        stdout_gone()
        return 1
    except SystemExit as exc:
        # argparse's --help and --version end here, and argparse drops a failed write.
        if guard is not None and guard.broken and exc.code in (0, None):
            stdout_gone()
            return 141  # as for a command whose reader went away (| head -1)
        if guard is None or guard.failure is None or exc.code not in (0, None):
            raise
        print(f"conveyor: {guard.failure}", file=sys.stderr)
        stdout_gone()
        return 1
    except KeyboardInterrupt:
        # A Ctrl-C before a command started (imports, parsing): nothing was written.
        print("conveyor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # As a tool killed by SIGPIPE: no message, 128 + 13; and stdout's last flush at exit
        # must not fail again.
        stdout_gone()
        return 141
    finally:
        if guard is not None:
            _unguard(guard)
        for stream in strict if argv is not None else ():  # a caller's streams as they were
            try:
                stream.reconfigure(errors="strict")  # type: ignore[attr-defined]
            except (OSError, ValueError):  # its flush failed (a full disk): it stays escaping
                pass
        # The process's own command (no argv given) is done: a SIGTERM while the interpreter
        # shuts down (~0.1 s, the drivers' clean-up) is ignored, not a silent -15 after the
        # outputs were written. Called in-process, the caller's handler comes back.
        if on_main:
            signal.signal(signal.SIGTERM, signal.SIG_IGN if argv is None
                          else previous if previous is not None else signal.SIG_DFL)


#: Held while a call puts its stdout guard in place or takes it out.
_GUARDING = threading.Lock()


def _unguard(guard: GuardedStdout) -> None:
    """Take this call's ``guard`` out of ``sys.stdout``: where another call (on another
    thread) wrapped it since, out of that one's chain (restored only when it was
    ``sys.stdout`` itself, a finished command's guard stayed there for good)."""
    with _GUARDING:
        if sys.stdout is guard:
            sys.stdout = guard.stream
            return
        outer: object = sys.stdout
        while isinstance(outer, GuardedStdout):
            if outer.stream is guard:
                outer.stream = guard.stream
                return
            outer = outer.stream


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # the same clean-up as Ctrl-C: no partial output stays


class StdoutError(OSError):
    """Writing to standard output failed (``> /dev/full``, a full disk behind ``> file``):
    the report is lost, not the command's own files, so the message must not advise about
    them."""

    def __str__(self) -> str:
        return f"could not write to standard output ({self.strerror}): send it elsewhere"


class GuardedStdout:
    """``sys.stdout`` during a command: a failed write or flush is a :class:`StdoutError`,
    so the command can tell its report's failure from its files' (both are ``OSError``). A
    reader gone away (``BrokenPipeError``) stays as it is: it ends the command quietly."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.failure: StdoutError | None = None  # the first failed write, once one failed
        #: The reader went away during a write or flush (argparse drops that error for
        #: --help: the command says so by its exit code, 141, all the same).
        self.broken = False

    def write(self, text: str) -> int:
        """Write ``text`` to standard output."""
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self.broken = True
            raise
        except OSError as exc:
            raise self._failed(exc) from exc

    def flush(self) -> None:
        """Flush standard output."""
        try:
            self.stream.flush()
        except BrokenPipeError:
            self.broken = True
            raise
        except OSError as exc:
            raise self._failed(exc) from exc

    def _failed(self, exc: OSError) -> StdoutError:
        self.failure = self.failure or StdoutError(exc.errno, exc.strerror)
        return self.failure

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def stdout_gone() -> None:
    """Point fd 1 at ``/dev/null`` once standard output failed, so what is still buffered
    goes nowhere at exit instead of failing again there ("Exception ignored ...")."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
    finally:
        os.close(devnull)


def _tolerant_std_streams() -> list[TextIO]:
    """Write what stdout and stderr cannot encode as backslash escapes; return the streams
    changed (those that were strict). A file name of non-UTF-8 bytes under a strict UTF-8
    locale, or any non-ASCII name beside ``PYTHONIOENCODING=ascii``, made ``print(f"wrote
    {name}")`` a UnicodeEncodeError traceback (exit 1) after the outputs were written. A
    stream that escapes already (C.UTF-8's surrogateescape writes the name's own bytes) is
    left as it is."""
    changed = []
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
            changed.append(stream)
    return changed


def _open_closed_std_streams() -> None:
    """Make a closed standard stream (``2>&-``, ``>&-``) ``/dev/null``. Python leaves
    ``sys.stderr`` None then: a map failed silently, and a success ended in a traceback at
    the last flush of stdout; a file the command opened could also land on fd 1 or 2 and
    receive its messages."""
    import os

    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free fd: this one, in order
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115 (for the process)
