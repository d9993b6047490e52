"""Image blocks on CUDA (issue 19 item 2): inputs read through texture objects over CUDA
arrays, the same checks as the OpenCL ones (test_image.py) where CUDA applies: exact nearest
reads of every channel type and count, each addressing mode at the edges against the matching
``boundary=``, linear reads across the halo rows, an image that is also the output, and the
images (and their textures) freed after a failed copy. GPU only: on the GPU machine run

    CONVEYOR_TEST_BACKENDS=cuda CONVEYOR_TEST_KIND=gpu python3 -m pytest -q \\
        tests/pipeline/test_image*.py tests/test_examples.py -k "image or resample"

CUDA kernels take ``cudaTextureObject_t`` in an image input's place (no sampler: the modes are
bound to the texture) and cannot ask it its size, so these kernels take the width (and, for
normalized coordinates, the height: ``block_rows + 2 * halo``) as args."""

from __future__ import annotations

import numpy as np
import pytest
from streamkit import fail_image_copy, image_values, images_made

import conveyor as cv
from conveyor.errors import BackendError, InputError, OutOfMemoryError
from conveyor.pipeline.halo import PAD_MODES

pytestmark = pytest.mark.gpu

# The C type a texture of 1 channel is read as, the output buffer's C type, the vector prefix.
TYPES = {
    "float32": ("float", "float", "float"), "float16": ("float", "float", "float"),
    "int8": ("signed char", "signed char", "char"), "int16": ("short", "short", "short"),
    "int32": ("int", "int", "int"), "uint8": ("unsigned char", "unsigned char", "uchar"),
    "uint16": ("unsigned short", "unsigned short", "ushort"),
    "uint32": ("unsigned int", "unsigned int", "uint"),
}  # fmt: skip
OUT_DTYPES = {"float16": np.float32}
PICK = {1: "v", 2: "(c == 0 ? v.x : v.y)",
        4: "(c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w)"}

INDEX = "unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;"

COPY = """
extern "C" __global__ void copy(cudaTextureObject_t img, {out} *y, unsigned int channels,
                                unsigned int halo, unsigned int w, unsigned long long offset,
                                unsigned long long n) {{
    {index}
    if (i >= n) return;
    unsigned long long pixel = i / channels;
    unsigned int c = i % channels;
    {read} v = tex2D<{read}>(img, (float)(pixel % w) + 0.5f, (float)(pixel / w + halo) + 0.5f);
    y[i] = ({out}){pick};
}}
"""

# A 3 x 3 box sum: the columns past the edges come from the texture, the rows from the halo.
BOX = """
extern "C" __global__ void box(cudaTextureObject_t img, float *y, unsigned int normalized,
                               int w, int h, unsigned long long offset, unsigned long long n) {
    INDEX
    if (i >= n) return;
    int x = i % w, row = i / w + 1;  /* halo = 1 */
    float sum = 0.0f;
    for (int dy = -1; dy <= 1; dy++)
        for (int dx = -1; dx <= 1; dx++) {
            float ax = x + dx + 0.5f, ay = row + dy + 0.5f;
            if (normalized) { ax /= w; ay /= h; }
            sum += tex2D<float>(img, ax, ay);
        }
    y[i] = sum;
}
""".replace("INDEX", INDEX)

# Samples at a quarter pixel right of and below each pixel centre: weights 3/4 and 1/4.
QUARTER = """
extern "C" __global__ void quarter(cudaTextureObject_t img, float *y, int w,
                                   unsigned long long offset, unsigned long long n) {
    INDEX
    if (i < n) y[i] = tex2D<float>(img, i % w + 0.75f, i / w + 1 + 0.75f);
}
""".replace("INDEX", INDEX)

# A kernel written for a buffer input: not what an image input takes on CUDA.
PLAIN = """
extern "C" __global__ void plain(const float *x, float *y, unsigned long long offset,
                                 unsigned long long n) {}
"""


def _copy_kernel(device, dtype, channels):
    scalar, out, vector = TYPES[np.dtype(dtype).name]
    read = scalar if channels == 1 else f"{vector}{channels}"
    source = COPY.format(out=out, read=read, pick=PICK[channels], index=INDEX)
    return device.compile(source, "copy")


@pytest.fixture
def cuda_device(device):
    """A CUDA device (each in turn)."""
    if device.backend != "cuda":
        pytest.skip("CUDA texture objects; OpenCL images: test_image.py")
    return device


def test_every_channel_type_and_count_is_a_format(cuda_device):
    limits = cuda_device.image_limits()
    assert {(c, np.dtype(d)) for c in (1, 2, 4) for d in TYPES} == set(limits.formats)
    assert limits.max_width >= 65536 and limits.max_height >= 32768


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("channels", [1, 2, 4])
def test_nearest_reads_are_exact_for_every_channel_type_and_count(cuda_device, dtype,
                                                                  channels):
    shape = (75, 13) if channels == 1 else (75, 13, channels)
    x = image_values(shape, dtype)
    y = np.zeros(shape, OUT_DTYPES.get(dtype, dtype))
    report = cv.stream(_copy_kernel(cuda_device, dtype, channels), [cv.image(x)], [y],
                       device=cuda_device, args=(channels, 2, 13), halo=2,
                       block_bytes=x[0].nbytes * 8)
    assert report.blocks > 5
    np.testing.assert_array_equal(y, x.astype(y.dtype))


