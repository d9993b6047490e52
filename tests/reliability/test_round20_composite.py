"""Round twenty, helper b: differential fuzzing of the composite paths against NumPy.

A seeded generator (kept outside the repository) built about 10,000 streams that combine file
inputs and outputs (``.npy`` paths, ``cv.npy``, ``cv.raw`` with a header offset, memmaps in
modes r / c / r+ / w+, ``cv.npy_out``, ``cv.raw_out``, an output over an input's file, an
existing file replaced), ``cv.iterate`` over uneven chunks (empty, one-row, refilled buffers,
views, lists, a chunk of another dtype), chains of 2 to 4 links (kernels and callables,
halos, temps of other types, outputs read by later links, reductions), ``cv.per_block`` and
``cv.rows`` outputs, image blocks, and streams over two devices, with random sizes, row
shapes, halos (also longer than the input), boundaries, block sizes, depths, ``first_row``
(up to 2**62 and negative), ``keep_pinned`` and traces, each compared with a NumPy reference
(outputs, files written, files that must not change, no leftover part files, pools back at
zero). Every answer matched NumPy and every failure was a conveyor error that left files as
they were.

Found (strict xfails, each asserting the right behaviour):

- **A chain of kernels is taken for a callable** in the zero-copy decision
  (``stream._zero_copy``: ``read_only = compute is not None and not isinstance(compute,
  Kernel) and ...``; a Chain is not a Kernel): a chain whose kernels only read a read-only
  array (a read-only memmap, a ``writeable=False`` array) is refused with ``zero_copy=True``
  as "zero_copy=True with a callable and a read-only input array", though it has no
  callable and the same kernel alone runs zero-copy; without ``zero_copy=`` it is staged
  (copied) where the same chain over a writable array, or the kernel alone, runs in place.
- **A callable writing a file output given no dtype** (``"y.npy"``, ``cv.npy_out(path)``)
  gets input 0's dtype for the file; a callable that returns another type is refused "return
  that [float64 array]" with no word of the file's dtype, which is what the user would change
  (``cv.npy_out(path, dtype=...)``) (step.py, ``_returned``'s message).

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    assert_clean,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    kernel,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

F32 = np.float32
PADS = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}


def small(shape, seed):
    """Small whole numbers as float32: every sum below is exact, in any order."""
    return np.random.default_rng(seed).integers(-9, 10, shape).astype(F32)


def window(x, halo, boundary):
    """What streamkit's ``sten`` kernel computes (args ``(cols, halo)``), boundary as np.pad."""
    if halo == 0 or x.shape[0] == 0:
        return x.copy()
    widths = [(halo, halo)] + [(0, 0)] * (x.ndim - 1)
    if isinstance(boundary, str):
        p = np.pad(x, widths, mode=PADS[boundary])
    else:
        p = np.pad(x, widths, mode="constant", constant_values=F32(boundary))
    out = p[: x.shape[0]].copy()
    for k in range(1, 2 * halo + 1):
        out = out + p[k : k + x.shape[0]]
    return out


def sten_scale(device, cols, halo, k=3.0):
    """A chain: ``sten`` over input 0 (with its halo) into a temp, then ``scale`` by k."""
    return cv.chain(
        cv.link(kernel(device, "sten"), reads="in0", writes="t", args=(cols, halo)),
        cv.link(kernel(device, "scale"), reads="t", writes="out0", args=(k,)),
        temps={"t": F32})


