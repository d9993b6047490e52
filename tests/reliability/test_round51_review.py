"""Round fifty-one: a review of round fifty's fixes and the session-23 re-read (fc9bfee to
4ec6386: conveyor/containers.py, the writable-handle walk's bound, Dask's held check, the
pools' largest-allocation check).

Found (each a strict xfail asserting the right behaviour):

- resident.py ``_writable_within``: the 10,000-container bound is spent by a sibling's small
  tuples before the handle is popped (LIFO), so ``{"table": h, "points": 10,000 pairs}``
  passes a writable handle to the callable silently, at depth one.
- containers.py ``_read``: past 8 levels of mappingproxies, ChainMaps or UserDicts it returns
  None and the walk passes the handle silently; a ChainMap whose ``maps`` repeats a map (or
  itself) is read once per path, exponential in the depth (``maps=[c] * 10``: 10**9 reads).
- dask/held.py ``refuse_held``: ``inspect.getattr_static(f, "__name__")`` is the function
  type's descriptor, so every plain function is named 'function' in the message; a class
  whose slot is private (``__device``, stored mangled) or whose ``__slots__`` was an
  iterator hides a device in it; worker.py ``_own_copy`` loses a private slot the same way.
- memory/pool.py ``_fits_one_allocation`` skips pinned pools, so on OpenCL a pinned request
  past the largest allocation is named by its page class again (round fifty's finding).
- containers.py: a UserDict's or ChainMap's ``.values()``/``.items()`` (collections.abc views)
  is no container, and a writable handle in one passes.
- chainbind.py ``make_plan``: a ``block_bytes`` smaller than a temp's row is reworded as "the
  chain's temps do not fit the memory limit ... a larger memory_limit" (none was set).

Held (scripts under /tmp/r51rev, not kept): the walk over list/tuple/set/frozenset/dict,
OrderedDict/defaultdict/Counter, namedtuple, dict views (OrderedDict's too), keys of dicts
and Counters, self-holding dicts through a mappingproxy; 9,990 tuples beside a handle (found);
Dask's check of a UserDict view and a SimpleNamespace (found, by attributes); a callable
object's and a partial's name; halo refusals over 324 chain streams (rows, halo, temp width,
memory_limit, block_bytes): each HaloPastBlocks named the halo and what helps.
"""

from __future__ import annotations

import collections
import sys
import types
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402, F401 (dev: a fixture)
    compiling_device,
    compiling_opencl_spec,
    stream_with_arg,
)

import conveyor as cv  # noqa: E402
from conveyor import containers  # noqa: E402
from conveyor.dask import held  # noqa: E402

SPEC = compiling_opencl_spec()
pytestmark = pytest.mark.skipif(SPEC is None, reason="no usable OpenCL device")


# -- 1. the walk's bound spent by a sibling before the handle is looked at ----------------------
@pytest.mark.parametrize("where", ["dict-first", "list-first", "list-last"])
def test_a_writable_handle_beside_10000_small_tuples_is_refused(dev, where):
    """resident.py ~470-492: the stack is popped last-in first; a dict's values are pushed in
    order, so the list of points is opened before ``h`` and its 10,000 tuples each take a
    place in ``seen`` (they are CONTAINERS, kept by ``_kept``); the loop stops at
    MOST_CONTAINERS with ``h`` still on the stack, and returns None. Fix: look at the
    handles (``type(x) is Resident``) among ``items`` as they are read, before pushing
    containers, and where the bound stops the walk with entries left, raise an InputError
    that says the args were too many containers to be checked (never None). In a list the
    handle past the first 10,000 containers is also cut by ``_kept``'s ``islice`` (~500)."""
    with cv.resident(np.zeros(4, np.float32), writable=True, device=dev) as table:
        points = [(i, i) for i in range(10_000)]
        arg = {"dict-first": {"table": table, "points": points},
               "list-first": [table, *points], "list-last": [*points, table]}[where]
        with pytest.raises(cv.InputError, match=r"args\[0\]\[('table'|0|10000)\] is a writable"):
            stream_with_arg(dev, arg)


