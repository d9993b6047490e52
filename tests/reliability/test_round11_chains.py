"""The eleventh round, helper F: chains (temps written twice, halos read by later links, in
place, one link and twenty, reductions, per-block and ratio outputs read by later links,
resident tables, several devices) and image blocks (every boundary and addressing mode, odd
sizes, channels, dtypes, blocks that do not divide the image, several images, views and
files). Every answer is compared with NumPy; real PoCL devices and kernels.

Found (xfail, strict):

- A device array handed to a callable (a chain's link, or a plain callable) is a PyOpenCL
  array over conveyor's own ``cl.Buffer``, which conveyor releases explicitly
  (``cl_buffer.release()``) when the block retires (a zero-copy block's USE_HOST_PTR
  buffer) or when the pool frees the block (``trim()``, the keep budget). Any array that
  outlives that point is a dangling handle: reading it segfaults the process. The common
  way to get one: a callable that raises inside a pytest test, whose failure report reprs
  the callable's arguments from the traceback (a PyOpenCL array's repr reads it back), so
  pytest died with "Fatal Python error: Segmentation fault" and no report at all.
- A chain over several devices hands a callable link's ``cv.resident`` argument to it as the
  handle on the table's own device and as a NumPy copy of the table on every other device
  (``multi._chain_for`` runs ``_args_for`` over every link, callables included). A callable
  on one device, and a plain callable over several, get the handle itself: the same link
  got two types of one argument within one stream, and a callable that reads
  ``handle.array`` ran for one device and not for the other (or read something else).

The rest are guards: cases that held when tried.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import assert_clean, compiled, opencl_c_only, store, to_host  # noqa: E402

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

KERNELS = """
__kernel void inc(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + 1.0f;
}
__kernel void dbl(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}
__kernel void bump(__global float *t, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) t[i] = t[i] + 1.0f;
}
__kernel void add2(__global const float *a, __global const float *b, __global float *y,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = a[i] + b[i];
}
__kernel void center(__global const float *x, __global float *t, ulong cols, ulong h,
                     ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) t[i] = x[i + h * cols];
}
__kernel void ends(__global const float *x, __global const float *t, __global float *y,
                   ulong cols, ulong h, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = t[i] + x[i] + x[i + 2 * h * cols];
}
__kernel void mixed(__global const float *a, __global const float *b, __global float *y,
                  ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = a[i + 1] + b[i] + a[i] + a[i + 2];
}
__kernel void wide(__global const float *x, __global float *t, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) for (int k = 0; k < 4; k++) t[4 * i + k] = x[i] * (float)(k + 1);
}
__kernel void mean(__global const float *x, __global float *r, ulong offset, ulong n) {
    if (get_global_id(0) == 0) {
        float s = 0.0f;
        for (ulong k = 0; k < n; k++) s += x[k];
        r[0] = s / (float)n;
        r[1] = (float)n;
    }
}
__kernel void less(__global const float *x, __global const float *r, __global float *y,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] - r[0];
}
__kernel void up2(__global const float *x, __global float *u, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { u[2 * i] = x[i]; u[2 * i + 1] = -x[i]; }
}
__kernel void down2(__global const float *u, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 10.0f * u[2 * i] + u[2 * i + 1];
}
__kernel void pool2(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n / 2) y[i] = x[2 * i] + x[2 * i + 1];
}
__kernel void hist(__global const float *x, __global int *counts, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) atomic_add(&counts[((int)x[i]) % 8], 1);
}
__kernel void lut(__global const float *x, __global float *y, __global const float *t,
                  ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + t[(offset + i) % 4];
}
"""

PADS = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}


def k(device: cv.Device, name: str) -> cv.Kernel:
    return compiled(device, KERNELS, name)


def padded(x: np.ndarray, halo: int, boundary) -> np.ndarray:
    """``x`` with ``halo`` rows of ``boundary`` before and after (axis 0), as np.pad."""
    widths = ((halo, halo),) + ((0, 0),) * (x.ndim - 1)
    if boundary in PADS:
        return np.pad(x, widths, mode=PADS[boundary])
    return np.pad(x, widths, constant_values=boundary)


def values(n: int) -> np.ndarray:
    return (np.arange(n, dtype=np.float32) % 113).astype(np.float32)


# == chains =================================================================================
# -- found ----------------------------------------------------------------------------------
def test_a_callable_link_gets_its_resident_arg_as_given_on_every_device(pair):
    x = values(20_000)
    table = np.array([5, 6, 7, 8], np.float32)
    seen: list[str] = []

    def add_first(t, y, handle, *, queue, offset, n):
        seen.append(type(handle).__name__)
        # handle.array raised AttributeError on the second device; read either, so that the
        # failure below is the assertion (no device array in the traceback's frames: see
        # the crash test below)
        first = np.asarray(getattr(handle, "array", handle))[0]
        store(y, to_host(t, queue) + first, queue)

    with cv.resident(table) as handle:
        for where in (pair[0], pair):  # one device, then two: the same answer, the same type
            seen.clear()
            y = np.zeros_like(x)
            chain = cv.chain(cv.link(k(pair[0], "dbl"), "in0", "t0"),
                             cv.link(add_first, "t0", "out0", args=(handle,)),
                             temps=[np.float32])
            cv.stream(chain, [x], [y], device=where, block_bytes=4000, warmup=False)
            np.testing.assert_array_equal(y, 2 * x + 5)
            assert set(seen) == {"Resident"}, where


KEEPS = '''
import sys
import numpy as np
import conveyor as cv

dev = cv.device(sys.argv[1])
dbl = dev.compile(cv.portable("""__kernel void dbl(__global const float *x, __global float *y,
    ulong offset, ulong n) { ulong i = get_global_id(0); if (i < n) y[i] = 2.0f * x[i]; }"""),
    "dbl")
x = np.arange(20_000, dtype=np.float32)
y = np.zeros_like(x)
kept = []

def keep(t, out, *, queue, offset, n):
    kept.append(out)  # as a traceback's frame keeps a failed callable's arguments
    if offset >= 3000:
        raise ZeroDivisionError("a late block")
    return t

chain = cv.chain(cv.link(dbl, "in0", "t0"), cv.link(keep, "t0", "out0"), temps=[np.float32])
try:
    cv.stream(chain, [x], [y], device=dev, block_bytes=4000, warmup=False)
except ZeroDivisionError:
    pass
dev.memory_pool.trim()  # pool blocks are released as a zero-copy block's buffer was
try:
    repr(kept[-1])  # what pytest's report of the failure does (repr_args): reads the array
except Exception as exc:  # a Python error is fine; the process must live
    print("raised", type(exc).__name__)
print("alive")
'''


def test_a_device_array_a_callable_link_kept_does_not_crash_the_process(device, tmp_path):
    """A callable link raised at block 3; its arguments live on in the traceback's frames
    (pytest's failure report reprs them: a PyOpenCL array's repr reads it back). The output
    ``out0`` was used in place (zero-copy) through a USE_HOST_PTR buffer that the stream
    releases explicitly as it ends, and a pool block trimmed later is released the same
    way, so the array's buffer is freed under it: the process died of SIGSEGV (a failing
    callable inside a pytest test took the whole run down with "Fatal Python error:
    Segmentation fault" and no report)."""
    if device.backend != "opencl":
        pytest.skip("PyOpenCL device arrays")
    import subprocess

    script = tmp_path / "keeps.py"
    script.write_text(KEEPS)
    done = subprocess.run([sys.executable, str(script), device.spec], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ))
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "alive" in done.stdout


