"""Round sixteen, image inputs and chains in depth: ``cv.image`` blocks of every integer
type at its extremes, non-contiguous image arrays (0-stride, negative strides, a view of the
channel axis), empty images, widths and heights at and past the device's limits, images with
trace files, bool inputs and big-endian files beside them; chains with halos, temps of row
shapes, callable links returning arrays, ratio and per-block outputs written by kernel and
callable links, reductions ending a chain, ``first_row``, ``cv.iterate`` inputs. Every result
is compared with NumPy's.

Found (strict xfails, each asserting the right behaviour):

- ``trace=`` naming an image input's file (a ``.npy`` path, a memory map of it, a ``cv.raw``
  file) is not refused: the stream runs and then replaces the user's input file with the
  Chrome trace. ``_check_trace`` (pipeline/stream.py) looks for ``path`` / ``array`` on each
  source, and an ``ImageSource`` keeps them on its ``inner`` source.
- A bool input read from a ``.npy`` file (or a ``cv.iterate``) holding bytes other than 0 and
  1 is refused beside plain inputs, but streams unchecked beside an image input: the stream
  skips ``guard_bools`` whenever an input is an image (the sampler parameters shift the
  kernel's parameter list).
- A halo that leaves blocks fewer rows than itself because of the device's image height is
  told to "use a larger block_bytes or memory_limit", which cannot help: the block's rows are
  capped by ``CL_DEVICE_IMAGE2D_MAX_HEIGHT`` less 2 halo.
- A big-endian ``.npy`` image given by path is told to ``pass a.astype(...)`` (there is no
  array to convert), where a plain input given by path is told how to rewrite the file.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (
    assert_clean,  # noqa: E402
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402


@pytest.fixture
def image_device(device):
    """The device, where it has OpenCL images."""
    if device.backend != "opencl":
        pytest.skip("OpenCL images")
    try:
        device.image_limits()
    except InputError as exc:
        pytest.skip(f"{device.spec} has no images: {exc}")
    return device


#: np.pad's mode for each boundary= name.
PAD = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}


def padded(x: np.ndarray, h: int, boundary: str | float) -> np.ndarray:
    """``x`` with ``h`` rows before and after under ``boundary`` (np.pad's rows)."""
    width = [(h, h)] + [(0, 0)] * (x.ndim - 1)
    if isinstance(boundary, str):
        return np.pad(x, width, mode=PAD[boundary])
    return np.pad(x, width, mode="constant", constant_values=boundary)


# -- image kernels (one source: one build) ----------------------------------------------------
IMAGES = """
__kernel void wsum(read_only image2d_t img, sampler_t s, __global float *y, uint channels,
                   uint h, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    ulong pixel = i / channels;
    uint c = i % channels;
    int w = get_image_width(img);
    float t = 0.0f;
    for (int d = 0; d <= 2 * (int)h; d++) {
        float4 v = read_imagef(img, s, (int2)(pixel % w, pixel / w + d));
        t += (c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w) * (float)(d + 1);
    }
    y[i] = t;
}
__kernel void flagged(read_only image2d_t img, sampler_t s, __global const bool *f,
                      __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    int w = get_image_width(img);
    y[i] = read_imagef(img, s, (int2)(i % w, i / w)).x + (f[i] ? 1.0f : 0.0f);
}
__kernel void signed_copy(read_only image2d_t img, sampler_t s, __global int *y,
                          uint channels, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    ulong pixel = i / channels;
    uint c = i % channels;
    int w = get_image_width(img);
    int4 v = read_imagei(img, s, (int2)(pixel % w, pixel / w));
    y[i] = c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}
__kernel void unsigned_copy(read_only image2d_t img, sampler_t s, __global uint *y,
                            uint channels, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    ulong pixel = i / channels;
    uint c = i % channels;
    int w = get_image_width(img);
    uint4 v = read_imageui(img, s, (int2)(pixel % w, pixel / w));
    y[i] = c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}
"""

_built: dict[tuple[int, str, str], cv.Kernel] = {}


def build(device: cv.Device, source: str, name: str) -> cv.Kernel:
    """``device.compile(source, name)``, once per device, source and name."""
    key = (id(device), source, name)
    if key not in _built or _built[key].device is not device:
        _built[key] = device.compile(source, name)
    return _built[key]


def wsum_want(a: np.ndarray, h: int, boundary: str | float = "nearest") -> np.ndarray:
    """What ``wsum`` computes: rows r - h .. r + h weighted 1 .. 2h + 1, every channel."""
    a = np.asarray(a, np.float64)
    if len(a) == 0:
        return a.astype(np.float32)
    p = padded(a, h, boundary)
    return sum(p[d:d + len(a)] * (d + 1) for d in range(2 * h + 1)).astype(np.float32)


def run_wsum(device: cv.Device, a: np.ndarray, h: int = 1, **kw) -> np.ndarray:
    channels = a.shape[2] if a.ndim == 3 else 1
    y = np.zeros(a.shape, np.float32)
    cv.stream(build(device, IMAGES, "wsum"), [cv.image(a)], [y], args=(channels, h),
              halo=h, device=device, **kw)
    return y


# -- images: found ----------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["npy", "memmap", "raw"])
def test_a_trace_naming_an_image_inputs_file_is_refused_and_the_file_kept(image_device,
                                                                          tmp_path, how):
    """A plain input's file named as ``trace=`` is an InputError before any work; an image
    input's file was not checked, and the trace replaced it after the stream."""
    a = np.arange(40 * 8, dtype=np.float32).reshape(40, 8)
    if how == "raw":
        path = tmp_path / "im.raw"
        a.tofile(path)
        source = cv.raw(path, dtype=np.float32, shape=a.shape)
    else:
        path = tmp_path / "im.npy"
        np.save(path, a)
        source = str(path) if how == "npy" else np.load(path, mmap_mode="r")
    before = path.read_bytes()
    y = np.zeros_like(a)
    try:
        with pytest.raises(InputError, match="trace"):
            cv.stream(build(image_device, IMAGES, "wsum"), [cv.image(source)], [y],
                      args=(1, 1), halo=1, device=image_device, trace=str(path))
    finally:
        after = path.read_bytes()
        del source
    assert after == before, "the image input's file was replaced by the trace"


@pytest.mark.parametrize("how", ["npy", "iterate"])
def test_bool_bytes_beside_an_image_input_are_refused_as_beside_a_plain_one(image_device,
                                                                           tmp_path, how):
    x = np.zeros((10, 4), np.float32)
    raw = np.zeros(40, np.uint8)
    raw[::3] = 2
    raw[1::3] = 100
    flags = raw.view(np.bool_).reshape(10, 4)
    path = tmp_path / "flags.npy"
    np.save(path, flags)
    source = str(path) if how == "npy" else cv.iterate(iter([flags[:5], flags[5:]]), 10)
    y = np.zeros_like(x)
    with pytest.raises(InputError, match="bytes? other than 0 and 1"):
        cv.stream(build(image_device, IMAGES, "flagged"), [cv.image(x), source], [y],
                  device=image_device)
    assert_clean(image_device)


def test_guard_bool_arrays_beside_an_image_input_are_checked(image_device):
    # guard: the in-memory bool array beside an image is refused (check_kernel checks it)
    x = np.zeros((10, 4), np.float32)
    raw = np.zeros(40, np.uint8)
    raw[::3] = 2
    with pytest.raises(InputError, match="bytes other than 0 and 1"):
        cv.stream(build(image_device, IMAGES, "flagged"),
                  [cv.image(x), raw.view(np.bool_).reshape(10, 4)], [np.zeros_like(x)],
                  device=image_device)


def test_a_halo_the_image_height_leaves_too_few_rows_for_names_the_image_height(image_device):
    height = image_device.image_limits().max_height
    halo = height // 3 + 1  # blocks of height - 2 * halo rows: fewer than the halo
    a = np.zeros((halo + 10, 1), np.float32)
    with pytest.raises(InputError) as caught:
        run_wsum(image_device, a, h=halo, block_bytes=a.nbytes * 4)
    message = str(caught.value)
    assert "image" in message and "height" in message, message
    assert "larger block_bytes" not in message, message


def test_a_big_endian_image_file_is_told_how_to_rewrite_the_file(image_device, tmp_path):
    a = np.arange(40 * 8, dtype=np.float32).reshape(40, 8)
    path = tmp_path / "be.npy"
    np.save(path, a.astype(">f4"))
    with pytest.raises(InputError) as caught:
        cv.stream(build(image_device, IMAGES, "wsum"), [cv.image(str(path))],
                  [np.zeros_like(a)], args=(1, 1), halo=1, device=image_device)
    message = str(caught.value)
    assert "a.astype" not in message and "np.save" in message, message


# -- images: guards ----------------------------------------------------------------------------
def test_guard_images_of_odd_strides_are_read_exactly(image_device):
    # guard: a 0-stride row and column (np.broadcast_to), negative strides on both axes, a
    # step and a slice of an 8-channel array's channel axis as RGBA, a (rows, cols, 1) array;
    # blocks of 5 rows of 37 (halo 1)
    rng = np.random.default_rng(16)
    base = rng.integers(0, 50, (37, 11)).astype(np.float32)
    eight = rng.integers(0, 50, (37, 11, 8)).astype(np.float32)
    views = [np.broadcast_to(base[3], base.shape), np.broadcast_to(base[:, :1], base.shape),
             base[::-1], base[:, ::-1], base[::-1, ::-1], eight[..., ::2], eight[..., 2:6],
             eight[::-1, :, 4:], base[..., None]]
    for view in views:
        y = run_wsum(image_device, view, block_bytes=5 * int(np.prod(view.shape[1:])) * 4)
        np.testing.assert_array_equal(y, wsum_want(view, 1), err_msg=str(view.strides))
    assert_clean(image_device)


@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", 0])
def test_guard_empty_images_stream_nothing(image_device, boundary):
    # guard: 0 rows (1 and 4 channels) into an output and reduce="sum" (0.0), every boundary
    normalized = boundary in ("reflect", "periodic")
    for shape in ((0, 11), (0, 11, 4)):
        a = np.zeros(shape, np.float32)
        channels = shape[2] if len(shape) == 3 else 1
        y = np.zeros(shape, np.float32)
        cv.stream(build(image_device, IMAGES, "wsum"), [cv.image(a, normalized=normalized)],
                  [y], args=(channels, 1), halo=1, boundary=boundary, device=image_device)
    report = cv.stream(build(image_device, IMAGES, "wsum"),
                       [cv.image(np.zeros((0, 5), np.float32), normalized=normalized)],
                       reduce="sum", args=(1, 1), halo=1, boundary=boundary,
                       device=image_device)
    assert report.result == 0.0
    assert_clean(image_device)


def test_guard_widths_and_heights_at_the_devices_image_limits(image_device):
    # guard: exactly the largest width streams exact, one more column is an InputError naming
    # the limit; more rows than the largest height (halo 2) are cut into blocks, exact
    limits = image_device.image_limits()
    rng = np.random.default_rng(3)
    wide = rng.integers(0, 9, (2, limits.max_width)).astype(np.float32)
    np.testing.assert_array_equal(run_wsum(image_device, wide), wsum_want(wide, 1))
    with pytest.raises(InputError, match="CL_DEVICE_IMAGE2D_MAX_WIDTH"):
        run_wsum(image_device, np.zeros((2, limits.max_width + 1), np.float32))
    if limits.max_height <= 65536:  # a few hundred KiB of rows
        tall = rng.integers(0, 9, (limits.max_height + 7, 1)).astype(np.float32)
        np.testing.assert_array_equal(run_wsum(image_device, tall, h=2), wsum_want(tall, 2))
    assert_clean(image_device)


def test_guard_integer_images_at_their_extremes_are_read_exactly(image_device):
    # guard: int8/16/32 and uint8/16/32 min, max and neighbours, 1 and 4 channels, blocks of
    # 2 rows of 9, read with read_imagei / read_imageui
    formats = image_device.image_limits().formats
    for dtype in (np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32):
        info = np.iinfo(dtype)
        values = np.array([info.min, info.max, 0, 1, info.max - 1, info.min + 1, 7], dtype)
        name, out = (("signed_copy", np.int32) if info.min < 0 else
                     ("unsigned_copy", np.uint32))
        for channels in (1, 4):
            if (channels, np.dtype(dtype)) not in formats:
                continue
            a = np.ascontiguousarray(np.resize(values, (9, 5, channels) if channels == 4
                                               else (9, 5)))
            y = np.zeros(a.shape, out)
            cv.stream(build(image_device, IMAGES, name), [cv.image(a)], [y], args=(channels,),
                      device=image_device, block_bytes=2 * y[0].nbytes)
            np.testing.assert_array_equal(y, a.astype(out), err_msg=f"{dtype} {channels}")


# -- chains ------------------------------------------------------------------------------------
CHAINS = """
__kernel void rowpair(__global const float *x, __global float *t, ulong cols, ulong h,
                      ulong offset, ulong n) {
    ulong j = get_global_id(0);
    if (j >= n / cols * 2) return;
    ulong r = j / 2;
    float s = 0.0f;
    if (j % 2 == 0) {
        for (ulong k = 0; k <= 2 * h; k++) s += x[(r + k) * cols] * (float)(k + 1);
    } else {
        s = x[(r + h) * cols + cols - 1] * 2.0f + (float)(offset / cols + r);
    }
    t[j] = s;
}
__kernel void fold(__global const float *t, __global float *v, ulong cols, ulong offset,
                   ulong n) {
    ulong j = get_global_id(0);
    if (j >= n) return;
    v[j] = t[2 * (j / cols)] - t[2 * (j / cols) + 1];
}
__kernel void pool2(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n / 2) y[i] = x[2 * i] + x[2 * i + 1] * 10.0f;
}
__kernel void tripleh(__global const float *x, __global float *y, ulong h, ulong offset,
                      ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i + h] * 3.0f;
}
__kernel void recsum(__global const float *x, __global float *r, ulong offset, ulong n) {
    if (get_global_id(0) != 0) return;
    float s = 0.0f;
    for (ulong k = 0; k < n; k++) s += x[k];
    r[0] = s;
    r[1] = (float)offset;
    r[2] = (float)n;
}
"""


def _opencl_arrays(device: cv.Device) -> None:
    if device.backend != "opencl":
        pytest.skip("PyOpenCL device arrays in the callable links")


def _pair_want(x: np.ndarray, h: int, boundary: str | float, first_row: int) -> np.ndarray:
    """What ``rowpair`` writes: per row, the weighted column-0 stencil and twice the last
    column plus the row's index in the whole array."""
    p = padded(x.astype(np.float64), h, boundary)
    rows = len(x)
    t0 = sum(p[k:k + rows, 0] * (k + 1) for k in range(2 * h + 1))
    t1 = x[:, -1].astype(np.float64) * 2 + (first_row + np.arange(rows))
    return np.stack([t0, t1], 1).astype(np.float32)


@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", 0.5])
def test_guard_a_halo_through_a_row_shaped_temp_a_callable_and_a_reduction(device, boundary):
    # guard: a stencil link writes a ((2,), float32) temp per row of a (rows, 3) input, a
    # callable link (which gets the halo rows of in0) returns twice the temp into a (rows, 2)
    # output, a kernel folds the temp into a second output; the same chain ending in
    # reduce= sum/min/max; halo 0, 1, 3 of 1, 7 and 50 rows, blocks of 3 rows or one,
    # first_row=7
    _opencl_arrays(device)

    def twice(x, t, y, h, *, queue, offset, n):
        assert x.shape == (t.shape[0] + 2 * h, 3)
        return t * 2

    rowpair, fold = build(device, CHAINS, "rowpair"), build(device, CHAINS, "fold")
    rng = np.random.default_rng(16)
    for rows in (1, 7, 50):
        for h in (0, 1, 3):
            for block_rows in (None, 3):
                if h and block_rows and h > block_rows and rows > block_rows:
                    continue
                x = rng.integers(-9, 9, (rows, 3)).astype(np.float32)
                t = _pair_want(x, h, boundary, 7)
                folded = np.repeat(t[:, 0] - t[:, 1], 3)
                chain = cv.chain(cv.link(rowpair, "in0", "tp", args=(3, h)),
                                 cv.link(twice, ("in0", "tp"), "out0", args=(h,)),
                                 cv.link(fold, "tp", "out1", args=(3,)),
                                 temps={"tp": ((2,), np.float32)})
                y, v = np.zeros((rows, 2), np.float32), np.zeros((rows, 3), np.float32)
                options = dict(halo=h, boundary=boundary, device=device, first_row=7,
                               block_bytes=None if block_rows is None else block_rows * 12)
                cv.stream(chain, [x], [y, v], **options)
                where = f"rows={rows} h={h} block_rows={block_rows}"
                np.testing.assert_array_equal(y, 2 * t, err_msg=where)
                np.testing.assert_array_equal(v.reshape(-1), folded, err_msg=where)
                reducing = cv.chain(cv.link(rowpair, "in0", "tp", args=(3, h)),
                                    cv.link(fold, "tp", "reduce", args=(3,)),
                                    temps={"tp": ((2,), np.float32)})
                for op in ("sum", "min", "max"):
                    report = cv.stream(reducing, [x], reduce=op, **options)
                    assert report.result == getattr(np, op)(folded.astype(np.float64)), \
                        (where, op)
    assert_clean(device)


def test_guard_ratio_and_per_block_outputs_written_by_kernel_and_callable_links(device):
    # guard: a kernel link pools a temp into a (1, 2) ratio output, a callable link returns a
    # (2, 1) up-sampled output, a kernel reads the pooled output into a third; per-block
    # records from a kernel link and from a callable link returning a (1, 3) array; halo 0 to
    # 2, blocks of 2, 4 or all rows, first_row=3
    _opencl_arrays(device)
    import pyopencl.array as cla

    tripleh, pool2 = build(device, CHAINS, "tripleh"), build(device, CHAINS, "pool2")
    recsum = build(device, CHAINS, "recsum")

    def up(x, y, h, *, queue, offset, n):
        own = x[h:x.shape[0] - h].get(queue=queue)
        return cla.to_device(queue, np.repeat(own, 2))

    def record(t, r, *, queue, offset, n):
        v = t.get(queue=queue)
        return cla.to_device(queue, np.array([[v.sum(), offset, n]], np.float32))

    for rows in (2, 6, 50):
        x = np.random.default_rng(rows).integers(-9, 9, rows).astype(np.float32)
        for h in (0, 1, 2):
            for block_rows in (None, 2, 4):
                if h and block_rows and h > block_rows and rows > block_rows:
                    continue
                block_bytes = None if block_rows is None else block_rows * 4
                chain = cv.chain(cv.link(tripleh, "in0", "t", args=(h,)),
                                 cv.link(pool2, "t", "out0"),
                                 cv.link(up, "in0", "out1", args=(h,)),
                                 cv.link(tripleh, "out0", "out2", args=(0,)),
                                 temps={"t": np.float32})
                report = cv.stream(chain, [x], [cv.rows(np.float32, ratio=(1, 2)),
                                                cv.rows(np.float32, ratio=(2, 1)),
                                                cv.rows(np.float32, ratio=(1, 2))],
                                   halo=h, device=device, first_row=3, block_bytes=block_bytes)
                pooled = 3 * x[0::2] + 30 * x[1::2]
                where = f"rows={rows} h={h} block_rows={block_rows}"
                np.testing.assert_array_equal(report.outputs[0], pooled, err_msg=where)
                np.testing.assert_array_equal(report.outputs[1], np.repeat(x, 2), err_msg=where)
                np.testing.assert_array_equal(report.outputs[2], 3 * pooled, err_msg=where)
            chain = cv.chain(cv.link(tripleh, "in0", "t", args=(0,)),
                             cv.link(recsum, "t", "out0"), cv.link(record, "t", "out1"),
                             temps={"t": np.float32})
            report = cv.stream(chain, [x], [cv.per_block((3,), np.float32)] * 2,
                               device=device, first_row=3, block_bytes=block_bytes)
            for k, (lo, hi) in enumerate(report.block_ranges):
                want = [3 * x[lo:hi].sum(), 3 + lo, hi - lo]
                assert report.outputs[0][k].tolist() == want, (rows, k)
                assert report.outputs[1][k].tolist() == want, (rows, k)
    assert_clean(device)


def test_guard_a_chain_over_an_iterable_with_a_halo_and_a_warmed_callable(device):
    # guard: a cv.iterate input in chunks of 1, 7 and all 50 rows, halo 2, each boundary a
    # single read allows: the warm-up call peeks at the first rows without losing them
    _opencl_arrays(device)
    tripleh = build(device, CHAINS, "tripleh")

    def plus(x, t, y, h, *, queue, offset, n):
        return t + x[h:h + t.shape[0]]

    x = np.random.default_rng(0).integers(0, 9, (50, 2)).astype(np.float32)
    for boundary in ("nearest", "reflect", 0.0):
        p = padded(x, 2, boundary)
        for chunk in (1, 7, 50):
            chain = cv.chain(cv.link(tripleh, "in0", "t", args=(4,)),
                             cv.link(plus, ("in0", "t"), "out0", args=(2,)),
                             temps={"t": np.float32})
            y = np.zeros_like(x)
            cv.stream(chain, [cv.iterate((x[i:i + chunk] for i in range(0, 50, chunk)), 50)],
                      [y], halo=2, boundary=boundary, device=device, block_bytes=6 * 8,
                      first_row=5)
            np.testing.assert_array_equal(y, 4 * p[2:52], err_msg=f"{boundary} {chunk}")
    assert_clean(device)


def test_guard_image_inputs_with_a_chain_are_refused(image_device):
    # guard: a chain cannot take an image input: an InputError before any work
    a = np.zeros((4, 4), np.float32)
    chain = cv.chain(cv.link(build(image_device, CHAINS, "pool2"), "in0", "out0"))
    with pytest.raises(InputError, match="not by a chain"):
        cv.stream(chain, [cv.image(a)], [np.zeros_like(a)], device=image_device)
