"""Chains (issue 19, item 1): several kernels or callables per block, device-only temps
between them, checked before any work; exact against NumPy. The kernels are portable
(cv.portable), so the same tests run on CUDA on the GPU machine."""

from __future__ import annotations

import numpy as np
import pytest
from streamkit import add_reference, data, in_use, kernel, stencil_reference, store, to_host

import conveyor as cv

SOURCE = cv.portable("""
__kernel void to_int(__global const float *x, __global int *t, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) t[i] = (int)(x[i] * 100.0f);
}
__kernel void widen(__global const int *t, __global double *u, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) u[i] = (double)t[i] * 0.5 + (double)(offset + i);
}
__kernel void blend(__global const double *u, __global const float *x, __global float *y,
                  ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (float)u[i] + x[i];
}
__kernel void rowstats(__global const float *x, __global float *t, ulong cols,
                       ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n && i % cols == 0) {
        ulong r = i / cols;
        float s = x[i];
        for (ulong k = 1; k < cols; k++) s += x[i + k];
        t[2 * r] = s;
        t[2 * r + 1] = x[i];
    }
}
__kernel void pairdiff(__global const float *t, __global float *y, ulong cols,
                       ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n && i % cols == 0) {
        ulong r = i / cols;
        y[r] = t[2 * r] - t[2 * r + 1];
    }
}
__kernel void triple(__global const int *x, __global int *t, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) t[i] = 3 * x[i];
}
__kernel void plus_one(__global const int *t, __global int *r, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) r[i] = t[i] + 1;
}
__kernel void both(__global const int *t, __global int *o, __global int *r,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { o[i] = t[i] - 1; r[i] = t[i] + 1; }
}
__kernel void bad_offset(__global const float *x, __global float *t, __global float *y,
                         ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + t[i];
}
""")

_built: dict[tuple[str, str], cv.Kernel] = {}


def k(device: cv.Device, name: str) -> cv.Kernel:
    key = (device.spec, name)
    if key not in _built:
        _built[key] = device.compile(SOURCE, name)
    return _built[key]


def typed_reference(x: np.ndarray) -> np.ndarray:
    """to_int, widen, blend in NumPy (same operations, same order)."""
    t = (x * np.float32(100)).astype(np.int32)
    u = t.astype(np.float64) * 0.5 + np.arange(x.size, dtype=np.float64).reshape(x.shape)
    return u.astype(np.float32) + x


# -- exact against NumPy -----------------------------------------------------------------------
@pytest.mark.parametrize("zero_copy", [False, None])
def test_two_links_with_a_temp(device, zero_copy):
    a, b = data((50_000,), np.float32, 1), data((50_000,), np.float32, 2)
    c = np.zeros_like(a)
    chain = cv.chain(
        cv.link(kernel(device, "add"), reads=("in0", "in1"), writes="t0"),
        cv.link(kernel(device, "scale"), reads="t0", writes="out0", args=(2.0,)),
        temps=[np.float32])
    report = cv.stream(chain, [a, b], [c], device=device, block_bytes=4096,
                       zero_copy=zero_copy)
    np.testing.assert_array_equal(c, add_reference(a, b) * np.float32(2))
    assert report.blocks > 10


def test_three_links_with_temps_of_different_dtypes_as_a_linear_chain(device):
    x = data((30_000,), np.float32, 3)
    y = np.zeros_like(x)
    chain = cv.chain(k(device, "to_int"), k(device, "widen"), temps=[np.int32, np.float64])
    with pytest.raises(cv.InputError, match="2 bare links is linear"):
        cv.stream(chain, [x], [y], device=device)
    chain = cv.chain(
        cv.link(k(device, "to_int"), reads="in0", writes="t"),
        cv.link(k(device, "widen"), reads="t", writes="u"),
        cv.link(k(device, "blend"), reads=("u", "in0"), writes="out0"),
        temps={"t": np.int32, "u": np.float64})
    report = cv.stream(chain, [x], [y], device=device, block_bytes=8 * 1000)
    np.testing.assert_array_equal(y, typed_reference(x))
    assert report.blocks == 30  # the widest row (the float64 temp) sets the block


def test_linear_chain_of_bare_kernels(device):
    x = data((20_000,), np.int32, 4)
    y = np.zeros_like(x)
    cv.stream(cv.chain([k(device, "triple"), k(device, "plus_one")], temps=[np.int32]), x, y,
              device=device, block_bytes=4000)
    np.testing.assert_array_equal(y, 3 * x + 1)


