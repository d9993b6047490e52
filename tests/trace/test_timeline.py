"""The timeline of a real stream: one clock, one span per block and lane, lanes that never
overlap themselves, and the figures drawn from it."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from tracekit import kernel, vadd_stream

import conveyor as cv
from conveyor.trace.timeline import COPY_LANES, DEVICE_LANES, LANES, Span, Timeline

ZERO_COPY = pytest.mark.parametrize("zero_copy", [False, None], ids=["copying", "auto"])


@ZERO_COPY
def test_every_block_appears_once_per_lane(device, zero_copy):
    report = vadd_stream(device, zero_copy=zero_copy)
    timeline = report.timeline
    assert timeline.lanes and set(timeline.lanes) <= set(LANES)
    for lane in timeline.lanes:
        blocks = [s.block for s in timeline.lane(lane)]
        assert sorted(blocks) == list(range(report.blocks)), lane


@ZERO_COPY
@pytest.mark.parametrize("depth", [1, 3])
def test_spans_on_one_lane_do_not_overlap(device, zero_copy, depth):
    timeline = vadd_stream(device, zero_copy=zero_copy, depth=depth).timeline
    for lane in timeline.lanes:
        for first, second in pairwise(timeline.lane(lane)):
            assert first.end_ns <= second.start_ns, (lane, first, second)


def test_copy_spans_carry_their_bytes(device):
    report = vadd_stream(device)
    timeline = report.timeline
    assert sum(s.nbytes for s in timeline.lane("copy-in")) == report.bytes_in
    assert sum(s.nbytes for s in timeline.lane("copy-out")) == report.bytes_out


def test_device_spans_sit_on_the_host_clock(device):
    """Causality across the two clocks: a block's copy-in starts after its stage-in ended on
    the host, and its copy-out ends before the host's wait for it ends (within the bound)."""
    timeline = vadd_stream(device).timeline
    error = timeline.clock_error_ns
    assert error is not None and 0 <= error < 50_000_000
    staged = {s.block: s for s in timeline.lane("stage-in")}
    waited = {s.block: s for s in timeline.lane("host-wait")}
    for span in timeline.lane("copy-in"):
        assert span.start_ns >= staged[span.block].end_ns - error, span
    for span in timeline.lane("copy-out"):
        assert span.end_ns <= waited[span.block].end_ns + error, span
    assert timeline.start_ns is not None
    assert min(s.start_ns for s in timeline.spans) >= timeline.start_ns - error


def test_reduction_records_the_host_combine(device):
    x = np.arange(30_000, dtype=np.float32)
    report = cv.stream(kernel(device, "ident"), [x], device=device, reduce="sum",
                       block_bytes=40_000, zero_copy=False)
    assert report.result == pytest.approx(float(x.sum(dtype=np.float64)), rel=1e-5)
    blocks = [s.block for s in report.timeline.lane("combine")]
    assert sorted(blocks) == list(range(report.blocks))


@ZERO_COPY
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_overlap_is_a_share(device, zero_copy, depth):
    overlap = vadd_stream(device, zero_copy=zero_copy, depth=depth).overlap
    if zero_copy is False:
        assert overlap is not None
    assert overlap is None or 0.0 <= overlap <= 1.0


def test_figures_are_consistent(device):
    report = vadd_stream(device)
    timeline = report.timeline
    busy = report.busy_seconds
    assert set(busy) == set(timeline.lanes) and all(v >= 0 for v in busy.values())
    wall = timeline.wall_ns / 1e9
    assert 0 < wall <= report.seconds
    assert all(v <= wall + 1e-9 for v in busy.values())
    exposed = report.exposed_transfer_seconds
    assert exposed is not None and exposed == pytest.approx(wall - busy["compute"], abs=1e-9)
    assert report.host_stall_seconds == pytest.approx(busy.get("host-wait", 0.0))
    assert report.bound in busy


def test_str_is_a_short_table(device):
    text = str(vadd_stream(device))
    for word in (device.spec, "GB/s", "compute", "copy-in", "overlap", "exposed transfer",
                 "host stall"):
        assert word in text
    assert len(text.splitlines()) <= 14


# -- the definitions, on spans made by hand -------------------------------------------------
def _timeline(*spans: tuple[str, int, int, int]) -> Timeline:
    return Timeline([Span(lane, block, start, end) for lane, block, start, end in spans])


def test_overlap_counts_copy_time_under_compute():
    # copy-in 0..10 (half under compute 5..15), copy-out 20..30 (none): 5 of 20 hidden.
    timeline = _timeline(("copy-in", 0, 0, 10), ("compute", 0, 5, 15), ("copy-out", 0, 20, 30))
    assert timeline.overlap == pytest.approx(0.25)
    assert timeline.exposed_transfer_ns == 30 - 10
    assert timeline.bound in COPY_LANES


