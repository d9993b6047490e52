"""``conveyor map`` and ``conveyor reduce``: check cheaply, build the kernel, stream, print.

Output: the report table and what was written (default); only the result (``-q``: reduce's
value, nothing for map); or one JSON object (``--json``). The progress bar goes to stderr
only when stderr is a terminal, unless ``--progress``/``--no-progress`` says otherwise.
"""

from __future__ import annotations

import argparse
import decimal
import fractions
import importlib.util
import json
import math
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

import numpy as np

import conveyor as cv
from conveyor.backends import select
from conveyor.cli import cluster, words
from conveyor.cli.files import (
    refuse_one_file_twice,
    refuse_to_replace,
    refuse_writing_what_is_read,
)
from conveyor.cli.inputs import Input, apply_casts, check_options, open_input
from conveyor.errors import CompileError, InputError, note_outputs_written
from conveyor.kernels.includes import anchor_includes

KERNEL_SUFFIXES = {".cl": "opencl", ".cu": "cuda"}


def plot_names(options: argparse.Namespace) -> list[tuple[str, str | None]]:
    """``--plot`` as the file it writes (``x`` writes ``x.png``; trace/plot.py: plot_file),
    for the checks on output files; ``options.plot`` becomes that file."""
    if options.plot:
        from conveyor.trace.plot import plot_file

        options.plot = plot_file(options.plot, f"--plot {options.plot}")
    return [("--plot", options.plot)]


def run_map(options: argparse.Namespace) -> int:
    """``conveyor map``: stream the inputs through the kernel into the ``-o`` files."""
    for path in options.outputs:
        if not path.strip():
            raise InputError("-o '': name the output .npy file, e.g. -o out.npy")
        # os.path.isdir: Path.is_dir raised OSError for a name too long (exit 1, no advice).
        if path.endswith(("/", os.sep)) or os.path.isdir(path):
            what = "is a folder" if os.path.isdir(path) else "ends with /, as a folder does"
            raise InputError(f"-o {path} {what}: name a .npy file in it, e.g. "
                             f"{Path(path) / 'out.npy'}")
        if Path(path).suffix.lower() != ".npy":
            raise InputError(f"-o {path}: outputs are .npy files; name it {path}.npy")
    if options.plot and importlib.util.find_spec("matplotlib") is None:
        raise InputError("--plot needs matplotlib: pip install 'conveyor[plot]'")
    plots = plot_names(options)
    refuse_one_file_twice([*(("-o", p) for p in options.outputs), ("--trace", options.trace),
                           *plots])
    read = _files_read(options)  # before --force is advised: it would not help
    refuse_writing_what_is_read([("--trace", options.trace), *plots], read)
    # Not the -i inputs: an output may be an input's file (in place: the input is read whole
    # first); never the kernel file nor a header it includes.
    refuse_writing_what_is_read([("-o", p) for p in options.outputs],
                                [(what, path) for what, path in read if what != "-i"])
    refuse_to_replace([*(("-o", p) for p in options.outputs), ("--trace", options.trace),
                       *plots], options.force)
    if cluster.on_cluster(options):
        return cluster.run(options, list(options.outputs), None)
    report = _stream(options, outputs=[cv.npy_out(p) for p in options.outputs])
    try:
        _after_map(options, report)
    except BaseException as exc:  # a Ctrl-C, say: the outputs are whole, and stay
        note_outputs_written(exc)
        raise
    return 0


def _trace_written(options: argparse.Namespace, report: cv.Report) -> None:
    """OSError (exit 1) when ``--trace`` was asked for and not written: the library only
    warns (a trace is a side output of a stream), and the command exited 0 without the file
    it was asked for, where a --plot that fails exits 1."""
    if options.trace and not report.trace_file:
        raise OSError(f"--trace {options.trace} was not written (the warning above says why)")


