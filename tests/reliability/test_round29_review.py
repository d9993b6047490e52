"""Round twenty-nine: a review of round twenty-eight's fixes (9915c22..02fe605): the in-place
match by inode (``stream._mapped_outputs``, ``FileSource.inode``/``writes_in_place``/
``begin``), ``check_nbytes``/``check_image``/``check_sampler``, ``deferred_sigint``'s swap,
nested sub-array outputs, headers through ``PYOPENCL_BUILD_OPTIONS``, ``_vector_width``.

Method (scripts under /tmp/r29rev, not kept): 6 threads sharing one ``cv.npy`` (twice, fds
counted); in-place streams through ``np.load(mmap_mode="r+")`` of a ``cv.npy`` object, of a
path, of one object given twice, over both PoCL devices, and one object streamed in place
then read again; the same at 9915c22 and 9f3cb5f (``git archive`` under /tmp); an output
memmap of another file system's file whose inode number equals the input's (two fresh
tmpfs mounts, then a memfd beside /dev/shm).

Found: two regressions of round twenty-eight (an output of another file with the input's
inode number hid a rewrite, and a stream into one was refused as "in place": matched by
(device, inode) now), ``alloc_image`` taking only ``np.dtype`` objects (a bare AttributeError
for ``np.float32``), and ``image_sampler("repeat", ..., normalized=False)`` a driver error
(an InputError saying what to pass now). Each was a strict xfail seen failing for its reason,
and is a plain test since its fix.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import first_device_only, kernel  # noqa: E402, F401 (autouse: first device only)
from test_multi import two_devices  # noqa: E402

import conveyor as cv  # noqa: E402

_ROWS = 1000


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A folder of this test's own under /tmp (see round twenty-eight's)."""
    with tempfile.TemporaryDirectory(prefix="r29-review-", dir="/tmp") as folder:
        yield Path(folder)


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[cv.Device, cv.Device]]:
    """Two devices (tests/pipeline/test_multi.py's ``two_devices``)."""
    first, second, made = two_devices()
    yield first, second
    if made is not None:
        gc.collect()
        made.close()


@pytest.fixture
def twin() -> Iterator[tuple[Path, np.memmap]]:
    """An input ``.npy`` of ``arange(1000)`` float32 in /dev/shm and a writable shared map of
    ANOTHER file (a memfd, of another file system) whose inode NUMBER is the input's: made by
    creating files in /dev/shm (a tmpfs: inode numbers counted up one by one) until one
    takes the memfd's number. Skipped where no such pair is found (no /dev/shm, or a file
    system that numbers inodes otherwise)."""
    if not os.path.isdir("/dev/shm") or not hasattr(os, "memfd_create"):
        pytest.skip("no /dev/shm or memfd here")
    x = np.arange(_ROWS, dtype=np.float32)
    folder = Path(tempfile.mkdtemp(prefix="r29-twin-", dir="/dev/shm"))
    memfds: list[int] = [os.memfd_create("r29-out")]
    found: Path | None = None
    try:
        probe = folder / "x.npy"
        np.save(probe, x)
        for i in range(50_000):  # the lower of the two counters goes up until they meet
            target, ino = os.fstat(memfds[-1]).st_ino, os.stat(probe).st_ino
            if ino == target:
                found = probe
                break
            if ino < target:
                probe.unlink()
                probe = folder / f"x{i}.npy"
                np.save(probe, x)
            else:
                os.close(memfds.pop())
                memfds.append(os.memfd_create("r29-out"))
        if found is None:
            pytest.skip("no /dev/shm file took a memfd's inode number here")
        fd = memfds[-1]
        os.ftruncate(fd, x.nbytes)
        out = np.memmap(f"/proc/self/fd/{fd}", np.float32, "r+", 0, (_ROWS,))
        assert os.fstat(fd).st_dev != os.stat(found).st_dev
        yield found, out
        del out
    finally:
        for fd in memfds:
            os.close(fd)
        for child in folder.iterdir():
            child.unlink()
        folder.rmdir()


def _rewrite_in_place(path: Path, values: np.ndarray) -> None:
    """Write ``values`` over the data of the .npy at ``path`` (same size, same header), as
    another program would, and move its modification time a second on."""
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - values.nbytes)
        f.write(values.tobytes())
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


