"""NVTX ranges: only on CUDA with the nvtx package; nothing to pay otherwise."""

from __future__ import annotations

import sys

import pytest

from conveyor.trace import nvtx as trace_nvtx


@pytest.fixture(autouse=True)
def fresh_lookup():
    """The package is looked up once per process: each test looks afresh, and leaves the
    process's answer as it found it (sys.modules restored by monkeypatch)."""
    trace_nvtx._cuda_annotator.cache_clear()
    yield
    trace_nvtx._cuda_annotator.cache_clear()


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


def test_the_package_is_looked_up_once_per_process(monkeypatch):
    """Not once per stream: a failed import searched sys.path from every streaming thread."""
    monkeypatch.setitem(sys.modules, "nvtx", None)
    first = trace_nvtx.annotator("cuda")
    monkeypatch.delitem(sys.modules, "nvtx")
    assert trace_nvtx.annotator("cuda") is first  # the first answer, not a new import