def _after_map(options: argparse.Namespace, report: cv.Report) -> None:
    """What ``conveyor map`` does once its outputs are written: the plot, then the figures."""
    _trace_written(options, report)
    if options.plot:
        from conveyor.trace.plot import plot_timeline

        try:
            plot_timeline(report.timeline, options.plot,
                          title=f"conveyor map {options.kernel}")
        except OSError as exc:  # name the plot: a full disk's error named no file (or a temp)
            if exc.errno is None or exc.filename == options.plot:
                raise
            raise type(exc)(exc.errno, exc.strerror, options.plot) from exc
    if options.json:
        _print_json(options, report, outputs=list(options.outputs))
    elif not options.quiet:
        print(report)
        print(f"wrote {', '.join(options.outputs)}")
        if report.trace_file:
            print(f"trace written to {report.trace_file}")
        if options.plot:
            print(f"timeline written to {options.plot}")


def run_reduce(options: argparse.Namespace) -> int:
    """``conveyor reduce``: fold the kernel's per-element values; print the result."""
    refuse_writing_what_is_read([("--trace", options.trace)], _files_read(options))
    refuse_to_replace([("--trace", options.trace)], options.force)
    if cluster.on_cluster(options):
        return cluster.run(options, [], options.op)
    report = _stream(options, outputs=[], reduce=options.op)
    if options.json:
        _print_json(options, report, result=report.result)
    elif options.quiet:
        print(_plain(report.result))
    else:
        print(report)
        if report.trace_file:
            print(f"trace written to {report.trace_file}")
        print(f"{options.op} = {_plain(report.result)}")
    _trace_written(options, report)
    return 0


def _files_read(options: argparse.Namespace) -> list[tuple[str, str]]:
    """The files the command reads, as (what, path): the kernel file first, the headers it
    includes (``--trace kd/defs.h --force`` replaced the header ``kd/h.cl`` includes), then
    each -i."""
    return [("kernel file", options.kernel_file), *_headers_read(options.kernel_file),
            *(("-i", Input(text).path) for text in options.inputs)]


def _headers_read(kernel_file: str) -> list[tuple[str, str]]:
    """("header", path) of each header the kernel file includes that exists; none where the
    file cannot be read yet (the command says why when it reads it)."""
    from conveyor import config
    from conveyor.kernels.includes import included_headers

    path = Path(kernel_file)
    try:
        source = anchor_includes(read_kernel(path), path.parent, f"kernel file {path}")
    except InputError:
        return []
    # An OpenCL build also searches PYOPENCL_BUILD_OPTIONS' -I folders (kernels/build.py
    # kernel_headers): a header found there was written over by -o/--trace with --force.
    forced = config.pyopencl_build_options().split() if path.suffix.lower() != ".cu" else []
    return [("header", found) for _, found, data in included_headers(source, forced)
            if data is not None]


def kernel_source(options: argparse.Namespace) -> tuple[str, str]:
    """The kernel file's text, its quoted includes anchored beside it, and the backend its
    suffix names; InputError for another suffix or an empty file. The local command and a
    cluster run both read it so (a cluster run once compiled ``#include "common.h"``
    against the current folder's header, and a ``.cu`` file as OpenCL C)."""
    kernel_path = Path(options.kernel_file)
    backend = KERNEL_SUFFIXES.get(kernel_path.suffix.lower())
    if backend is None:
        raise InputError(f"{kernel_path}: name OpenCL C sources .cl and CUDA C sources .cu")
    source = anchor_includes(read_kernel(kernel_path), kernel_path.parent,
                             f"kernel file {kernel_path}")
    if not source.lstrip("\ufeff \t\r\n"):
        raise InputError(f"kernel file {kernel_path} is empty: write the kernel "
                         f"{options.kernel!r} in it (or name the file that has it)")
    return source, backend


def check_backend(kernel_path: Path, backend: str, spec: str, device_backend: str) -> None:
    """InputError when the kernel file's language (``backend``) is not the device's."""
    if device_backend != backend:
        other = "cuda" if backend == "cuda" else "opencl"
        raise InputError(
            f"{kernel_path.name} is {'CUDA' if backend == 'cuda' else 'OpenCL'} C but "
            f"{spec} is an {device_backend} device: pass --device {other}, or write "
            f"the kernel as {'.cl' if device_backend == 'opencl' else '.cu'}")


