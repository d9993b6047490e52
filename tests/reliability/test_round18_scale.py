"""Round eighteen, helper A: counts at their extremes (small data, large counts): streams of
thousands of one-row blocks, reductions over many blocks, many arrays and links, rows of 64
dimensions, many contexts, very long kernel names.

Found (strict xfails, each asserting the right behaviour):

- A reduction keeps every block's partial until the stream ends and folds them only then
  (``Reduction.collect`` appends to a list; ``combine`` runs in ``result()``): a callable's
  array partials (``np.bincount(x, minlength=K)``, which the README suggests) cost blocks x K
  of host memory at once (500 blocks of 64 KiB partials: 36 MB traced), and ``reduce=f`` is
  first called after the last block has run, not as the blocks retire.
- A kernel name of 253 characters or more aborts the process (SIGABRT, "Final linking of
  kernel ... failed." from PoCL) inside ``device.compile``: the program's binaries are asked
  for (``build_binary``; a launch does it too), and PoCL's final link of the kernel fails with
  an abort (252 characters work: a file name of 255 bytes, it seems). Any kernel of the
  source does it, not only the one asked for.
- ``cv.per_block(shape)`` of 64 dimensions is NumPy's raw ``ValueError: maximum supported
  dimension for an ndarray is currently 64, found 65`` (the record shape plus the blocks
  axis); ``cv.rows(shape=...)`` of 64 dimensions is an InputError that says the output is
  "more than this host can allocate" (32 bytes).
- The host-memory check (a stream that needs more than the host's memory is refused before
  anything is allocated) counts the pinned staging ring as the device bins it (512 bytes a
  buffer at least) and without its two extra entries: a pinned entry is a page (4 KiB) at
  least, so a deep ring of small blocks pins 8 times what was checked (depth=10**6 over
  10**6 one-row float32 blocks: 2 GB checked, 8 GB pinned, on a 4 MB input).
- ``cv.raw(path, dtype, shape=(-1, 2**62))`` of an empty file is taken (its ``-1`` makes
  the product of the non-zero dimensions negative in ``_check_dims``), where ``(0, 2**62)``
  is refused at once; the stream then says a 0-byte output is "more than this host can
  allocate".

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    assert_clean,
    data,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    kernel,
    stencil_reference,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402
from conveyor.trace.timeline import Span, Timeline  # noqa: E402

SRC = str(Path(cv.__file__).resolve().parents[1])  # the conveyor under test, for children


def _child_env() -> dict[str, str]:
    path = os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path.rstrip(os.pathsep))


# -- reductions over many blocks ---------------------------------------------------------------
def test_a_custom_fold_runs_as_blocks_retire_not_after_the_last(device):
    """``reduce=f`` over 64 one-row blocks: by the time the last block's callable runs, every
    block that left the ring (all but the last ``depth``) has been folded. Today no fold has
    run then: every partial is kept in a list and folded after the stream."""
    x = np.arange(64, dtype=np.float32)
    folds = [0]
    at_last: list[int] = []

    def partial(x, *, queue, offset, n):
        if offset + n == 64:
            at_last.append(folds[0])
        return np.ones(4, np.int64)

    def fold(a, b):
        folds[0] += 1
        return a + b

    report = cv.stream(partial, [x], device=device, block_bytes=4, reduce=fold, depth=2)
    np.testing.assert_array_equal(report.result, np.full(4, 64))
    assert folds[0] == 63
    assert at_last and at_last[0] >= 64 - report.depth - 2, (
        f"{at_last[0]} folds before the last block: the partials wait for the stream's end")


def test_a_callable_sum_of_array_partials_holds_a_few_partials_not_one_per_block(device):
    """``reduce="sum"`` over 200 one-row blocks whose partials are 32 KiB arrays (a histogram
    of 4096 bins, as ``np.bincount(x, minlength=4096)`` gives): the host holds a few partials
    at a time (the ring's), not 200 of them (6.4 MB). Folding as blocks retire keeps the
    memory of a reduction bounded whatever the block count."""
    blocks, bins = 200, 4096
    x = np.arange(blocks, dtype=np.float32)

    def hist(x, *, queue, offset, n):
        counts = np.zeros(bins, np.int64)
        counts[offset % bins] = n
        return counts

    cv.stream(hist, [x[:8]], device=device, block_bytes=4, reduce="sum")  # warm: pools, code
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        report = cv.stream(hist, [x], device=device, block_bytes=4, reduce="sum")
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    expected = np.zeros(bins, np.int64)
    expected[:blocks] = 1
    np.testing.assert_array_equal(report.result, expected)
    assert peak < 2 * 2**20, f"{peak} bytes traced for {blocks} partials of {bins * 8} bytes"


# -- deep rings of small blocks -------------------------------------------------------------------
def test_a_deep_ring_of_small_blocks_is_checked_against_the_pinned_pages_it_takes(
        device, monkeypatch):
    """On a host of 6 MiB (``hostmem.total`` says so), a copying stream of 1,000 one-row
    float32 blocks in a ring of depth 1,000 pins a page per input and output entry (1,002 x 2
    x 4 KiB = 8.2 MB), beside its device ring: refused before any block, as the README
    says. Today the check counts 2 MB (the device's 512-byte bins) and the stream runs."""
    from conveyor.memory import hostmem

    monkeypatch.setattr(hostmem, "total", lambda: 6 * 2**20)
    x = np.arange(1000, dtype=np.float32)
    y = np.zeros_like(x)
    pool = device.pinned_pool
    pool.reset_peak()  # the shared device's pool: earlier tests' peaks
    with pytest.raises(InputError, match="host"):
        cv.stream(kernel(device, "scale"), [x], [y], device=device, block_bytes=4,
                  depth=1000, args=(np.float32(2),), zero_copy=False)
    assert pool.stats().peak_in_use_bytes < 6 * 2**20


# -- kernel names --------------------------------------------------------------------------------
def test_a_very_long_kernel_name_is_an_error_not_an_abort(device):
    """A kernel named with 253 characters (a generated name, say): ``device.compile`` and a
    stream either work or raise conveyor's error; today the child process dies with SIGABRT
    inside ``compile`` (PoCL: "Final linking of kernel ... failed.")."""
    if "pthread" not in device.name and "cpu" not in device.name.lower():
        pytest.skip("PoCL's limit: the check runs on the CPU device")
    code = f"""
        import numpy as np, conveyor as cv
        from conveyor.errors import CompileError, InputError
        dev = cv.device({device.spec!r}, warm_up=False)
        name = "k" * 253
        src = ("__kernel void " + name + "(__global const float *x, __global float *y, "
               "ulong offset, ulong n) {{ ulong i = get_global_id(0); if (i < n) y[i] = x[i]; }}")
        try:
            k = dev.compile(cv.portable(src), name)
            x = np.arange(10, dtype=np.float32)
            y = np.zeros_like(x)
            cv.stream(k, [x], [y], device=dev)
            print("streamed", np.array_equal(x, y))
        except (CompileError, InputError) as exc:
            print("refused", type(exc).__name__, str(exc)[:200])
        """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=_child_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-300:])
    assert done.stdout.startswith(("streamed True", "refused")), done.stdout