# -- guards: temps, halos, order -------------------------------------------------------------
@pytest.mark.parametrize("zero_copy", [None, False])
def test_guard_a_temp_written_by_several_links_in_turn(device, zero_copy):
    # guard: a temp written four times (read and written by one link, written by a link
    # that reads nothing) holds the last value at the link that reads it; so does an output
    opencl_c_only(device)
    x = values(10_007)
    y = np.zeros_like(x)
    chain = cv.chain(cv.link(k(device, "dbl"), "in0", "t0"),
                     cv.link(k(device, "inc"), "t0", "t0"),
                     cv.link(k(device, "bump"), (), "t0"),
                     cv.link(k(device, "dbl"), "t0", "t0"),
                     cv.link(k(device, "inc"), "t0", "out0"), temps=[np.float32])
    cv.stream(chain, [x], [y], device=device, block_bytes=4000, zero_copy=zero_copy)
    np.testing.assert_array_equal(y, (2 * x + 2) * 2 + 1)
    # an output written twice, read between: the last write is the output's
    y[:] = 0
    chain = cv.chain(cv.link(k(device, "dbl"), "in0", "out0"),
                     cv.link(k(device, "inc"), "out0", "t0"),
                     cv.link(k(device, "dbl"), "t0", "out0"), temps=[np.float32])
    cv.stream(chain, [x], [y], device=device, block_bytes=4000, zero_copy=zero_copy)
    np.testing.assert_array_equal(y, (2 * x + 1) * 2)


@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", 2.5])
def test_guard_the_halo_read_by_the_second_link_only(device, boundary):
    # guard: link 0 ignores the halo rows (reads each row's centre into a temp), link 1 reads
    # the rows h before and after from the input again
    opencl_c_only(device)
    x = (np.arange(1003 * 3, dtype=np.float32) % 17).reshape(1003, 3)
    h = 2
    p = padded(x, h, boundary)
    y = np.zeros_like(x)
    chain = cv.chain(cv.link(k(device, "center"), "in0", "t0", args=(3, h)),
                     cv.link(k(device, "ends"), ("in0", "t0"), "out0", args=(3, h)),
                     temps=[np.float32])
    cv.stream(chain, [x], [y], device=device, halo=h, boundary=boundary,
              block_bytes=3 * 4 * 97)
    np.testing.assert_array_equal(y, p[h:h + 1003] + p[:1003] + p[2 * h:2 * h + 1003])


