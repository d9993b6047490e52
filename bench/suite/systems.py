"""The systems under test and what they share: conveyor on CUDA and on OpenCL, and the naive
PyOpenCL loop. The CuPy and PyTorch peers are in ``cuda_peers``.

A system turns a workload and its inputs (the caller's pageable NumPy arrays, or what
``pin_inputs`` made) into a ``Runner``: everything that may be set up once (kernels, device
buffers, staging memory, streams) is made before timing; ``Runner.run()`` is one full,
synchronised pass over the data and returns (seconds, reduction total or None, extra figures).
"""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import conveyor as cv

from .workloads import Workload, block_ranges, halo_pieces, parallel_copy

RunResult = tuple[float, float | None, dict[str, Any]]

#: Work items of the naive loop's reduction kernel (and float64 partials read back per block).
PARTIALS = 16384
PARTIAL_SUMS = f"""
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
__kernel void partial_sums(__global const float *y, __global double *partial, ulong n) {{
    ulong i = get_global_id(0);
    double acc = 0.0;
    for (ulong j = i; j < n; j += {PARTIALS}) acc += y[j];
    partial[i] = acc;
}}
"""


@dataclass
class Runner:
    """``run()`` streams the whole workload once; ``close()`` frees what the runner holds."""

    run: Callable[[], RunResult]
    close: Callable[[], None] = field(default=lambda: None)


class System:
    """A way of streaming the data. ``kinds``: the input kinds it runs ("pageable", "pinned")."""

    name = "?"
    device_spec = ""
    kinds: tuple[str, ...] = ("pageable", "pinned")

    def __init__(self, block_elems: int, depth: int) -> None:
        self.block_elems = block_elems
        self.depth = depth

    def pin_inputs(self, arrays: list[np.ndarray]) -> list[Any]:
        """The inputs in this system's own pinned memory (made once, before timing)."""
        raise NotImplementedError

    def pin_output(self, n: int) -> tuple[Any, np.ndarray]:
        """A pinned float32 output of n elements: (what the runner writes, its NumPy view)."""
        raise NotImplementedError

    def runner(self, wl: Workload, inputs: list[Any], output: Any, kind: str) -> Runner:
        """Set up a runner for ``wl`` on ``inputs`` writing ``output`` (None for reductions)."""
        raise NotImplementedError

    def trim(self) -> None:
        """Free the pinned and device memory this system's pools hold (between workloads)."""
        gc.collect()


# -- conveyor ------------------------------------------------------------------------------
class Conveyor(System):
    """``cv.stream`` with its defaults, except ``block_bytes`` and ``depth``."""

    def __init__(self, name: str, dev: cv.Device, block_elems: int, depth: int) -> None:
        super().__init__(block_elems, depth)
        self.name = name
        self.dev = dev
        self.device_spec = dev.spec
        self.last_report: cv.Report | None = None  # the last run's (bench/pinned_ab.py --trace)

    def pin_inputs(self, arrays: list[np.ndarray]) -> list[Any]:
        pinned = []
        for a in arrays:
            p = cv.pinned.empty(a.shape, a.dtype, device=self.dev)
            parallel_copy(p, a)
            pinned.append(p)
        return pinned

    def pin_output(self, n: int) -> tuple[Any, np.ndarray]:
        out = cv.pinned.empty(n, np.float32, device=self.dev)
        return out, out

    def runner(self, wl: Workload, inputs: list[Any], output: Any, kind: str) -> Runner:
        kernel = self.dev.compile(wl.source, wl.kernel)
        options = dict(device=self.dev, depth=self.depth, block_bytes=self.block_elems * 4,
                       halo=wl.halo, args=wl.args)

        def run() -> RunResult:
            start = time.perf_counter()
            if wl.reduce:
                report = cv.stream(kernel, inputs, reduce="sum", **options)
            else:
                report = cv.stream(kernel, inputs, [output], **options)
            seconds = time.perf_counter() - start
            self.last_report = report
            exposed = report.exposed_transfer_seconds
            extra = {
                "stream_seconds": report.seconds,
                "gbps_in_report": report.gbps_in,
                "blocks": report.blocks,
                "zero_copy": report.zero_copy,
                "overlap": report.overlap,
                "bound": report.bound,
                "exposed_transfer_seconds": exposed,
                "exposed_share": None if exposed is None else exposed / report.seconds,
                "host_stall_seconds": report.host_stall_seconds,
                "busy_seconds": report.busy_seconds,
            }
            total = None if report.result is None else float(report.result)
            return seconds, total, extra

        return Runner(run)

    def trim(self) -> None:
        gc.collect()
        self.dev.pinned_pool.trim()
        self.dev.memory_pool.trim()


