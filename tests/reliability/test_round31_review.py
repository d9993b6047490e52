"""Round thirty-one: a review of round thirty's fix (2e20693): ``overlap.maps_lines`` reads
``/proc/self/maps`` as bytes, splits at newlines, decodes each path with ``os.fsdecode`` and
turns the kernel's ``\\012`` back into a newline; ``io._mapped_writable`` reads bytes.

Found: the kernel escapes only a newline in a mapped file's name (as ``\\012``), never a
backslash, so a name that holds the four characters ``\\012`` reads the same as one holding a
newline, and ``maps_lines`` turns it into a newline: every user of the path (``mapped_path``,
``shared_file``, ``check_map_sizes``) then names a file that does not exist (or another
file). ``/proc/self/map_files/START-END`` names the file exactly (a link to it).

Each was a strict xfail seen failing for its reason, and is a plain test since the fix: of
the text as written and the text with ``\\012`` made a newline, the path is the one that
names the mapped inode now (``overlap._map_path``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import (  # noqa: E402, F401 (first_device_only: autouse, first device only)
    compiled,
    first_device_only,
    kernel,
)

import conveyor as cv  # noqa: E402

_ROWS = 1000
_ODD = "a\\012b.npy"  # a backslash, then 0, 1, 2: a legal name, which the maps show as is
_TWO = """
__kernel void two(__global const float *x, __global float *y, __global float *z,
                  ulong offset, ulong n) {
    size_t i = get_global_id(0);
    if (i < n) { y[i] = 2.0f * x[i]; z[i] = 3.0f * x[i]; }
}
"""
_SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A folder of this test's own under /tmp."""
    with tempfile.TemporaryDirectory(prefix="r31-review-", dir="/tmp") as folder:
        yield Path(folder)


def test_a_trace_onto_a_memmap_input_named_with_a_literal_012_is_refused(device, scratch):
    """README: ``trace=`` naming an input's file is an InputError (round thirty fixed it for a
    newline in the name). For ``a\\012b.npy`` the stream runs and the trace JSON replaces the
    user's input file."""
    x = np.arange(_ROWS, dtype=np.float32)
    path = scratch / _ODD
    np.save(path, x)
    source = np.load(path, mmap_mode="r")
    try:
        with pytest.raises(cv.InputError, match="names the same file as input 0"):
            cv.stream(kernel(device, "scale"), [source], [np.float32], device=device,
                      args=(2.0,), block_bytes=400, trace=str(path))
    finally:
        del source
        np.testing.assert_array_equal(np.load(path), x)


def test_a_file_output_of_a_memmap_outputs_file_named_with_a_literal_012_is_refused(
        device, scratch):
    """``stream._check_files`` refuses a file output naming the file a memmap output writes
    (the file output replaces the file at the end, and the memmap's rows go with the old
    one), as it does for ``plain.npy``. For ``a\\012b.npy`` the stream runs: afterwards the
    file holds output 1 only, and output 0's rows are in no file."""
    x = np.arange(_ROWS, dtype=np.float32)
    path = scratch / _ODD
    np.save(path, np.zeros_like(x))
    out = np.load(path, mmap_mode="r+")
    try:
        with pytest.raises(cv.InputError, match="output 0 is a memory map of"):
            cv.stream(compiled(device, _TWO, "two"), [x], [out, str(path)],
                      device=device, block_bytes=400)
    finally:
        del out


def test_a_memmap_input_named_with_a_literal_012_cut_after_mapping_is_an_input_error(
        device, scratch):
    """Round seventeen: a memmap input whose file was cut after it was mapped is an
    InputError before any work (touching its pages past the end is SIGBUS). For
    ``a\\012b.npy`` ``check_map_sizes`` stats ``a\\nb.npy`` (absent), gives up, and the
    process is killed. Run in a child."""
    path = scratch / _ODD
    code = textwrap.dedent(f"""
        import os, numpy as np, conveyor as cv
        np.save({str(path)!r}, np.arange(100_000, dtype=np.float32))
        m = np.load({str(path)!r}, mmap_mode="r")
        os.truncate({str(path)!r}, 128)

        def compute(x, y, *, queue, offset, n):
            return x

        try:
            cv.stream(compute, [m], [np.float32], device=cv.device({device.spec!r}))
        except cv.InputError as exc:
            print("InputError", exc)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (_SRC, os.environ.get("PYTHONPATH", "")) if p))
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=120)
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    assert "InputError" in child.stdout


def test_a_trace_onto_a_new_file_is_not_taken_for_a_memmap_input_of_a_literal_012(device,
                                                                                  scratch):
    """The input is a memmap of ``a\\012b.npy``; ``trace=`` names ``a\\nb.npy``, a file that
    does not exist: legal work, refused today with a message naming a file that is not the
    input (``same_file`` falls back to comparing the two paths)."""
    x = np.arange(_ROWS, dtype=np.float32)
    np.save(scratch / _ODD, x)
    source = np.load(scratch / _ODD, mmap_mode="r")
    try:
        got = cv.stream(kernel(device, "scale"), [source], [np.float32], device=device,
                        args=(2.0,), block_bytes=400, trace=str(scratch / "a\nb.npy"))
        np.testing.assert_array_equal(got.outputs[0], x * 2)
    finally:
        del source
