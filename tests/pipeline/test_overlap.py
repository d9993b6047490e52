"""Inputs and outputs that overlap (pipeline/overlap.py, pipeline/halo.py): the same array as
input and output runs in place with NumPy's answer on every path, with and without a halo;
any other overlap is an InputError before any work."""

from __future__ import annotations

import contextlib
import mmap

import numpy as np
import pytest
from streamkit import data, in_use, kernel, stencil_reference

import conveyor as cv

ROWS, COLS = 999, 3  # odd: a short tail block
BLOCKS = {"2-row": 24, "5-row": 60, "32-row": 384}  # block_bytes: 3 floats a row


@contextlib.contextmanager
def held(device: cv.Device, x: np.ndarray, how: str):
    """``x`` as a pageable, pinned (cv.pinned.asarray) or registered array."""
    if how == "pageable":
        yield x
    elif how == "pinned":
        yield cv.pinned.asarray(x, device=device)
    else:
        with cv.pinned.register(x, device=device):
            yield x


def _stencil_in_place(device, x, halo, **kw) -> None:
    cv.stream(kernel(device, "sten"), [x], [x], device=device, args=(COLS, halo), halo=halo,
              **kw)


# -- the same array in and out -----------------------------------------------------------
@pytest.mark.parametrize("how", ["pageable", "pinned", "registered"])
@pytest.mark.parametrize("halo", [1, 2])
@pytest.mark.parametrize("depth", [1, 2, 4])
@pytest.mark.parametrize("block", list(BLOCKS), ids=list(BLOCKS))
def test_in_place_stencil_equals_numpy(device, how, halo, depth, block):
    # Before the fix a pinned array was wrong at every block boundary: block k's copy-out
    # rewrote the halo rows block k+1 had still to copy in.
    x0 = data((ROWS, COLS), np.float32, 1)
    with held(device, x0.copy(), how) as x:
        _stencil_in_place(device, x, halo, depth=depth, block_bytes=BLOCKS[block],
                          zero_copy=False)
        np.testing.assert_array_equal(x, stencil_reference(x0, halo))


@pytest.mark.inline_staging
@pytest.mark.parametrize("how", ["pageable", "pinned"])
def test_in_place_stencil_staged_inline(device, how):
    x0 = data((ROWS, COLS), np.float32, 2)
    with held(device, x0.copy(), how) as x:
        _stencil_in_place(device, x, 2, depth=3, block_bytes=BLOCKS["5-row"])
        np.testing.assert_array_equal(x, stencil_reference(x0, 2))


@pytest.mark.parametrize("how", ["pageable", "pinned", "registered"])
@pytest.mark.parametrize("zero_copy", [False, None, True], ids=["copying", "auto", "zero-copy"])
@pytest.mark.parametrize("depth", [1, 3])
def test_in_place_map_equals_numpy(device, how, zero_copy, depth):
    if zero_copy and not device.host_unified:
        pytest.skip("zero-copy needs a host-unified device")
    x0 = data((ROWS, COLS), np.float32, 3)
    with held(device, x0.copy(), how) as x:
        cv.stream(kernel(device, "scale"), [x], [x], device=device, args=(np.float32(3),),
                  depth=depth, block_bytes=BLOCKS["5-row"], zero_copy=zero_copy)
        np.testing.assert_array_equal(x, x0 * np.float32(3))


def test_in_place_with_a_second_input(device):
    # One input in place beside one apart; the saved rows are only the in-place input's.
    a0, b = data((ROWS,), np.float32, 4), data((ROWS,), np.float32, 5)
    a = cv.pinned.asarray(a0, device=device)
    cv.stream(kernel(device, "add"), [a, b], [a], device=device, block_bytes=64, depth=2)
    index = (np.arange(ROWS) % 7).astype(np.float32)
    np.testing.assert_array_equal(a, a0 + b + index)


def test_halo_of_one_block_in_place(device):
    x0 = data((40, COLS), np.float32, 6)
    x = cv.pinned.asarray(x0, device=device)
    _stencil_in_place(device, x, 3)
    np.testing.assert_array_equal(x, stencil_reference(x0, 3))


def test_saved_rows_go_back_to_the_pool(device):
    x = cv.pinned.asarray(data((ROWS, COLS), np.float32, 7), device=device)
    before = in_use(device)
    _stencil_in_place(device, x, 2, block_bytes=BLOCKS["5-row"])
    assert in_use(device) == before


# -- overlaps that are not the same rows ---------------------------------------------------
def _refused(device, inputs, outputs, **kw) -> None:
    before = in_use(device)
    with pytest.raises(cv.InputError, match=r"overlap in memory.*Pass a copy"):
        cv.stream(kernel(device, "scale"), inputs, outputs, device=device,
                  args=(np.float32(1),), **kw)
    assert in_use(device) == before


@pytest.mark.parametrize("how", ["pageable", "pinned"])
@pytest.mark.parametrize("zero_copy", [False, None, True], ids=["copying", "auto", "zero-copy"])
@pytest.mark.parametrize("shift", ["forward", "backward"])
def test_shifted_views_are_refused(device, how, zero_copy, shift):
    if zero_copy and not device.host_unified:
        pytest.skip("zero-copy needs a host-unified device")
    a = np.arange(ROWS + 1, dtype=np.float32)
    if how == "pinned":
        a = cv.pinned.asarray(a, device=device)
    src, dst = (a[:-1], a[1:]) if shift == "forward" else (a[1:], a[:-1])
    _refused(device, [src], [dst], zero_copy=zero_copy, block_bytes=64)