def _stream(options: argparse.Namespace, outputs: list[Any],
            reduce: str | None = None) -> cv.Report:
    """Check everything that can be checked cheaply, then build the kernel and stream."""
    kernel_path = Path(options.kernel_file)
    source, backend = kernel_source(options)
    # A wrong --kernel fails before any file is read, unless the device's macros may decide.
    name_settled = check_kernel_name(source, options.kernel)
    inputs = [Input(text) for text in options.inputs]
    options.input_names = [item.text for item in inputs]  # errors name inputs by these
    check_options(inputs, options)
    sources = []
    try:
        for item in inputs:
            sources.append(open_input(item, options))
        # No warm-up: the command streams at once, leaving it nothing to overlap.
        devs = (select(options.device, warm_up=False) if options.device
                else [cv.device(None, warm_up=False)])
        for dev in devs:
            check_backend(kernel_path, backend, dev.spec, dev.backend)
        dev = devs[0]
        if not name_settled:
            check_kernel_name(source, options.kernel, dev)
        try:
            with words.compiler_output():
                kernel = dev.compile(source, options.kernel)
        except CompileError as exc:
            # A kernel the raw text has but the compiler never saw (inside an #if 0) builds
            # and then fails to load: say that, as for any name the source lacks.
            check_kernel_name(source, options.kernel, dev)
            exc.source_name = str(kernel_path)  # the log points at the user's file
            raise
        sources = apply_casts(sources, inputs, kernel.params, options.cast)
    except BaseException:
        for opened in sources:
            opened.close()
        raise
    progress = sys.stderr.isatty() and not options.quiet and not options.json
    return cv.stream(kernel, sources, outputs, device=devs if len(devs) > 1 else dev,
                     schedule=options.schedule, memory_limit=options.memory_limit,
                     block_bytes=options.block_bytes, depth=options.depth,
                     workers=options.workers, halo=options.halo, boundary=options.boundary,
                     reduce=reduce,
                     args=[_number(a) for a in options.args],
                     progress=progress if options.progress is None else options.progress,
                     trace=options.trace)


def read_kernel(path: Path) -> str:
    """The text of kernel file ``path``; InputError when it cannot be read or is not UTF-8.

    Decoded as UTF-8 whatever the locale: the library takes sources as text and hands the
    compiler their UTF-8 bytes, so a Latin-1 byte would not reach it as written anyway."""
    try:
        # O_NONBLOCK: a FIFO named k.cl must not block the open until a writer comes.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            kind = os.fstat(fd).st_mode
            if not stat.S_ISREG(kind):  # /dev/zero behind k.cl would be read until memory ran out
                raise InputError(f"kernel file {path} is not a regular file (a "
                                 f"{_node_kind(kind)}): name the .cl or .cu file itself")
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read()
        finally:
            os.close(fd)
    except OSError as exc:
        raise InputError(f"cannot read kernel file {path} ({exc.strerror}): "
                         f"check the path") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(f"kernel file {path} is not UTF-8: byte 0x{data[exc.start]:02x} at "
                         f"offset {exc.start} (line {line}); save it as UTF-8") from None


