"""Round twenty-three, helper A: a review of the source changes since round twenty-one's fixes
(4ffe02c..1da6a20): the timeline's compaction of a long stream's events, the named EMFILE
error, the flat folds and ``_host_copy``, ``kernel.headers`` and the several-device check in
``kernel_for``, ``_in_forked_child`` and the pool's ``_done``.

The compaction was tried with ``COMPACT_RECORDS`` lowered to 1 (every retire compacts) against
the default, over one device and two (static and dynamic), staged and zero-copy paths, depth
1 to 3, chains (kernel links, a reduction ending one), callable and kernel reductions, halo,
``cv.iterate``, file inputs and outputs, 1 MiB blocks on the staging threads and image
blocks: the spans (lane, block, label, bytes), the lanes, whether the overlap and bound are
known, the Chrome trace's events and the pickled report agreed every time (guards below).

Found (strict xfails, each asserting the right behaviour):

- **Wrong answer (two devices)**: a kernel whose header is found through an ``-I`` folder of
  ``PYOPENCL_BUILD_OPTIONS`` (which PyOpenCL adds to every build), edited after the kernel was
  built, streams over two devices with no error: one device runs the old code, the other the
  new (3600 rows x 1, 400 rows x 2). ``header_state`` reads ``options`` only
  (build.py:260, 306; multi.py:76), where the cache key reads ``[*options, *forced]``
  (cache.py:126). The same for a change of ``PYOPENCL_BUILD_OPTIONS`` itself (``-DK=2``):
  the kernel records neither.
- **Stale kernel (wrong answer, persists on disk)**: a header edited while a
  ``compile(wait=False)`` build waits or runs: the key (and ``kernel.headers``) were read
  from the old text, the compiler read the new, and the binary is memoized and stored in the
  disk cache under the OLD text's key (build.py:305-329, ``_fetch_or_build`` stores under
  ``self._key``); with the header set back, ``compile`` (in this process or any later one)
  runs the new code (x * 2 for x * 1). ``compile_kernel`` has the same window (key at
  build.py:258, the build after it).
- **Wrong answer (Dask)**: ``conveyor.dask.reduce`` of float16 partials over more chunks than
  dask combines at once (16): each group's total is cast to float16 by ``Fold.result``
  (fold.py:86) inside ``_fold``, dask's ``combine`` (arrays.py:176): inf + -inf = nan where
  ``cv.stream`` adds in float32 and gives 0 (and rounds twice short of overflow). A file
  stream's ``reduce=`` folds the workers' float16 results the same way (files.py).
- **Wrong answer**: a ``reduce=f`` partial that is a dataclass, a ``SimpleNamespace`` or a
  ``deque`` holding a buffer the callable fills again for every block folds the buffer as it
  is when the block retires (1080 for 780): ``_host_copy`` copies inside tuples, lists and
  dicts only (step.py:416). Round twenty-two's dict case, for the other containers.
- **Misleading error**: with no file descriptor left, naming a ``.npy`` (or raw) input is an
  InputError "cannot read input file x.npy (Too many open files): check its permissions":
  ``io._existing`` (io.py:485) opens every input first and was not given
  ``raise_if_too_many_open`` (only ``FileSource._file`` and the sinks were).
- **Raw error**: a closed pool's ``release(block, after=event)`` whose event cannot answer
  (a forked child's) raises the event's error, and drops every pending block: ``_done``
  guards the first ``is_done`` (pool.py:328), but ``_collect_done`` (pool.py:483), which
  ``release`` calls at once on a closed pool, asks the same event again unguarded.

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import pickle
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import (  # noqa: E402
    first_device_only,  # noqa: F401 (autouse: first device only)
    kernel,
    opencl_c_only,
)
from streamkit import to_host  # noqa: E402

import conveyor as cv  # noqa: E402
from conveyor.errors import BackendError, InputError  # noqa: E402
from conveyor.trace import timeline as trace_timeline  # noqa: E402

X = np.arange(40, dtype=np.float32)  # four blocks of 10 rows at block_bytes=40

SCALE_SRC = """#include {include}
__kernel void scale23(__global const float *x, __global float *y, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * K23;
}}
"""


# -- trace/timeline.py: compaction of a long stream's events --------------------------------------

def _shape(report: cv.Report, devices: bool = True) -> tuple:
    """What a stream's timeline says that does not depend on timing."""
    timeline = report.timeline
    spans = sorted((s.lane, s.block, s.label, s.nbytes, s.device if devices else "")
                   for s in timeline.spans)
    trace = sorted((e.get("name"), e.get("ph")) for e in timeline.to_chrome_trace()["traceEvents"]
                   if e.get("ph") == "X")
    again = pickle.loads(pickle.dumps(report)).timeline
    assert sorted((s.lane, s.block, s.label, s.nbytes) for s in again.spans) == \
        sorted((s.lane, s.block, s.label, s.nbytes) for s in timeline.spans)
    return (spans, timeline.lanes, trace, report.overlap is None, report.bound is None,
            len(timeline))