def test_guard_reads_in_an_order_no_link_can_run_are_refused(device):
    # guard: a temp read before it is written (also by the link that writes it), an output
    # read by a link before the later link that writes it: InputError before any work
    opencl_c_only(device)
    x = values(100)
    y = np.full_like(x, 7)
    cases = [
        (cv.chain(cv.link(k(device, "add2"), ("in0", "t0"), "t0"),
                  cv.link(k(device, "inc"), "t0", "out0"), temps=[np.float32]), "'t0'"),
        (cv.chain(cv.link(k(device, "add2"), ("in0", "out1"), "out0"),
                  cv.link(k(device, "inc"), "in0", "out1")), "'out1'"),
    ]
    for chain, name in cases:
        with pytest.raises(InputError, match=rf"link 0 .* reads {name}, which no earlier link "
                                             r"writes"):
            cv.stream(chain, [x], [y, np.zeros_like(x)], device=device)
    assert (y == 7).all()


# -- guards: in place --------------------------------------------------------------------------
@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", 0.5])
@pytest.mark.parametrize("zero_copy", [None, False])
def test_guard_a_chain_in_place_with_a_halo(device, boundary, zero_copy):
    # guard: in == out with halo 2, the output written by the first link and the input read
    # again (halo rows included) by the second: NumPy's answer on every path
    opencl_c_only(device)
    x0 = (np.arange(1003 * 3, dtype=np.float32) % 17).reshape(1003, 3)
    h = 2
    p = padded(x0, h, boundary)
    want = p[h:h + 1003] + p[:1003] + p[2 * h:2 * h + 1003]
    for chain in (cv.chain(cv.link(k(device, "center"), "in0", "t0", args=(3, h)),
                           cv.link(k(device, "ends"), ("in0", "t0"), "out0", args=(3, h)),
                           temps=[np.float32]),
                  cv.chain(cv.link(k(device, "center"), "in0", "out0", args=(3, h)),
                           cv.link(k(device, "ends"), ("in0", "out0"), "out0", args=(3, h)))):
        a = x0.copy()
        cv.stream(chain, [a], [a], device=device, halo=h, boundary=boundary,
                  block_bytes=3 * 4 * 97, zero_copy=zero_copy)
        np.testing.assert_array_equal(a, want)


@pytest.mark.parametrize("halo", [0, 1])
@pytest.mark.parametrize("zero_copy", [None, False])
def test_guard_a_chain_that_swaps_two_arrays_in_place(device, halo, zero_copy):
    # guard: inputs=[a, b], outputs=[b, a]; link 1 reads b after link 0 wrote it (as out0)
    opencl_c_only(device)
    a0 = np.arange(5000, dtype=np.float32)
    b0 = a0 * 3 + 1
    a, b = a0.copy(), b0.copy()
    if halo:
        ap, bp = np.pad(a0, 1, mode="edge"), np.pad(b0, 1, mode="edge")
        want_b = ap[1:-1] + bp[:-2] + ap[:-2] + ap[2:]  # mixed(a, b): b's index i is row i - 1
        want_a = 2 * (bp[1:-1] + ap[:-2] + bp[:-2] + bp[2:])
        first = second = k(device, "mixed")
    else:
        want_b, want_a = a0 + b0, 2 * (b0 + a0)
        first = second = k(device, "add2")
    chain = cv.chain(cv.link(first, ("in0", "in1"), "out0"),
                     cv.link(second, ("in1", "in0"), "t"),
                     cv.link(k(device, "dbl"), "t", "out1"), temps={"t": np.float32})
    cv.stream(chain, [a, b], [b, a], device=device, block_bytes=400, zero_copy=zero_copy,
              halo=halo)
    np.testing.assert_array_equal(b, want_b)
    np.testing.assert_array_equal(a, want_a)


# -- guards: one link, twenty links ------------------------------------------------------------
def test_guard_a_chain_of_one_link_is_the_kernel(device):
    # guard: cv.chain(k), cv.chain([k]) and cv.chain(cv.link(k, ...)) equal cv.stream(k)
    opencl_c_only(device)
    x = values(10_007)
    for chain in (cv.chain(k(device, "inc")), cv.chain([k(device, "inc")]),
                  cv.chain(cv.link(k(device, "inc"), "in0", "out0"))):
        y = np.zeros_like(x)
        cv.stream(chain, [x], [y], device=device, block_bytes=4000)
        np.testing.assert_array_equal(y, x + 1)


def test_guard_twenty_links_of_one_kernel_object_on_one_and_two_devices(pair):
    # guard: one Kernel object in 20 linear links (19 temps), each link titled apart
    x = values(20_000)
    chain = cv.chain([k(pair[0], "inc")] * 20, temps=[np.float32] * 19)
    for where in (pair[0], pair):
        y = np.zeros_like(x)
        report = cv.stream(chain, [x], [y], device=where, block_bytes=4000)
        np.testing.assert_array_equal(y, x + 20)
        labels = {s.label for s in report.timeline.spans if s.lane == "compute"}
        assert labels == {"inc"} | {f"inc#{i}" for i in range(2, 21)}


