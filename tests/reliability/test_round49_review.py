"""Round forty-nine: a review of round forty-eight's fixes and round forty-six's memory part
(bbce0dd, 6cd5235), against bbce0dd^ and a576d63.

Tried (scripts under /tmp/r49rev, not kept): a seeded fuzz of 80 streams on a second context
under pinned limits of 8 KiB to 1 MiB, ``CONVEYOR_RING_GROW`` 0 and 1, depths 1-4, with
two-input maps, halo 1-3 stencils, a two-output kernel and a callable failing part way:
every result exact, ``in_use_bytes == pending_bytes == 0`` after each stream, no thread
left; OutOfMemoryError only where one entry of one-page buffers cannot fit the limit or
``block_bytes=`` forced larger entries. ``_writable_within`` over namedtuples, OrderedDict,
defaultdict, Counter keys, a frozenset in a tuple, UserList, ChainMap, mappingproxy, deque,
tuples as dict keys, a list holding itself: each handle found, with its path.

Found (each a strict xfail asserting the right behaviour):

- ring.py ``start()`` with ``CONVEYOR_RING_GROW=0`` allocates the ring's entries on the
  stream's hot path (``_acquire_or_none``), where the pool's misses are hazards: on a fresh
  device ``strict=True`` raises HazardError for conveyor's own ring (bbce0dd^ allocated it
  in ``Ring.__init__`` and ran).
- resident.py ``_writable_within`` reads a walked type's subclass through its own
  ``__iter__``/``items()``: a list subclass whose ``__iter__`` yields nothing or raises, a
  dict subclass whose ``items()`` does, hide a writable handle; dict views
  (``d.values()``, ``d.items()``) are not walked.
- dask/held.py ``_inside`` iterates any Collection instead of reading its attributes: a
  user's Sequence class keeping a device in an attribute is no longer refused on the client
  (bbce0dd^ named it).
- plan.py ``_ratio_hint`` suggests ``cv.rows(dtype, ratio=...)`` without ``shape=``: where
  the output's row shape is not input 0's, the suggested output has the wrong shape.
- dask/worker.py ``_own_copy``'s fallback builds ``__new__(cls, *exc.args)``: an OSError
  subclass loses its filename there, a UnicodeDecodeError subclass its fields, and both are
  not copied (the shared object again).
"""

from __future__ import annotations

import errno
import gc
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import compiling_opencl_spec  # noqa: E402

import conveyor as cv  # noqa: E402

SPEC = compiling_opencl_spec()
pytestmark = pytest.mark.skipif(SPEC is None, reason="no usable OpenCL device")

ADD = """__kernel void add(__global const float *a, __global const float *b, __global float *c,
                  ulong offset, ulong n)
{ ulong i = get_global_id(0); if (i < n) c[i] = a[i] + b[i]; }"""


@pytest.fixture(scope="module")
def dev():
    return cv.device(SPEC)


@pytest.fixture
def ctx(dev):
    """Another context on the first OpenCL device: its pools are the test's own (and fresh:
    every pinned acquire is a miss)."""
    from conveyor.backends import opencl

    platform, index = (int(part) for part in dev.spec.split(":")[1:])
    made = opencl.Device(dev.cl_device, platform, index)
    yield made
    gc.collect()
    made.close()


# -- 1. CONVEYOR_RING_GROW=0 allocates on the hot path -----------------------------------------
@pytest.mark.parametrize("limit", [None, "1MiB"])
def test_a_strict_stream_without_ring_growth_runs_on_a_fresh_device(ctx, monkeypatch, limit):
    """ring.py ``start()`` takes every entry with ``_acquire_or_none`` (ring.py ~104) on the
    thread that runs the stream, inside ``hazards.hot_path``: each miss of the fresh pinned
    pool is reported by memory/pool.py ~235 as "allocated after the ring was built", which
    ``strict=True`` raises (and which otherwise warns the user to warm the pool, for
    conveyor's own ring). bbce0dd^ allocated them in ``Ring.__init__``, before the hot path.
    Fix: take the entries before the hot path is entered (the path's setup), or mark the
    ring's own acquires as no hazard."""
    monkeypatch.setenv("CONVEYOR_RING_GROW", "0")
    if limit is not None:
        ctx.pinned_pool.limit = limit
    k = ctx.compile(ADD, "add")
    a = np.arange(100_000, dtype=np.float32)
    c = np.zeros_like(a)
    cv.stream(k, [a, a], [c], device=ctx, zero_copy=False, strict=True, block_bytes=16384)
    np.testing.assert_array_equal(c, a + a)
    gc.collect()
    assert ctx.pinned_pool.stats().in_use_bytes == 0


