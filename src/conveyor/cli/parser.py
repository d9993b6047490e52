"""The ``conveyor`` command's options: every one with help text that states its default."""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Sequence
from typing import Any

from conveyor import config
from conveyor.errors import InputError

# Options whose value may start with "-" (``--shape -1,3``, ``--arg -2.5``, ``--boundary
# -inf``): argparse would take "-1,3" (or "-inf", "-1e3") for an option, so such a pair is
# joined into ``--shape=-1,3`` before parsing.
_SIGNED_VALUE_OPTIONS = ("--shape", "--arg", "--boundary")
_SIGNED_VALUE = re.compile(r"^-(?:[0-9.]|inf|nan)", re.I)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Appends "(default: X)" to an option's help when it has a default worth stating."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if ("%(default)" in text or "default:" in text or not action.option_strings
                or action.default in (None, False, [], argparse.SUPPRESS)):
            return text
        return f"{text} (default: %(default)s)"


class UsageError(SystemExit):
    """argparse's exit for bad usage (code 2), carrying its message for ``--json``."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error keeps its message (``commands.run`` prints it as JSON too
    when ``--json`` was asked for). Sub-command parsers are of this class as well."""

    def error(self, message: str) -> Any:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise UsageError(message)


def build(version: str) -> argparse.ArgumentParser:
    """The parser of the whole command; each sub-command's ``run`` is set as a default."""
    parser = _Parser(
        prog="conveyor", formatter_class=_Formatter,
        description="Stream data larger than device memory through GPU kernels.",
        epilog="Exit codes: 0 done, 2 bad usage or input (nothing written), 1 runtime failure, "
               "130 interrupted.\n'conveyor COMMAND --help' shows a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"conveyor {version}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    devices = _sub(commands, "devices", "list devices (and measure their link)")
    devices.add_argument("--measure", action="store_true",
                         help="measure pinned/pageable copy bandwidth each way and cache it")

    for name, helptext in (("map", "stream files through a kernel into output files"),
                           ("reduce", "fold a kernel's per-element values over files")):
        _stream_options(_sub(commands, name, helptext), name)

    demo = _sub(commands, "demo", "stream a dataset 8x the memory limit it sets")
    from conveyor.demo import add_options

    add_options(demo)

    bench = _sub(commands, "bench", "link bandwidth, and conveyor vs a naive loop")
    bench.add_argument("--device", metavar="SPEC", help="device spec (default: the best)")
    bench.add_argument("--mib", type=_positive, default=64, metavar="N", help="MiB per input")
    bench.add_argument("--runs", type=_positive, default=5, metavar="N",
                       help="runs of each; the median is reported, with the spread")
    bench.add_argument("--max-spread", type=float, default=25.0, metavar="PCT",
                       help="say the machine is too noisy to compare when the runs spread "
                            "(max - min) / median by this many percent or more")

    cache = _sub(commands, "cache", "the kernel cache: info or clear")
    cache.add_argument("action", nargs="?", choices=("info", "clear"),
                       help="info: where it is, entries and size; clear: delete the entries")
    cache.set_defaults(usage_help=cache.format_help)  # a bare "conveyor cache" prints it
    # The action is needed (a bare "conveyor cache" prints this help and exits 2): argparse
    # wrote it "[{info,clear}]", as if it could be left out.
    cache.usage = "conveyor cache [-h] {info,clear}"
    return parser


def _sub(commands: Any, name: str, helptext: str) -> argparse.ArgumentParser:
    sub: argparse.ArgumentParser = commands.add_parser(
        name, help=helptext, description=helptext[0].upper() + helptext[1:] + ".",
        formatter_class=_Formatter)
    return sub


def _stream_options(sub: argparse.ArgumentParser, name: str) -> None:
    sub.add_argument("kernel_file", metavar="KERNEL_FILE",
                     help="OpenCL C (.cl) or CUDA C (.cu) source")
    sub.add_argument("--kernel", required=True, metavar="NAME", help="kernel to run (required)")
    sub.add_argument("-i", "--input", action="append", required=True, dest="inputs",
                     metavar="FILE", help="input file, repeat for more: .npy; .parquet or "
                     ".arrow/.feather as FILE:COLUMN (FILE:A,B for a 2-D input); anything "
                     "else is raw binary (give --dtype)")
    sub.add_argument("--halo", type=_natural, default=0, metavar="H",
                     help="extra rows before and after each input block")
    sub.add_argument("--boundary", type=_boundary, default="nearest", metavar="MODE",
                     help="the halo's rows past either end: nearest (the edge row, the "
                          "default), reflect, periodic, or a number")
    if name == "map":
        sub.add_argument("-o", "--output", action="append", required=True, dest="outputs",
                         metavar="FILE.npy", help="output .npy file (repeat for more)")
        sub.add_argument("--plot", metavar="PNG", help="write a timeline figure "
                         "(needs matplotlib: pip install 'conveyor[plot]')")
    else:
        sub.add_argument("--op", choices=("sum", "min", "max"), default="sum",
                         help="how to fold the kernel's per-element values")
    sub.add_argument("--arg", action="append", default=[], dest="args", metavar="VALUE",
                     help="scalar kernel argument after the buffers (repeat for more)")
    sub.add_argument("--dtype", help="element type of raw binary inputs, e.g. float32")
    sub.add_argument("--shape", help="shape of raw binary inputs, e.g. -1,3 (default: 1-D)")
    sub.add_argument("--column", action="append", default=None, dest="columns", metavar="NAME",
                     help="Parquet/Arrow column for inputs given without :COLUMN (repeat for "
                          "a 2-D input)")
    sub.add_argument("--cast", action="append", default=[], metavar="[NAME:]DTYPE",
                     help="convert an input to DTYPE as it is read; NAME is the kernel "
                          "parameter or the -i text (default: every input)")
    sub.add_argument("--device", metavar="SPEC", action="append",
                     help="device spec: cuda, cuda:1, opencl, opencl:0:1, cpu, gpu "
                          "(default: $CONVEYOR_DEVICE, else the best); repeat it, or give "
                          "cuda:all / opencl:gpu:all, to stream over several devices at once")
    sub.add_argument("--schedule", choices=("dynamic", "static"), default="dynamic",
                     help="several devices: blocks to whichever has room (dynamic), or one "
                          "contiguous share each (static)")
    sub.add_argument("--memory-limit", type=size, metavar="SIZE",
                     help="device memory the stream may use, e.g. 1GiB, 512MiB (default: half "
                          "the device's memory)")
    sub.add_argument("--block-bytes", type=size, metavar="SIZE",
                     help="bytes of one block of the widest array, e.g. 64MiB (default: from "
                          "--memory-limit)")
    sub.add_argument("--depth", type=_positive, default=3, metavar="N",
                     help="blocks in flight at once")
    sub.add_argument("--workers", type=_workers, metavar="N",
                     help="staging threads, 1 to 1024 (default: chosen from the CPU count)")
    sub.add_argument("--trace", metavar="JSON", help="write a Chrome trace (opens in Perfetto)")
    sub.add_argument("--force", action="store_true",
                     help="replace output, trace and plot files that already exist"
                     if name == "map" else "replace a trace file that already exists")
    sub.add_argument("--json", action="store_true",
                     help="print the result and the report's figures as one JSON object")
    sub.add_argument("-q", "--quiet", action="store_true",
                     help="print only the result (reduce: the value; map: nothing)")
    sub.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="progress bar on stderr (default: only when stderr is a terminal)")
    where = sub.add_mutually_exclusive_group()
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="run on the Dask cluster of this scheduler (tcp://HOST:8786): one "
                            "stream per worker over its rows of the files (conveyor[dask])")
    where.add_argument("--cluster", choices=("local", "local-cuda"),
                       help="run on a Dask cluster started for this command: local (worker "
                            "processes) or local-cuda (dask-cuda, one worker per GPU)")


