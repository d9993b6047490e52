"""conveyor on Dask (issue 16): 2 workers vs 1, the overhead per chunk against a direct
``cv.stream`` of the same chunk, and against the CuPy ``map_blocks`` idiom.

2 workers vs 1 is measured for four cases over the same chunks: the map 2x + 1 of pageable
chunks (the host stages every byte in and out), a reduction (the host stages the input only),
the map of chunks in pinned memory (the host stages the output only), and a compute-bound map
(the kernel slower than the copies). Beside them, the host's own copy rate into fresh memory
with 1 and 2 workers at once: what the pageable cases can reach whatever the GPUs.

On a GPU host: ``LocalCUDACluster`` (dask-cuda, one worker per GPU) where it is installed,
else one Nanny per worker with ``CUDA_VISIBLE_DEVICES=i`` (worker i on GPU i). The CuPy idiom
runs where CuPy is installed. Inputs are persisted on the workers first, and outputs persisted
(never gathered), so what is timed is the chunks' work, not the client's network.

    python3 bench/dask_bench.py                       # GPU host: 1 GiB chunks, 8 chunks
    python3 bench/dask_bench.py --chunk-mib 1 --chunks 4 --runs 2   # PoCL smoke test

Prints one line per measurement and a JSON object last.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import statistics
import time
from typing import Any

import dask.array as da
import numpy as np
from dask.graph_manipulation import clone
from distributed import Client, Nanny, Scheduler, SpecCluster, wait

import conveyor as cv
import conveyor.dask as cvd

SOURCE = cv.portable("""
__kernel void axpb(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i] + 1.0f;
}
""")
HEAVY = cv.portable("""
__kernel void heavy(__global const float *x, __global float *y, int reps, ulong offset,
                    ulong n) {
    ulong i = get_global_id(0);
    if (i < n) {
        float v = x[i];
        for (int k = 0; k < reps; ++k) v = v * 0.999f + 0.001f;
        y[i] = v;
    }
}
""")
MIB = 2**20


def cluster(workers: int, cuda: bool) -> Any:
    """A local cluster of ``workers`` processes, worker i on GPU i: dask-cuda's
    LocalCUDACluster where it is installed, else one Nanny per worker with its own
    ``CUDA_VISIBLE_DEVICES`` (harmless on a machine without GPUs)."""
    if cuda:
        from dask_cuda import LocalCUDACluster

        return LocalCUDACluster(CUDA_VISIBLE_DEVICES=list(range(workers)), memory_limit=0)
    return SpecCluster(
        scheduler={"cls": Scheduler, "options": {"dashboard_address": ":0",
                                                 "host": "127.0.0.1"}},
        workers={i: {"cls": Nanny, "options": {
            # No memory limit: 1 GiB chunks in and out pass Dask's default share of host
            # memory, and its spilling to disk (seen: 13 s instead of 1 s for 8 chunks) would
            # be what the benchmark measures.
            "nthreads": 1, "host": "127.0.0.1", "silence_logs": logging.WARNING,
            "memory_limit": 0,
            "env": {"CUDA_VISIBLE_DEVICES": str(i)}}} for i in range(workers)},
        silence_logs=logging.WARNING,
    )


def timed(run: Any, runs: int) -> float:
    """Median seconds of ``runs`` calls of ``run(seed)`` after one warm-up."""
    run(0)
    times = []
    for seed in range(1, runs + 1):
        start = time.perf_counter()
        run(seed)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def fresh(y: Any, x: Any, seed: int) -> Any:
    """``y`` under new keys (``x``'s kept): a result still held from the last run under the
    same keys would otherwise be reused, not recomputed."""
    return clone(y, omit=x, seed=seed)


def persisted(client: Client, rows: int, chunk_rows: int) -> Any:
    """A random float32 array persisted on the workers, its chunks spread evenly over them
    (a map task runs where its chunk is: 5 chunks on one worker and 3 on the other would cap
    2 workers at 1.6 x whatever conveyor does)."""
    x = da.random.default_rng(0).random(rows, chunks=chunk_rows, dtype=np.float32)
    x = client.persist(x)
    wait(x)
    if len(placement(client, x)) > 1 and len(set(placement(client, x).values())) > 1:
        client.rebalance(x)
    return x


def placement(client: Client, x: Any) -> dict[str, int]:
    """Chunks of ``x`` held by each worker."""
    counts: dict[str, int] = {w: 0 for w in client.scheduler_info()["workers"]}
    for holders in client.who_has(x).values():
        counts[holders[0]] += 1
    return counts


def host_copy_gbs(client: Client, mib: int, workers: list[str]) -> float:
    """Host copy rate of ``workers`` together, GB/s: each copies ``mib`` MiB of pageable
    memory into a fresh array (the page faults of a fresh output included) with as many
    threads as conveyor stages with, all workers at the same time, 3 times. What pageable
    chunks can reach is bounded by this, whatever the GPUs."""

    def copy(nbytes: int) -> float:
        from concurrent.futures import ThreadPoolExecutor

        from conveyor.pipeline.stage import default_workers

        threads = default_workers()  # as many as conveyor's staging uses on this worker
        src = np.ones(nbytes // 4, np.float32)
        with ThreadPoolExecutor(threads) as pool:
            start = time.perf_counter()
            cuts = np.linspace(0, src.size, threads + 1).astype(np.int64)
            for _ in range(3):
                dst = np.empty_like(src)
                list(pool.map(lambda lo, hi, d=dst: np.copyto(d[lo:hi], src[lo:hi]),
                              cuts[:-1], cuts[1:]))
            return 3 * nbytes / (time.perf_counter() - start)

    rates = client.run(copy, mib * MIB, workers=workers)
    return sum(rates.values()) / 1e9


def map_seconds(client: Client, x: Any, device: str | None, runs: int,
                reps: int | None = None) -> float:
    """The map 2x + 1 over every chunk; with ``reps``, the compute-bound kernel instead."""
    kernel = cvd.kernel(SOURCE, "axpb") if reps is None else cvd.kernel(HEAVY, "heavy")
    args = () if reps is None else (reps,)

    def run(seed: int) -> None:
        y = client.persist(fresh(cvd.map_blocks(kernel, x, device=device, args=args), x,
                                 seed))
        wait(y)
        del y

    return timed(run, runs)


def reduce_seconds(client: Client, x: Any, device: str | None, runs: int) -> float:
    """The sum of 2x + 1 over every chunk (conveyor reductions: nothing but partials comes
    back, so the host only stages the input)."""
    kernel = cvd.kernel(SOURCE, "axpb")

    def run(seed: int) -> None:
        client.compute(fresh(cvd.reduce(kernel, x, "sum", device=device), x, seed)).result()

    return timed(run, runs)


def pinned_chunks(client: Client, x: Any) -> Any:
    """``x`` with every chunk copied into pinned memory on the worker that holds it (a worker
    that reads its data into ``cv.pinned`` buffers): the stream copies from them directly."""
    xp = client.persist(x.map_blocks(_pinned_copy, dtype=x.dtype))
    wait(xp)
    return xp


def _pinned_copy(chunk: np.ndarray) -> np.ndarray:
    out: np.ndarray = cv.pinned.asarray(chunk)
    return out


def direct_seconds(client: Client, x: Any, device: str | None, runs: int) -> float:
    """A plain cv.stream of chunk 0 on the worker that holds it (kernel built beforehand)."""

    def on_worker(chunk: np.ndarray) -> float:
        dev = cv.device(device)
        kernel = dev.compile(SOURCE, "axpb")
        cv.stream(kernel, [chunk], [np.float32], device=dev)  # warm
        times, kept = [], []
        for _ in range(runs):
            start = time.perf_counter()
            kept.append(cv.stream(kernel, [chunk], [np.float32], device=dev).outputs[0])
            times.append(time.perf_counter() - start)
        # Outputs were kept, as persisted chunks are: each run writes fresh memory, as a
        # task does (a freed output's pages, reused at once, fault in cheaper).
        del kept
        return statistics.median(times)

    chunk = client.futures_of(x)[0]  # x has one chunk, held by a worker: no copy through here
    return float(client.submit(on_worker, chunk, pure=False).result())


def cupy_seconds(client: Client, x: Any, runs: int) -> float | None:
    """What a Dask user writes today: copy each pageable chunk to the GPU, compute, copy back."""
    if importlib.util.find_spec("cupy") is None:
        return None

    def idiom(chunk: np.ndarray) -> np.ndarray:
        import cupy as cp

        return cp.asnumpy(2.0 * cp.asarray(chunk) + 1.0).astype(np.float32)

    def run(seed: int) -> None:
        y = client.persist(fresh(x.map_blocks(idiom, dtype=np.float32), x, seed))
        wait(y)
        del y

    return timed(run, runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunk-mib", type=int, default=1024, help="MiB per chunk")
    parser.add_argument("--chunks", type=int, default=8, help="chunks in the array")
    parser.add_argument("--runs", type=int, default=5, help="timed runs (median)")
    parser.add_argument("--device", default=None, help="device spec on each worker")
    parser.add_argument("--heavy-reps", type=int, default=32768,
                        help="multiply-adds per element of the compute-bound map")
    parser.add_argument("--no-idiom", action="store_true",
                        help="skip the CuPy map_blocks idiom (it takes ~1 s per GiB)")
    parser.add_argument("--cluster", choices=("auto", "local-cuda", "nanny"), default="auto",
                        help="LocalCUDACluster (dask-cuda), one Nanny per GPU, or auto: the "
                             "first where dask-cuda is installed")
    options = parser.parse_args()
    cuda = (options.cluster == "local-cuda" or options.cluster == "auto"
            and importlib.util.find_spec("dask_cuda") is not None)
    chunk_rows = options.chunk_mib * MIB // 4
    rows = chunk_rows * options.chunks
    figures: dict[str, Any] = {"chunk_mib": options.chunk_mib, "chunks": options.chunks,
                               "cluster": "LocalCUDACluster" if cuda else
                               "SpecCluster, CUDA_VISIBLE_DEVICES=i on worker i"}
    for workers in (1, 2):
        with cluster(workers, cuda) as made, Client(made) as client:
            client.wait_for_workers(workers)
            specs = cvd.warm(cvd.kernel(SOURCE, "axpb"), client=client, device=options.device)
            visible = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
            print(f"{workers} worker(s) on: {', '.join(sorted(specs.values()))}; "
                  f"CUDA_VISIBLE_DEVICES {sorted(visible.values(), key=str)}")
            x = persisted(client, rows, chunk_rows)
            spread = sorted(placement(client, x).values())
            print(f"{workers} worker(s): chunks per worker {spread}")
            copy = host_copy_gbs(client, options.chunk_mib, list(specs))
            figures[f"host_copy_{workers}_workers_gbs"] = copy
            print(f"{workers} worker(s): host copy into fresh memory, all at once: "
                  f"{copy:.1f} GB/s")
            seconds = map_seconds(client, x, options.device, options.runs)
            figures[f"map_{workers}_workers_s"] = seconds
            print(f"{workers} worker(s): {seconds:.3f} s for {options.chunks} chunks of "
                  f"{options.chunk_mib} MiB ({rows * 4 / seconds / 1e9:.2f} GB/s in)")
            summed = reduce_seconds(client, x, options.device, options.runs)
            figures[f"reduce_{workers}_workers_s"] = summed
            print(f"{workers} worker(s): reduce {summed:.3f} s "
                  f"({rows * 4 / summed / 1e9:.2f} GB/s in)")
            heavy = map_seconds(client, x, options.device, options.runs, options.heavy_reps)
            figures[f"heavy_{workers}_workers_s"] = heavy
            print(f"{workers} worker(s): compute-bound map ({options.heavy_reps} multiply-adds "
                  f"per element) {heavy:.3f} s ({rows * 4 / heavy / 1e9:.2f} GB/s in)")
            xp = pinned_chunks(client, x)
            pinned = map_seconds(client, xp, options.device, options.runs)
            figures[f"map_pinned_{workers}_workers_s"] = pinned
            print(f"{workers} worker(s): map of pinned chunks {pinned:.3f} s "
                  f"({rows * 4 / pinned / 1e9:.2f} GB/s in)")
            del xp
            if workers == 1:
                one = persisted(client, chunk_rows, chunk_rows)
                dask_one = map_seconds(client, one, options.device, options.runs)
                direct = direct_seconds(client, one, options.device, options.runs)
                per_chunk = seconds / options.chunks
                figures.update(chunk_dask_s=dask_one, chunk_direct_s=direct,
                               chunk_overhead=dask_one / direct - 1,
                               chunk_in_run_s=per_chunk,
                               chunk_in_run_overhead=per_chunk / direct - 1)
                print(f"one chunk alone: conveyor.dask {dask_one:.4f} s (a whole persist: "
                      f"client, scheduler and worker round trip), direct cv.stream "
                      f"{direct:.4f} s: overhead {100 * (dask_one / direct - 1):.1f} %")
                print(f"per chunk in the {options.chunks}-chunk run: {per_chunk:.4f} s: "
                      f"overhead {100 * (per_chunk / direct - 1):.1f} % over direct")
                idiom = None if options.no_idiom else cupy_seconds(client, x, options.runs)
                figures["cupy_idiom_s"] = idiom
                if idiom is None:
                    print("cupy idiom: skipped (CuPy is not installed)")
                else:
                    print(f"cupy map_blocks idiom: {idiom:.3f} s: conveyor.dask is "
                          f"{idiom / seconds:.2f} x faster")
    figures["speedup_2_vs_1"] = figures["map_1_workers_s"] / figures["map_2_workers_s"]
    for case in ("reduce", "map_pinned", "heavy"):
        figures[f"{case}_speedup_2_vs_1"] = (figures[f"{case}_1_workers_s"]
                                             / figures[f"{case}_2_workers_s"])
        print(f"{case}: 2 workers vs 1: {figures[f'{case}_speedup_2_vs_1']:.2f} x")
    figures["host_copy_2_vs_1"] = (figures["host_copy_2_workers_gbs"]
                                   / figures["host_copy_1_workers_gbs"])
    print(f"2 workers vs 1: {figures['speedup_2_vs_1']:.2f} x (the host's copy rate into "
          f"fresh memory: {figures['host_copy_2_vs_1']:.2f} x)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
