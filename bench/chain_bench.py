"""A two-kernel chain against two separate streams on the same data (issue 19).

Kernels: ``t = x * a + b``, then ``y = t * t + 1`` (float32). The chain runs both on each
block with ``t`` in a device-only temp: x crosses the link in, y out. Two separate streams
send ``t`` to the host and back (x in, t out; t in, y out): twice the traffic each way. Both
in the same run, on pinned host arrays (so the link, not the host's staging, is the bound),
best of ``--repeats``. Input GB/s = bytes of x / seconds. Target on a GPU: chain >= 1.8 x.

    python bench/chain_bench.py [--device SPEC] [--gib 4] [--repeats 3] [--pageable]
"""

from __future__ import annotations

import argparse
import datetime
import time

import numpy as np

import conveyor as cv

SOURCE = cv.portable("""
__kernel void affine(__global const float *x, __global float *t, float a, float b,
                     ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) t[i] = x[i] * a + b;
}
__kernel void square_plus_one(__global const float *t, __global float *y,
                              ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = t[i] * t[i] + 1.0f;
}
""")
A, B = 1.5, -0.25


def _arrays(dev: cv.Device, n: int, pinned: bool) -> tuple[np.ndarray, ...]:
    x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    if not pinned:
        return x, np.empty_like(x), np.empty_like(x), np.empty_like(x)
    return (cv.pinned.asarray(x, device=dev), cv.pinned.empty_like(x, device=dev),
            cv.pinned.empty_like(x, device=dev), cv.pinned.empty_like(x, device=dev))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default=None, help="device spec, e.g. cuda:0, opencl:0:0")
    parser.add_argument("--gib", type=float, default=4.0, help="GiB of input (float32)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pageable", action="store_true",
                        help="NumPy arrays instead of pinned ones (host staging in the way)")
    options = parser.parse_args(argv)
    dev = cv.device(options.device)
    n = max(int(options.gib * 2**30) // 4, 1)
    first = dev.compile(SOURCE, "affine")
    second = dev.compile(SOURCE, "square_plus_one")
    chain = cv.chain(cv.link(first, "in0", "t", args=(A, B)),
                     cv.link(second, "t", "out0"), temps={"t": np.float32})
    x, t_host, y_separate, y_chain = _arrays(dev, n, not options.pageable)

    def separate() -> None:
        cv.stream(first, [x], [t_host], device=dev, args=(A, B))
        cv.stream(second, [t_host], [y_separate], device=dev)

    def chained() -> None:
        cv.stream(chain, [x], [y_chain], device=dev)

    best = {"two streams": float("inf"), "chain": float("inf")}
    runs = {"two streams": separate, "chain": chained}
    for _ in range(max(options.repeats, 1)):
        for name, run in runs.items():  # alternate, so drift hits both alike
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    exact = bool(np.array_equal(y_chain, y_separate))
    kind = "pageable" if options.pageable else "pinned"
    print(f"# two-kernel chain vs two streams — {dev.spec} {dev.name}, {options.gib:g} GiB "
          f"float32 ({kind}), best of {options.repeats}, {datetime.date.today()}\n")
    print("| variant | bytes over the link | seconds | input GB/s |")
    print("|---|---|---|---|")
    moved = {"two streams": 4 * x.nbytes, "chain": 2 * x.nbytes}
    for name, seconds in best.items():
        print(f"| {name} | {moved[name] / 2**30:.2f} GiB | {seconds:.3f} | "
              f"{x.nbytes / seconds / 1e9:.2f} |")
    ratio = best["two streams"] / best["chain"]
    print(f"\nchain / two streams: {ratio:.2f} x (target >= 1.8 on a GPU); results identical: "
          f"{exact}")
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
