"""Round eight: ``first_row`` at the ends of a 64-bit offset, and traces of several devices,
of a chain that runs one kernel twice, of zero blocks, and of paths that cannot be written
(each test fails without its fix, but for the few marked as guards)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv
from conveyor.pipeline.report import Report
from conveyor.trace import plot as trace_plot
from conveyor.trace.ceiling import FILE_NAME, device_key, link_ceiling
from conveyor.trace.timeline import Span, Timeline, one_per_block

sys.path.insert(0, str(Path(__file__).parent.parent / "trace"))
from tracekit import BLOCK, N, kernel  # noqa: E402

TWO = [d for d in cv.devices() if d.spec in ("opencl:0:0", "opencl:1:0")]

OFFSETS = """
__kernel void offsets(__global const float *x, __global ulong *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = offset + i;
}
__kernel void twice(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}
"""
_built: dict[tuple[str, str], cv.Kernel] = {}


def _kernel(device: cv.Device, name: str) -> cv.Kernel:
    key = (device.spec, name)
    if key not in _built:
        _built[key] = device.compile(cv.portable(OFFSETS), name)
    return _built[key]


def _offsets(device: cv.Device, first_row: object, rows: int = 10) -> np.ndarray:
    """The offset each row's kernel saw, streaming ``rows`` rows from ``first_row``."""
    y = np.zeros(rows, np.uint64)
    cv.stream(_kernel(device, "offsets"), [np.zeros(rows, np.float32)], [y], device=device,
              first_row=first_row, block_bytes=16, zero_copy=False)
    return y


# -- first_row ---------------------------------------------------------------------------------
@pytest.mark.parametrize("first_row", [2**63, 2**64 - 10, 2**64, 2**65 + 1, -(2**63) - 1,
                                       -(2**64), np.uint64(2**64 - 1)],
                         ids=["2**63", "2**64-10", "2**64", "2**65+1", "-2**63-1", "-2**64",
                              "uint64-max"])
def test_a_first_row_past_a_signed_64_bit_integer_is_refused(device, first_row, tmp_path):
    # Was: no error; the kernel's ulong offset wrapped (2**64 gave row 0 the offset 0).
    out = tmp_path / "y.npy"
    with pytest.raises(cv.InputError, match=r"first_row=.*signed 64-bit integer"):
        cv.stream(_kernel(device, "offsets"), [np.zeros(10, np.float32)], [out],
                  device=device, first_row=first_row)
    assert not out.exists()


def test_a_first_row_past_64_bits_is_refused_while_the_options_are_read():
    # Before any device, compile or input: "kernel" is no source and no device is named.
    with pytest.raises(cv.InputError, match=r"first_row=18446744073709551616 lies outside"):
        cv.stream("kernel", [np.zeros(4, np.float32)], [], first_row=2**64)


@pytest.mark.parametrize("compute", ["kernel", "callable"])
def test_offsets_of_the_last_rows_past_2_63_are_refused_before_any_block(device, compute):
    # 2**63 - 5 fits, but rows 5..9 would get offsets past 2**63 (the kernel's wrapped at
    # 2**64; a callable got Python ints no int64 holds).
    calls = []

    def record(x, y, *, queue, offset, n):
        calls.append(offset)

    step = _kernel(device, "offsets") if compute == "kernel" else record
    y = np.zeros(10, np.uint64)
    with pytest.raises(cv.InputError, match=r"from -9223372036854775808 to "
                                            r"9223372036854775798"):
        cv.stream(step, [np.zeros(10, np.float32)], [y], device=device, first_row=2**63 - 5,
                  block_bytes=16, zero_copy=False)
    assert calls == [] and not y.any()


def test_offsets_past_2_63_are_refused_before_an_output_file_exists(device, tmp_path):
    """The check runs with the inputs' rows known, before the sinks open their part files
    (the engine's own check, per device, comes after them)."""
    out = tmp_path / "y.npy"
    with pytest.raises(cv.InputError, match="past a signed 64-bit integer"):
        cv.stream(_kernel(device, "offsets"), [np.zeros(10, np.float32)], [str(out)],
                  device=device, first_row=2**63 - 5)
    assert list(tmp_path.iterdir()) == []


