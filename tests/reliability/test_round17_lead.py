"""Round seventeen: what the lead fixed beside the helpers' reports (each test fails on the code
before its fix).

- Round sixteen's known ones: a ``__constant`` input's blocks were not capped at the device's
  constant buffer size (a driver may fail such a launch; where it cannot be, a warning); a
  default plan ignored
  the pinned pool's ``limit`` (OutOfMemoryError every time); blocks given back to a pool
  after ``device.close()`` were held for good. Here: the same over several devices and in a
  chain, the refusal when not one row fits, and a pool used again after close() holding again.
"""

from __future__ import annotations

import gc
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

FROM_CONSTANT = """__kernel void from_constant(__constant float *x, __global float *y, ulong offset,
                            ulong n) { ulong i = get_global_id(0); if (i < n) y[i] = x[i] * 2.0f; }
__kernel void twice(__global const float *x, __global float *y, ulong offset, ulong n)
{ ulong i = get_global_id(0); if (i < n) y[i] = x[i] * 2.0f; }
__kernel void plus_table(__constant float *x, __global float *y, __constant float *t,
                         ulong offset, ulong n)
{ ulong i = get_global_id(0); if (i < n) y[i] = x[i] + t[i % 4]; }"""


def _opencl(device):
    if device.backend != "opencl":
        pytest.skip("OpenCL C kernel")


