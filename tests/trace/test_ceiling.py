"""The link ceiling: read from the cache when measured, ignored when absent or damaged."""

from __future__ import annotations

import json

import pytest
from tracekit import vadd_stream

from conveyor.trace import ceiling


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_no_ceiling_file_means_no_ratio(device, cache_dir):
    report = vadd_stream(device)
    assert report.ceiling is None and report.ceiling_ratio_in is None
    assert "ceiling" not in str(report)


def test_measured_ceiling_gives_the_ratio(device, cache_dir):
    ceiling.save_link_ceiling(device.spec, device.name,
                              {"pinned_h2d_gbps": 2.0, "pinned_d2h_gbps": 4.0})
    report = vadd_stream(device)
    assert report.ceiling == ceiling.LinkCeiling(2.0, 4.0)
    assert report.ceiling_ratio_in == pytest.approx(report.gbps_in / 2.0)
    assert report.ceiling_ratio_out == pytest.approx(report.gbps_out / 4.0)
    assert "x ceiling" in str(report)


def test_saving_keeps_other_devices(cache_dir):
    ceiling.save_link_ceiling("cuda:0", "A", {"pinned_h2d_gbps": 50.0})
    ceiling.save_link_ceiling("cuda:1", "B", {"pinned_d2h_gbps": 40.0})
    assert ceiling.link_ceiling("cuda:0", "A") == ceiling.LinkCeiling(50.0, None)
    assert ceiling.link_ceiling("cuda:1", "B") == ceiling.LinkCeiling(None, 40.0)
    assert ceiling.link_ceiling("cuda:0", "another GPU") is None
    assert [p.name for p in cache_dir.iterdir()] == [ceiling.FILE_NAME]


@pytest.mark.parametrize("text", [
    "", "{", "[]", '{"devices": []}', '{"devices": {"cuda:0|A": 3}}',
    '{"devices": {"cuda:0|A": {"pinned_h2d_gbps": "fast"}}}',
    '{"devices": {"cuda:0|A": {"pinned_h2d_gbps": -1}}}',
])
def test_damaged_file_means_unknown(cache_dir, text):
    (cache_dir / ceiling.FILE_NAME).write_text(text)
    assert ceiling.link_ceiling("cuda:0", "A") is None


def test_a_bad_cache_setting_means_unknown(monkeypatch):
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", "relative/dir")
    assert ceiling.link_ceiling("cuda:0", "A") is None


def test_other_key_spellings_are_read(cache_dir):
    document = {"devices": {"cuda:0|A": {"h2d_gbps": 12.5, "d2h": 11}}}
    (cache_dir / ceiling.FILE_NAME).write_text(json.dumps(document))
    assert ceiling.link_ceiling("cuda:0", "A") == ceiling.LinkCeiling(12.5, 11.0)