def test_offsets_count_elements_of_a_row_too(device):
    # 2**61 rows of 4 elements: the first offset is 2**63 itself.
    with pytest.raises(cv.InputError, match="4 elements"):
        cv.stream(_kernel(device, "offsets"), [np.zeros((3, 4), np.float32)],
                  [np.zeros((3, 4), np.uint64)], device=device, first_row=2**61)


def test_first_rows_at_the_ends_of_the_range_and_numpy_integers_run_exactly(device):
    # A guard: what fits runs, and NumPy integers are taken as ints.
    top = 2**63 - 10
    np.testing.assert_array_equal(_offsets(device, top),
                                  np.arange(10, dtype=np.uint64) + np.uint64(top))
    bottom = _offsets(device, np.int64(-(2**63)))  # wraps as ulong: 2**63, 2**63 + 1, ...
    np.testing.assert_array_equal(bottom, np.uint64(2**63) + np.arange(10, dtype=np.uint64))
    for value in (np.uint32(7), np.int8(7), np.uint64(7)):
        np.testing.assert_array_equal(_offsets(device, value),
                                      np.arange(7, 17, dtype=np.uint64))


@pytest.mark.parametrize("first_row", [2.0, True, np.float64(3.0), "3", None])
def test_first_row_that_is_no_integer_is_refused(first_row):
    # A guard (no device needed: refused while the options are read).
    with pytest.raises(cv.InputError, match="first_row takes an int"):
        cv.stream("kernel", [np.zeros(4, np.float32)], [], first_row=first_row)


# -- one span per block, per device ----------------------------------------------------------
def test_one_per_block_keeps_each_device_apart():
    spans = [Span("copy-in", 3, 0, 10, 8, device="a"), Span("copy-in", 3, 5, 30, 8, device="b"),
             Span("copy-in", 3, 10, 20, 4, device="a")]
    joined = sorted(one_per_block(spans), key=lambda s: s.device)
    # Was: one span of both devices, 0..30 ns, 20 bytes, its device dropped ("").
    assert joined == [Span("copy-in", 3, 0, 20, 12, device="a"),
                      Span("copy-in", 3, 5, 30, 8, device="b")]


def test_a_chain_that_runs_one_kernel_twice_shows_both_links(device, tmp_path):
    x = np.arange(N, dtype=np.float32)
    y = np.empty_like(x)
    twice = _kernel(device, "twice")
    report = cv.stream(cv.chain(twice, twice, temps=[np.float32]), [x], [y], device=device,
                       block_bytes=BLOCK, zero_copy=False)
    np.testing.assert_array_equal(y, 4 * x)
    timeline = report.timeline
    compute = timeline.lane("compute")
    # Was: one span per block, from the first link's start to the second's end.
    assert len(compute) == 2 * report.blocks
    for block in range(report.blocks):
        first, second = sorted((s for s in compute if s.block == block),
                               key=lambda s: s.start_ns)
        # Round nine: the second link of one name has a title of its own.
        assert (first.title, second.title) == ("compute:twice", "compute:twice#2")
        assert first.end_ns <= second.start_ns  # one in-order queue: one after the other
    timeline.save(tmp_path / "chain.json")
    slices = [e for e in json.loads((tmp_path / "chain.json").read_text())["traceEvents"]
              if e.get("cat") == "compute"]
    assert len(slices) == 2 * report.blocks


# -- overlap: one definition -------------------------------------------------------------------
def _two_device_report(zero_copy_b: bool = False) -> Report:
    """Device a: 100 ns of copy all under its kernel (1000 bytes); device b: 300 ns of copy
    and its kernel later (10 bytes)."""
    own = {"a": [Span("copy-in", 0, 0, 100, 1000), Span("compute", 0, 0, 100)],
           "b": [Span("copy-in", 1, 0, 300, 10), Span("compute", 1, 1000, 1100)]}

    def merged() -> Timeline:
        timeline = Timeline([Span(s.lane, s.block, s.start_ns, s.end_ns, s.nbytes,
                                  device=name) for name, spans in own.items() for s in spans])
        timeline.devices = ["a", "b"]
        return timeline

    devices = [Report("a", bytes_in=1000, blocks=1,
                      timeline_source=lambda: Timeline(own["a"])),
               Report("b", bytes_in=10, blocks=1, zero_copy=zero_copy_b,
                      timeline_source=lambda: Timeline(own["b"]))]
    return Report("a,b", bytes_in=1010, blocks=2, devices=devices, timeline_source=merged)


