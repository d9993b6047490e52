"""Arrays with fewer elements per block than input 0 (one value per row, a per-block record,
a ratio output, a narrow chain temp) against a kernel that keeps to the documented ``i < n``:
``n`` counts input 0's elements, so before this a kernel wrote past such an array's buffer.
Used in place (zero-copy, on PoCL) that was past the caller's array: rows of later blocks
and, at the last block, the heap (the process aborted: "malloc(): unaligned tcache chunk")."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from streamkit import in_use

import conveyor as cv
from conveyor.pipeline.plan import ArraySpec

# Writes n values: as many as input 0 has elements in the block, whatever y's shape.
FILL = cv.portable("""
__kernel void fill(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (float)(offset + i);
}
""")


def _wrap_acquire(monkeypatch, device) -> list[int]:
    sizes: list[int] = []
    real = device.memory_pool.acquire

    def acquire(nbytes, *args, **kwargs):
        sizes.append(nbytes)
        return real(nbytes, *args, **kwargs)

    monkeypatch.setattr(device.memory_pool, "acquire", acquire)
    return sizes


def test_a_narrow_output_is_not_used_in_place_and_its_device_buffer_holds_n(device,
                                                                            monkeypatch):
    x = np.zeros((9_001, 3), np.float32)
    y = np.full(9_001, -1, np.float32)
    sizes = _wrap_acquire(monkeypatch, device)
    report = cv.stream(device.compile(FILL, "fill"), [x], [y], device=device,
                       block_bytes=12_000)
    assert not report.zero_copy  # auto: never in place when n runs past an array
    rows = report.block_rows
    assert min(sizes) >= rows * 3 * 4  # every slot buffer holds n float32
    # Each block wrote its own rows: y[lo + j] = offset + j (offset = lo * 3 elements).
    lo = np.arange(9_001) // rows * rows
    np.testing.assert_array_equal(y, (lo * 3 + np.arange(9_001) - lo).astype(np.float32))
    assert in_use(device) == (0, 0)


def test_zero_copy_true_with_a_narrow_output_is_an_input_error(device):
    if not device.host_unified:
        pytest.skip("zero-copy needs a device that shares memory with the host")
    x = np.zeros((100, 3), np.float32)
    y = np.zeros(100, np.float32)
    with pytest.raises(cv.InputError, match=r"fewer elements per block than input 0 "
                                            r"\(output 0 has fewer\)"):
        cv.stream(device.compile(FILL, "fill"), [x], [y], device=device, zero_copy=True)


def test_a_narrow_chain_temp_is_padded_to_n(device, monkeypatch):
    x = np.arange(3_000, dtype=np.float32).reshape(1_000, 3)
    y = np.zeros((1_000, 3), np.float32)
    fill = device.compile(FILL, "fill")
    copy = device.compile(cv.portable("""
    __kernel void copy(__global const float *t, __global float *y, ulong offset, ulong n) {
        ulong i = get_global_id(0);
        if (i < n) y[i] = t[i];
    }"""), "copy")
    sizes = _wrap_acquire(monkeypatch, device)
    chain = cv.chain([fill, copy], temps=[((1,), np.float32)])  # 1 element a row, n is 3
    report = cv.stream(chain, [x], [y], device=device, block_bytes=1_200)
    assert min(sizes) >= report.block_rows * 3 * 4
    with pytest.raises(cv.InputError, match="holds no elements"):
        cv.chain([fill, copy], temps=[((0,), np.float32)])


def test_device_bytes_of_an_array_never_fall_below_n():
    first = ArraySpec((100, 4), np.dtype(np.float32))
    narrow = ArraySpec((100,), np.dtype(np.float64))
    assert narrow.device_bytes(10, 10, first) == 10 * 4 * 8
    assert narrow.narrower_than(first, 10)
    assert not first.narrower_than(first, 10)
    wide = ArraySpec((100, 8), np.dtype(np.int8))
    assert wide.device_bytes(12, 10, first) == 12 * 8  # its own rows when they are more


def test_the_narrow_output_case_no_longer_corrupts_the_heap(device, tmp_path):
    # The case that aborted the process on PoCL (zero-copy, auto): in a child process, so a
    # corrupted heap cannot take the test run down with it.
    script = tmp_path / "narrow.py"
    script.write_text(textwrap.dedent(f"""
        import numpy as np, conveyor as cv
        dev = cv.device({device.spec!r})
        k = dev.compile({FILL!r}, "fill")
        for _ in range(3):
            x = np.zeros((10_000, 3), np.float32)
            y = np.zeros(10_000, np.float32)
            cv.stream(k, [x], [y], device=dev, block_bytes=12_000)
        print("ok")
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
