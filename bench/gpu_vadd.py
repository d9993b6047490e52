"""vadd over 2 x 4 GiB float32 inputs in 64 MiB blocks, on every GPU backend present, from
pageable NumPy arrays and from pinned arrays, next to the pinned copy ceiling of the same run.

Run on the GPU machine: python3 bench/gpu_vadd.py [--gib 4] [--json out.json]
Prints a markdown table; each figure is the best of --repeats runs after one warm-up, and
every result is checked against NumPy before its time counts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time

import numpy as np

import conveyor as cv

SOURCE = cv.portable("""
__kernel void vadd(__global const float *a, __global const float *b, __global float *c,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}
""")



def ceiling(dev: cv.Device, nbytes: int, repeats: int = 3) -> dict[str, float]:
    """Pinned copy GB/s host->device, device->host, and both at once (two queues)."""
    pin_in = dev.alloc_pinned(nbytes)
    pin_out = dev.alloc_pinned(nbytes)
    buf_a = dev.alloc_device(nbytes)
    buf_b = dev.alloc_device(nbytes)
    q1, q2 = dev.create_queue(), dev.create_queue()
    pin_in.array.fill(1)
    pin_out.array.fill(0)
    best = {"h2d": 0.0, "d2h": 0.0, "both": 0.0}
    try:
        for _ in range(repeats + 1):
            start = time.perf_counter()
            q1.copy_in(buf_a, pin_in.array).wait()
            best["h2d"] = max(best["h2d"], nbytes / (time.perf_counter() - start) / 1e9)
            start = time.perf_counter()
            q1.copy_out(pin_out.array, buf_a).wait()
            best["d2h"] = max(best["d2h"], nbytes / (time.perf_counter() - start) / 1e9)
            start = time.perf_counter()
            e1 = q1.copy_in(buf_b, pin_in.array)
            e2 = q2.copy_out(pin_out.array, buf_a)
            e1.wait()
            e2.wait()
            best["both"] = max(best["both"], 2 * nbytes / (time.perf_counter() - start) / 1e9)
    finally:
        for obj in (q1, q2, buf_a, buf_b, pin_in, pin_out):
            obj.close()
    return best


def run(dev: cv.Device, a: np.ndarray, b: np.ndarray, c: np.ndarray, expected: np.ndarray,
        repeats: int) -> tuple[float, float]:
    """Best input GB/s and the overlap figure of that run."""
    kernel = dev.compile(SOURCE, "vadd")
    best, overlap = 0.0, 0.0
    for attempt in range(repeats + 1):
        c.fill(0)
        report = cv.stream(kernel, [a, b], [c], device=dev, block_bytes=64 * 2**20)
        if not np.array_equal(c, expected):
            raise SystemExit(f"{dev.spec}: wrong result")
        if attempt and report.gbps_in > best:
            best, overlap = report.gbps_in, report.overlap or 0.0
    return best, overlap


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=4.0, help="GiB per input")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None)
    options = parser.parse_args()
    n = int(options.gib * 2**30) // 4
    rng = np.random.default_rng(1)
    a = rng.random(n, dtype=np.float32)
    b = rng.random(n, dtype=np.float32)
    expected = a + b
    c = np.empty_like(a)
    c.fill(0)
    rows = []
    gpus = [d for d in cv.devices() if d.kind == "gpu"]
    print(f"# vadd 2 x {options.gib:g} GiB float32 in, 64 MiB blocks — {datetime.date.today()}\n")
    print("| device | pinned H2D ceiling | D2H | both | input kind | input GB/s | "
          "ratio to H2D ceiling | overlap |")
    print("|---|---|---|---|---|---|---|---|")
    for dev in gpus:
        ceil = ceiling(dev, 2 * 2**30)
        for kind in ("pageable", "pinned"):
            if kind == "pinned":
                ins = [cv.pinned.asarray(a, device=dev), cv.pinned.asarray(b, device=dev)]
                out = cv.pinned.zeros_like(c, device=dev)
            else:
                ins, out = [a, b], c
            gbps, overlap = run(dev, ins[0], ins[1], out, expected, options.repeats)
            del ins, out
            row = {"device": f"{dev.spec} {dev.name}", "h2d": ceil["h2d"], "d2h": ceil["d2h"],
                   "both": ceil["both"], "kind": kind, "gbps_in": gbps,
                   "ratio": gbps / ceil["h2d"], "overlap": overlap}
            rows.append(row)
            print(f"| {row['device']} | {ceil['h2d']:.1f} GB/s | {ceil['d2h']:.1f} | "
                  f"{ceil['both']:.1f} | {kind} | {gbps:.1f} | {row['ratio']:.2f} | "
                  f"{overlap:.0%} |", flush=True)
    if options.json:
        with open(options.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
