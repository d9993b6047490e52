"""Issue 17, start-up: ``import conveyor`` (and reaching its public names, and ``conveyor
--help``) touches no driver: PyOpenCL and cuda.core load, and devices are found, only when a
call needs a device."""

from __future__ import annotations

import json
import subprocess
import sys

DRIVERS = ("pyopencl", "cuda")

PROBE = """
import json, sys
import conveyor as cv
{body}
import conveyor.backends as backends
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {drivers!r})
print(json.dumps({{"loaded": loaded, "found": backends._found is not None}}))
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
    assert _probe(body) == {"loaded": [], "found": False}


def test_conveyor_help_loads_no_driver():
    body = ("from conveyor.cli import main\n"
            "for argv in (['--help'], ['map', '--help']):\n"
            "    try:\n"
            "        main(argv)\n"
            "    except SystemExit as exc:\n"
            "        assert exc.code == 0, exc.code\n")
    assert _probe(body) == {"loaded": [], "found": False}


def test_a_call_that_needs_a_device_finds_them():
    got = _probe("cv.devices()")
    assert got["found"] is True and "pyopencl" in got["loaded"]
