"""Round fifteen, shapes, views and aliasing: N-D inputs, non-contiguous and 0-stride views,
outputs that alias inputs, halos at tiny lengths, blocks that do not divide the rows, shaped
outputs, memory maps that are views, structured records with padding. Every result is
compared with NumPy's.

Found (strict xfails, each asserting the right behaviour):

- Two memory maps of one *unlinked* file (``tempfile.TemporaryFile()``, a file removed
  after it was mapped, ``os.memfd_create``) that overlap are not seen as overlapping: the
  overlap check stats the path in ``/proc/self/maps``, which fails for ``" (deleted)"``
  and ``memfd:`` names, and then compares memory only. An input shifted 500 rows from its
  output came back with half its rows wrong, with no error.
- A structured input for a kernel's struct pointer is checked for its layout only: a
  ``float32`` field where the struct has an ``int`` member (same offset, same size) is read
  as the int's bits, and fields named as the struct's members but in another order are read
  as the member at their position. Both silently wrong.
- A multi-field view of records (``r[['a', 'c']]``) that hides a struct member passes the
  layout check (fewer fields than members: only the size is compared): staged, the kernel
  reads the hidden member from stale pinned bytes; zero-copy, it reads and writes the
  caller's hidden field. Path-dependent garbage, no error.
- A packed structured dtype given as an output (a dtype, ``cv.per_block``, ``cv.rows``,
  ``cv.npy_out(dtype=)``) is told to ``pass a.astype(...)``: there is no array to convert.
"""

from __future__ import annotations

import mmap
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    add_reference,
    assert_clean,
    data,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    kernel,
    stencil_reference,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

#: np.pad's mode for each boundary= name.
PAD = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}


def padded(x: np.ndarray, h: int, boundary: str | float) -> np.ndarray:
    """``x`` with ``h`` rows before and after under ``boundary`` (np.pad's rows)."""
    width = [(h, h)] + [(0, 0)] * (x.ndim - 1)
    if isinstance(boundary, str):
        return np.pad(x, width, mode=PAD[boundary])
    return np.pad(x, width, mode="constant", constant_values=boundary)


def weighted_reference(x: np.ndarray, h: int, boundary: str | float) -> np.ndarray:
    """What WEIGHTED computes: y[r] = sum over k of x[r + k - h] * (k + 1), rows past the
    ends under ``boundary``."""
    p = padded(np.ascontiguousarray(x), h, boundary)
    rows = len(x)
    return sum(p[k : k + rows] * np.float32(k + 1) for k in range(2 * h + 1))


WEIGHTED = """
__kernel void weighted(__global const float *x, __global float *y, ulong cols, ulong h,
                       ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) {
        float s = 0.0f;
        for (ulong k = 0; k <= 2 * h; k++) s += x[i + k * cols] * (float)(k + 1);
        y[i] = s;
    }
}
"""

SWAP = """
__kernel void swap(__global const float *a, __global const float *b, __global float *p,
                   __global float *q, ulong cols, ulong h, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) {
        float sa = 0.0f, sb = 0.0f;
        for (ulong k = 0; k <= 2 * h; k++) {
            sa += a[i + k * cols];
            sb += b[i + k * cols] * (float)(k + 1);
        }
        p[i] = sa - sb;
        q[i] = sa * 0.5f + sb;
    }
}
"""

DECIMATE = """
__kernel void decimate(__global const float *x, __global float *y, __global float *z,
                       ulong q, ulong h, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n / q) y[i] = x[h + i * q - h] * 1000.0f + x[h + i * q + h];
    if (i < n) z[i] = x[i + h];
}
"""

_built: dict[tuple[int, str, str], cv.Kernel] = {}


def build(device: cv.Device, source: str, name: str) -> cv.Kernel:
    """``device.compile(cv.portable(source), name)``, once per device."""
    key = (id(device), source, name)
    if key not in _built or _built[key].device is not device:
        _built[key] = device.compile(cv.portable(source), name)
    return _built[key]


