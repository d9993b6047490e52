"""Parse the command line, run the sub-command, turn its errors into exit codes and one
line each (in the command's own terms)."""

from __future__ import annotations

import argparse
import errno
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import conveyor
from conveyor.cli import StdoutError, cluster, stdout_gone, words
from conveyor.cli import parser as cli_parser
from conveyor.errors import (
    CompileError,
    ConveyorError,
    InputError,
    is_advised,
    outputs_written,
)

Runner = Callable[[argparse.Namespace], int]


def run(argv: Sequence[str]) -> int:
    """Parse ``argv`` and run its command; return the exit code (see :mod:`conveyor.cli`)."""
    parser = cli_parser.build(conveyor.__version__)
    try:
        options = parser.parse_args(cli_parser.join_signed_values(argv))
    except cli_parser.UsageError as exc:
        # A script reading stdout gets the reason there too (argparse takes "--js" for it).
        if any(len(a) > 3 and "--json".startswith(a) for a in argv):
            _print_json_error(exc.message, "UsageError", 2)
        raise
    if options.command is None:  # a bare "conveyor": the help, as a usage error
        parser.print_help(sys.stderr)
        return 2
    if options.command == "cache" and options.action is None:
        print(options.usage_help(), file=sys.stderr, end="")
        return 2
    # SIGTERM is a Ctrl-C already: conveyor.cli.main installs that for the whole command.
    shown = warnings.showwarning
    warnings.showwarning = _warning_line(options)
    try:
        return _runner(options.command)(options)
    except InputError as exc:
        return _fail(options, exc, f"{_one_line(exc)}", 2)
    except KeyboardInterrupt as exc:
        if options.command != "map":
            said = "interrupted"
        elif outputs_written(exc):
            said = f"interrupted after writing {', '.join(options.outputs)}"
        else:
            said = "interrupted; no output was written"
        return _fail(options, exc, said, 130)
    except CompileError as exc:
        # The log as the compiler wrote it, its lines naming the kernel file.
        print(f"conveyor {options.command}: {exc}", file=sys.stderr)
        _say_json(options, exc, str(exc), 1)
        return 1
    except ConveyorError as exc:
        return _fail(options, exc, str(exc), 1)
    except MemoryError:
        # The host's memory, not the device's (that is an OutOfMemoryError, a ConveyorError).
        return _fail(options, MemoryError(), "the host ran out of memory: use smaller inputs "
                     "(demo, bench: a smaller --mib), or free memory", 1)
    except BrokenPipeError:
        raise  # stdout's reader went away: main() exits quietly, as after SIGPIPE
    except StdoutError as exc:
        # Not the command's files (a full disk's advice would be about them): its report.
        stdout_gone()
        said = str(exc)
        if options.command == "map":
            said = f"wrote {', '.join(options.outputs)}, but {said}, or pass -q"
        return _fail(options, exc, said, 1)
    except OSError as exc:
        # conveyor's own OSErrors say what to change already (a full disk, too many files)
        told = is_advised(exc)
        return _fail(options, exc, str(exc) if told else f"{exc}: {_os_advice(exc)}", 1)
    finally:
        warnings.showwarning = shown


def _runner(command: str) -> Runner:
    from conveyor.cli import streaming, tools

    runners: dict[str, Runner] = {
        "devices": tools.run_devices, "map": streaming.run_map,
        "reduce": streaming.run_reduce, "demo": tools.run_demo, "bench": tools.run_bench,
        "cache": tools.run_cache,
    }
    return runners[command]


def _warning_line(options: argparse.Namespace) -> Callable[..., None]:
    """``warnings.showwarning`` for the command: a warning is said as the command's errors
    are, ``conveyor map: warning: ...`` on stderr, not as Python shows it (the library's file
    and line, then a line of its source: "stream.py:218: RuntimeWarning: conveyor: removed
    ... report = _run(compute, ...)")."""

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        text = str(message).removeprefix("conveyor: ")
        if text.startswith("Non-empty compiler output encountered"):
            return  # PyOpenCL's note that a build that worked printed something (NVIDIA's)
        try:
            _say(options, f"warning: {text}")
        except OSError:
            pass  # stderr is gone: as Python's own showwarning, say nothing

    return show


def _say(options: argparse.Namespace, message: str) -> None:
    text = words.cli_terms(message, getattr(options, "input_names", ()),
                           cluster=cluster.on_cluster(options))
    print(f"conveyor {options.command}: {text}", file=sys.stderr)


def _fail(options: argparse.Namespace, exc: BaseException, message: str, code: int) -> int:
    """Say ``message`` on stderr (and as JSON on stdout with ``--json``); return ``code``.
    A ``map`` whose outputs were already written when it failed (its ``--plot``, say) says
    so first: a script seeing exit 1 must not take its old outputs for still there."""
    if (options.command == "map" and outputs_written(exc)
            and not isinstance(exc, KeyboardInterrupt | StdoutError)):
        message = f"wrote {', '.join(options.outputs)}, but then: {message}"
    _say(options, message)
    _say_json(options, exc, words.cli_terms(message, getattr(options, "input_names", ())),
              code)
    return code


def _say_json(options: argparse.Namespace, exc: BaseException, message: str,
              code: int) -> None:
    """With ``--json``, a failure is one JSON object on stdout too, as a success is, so a
    script that reads stdout never gets nothing: ``{"error": ..., "type": ...,
    "exit_code": ...}``. The message still goes to stderr for a person."""
    if getattr(options, "json", False):
        _print_json_error(message, type(exc).__name__, code)


def _print_json_error(message: str, kind: str, code: int) -> None:
    import json

    try:
        print(json.dumps({"error": message, "type": kind, "exit_code": code}))
    except OSError:  # stdout is what failed (a full disk): the message is on stderr already
        pass


def _os_advice(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free some space or write elsewhere"
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return ("more files are open than this process (ulimit -n) or the system allows: raise "
                "the limit, or give fewer inputs")
    if exc.errno == errno.EFBIG:
        return ("the file is larger than this process may write (see ulimit -f) or than the "
                "file system holds: raise the limit or write elsewhere")
    return "check the path and its permissions"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
