"""Draw a timeline as a Gantt chart with matplotlib (the ``plot`` extra).

No pyplot and no global backend: a ``Figure`` on its own Agg canvas, so plotting from a
library call never opens a window or changes the caller's matplotlib state.
"""

from __future__ import annotations

import math
import numbers
import os
from pathlib import Path
from typing import Any

import numpy as np

from conveyor import files
from conveyor.errors import InputError
from conveyor.trace.timeline import Span, Timeline, device_order

COLORS = {
    "stage-in": "#8c6bb1", "copy-in": "#2b8cbe", "compute": "#e34a33", "copy-out": "#31a354",
    "stage-out": "#756bb1", "host-wait": "#969696", "combine": "#fdae6b",
}  # fmt: skip


def _matplotlib() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise InputError(
            "timeline.plot needs matplotlib: pip install conveyor[plot] "
            "(or pip install matplotlib)"
        ) from exc
    except ValueError as exc:  # matplotlib refuses its settings: MPLBACKEND=bogus
        raise InputError(f"timeline.plot: matplotlib would not load ({exc}): fix or unset "
                         f"MPLBACKEND, or fix matplotlib's settings (matplotlibrc); conveyor "
                         f"draws with the Agg backend") from exc
    return Figure, FigureCanvasAgg


def plot_rows(timeline: Timeline) -> list[tuple[str, str, list[Span]]]:
    """The rows of the chart, top to bottom, as (row label, lane, spans): one per lane in
    journey order, and within a lane one per span title (the links of a chain: a row each,
    labelled as the trace names them, ``compute:twice``, ``compute:twice#2``; unlabelled
    spans first); on a stream over several devices one per device and lane (and title),
    device by device, labelled ``device lane``, so one device's spans never hide
    another's."""
    devices = device_order(timeline)
    several = len(devices) > 1
    rows = []
    for device in devices if several else [None]:
        for lane in timeline.lanes:
            spans = [s for s in timeline.lane(lane) if device is None or s.device == device]
            titles = list(dict.fromkeys(s.title for s in sorted(spans, key=_unlabelled_first)))
            for title in titles:
                found = [s for s in spans if s.title == title]
                rows.append((f"{device} {title}" if device else title, lane, found))
    return rows


def _unlabelled_first(span: Span) -> tuple[bool, int, int]:
    """The order of a lane's rows: its unlabelled spans, then each title by its first span
    (a chain's links in the order they run)."""
    return (bool(span.label), span.start_ns, span.block)


def check_span(span_ms: object) -> float | None:
    """``span_ms`` as a float: None, or a finite number of milliseconds above 0; InputError
    otherwise (0 or a negative length would draw an empty or mirrored axis, and NaN, inf or a
    string fail in matplotlib after the drawing began)."""
    if span_ms is None:
        return None
    if isinstance(span_ms, numbers.Real) and not isinstance(span_ms, bool | np.bool_):
        try:
            value = float(span_ms)
        except OverflowError:  # an int past any float (10**400)
            value = math.inf
        if math.isfinite(value) and value > 0:
            return value
    raise InputError(f"timeline.plot(span_ms={span_ms!r}): span_ms is the time axis' length "
                     f"in ms, a number above 0 (e.g. span_ms=250.0), or None to fit the "
                     f"stream")


def final_path(path: str | os.PathLike[str]) -> tuple[str, str]:
    """The file ``plot_timeline`` writes and its format: ``path`` itself, or ``path.png``
    when it has no suffix (as matplotlib's ``savefig`` names it)."""
    text = os.fspath(path)
    suffix = Path(text).suffix.lstrip(".").lower()
    if not suffix:
        return f"{text}.png", "png"
    return text, suffix


def plot_target(path: str | os.PathLike[str]) -> str:
    """The file a timeline plot of ``path`` writes (:func:`final_path`), once matplotlib is
    known to write its format: InputError without matplotlib or for a suffix it cannot
    write, so callers (the CLI's ``--plot``) refuse a bad name before the stream runs."""
    _, canvas_cls = _matplotlib()
    text, suffix = final_path(path)
    formats = canvas_cls.get_supported_filetypes()
    if suffix not in formats:  # before drawing, and not as matplotlib's ValueError
        raise InputError(f"timeline.plot({text!r}): matplotlib cannot write "
                         f"'.{suffix}' files: name a file ending in one of "
                         f"{', '.join('.' + f for f in sorted(formats))}")
    return text