def join_signed_values(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--shape -1,3`` (and ``--arg -2``) written as ``--shape=-1,3``; also
    for an abbreviation argparse takes (``--bound -inf``: argparse accepts any prefix of an
    option, so ``--bound -5`` ran and ``--bound -inf`` did not)."""
    joined: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if (token.startswith("--") and len(token) > 2
                and any(name.startswith(token) for name in _SIGNED_VALUE_OPTIONS)
                and i + 1 < len(argv) and _SIGNED_VALUE.match(argv[i + 1])):
            joined.append(f"{token}={argv[i + 1]}")
            i += 2
            continue
        joined.append(token)
        i += 1
    return joined


def size(text: str) -> int:
    """A byte count from ``text``, read as ``cv.stream`` reads sizes (``config.parse_size``:
    4096, 1e9, 64KB, 64KiB, 512MiB, 1GiB; KB = 1000, KiB = 1024), and at least 1 byte."""
    try:
        value = config.parse_size("size", text)
    except InputError as exc:
        # parse_size names the value "size=..."; argparse names the option itself.
        raise argparse.ArgumentTypeError(str(exc).removeprefix("size=")) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give at least 1 byte")
    return value


def _positive(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of at least 1")
    return value


def _workers(text: str) -> int:
    from conveyor.pipeline.options import MAX_WORKERS

    value = _positive(text)
    if value > MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from 1 to "
                                         f"{MAX_WORKERS} (staging threads; a few saturate "
                                         f"host memory copies)")
    return value


def _boundary(text: str) -> str | int | float:
    """``--boundary``: a mode's name, or the number the rows past either end hold."""
    if text in ("nearest", "reflect", "periodic"):
        return text
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give nearest, reflect, periodic, or a number (the value of the "
            f"rows past either end)") from exc
    if math.isinf(value) and "inf" not in text.lower():
        # "1e400" read as inf, where the library refuses a finite number past float64
        raise argparse.ArgumentTypeError(
            f"{text!r} lies past float64's range (finite values within ±"
            f"{sys.float_info.max!r}): give a number in that range, or inf")
    return value


def _natural(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of at least 0")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from exc