def layout(x: np.ndarray, how: str, device: cv.Device) -> np.ndarray:
    """``x``'s values in another memory layout (the same values, compared as such)."""
    if how == "c":
        return x.copy()
    if how == "reversed":  # negative stride along axis 0
        return x[::-1].copy()[::-1]
    if how == "fortran":
        return np.asfortranarray(x)
    if how == "every-other":  # a step along axis 0, the rows between poisoned
        big = np.repeat(x, 2, axis=0)
        big[1::2] = 99
        return big[::2]
    if how == "inner-reversed":  # negative strides below axis 0
        return np.ascontiguousarray(x[..., ::-1])[..., ::-1] if x.ndim > 1 else x.copy()
    if how == "pinned":
        p = cv.pinned.empty(x.shape, x.dtype, device=device)
        p[...] = x
        return p
    if how == "pinned-view":  # a pinned array's rows from row 3 on
        p = cv.pinned.empty((x.shape[0] + 3, *x.shape[1:]), x.dtype, device=device)
        p[:3] = 77
        p[3:] = x
        return p[3:]
    raise AssertionError(how)


LAYOUTS = ["c", "reversed", "fortran", "every-other", "inner-reversed", "pinned",
           "pinned-view"]


# -- maps over N-D, non-contiguous and pinned views --------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int64])
@pytest.mark.parametrize("shape", [(1,), (13,), (13, 3), (13, 2, 3), (5, 1)])
def test_maps_over_every_layout_pair_equal_numpy(device, dtype, shape):
    """guard: two inputs in every pair of layouts (negative strides on axis 0 and below,
    Fortran order, a step, pinned and a pinned view), blocks of 1, 2 and 5 rows (none
    dividing 13), copying and auto: c = a + b + index % 7 exactly."""
    a0, b0 = data(shape, dtype, 1), data(shape, dtype, 2)
    expected = add_reference(a0, b0)
    row = int(np.prod(shape[1:])) * np.dtype(dtype).itemsize
    for index, first in enumerate(LAYOUTS):
        second = LAYOUTS[(index * 3 + 1) % len(LAYOUTS)]  # every layout on both sides
        for rows, zero_copy in ((1, None), (2, False), (5, None)):
            a, b = layout(a0, first, device), layout(b0, second, device)
            c = np.zeros(shape, dtype)
            cv.stream(kernel(device, "add", dtype), [a, b], [c], device=device,
                      block_bytes=rows * row, zero_copy=zero_copy)
            np.testing.assert_array_equal(c, expected, err_msg=f"{first}/{second}/{rows}")
            del a, b
    assert_clean(device)


@pytest.mark.parametrize("offset", [1, 2, 3, 60])
@pytest.mark.parametrize("zero_copy", [None, True, False])
def test_misaligned_arrays_in_and_out(device, offset, zero_copy):
    """guard: float32 arrays starting 1, 2, 3 or 60 bytes into a buffer (np.frombuffer
    with an offset), inputs and output, used in place (zero-copy) or copied."""
    n = 10_007
    buf = bytearray(3 * (n * 4 + 64))

    def view(j: int) -> np.ndarray:
        return np.frombuffer(buf, np.float32, n, offset=j * (n * 4 + 64) + offset)

    a, b, c = view(0), view(1), view(2)
    a[:] = data((n,), np.float32, 3)
    b[:] = data((n,), np.float32, 4)
    if zero_copy and not device.host_unified:
        pytest.skip("zero_copy=True needs a device in host memory")
    cv.stream(kernel(device, "add"), [a, b], [c], device=device, zero_copy=zero_copy,
              block_bytes=4 * 1000)
    np.testing.assert_array_equal(c, add_reference(a.copy(), b.copy()))
    assert_clean(device)


def test_a_broadcast_input_streams_its_one_row(device):
    """guard: a 0-stride view (np.broadcast_to, read-only) as an input, 1-D and rows of 3,
    with and without a halo."""
    a = data((1001,), np.float32, 5)
    c = np.zeros_like(a)
    two = np.broadcast_to(np.float32(2.0), a.shape)
    cv.stream(kernel(device, "add"), [a, two], [c], device=device, block_bytes=4 * 97)
    np.testing.assert_array_equal(c, add_reference(a, np.full_like(a, 2.0)))
    row = np.array([1.0, -2.0, 0.5], np.float32)
    x = np.broadcast_to(row, (200, 3))
    y = np.zeros((200, 3), np.float32)
    cv.stream(kernel(device, "sten"), [x], [y], device=device, args=(3, 2), halo=2,
              block_bytes=3 * 4 * 7)
    np.testing.assert_array_equal(y, stencil_reference(np.ascontiguousarray(x), 2))
    assert_clean(device)


