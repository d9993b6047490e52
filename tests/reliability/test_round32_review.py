"""Round thirty-two: a review of the last session's final fixes (afcebd3, 883ec66).

Found: ``overlap._map_path`` tries two readings of a mapped file's ``/proc/self/maps`` text,
every ``\\012`` as written or every one made a newline. A name holding both (a literal
``\\012`` and a newline, in the file's name or in a folder's) is neither reading, so the path
names no file: a ``trace=`` onto such a memmap input replaces the input, a file output of a
memmap output's file is not refused, and a memmap cut after mapping kills the process
(SIGBUS). ``/proc/self/map_files/START-END`` is a link to the mapped file by its exact name.

Held (kept as guards below, and fuzzed in /tmp/r32rev/fuzz.py): ``first_row`` from -2**63
to 2**62 with ``offset`` of char to ulong, ``n`` of ushort to ulong, halos, ``cv.iterate``
and chains whose links differ in ``offset``'s signedness.
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
    opencl_c_only,
)

import conveyor as cv  # noqa: E402

_ROWS = 1000
# A literal backslash-0-1-2 and a newline in one name; /proc/self/maps shows both as \012.
_MIXED = ["a\\012b\nc.npy", "d\\012x/a\nb.npy"]
_TWO = """
__kernel void two(__global const float *x, __global float *y, __global float *z,
                  ulong offset, ulong n) {
    size_t i = get_global_id(0);
    if (i < n) { y[i] = 2.0f * x[i]; z[i] = 3.0f * x[i]; }
}
"""
_SRC = str(Path(__file__).resolve().parents[2] / "src")
_MAPPED_NAME = ("overlap._map_path tries every \\012 as written or every one a newline: a "
                "name holding both names no file")


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A folder of this test's own under /tmp."""
    with tempfile.TemporaryDirectory(prefix="r32-review-", dir="/tmp") as folder:
        yield Path(folder)


def _path(scratch: Path, name: str) -> Path:
    path = scratch / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.parametrize("name", _MIXED)
def test_a_trace_onto_a_memmap_input_named_with_a_literal_012_and_a_newline_is_refused(
        device, scratch, name):
    """README: ``trace=`` naming an input's file is an InputError. For a memmap input whose
    path holds a literal ``\\012`` and a newline, the stream runs and the trace JSON replaces
    the user's input file."""
    x = np.arange(_ROWS, dtype=np.float32)
    path = _path(scratch, name)
    np.save(path, x)
    source = np.load(path, mmap_mode="r")
    try:
        with pytest.raises(cv.InputError, match="names the same file as input 0"):
            cv.stream(kernel(device, "scale"), [source], [np.float32], device=device,
                      args=(2.0,), block_bytes=400, trace=str(path))
    finally:
        del source
        np.testing.assert_array_equal(np.load(path), x)


def test_a_file_output_of_a_memmap_outputs_file_named_with_a_literal_012_and_a_newline_is_refused(
        device, scratch):
    """``stream._check_files`` refuses a file output naming the file a memmap output writes
    (round thirty-one fixed it for ``a\\012b.npy``). For ``a\\012b<newline>c.npy`` the stream
    runs: afterwards the file holds output 1, and output 0's rows are in no file."""
    x = np.arange(_ROWS, dtype=np.float32)
    path = _path(scratch, _MIXED[0])
    np.save(path, np.zeros_like(x))
    out = np.load(path, mmap_mode="r+")
    try:
        with pytest.raises(cv.InputError, match="output 0 is a memory map of"):
            cv.stream(compiled(device, _TWO, "two"), [x], [out, str(path)],
                      device=device, block_bytes=400)
    finally:
        del out


def test_a_memmap_input_named_with_a_literal_012_and_a_newline_cut_after_mapping_is_an_input_error(
        device, scratch):
    """Round seventeen: a memmap input whose file was cut after it was mapped is an
    InputError before any work. For ``a\\012b<newline>c.npy`` ``check_map_sizes`` stats a
    name that is not the file, gives up, and the child is killed by SIGBUS."""
    path = _path(scratch, _MIXED[0])
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


def test_guard_an_in_place_memmap_of_a_file_named_with_a_literal_012_and_a_newline(
        device, scratch):
    """guard: a stream reading ``cv.npy(path)`` into a memmap of the same file writes it in
    place (``stream._mapped_outputs`` by the map's numbers where the path names no file)."""
    path = _path(scratch, _MIXED[0])
    x = np.arange(_ROWS, dtype=np.float32)
    np.save(path, x)
    out = np.load(path, mmap_mode="r+")
    try:
        cv.stream(kernel(device, "scale"), [cv.npy(path)], [out], device=device,
                  args=(2.0,), block_bytes=400)
        out.flush()
    finally:
        del out
    np.testing.assert_array_equal(np.load(path), 2 * x)


_AT = """__kernel void at(__global const float *x, __global long *y, {t} offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) y[i] = (long)offset + (long)i;
}}"""
_AT2 = """__kernel void at2(__global const long *t, __global long *y, {t} offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) y[i] = t[i] * 1000 + ((long)offset + (long)i - t[i]);
}}"""


@pytest.mark.parametrize(("first", "second"), [("long", "ulong"), ("ulong", "int")])
def test_guard_chain_links_of_either_offset_signedness_with_a_negative_first_row(
        device, first, second):
    """guard: ``ChainStep.signed`` is read per link: a ``long`` and a ``ulong`` (or ``int``)
    ``offset`` in one chain each get row ``first_row + i``'s offset, with a halo and blocks
    of 3 rows (2-D rows of 2 elements)."""
    opencl_c_only(device)
    chain = cv.chain([device.compile(_AT.format(t=first), "at"),
                      device.compile(_AT2.format(t=second), "at2")], temps=[np.int64])
    x = np.zeros((10, 2), np.float32)
    y = np.full((10, 2), -1, np.int64)
    cv.stream(chain, [x], [y], first_row=-4, halo=1, block_bytes=24, device=device)
    np.testing.assert_array_equal(y.reshape(-1), (np.arange(20) - 8) * 1000)
