"""The ninth round: what round eight noticed and left (RELIABILITY.md, "Left").

- A generator given to ``cv.iterate`` and left suspended by a failed stream (a kernel step,
  a chain's link or a refusal raised while it was part-read) was closed only by the garbage
  collector: its ``finally`` (closing the file it reads) ran at some later moment, or never
  while the failed stream's source was still referenced. The stream now closes it as it
  ends, before ``cv.stream`` raises; an error of the close itself is a note on the stream's
  error, not in its place. An iterator object the caller passed in is left open, as a ``for``
  loop leaves it.
- A resident table for a pointer to a struct (``rec*``) took any dtype without fields
  (``float32``) and the kernel read its floats as records: refused now where the kernel's
  source defines the struct, with the structured dtype to pass.
- The host-memory check of a stream over several devices compared each device's staging
  ring with the host's memory alone; it sums them now.
- A chain that runs one kernel twice showed two slices of one title per block (trace, plot,
  ``Span.title``); the second link is ``name#2`` now, everywhere.
- ``timeline.plot("somedir")`` and ``--plot somedir`` with a folder ``somedir`` were refused,
  though the file written is ``somedir.png``: that file is judged now. A name that ends with
  a separator (``somedir/``: the file would be ``somedir/.png``) is refused as a folder.
"""

from __future__ import annotations

import json
import os
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import Boom, assert_clean, compiled, kernel, store, to_host  # noqa: E402

import conveyor as cv  # noqa: E402
from conveyor.memory import hostmem  # noqa: E402
from conveyor.trace import plot as trace_plot  # noqa: E402
from conveyor.trace.timeline import Span, Timeline  # noqa: E402

_STRUCT = """
typedef struct { uchar a; float b; } rec;
__kernel void rec_lut(__global const float *x, __global float *y, __global const rec *t,
                      ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + (float)t[i % 4].a + t[i % 4].b;
}
"""

#: The same kernel with its struct from a macro: conveyor cannot read it, so does not judge.
_MACRO = _STRUCT.replace("typedef struct { uchar a; float b; } rec;",
                         "#define REC struct { uchar a; float b; }\ntypedef REC rec;")

_TWICE = """
__kernel void twice(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}
"""

_kernel = compiled  # reliakit: built once per device, source and name




# -- 1. a generator left suspended by a failed stream ---------------------------------------
def _reader(parts, log: list[str], fail_close: bool = False):
    """A generator over ``parts`` whose ``finally`` (a reader's file close) logs "closed"."""
    try:
        yield from parts
    finally:
        log.append("closed")
        if fail_close:
            raise ValueError("the file would not close")


def _failing_at(block: int):
    """A compute callable that copies its block and raises Boom on call ``block``."""
    calls: list[int] = []

    def compute(x, y, queue, offset, n):
        calls.append(n)
        if len(calls) == block:
            raise Boom("the step failed")
        store(y, to_host(x, queue), queue)

    return compute


def test_a_generator_left_by_a_failed_stream_is_closed_before_it_raises(device):
    x = np.arange(20_000, dtype=np.float32)
    log: list[str] = []
    source = cv.iterate(_reader(np.array_split(x, 40), log), length=len(x))  # held: no GC
    with pytest.raises(Boom, match="the step failed"):
        cv.stream(_failing_at(2), [source], [np.float32], device=device, block_bytes=2000,
                  zero_copy=False)
    # Was []: the generator hung suspended in its loop until the source was collected.
    assert log == ["closed"]
    # A source serves one stream: once its stream has closed it, it says so.
    with pytest.raises(cv.InputError, match=r"iterable of generator was closed when the "
                                            r"stream that read it ended.*new cv.iterate"):
        cv.stream(kernel(device, "ident"), [source], [np.float32], device=device)
    assert_clean(device)
    # A chain's callable link failing: the same.
    log.clear()
    source = cv.iterate(_reader(np.array_split(x, 40), log), length=len(x))
    chained = cv.chain(kernel(device, "ident"), _failing_at(3), temps=[np.float32])
    with pytest.raises(Boom):
        cv.stream(chained, [source], [np.float32], device=device, block_bytes=2000)
    assert log == ["closed"]
    assert_clean(device)


def test_an_error_closing_the_generator_is_a_note_not_the_error(device):
    x = np.arange(20_000, dtype=np.float32)
    log: list[str] = []
    source = cv.iterate(_reader(np.array_split(x, 40), log, fail_close=True), length=len(x))
    with pytest.raises(Boom, match="the step failed") as caught:
        cv.stream(_failing_at(2), [source], [np.float32], device=device, block_bytes=2000,
                  zero_copy=False)
    assert log == ["closed"]  # was []
    notes = getattr(caught.value, "__notes__", [])
    assert any("closing the iterable of generator" in n and "would not close" in n
               for n in notes), notes
    assert_clean(device)