def test_a_writable_handle_past_the_container_bound_is_refused_not_passed(dev):
    """At the bound the walk returns None (resident.py ~470: ``while stack and len(seen) <
    MOST_CONTAINERS``), so the handle goes to the callable as itself: README's refusal is
    neither made nor replaced by one saying the args could not be checked. Fix: when the
    loop ends with ``stack`` non-empty, raise InputError ("args[0] holds more than 10,000
    containers: a writable cv.resident table in it could not be looked for; ...")."""
    with cv.resident(np.zeros(4, np.float32), writable=True, device=dev) as table:
        deep = [table]
        for _ in range(10_001):
            deep = [deep]
        with pytest.raises(cv.InputError, match="writable cv.resident|10,000|10000"):
            stream_with_arg(dev, deep)


# -- 2. containers.py: a depth cap that hides, and repeated maps read once per path -----------
def _proxies(value, levels):
    for _ in range(levels):
        value = types.MappingProxyType(value)
    return value


def _chainmaps(value, levels):
    for _ in range(levels):
        value = collections.ChainMap(value)
    return value


NESTED = {
    "mappingproxy-x10": lambda t: _proxies({"k": t}, 10),
    "chainmap-x10": lambda t: _chainmaps({"k": t}, 10),
}


@pytest.mark.parametrize("make", list(NESTED.values()), ids=list(NESTED))
def test_a_writable_handle_under_nested_standard_mappings_is_refused(dev, make):
    """containers.py ~39-40 (``if depth > 8: return None``) and ~57-70: a mappingproxy,
    UserList/UserDict and ChainMap are read by recursing into what they wrap; a tenth level
    reads as "no container", so the walk (resident.py) skips it and the stream runs. Fix:
    return the wrapped mapping(s) as one item each (``("seq", [wrapped])`` for a proxy,
    ``("seq", maps)`` for a ChainMap) and let the walk's own stack and ``seen`` go down
    them, so depth is bounded by MOST_CONTAINERS, not 8, and cycles end by ``seen``."""
    with cv.resident(np.zeros(4, np.float32), writable=True, device=dev) as table:
        with pytest.raises(cv.InputError, match="writable cv.resident"):
            stream_with_arg(dev, make(table))


def test_a_chainmap_repeating_itself_is_read_a_bounded_number_of_times(monkeypatch):
    """``c = ChainMap(); c.maps = [c] * 3``: ``_read`` recurses into each of the three, to
    depth 8: 3**9 = 19,683 calls for one container (``[c] * 6``: 2.7 s here; ``[c] * 10``:
    10**9, a stream that never starts, in the walk and in Dask's check alike). Counted where
    each wrapper is read, ``vars`` (no timing); ten of itself and a dict here. Fix: as
    above, hand the maps to the caller's walk (each once, by ``seen``), or keep a set of ids
    read within one ``standard_items``."""
    calls = [0]

    def counted(value):  # every wrapper is read through vars(): counted there
        calls[0] += 1
        return vars(value)

    monkeypatch.setattr(containers, "vars", counted, raising=False)
    chain = collections.ChainMap()
    chain.maps = [chain] * 10 + [{"k": 1}]
    assert containers.standard_items(chain) == ("map", [("k", 1)])
    assert calls[0] <= 100, f"{calls[0]} reads of one ChainMap of 11 maps"


# -- 3. dask/held.py: the callable's name, and slots read by __slots__'s value ---------------
def _holding(value):
    def kernel_of_mine(x, *args, queue, offset, n):
        return value

    return kernel_of_mine


def test_dasks_refusal_names_the_users_function(dev):
    """held.py ~66: ``getattr_static`` does not run descriptors, and a function's
    ``__name__`` is a getset descriptor on ``types.FunctionType``; the label falls to
    ``type(compute).__name__``: "the callable 'function' uses 'value'" (before round fifty:
    'kernel_of_mine'). Fix: for ``types.FunctionType``/``MethodType``/builtins (whose
    ``__name__`` runs no user code) read ``compute.__name__``; getattr_static for the rest."""
    with pytest.raises(cv.InputError, match="'kernel_of_mine'"):
        held.refuse_held(_holding(dev))


def test_dasks_refusal_names_the_device_held(dev):
    """Guard: a device held in a closure is refused on the client, naming the variable."""
    with pytest.raises(cv.InputError, match="'value', a device of this process"):
        held.refuse_held(_holding(dev))


class _IteratorSlots:
    __slots__ = iter(["device"])  # any iterable is allowed; the class keeps it, spent

    def __init__(self, device):
        self.device = device

    def __call__(self, x, *args, queue, offset, n):
        return None


