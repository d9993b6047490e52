"""Quick measurements behind ``conveyor devices --measure`` and ``conveyor bench``.

Link bandwidth is measured with the backend primitives only (a pinned or pageable host array,
a device buffer, ``copy_in``/``copy_out`` on one queue), best of a few repeats, so the figure is
the ceiling a stream can reach on this device. The naive loop is what people write first: one
block at a time, blocking copies from pageable NumPy arrays, no overlap.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from conveyor.backends.base import Device, Kernel
from conveyor.memory import numa


@dataclass(frozen=True)
class LinkFigures:
    """Copy bandwidth of one device in GB/s (1e9 bytes/s), pinned and pageable, each way."""

    pinned_h2d_gbps: float
    pinned_d2h_gbps: float
    pageable_h2d_gbps: float
    pageable_d2h_gbps: float

    def as_dict(self) -> dict[str, float]:
        """The figures by name (the keys of the cached JSON)."""
        return {
            "pinned_h2d_gbps": self.pinned_h2d_gbps,
            "pinned_d2h_gbps": self.pinned_d2h_gbps,
            "pageable_h2d_gbps": self.pageable_h2d_gbps,
            "pageable_d2h_gbps": self.pageable_d2h_gbps,
        }


def _best_gbps(nbytes: int, repeats: int, run: Callable[[], None]) -> float:
    run()  # the first copy pays for page faults and driver set-up
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return nbytes / best / 1e9 if best > 0 else 0.0


def link_bandwidth(device: Device, nbytes: int = 64 * 2**20, repeats: int = 3) -> LinkFigures:
    """Measure host-to-device and device-to-host copies of ``nbytes`` from pinned and from
    pageable memory on ``device``; best of ``repeats``."""
    queue = device.create_queue()
    try:
        device.wait_for_warm_up()  # its allocations would share the measured time
        with (device.alloc_device(nbytes) as dev_buf,
              numa.allocate_near(device, device.alloc_pinned, nbytes) as pinned_buf):
            pinned_host = pinned_buf.array[:nbytes]
            pinned_host.fill(1)
            pageable = np.ones(nbytes, np.uint8)

            def copy_in(host: np.ndarray) -> Callable[[], None]:
                return lambda: queue.copy_in(dev_buf, host).wait()

            def copy_out(host: np.ndarray) -> Callable[[], None]:
                return lambda: queue.copy_out(host, dev_buf).wait()

            figures = LinkFigures(
                pinned_h2d_gbps=_best_gbps(nbytes, repeats, copy_in(pinned_host)),
                pinned_d2h_gbps=_best_gbps(nbytes, repeats, copy_out(pinned_host)),
                pageable_h2d_gbps=_best_gbps(nbytes, repeats, copy_in(pageable)),
                pageable_d2h_gbps=_best_gbps(nbytes, repeats, copy_out(pageable)),
            )
            queue.finish()
    finally:
        queue.close()
    return figures


def naive_loop(device: Device, kernel: Kernel, inputs: list[np.ndarray], output: np.ndarray,
               block_rows: int, args: Sequence[Any] = ()) -> float:
    """Run a map the naive way: per block, blocking copies in from pageable arrays, the
    kernel, a blocking copy out. Returns the seconds it took."""
    queue = device.create_queue()
    row_bytes = [a.nbytes // max(len(a), 1) for a in inputs]
    out_row_bytes = output.nbytes // max(len(output), 1)
    dev_in = [device.alloc_device(max(block_rows * rb, 1)) for rb in row_bytes]
    dev_out = device.alloc_device(max(block_rows * out_row_bytes, 1))
    try:
        started = time.perf_counter()
        for start in range(0, len(output), block_rows):
            stop = min(start + block_rows, len(output))
            for buf, array in zip(dev_in, inputs, strict=True):
                queue.copy_in(buf, array[start:stop]).wait()
            n = stop - start
            launch_args = [*dev_in, dev_out, *args, np.uint64(start), np.uint64(n)]
            queue.launch(kernel, n, launch_args).wait()
            queue.copy_out(output[start:stop], dev_out).wait()
        queue.finish()
        return time.perf_counter() - started
    finally:
        for buf in [*dev_in, dev_out]:
            buf.close()
        queue.close()