def test_n_d_rows_and_a_temp_of_another_row_shape(device):
    x = data((9_000, 3), np.float32, 5)
    y = np.zeros(9_000, np.float32)
    chain = cv.chain(
        cv.link(k(device, "rowstats"), reads="in0", writes="stats", args=(3,)),
        cv.link(k(device, "pairdiff"), reads="stats", writes="out0", args=(3,)),
        temps={"stats": ((2,), np.float32)})
    cv.stream(chain, [x], [y], device=device, block_bytes=3 * 4 * 700)
    np.testing.assert_array_equal(y, x[:, 0] + x[:, 1] + x[:, 2] - x[:, 0])
    z = data((5_000, 2, 2), np.float32, 6)
    out = np.zeros_like(z)
    chain = cv.chain(kernel(device, "ident"), kernel(device, "scale"), temps=[np.float32])
    with pytest.raises(cv.InputError, match="link 1"):
        cv.stream(chain, [z], [out], device=device)  # scale takes k: name its args
    chain = cv.chain(cv.link(kernel(device, "ident"), "in0", "t0"),
                     cv.link(kernel(device, "scale"), "t0", "out0", args=(0.5,)),
                     temps=[np.float32])  # a dtype alone: rows of input 0's shape (2, 2)
    cv.stream(chain, [z], [out], device=device, block_bytes=16 * 300)
    np.testing.assert_array_equal(out, z * np.float32(0.5))


def test_a_callable_links_warm_up_sees_the_halo_rows_the_stream_gives(device):
    """Round fourteen: a callable link's warm-up put the input's rows at index 0 of its
    halo'd input and zeros for the pad rows; the first block has the pads first."""
    h = 2
    a = data((12_000,), np.float32, 9)
    c = np.zeros_like(a)
    seen = []

    def middle(t, u, queue, offset, n):
        rows = to_host(t, queue)
        seen.append(rows)
        store(u, rows[h : len(rows) - h], queue)

    chain = cv.chain(cv.link(middle, "in0", "out0"))
    cv.stream(chain, [a], [c], device=device, block_bytes=4000, halo=h, boundary="reflect")
    np.testing.assert_array_equal(c, a)
    warm, first = seen[0], seen[1]
    np.testing.assert_array_equal(warm, first[: len(warm)])
    np.testing.assert_array_equal(warm[:h], a[:h][::-1])
    np.testing.assert_array_equal(warm[h:], a[: len(warm) - h])


def test_a_callable_link_between_kernels(device):
    a, b = data((12_000,), np.float32, 7), data((12_000,), np.float32, 8)
    c = np.zeros_like(a)
    seen = []

    def negate(t, u, queue, offset, n):
        seen.append((offset, n))
        store(u, -to_host(t, queue), queue)

    chain = cv.chain(
        cv.link(kernel(device, "add"), ("in0", "in1"), "t0"),
        cv.link(negate, "t0", "t1"),
        cv.link(kernel(device, "scale"), "t1", "out0", args=(3.0,)),
        temps=[np.float32, np.float32])
    report = cv.stream(chain, [a, b], [c], device=device, block_bytes=4000)
    np.testing.assert_array_equal(c, -add_reference(a, b) * np.float32(3))
    assert seen[0] == (0, 64)  # the warm-up call, on the first rows
    assert seen[1:] == [(i * 1000, min(1000, 12_000 - i * 1000)) for i in range(12)]
    lanes = {(s.lane, s.label) for s in report.timeline.spans if s.lane == "compute"}
    assert lanes == {("compute", "add_float32"), ("compute", "negate"),
                     ("compute", "scale_float32")}


def test_a_callable_that_returns_its_write(device):
    x = data((6_000,), np.int32, 9)
    y = np.zeros_like(x)

    def twice(t, u, queue, offset, n):
        return t * 2 if hasattr(t, "get") else None

    if device.backend != "opencl":
        pytest.skip("returns a PyOpenCL array")
    chain = cv.chain(k(device, "triple"), twice, temps=[np.int32])
    cv.stream(chain, x, y, device=device, block_bytes=4000)
    np.testing.assert_array_equal(y, 6 * x)


@pytest.mark.parametrize("op", ["sum", "min", "max"])
def test_a_kernel_reduction_ends_a_chain(device, op):
    x = data((40_000,), np.int32, 10)
    chain = cv.chain(cv.link(k(device, "triple"), "in0", "t0"),
                     cv.link(k(device, "plus_one"), "t0", "reduce"), temps=[np.int32])
    report = cv.stream(chain, [x], device=device, reduce=op, block_bytes=4000)
    assert report.result == getattr(np, op)(3 * x.astype(np.int64) + 1)
    linear = cv.chain(k(device, "triple"), k(device, "plus_one"), temps=[np.int32])
    assert cv.stream(linear, x, device=device, reduce=op).result == report.result


