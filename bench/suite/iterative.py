"""Issue 17's extra figures for the suite: the first call in a fresh process (bench/first_call.py
as a subprocess), the host staging bound of each workload, and the iterative case (the same
pageable arrays streamed ``passes`` times, without and with ``keep_pinned=True``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import conveyor as cv

from .workloads import Workload, parallel_fill

ROOT = Path(__file__).resolve().parent.parent.parent


def staged_per_input(wl: Workload) -> float:
    """Host bytes copied (pageable to pinned and back) per input byte: in 1, out out/in."""
    return (wl.in_bytes + wl.out_bytes) / wl.in_bytes


def host_bound(wl: Workload, link: float, memcpy: float | None,
               memcpy_beside_link: float | None = None) -> dict[str, Any]:
    """``min(link, host copy rate ÷ bytes staged per input byte)`` in input GB/s (``link``:
    the pinned H2D ceiling); with ``memcpy_beside_link``, the same bound from the host copy
    rate measured while pinned copies keep the link busy both ways, as a stream's DMA does."""
    per = staged_per_input(wl)
    host = None if memcpy is None else memcpy / per
    beside = None if memcpy_beside_link is None else memcpy_beside_link / per
    return {"staged_per_input_byte": per, "host_gbps": host, "link_gbps": link,
            "bound_gbps": link if host is None else min(link, host),
            "host_beside_link_gbps": beside,
            "bound_beside_link_gbps": None if beside is None else min(link, beside)}


def first_call(spec: str, workload: str, gib: float, flops: int = 2000, timeout: float = 900,
               data_first: bool = False) -> dict[str, Any]:
    """bench/first_call.py in a fresh process (``data_first``: the inputs made before the
    device is opened): its JSON, or {"error": ...}."""
    from bench import bytecode

    env = bytecode.env()  # as an installed package: no module compiled inside the first call
    try:
        done = subprocess.run([sys.executable, "-m", "bench.first_call", "--workload", workload,
                               "--gib", str(gib), "--device", spec,
                               "--flops", str(flops), *(["--data-first"] * data_first)],
                              env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode:
        return {"error": (done.stderr.strip() or done.stdout.strip())[-300:]}
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def iterative(dev: cv.Device, wl: Workload, passes: int, block_elems: int, depth: int
              ) -> dict[str, Any]:
    """Input GB/s of each pass over the same pageable inputs, without and with keep_pinned."""
    kernel = dev.compile(wl.source, wl.kernel)
    out = None if wl.reduce else np.empty(wl.n, np.float32)
    if out is not None:
        parallel_fill(out, 0.0)
    options = dict(device=dev, depth=depth, block_bytes=block_elems * 4, halo=wl.halo,
                   args=wl.args)
    figures: dict[str, Any] = {}
    for keep in (False, True):
        cv.release_pinned()
        rates = []
        for _ in range(passes):
            start = time.perf_counter()
            if wl.reduce:
                report = cv.stream(kernel, wl.inputs, reduce="sum", keep_pinned=keep, **options)
            else:
                report = cv.stream(kernel, wl.inputs, [out], keep_pinned=keep, **options)
            seconds = time.perf_counter() - start
            total = None if report.result is None else float(report.result)
            check = wl.check(out, total)
            if check != "ok":
                raise RuntimeError(f"iterative {wl.name} keep_pinned={keep}: {check}")
            rates.append(wl.in_bytes / seconds / 1e9)
        figures["kept" if keep else "plain"] = rates
    cv.release_pinned()
    return figures
