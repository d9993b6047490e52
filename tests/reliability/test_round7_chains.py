"""Round seven (chains and image blocks): edges tried as a demanding user would, which held
(no fix was needed); kept so that they keep holding. Real kernels, exact against NumPy."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "pipeline"))
from streamkit import store, to_host  # noqa: E402
from test_image import BOX  # noqa: E402  (a 3 x 3 box sum, halo 1)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

SOURCE = cv.portable("""
__kernel void dbl(__global const float *x, __global float *t, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) t[i] = 2.0f * x[i];
}
__kernel void inc(__global const float *t, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = t[i] + 1.0f;
}
__kernel void both(__global const float *t, __global float *y, __global float *r,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { y[i] = t[i]; r[i] = t[i]; }
}
""")


def add3(t, u, *, queue, offset, n):
    store(u, to_host(t, queue) + 3, queue)


def _chain(device: cv.Device) -> cv.Chain:
    return cv.chain(cv.link(device.compile(SOURCE, "dbl"), "in0", "t0"),
                    cv.link(add3, "t0", "t1"),
                    cv.link(device.compile(SOURCE, "inc"), "t1", "out0"),
                    temps=[np.float32, np.float32])


def test_a_mixed_chain_over_no_rows_writes_nothing_and_reduces_to_zero(device):
    empty = np.zeros(0, np.float32)
    y = np.zeros(0, np.float32)
    cv.stream(_chain(device), [empty], [y], device=device)
    assert y.shape == (0,)
    reduced = cv.chain(cv.link(device.compile(SOURCE, "dbl"), "in0", "t0"),
                       cv.link(device.compile(SOURCE, "both"), "t0", ("out0", "reduce")),
                       temps=[np.float32])
    report = cv.stream(reduced, [empty], [np.zeros(0, np.float32)], reduce="sum",
                       device=device)
    assert report.result == 0


def test_one_chain_streamed_from_two_threads_at_once_is_exact(device):
    chain = _chain(device)
    results: list[bool] = []
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            x = (np.arange(20000, dtype=np.float32) * seed) % 300
            for _ in range(3):
                y = np.zeros_like(x)
                cv.stream(chain, [x], [y], device=device, block_bytes=4096)
                results.append(bool(np.array_equal(y, 2 * x + 4)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in (1, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == [True] * 6


@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (5, 1), (2, 3)])
@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", 0])
def test_box_sums_of_one_row_or_one_column_images_match_np_pad(device, shape, boundary):
    if device.backend != "opencl":
        pytest.skip("OpenCL images; CUDA texture objects: test_image_cuda.py")
    try:
        device.image_limits()
    except InputError as exc:
        pytest.skip(f"{device.spec} has no images: {exc}")
    a = np.random.default_rng(2).integers(0, 9, size=shape).astype(np.float32)
    normalized = boundary in ("reflect", "periodic")
    mode = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap", 0: "constant"}
    padded = np.pad(a, 1, mode=mode[boundary])
    want = sum(padded[1 + dy: 1 + dy + shape[0], 1 + dx: 1 + dx + shape[1]]
               for dy in (-1, 0, 1) for dx in (-1, 0, 1))
    for block_bytes in (None, 4 * shape[1]):  # one block, and blocks of one row
        y = np.zeros_like(a)
        cv.stream(device.compile(BOX, "box"), [cv.image(a, normalized=normalized)], [y],
                  args=(int(normalized),), halo=1, boundary=boundary, device=device,
                  block_bytes=block_bytes)
        np.testing.assert_array_equal(y, want)
