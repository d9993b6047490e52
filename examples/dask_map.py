"""conveyor on a Dask cluster: a 5-point stencil over a dask array, then a reduction.

Starts a LocalCluster of two worker processes (each opens its own device: PoCL here, a GPU
where there is one), streams every chunk through the kernel with dask's overlap for the halo,
and checks the result against NumPy.

    python examples/dask_map.py [--rows 1000000] [--chunks 250000] [--device SPEC]
"""

from __future__ import annotations

import argparse

import dask.array as da
import numpy as np
from distributed import Client, LocalCluster

import conveyor as cv
import conveyor.dask as cvd

SOURCE = cv.portable("""
__kernel void smooth5(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);   /* element i of the block is x[i + 2] */
    if (i < n) y[i] = (x[i] + x[i + 1] + x[i + 2] + x[i + 3] + x[i + 4]) * 0.2f;
}
""")

SUM = cv.portable("""
__kernel void square(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * x[i];
}
""")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--chunks", type=int, default=250_000)
    parser.add_argument("--device", default=None, help="device spec on every worker")
    options = parser.parse_args()
    x = np.random.default_rng(0).random(options.rows, dtype=np.float32)
    kernel = cvd.kernel(SOURCE, "smooth5")  # built on the workers; the client compiles nothing
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, \
            Client(cluster):
        dx = da.from_array(x, chunks=options.chunks)
        y = cvd.map_blocks(kernel, dx, halo=2, boundary="nearest", device=options.device)
        got = y.compute()
        total = cvd.reduce(cvd.kernel(SUM, "square"), dx, "sum",
                           device=options.device).compute()
    p = np.pad(x, 2, mode="edge")
    expected = (p[:-4] + p[1:-3] + p[2:-2] + p[3:-1] + p[4:]) * np.float32(0.2)
    print(f"stencil over {len(dx.chunks[0])} chunks on 2 workers: max error "
          f"{float(np.max(np.abs(got - expected))):.2e}")
    reference = float(np.sum(x.astype(np.float64) ** 2))
    print(f"sum of squares: {float(total):.6g} (NumPy: {reference:.6g})")


if __name__ == "__main__":
    main()
