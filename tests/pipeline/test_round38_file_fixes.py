"""Round thirty-eight's file fixes, beside the hunter's tests (reliability/
test_round38_special.py): ``python -m conveyor`` runs the command; Parquet and Arrow inputs,
opened once through ``io.open_regular`` and handed to PyArrow, still stream whole and leave
no descriptor open when a check made with it refuses the file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv
from conveyor.errors import InputError

SRC = str(Path(cv.__file__).resolve().parents[1])  # the conveyor under test, for the child



def _fds() -> int:
    """Descriptors this process holds now."""
    return len(os.listdir("/proc/self/fd"))


def _returns_x(x, y, *, queue, offset, n):
    """A callable that copies its input to its output (no kernel build)."""
    return x


def _table_file(tmp_path: Path, kind: str, x: np.ndarray) -> Path:
    """``x`` as column "x" of a Parquet or Arrow file in chunks of 2,000 rows."""
    pa = pytest.importorskip("pyarrow")
    path = tmp_path / f"x.{kind}"
    if kind == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"x": x}), path, row_group_size=2000)
    else:
        import pyarrow.feather as feather

        batches = [pa.record_batch({"x": x[i:i + 2000]}) for i in range(0, len(x), 2000)]
        feather.write_feather(pa.Table.from_batches(batches), path, compression="uncompressed")
    return path


def test_python_m_conveyor_runs_the_command():
    """``python -m conveyor --help`` prints the command's help and exits 0 (there was no
    ``conveyor/__main__.py``: "No module named conveyor.__main__")."""
    done = subprocess.run([sys.executable, "-m", "conveyor", "--help"], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                              filter(None, [SRC, os.environ.get("PYTHONPATH")]))))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage: conveyor" in done.stdout


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_a_table_input_read_through_its_descriptor_streams_whole(device, tmp_path, kind):
    """The file opened once (not by PyArrow, by path) is read whole, chunk by chunk."""
    x = np.arange(20_000, dtype=np.float32)
    source = getattr(cv, kind)(_table_file(tmp_path, kind, x), "x")
    y = cv.stream(_returns_x, [source], [np.float32], device=device, block_bytes=16_000,
                  warmup=False).outputs[0]
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_a_table_input_refused_after_its_open_leaves_no_descriptor(tmp_path, kind):
    """A check made with the open file (a column that is not there) refuses it, and closes
    the file it opened: the error's traceback held it open before."""
    path = _table_file(tmp_path, kind, np.arange(100, dtype=np.float32))
    before = _fds()
    with pytest.raises(InputError, match="no column 'y'"):
        getattr(cv, kind)(path, "y")
    assert _fds() == before