# -- guards: reductions and records at the end -------------------------------------------------
def test_guard_kernel_reductions_ending_a_chain_with_a_halo(device):
    # guard: the last link folds values made from the input's halo rows and a temp
    opencl_c_only(device)
    x = (np.arange(1003 * 3, dtype=np.float32) % 17).reshape(1003, 3)
    h = 1
    p = padded(x, h, "nearest")
    want = p[h:h + 1003] + p[:1003] + p[2 * h:2 * h + 1003]
    chain = cv.chain(cv.link(k(device, "center"), "in0", "t0", args=(3, h)),
                     cv.link(k(device, "ends"), ("in0", "t0"), "reduce", args=(3, h)),
                     temps=[np.float32])
    for op in ("sum", "min", "max"):
        report = cv.stream(chain, [x], reduce=op, device=device, halo=h,
                           block_bytes=3 * 4 * 97)
        assert report.result == getattr(want.astype(np.float64), op)(), op


def test_guard_a_reduction_with_a_ratio_output_beside_it_over_two_devices(pair):
    x = values(20_000)
    chain = cv.chain(cv.link(k(pair[0], "dbl"), "in0", "t0"),
                     cv.link(k(pair[0], "pool2"), "t0", "out0"),
                     cv.link(k(pair[0], "add2"), ("t0", "in0"), "reduce"), temps=[np.float32])
    report = cv.stream(chain, [x], [cv.rows(np.float32, ratio=(1, 2))], reduce="sum",
                       device=pair, block_bytes=4000)
    assert report.result == (3 * x).astype(np.float64).sum()
    np.testing.assert_array_equal(report.outputs[0], (2 * x).reshape(-1, 2).sum(axis=1))


def test_guard_a_per_block_record_read_by_a_later_link(device):
    # guard: link 0 writes each block's mean into a cv.per_block record; link 1 reads the
    # record (a device buffer of one record) to centre the block
    opencl_c_only(device)
    x = values(10_007)
    chain = cv.chain(cv.link(k(device, "mean"), "in0", "out0"),
                     cv.link(k(device, "less"), ("in0", "out0"), "out1"))
    report = cv.stream(chain, [x], [cv.per_block((2,), np.float32), np.float32],
                       device=device, block_bytes=4000)
    records, y = report.outputs
    assert len(records) == len(report.block_ranges) == 11
    for record, (lo, hi) in zip(records, report.block_ranges, strict=True):
        assert record[1] == hi - lo
        np.testing.assert_array_equal(y[lo:hi], x[lo:hi] - record[0])


def test_guard_an_upsampled_output_read_by_a_later_link(device):
    # guard: a cv.rows(ratio=(2, 1)) output written by a kernel or returned by a callable,
    # then read by the next link
    opencl_c_only(device)
    import pyopencl.array as cla

    x = values(10_007)

    def up(a, u, *, queue, offset, n):
        return cla.to_device(queue, np.repeat(to_host(a, queue), 2))

    for first, second in ((k(device, "up2"), 9 * x), (up, 11 * x)):
        chain = cv.chain(cv.link(first, "in0", "out0"),
                         cv.link(k(device, "down2"), "out0", "out1"))
        report = cv.stream(chain, [x], [cv.rows(np.float32, ratio=(2, 1)), np.float32],
                           device=device, block_bytes=4000)
        np.testing.assert_array_equal(report.outputs[1], second)
        assert report.outputs[0].shape == (2 * len(x),)


def test_guard_a_temp_wider_than_input_rows_between_a_kernel_and_a_callable(device):
    # guard: a ((4,), float32) temp per float32 element of input 0
    opencl_c_only(device)
    x = values(10_007)

    def row_sums(t, y, *, queue, offset, n):
        store(y, to_host(t, queue).sum(axis=1, dtype=np.float32), queue)

    y = np.zeros_like(x)
    cv.stream(cv.chain(cv.link(k(device, "wide"), "in0", "t"), cv.link(row_sums, "t", "out0"),
                       temps={"t": ((4,), np.float32)}), [x], [y], device=device,
              block_bytes=4000)
    np.testing.assert_array_equal(y, 10 * x)


# -- guards: resident tables -------------------------------------------------------------------
def test_guard_one_writable_table_counted_into_by_two_links(device):
    opencl_c_only(device)
    x = values(10_007)
    counts = np.zeros(8, np.int32)
    y = np.zeros_like(x)
    with cv.resident(counts, writable=True) as t:
        chain = cv.chain(cv.link(k(device, "hist"), "in0", (), args=(t,)),
                         cv.link(k(device, "dbl"), "in0", "t0"),
                         cv.link(k(device, "hist"), "t0", (), args=(t,)),
                         cv.link(k(device, "inc"), "t0", "out0"), temps=[np.float32])
        cv.stream(chain, [x], [y], device=device, block_bytes=4000)
    want = (np.bincount(x.astype(np.int64) % 8, minlength=8)
            + np.bincount((2 * x).astype(np.int64) % 8, minlength=8))
    np.testing.assert_array_equal(counts, want)
    np.testing.assert_array_equal(y, 2 * x + 1)


