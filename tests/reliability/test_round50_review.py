"""Round fifty: a review of round forty-nine's fixes (80021af), against a576d63.

Tried (scripts under /tmp/r50rev, not kept): strict streams with ``CONVEYOR_RING_GROW`` 0
and 1 on fresh contexts, one and two devices, whose callable allocates device or pinned
memory (a HazardError each time) and that allocate nothing (they run); ``_ratio_hint``
followed for records, row shapes, subarray dtypes, ratios above 1 and 0 rows (each suggested
``cv.rows`` gave the output's shape and dtype); zero-copy streams of 1-1000 rows, widths 1-3,
ratio (2, 1) outputs and empty inputs with ``zero_copy`` None and True (exact; zero-width
rows refused by the plan as before); the pools' ``acquire``/``prepare`` and ``alloc_svm``
with NumPy integers, bools, floats, strings, None and ints past 2**64 (InputError each).

Found (each a strict xfail asserting the right behaviour):

- resident.py ``_builtin_iter`` reads only list/tuple/set/frozenset subclasses through the
  built-in: a deque, UserList, UserDict or ChainMap subclass, and a mappingproxy over a dict
  subclass, are read through the user's ``__iter__``/``items()`` and hide a writable handle.
- dask/held.py ``_inside``: dict views are no container there (a device in
  ``{...}.values()`` is missed); subclasses of ``_OWN_CONTAINERS`` and any Mapping are read
  through their own ``__iter__``/``items()`` (user code run, a device hidden); a user's
  Mapping keeping ``self.device`` is iterated and its attribute never looked at.
- dask/worker.py ``_own_copy``: an exception keeping a value in ``__slots__`` is copied
  without it (no error; ``exc.code`` is an AttributeError on the copy).
- memory/pool.py ``acquire``: a size past the device's largest allocation is refused naming
  the pool's bin size, not the size asked for.
"""

from __future__ import annotations

import collections
import errno
import sys
import types
from collections.abc import Mapping
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


def _reads(x, *args, queue, offset, n):
    return int(n)


# -- 1. resident.py: other standard containers' subclasses still read through user code -------
class HidingDeque(collections.deque):
    def __iter__(self):
        return iter(())


class HidingUserList(collections.UserList):
    def __iter__(self):
        return iter(())


class HidingUserDict(collections.UserDict):
    def __iter__(self):
        return iter(())

    def items(self):
        return iter(())


class HidingChainMap(collections.ChainMap):
    def __iter__(self):
        return iter(())

    def items(self):
        return iter(())


class HidingDict(dict):
    def items(self):
        return iter(())


HOLDERS = {
    "deque-subclass": lambda t: HidingDeque([t]),
    "userlist-subclass": lambda t: HidingUserList([t]),
    "userdict-subclass": lambda t: HidingUserDict(k=t),
    "chainmap-subclass": lambda t: HidingChainMap({"k": t}),
    "mappingproxy-of-dict-subclass": lambda t: types.MappingProxyType(HidingDict(k=t)),
}


@pytest.mark.parametrize("make", list(HOLDERS.values()), ids=list(HOLDERS))
def test_a_writable_handle_in_another_standard_containers_subclass_is_refused(dev, make):
    """README: a writable cv.resident in a callable's args is an InputError inside the
    standard containers, and _WALKED names their subclasses. ``_builtin_iter``
    (resident.py ~503) falls back to ``iter(item)`` (the subclass's ``__iter__``) for a
    deque and a UserList, and ``_writable_within`` (~478) calls ``item.items()`` on a
    UserDict, a ChainMap and a mappingproxy (whose items() calls the wrapped dict
    subclass's own). Fix: ``collections.deque.__iter__(item)``; ``item.data`` of a
    UserList/UserDict; ``item.maps`` of a ChainMap; a mappingproxy read as
    ``dict.items(proxy.copy())`` where it wraps a dict (or walk its ``dict(proxy)``)."""
    x = np.ones(100, np.float32)
    with cv.resident(np.zeros(4, np.float32), writable=True, device=dev) as table:
        with pytest.raises(cv.InputError, match="writable cv.resident"):
            cv.stream(_reads, [x], device=dev, reduce="sum", args=(make(table),))


# -- 2. dask/held.py: dict views missed; subclasses and Mappings read through user code --------
def _twice(x, y, *args, queue, offset, n):
    y.set(x.get(queue=queue) * 2, queue=queue)


def _map_blocks_with(held):
    pytest.importorskip("distributed")
    import dask.array as da

    import conveyor.dask as cvd

    x = da.from_array(np.arange(8, dtype=np.float32), chunks=4)
    return cvd.map_blocks(_twice, x, args=(held,), device=SPEC)


@pytest.mark.parametrize("view", ["values", "items", "keys"])
def test_a_device_in_a_dict_view_in_dask_args_is_named_on_the_client(dev, view):
    """held.py ``_inside`` (~107-114) reads a Mapping's items and ``_OWN_CONTAINERS``
    (~121) item by item; a ``dict_values`` is neither, and its attributes are empty, so
    ``args=({"d": dev}.values(),)`` goes to the workers (resident.py walks these views since
    round forty-nine). Fix: add ``type({}.keys())``, ``type({}.values())``,
    ``type({}.items())`` to ``_OWN_CONTAINERS``."""
    holder = {dev: 1} if view == "keys" else {"d": dev}
    with pytest.raises(cv.InputError, match="a device of this process"):
        _map_blocks_with(getattr(holder, view)())


RAN: list[str] = []


class QuietList(list):
    def __iter__(self):
        RAN.append("QuietList.__iter__")
        return iter(())


class QuietTuple(tuple):
    __slots__ = ()

    def __iter__(self):
        RAN.append("QuietTuple.__iter__")
        return iter(())