def _both_ways(monkeypatch: pytest.MonkeyPatch, run, devices: bool = True):
    """``run()`` with the default threshold, then compacting at every retire."""
    first = run()
    monkeypatch.setattr(trace_timeline, "COMPACT_RECORDS", 1)
    calls = []
    real = trace_timeline.compact

    def counting(*args):
        calls.append(args[2])
        return real(*args)

    monkeypatch.setattr(trace_timeline, "compact", counting)
    second = run()
    monkeypatch.undo()
    assert calls, "the stream never compacted"
    assert _shape(first, devices) == _shape(second, devices)
    return first, second


def test_guard_compacted_timeline_is_the_same_over_two_devices_chain_and_reduce(
        pair, monkeypatch):
    """guard: a chain of two kernels ending in a reduction, over two devices (static: each
    device the same blocks every run), staged: the same spans, lanes and trace whether the
    events were read at the end or as the blocks retired; the same total."""
    first, second = pair
    add, ident = kernel(first, "add"), kernel(first, "ident")
    chain = cv.chain(cv.link(add, reads=("in0", "in1"), writes="t"),
                     cv.link(ident, reads="t", writes="reduce"), temps={"t": np.float32})
    a = np.arange(4000, dtype=np.float32)

    def run():
        return cv.stream(chain, [a, a], device=pair, reduce="sum", block_bytes=400,
                         schedule="static", zero_copy=False)

    one, two = _both_ways(monkeypatch, run)
    want = float((2 * a + np.arange(4000) % 7).sum())
    assert float(one.result) == float(two.result) == want


def test_guard_compacted_timeline_is_the_same_for_files_halo_and_iterate(
        device, tmp_path, monkeypatch):
    """guard: a stencil (halo=1) of a cv.iterate input into a .npy output, depth 3, and a
    callable reduction over a .npy input: the same timeline both ways, outputs right."""
    x = np.arange(3000, dtype=np.float32).reshape(1000, 3)
    np.save(tmp_path / "x.npy", x)
    sten = kernel(device, "sten")

    def stencil():
        chunks = (x[i:i + 77] for i in range(0, 1000, 77))
        return cv.stream(sten, [cv.iterate(chunks, 1000)], [tmp_path / "y.npy"],
                         device=device, args=(3, 1), halo=1, block_bytes=3 * 4 * 100, depth=3)

    _both_ways(monkeypatch, stencil)
    y = np.load(tmp_path / "y.npy")
    padded = np.concatenate([x[:1], x, x[-1:]])
    np.testing.assert_array_equal(y, padded[:-2] + padded[1:-1] + padded[2:])

    def total(a, *, queue, offset, n):
        return float(to_host(a, queue).sum())

    def reduced():
        return cv.stream(total, [tmp_path / "x.npy"], device=device, reduce="sum",
                         block_bytes=1200)

    one, two = _both_ways(monkeypatch, reduced)
    assert one.result == two.result == float(x.sum())


# -- kernels/build.py, pipeline/multi.py: kernel.headers and the several-device check -------------