def test_guard_one_kernel_with_another_table_in_each_link_on_two_devices(pair):
    # guard: also with first_row (the tables are read at the whole array's offset)
    x = values(20_000)
    table = np.array([1, 2, 3, 4], np.float32)
    index = (np.arange(len(x)) + 3) % 4
    want = x + table[index] + 2 * table[index]
    with cv.resident(table * 2) as doubled:
        chain = cv.chain(cv.link(k(pair[0], "lut"), "in0", "t0", args=(table,)),
                         cv.link(k(pair[0], "lut"), "t0", "out0", args=(doubled,)),
                         temps=[np.float32])
        for where in (pair[0], pair):
            y = np.zeros_like(x)
            cv.stream(chain, [x], [y], device=where, block_bytes=4000, first_row=3)
            np.testing.assert_array_equal(y, want)


def test_guard_a_device_array_in_a_chain_over_two_devices_is_refused(pair):
    # guard: a PyOpenCL array of the first device's context in a link's args, over two
    # devices: an InputError before any work. Held only since this round's context check in
    # resident._device_array: before it, two PoCL platforms gave a raw BackendError
    # (clEnqueueNDRangeKernel: OUT_OF_RESOURCES) from the second device's launch, where a
    # single kernel over two devices says "a device array in args= lives on one device".
    import pyopencl as cl
    import pyopencl.array as cla

    if pair[0].backend != "opencl":
        pytest.skip("a PyOpenCL device array")
    queue = cl.CommandQueue(pair[0].context)
    table = cla.to_device(queue, np.array([1, 2, 3, 4], np.float32))
    queue.finish()
    x = values(20_000)
    y = np.full_like(x, 7)
    chain = cv.chain(cv.link(k(pair[0], "lut"), "in0", "t0", args=(table,)),
                     cv.link(k(pair[0], "inc"), "t0", "out0"), temps=[np.float32])
    with pytest.raises(InputError, match=r"link 0 .*args\[0\]"):
        cv.stream(chain, [x], [y], device=pair, block_bytes=4000)
    assert (y == 7).all()
    del table
    queue.finish()


# -- guards: files and failures over two devices -----------------------------------------------
def test_guard_a_chain_between_files_and_a_failing_link_over_two_devices(pair, tmp_path):
    x = values(20_000)
    np.save(tmp_path / "x.npy", x)
    chain = cv.chain(cv.link(k(pair[0], "dbl"), "in0", "t0"),
                     cv.link(k(pair[0], "add2"), ("t0", "in0"), "out0"),
                     cv.link(k(pair[0], "inc"), "t0", "out1"), temps=[np.float32])
    cv.stream(chain, [tmp_path / "x.npy"], [tmp_path / "y.npy", tmp_path / "z.npy"],
              device=pair, block_bytes=4000)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), 3 * x)
    np.testing.assert_array_equal(np.load(tmp_path / "z.npy"), 2 * x + 1)

    def fails_late(t, y, *, queue, offset, n):
        if offset >= 3000:
            raise ZeroDivisionError("link 1 at a late block")
        store(y, to_host(t, queue), queue)

    chain = cv.chain(cv.link(k(pair[0], "dbl"), "in0", "t0"), cv.link(fails_late, "t0", "out0"),
                     temps=[np.float32])
    with pytest.raises(ZeroDivisionError, match="late block"):
        cv.stream(chain, [tmp_path / "x.npy"], [tmp_path / "w.npy"], device=pair,
                  block_bytes=4000)
    assert sorted(os.listdir(tmp_path)) == ["x.npy", "y.npy", "z.npy"]
    gc.collect()
    for dev in pair:
        assert_clean(dev)


# == image blocks ===========================================================================
BOXN = """
__kernel void boxn(read_only image2d_t img, sampler_t s, __global float *y, uint channels,
                   uint halo, uint normalized, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    int w = get_image_width(img), h = get_image_height(img);
    ulong pixel = i / channels;
    uint c = i % channels;
    int x = pixel % w, row = pixel / w + halo;
    float sum = 0.0f;
    for (int dy = -(int)halo; dy <= (int)halo; dy++)
        for (int dx = -1; dx <= 1; dx++) {
            float2 at = (float2)(x + dx + 0.5f, row + dy + 0.5f);
            if (normalized) at /= (float2)(w, h);
            READ
            sum += c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
        }
    y[i] = sum;
}
"""
READ = {"f": "float4 v = read_imagef(img, s, at);",
        "u": "float4 v = convert_float4(read_imageui(img, s, at));",
        "i": "float4 v = convert_float4(read_imagei(img, s, at));"}


