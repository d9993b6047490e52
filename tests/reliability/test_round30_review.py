"""Round thirty: a review of round twenty-nine's fixes (02fe605..63e686e): in-place outputs
matched by (device, inode) (``stream._mapped_outputs``, ``FileSource.file_id``), and the
whole life of a ``FileSource`` beside it; ``alloc_image``'s dtype and ``check_sampler``.

Method (scripts under /tmp/r30rev, not kept): streams with a memmap input or output while the
process also maps a file whose name is not UTF-8 (legal on Linux: bytes names).

Found: ``overlap._read_maps`` reads ``/proc/self/maps`` as UTF-8 text, so one mapped file of a
Latin-1 name anywhere in the process makes every stream with a memmap input or output (in
place or not) fail with a bare UnicodeDecodeError; and `trace=` onto a memmap input whose
name holds a newline or U+2028 is not refused (the path read from the maps never matches)
and replaces the input file. Each was a strict xfail seen failing for its reason; the maps
are read as bytes now, split at newlines only, each path decoded as the file system names it
(``overlap.maps_lines``), and each test is a plain test since.
"""

from __future__ import annotations

import mmap
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import first_device_only, kernel  # noqa: E402, F401 (autouse: first device only)

import conveyor as cv  # noqa: E402

_ROWS = 1000


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A folder of this test's own under /tmp."""
    with tempfile.TemporaryDirectory(prefix="r30-review-", dir="/tmp") as folder:
        yield Path(folder)


@pytest.fixture
def latin1_map(scratch: Path) -> Iterator[None]:
    """A shared writable map (``mmap.mmap``, closed at teardown however the test ends, so no
    other test sees it), held by the caller, of a file whose name is Latin-1 bytes
    (``café.bin`` as b"caf\\xe9.bin": not UTF-8, a legal Linux file name)."""
    name = os.path.join(os.fsencode(scratch), b"caf\xe9.bin")
    with open(name, "wb") as f:
        f.write(bytes(4096))
    fd = os.open(name, os.O_RDWR)
    try:
        held = mmap.mmap(fd, 4096)
    finally:
        os.close(fd)
    try:
        yield
    finally:
        held.close()


@pytest.mark.parametrize("case", ["in place", "memmap output", "memmap input"])
def test_a_mapped_file_of_a_latin1_name_does_not_break_memmap_streams(device, scratch,
                                                                      latin1_map, case):
    """README: memmaps are inputs and outputs like any array, and an input's memmap may be
    its output (in place). The caller also holds a memmap of a file named in Latin-1
    (``latin1_map``, unrelated to the stream). Each stream below must run; today
    ``check_map_sizes`` -> ``_read_maps`` raises UnicodeDecodeError before any work."""
    x = np.arange(_ROWS, dtype=np.float32)
    path = scratch / "x.npy"
    np.save(path, x)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))  # each write changes it
    if case == "in place":
        out = np.load(path, mmap_mode="r+")
        cv.stream(kernel(device, "scale"), [cv.npy(path)], [out], device=device,
                  args=(2.0,), block_bytes=400)
        del out
        np.testing.assert_array_equal(np.load(path), x * 2)
    elif case == "memmap output":
        np.save(scratch / "y.npy", np.zeros_like(x))
        out = np.load(scratch / "y.npy", mmap_mode="r+")
        cv.stream(kernel(device, "scale"), [x], [out], device=device, args=(2.0,),
                  block_bytes=400)
        np.testing.assert_array_equal(out, x * 2)
    else:
        got = cv.stream(kernel(device, "scale"), [np.load(path, mmap_mode="r")],
                        [np.float32], device=device, args=(2.0,),
                        block_bytes=400).outputs[0]
        np.testing.assert_array_equal(got, x * 2)


@pytest.mark.parametrize("name", ["a\nb.npy", "a\u2028b.npy"])
def test_a_trace_onto_a_memmap_input_of_an_odd_name_is_refused(device, scratch, name):
    """README: ``trace=`` naming an input's file is an InputError (it would replace it), as
    it is for ``plain.npy``. For a memmap input whose name holds a newline or U+2028 the
    stream runs and the trace JSON replaces the user's input file."""
    x = np.arange(_ROWS, dtype=np.float32)
    path = scratch / name
    np.save(path, x)
    source = np.load(path, mmap_mode="r")
    try:
        with pytest.raises(cv.InputError, match="names the same file as input 0"):
            cv.stream(kernel(device, "scale"), [source], [np.float32], device=device,
                      args=(2.0,), block_bytes=400, trace=str(path))
    finally:
        del source
        np.testing.assert_array_equal(np.load(path), x)
