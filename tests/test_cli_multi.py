"""``conveyor map/reduce`` over several devices (issue 15 item 7): ``--device`` repeated or
``--device opencl:all``; ``conveyor devices --measure`` measures devices alone and all at once.

Where only one device here can build kernels, the second is a second context on its hardware
(tests/pipeline/test_multi.py says why), handed to the command through its device selection.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv
from conftest import DEVICES
from conveyor.cli import main, streaming

sys.path.insert(0, str(Path(__file__).resolve().parent / "pipeline"))
from test_multi import two_devices  # noqa: E402

from test_cli import KERNELS  # noqa: E402


@pytest.fixture
def two(monkeypatch):
    """Two devices of one backend, and ``--device pair`` selecting both."""
    first, second, made = two_devices()
    pair = [first, second]
    real = streaming.select
    monkeypatch.setattr(streaming, "select",
                        lambda specs, **kw: pair if specs == ["pair"] else real(specs, **kw))
    yield pair
    if made is not None:
        gc.collect()
        assert made.memory_pool.stats().in_use_bytes == 0
        made.close()


def test_map_and_reduce_on_two_devices(two, tmp_path, capsys):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(50_000).astype(np.float32)
    y = rng.standard_normal(50_000).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    kernel_file = tmp_path / ("k.cu" if two[0].backend == "cuda" else "k.cl")
    kernel_file.write_text(KERNELS)
    for schedule in ("dynamic", "static"):
        code = main(["map", str(kernel_file), "--kernel", "saxpy", "-i",
                     str(tmp_path / "x.npy"), "-i", str(tmp_path / "y.npy"), "-o",
                     str(tmp_path / "out.npy"), "--arg", "2", "--device", "pair",
                     "--schedule", schedule, "--block-bytes", "4000", "--json", "--force"])
        assert code == 0, capsys.readouterr().err
        figures = json.loads(capsys.readouterr().out)
        assert len(figures["devices"]) == 2 and figures["blocks"] == 50
        np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), np.float32(2) * x + y)
    code = main(["reduce", str(kernel_file), "--kernel", "positive", "-i",
                 str(tmp_path / "x.npy"), "--device", "pair", "--block-bytes", "4000",
                 "--json"])
    assert code == 0
    one = cv.stream(two[0].compile(KERNELS, "positive"), [x], reduce="sum", device=two[0],
                    block_bytes=4000)
    assert json.loads(capsys.readouterr().out)["result"] == float(one.result)  # bitwise


def test_a_device_repeated_is_refused(tmp_path, capsys):
    if not DEVICES:
        pytest.skip("no usable device")
    kernel_file = tmp_path / ("k.cu" if DEVICES[0].backend == "cuda" else "k.cl")
    kernel_file.write_text(KERNELS)
    np.save(tmp_path / "x.npy", np.ones(100, np.float32))
    spec = DEVICES[0].spec
    code = main(["reduce", str(kernel_file), "--kernel", "positive", "-i",
                 str(tmp_path / "x.npy"), "--device", spec, "--device", spec])
    assert code == 2 and "listed twice" in capsys.readouterr().err


def test_devices_measure_all_at_once(tmp_path, monkeypatch, capsys):
    from conveyor.measure_all import groups

    found = cv.devices()
    if not groups(found):
        pytest.skip("no two devices of one backend and kind here")
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["devices", "--measure"]) == 0
    out = capsys.readouterr().out
    assert "all at once: pinned in" in out
    saved = json.loads((tmp_path / "cache" / "link-bandwidth.json").read_text())["devices"]
    group = groups(found)[0]
    key = ",".join(d.spec for d in group) + "|" + ",".join(d.name for d in group)
    assert saved[key]["pinned_h2d_gbps"] > 0