# -- rows of many dimensions -------------------------------------------------------------------
def test_a_per_block_record_of_64_dimensions_is_an_input_error(device):
    """``cv.per_block((1,) * 64, ...)`` makes an output of 65 dimensions (blocks first), past
    NumPy's 64: conveyor's InputError naming the record shape, not NumPy's ValueError from
    ``np.empty`` in ``PerBlock.sink``."""
    x = np.arange(8, dtype=np.float32)
    with pytest.raises(InputError, match="per_block"):
        cv.stream(_writes_nothing, [x], [cv.per_block((1,) * 64, np.float32)], device=device,
                  block_bytes=16)


def test_a_ratio_output_of_64_dimensions_says_dimensions_not_memory(device):
    """``cv.rows(np.float32, shape=(1,) * 64)``: 8 rows of one element each (32 bytes) in 65
    dimensions. The InputError says the dimensions are too many (NumPy holds 64), not that
    the host cannot allocate 32 bytes."""
    x = np.arange(8, dtype=np.float32)
    with pytest.raises(InputError) as caught:
        cv.stream(_writes_nothing, [x], [cv.rows(np.float32, shape=(1,) * 64)], device=device,
                  block_bytes=16)
    message = str(caught.value)
    assert "dimension" in message and "allocate" not in message, message


def test_a_raw_shape_of_minus_one_past_any_array_is_refused_as_zero_rows_is(tmp_path):
    """``cv.raw`` of an empty file with ``shape=(-1, 2**62)`` (0 rows of 2**62 float32s, 2**64
    bytes a row) is refused at once, as ``shape=(0, 2**62)`` is: no NumPy array has such a
    row. Today the ``-1`` passes ``_check_dims`` and the stream later says a 0-byte output is
    more than the host can allocate."""
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="2\\*\\*63"):
        cv.raw(empty, np.float32, (0, 2**62))
    with pytest.raises(InputError, match="2\\*\\*63"):
        cv.raw(empty, np.float32, (-1, 2**62))


def _writes_nothing(x, y, *, queue, offset, n):
    """A callable that leaves its output as it is (no kernel build)."""


def test_inputs_of_64_dimensions_with_a_halo_match_numpy(device):
    """guard: an input of 64 dimensions (rows of 1 x ... x 3) through a stencil with a halo
    of 2 over blocks of 4 rows: every row's window as NumPy computes it."""
    x = data((64,) + (1,) * 62 + (3,), np.float32, 3)
    y = np.zeros_like(x)
    cv.stream(kernel(device, "sten"), [x], [y], device=device, args=(3, 2), halo=2,
              block_bytes=4 * 3 * 4)
    np.testing.assert_array_equal(y.reshape(64, 3), stencil_reference(x.reshape(64, 3), 2))


