"""Ceilings measured at the start of the run, and the compute-heavy kernel alone.

Pinned copies use conveyor's device primitives (``ceiling`` of bench/gpu_vadd.py: one copy of
``nbytes`` each way and both ways at once on two queues); pageable copies are the driver's
own blocking copy from and to an ordinary NumPy array (``cudaMemcpy`` through CuPy on CUDA,
a blocking ``enqueue_copy`` through PyOpenCL on OpenCL); the host ceiling is a parallel memcpy
from pageable into pinned memory (``parallel_copy_gbps`` of bench/host_ceilings.py). Best of
``repeats``.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from bench.gpu_vadd import ceiling as pinned_ceiling
from bench.host_ceilings import parallel_copy_gbps

import conveyor as cv

from .workloads import THREADS, Workload


def _best(nbytes: int, repeats: int, fn: Callable[[], None]) -> float:
    fn()  # first touch and driver set-up
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


def pageable_cuda(index: int, nbytes: int, repeats: int) -> dict[str, float]:
    """Blocking cudaMemcpy from and to pageable NumPy memory (needs CuPy)."""
    import cupy as cp

    with cp.cuda.Device(index):
        dbuf = cp.empty(nbytes, cp.uint8)
        host = np.ones(nbytes, np.uint8)
        rt = cp.cuda.runtime
        figures = {
            "pageable_h2d": _best(nbytes, repeats, lambda: rt.memcpy(
                dbuf.data.ptr, host.ctypes.data, nbytes, rt.memcpyHostToDevice)),
            "pageable_d2h": _best(nbytes, repeats, lambda: rt.memcpy(
                host.ctypes.data, dbuf.data.ptr, nbytes, rt.memcpyDeviceToHost)),
        }
        dbuf = None  # back to CuPy's pool, then freed
        cp.get_default_memory_pool().free_all_blocks()
    return figures


def pageable_opencl(dev: cv.Device, nbytes: int, repeats: int) -> dict[str, float]:
    """Blocking enqueue_copy from and to pageable NumPy memory, on a context of its own."""
    import pyopencl as cl

    ctx = cl.Context([dev.cl_device])  # type: ignore[attr-defined]
    queue = cl.CommandQueue(ctx)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, nbytes)
    host = np.ones(nbytes, np.uint8)
    try:
        return {
            "pageable_h2d": _best(nbytes, repeats, lambda: cl.enqueue_copy(
                queue, buf, host, is_blocking=True)),
            "pageable_d2h": _best(nbytes, repeats, lambda: cl.enqueue_copy(
                queue, host, buf, is_blocking=True)),
        }
    finally:
        queue.finish()
        buf.release()


def measure(devices: list[cv.Device], nbytes: int, repeats: int = 3) -> dict[str, Any]:
    """Every ceiling of every device in ``devices``, and the host's parallel memcpy."""
    out: dict[str, Any] = {"bytes": nbytes, "devices": {}}
    for dev in devices:
        fig: dict[str, Any] = {"name": dev.name}
        pinned = pinned_ceiling(dev, nbytes, repeats)
        fig.update(pinned_h2d=pinned["h2d"], pinned_d2h=pinned["d2h"], pinned_both=pinned["both"])
        try:
            if dev.backend == "cuda":
                fig.update(pageable_cuda(getattr(dev, "index", 0), nbytes, repeats))
            else:
                fig.update(pageable_opencl(dev, nbytes, repeats))
        except Exception as exc:  # e.g. no CuPy: the pinned figures still stand
            fig["pageable_error"] = f"{type(exc).__name__}: {exc}"
        out["devices"][dev.spec] = fig
        print(f"ceilings {dev.spec}: " + ", ".join(
            f"{k} {v:.1f}" for k, v in fig.items() if isinstance(v, float)), flush=True)
    if devices:
        with devices[0].alloc_pinned(nbytes) as pin:
            dst = pin.array[:nbytes]
            dst.fill(0)
            src = np.ones(nbytes, np.uint8)
            out["host_memcpy_threads"] = THREADS
            out["host_memcpy_to_pinned"] = parallel_copy_gbps(dst, src, THREADS, repeats)
            print(f"host memcpy pageable -> pinned, {THREADS} threads: "
                  f"{out['host_memcpy_to_pinned']:.1f} GB/s", flush=True)
            if devices[0].kind == "gpu":
                out["host_memcpy_beside_link"] = memcpy_beside_link(devices[0], dst, src,
                                                                    repeats)
                print(f"host memcpy pageable -> pinned while the link copies both ways: "
                      f"{out['host_memcpy_beside_link']:.1f} GB/s", flush=True)
    return out


def memcpy_beside_link(dev: cv.Device, dst: np.ndarray, src: np.ndarray, repeats: int,
                       block: int = 256 * 2**20) -> float:
    """The host's parallel memcpy (as ``host_memcpy_to_pinned``) while another thread keeps
    the link busy with pinned copies both ways: what staging threads can copy while the
    device's DMA reads and writes host memory too, as it does in a stream."""
    stop = threading.Event()
    failed: list[BaseException] = []
    with contextlib.ExitStack() as held:
        pin_in, pin_out = (held.enter_context(dev.alloc_pinned(block)) for _ in range(2))
        buf_a, buf_b = (held.enter_context(dev.alloc_device(block)) for _ in range(2))
        q1, q2 = (held.enter_context(dev.create_queue()) for _ in range(2))
        pin_in.array.fill(1)

        def link() -> None:
            try:
                while not stop.is_set():
                    e1 = q1.copy_in(buf_a, pin_in.array)
                    e2 = q2.copy_out(pin_out.array, buf_b)
                    e1.wait()
                    e2.wait()
            except BaseException as exc:  # reported below: the figure would be of an idle link
                failed.append(exc)

        busy = threading.Thread(target=link, name="link-busy", daemon=True)
        busy.start()
        try:
            time.sleep(0.05)
            gbps = parallel_copy_gbps(dst, src, THREADS, repeats)
        finally:
            stop.set()
            busy.join()
        if failed:
            raise RuntimeError("the copies keeping the link busy failed") from failed[0]
        return gbps


def kernel_alone(dev: cv.Device, wl: Workload, block_elems: int, repeats: int = 2
                 ) -> dict[str, float]:
    """The workload's kernel over the whole data with nothing crossing the link: one block
    resident on the device, launched once per block of the stream. Seconds, best of
    ``repeats``."""
    kernel = dev.compile(wl.source, wl.kernel)
    n = min(block_elems, wl.n)
    count = -(-wl.n // n)
    queue = dev.create_queue()
    x, y = dev.alloc_device(n * 4), dev.alloc_device(n * 4)
    try:
        queue.fill(x, 0, n * 4)
        args = [x, y, *wl.args, np.uint64(0), np.uint64(n)]

        def all_blocks() -> None:
            for _ in range(count):
                queue.launch(kernel, n, args)
            queue.finish()

        queue.launch(kernel, n, args)
        queue.finish()
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            all_blocks()
            best = min(best, time.perf_counter() - start)
    finally:
        queue.close()
        x.close()
        y.close()
    return {"seconds": best, "blocks": count}