def _node_kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
             (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"), (stat.S_ISDIR, "folder"))
    return next((name for test, name in kinds if test(mode)), "special file")


def check_kernel_name(source: str, name: str, device: cv.Device | None = None) -> bool:
    """InputError unless ``source`` defines kernel ``name`` once preprocessed, as the library
    reads it (``kernels/preprocess.py``): a name made by a macro (``add_##T``) counts, one in
    an ``#if 0`` does not, and the listing names what the compiler will see.

    With ``device``, exact: its predefined macros are defined, as the library does; returns
    True. Without (before any device is open) it refuses only what no device could change and
    returns whether that settled it: True for a name in the raw text (cheap, no preprocessing;
    if it sits in an ``#if 0`` the build fails to load it and the caller checks again with the
    device), False when the device's macros may decide (the caller checks again once it has
    one): a name found only after expanding, or a source with ``#if`` lines."""
    from conveyor.kernels.signature import kernel_names, parse_params

    if device is None:
        # parse_params, not kernel_names: "add_##T(" is no kernel "add_" (it wants "NAME(").
        try:
            parse_params(source, name)
        except InputError:
            pass
        else:
            return True
    from conveyor.kernels.preprocess import expand_checked  # only now: pcpp costs ~50 ms

    macros = tuple(sorted(device.source_macros().items())) if device is not None else ()
    text, expanded = expand_checked(source, (), macros)
    if not expanded:  # pcpp failed on it (it warned): the raw text is all there is
        text = source
    found = kernel_names(text)
    if name in found:
        return device is not None
    if device is None and _CONDITIONAL.search(source):
        return False  # an #ifdef cl_khr_fp64 around it, say: the device's macros decide
    listing = ", ".join(dict.fromkeys(found)) or "none"
    raise InputError(f"no kernel named {name!r} in the source (after its #define and #if); "
                     f"kernels found: {listing}: pass one of them with --kernel")


_CONDITIONAL = re.compile(r"^[ \t]*#[ \t]*(?:if|ifdef|ifndef|elif)\b", re.M)


class _Written(fractions.Fraction):
    """A ``--arg`` with a fraction whose float would truncate to another integer
    (``9007199254740993.5`` is ...994.0 as a float): its exact value, so that an integer
    parameter gets the written number truncated (...993) and a float one its nearest float;
    shown as written in messages."""

    text = ""

    def __repr__(self) -> str:
        return self.text

    def __reduce__(self) -> tuple[object, tuple[str]]:  # to a cluster's workers, as written
        return (_number, (self.text,))


def _number(text: str) -> int | float | fractions.Fraction:
    try:
        whole = int(text)
    except ValueError:
        pass
    else:  # "-0" is the float -0.0 (its sign matters to a float parameter), 0 to an int one
        return -0.0 if whole == 0 and text.strip().startswith("-") else whole
    try:
        value = float(text)
    except ValueError as exc:
        raise InputError(f"--arg {text!r} is not a number: pass scalars like 2 or 2.5") from exc
    if math.isinf(value) and text.strip().lstrip("+-").lower() not in ("inf", "infinity"):
        # float("1e400") is inf: a number past every float would otherwise run as infinity
        raise InputError(f"--arg {text} is past the largest float (1.8e308): it would be "
                         f"infinity; pass a smaller number, or inf if infinity is meant")
    try:
        exact = decimal.Decimal(text.strip())
    except decimal.InvalidOperation:  # a spelling float() takes and Decimal does not
        return value
    if exact.is_finite() and exact != exact.to_integral_value() and math.isfinite(value) \
            and int(exact) != math.trunc(value):
        written = _Written(exact)
        written.text = text.strip()
        return written
    if exact.is_finite() and exact == exact.to_integral_value() and \
            abs(exact) < 2**64 and decimal.Decimal(value) != exact:
        # A whole number written as a float past 2**53 ("9007199254740993.0"): as a float it
        # would reach a 64-bit integer parameter rounded (...992). (Past 2**64 no integer
        # parameter holds it: it stays the float it was written as.)
        return int(exact)
    return value


def _plain(value: Any) -> Any:
    """A NumPy result as plain Python (a number, or nested lists for an array)."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    return value


def _print_json(options: argparse.Namespace, report: cv.Report, **extra: Any) -> None:
    figures: dict[str, Any] = {
        "command": options.command, "kernel": options.kernel, "device": report.device,
        **{key: _plain(value) for key, value in extra.items()},
        "seconds": report.seconds, "bytes_in": report.bytes_in, "bytes_out": report.bytes_out,
        "gbps_in": report.gbps_in, "gbps_out": report.gbps_out, "blocks": report.blocks,
        "block_rows": report.block_rows, "depth": report.depth,
        "zero_copy": report.zero_copy, "peak_device_bytes": report.peak_device_bytes,
    }
    if report.devices:
        figures["devices"] = [{"device": r.device, "blocks": r.blocks, "bytes_in": r.bytes_in,
                               "seconds": r.seconds} for r in report.devices]
        figures["imbalance"] = report.imbalance
    if report.blocks:
        figures.update({
            "overlap": report.overlap, "bound": report.bound,
            "exposed_transfer_seconds": report.exposed_transfer_seconds,
            "host_stall_seconds": report.host_stall_seconds,
            "busy_seconds": report.busy_seconds,
            "ceiling_ratio_in": report.ceiling_ratio_in,
            "ceiling_ratio_out": report.ceiling_ratio_out,
        })
    if report.trace_file:
        figures["trace"] = report.trace_file
    if getattr(options, "plot", None):
        figures["plot"] = options.plot
    print(json.dumps(_finite(figures)))


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: such floats are written as the strings "nan", "inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value
