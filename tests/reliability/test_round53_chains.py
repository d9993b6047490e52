"""Round fifty-three, chains after this session's changes (a callable's warm-up before the
ring, writable tables found in callables' args, outputs readied before the copy-back): kernel
and callable links with temps, halos, ``cv.rows`` and per-block outputs, read-only and
writable residents, file outputs and two devices, each compared with NumPy. Real PoCL
devices and kernels.

Found (xfail, strict):

- A writable ``cv.resident`` handle in a callable link's ``args=`` is refused with "give the
  callable the array itself, and write it there". Doing that, while a kernel link of the same
  chain counts into the table through the handle, loses every write the callable made: the
  table's copy-back after the stream replaces the host array with the device's copy. No
  error; the callable's counts are simply gone.

The rest are guards: cases that held when tried.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import assert_clean, compiled, opencl_c_only, store, to_host  # noqa: E402

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

KERNELS = """
__kernel void dbl(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}
__kernel void pool2(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n / 2) y[i] = x[2 * i] + x[2 * i + 1];
}
__kernel void hist(__global const float *x, __global int *counts, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) atomic_add(&counts[((int)x[i]) % 8], 1);
}
"""

PADS = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}


def padded(x: np.ndarray, halo: int, boundary: str) -> np.ndarray:
    return np.pad(x, ((halo, halo),), mode=PADS[boundary])


def k(device: cv.Device, name: str) -> cv.Kernel:
    return compiled(device, KERNELS, name)


def values(n: int) -> np.ndarray:
    return (np.arange(n) % 13).astype(np.float32)


def test_a_callable_writing_the_array_of_a_writable_table_keeps_its_writes_or_is_refused(
        device):
    opencl_c_only(device)
    x = values(10_007)
    counts = np.zeros(8, np.int32)
    y = np.zeros_like(x)
    calls = []

    def tally(t, out, table, *, queue, offset, n):
        table[0] += 1  # the callable's own count, in the array the refusal said to pass
        calls.append(n)
        store(out, to_host(t, queue) + 1, queue)

    with cv.resident(counts, writable=True) as handle:
        # the handle itself in the callable's args is refused, advising the array instead
        with pytest.raises(InputError, match="give the callable an array of its own"):
            cv.stream(cv.chain(cv.link(k(device, "hist"), "in0", (), args=(handle,)),
                               cv.link(tally, "in0", "out0", args=(handle,))),
                      [x], [y], device=device, block_bytes=4000)
        chain = cv.chain(cv.link(k(device, "hist"), "in0", (), args=(handle,)),
                         cv.link(k(device, "dbl"), "in0", "t0"),
                         cv.link(tally, "t0", "out0", args=(counts,)), temps=[np.float32])
        try:
            cv.stream(chain, [x], [y], device=device, block_bytes=4000, warmup=False)
        except InputError as exc:  # refused, naming the shared array: right too
            assert "counts" in str(exc) or "args[0]" in str(exc)
            return
    np.testing.assert_array_equal(y, 2 * x + 1)
    want = np.bincount(x.astype(np.int64) % 8, minlength=8)
    want[0] += len(calls)
    np.testing.assert_array_equal(counts, want)  # today: counts == bincount, calls lost


# -- guards ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fail_at", [0, 5000, None])
def test_guard_a_failing_callable_link_drops_table_writes_and_file(device, tmp_path, fail_at):
    # guard: a kernel link counts into a writable table, a callable link fails in its warm-up
    # (offset 0), mid-stream, or never; the table keeps its values and no file is left, or
    # both are right
    opencl_c_only(device)
    x = values(10_007)
    counts = np.full(8, 7, np.int32)
    out = tmp_path / "y.npy"

    def last(t, y, *, queue, offset, n):
        if fail_at is not None and offset >= fail_at:
            raise ZeroDivisionError(f"the block at {offset}")
        store(y, to_host(t, queue) + 1, queue)

    with cv.resident(counts, writable=True) as handle:
        chain = cv.chain(cv.link(k(device, "hist"), "in0", (), args=(handle,)),
                         cv.link(k(device, "dbl"), "in0", "t0"),
                         cv.link(last, "t0", "out0"), temps=[np.float32])
        if fail_at is None:
            cv.stream(chain, [x], [cv.npy_out(out, np.float32)], device=device,
                      block_bytes=4000)
            np.testing.assert_array_equal(np.load(out), 2 * x + 1)
            want = np.bincount(x.astype(np.int64) % 8, minlength=8) + 7
            np.testing.assert_array_equal(counts, want)
        else:
            with pytest.raises(ZeroDivisionError):
                cv.stream(chain, [x], [cv.npy_out(out, np.float32)], device=device,
                          block_bytes=4000)
            np.testing.assert_array_equal(counts, np.full(8, 7, np.int32))
            assert os.listdir(tmp_path) == []
    assert_clean(device)


@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic"])
def test_guard_a_halo_callable_then_kernels_into_rows_outputs_on_two_devices(pair, boundary):
    # guard: a callable link reads input 0 with its halo, then two kernel links read its temp
    # into a full output and a cv.rows(ratio=(1, 2)) output, over two devices
    opencl_c_only(pair[0])
    x = values(10_006)
    halo = 3

    def sums(xh, t, *, queue, offset, n):
        h = to_host(xh, queue)
        store(t, h[halo:len(h) - halo] + h[:len(h) - 2 * halo] + h[2 * halo:], queue)

    chain = cv.chain(cv.link(sums, "in0", "t0"), cv.link(k(pair[0], "dbl"), "t0", "out0"),
                     cv.link(k(pair[0], "pool2"), "t0", "out1"), temps=[np.float32])
    y = np.zeros_like(x)
    report = cv.stream(chain, [x], [y, cv.rows(np.float32, ratio=(1, 2))], device=pair,
                       block_bytes=4000, halo=halo, boundary=boundary)
    p = padded(x, halo, boundary)
    t = x + p[:len(x)] + p[2 * halo:]
    np.testing.assert_array_equal(y, 2 * t)
    np.testing.assert_array_equal(report.outputs[1], t[0::2] + t[1::2])
