"""``conveyor map/reduce --scheduler ADDRESS`` (or ``--cluster local|local-cuda``): the same
command, run by ``conveyor.dask.stream`` as one stream per worker over its rows of the files.

The client reads only the kernel file and the inputs' headers; each worker builds the kernel
and opens its own device (``--device`` names it on the workers).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from conveyor.cli.inputs import Input, check_options, open_input
from conveyor.errors import InputError


def on_cluster(options: argparse.Namespace) -> bool:
    """True when the command should run on a Dask cluster."""
    return (getattr(options, "scheduler", None) is not None
            or getattr(options, "cluster", None) is not None)  # --scheduler '' is an error


def run(options: argparse.Namespace, outputs: list[str], reduce: str | None) -> int:
    """Run map (``outputs``) or reduce (``reduce``) on the cluster; print like the local
    command (the per-range table instead of the report)."""
    from conveyor.cli.streaming import _finite, _number, _plain
    from conveyor.dask import kernel, stream
    from conveyor.dask.cluster import connect

    if options.cast:
        raise InputError("--cast is not supported with --scheduler/--cluster: convert the "
                         "inputs first")
    for flag in ("trace", "plot"):
        if getattr(options, flag, None):
            raise InputError(f"--{flag} is per-process: drop it with --scheduler/--cluster")
    if getattr(options, "schedule", None) == "static":  # it was taken and ignored
        raise InputError("--schedule shares blocks among the devices of one process; each "
                         "worker streams on one device: drop it with --scheduler/--cluster")
    if getattr(options, "progress", None):
        raise InputError("--progress draws a bar for a stream of this process; the workers "
                         "stream theirs: drop it with --scheduler/--cluster (the command "
                         "prints each worker's rows when they are done)")
    from conveyor.cli.streaming import check_backend, kernel_source

    source, backend = kernel_source(options)
    device = _one_device(options.device)
    named = (device or "").strip().lower().split(":")[0]
    if named in ("opencl", "cuda"):  # the workers' own default is theirs to choose
        check_backend(Path(options.kernel_file), backend, device or "", named)
    spec = kernel(source, options.kernel)
    inputs = [Input(text) for text in options.inputs]
    options.input_names = [item.text for item in inputs]
    check_options(inputs, options)
    for item in inputs:
        if item.kind == "table":
            raise InputError(f"-i {item.text}: Parquet/Arrow inputs are read on one machine; "
                             f"with --scheduler/--cluster give .npy or raw files (each worker "
                             f"reads its own rows), or drop --scheduler/--cluster")
    sources = [open_input(item, options) for item in inputs]
    with connect(options.scheduler, options.cluster) as client:
        report = stream(spec, sources, outputs, client=client, reduce=reduce,
                        args=[_number(a) for a in options.args],
                        halo=options.halo, boundary=options.boundary, device=device,
                        depth=options.depth, block_bytes=options.block_bytes,
                        memory_limit=options.memory_limit, workers=options.workers)
    if options.json:
        figures: dict[str, Any] = {"command": options.command, "kernel": options.kernel,
                                   "seconds": report.seconds, "ranges": report.ranges}
        if reduce is not None:
            figures["result"] = _plain(report.result)
        else:
            figures["outputs"] = outputs
        print(json.dumps(_finite(figures)))  # NaN and inf as strings: JSON has neither
    elif options.quiet:
        if reduce is not None:
            print(_plain(report.result))
    else:
        for part in report.ranges:
            lo, hi = part["rows"]
            print(f"rows {lo}:{hi} on {part['worker']}: {part['blocks']} blocks, "
                  f"{part['seconds']:.3f} s")
        if reduce is not None:
            print(f"{options.op} = {_plain(report.result)}")
        else:
            print(f"wrote {', '.join(outputs)}")
    return 0


def _one_device(specs: list[str] | None) -> str | None:
    """The one ``--device`` of a cluster run (each worker streams on its own device)."""
    if specs and len(specs) > 1:
        raise InputError("--device once with --scheduler/--cluster: each worker streams on "
                         "one device (local-cuda starts one worker per GPU)")
    return specs[0] if specs else None
