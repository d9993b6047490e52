"""Image blocks (issue 19 item 2): inputs read through image2d_t and a sampler, exact against
NumPy for every channel type and count the device has a format for, each addressing mode at
the edges against the matching ``boundary=``, blocks cut to the device's image height, and
every bad input an InputError before any work (no queue made, no image allocated)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from streamkit import fail_image_copy, image_values, images_made

import conveyor as cv
from conveyor.backends import base
from conveyor.errors import BackendError, InputError, OutOfMemoryError
from conveyor.pipeline.halo import PAD_MODES

# read_image{f,i,ui} per dtype, and the C type of the output buffer (half images read as float).
READS = {
    "float32": ("f", "float4", "float"), "float16": ("f", "float4", "float"),
    "int8": ("i", "int4", "char"), "int16": ("i", "int4", "short"),
    "int32": ("i", "int4", "int"), "uint8": ("ui", "uint4", "uchar"),
    "uint16": ("ui", "uint4", "ushort"), "uint32": ("ui", "uint4", "uint"),
}  # fmt: skip
OUT_DTYPES = {"float16": np.float32}

COPY = """
__kernel void copy(read_only image2d_t img, sampler_t s, __global {out} *y, uint channels,
                   uint halo, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i >= n) return;
    ulong pixel = i / channels;
    uint c = i % channels;
    int w = get_image_width(img);
    {vec} v = read_image{suffix}(img, s, (int2)(pixel % w, pixel / w + halo));
    y[i] = ({out})(c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w);
}}
"""

# A 3 x 3 box sum: the columns past the edges come from the sampler, the rows from the halo.
BOX = """
__kernel void box(read_only image2d_t img, sampler_t s, __global float *y, uint normalized,
                  ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    int w = get_image_width(img), h = get_image_height(img);
    int x = i % w, row = i / w + 1;  /* halo = 1 */
    float sum = 0.0f;
    for (int dy = -1; dy <= 1; dy++)
        for (int dx = -1; dx <= 1; dx++) {
            float2 at = (float2)(x + dx + 0.5f, row + dy + 0.5f);
            if (normalized) at /= (float2)(w, h);
            sum += read_imagef(img, s, at).x;
        }
    y[i] = sum;
}
"""

# Samples at a quarter pixel right of and below each pixel centre: weights 3/4 and 1/4.
QUARTER = """
__kernel void quarter(read_only image2d_t img, sampler_t s, __global float *y,
                      ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    int w = get_image_width(img);
    y[i] = read_imagef(img, s, (float2)(i % w + 0.75f, i / w + 1 + 0.75f)).x;
}
"""

# Each element: the row of the whole array it is in, from offset (offset / columns + row).
ROWS = """
__kernel void rows(read_only image2d_t img, sampler_t s, __global long *y, ulong offset,
                   ulong n) {
    ulong i = get_global_id(0);
    int w = get_image_width(img);
    if (i < n) y[i] = (long)((offset + i) / w);
}
"""

# A kernel written for a buffer input: not what an image input takes.
PLAIN = """
__kernel void plain(__global const float *x, uint s, __global float *y, ulong offset,
                    ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i];
}
"""


def _copy_kernel(device, dtype):
    suffix, vec, out = READS[np.dtype(dtype).name]
    return device.compile(COPY.format(suffix=suffix, vec=vec, out=out), "copy")


@pytest.fixture
def image_device(device):
    """An OpenCL device with image support (each usable device in turn)."""
    if device.backend != "opencl":
        pytest.skip("OpenCL images; CUDA texture objects: test_image_cuda.py")
    try:
        device.image_limits()
    except InputError as exc:  # test_a_device_without_images_says_so checks this error
        pytest.skip(f"{device.spec} has no images: {exc}")
    return device


@pytest.mark.parametrize("dtype", list(READS))
@pytest.mark.parametrize("channels", [1, 2, 4])
def test_nearest_reads_are_exact_for_every_channel_type_and_count(image_device, dtype,
                                                                  channels):
    shape = (75, 13) if channels == 1 else (75, 13, channels)
    x = image_values(shape, dtype)
    y = np.zeros(shape, OUT_DTYPES.get(dtype, dtype))
    kernel = _copy_kernel(image_device, dtype)
    run = lambda: cv.stream(kernel, [cv.image(x)], [y], device=image_device,  # noqa: E731
                            args=(channels, 2), halo=2, block_bytes=x[0].nbytes * 8)
    if (channels, np.dtype(dtype)) not in image_device.image_limits().formats:
        with pytest.raises(InputError, match=rf"no image format of {channels} channel.*"
                                             r"its formats are 1 channel: .*float32"):
            run()
        return
    report = run()
    assert report.blocks > 5
    np.testing.assert_array_equal(y, x.astype(y.dtype))


def test_the_formats_named_are_the_devices_own(image_device):
    limits = image_device.image_limits()
    # PoCL lists R and RGBA of every channel type, and no RG.
    assert (1, np.dtype(np.float32)) in limits.formats
    assert (4, np.dtype(np.uint8)) in limits.formats
    x = np.zeros((8, 8), np.float64)
    with pytest.raises(InputError) as error:
        cv.stream(_copy_kernel(image_device, np.float32), [cv.image(x)],
                  [np.zeros((8, 8), np.float32)], device=image_device, args=(1, 0))
    for channels in sorted({c for c, _ in limits.formats}):
        names = sorted(str(d) for c, d in limits.formats if c == channels)
        assert ", ".join(names) in str(error.value)


@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", 0])
def test_each_addressing_mode_at_the_edges_is_the_matching_boundary(image_device, boundary):
    x = (np.arange(61 * 17) % 97).astype(np.float32).reshape(61, 17)
    y = np.zeros_like(x)
    normalized = boundary in ("reflect", "periodic")  # OpenCL's repeat modes need it
    report = cv.stream(image_device.compile(BOX, "box"),
                       [cv.image(x, normalized=normalized)], [y], device=image_device,
                       args=(int(normalized),), halo=1, boundary=boundary,
                       block_bytes=x[0].nbytes * 8)
    assert report.blocks > 5
    mode = PAD_MODES.get(boundary, "constant") if isinstance(boundary, str) else "constant"
    p = np.pad(x, 1, mode=mode)
    expected = sum(p[dy : dy + 61, dx : dx + 17] for dy in range(3) for dx in range(3))
    np.testing.assert_array_equal(y, expected)


def test_an_explicit_address_that_matches_is_taken(image_device):
    x = (np.arange(40 * 9) % 31).astype(np.float32).reshape(40, 9)
    y = np.zeros_like(x)
    cv.stream(image_device.compile(BOX, "box"),
              [cv.image(x, address="repeat", normalized=True)], [y], device=image_device,
              args=(1,), halo=1, boundary="periodic", block_bytes=x[0].nbytes * 8)
    p = np.pad(x, 1, mode="wrap")
    np.testing.assert_array_equal(y, sum(p[a : a + 40, b : b + 9] for a in range(3)
                                         for b in range(3)))


@pytest.mark.parametrize("source", ["array", "npy"])
def test_linear_reads_interpolate_across_the_halo_rows(image_device, source, tmp_path):
    x = np.random.default_rng(3).random((90, 21), dtype=np.float32)
    given = x
    if source == "npy":
        np.save(tmp_path / "x.npy", x)
        given = str(tmp_path / "x.npy")
    y = np.zeros_like(x)
    report = cv.stream(image_device.compile(QUARTER, "quarter"),
                       [cv.image(given, filter="linear")], [y], device=image_device, halo=1,
                       block_bytes=x[0].nbytes * 8)
    assert report.blocks > 5
    p = np.pad(x, ((0, 1), (0, 1)), mode="edge")  # clamp_to_edge columns, "nearest" rows
    a, b = np.float32(0.75), np.float32(0.25)
    expected = (a * a * p[:-1, :-1] + b * a * p[:-1, 1:] + a * b * p[1:, :-1]
                + b * b * p[1:, 1:])
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_offset_says_which_rows_of_the_whole_array_the_image_holds(image_device):
    x = np.zeros((50, 7), np.float32)
    y = np.zeros((50, 7), np.int64)
    cv.stream(image_device.compile(ROWS, "rows"), [cv.image(x)], [y], device=image_device,
              halo=3, first_row=1000, block_bytes=x[0].nbytes * 8)
    np.testing.assert_array_equal(y, np.repeat(np.arange(1000, 1050)[:, None], 7, axis=1))


def test_an_image_that_is_also_the_output_runs_in_place(image_device):
    x = (np.arange(64 * 5) % 11).astype(np.float32).reshape(64, 5)
    expected = sum(np.pad(x, 1, mode="edge")[a : a + 64, b : b + 5] for a in range(3)
                   for b in range(3))
    cv.stream(image_device.compile(BOX, "box"), [cv.image(x)], [x], device=image_device,
              args=(0,), halo=1, block_bytes=x[0].nbytes * 8)
    np.testing.assert_array_equal(x, expected)


def _smaller(monkeypatch, device, **fields):
    """Make ``device`` (the real one) report smaller image limits."""
    real = device.image_limits()
    monkeypatch.setattr(device, "image_limits", lambda: replace(real, **fields))


def test_blocks_are_cut_to_the_devices_image_height(image_device, monkeypatch):
    _smaller(monkeypatch, image_device, max_height=12)
    x = (np.arange(100 * 6) % 23).astype(np.float32).reshape(100, 6)
    y = np.zeros_like(x)
    report = cv.stream(image_device.compile(BOX, "box"), [cv.image(x)], [y],
                       device=image_device, args=(0,), halo=1)
    assert report.block_rows == 10  # 12 image rows less 2 halo rows
    np.testing.assert_array_equal(y, sum(np.pad(x, 1, mode="edge")[a : a + 100, b : b + 6]
                                         for a in range(3) for b in range(3)))


class _Watch:
    """Counts queues and images the real device makes (any is work begun)."""

    def __init__(self, monkeypatch, device):
        self.calls: list[str] = []
        for name in ("create_queue", "alloc_image"):
            real = getattr(device, name)

            def counted(*args, _real=real, _name=name, **kw):
                self.calls.append(_name)
                return _real(*args, **kw)

            monkeypatch.setattr(device, name, counted)


def _bad_cases(device):
    box = device.compile(BOX, "box")
    copy = _copy_kernel(device, np.float32)
    f32 = np.zeros((40, 10), np.float32)
    return {
        "float64 (no format)": (copy, [cv.image(f32.astype(np.float64))], {"args": (1, 0)},
                                r"no image format of 1 channel\(s\) of float64; its formats "
                                r"are 1 channel: .*float32"),
        "3 channels": (copy, [cv.image(np.zeros((40, 10, 3), np.float32))],
                       {"args": (3, 0)}, r"no image format of 3 channel"),
        "address without its boundary": (
            box, [cv.image(f32, address="repeat", normalized=True)], {"args": (1,)},
            r"address='repeat'.*boundary='periodic'.*this stream has boundary='nearest'"),
        "constant boundary": (box, [cv.image(f32)], {"args": (0,), "boundary": 7},
                              r"boundary=7 has no sampler addressing mode"),
        "repeat, not normalized": (box, [cv.image(f32)], {"args": (0,), "boundary": "reflect"},
                                   r"mirrored_repeat.*normalized coordinates only"),
        "a callable": (lambda *a, **k: None, [cv.image(f32)], {},
                       r"image inputs are read by a kernel"),
        "a buffer kernel": (device.compile(PLAIN, "plain"), [cv.image(f32)], {},
                            r"takes 'read_only image2d_t, sampler_t' in its place"),
        "a parameter short": (device.compile(ROWS, "rows"), [cv.image(f32), f32], {},
                              r"each image input takes two"),
        "a chain": (cv.chain([copy, copy], temps=[np.float32]), [cv.image(f32)], {},
                    r"read by a single kernel, not by a chain"),
        "zero_copy=True": (copy, [cv.image(f32)], {"args": (1, 0), "zero_copy": True},
                           r"zero_copy=True with an image input .*never used in place"),
    }


@pytest.mark.parametrize("case", ["float64 (no format)", "3 channels",
                                  "address without its boundary", "constant boundary",
                                  "repeat, not normalized", "a callable", "a buffer kernel",
                                  "a parameter short", "a chain", "zero_copy=True"])
def test_bad_inputs_are_input_errors_before_any_work(image_device, monkeypatch, case):
    compute, inputs, options, message = _bad_cases(image_device)[case]
    watch = _Watch(monkeypatch, image_device)
    y = np.full((40, 10), 5, np.float32)
    with pytest.raises(InputError, match=message):
        cv.stream(compute, inputs, [y], device=image_device, **options)
    assert watch.calls == []
    assert (y == 5).all()


def test_a_width_over_the_devices_limit_names_it(image_device, monkeypatch):
    _smaller(monkeypatch, image_device, max_width=10)
    watch = _Watch(monkeypatch, image_device)
    with pytest.raises(InputError, match=r"11 columns, more than .*largest image width "
                                         r"\(10 pixels"):
        cv.stream(_copy_kernel(image_device, np.float32), [cv.image(np.zeros((4, 11),
                  np.float32))], [np.zeros((4, 11), np.float32)], device=image_device,
                  args=(1, 0))
    assert watch.calls == []


def test_a_halo_taller_than_the_image_height_names_it(image_device, monkeypatch):
    _smaller(monkeypatch, image_device, max_height=6)
    with pytest.raises(InputError, match=r"halo=3 leaves no rows .*largest image height "
                                         r"\(6 pixels\)"):
        cv.stream(image_device.compile(ROWS, "rows"), [cv.image(np.zeros((40, 3),
                  np.float32))], [np.int64], device=image_device, halo=3)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"address": "none"}, r"address='none' leaves reads past the edges undefined"),
    ({"address": "wrap"}, r"address='wrap' is not an addressing mode"),
    ({"filter": "cubic"}, r"filter='cubic'"),
    ({"normalized": 1}, r"normalized=1"),
])
def test_bad_image_options_are_refused_at_once(kwargs, message):
    with pytest.raises(InputError, match=message):
        cv.image(np.zeros((4, 4), np.float32), **kwargs)


@pytest.mark.parametrize(("value", "message"), [
    (np.zeros(10, np.float32), r"shape \(10,\): an image is \(rows, columns\)"),
    (np.zeros((4, 4, 5), np.float32), r"1, 2 or 4 channels"),
    (np.zeros((4, 4), ">f4"), r"not in this machine's byte order"),
    (cv.iterate([np.zeros((4, 4), np.float32)], length=4), r"an image input reads an array"),
])
def test_shapes_images_cannot_be_are_refused(image_device, value, message):
    with pytest.raises(InputError, match=message):
        cv.stream(image_device.compile(ROWS, "rows"), [cv.image(value)], [np.int64],
                  device=image_device)


def test_linear_reads_of_integer_images_are_refused(image_device):
    with pytest.raises(InputError, match=r"filter='linear' interpolates float and half"):
        cv.stream(image_device.compile(ROWS, "rows"),
                  [cv.image(np.zeros((4, 4), np.uint8), filter="linear")], [np.int64],
                  device=image_device)


def test_a_backend_without_images_says_so(device):
    # The base class's answer (OpenCL and CUDA override it): asked of a real device here.
    with pytest.raises(InputError, match=r"image blocks are OpenCL and CUDA only.*plain input"):
        base.Device.image_limits(device)


CUDA_TAKES = """
extern "C" __global__ void k(cudaTextureObject_t img, const float *x, float *y, int w,
                             unsigned long long offset, unsigned long long n) {}