def test_header_found_through_pyopencl_build_options_is_checked_over_two_devices(
        pair, tmp_path, monkeypatch):
    """The kernel includes <k23.h>, found through ``PYOPENCL_BUILD_OPTIONS=-I<dir>`` (the
    cache key reads that folder's headers). After the header is edited, a stream over two
    devices must be refused as it is for an ``-I`` of the kernel's own options; today the
    second device builds the new code and the output mixes x * 1 and x * 2 with no error.
    (The same for ``PYOPENCL_BUILD_OPTIONS`` itself changed to ``-DK23=2.0f``.)"""
    first, _ = pair
    (tmp_path / "k23.h").write_text("#define K23 1.0f\n")
    monkeypatch.setenv("PYOPENCL_BUILD_OPTIONS", f"-I{tmp_path}")
    k = first.compile(SCALE_SRC.format(include="<k23.h>"), "scale23")
    (tmp_path / "k23.h").write_text("#define K23 2.0f\n")
    x = np.ones(4000, dtype=np.float32)
    y = np.zeros_like(x)
    try:
        cv.stream(k, [x], [y], device=pair, block_bytes=400)
    except InputError as exc:
        assert "compile the kernel again" in str(exc)
        return
    values, counts = np.unique(y, return_counts=True)
    pytest.fail(f"no error; rows of each value: {values.tolist()} {counts.tolist()}")


