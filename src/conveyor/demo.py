"""``conveyor demo`` (what ``make demo`` runs; also ``python -m conveyor.demo``): stream a
dataset 8× larger than the memory limit it sets through a kernel on the default device, check
it, say how fast it went; with ``--trace`` / ``--plot``, write a Chrome trace and a timeline
PNG (with matplotlib) there. It writes nothing else, and replaces an existing file only with
``--force``.

Runs on the default device: a CUDA or OpenCL GPU where there is one, PoCL's CPU device
elsewhere. ``--device SPEC`` picks another; ``--mib`` sets the size of each input.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time

import numpy as np

import conveyor as cv

# One source for both backends: cv.portable makes NVRTC read the OpenCL spellings.
SAXPY = cv.portable("""
__kernel void saxpy(__global const float *x, __global const float *y, __global float *out,
                    float a, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) out[i] = a * x[i] + y[i];
}
""")


def main(argv: list[str] | None = None) -> int:
    """``python -m conveyor.demo``: parse the options and run the demo (``conveyor demo`` is
    the same); return the exit code (0 when the result checks out)."""
    parser = argparse.ArgumentParser(prog="python -m conveyor.demo", description=__doc__)
    add_options(parser)
    options = parser.parse_args(argv)
    from conveyor.cli.files import refuse_to_replace

    try:
        options.plot = plot_file(options.plot)
        refuse_to_replace([("--trace", options.trace), ("--plot", options.plot)],
                          options.force)
    except cv.InputError as exc:
        parser.error(str(exc))
    return run(options.device, options.mib, options.trace, options.plot)


def plot_file(plot: str | None) -> str | None:
    """The file ``--plot`` writes (``x`` writes ``x.png``), its name and format checked
    before the demo runs; as given without matplotlib (the demo then says it draws no
    timeline)."""
    if not plot or importlib.util.find_spec("matplotlib") is None:
        return plot
    from conveyor.trace.plot import plot_file

    return plot_file(plot, f"--plot {plot}")


def add_options(parser: argparse.ArgumentParser) -> None:
    """The demo's command-line options (shared with ``conveyor demo``)."""
    parser.add_argument("--device", default=None, help="device spec (default: the best)")
    parser.add_argument("--mib", type=int, default=256, metavar="N", help="MiB per input")
    parser.add_argument("--trace", metavar="JSON", help="write a Chrome trace here")
    parser.add_argument("--plot", metavar="PNG",
                        help="write a timeline PNG here (needs matplotlib: conveyor[plot])")
    parser.add_argument("--force", action="store_true",
                        help="replace trace and plot files that already exist")


def run(device_spec: str | None, mib: int, trace: str | None, plot: str | None) -> int:
    """Stream 2 x ``mib`` MiB through saxpy with a memory limit of 1/8 of the data; check the
    result against NumPy; write the Chrome trace and (with matplotlib) the timeline PNG where
    ``trace`` and ``plot`` say (None: not at all)."""
    if mib < 1:
        raise cv.InputError(f"--mib {mib}: give at least 1 MiB per input")
    dev = cv.device(device_spec)
    rows = mib * 2**20 // 4
    in_bytes = 2 * rows * 4
    memory_limit = in_bytes // 8  # the data is 8x the device memory conveyor may use
    print(f"device: {dev.spec} {dev.name} ({dev.kind}, {dev.backend})")
    print(f"data: 2 inputs x {mib} MiB float32 in, {mib} MiB out; "
          f"memory limit {size_text(memory_limit)}")
    rng = np.random.default_rng(0)
    x = rng.random(rows, dtype=np.float32)
    y = rng.random(rows, dtype=np.float32)
    out = np.empty_like(x)
    out.fill(0)  # touch the output's pages now, so the stream does not time page faults
    started = time.perf_counter()
    kernel = dev.compile(SAXPY, "saxpy")
    print(f"kernel built and loaded in {time.perf_counter() - started:.3f} s")
    report = cv.stream(kernel, [x, y], [out], device=dev, args=(2.0,),
                       memory_limit=memory_limit, trace=trace)
    expected = np.float32(2.0) * x + y
    if not np.array_equal(out, expected):
        bad = int(np.count_nonzero(out != expected))
        print(f"FAILED: {bad} of {rows} elements differ from NumPy", file=sys.stderr)
        return 1
    print(report)
    print(f"result checked against NumPy: all {rows} elements equal")
    print(f"peak device memory {size_text(report.peak_device_bytes)} "
          f"<= limit {size_text(memory_limit)}")
    if report.trace_file:
        print(f"trace written to {report.trace_file} (open it in https://ui.perfetto.dev)")
    if not trace and not plot:
        print("to see the timeline: add --trace demo.json --plot demo.png")
    if plot:
        if importlib.util.find_spec("matplotlib") is None:
            print("no timeline PNG: matplotlib is not installed (pip install 'conveyor[plot]')")
        else:
            from conveyor.trace.plot import plot_timeline

            plot_timeline(report.timeline, plot, title=f"conveyor demo on {dev.spec}")
            print(f"timeline written to {plot}")
    return 0


def size_text(nbytes: float) -> str:
    """``nbytes`` in MiB, or in KiB below 1 MiB, to one decimal at most: ``--mib 1`` sets a
    limit of 256 KiB, which whole MiB would print as "0 MiB". Rounding is monotonic, so a peak
    within the limit never prints above it."""
    value, unit = (nbytes / 2**20, "MiB") if nbytes >= 2**20 else (nbytes / 2**10, "KiB")
    return f"{value:.1f}".removesuffix(".0") + f" {unit}"


if __name__ == "__main__":
    sys.exit(main())