def test_a_generator_refused_by_the_stream_or_by_iterate_is_closed(pair):
    x = np.arange(1000, dtype=np.float32)
    log: list[str] = []
    source = cv.iterate(_reader([x[:500], x[500:]], log), length=1000)
    with pytest.raises(cv.InputError, match="read once, in order, and several devices"):
        cv.stream(kernel(pair[0], "ident"), [source], [np.float32], device=pair)
    assert log == ["closed"]  # was []
    log.clear()
    masked = np.ma.masked_array(x, mask=x % 2 == 0)
    with pytest.raises(cv.InputError, match="masked array"):
        cv.iterate(_reader([masked], log), length=1000)
    assert log == ["closed"]  # was []: the refused generator lived on in the traceback


@pytest.mark.parametrize("mistake", ["depth", "trace", "later input", "option type"])
def test_a_generator_refused_before_its_stream_begins_is_closed(device, tmp_path, mistake):
    """Refusals raised before the stream took its sources (an option, the trace place, an
    input after the iterate one) left the generator suspended too."""
    x = np.arange(1000, dtype=np.float32)
    log: list[str] = []
    source = cv.iterate(_reader(np.array_split(x, 4), log), length=len(x))
    options = {"depth": {"depth": 0}, "trace": {"trace": tmp_path / "no" / "t.json"},
               "later input": {}, "option type": {"block_bytes": "lots"}}[mistake]
    inputs = [source, tmp_path / "missing.npy"] if mistake == "later input" else [source]
    with pytest.raises(cv.InputError):
        cv.stream(kernel(device, "ident"), inputs, [np.float32], device=device, **options)
    assert log == ["closed"]  # was []: closed only by the garbage collector
    assert_clean(device)


def test_an_iterator_object_passed_in_is_left_open_and_one_made_here_closed(device):
    """``for`` never closes an iterator it was given; a stream does not either. What
    ``iter()`` made from an iterable (a generator of ``__iter__``) nobody else holds: the
    stream closes it."""
    x = np.arange(20_000, dtype=np.float32)

    class Reader:
        def __init__(self, parts):
            self.parts, self.closed = iter(parts), False

        def __iter__(self):
            return self

        def __next__(self):
            return next(self.parts)

        def close(self):
            self.closed = True

    reader = Reader(np.array_split(x, 40))
    with pytest.raises(Boom):
        cv.stream(_failing_at(2), [cv.iterate(reader, length=len(x))], [np.float32],
                  device=device, block_bytes=2000, zero_copy=False)
    assert not reader.closed  # the caller's: it may go on reading it

    log: list[str] = []

    class Dataset:
        def __iter__(self):
            return _reader(np.array_split(x, 40), log)

    source = cv.iterate(Dataset(), length=len(x))
    with pytest.raises(Boom):
        cv.stream(_failing_at(2), [source], [np.float32], device=device, block_bytes=2000,
                  zero_copy=False)
    assert log == ["closed"]  # was []
    assert_clean(device)
    # A stream that succeeds: the generator ended itself; a failing close of an iterator
    # made here is a warning (the outputs are written), not an error.

    class Stubborn:
        def __init__(self):
            self.parts = iter(np.array_split(x, 4))

        def __next__(self):
            return next(self.parts)

        def close(self):
            raise OSError("stuck")

    class Data:
        def __iter__(self):
            return Stubborn()

    with pytest.warns(RuntimeWarning, match="closing the iterable of Data.*stuck"):
        out = cv.stream(kernel(device, "ident"), [cv.iterate(Data(), length=len(x))],
                        [np.float32], device=device).outputs[0]
    np.testing.assert_array_equal(out, x)


