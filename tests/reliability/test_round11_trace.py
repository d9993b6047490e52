"""Round eleven, helper G: what conveyor shows (reports, timelines, Chrome traces, plots) and
how it is configured (every ``CONVEYOR_*`` variable, ``cv.configure``), and the command's
other sub-commands (``devices``, ``reduce``, ``cache``, ``demo``), tried as a demanding user
and as an attacker would, on real PoCL kernels and real files.

Found (xfail, strict: each asserts the right behaviour and turns red once fixed):

- A ``trace=`` that names the file behind a memory-mapped *output* (``np.lib.format.
  open_memmap("y.npy", "w+")``) replaced the results with the trace JSON after the stream,
  with no error; one that names the file behind a memory-mapped *input* replaced the input.
  ``_check_trace`` compares the trace only with ``cv.npy``/``cv.raw`` paths, not with the
  files behind memmaps (which ``overlap.py`` does find, through ``/proc/self/maps``).
- ``conveyor map/reduce/demo --trace DIR/t.json`` into a folder that cannot be written: a
  warning that the trace was not written, then "trace written to DIR/t.json" on stdout (and
  ``"trace": ...`` in ``--json``), exit 0. ``--plot`` there exited 1 *after* writing ``-o``,
  naming the internal ``.t.png.XXXXXXXX.new`` file; ``cv.stream(trace=...)`` there runs the
  whole stream and only warns; ``timeline.save``/``plot`` there raise a PermissionError naming
  the internal temporary file, not the path given.
- A FIFO where the link-ceiling file lives (``<cache>/link-bandwidth.json``) made
  ``str(report)`` (and so every ``conveyor map``) hang for ever: ``ceiling._read`` opens it
  with ``Path.read_text`` (kernel cache entries are opened ``O_NONBLOCK`` and fstat'ed).
- ``CONVEYOR_CACHE_DIR='~nosuchuser/x'``: Python's ``RuntimeError: Could not determine home
  directory.`` from ``compile()``, from ``str(report)`` (the ceiling's ``ceiling_path`` only
  catches ConveyorError) and as a traceback from ``conveyor cache info`` and ``conveyor map``.
- A size string with more than 4300 digits (``"8." + "0" * 5000 + "GiB"``, or 5000 leading
  zeros) raised Python's ``ValueError: Exceeds the limit (4300 digits) for integer string
  conversion`` from ``config.parse_size``: ``CONVEYOR_POOL_KEEP``/``WARMUP``/
  ``PINNED_BUDGET``, ``block_bytes=``, ``memory_limit=``, ``cv.configure`` (the CLI's
  ``--block-bytes`` is saved by argparse's "invalid size value").
- ``cv.configure(pinned_budget=np.int64(8 << 30))`` (or ``8.0 * 2**30``) was refused with
  "use 0 or more bytes (an int ...)", where ``cv.stream`` takes NumPy integers and integral
  floats for every size.
- Malformed ``CONVEYOR_PREFAULT``, ``CONVEYOR_PINNED_ALLOC``, ``CONVEYOR_PINNED_BUDGET`` and
  ``CONVEYOR_RING_GROW`` were silently ignored by a zero-copy stream (each is read only where
  it is used), while ``CONVEYOR_POOL_KEEP`` and ``CONVEYOR_WARMUP`` are refused by
  ``cv.device()`` for that very reason.
- ``CONVEYOR_NO_CACHE=1 conveyor cache clear`` said "the kernel cache is off" and exited 0
  with every entry of the cache folder left in place.
- ``conveyor devices``, where a person checks the set-up, listed the devices and exited 0
  under ``CONVEYOR_DEVICE='my gpu'`` with no word of it (every later command refuses it).
- ``CONVEYOR_DEVICE`` of non-ASCII digits (``opencl:٠:٠``) passed the variable's check
  (``\\d`` without ``re.ASCII``) and failed later as "no device matches", not naming the
  variable.
- A chain link's ``name=`` (or any span label) with ``$...$`` in it was parsed by matplotlib
  as mathtext: ``timeline.plot`` raised matplotlib's ``ValueError: Unknown symbol``.
- ``report.rows`` of an input of 5 rows that hold no elements (shape ``(5, 0)``) was 0.

Guards (already right) are marked "guard:" in their docstrings.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import pwd
import re
import sys
import tempfile
import threading
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # reliakit (and, through it, streamkit)
from reliakit import kernel, store, to_host  # noqa: E402

import conveyor as cv  # noqa: E402
from conveyor import config  # noqa: E402
from conveyor.cli import main  # noqa: E402
from conveyor.errors import InputError  # noqa: E402
from conveyor.kernels.portable import PRELUDE  # noqa: E402
from conveyor.memory import keep  # noqa: E402
from conveyor.trace.timeline import Span, Timeline  # noqa: E402

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None

CLI_KERNELS = PRELUDE + """
__kernel void dbl(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}
__kernel void ident(__global const float *x, __global float *r, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) r[i] = x[i];
}
"""


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A scratch folder as the current one, with k.cl/k.cu and x.npy (1000 float32)."""
    (tmp_path / "k.cl").write_text(CLI_KERNELS)
    (tmp_path / "k.cu").write_text(CLI_KERNELS)
    np.save(tmp_path / "x.npy", np.arange(1000, dtype=np.float32))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _kfile(device: cv.Device) -> str:
    return "k.cu" if device.backend == "cuda" else "k.cl"