@pytest.fixture
def image_device(device):
    if device.backend != "opencl":
        pytest.skip("OpenCL images")
    try:
        device.image_limits()
    except InputError as exc:
        pytest.skip(f"{device.spec} has no images: {exc}")
    return device


def _box_want(a: np.ndarray, halo: int, boundary) -> np.ndarray:
    """A (2 halo + 1) x 3 box sum of every channel, past the edges as np.pad's mode."""
    rows, cols = a.shape[:2]
    a3 = a.reshape(rows, cols, -1).astype(np.float64)
    mode = PADS.get(boundary, "constant")
    p = np.pad(a3, ((halo, halo), (1, 1), (0, 0)), mode=mode)
    total = sum(p[dy:dy + rows, dx:dx + cols] for dy in range(2 * halo + 1) for dx in range(3))
    return total.reshape(a.shape).astype(np.float32)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32, np.float16])
@pytest.mark.parametrize("channels", [1, 2, 4])
def test_guard_box_sums_over_odd_images_every_boundary_and_block(image_device, dtype, channels):
    # guard: shapes of one row, one column and primes; halo 1 and 2; blocks of 3 rows that
    # do not divide the rows; every boundary with its addressing mode (normalized
    # coordinates too where unnormalized ones are allowed). No 2-channel or half format on
    # PoCL: that is the InputError listing the formats (half: README, Image blocks).
    device = image_device
    kernel = device.compile(BOXN.replace("READ", READ[np.dtype(dtype).kind]), "boxn")
    if (channels, np.dtype(dtype)) not in device.image_limits().formats:
        a = np.zeros((5, 3, channels), dtype)
        with pytest.raises(InputError, match=r"no image format of .*its formats are"):
            cv.stream(kernel, [cv.image(a)], [np.float32], args=(channels, 1, 0), halo=1,
                      device=device)
        return
    rng = np.random.default_rng(channels)
    for shape in [(1, 1), (1, 7), (7, 1), (13, 11)]:
        full = shape if channels == 1 else (*shape, channels)
        a = rng.integers(0, 50, full).astype(dtype)
        for halo in (1, 2):
            for boundary in ("nearest", "reflect", "periodic", 0):
                want = _box_want(a, halo, boundary)
                for normalized in ((True,) if boundary in ("reflect", "periodic")
                                   else (False, True)):
                    for rows in (None, 3):
                        if rows is not None and rows < halo < shape[0]:
                            continue
                        y = np.zeros(full, np.float32)
                        cv.stream(kernel, [cv.image(a, normalized=normalized)], [y],
                                  args=(channels, halo, int(normalized)), halo=halo,
                                  boundary=boundary, device=device,
                                  block_bytes=None if rows is None else rows * y[0].nbytes)
                        np.testing.assert_array_equal(
                            y, want, err_msg=f"{shape} halo={halo} {boundary} {normalized} "
                                             f"rows={rows}")


IMAGES = """
__kernel void two(read_only image2d_t a, sampler_t sa, read_only image2d_t b, sampler_t sb,
                  __global float *y, uint halo, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    int w = get_image_width(a);
    int2 at = (int2)(i % w, i / w + halo);
    y[i] = read_imagef(a, sa, at).x + 10.0f * read_imagef(b, sb, at).x
           + read_imagef(a, sa, at + (int2)(-1, -1)).x;
}
__kernel void second(__global const float *x, read_only image2d_t b, sampler_t sb,
                     __global float *y, uint halo, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    int w = get_image_width(b);
    int2 at = (int2)(i % w, i / w + halo);
    y[i] = x[i + halo * w] + read_imagef(b, sb, at + (int2)(1, 1)).x;
}
__kernel void pair_sum(read_only image2d_t a, sampler_t sa, __global float *r, uint halo,
                       ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    int w = get_image_width(a);
    int2 at = (int2)(i % w, i / w + halo);
    r[i] = read_imagef(a, sa, at).x + read_imagef(a, sa, at + (int2)(0, 1)).x;
}
__kernel void record(read_only image2d_t a, sampler_t sa, __global float *r, ulong offset,
                     ulong n) {
    if (get_global_id(0) != 0) return;
    int w = get_image_width(a);
    float s = 0.0f;
    for (ulong k = 0; k < n; k++) s += read_imagef(a, sa, (int2)(k % w, k / w)).x;
    r[0] = s;
    r[1] = (float)(offset / w);
}
__kernel void pool(read_only image2d_t a, sampler_t sa, __global float *y, uint halo,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    int w = get_image_width(a);
    if (i >= n / 2) return;
    int c = i % w, r = i / w;
    y[i] = read_imagef(a, sa, (int2)(c, 2 * r + halo)).x
           + read_imagef(a, sa, (int2)(c, 2 * r + 1 + halo)).x;
}
__kernel void tall(read_only image2d_t a, sampler_t sa, __global float *y, uint normalized,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    int w = get_image_width(a), h = get_image_height(a);
    float s = 0.0f;
    for (int d = -5; d <= 5; d++) {
        float2 at = (float2)(i % w + 0.5f, i / w + 5 + d + 0.5f);
        if (normalized) at /= (float2)(w, h);
        s += read_imagef(a, sa, at).x * (float)(d + 6);
    }
    y[i] = s;
}
__kernel void above(read_only image2d_t img, sampler_t s, __global TYPE *y, uint channels,
                    ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    ulong pixel = i / channels;
    uint c = i % channels;
    int w = get_image_width(img);
    VEC v = READ(img, s, (int2)(pixel % w, pixel / w + 1));
    VEC u = READ(img, s, (int2)(pixel % w, pixel / w));
    y[i] = (TYPE)(c == 0 ? v.x + u.x : c == 1 ? v.y + u.y : c == 2 ? v.z + u.z : v.w + u.w);
}
"""