@pytest.mark.parametrize("seed", range(20))
def test_overlap_is_the_time_copies_share_with_compute_counted_tick_by_tick(seed):
    """Round fourteen: the overlap measured each copy against every kernel (copies ×
    kernels), so printing the report of 4,000 one-row blocks took 24 s. It is one sweep
    now; this checks it against counting every nanosecond tick of small random timelines."""
    rng = np.random.default_rng(seed)
    spans = []
    for lane in ("copy-in", "compute", "copy-out"):
        for block in range(int(rng.integers(0, 12))):
            start = int(rng.integers(0, 200))
            spans.append((lane, block, start, start + int(rng.integers(1, 30))))
    timeline = _timeline(*spans)
    ticks = {lane: set() for lane in ("copy-in", "compute", "copy-out")}
    for lane, _, start, end in spans:
        ticks[lane].update(range(start, end))
    total = len(ticks["copy-in"]) + len(ticks["copy-out"])
    hidden = len(ticks["copy-in"] & ticks["compute"]) + len(ticks["copy-out"] & ticks["compute"])
    if total == 0 or not ticks["compute"]:
        assert timeline.overlap is None
    else:
        assert timeline.overlap == pytest.approx(hidden / total)


def test_the_overlap_of_many_blocks_is_measured_in_one_sweep():
    """100,000 blocks: each copy against every kernel was 10**10 steps."""
    n = 100_000
    spans = [("copy-in", k, 3 * k, 3 * k + 2) for k in range(n)]
    spans += [("compute", k, 3 * k + 1, 3 * k + 3) for k in range(n)]
    assert _timeline(*spans).overlap == pytest.approx(0.5)


def test_overlap_is_none_without_copies_or_compute():
    assert _timeline(("compute", 0, 0, 5)).overlap is None
    assert _timeline(("copy-in", 0, 0, 5)).overlap is None


def test_busy_time_counts_a_moment_once():
    timeline = _timeline(("compute", 0, 0, 10), ("compute", 1, 5, 12))
    assert timeline.busy_ns("compute") == 12 and timeline.bound == "compute"


def test_lanes_follow_the_journey():
    timeline = _timeline(*[(lane, 0, 0, 1) for lane in reversed(DEVICE_LANES)])
    assert timeline.lanes == list(DEVICE_LANES)


@ZERO_COPY
def test_a_long_streams_events_are_read_as_its_blocks_retire(device, zero_copy, monkeypatch):
    """Past ``COMPACT_RECORDS`` records, the finished blocks' driver events are read into
    times and dropped while the stream runs (a stream of 10**6 one-row blocks held 3.4 GB of
    events): the timeline is whole, one span per block and lane, lanes in order."""
    from conveyor.pipeline import paths
    from conveyor.trace import timeline as trace_timeline

    monkeypatch.setattr(trace_timeline, "COMPACT_RECORDS", 5)
    kept: list[list] = []
    real = paths.Path.__init__

    def recording(self, *args, **kw):
        real(self, *args, **kw)
        kept.append(self.records)

    monkeypatch.setattr(paths.Path, "__init__", recording)
    report = vadd_stream(device, zero_copy=zero_copy, depth=2)
    assert report.blocks >= 8
    timeline = report.timeline
    for lane in timeline.lanes:
        blocks = [s.block for s in timeline.lane(lane)]
        assert sorted(blocks) == list(range(report.blocks)), lane
        for first, second in pairwise(timeline.lane(lane)):
            assert first.end_ns <= second.start_ns, (lane, first, second)
    records = kept[0]  # the engine's list, as it was (the report took a detached copy)
    assert any(isinstance(r[2], trace_timeline.Timed) for r in records)


def test_compact_reads_finished_blocks_only():
    from conveyor.trace.timeline import Timed, compact

    class Done:
        def __init__(self, t):
            self.t = t

        def profile_ns(self):
            return (self.t, self.t + 1)

    records = [("copy-in", 0, Done(1), 4), ("compute", 0, Done(2), 0), ("copy-in", 1, Done(3), 4),
               ("compute", 2, Done(5), 0)]
    assert compact(records, 0, 0) == 2
    assert [type(r[2]) for r in records] == [Timed, Timed, Done, Done]
    assert compact(records, 2, 2) == 4 and records[3][2].profile_ns() == (5, 6)
    timed = records[0][2]
    assert records[0] == ("copy-in", 0, timed, 4) and timed.detached() is timed