def test_header_edited_while_a_kernel_future_builds_does_not_poison_the_cache(
        device, tmp_path):
    """The header's text is read for the key when ``compile(wait=False)`` returns, and again
    by the compiler when its thread builds (here held back by the build's own lock until the
    header was edited from K23 1 to 2). The binary of the new text is then kept, in the memo
    and the disk cache, under the OLD text's key: with the header set back to 1, compiling
    the kernel again (in this process or any later one) runs x * 2. The build must not be
    filed under a key whose headers it did not read (read the state again after the build;
    where it changed, build again or keep it out of the memo and the cache)."""
    from conveyor.kernels.build import default_cache, device_key
    from conveyor.kernels.buildlock import build_lock

    opencl_c_only(device)
    header = tmp_path / "k23.h"
    header.write_text("#define K23 1.0f\n")
    source, options = SCALE_SRC.format(include='"k23.h"'), ("-I", str(tmp_path))
    with build_lock(device_key(device, options, source), default_cache()):
        future = device.compile(source, "scale23", options=options, wait=False)
        header.write_text("#define K23 2.0f\n")
    future.result()
    header.write_text("#define K23 1.0f\n")
    again = device.compile(source, "scale23", options=options)
    x = np.ones(8, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(again, [x], [y], device=device)
    assert (y == 1).all(), y


def test_guard_header_checks_over_two_devices(pair, tmp_path, monkeypatch):
    """guard: an include of an include (-I): a header only touched (its mtime) streams over
    two devices, right; one edited, or deleted, is refused naming its path; a kernel with no
    header at all streams."""
    first, _ = pair
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inc").mkdir()
    outer, inner = tmp_path / "inc" / "outer23.h", tmp_path / "inc" / "inner23.h"
    outer.write_text('#include "inner23.h"\n')
    inner.write_text("#define K23 3.0f\n")
    k = first.compile(SCALE_SRC.format(include='"outer23.h"'), "scale23",
                      options=("-I", str(tmp_path / "inc")))
    x = np.ones(400, dtype=np.float32)
    y = np.zeros_like(x)
    os.utime(inner, (1, 1))
    cv.stream(k, [x], [y], device=pair, block_bytes=40)
    assert (y == 3).all()
    inner.write_text("#define K23 4.0f\n")
    with pytest.raises(InputError, match="inner23.h"):
        cv.stream(k, [x], [y], device=pair, block_bytes=40)
    inner.unlink()
    with pytest.raises(InputError, match="inner23.h.*compile the kernel again"):
        cv.stream(k, [x], [y], device=pair, block_bytes=40)
    plain = kernel(first, "scale")
    assert plain.headers == ()
    cv.stream(plain, [x], [y], device=pair, args=(np.float32(2),), block_bytes=40)
    assert (y == 2).all()


# -- pipeline/step.py: _host_copy ------------------------------------------------------------------

@dataclasses.dataclass
class Hist:
    h: np.ndarray


def _holder(kind: str, value: np.ndarray):
    if kind == "dataclass":
        return Hist(value)
    if kind == "namespace":
        return types.SimpleNamespace(h=value)
    return collections.deque([value])


def _held(partial) -> np.ndarray:
    return partial[0] if isinstance(partial, collections.deque) else partial.h


@pytest.mark.parametrize("kind", ["dataclass", "namespace", "deque"])
def test_custom_partial_holding_a_reused_buffer_folds_each_blocks_values(device, kind):
    """The callable fills one buffer for every block and returns it inside an object that a
    custom ``reduce=f`` folds: each block's values must be folded, as they are for a tuple
    or a dict (round twenty-two). Today block 0's partial is read when it retires, after
    block 1 refilled the buffer: 1080 for 780."""
    buf = np.zeros(2)

    def part(a, *, queue, offset, n):
        buf[:] = [to_host(a, queue).sum(), n]
        return _holder(kind, buf)

    def fold(s, t):
        return _holder(kind, _held(s) + _held(t))

    got = cv.stream(part, [X], device=device, reduce=fold, block_bytes=40, depth=2).result
    assert _held(got).tolist() == [float(X.sum()), 40.0]


# -- files.py: raise_if_too_many_open and where it is not called ----------------------------------

_EMFILE_CHILD = textwrap.dedent("""
    import os, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    import numpy as np
    import conveyor as cv
    path = sys.argv[1]
    cv.npy(path), cv.raw(path, np.uint8)  # every module they use imported first
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    for make in (lambda: cv.npy(path), lambda: cv.raw(path, np.uint8)):
        try:
            make()
            print("no error")
        except BaseException as exc:
            print(type(exc).__name__, getattr(exc, "errno", None), exc)
""")


def test_no_descriptor_left_for_an_input_file_is_named_as_such(tmp_path):
    """With no file descriptor left (ulimit -n, in a child process), naming an input file
    must raise the named OSError of an output (errno 24, "ulimit -n"), not an InputError
    telling the user to check the file's permissions."""
    np.save(tmp_path / "x.npy", X)
    done = subprocess.run([sys.executable, "-c", _EMFILE_CHILD, str(tmp_path / "x.npy")],
                          capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and len(lines) == 2, done.stderr[-2000:]
    for line in lines:
        assert line.startswith("OSError 24") and "ulimit -n" in line, line
        assert "permissions" not in line, line


# -- memory/pool.py: _done ------------------------------------------------------------------------

class _Unanswering:
    """A real event whose is_done raises, as a forked child's does."""

    def __init__(self, event) -> None:
        self.event = event

    def is_done(self) -> bool:
        raise BackendError("this event belongs to the parent process (forked child)")

    def wait(self) -> None:
        self.event.wait()

    def detached(self):
        return self


def test_closed_pool_release_after_an_event_that_cannot_answer(device):
    """A block given back to a closed pool, fenced by an event that cannot answer: kept
    pending (as ``_done`` does for an open pool), no error out of ``release``, the pending
    bytes still counted until the event can answer."""
    from conveyor.memory.pool import DevicePool

    pool = DevicePool(device)
    queue = device.create_queue()
    try:
        block = pool.acquire(4096)
        pool.close()
        pool.release(block, after=_Unanswering(queue.marker()))
        assert pool.stats().pending_bytes == block.nbytes
    finally:
        pool._pending.clear()  # the event never answers: free the block by hand
        block.close()
        queue.close()


# -- dask/arrays.py: the tree fold of the chunks' partials ----------------------------------------

@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
def test_dask_reduce_of_float16_partials_folds_as_cv_stream_does(device):
    """32 chunks (dask combines 16 at a time, then aggregates the groups) whose callable
    returns float16 partials, +30000 for the first 16 chunks and -30000 for the rest:
    ``cv.stream`` adds float16 partials in float32 and casts the total once (0.0);
    ``conveyor.dask.reduce`` must give what it gives (its docstring says so). Today each
    group's total is cast to float16 (inf, -inf) before the groups are added: nan."""
    dask = pytest.importorskip("dask")
    da = pytest.importorskip("dask.array")
    import conveyor.dask as cvd

    x = np.arange(64, dtype=np.float32)

    def part(a, *, queue, offset, n):
        return np.float16(30000 if offset < 32 else -30000)

    local = cv.stream(part, [x], device=device, reduce="sum", block_bytes=8).result
    assert local == 0 and local.dtype == np.float16
    with dask.config.set(scheduler="synchronous"):
        got = cvd.reduce(part, da.from_array(x, chunks=2), "sum", device=device.spec,
                         block_bytes=8).compute()
    assert got == local and got.dtype == np.float16, got
