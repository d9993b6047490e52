"""Round fifteen: what the lead found beside the helpers' reports (each test fails on the code
before its fix).

- A ``.npy`` saved from a Fortran-ordered array of shape (N, 1) or (1, N) was refused as
  "Fortran-ordered", though its bytes are the same in either order: only shapes with two or
  more axes longer than 1 have a different layout.
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

INC = """__kernel void inc(__global const float *x, __global float *y, ulong offset, ulong n)
{ ulong i = get_global_id(0); if (i < n) y[i] = x[i] + 1.0f; }"""


@pytest.mark.parametrize("shape", [(12, 1), (1, 12), (12,)])
def test_a_fortran_ordered_npy_with_one_long_axis_streams(device, tmp_path, shape):
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernel")
    values = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(shape))
    path = tmp_path / "f.npy"
    np.save(path, values)
    out = np.zeros(shape, np.float32)
    cv.stream(device.compile(INC, "inc"), [str(path)], [out], device=device)
    np.testing.assert_array_equal(out, values + 1)
    assert_clean(device)


def test_a_fortran_ordered_npy_of_two_long_axes_is_refused(device, tmp_path):
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernel")
    path = tmp_path / "f.npy"
    np.save(path, np.asfortranarray(np.zeros((3, 4), np.float32)))
    with pytest.raises(InputError, match="Fortran-ordered"):
        cv.stream(device.compile(INC, "inc"), [str(path)], [np.zeros((3, 4), np.float32)],
                  device=device)
    assert_clean(device)


@pytest.mark.parametrize("kind", ["npy", "raw"])
def test_a_file_input_of_another_dtype_is_told_how_to_convert_the_file(device, tmp_path, kind):
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernel")
    values = np.arange(12, dtype=np.float64)
    if kind == "npy":
        path = tmp_path / "d.npy"
        np.save(path, values)
        given: object = str(path)
    else:
        path = tmp_path / "d.raw"
        values.tofile(path)
        given = cv.raw(str(path), np.float64)
    with pytest.raises(InputError) as caught:
        cv.stream(device.compile(INC, "inc"), [given], [np.zeros(12, np.float32)],
                  device=device)
    message = str(caught.value)
    assert str(path) in message and "astype(np.float32)" in message, message
    assert "a.astype" not in message, message
    assert_clean(device)


def test_iterate_chunks_that_are_the_outputs_own_rows_stream_in_place(device):
    """guard (beside round fifteen's refusal of chunks that view an output): chunks that are
    exactly the output's own rows, with no halo, are an in-place stream, read before written."""
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernel")
    a = np.arange(10_000, dtype=np.float32)
    chunks = (a[s:s + 3000] for s in range(0, len(a), 3000))
    cv.stream(device.compile(INC, "inc"), [cv.iterate(chunks, length=len(a))], [a],
              device=device, block_bytes=4000)
    np.testing.assert_array_equal(a, np.arange(10_000, dtype=np.float32) + 1)
    assert_clean(device)


def test_a_bool_file_over_two_devices_is_checked_as_it_is_read(pair, tmp_path):
    """Round fifteen: bool bytes other than 0 and 1 in a file input are refused on every way
    in, a stream over two devices too (its readers are shared by the devices' engines)."""
    raw = np.tile(np.array([0, 1, 2], np.uint8), 4000)
    raw.tofile(tmp_path / "b.raw")
    src = """__kernel void cnt(__global const bool *x, __global int *y, ulong offset, ulong n)
    { ulong i = get_global_id(0); if (i < n) y[i] = x[i] ? 1 : 0; }"""
    kernels = [d.compile(src, "cnt") for d in pair]
    with pytest.raises(InputError, match="other than 0 and 1"):
        cv.stream(kernels[0], [cv.raw(tmp_path / "b.raw", np.bool_)], [np.int32],
                  device=list(pair), block_bytes=4000)
    good = np.tile(np.array([0, 1, 1], np.uint8), 4000)
    good.tofile(tmp_path / "b.raw")
    report = cv.stream(kernels[0], [cv.raw(tmp_path / "b.raw", np.bool_)], [np.int32],
                       device=list(pair), block_bytes=4000)
    assert int(report.outputs[0].sum()) == 8000
    for d in pair:
        assert_clean(d)


def test_a_callable_sum_of_python_bools_counts_them(device):
    """Round fifteen: a callable ``reduce="sum"`` whose one block returned Python's ``True``
    gave ``True``; over several blocks, bools are counted (1 each), as ``np.sum`` counts."""
    if device.backend != "opencl":
        pytest.skip("the callable reads PyOpenCL arrays")

    def any_positive(x, *, queue, offset, n):
        return bool((x.get(queue=queue) > 0).any())

    x = np.ones(100, np.float32)
    one = cv.stream(any_positive, [x], device=device, reduce="sum").result
    assert one == 1 and type(one) is int, repr(one)
    many = cv.stream(any_positive, [x], device=device, reduce="sum", block_bytes=40).result
    assert many == 10 and type(many) is int
    assert_clean(device)


def test_a_whole_number_written_as_a_float_reaches_a_long_parameter_exactly(tmp_path,
                                                                             monkeypatch):
    """Round fifteen: ``--arg 9007199254740993.0`` for a ``long`` parameter went through
    float64 and arrived as ...992; a whole number past 2**53 arrives exactly."""
    from conveyor.cli import main

    opencl = [d for d in cv.devices() if d.backend == "opencl"]
    if not opencl:
        pytest.skip("no OpenCL device")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.cl").write_text(
        "__kernel void put(__global const uchar *x, __global long *y, long v, ulong offset, "
        "ulong n) { ulong i = get_global_id(0); if (i < n) y[i] = v; }")
    np.save(tmp_path / "x.npy", np.zeros(3, np.uint8))
    for text, want in (("9007199254740993.0", 9007199254740993),
                       ("-9007199254740993.00", -9007199254740993), ("3.7", 3)):
        code = main(["map", "k.cl", "--kernel", "put", "--device", opencl[0].spec, "-q",
                     "-i", "x.npy", "-o", "y.npy", "--force", f"--arg={text}"])
        assert code == 0
        assert np.load(tmp_path / "y.npy").tolist() == [want] * 3, text


def test_a_link_figure_in_a_folder_others_may_write_is_not_read(tmp_path, monkeypatch):
    """Round fifteen: the link-bandwidth file was read from the cache folder even where the
    kernel cache refuses that folder (others may write it): a planted figure changed every
    report's ratios. It is read only from a folder the kernel cache would use."""
    from conveyor.trace import ceiling

    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(folder))
    ceiling.save_link_ceiling("opencl:0:0", "dev", {"pinned_h2d_gbps": 12.5})
    assert ceiling.link_ceiling("opencl:0:0", "dev").h2d_gbps == 12.5
    folder.chmod(0o777)  # anyone may now replace the file
    assert ceiling.link_ceiling("opencl:0:0", "dev") is None
    folder.chmod(0o700)
