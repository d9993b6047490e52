"""Round eleven, the lead's own cases: round nine's and ten's leftovers (RELIABILITY.md)."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from conveyor.errors import InputError
from conveyor.pipeline import overlap
from conveyor.pipeline.io import ArraySource
from conveyor.pipeline.sinks import ArraySink


def _knapsack_views() -> tuple[np.ndarray, np.ndarray]:
    """A 14-dimensional strided view and a byte inside its range that it never touches:
    deciding that they do not overlap takes ``np.shares_memory`` about 10**5 steps."""
    rng = np.random.default_rng(1)
    base = np.zeros(1 << 23, np.uint8)
    strides = tuple(int(x) for x in rng.integers(1000, 100000, 14))
    view = as_strided(base, shape=(3,) * 14, strides=strides)
    sums = {0}
    for s in strides:
        sums = {x + k * s for x in sums for k in range(3)}
    hole = next(t for t in range(max(sums) // 2, max(sums)) if t not in sums)
    return view, base[hole:hole + 1]


def test_an_overlap_too_costly_to_decide_is_refused_not_searched_for_minutes(monkeypatch):
    # An exact np.shares_memory of views of 16-24 strided dimensions took 5-20 s (round
    # nine): the search is bounded now, and what it cannot rule out is refused.
    view, byte = _knapsack_views()
    assert overlap.in_place_pairs([ArraySource(view)], [ArraySink(byte)]) == frozenset()
    monkeypatch.setattr(overlap, "MAX_WORK", 1000)
    with pytest.raises(InputError, match=r"input 0 and output 0 may share memory.*copy"):
        overlap.in_place_pairs([ArraySource(view)], [ArraySink(byte)])
    with pytest.raises(InputError, match=r"outputs 0 and 1 may share memory"):
        overlap.in_place_pairs([], [ArraySink(view), ArraySink(byte)])
    with pytest.raises(InputError, match=r"table that may share memory with output 0"):
        overlap.check_tables([("table t", view)], [ArraySink(byte)])