class LoudList(list):
    def __iter__(self):
        RAN.append("LoudList.__iter__")
        raise RuntimeError("read on demand")


class QuietDeque(collections.deque):
    def __iter__(self):
        RAN.append("QuietDeque.__iter__")
        return iter(())


class QuietDict(dict):
    def items(self):
        RAN.append("QuietDict.items")
        return iter(())


class Table(Mapping):
    """A user's Mapping of names that keeps the device it was made for."""

    def __init__(self, values, device):
        self.values_, self.device = dict(values), device

    def __getitem__(self, key):
        RAN.append("Table.__getitem__")
        return self.values_[key]

    def __iter__(self):
        RAN.append("Table.__iter__")
        return iter(self.values_)

    def __len__(self):
        return len(self.values_)


DASK_HOLDERS = {
    "list-subclass-hides": lambda d: QuietList([d]),
    "tuple-subclass-hides": lambda d: QuietTuple((d,)),
    "list-subclass-raises": lambda d: LoudList([d]),
    "deque-subclass-hides": lambda d: QuietDeque([d]),
    "dict-subclass-hides": lambda d: QuietDict(k=d),
    "users-mapping-keeps-device": lambda d: Table({"a": 1}, d),
}


@pytest.mark.parametrize("make", list(DASK_HOLDERS.values()), ids=list(DASK_HOLDERS))
def test_a_device_in_a_users_container_subclass_is_named_without_running_its_code(dev, make):
    """held.py ``_inside`` (~107-112) reads ``value.items()`` of any Mapping and
    ``islice(value, ...)`` of a subclass of ``_OWN_CONTAINERS``: both run the user's code
    (round forty-nine's own reason for not iterating a user's Sequence), a subclass whose
    ``__iter__`` yields nothing or raises hides the device, and a user's Mapping keeping
    ``self.device`` is iterated and its attributes never read. Fix: as resident.py does,
    read subclasses through the built-in (``list.__iter__``, ``tuple.__iter__``,
    ``collections.deque.__iter__``, ``dict.items``); a Mapping that is not a dict (nor
    UserDict/ChainMap, read by ``.data``/``.maps``) by its attributes, as a Sequence now is."""
    RAN.clear()
    with pytest.raises(cv.InputError, match="a device of this process"):
        _map_blocks_with(make(dev))
    assert RAN == []


# -- 3. dask/worker.py: an exception's __slots__ are lost by its copy ---------------------------
class Coded(Exception):
    __slots__ = ("code",)

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


class CodedOSError(OSError):
    __slots__ = ("code",)

    def __init__(self, path, code):
        super().__init__(errno.ENOENT, "gone", path)
        self.code = code


@pytest.mark.parametrize("exc", [Coded("failed", 7), CodedOSError("/data/x.npy", 7)],
                         ids=["exception-slots", "oserror-subclass-slots"])
def test_a_copied_exception_keeps_its_slots(exc):
    """worker.py ``_own_copy`` (~337-350): BaseException's reduce carries ``__dict__`` only;
    where the class's ``__init__`` takes other arguments the fallback builds the copy
    without it, and a slot it set is never set on the copy. The copy passes the
    ``str``/``args`` check and the user's ``except Coded as e: e.code`` raises
    AttributeError. Fix: copy every slot of the MRO's ``__slots__`` that is set on ``exc``
    (``object.__getattribute__``), or return ``exc`` when a slot cannot be copied."""
    from conveyor.dask.worker import _own_copy

    made = _own_copy(exc)
    assert made is not exc
    assert made.code == exc.code


# -- 4. memory/pool.py: a size past the largest allocation named as its bin -----------------------
@pytest.mark.parametrize("nbytes", [10**30, 2**64 + 5], ids=["1e30", "2**64+5"])
def test_a_size_past_the_largest_allocation_is_named_as_given(dev, nbytes):
    """RELIABILITY round forty-nine: acquire refuses a size it cannot take "with an
    InputError naming the value given". ``acquire`` (pool.py ~231) bins the size first and
    the backend's ``alloc_device`` (opencl.py ~679) names the bin:
    ``acquire(10**30)`` says 1029966112685436388716071354368 bytes. Fix: check ``nbytes``
    against ``device.max_alloc_bytes`` in ``acquire``/``prepare`` before ``_bin_size``."""
    with pytest.raises(cv.InputError) as caught:
        dev.memory_pool.acquire(nbytes)
    assert str(nbytes) in str(caught.value)


# -- guards: what held ---------------------------------------------------------------------------
def test_guard_a_strict_callable_that_allocates_is_still_caught_without_ring_growth(
        dev, monkeypatch):
    """``hazards.unwatched`` covers the ring's own start only: a callable's pinned
    allocation on the hot path is still a HazardError with CONVEYOR_RING_GROW=0."""
    import gc

    from conveyor.backends import opencl

    monkeypatch.setenv("CONVEYOR_RING_GROW", "0")
    platform, index = (int(part) for part in dev.spec.split(":")[1:])
    ctx = opencl.Device(dev.cl_device, platform, index)
    try:
        def alloc(x, y, *, queue, offset, n):
            cv.pinned.empty(1000 + int(offset), np.float32, device=ctx)
            y.set(x.get(queue=queue), queue=queue)

        x = np.arange(20_000, dtype=np.float32)
        with pytest.raises(cv.HazardError, match="pinned"):
            cv.stream(alloc, [x], [np.zeros_like(x)], device=ctx, zero_copy=False,
                      strict=True, block_bytes=16384)
        gc.collect()
        assert ctx.pinned_pool.stats().in_use_bytes == 0
    finally:
        gc.collect()
        ctx.close()