def test_strided_input_over_its_output_is_refused(device):
    a = np.arange(2 * ROWS, dtype=np.float32)
    _refused(device, [a[::2]], [a[ROWS:]])


def test_other_dtype_view_of_shifted_rows_is_refused(device):
    a = np.zeros((ROWS + 1, 2), np.float32)
    _refused(device, [a[1:].view(np.float32)], [a[:-1]])


SPLIT = cv.portable("""
__kernel void split(__global const float *x, __global float *y, __global float *z,
                    ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { y[i] = x[i]; z[i] = -x[i]; }
}""")


@pytest.mark.parametrize("views", ["one array twice", "shifted views", "memmaps of a file"])
def test_outputs_that_share_memory_are_refused(device, tmp_path, views):
    # Before: both ran, and which output's rows ended up in the shared memory changed from
    # block to block (98 of 100,000 elements from one, the rest from the other).
    out = np.zeros(ROWS + 1, np.float32)
    if views == "one array twice":
        first, second = out[:-1], out[:-1]
    elif views == "shifted views":
        first, second = out[:-1], out[1:]
    else:
        out.tofile(tmp_path / "y.raw")
        first = np.memmap(tmp_path / "y.raw", np.float32, "r+")[:-1]
        second = np.memmap(tmp_path / "y.raw", np.float32, "r+")[1:]
    before = in_use(device)
    with pytest.raises(cv.InputError, match=r"outputs 0 and 1 share memory.*separate array"):
        cv.stream(device.compile(SPLIT, "split"), [data((ROWS,), np.float32, 14)],
                  [first, second],
                  device=device, block_bytes=BLOCKS["5-row"])
    assert in_use(device) == before


def test_disjoint_views_of_one_array_run(device):
    a = np.arange(2 * ROWS, dtype=np.float32)
    x, y = a[:ROWS], a[ROWS:]
    expected = x * np.float32(2)
    cv.stream(kernel(device, "scale"), [x], [y], device=device, args=(np.float32(2),),
              block_bytes=64)
    np.testing.assert_array_equal(y, expected)


# -- memory maps and files -----------------------------------------------------------------
def _npy(tmp_path, x0):
    path = tmp_path / "x.npy"
    np.save(path, x0)
    return path


@pytest.mark.parametrize("halo", [0, 2])
def test_two_memmaps_of_one_file_run_in_place(device, tmp_path, halo):
    x0 = data((ROWS, COLS), np.float32, 8)
    path = _npy(tmp_path, x0)
    src, dst = np.load(path, mmap_mode="r"), np.load(path, mmap_mode="r+")
    _stencil_in_place_two(device, src, dst, halo)
    dst.flush()
    np.testing.assert_array_equal(np.load(path), stencil_reference(x0, halo))


def _stencil_in_place_two(device, src, dst, halo) -> None:
    cv.stream(kernel(device, "sten"), [src], [dst], device=device, args=(COLS, halo),
              halo=halo, block_bytes=BLOCKS["5-row"])


def test_memmaps_one_row_apart_are_refused(device, tmp_path):
    path = _npy(tmp_path, data((ROWS + 1,), np.float32, 9))
    src, dst = np.load(path, mmap_mode="r"), np.load(path, mmap_mode="r+")
    _refused(device, [src[:-1]], [dst[1:]])


def test_frombuffer_of_an_mmap_one_row_from_a_memmap_is_refused(device, tmp_path):
    # np.frombuffer(mmap.mmap) keeps a memoryview, not the mmap, as its base.
    path = tmp_path / "x.raw"
    data((ROWS + 1,), np.float32, 13).tofile(path)
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mapped:
        src = np.frombuffer(mapped, np.float32)
        dst = np.memmap(path, np.float32, "r+")
        try:
            _refused(device, [src[:-1]], [dst[1:]])
        finally:
            del src, dst


def test_npy_input_read_in_place_of_its_memmap(device, tmp_path):
    x0 = data((ROWS, COLS), np.float32, 10)
    path = _npy(tmp_path, x0)
    dst = np.load(path, mmap_mode="r+")
    _stencil_in_place_two(device, cv.npy(path), dst, 2)
    dst.flush()
    np.testing.assert_array_equal(np.load(path), stencil_reference(x0, 2))


def test_raw_input_over_a_shifted_memmap_is_refused(device, tmp_path):
    path = tmp_path / "x.raw"
    data((ROWS + 1,), np.float32, 11).tofile(path)
    dst = np.memmap(path, np.float32, "r+")
    _refused(device, [cv.raw(path, np.float32, offset=4)], [dst[:-1]])


def test_npy_output_onto_its_own_input_file(device, tmp_path):
    # A file output goes to a temporary file renamed at the end: it overlaps nothing.
    x0 = data((ROWS, COLS), np.float32, 12)
    path = _npy(tmp_path, x0)
    cv.stream(kernel(device, "sten"), [str(path)], [str(path)], device=device,
              args=(COLS, 2), halo=2, block_bytes=BLOCKS["5-row"])
    np.testing.assert_array_equal(np.load(path), stencil_reference(x0, 2))
