"""Round fifteen, helper c: features combined that were each tested alone (chains, resident
tables, callables with halos and reductions, ``cv.iterate`` sources, ``keep_pinned``,
``zero_copy``, ``trace=``, reports, several devices, image blocks), in pairs and triples.
Every result is compared with a NumPy reference.

Found (strict xfails until fixed):

- ``cv.iterate`` chunks that are views of the stream's own output (a memmap processed in
  place chunk by chunk, with a halo; or shifted by a row) are neither in place (NumPy's
  answer, halo rows saved) nor refused as an overlap, as arrays are: the source holds the
  chunk and reads rows of it for block k after block k - 1 was staged out over them. One
  wrong row per block, no error (seen 2 runs in 6 on its own; made certain by waiting, in
  the source's ``rows``, for the output row to be written: an order the engine allows).
- A writable ``cv.resident`` in a chain link's args over several devices is refused as
  "args[0] is cv.resident(writable=True)", naming no link (a device array there names it).
- A callable chain link whose signature cannot take the link's call (too few positional
  parameters for its reads and writes, or no ``queue``/``offset``/``n`` keywords) fails with
  Python's raw TypeError from the warm-up (or the first block), naming neither the link nor
  the convention; a plain callable gets an InputError saying what it is called with.
- A reducing callable defined with ``async def`` (or ``yield``) over a stream of one block
  gives ``report.result`` = a coroutine (generator) object, with no error; over several
  blocks it is an InputError that says "cannot fold" and never says ``async def``. Likewise a
  dict partial with ``reduce="sum"`` is refused over two blocks and returned as the total
  over one.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    assert_clean,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    opencl_c_only,
    zero_copy_where_unified,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

SRC = """
__kernel void scale(__global const float *x, __global float *y, float k, ulong offset,
                    ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * k;
}
__kernel void sq(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * x[i];
}
__kernel void sq2(__global const float *x, __global float *y, __global float *r,
                  ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { y[i] = x[i] * x[i]; r[i] = x[i] * x[i]; }
}
/* a 3-point box over the halo'd input plus the temp weighted by a 4-entry table */
__kernel void sten_lut(__global const float *x, __global const float *t, __global float *y,
                       __global const float *lut, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + x[i + 1] + x[i + 2] + t[i] * lut[(offset + i) % 4];
}
__kernel void box(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + x[i + 1] + x[i + 2];
}
/* y = x plus an element of a table far from i: the table read after rows were written */
__kernel void far(__global const float *x, __global float *y, __global const float *tab,
                  ulong len, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + tab[(offset + i + len / 2) % len];
}
__kernel void lut5(__global const float *x, __global float *y, __global const float *t,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + t[(offset + i) % 5];
}
__kernel void hist(__global const float *x, __global float *y, __global uint *h, ulong offset,
                   ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { y[i] = x[i + 1]; atomic_inc(&h[(uint)(x[i + 1] * 8.0f) & 7]); }
}
__kernel void pool2(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n / 2) y[i] = x[2 * i] + x[2 * i + 1];
}
__kernel void bsum(__global const float *x, __global float *y, ulong offset, ulong n) {
    if (get_global_id(0) == 0) {
        float s = 0.0f;
        for (ulong i = 0; i < n; i++) s += x[i];
        y[0] = s; y[1] = (float)offset;
    }
}
"""

IMAGE = """
__kernel void neighbours(read_only image2d_t img, sampler_t s, __global float *out,
                    __global const float *w, uint cols, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    int c = i % cols, r = i / cols + 1;
    out[i] = read_imagef(img, s, (int2)(c, r - 1)).x * w[0]
           + read_imagef(img, s, (int2)(c, r)).x * w[1]
           + read_imagef(img, s, (int2)(c, r + 1)).x * w[2]
           + read_imagef(img, s, (int2)(c - 1, r)).x;
}
"""

PAD = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}

_built: dict[tuple[int, str], cv.Kernel] = {}


def k(device: cv.Device, name: str, source: str = SRC) -> cv.Kernel:
    """``name`` of ``source`` built once per device (the tests' kernels are OpenCL C)."""
    opencl_c_only(device)
    key = (id(device), name)
    if key not in _built or _built[key].device is not device:
        _built[key] = device.compile(source, name)
    return _built[key]


def values(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(n).astype(np.float32)


def padded(x: np.ndarray, h: int, boundary) -> np.ndarray:
    if isinstance(boundary, str):
        return np.pad(x, h, mode=PAD[boundary])
    return np.pad(x, h, mode="constant", constant_values=boundary)


def box_ref(x: np.ndarray, boundary="nearest") -> np.ndarray:
    p = padded(x, 1, boundary)
    return p[:-2] + p[1:-1] + p[2:]


class _no_check:
    """A context that checks nothing (the inner stream may warn of its own allocations)."""

    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore")
        return self

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)


# -- a chain whose second link reads the halo and a resident table --------------------------
@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", 0.5])
@pytest.mark.parametrize("zero_copy", [None, False])
def test_guard_a_chain_whose_second_link_reads_the_halo_a_temp_and_a_table(device, boundary,
                                                                          zero_copy):
    """guard: link 0 scales the halo'd input into a temp (its element i is row i - 1), link 1
    adds a 3-point box of the input and the temp weighted by a table indexed by offset."""
    x = values(10_001)
    lut = np.array([1, 2, 3, 4], np.float32)
    y = np.zeros_like(x)
    chain = cv.chain(
        cv.link(k(device, "scale"), reads="in0", writes="t0", args=(2.0,)),
        cv.link(k(device, "sten_lut"), reads=("in0", "t0"), writes="out0", args=(lut,)),
        temps=[np.float32])
    cv.stream(chain, [x], [y], device=device, halo=1, boundary=boundary, block_bytes=4000,
              zero_copy=zero_copy)
    p = padded(x, 1, boundary)
    ref = p[:-2] + p[1:-1] + p[2:] + (p[:-2] * np.float32(2)) * lut[np.arange(len(x)) % 4]
    np.testing.assert_allclose(y, ref, rtol=1e-6)
    assert_clean(device)


# -- a cv.iterate source into a chain ending in a reduction ----------------------------------
@pytest.mark.parametrize("halo", [0, 2])
def test_guard_an_iterate_source_into_a_chain_ending_in_a_reduction_with_an_output(device,
                                                                                  halo):
    """guard: chunks of 777 rows into blocks of 1000, a chain scale -> (square into out0 and
    reduce), reduce="sum"; with a halo the links read the halo'd input (row i - halo)."""
    x = values(10_001)
    y = np.zeros_like(x)

    def chunks():
        for s in range(0, len(x), 777):
            yield x[s:s + 777]

    chain = cv.chain(cv.link(k(device, "scale"), reads="in0", writes="t0", args=(3.0,)),
                     cv.link(k(device, "sq2"), reads="t0", writes=("out0", "reduce")),
                     temps=[np.float32])
    report = cv.stream(chain, [cv.iterate(chunks(), length=len(x))], [y], device=device,
                       reduce="sum", block_bytes=4000, halo=halo)
    rows = np.pad(x, halo, mode="edge")[:len(x)]  # element i of a link is row i - halo
    ref = (rows * np.float32(3)) ** 2
    np.testing.assert_array_equal(y, ref)
    assert report.result == pytest.approx(float(ref.astype(np.float64).sum()), rel=1e-9)
    assert_clean(device)


# -- tables that are also inputs or outputs --------------------------------------------------
@pytest.mark.parametrize("zero_copy", [None, False, True])
@pytest.mark.parametrize("role", ["input", "in place", "output"])
def test_guard_a_table_that_is_also_an_input_or_the_output(device, role, zero_copy, request):
    """guard: the table is uploaded before the first block, so every block reads the old
    values of an array that is also the input, the in-place array or the output."""
    zero_copy_where_unified(device, request)
    x = values(10_001)
    ref = x + x[(np.arange(len(x)) + len(x) // 2) % len(x)]
    a = x.copy()
    out = a if role == "in place" else np.zeros_like(x) if role == "input" else x.copy()
    table = out if role == "output" else a
    cv.stream(k(device, "far"), [a], [out], args=(table, len(x)), device=device,
              block_bytes=4000, zero_copy=zero_copy)
    np.testing.assert_array_equal(out, ref)
    assert_clean(device)


@pytest.mark.parametrize("schedule", ["dynamic", "static"])
@pytest.mark.parametrize("how", ["array", "resident", "kept"])
def test_guard_in_place_over_two_devices_with_the_array_as_its_own_table(pair, schedule, how):
    """guard: each device uploads the table when it starts, maybe after the other has written
    rows of it back; every device must read the old values."""
    for d in pair:
        opencl_c_only(d)
    x = values(10_001)
    ref = x + x[(np.arange(len(x)) + len(x) // 2) % len(x)]
    a = x.copy()
    kernel = k(pair[0], "far")
    if how == "kept":
        cv.keep_pinned(a)
    try:
        if how == "resident":
            with cv.resident(a) as table:
                cv.stream(kernel, [a], [a], args=(table, len(x)), device=pair,
                          block_bytes=400, schedule=schedule)
        else:
            cv.stream(kernel, [a], [a], args=(a, len(x)), device=pair, block_bytes=400,
                      schedule=schedule)
    finally:
        cv.release_pinned()
    np.testing.assert_array_equal(a, ref)
    for d in pair:
        assert_clean(d)


# -- trace and timeline of a chain over two devices -----------------------------------------
def test_guard_the_trace_of_a_reducing_chain_over_two_devices_has_every_link_of_every_block(
        pair, tmp_path):
    """guard: a kernel, the same kernel again and a callable partial, over two devices with
    copies: each block's three links appear once, on the device that ran it."""
    for d in pair:
        opencl_c_only(d)
    x = values(10_000)
    kernel = k(pair[0], "scale")

    def part(t, *, queue, offset, n):
        return float(t.get(queue=queue).astype(np.float64).sum())

    chain = cv.chain(cv.link(kernel, reads="in0", writes="t0", args=(2.0,)),
                     cv.link(kernel, reads="t0", writes="t1", args=(3.0,)),
                     cv.link(part, reads="t1"), temps=[np.float32, np.float32])
    trace = tmp_path / "chain.json"
    report = cv.stream(chain, [x], device=pair, block_bytes=400, reduce="sum", trace=trace,
                       zero_copy=False)
    assert report.result == pytest.approx(float((x * np.float32(6)).astype(np.float64).sum()),
                                          rel=1e-9)
    assert report.trace_file is not None and Path(report.trace_file) == trace
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    # Two contexts of one device (the GPU machine's pair) are told apart as SPEC#0, SPEC#1.
    assert sorted(n.split("#")[0] for n in names.values()) == sorted(
        f"conveyor: {d.spec}" for d in pair)
    slices = [e for e in events if e.get("ph") == "X" and e["cat"] == "compute"]
    seen = Counter((e["name"].rsplit(" ", 1)[0], e["args"]["block"]) for e in slices)
    assert set(seen.values()) == {1}
    assert {title for title, _ in seen} == {"compute:scale", "compute:scale#2", "compute:part"}
    assert len(seen) == 3 * report.blocks
    per_device = Counter(names[e["pid"]] for e in slices)
    assert sorted(per_device.values()) == sorted(3 * r.blocks for r in report.devices)
    spans = Counter((s.device, s.label) for s in report.timeline.spans if s.lane == "compute")
    assert sum(spans.values()) == 3 * report.blocks
    for d in pair:
        assert_clean(d)


# -- one chain object, and one link, reused -------------------------------------------------
def test_guard_one_chain_object_on_one_device_then_two_then_one_again(pair):
    """guard: the chain's kernels are built for each device of a list; its table uploaded
    again for each stream."""
    for d in pair:
        opencl_c_only(d)
    x = values(10_001)
    t5 = np.arange(5, dtype=np.float32) * 10
    first = cv.link(k(pair[0], "scale"), reads="in0", writes="t0", args=(3.0,))
    chain = cv.chain(first, cv.link(k(pair[0], "lut5"), reads="t0", writes="out0",
                                    args=(t5,)), temps=[np.float32])
    other = cv.chain(first, cv.link(k(pair[0], "scale"), reads="t0", writes="out0",
                                    args=(2.0,)), temps=[np.float32])
    for device in (pair[0], pair, pair[0], pair[::-1]):
        y = np.zeros_like(x)
        cv.stream(chain, [x], [y], device=device, block_bytes=4000)
        np.testing.assert_array_equal(y, x * np.float32(3) + t5[np.arange(len(x)) % 5])
        t5 += 1
        z = np.zeros_like(x)
        cv.stream(other, [x], [z], device=device, block_bytes=4000)
        np.testing.assert_array_equal(z, x * np.float32(3) * np.float32(2))
    for d in pair:
        assert_clean(d)


# -- streams inside streams: the output of one is the input of the other, both open ----------
@pytest.mark.parametrize("zero_copy", [None, False])
def test_guard_a_stream_run_by_an_iterate_generator_feeds_the_outer_stream(pair, zero_copy):
    """guard: each chunk the outer stream reads is the output of an inner stream, run on
    the same device and on the other, while the outer one is open."""
    for d in pair:
        opencl_c_only(d)
    x = values(10_001)
    for inner in pair:
        def chunks(inner=inner):
            for s in range(0, len(x), 777):
                part = x[s:s + 777]
                out = np.empty_like(part)
                cv.stream(k(inner, "scale"), [part], [out], args=(3.0,), device=inner,
                          block_bytes=1000, zero_copy=zero_copy)
                yield out

        y = np.zeros_like(x)
        with _no_check():
            cv.stream(k(pair[0], "sq"), [cv.iterate(chunks(), length=len(x))], [y],
                      device=pair[0], block_bytes=4000, zero_copy=zero_copy)
        np.testing.assert_array_equal(y, (x * np.float32(3)) ** 2)
    for d in pair:
        assert_clean(d)


def test_guard_a_stream_run_inside_a_callable_block(device):
    """guard: a callable that streams its block through a kernel on the same device."""
    opencl_c_only(device)
    x = values(10_001)
    kernel = k(device, "scale")

    def inner(xb, yb, *, queue, offset, n):
        host = xb.get(queue=queue)
        out = np.empty_like(host)
        cv.stream(kernel, [host], [out], args=(3.0,), device=device, block_bytes=1000)
        yb.set(out, queue=queue)

    y = np.zeros_like(x)
    with _no_check():
        cv.stream(inner, [x], [y], device=device, block_bytes=4000)
    np.testing.assert_array_equal(y, x * np.float32(3))
    assert_clean(device)


def test_guard_a_file_input_replaced_by_a_nested_stream_mid_read_is_read_whole(device,
                                                                              tmp_path):
    """guard: at block 4 a nested stream writes the outer stream's input file (renamed over
    it): the outer stream reads the old file to its end, never a mix."""
    opencl_c_only(device)
    x = values(10_001)
    path = tmp_path / "x.npy"
    np.save(path, x)
    calls = []

    def double(xb, yb, *, queue, offset, n):
        calls.append(offset)
        if len(calls) == 4:
            cv.stream(k(device, "scale"), [x[::-1].copy()], [cv.npy_out(path)], args=(1.0,),
                      device=device)
        return xb * 2

    y = np.zeros_like(x)
    with _no_check():
        cv.stream(double, [cv.npy(path)], [y], device=device, block_bytes=4000, warmup=False)
    np.testing.assert_array_equal(y, 2 * x)
    np.testing.assert_array_equal(np.load(path), x[::-1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy"]
    assert_clean(device)


# -- callables with halos and reductions, on one and two devices -----------------------------
@pytest.mark.parametrize("boundary", ["nearest", "reflect", "periodic", 0.5])
def test_guard_a_halo_callable_reduction_over_one_and_two_devices(device, pair, boundary):
    """guard: each block's partial is the sum of its 3-point boxes over the halo rows."""
    if device.backend != "opencl":
        pytest.skip("the callable reads PyOpenCL arrays")
    x = values(10_001)

    def boxes(xb, *, queue, offset, n):
        h = xb.get(queue=queue).astype(np.float64)
        return float((h[:-2] + h[1:-1] + h[2:]).sum())

    p = padded(x, 1, boundary).astype(np.float64)
    ref = float((p[:-2] + p[1:-1] + p[2:]).sum())
    for where in (device, pair):
        report = cv.stream(boxes, [x], device=where, halo=1, boundary=boundary, reduce="sum",
                           block_bytes=4000)
        assert report.result == pytest.approx(ref, rel=1e-12)
    assert_clean(device)


@pytest.mark.parametrize("two", [False, True])
def test_guard_a_returning_halo_callable_link_then_a_kernel_reduction(pair, two):
    """guard: a callable link returns its block's 3-point boxes (halo rows read) into a temp,
    a kernel squares it into ``reduce``: max, and an output beside it."""
    for d in pair:
        opencl_c_only(d)
    x = values(10_001)

    def boxes(xb, t, *, queue, offset, n):
        return xb[:-2] + xb[1:-1] + xb[2:]

    chain = cv.chain(cv.link(boxes, reads="in0", writes="t0"),
                     cv.link(k(pair[0], "sq2"), reads="t0", writes=("out0", "reduce")),
                     temps=[np.float32])
    y = np.zeros_like(x)
    report = cv.stream(chain, [x], [y], device=pair if two else pair[0], halo=1,
                       boundary="periodic", reduce="max", block_bytes=4000)
    ref = box_ref(x, "periodic") ** 2
    np.testing.assert_allclose(y, ref, rtol=1e-6)
    assert report.result == pytest.approx(float(ref.max()), rel=1e-6)
    for d in pair:
        assert_clean(d)


# -- image blocks with a table, keep_pinned, pinned arrays, trace, in place -------------------
@pytest.mark.parametrize("boundary", ["nearest", 0])
def test_guard_an_image_with_a_table_kept_pinned_traced_and_in_place(device, boundary,
                                                                     tmp_path):
    """guard: a cross of an image's neighbours, weighted by a resident table, as a kept
    array streamed twice, a pinned array, with a trace, and in place."""
    opencl_c_only(device)
    rows, cols = 301, 17
    a = np.random.default_rng(1).random((rows, cols)).astype(np.float32)
    w = np.array([1, 10, 100], np.float32)
    kernel = k(device, "neighbours", IMAGE)

    def ref(a):
        p = np.pad(a, 1, mode="edge" if boundary == "nearest" else "constant")
        return p[:-2, 1:-1] * w[0] + p[1:-1, 1:-1] * w[1] + p[2:, 1:-1] * w[2] + p[1:-1, :-2]

    common = dict(args=(w, cols), halo=1, boundary=boundary, device=device,
                  block_bytes=cols * 4 * 40)
    kept = a.copy()
    y = np.zeros_like(a)
    try:
        for _ in range(2):
            cv.stream(kernel, [cv.image(kept)], [y], keep_pinned=True,
                      trace=tmp_path / "img.json", **common)
            np.testing.assert_allclose(y, ref(kept), rtol=1e-6)
            kept *= 2
    finally:
        cv.release_pinned()
    assert json.loads((tmp_path / "img.json").read_text())
    pinned_in = cv.pinned.asarray(a, device=device)
    pinned_out = cv.pinned.zeros_like(a, device=device)
    cv.stream(kernel, [cv.image(pinned_in)], [pinned_out], **common)
    np.testing.assert_allclose(pinned_out, ref(a), rtol=1e-6)
    del pinned_in, pinned_out
    same = a.copy()
    cv.stream(kernel, [cv.image(same)], [same], **common)
    np.testing.assert_allclose(same, ref(a), rtol=1e-6)
    assert_clean(device)


# -- keep_pinned with in place, halos, tables, and kept arrays over two devices --------------
@pytest.mark.parametrize("zero_copy", [None, False])
def test_guard_a_kept_array_in_place_with_a_halo_twice(device, zero_copy):
    opencl_c_only(device)
    x = values(10_001)
    a = x.copy()
    try:
        for _ in range(2):
            before = a.copy()
            cv.stream(k(device, "box"), [a], [a], device=device, halo=1, keep_pinned=True,
                      block_bytes=4000, zero_copy=zero_copy)
            np.testing.assert_array_equal(a, box_ref(before))
    finally:
        cv.release_pinned()
    assert_clean(device)


def test_guard_a_kept_output_streamed_next_as_input_and_table_then_over_two_devices(pair):
    """guard: kept on device 0, then kept again by a stream on device 1, then streamed over
    both; the host's changes between streams are seen each time."""
    for d in pair:
        opencl_c_only(d)
    x = values(10_000)
    a, y, z = x.copy(), np.zeros_like(x), np.zeros_like(x)
    try:
        cv.stream(k(pair[0], "scale"), [a], [y], args=(2.0,), device=pair[0],
                  keep_pinned=True, block_bytes=400)
        cv.stream(k(pair[0], "lut5"), [y], [z], args=(y,), device=pair[0], keep_pinned=True,
                  block_bytes=400)
        np.testing.assert_array_equal(z, 2 * x + 2 * x[np.arange(len(x)) % 5])
        for where in (pair[1], pair):
            a += 1
            cv.stream(k(pair[1], "scale"), [a], [y], args=(2.0,), device=where,
                      keep_pinned=where is pair[1], block_bytes=400)
            np.testing.assert_array_equal(y, 2 * a)
    finally:
        cv.release_pinned()
    for d in pair:
        assert_clean(d)


@pytest.mark.parametrize("kind", ["numpy", "pinned", "kept"])
@pytest.mark.parametrize("chunk", [25_000, 3_000])
def test_guard_iterate_chunks_in_one_buffer_filled_again(device, kind, chunk):
    """guard: a readinto-style source (one buffer, filled again for every chunk, then
    spoiled at its end) of a pageable, pinned or kept buffer."""
    opencl_c_only(device)
    n = 100_000
    x = values(n)
    if kind == "pinned":
        buf = cv.pinned.empty(chunk, np.float32, device=device)
    else:
        buf = np.empty(chunk, np.float32)
        if kind == "kept":
            cv.keep_pinned(buf)

    def chunks():
        for s in range(0, n, chunk):
            m = min(chunk, n - s)
            buf[:m] = x[s:s + m]
            yield buf[:m]
        buf[:] = -1

    y = np.zeros_like(x)
    try:
        cv.stream(k(device, "scale"), [cv.iterate(chunks(), length=n)], [y], args=(2.0,),
                  device=device, block_bytes=40_000)
    finally:
        cv.release_pinned()
    np.testing.assert_array_equal(y, 2 * x)
    buf = None  # the pinned block goes back to its pool
    assert_clean(device)


def _after_output_row_written(monkeypatch, a: np.ndarray, old: np.ndarray) -> None:
    """Make ``IterSource.rows(lo, hi)`` (called on the stage-ahead thread for each block)
    wait until the stream has written row ``lo`` of the output ``a`` back (the block before
    has been staged out): an order the engine allows, and that happens on its own under
    load (2 runs in 6 here), made certain. The read of the end's pad rows before the first
    block (one row) is let through; waits at most 10 s (then reads as it is)."""
    from conveyor.pipeline.chunks import IterSource

    real = IterSource.rows

    def rows(self, lo, hi):
        if lo > 0 and hi - lo > 1:
            deadline = time.monotonic() + 10
            while a[lo] == old[lo] and time.monotonic() < deadline:
                time.sleep(0.001)
        return real(self, lo, hi)

    monkeypatch.setattr(IterSource, "rows", rows)


@pytest.mark.parametrize("shape", ["in place, halo 1", "shifted by a row"])
@pytest.mark.parametrize("chunk", [10_001, 3_000])
def test_iterate_chunks_that_view_the_output_are_refused_or_read_before_written(
        device, monkeypatch, shape, chunk):
    """An array given as input and output is NumPy's answer (halo rows saved first), and an
    input overlapping an output any other way is refused. The same array yielded as
    cv.iterate chunks (a memmap processed in place, chunk by chunk) is neither: a chunk held
    by the source is read for block k (its halo row, or its first row when shifted) after
    block k - 1's output was staged out over it: one wrong row per block, no error."""
    opencl_c_only(device)
    x = values(10_001)
    a = x.copy()
    halo = 1 if shape.startswith("in place") else 0
    rows = len(a) - (1 - halo)

    def chunks():
        for s in range(0, rows, chunk):
            yield a[s:min(s + chunk, rows)]

    _after_output_row_written(monkeypatch, a, x)
    out = a if halo else a[1:]
    kernel, args = (k(device, "box"), ()) if halo else (k(device, "scale"), (2.0,))
    try:
        cv.stream(kernel, [cv.iterate(chunks(), length=rows)], [out], args=args, halo=halo,
                  device=device, block_bytes=4000)
    except InputError as exc:
        assert "output" in str(exc)  # refused, naming the output: right too
    else:
        np.testing.assert_array_equal(out, box_ref(x) if halo else 2 * x[:-1])
    assert_clean(device)


@pytest.mark.parametrize("zero_copy", [None, False])
def test_guard_a_writable_table_counted_by_a_halo_chain(device, zero_copy):
    opencl_c_only(device)
    x = values(10_001)
    counts = np.zeros(8, np.uint32)
    y = np.zeros_like(x)
    with cv.resident(counts, writable=True) as table:
        chain = cv.chain(cv.link(k(device, "hist"), reads="in0", writes="t0", args=(table,)),
                         cv.link(k(device, "box"), reads="in0", writes="out0"),
                         temps=[np.float32])
        cv.stream(chain, [x], [y], device=device, block_bytes=4000, halo=1,
                  zero_copy=zero_copy)
    np.testing.assert_array_equal(counts, np.bincount((x * 8).astype(np.uint32) & 7,
                                                      minlength=8))
    np.testing.assert_array_equal(y, box_ref(x))
    assert_clean(device)


@pytest.mark.parametrize("first_row", [0, 7, 2**40 + 3])
def test_guard_a_chain_with_ratio_and_per_block_outputs_over_two_devices(pair, first_row):
    """guard: a table indexed by the whole array's offset, a 1:2 pooled output and one record
    per block (its sum and offset), with first_row, over two devices."""
    for d in pair:
        opencl_c_only(d)
    n = 10_000
    x = values(n)
    t5 = np.arange(5, dtype=np.float32) * 10
    chain = cv.chain(cv.link(k(pair[0], "lut5"), reads="in0", writes="t0", args=(t5,)),
                     cv.link(k(pair[0], "pool2"), reads="t0", writes="out0"),
                     cv.link(k(pair[0], "bsum"), reads="t0", writes="out1"),
                     temps=[np.float32])
    report = cv.stream(chain, [x], [cv.rows(np.float32, ratio=(1, 2)),
                                    cv.per_block((2,), np.float32)],
                       device=pair, block_bytes=400, first_row=first_row)
    t = x + t5[(first_row + np.arange(n)) % 5]
    np.testing.assert_array_equal(report.outputs[0], t[0::2] + t[1::2])
    records = report.outputs[1]
    assert len(records) == len(report.block_ranges) == report.blocks
    for (start, stop), (total, offset) in zip(report.block_ranges, records, strict=True):
        assert total == pytest.approx(float(t[start:stop].sum()), rel=1e-5)
        assert offset == np.float32(first_row + start)
    assert sum(r.blocks for r in report.devices) == report.blocks
    for d in pair:
        assert_clean(d)


# -- found: callable links and reducing callables --------------------------------------------
def _one(xb, *, queue, offset, n):
    return xb * 2


def _no_keywords(xb, t):
    return xb * 2


@pytest.mark.parametrize("compute", [_one, _no_keywords])
@pytest.mark.parametrize("warmup", [True, False])
def test_a_callable_link_that_cannot_take_its_call_is_an_input_error_naming_it(device,
                                                                               compute,
                                                                               warmup):
    """A link reading in0 and writing t0 gets two arrays, then queue=, offset=, n=; a plain
    callable of the wrong signature is an InputError saying so (step.check_signature), a
    chain's link a raw TypeError from its warm-up or first block."""
    if device.backend != "opencl":
        pytest.skip("the callable reads PyOpenCL arrays")
    x = values(1000)
    chain = cv.chain(cv.link(compute, reads="in0", writes="t0"),
                     cv.link(k(device, "scale"), reads="t0", writes="out0", args=(1.0,)),
                     temps=[np.float32])
    with pytest.raises(InputError, match=r"link 0 .*queue="):
        cv.stream(chain, [x], [np.zeros_like(x)], device=device, block_bytes=400,
                  warmup=warmup)
    assert_clean(device)


async def _coroutine(x, *, queue, offset, n):
    return 1.0


def _generator(x, *, queue, offset, n):
    yield 1.0


@pytest.mark.parametrize("compute", [_coroutine, _generator])
@pytest.mark.parametrize("rows", [100, 10_000])
@pytest.mark.parametrize("in_chain", [False, True])
def test_an_async_or_generator_reducing_callable_is_refused_saying_so(device, compute, rows,
                                                                      in_chain):
    """Over one block report.result was the coroutine (or generator) object; over several
    an InputError that it "cannot fold", which does not say async def / yield is the fault
    (the message a writing callable gets: step.py)."""
    if device.backend != "opencl":
        pytest.skip("the callable reads PyOpenCL arrays")
    x = values(rows)
    what = compute
    if in_chain:
        what = cv.chain(cv.link(k(device, "scale"), reads="in0", writes="t0", args=(1.0,)),
                        cv.link(compute, reads="t0"), temps=[np.float32])
    with _no_check(), pytest.raises(InputError, match="async def"):
        cv.stream(what, [x], device=device, reduce="sum", block_bytes=4000)
    assert_clean(device)


def test_a_dict_partial_with_sum_is_refused_over_one_block_as_over_two(device):
    if device.backend != "opencl":
        pytest.skip("the callable reads PyOpenCL arrays")

    def counts(x, *, queue, offset, n):
        return {"rows": n}

    with pytest.raises(InputError, match="dict"):
        cv.stream(counts, [np.zeros(20_000, np.float32)], device=device, reduce="sum",
                  block_bytes=4000)  # five blocks: refused today
    with pytest.raises(InputError, match="dict"):
        cv.stream(counts, [np.zeros(100, np.float32)], device=device, reduce="sum",
                  block_bytes=4000)  # one block: {'rows': 100} today
    assert_clean(device)


def test_a_writable_table_in_a_chain_over_two_devices_is_refused_naming_the_link(pair):
    """A device array in a chain's args over two devices is refused as "link 0 ('...'):
    args[0] ..." (round eleven); a writable cv.resident in link 1's args says only "args[0]
    is cv.resident(writable=True)", which could be any link's (multi._chain_for calls
    _args_for with no link to name)."""
    for d in pair:
        opencl_c_only(d)
    x = values(1000)
    counts = np.zeros(8, np.uint32)
    with cv.resident(counts, writable=True) as table:
        chain = cv.chain(cv.link(k(pair[0], "scale"), reads="in0", writes="t0", args=(1.0,)),
                         cv.link(k(pair[0], "hist"), reads="t0", writes="out0",
                                 args=(table,)),
                         temps=[np.float32])
        with pytest.raises(InputError, match=r"link 1 .*args\[0\]"):
            cv.stream(chain, [x], [np.zeros_like(x)], device=pair, halo=1)
    assert not counts.any()
    for d in pair:
        assert_clean(d)


# -- more guards -----------------------------------------------------------------------------
@pytest.mark.parametrize("two", [False, True])
def test_guard_a_failing_chain_with_a_trace_leaves_the_old_trace_file(pair, tmp_path, two):
    """guard: a callable link that raises at block 5, with trace= naming an existing file:
    the error is the callable's, the old file stays as it was, no temporary is left."""
    for d in pair:
        opencl_c_only(d)
    trace = tmp_path / "run.json"
    trace.write_text("OLD")
    calls = []

    def boom(t, o, *, queue, offset, n):
        calls.append(offset)
        if len(calls) == 5:
            raise ZeroDivisionError("block 5")
        return t * 1

    chain = cv.chain(cv.link(boom, reads="in0", writes="t0"),
                     cv.link(k(pair[0], "scale"), reads="t0", writes="out0", args=(2.0,)),
                     temps=[np.float32])
    x = values(10_000)
    with pytest.raises(ZeroDivisionError, match="block 5"):
        cv.stream(chain, [x], [np.zeros_like(x)], device=pair if two else pair[0],
                  block_bytes=400, warmup=False, trace=trace)
    assert trace.read_text() == "OLD"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]
    for d in pair:
        assert_clean(d)


@pytest.mark.parametrize("schedule", ["dynamic", "static"])
@pytest.mark.parametrize("halo", [0, 2])
def test_guard_a_chains_partials_fold_in_block_order_over_two_devices(pair, schedule, halo):
    """guard: reduce=f, a function that is not commutative in what it records, gets every
    block after the first once, in block order, whichever device ran it."""
    for d in pair:
        opencl_c_only(d)
    x = np.arange(10_000, dtype=np.float32)
    order = []

    def part(t, *, queue, offset, n):
        return np.array([offset, n], np.int64)

    def fold(a, b):
        order.append(int(b[0]))
        return np.array([min(a[0], b[0]), a[1] + b[1]])

    chain = cv.chain(cv.link(k(pair[0], "scale"), reads="in0", writes="t0", args=(1.0,)),
                     cv.link(part, reads="t0"), temps=[np.float32])
    report = cv.stream(chain, [x], device=pair, block_bytes=400, reduce=fold,
                       schedule=schedule, halo=halo)
    assert report.result.tolist() == [0, len(x)]
    assert order == [start for start, _ in report.block_ranges[1:]]
    for d in pair:
        assert_clean(d)


@pytest.mark.parametrize("chunk", [1, 7, 5000])
@pytest.mark.parametrize("boundary", ["nearest", "reflect", 0.0])
def test_guard_a_readinto_source_into_halo_callables_a_chain_and_a_reduction(device, chunk,
                                                                            boundary):
    """guard: one buffer filled again for every chunk (of 1 row to the whole input), read by
    a returning halo callable, the same callable as a chain's first link (with its warm-up on
    the first rows), and a halo callable's partials."""
    if device.backend != "opencl":
        pytest.skip("the callable reads PyOpenCL arrays")
    n, h = 5000, 3
    x = values(n)
    p = padded(x, h, boundary)
    ref = p[0:n] + p[2 * h:2 * h + n]

    def source():
        buf = np.empty(chunk, np.float32)

        def chunks():
            for s in range(0, n, chunk):
                m = min(chunk, n - s)
                buf[:m] = x[s:s + m]
                yield buf[:m]
            buf[:] = np.nan

        return cv.iterate(chunks(), length=n)

    def ends(xb, yb, *, queue, offset, n):
        return xb[0:n] + xb[2 * h:2 * h + n]

    def ends_sum(xb, *, queue, offset, n):
        v = xb.get(queue=queue)
        return float((v[0:n] + v[2 * h:2 * h + n]).astype(np.float64).sum())

    common = dict(device=device, halo=h, boundary=boundary, block_bytes=2000)
    y = np.zeros_like(x)
    cv.stream(ends, [source()], [y], **common)
    np.testing.assert_array_equal(y, ref)
    chain = cv.chain(cv.link(ends, reads="in0", writes="t0"),
                     cv.link(k(device, "sq"), reads="t0", writes="out0"), temps=[np.float32])
    cv.stream(chain, [source()], [y], **common)
    np.testing.assert_array_equal(y, ref * ref)
    report = cv.stream(ends_sum, [source()], reduce="sum", **common)
    assert report.result == pytest.approx(float(ref.astype(np.float64).sum()), rel=1e-12)
    assert_clean(device)


@pytest.mark.parametrize("action", ["close", "refresh"])
def test_guard_a_table_closed_or_refreshed_by_a_link_mid_stream_is_refused(device, action):
    """guard: a callable link closing (or refreshing) the cv.resident table a later link
    reads, at block 4: an InputError from the handle, every buffer back, the table usable by
    the next stream."""
    opencl_c_only(device)
    x = values(10_000)
    t5 = np.arange(5, dtype=np.float32) * 10
    calls = []
    with cv.resident(t5) as table:
        def meddle(t, o, *, queue, offset, n):
            calls.append(offset)
            if len(calls) == 4:
                getattr(table, action)()
            return t * 1

        chain = cv.chain(cv.link(meddle, reads="in0", writes="t0"),
                         cv.link(k(device, "lut5"), reads="t0", writes="out0",
                                 args=(table,)), temps=[np.float32])
        with pytest.raises(InputError, match=f"{action} it after the stream returns"):
            cv.stream(chain, [x], [np.zeros_like(x)], device=device, block_bytes=400,
                      warmup=False)
        y = np.zeros_like(x)
        cv.stream(k(device, "lut5"), [x], [y], args=(table,), device=device, block_bytes=400)
    np.testing.assert_array_equal(y, x + t5[np.arange(len(x)) % 5])
    assert_clean(device)


@pytest.mark.parametrize("owner", [0, 1])
@pytest.mark.parametrize("where", ["same", "other", "both"])
@pytest.mark.parametrize("table_kind", ["pinned", "resident of pinned", "kept"])
def test_guard_pinned_arrays_of_one_device_as_inputs_outputs_and_tables_of_another(
        pair, owner, where, table_kind):
    for d in pair:
        opencl_c_only(d)
    n = 10_000
    x = values(n)
    t5 = np.arange(5, dtype=np.float32) * 10
    home = pair[owner]
    target = {"same": home, "other": pair[1 - owner], "both": pair}[where]
    kernel = k(pair[1 - owner] if where == "other" else home, "lut5")
    table = t5.copy() if table_kind == "kept" else cv.pinned.asarray(t5, device=home)
    x_in = cv.pinned.asarray(x, device=home)
    y = cv.pinned.zeros_like(x, device=home)
    try:
        if table_kind == "kept":
            cv.keep_pinned(table)
        if table_kind == "resident of pinned":
            with cv.resident(table) as handle:
                cv.stream(kernel, [x_in], [y], args=(handle,), device=target, block_bytes=400)
            del handle  # it holds the pinned table
        else:
            cv.stream(kernel, [x_in], [y], args=(table,), device=target, block_bytes=400)
    finally:
        cv.release_pinned()
    np.testing.assert_array_equal(y, x + t5[np.arange(n) % 5])
    del table, x_in, y
    for d in pair:
        assert_clean(d)


def test_guard_a_reducing_chains_report_over_two_devices_pickles_with_its_timeline(pair,
                                                                                  tmp_path):
    import pickle

    for d in pair:
        opencl_c_only(d)
    x = np.arange(10_000, dtype=np.float32)

    def part(t, *, queue, offset, n):
        return t.get(queue=queue).astype(np.float64).sum()

    chain = cv.chain(cv.link(k(pair[0], "scale"), reads="in0", writes="t0", args=(1.0,)),
                     cv.link(part, reads="t0"), temps=[np.float32])
    report = cv.stream(chain, [x], device=pair, block_bytes=400, reduce="sum")
    again = pickle.loads(pickle.dumps(report))
    assert again.result == report.result == float(x.astype(np.float64).sum())
    assert str(again) == str(report)
    assert [r.blocks for r in again.devices] == [r.blocks for r in report.devices]
    assert len(again.timeline.spans) == len(report.timeline.spans)
    again.timeline.save(tmp_path / "again.json")
    assert json.loads((tmp_path / "again.json").read_text())
    for d in pair:
        assert_clean(d)