def plot_file(path: str | os.PathLike[str], what: str) -> str:
    """The file a timeline plot of ``path`` writes (:func:`plot_target`: ``x`` writes
    ``x.png``), after checking that file, and the name as given, as places an output may go
    (``files.output_target``; ``what`` names the call or option in its messages): a given
    ``/dev/stdout`` is refused as standard output, not written as ``/dev/stdout.png``, and a
    folder ``x.png`` before anything is drawn. A given name that is an existing folder
    (``runs``) is not refused for that: nothing is written into it, and the file written,
    ``runs.png`` beside it, is the one judged. A name that ends with a separator, or whose
    last part is ``.`` or ``..``, names a folder and no file (``runs/`` would write
    ``runs/.png``, ``.`` a file ``..png``): refused, saying to name the image file."""
    text = files.path_text(path, what)
    if os.path.basename(text) in ("", ".", ".."):
        raise InputError(f"{what}: {text!r} names a folder, not a file: name the image file "
                         f"to write, e.g. {os.path.join(text, 'timeline.png')!r}")
    beside = final_path(text)[0] != text  # x given, x.png written
    if not (beside and os.path.isdir(text)):
        files.output_target(path, what, probe=True)
    target = plot_target(path)
    if beside:
        files.output_target(target, what, probe=True)
    return target


def plot_timeline(timeline: Timeline, path: str | os.PathLike[str], *,
                  title: str | None = None, span_ms: float | None = None) -> None:
    """Write a Gantt chart of ``timeline`` to ``path`` (format from the suffix: .png, .svg,
    .pdf; a path with none gets ``.png``): one row per lane in journey order (per device and
    lane for several devices: :func:`plot_rows`), one bar per block and stage, times in ms
    from the stream's start (``span_ms`` fixes the axis length, to compare charts), the
    overlap figure in the title. InputError without matplotlib, and for a ``span_ms`` that is
    no length (:func:`check_span`)."""
    span = check_span(span_ms)
    figure_cls, canvas_cls = _matplotlib()
    path = plot_target(path)
    suffix = final_path(path)[1]
    rows = plot_rows(timeline)
    figure = figure_cls(figsize=(11, 0.55 * max(len(rows), 1) + 1.4), dpi=120)
    canvas_cls(figure)
    axes = figure.add_subplot(1, 1, 1)
    origin = timeline.origin_ns
    for row, (_, lane, spans) in enumerate(rows):
        color = COLORS.get(lane, "#636363")
        for parity, alpha in ((0, 1.0), (1, 0.55)):  # alternate shades tell blocks apart
            bars = [((s.start_ns - origin) / 1e6, max(s.duration_ns / 1e6, 1e-6))
                    for s in spans if s.block % 2 == parity]
            axes.broken_barh(bars, (row - 0.4, 0.8), facecolors=color, alpha=alpha,
                             edgecolor="none")
    axes.set_yticks(range(len(rows)), labels=[_drawable(label) for label, _, _ in rows])
    for tick in axes.get_yticklabels():  # "$...$" in a link's name is text, not mathtext
        tick.set_parse_math(False)
    axes.set_ylim(max(len(rows), 1) - 0.5, -0.5)  # journey order, top to bottom
    if not rows:  # a stream of zero-length inputs ran no block: say so, not an empty grid
        axes.text(0.5, 0.5, "no blocks: the inputs are empty", transform=axes.transAxes,
                  ha="center", va="center")
    axes.set_xlim(0, span or max(timeline.wall_ns / 1e6, 1e-3))
    axes.set_xlabel("ms since the stream's first block")
    axes.grid(axis="x", linewidth=0.3)
    overlap = timeline.overlap
    figures = "overlap n/a" if overlap is None else f"overlap {overlap:.0%}"
    heading = f"{title}: {figures}" if title else figures
    axes.set_title(_drawable(heading), fontsize=10, parse_math=False)  # "$" is text here
    figure.tight_layout()
    # Into a part file renamed over the target, as every conveyor output: a failed draw leaves
    # no half file, and a symlink another user planted in /tmp is refused (files.resolve).
    files.atomic_write(path, lambda handle: figure.savefig(handle, format=suffix),
                       durable=False, binary=True)


def _drawable(text: str) -> str:
    """``text`` as the font code takes it: a lone surrogate (a name read with
    ``errors="surrogateescape"``) crashed matplotlib's ``set_text``; it is drawn escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")