def _images(device: cv.Device, name: str, **types: str) -> cv.Kernel:
    source = IMAGES
    for key, value in (types or {"TYPE": "float", "VEC": "float4", "READ": "read_imagef"}
                       ).items():
        source = source.replace(key, value)
    return device.compile(source, name)


@pytest.mark.parametrize("shape", [(37, 11), (13, 1), (1, 13), (3, 4)])
def test_guard_two_images_an_image_beside_a_buffer_and_a_reduction(image_device, shape):
    device = image_device
    rng = np.random.default_rng(sum(shape))
    a = rng.integers(0, 9, shape).astype(np.float32)
    b = rng.integers(0, 9, shape).astype(np.float32)
    block_bytes = 5 * a[0].nbytes if shape[0] > 5 else None
    pa, pb = np.pad(a, 1, mode="edge"), np.pad(b, 1, mode="edge")
    y = np.zeros_like(a)
    cv.stream(_images(device, "two"), [cv.image(a), cv.image(b)], [y], args=(1,), halo=1,
              device=device, block_bytes=block_bytes)
    np.testing.assert_array_equal(y, a + 10 * b + pa[:-2, :-2])
    y = np.zeros_like(a)
    cv.stream(_images(device, "second"), [a, cv.image(b)], [y], args=(1,), halo=1,
              device=device, block_bytes=block_bytes)
    np.testing.assert_array_equal(y, a + pb[2:, 2:])
    report = cv.stream(_images(device, "pair_sum"), [cv.image(a)], reduce="sum", args=(1,),
                       halo=1, device=device, block_bytes=block_bytes)
    assert report.result == (a + pa[2:, 1:-1]).astype(np.float64).sum()


def test_guard_per_block_and_ratio_outputs_of_an_image(image_device):
    device = image_device
    a = np.random.default_rng(4).integers(0, 9, (40, 7)).astype(np.float32)
    report = cv.stream(_images(device, "record"), [cv.image(a)],
                       [cv.per_block((2,), np.float32)], device=device,
                       block_bytes=6 * a[0].nbytes, first_row=100)
    assert len(report.block_ranges) == 7
    for record, (lo, hi) in zip(report.outputs[0], report.block_ranges, strict=True):
        assert record.tolist() == [a[lo:hi].sum(), 100 + lo]
    report = cv.stream(_images(device, "pool"), [cv.image(a)],
                       [cv.rows(np.float32, ratio=(1, 2))], args=(1,), halo=1, device=device,
                       block_bytes=5 * a[0].nbytes)
    np.testing.assert_array_equal(report.outputs[0], a.reshape(20, 2, 7).sum(axis=1))


@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", 0])
def test_guard_an_image_halo_taller_than_the_image(image_device, boundary):
    # guard: 3 rows, halo 5: the pad rows are np.pad's past the whole array, read through
    # the image
    a = np.random.default_rng(5).integers(0, 9, (3, 5)).astype(np.float32)
    normalized = boundary in ("reflect", "periodic")
    y = np.zeros_like(a)
    cv.stream(_images(image_device, "tall"), [cv.image(a, normalized=normalized)], [y],
              args=(int(normalized),), halo=5, boundary=boundary, device=image_device)
    p = padded(a, 5, boundary)
    np.testing.assert_array_equal(y, sum(p[5 + d:8 + d] * (d + 6) for d in range(-5, 6)))