def test_a_reduction_with_outputs_beside_it(device):
    x = data((20_000,), np.int32, 11)
    o = np.zeros_like(x)
    chain = cv.chain(cv.link(k(device, "triple"), "in0", "t0"),
                     cv.link(k(device, "both"), "t0", ("out0", "reduce")), temps=[np.int32])
    report = cv.stream(chain, [x], [o], device=device, reduce="sum", block_bytes=4000)
    np.testing.assert_array_equal(o, 3 * x - 1)
    assert report.result == np.sum(3 * x.astype(np.int64) + 1)


def test_a_callable_partial_ends_a_chain(device):
    x = data((20_000,), np.int32, 12)

    def partial(t, queue, offset, n):
        return int(to_host(t, queue).astype(np.int64).sum())

    chain = cv.chain(cv.link(k(device, "triple"), "in0", "t0"), cv.link(partial, "t0"),
                     temps=[np.int32])
    report = cv.stream(chain, [x], device=device, reduce=lambda p, q: p + q,
                       block_bytes=4000)
    assert report.result == 3 * int(x.astype(np.int64).sum())


@pytest.mark.parametrize("boundary", ["nearest", "reflect"])
def test_halo_applies_to_the_inputs_of_every_link(device, boundary):
    x = data((6_000, 3), np.float32, 13)
    y = np.zeros_like(x)
    chain = cv.chain(cv.link(kernel(device, "sten"), "in0", "t0", args=(3, 2)),
                     cv.link(kernel(device, "scale"), "t0", "out0", args=(2.0,)),
                     temps=[np.float32])
    cv.stream(chain, [x], [y], device=device, halo=2, boundary=boundary,
              block_bytes=12 * 500)
    if boundary == "nearest":
        expected = stencil_reference(x, 2)
    else:
        p = np.pad(x, [(2, 2), (0, 0)], mode="symmetric")
        expected = p[0:6000].copy()
        for shift in range(1, 5):
            expected = expected + p[shift:shift + 6000]
    np.testing.assert_array_equal(y, expected * np.float32(2))


def test_each_link_is_a_span_of_the_compute_lane(device, tmp_path):
    x = data((20_000,), np.int32, 14)
    y = np.zeros_like(x)
    chain = cv.chain(k(device, "triple"), k(device, "plus_one"), temps=[np.int32])
    trace = tmp_path / "chain.json"
    report = cv.stream(chain, x, y, device=device, block_bytes=4000, trace=str(trace))
    compute = report.timeline.lane("compute")
    assert sorted({s.label for s in compute}) == ["plus_one", "triple"]
    assert len(compute) == 2 * report.blocks
    for block in range(report.blocks):
        first, second = sorted((s for s in compute if s.block == block),
                               key=lambda s: s.start_ns)
        assert (first.label, second.label) == ("triple", "plus_one")
        assert first.end_ns <= second.start_ns + (report.timeline.clock_error_ns or 0) + 1
    assert "compute" in report.timeline.lanes and "compute:triple" not in report.timeline.lanes
    assert '"compute:triple 0"' in trace.read_text()


def test_temps_count_against_the_memory_limit(device):
    a = data((100_000,), np.float32, 15)
    out = np.zeros_like(a)
    plain = cv.stream(kernel(device, "scale"), [a], [out], device=device, args=(1.0,),
                      memory_limit=2**20)
    chain = cv.chain(
        cv.link(kernel(device, "ident"), "in0", "t0"),
        cv.link(kernel(device, "scale"), "t0", "out0", args=(1.0,)),
        temps=[((4,), np.float32)])
    report = cv.stream(chain, [a], [out], device=device, memory_limit=2**20)
    np.testing.assert_array_equal(out, a)
    assert report.block_rows < plain.block_rows  # the 16-byte rows of the temp took room
    assert report.peak_device_bytes <= 2**20
    assert in_use(device) == (0, 0)


def test_links_may_be_kernel_futures_and_a_file_output_takes_the_kernels_dtype(device,
                                                                                tmp_path):
    x = data((10_000,), np.float32, 16)
    first = device.compile(SOURCE, "to_int", wait=False)
    second = device.compile(SOURCE, "widen", wait=False)
    target = tmp_path / "u.npy"
    chain = cv.chain(first, second, temps=[np.int32])
    cv.stream(chain, x, str(target), device=device, block_bytes=8 * 1000)
    u = np.load(target)
    assert u.dtype == np.float64  # widen's output parameter, not input 0's float32
    t = (x * np.float32(100)).astype(np.int32)
    np.testing.assert_array_equal(u, t * 0.5 + np.arange(x.size, dtype=np.float64))
