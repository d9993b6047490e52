"""The examples run (small sizes) and give NumPy's answers (issue 14: examples/bloom_filter.py
in CI)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [0, 1])
def test_bloom_filter_scores_are_exact_with_data_several_times_the_memory_limit(device, seed):
    bloom = _load("bloom_filter")
    words = 600_000  # 2.4 MB of words, 4x the limit
    exact, report = bloom.run(device, words, memory_limit=600_000, seed=seed)
    assert exact
    assert report.blocks > 4 and report.bytes_in == words * 4


@pytest.mark.parametrize("seed", [0, 1])
def test_bloom_filter_as_a_two_kernel_chain_is_exact_and_its_flags_stay_on_the_device(
        device, seed):
    bloom = _load("bloom_filter")
    words = 600_000
    exact, report = bloom.run(device, words, memory_limit=600_000, seed=seed, chain=True)
    assert exact
    assert report.blocks > 4
    assert report.bytes_in == words * 4 and report.bytes_out == 0  # the words only
    timeline = report.timeline
    assert sum(s.nbytes for s in timeline.lane("copy-in")) <= words * 4
    assert not timeline.lane("copy-out")  # no per-word flag came back
    assert {s.label for s in timeline.lane("compute")} == {"flag", "score_flagged"}


@pytest.mark.parametrize("ratio", [(2, 3), (1, 2)])
def test_resample_downscales_an_image_larger_than_the_memory_limit(device, ratio):
    resample = _load("resample")  # OpenCL images, CUDA texture objects
    rows, columns = 600, 390  # 0.94 MB of float32, 4x the limit
    exact, report = resample.run(device, rows, columns, ratio=ratio,
                                 memory_limit=rows * columns)
    assert exact
    assert report.blocks > 4
    assert report.outputs[0].shape == (rows * ratio[0] // ratio[1],
                                       columns * ratio[0] // ratio[1])
