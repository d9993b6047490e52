"""Issue 17, start-up: ``import conveyor`` (and reaching its public names, and ``conveyor
--help``) touches no driver: PyOpenCL and cuda.core load, and devices are found, only when a
call needs a device."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import conveyor as cv

DRIVERS = ("pyopencl", "cuda")

PROBE = """
import json, sys
import conveyor as cv
{body}
import conveyor.backends as backends
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {drivers!r})
print(json.dumps({{"loaded": loaded, "found": sorted(backends._found)}}))
"""


def _probe(body: str) -> dict:
    code = PROBE.format(body=body, drivers=DRIVERS)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_conveyor_and_its_names_load_no_driver():
    body = "\n".join(f"cv.{name}" for name in (
        "stream", "pinned", "npy", "npy_out", "resident", "portable", "keep_pinned",
        "configure", "release_pinned", "Report", "InputError", "per_block", "rows"))
    body += "\nimport conveyor.pipeline.engine, conveyor.memory.keep, conveyor.memory.prefault"
    assert _probe(body) == {"loaded": [], "found": []}


def test_conveyor_help_loads_no_driver():
    body = ("from conveyor.cli import main\n"
            "for argv in (['--help'], ['map', '--help']):\n"
            "    try:\n"
            "        main(argv)\n"
            "    except SystemExit as exc:\n"
            "        assert exc.code == 0, exc.code\n")
    assert _probe(body) == {"loaded": [], "found": []}


def test_a_call_that_needs_a_device_finds_them():
    got = _probe("cv.devices()")
    assert got["found"] == ["cuda", "opencl"] and "pyopencl" in got["loaded"]


def test_an_opencl_spec_starts_no_cuda():
    # A call that names OpenCL (or the CPU kind, which only OpenCL has) does not ask CUDA for
    # devices, nor load it; the GPU machine's tests cover the reverse ("cuda:0").
    for spec in ("opencl:0:0", "opencl", "opencl:0", "cpu", "opencl:all", "cpu:all"):
        got = _probe(f"from conveyor.backends import select\n"
                     f"select({spec!r}, warm_up=False)")
        assert got["found"] == ["opencl"], (spec, got)
        assert not [m for m in got["loaded"] if m.startswith("cuda")], (spec, got)


def test_the_default_device_stops_at_cuda_when_it_has_a_gpu():
    cuda_gpu = any(d.backend == "cuda" and d.kind == "gpu" for d in cv.devices())
    bodies = ["cv.device(warm_up=False)"] + ["cv.device('gpu', warm_up=False)"] * cuda_gpu
    for body in bodies:
        got = _probe(body)
        assert got["found"] == (["cuda"] if cuda_gpu else ["cuda", "opencl"]), (body, got)


@pytest.mark.gpu
def test_a_cuda_spec_starts_no_opencl():
    if not any(d.backend == "cuda" for d in cv.devices()):
        pytest.skip("no CUDA device")
    got = _probe("cv.device('cuda:0', warm_up=False)")
    assert got["found"] == ["cuda"] and "pyopencl" not in got["loaded"], got
