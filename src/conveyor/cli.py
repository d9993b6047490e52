"""The ``conveyor`` command: devices, map, reduce, demo, bench, cache.

Exit codes: 0 success; 2 bad usage or input (argparse errors and every InputError: the one-line
message says what to change); 1 a runtime failure (a kernel that does not build, a driver
error); 130 interrupted (Ctrl-C or SIGTERM). A failed or interrupted ``map`` leaves no output
file behind: outputs are renamed into place only when the whole stream has succeeded.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import conveyor as cv
from conveyor.errors import ConveyorError, InputError

KERNEL_SUFFIXES = {".cl": "opencl", ".cu": "cuda"}
_SIZE = re.compile(r"^\s*([0-9.]+(?:e[0-9]+)?)\s*([kmgt]i?b?|b)?\s*$", re.I)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    parser = _parser()
    options = parser.parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        result: int = options.run(options)
        return result
    except InputError as exc:
        _say(f"conveyor {options.command}: {_one_line(exc)}")
        return 2
    except KeyboardInterrupt:
        _say(f"conveyor {options.command}: interrupted; no output was written")
        return 130
    except ConveyorError as exc:
        _say(f"conveyor {options.command}: {exc}")  # a CompileError carries its log
        return 1
    except OSError as exc:
        _say(f"conveyor {options.command}: {exc}: check the path and its permissions")
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # the same clean-up as Ctrl-C: no partial output stays


def _say(message: str) -> None:
    print(message, file=sys.stderr)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


# -- the parser -------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="conveyor",
        description="Stream data larger than device memory through GPU kernels.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    devices = commands.add_parser("devices", help="list devices (and measure their link)")
    devices.add_argument("--measure", action="store_true",
                         help="measure pinned/pageable copy bandwidth each way and cache it")
    devices.set_defaults(run=_devices)

    for name, helptext in (("map", "stream files through a kernel into output files"),
                           ("reduce", "fold a kernel's per-element values over files")):
        sub = commands.add_parser(name, help=helptext)
        sub.add_argument("kernel_file", metavar="KERNEL_FILE",
                         help="OpenCL C (.cl) or CUDA C (.cu) source")
        sub.add_argument("--kernel", required=True, metavar="NAME", help="kernel to run")
        sub.add_argument("-i", "--input", action="append", required=True, dest="inputs",
                         metavar="FILE", help=".npy, .parquet, .arrow/.feather or raw binary")
        if name == "map":
            sub.add_argument("-o", "--output", action="append", required=True, dest="outputs",
                             metavar="FILE.npy", help="output .npy file (repeat for more)")
            sub.add_argument("--halo", type=int, default=0, metavar="H",
                             help="extra rows before and after each input block")
            sub.add_argument("--plot", metavar="PNG", help="timeline figure (conveyor[plot])")
        else:
            sub.add_argument("--op", choices=("sum", "min", "max"), default="sum")
        sub.add_argument("--arg", action="append", default=[], dest="args", metavar="VALUE",
                         help="scalar kernel argument after the buffers (repeat for more)")
        sub.add_argument("--dtype", help="element type of raw binary inputs (e.g. float32)")
        sub.add_argument("--shape", help="shape of raw binary inputs, e.g. -1,3")
        sub.add_argument("--column", action="append", default=None, dest="columns",
                         help="Parquet/Arrow column(s) to read (repeat for a 2-D input)")
        _common(sub)
        sub.set_defaults(run=_map if name == "map" else _reduce)

    demo = commands.add_parser("demo", help="stream a dataset 8x the memory limit it sets")
    from conveyor import demo as demo_module

    demo_module.add_options(demo)
    demo.set_defaults(run=_demo)

    bench = commands.add_parser("bench", help="link bandwidth, and conveyor vs a naive loop")
    bench.add_argument("--device", help="device spec (default: the best)")
    bench.add_argument("--mib", type=int, default=64, help="MiB per input (default 64)")
    bench.set_defaults(run=_bench)

    cache = commands.add_parser("cache", help="the kernel cache: info or clear")
    cache.add_argument("action", choices=("info", "clear"))
    cache.set_defaults(run=_cache)
    return parser


def _common(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--device", help="device spec: cuda, cuda:1, opencl, opencl:0:1, cpu, gpu")
    sub.add_argument("--memory-limit", type=_size, metavar="SIZE",
                     help="device memory the stream may use, e.g. 1GiB, 512MiB")
    sub.add_argument("--trace", metavar="JSON", help="write a Chrome trace (opens in Perfetto)")
    sub.add_argument("--quiet", action="store_true", help="no progress bar")


def _size(text: str) -> int:
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: use e.g. 1GiB, 512MiB, 1e9")
    number, unit = match.groups()
    unit = (unit or "").lower()
    base = 1024 if "i" in unit else 1000
    scale = base ** "bkmgt".index(unit[0]) if unit and unit[0] != "b" else 1
    return int(float(number) * scale)


# -- devices ------------------------------------------------------------------------------------
def _devices(options: argparse.Namespace) -> int:
    from conveyor.backends.diagnose import problems

    found = cv.devices()
    rows = [("SPEC", "BACKEND", "KIND", "MEMORY", "CUS", "SVM", "UNIFIED", "NAME")]
    for dev in found:
        rows.append((dev.spec, dev.backend, dev.kind, f"{dev.global_mem_bytes / 2**30:.1f} GiB",
                     str(dev.compute_units), "yes" if dev.svm else "no",
                     "yes" if dev.host_unified else "no", dev.name))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if not found:
        print("no device found: install pocl-binary-distribution, or a GPU driver")
    for problem in problems(found, probe=True):
        print(f"note: {problem}")
    if options.measure:
        _measure_all(found)
    return 0


def _measure_all(found: list[cv.Device]) -> None:
    from conveyor.measure import link_bandwidth

    print("\nlink bandwidth, GB/s (best of 3 copies of 64 MiB):")
    print(f"{'SPEC':<14}{'pinned in':>10}{'pinned out':>11}{'pageable in':>12}"
          f"{'pageable out':>13}")
    for dev in found:
        try:
            figures = link_bandwidth(dev)
        except ConveyorError as exc:
            print(f"{dev.spec:<14}cannot measure: {_one_line(exc)}")
            continue
        print(f"{dev.spec:<14}{figures.pinned_h2d_gbps:>10.2f}{figures.pinned_d2h_gbps:>11.2f}"
              f"{figures.pageable_h2d_gbps:>12.2f}{figures.pageable_d2h_gbps:>13.2f}")
        try:
            from conveyor.trace.ceiling import save_link_ceiling

            where = save_link_ceiling(dev.spec, dev.name, figures.as_dict())
        except (ImportError, OSError, ConveyorError) as exc:
            print(f"  (not cached: {_one_line(exc)})")
        else:
            print(f"  cached in {where}")


# -- map and reduce ----------------------------------------------------------------------------
def _map(options: argparse.Namespace) -> int:
    if options.plot and importlib.util.find_spec("matplotlib") is None:
        raise InputError("--plot needs matplotlib: pip install 'conveyor[plot]'")
    for path in options.outputs:
        if Path(path).suffix.lower() != ".npy":
            raise InputError(f"output {path}: outputs are .npy files; name it {path}.npy")
    report = _stream(options, outputs=[cv.npy_out(p) for p in options.outputs])
    print(report)
    print(f"wrote {', '.join(options.outputs)}")
    if options.trace:
        print(f"trace written to {options.trace}")
    if options.plot:
        from conveyor.trace.plot import plot_timeline

        plot_timeline(report.timeline, options.plot, title=f"conveyor map {options.kernel}")
        print(f"timeline written to {options.plot}")
    return 0


def _reduce(options: argparse.Namespace) -> int:
    report = _stream(options, outputs=[], reduce=options.op)
    print(report)
    print(f"{options.op} = {report.result}")
    return 0


def _stream(options: argparse.Namespace, outputs: list[Any],
            reduce: str | None = None) -> cv.Report:
    """Check everything that can be checked cheaply, then build the kernel and stream."""
    kernel_path = Path(options.kernel_file)
    backend = KERNEL_SUFFIXES.get(kernel_path.suffix.lower())
    if backend is None:
        raise InputError(f"{kernel_path}: name OpenCL C sources .cl and CUDA C sources .cu")
    try:
        source = kernel_path.read_text()
    except OSError as exc:
        raise InputError(f"cannot read kernel file {kernel_path} ({exc.strerror}): "
                         f"check the path") from exc
    from conveyor.kernels.signature import parse_params

    parse_params(source, options.kernel)  # a wrong --kernel fails before any file is read
    inputs = [_input(path, options) for path in options.inputs]
    dev = cv.device(options.device)
    if dev.backend != backend:
        other = "cuda" if backend == "cuda" else "opencl"
        raise InputError(
            f"{kernel_path.name} is {'CUDA' if backend == 'cuda' else 'OpenCL'} C but "
            f"{dev.spec} is an {dev.backend} device: pass --device {other}, or write the "
            f"kernel as {'.cl' if dev.backend == 'opencl' else '.cu'}"
        )
    kernel = dev.compile(source, options.kernel)
    return cv.stream(kernel, inputs, outputs, device=dev, memory_limit=options.memory_limit,
                     halo=getattr(options, "halo", 0), reduce=reduce,
                     args=[_number(a) for a in options.args],
                     progress=not options.quiet, trace=options.trace)


def _input(path: str, options: argparse.Namespace) -> Any:
    suffix = Path(path).suffix.lower()
    if suffix == ".npy":
        return cv.npy(path)
    if suffix in (".parquet", ".pq", ".arrow", ".feather", ".ipc"):
        if not options.columns:
            raise InputError(f"{path}: say which column to read with --column NAME")
        columns = options.columns[0] if len(options.columns) == 1 else options.columns
        if suffix in (".parquet", ".pq"):
            return cv.parquet(path, columns)
        return cv.arrow(path, columns)
    if options.dtype is None:
        raise InputError(f"{path} is not .npy, .parquet or .arrow: for a raw binary file "
                         f"give --dtype (e.g. float32) and, for N-D data, --shape -1,3")
    try:
        dtype = np.dtype(options.dtype)
    except TypeError as exc:
        raise InputError(f"--dtype {options.dtype!r} is not a NumPy dtype: use e.g. float32")\
            from exc
    return cv.raw(path, dtype, _shape(options.shape))


def _shape(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.replace("x", ",").split(",") if part.strip())
    except ValueError as exc:
        raise InputError(f"--shape {text!r}: give integers separated by commas, e.g. -1,3")\
            from exc


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError as exc:
        raise InputError(f"--arg {text!r} is not a number: pass scalars like 2 or 2.5") from exc


# -- demo, bench, cache -------------------------------------------------------------------------
def _demo(options: argparse.Namespace) -> int:
    from conveyor import demo

    return demo.run(options.device, options.mib, options.trace, options.plot)


def _bench(options: argparse.Namespace) -> int:
    from conveyor.demo import SAXPY
    from conveyor.measure import link_bandwidth, naive_loop

    if options.mib < 1:
        raise InputError(f"--mib {options.mib}: give at least 1 MiB per input")
    dev = cv.device(options.device)
    print(f"device: {dev.spec} {dev.name} ({dev.kind}, {dev.backend})")
    link = link_bandwidth(dev)
    print(f"link, GB/s: pinned in {link.pinned_h2d_gbps:.2f}, out {link.pinned_d2h_gbps:.2f}; "
          f"pageable in {link.pageable_h2d_gbps:.2f}, out {link.pageable_d2h_gbps:.2f}")
    rows = options.mib * 2**20 // 4
    rng = np.random.default_rng(0)
    x = rng.random(rows, dtype=np.float32)
    y = rng.random(rows, dtype=np.float32)
    out = np.zeros_like(x)
    kernel = dev.compile(SAXPY, "saxpy")
    report = cv.stream(kernel, [x, y], [out], device=dev, args=(2.0,))
    block_rows = report.block_rows
    naive_out = np.zeros_like(x)
    naive_seconds = naive_loop(dev, kernel, [x, y], naive_out, block_rows, args=(2.0,))
    if not np.array_equal(out, naive_out):
        raise ConveyorError("conveyor and the naive loop disagree: please report this")
    moved = x.nbytes + y.nbytes + out.nbytes
    fast = moved / report.seconds / 1e9
    slow = moved / naive_seconds / 1e9
    print(f"saxpy, 2 x {options.mib} MiB in, {options.mib} MiB out, blocks of {block_rows} rows:")
    print(f"  conveyor   {report.seconds:7.3f} s  {fast:7.2f} GB/s in+out"
          f"{'  (zero-copy)' if report.zero_copy else ''}")
    print(f"  naive loop {naive_seconds:7.3f} s  {slow:7.2f} GB/s in+out")
    print(f"  conveyor is {naive_seconds / report.seconds:.2f}x the naive loop; pinned link "
          f"ceiling {link.pinned_h2d_gbps:.2f} GB/s in")
    return 0


def _cache(options: argparse.Namespace) -> int:
    from conveyor.kernels.build import default_cache

    cache = default_cache()
    if cache is None:
        print("the kernel cache is off (CONVEYOR_NO_CACHE is set)")
        return 0
    if options.action == "clear":
        removed = cache.clear()
        print(f"removed {removed} entries from {cache.path}")
        return 0
    info = cache.info()
    state = "on" if info.enabled else "off (the directory was refused; see the warning)"
    print(f"kernel cache {info.path}: {state}, {info.entries} entries, "
          f"{info.total_bytes / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