# -- 2. a resident table for a struct pointer -----------------------------------------------
def test_a_table_without_fields_for_a_struct_pointer_is_refused(device):
    rec_lut = _kernel(device, _STRUCT, "rec_lut")
    x = np.arange(8, dtype=np.float32)
    flat = np.arange(8, dtype=np.float32)
    want = r"np\.dtype\(\[\('a', 'u1'\), \('b', '<f4'\)\], align=True\)"
    with pytest.raises(cv.InputError, match=r"args\[0\] \(kernel parameter 't', .*rec.*\) "
                                            r"points to struct 'rec' of 8 bytes, but the array "
                                            r"holds float32, which has no fields.*" + want):
        cv.stream(rec_lut, [x], [np.float32], args=(flat,), device=device)  # was garbage
    with cv.resident(flat) as handle, pytest.raises(cv.InputError, match=want):
        cv.stream(rec_lut, [x], [np.float32], args=(handle,), device=device)
    # A chain's link: its args are resident tables too.
    with pytest.raises(cv.InputError, match=r"link 0 .*points to struct 'rec'"):
        cv.stream(cv.chain(cv.link(rec_lut, reads="in0", writes="out0", args=(flat,))), [x],
                  [np.float32], device=device)
    assert_clean(device)
    # The dtype the message gives streams the records.
    table = np.zeros(4, np.dtype([("a", "u1"), ("b", "<f4")], align=True))
    table["a"], table["b"] = [1, 2, 3, 4], [0.5, 0.25, 0.125, 2.0]
    out = cv.stream(rec_lut, [x], [np.float32], args=(table,), device=device).outputs[0]
    per = table["a"] + table["b"]
    np.testing.assert_array_equal(out, x + np.tile(per, 2).astype(np.float32))


def test_a_struct_a_macro_defines_is_judged_as_the_compiler_sees_it(device):
    # Struct layouts are read from the preprocessed code since round eleven: a struct that a
    # macro defines is laid out too, so a table without fields is refused as for a struct
    # written out (it streamed unchecked before), and the records' dtype streams.
    rec_lut = _kernel(device, _MACRO, "rec_lut")
    x = np.zeros(8, np.float32)
    with pytest.raises(cv.InputError, match="has no fields"):
        cv.stream(rec_lut, [x], [np.float32], args=(np.zeros(8, np.float32),), device=device)
    records = np.zeros(8, np.dtype([("a", "u1"), ("b", "<f4")], align=True))
    cv.stream(rec_lut, [x], [np.float32], args=(records,), device=device)
    assert_clean(device)


