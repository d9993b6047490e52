"""NVTX ranges: only on CUDA with the nvtx package; nothing to pay otherwise."""

from __future__ import annotations

import sys

import pytest

from conveyor.trace import nvtx as trace_nvtx


def test_no_annotator_off_cuda():
    assert trace_nvtx.annotator("opencl") is None


def test_no_annotator_without_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvtx", None)
    assert trace_nvtx.annotator("cuda") is None


def test_annotator_pushes_and_pops_ranges():
    pytest.importorskip("nvtx")
    annotator = trace_nvtx.annotator("cuda")
    assert annotator is not None
    for kind in ("stage", "host-wait", "unknown"):
        annotator.push(f"{kind} 0", kind)
        annotator.pop()