# -- the naive PyOpenCL loop ---------------------------------------------------------------
class NaivePyOpenCL(System):
    """What people write first: per block, blocking copies of NumPy slices in, the kernel, a
    blocking copy out, on a context of its own. For the reduction, a plain kernel folds the
    block's per-element values into float64 partials that are read back (blocking) and summed
    on the host (PyOpenCL's own ``array.sum`` needs Mako, which the GPU machine lacks)."""

    name = "pyopencl-naive"
    kinds = ("pageable",)

    def __init__(self, dev: cv.Device, block_elems: int, depth: int) -> None:
        super().__init__(block_elems, depth)
        import pyopencl as cl

        self.cl = cl
        self.device_spec = dev.spec
        self.cl_device = dev.cl_device  # type: ignore[attr-defined]
        self.ctx = cl.Context([self.cl_device])
        self.queue = cl.CommandQueue(self.ctx)

    def runner(self, wl: Workload, inputs: list[Any], output: Any, kind: str) -> Runner:
        cl = self.cl
        q, h, total_n = self.queue, wl.halo, wl.n
        with warnings.catch_warnings():  # NVIDIA's compiler prints build notes; not errors
            warnings.filterwarnings("ignore", message="Non-empty compiler output")
            knl = cl.Kernel(cl.Program(self.ctx, wl.source).build(), wl.kernel)
            fold = cl.Kernel(cl.Program(self.ctx, PARTIAL_SUMS).build(), "partial_sums")
        wg = knl.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, self.cl_device)
        local = min(256, int(wg))
        fold_local = min(local, int(fold.get_work_group_info(
            cl.kernel_work_group_info.WORK_GROUP_SIZE, self.cl_device)))
        partials = np.zeros(PARTIALS, np.float64)
        d_partials = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, partials.nbytes)
        block = min(self.block_elems, total_n)
        mf = cl.mem_flags
        d_in = [cl.Buffer(self.ctx, mf.READ_ONLY, (block + 2 * h) * 4) for _ in inputs]
        d_out = cl.Buffer(self.ctx, mf.READ_WRITE, block * 4)
        edges = wl.edges
        ranges = block_ranges(total_n, block)

        def run() -> RunResult:
            total = 0.0
            start = time.perf_counter()
            for s, e in ranges:
                lo, hi, at, front, back = halo_pieces(total_n, s, e, h)
                for buf, a, (first, last) in zip(d_in, inputs, edges, strict=True):
                    cl.enqueue_copy(q, buf, a[lo:hi], dst_offset=at * 4, is_blocking=True)
                    if front:
                        cl.enqueue_fill_buffer(q, buf, np.float32(first), 0, front * 4)
                    if back:
                        cl.enqueue_fill_buffer(q, buf, np.float32(last), (at + hi - lo) * 4,
                                               back * 4)
                n = e - s
                knl(q, (-(-n // local) * local,), (local,), *d_in, d_out, *wl.args,
                    np.uint64(s), np.uint64(n))
                if wl.reduce:
                    fold(q, (PARTIALS,), (fold_local,), d_out, d_partials, np.uint64(n))
                    cl.enqueue_copy(q, partials, d_partials, is_blocking=True)
                    total += float(partials.sum())
                else:
                    cl.enqueue_copy(q, output[s:e], d_out, is_blocking=True)
            q.finish()
            return time.perf_counter() - start, total if wl.reduce else None, {}

        def close() -> None:
            for buf in [*d_in, d_out, d_partials]:
                buf.release()

        return Runner(run, close)