# -- 3. the host-memory check over several devices ------------------------------------------
def test_the_host_memory_check_sums_the_rings_of_every_device(pair, monkeypatch):
    x = np.arange(1 << 16, dtype=np.float32)
    ident = [kernel(dev, "ident") for dev in pair]
    real_total = hostmem.total
    if real_total() is None:
        pytest.skip("no MemTotal in /proc/meminfo")
    # One device's ring, as its own check counts it.
    monkeypatch.setattr(hostmem, "total", lambda: 1)
    with pytest.raises(cv.InputError, match="bytes of host memory") as caught:
        cv.stream(ident[0], [x], [np.float32], device=pair[0], block_bytes=1 << 14,
                  zero_copy=False)
    found = re.search(r"about (\d+) bytes", str(caught.value))
    assert found is not None
    ring = int(found.group(1))
    # Room for one ring and a half: each device's alone fits, both do not.
    monkeypatch.setattr(hostmem, "total", lambda: ring * 3 // 2)
    with pytest.raises(cv.InputError, match=rf"over 2 devices would hold about {2 * ring} "
                                            rf"bytes of host memory .* more than the host.s "
                                            rf"{ring * 3 // 2}"):
        cv.stream(ident[0], [x], [np.float32], device=pair, block_bytes=1 << 14,
                  zero_copy=False)  # was no error
    for dev in pair:
        assert_clean(dev)
    # Room for both: it streams.
    monkeypatch.setattr(hostmem, "total", lambda: 2 * ring)
    out = cv.stream(ident[0], [x], [np.float32], device=pair, block_bytes=1 << 14,
                    zero_copy=False).outputs[0]
    np.testing.assert_array_equal(out, x)


# -- 4. one kernel twice in a chain ----------------------------------------------------------
def test_links_of_one_name_have_titles_of_their_own(device, tmp_path):
    twice = _kernel(device, _TWICE, "twice")
    x = np.arange(4000, dtype=np.float32)
    report = cv.stream(cv.chain(twice, twice, twice, temps=[np.float32, np.float32]), [x],
                       [np.float32], device=device, block_bytes=4000, zero_copy=False)
    np.testing.assert_array_equal(report.outputs[0], 8 * x)
    timeline = report.timeline
    for block in range(report.blocks):
        spans = sorted((s for s in timeline.lane("compute") if s.block == block),
                       key=lambda s: s.start_ns)
        # Was "compute:twice" three times.
        assert [s.title for s in spans] == ["compute:twice", "compute:twice#2",
                                            "compute:twice#3"]
    timeline.save(tmp_path / "chain.json")
    names = [e["name"] for e in json.loads((tmp_path / "chain.json").read_text())["traceEvents"]
             if e.get("cat") == "compute"]
    assert len(names) == len(set(names)) == 3 * report.blocks
    assert "compute:twice#2 0" in names
    # The chart: a row per link, named as the trace names it.
    rows = [(label, lane, len(spans)) for label, lane, spans in trace_plot.plot_rows(timeline)]
    assert [r for r in rows if r[1] == "compute"] == [
        ("compute:twice", "compute", report.blocks), ("compute:twice#2", "compute", report.blocks),
        ("compute:twice#3", "compute", report.blocks)]
    # Names given with cv.link: numbered the same way; distinct names stay as they are.
    named = cv.chain(cv.link(twice, "in0", "t0", name="scale"),
                     cv.link(twice, "t0", "out0", name="scale"), temps=[np.float32])
    labels = {s.label for s in cv.stream(named, [x], [np.float32], device=device,
                                         block_bytes=4000).timeline.lane("compute")}
    assert labels == {"scale", "scale#2"}
    other = cv.chain(cv.link(twice, "in0", "t0", name="a"),
                     cv.link(twice, "t0", "out0", name="b"), temps=[np.float32])
    labels = {s.label for s in cv.stream(other, [x], [np.float32], device=device,
                                         block_bytes=4000).timeline.lane("compute")}
    assert labels == {"a", "b"}
    assert_clean(device)


def test_plot_rows_of_a_chain_on_two_devices_keep_devices_and_links_apart():
    spans = [Span("compute", b, 10 * b, 10 * b + 5, label=label, device=dev)
             for dev in ("d0", "d1") for b in range(2) for label in ("k", "k#2")]
    spans += [Span("copy-in", 0, 0, 3, device="d0")]
    timeline = Timeline(spans)
    timeline.devices = ["d0", "d1"]
    rows = [(label, len(found)) for label, _, found in trace_plot.plot_rows(timeline)]
    assert rows == [("d0 copy-in", 1), ("d0 compute:k", 2), ("d0 compute:k#2", 2),
                    ("d1 compute:k", 2), ("d1 compute:k#2", 2)]


# -- 5. plot of a name that is a folder ---------------------------------------------------------
def _timeline() -> Timeline:
    return Timeline([Span("copy-in", 0, 0, 100, 8), Span("compute", 0, 50, 200)])


def test_plot_of_a_folders_name_writes_the_png_beside_it(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "runs").mkdir()
    _timeline().plot(tmp_path / "runs")  # was: "runs is a folder"
    assert (tmp_path / "runs.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "runs").is_dir() and list((tmp_path / "runs").iterdir()) == []
    # What round eight refused still is: a folder where the PNG goes, a name that is standard
    # output, and a name that ends with a separator (the file would be "runs/.png").
    (tmp_path / "chart.png").mkdir()
    with pytest.raises(cv.InputError, match=r"chart\.png is a folder"):
        _timeline().plot(tmp_path / "chart")
    for name in (f"{tmp_path / 'runs'}{os.sep}", f"{tmp_path}{os.sep}.", str(tmp_path)
                 + os.sep + ".."):
        with pytest.raises(cv.InputError, match=r"names a folder.*name the image file"):
            _timeline().plot(name)
    assert not (tmp_path / "runs" / ".png").exists() and not (tmp_path / "..png").exists()
    with pytest.raises(cv.InputError, match="standard output|not a file|character device"):
        trace_plot.plot_file("/dev/stdout", "timeline.plot('/dev/stdout')")


def test_cli_plot_of_a_folders_name_writes_the_png_beside_it(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from conveyor.cli import main

    opencl = [d for d in cv.devices() if d.backend == "opencl"]
    if not opencl:
        pytest.skip("no OpenCL device")
    (tmp_path / "k.cl").write_text(_TWICE)
    np.save(tmp_path / "x.npy", np.arange(100, dtype=np.float32))
    (tmp_path / "tl").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["map", str(tmp_path / "k.cl"), "--kernel", "twice", "--device",
                     opencl[0].spec, "-i", str(tmp_path / "x.npy"), "-o",
                     str(tmp_path / "y.npy"), "--plot", str(tmp_path / "tl")])
    captured = capsys.readouterr()
    assert code == 0, captured.err  # was 2: "--plot .../tl: .../tl is a folder"
    assert (tmp_path / "tl.png").is_file()
    assert f"timeline written to {tmp_path / 'tl.png'}" in captured.out