@pytest.mark.parametrize("output", ["broadcast", "as_strided-writeable"])
def test_a_zero_stride_output_is_refused(device, output):
    """guard: np.broadcast_to (read-only) and a writeable 0-stride as_strided view as an
    output: every row would be the same memory."""
    a = data((100,), np.float32, 6)
    if output == "broadcast":
        out = np.broadcast_to(np.zeros(1, np.float32), (100,))
    else:
        out = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (100,), (0,),
                                              writeable=True)
    with pytest.raises(InputError, match="read-only|not C-contiguous"):
        cv.stream(kernel(device, "scale"), [a], [out], device=device, args=(2.0,))
    assert_clean(device)


def test_a_zero_stride_view_of_the_output_as_input_is_refused(device):
    """guard: inputs=[np.broadcast_to(a[:1], a.shape)], outputs=[a]: every input row is
    a[0], which block 0 overwrites; refused, not read after it was written."""
    a = data((1000,), np.float32, 7)
    with pytest.raises(InputError, match="overlap"):
        cv.stream(kernel(device, "scale"), [np.broadcast_to(a[:1], a.shape)], [a],
                  device=device, args=(2.0,), block_bytes=4 * 50)
    assert_clean(device)


# -- stencils at the ends, tiny lengths, blocks that do not divide ------------------------------
@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", 1.5])
@pytest.mark.parametrize("how", ["c", "reversed", "fortran", "every-other"])
def test_stencils_at_tiny_lengths_equal_np_pad(device, boundary, how):
    """guard: a weighted stencil (each halo row its own weight, so a mirrored or shifted pad
    row shows) over 1, 2, 3, 5 and 13 rows of 1 and 3 columns, halos 1 to 5 (longer than
    the array too), blocks of 1, 2, 3 and 100 rows, against np.pad's rows."""
    k = build(device, WEIGHTED, "weighted")
    for n in (1, 2, 5, 13):
        for cols in (1, 3):
            x0 = data((n, cols) if cols > 1 else (n,), np.float32, n * 10 + cols)
            for h in (1, 2, 5):
                for rows in (1, 3, 100):
                    if h > rows and n > rows:
                        continue  # a halo longer than a block of several: refused
                    x = layout(x0, how, device)
                    y = np.full(x0.shape, -7, np.float32)
                    cv.stream(k, [x], [y], device=device, args=(cols, h), halo=h,
                              boundary=boundary, block_bytes=rows * cols * 4)
                    np.testing.assert_allclose(
                        y, weighted_reference(x0, h, boundary), rtol=1e-5, atol=1e-5,
                        err_msg=f"n={n} cols={cols} h={h} rows={rows}")
    assert_clean(device)


@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", 0.0])
@pytest.mark.parametrize("shape", [(0,), (0, 3)])
def test_no_rows_with_a_halo_run_nothing(device, boundary, shape):
    """guard: zero rows with halo=2 under each boundary (periodic wraps modulo the length),
    pageable and pinned in place: an empty output, nothing allocated."""
    x = np.zeros(shape, np.float32)
    report = cv.stream(kernel(device, "sten"), [x], [np.float32], device=device, args=(3, 2),
                       halo=2, boundary=boundary)
    assert report.outputs[0].shape == shape and report.blocks == 0
    p = cv.pinned.empty(shape, np.float32, device=device)
    cv.stream(kernel(device, "sten"), [p], [p], device=device, args=(3, 2), halo=2,
              boundary=boundary)
    del p
    assert_clean(device)


@pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "pinned"])
@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", -2.0])
def test_two_arrays_swapped_in_place_with_a_halo(device, pinned, boundary):
    """guard: inputs=[a, b], outputs=[b, a] (each input is the other's output) with halos
    0 to 4, rows of 1 and 3, blocks of 1 to 7 rows: NumPy's answer, every input read as it
    was before any output row was written."""
    k = build(device, SWAP, "swap")
    for n in (2, 17):
        for cols in (1, 3):
            shape = (n, cols) if cols > 1 else (n,)
            a0, b0 = data(shape, np.float32, 1), data(shape, np.float32, 2)
            for h, rows in ((0, 1), (1, 2), (2, 3), (4, 7)):
                if pinned:
                    a = cv.pinned.empty(shape, np.float32, device=device)
                    b = cv.pinned.empty(shape, np.float32, device=device)
                    a[...], b[...] = a0, b0
                else:
                    a, b = a0.copy(), b0.copy()
                cv.stream(k, [a, b], [b, a], device=device, args=(cols, h), halo=h,
                          boundary=boundary, block_bytes=rows * cols * 4)
                pa, pb = padded(a0, h, boundary), padded(b0, h, boundary)
                sa = sum(pa[j : j + n] for j in range(2 * h + 1))
                sb = sum(pb[j : j + n] * np.float32(j + 1) for j in range(2 * h + 1))
                np.testing.assert_allclose(b, sa - sb, rtol=1e-5, atol=1e-4)
                np.testing.assert_allclose(a, sa * np.float32(0.5) + sb, rtol=1e-5, atol=1e-4)
                del a, b
    assert_clean(device)


