"""Draw a timeline as a Gantt chart with matplotlib (the ``plot`` extra).

No pyplot and no global backend: a ``Figure`` on its own Agg canvas, so plotting from a
library call never opens a window or changes the caller's matplotlib state.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from conveyor import files
from conveyor.errors import InputError
from conveyor.trace.timeline import Timeline

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
    return Figure, FigureCanvasAgg


def plot_timeline(timeline: Timeline, path: str | os.PathLike[str], *,
                  title: str | None = None, span_ms: float | None = None) -> None:
    """Write a Gantt chart of ``timeline`` to ``path`` (format from the suffix: .png, .svg,
    .pdf): one row per lane in journey order, one bar per block and stage, times in ms from
    the stream's start (``span_ms`` fixes the axis length, to compare charts), the overlap
    figure in the title. InputError without matplotlib."""
    figure_cls, canvas_cls = _matplotlib()
    suffix = Path(path).suffix.lstrip(".").lower()
    if not suffix:  # as matplotlib's savefig does: a PNG, named with its suffix
        path, suffix = f"{os.fspath(path)}.png", "png"
    formats = canvas_cls.get_supported_filetypes()
    if suffix not in formats:  # before drawing, and not as matplotlib's ValueError
        raise InputError(f"timeline.plot({os.fspath(path)!r}): matplotlib cannot write "
                         f"'.{suffix}' files: name a file ending in one of "
                         f"{', '.join('.' + f for f in sorted(formats))}")
    lanes = timeline.lanes
    figure = figure_cls(figsize=(11, 0.55 * max(len(lanes), 1) + 1.4), dpi=120)
    canvas_cls(figure)
    axes = figure.add_subplot(1, 1, 1)
    origin = timeline.origin_ns
    for row, lane in enumerate(lanes):
        color = COLORS.get(lane, "#636363")
        for parity, alpha in ((0, 1.0), (1, 0.55)):  # alternate shades tell blocks apart
            bars = [((s.start_ns - origin) / 1e6, max(s.duration_ns / 1e6, 1e-6))
                    for s in timeline.lane(lane) if s.block % 2 == parity]
            axes.broken_barh(bars, (row - 0.4, 0.8), facecolors=color, alpha=alpha,
                             edgecolor="none")
    axes.set_yticks(range(len(lanes)), labels=lanes)
    axes.set_ylim(max(len(lanes), 1) - 0.5, -0.5)  # journey order, top to bottom
    if not lanes:  # a stream of zero-length inputs ran no block: say so, not an empty grid
        axes.text(0.5, 0.5, "no blocks: the inputs are empty", transform=axes.transAxes,
                  ha="center", va="center")
    axes.set_xlim(0, span_ms or max(timeline.wall_ns / 1e6, 1e-3))
    axes.set_xlabel("ms since the stream's first block")
    axes.grid(axis="x", linewidth=0.3)
    overlap = timeline.overlap
    figures = "overlap n/a" if overlap is None else f"overlap {overlap:.0%}"
    heading = f"{title}: {figures}" if title else figures
    axes.set_title(heading, fontsize=10)
    figure.tight_layout()
    # Into a part file renamed over the target, as every conveyor output: a failed draw leaves
    # no half file, and a symlink another user planted in /tmp is refused (files.resolve).
    files.atomic_write(path, lambda handle: figure.savefig(handle, format=suffix),
                       durable=False, binary=True)
