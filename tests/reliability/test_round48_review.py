"""Round forty-eight: a review of round forty-six's memory fixes and round forty-seven's
(c163c0e, 641ed8a, 6cd5235), against a576d63 and 641ed8a^.

Tried (scripts under /tmp/r48rev, not kept): a seeded fuzz of streams on fresh contexts
under pinned limits of 8 KiB to 4 MiB (two-input maps, halo-2 stencils with a constant
boundary, ``cv.rows`` ratio-1/2 outputs, ``keep_pinned`` inputs, a ``cv.iterate`` input
failing half way, three streams on threads), with a ``cv.pinned`` array holding 30-99 % of
the limit: every result exact and every pinned byte back (``in_use_bytes == 0``) after each
stream, failed or not; OutOfMemoryError only where the staged buffers' one-page entries
cannot fit the room left, where ``block_bytes=`` forced larger entries, or when streams on
threads took the room between one's plan and its first entry. ``_writable_within`` over
generators and iterators (not consumed). ``held.refuse_value`` over deques, dict views,
UserList, ChainMap, namedtuples, nested lists. ``_own_copy`` over conveyor's own errors,
JSONDecodeError, AttributeError(name=, obj=), OSError with two file names.

Found (each a strict xfail asserting the right behaviour):

- resident.py ``_writable_within`` now walks any ``collections.abc.Sequence``/``Mapping``
  through the user's own ``__getitem__``/``items()``: a callable's args holding a Sequence
  whose ``__getitem__`` raises, or one that never raises IndexError (a ring buffer indexed
  modulo its length: the walk never ends), or a Mapping whose ``items()`` raises, fail or
  hang every ``cv.stream`` (a576d63 ran them; the user's code is read element by element).
- dask/held.py ``device_array`` takes a class whose instances have a
  ``__cuda_array_interface__`` property (CuPy's ``ndarray``, PyTorch's ``Tensor``,
  Numba's device array classes) for a device array: a callable naming such a class as a
  default or in ``args=`` is refused on the client.
- dask/held.py ``_inside`` walks tuple, list, set and Mapping only: a device in a deque
  among ``args=`` is not named on the client (Dask fails later, "cannot pickle
  '_thread.lock'").
- dask/worker.py ``_own_copy`` (641ed8a) calls the exception's class with its ``args``: a
  user's exception whose ``__init__`` takes other arguments (``(path, reason)``, keyword-only)
  is no longer copied (641ed8a^ copied it through ``__new__``), so each task's chunk note goes
  onto the one shared object again.
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402, F401 (dev: a fixture)
    compiling_device,
    compiling_opencl_spec,
)

import conveyor as cv  # noqa: E402

SPEC = compiling_opencl_spec()
pytestmark = pytest.mark.skipif(SPEC is None, reason="no usable OpenCL device")


def _counts(x, *args, queue, offset, n):
    return int(n)


# -- 1. the writable-handle walk reads the user's own containers -------------------------------
class Raising(Sequence):
    """A lazy sequence whose rows cannot be read here (a dataset whose files are elsewhere)."""

    def __len__(self):
        return 3

    def __getitem__(self, index):
        raise RuntimeError("rows are read on demand, not by conveyor")


class Endless(Sequence):
    """A ring buffer indexed modulo its length: it never raises IndexError, so iterating it
    (``Sequence.__iter__``) never ends. Reads past its length raise here instead of running
    for ever, so the test stays finite."""

    reads = 0

    def __len__(self):
        return 3

    def __getitem__(self, index):
        type(self).reads += 1
        if index >= 1000:
            raise RuntimeError("read past its length: iterating this sequence never ends")
        return index % 3


class ItemsRaise(Mapping):
    """A mapping whose ``items()`` raises (a remote store that lists no items)."""

    def __len__(self):
        return 1

    def __iter__(self):
        return iter(["k"])

    def __getitem__(self, key):
        return 1.0

    def items(self):
        raise RuntimeError("this store lists no items")


@pytest.mark.parametrize("make", [Raising, Endless, ItemsRaise],
                         ids=["getitem-raises", "endless", "items-raises"])
def test_a_callables_args_of_users_own_containers_stream(dev, make):
    """README: a writable resident in a callable's args is refused; nothing says the args
    are read. a576d63 ran these; since c163c0e ``resident._writable_within``
    (resident.py ~470) does ``enumerate(item)`` / ``item.items()`` for any Sequence or
    Mapping, with no guard and no bound. Fix: walk only the containers a handle can be put
    in without user code (exact builtin and ``collections`` types, as held.py does for
    Dask), or bound the walk and treat a container that raises as holding no handle."""
    Endless.reads = 0
    x = np.ones(1000, np.float32)
    report = cv.stream(_counts, [x], device=dev, reduce="sum", args=(make(),),
                       block_bytes=400)
    assert report.result == 1000
    assert Endless.reads <= 3


# -- 2. Dask: what a callable holds ------------------------------------------------------------
class DeviceArrayType:
    """A device-array class as CuPy's ``ndarray`` or PyTorch's ``Tensor`` is: its instances
    have ``__cuda_array_interface__`` (a property, so the class has the attribute too)."""

    @property
    def __cuda_array_interface__(self):
        raise AttributeError("a host-side instance")


def _typed(x, y, *, queue, offset, n, kind=DeviceArrayType):
    y.set(x.get(queue=queue) * (2 if not isinstance(x, kind) else 3), queue=queue)


def _twice(x, y, *args, queue, offset, n):
    y.set(x.get(queue=queue) * 2, queue=queue)


def _x(n=8):
    import dask.array as da

    return da.from_array(np.arange(n, dtype=np.float32), chunks=4)


@pytest.mark.parametrize("where", ["default", "args"])
def test_a_device_array_class_is_no_device_array(where):
    """``isinstance(v, cupy.ndarray)`` in a callable (the class as a default, a global of
    ``__main__`` or in ``args=``) is refused on the client as "a device array of this
    process": ``hasattr(cls, "__cuda_array_interface__")`` is True for the class. Fix:
    held.py ``device_array`` returns False for ``isinstance(value, type)``."""
    pytest.importorskip("distributed")
    import conveyor.dask as cvd

    compute, args = (_typed, ()) if where == "default" else (_twice, (DeviceArrayType,))
    cvd.map_blocks(compute, _x(), args=args, device=SPEC)  # the graph only


def test_a_device_in_a_deque_among_args_is_named_on_the_client(dev):
    """A device in ``collections.deque`` reaches Dask, which fails at compute() with
    "cannot pickle '_thread.lock' object", naming nothing (round forty-six's finding for
    tuples and lists). Fix: ``_inside`` takes any ``collections.abc.Collection`` other than
    text and arrays (bounded by ``islice`` as now), as resident.py's walk does."""
    pytest.importorskip("distributed")
    import conveyor.dask as cvd

    with pytest.raises(cv.InputError, match="device"):
        cvd.map_blocks(_twice, _x(), args=(collections.deque([dev]),), device=SPEC)