def test_guard_images_of_views_files_and_in_place(image_device, tmp_path):
    # guard: strided, transposed, Fortran-order and read-only arrays; .npy and raw files with
    # first_row into a file output; an RGBA uint8 image that is its own output
    device = image_device
    kernel = _images(device, "above")
    base = np.random.default_rng(6).integers(0, 50, (29, 14)).astype(np.float32)

    def want(a: np.ndarray) -> np.ndarray:
        p = padded(a.astype(np.float64), 1, "nearest")
        return (p[1:-1] + p[:-2]).astype(a.dtype)

    read_only = np.frombuffer(base.tobytes(), np.float32).reshape(base.shape)
    for view in (base[:, ::2], base[::2], base.T, np.asfortranarray(base), read_only):
        y = np.zeros(view.shape, np.float32)
        cv.stream(kernel, [cv.image(view)], [y], args=(1,), halo=1, device=device,
                  block_bytes=4 * y[0].nbytes)
        np.testing.assert_array_equal(y, want(view))
    np.save(tmp_path / "im.npy", base)
    base.tofile(tmp_path / "im.raw")
    for source in (str(tmp_path / "im.npy"),
                   cv.raw(tmp_path / "im.raw", dtype=np.float32, shape=base.shape)):
        cv.stream(kernel, [cv.image(source)], [tmp_path / "out.npy"], args=(1,), halo=1,
                  device=device, block_bytes=3 * base[0].nbytes, first_row=7)
        np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), want(base))
    assert sorted(os.listdir(tmp_path)) == ["im.npy", "im.raw", "out.npy"]
    rgba = np.random.default_rng(7).integers(0, 100, (23, 9, 4)).astype(np.uint8)
    expected = want(rgba.astype(np.int64)).astype(np.uint8)
    in_place = _images(device, "above", TYPE="uchar", VEC="uint4", READ="read_imageui")
    cv.stream(in_place, [cv.image(rgba)], [rgba], args=(4,), halo=1, device=device,
              block_bytes=5 * rgba[0].nbytes)
    np.testing.assert_array_equal(rgba, expected)


LINEAR = """
__kernel void at(read_only image2d_t img, sampler_t s, __global float *y, float dx, float dy,
                 ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    int w = get_image_width(img), h = get_image_height(img);
    float2 at = (float2)((i % w) + 0.5f + dx, (i / w) + 1 + 0.5f + dy) / (float2)(w, h);
    y[i] = read_imagef(img, s, at).x;
}
"""


@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", 0])
def test_guard_linear_reads_at_normalized_coordinates_past_every_edge(image_device, boundary):
    # guard: bilinear reads a quarter and a half pixel off the centres, past the first and
    # last column (the sampler) and row (the halo's pad rows), blocks of 5 of 37 rows
    x = np.random.default_rng(3).random((37, 9), dtype=np.float32)
    p = padded(x.astype(np.float64), 1, boundary)
    p = np.pad(p, ((0, 0), (1, 1)), mode=PADS.get(boundary, "constant"))
    kernel = image_device.compile(LINEAR, "at")
    for dx, dy in ((0.25, 0.25), (-0.25, -0.25), (-0.5, 0.5)):
        y = np.zeros_like(x)
        cv.stream(kernel, [cv.image(x, filter="linear", normalized=True)], [y],
                  args=(dx, dy), halo=1, boundary=boundary, device=image_device,
                  block_bytes=5 * x[0].nbytes)
        r = np.arange(37)[:, None] + dy
        c = np.arange(9)[None, :] + dx
        r0, c0 = np.floor(r).astype(int), np.floor(c).astype(int)
        fr, fc = r - r0, c - c0
        want = ((1 - fr) * (1 - fc) * p[r0 + 1, c0 + 1] + (1 - fr) * fc * p[r0 + 1, c0 + 2]
                + fr * (1 - fc) * p[r0 + 2, c0 + 1] + fr * fc * p[r0 + 2, c0 + 2])
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("warmup", [True, False])
def test_guard_a_callable_link_returning_another_row_shape_or_dtype_for_a_temp(device, warmup):
    # guard: a (4n,) array or a float64 one for a ((4,), float32) temp: an InputError naming
    # the link, the temp and both shapes (by the warm-up, or at the first block without it),
    # the output untouched and every pool back at zero
    import pyopencl.array as cla

    if device.backend != "opencl":
        pytest.skip("PyOpenCL device arrays")
    x = values(5000)
    wide = compiled(device, """
__kernel void unwide(__global const float *t, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = t[4 * i] + t[4 * i + 1] + t[4 * i + 2] + t[4 * i + 3];
}""", "unwide")

    def flat(a, t, *, queue, offset, n):
        return cla.to_device(queue, np.repeat(to_host(a, queue), 4))

    def doubles(a, t, *, queue, offset, n):
        return cla.to_device(queue, np.repeat(to_host(a, queue), 4).reshape(-1, 4)
                             .astype(np.float64))

    for returns, got in ((flat, r"float32 of shape \(\d+,\)"),
                         (doubles, r"float64 of shape \(\d+, 4\)")):
        y = np.full_like(x, 7)
        chain = cv.chain(cv.link(returns, "in0", "t"), cv.link(wide, "t", "out0"),
                         temps={"t": ((4,), np.float32)})
        with pytest.raises(InputError, match=rf"link 0 \('{returns.__name__}'\) returned {got} "
                                             r"for 't', which holds a C-contiguous float32 "
                                             r"array of shape \(\d+, 4\)"):
            cv.stream(chain, [x], [y], device=device, block_bytes=4000, warmup=warmup)
        assert (y == 7).all()
        gc.collect()
        assert_clean(device)