@pytest.mark.parametrize("grow", ["0", "1"])
@pytest.mark.parametrize("limit", ["12KiB", "48KiB"])
def test_guard_two_outputs_and_a_failure_under_a_pinned_limit_give_every_byte_back(
        ctx, monkeypatch, grow, limit):
    monkeypatch.setenv("CONVEYOR_RING_GROW", grow)
    ctx.pinned_pool.limit = limit
    two = ctx.compile("""__kernel void two(__global const float *x, __global float *y,
        __global float *z, ulong offset, ulong n)
        { ulong i = get_global_id(0); if (i < n) { y[i] = 2 * x[i]; z[i] = x[i] + 1; } }""",
                      "two")
    x = np.arange(7000, dtype=np.float32)
    y, z = np.zeros_like(x), np.zeros_like(x)
    cv.stream(two, [x], [y, z], device=ctx, zero_copy=False, depth=2)
    np.testing.assert_array_equal(y, 2 * x)
    np.testing.assert_array_equal(z, x + 1)

    def half(x, y, *, queue, offset, n):
        if offset + n > 3500:
            raise RuntimeError("boom")
        y.set(x.get(queue=queue), queue=queue)

    with pytest.raises(RuntimeError, match="boom"):
        cv.stream(half, [x], [y], device=ctx, zero_copy=False, depth=2)
    gc.collect()
    stats = ctx.pinned_pool.stats()
    assert (stats.in_use_bytes, stats.pending_bytes) == (0, 0)


# -- 2. the writable-handle walk: subclasses read through their own code, dict views ----------
class HidingList(list):
    def __iter__(self):
        return iter(())


class RaisingList(list):
    def __iter__(self):
        raise RuntimeError("read on demand")


class HidingDict(dict):
    def items(self):
        return iter(())


class RaisingDict(dict):
    def items(self):
        raise RuntimeError("read on demand")


def _reads(x, *args, queue, offset, n):
    return int(n)


@pytest.mark.parametrize("make", [HidingList, RaisingList, HidingDict, RaisingDict],
                         ids=["list-iter-hides", "list-iter-raises", "dict-items-hides",
                              "dict-items-raises"])
def test_a_writable_handle_in_a_builtin_subclass_is_refused(dev, make):
    """README: a writable cv.resident in a callable's args is an InputError "also inside the
    tuples, lists, sets, dicts and other standard containers"; resident.py's docstring says
    their subclasses are walked. ``_writable_within`` (resident.py ~476-487) reads them with
    ``item.items()`` / ``enumerate(item)``, the subclass's own code, and takes one that
    raises as holding nothing. Fix: read a subclass of a builtin through the builtin's own
    methods (``dict.items(item)``, ``list.__iter__(item)``, ``tuple.__iter__``,
    ``set.__iter__``), which run no user code and see what it holds."""
    x = np.ones(100, np.float32)
    with cv.resident(np.zeros(4, np.float32), writable=True, device=dev) as table:
        held = make([table]) if issubclass(make, list) else make(k=table)
        with pytest.raises(cv.InputError, match="writable cv.resident"):
            cv.stream(_reads, [x], device=dev, reduce="sum", args=(held,))


@pytest.mark.parametrize("view", ["values", "items"])
def test_a_writable_handle_in_a_dict_view_is_refused(dev, view):
    """``_WALKED`` (resident.py ~494) lists no dict views: ``args=(tables.values(),)``
    hands the callable the handles. Fix: add ``type({}.values())``, ``type({}.items())``
    and ``type({}.keys())`` (read in C, as a dict is)."""
    x = np.ones(100, np.float32)
    with cv.resident(np.zeros(4, np.float32), writable=True, device=dev) as table:
        tables = {"t": table}
        with pytest.raises(cv.InputError, match="writable cv.resident"):
            cv.stream(_reads, [x], device=dev, reduce="sum",
                      args=(getattr(tables, view)(),))


