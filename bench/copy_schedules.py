"""Pinned map on CUDA: which copy schedule gives the link most? Interleaved, one process.

Raw CuPy replicas of two schedules over the same ``cv.pinned`` inputs, 64 MiB blocks, depth 3
and the same add kernel:

- ``roles``: conveyor's shape: one stream for every copy-in, one for kernels, one for every
  copy-out, events between them, and the host waits for a slot's copy-out before reusing it;
- ``roles2``: ``roles`` with the copy-ins alternating over two streams;
- ``slots``: the peers' shape (bench/suite's CuPy pipeline and PyTorch): each ring slot has its
  own stream, with its copy-ins, kernel and copy-out in order on it.

Beside them, bench/suite's conveyor-cuda, cupy-pipeline and pytorch runners. Every runner runs
once per round, the order reversed every other round; the first round checks each output (a
sample of it against NumPy) and is dropped. Prints each runner's median and best input GB/s.

On the GPU machine: ``python3 bench/copy_schedules.py [GiB per input] [rounds]`` (needs CuPy
and PyTorch; bench/NOTES.md, session 19).
"""
from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
from bench.suite.cuda_peers import CupyPipeline, Torch  # noqa: E402
from bench.suite.systems import Conveyor  # noqa: E402
from bench.suite.workloads import make  # noqa: E402

import conveyor as cv  # noqa: E402

BLOCK = 64 * 2**20 // 4  # elements per block: 64 MiB of float32
DEPTH = 3
ADD = cp.RawKernel(r"""
extern "C" __global__ void add(const float *a, const float *b, float *c,
                               unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}""", "add")


def raw_runner(kind: str, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> Callable[[], float]:
    """A runner of schedule ``kind`` ("roles", "roles2" or "slots") for c = a + b."""
    n = a.size
    ranges = [(s, min(s + BLOCK, n)) for s in range(0, n, BLOCK)]
    slots = [[cp.empty(BLOCK, cp.float32) for _ in range(3)] for _ in range(DEPTH)]
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(DEPTH)]  # slots: one a slot
    copy_ins = streams[:2] if kind == "roles2" else streams[:1]  # roles: copy-ins
    compute, copy_out = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)

    def launch(da: Any, db: Any, dc: Any, m: int) -> None:
        ADD(((m + 255) // 256,), (256,), (da, db, dc, np.uint64(m)))

    def run() -> float:
        start = time.perf_counter()
        slot_free: list[Any] = [None] * DEPTH
        for k, (s, e) in enumerate(ranges):
            j, m = k % DEPTH, e - s
            da, db, dc = slots[j]
            if kind == "slots":
                st = streams[j]
                with st:
                    da.data.copy_from_host_async(a[s:e].ctypes.data, m * 4, st)
                    db.data.copy_from_host_async(b[s:e].ctypes.data, m * 4, st)
                    launch(da, db, dc, m)
                    dc.data.copy_to_host_async(c[s:e].ctypes.data, m * 4, st)
                continue
            if slot_free[j] is not None:
                slot_free[j].synchronize()  # the host waits for the slot, as conveyor's engine
            st = copy_ins[k % len(copy_ins)]
            da.data.copy_from_host_async(a[s:e].ctypes.data, m * 4, st)
            db.data.copy_from_host_async(b[s:e].ctypes.data, m * 4, st)
            compute.wait_event(st.record())
            with compute:
                launch(da, db, dc, m)
            copy_out.wait_event(compute.record())
            dc.data.copy_to_host_async(c[s:e].ctypes.data, m * 4, copy_out)
            slot_free[j] = copy_out.record()
        cp.cuda.Device().synchronize()
        return time.perf_counter() - start

    return run


def main() -> None:
    gib = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    dev = cv.device("cuda:0")
    dev.wait_for_warm_up()
    wl = make("map", gib, 20)
    runners: list[tuple[str, Callable[[], float], np.ndarray]] = []
    for system in (Conveyor("conveyor-cuda", dev, BLOCK, DEPTH), CupyPipeline(0, BLOCK, DEPTH),
                   Torch(0, BLOCK, DEPTH)):
        inputs = system.pin_inputs(wl.inputs)
        out, view = system.pin_output(wl.n)
        runner = system.runner(wl, inputs, out, "pinned")
        runners.append((system.name, lambda r=runner: r.run()[0], view))
    a, b = (cv.pinned.empty(wl.n, np.float32, device=dev) for _ in range(2))
    a[:], b[:] = wl.inputs
    for kind in ("roles", "roles2", "slots"):
        c = cv.pinned.empty(wl.n, np.float32, device=dev)
        runners.append((kind, raw_runner(kind, a, b, c), c))
    expected = (wl.inputs[0] + wl.inputs[1])[::997]
    rates: dict[str, list[float]] = {name: [] for name, _, _ in runners}
    for r in range(rounds):
        for name, run, view in (runners if r % 2 == 0 else runners[::-1]):
            seconds = run()
            if r == 0:
                if not np.array_equal(view[::997], expected):
                    raise SystemExit(f"{name}: wrong output")
            else:
                rates[name].append(wl.in_bytes / seconds / 1e9)
    for name, values in rates.items():
        runs = " ".join(f"{v:.1f}" for v in values)
        print(f"{name:15s} median {statistics.median(values):5.1f}  best {max(values):5.1f}"
              f"  runs {runs}", flush=True)


if __name__ == "__main__":
    main()
