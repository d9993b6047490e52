"""Round sixteen, what conveyor reports about a stream: the Report's byte counts, blocks,
peak device memory, overlap, bound and exposed transfer checked against what the stream did
(bytes counted here for maps, halos, reductions, chains, per-block and ratio outputs, files,
zero-copy, two devices, no rows, one block, a failure part way), the Chrome trace (standard
JSON, every block once), ``timeline.plot`` with odd titles and link names, and the command's
``--json`` against its ``--trace``.

Found (strict xfails, each asserting the right behaviour):

- On several devices each engine takes its clock anchor (the timeline's start) before it
  waits for the other engines to be built: a device whose set-up is slow (a callable's
  warm-up loading its modules) moves the start of the merged timeline, and of every faster
  device's own timeline, back by that set-up. ``exposed_transfer_seconds`` and
  ``device_idle_seconds`` then count it (0.51 s of "exposed transfer" for a stream that ran
  for 20 ms), and the trace shows every block half a second after its start.
- On several devices ``exposed_transfer_seconds`` (wall minus the union of every device's
  compute) counts a copy on one device as hidden under a kernel on another, the flaw round
  seven fixed for ``overlap``: overlap 0 and exposed transfer 0 at once. ``bound`` takes
  each lane's union over the devices too: two devices each busier computing (100 ns) than
  copying (60 ns) report ``copy-in`` when their copies are staggered.
- ``report.devices[i].block_ranges`` gives the rows of blocks 0, 1, ... whatever blocks that
  device ran (a static split: the second device ran blocks 10-19, its ranges say 0-9).
- A device of a stream over several that ran no block prints "nothing to do (zero-length
  inputs)" for inputs of 100 rows; a stream of no rows over two devices has no per-device
  report at all (``report.devices == []``), where the README promises one per device.
- ``timeline.plot(title=...)`` hands the title to matplotlib as mathtext (``"$x$"`` drawn as
  math, ``r"$\\frac$"`` a raw ValueError after the drawing began), where a link's name is
  drawn as text; a title or a link name with a lone surrogate is a raw TypeError from
  matplotlib's font code.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import pickle
import sys
import threading
import time
import warnings
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import data, kernel, stencil_reference  # noqa: E402

import conveyor as cv  # noqa: E402
from conveyor.cli import main  # noqa: E402
from conveyor.errors import InputError  # noqa: E402
from conveyor.kernels.portable import PRELUDE  # noqa: E402
from conveyor.trace.timeline import Span, Timeline  # noqa: E402

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


from reliakit import first_device_only  # noqa: E402, F401 (autouse: first device only)


def _strict_json(text: str):
    """``text`` parsed as standard JSON: NaN, Infinity and -Infinity are refused."""
    def refuse(constant):
        raise ValueError(f"not standard JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def _per_title(document) -> dict[str, list[int]]:
    """The block index of every slice of a Chrome trace, by slice title (lane, or
    ``compute:link``), over every device (process) of it."""
    found: dict[str, list[int]] = defaultdict(list)
    for event in document["traceEvents"]:
        if event["ph"] == "X":
            title, _, block = event["name"].rpartition(" ")
            assert int(block) == event["args"]["block"], event
            found[title].append(event["args"]["block"])
    return found


# == the figures against bytes counted here ======================================================
def _make(kind: str, devs, tmp_path: Path):
    """A stream of ``kind`` on ``devs`` (a device or a list), with the bytes in and out that
    it moves by the README's rule (the caller's data: halo re-reads not counted, reductions
    have no output)."""
    first = devs[0] if isinstance(devs, list) else devs
    scale = kernel(first, "scale")
    x = data((20_000,), np.float32, 1)
    if kind == "map":
        report = cv.stream(scale, [x], [np.float32], args=(2.0,), device=devs, block_bytes=4000,
                           zero_copy=False)
        np.testing.assert_array_equal(report.outputs[0], x * np.float32(2))
        return report, x.nbytes, x.nbytes
    if kind == "zero-copy":
        report = cv.stream(scale, [x], [np.float32], args=(2.0,), device=devs, block_bytes=4000)
        return report, x.nbytes, x.nbytes
    if kind == "halo":
        m = data((3000, 3), np.float32, 2)
        report = cv.stream(kernel(first, "sten"), [m], [np.float32], args=(3, 2), halo=2,
                           device=devs, block_bytes=3600)
        np.testing.assert_array_equal(report.outputs[0], stencil_reference(m, 2))
        return report, m.nbytes, m.nbytes
    if kind == "reduce":
        report = cv.stream(kernel(first, "ident"), [x], reduce="sum", device=devs,
                           block_bytes=4000, zero_copy=False)
        assert report.result == pytest.approx(float(x.astype(np.float64).sum()))
        return report, x.nbytes, 0
    if kind == "per-block":
        report = cv.stream(scale, [x], [cv.per_block((3,), np.float32)], args=(2.0,),
                           device=devs, block_bytes=4000)
        return report, x.nbytes, report.blocks * 3 * 4
    if kind == "ratio":
        report = cv.stream(scale, [x], [cv.rows(np.float32, ratio=(1, 4))], args=(2.0,),
                           device=devs, block_bytes=4000)
        return report, x.nbytes, x.nbytes // 4
    if kind == "chain":
        chain = cv.chain(cv.link(scale, "in0", "t0", args=(2.0,)),
                         cv.link(scale, "t0", "out0", args=(3.0,)), temps=[np.float32])
        report = cv.stream(chain, [x], [np.float32], device=devs, block_bytes=4000,
                           zero_copy=False)
        np.testing.assert_array_equal(report.outputs[0], x * np.float32(2) * np.float32(3))
        return report, x.nbytes, x.nbytes  # the temp is the device's, not the caller's
    # files: a .npy in, a .npy out
    np.save(tmp_path / "in.npy", x)
    report = cv.stream(scale, [str(tmp_path / "in.npy")], [cv.npy_out(tmp_path / "out.npy")],
                       args=(2.0,), device=devs, block_bytes=4000)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), x * np.float32(2))
    return report, x.nbytes, x.nbytes


KINDS = ["map", "zero-copy", "halo", "reduce", "per-block", "ratio", "chain", "files"]


@pytest.mark.parametrize("several", [False, True], ids=["one device", "two devices"])
def test_guard_bytes_and_blocks_are_what_the_stream_moved(device, pair, tmp_path, several):
    """guard: bytes in and out are the caller's data (counted here) for maps, zero-copy,
    halos, reductions, per-block and ratio outputs, chains and files; the copy-out lane
    carries exactly the output's bytes; every block is in the compute lane once; on two
    devices the devices' blocks and bytes add up to the stream's."""
    for kind in KINDS:
        report, want_in, want_out = _make(kind, pair if several else device, tmp_path)
        assert (report.bytes_in, report.bytes_out) == (want_in, want_out), kind
        timeline = report.timeline
        assert sorted(s.block for s in timeline.lane("compute") if not s.label) == \
            list(range(report.blocks)) or kind == "chain", kind
        if kind != "reduce" and not report.zero_copy:
            assert sum(s.nbytes for s in timeline.lane("copy-out")) == want_out, kind
        if kind in ("map", "files", "per-block", "ratio"):
            assert sum(s.nbytes for s in timeline.lane("copy-in")) == want_in, kind
        if several:
            assert len(report.devices) == 2, kind
            assert sum(d.blocks for d in report.devices) == report.blocks, kind
            assert sum(d.bytes_in for d in report.devices) == want_in, kind
            assert sum(d.bytes_out for d in report.devices) == want_out, kind


def test_guard_peak_device_bytes_is_what_the_pool_held(device):
    """guard: ``peak_device_bytes`` equals the device pool's own peak of bytes in use over
    the stream, for a staged map, a reduction, a halo, a chain's temps and a resident table
    kept across streams (counted while the stream uses it)."""
    x = data((20_000,), np.float32, 1)
    m = data((3000, 3), np.float32, 2)
    scale = kernel(device, "scale")
    chain = cv.chain(cv.link(scale, "in0", "t0", args=(2.0,)),
                     cv.link(scale, "t0", "out0", args=(3.0,)), temps=[np.float32])
    streams = [
        lambda: cv.stream(scale, [x], [np.float32], args=(2.0,), device=device,
                          block_bytes=4000, zero_copy=False),
        lambda: cv.stream(kernel(device, "ident"), [x], reduce="max", device=device,
                          block_bytes=4000, zero_copy=False),
        lambda: cv.stream(kernel(device, "sten"), [m], [np.float32], args=(3, 2), halo=2,
                          device=device, block_bytes=3600),
        lambda: cv.stream(chain, [x], [np.float32], device=device, block_bytes=4000,
                          zero_copy=False),
    ]
    pool = device.memory_pool
    for run in streams:
        pool.reset_peak()
        report = run()
        assert report.peak_device_bytes == pool.stats().peak_in_use_bytes
        assert report.peak_device_bytes > 0


# == the Chrome trace ============================================================================
def _callable_double(x, y, *, queue, offset, n):
    return x * 2


@pytest.mark.parametrize("kind", ["chain reduce", "halo", "callable", "depth 1"])
def test_guard_every_block_is_in_the_trace_once_per_lane_on_two_devices(pair, tmp_path, kind):
    """guard: in the Chrome trace of a stream over two devices (dynamic supply), every lane
    and every link of a chain holds each block exactly once over both devices, the trace is
    standard JSON, and the Python timeline holds the same slices."""
    scale, ident = kernel(pair[0], "scale"), kernel(pair[0], "ident")
    x = data((20_000,), np.float32, 3)
    trace = tmp_path / "t.json"
    if kind == "chain reduce":
        chain = cv.chain(cv.link(scale, "in0", "t0", args=(2.0,), name='a "q" \u00fc\\'),
                         cv.link(ident, "t0", "reduce"), temps=[np.float32])
        report = cv.stream(chain, [x], device=pair, reduce="max", block_bytes=4000,
                           zero_copy=False, trace=trace)
        assert report.result == np.max(x * np.float32(2))
    elif kind == "halo":
        m = data((3000, 3), np.float32, 4)
        report = cv.stream(kernel(pair[0], "sten"), [m], [np.float32], args=(3, 1), halo=1,
                           device=pair, block_bytes=3600, trace=trace)
    elif kind == "callable":
        report = cv.stream(_callable_double, [x], [np.float32], device=pair, block_bytes=4000,
                           trace=trace)
    else:
        report = cv.stream(scale, [x], [np.float32], args=(2.0,), device=pair, depth=1,
                           block_bytes=4000, zero_copy=False, trace=trace)
    assert report.trace_file == str(trace)
    document = _strict_json(trace.read_text())
    titles = _per_title(document)
    assert "compute" in titles or kind == "chain reduce"
    for title, blocks in titles.items():
        assert sorted(blocks) == list(range(report.blocks)), title
    assert sum(len(b) for b in titles.values()) == len(report.timeline.spans)
    if kind == "chain reduce":
        assert 'compute:a "q" \u00fc\\' in titles and "compute:ident_float32" in titles


# == block ranges and per-block records ==========================================================
FIRST = """__kernel void first(__global const float *x, __global float *r, ulong offset,
                            ulong n) {
    if (get_global_id(0) == 0) { r[0] = (float)offset; r[1] = (float)n; r[2] = x[0]; }
}"""


@pytest.mark.parametrize("shape", [(1001,), (333, 3), (1,)])
def test_guard_per_block_records_match_block_ranges_on_two_devices(pair, shape):
    """guard: over two devices, record k of a per-block output is block k's (its first
    element's offset, its element count, its first value), and the stream's
    ``block_ranges`` are those rows, for rows a block does not divide, N-D rows and one row."""
    k = pair[0].compile(cv.portable(FIRST), "first")
    x = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    report = cv.stream(k, [x], [cv.per_block((3,), np.float32)], device=pair, block_bytes=400)
    ranges = report.block_ranges
    cols = math.prod(shape[1:])
    want = np.stack([ranges[:, 0] * cols, (ranges[:, 1] - ranges[:, 0]) * cols,
                     ranges[:, 0] * cols], axis=1).astype(np.float32)
    np.testing.assert_array_equal(report.outputs[0], want)
    assert ranges[-1, 1] == shape[0] and report.bytes_out == report.blocks * 12


def test_each_devices_block_ranges_are_the_blocks_it_ran(pair):
    x = data((20_000,), np.float32, 5)
    report = cv.stream(kernel(pair[0], "scale"), [x], [np.float32], args=(2.0,), device=pair,
                       block_bytes=4000, zero_copy=False, schedule="static")
    for own in report.devices:
        ran = sorted(s.block for s in own.timeline.lane("compute"))
        assert len(ran) == own.blocks
        # The rows [start, stop) of the blocks this device ran (the second ran 10-19; its
        # block_ranges said rows 0-10000).
        assert own.block_ranges.tolist() == report.block_ranges[ran].tolist()


def test_a_device_that_ran_no_block_does_not_say_the_inputs_are_empty(pair):
    x = data((100,), np.float32, 6)
    report = cv.stream(kernel(pair[0], "scale"), [x], [np.float32], args=(2.0,), device=pair,
                       block_bytes=4000, zero_copy=False, schedule="static")
    idle = [own for own in report.devices if own.blocks == 0]
    assert report.blocks == 1 and len(idle) == 1
    assert "zero-length" not in str(idle[0]), str(idle[0])


def test_a_stream_of_no_rows_over_two_devices_reports_each_device(pair):
    x = np.zeros(0, np.float32)
    report = cv.stream(kernel(pair[0], "scale"), [x], [np.float32], args=(2.0,), device=pair)
    assert report.blocks == 0 and "nothing to do" in str(report)
    assert [own.blocks for own in report.devices] == [0, 0]  # README: one Report per device


# == the timeline's start and the figures over several devices ==================================
def test_a_slow_device_set_up_is_not_counted_in_another_devices_timeline(pair):
    slow = pair[1].cl_device if pair[1].backend == "opencl" else None
    if slow is None or slow == pair[0].cl_device:
        pytest.skip("tells two OpenCL devices apart by their queues")
    warmed: list[int] = []
    first_warm = threading.Event()

    def double(x, y, *, queue, offset, n):
        if queue.device != slow:
            first_warm.set()  # the first device's warm-up call: its anchor follows at once
        elif not warmed:  # the warm-up call on the second device
            first_warm.wait(10)
            time.sleep(0.2)  # a module load (CuPy, PyTorch) on that device
            warmed.append(time.perf_counter_ns())
        return x * 2

    x = data((8000,), np.float32, 7)
    report = cv.stream(double, [x], [np.float32], device=pair, block_bytes=4000,
                       schedule="static")
    np.testing.assert_array_equal(report.outputs[0], x * np.float32(2))
    assert warmed, "the second device's warm-up call ran"
    # No engine starts its first block before every engine is built (multi.py's barrier),
    # so no device's timeline, nor the stream's, begins before the warm-up ended: was 0.2 s
    # before it, and that wait was counted as exposed transfer and device idle time.
    for own in report.devices:
        assert own.timeline.origin_ns >= warmed[0], own.device
    assert report.timeline.origin_ns >= warmed[0]


def _staggered(first: list[Span], second: list[Span]) -> Timeline:
    """A timeline of two devices, ``a`` running ``first`` and ``b`` running ``second``."""
    timeline = Timeline([*(replace(s, device="a") for s in first),
                         *(replace(s, device="b") for s in second)])
    timeline.devices = ["a", "b"]
    return timeline


def test_exposed_transfer_counts_each_devices_copies_against_its_own_kernels():
    # Device a copies then computes; device b computes then copies: no copy of either runs
    # under its own kernel (overlap 0), yet one device's kernel covers the other's copy.
    timeline = _staggered([Span("copy-in", 0, 0, 100, 64), Span("compute", 0, 100, 200)],
                          [Span("compute", 1, 0, 100), Span("copy-in", 1, 100, 200, 64)])
    assert timeline.overlap == 0.0
    exposed = timeline.exposed_transfer_ns
    assert exposed is not None and exposed > 0  # was 0: "perfect overlap"


def test_bound_of_two_compute_bound_devices_is_compute():
    # Each device computes 100 ns and copies 60 ns: both are compute-bound. Their kernels
    # run at once, their copies one after the other (the union of copy-in is 120 ns).
    timeline = _staggered([Span("copy-in", 0, 0, 60, 64), Span("compute", 0, 0, 100)],
                          [Span("copy-in", 1, 60, 120, 64), Span("compute", 1, 0, 100)])
    for device in ("a", "b"):
        own = Timeline([s for s in timeline.spans if s.device == device])
        assert own.bound == "compute"
    assert timeline.bound == "compute"  # was "copy-in"


# == pickling and a failure part way =============================================================
def test_guard_a_pickled_report_of_two_devices_keeps_every_figure(pair):
    """guard: a report over two devices pickles with its timeline (and its devices'): the
    copy has the same figures, table and per-device reports."""
    x = data((20_000,), np.float32, 8)
    report = cv.stream(kernel(pair[0], "scale"), [x], [np.float32], args=(2.0,), device=pair,
                       block_bytes=4000, zero_copy=False, schedule="static")
    again = pickle.loads(pickle.dumps(report))
    for name in ("overlap", "bound", "busy_seconds", "exposed_transfer_seconds", "imbalance",
                 "blocks", "bytes_in", "bytes_out", "peak_device_bytes"):
        assert getattr(again, name) == getattr(report, name), name
    assert str(again) == str(report)
    assert [len(d.timeline) for d in again.devices] == [len(d.timeline) for d in report.devices]
    np.testing.assert_array_equal(again.outputs[0], x * np.float32(2))


def test_guard_a_stream_failing_part_way_leaves_the_old_trace_and_output(device, tmp_path):
    """guard: a callable that fails at block 3 of a file stream with trace=: the old trace
    and the old output file are as they were, and no temporary file is left beside them."""
    if device.backend != "opencl":
        pytest.skip("the callable does arithmetic on PyOpenCL arrays")
    (tmp_path / "t.json").write_text("OLD")
    np.save(tmp_path / "o.npy", np.zeros(3))

    def fails(x, y, *, queue, offset, n):
        if offset >= 3000:
            raise ZeroDivisionError("block 3")
        return x * 2

    x = data((20_000,), np.float32, 9)
    with pytest.raises(ZeroDivisionError):
        cv.stream(fails, [x], [cv.npy_out(tmp_path / "o.npy")], device=device,
                  block_bytes=4000, trace=tmp_path / "t.json")
    assert sorted(os.listdir(tmp_path)) == ["o.npy", "t.json"]
    assert (tmp_path / "t.json").read_text() == "OLD"
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), np.zeros(3))


# == timeline.plot with odd titles and link names ================================================
def _plot_or_refuse(timeline: Timeline, path: Path, **kw) -> None:
    """Draw, or refuse with conveyor's own InputError: never a matplotlib error."""
    try:
        timeline.plot(path, **kw)
    except InputError:
        return
    assert path.stat().st_size > 0


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="needs matplotlib")
@pytest.mark.parametrize("title", [r"cost $\frac$", "\ud800"], ids=["mathtext", "surrogate"])
def test_an_odd_plot_title_is_drawn_as_text_or_refused(device, tmp_path, title):
    x = data((2000,), np.float32, 10)
    report = cv.stream(kernel(device, "scale"), [x], [np.float32], args=(2.0,), device=device,
                       block_bytes=4000, zero_copy=False)
    _plot_or_refuse(report.timeline, tmp_path / "p.png", title=title)


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="needs matplotlib")
def test_a_link_name_with_a_lone_surrogate_is_refused_or_plotted(device, tmp_path):
    scale = kernel(device, "scale")
    try:
        first = cv.link(scale, "in0", "t0", args=(2.0,), name="odd \ud800")
    except InputError:
        return
    chain = cv.chain(first, cv.link(scale, "t0", "out0", args=(3.0,)), temps=[np.float32])
    x = data((2000,), np.float32, 11)
    report = cv.stream(chain, [x], [np.float32], device=device, block_bytes=4000,
                       zero_copy=False, trace=tmp_path / "t.json")
    _strict_json((tmp_path / "t.json").read_text())
    _plot_or_refuse(report.timeline, tmp_path / "p.png")


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="needs matplotlib")
def test_guard_link_names_of_quotes_unicode_and_length_are_traced_and_plotted(device, tmp_path):
    """guard: link names of quotes, backslashes, a newline, mathtext, emoji and 5,000
    characters are each one slice title per block in the standard-JSON trace, and plot."""
    scale = kernel(device, "scale")
    x = data((2000,), np.float32, 12)
    for name in ['"q" \\ \n', r"$\frac$", "\U0001f600" * 20, "L" * 5000]:
        chain = cv.chain(cv.link(scale, "in0", "t0", args=(2.0,), name=name),
                         cv.link(scale, "t0", "out0", args=(3.0,)), temps=[np.float32])
        report = cv.stream(chain, [x], [np.float32], device=device, block_bytes=4000,
                           zero_copy=False, trace=tmp_path / "t.json")
        titles = _per_title(_strict_json((tmp_path / "t.json").read_text()))
        assert titles[f"compute:{name}"] == list(range(report.blocks))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # matplotlib: no tight layout for 5,000 chars
            report.timeline.plot(tmp_path / "p.png")
        assert (tmp_path / "p.png").stat().st_size > 0