class _PrivateSlots:
    __slots__ = ("__device",)  # stored as _PrivateSlots__device

    def __init__(self, device):
        self.__device = device

    def __call__(self, x, *args, queue, offset, n):
        return self.__device


@pytest.mark.parametrize("kind", [_PrivateSlots, _IteratorSlots], ids=["private", "iterator"])
def test_a_device_in_a_slot_is_named(dev, kind):
    """held.py ~166-173: ``object.__getattribute__(instance, "__device")`` is an
    AttributeError (the slot is ``_PrivateSlots__device``), and an iterator given as
    ``__slots__`` is empty when read again: the device goes on to pickling, where it fails as
    "cannot pickle '_thread.lock' object". Fix: read the slots from the class's member
    descriptors (``for d in kind.__dict__.values() if isinstance(d,
    types.MemberDescriptorType)``: ``d.__get__(instance)``), which also survives a
    ``__slots__`` rebound to a non-iterable (a raw TypeError from the check today)."""
    with pytest.raises(cv.InputError, match="a device of this process"):
        held.refuse_held(kind(dev))


class _CodedError(RuntimeError):
    __slots__ = ("__code",)

    def __init__(self, message, code):
        super().__init__(message)
        self.__code = code

    @property
    def code(self):
        return self.__code


def test_a_copied_exception_keeps_its_private_slots():
    """worker.py ~354-362 (round fifty's fix): ``object.__getattribute__(exc, "__code")`` is
    an AttributeError (``_CodedError__code`` is the slot), taken for "unset", so the copy a
    worker raises has no code: ``exc.code`` is an AttributeError. Fix: copy through the
    member descriptors, as above (``d.__set__(made, d.__get__(exc))``)."""
    from conveyor.dask.worker import _own_copy

    made = _own_copy(_CodedError("bad input", 7))
    assert made.code == 7


# -- 4. pool.py: a pinned request past the largest allocation, named by its page class -------
def test_a_pinned_request_past_the_largest_allocation_is_named_as_asked(dev):
    """pool.py ~607 returns for ``host_memory`` pools; opencl.py alloc_pinned (~698) is then
    handed ``page_bin(nbytes)``, and its InputError names that (round fifty's finding, back
    for the pinned pool on OpenCL, where the largest allocation does bound it). Fix: let the
    backend say whether its pinned memory is bounded (``device.max_pinned_bytes``: the
    largest allocation on OpenCL, None on CUDA) and check that as asked in acquire/prepare."""
    asked = dev.max_alloc_bytes + 1
    with pytest.raises(cv.InputError, match=f"^acquire: {asked} bytes|(?<!\\d){asked} bytes"):
        dev.pinned_pool.acquire(asked)


# -- 5. the standard library's other views of a mapping ---------------------------------------
ABC_VIEWS = {
    "userdict-values": lambda t: collections.UserDict(t=t).values(),
    "userdict-items": lambda t: collections.UserDict(t=t).items(),
    "chainmap-values": lambda t: collections.ChainMap({"t": t}).values(),
}


@pytest.mark.parametrize("make", list(ABC_VIEWS.values()), ids=list(ABC_VIEWS))
def test_a_writable_handle_in_a_user_dicts_view_is_refused(dev, make):
    """``_VIEWS`` (containers.py ~21) names the dict views only; a UserDict's and a
    ChainMap's ``values()``/``items()``/``keys()`` are ``collections.abc.ValuesView`` etc.,
    so ``args=(tables.values(),)`` with ``tables`` a UserDict runs with a writable handle
    (``{...}.values()`` of a dict is refused; Dask's check finds the same view's device, by
    its ``_mapping`` slot). Fix: for ``collections.abc.MappingView`` instances read the
    ``_mapping`` slot through the member descriptor
    (``collections.abc.MappingView.__dict__['_mapping'].__get__(view)``) and read that
    mapping as ``_read`` does, keys, values or pairs by the view's base class."""
    with cv.resident(np.zeros(4, np.float32), writable=True, device=dev) as table:
        with pytest.raises(cv.InputError, match="writable cv.resident"):
            stream_with_arg(dev, make(table))


# -- 6. chainbind: other plan refusals than the memory limit's, reworded as the memory limit's --
def _fill(x, t, *args, queue, offset, n):
    return None