def test_constant_input_blocks_over_two_devices_fit_the_smallest_constant_buffer(pair):
    for dev in pair:
        _opencl(dev)
    kernel = pair[0].compile(FROM_CONSTANT, "from_constant")
    limit = min(dev.max_constant_bytes for dev in pair)
    x = np.arange(limit // 2, dtype=np.float32) / 7  # twice the limit in bytes
    y = np.zeros_like(x)
    report = cv.stream(kernel, [x], [y], device=pair, block_bytes=1 << 20)
    np.testing.assert_array_equal(y, x * 2)
    assert report.block_rows * x.itemsize <= limit


def test_constant_input_read_by_a_chain_link_fits_the_constant_buffer(device):
    _opencl(device)
    chain = cv.chain([device.compile(FROM_CONSTANT, "twice"),
                      device.compile(FROM_CONSTANT, "from_constant")], temps=[np.float32])
    # The temp is read through __constant by the second link: it is a temp, not an input,
    # so only inputs are capped; the first link reads input 0 as __global.
    limit = device.max_constant_bytes
    x = np.arange(limit // 2, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(chain, [x], [y], device=device, block_bytes=limit // 2)
    np.testing.assert_array_equal(y, x * 4)
    chain = cv.chain(cv.link(device.compile(FROM_CONSTANT, "from_constant"), reads="in0",
                             writes="out0"))
    report = cv.stream(chain, [x], [y], device=device, block_bytes=1 << 20)
    np.testing.assert_array_equal(y, x * 2)
    assert report.block_rows * x.itemsize <= limit


def test_a_halo_that_leaves_no_row_of_the_constant_buffer_is_warned_about_by_name(device):
    _opencl(device)
    k = device.compile(FROM_CONSTANT, "from_constant")
    limit = device.max_constant_bytes
    x = np.zeros(limit, np.float32)
    with pytest.warns(RuntimeWarning, match=r"input 0 \(parameter 'x'.*__global const"):
        y = cv.stream(k, [x], [np.float32], device=device, halo=limit // 8).outputs[0]
    np.testing.assert_array_equal(y, x * 2)  # PoCL runs it (a warning, not a refusal)
    with pytest.raises(InputError, match="constant buffer size.*__global const"):
        cv.stream(k, [x], [np.float32], device=device, halo=limit // 12 + 1)
    assert_clean(device)


def test_constant_tables_in_args_count_against_the_constant_buffer(device):
    _opencl(device)
    k = device.compile(FROM_CONSTANT, "plus_table")
    limit = device.max_constant_bytes
    x = np.arange(limit // 4, dtype=np.float32)  # the limit in bytes
    big = np.zeros(limit // 4 + 1, np.float32)
    with pytest.warns(RuntimeWarning, match=r"args\[0\] \(parameter 't'\).*__global const"):
        cv.stream(k, [x], [np.float32], args=(big,), device=device)
    table = np.zeros(limit // 8, np.float32)  # half the constant buffer
    table[:4] = [1, 2, 3, 4]
    y = np.zeros_like(x)
    report = cv.stream(k, [x], [y], args=(table,), device=device, block_bytes=limit)
    np.testing.assert_array_equal(y, x + np.tile(table[:4], len(x) // 4))
    assert report.block_rows * 4 + table.nbytes <= limit
    assert_clean(device)


def test_the_pinned_pools_limit_is_planned_within_over_two_devices(pair):
    for dev in pair:
        _opencl(dev)
    kernel = pair[0].compile(FROM_CONSTANT, "twice")
    x = np.arange(300_000, dtype=np.float32)
    y = np.zeros_like(x)
    old = [dev.pinned_pool.limit for dev in pair]
    try:
        for dev in pair:
            dev.pinned_pool.limit = "1MiB"
            dev.pinned_pool.reset_peak()
        cv.stream(kernel, [x], [y], device=pair, zero_copy=False)
    finally:
        for dev, value in zip(pair, old, strict=True):
            dev.pinned_pool.limit = value
    np.testing.assert_array_equal(y, x * 2)
    assert all(dev.pinned_pool.stats().peak_in_use_bytes <= 2**20 for dev in pair)


def test_a_pool_used_again_after_close_holds_its_blocks_again(device):
    _opencl(device)
    from conveyor.backends import opencl

    platform, index = (int(part) for part in device.spec.split(":")[1:])
    ctx = opencl.Device(device.cl_device, platform, index)  # type: ignore[attr-defined]
    try:
        k = ctx.compile(FROM_CONSTANT, "twice")
        x = np.arange(50_000, dtype=np.float32)
        y = np.zeros_like(x)
        pinned = cv.pinned.empty(1000, np.float32, device=ctx)
        ctx.close()
        del pinned
        gc.collect()
        assert ctx.pinned_pool.stats().held_bytes == 0  # freed as it came back
        cv.stream(k, [x], [y], device=ctx, zero_copy=False, block_bytes=40_000)
        np.testing.assert_array_equal(y, x * 2)
        stats = ctx.pinned_pool.stats()
        assert stats.in_use_bytes == 0 and stats.held_bytes > 0  # kept for the next stream
    finally:
        gc.collect()
        ctx.close()


# -- round fifteen's noticed-and-left messages ----------------------------------------------
@pytest.fixture
def work(tmp_path, monkeypatch):
    """A kernel file and a float32 .npy input in the current folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.cl").write_text(FROM_CONSTANT)
    np.save(tmp_path / "x.npy", np.arange(10, dtype=np.float32))
    return tmp_path


def _cli(argv, capsys) -> tuple[int, str]:
    from conveyor.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("extra, expected", [
    (["--block-bytes", "-0"], "give at least 1 byte"),  # was "'-0' is negative"
    (["--trace", ""], "--trace got an empty file name ''"),  # was "names a folder"
    (["--plot", ""], "--plot got an empty file name ''"),
])
def test_empty_and_minus_zero_options_are_told_plainly(work, capsys, extra, expected):
    code, err = _cli(["map", "k.cl", "--kernel", "twice", "-i", "x.npy", "-o", "y.npy",
                      "-q", *extra], capsys)
    assert code == 2 and expected in err, err
    assert not (work / "y.npy").exists()


def test_an_empty_input_name_is_told_to_name_the_file(work, capsys):
    code, err = _cli(["map", "k.cl", "--kernel", "twice", "-i", "", "-o", "y.npy"], capsys)
    assert code == 2 and "-i '': name the input file" in err, err


def test_measured_figures_are_not_saved_where_they_would_not_be_read(tmp_path):
    from conveyor.trace.ceiling import link_ceiling, save_link_ceiling

    a_file = tmp_path / "cache"
    a_file.write_text("")
    with pytest.raises(InputError, match="is a file, not a folder"):
        save_link_ceiling("opencl:0:0", "dev", {"pinned_h2d_gbps": 1.0}, cache_dir=a_file)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(InputError, match="writable by group or others"):
        save_link_ceiling("opencl:0:0", "dev", {"pinned_h2d_gbps": 1.0}, cache_dir=shared)
    mine = tmp_path / "mine"
    save_link_ceiling("opencl:0:0", "dev", {"pinned_h2d_gbps": 1.0}, cache_dir=mine)
    assert link_ceiling("opencl:0:0", "dev", cache_dir=mine).h2d_gbps == 1.0


def test_absolute_paths_stream_from_a_removed_current_folder(device, tmp_path, monkeypatch):
    # The re-read's: inputs and outputs join the current folder to relative names (not
    # os.path.abspath, which drops link/.. as text); an absolute name must not ask for a
    # current folder that was removed (os.getcwd raises FileNotFoundError).
    np.save(tmp_path / "x.npy", np.arange(10, dtype=np.float32))
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()

    def same(x, y, *, queue, offset, n):
        return x

    report = cv.stream(same, [cv.npy(tmp_path / "x.npy")], [cv.npy_out(tmp_path / "y.npy")],
                       device=device)
    assert report.outputs == [str(tmp_path / "y.npy")]
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), np.arange(10))


def test_chunks_of_one_memory_map_look_up_its_file_once(device, tmp_path, monkeypatch):
    # The re-read's: each cv.iterate chunk of an np.memmap read /proc/self/maps to check the
    # file's size (SIGBUS if cut); chunks of one map share its check.
    from conveyor.pipeline import overlap

    np.save(tmp_path / "m.npy", np.arange(2000, dtype=np.float32))
    m = np.load(tmp_path / "m.npy", mmap_mode="r")
    reads = []
    real = overlap._read_maps
    monkeypatch.setattr(overlap, "_read_maps", lambda: reads.append(1) or real())

    def same(x, y, *, queue, offset, n):
        return x

    y = cv.stream(same, [cv.iterate((m[i:i + 10] for i in range(0, 2000, 10)), length=2000)],
                  [np.float32], device=device, block_bytes=400).outputs[0]
    np.testing.assert_array_equal(y, np.arange(2000))
    assert len(reads) == 1, len(reads)