def _map(device: cv.Device, *extra: str) -> list[str]:
    return ["map", _kfile(device), "--kernel", "dbl", "-i", "x.npy", "-o", "y.npy",
            "--device", device.spec, *extra]


@pytest.fixture
def unwritable(tmp_path):
    """A folder in which this process cannot create a file: one of ours with mode 0500, or
    for root (whom modes do not stop) /sys, where sysfs refuses new files."""
    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o500)
        yield str(folder)
        folder.chmod(0o700)
        return
    try:
        fd, name = tempfile.mkstemp(dir="/sys")
    except OSError:
        yield "/sys"
        return
    os.close(fd)
    os.unlink(name)
    pytest.skip("no folder here refuses root's new files")


def _strict_json(text: str):
    """``text`` parsed as standard JSON: NaN, Infinity and -Infinity are refused."""
    def refuse(constant):
        raise ValueError(f"not standard JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


# == 1. a trace written over the file behind a memmap ==========================================
@pytest.mark.parametrize("end", ["output", "input"])
def test_a_trace_naming_the_file_behind_a_memmap_is_refused(device, tmp_path, end):
    x = np.arange(1000, dtype=np.float32)
    path = tmp_path / f"{end}.npy"
    if end == "output":
        mapped = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=x.shape)
        inputs, outputs = [x], [mapped]
    else:
        np.save(path, x)
        mapped = np.load(path, mmap_mode="r")
        inputs, outputs = [mapped], [np.float32]
    try:
        with pytest.raises(InputError, match="trace"):
            cv.stream(kernel(device, "scale"), inputs, outputs, args=(2.0,), device=device,
                      trace=path)
    finally:
        del mapped, inputs, outputs
        # whatever happened, the file must still be the array (not the trace's JSON)
        kept = np.load(path)
        assert kept.shape == x.shape


# == 2. a trace or plot into a folder that cannot be written ===================================
@pytest.mark.parametrize("command", ["map", "map --json", "reduce", "demo"])
def test_the_command_never_says_it_wrote_a_trace_it_did_not(device, work, unwritable, capsys,
                                                            command):
    trace = os.path.join(unwritable, f"r11g-{uuid.uuid4().hex}.json")
    if command.startswith("map"):
        argv = _map(device, "--trace", trace, *command.split()[1:])
    elif command == "reduce":
        argv = ["reduce", _kfile(device), "--kernel", "ident", "-i", "x.npy", "--device",
                device.spec, "--trace", trace]
    else:
        argv = ["demo", "--mib", "1", "--device", device.spec, "--trace", trace]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(argv)
    out = capsys.readouterr().out
    assert not os.path.exists(trace)
    assert "trace written to" not in out, (code, out)
    if "--json" in command and code == 0:
        assert "trace" not in _strict_json(out)