def test_disjoint_halves_of_one_array_with_a_halo(device):
    """guard: inputs=[base[:50]], outputs=[base[50:]] and the other way round: a halo row
    past the input's end is a pad row, never the neighbouring half's first row."""
    for forward in (True, False):
        base = data((100, 3), np.float32, 5)
        before = base.copy()
        src, dst = (slice(0, 50), slice(50, 100)) if forward else (slice(50, 100),
                                                                    slice(0, 50))
        cv.stream(kernel(device, "sten"), [base[src]], [base[dst]], device=device,
                  args=(3, 1), halo=1, block_bytes=3 * 4 * 7)
        np.testing.assert_array_equal(base[dst], stencil_reference(before[src], 1))
        np.testing.assert_array_equal(base[src], before[src])
    assert_clean(device)


def test_pinned_views_in_and_out_with_a_halo(device):
    """guard: a pinned array's rows from row 3 on as the input and another's from row 4 on
    as the output (both direct), halo 2, blocks of 7 rows of 3: exact, and the rows before
    the output view untouched."""
    x0 = data((101, 3), np.float32, 4)
    source = cv.pinned.empty((104, 3), np.float32, device=device)
    target = cv.pinned.empty((105, 3), np.float32, device=device)
    source[:3], source[3:], target[:] = 55, x0, -1
    cv.stream(kernel(device, "sten"), [source[3:]], [target[4:]], device=device, args=(3, 2),
              halo=2, block_bytes=3 * 4 * 7)
    np.testing.assert_array_equal(target[4:], stencil_reference(x0, 2))
    assert (target[:4] == -1).all()
    del source, target
    assert_clean(device)


# -- shaped outputs --------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["c", "every-other"])
def test_a_ratio_output_beside_a_full_one_with_a_halo(device, how):
    """guard: cv.rows(ratio=(1, q)) beside a full-length output, halos 0 to 3 (the samples
    at each block's first row reach into the halo rows), blocks of 1 and 13 rows asked (cut
    at multiples of q), lengths 12 and 100."""
    k = build(device, DECIMATE, "decimate")
    for n in (12, 100):
        base = np.arange(1, n + 1, dtype=np.float32)
        x = layout(base, how, device)
        for q in (1, 2, 4):
            for h in (0, 1, 3):
                for rows in (1, 13):
                    if h > max(rows, q) and n > max(rows, q):
                        continue
                    try:
                        report = cv.stream(k, [x], [cv.rows(np.float32, ratio=(1, q)),
                                                    np.float32], device=device, halo=h,
                                           args=(q, h), block_bytes=rows * 4)
                    except InputError as exc:
                        assert "halo" in str(exc)  # a halo longer than a block
                        continue
                    p = np.pad(base, h, mode="edge")
                    at = np.arange(0, n, q)
                    np.testing.assert_array_equal(report.outputs[0], p[at] * 1000 + p[at + 2 * h])
                    np.testing.assert_array_equal(report.outputs[1], base)
    assert_clean(device)


def test_per_block_records_over_a_reversed_input(device):
    """guard: cv.per_block over a negative-stride input, 1000 rows in blocks of 70 (the last
    one short): each record is its block's sum and offset."""
    source = """
    __kernel void bsum(__global const float *x, __global float *r, ulong offset, ulong n) {
        if (get_global_id(0) == 0) {
            float s = 0.0f;
            for (ulong i = 0; i < n; i++) s += x[i];
            r[0] = s; r[1] = (float)offset;
        }
    }"""
    x = np.arange(1000, dtype=np.float32)[::-1]
    report = cv.stream(build(device, source, "bsum"), [x], [cv.per_block(2, np.float32)],
                       device=device, block_bytes=4 * 70)
    ranges = report.block_ranges
    assert ranges[-1, 1] == 1000 and report.outputs[0].shape == (len(ranges), 2)
    np.testing.assert_array_equal(report.outputs[0][:, 0],
                                  [x[lo:hi].sum() for lo, hi in ranges])
    np.testing.assert_array_equal(report.outputs[0][:, 1], ranges[:, 0])
    assert_clean(device)


