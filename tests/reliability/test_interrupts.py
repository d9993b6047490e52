"""Ctrl-C at random points of long streams (issue 8, item 7), in a subprocess that sends SIGINT
to itself from a timer with a seeded random delay (interrupt_child.py says what it checks after
every interrupt: pools at zero, no staging thread, no partial ``.npy`` output, the next stream
right). The seed and every delay are printed; a failure shows them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import conveyor as cv
from conveyor.pipeline import engine as engine_module
from conveyor.pipeline.stage import Stager

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
PIPELINE = HERE.parent / "pipeline"  # streamkit, for the child
# One seed of 8 rounds (two of 16 before session 13): tests/pipeline/test_interrupt_sweep.py
# now tries some 1,500 chosen points a run, where these draw them.
ROUNDS = 8

sys.path.insert(0, str(HERE))  # reliakit (and, through it, streamkit)
from reliakit import assert_clean, kernel, next_stream_right, vadd_arrays  # noqa: E402


@pytest.mark.parametrize("seed", [1234])
def test_sigint_at_random_points_leaves_the_process_usable(device, tmp_path, seed):
    # Prepend: the GPU machine's carried wheels are on the inherited PYTHONPATH.
    path = os.pathsep.join([str(SRC), str(PIPELINE), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path.rstrip(os.pathsep))
    folder = tmp_path / "out"
    folder.mkdir()
    done = subprocess.run(
        [sys.executable, str(HERE / "interrupt_child.py"), device.spec, str(seed), str(ROUNDS),
         str(folder)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1].split()
    assert last[0] == "OK" and int(last[1]) > 0, done.stdout  # some rounds were cut short


class _InterruptedJoin(Stager):
    """The real stager; Ctrl-C lands just as ``close()`` starts joining its workers (the
    first call of the executor's real shutdown raises KeyboardInterrupt)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        real, calls = self._executor.shutdown, [0]

        def shutdown(*a, **k):
            calls[0] += 1
            if calls[0] == 1:
                raise KeyboardInterrupt
            return real(*a, **k)

        self._executor.shutdown = shutdown  # type: ignore[method-assign]


def test_interrupt_while_joining_the_staging_threads_still_cleans_up(device, monkeypatch):
    monkeypatch.setattr(engine_module, "Stager", _InterruptedJoin)
    a, b, c = vadd_arrays(4000)
    with pytest.raises(KeyboardInterrupt):
        cv.stream(kernel(device, "add"), [a, b], [c], device=device, block_bytes=1000,
                  zero_copy=False, workers=2)
    monkeypatch.undo()
    assert_clean(device)
    next_stream_right(device)