@pytest.mark.parametrize("option", ["--plot", "--trace"])
def test_a_plot_or_trace_into_an_unwritable_folder_is_refused_before_any_work(
        device, work, unwritable, capsys, option):
    if option == "--plot" and not HAS_MATPLOTLIB:
        pytest.skip("--plot needs matplotlib")
    target = os.path.join(unwritable, f"r11g-{uuid.uuid4().hex}.png")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(_map(device, option, target))
    err = capsys.readouterr().err
    assert code == 2, err
    assert not (work / "y.npy").exists()
    assert option in err and ".new" not in err, err


def test_a_stream_trace_into_an_unwritable_folder_is_refused_before_any_work(device,
                                                                            unwritable):
    x = np.arange(1000, dtype=np.float32)
    y = np.zeros_like(x)
    trace = os.path.join(unwritable, f"r11g-{uuid.uuid4().hex}.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # today: the stream runs, then warns
        with pytest.raises(InputError, match=re.escape(trace)):
            cv.stream(kernel(device, "scale"), [x], [y], args=(2.0,), device=device,
                      trace=trace)
    assert not y.any()  # before any work


@pytest.mark.parametrize("method", ["save", "plot"])
def test_timeline_save_or_plot_into_an_unwritable_folder_names_the_path(unwritable, method):
    if method == "plot" and not HAS_MATPLOTLIB:
        pytest.skip("plot needs matplotlib")
    timeline = Timeline([Span("compute", 0, 0, 1000)])
    path = os.path.join(unwritable, f"r11g-{uuid.uuid4().hex}.json")
    if method == "plot":
        path = path.removesuffix(".json") + ".png"
    with pytest.raises((InputError, OSError)) as caught:
        getattr(timeline, method)(path)
    assert path in str(caught.value) and ".new" not in str(caught.value), caught.value


# == 3. a FIFO in place of the link-ceiling file ================================================
def test_str_of_a_report_does_not_hang_on_a_fifo_ceiling_file(tmp_path, monkeypatch):
    report = cv.Report(device="opencl:0:0", device_name="some device", rows=10, blocks=1,
                       block_rows=10, depth=1, bytes_in=40, seconds=0.001)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    fifo = cache / "link-bandwidth.json"
    os.mkfifo(fifo)
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(cache))
    shown: list[str] = []
    reader = threading.Thread(target=lambda: shown.append(str(report)), daemon=True)
    reader.start()
    reader.join(10.0)  # a bound for a hang only: the right code reads no FIFO at all
    hung = reader.is_alive()
    while reader.is_alive():  # free the reader: a writer that opens and closes gives it EOF
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(0.05)
    assert not hung, "str(report) blocked opening the FIFO"
    assert shown and "conveyor stream" in shown[0]


# == 4. CONVEYOR_CACHE_DIR naming a home that does not exist ====================================
def _no_such_user() -> str:
    name = "r11g-nosuchuser"
    with contextlib.suppress(KeyError):
        pwd.getpwnam(name)
        pytest.skip(f"a user {name} exists here")
    return name


def test_a_cache_dir_under_an_unknown_users_home_is_an_input_error(device, work, monkeypatch,
                                                                   capsys):
    x = np.arange(1000, dtype=np.float32)
    report = cv.stream(kernel(device, "scale"), [x], [np.float32], args=(2.0,), device=device)
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", f"~{_no_such_user()}/cache")
    with pytest.raises(InputError, match="CONVEYOR_CACHE_DIR"):
        config.cache_dir()
    assert "conveyor stream" in str(report)  # the report's ceiling: unknown, not an error
    assert main(["cache", "info"]) == 2
    err = capsys.readouterr().err
    assert "CONVEYOR_CACHE_DIR" in err and len(err.strip().splitlines()) == 1, err


