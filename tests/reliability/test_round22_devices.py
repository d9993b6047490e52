"""Round twenty-two, helper b: differential fuzzing of streams over two devices (the ``pair``
fixture: PoCL's two OpenCL CPU devices here) against one device and NumPy.

A seeded generator (kept outside the repository) made about 1,500 cases, each run four ways
(one device; both devices under ``schedule="dynamic"`` and ``"static"``; the devices in the
other order: about 6,000 streams), and about 500 streams with faults injected by wrapping real
objects (a callable raising on one block or in ``reduce=f``, a device closed from a callable
mid-stream under files, halos and folds, a ``cv.resident`` or its home device closed mid-stream):
kernels and callables, chains of kernel and callable links with temps and a fold at the end,
halos under every boundary (arrays, ``.npy``, ``cv.npy``, ``cv.raw`` with a header, memmaps,
Parquet and Arrow inputs of uneven row groups and batches), ``cv.rows`` ratios as written
((2, 4), (3, 6), (6, 4), (2, 3)...) with and without a halo, ``cv.per_block`` records, chains
writing a map, a per-block and a ratio output at once beside a fold, reductions (sum / min /
max of float32, float64 and int32 kernels, NaN; callables' float, tuple, list and custom
``f`` partials), ``args=`` tables, ``cv.resident`` handles bound to either device,
``__constant`` inputs and tables, in place, ``.npy`` / ``cv.raw_out`` outputs and an output
over its input's file, ``first_row`` (0, 1, 2**40, negative), block sizes of 1 to 100 rows,
depths 1 to 5, ``workers=``, traces, and 0, 1, 2 rows (fewer rows than devices). Every run
compared outputs, ``report.result`` and the report's figures (rows, blocks, block rows,
bytes; per-device blocks and bytes adding up, per-device block ranges tiling the rows; one
trace process per device that ran a block) with one device and with NumPy, then checked both
devices' pools at zero and no staging thread left. All of these agreed (float64 sums up to
summation order; a callable's tuple partial over no rows gives the dtype's 0, as the README
says). ``device=`` and ``schedule=`` refuse sets, generators, arrays, None, a device named
twice, and ``"STATIC"`` with an ``InputError``.

Found (strict xfails, each asserting the right behaviour):

- **Two versions of one kernel in one stream**: a Kernel built for one device is built again
  for each other device from its source and options (``multi.kernel_for``), reading its
  ``#include`` headers as they are *now*. A header edited after the first build (a notebook
  cell re-run with the kernel object kept) gives a stream in which the first device's rows
  come from the old code and the others' from the new: no error, an answer that matches
  neither version. One device runs the kernel it was given throughout. The same with ``-I.``,
  a relative ``-Iinc`` or a quoted include found in the current folder after ``os.chdir``.

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    assert_clean,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

SCHEDULES = ["dynamic", "static"]


def _opencl(*devices: cv.Device) -> None:
    for dev in devices:
        if dev.backend != "opencl":
            pytest.skip("OpenCL C kernels")


def _clean(pair) -> None:
    for dev in pair:
        assert_clean(dev)


# ------------------------------------------------------------ one kernel, rebuilt per device

HEADED = """#include "scale.h"
__kernel void headed(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * SCALE;
}"""


def test_a_header_edited_after_the_build_never_mixes_two_kernels(pair, tmp_path):
    # k = d0.compile(src_including_h, "headed", options=("-I" + folder,)); edit h
    # cv.stream(k, [x], [y], device=[d0, d1]): d0's rows use the old h, d1's the new.
    # multi.kernel_for builds d1's from k.source and k.options, reading h as it is now.
    _opencl(*pair)
    header = tmp_path / "scale.h"
    header.write_text("#define SCALE 1.0f\n")
    built = pair[0].compile(HEADED, "headed", options=(f"-I{tmp_path}",))
    header.write_text("#define SCALE 2.0f\n")  # edited; the kernel object is kept
    x = np.ones(4000, np.float32)
    y = np.zeros_like(x)
    cv.stream(built, [x], [y], device=pair[0], block_bytes=4000)
    np.testing.assert_array_equal(y, x)  # one device: the kernel as built
    y[:] = 0
    try:
        report = cv.stream(built, [x], [y], device=list(pair), block_bytes=4000,
                           schedule="static")
    except InputError as exc:  # refused ("compile it again") is right too
        assert "scale.h" in str(exc)
    else:
        assert [d.blocks for d in report.devices] == [2, 2]
        # Every row from one kernel: not half the rows times 1 and half times 2.
        assert np.unique(y).size == 1, np.unique(y)
    _clean(pair)


# ------------------------------------------------------------------------------- guards

SRC = """
__kernel void scale(__global const float *x, __global float *y, float k, ulong offset,
                    ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * k + (float)((offset + i) % 5);
}
__kernel void bsum(__global const float *x, __global float *y, ulong cols, ulong offset,
                   ulong n) {
    if (get_global_id(0) == 0) {
        float s = 0;
        for (ulong j = 0; j < n; j++) s += x[j];
        y[0] = s; y[1] = (float)(offset / cols); y[2] = (float)n;
    }
}
__kernel void pool(__global const float *x, __global float *y, ulong p, ulong q, ulong cols,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    ulong r = i / cols, c = i % cols;
    if (r % q) return;
    float s = 0;
    for (ulong k = 0; k < q; k++) s += x[(r + k) * cols + c] * (float)(k + 1);
    for (ulong m = 0; m < p; m++)
        y[((r / q) * p + m) * cols + c] = s * (float)(m + 1) + (float)(offset / cols + r);
}
__kernel void ident(__global const float *x, __global float *r, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) r[i] = x[i];
}
__kernel void sten(__global const float *x, __global float *y, ulong cols, ulong halo,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) {
        float s = x[i];
        for (ulong k = 1; k <= 2 * halo; k++) s += x[i + k * cols] * (float)(k + 1);
        y[i] = s;
    }
}
"""

_built: dict[tuple[int, str], cv.Kernel] = {}


def _k(device: cv.Device, name: str) -> cv.Kernel:
    key = (id(device), name)
    if key not in _built or _built[key].device is not device:
        _built[key] = device.compile(SRC, name)
    return _built[key]


def _small(shape, seed):
    """Small whole numbers as float32: every sum below is exact, in any order."""
    return np.random.default_rng(seed).integers(-9, 10, shape).astype(np.float32)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_guard_a_chain_of_map_record_and_ratio_outputs_and_a_fold(pair, schedule):
    """guard: one chain writing a map output, a ``cv.per_block`` record and a ``cv.rows``
    ratio (2, 4) output (taken as written: blocks cut at multiples of 4 rows) beside a
    ``reduce="max"`` of the map, from ``first_row=7``, over two devices: the same outputs,
    records, block ranges and result as one device, and NumPy's."""
    _opencl(*pair)
    rows, cols, p, q = 48, 3, 2, 4
    x = _small((rows, cols), 1)

    def run(devices):
        first = devices[0]
        out = np.zeros_like(x)
        chain = cv.chain(
            cv.link(_k(first, "scale"), reads="in0", writes="out0", args=(2.0,)),
            cv.link(_k(first, "bsum"), reads="in0", writes="out1", args=(cols,)),
            cv.link(_k(first, "pool"), reads="in0", writes="out2", args=(p, q, cols)),
            cv.link(_k(first, "ident"), reads="out0", writes="reduce"))
        report = cv.stream(chain, [x], [out, cv.per_block((3,), np.float32),
                                        cv.rows(np.float32, ratio=(p, q), shape=(cols,))],
                           device=devices, reduce="max", block_bytes=8 * cols * 4,
                           first_row=7, schedule=schedule)
        return out, report

    one_out, one = run([pair[0]])
    two_out, two = run(list(pair))
    assert sum(d.blocks for d in two.devices) == two.blocks == one.blocks == 6
    np.testing.assert_array_equal(two_out, one_out)
    for a, b in zip(two.outputs[1:], one.outputs[1:], strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(two.block_ranges, one.block_ranges)
    assert two.result == one.result
    index = np.arange(x.size, dtype=np.int64).reshape(x.shape) + 7 * cols
    mapped = x * 2 + (index % 5)
    np.testing.assert_array_equal(two_out, mapped)
    assert two.result == mapped.max()
    records = np.array([[x[a:b].sum(), 7 + a, (b - a) * cols] for a, b in two.block_ranges],
                       np.float32)
    np.testing.assert_array_equal(two.outputs[1], records)
    groups = (x.reshape(rows // q, q, cols) * np.arange(1, q + 1, dtype=np.float32)[:, None]
              ).sum(axis=1)
    ratio = np.stack([groups * (m + 1) + (7 + np.arange(rows // q) * q)[:, None]
                      for m in range(p)], axis=1).reshape(rows * p // q, cols)
    np.testing.assert_array_equal(two.outputs[2], ratio.astype(np.float32))
    _clean(pair)


@pytest.mark.parametrize("form", ["parquet", "arrow"])
def test_guard_table_files_with_a_periodic_halo_over_two_devices(pair, tmp_path, form):
    """guard: a Parquet or Arrow input of uneven row groups / batches (read by one device at
    a time) with ``halo=2, boundary="periodic"``, whose first and last blocks run on
    different devices (static schedule): ``np.pad``'s "wrap" rows, as on one device."""
    _opencl(*pair)
    pa = pytest.importorskip("pyarrow")
    rows, h = 300, 2
    x = _small((rows,), 2)
    if form == "parquet":
        import pyarrow.parquet as pq

        path = tmp_path / "t.parquet"
        pq.write_table(pa.table({"x": x}), path, row_group_size=7)
        source = cv.parquet(path, "x")
    else:
        import pyarrow.ipc as ipc

        path = tmp_path / "t.arrow"
        with ipc.new_file(path, pa.schema([("x", pa.float32())])) as writer:
            for batch in pa.table({"x": x}).to_batches(max_chunksize=11):
                writer.write_batch(batch)
        source = cv.arrow(path, "x")
    y = np.zeros_like(x)
    report = cv.stream(_k(pair[0], "sten"), [source], [y], device=list(pair), halo=h,
                       boundary="periodic", args=(1, h), block_bytes=40 * 4,
                       schedule="static")
    assert all(d.blocks for d in report.devices)
    padded = np.pad(x, h, mode="wrap")
    want = padded[:rows].copy()
    for k in range(1, 2 * h + 1):
        want = want + padded[k:k + rows] * np.float32(k + 1)
    np.testing.assert_array_equal(y, want)
    _clean(pair)


def test_a_header_edited_while_a_kernel_future_builds_is_seen_over_two_devices(pair, tmp_path):
    """The review of round twenty-two: the header state was read when the future's kernel
    was loaded, after its build, so an edit between the two was recorded as the binary's and
    the other device built the new code (half the rows x1, half x2). It is read with the key
    now, before the build."""
    _opencl(*pair)
    header = tmp_path / "scale.h"
    header.write_text("#define SCALE 1.0f\n")
    future = pair[0].compile(HEADED, "headed", options=(f"-I{tmp_path}",), wait=False)
    while not future.done():
        time.sleep(0.01)
    header.write_text("#define SCALE 2.0f\n")  # edited after the build, before result()
    built = future.result()
    x = np.ones(4000, np.float32)
    y = np.zeros_like(x)
    with pytest.raises(InputError, match="scale.h"):
        cv.stream(built, [x], [y], device=list(pair), block_bytes=4000, schedule="static")
    _clean(pair)