# -- many blocks, arrays, links, contexts -------------------------------------------------------
def test_the_timeline_figures_of_many_spans_take_one_sweep():
    """guard: a timeline of 60,000 spans (20,000 blocks of copy-in, compute, copy-out), its
    overlap, bound, busy and idle figures and its Chrome trace. Measured copy by kernel this
    took minutes (round 11); one sweep takes a fraction of a second. No timing is asserted:
    a quadratic loop here would stall the suite, which is what this guards."""
    spans = []
    for block in range(20_000):
        t = block * 300
        spans += [Span("copy-in", block, t, t + 100, 4), Span("compute", block, t + 50, t + 250),
                  Span("copy-out", block, t + 200, t + 300, 4)]
    timeline = Timeline(spans, start_ns=0)
    assert timeline.overlap == pytest.approx(0.5)
    assert timeline.bound == "compute"
    assert timeline.busy_ns("copy-in") == 20_000 * 100
    assert timeline.idle_ns == 20_000 * 300 - 20_000 * 200
    assert len(timeline.to_chrome_trace()["traceEvents"]) > 60_000


def test_three_thousand_one_row_blocks_copied(device):
    """guard: 3,000 copied blocks of one row each: every row, the blocks' ranges, one
    compute span per block, and nothing left in use."""
    x = np.arange(3000, dtype=np.float32)
    y = np.zeros_like(x)
    report = cv.stream(kernel(device, "scale"), [x], [y], device=device, block_bytes=4,
                       args=(np.float32(2),), zero_copy=False)
    np.testing.assert_array_equal(y, 2 * x)
    assert report.blocks == 3000
    assert len(report.timeline.lane("compute")) == 3000
    np.testing.assert_array_equal(report.block_ranges[:, 0], np.arange(3000))
    assert_clean(device)


def test_fifty_links_and_forty_nine_temps(device):
    """guard: a chain of 50 ``scale`` links (each doubling) through 49 temps over 10 blocks:
    x * 2**50 exactly, and one compute span per link and block, each link titled."""
    scale = kernel(device, "scale")
    names = ["in0", *(f"t{i}" for i in range(49)), "out0"]
    links = [cv.link(scale, names[i], names[i + 1], args=(np.float32(2),)) for i in range(50)]
    x = data((1000,), np.float32, 5)
    y = np.zeros_like(x)
    report = cv.stream(cv.chain(*links, temps=[np.float32] * 49), [x], [y], device=device,
                       block_bytes=400)
    np.testing.assert_array_equal(y, x * np.float32(2.0**50))
    compute = report.timeline.lane("compute")
    assert len(compute) == 50 * report.blocks
    assert len({s.label for s in compute}) == 50


def test_forty_inputs_and_twenty_outputs_in_one_stream(device):
    """guard: one kernel of 40 inputs and 20 outputs (60 buffers a slot), over 10 blocks."""
    params = ", ".join([f"__global const float *a{i}" for i in range(40)]
                       + [f"__global float *y{j}" for j in range(20)])
    total = " + ".join(f"a{i}[i]" for i in range(40))
    writes = " ".join(f"y{j}[i] = s * {j + 1}.0f;" for j in range(20))
    source = (f"__kernel void wide(\n{params}, ulong offset, ulong n) {{\n"
              f"ulong i = get_global_id(0); if (i < n) {{ float s = {total}; {writes} }} }}")
    k = device.compile(cv.portable(source), "wide")
    xs = [np.full(100, i, np.float32) for i in range(40)]
    ys = [np.zeros(100, np.float32) for _ in range(20)]
    cv.stream(k, xs, ys, device=device, block_bytes=40, zero_copy=False)
    for j, y in enumerate(ys):
        np.testing.assert_array_equal(y, np.full(100, sum(range(40)) * (j + 1), np.float32))
    assert_clean(device)


def test_twenty_contexts_of_one_device_leave_no_descriptor_or_thread(device):
    """guard: twenty fresh contexts of the device, each with a kernel and a copying stream,
    each closed: no file descriptor and no thread more than after the first."""
    if device.backend != "opencl":
        pytest.skip("a second context is made for OpenCL devices")
    from conveyor.backends import opencl

    platform, index = (int(part) for part in device.spec.split(":")[1:])
    x = data((1000,), np.float32, 7)
    counts = []
    for _ in range(20):
        fresh = opencl.Device(device.cl_device, platform, index)
        try:
            y = np.zeros_like(x)
            cv.stream(kernel(fresh, "scale"), [x], [y], device=fresh, block_bytes=400,
                      args=(np.float32(3),), zero_copy=False)
            np.testing.assert_array_equal(y, x * np.float32(3))
        finally:
            gc.collect()
            fresh.close()
        del fresh
        gc.collect()
        counts.append((len(os.listdir("/proc/self/fd")), threading.active_count()))
    assert counts[-1][0] <= counts[0][0] and counts[-1][1] <= counts[0][1], counts
