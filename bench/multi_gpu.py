"""One stream over several GPUs (issue 15): 2 devices against 1 in the same run, next to the
aggregate pinned ceiling, the host copy-rate bound of pageable inputs, a compute-bound kernel,
the imbalance, and one GPU busy with another job (dynamic supply against the static split).

On the 2 x H200 machine, from the repository root (after scripts/gpu-env.sh, as bench/gpu.sh):
    python3 bench/multi_gpu.py --backend cuda --gib 4 --json multi_cuda.json
    python3 bench/multi_gpu.py --backend opencl --gib 4 --json multi_opencl.json
Here (two PoCL CPU devices, or one and a second context on it): python3 bench/multi_gpu.py
--backend opencl --gib 0.0625. Each figure is the best of --repeats runs after one warm-up;
every result is checked against NumPy before its time counts.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import conveyor as cv
from conveyor.measure import link_bandwidth
from conveyor.measure_all import aggregate_bandwidth
from conveyor.pipeline.stage import default_workers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_ceilings import parallel_copy_gbps  # noqa: E402

SOURCE = cv.portable("""
__kernel void vadd(__global const float *a, __global const float *b, __global float *c,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}
__kernel void heavy(__global const float *a, __global const float *b, __global float *c,
                    int reps, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) {
        float s = a[i];
        for (int k = 0; k < reps; k++) s = s * 0.999f + b[i];
        c[i] = s;
    }
}
__kernel void spin(__global float *x, int reps, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) {
        float s = x[i];
        for (int k = 0; k < reps; k++) s = s * 0.999f + 0.001f;
        x[i] = s;
    }
}
""")


def pick_devices(backend: str) -> tuple[list[cv.Device], str]:
    """Two devices of ``backend`` (GPUs where there are), and a note on what they are."""
    every = [d for d in cv.devices() if d.backend == backend]
    gpus = [d for d in every if d.kind == "gpu"]
    if len(gpus) >= 2:
        return gpus, ""
    usable = []
    for dev in every:
        try:
            dev.compile(SOURCE, "vadd")
            usable.append(dev)
        except cv.ConveyorError:
            continue
    if len(usable) >= 2:
        return usable, "no two GPUs: CPU devices"
    if not usable:
        sys.exit(f"no {backend} device can build kernels here")
    if backend != "opencl":
        sys.exit(f"one {backend} device here: nothing to compare")
    from conveyor.backends import opencl

    dev = usable[0]
    platform, index = (int(p) for p in dev.spec.split(":")[1:])
    second = opencl.Device(dev.cl_device, platform, index)  # type: ignore[attr-defined]
    return [dev, second], "one usable device: the second is another context on it"


def vadd_copies_gbps(devs: list[cv.Device], block: int, blocks: int, repeats: int = 2) -> float:
    """Input GB/s of vadd's copies alone, no kernel, on every device of ``devs`` at once: per
    block, two inputs in (one queue) and one output out (another), each device from its own
    pinned buffers, ``blocks`` blocks each; best of ``repeats`` after a warm-up. The ceiling
    of a stream that moves bytes both ways: the host carries less in both directions at once
    than in one (measured on 2 x H200: 84 GB/s in with 42 out, against 108 in alone)."""
    sets = []
    held: list[Any] = []
    for dev in devs:
        q_in, q_out = dev.create_queue(), dev.create_queue()
        d_in, d_out = dev.alloc_device(2 * block), dev.alloc_device(block)
        h_in, h_out = dev.alloc_pinned(2 * block), dev.alloc_pinned(block)
        h_in.array[:2 * block].fill(1)
        held += [d_in, d_out, h_in, h_out]
        sets.append((q_in, q_out, d_in, d_out, h_in.array[:2 * block], h_out.array[:block]))

    def copies(index: int) -> None:
        q_in, q_out, d_in, d_out, h_in, h_out = sets[index]
        for _ in range(blocks):
            q_in.copy_in(d_in, h_in)
            q_out.copy_out(h_out, d_out)
            q_in.flush()  # NVIDIA's OpenCL holds commands back until a flush
            q_out.flush()
        q_in.finish()
        q_out.finish()

    best = float("inf")
    try:
        for _ in range(repeats + 1):
            threads = [threading.Thread(target=copies, args=(i,)) for i in range(len(devs))]
            started = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            best = min(best, time.perf_counter() - started)
    finally:
        for q_in, q_out, *_ in sets:
            q_in.close()
            q_out.close()
        for buffer in held:
            buffer.close()
    return len(devs) * blocks * 2 * block / best / 1e9


def timed(run: Any, check: Any, repeats: int) -> tuple[float, cv.Report]:
    """Best seconds of ``repeats`` runs after one warm-up, each checked first."""
    report = run()
    check()
    best, best_report = float("inf"), report
    for _ in range(repeats):
        report = run()
        check()
        if report.seconds < best:
            best, best_report = report.seconds, report
    return best, best_report


class BusyJob:
    """Another job on one device: a long kernel launched over and over on its own queue, on a
    thread of its own, until ``stop()``."""

    def __init__(self, dev: cv.Device, elements: int, reps: int) -> None:
        self.dev = dev
        self.kernel = dev.compile(SOURCE, "spin")
        self.buffer = dev.memory_pool.acquire(elements * 4)
        self.elements = elements
        self.reps = reps
        self.queue = dev.create_queue()
        self.done = threading.Event()
        self.launches = 0
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        while not self.done.is_set():
            self.queue.launch(self.kernel, self.elements,
                              [self.buffer, np.int32(self.reps), np.uint64(self.elements)])
            self.queue.finish()
            self.launches += 1

    def __enter__(self) -> BusyJob:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        self.queue.close()
        self.dev.memory_pool.release(self.buffer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("cuda", "opencl"), default="cuda")
    parser.add_argument("--gib", type=float, default=4.0, help="GiB per input (vadd: 2 in, 1 out)")
    parser.add_argument("--block-mib", type=float, default=64.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--reps", type=int, default=0,
                        help="loop count of the compute-bound kernel (default: by device kind)")
    parser.add_argument("--busy-reps", type=int, default=0,
                        help="loop count of the other job's kernel on GPU 1 (default: long "
                             "enough that it fills the GPU for tens of ms per launch)")
    parser.add_argument("--json", help="write the figures to this JSON file")
    options = parser.parse_args()

    devs, note = pick_devices(options.backend)
    devs = devs[:2]
    gpu = all(d.kind == "gpu" for d in devs)
    kernels = [d.compile(SOURCE, "vadd") for d in devs]
    heavy = [d.compile(SOURCE, "heavy") for d in devs]
    n = int(options.gib * 2**30) // 4
    block = int(options.block_mib * 2**20)
    reps = options.reps or (20000 if gpu else 20)  # 2000 left an H200 link-bound
    busy_reps = options.busy_reps or (200_000 if gpu else 200)
    figures: dict[str, Any] = {"backend": options.backend, "devices": [d.spec for d in devs],
                               "names": [d.name for d in devs], "gib": options.gib,
                               "note": note}
    print(f"devices: {', '.join(f'{d.spec} ({d.name})' for d in devs)}"
          + (f"  [{note}]" if note else ""))

    # Ceilings of this run: each device alone, both at once, and the host's copy rate.
    alone = [link_bandwidth(d) for d in devs]
    both = aggregate_bandwidth(devs)
    scratch = np.ones(min(n * 4, 2**30), np.uint8)
    host_rate = parallel_copy_gbps(np.empty_like(scratch), scratch, default_workers())
    del scratch
    figures["ceiling_alone_h2d"] = [f.pinned_h2d_gbps for f in alone]
    figures["ceiling_alone_d2h"] = [f.pinned_d2h_gbps for f in alone]
    figures["ceiling_both_h2d"] = both.pinned_h2d_gbps
    figures["ceiling_both_d2h"] = both.pinned_d2h_gbps
    figures["host_copy_gbps"] = host_rate
    print(f"pinned ceiling h2d GB/s: alone {[round(f.pinned_h2d_gbps, 1) for f in alone]}, "
          f"both at once {both.pinned_h2d_gbps:.1f} "
          f"({both.pinned_h2d_gbps / alone[0].pinned_h2d_gbps:.2f} x); host memcpy "
          f"{host_rate:.1f} GB/s")

    # The copies of vadd alone, both directions at once: one device, then both at once.
    copy_blocks = max(1, min(32, n * 4 // block))
    duplex = [vadd_copies_gbps(devs[:1], block, copy_blocks), vadd_copies_gbps(devs, block,
                                                                               copy_blocks)]
    figures["vadd_copies_gbps_in"] = duplex
    print(f"vadd's copies alone (2 in, 1 out per block, no kernel) GB/s in: 1 device "
          f"{duplex[0]:.1f}, both at once {duplex[1]:.1f} ({duplex[1] / duplex[0]:.2f} x)")

    rng = np.random.default_rng(0)
    pa = cv.pinned.empty(n, np.float32, device=devs[0])
    pb = cv.pinned.empty(n, np.float32, device=devs[0])
    pc = cv.pinned.empty(n, np.float32, device=devs[0])
    pa[:] = rng.random(n, dtype=np.float32)
    pb[:] = rng.random(n, dtype=np.float32)
    expected = pa + pb
    rows = []

    def case(name: str, inputs: list[np.ndarray], out: np.ndarray, ks: list[cv.Kernel],
             args: tuple = (), want: np.ndarray = expected, **kw: Any) -> None:
        def check() -> None:
            if not np.array_equal(out, want):
                sys.exit(f"{name}: wrong result")

        results = {}
        for label, device in (("1", devs[0]), ("2", devs)):
            seconds, report = timed(
                lambda device=device: cv.stream(ks[0], inputs, [out], device=device, args=args,
                                                block_bytes=block, **kw),
                check, options.repeats)
            results[label] = (seconds, report)
        one, two = results["1"][0], results["2"][0]
        report = results["2"][1]
        gbps_in = report.gbps_in
        row = {"case": name, "one_s": one, "two_s": two, "speedup": one / two,
               "two_gbps_in": gbps_in, "imbalance": report.imbalance,
               "blocks": [r.blocks for r in report.devices],
               "ratio_to_both_ceiling_in": gbps_in / both.pinned_h2d_gbps,
               "ratio_to_vadd_copies_in": gbps_in / duplex[1]}
        rows.append(row)
        print(f"{name:<22} 1 dev {one:7.3f} s  2 dev {two:7.3f} s  = {one / two:4.2f} x  "
              f"{gbps_in:6.1f} GB/s in ({row['ratio_to_both_ceiling_in']:.2f} of both-at-once "
              f"ceiling, {row['ratio_to_vadd_copies_in']:.2f} of vadd's copies alone)  "
              f"imbalance {report.imbalance:.1%}  blocks {row['blocks']}")

    case("vadd pinned", [pa, pb], pc, kernels)
    a, b = np.asarray(pa).copy(), np.asarray(pb).copy()
    c = np.empty_like(a)
    case("vadd pageable", [a, b], c, kernels)
    # Pageable: every byte is staged by the host (2 in, 1 out per 2 input bytes): 1.5 bytes
    # copied per input byte, so inputs can flow at most at host rate / 1.5.
    bound = min(both.pinned_h2d_gbps, host_rate / 1.5)
    rows[-1]["host_bound_gbps_in"] = bound
    print(f"{'':<22} pageable bound min(link, host {host_rate:.1f} / 1.5) = {bound:.1f} GB/s in "
          f"-> {rows[-1]['two_gbps_in'] / bound:.2f} of it")
    # Inputs only (a sum of a + b: a few KiB of partials come back): the copies go one way,
    # so the bound is the both-at-once host-to-device ceiling, not vadd's two-way copies.
    sums = {}
    for label, device in (("1", devs[0]), ("2", devs)):
        sums[label] = timed(
            lambda device=device: cv.stream(kernels[0], [pa, pb], device=device, reduce="sum",
                                            block_bytes=block), lambda: None, options.repeats)
    if sums["1"][1].result != sums["2"][1].result:
        sys.exit(f"sum: {sums['2'][1].result} on 2 devices, {sums['1'][1].result} on 1")
    one, two = sums["1"][0], sums["2"][0]
    report = sums["2"][1]
    rows.append({"case": "sum pinned (inputs only)", "one_s": one, "two_s": two,
                 "speedup": one / two, "two_gbps_in": report.gbps_in,
                 "imbalance": report.imbalance, "blocks": [r.blocks for r in report.devices],
                 "ratio_to_both_ceiling_in": report.gbps_in / both.pinned_h2d_gbps})
    print(f"{'sum pinned (in only)':<22} 1 dev {one:7.3f} s  2 dev {two:7.3f} s  = "
          f"{one / two:4.2f} x  {report.gbps_in:6.1f} GB/s in "
          f"({rows[-1]['ratio_to_both_ceiling_in']:.2f} of both-at-once ceiling)  imbalance "
          f"{report.imbalance:.1%}  blocks {rows[-1]['blocks']}  (same result on 1 and 2)")

    hc = cv.pinned.empty(n, np.float32, device=devs[0])
    want_heavy = np.empty_like(pa)
    cv.stream(heavy[0], [pa, pb], [want_heavy], device=devs[0], args=(reps,), block_bytes=block)
    case(f"compute-bound x{reps}", [pa, pb], hc, heavy, args=(reps,), want=want_heavy)

    # One GPU busy with another job: its blocks take longer; the dynamic supply gives it fewer.
    busy = {}
    for schedule in ("static", "dynamic"):
        with BusyJob(devs[1], elements=1 << 22 if gpu else 1 << 16, reps=busy_reps) as job:
            def check(schedule: str = schedule) -> None:
                if not np.array_equal(pc, expected):
                    sys.exit(f"busy {schedule}: wrong result")

            seconds, report = timed(
                lambda schedule=schedule: cv.stream(kernels[0], [pa, pb], [pc], device=devs,
                                                    block_bytes=block, schedule=schedule),
                check, options.repeats)
        busy[schedule] = {"seconds": seconds, "imbalance": report.imbalance,
                          "blocks": [r.blocks for r in report.devices],
                          "busy_launches": job.launches}
        print(f"GPU 1 busy, {schedule:<8} {seconds:7.3f} s  imbalance {report.imbalance:.1%}  "
              f"blocks {busy[schedule]['blocks']}")
    busy["dynamic_over_static"] = busy["static"]["seconds"] / busy["dynamic"]["seconds"]
    print(f"dynamic beats static by {busy['dynamic_over_static']:.2f} x with GPU 1 busy")
    figures["cases"] = rows
    figures["busy"] = busy
    if options.json:
        Path(options.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