def _use(x, t, y, *args, queue, offset, n):
    return None


def test_a_block_bytes_smaller_than_a_temps_row_is_not_called_the_memory_limit(dev):
    """chainbind.py ~126-146: the halo's refusal is told by type since the re-read
    (HaloPastBlocks), but any other InputError of ``make_plan`` with the temps that the plan
    without them does not raise is reworded as the temps not fitting the memory limit. Here
    plan.py ~381 refuses ``block_bytes=4096`` as smaller than the temp's 16384-byte row; the
    user reads "use smaller temps or a larger memory_limit" (no memory_limit was given, and
    none helps), the right advice only in the parentheses. Fix: give the ring-over-the-limit
    refusal its own type (as HaloPastBlocks) and reword only that one; raise the rest as
    they are (naming the temp, where the row is a temp's)."""
    chain = cv.chain(cv.link(_fill, reads="in0", writes="t"),
                     cv.link(_use, reads=("in0", "t"), writes="out0"),
                     temps={"t": ((4096,), np.float32)})
    x, y = np.ones(1000, np.float32), np.zeros(1000, np.float32)
    with pytest.raises(cv.InputError) as caught:
        cv.stream(chain, [x], [y], device=dev, block_bytes=4096)
    message = str(caught.value)
    assert "block_bytes >= 16384" in message
    assert "memory limit" not in message and "memory_limit" not in message, message


# -- the session's fixes, beyond the findings ------------------------------------------------
def test_args_past_the_container_bound_are_refused_naming_it(dev, monkeypatch):
    """Past MOST_CONTAINERS containers of containers the walk refuses the stream, saying it
    stopped (a handle deeper in was passed silently); lowered here, the bound's own value
    takes 0.5 s to reach."""
    from conveyor.pipeline import resident

    monkeypatch.setattr(resident, "MOST_CONTAINERS", 50)
    with cv.resident(np.zeros(4, np.float32), writable=True, device=dev) as table:
        deep: list = [table]
        for _ in range(60):
            deep = [deep]
        with pytest.raises(cv.InputError, match="more than 50 containers .* NumPy array"):
            stream_with_arg(dev, deep)
        # Containers holding no container are told apart in C, and never count.
        assert stream_with_arg(dev, [(i, i) for i in range(1000)]).result == 64


@pytest.mark.parametrize("where", [0, 777, 99_999])
def test_a_handle_in_one_small_tuple_of_many_is_found(dev, where):
    """10**5 small tuples, one of which holds the handle: the groups of plain containers
    that hold one are halved until it is read (``resident._holding``)."""
    with cv.resident(np.zeros(4, np.float32), writable=True, device=dev) as table:
        points: list = [(i, i) for i in range(100_000)]
        points[where] = (where, table)
        with pytest.raises(cv.InputError, match=rf"args\[0\]\['points'\]\[{where}\]\[1\]"):
            stream_with_arg(dev, {"points": points})


def test_many_namedtuples_of_numbers_are_no_containers_of_containers(dev):
    """The session's reviewer: 100,001 namedtuples of floats were each read one by one and
    counted towards the bound, and the stream was refused for "containers that hold
    others"; tuple, list, set and dict subclasses are told apart in C as the plain ones."""
    point = collections.namedtuple("point", "x y")
    assert stream_with_arg(dev, [point(float(i), 1.0) for i in range(100_001)]).result == 64


def test_a_handle_in_an_objects_vars_in_a_list_is_refused(dev):
    """A dict is screened by its keys and values (on Python 3.13 an instance's ``__dict__``
    shows gc.get_referents none of its values)."""
    class Config:
        pass

    with cv.resident(np.zeros(4, np.float32), writable=True, device=dev) as table:
        config = Config()
        config.table = table
        with pytest.raises(cv.InputError, match=r"args\[0\]\[0\]\['table'\] is a writable"):
            stream_with_arg(dev, [vars(config)])


def test_dasks_check_names_a_method_whose_function_raises_on_reads():
    """A bound method's ``__name__`` is read through its ``__func__``, whose ``__getattr__``
    may raise: the check names the type instead of raising the user's error."""
    class Raising:
        def __call__(self, *args, **kwargs):
            return None

        def __getattr__(self, name):
            raise KeyError(name)

    assert held._name(types.MethodType(Raising(), object())) == "method"