def test_a_callable_gets_3d_blocks_of_a_reversed_input_with_its_halo(device):
    """guard: a callable over a reversed (rows, 2, 3) input with halo 1 gets (block + 2, 2,
    3) arrays and returns the block's rows; offsets count elements."""
    if device.backend != "opencl":
        pytest.skip("the callable slices PyOpenCL arrays")
    x = np.arange(7 * 2 * 3, dtype=np.float32).reshape(7, 2, 3)[::-1]
    seen = []

    def twice(x, y, *, queue, offset, n):
        seen.append((x.shape, y.shape, offset, n))
        return x[1:-1] * 2

    report = cv.stream(twice, [x], [np.float32], device=device, halo=1,
                       block_bytes=2 * 3 * 4 * 2, warmup=False)
    np.testing.assert_array_equal(report.outputs[0], x * 2)
    assert seen[0] == ((4, 2, 3), (2, 2, 3), 0, 12)
    assert all(x_shape == (y_shape[0] + 2, 2, 3) for x_shape, y_shape, _, _ in seen)
    assert_clean(device)


# -- memory maps and other mappings of one file ------------------------------------------------
def test_two_mappings_of_shared_memory_one_row_apart_are_refused(device):
    """guard: two SharedMemory handles of one /dev/shm segment (two addresses, one file),
    the input one row before the output: refused as overlapping."""
    from multiprocessing import shared_memory

    x0 = data((1001,), np.float32, 8)
    first = shared_memory.SharedMemory(create=True, size=x0.nbytes)
    try:
        second = shared_memory.SharedMemory(name=first.name)
        try:
            a = np.ndarray(x0.shape, np.float32, buffer=first.buf)
            b = np.ndarray(x0.shape, np.float32, buffer=second.buf)
            a[:] = x0
            with pytest.raises(InputError, match="overlap"):
                cv.stream(kernel(device, "scale"), [a[:-1]], [b[1:]], device=device,
                          args=(2.0,), block_bytes=4 * 50)
            del a, b
        finally:
            second.close()
    finally:
        first.close()
        first.unlink()
    assert_clean(device)


def test_offset_memmaps_of_one_file_apart_and_the_same(device, tmp_path):
    """guard: np.memmap(offset=) windows of one file: two disjoint windows run (no false
    overlap), the same window opened twice runs in place with a halo, exactly."""
    n = 600
    x0 = data((2 * n + 3,), np.float32, 9)
    path = tmp_path / "data.bin"
    x0.tofile(path)
    first = np.memmap(path, np.float32, "r+", offset=4 * 3, shape=(n,))
    second = np.memmap(path, np.float32, "r+", offset=4 * (n + 3), shape=(n,))
    cv.stream(kernel(device, "sten"), [first], [second], device=device, args=(1, 1), halo=1,
              block_bytes=4 * 50)
    np.testing.assert_array_equal(np.asarray(second), stencil_reference(x0[3 : n + 3], 1))
    again = np.memmap(path, np.float32, "r+", offset=4 * 3, shape=(n,))
    cv.stream(kernel(device, "sten"), [first], [again], device=device, args=(1, 2), halo=2,
              block_bytes=4 * 50)
    np.testing.assert_array_equal(np.asarray(again), stencil_reference(x0[3 : n + 3], 2))
    del first, second, again
    assert_clean(device)


def _unlinked_maps(kind: str, values: np.ndarray, folder: Path):
    """Two separate writable mappings of one file that has no name any more, each as a
    float32 array of ``values``' length; and what to close."""
    if kind == "TemporaryFile":
        f = tempfile.TemporaryFile(dir=folder)  # unlinked at once
        f.write(values.tobytes())
        f.flush()
        maps = [np.memmap(f, np.float32, "r+", shape=values.shape) for _ in range(2)]
        return maps, [f]
    if kind == "removed":
        path = folder / "gone.bin"
        values.tofile(path)
        maps = [np.memmap(path, np.float32, "r+", shape=values.shape) for _ in range(2)]
        path.unlink()
        return maps, []
    fd = os.memfd_create("conveyor-r15")
    os.write(fd, values.tobytes())
    views = [mmap.mmap(fd, values.nbytes) for _ in range(2)]
    os.close(fd)  # the mappings keep the memory
    return [np.frombuffer(v, np.float32) for v in views], []