# == the command's --json against its --trace ====================================================
CLI_KERNEL = PRELUDE + """
__kernel void dbl(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}
"""


def test_guard_cli_json_figures_agree_with_its_trace(device, tmp_path, monkeypatch, capsys):
    """guard: ``conveyor map --json --trace`` over 30 blocks: the JSON's blocks and bytes
    are the trace's (each lane once per block, its bytes the input's and output's), its
    overlap is in [0, 1], its bound a work lane, and the output is right."""
    if device.backend != "opencl":
        pytest.skip("the kernel file is OpenCL C")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.cl").write_text(CLI_KERNEL)
    x = np.arange(30_000, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["map", "k.cl", "--kernel", "dbl", "-i", "x.npy", "-o", "y.npy",
                 "--device", device.spec, "--block-bytes", "4000", "--json",
                 "--trace", "t.json"]) == 0
    figures = _strict_json(capsys.readouterr().out)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), x * 2)
    document = _strict_json((tmp_path / "t.json").read_text())
    titles = _per_title(document)
    assert figures["blocks"] == 30 and figures["trace"] == "t.json"
    for lane in ("stage-in", "copy-in", "compute", "copy-out", "stage-out"):
        assert sorted(titles[lane]) == list(range(30)), lane
    moved = defaultdict(int)
    for event in document["traceEvents"]:
        if event["ph"] == "X":
            moved[event["cat"]] += event["args"]["bytes"]
    assert figures["bytes_in"] == moved["copy-in"] == x.nbytes
    assert figures["bytes_out"] == moved["copy-out"] == x.nbytes
    assert 0.0 <= figures["overlap"] <= 1.0
    assert figures["bound"] in figures["busy_seconds"]