# == 5. sizes of more than 4300 digits ==========================================================
_LONG_SIZES = ["8." + "0" * 5000 + "GiB", "0" * 5000 + "8GiB"]


@pytest.mark.parametrize("text", _LONG_SIZES, ids=["long fraction", "leading zeros"])
@pytest.mark.parametrize("where", ["parse_size", "CONVEYOR_POOL_KEEP", "configure"])
def test_a_size_of_thousands_of_digits_is_taken_or_refused_by_name(monkeypatch, text, where):
    monkeypatch.setattr(keep, "_budget", keep._budget)  # configure() is put back after
    try:
        if where == "parse_size":
            got = config.parse_size("block_bytes", text)
        elif where == "configure":
            got = cv.configure(pinned_budget=text)["pinned_budget"]
        else:
            monkeypatch.setenv(where, text)
            got = config.pool_keep()
    except InputError as exc:
        assert ("block_bytes" if where == "parse_size" else
                "pinned_budget" if where == "configure" else where) in str(exc)
    else:
        assert got == 8 * 2**30


# == 6. cv.configure takes the sizes cv.stream takes ============================================
@pytest.mark.parametrize("value", [np.int64(8 * 2**30), np.uint64(8 * 2**30), 8.0 * 2**30],
                         ids=["int64", "uint64", "float"])
def test_configure_takes_numpy_integers_and_integral_floats(monkeypatch, value):
    monkeypatch.setattr(keep, "_budget", keep._budget)
    assert cv.configure(pinned_budget=value) == {"pinned_budget": 8 * 2**30}


# == 7. malformed variables a stream does not read ==============================================
@pytest.mark.parametrize("name", ["CONVEYOR_PREFAULT", "CONVEYOR_PINNED_ALLOC",
                                  "CONVEYOR_PINNED_BUDGET", "CONVEYOR_RING_GROW"])
def test_a_malformed_variable_is_refused_even_where_it_is_not_used(device, monkeypatch, name):
    if not device.host_unified:
        pytest.skip("a device that copies reads these variables anyway")
    x = np.arange(100_000, dtype=np.float32)
    monkeypatch.setenv(name, "garbage")
    with pytest.raises(InputError, match=f"{name}='garbage'"):
        cv.stream(kernel(device, "scale"), [x], [np.float32], args=(2.0,), device=device,
                  block_bytes=40_000)


# == 8. cache clear with the cache turned off ====================================================
def test_cache_clear_with_no_cache_set_clears_or_says_it_did_not(device, tmp_path, monkeypatch,
                                                                 capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(cache))
    device.compile(cv.portable(CLI_KERNELS.replace("dbl", f"dbl_{uuid.uuid4().hex[:8]}")),
                   "ident")
    assert list(cache.glob("*.bin"))
    monkeypatch.setenv("CONVEYOR_NO_CACHE", "1")
    code = main(["cache", "clear"])
    err = capsys.readouterr().err
    left = list(cache.glob("*.bin"))
    assert not left or (code != 0 and "clear" in err), (code, left)


# == 9. CONVEYOR_DEVICE of non-ASCII digits =====================================================
@pytest.mark.parametrize("spec", ["opencl:\u0660:\u0660", "cuda:\uff11"])
def test_a_device_spec_of_non_ascii_digits_is_refused_naming_the_variable(monkeypatch, spec):
    monkeypatch.setenv("CONVEYOR_DEVICE", spec)
    with pytest.raises(InputError, match="CONVEYOR_DEVICE"):
        config.default_device_spec()


