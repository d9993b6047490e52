"""The Gantt chart: a PNG is written, and a missing matplotlib says what to install."""

from __future__ import annotations

import sys

import pytest
from tracekit import vadd_stream

import conveyor as cv
from conveyor.trace.timeline import Span, Timeline

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plot_writes_a_png(device, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "run.png"
    vadd_stream(device).timeline.plot(path)
    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_MAGIC)


def test_plot_of_an_empty_timeline_still_draws(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "empty.png"
    Timeline([Span("compute", 0, 0, 0)]).plot(path, title="empty")
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_plot_of_a_stream_that_ran_no_block_draws_without_a_warning(tmp_path):
    """A timeline with no lane at all (zero-length inputs): matplotlib warned that the y
    limits were singular."""
    pytest.importorskip("matplotlib")
    import warnings

    path = tmp_path / "none.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Timeline([]).plot(path)
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_plot_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    # A None entry in sys.modules makes the import fail, as on a machine without it.
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    timeline = Timeline([Span("compute", 0, 0, 10)])
    with pytest.raises(cv.InputError, match=r"pip install conveyor\[plot\]"):
        timeline.plot(tmp_path / "run.png")
    assert not (tmp_path / "run.png").exists()


def test_a_format_matplotlib_cannot_write_is_refused_before_drawing(tmp_path):
    """'.xyz' was matplotlib's ValueError from inside the part-file write."""
    pytest.importorskip("matplotlib")
    with pytest.raises(cv.InputError, match=r"cannot write '\.xyz' files: .*\.png"):
        Timeline([Span("compute", 0, 0, 10)]).plot(tmp_path / "run.xyz")
    assert list(tmp_path.iterdir()) == []