@pytest.mark.parametrize("kind", ["TemporaryFile", "removed", "memfd"])
def test_overlapping_maps_of_an_unlinked_file_are_refused_or_exact(device, kind, tmp_path):
    """inputs=[m1[:n]], outputs=[m2[500:]], two mappings of one unlinked file: block k
    writes the rows block k + 10 reads. Refused as overlapping (as for a named file), or
    NumPy's answer; today 500 of 1000 rows come back wrong with no error."""
    if kind == "memfd" and not hasattr(os, "memfd_create"):
        pytest.skip("no memfd_create here")
    n, shift = 1000, 500
    x0 = np.arange(n + shift, dtype=np.float32)
    (m1, m2), keep = _unlinked_maps(kind, x0, tmp_path)
    try:
        try:
            cv.stream(kernel(device, "scale"), [m1[:n]], [m2[shift:]], device=device,
                      args=(2.0,), block_bytes=4 * 50)
        except InputError as exc:
            assert "overlap" in str(exc)
        else:
            np.testing.assert_array_equal(np.asarray(m2[shift:]), x0[:n] * 2)
    finally:
        del m1, m2
        for item in keep:
            item.close()
    assert_clean(device)


def test_two_outputs_in_maps_of_an_unlinked_file_are_refused(device, tmp_path):
    """outputs=[m1[:n], m2[1:n + 1]] over one TemporaryFile: which one's rows stay depends
    on the order of the copies; refused for a named file, not for an unlinked one."""
    n = 1000
    (m1, m2), keep = _unlinked_maps("TemporaryFile", np.zeros(n + 1, np.float32), tmp_path)
    source = """
    __kernel void two(__global const float *x, __global float *y, __global float *z,
                      ulong offset, ulong n) {
        ulong i = get_global_id(0);
        if (i < n) { y[i] = 2.0f * x[i]; z[i] = 3.0f * x[i]; }
    }"""
    try:
        with pytest.raises(InputError, match="share memory"):
            cv.stream(build(device, source, "two"), [np.ones(n, np.float32)],
                      [m1[:n], m2[1 : n + 1]], device=device, block_bytes=4 * 50)
    finally:
        del m1, m2
        for item in keep:
            item.close()
    assert_clean(device)


# -- structured records ------------------------------------------------------------------------
RECORDS = """
typedef struct { float a; int b; float c; } rec;
__kernel void rec_mix(__global const rec *r, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = r[i].a + (float)r[i].b * 10.0f + r[i].c * 100.0f;
}
"""
REC = np.dtype([("a", "f4"), ("b", "i4"), ("c", "f4")], align=True)


def _records(dtype: np.dtype, shape: tuple[int, ...] = (10,)) -> np.ndarray:
    r = np.zeros(shape, dtype)
    r["a"], r["b"], r["c"] = 1, 2, 3
    return r


@pytest.mark.parametrize("how", ["c", "reversed", "every-other", "2-D", "2-D fortran"])
def test_records_in_any_layout_read_as_the_struct(device, how):
    """guard: C-laid-out records, reversed, strided, rows of 2 records and Fortran order:
    each is read as the struct (1 + 2 * 10 + 3 * 100)."""
    r = _records(REC, (10, 2) if how.startswith("2-D") else (10,))
    x = {"c": r, "reversed": r[::-1], "every-other": np.repeat(r, 2)[::2], "2-D": r,
         "2-D fortran": np.asfortranarray(r)}[how]
    y = cv.stream(build(device, RECORDS, "rec_mix"), [x], [np.float32],
                  device=device).outputs[0]
    np.testing.assert_array_equal(y, np.full(x.shape, 321, np.float32))
    assert_clean(device)


def test_a_multi_field_view_wider_than_the_struct_is_refused(device):
    """guard: r[['a', 'b', 'c']] of a 4-field record keeps its 16-byte stride: refused
    against the 12-byte struct, not read at 12-byte steps."""
    four = _records(np.dtype([("a", "f4"), ("b", "i4"), ("c", "f4"), ("d", "f4")]))
    with pytest.raises(InputError, match="12 bytes"):
        cv.stream(build(device, RECORDS, "rec_mix"), [four[["a", "b", "c"]]], [np.float32],
                  device=device)
    assert_clean(device)


