"""What the host can do for a pageable stream: parallel memcpy into pinned memory by thread
count, the same while the link is busy, and the cost of page-locking memory in place.

Run on the GPU machine: python3 bench/host_ceilings.py [--gib 2] [--json out.json]
Pageable inputs reach the link only through one of two doors: a memcpy into pinned staging
(bounded by host memory bandwidth, shared with the DMA engines) or page-locking the caller's
pages where they are (cuMemHostRegister, bounded by the kernel's page-table work). These are
the two ceilings the engine's pageable path is judged against.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import conveyor as cv

PIECE = 8 * 2**20


def parallel_copy_gbps(dst: np.ndarray, src: np.ndarray, threads: int, repeats: int = 3
                       ) -> float:
    """Best GB/s of ``dst[...] = src`` cut into 8 MiB pieces over ``threads`` threads."""
    pieces = [slice(i, min(i + PIECE, src.nbytes)) for i in range(0, src.nbytes, PIECE)]
    best = 0.0
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(lambda s: np.copyto(dst[s], src[s]), pieces))
            best = max(best, src.nbytes / (time.perf_counter() - start) / 1e9)
    return best


def register_costs(dev: cv.Device, array: np.ndarray, chunk: int, threads: int
                   ) -> dict[str, float]:
    """GB/s of cuMemHostRegister and of cuMemHostUnregister over ``array`` in ``chunk`` bytes,
    ``threads`` chunks at a time."""
    chunks = [array[i : i + chunk] for i in range(0, array.nbytes, chunk)]
    regs: list = [None] * len(chunks)

    def reg(i: int) -> None:
        regs[i] = dev.register_host(chunks[i])

    with ThreadPoolExecutor(threads) as pool:
        start = time.perf_counter()
        list(pool.map(reg, range(len(chunks))))
        t_reg = time.perf_counter() - start
        locked = all(r.page_locked for r in regs)
        start = time.perf_counter()
        list(pool.map(lambda r: r.close(), regs))
        t_unreg = time.perf_counter() - start
    return {"register_gbps": array.nbytes / t_reg / 1e9,
            "unregister_gbps": array.nbytes / t_unreg / 1e9, "locked": float(locked)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--json", default=None)
    options = parser.parse_args()
    nbytes = int(options.gib * 2**30)
    dev = next(d for d in cv.devices() if d.backend == "cuda")
    out: dict[str, object] = {"cpus": os.cpu_count()}
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as handle:
            out["thp"] = handle.read().strip()
    except OSError:
        out["thp"] = "?"
    src = np.ones(nbytes, np.uint8)
    page_dst = np.zeros(nbytes, np.uint8)
    pin = dev.alloc_pinned(nbytes)
    pin_dst = pin.array[:nbytes]
    pin_dst.fill(0)
    counts = [t for t in (1, 2, 4, 8, 12, 16, 24, 32) if t <= 2 * (os.cpu_count() or 1)]
    out["memcpy_to_pinned"] = {t: parallel_copy_gbps(pin_dst, src, t) for t in counts}
    out["memcpy_to_pageable"] = {t: parallel_copy_gbps(page_dst, src, t) for t in (1, 8, 16)}
    out["memcpy_from_pinned"] = {t: parallel_copy_gbps(page_dst, pin_dst, t) for t in (8, 16)}
    # The same memcpy while the DMA engines stream pinned memory both ways.
    dbuf = dev.alloc_device(nbytes)
    dbuf2 = dev.alloc_device(nbytes)
    pin2 = dev.alloc_pinned(nbytes)
    q1, q2 = dev.create_queue(), dev.create_queue()
    stop = threading.Event()
    moved = [0]

    def pump() -> None:
        while not stop.is_set():
            e1 = q1.copy_in(dbuf, pin2.array[:nbytes])
            e2 = q2.copy_out(pin2.array[nbytes // 2 : nbytes], dbuf2, src_offset=0)
            e1.wait()
            e2.wait()
            moved[0] += nbytes + nbytes // 2

    pumper = threading.Thread(target=pump)
    start = time.perf_counter()
    pumper.start()
    busy = {t: parallel_copy_gbps(pin_dst, src, t, repeats=4) for t in (8, 16)}
    stop.set()
    pumper.join()
    out["memcpy_to_pinned_link_busy"] = busy
    out["link_gbps_meanwhile"] = moved[0] / (time.perf_counter() - start) / 1e9
    for obj in (q1, q2, dbuf, dbuf2, pin2):
        obj.close()
    # Page-locking in place.
    regs = {}
    for chunk_mib, threads in ((64, 1), (64, 4), (64, 8), (256, 1), (256, 4), (nbytes >> 20, 1)):
        regs[f"{chunk_mib}MiB x{threads}"] = register_costs(dev, src, chunk_mib << 20, threads)
    out["register"] = regs
    # Copy rate from a registered array (is it the pinned rate?).
    q = dev.create_queue()
    dbuf = dev.alloc_device(nbytes)
    with cv.pinned.register(src, device=dev):
        q.copy_in(dbuf, src).wait()
        start = time.perf_counter()
        q.copy_in(dbuf, src).wait()
        out["h2d_from_registered_gbps"] = nbytes / (time.perf_counter() - start) / 1e9
    start = time.perf_counter()
    q.copy_in(dbuf, pin_dst).wait()
    out["h2d_from_pinned_gbps"] = nbytes / (time.perf_counter() - start) / 1e9
    q.close()
    dbuf.close()
    pin.close()
    text = json.dumps(out, indent=1)
    print(text)
    if options.json:
        with open(options.json, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
