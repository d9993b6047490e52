"""Round twenty-four, helper B: README.md's promises read as a demanding user reads them, section
by section since round seventeen's pass (test_round17_docs.py): chains, callables and what
they may return, reductions and folds, ``cv.rows``/``cv.per_block``, several devices, resident
tables, ``keep_pinned``, pinned and registered memory, files and the command line (exit
codes, ``--json``, ``--cast``, modes, links), ``conveyor.dask``, the environment variables,
strict mode, and the docstrings of the public names. Every code example was run as written
(on PoCL), and each sentence that promises a behaviour was tried; nearly all held.

Found:

- **README promise false (reductions)**, the README reworded (no test: a float64 sum's last
  bits do depend on the order): "A kernel's float32 values are summed in float64 on
  the device where it has doubles ..., so the total does not depend on the block size." It
  does: float32 values ``[2**60, 1, -2**60, 1] * 10`` (all exact in float32; the true total is
  20) sum to 1.0 in blocks of one row, 0.0 in blocks of two, 10.0 in blocks of four and 0.0 in
  one block. A float64 running sum is exact only while the values span less than 53 bits;
  the device's per-work-item strides (reduce.py, the generated fold), ``fold_partials`` and
  the host fold of block partials add in an order the block size sets. The float64
  accumulator fixed float32 overflow and rounding (the 3001 x 2**127 case), not this.
- **Unclear error (Dask)** (a strict xfail, fixed: the worker names ``dtype=``):
  ``conveyor.dask.map_blocks(k, x, dtype=np.float64)`` for a kernel
  whose output parameter is ``float*`` builds the graph, and every chunk's ``compute()`` fails
  with cv.stream's advice, "output 0 has dtype float64: pass an array of float32 (e.g.
  a.astype(np.float32))": the user passed no array, only ``dtype=``. A defaulted dtype gets
  "pass dtype=np.{dtype} to map_blocks" (arrays.py ``_map_chunk``'s ``defaulted``); an
  explicit one gets nothing, though the client knows the kernel's parameters
  (``_default_dtype`` reads them) and could refuse it before any task.

Guards say "guard:" in their docstrings.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and streamkit)
from reliakit import (  # noqa: E402
    assert_clean,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    kernel,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402
from conveyor.pipeline.reduce import has_fp64  # noqa: E402


# == Reductions: float32 totals in float64 ====================================================
def test_a_float32_kernel_sum_of_ordinary_values_is_the_same_in_any_blocks(device):
    """guard: what the README's float64 accumulator does hold: float32 values of one
    magnitude (a million normal values, and 2**127 values that overflow float32 when summed)
    give one total whatever the block size and path."""
    if not has_fp64(device):
        pytest.skip("float32 partials without doubles")
    ident = kernel(device, "ident")
    x = (np.random.default_rng(2).standard_normal(250_000) * 1000).astype(np.float32)
    big = np.full(3001, 2.0**127, np.float32)
    for data in (x, big):
        totals = {float(cv.stream(ident, [data], reduce="sum", device=device, block_bytes=bb,
                                  zero_copy=zero_copy).result)
                  for bb in (4000, 40_000, None) for zero_copy in (None, False)}
        assert len(totals) == 1, totals
    assert totals == {3001 * 2.0**127}
    assert_clean(device)


# == conveyor.dask: map_blocks(dtype=) that the kernel does not write ============================
def test_dask_map_blocks_with_a_dtype_the_kernel_does_not_write_says_dtype(device):
    """``cvd.map_blocks(k, x, dtype=np.float64)`` where ``k`` writes ``float*``: every chunk
    fails at ``compute()`` with "output 0 has dtype float64: pass an array of float32 (e.g.
    a.astype(np.float32)) or declare the parameter double*". The user gave ``dtype=``, not an
    array; the message should name ``dtype=`` (as a defaulted dtype's does: "pass
    dtype=np.float32 to map_blocks"), best on the client before any task."""
    cvd = pytest.importorskip("conveyor.dask")
    da = pytest.importorskip("dask.array")
    import dask

    if device.backend != "opencl":
        pytest.skip("the synchronous scheduler opens the device by spec in this process")
    scale = kernel(device, "scale")
    x = da.from_array(np.arange(100, dtype=np.float32), chunks=50)
    with dask.config.set(scheduler="synchronous"), pytest.raises(InputError) as caught:
        cvd.map_blocks(scale, x, args=(2.0,), dtype=np.float64, device=device.spec).compute()
    assert "dtype=" in str(caught.value), caught.value


# == The README's image snippet, as written =======================================================
DOWNSCALE = """__kernel void downscale(read_only image2d_t img, sampler_t linear,
                                __global float *out,
                                uint p, uint q, uint out_columns, ulong offset, ulong n) {
    ulong i = get_global_id(0), out_rows = n / get_image_width(img) * p / q;
    if (i >= out_rows * out_columns) return;
    float2 at = (float2)((i % out_columns + 0.5f) * q / p, (i / out_columns + 0.5f) * q / p);
    out[i] = read_imagef(img, linear, at).x;
}"""


def _bilinear(x: np.ndarray, p: int, q: int) -> np.ndarray:
    """``x`` resampled by ``p / q`` with clamp-to-edge bilinear reads at pixel centres."""
    rows, cols = x.shape
    ys = (np.arange(rows * p // q) + 0.5) * q / p - 0.5
    xs = (np.arange(cols * p // q) + 0.5) * q / p - 0.5
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]

    def at(r: np.ndarray, c: np.ndarray) -> np.ndarray:
        return x[np.clip(r, 0, rows - 1)][:, np.clip(c, 0, cols - 1)]

    return ((1 - fy) * ((1 - fx) * at(y0, x0) + fx * at(y0, x0 + 1))
            + fy * ((1 - fx) * at(y0 + 1, x0) + fx * at(y0 + 1, x0 + 1)))


def test_readme_image_snippet_downscales_as_numpy_does(device):
    """guard: README, Image blocks: the ``downscale`` snippet as written (its first line
    broken in two) (``cv.image(x, filter="linear")``, ``cv.rows(np.float32, ratio=(2, 3),
    shape=(cols * 2 // 3,))``, ``args=(2, 3, cols * 2 // 3)``), over ten blocks, equals a
    clamp-to-edge bilinear resampling of the whole image (values in quarters: exact in
    float32)."""
    if device.backend != "opencl":
        pytest.skip("OpenCL C image kernel (CUDA takes a cudaTextureObject_t)")
    rows, cols = 300, 96
    x = (np.random.default_rng(0).integers(0, 64, (rows, cols)) / 4).astype(np.float32)
    report = cv.stream(device.compile(DOWNSCALE, "downscale"), [cv.image(x, filter="linear")],
                       [cv.rows(np.float32, ratio=(2, 3), shape=(cols * 2 // 3,))],
                       args=(2, 3, cols * 2 // 3), memory_limit="256MiB", device=device,
                       block_bytes=cols * 4 * 30)
    assert report.blocks == 10
    np.testing.assert_array_equal(report.outputs[0], _bilinear(x, 2, 3))
    assert_clean(device)


# == Python callables: the README's snippet and its warm-up call ==================================
def test_readme_callable_snippet_and_its_warm_up_call(device):
    """guard: README, Python callables: ``return x * 2`` fills the output; before the stream
    the callable is called once on the first rows, at most 64, into scratch outputs that are
    dropped (a reduction's warm-up partial is not folded: each row counts once);
    ``warmup=False`` turns the call off."""
    if device.backend != "opencl":
        pytest.skip("PyOpenCL array arithmetic")
    calls: list[tuple[int, int]] = []

    def double(x, y, *, queue, offset, n):
        calls.append((offset, n))
        return x * 2

    def count(x, *, queue, offset, n):
        calls.append((offset, n))
        return np.int64(n)

    x = np.arange(1000, dtype=np.float32)
    report = cv.stream(double, [x], [np.float32], device=device, block_bytes=800)
    np.testing.assert_array_equal(report.outputs[0], x * 2)
    assert calls[0] == (0, 64) and calls[1:] == [(r, 200) for r in range(0, 1000, 200)]
    calls.clear()
    cv.stream(double, [x], [np.float32], device=device, block_bytes=800, warmup=False)
    assert calls == [(r, 200) for r in range(0, 1000, 200)]
    calls.clear()
    assert cv.stream(count, [x], reduce="sum", device=device, block_bytes=800).result == 1000
    assert calls[0] == (0, 64) and len(calls) == 6
    assert_clean(device)