def test_a_record_field_of_another_type_than_its_member_is_refused(device):
    """Field 'b' is float32 where the struct has ``int b``: same offset, same size, so the
    layout check passes and the kernel reads 2.0f's bits as an int (1.07e10 for 321).
    It should be an InputError naming the field and both types, as a float32 array for an
    ``int*`` parameter is."""
    wrong = _records(np.dtype([("a", "f4"), ("b", "f4"), ("c", "f4")]))
    with pytest.raises(InputError, match="'b'"):
        cv.stream(build(device, RECORDS, "rec_mix"), [wrong], [np.float32], device=device)
    assert_clean(device)


def test_record_fields_named_as_members_in_another_order_are_refused(device):
    """Fields c, b, a at bytes 0, 4, 8 for ``struct { float a; int b; float c; }``: every
    offset and the size match by position, so the kernel's r.a reads field 'c' (123 where
    NumPy's r['a'] + ... is 321). A field named as a member but at another member's offset
    should be an InputError."""
    swapped = _records(np.dtype([("c", "f4"), ("b", "i4"), ("a", "f4")]))
    with pytest.raises(InputError, match="'a'|'c'"):
        cv.stream(build(device, RECORDS, "rec_mix"), [swapped], [np.float32], device=device)
    assert_clean(device)


MAKE_RECORDS = """
typedef struct { float a; int b; float c; } rec;
__kernel void rec_make(__global const float *x, __global rec *r, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { r[i].a = x[i]; r[i].b = 5; r[i].c = 2.0f * x[i]; }
}
"""


@pytest.mark.parametrize("zero_copy", [None, False], ids=["auto", "copying"])
@pytest.mark.parametrize("end", ["input", "output"])
def test_a_record_view_that_hides_a_struct_member_is_refused(device, end, zero_copy):
    """r[['a', 'c']] of rec records keeps their 12 bytes but not field 'b', which the
    struct's member 2 is: two fields for three members, so only the size is compared. As an
    input, the staged kernel read 'b' from whatever the pinned slot held (sums of 1e9 for
    321), the zero-copy one the hidden field; as an output, zero-copy wrote the hidden 'b'
    and the staged copy did not. An InputError naming the member is the one answer."""
    r = _records(REC, (1000,))
    r["b"] = -1
    if end == "input":
        k, inputs, outputs = build(device, RECORDS, "rec_mix"), [r[["a", "c"]]], [np.float32]
    else:
        k = build(device, MAKE_RECORDS, "rec_make")
        inputs, outputs = [np.arange(1000, dtype=np.float32)], [r[["a", "c"]]]
    with pytest.raises(InputError, match="'b'"):
        cv.stream(k, inputs, outputs, device=device, zero_copy=zero_copy,
                  block_bytes=12 * 100)
    assert (r["b"] == -1).all()
    assert_clean(device)


PACKED_OUT = """
typedef struct { uchar tag; float sum; } summary;
__kernel void summarize(__global const float *x, __global summary *r, ulong offset, ulong n) {
    if (get_global_id(0) == 0) { r[0].tag = 7; r[0].sum = (float)n; }
}
"""


@pytest.mark.parametrize("kind", ["dtype", "per_block", "rows", "npy_out"])
def test_a_packed_record_output_is_told_the_aligned_dtype(device, kind, tmp_path):
    """NumPy's packed [('tag', 'u1'), ('sum', 'f4')] (5 bytes) for a kernel's 8-byte struct
    output is refused, rightly; but the advice is ``a.astype(np.dtype([...], align=True))``
    where no array exists (the stream makes it): it should say to pass that dtype."""
    packed = np.dtype([("tag", "u1"), ("sum", "f4")])
    out = {"dtype": packed, "per_block": cv.per_block(1, packed),
           "rows": cv.rows(packed, ratio=(1, 10)),
           "npy_out": cv.npy_out(tmp_path / "r.npy", dtype=packed)}[kind]
    with pytest.raises(InputError, match="align=True") as caught:
        cv.stream(build(device, PACKED_OUT, "summarize"), [np.zeros(100, np.float32)], [out],
                  device=device)
    assert "a.astype" not in str(caught.value), str(caught.value)
    assert not list(tmp_path.iterdir())
    assert_clean(device)