"""


def test_cuda_kernels_take_one_texture_object_per_image_input():
    from conveyor.kernels.signature import parse_params
    from conveyor.pipeline.image import kernel_params

    params = parse_params(CUDA_TAKES, "k")
    # Input 0 an image, input 1 a buffer, one output, one arg, offset, n: six parameters.
    assert kernel_params("k", params, frozenset({0}), 6, "cuda") == list(params)
    with pytest.raises(InputError, match=r"CUDA kernel 'k' takes 'cudaTextureObject_t' in "
                                         r"its place \(read with tex2D<T>\), not 'const float"):
        kernel_params("k", params, frozenset({1}), 6, "cuda")
    with pytest.raises(InputError, match=r"takes 6 parameters; this stream passes 7: on CUDA "
                                         r"each image input takes one \(cudaTextureObject_t\)"):
        kernel_params("k", params, frozenset({0}), 7, "cuda")
    # The OpenCL rule is unchanged: image2d_t and sampler_t.
    with pytest.raises(InputError, match=r"each image input takes two"):
        kernel_params("k", params, frozenset({0}), 6, "opencl")


def test_images_and_buffers_go_back_after_a_failed_copy(image_device, monkeypatch):
    made = images_made(monkeypatch, image_device)
    fail_image_copy(monkeypatch, image_device, at=4, call="clEnqueueWriteImage")
    x = np.zeros((200, 8), np.float32)
    with pytest.raises(BackendError, match="injected"):
        cv.stream(image_device.compile(BOX, "box"), [cv.image(x)], [np.float32],
                  device=image_device, args=(0,), halo=1, block_bytes=x[0].nbytes * 10)
    assert len(made) == 3  # one image per slot
    assert all(image.cl_image is None for image in made)  # all freed; pools: conftest


def test_images_made_before_a_failed_one_are_freed(image_device, monkeypatch):
    made = images_made(monkeypatch, image_device, fail_at=2)
    x = np.zeros((200, 8), np.float32)
    with pytest.raises(OutOfMemoryError):
        cv.stream(image_device.compile(BOX, "box"), [cv.image(x)], [np.float32],
                  device=image_device, args=(0,), halo=1, block_bytes=x[0].nbytes * 10)
    assert len(made) == 2
    assert all(image.cl_image is None for image in made)


def test_report_counts_the_images_as_device_memory(image_device):
    x = np.zeros((200, 8), np.float32)
    report = cv.stream(image_device.compile(BOX, "box"), [cv.image(x)], [np.float32],
                       device=image_device, args=(0,), halo=1, block_bytes=x[0].nbytes * 10)
    assert report.peak_device_bytes >= 3 * 12 * x[0].nbytes  # 3 images of 10 + 2 rows


class _NoImages:
    """A real cl.Device that reports no image support (everything else is the real one's)."""

    def __init__(self, real):
        self._real = real

    image_support = False

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_a_device_without_images_says_so_before_any_work(device, monkeypatch):
    if device.backend != "opencl":
        pytest.skip("an OpenCL device's image support")
    kernel = device.compile(ROWS, "rows")  # built by the real device
    monkeypatch.setattr(device, "cl_device", _NoImages(device.cl_device))
    monkeypatch.setattr(device, "_image_limits", None)  # asked again, of the wrapped device
    watch = _Watch(monkeypatch, device)
    with pytest.raises(InputError, match=r"has no image support: stream the array as a plain "
                                         r"input"):
        cv.stream(kernel, [cv.image(np.zeros((4, 4), np.float32))], [np.int64],
                  device=device)
    assert watch.calls == []
