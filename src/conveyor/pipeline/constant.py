"""``__constant`` buffers (OpenCL): how many rows of a block fit the device's constant memory.

A kernel parameter declared ``__constant`` is bound to a buffer that, by the OpenCL
specification, fits ``CL_DEVICE_MAX_CONSTANT_BUFFER_SIZE`` (64 KiB on NVIDIA) together with the
kernel's other ``__constant`` buffers; a driver may fail a launch past it. A stream input bound
to one is cut into blocks that fit beside the ``__constant`` tables in ``args=``. Where that
cannot be (the tables alone pass it, or not one row fits beside them) the stream runs as asked
with a warning: PoCL does not enforce the size, and NVIDIA's OpenCL ran a kernel reading 4
times it right (an H100, driver 580, 2026-11-24), so a refusal would stop work that runs.
CUDA has no such parameters.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from conveyor.backends.base import Device, Kernel
from conveyor.pipeline import validate


def constant_rows(compute: Any, dev: Device, sources: Sequence[Any], halo: int,
                  max_rows: int | None, residents: Any = None) -> tuple[int | None, str]:
    """``max_rows`` (an image height's cap, or None) capped so that the block (and halo
    rows) of every input a kernel (or a chain's kernel link) reads through ``__constant``
    fits the device's constant buffers together with that kernel's ``__constant`` tables in
    ``args=`` (``residents``, or each link's own), and which cap it is (make_plan's
    ``block_cap``). A warning, and no cap for that kernel, when its tables alone do not
    fit, or not one row does beside them (the module's docstring says why)."""
    cap = dev.max_constant_bytes
    if cap is None:
        return max_rows, "image"
    kernels: list[tuple[str, dict[int, str], dict[int, tuple[str, int]]]] = []
    if isinstance(compute, Kernel):
        params = [p for p in compute.params if "sampler" not in p.base]  # an image's pair
        kernels.append(("", {i: f"parameter {p.name!r} of kernel {compute.name!r}"
                             for i, p in enumerate(params[:len(sources)])
                             if p.address == "constant"},
                        getattr(residents, "constant", {})))
    for link in getattr(compute, "links", ()):  # a bound chain (pipeline/chainbind.py)
        if isinstance(link.compute, Kernel):
            kernels.append((f"{link.where()}: ",
                            {ref.index: f"parameter {p.name!r} of {link.where()}"
                             for ref, p in zip(link.reads, link.compute.params, strict=False)
                             if ref.kind == "in" and p.address == "constant"},
                            getattr(getattr(link, "residents", None), "constant", {})))
    rows: int | None = None
    for where, bound, tables in kernels:
        table_bytes = sum(nbytes for _, nbytes in tables.values())
        if table_bytes > cap:
            named = ", ".join(f"args[{i}] (parameter {name!r})"
                              for i, (name, _) in tables.items())
            _warn(f"{where}{named}: __constant tables of {table_bytes} bytes, more than the "
                  f"device's constant buffers hold ({cap} bytes, "
                  f"CL_DEVICE_MAX_CONSTANT_BUFFER_SIZE)", "the parameter")
            continue
        if not bound:
            continue
        # Per row as the device buffer holds it: an input narrower than input 0 is padded to
        # input 0's elements a row (plan.ArraySpec.device_bytes).
        first = validate.spec(sources[0])
        row_bytes = sum(max((spec := validate.spec(sources[i])).row_bytes,
                            first.row_items * spec.dtype.itemsize) for i in bound)
        fit = (cap - table_bytes) // max(row_bytes, 1) - 2 * halo
        if fit < 1:
            named = ", ".join(f"input {i} ({what})" for i, what in sorted(bound.items()))
            _warn(f"{named}: __constant, and {1 + 2 * halo} row(s) of it ({row_bytes} bytes a "
                  f"row{f', halo={halo}' if halo else ''}) do not fit the device's constant "
                  f"buffers ({cap} bytes, CL_DEVICE_MAX_CONSTANT_BUFFER_SIZE"
                  f"{f', less {table_bytes} of __constant tables in args=' if table_bytes else ''}"
                  f")", "it")
            continue
        rows = fit if rows is None else min(rows, fit)
    if rows is None or (max_rows is not None and max_rows <= rows):
        return max_rows, "image"
    return rows, "constant"


def _warn(what: str, it: str) -> None:
    warnings.warn(f"conveyor: {what}: some OpenCL drivers fail such a launch (PoCL and "
                  f"NVIDIA's run it); declare {it} __global const to be safe", RuntimeWarning,
                  stacklevel=4)