def files_of(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# -- found ------------------------------------------------------------------------------------
def test_a_chain_of_kernels_over_a_read_only_array_runs_zero_copy(device):
    """``zero_copy=True`` with a chain of kernels that only read a read-only input is taken
    as the kernel alone takes it; without ``zero_copy=`` the chain runs in place as it does
    over a writable copy of the same array."""
    if not device.host_unified:
        pytest.skip("zero-copy needs a device in host memory")
    x = small((500,), 1)
    x.flags.writeable = False
    chain = cv.chain(cv.link(kernel(device, "scale"), reads="in0", writes="out0", args=(2.0,)))
    y = np.zeros_like(x)
    cv.stream(kernel(device, "scale"), [x], [y], device=device, args=(2.0,), zero_copy=True)
    np.testing.assert_array_equal(y, x * 2)  # the kernel alone: right
    y[:] = 0
    writable = cv.stream(chain, [x.copy()], [y], device=device, block_bytes=400)
    assert "stage-in" not in writable.busy_seconds  # in place over a writable array
    y[:] = 0
    cv.stream(chain, [x], [y], device=device, block_bytes=400, zero_copy=True)
    np.testing.assert_array_equal(y, x * 2)
    y[:] = 0
    report = cv.stream(chain, [x], [y], device=device, block_bytes=400)
    np.testing.assert_array_equal(y, x * 2)
    assert "stage-in" not in report.busy_seconds, report.busy_seconds
    assert_clean(device)


def test_a_callable_returning_another_type_for_a_file_output_is_told_the_files_dtype(
        device, tmp_path):
    """The file output took input 0's dtype (float64) because none was given; the callable
    returns int32: the message names the file's dtype as the thing to set."""
    if device.backend != "opencl":
        pytest.skip("the callable does PyOpenCL array arithmetic")
    x = np.arange(10, dtype=np.float64)

    def halve(a, y, *, queue, offset, n):
        return (a * 2).astype(np.int32)

    target = tmp_path / "y.npy"
    with pytest.raises(InputError) as caught:
        cv.stream(halve, [x], [str(target)], device=device)
    assert "dtype=" in str(caught.value) and "npy_out" in str(caught.value), caught.value
    assert not target.exists()


# -- guards -----------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["dynamic", "static"])
def test_guard_a_halo_chain_over_two_devices_from_a_file_into_that_file(pair, tmp_path,
                                                                         schedule):
    """guard: a chain with a halo over two devices, reading ``cv.npy`` and writing its own
    file (written to a temporary file, renamed at the end), with a first_row: NumPy's answer,
    a file beside it untouched, nothing left over."""
    x = small((157, 3), 2)
    path = tmp_path / "x.npy"
    np.save(path, x)
    beside = tmp_path / "beside.npy"
    np.save(beside, np.arange(4))
    kept = beside.read_bytes()
    report = cv.stream(sten_scale(pair[0], 3, 2), [cv.npy(path)], [str(path)], device=pair,
                       halo=2, boundary="reflect", block_bytes=3 * 4 * 9, depth=2,
                       first_row=10**6, schedule=schedule)
    np.testing.assert_array_equal(np.load(path), window(x, 2, "reflect") * F32(3))
    assert beside.read_bytes() == kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["beside.npy", "x.npy"]
    assert sum(r.blocks for r in report.devices) == report.blocks
    for dev in pair:
        assert_clean(dev)


def test_guard_uneven_iterate_chunks_into_a_halo_chain_and_a_raw_file(device, tmp_path):
    """guard: ``cv.iterate`` chunks of 0, 1 and many rows, from one buffer filled again,
    through a halo chain with a constant boundary into ``cv.raw_out``."""
    x = small((90, 2), 3)
    sizes = [0, 1, 0, 7, 1, 0, 0, 22, 1, 1, 40, 0, 17]
    assert sum(sizes) == len(x)

    def chunks():
        buf = np.empty((max(sizes), 2), F32)
        at = 0
        for s in sizes:
            buf[:s] = x[at : at + s]
            at += s
            yield buf[:s]

    out = tmp_path / "y.bin"
    cv.stream(sten_scale(device, 2, 3), [cv.iterate(chunks(), length=len(x))],
              [cv.raw_out(out, F32)], device=device, halo=3, boundary=-2.0,
              block_bytes=2 * 4 * 5, depth=3)
    got = np.fromfile(out, F32).reshape(x.shape)
    np.testing.assert_array_equal(got, window(x, 3, -2.0) * F32(3))
    assert_clean(device)


@pytest.mark.parametrize("op", ["sum", "max"])
def test_guard_a_halo_reduction_over_two_devices_from_a_memmap(pair, tmp_path, op):
    """guard: a kernel reduction with a halo over two devices, its input a read-only memmap,
    folds to NumPy's value (a halo longer than a block on the periodic boundary)."""
    x = small((301,), 4)
    np.save(tmp_path / "x.npy", x)
    m = np.load(tmp_path / "x.npy", mmap_mode="r")
    report = cv.stream(kernel(pair[0], "sten"), [m], device=pair, args=(1, 3), halo=3,
                       boundary="periodic", reduce=op, block_bytes=4 * 8)
    want = window(x, 3, "periodic").astype(np.float64)
    assert float(report.result) == float(want.sum() if op == "sum" else want.max())
    del m
    for dev in pair:
        assert_clean(dev)


def test_guard_a_small_seeded_sweep_of_sources_sinks_chains_and_devices(device, pair,
                                                                         tmp_path):
    """guard: a dozen seeded streams mixing every source (array, read-only, memmap, .npy
    path, cv.npy, cv.raw with a header, cv.iterate), sink (array, dtype, memmap, .npy path,
    npy_out, raw_out, an existing file), one or two devices, halo, boundary and block size,
    each equal to NumPy, no input file changed, no part file left."""
    rng = np.random.default_rng(20)
    for case in range(12):
        folder = tmp_path / f"c{case}"
        folder.mkdir()
        rows, cols = int(rng.integers(0, 60)), int(rng.integers(1, 4))
        halo = int(rng.integers(0, 4))
        boundary = [str(b) for b in ("nearest", "reflect", "periodic")][case % 3] \
            if case % 4 else float(rng.integers(-3, 4))
        x = small((rows, cols), 100 + case)
        src = ["array", "ro", "memmap", "npy", "cv_npy", "raw", "iterate"][case % 7]
        two = src != "iterate" and case % 2 == 1
        if src == "iterate" and boundary == "periodic":
            boundary = "nearest"
        path = folder / "x.npy"
        np.save(path, x)
        if src == "array":
            inp = x.copy()
        elif src == "ro":
            inp = x.copy()
            inp.flags.writeable = False
        elif src == "memmap":
            inp = np.load(path, mmap_mode="r")
        elif src == "npy":
            inp = str(path)
        elif src == "cv_npy":
            inp = cv.npy(path)
        elif src == "raw":
            inp = cv.raw(path, F32, shape=(-1, cols), offset=path.stat().st_size - x.nbytes)
        else:
            cuts = np.sort(rng.integers(0, rows + 1, 4))
            inp = cv.iterate((x[a:b] for a, b in zip([0, *cuts], [*cuts, rows], strict=True)),
                             length=rows)
        sink = ["array", "dtype", "memmap", "npy", "npy_out", "raw_out", "exists"][case % 7]
        target = folder / ("y.bin" if sink == "raw_out" else "y.npy")
        if sink == "array":
            out = np.full((rows, cols), 7, F32)
        elif sink == "dtype":
            out = F32
        elif sink == "memmap" and rows:
            out = np.lib.format.open_memmap(target, mode="w+", dtype=F32, shape=(rows, cols))
        elif sink == "raw_out":
            out = cv.raw_out(target, F32)
        elif sink == "npy_out":
            out = cv.npy_out(target)
        else:
            if sink == "exists":
                np.save(target, np.arange(3, dtype=np.int8))
            out = str(target)
        before = path.read_bytes()
        chain = case % 3 != 0
        compute = sten_scale(pair[0] if two else device, cols, halo) if chain \
            else kernel(device, "sten")
        report = cv.stream(compute, [inp], [out], device=pair if two else device, halo=halo,
                           boundary=boundary, args=() if chain else (cols, halo),
                           block_bytes=int(rng.integers(max(halo, 1), 20)) * cols * 4,
                           depth=int(rng.integers(1, 4)), first_row=int(rng.integers(0, 99)))
        want = window(x, halo, boundary) * (F32(3) if chain else F32(1))
        if isinstance(out, np.ndarray):
            got = out
        elif sink == "dtype":
            got = report.outputs[0]
        elif sink == "raw_out":
            got = np.fromfile(target, F32).reshape(want.shape)
        else:
            got = np.load(target)
        np.testing.assert_array_equal(got, want, err_msg=f"case {case}: {src} -> {sink}")
        assert path.read_bytes() == before, case
        assert not [p for p in folder.iterdir() if p.name.startswith(".")], case
        del inp, out, report
    for dev in {*pair, device}:
        assert_clean(dev)
