"""Round seventeen, the newer kinds of work combined: per-block and ratio outputs (a histogram
per block, up-sampling into rows of extra dimensions), lookup tables (``args=`` arrays and
``cv.resident``, strided, reversed, Fortran-ordered, of half, bool, record and uint64
elements, ``__constant``), halos (longer than the input, 2-D rows, every boundary), reductions
(kernels and callables, over complex, uint64, int8, bool and float16 data), ``cv.iterate``
sources, chains and image blocks, each beside another: two devices (``pair``), ``.npy`` and raw
files in and out, n = 0, 1, not a multiple of the block, blocks of one row. Every result is
compared with NumPy's.

Found (strict xfails, each asserting the right behaviour):

- A ``__constant`` table in a chain link's ``args=`` is not counted against the device's
  constant buffer: a table larger than the buffer streams (a GPU driver fails the launch
  mid-stream) where the same kernel alone is refused before any work, and a ``__constant``
  input read by that link gets blocks as large as if the table were not there.
  ``stream.constant_rows`` reads ``residents.constant``, which a chain's ``ChainResidents``
  does not have. Nor is a device array (``pyopencl.array.Array``) given for a ``__constant``
  parameter counted: ``resident.bind`` notes ``__constant`` handles only.
- A complex constant ``boundary=`` for a complex input (``np.pad``'s ``constant_values=1+2j``)
  is refused as not "a number", which it is.
- A complex64 input for a ``struct {float re, im;}`` pointer is told to "declare it as a
  pointer to a scalar type such as complex64*", a C type that does not exist.
- ``cv.iterate`` over an iterable with no chunks (``length=0``) is taken as float32: a stream of
  no rows through a ``uchar`` kernel is refused ("input 0 has dtype float32").
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    assert_clean,
    compiled,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402


def _opencl(*devices):
    for dev in devices:
        if dev.backend != "opencl":
            pytest.skip("OpenCL C kernels (atomics, __constant, images, half)")


# One source, one build per kernel name and device.
WORK = """
__kernel void hist(__global const uchar *x, __global uint *h, ulong offset, ulong n) {
    if (get_global_id(0) == 0) {
        for (int b = 0; b < 16; b++) h[b] = 0;
        for (ulong i = 0; i < n; i++) h[x[i] & 15]++;
    }
}
__kernel void up(__global const uchar *x, __global double *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) for (int r = 0; r < 3; r++) for (int c = 0; c < 2; c++)
        y[(i * 3 + r) * 2 + c] = x[i] * 10.0 + r * 2 + c + (double)(offset + i) * 1000.0;
}
__kernel void sten(__global const float *x, __global float *y, ulong cols, ulong halo,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) {
        float s = 0.0f;
        for (ulong k = 0; k <= 2 * halo; k++) s += x[i + k * cols] * (float)(k + 1);
        y[i] = s;
    }
}
__kernel void lut8(__global const uchar *x, __global float *y, __global const float *t,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = t[x[i]];
}
"""

# OpenCL C only: atomics, half, bool and struct tables, __constant, a struct of two floats.
TABLES = """
typedef struct { char a; ulong b; float c; } rec;
typedef struct { float re; float im; } cplx;
__kernel void whalo(__global const uchar *x, __global uint *h, ulong halo, ulong offset,
                    ulong n) {
    ulong i = get_global_id(0);
    if (i < n) atomic_add(&h[(x[i] + x[i + 2 * halo]) & 15], 1u);
}
__kernel void thalf(__global const uchar *x, __global float *y, __global const half *t,
                    ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = vload_half(x[i] & 7, t);
}
__kernel void tbool(__global const uchar *x, __global uchar *y, __global const bool *t,
                    ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = t[x[i] & 7] ? 7 : 3;
}
__kernel void trec(__global const uchar *x, __global ulong *y, __global const rec *t,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { rec r = t[x[i] & 7]; y[i] = (ulong)(long)r.a + r.b + (ulong)r.c; }
}
__kernel void tu64(__global const uchar *x, __global ulong *y, __constant ulong *t,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = t[x[i] & 7] ^ (offset + i);
}
__kernel void plus_table(__constant float *x, __global float *y, __constant float *t,
                         ulong offset, ulong n) {
    ulong i = get_global_id(0); if (i < n) y[i] = x[i] + t[i % 4];
}
__kernel void conj(__global const cplx *x, __global cplx *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { y[i].re = x[i].re; y[i].im = -x[i].im; }
}
"""

IMAGE = """
__kernel void isum(read_only image2d_t img, sampler_t s, __global float *y, uint halo,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    int w = get_image_width(img);
    float t = 0.0f;
    for (int d = 0; d <= 2 * (int)halo; d++)
        t += read_imagef(img, s, (int2)(i % w, i / w + d)).x * (float)(d + 1);
    y[i] = t;
}
__kernel void iblk(read_only image2d_t img, sampler_t s, __global float *rec, ulong offset,
                   ulong n) {
    if (get_global_id(0) != 0) return;
    int w = get_image_width(img);
    float t = 0.0f;
    for (ulong i = 0; i < n; i++) t += read_imagef(img, s, (int2)(i % w, i / w)).x;
    rec[0] = t; rec[1] = (float)offset; rec[2] = (float)n;
}
__kernel void ipool(read_only image2d_t img, sampler_t s, __global float *y, ulong offset,
                    ulong n) {
    ulong i = get_global_id(0);
    int w = get_image_width(img);
    if (i >= n / 2) return;
    ulong r = i / w, c = i % w;
    y[i] = read_imagef(img, s, (int2)(c, 2 * r + 1)).x
         + read_imagef(img, s, (int2)(c, 2 * r + 2)).x;
}
"""

_raw: dict[tuple[int, str, str], cv.Kernel] = {}


def raw_kernel(device: cv.Device, source: str, name: str) -> cv.Kernel:
    """``device.compile(source, name)`` (OpenCL C as it is), once per device."""
    key = (id(device), source, name)
    if key not in _raw or _raw[key].device is not device:
        _raw[key] = device.compile(source, name)
    return _raw[key]


#: np.pad's mode for each boundary= name.
PAD = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}


def padded(x: np.ndarray, h: int, boundary: str | float) -> np.ndarray:
    width = [(h, h)] + [(0, 0)] * (x.ndim - 1)
    if isinstance(boundary, str):
        return np.pad(x, width, mode=PAD[boundary])
    return np.pad(x, width, mode="constant", constant_values=boundary)


def sten_want(x: np.ndarray, h: int, boundary: str | float) -> np.ndarray:
    """What ``sten`` computes: rows r - h .. r + h of the padded input weighted 1 .. 2h + 1."""
    if len(x) == 0:
        return x.copy()
    p = padded(x, h, boundary)
    out = np.zeros_like(x)
    for k in range(2 * h + 1):
        out = out + p[k : k + len(x)] * np.float32(k + 1)
    return out


def _devices(device, pair, where):
    return device if where == "one" else pair


# -- per-block and ratio outputs -------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 17, 201])
@pytest.mark.parametrize("how", ["npy", "raw", "iterate"])
def test_guard_a_histogram_per_block_from_files_and_iterables_on_one_and_two_devices(
        device, pair, tmp_path, n, how):
    # guard: one record per block, wherever the rows come from and however many devices
    # share the blocks (1-row blocks, a short tail, one block, none).
    u = np.random.default_rng(n).integers(0, 256, n).astype(np.uint8)
    np.save(tmp_path / "u.npy", u)
    u.tofile(tmp_path / "u.raw")
    for where in ("one", "pair"):
        if where == "pair" and how == "iterate":
            continue  # refused over several devices (read once, in order)
        if how == "iterate" and n == 0:
            continue  # test_an_empty_iterable_takes_the_kernels_dtype
        for block_bytes in (1, 100, None):
            source = {"npy": tmp_path / "u.npy", "raw": cv.raw(tmp_path / "u.raw", np.uint8),
                      "iterate": cv.iterate((u[i:i + 7] for i in range(0, n, 7)), length=n)}
            report = cv.stream(compiled(device, WORK, "hist"), [source[how]],
                               [cv.per_block((16,), np.uint32)], block_bytes=block_bytes,
                               device=_devices(device, pair, where))
            want = np.array([np.bincount(u[a:b] & 15, minlength=16)
                             for a, b in report.block_ranges], np.uint32).reshape(-1, 16)
            np.testing.assert_array_equal(report.outputs[0], want)
            assert report.outputs[0].shape == (report.blocks, 16)
            assert n == 0 or report.block_ranges[-1, 1] == n
    assert_clean(device)


@pytest.mark.parametrize("n", [0, 1, 5, 301])
def test_guard_an_up_sampled_output_of_wider_rows_and_type_on_one_and_two_devices(
        device, pair, n):
    # guard: cv.rows(ratio=(3, 1), shape=(2,)) of float64 from uint8: 48 bytes of output per
    # byte of input 0, padded device buffers, zero-copy or not, blocks of one row.
    x = np.random.default_rng(n).integers(0, 256, n).astype(np.uint8)
    index = np.arange(n)[:, None, None] * 1000.0
    want = (x[:, None, None] * 10.0 + np.arange(3)[None, :, None] * 2
            + np.arange(2)[None, None, :] + index).reshape(n * 3, 2)
    for where in ("one", "pair"):
        for block_bytes, zero_copy in ((48, None), (48 * 64, False), (None, None)):
            report = cv.stream(compiled(device, WORK, "up"), [x],
                               [cv.rows(np.float64, ratio=(3, 1), shape=(2,))],
                               block_bytes=block_bytes, zero_copy=zero_copy,
                               device=_devices(device, pair, where))
            np.testing.assert_array_equal(report.outputs[0], want)
    assert_clean(device)


# -- halos ----------------------------------------------------------------------------------

@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", 2.5])
@pytest.mark.parametrize("how", ["array", "npy", "raw", "iterate", "npy-out"])
def test_guard_halos_longer_than_the_input_from_every_source_into_every_sink(
        device, pair, tmp_path, boundary, how):
    # guard: 2-D rows of 3, halo 8 on 1, 2 and 5 rows (one block), every boundary, whether the
    # rows come from an array, a file or an iterable and go to an array or a .npy file.
    if how == "iterate" and boundary == "periodic":
        pytest.skip("refused: an iterable is read once, in order")
    h = 8
    for rows in (1, 2, 5):
        x = (np.random.default_rng(rows).integers(-8, 8, (rows, 3)) / 4).astype(np.float32)
        np.save(tmp_path / "x.npy", x)
        x.tofile(tmp_path / "x.raw")
        for where in ("one", "pair"):
            if where == "pair" and how == "iterate":
                continue
            source = {"array": x, "npy": tmp_path / "x.npy", "npy-out": x,
                      "raw": cv.raw(tmp_path / "x.raw", np.float32, (-1, 3)),
                      "iterate": cv.iterate((x[i:i + 2] for i in range(0, rows, 2)),
                                            length=rows)}[how]
            out = tmp_path / "y.npy" if how == "npy-out" else np.float32
            report = cv.stream(compiled(device, WORK, "sten"), [source], [out], args=(3, h),
                               halo=h, boundary=boundary, device=_devices(device, pair, where))
            got = np.load(tmp_path / "y.npy") if how == "npy-out" else report.outputs[0]
            np.testing.assert_array_equal(got, sten_want(x, h, boundary))
    assert_clean(device)


# -- lookup tables --------------------------------------------------------------------------

def test_guard_tables_of_any_layout_in_args_and_resident_on_one_and_two_devices(device, pair):
    # guard: a strided, a reversed, a read-only and a Fortran-ordered table read as its C
    # order, whether uploaded per stream or held by cv.resident, on one device or two.
    rng = np.random.default_rng(3)
    u = rng.integers(0, 256, 1001).astype(np.uint8)
    big = rng.standard_normal(512).astype(np.float32)
    tables = [big[::2], big[:256][::-1], np.frombuffer(big[:256].tobytes(), np.float32),
              np.asfortranarray(big[:256].reshape(16, 16))]
    k = compiled(device, WORK, "lut8")
    for table in tables:
        want = np.ascontiguousarray(table).reshape(-1)[u]
        for where in ("one", "pair"):
            devices = _devices(device, pair, where)
            y = cv.stream(k, [u], [np.float32], args=(table,), device=devices,
                          block_bytes=100).outputs[0]
            np.testing.assert_array_equal(y, want)
            with cv.resident(table) as handle:
                y = cv.stream(k, [u], [np.float32], args=(handle,), device=devices,
                              block_bytes=100).outputs[0]
            np.testing.assert_array_equal(y, want)
    assert_clean(device)


def test_guard_half_bool_record_and_constant_uint64_tables_over_two_devices(pair):
    # guard: tables of half (vload_half), bool, an aligned record with a uint64 member past
    # 2**63, and a __constant ulong table beside offsets past 2**62, on two devices.
    _opencl(*pair)
    x = np.random.default_rng(1).integers(0, 256, 333).astype(np.uint8)
    half = (np.arange(8) * 1.5 - 3).astype(np.float16)
    flags = np.array([1, 0, 1, 1, 0, 0, 1, 0], bool)
    rec = np.dtype([("a", np.int8), ("b", np.uint64), ("c", np.float32)], align=True)
    records = np.zeros(8, rec)
    records["a"] = np.arange(8) - 4
    records["b"] = 2**63 + np.arange(8, dtype=np.uint64)
    records["c"] = np.arange(8) * 3
    words = np.uint64(2**64 - 1) - np.arange(8, dtype=np.uint64) * np.uint64(12345)
    k = {name: raw_kernel(pair[0], TABLES, name) for name in ("thalf", "tbool", "trec", "tu64")}
    for block_bytes in (50, None):
        def run(name, table, out, first_row=0, bb=block_bytes):
            return cv.stream(k[name], [x], [out], args=(table,), device=pair, block_bytes=bb,
                             first_row=first_row).outputs[0]
        np.testing.assert_array_equal(run("thalf", half, np.float32),
                                      half[x & 7].astype(np.float32))
        np.testing.assert_array_equal(run("tbool", flags, np.uint8),
                                      np.where(flags[x & 7], 7, 3).astype(np.uint8))
        r = records[x & 7]
        np.testing.assert_array_equal(
            run("trec", records, np.uint64),
            r["a"].astype(np.int64).astype(np.uint64) + r["b"] + r["c"].astype(np.uint64))
        index = np.arange(len(x), dtype=np.uint64) + np.uint64(2**62)
        np.testing.assert_array_equal(run("tu64", words, np.uint64, 2**62),
                                      words[x & 7] ^ index)
    for dev in pair:
        assert_clean(dev)


@pytest.mark.parametrize("n", [0, 1, 7, 300])
@pytest.mark.parametrize("how", ["array", "npy", "iterate"])
def test_guard_a_writable_histogram_table_through_a_halo_with_a_constant_boundary(
        device, tmp_path, n, how):
    # guard: a writable resident table counted into by every element of a halo stream (a
    # constant boundary of 7), from an array, a file or an iterable; of no rows: unchanged.
    _opencl(device)
    if how == "iterate" and n == 0:
        pytest.skip("test_an_empty_iterable_takes_the_kernels_dtype")
    u = np.random.default_rng(n).integers(0, 256, n).astype(np.uint8)
    np.save(tmp_path / "u.npy", u)
    p = np.pad(u, 3, constant_values=7).astype(np.uint32)
    start = np.arange(16, dtype=np.uint32) * 1000
    want = start + np.bincount((p[:n] + p[6:6 + n]) & 15, minlength=16).astype(np.uint32)
    for block_bytes in (3, 64, None):
        counts = start.copy()
        source = {"array": u, "npy": tmp_path / "u.npy",
                  "iterate": cv.iterate((u[i:i + 5] for i in range(0, n, 5)), length=n)}[how]
        with cv.resident(counts, writable=True) as table:
            cv.stream(raw_kernel(device, TABLES, "whalo"), [source], [], args=(table, 3),
                      halo=3, boundary=7, device=device, block_bytes=block_bytes)
        np.testing.assert_array_equal(counts, want)
    assert_clean(device)


def test_a_constant_table_in_a_chain_link_is_refused_or_fitted_as_for_the_kernel(device):
    _opencl(device)
    k = raw_kernel(device, TABLES, "plus_table")
    limit = device.max_constant_bytes
    x = np.arange(limit // 4, dtype=np.float32)
    big = np.zeros(limit // 4 + 1, np.float32)  # one element past the constant buffer
    # The kernel alone is warned about before any work (test_round17_lead); so must the
    # same kernel be as the one link of a chain (some drivers fail such a launch).
    chain = cv.chain(cv.link(k, reads="in0", writes="out0", args=(big,)))
    with pytest.warns(RuntimeWarning, match=r"parameter 't'.*__global const"):
        cv.stream(chain, [x], [np.float32], device=device)
    # A table of half the buffer leaves the __constant input's blocks the other half.
    table = np.zeros(limit // 8, np.float32)
    table[:4] = [1, 2, 3, 4]
    chain = cv.chain(cv.link(k, reads="in0", writes="out0", args=(table,)))
    report = cv.stream(chain, [x], [np.float32], device=device, block_bytes=limit)
    np.testing.assert_array_equal(report.outputs[0], x + np.tile(table[:4], len(x) // 4))
    assert report.block_rows * x.itemsize + table.nbytes <= limit


def test_a_device_array_for_a_constant_parameter_counts_against_the_constant_buffer(device):
    _opencl(device)
    import pyopencl as cl
    import pyopencl.array as cl_array

    k = raw_kernel(device, TABLES, "plus_table")
    limit = device.max_constant_bytes
    x = np.arange(limit // 4, dtype=np.float32)
    queue = cl.CommandQueue(device.context)
    table = np.zeros(limit // 8, np.float32)  # half the constant buffer
    table[:4] = [1, 2, 3, 4]
    half = cl_array.to_device(queue, table)
    queue.finish()
    report = cv.stream(k, [x], [np.float32], args=(half,), device=device, block_bytes=limit)
    np.testing.assert_array_equal(report.outputs[0], x + np.tile(table[:4], len(x) // 4))
    # As for the same table given as a NumPy array (test_round17_lead): the input's blocks
    # get what the table leaves of the constant buffer.
    assert report.block_rows * x.itemsize + table.nbytes <= limit
    big = cl_array.to_device(queue, np.zeros(limit // 4 + 1, np.float32))
    queue.finish()
    with pytest.warns(RuntimeWarning, match=r"args\[0\] \(parameter 't'\).*__global const"):
        cv.stream(k, [x], [np.float32], args=(big,), device=device)


# -- reductions -----------------------------------------------------------------------------

def _sample(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if dtype.kind == "c":
        return (rng.integers(-9, 9, shape) + 1j * rng.integers(-9, 9, shape)).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype == np.uint64:
        return rng.integers(0, 2**64, shape, dtype=np.uint64)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, endpoint=True, dtype=dtype)
    return rng.integers(-50, 50, shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.int8, np.uint64, np.bool_, np.float16, np.complex64])
def test_guard_callable_sums_of_narrow_wide_and_complex_files_with_a_halo_over_two_devices(
        device, pair, tmp_path, dtype):
    # guard: each block's np.sum (halo rows dropped) folds to np.sum of the whole file in its
    # type (int8 and bool to int64, uint64 wrapping, float16, complex), on one device or two.
    _opencl(device, *pair)
    rng = np.random.default_rng(5)
    for shape in ((0,), (1,), (7,), (100, 3), (11, 2, 2)):
        x = _sample(np.dtype(dtype), shape, rng)
        np.save(tmp_path / "c.npy", x)
        want = x.sum(axis=0)
        row_bytes = x.dtype.itemsize * int(np.prod(shape[1:]))
        for where in ("one", "pair"):
            for rows in (2, 3, None):
                def partial(block, *, queue, offset, n):
                    a = block.get()
                    return a[2:len(a) - 2].sum(axis=0)
                report = cv.stream(partial, [tmp_path / "c.npy"], reduce="sum", halo=2,
                                   device=_devices(device, pair, where),
                                   block_bytes=None if rows is None else row_bytes * rows)
                got = np.asarray(report.result)
                assert got.dtype == want.dtype, (shape, where, rows)
                np.testing.assert_array_equal(got, want)
    assert_clean(device)


# -- image blocks ---------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["npy", "raw"])
def test_guard_image_files_into_a_reduction_per_block_records_and_a_ratio_output(
        device, tmp_path, how):
    # guard: an image read from a file, with 1-row and tail blocks, into a halo reduction,
    # one record per block and a 1-in-2 ratio output (halo 1).
    _opencl(device)
    try:
        device.image_limits()
    except InputError as exc:
        pytest.skip(f"no images: {exc}")
    k = {name: raw_kernel(device, IMAGE, name) for name in ("isum", "iblk", "ipool")}
    for rows in (1, 6, 37):
        x = (np.random.default_rng(rows).integers(-64, 64, (rows, 5)) / 4).astype(np.float32)
        np.save(tmp_path / "im.npy", x)
        x.tofile(tmp_path / "im.raw")

        def image():
            return cv.image(tmp_path / "im.npy" if how == "npy" else
                            cv.raw(tmp_path / "im.raw", np.float32, (-1, 5)))
        for block_bytes in (20, 80, None):
            report = cv.stream(k["isum"], [image()], reduce="sum", args=(1,), halo=1,
                               boundary=0, device=device, block_bytes=block_bytes)
            assert report.result == sten_want(x, 1, 0.0).astype(np.float64).sum()
            report = cv.stream(k["iblk"], [image()], [cv.per_block((3,), np.float32)],
                               device=device, block_bytes=block_bytes)
            want = np.array([[x[a:b].sum(), a * 5, (b - a) * 5]
                             for a, b in report.block_ranges], np.float32)
            np.testing.assert_array_equal(report.outputs[0], want)
            if rows % 2 == 0:
                report = cv.stream(k["ipool"], [image()], [cv.rows(np.float32, ratio=(1, 2))],
                                   halo=1, device=device, block_bytes=block_bytes)
                np.testing.assert_array_equal(report.outputs[0], x[0::2] + x[1::2])
    assert_clean(device)


# -- what is wrong --------------------------------------------------------------------------

def test_a_complex_constant_boundary_pads_a_complex_input_as_np_pad_does(device):
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels, PyOpenCL arrays in callables")
    x = (np.arange(6) + 1j * np.arange(6)[::-1]).astype(np.complex64)

    def keep_block(block, y, *, queue, offset, n):
        return block[1:block.shape[0] - 1]

    def window(block, *, queue, offset, n):
        return block.get()  # the block with its halo rows, as a partial of one block

    report = cv.stream(keep_block, [x], [np.complex64], halo=1, boundary=1 + 2j,
                       device=device)
    np.testing.assert_array_equal(report.outputs[0], x)
    report = cv.stream(window, [x], reduce=lambda a, b: np.concatenate([a, b]), halo=1,
                       boundary=1 + 2j, device=device, block_bytes=x.nbytes)
    np.testing.assert_array_equal(report.result, np.pad(x, 1, constant_values=1 + 2j))


def test_a_complex_input_for_a_struct_pointer_is_refused(device):
    # guard: a complex64 array for a struct pointer is refused before any work (its record
    # view is taken: the struct's two floats).
    _opencl(device)
    k = raw_kernel(device, TABLES, "conj")
    x = (np.arange(10) + 1j * np.arange(10)).astype(np.complex64)
    with pytest.raises(InputError, match="parameter 'x'"):
        cv.stream(k, [x], [np.complex64], device=device)
    pair_dtype = np.dtype([("re", np.float32), ("im", np.float32)])
    y = cv.stream(k, [x.view(pair_dtype)], [pair_dtype], device=device).outputs[0]
    np.testing.assert_array_equal(y.view(np.complex64), np.conj(x))


def test_a_complex_input_for_a_struct_pointer_is_told_the_record_view(device):
    _opencl(device)
    k = raw_kernel(device, TABLES, "conj")
    x = (np.arange(10) + 1j * np.arange(10)).astype(np.complex64)
    with pytest.raises(InputError) as caught:
        cv.stream(k, [x], [np.complex64], device=device)
    message = str(caught.value)
    assert "complex64*" not in message, message
    assert "view" in message, message  # e.g. x.view(np.dtype([("re", "f4"), ("im", "f4")]))


def test_an_empty_iterable_takes_the_kernels_dtype(device):
    report = cv.stream(compiled(device, WORK, "hist"), [cv.iterate(iter([]), length=0)],
                       [cv.per_block((16,), np.uint32)], device=device)
    assert report.blocks == 0
    assert report.outputs[0].shape == (0, 16)