def test_report_overlap_of_several_devices_is_the_timelines():
    report = _two_device_report()
    # (100 + 0) ns hidden of (100 + 300) ns copied. Was 0.99: the devices' figures weighed
    # by bytes, where report.timeline.overlap pooled copy time.
    assert report.timeline.overlap == pytest.approx(0.25)
    assert report.overlap == pytest.approx(0.25)


def test_report_overlap_leaves_a_zero_copy_device_out():
    # A guard: as on one device, a zero-copy device's spans give no overlap figure.
    assert _two_device_report(zero_copy_b=True).overlap == pytest.approx(1.0)


# -- two devices: trace, plot ------------------------------------------------------------------
@pytest.mark.skipif(len(TWO) < 2, reason="needs PoCL's two devices")
def test_a_stream_over_two_devices_saves_and_plots_each_device_apart(tmp_path):
    a, b = np.random.default_rng(3).standard_normal((2, N)).astype(np.float32)
    c = np.empty_like(a)
    report = cv.stream(kernel(TWO[0], "vadd"), [a, b], [c], device=TWO, block_bytes=BLOCK,
                       zero_copy=False, schedule="static")
    np.testing.assert_array_equal(c, a + b)
    timeline = report.timeline
    assert report.overlap == timeline.overlap  # one definition (was weighed by bytes)
    rows = trace_plot.plot_rows(timeline)
    # Was: one row per lane, both devices' bars drawn over each other.
    labels = [label for label, _, _ in rows]
    for tag in timeline.devices:
        assert f"{tag} compute" in labels and f"{tag} copy-in" in labels
    for label, lane, spans in rows:
        assert {s.lane for s in spans} == {lane}
        assert len({s.device for s in spans}) == 1 and label.startswith(spans[0].device)
    assert sum(len(spans) for _, _, spans in rows) == len(timeline)
    pytest.importorskip("matplotlib")
    timeline.plot(tmp_path / "two.png")
    assert (tmp_path / "two.png").stat().st_size > 0
    timeline.save(tmp_path / "two.json")
    events = json.loads((tmp_path / "two.json").read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    for event in (e for e in events if e["ph"] == "X"):
        span_device = next(s.device for s in timeline.spans
                           if s.block == event["args"]["block"] and s.lane == event["cat"])
        assert names[event["pid"]].endswith(span_device)


@pytest.mark.parametrize("several", [False, True], ids=["one-device", "two-devices"])
def test_a_stream_of_zero_blocks_saves_and_plots(device, several, tmp_path):
    # A guard: zero-length inputs run no block; the trace and chart still say so.
    if several and len(TWO) < 2:
        pytest.skip("needs PoCL's two devices")
    empty = np.zeros(0, np.float32)
    where = TWO if several else device
    report = cv.stream(kernel(TWO[0] if several else device, "vadd"), [empty, empty],
                       [np.float32], device=where)
    timeline = report.timeline
    assert len(timeline) == 0 and report.overlap is None and timeline.overlap is None
    assert trace_plot.plot_rows(timeline) == []
    timeline.save(tmp_path / "empty.json")
    trace = json.loads((tmp_path / "empty.json").read_text())
    assert [e for e in trace["traceEvents"] if e["ph"] == "X"] == []
    pytest.importorskip("matplotlib")
    timeline.plot(tmp_path / "empty.png")
    assert (tmp_path / "empty.png").stat().st_size > 0


# -- plot's path and axis ----------------------------------------------------------------------
def _timeline() -> Timeline:
    return Timeline([Span("copy-in", 0, 0, 100, 8), Span("compute", 0, 50, 200)])


def test_plot_checks_the_png_it_writes_for_a_path_with_no_suffix(tmp_path):
    (tmp_path / "chart.png").mkdir()
    # Was: drawn, then a PermissionError from the write (the check looked at "chart").
    with pytest.raises(cv.InputError, match=r"chart\.png is a folder"):
        _timeline().plot(tmp_path / "chart")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chart.png"]


@pytest.mark.parametrize("span_ms", [0, -5.0, math.nan, math.inf, "10", True, 10**400],
                         ids=["zero", "negative", "nan", "inf", "str", "bool", "past-float"])
def test_plot_refuses_a_span_that_is_no_length(span_ms, tmp_path):
    # Was: 0 drew the stream's own length, -5 a mirrored axis, the rest matplotlib's
    # ValueError or ConversionError after drawing began.
    with pytest.raises(cv.InputError, match="span_ms"):
        _timeline().plot(tmp_path / "chart.png", span_ms=span_ms)
    assert list(tmp_path.iterdir()) == []


# -- the link ceiling file ---------------------------------------------------------------------
@pytest.mark.parametrize("text", ["1" + "0" * 400, "[" * 100_000],
                         ids=["integer-past-float", "nested-too-deep"])
def test_a_ceiling_file_no_float_or_parser_can_read_gives_no_ceiling(text, tmp_path):
    key = device_key("opencl:9:9", "x")
    if text.startswith("["):
        document = text
    else:
        document = (f'{{"format": 1, "devices": {{"{key}": {{"pinned_h2d_gbps": {text}, '
                    f'"pinned_d2h_gbps": 3.5}}}}}}')
    (tmp_path / FILE_NAME).write_text(document)
    # Was: OverflowError (int too large to convert to float) or RecursionError from every
    # report's ceiling, and so from print(report).
    found = link_ceiling("opencl:9:9", "x", tmp_path)
    if text.startswith("["):
        assert found is None
    else:
        assert found is not None and found.h2d_gbps is None and found.d2h_gbps == 3.5


# -- the command line's --plot: the file it writes, and its format, before the stream -------
def _cli_map(tmp: Path, *extra: str) -> int:
    from conveyor.cli import main

    opencl = [d for d in cv.devices() if d.backend == "opencl"]
    if not opencl:
        pytest.skip("no OpenCL device")
    (tmp / "k.cl").write_text(OFFSETS)
    np.save(tmp / "x.npy", np.arange(100, dtype=np.float32))
    return main(["map", str(tmp / "k.cl"), "--kernel", "twice", "--device", opencl[0].spec,
                 "-i", str(tmp / "x.npy"), "-o", str(tmp / "y.npy"), *extra])


def test_cli_plot_with_no_suffix_names_and_guards_the_png_it_writes(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert _cli_map(tmp_path, "--plot", str(tmp_path / "tl")) == 0
    assert (tmp_path / "tl.png").is_file() and not (tmp_path / "tl").exists()
    assert f"timeline written to {tmp_path / 'tl.png'}" in capsys.readouterr().out
    (tmp_path / "y.npy").unlink()
    # tl.png exists now: without --force it is refused before the stream writes -o
    assert _cli_map(tmp_path, "--plot", str(tmp_path / "tl")) == 2
    assert "tl.png" in capsys.readouterr().err and not (tmp_path / "y.npy").exists()


def test_cli_plot_in_a_format_matplotlib_cannot_write_is_refused_before_the_stream(tmp_path,
                                                                                  capsys):
    pytest.importorskip("matplotlib")
    assert _cli_map(tmp_path, "--plot", str(tmp_path / "tl.xyz")) == 2
    assert "'.xyz'" in capsys.readouterr().err
    assert not (tmp_path / "y.npy").exists() and not (tmp_path / "tl.xyz").exists()


def test_demo_plot_onto_standard_output_is_refused_not_written_beside_it(capsys):
    """``conveyor demo --plot /dev/stdout`` drew ``/dev/stdout.png`` once the name was taken
    as the file it writes; the name as given is checked as an output place first."""
    pytest.importorskip("matplotlib")
    from conveyor.cli import main

    assert main(["demo", "--mib", "1", "--plot", "/dev/stdout"]) == 2
    assert "standard output" in capsys.readouterr().err
    assert not Path("/dev/stdout.png").exists()