# -- 3. Dask: a user's Collection is iterated, its attributes no longer read -------------------
class Batch(Sequence):
    """A user's Sequence of values that keeps the device it was made for."""

    def __init__(self, values, device):
        self.values, self.device = list(values), device

    def __len__(self):
        return len(self.values)

    def __getitem__(self, index):
        return self.values[index]


def _twice(x, y, *args, queue, offset, n):
    y.set(x.get(queue=queue) * 2, queue=queue)


def test_a_device_kept_by_a_users_sequence_in_args_is_named_on_the_client(dev):
    """bbce0dd^ read a user's Sequence's attributes (``_attributes``) and refused the
    device; held.py ``_inside`` (~109) now takes any ``Collection`` by iterating it, so the
    values are looked at and ``self.device`` is not. Fix: for a Collection that is not one
    of Python's own containers, look at its items and its attributes both."""
    pytest.importorskip("distributed")
    import dask.array as da

    import conveyor.dask as cvd

    x = da.from_array(np.arange(8, dtype=np.float32), chunks=4)
    with pytest.raises(cv.InputError, match="device"):
        cvd.map_blocks(_twice, x, args=(Batch([1.0, 2.0], dev),), device=SPEC)


# -- 4. the ratio hint leaves out the row shape --------------------------------------------------
def _nothing(x, y, *, queue, offset, n):
    return None


@pytest.mark.parametrize("shapes", [((8, 4), (4,)), ((8,), (4, 3)), ((8, 4), (4, 2))],
                         ids=["2d-in-1d-out", "1d-in-2d-out", "other-columns"])
def test_the_ratio_hints_cv_rows_makes_the_arrays_shape(dev, shapes):
    """plan.py ``_ratio_hint`` (~490) names only the dtype and the ratio; ``cv.rows``
    without ``shape=`` takes input 0's row shape, so the output the message suggests is
    (4, 4) for a (4,) array beside an (8, 4) input. Fix: pass the output's row shape to
    ``_ratio_hint`` and add ``shape=(...)`` where it differs from input 0's."""
    ins, outs = shapes
    x = np.zeros(ins, np.float32)
    with pytest.raises(cv.InputError) as caught:
        cv.stream(_nothing, [x], [np.zeros(outs, np.float32)], device=dev)
    hint = re.search(r"cv\.rows\(.*\)\)", str(caught.value))
    assert hint is not None, str(caught.value)
    suggested = eval(hint.group(0), {"cv": cv, "np": np})  # noqa: S307 - the message's own
    report = cv.stream(_nothing, [x], [suggested], device=dev)
    assert report.outputs[0].shape == outs


# -- 5. Dask: exception copies of other builtin bases -------------------------------------------
class Gone(OSError):
    def __init__(self, path, reason):
        super().__init__(errno.ENOENT, reason, path)


class BadText(UnicodeDecodeError):
    def __init__(self, data):
        super().__init__("utf-8", data, 0, 1, "not UTF-8")


@pytest.mark.parametrize("exc", [Gone("/data/x.npy", "gone"), BadText(b"\xff")],
                         ids=["oserror-subclass", "unicodeerror-subclass"])
def test_a_users_exception_of_another_builtin_base_is_copied(exc):
    """worker.py ``_own_copy`` (~340): ``Gone(2, 'gone', '/data/x.npy')`` raises TypeError,
    and ``OSError.__new__(Gone, *exc.args)`` has no filename (``args`` is (2, 'gone')), so
    ``str`` differs and ``exc`` itself is returned (each task's note on one object). Fix: in
    the fallback, ``made = cls.__new__(cls, *reduced[1])`` and then the nearest builtin
    base's ``__init__(made, *reduced[1])`` (what the builtin's reduce is for)."""
    from conveyor.dask.worker import _own_copy

    exc.add_note("shared")
    made = _own_copy(exc)
    assert made is not exc
    made.add_note("mine")
    assert exc.__notes__ == ["shared"]
    assert str(made) == str(exc) and type(made) is type(exc)