@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", 0])
def test_each_addressing_mode_at_the_edges_is_the_matching_boundary(cuda_device, boundary):
    x = (np.arange(61 * 17) % 97).astype(np.float32).reshape(61, 17)
    y = np.zeros_like(x)
    normalized = boundary in ("reflect", "periodic")  # CUDA's wrap and mirror need it
    report = cv.stream(cuda_device.compile(BOX, "box"),
                       [cv.image(x, normalized=normalized)], [y], device=cuda_device,
                       args=(int(normalized), 17, 8 + 2), halo=1, boundary=boundary,
                       block_bytes=x[0].nbytes * 8)
    assert report.blocks > 5 and report.block_rows == 8  # the image height is 8 + 2 rows
    mode = PAD_MODES.get(boundary, "constant") if isinstance(boundary, str) else "constant"
    p = np.pad(x, 1, mode=mode)
    expected = sum(p[dy : dy + 61, dx : dx + 17] for dy in range(3) for dx in range(3))
    np.testing.assert_array_equal(y, expected)


def test_linear_reads_interpolate_across_the_halo_rows(cuda_device):
    x = np.random.default_rng(3).random((90, 21), dtype=np.float32)
    y = np.zeros_like(x)
    report = cv.stream(cuda_device.compile(QUARTER, "quarter"),
                       [cv.image(x, filter="linear")], [y], device=cuda_device, args=(21,),
                       halo=1, block_bytes=x[0].nbytes * 8)
    assert report.blocks > 5
    p = np.pad(x, ((0, 1), (0, 1)), mode="edge")  # clamp columns, "nearest" rows
    a, b = np.float32(0.75), np.float32(0.25)
    expected = (a * a * p[:-1, :-1] + b * a * p[:-1, 1:] + a * b * p[1:, :-1]
                + b * b * p[1:, 1:])
    # Texture units interpolate with 8-bit fixed-point weights (1/4 and 3/4 are exact).
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_an_image_that_is_also_the_output_runs_in_place(cuda_device):
    x = (np.arange(64 * 5) % 11).astype(np.float32).reshape(64, 5)
    expected = sum(np.pad(x, 1, mode="edge")[a : a + 64, b : b + 5] for a in range(3)
                   for b in range(3))
    cv.stream(cuda_device.compile(BOX, "box"), [cv.image(x)], [x], device=cuda_device,
              args=(0, 5, 8 + 2), halo=1, block_bytes=x[0].nbytes * 8)
    np.testing.assert_array_equal(x, expected)


def test_a_kernel_without_a_texture_object_in_the_images_place_is_refused(cuda_device):
    with pytest.raises(InputError, match=r"takes 'cudaTextureObject_t' in its place"):
        cv.stream(cuda_device.compile(PLAIN, "plain"),
                  [cv.image(np.zeros((4, 4), np.float32))], [np.float32], device=cuda_device)
    with pytest.raises(InputError, match=r"OpenCL and CUDA allow with normalized coordinates "
                                         r"only"):
        cv.stream(cuda_device.compile(BOX, "box"), [cv.image(np.zeros((4, 4), np.float32))],
                  [np.float32], device=cuda_device, args=(0, 4, 6), halo=1,
                  boundary="periodic")


def test_images_and_textures_go_back_after_a_failed_copy(cuda_device, monkeypatch):
    made = images_made(monkeypatch, cuda_device)
    fail_image_copy(monkeypatch, cuda_device, at=4, call="cuMemcpy2DAsync")
    x = np.zeros((200, 8), np.float32)
    with pytest.raises(BackendError, match="injected"):
        cv.stream(cuda_device.compile(BOX, "box"), [cv.image(x)], [np.float32],
                  device=cuda_device, args=(0, 8, 12), halo=1, block_bytes=x[0].nbytes * 10)
    assert len(made) == 3  # one image per slot, each with its texture object
    assert all(image.array is None and image.textures == [] for image in made)


def test_images_made_before_a_failed_one_are_freed(cuda_device, monkeypatch):
    made = images_made(monkeypatch, cuda_device, fail_at=2)
    x = np.zeros((200, 8), np.float32)
    with pytest.raises(OutOfMemoryError):
        cv.stream(cuda_device.compile(BOX, "box"), [cv.image(x)], [np.float32],
                  device=cuda_device, args=(0, 8, 12), halo=1, block_bytes=x[0].nbytes * 10)
    assert len(made) == 2
    assert all(image.array is None for image in made)