def test_conveyor_devices_notes_a_malformed_device_variable(work, monkeypatch, capsys):
    monkeypatch.setenv("CONVEYOR_DEVICE", "my gpu")
    code = main(["devices"])
    shown = capsys.readouterr()
    assert "CONVEYOR_DEVICE" in shown.out + shown.err, (code, shown.out)


# == 10. span labels drawn as written ============================================================
@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="plot needs matplotlib")
@pytest.mark.parametrize("label", ["a $\\nosuch$ b", "x_{1} $a_$"])
def test_a_link_name_with_dollar_signs_is_drawn_as_written(tmp_path, label):
    timeline = Timeline([Span("compute", 0, 0, 1000), Span("compute", 0, 0, 1000, label=label)])
    timeline.plot(tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 0


# == 11. report.rows of rows with no elements ====================================================
def test_report_rows_counts_rows_that_hold_no_elements(device):
    report = cv.stream(kernel(device, "scale"), [np.zeros((5, 0), np.float32)], [np.float32],
                       args=(2.0,), device=device)
    assert report.outputs[0].shape == (5, 0)
    assert report.rows == 5


# == guards ======================================================================================
def _check_trace_document(document) -> None:
    events = document["traceEvents"]
    named = {(e["pid"], e["tid"]) for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    for event in events:
        assert event["ph"] in ("M", "X"), event
        if event["ph"] != "X":
            continue
        for key, kind in (("name", str), ("cat", str), ("pid", int), ("tid", int)):
            assert isinstance(event[key], kind), event
        for key in ("ts", "dur"):
            assert isinstance(event[key], float) and math.isfinite(event[key]), event
            assert event[key] >= 0, event
        assert (event["pid"], event["tid"]) in named, event
        assert isinstance(event["args"]["block"], int) and event["args"]["bytes"] >= 0


def _callable_double(a, y, *, queue, offset, n):
    store(y, to_host(a, queue) * 2, queue)


def _stream(kind: str, device: cv.Device, pair: list[cv.Device], trace: Path) -> cv.Report:
    x = np.arange(20_000, dtype=np.float32)
    k = kernel(device, "scale")
    if kind == "empty":
        return cv.stream(k, [x[:0]], [np.float32], args=(2.0,), device=device, trace=trace)
    if kind == "one row":
        return cv.stream(k, [x[:1]], [np.float32], args=(2.0,), device=device, trace=trace,
                         zero_copy=False)
    if kind == "blocks":
        return cv.stream(k, [x], [np.float32], args=(2.0,), device=device, trace=trace,
                         zero_copy=False, block_bytes=4000)
    if kind == "zero-copy":
        return cv.stream(k, [x], [np.float32], args=(2.0,), device=device, trace=trace,
                         block_bytes=4000)
    if kind == "reduce":
        return cv.stream(kernel(device, "ident"), [x], reduce="max", device=device,
                         trace=trace, block_bytes=4000, zero_copy=False)
    if kind == "callable":
        return cv.stream(_callable_double, [x], [np.float32], device=device, trace=trace,
                         block_bytes=4000)
    if kind == "chain":
        chain = cv.chain(cv.link(k, "in0", "t0", args=(2.0,), name='tab\t"quote" \u00fc \\'),
                         cv.link(k, "t0", "out0", args=(3.0,)), temps=[np.float32])
        return cv.stream(chain, [x], [np.float32], device=device, trace=trace,
                         block_bytes=4000, zero_copy=False)
    return cv.stream(kernel(pair[0], "scale"), [x], [np.float32], args=(2.0,), device=pair,
                     trace=trace, block_bytes=4000)


@pytest.mark.parametrize("kind", ["empty", "one row", "blocks", "zero-copy", "reduce",
                                  "callable", "chain", "two devices"])
def test_guard_traces_are_standard_json_and_figures_in_range(device, pair, tmp_path, kind):
    """guard: for streams of no row, one row, several blocks, zero-copy, a reduction, a
    callable, a chain with a label of tabs, quotes and backslashes, and two devices, the
    Chrome trace written by trace= and by timeline.save is standard JSON (no NaN/Infinity)
    with every slice's fields, overlap is None or within [0, 1], and str/repr/len work."""
    trace = tmp_path / "t.json"
    report = _stream(kind, device, pair, trace)
    first = _strict_json(trace.read_text())
    _check_trace_document(first)
    report.timeline.save(tmp_path / "again.json")
    assert _strict_json((tmp_path / "again.json").read_text()) == first
    for figure in (report.overlap, report.timeline.overlap):
        assert figure is None or 0.0 <= figure <= 1.0, figure
    assert str(report) and repr(report) and len(report.timeline) >= 0
    if kind == "empty":
        assert report.blocks == 0 and report.block_ranges.shape == (0, 2)
        assert "nothing to do" in str(report)
    if kind == "one row":
        assert report.blocks == 1 and report.block_ranges.tolist() == [[0, 1]]


_TAKEN = [
    ("CONVEYOR_PREFAULT", "MADVISE", config.prefault_mode, "madvise"),
    ("CONVEYOR_NUMA", " OFF ", config.numa_mode, "off"),
    ("CONVEYOR_PINNED_ALLOC", "Driver", config.pinned_alloc_mode, "driver"),
    ("CONVEYOR_SWITCH_INTERVAL", "100 US", config.switch_interval, 1e-4),
    ("CONVEYOR_SWITCH_INTERVAL", "OFF", config.switch_interval, None),
    ("CONVEYOR_WARMUP", "Off", config.warmup_bytes, 0),
    ("CONVEYOR_WARMUP", "ON", config.warmup_bytes, None),
    ("CONVEYOR_POOL_KEEP", "1.5 kib", config.pool_keep, 1536),
    ("CONVEYOR_PINNED_BUDGET", "0", config.pinned_budget, 0),
    ("CONVEYOR_RING_GROW", "NO", config.ring_grow, False),
    ("CONVEYOR_STRICT", "Yes", config.strict_mode, True),
    ("CONVEYOR_NO_CACHE", "FALSE", config.cache_disabled, False),
    ("CONVEYOR_DEVICE", "OpenCL:0:0", config.default_device_spec, "OpenCL:0:0"),
]


@pytest.mark.parametrize(("name", "value", "read", "want"), _TAKEN,
                         ids=[f"{t[0]}={t[1].strip()}" for t in _TAKEN])
def test_guard_variables_take_any_case_and_spaces(monkeypatch, name, value, read, want):
    """guard: choices, switches, sizes and durations are read in any letter case, with
    spaces around them (and between a number and its unit)."""
    monkeypatch.setenv(name, value)
    assert read() == want


_REFUSED = [
    ("CONVEYOR_PREFAULT", "\uff4f\uff46\uff46", config.prefault_mode),  # fullwidth "off"
    ("CONVEYOR_NUMA", "auto\u200b", config.numa_mode),  # a zero-width space after it
    ("CONVEYOR_STRICT", "\u0661", config.strict_mode),  # Arabic-Indic 1
    ("CONVEYOR_RING_GROW", "-1", config.ring_grow),
    ("CONVEYOR_POOL_KEEP", "-64MiB", config.pool_keep),
    ("CONVEYOR_PINNED_BUDGET", "9" * 40, config.pinned_budget),
    ("CONVEYOR_WARMUP", "1e99GiB", config.warmup_bytes),
    ("CONVEYOR_WARMUP", "1MiB", config.warmup_bytes),
    ("CONVEYOR_SWITCH_INTERVAL", "-1ms", config.switch_interval),
    ("CONVEYOR_SWITCH_INTERVAL", "9" * 400 + "s", config.switch_interval),
    ("CONVEYOR_SWITCH_INTERVAL", "nan ms", config.switch_interval),
    ("CONVEYOR_DEVICE", "opencl:-1", config.default_device_spec),
    ("CONVEYOR_CACHE_DIR", "cache/\u00e9", config.cache_dir),
]


@pytest.mark.parametrize(("name", "value", "read"), _REFUSED,
                         ids=[f"{t[0]}-{i}" for i, t in enumerate(_REFUSED)])
def test_guard_negative_huge_and_non_ascii_values_are_refused_by_name(monkeypatch, name, value,
                                                                       read):
    """guard: negative, huge, garbage and non-ASCII look-alike values are InputErrors that
    name the variable and the value."""
    monkeypatch.setenv(name, value)
    with pytest.raises(InputError, match=re.escape(f"{name}={value!r}")):
        read()


@pytest.mark.parametrize(("name", "value"), [
    ("CONVEYOR_DEVICE", "my gpu"), ("CONVEYOR_CACHE_DIR", "relative/cache"),
    ("CONVEYOR_NO_CACHE", "maybe"), ("CONVEYOR_STRICT", "2"), ("CONVEYOR_POOL_KEEP", "lots"),
    ("CONVEYOR_WARMUP", "early"), ("CONVEYOR_SWITCH_INTERVAL", "quick"),
])
def test_guard_the_command_refuses_a_malformed_variable_in_one_line(device, work, monkeypatch,
                                                                    capsys, name, value):
    """guard: ``conveyor map`` under a malformed variable it reads exits 2 with one line
    naming the variable, and writes no output (nor a part of one)."""
    monkeypatch.setenv(name, value)
    argv = _map(device)
    if name == "CONVEYOR_DEVICE":  # read only where --device is not given
        argv = argv[:argv.index("--device")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{name}={value!r}" in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in work.iterdir()) == ["k.cl", "k.cu", "x.npy"]


def test_guard_sub_command_usage_errors_are_one_json_object_with_json(work, capsys):
    """guard: ``conveyor cache list`` (no such action) is a usage error naming the actions;
    ``conveyor devices --json`` (no such option) exits 2 with one JSON object on stdout."""
    with pytest.raises(SystemExit) as caught:
        main(["cache", "list"])
    assert caught.value.code == 2
    assert "info" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:
        main(["devices", "--json"])
    assert caught.value.code == 2
    assert _strict_json(capsys.readouterr().out)["exit_code"] == 2


def test_guard_reduce_json_is_standard_for_nan_and_for_no_rows(device, work, capsys):
    """guard: ``conveyor reduce --json`` writes a NaN result as the string "nan" (standard
    JSON), and a reduction of no rows parses with its result 0.0 and no timeline figures."""
    values = np.arange(100, dtype=np.float32)
    values[5] = np.nan
    np.save(work / "n.npy", values)
    np.save(work / "e.npy", values[:0])
    reduce = ["reduce", _kfile(device), "--kernel", "ident", "--device", device.spec, "--json"]
    assert main([*reduce, "-i", "n.npy", "--op", "max"]) == 0
    found = _strict_json(capsys.readouterr().out)
    assert found["result"] == "nan" and found["blocks"] == 1
    assert found["overlap"] is None or 0.0 <= found["overlap"] <= 1.0
    assert main([*reduce, "-i", "e.npy"]) == 0
    found = _strict_json(capsys.readouterr().out)
    assert found["result"] == 0.0 and found["blocks"] == 0 and "overlap" not in found


def test_guard_a_trace_through_a_link_to_a_file_replaces_the_file(device, tmp_path):
    """guard: trace= through a symlink to an existing file writes the file it points to and
    leaves the link (as outputs are written through links)."""
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    x = np.arange(1000, dtype=np.float32)
    cv.stream(kernel(device, "scale"), [x], [np.float32], args=(2.0,), device=device,
              trace=link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    _check_trace_document(_strict_json(target.read_text()))