# -- 3. Dask: exception copies -----------------------------------------------------------------
class TwoArgs(Exception):
    def __init__(self, path, reason):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


class KeywordOnly(Exception):
    def __init__(self, *, code):
        super().__init__(f"code {code}")
        self.code = code


@pytest.mark.parametrize("exc", [TwoArgs("/data/x.npy", "gone"), KeywordOnly(code=3)],
                         ids=["two-args", "keyword-only"])
def test_a_users_exception_with_its_own_init_is_copied(exc):
    """641ed8a^ made the copy with ``type(exc).__new__`` (no ``__init__`` run) and copied
    these; worker.py ``_own_copy`` now runs ``reduced[0](*reduced[1])``, i.e.
    ``TwoArgs("/data/x.npy: gone")``, which raises TypeError, and falls back to ``exc``
    itself, so every task's "chunk" note lands on one object. Fix: fall back to the
    ``__new__`` copy (then the reduce's state) where calling the class fails."""
    from conveyor.dask.worker import _own_copy

    exc.add_note("shared")
    made = _own_copy(exc)
    assert made is not exc
    made.add_note("mine")
    assert exc.__notes__ == ["shared"]
    assert str(made) == str(exc) and type(made) is type(exc)
    assert vars(made).items() >= {k: v for k, v in vars(exc).items()
                                  if k != "__notes__"}.items()


# -- 4. the pinned limit with CONVEYOR_RING_GROW=0 ---------------------------------------------
ADD = """__kernel void add(__global const float *a, __global const float *b, __global float *c,
                  ulong offset, ulong n)
{ ulong i = get_global_id(0); if (i < n) c[i] = a[i] + b[i]; }"""


@pytest.fixture
def ctx(dev):
    """Another context on the first OpenCL device (its pools are the test's own)."""
    import gc

    from conveyor.backends import opencl

    platform, index = (int(part) for part in dev.spec.split(":")[1:])
    made = opencl.Device(dev.cl_device, platform, index)
    yield made
    gc.collect()
    made.close()


@pytest.mark.parametrize("limit, depth, n", [("12KiB", 1, 1536), ("24KiB", 2, 2100)])
def test_a_small_pinned_limit_streams_without_ring_growth(ctx, monkeypatch, limit, depth, n):
    """Round forty-six's case (test_round46_memory.py, 6cd5235): the plan stops shrinking at
    a page per buffer and counts on "the ring then runs on the entries that fit" (plan.py
    ``_fit_staging``). With growth on it does (3 and 2 blocks, exact). README documents
    ``CONVEYOR_RING_GROW=0`` as allocating the ring up front; ring.py ``Ring.__init__``
    then acquires every entry with ``pool.acquire`` and the third entry raises
    OutOfMemoryError ("asked for 4.0 KiB with 12.0 KiB in use"), advising smaller blocks
    or a lower depth, neither of which helps. Fix: up front, stop at the first entry the
    limit refuses after the first (as ``_grow`` does), or give the ring a target of the
    entries that fit the room the plan saw."""
    monkeypatch.setenv("CONVEYOR_RING_GROW", "0")
    k = ctx.compile(ADD, "add")
    a = np.arange(n, dtype=np.float32)
    c = np.zeros_like(a)
    ctx.pinned_pool.limit = limit
    cv.stream(k, [a, a], [c], device=ctx, zero_copy=False, depth=depth)
    np.testing.assert_array_equal(c, a + a)
