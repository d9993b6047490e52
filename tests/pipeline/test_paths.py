"""Each array's path is chosen once, before the first block (pipeline/paths.py), and the
engine's loop calls the same methods on every path; ``conveyor.closing`` joins through Ctrl-C."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from streamkit import add_reference, kernel, record_paths

import conveyor as cv
from conveyor import closing
from conveyor.pipeline import staged as staged_module
from conveyor.pipeline.options import StreamOptions

ROWS = 4096


def _chosen(device, monkeypatch, inputs, outputs, **kw):
    """Stream an add; return the path classes chosen for inputs and outputs."""
    chosen = record_paths(monkeypatch)
    cv.stream(kernel(device, "add"), inputs, outputs, device=device, block_bytes=4096, **kw)
    assert len(chosen) == 1  # once per stream, not per block
    return chosen[0]


def test_pageable_arrays_are_staged_and_pinned_ones_direct(device, monkeypatch):
    a = np.arange(ROWS, dtype=np.float32)
    b = cv.pinned.asarray(np.ones(ROWS, np.float32), device=device)
    c = np.zeros(ROWS, np.float32)
    ins, outs = _chosen(device, monkeypatch, [a, b], [c], zero_copy=False)
    assert sorted(ins) == ["DirectIn", "StagedIn"] and outs == ["StagedOut"]
    np.testing.assert_array_equal(c, add_reference(a, np.asarray(b)))
    del b


def test_zero_copy_is_one_path_each_way(device, monkeypatch):
    if not device.host_unified:
        pytest.skip("zero-copy needs a device that shares memory with the host")
    a, b, c = (np.ones(ROWS, np.float32), np.ones(ROWS, np.float32), np.zeros(ROWS, np.float32))
    assert _chosen(device, monkeypatch, [a, b], [c], zero_copy=True) == (["ZeroCopy"],
                                                                          ["ZeroCopy"])


def test_staged_paths_share_one_ring_per_direction(device, monkeypatch):
    rings: list[int] = []
    real = staged_module.StagingRings.ring

    def ring(self, sizes):
        rings.append(len(sizes))
        return real(self, sizes)

    monkeypatch.setattr(staged_module.StagingRings, "ring", ring)
    a, b, c = (np.ones(ROWS, np.float32), np.ones(ROWS, np.float32), np.zeros(ROWS, np.float32))
    cv.stream(kernel(device, "add"), [a, b], [c], device=device, block_bytes=4096,
              zero_copy=False)
    assert rings == [2, 1]  # one ring for both inputs, one for the output


def test_options_travel_as_one_frozen_object(device, monkeypatch):
    from conveyor.pipeline import stream as stream_module

    seen: list[StreamOptions] = []
    real = stream_module.Engine

    class Seeing(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            seen.append(self.options)

    monkeypatch.setattr(stream_module, "Engine", Seeing)
    a, b, c = (np.ones(ROWS, np.float32), np.ones(ROWS, np.float32), np.zeros(ROWS, np.float32))
    cv.stream(kernel(device, "add"), [a, b], [c], device=device, block_bytes=4096.0,
              depth=2, zero_copy=False, workers=1, strict=False)
    (options,) = seen
    assert (options.depth, options.block_bytes, options.zero_copy, options.workers) == (
        2, 4096, False, 1)
    with pytest.raises(AttributeError):
        options.depth = 3  # type: ignore[misc]


def test_join_finishes_through_a_keyboard_interrupt():
    release = threading.Event()
    thread = threading.Thread(target=release.wait)
    thread.start()
    calls = [0]
    real_join = thread.join

    def join(*args, **kw):
        calls[0] += 1
        if calls[0] == 1:
            release.set()
            raise KeyboardInterrupt
        return real_join(*args, **kw)

    thread.join = join  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        closing.join(thread)
    assert calls[0] == 2 and not thread.is_alive()


def test_closeable_lives_below_the_backends():
    from conveyor.backends import base

    assert base.Closeable is closing.Closeable
