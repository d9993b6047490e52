"""Round forty-six, image blocks and chains after the last sessions' features: struct (record)
temps and records in place through chains, resident tables (read-only, writable, one handle in
two links, a failing link), kernel and callable reductions ending a chain (bool flags, float16
partials), ``cv.rows`` and ``cv.per_block`` outputs of images under a device's image height,
``first_row`` (negative too), file inputs and outputs, two devices; images of every format
with halos wider than the image, column addressing against ``np.pad``, non-contiguous and
Fortran-order arrays, one file given as an image and as a plain input. Every result is
compared with NumPy's.

Tried at length outside this file (seeded scripts under /tmp, every result against NumPy):
2,600 image streams on PoCL (7 dtypes, 1/4 channels, halos 0-11 up to 5x the rows, all four
boundaries with column offsets through the sampler, Fortran/strided/reversed layouts,
``first_row``), 600 on NVIDIA's OpenCL (H100: float16 and 2-channel formats too) and 500
through CUDA texture objects (8 types x 1, 2, 4 channels, normalized reads), 2,300 chains on
PoCL (random dtypes of input, temp and output, row shapes, halos, boundaries, first_row in
-10..9, one or two devices, ratio / per-block outputs, kernel reductions, file, strided and
``cv.iterate`` inputs). All exact.

Found (strict xfails, each asserting the right behaviour):

- A writable ``cv.resident`` table memory-mapped from a file that an output also writes is not
  refused (the README refuses a writable table that shares memory with an output, and takes
  two maps of one file's bytes as one array): with the output another memmap of the file,
  the table's copy-back silently replaced the output's rows; with the output named by path,
  the output's rename replaced the table's counts. ``overlap.check_tables`` compares tables
  with outputs by address only (``np.shares_memory``), never by mapped file.
- An empty ``cv.iterate`` read through a struct pointer (a kernel or a chain link) is refused
  as float32 ("pass a structured array"): ``chunks.adopt_types`` and ``chain._adopt_types``
  lend an untyped iterable only a numeric parameter's dtype, not the struct's records.
- A chain temp of a record dtype laid out as NumPy packs it, for a kernel struct C pads, is
  told to "pass a.astype(np.dtype(..., align=True))": a temp is no array the user has; the
  fix is the dtype given in ``temps=`` (chainbind._check_kernel_link adds "declare temp ...
  in temps=" only for numeric parameters).
- A plain array given to a kernel that reads an image (``read_only image2d_t, sampler_t``) is
  told only that the parameter counts differ ("takes 5 parameters; this stream passes 4"),
  or, where the counts happen to match, to declare ``image2d_t`` "as a pointer to a scalar
  type such as float*": neither says to pass the input as ``cv.image(array)``.
- A halo longer than the block that a wide temp leaves under ``block_bytes=`` is told "the
  chain's temps do not fit the memory limit ... use a larger memory_limit", where no memory
  limit was set and a larger one cannot help (``BoundChain.make_plan`` rewrites every plan
  error the temps cause that way).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    assert_clean,
    first_device_only,  # noqa: F401 (autouse: first device only)
    opencl_c_kernels,  # noqa: F401 (autouse: OpenCL C kernels, skipped on CUDA)
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

_built: dict[tuple[int, str, str], cv.Kernel] = {}


def build(device: cv.Device, source: str, name: str) -> cv.Kernel:
    """``device.compile(source, name)``, once per device, source and name."""
    key = (id(device), source, name)
    if key not in _built or _built[key].device is not device:
        _built[key] = device.compile(source, name)
    return _built[key]


def image_device(device: cv.Device) -> cv.Device:
    """``device`` where it has OpenCL images; the test is skipped elsewhere."""
    try:
        device.image_limits()
    except InputError as exc:
        pytest.skip(f"{device.spec} has no images: {exc}")
    return device


#: np.pad's mode for each boundary= name.
PAD = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}


def padded(x: np.ndarray, h: int, boundary: str | float, columns: int = 0) -> np.ndarray:
    """``x`` with ``h`` rows (and ``columns`` columns) each side under ``boundary``."""
    width = [(h, h), (columns, columns)][: x.ndim] + [(0, 0)] * max(x.ndim - 2, 0)
    if isinstance(boundary, str):
        return np.pad(x, width, mode=PAD[boundary])
    return np.pad(x, width, mode="constant", constant_values=boundary)


# -- records through chains -------------------------------------------------------------------
RECORDS = """
typedef struct { int a; float b; } rec;
typedef struct { double d; char c; } wide;
__kernel void make(__global const float *x, __global rec *r, uint h, uint w, ulong offset,
                   ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { float v = x[i] + x[i + 2 * h * w]; r[i].a = (int)v; r[i].b = v * 0.5f; }
}
__kernel void use(__global const rec *r, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (float)r[i].a + r[i].b;
}
__kernel void bump(__global const rec *r, __global rec *o, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { o[i].a = r[i].a + 1; o[i].b = r[i].b * 2.0f; }
}
__kernel void make_wide(__global const float *x, __global wide *r, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { r[i].d = x[i]; r[i].c = (char)(offset + i); }
}
__kernel void use_wide(__global const wide *r, __global double *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = r[i].d + r[i].c;
}
"""
REC = np.dtype([("a", "i4"), ("b", "f4")], align=True)


@pytest.mark.parametrize("halo", [0, 2])
def test_guard_a_record_temp_between_kernel_links_with_a_halo(device, halo):
    # guard: records made by one link and read by the next, on each block, exact
    x = np.random.default_rng(3).integers(-100, 100, size=(41, 3)).astype(np.float32)
    chain = cv.chain(cv.link(build(device, RECORDS, "make"), "in0", "r", args=(halo, 3)),
                     cv.link(build(device, RECORDS, "use"), "r", "out0"), temps={"r": REC})
    y = np.zeros_like(x)
    cv.stream(chain, [x], [y], halo=halo, device=device, block_bytes=3 * 4 * (halo + 2) * 2)
    p = padded(x, halo, "nearest")
    v = p[:41] + p[2 * halo:2 * halo + 41]
    np.testing.assert_array_equal(y, np.trunc(v).astype(np.int32) + v * 0.5)
    assert_clean(device)


def test_guard_records_in_place_through_a_record_temp(device):
    # guard: a record array that is input and output of a chain, through a record temp
    x = np.random.default_rng(4).integers(-100, 100, size=(41, 3)).astype(np.float32)
    a = np.zeros(x.shape, REC)
    a["a"], a["b"] = x.astype(np.int32), x
    want_a, want_b = a["a"] + 2, a["b"] * 4
    bump = build(device, RECORDS, "bump")
    chain = cv.chain(cv.link(bump, "in0", "t"), cv.link(bump, "t", "out0"), temps={"t": REC})
    cv.stream(chain, [a], [a], device=device, block_bytes=48)
    np.testing.assert_array_equal(a["a"], want_a)
    np.testing.assert_array_equal(a["b"], want_b)


def test_a_packed_record_temp_is_told_to_declare_the_temp_aligned(device):
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    packed = np.dtype([("d", "f8"), ("c", "i1")])  # 9 bytes; C lays struct wide in 16
    chain = cv.chain(cv.link(build(device, RECORDS, "make_wide"), "in0", "t"),
                     cv.link(build(device, RECORDS, "use_wide"), "t", "out0"),
                     temps={"t": packed})
    with pytest.raises(InputError) as info:
        cv.stream(chain, [x], [np.float64], device=device)
    text = str(info.value)
    assert "align=True" in text and "temps=" in text  # the fix, and where it goes
    assert "a.astype" not in text  # no array of the user's to convert


# -- image kernels given plain arrays ---------------------------------------------------------
IMAGES = """
__kernel void pick(read_only image2d_t img, sampler_t s, __global float *y, ulong offset,
                   ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    int w = get_image_width(img);
    y[i] = read_imagef(img, s, (int2)(i % w, i / w)).x;
}
"""


def test_a_plain_array_for_an_image_parameter_is_told_to_pass_cv_image(device):
    device = image_device(device)
    pick = build(device, IMAGES, "pick")
    x = np.ones((4, 3), np.float32)
    with pytest.raises(InputError) as counts:  # the usual mistake: cv.image(x) forgotten
        cv.stream(pick, [x], [np.float32], device=device)
    with pytest.raises(InputError) as matching:  # counts that happen to match
        cv.stream(pick, [x, x], [], reduce="sum", device=device)
    for info in (counts, matching):
        assert "cv.image" in str(info.value), str(info.value)
    # and the right call runs
    report = cv.stream(pick, [cv.image(x)], [np.float32], device=device)
    np.testing.assert_array_equal(report.outputs[0], x)


# -- writable tables and outputs of one file ---------------------------------------------------
HIST = """__kernel void hist(__global const uint *x, __global uint *y, __global uint *counts,
                        ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { atomic_inc(&counts[x[i] % 16]); y[i] = x[i] + 100; }
}"""


@pytest.mark.parametrize("output", ["memmap", "file"])
@pytest.mark.parametrize("chained", [False, True])
def test_a_writable_table_mapped_from_an_outputs_file_is_refused(device, tmp_path, output,
                                                                 chained):
    # The README refuses "a writable resident table that shares memory with an output (its
    # copy-back would overwrite the results)", and takes two memory maps of one file's bytes
    # as one array (in place). A table mapped from counts.npy with the output another map of
    # counts.npy: the output's rows were replaced by the table's copy-back (the file held
    # [1 1 1 ...] for [100 101 102 ...]); with the output given as the path, the output's
    # rename replaced the table's copy-back (the counts were gone from the file).
    hist = build(device, HIST, "hist")
    path = tmp_path / "counts.npy"
    np.save(path, np.zeros(16, np.uint32))
    table = np.load(path, mmap_mode="r+")
    out = np.load(path, mmap_mode="r+") if output == "memmap" else cv.npy_out(path)
    x = np.arange(16, dtype=np.uint32)
    with cv.resident(table, writable=True) as counts:
        compute = (cv.chain(cv.link(hist, "in0", "out0", args=(counts,))) if chained
                   else hist)
        with pytest.raises(InputError, match="writable"):
            cv.stream(compute, [x], [out], args=() if chained else (counts,), device=device)
    assert_clean(device)


# -- an empty iterable of records -------------------------------------------------------------
@pytest.mark.parametrize("chained", [False, True])
def test_an_empty_iterable_read_through_a_struct_pointer_streams_nothing(device, chained):
    # An iterable that yields no chunk takes the type of the kernel parameter that reads it
    # (chunks.adopt_types; chain._adopt_types for a chain, round nineteen), so an empty source
    # of floats streams nothing. For records, the parameter has no NumPy dtype of its own
    # (param.dtype is None), and the stream is refused with advice the caller cannot follow.
    use = build(device, RECORDS, "use")
    compute = cv.chain(cv.link(use, "in0", "out0")) if chained else use
    report = cv.stream(compute, [cv.iterate(iter([]), 0)], [np.float32], device=device)
    assert report.outputs[0].shape == (0,)
    assert_clean(device)


# -- a temp wider than the inputs, under block_bytes= -------------------------------------------
WIDEN = """
__kernel void widen(__global const float *x, __global double *t, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) t[i] = x[i];
}
__kernel void narrow(__global const double *t, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (float)t[i];
}
"""


def test_a_halo_past_a_block_cut_by_a_wide_temp_names_block_bytes(device):
    # block_bytes= is one block of the widest array, a temp included: 36 bytes are 1 row of
    # the float64 temp (24 bytes a row), fewer than halo=3. The InputError of make_plan says
    # so ("use a larger block_bytes ..."), but BoundChain.make_plan (chainbind.py) rewrites
    # every plan error that the temps cause as a memory limit the temps do not fit.
    chain = cv.chain(cv.link(build(device, WIDEN, "widen"), "in0", "t"),
                     cv.link(build(device, WIDEN, "narrow"), "t", "out0"),
                     temps={"t": np.float64})
    x = np.ones((10, 3), np.float32)
    with pytest.raises(InputError) as info:
        cv.stream(chain, [x], [np.float32], halo=3, block_bytes=36, device=device)
    text = str(info.value)
    assert "block_bytes" in text
    assert "do not fit the memory limit" not in text, text  # none was set
    # the larger block_bytes it should name runs
    report = cv.stream(chain, [x], [np.float32], halo=3, block_bytes=3 * 24, device=device)
    np.testing.assert_array_equal(report.outputs[0], x)


# -- guards ------------------------------------------------------------------------------------
POOL3 = """
__kernel void pool3(read_only image2d_t img, sampler_t s, __global float *y, uint h,
                    ulong offset, ulong n) {
    ulong i = get_global_id(0);
    int w = get_image_width(img);
    if (i >= n / 3) return;
    ulong r = i / w, c = i % w;
    y[i] = read_imagef(img, s, (int2)(c, 3 * r + h)).x
         + read_imagef(img, s, (int2)(c, 3 * r + 1 + h)).x
         + read_imagef(img, s, (int2)(c, 3 * r + 2 + h)).x;
}
"""


@pytest.mark.parametrize(("height", "halo", "rows"), [(7, 0, 6), (7, 1, 3), (5, 1, 3), (13, 1, 9)])
def test_guard_a_pooled_image_output_under_a_small_image_height(device, monkeypatch, height,
                                                                 halo, rows):
    # guard: blocks cut by the image height (less 2 halo) and at multiples of a ratio's q
    from dataclasses import replace

    device = image_device(device)
    real = device.image_limits()
    monkeypatch.setattr(device, "image_limits", lambda: replace(real, max_height=height))
    x = np.random.default_rng(5).integers(0, 9, size=(60, 4)).astype(np.float32)
    report = cv.stream(build(device, POOL3, "pool3"), [cv.image(x)],
                       [cv.rows(np.float32, ratio=(1, 3))], args=(halo,), halo=halo,
                       device=device)
    assert report.block_rows == rows
    np.testing.assert_array_equal(report.outputs[0], x[0::3] + x[1::3] + x[2::3])
    assert_clean(device)


FLAGS = """
__kernel void flag(__global const float *x, __global bool *t, float at, long offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) t[i] = x[i] + (float)(offset + (long)i) > at;
}
__kernel void keep(__global const bool *t, __global bool *v, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) v[i] = t[i];
}
"""


def test_guard_a_bool_temp_counted_by_a_chain_over_two_devices(pair):
    # guard: flags in a bool temp, counted by the kernel fold (int64), at a negative
    # first_row, over two devices as on one
    x = np.random.default_rng(6).integers(-50, 50, size=(83, 3)).astype(np.float32)
    want = int((x + (np.arange(x.size) - 60).reshape(x.shape) > 3.0).sum())
    for devices in (pair[0], pair):
        first = devices[0] if isinstance(devices, list) else devices
        chain = cv.chain(cv.link(build(first, FLAGS, "flag"), "in0", "t", args=(3.0,)),
                         cv.link(build(first, FLAGS, "keep"), "t", "reduce"),
                         temps={"t": np.bool_})
        report = cv.stream(chain, [x], reduce="sum", first_row=-20, device=devices,
                           block_bytes=3 * 4 * 7)
        assert report.result == want and isinstance(report.result, int | np.int64)
