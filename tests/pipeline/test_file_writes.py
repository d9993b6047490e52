"""Output files written through a shared mapping of the part file (pipeline/sinks.py), or with
``pwrite`` (``CONVEYOR_FILE_WRITES=pwrite``, and where the file system cannot reserve blocks):
the same bytes either way, a file too large for the disk refused at the start, nothing left
behind by a failure, and the mapping never dropped under a write in progress."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from streamkit import add_reference, data, kernel

import conveyor as cv
from conveyor.pipeline import sinks

WAYS = ["map", "pwrite"]


def _mapped_sinks(monkeypatch) -> list[bool]:
    """Record, for each FileSink opened, whether it writes through a mapping."""
    seen: list[bool] = []
    real = sinks.FileSink.open

    def open_(self):
        real(self)
        seen.append(self._map is not None)

    monkeypatch.setattr(sinks.FileSink, "open", open_)
    return seen


@pytest.mark.parametrize("way", WAYS)
def test_npy_and_raw_outputs_hold_the_same_bytes_either_way(device, tmp_path, monkeypatch, way):
    monkeypatch.setenv("CONVEYOR_FILE_WRITES", way)
    seen = _mapped_sinks(monkeypatch)
    a, b = data((300_001,), np.float32, 1), data((300_001,), np.float32, 2)
    cv.stream(kernel(device, "add"), [a, b], [tmp_path / "c.npy"], device=device,
              block_bytes=2**20, workers=3, zero_copy=False)
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), add_reference(a, b))
    cv.stream(kernel(device, "add"), [a, b], [cv.raw_out(tmp_path / "c.bin", np.float32)],
              device=device, block_bytes=2**20, workers=3)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "c.bin", np.float32),
                                  add_reference(a, b))
    assert seen == [way == "map"] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.bin", "c.npy"]  # no part left


def test_rows_of_several_columns_land_in_place_through_the_mapping(device, tmp_path):
    x = data((4099, 37), np.float32, 3)
    cv.stream(kernel(device, "scale"), [x], [tmp_path / "y.npy"], device=device,
              args=[np.float32(3)], block_bytes=65536, workers=4)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), x * np.float32(3))


@pytest.mark.parametrize("way", WAYS)
def test_an_output_larger_than_the_file_size_limit_fails_and_leaves_nothing(tmp_path, way):
    """A file the disk (here: RLIMIT_FSIZE) cannot hold is an OSError (EFBIG; ENOSPC on a
    full disk), not a SIGBUS: with the mapping at the start, before any work, as the blocks
    are reserved first; with pwrite at the first write past the limit."""
    script = textwrap.dedent(f"""
        import errno, os, resource, signal, sys
        import numpy as np
        import conveyor as cv
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: EFBIG, not a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, 2**20))
        x = np.ones(2**20, np.float32)  # 4 MiB out
        try:
            cv.stream(lambda x, y: y.__setitem__(slice(None), x), [x],
                      [cv.raw_out({str(tmp_path / "y.bin")!r}, np.float32)],
                      block_bytes=2**19)
        except OSError as exc:
            print("OSError", errno.errorcode[exc.errno])
            sys.exit(0)
        print("no error")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "CONVEYOR_FILE_WRITES": way})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "OSError EFBIG", done.stdout + done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_mapping_is_dropped_only_after_writes_in_progress(tmp_path):
    """abort() while a write copies into the mapping waits for it; a write that comes after
    falls back to pwrite on the still-open file (never into unmapped memory)."""
    sink = sinks.FileSink(tmp_path / "y.npy", np.float32, (2**20,))
    sink.open()
    assert sink._map is not None
    entered, release = threading.Event(), threading.Event()
    real_bytes = sink._bytes

    class Slow(np.ndarray):  # a view of the mapping whose copy waits to be released
        def __getitem__(self, key):
            entered.set()
            release.wait(10)
            return np.ndarray.__getitem__(self, key)

    sink._bytes = real_bytes.view(Slow)
    writer = threading.Thread(target=sink.write_from, args=(np.ones(2**20, np.float32), 0))
    writer.start()
    assert entered.wait(10)
    aborting = threading.Thread(target=sink.abort)
    aborting.start()
    aborting.join(0.2)
    assert aborting.is_alive(), "abort() did not wait for the write in progress"
    release.set()
    writer.join(10)
    aborting.join(10)
    assert not aborting.is_alive() and sink._map is None
    assert list(tmp_path.iterdir()) == []