@pytest.mark.filterwarnings("ignore::conveyor.hazards.HazardWarning")
def test_a_rewrite_is_seen_beside_an_output_of_another_file_with_the_same_inode(device,
                                                                              twin):
    """README: a file "written or truncated by another program" while a stream reads it is
    refused ("changed while it was read"). The input is in /dev/shm; the output a memmap of
    a memfd (another file system) whose inode number happens to be the input's; another
    program rewrites the input at block 1. 9915c22 raised (the in-place match was by path);
    02fe605 matches ``_mapped_outputs`` by inode alone, calls it in place, and
    ``_check_not_rewritten`` lets the change pass: rows of both files mixed, no error."""
    path, out = twin
    x = np.arange(_ROWS, dtype=np.float32)

    def rewriting(a: Any, b: Any, *, queue: Any, offset: int, n: int) -> Any:
        if offset == 100:
            _rewrite_in_place(path, -x)
        return a

    with pytest.raises(cv.InputError, match="changed while it was read"):
        cv.stream(rewriting, [cv.npy(path)], [out], device=device, block_bytes=400,
                  warmup=False)


@pytest.mark.filterwarnings("ignore::conveyor.hazards.HazardWarning")
def test_a_stream_into_another_file_with_the_same_inode_is_not_refused(device, twin):
    """README: one ``cv.npy`` input may feed several streams at once. Stream A (a thread)
    reads the input into an array and waits at its first block; stream B reads the same
    object into a memmap of another file (a memfd) whose inode number happens to be the
    input's. Nothing writes the input: B must run. 02fe605 refuses it ("is read by another
    stream now, and this one writes it in place")."""
    path, out = twin
    x = np.arange(_ROWS, dtype=np.float32)
    source = cv.npy(path)
    entered, go_on = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def holding(a: Any, b: Any, *, queue: Any, offset: int, n: int) -> Any:
        if offset == 0:
            entered.set()
            assert go_on.wait(60)
        return a

    def run() -> None:
        try:
            got = cv.stream(holding, [source], [np.float32], device=device, block_bytes=400,
                            warmup=False).outputs[0]
            np.testing.assert_array_equal(got, x)
        except BaseException as exc:  # reported by the test's thread
            failures.append(exc)
        finally:
            entered.set()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert entered.wait(60)
        cv.stream(kernel(device, "scale"), [source], [out], device=device, args=(2.0,),
                  block_bytes=400)
        np.testing.assert_array_equal(out, x * 2)
    finally:
        go_on.set()
        thread.join()
    assert not failures, failures


def test_guard_in_place_streams_of_one_object_given_twice_over_two_devices(pair, scratch):
    """Held: one ``cv.npy`` object given twice to an in-place stream (its output a memmap of
    the input) over both devices, then read again by a plain stream, and six threads
    sharing it, none writing it."""
    x = np.arange(_ROWS, dtype=np.float32)
    path = scratch / "x.npy"
    np.save(path, x)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))  # each write changes it
    source = cv.npy(path)
    out = np.load(path, mmap_mode="r+")
    first = pair[0]
    cv.stream(kernel(first, "add"), [source, source], [out], device=list(pair),
              block_bytes=400)
    del out
    want = x + x + (np.arange(_ROWS) % 7).astype(np.float32)
    np.testing.assert_array_equal(np.load(path), want)
    errors: list[BaseException] = []

    def read(_: int) -> None:
        try:
            got = cv.stream(kernel(first, "scale"), [source], [np.float32], device=first,
                            args=(2.0,), block_bytes=400).outputs[0]
            np.testing.assert_array_equal(got, want * 2)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_alloc_image_takes_a_dtype_as_numpy_users_spell_it(device):
    """Round twenty-eight: ``alloc_image`` of a format the device has not is an InputError
    naming what it has; the check reads ``np.dtype(dtype)``. The allocation after it reads
    ``dtype.name``: ``np.float32`` or ``"float32"`` (a format the device has: 1 x float32)
    raise AttributeError, where ``np.dtype("float32")`` works."""
    for dtype in (np.float32, "float32"):
        image = device.alloc_image(4, 4, 1, dtype)
        image.close()


def test_image_sampler_of_a_repeat_mode_unnormalized_says_what_to_change(device):
    """Round twenty-eight: ``image_sampler`` of a mode it does not know is an InputError
    naming the modes (``check_sampler``). A known repeat mode with unnormalized coordinates
    (OpenCL allows repeat modes with normalized coordinates only; README's ``cv.image``
    table says "needs normalized=True", and ``cv.image`` refuses it so) still reaches
    clCreateSampler: BackendError INVALID_VALUE."""
    for address in ("repeat", "mirrored_repeat"):
        with pytest.raises(cv.InputError, match="normalized"):
            device.image_sampler(address, "nearest", False)
