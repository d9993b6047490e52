"""Resident arrays: tables a kernel reads (or writes) whole, uploaded once and passed to every
launch as a pointer, instead of streamed block by block.

An array in ``args=`` where the kernel declares a pointer (``__global const T*``,
``__constant T*``, ``const T*`` in CUDA) is uploaded before the first block, lives on the
device for the whole stream (counted against ``memory_limit``) and is given to every launch.
:func:`resident` makes a handle that keeps the table on the device across streams: closed by
``close()`` or the ``with`` block, and given back by the pool's out-of-memory ladder only while
no stream uses it (the next stream uploads it again). A kernel that may write a resident
(a pointer not declared const) is refused unless the handle is ``writable=True``; a writable
handle's array is uploaded at the start of every stream and copied back into the host array
after each stream that succeeded, so the host array is the table between streams: a reset
(``counts[:] = 0``) is seen, and a failed stream's partial writes never reach the next one. A
read-only table is uploaded once: after changing its host array, ``refresh()`` the handle.
Device arrays (``__cuda_array_interface__`` on CUDA, a ``pyopencl.array.Array`` on OpenCL)
are passed as they are: they are on the device already. A table whose values ``np.asarray``
would change (a masked array with masked elements, PyArrow data with nulls), and a structured
dtype laid out otherwise than the C struct the kernel's source defines (NumPy's packed fields
for a padded struct: pipeline/structs.py), are InputErrors, as they are for a streamed input;
so is a dtype without fields (``float32``) for a pointer to a struct the source defines
(``rec*``), with the structured dtype to pass. A struct from a header or a macro is not judged.
"""

from __future__ import annotations

import collections
import contextvars
import gc
import itertools
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from conveyor import config, interrupts
from conveyor.backends.base import Device, DeviceBuffer, Kernel, Queue, named_beside
from conveyor.closing import Closeable
from conveyor.containers import CONTAINERS, PLAIN, standard_items
from conveyor.errors import ConveyorError, InputError, OutOfMemoryError
from conveyor.kernels.signature import Param
from conveyor.memory.pool import device_bin
from conveyor.pipeline import structs


class Resident(Closeable):
    """A host array kept on one device across streams (see the module). ``nbytes`` is its
    size; it is uploaded when a stream first needs it (or now, when ``device`` is given)."""

    def __init__(self, array: Any, *, writable: bool = False,
                 device: Device | str | None = None) -> None:
        array = _table(array, "the array given to cv.resident()")
        writable = config.flag("writable", writable)
        if writable and not (array.flags.c_contiguous and array.flags.writeable):
            raise InputError("resident(writable=True) copies the table back into the array: "
                             "pass a C-contiguous, writable array")
        #: The caller's array: a copy of it is uploaded where it is not C-contiguous (a
        #: strided view, Fortran order), made again by refresh() to see the host's changes.
        self.source = array
        self.array = np.ascontiguousarray(array)
        self.writable = bool(writable)
        self.device: Device | None = None
        self.buffer: DeviceBuffer | None = None
        self.users = 0
        self.closed = False
        self._close_when_done = False  # a with body raised while a stream used the table
        self._lock = threading.RLock()
        self._kept = False  # array holds the device's values, read back by evict()
        # A writable table is held by one outermost stream (and those inside it) at a time:
        # its token (see claim()).
        self._owner: object | None = None
        self._claim_count = 0
        if device is not None:
            from conveyor.memory.keep import _device

            self._bind(_device(device))  # a Device or a spec string, as cv.stream takes
            self._upload_now()

    @property
    def nbytes(self) -> int:
        """Bytes of the table."""
        return int(self.array.nbytes)

    @property
    def dtype(self) -> np.dtype:
        """The table's element type."""
        return self.array.dtype

    def _bind(self, device: Device) -> None:
        # (Closing once its last stream lets go, after a with body raised, it stays usable
        # till then: a stream that holds it may start others with it, a generator's say.)
        if self.closed:
            raise InputError("this resident array was closed: make a new cv.resident(...)")
        if self.device is None:
            self.device = device
        elif self.device is not device:
            raise InputError(f"this resident array lives on "
                             f"{named_beside(self.device, device)}, the stream runs on "
                             f"{device.spec}: make a cv.resident(...) per device")

    def _upload_now(self) -> None:
        assert self.device is not None
        queue = self.device.create_queue()
        try:
            self.use(self.device, queue)
            queue.finish()
        except OutOfMemoryError as exc:
            # The stream's advice (block_bytes=, depth) is no help to a table made alone.
            exc.advice = (f"the table has {self.nbytes} bytes: use a smaller table, or free "
                          f"device memory (close other resident tables; raise "
                          f"device.memory_pool.limit where it is set)")
            raise
        finally:
            queue.close()
            self.done()

    def use(self, device: Device, queue: Queue) -> DeviceBuffer:
        """For a stream on ``device``: the device buffer, uploaded on ``queue`` first where it
        is not on the device (the queue orders the upload before the stream's launches)."""
        with self._lock:
            self._bind(device)
            host = self.current().reshape(-1).view(np.uint8)
            if self.buffer is None:
                pool = device.memory_pool
                buffer = pool.acquire(self.nbytes)
                try:
                    queue.copy_in(buffer, host)
                    # On the device before any stream is handed it: a stream on another
                    # thread took the buffer at once, and its kernels, ordered after its own
                    # queue alone, read the block's old bytes on CUDA (the uploading stream
                    # waits for this queue before its first launch anyway).
                    queue.finish()
                except BaseException:
                    pool.release(buffer)
                    raise
                self.buffer = buffer
                pool.add_evictable(self)
            elif self.writable and not self.users:
                # The host array is the table between streams (see the module): what the host
                # wrote since, or what a failed stream left half-written on the device, goes.
                queue.copy_in(self.buffer, host)
            self.users += 1
            return self.buffer

    def current(self) -> np.ndarray:
        """The C-contiguous table to upload: where nothing is on the device yet, a strided
        or Fortran-order table is copied again now (the copy made by ``cv.resident`` held the
        values from then: changes made before the first stream were never uploaded)."""
        with self._lock:
            if self.buffer is None and self.array is not self.source and not self._kept:
                self.array = np.ascontiguousarray(self.source)
            return self.array

    def done(self) -> None:
        """A stream has finished with the table (the last one closes it, where a ``with``
        body raised while it was in use)."""
        with self._lock:
            self.users -= 1
            if self._close_when_done and not self.users:
                self.close()

    def copy_back(self, queue: Queue) -> None:
        """Copy the device's table into ``array`` (writable handles, after a stream)."""
        with self._lock:
            if self.writable and self.buffer is not None:
                queue.copy_out(self.array.reshape(-1).view(np.uint8), self.buffer).wait()

    def home(self, default: Device) -> Device:
        """The device the table lives on; ``default`` when it was bound to none yet (bound
        now, so that streams started at once agree on it). InputError once closed."""
        with self._lock:
            self._bind(self.device if self.device is not None else default)
            assert self.device is not None
            return self.device

    def host_copy(self) -> np.ndarray:
        """The table as its device holds it, read back (a read-only table changed on the host
        since its upload, without refresh(), still has its old values there, and a stream on
        its device sees those); the host array where it is on no device."""
        with self._lock:
            if self.buffer is None or self.device is None:
                # (current(): a strided or Fortran-order table changed on the host before
                # any upload is copied again, as a stream of it on one device sees it)
                return self.current()
            host = np.empty_like(self.array)
            queue = self.device.create_queue()
            try:
                queue.copy_out(host.reshape(-1).view(np.uint8), self.buffer).wait()
            finally:
                queue.close()
            return host

    def evict(self) -> bool:
        """Give the device copy back to the pool if no stream uses it (the pool's
        out-of-memory ladder calls this); a later stream uploads the table again. Never waits
        for the table's lock: the ladder runs inside another table's upload, which holds that
        table's lock, and two uploads evicting each other's tables hung for ever. A table
        busy now is not evicted.

        A read-only table's device values are read back first and uploaded again in place of
        the host array: a host array changed without ``refresh()`` gave the old values until
        an unrelated stream's memory pressure evicted the table, and the new ones after (what
        a stream computed depended on the device's memory). Where that copy cannot be made
        (no host memory), the table is not evicted."""
        return self._drop(keep_values=True)

    def _drop(self, keep_values: bool = False) -> bool:
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self.users or self.buffer is None or self.device is None:
                return False
            if keep_values and not self.writable:
                try:
                    values = self.host_copy()
                except (MemoryError, ConveyorError):
                    return False
                self.array = values  # no longer self.source: refresh() reads that again
                self._kept = True
            buffer, self.buffer = self.buffer, None
        finally:
            self._lock.release()
        self.device.memory_pool.release(buffer)
        return True

    def refresh(self) -> None:
        """The host array changed: the next stream uploads it again (a read-only table is
        otherwise uploaded once; a writable one is uploaded by every stream anyway).
        InputError while a stream uses it."""
        with self._lock:
            if self.users:
                raise InputError("a stream is using this resident array: refresh it after "
                                 "the stream returns")
            if self.array is not self.source:  # a contiguous copy: copy the changes too
                self.array = np.ascontiguousarray(self.source)
            self._kept = False
            self._drop()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        """Close; where the ``with`` body raised while a stream still uses the table (on
        another thread), its error goes on as itself and the table closes once that stream
        lets go of it (an InputError "still in use" took the error's place, and the table
        stayed on the device for good)."""
        if exc is not None:
            with self._lock:
                if self.users:
                    self._close_when_done = True
                    return
        self.close()

    def close(self) -> None:
        """Free the device copy. InputError while a stream uses it."""
        with self._lock:
            if self.users:
                raise InputError("a stream is using this resident array: close it after "
                                 "the stream returns")
            self._drop()
            self.closed = True

    def __del__(self) -> None:
        try:
            if not self.closed and getattr(self, "users", 1) == 0:
                self._drop()
        except Exception:  # never raise from a finalizer, at shutdown least of all
            pass


def resident(array: Any, *, writable: bool = False,
             device: Device | str | None = None) -> Resident:
    """``array`` kept on the device across streams: pass the handle in ``args=`` where the
    kernel declares a pointer. ``writable=True`` lets the kernel write it: uploaded at the
    start of every stream, copied back into ``array`` after each that succeeded. A read-only
    table is uploaded once: ``refresh()`` after changing ``array``. ``device`` uploads it now
    (default: at first use). Close it (or use ``with``) to free the device memory."""
    return Resident(array, writable=writable, device=device)


#: Guards every writable table's owner (see :func:`claim`).
_claims = threading.Condition()
#: Streams waiting in :func:`claim` now: their token -> (the streams they run inside, the
#: streams holding the tables they wait for). Under ``_claims``.
_waiting: dict[object, tuple[tuple[object, ...], set[object]]] = {}
#: The streams a stream runs inside, as their tokens, outermost first: set by each claim in
#: the context its stream runs in, which the streams it starts inside (a callable's, on its
#: thread; a cv.iterate generator's, on its staging thread) see.
_holder: contextvars.ContextVar[tuple[object, ...]] = contextvars.ContextVar(
    "conveyor_resident_holder", default=())


class Claim:
    """Writable tables taken by :func:`claim` for one stream, for :func:`let_go`; ``nested``
    those that a stream this one runs inside already held."""

    __slots__ = ("tables", "nested", "_reset")

    def __init__(self, tables: list[Resident], nested: list[Resident],
                 reset: contextvars.Token[tuple[object, ...]] | None) -> None:
        self.tables, self.nested, self._reset = tables, nested, reset

    def __bool__(self) -> bool:
        return bool(self.tables)


def claim(handles: Sequence[Resident]) -> Claim:
    """Take the writable tables among ``handles`` for this stream, all at once. Streams
    sharing one writable device table could not drop a failed one's partial writes (the
    other's copy-back brought them home with its own), so a stream waits until every one of
    its tables is free. All at once, never one by one: two streams taking two tables in
    opposite orders each held one and waited for the other. A stream started inside one that
    holds a table (a callable's nested stream, or a ``cv.iterate`` generator's on the staging
    thread: the outer stream waits for either) shares that table: the streams it runs inside
    are found through the context, not the thread (a generator's stream on the staging
    thread waited for its own outer stream for ever). A table no enclosing stream holds is
    this stream's own: two streams inside one outer stream wait for each other for it."""
    writable = [h for h in dict.fromkeys(handles) if h.writable]
    if not writable:
        return Claim([], [], None)
    enclosing = _holder.get()
    mine = object()
    with _claims:
        try:
            while blockers := {h._owner for h in writable
                               if h._owner is not None and h._owner not in enclosing}:
                if _waits_on_itself(blockers, enclosing):
                    raise InputError(
                        "a writable cv.resident table this stream needs is held by another "
                        "stream, which (through a stream started inside it) waits for a table "
                        "held by a stream this one runs inside: each would wait for the other "
                        "for ever. Give each outer stream every writable table the streams "
                        "inside it use (a stream takes its tables all at once), or run them "
                        "one after the other")
                _waiting[mine] = (enclosing, blockers)
                interrupts.wait(_claims)
        finally:
            _waiting.pop(mine, None)
        nested = [h for h in writable if h._owner is not None]  # an enclosing stream's
        for handle in writable:
            if handle._owner is None:
                handle._owner = mine
            handle._claim_count += 1
    return Claim(writable, nested, _holder.set((*enclosing, mine)))


def _waits_on_itself(blockers: set[object], enclosing: tuple[object, ...]) -> bool:
    """Whether waiting for the streams ``blockers`` (holders of tables) would wait, through
    the streams waiting now (``_waiting``), for one of ``enclosing``: a stream cannot end
    before a stream started inside it does, so each enclosing stream of a waiter waits for
    what that waiter waits for. Two threads' outer streams, each holding a table whose
    callables' nested streams wanted the other's, waited for ever. Under ``_claims``."""
    waits_for: dict[object, set[object]] = {}
    for outer, held_by in _waiting.values():
        for stream in outer:
            waits_for.setdefault(stream, set()).update(held_by)
    todo, seen = list(blockers), set()
    while todo:
        stream = todo.pop()
        if stream in enclosing:
            return True
        if stream not in seen:
            seen.add(stream)
            todo += waits_for.get(stream, ())
    return False


def copy_back(taken: Claim, queue: Queue) -> None:
    """After a stream that succeeded: the writable tables it took, back into their host
    arrays, but for those a stream it runs inside holds. That outermost stream copies them
    back when it succeeds: a nested stream's copy-back brought the outer stream's writes home
    as well, and they stayed there when the outer stream then failed."""
    for handle in taken.tables:
        if handle not in taken.nested:
            handle.copy_back(queue)


def let_go(taken: Claim | None) -> None:
    """Give back tables taken by :func:`claim`."""
    if not taken:
        return
    with _claims:
        for handle in taken.tables:
            handle._claim_count -= 1
            if not handle._claim_count:
                handle._owner = None
        _claims.notify_all()
    if taken._reset is not None:
        try:
            _holder.reset(taken._reset)
        except ValueError:  # let go of in another context than the claim's
            _holder.set(())
        taken._reset = None


class ResidentArgs:
    """The resident arrays of one stream's ``args``: which argument each is, uploaded at the
    start, substituted into every launch's arguments, let go of at the end."""

    def __init__(self, handles: dict[int, Resident], device_arrays: dict[int, Any],
                 owned: Sequence[Resident],
                 constant: dict[int, tuple[str, int]] | None = None) -> None:
        self.handles = handles
        # args index -> (name of its __constant parameter, bytes of the table)
        self.constant = constant or {}
        self.device_arrays = device_arrays
        self.owned = list(owned)  # made for this stream from plain arrays: closed at its end
        self.used: list[Resident] = []
        self.waits: list[Any] = []  # device arrays' pending events (bind)
        self.claimed = Claim([], [], None)  # writable tables taken for the stream (claim())
        #: False for a chain link's: the chain takes every link's tables, and copies them back
        #: (chainbind.ChainResidents).
        self.top = True

    @property
    def nbytes(self) -> int:
        """Device bytes of the tables, as the pool bins them."""
        return sum(device_bin(h.nbytes) for h in self.handles.values())

    def upload(self, device: Device, queue: Queue, args: Sequence[Any]) -> tuple[Any, ...]:
        """Upload every table on ``queue``; return ``args`` with each replaced by its device
        buffer."""
        values = list(args)
        for event in self.waits:
            event.wait()
        for index, value in self.device_arrays.items():
            values[index] = value
        if self.top:
            self.claimed = claim(list(self.handles.values()))
        for index, handle in self.handles.items():
            values[index] = handle.use(device, queue)
            self.used.append(handle)
        return tuple(values)

    def copy_back(self, queue: Queue) -> None:
        """After a stream that succeeded: writable tables back into their host arrays."""
        if self.top:
            copy_back(self.claimed, queue)

    def release(self) -> None:
        """The stream is over (every queue finished): let go of the tables."""
        used, self.used = self.used, []
        for handle in used:
            handle.done()
        claimed, self.claimed = self.claimed, Claim([], [], None)
        let_go(claimed)
        for handle in self.owned:
            handle.close()


def bind(kernel: Kernel, first_arg: int, args: Sequence[Any]) -> ResidentArgs:
    """The resident arrays among ``args`` (parameters from ``first_arg`` on): InputError for
    a pointer parameter given no array, an array the kernel may write that is not a writable
    handle, or one whose dtype does not match."""
    handles: dict[int, Resident] = {}
    device_arrays: dict[int, Any] = {}
    owned: list[Resident] = []
    constant: dict[int, tuple[str, int]] = {}
    waits: list[Any] = []
    params = kernel.params[first_arg : first_arg + len(args)]
    for index, (param, value) in enumerate(zip(params, args, strict=False)):
        if not param.is_pointer:
            if isinstance(value, Resident):
                raise InputError(f"args[{index}]: kernel parameter {param.name!r} is a scalar "
                                 f"({param.type_text}) but receives a resident array: declare "
                                 f"it as a pointer, or pass a scalar")
            continue
        if param.address == "local":
            raise InputError(
                f"args[{index}] (kernel parameter {param.name!r}, {param.type_text}) is "
                f"__local memory, which conveyor does not pass (a launch's arguments are "
                f"buffers and scalars): declare a fixed-size __local array inside the kernel "
                f"instead (e.g. __local float tile[256];)")
        native = _device_array(value, kernel, param, index)
        if native is not None:
            device_arrays[index] = native
            # Work still writing it (PyOpenCL's array.events): waited for before the first
            # launch, which read the table's old values otherwise.
            waits.extend(getattr(value, "events", None) or ())
            if param.address == "constant":  # the launch binds the whole buffer
                whole = getattr(getattr(value, "base_data", None), "size", None)
                constant[index] = (param.name, int(whole or getattr(value, "nbytes", 0) or 0))
            continue
        handle = value if isinstance(value, Resident) else None
        if handle is None:
            if _host_buffer(value):  # a memoryview, array.array: as inputs= takes them
                value = _table(value, f"args[{index}] (kernel parameter {param.name!r})")
            if not isinstance(value, np.ndarray):
                raise InputError(
                    f"args[{index}]: kernel parameter {param.name!r} is a pointer "
                    f"({param.type_text}) but receives {_described(value)}: "
                    f"pass an array (uploaded once, passed to every launch) or "
                    f"cv.resident(array)")
            _table(value, f"args[{index}] (kernel parameter {param.name!r})")
            handle = Resident(value)
            owned.append(handle)
        _check(param, index, handle,
               structs.struct_source(kernel) if param.dtype is None else None)
        handles[index] = handle
        if param.address == "constant":
            constant[index] = (param.name, handle.nbytes)
    made = ResidentArgs(handles, device_arrays, owned, constant)
    made.waits = waits
    return made


def refuse_in_callable_args(args: Sequence[Any], whose: str) -> None:
    """InputError for a writable :func:`resident` handle among a Python callable's ``args``,
    at any depth of the tuples, lists, sets and dicts it is given in: they are passed as
    given, so the callable gets the handle itself, and the copy-back a writable table
    promises would never happen (a read-only handle is passed as it is: round eleven's
    rule)."""
    for index, value in enumerate(args):
        where = _writable_within(value, f"args[{index}]")
        if where is not None:
            raise InputError(
                f"{where} is a writable cv.resident table, but {whose} args are passed "
                f"as given (the handle itself: nothing would be copied back into its array). "
                f"A resident table is for a kernel's pointer parameter: give the callable an "
                f"array of its own to write (not the table's array while the table is "
                f"written back: the copy-back would replace its writes)")


def _writable_within(value: Any, where: str) -> str | None:
    """The path (``args[0][1]['k']``) of a writable :func:`resident` handle in ``value`` or
    in the containers it holds, at any depth, or None. Walked: the containers Python and its
    standard library make (tuples, lists, sets, dicts' keys and values, dict views, a deque,
    a UserDict, a mappingproxy, a ChainMap, their views, and their subclasses), read through
    the base type (conveyor/containers.py: a subclass's own ``__iter__`` or ``items()`` may
    hide or raise), never a user's own Sequence or Mapping (reading one runs its code: a lazy
    dataset's ``__getitem__`` raised, a ring buffer's never ended).

    Breadth first, each container once (one that holds itself ends), its items looked at as
    it is read: a handle is found before the containers beside it are. A container is looked
    into only where the types of its elements (read by ``map``, in C) hold a handle or
    another container, and plain tuples, lists, sets and dicts holding neither are told
    apart many at a time (``gc.get_referents``, in C: 10**6 small tuples in a fraction of a
    second). Past :data:`MOST_CONTAINERS` containers still to read, InputError: the walk
    says it gave up rather than let a handle deeper in pass (it passed silently)."""
    if issubclass(type(value), Resident):  # by type: isinstance runs a user's __getattribute__
        return where if value.writable else None
    # Queue entries: (item, link), link = (parent link, how, key) or None for ``value``.
    queue: collections.deque[tuple[Any, Any]] = collections.deque([(value, None)])
    # Objects held, not ids alone: a dict view's (key, value) tuples are made as it is read,
    # and a freed one's id came back for the next view's (its handle was never looked at).
    seen: dict[int, Any] = {}
    while queue:
        item, link = queue.popleft()
        if id(item) in seen:
            continue
        found = standard_items(item)  # Python's own containers only, read without user code
        if found is None:
            continue
        if len(seen) >= MOST_CONTAINERS:
            raise InputError(
                f"{where} holds more than {MOST_CONTAINERS} containers (tuples, lists, dicts, "
                f"...) that hold others: conveyor looks through a callable's args for a "
                f"writable cv.resident table, and stopped there. Pass bulk data as a NumPy "
                f"array (or an object of your own, which is not looked into)")
        seen[id(item)] = item
        kind, items = found
        if kind == "map":
            parts = [([inner for _, inner in items], "item", [key for key, _ in items]),
                     ([key for key, _ in items], "key", None)]
        else:
            parts = [(items, "index" if kind == "seq" else "element", None)]
        for values, how, keys in parts:
            kinds = set(map(type, values))  # in C: most containers hold no handle or container
            if any(issubclass(k, Resident) for k in kinds):  # handles as they are read
                for i, inner in enumerate(values):
                    if issubclass(type(inner), Resident) and inner.writable:
                        return _path(where, (link, how, keys[i] if keys is not None else i))
            if any(issubclass(k, CONTAINERS) for k in kinds):
                queue.extend((values[i], (link, how, keys[i] if keys is not None else i))
                             for i in _holding(values, kinds) if id(values[i]) not in seen)
    return None


def _holding(values: list[Any], kinds: set[type]) -> list[int]:
    """Indices of the containers among ``values`` that may hold a handle, each object once:
    containers holding no handle and no container are dropped, tuples, lists, sets and dicts
    (and their subclasses: a namedtuple, a Counter) told in C many at a time (halves of a
    group whose items hold one, down to groups of :data:`_FEW`), others by their items."""
    if len(set(map(id, values))) < len(values):  # [shared] * n: each object once
        first: dict[int, int] = {}
        for index, inner in enumerate(values):
            first.setdefault(id(inner), index)
        order: Sequence[int] = list(first.values())
    else:
        order = range(len(values))
    kinds_of = [type(values[i]) for i in order]
    kept = [] if all(issubclass(k, PLAIN) for k in kinds) else [
        i for i, kind in zip(order, kinds_of, strict=True)
        if issubclass(kind, CONTAINERS) and not issubclass(kind, PLAIN)
        and _holds_any(values[i])]
    groups = [[i for i, kind in zip(order, kinds_of, strict=True) if issubclass(kind, PLAIN)]]
    while groups:
        group = groups.pop()
        if not group or not _worth(_contents([values[i] for i in group])):
            continue
        if len(group) <= _FEW:
            kept += group
        else:
            groups += [group[:len(group) // 2], group[len(group) // 2:]]
    return kept


def _holds_any(container: Any) -> bool:
    """Whether a container of another kind (a deque, a UserDict, a view) holds a handle or
    a container, by its items (read as :func:`standard_items` reads them)."""
    found = standard_items(container)
    if found is None:
        return False
    kind, items = found
    values = list(itertools.chain.from_iterable(items)) if kind == "map" else items
    # A tuple among them (an items view's pairs) is looked into in C, as a plain one is.
    pairs = [inner for inner in values if type(inner) is tuple]
    return _worth(inner for inner in values if type(inner) is not tuple) or _worth(
        gc.get_referents(*pairs))


#: Base types whose own iteration reads a subclass's items in C (get_referents also lists a
#: subclass instance's ``__dict__``, a container, and every one was read one by one).
_ITERS: tuple[tuple[type, Any], ...] = (
    (tuple, tuple.__iter__), (list, list.__iter__), (frozenset, frozenset.__iter__),
    (set, set.__iter__))


def _contents(group: list[Any]) -> Any:
    """What the tuples, lists, sets and dicts of ``group`` hold (a dict its keys and
    values), read in C: exact ones through ``gc.get_referents``, subclasses through their
    base type's own iteration."""
    exact = [inner for inner in group if type(inner) in _EXACT]
    if len(exact) == len(group):  # most groups
        return gc.get_referents(*exact)
    parts: list[Any] = [gc.get_referents(*exact)]
    for base, iterate in _ITERS:
        parts.append(itertools.chain.from_iterable(map(iterate, [
            inner for inner in group if type(inner) is not base and issubclass(type(inner), base)
            and not issubclass(type(inner), dict)])))
    maps = [inner for inner in group if issubclass(type(inner), dict)]
    parts.append(itertools.chain.from_iterable(map(dict.keys, maps)))
    parts.append(itertools.chain.from_iterable(map(dict.values, maps)))
    return itertools.chain.from_iterable(parts)


#: Exactly these: ``gc.get_referents`` lists their items and nothing else.
_EXACT = frozenset({tuple, list, set, frozenset})


#: Plain containers read one by one once a group of them holds a handle or a container.
_FEW = 64


def _worth(items: Any) -> bool:
    """Whether ``items`` holds a handle or a container to look into, told by their types
    alone (one pass of ``map`` in C, not a Python loop over every element)."""
    return any(issubclass(kind, Resident) or issubclass(kind, CONTAINERS)
               for kind in set(map(type, items)))


def _path(where: str, link: Any) -> str:
    """The path to a handle found by :func:`_writable_within`, from its chain of links."""
    steps = []
    while link is not None:
        link, how, key = link
        steps.append((how, key))
    path = where
    for how, key in reversed(steps):  # a key or a set's element has no subscript: <named>
        path += (f"[{key!r}]" if how == "item" else f"[{key}]" if how == "index"
                 else "[<a key>]" if how == "key" else "[<an element>]")
    return path


#: Containers read one by one, at most, for one callable's args (those holding other
#: containers or handles: plain ones holding neither are told apart in C, many at a time).
#: Past it the stream is refused, naming the bound: a handle deeper in was passed silently.
MOST_CONTAINERS = 100_000


def _host_buffer(value: Any) -> bool:
    """Whether ``value`` is host memory NumPy takes as it is (the buffer protocol, or an
    array interface), not text and not a list (whose element type NumPy would guess)."""
    if isinstance(value, str | bytes | list | tuple) or isinstance(value, Resident):
        return False
    # an ndarray first: its __array_interface__ lists every field of its dtype (seconds
    # for records of millions of fields)
    if isinstance(value, np.ndarray) or hasattr(value, "__array_interface__") or hasattr(
            value, "__array__"):
        return True
    try:
        memoryview(value)
    except TypeError:
        return False
    return True


def _table(value: Any, what: str) -> np.ndarray:
    """``value`` as the array of a resident table (``what``: where it was given); InputError
    for what no device buffer holds (Python objects, a scalar, no elements) and for values
    ``np.asarray`` would change (masked elements, PyArrow nulls: validate.check_values)."""
    from conveyor.pipeline import validate

    validate.device_memory(value, what, "cv.resident uploads a host array; a device array "
                           "goes in args= itself (the launch takes its buffer)")
    validate.check_values(value, what)
    try:
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
    except (ValueError, TypeError) as exc:  # a ragged list: NumPy's "inhomogeneous shape"
        raise InputError(f"{what} is no array NumPy can make ({exc}): pass a NumPy array "
                         f"(rows of one length)") from None
    from conveyor.pipeline import overlap

    overlap.check_map_sizes([(what, array)])  # a map whose file was cut: SIGBUS at upload
    if array.dtype.names:  # before any message prints the dtype (records of 2**23 fields)
        from conveyor.pipeline.recordvalues import check_nesting

        check_nesting(what, array.dtype)
    if array.dtype.hasobject or array.ndim == 0 or array.size == 0:
        why = ("holds Python objects" if array.dtype.hasobject
               else "is a scalar" if array.ndim == 0 else "has no elements")
        raise InputError(f"{what} is {array.dtype} of shape {array.shape}, which {why}: a "
                         f"resident table is a device buffer of at least one element: pass a "
                         f"non-empty numeric array (np.zeros(1, dtype) for a table the kernel "
                         f"never reads)")
    return array


def _check(param: Param, index: int, handle: Resident, source: str | None) -> None:
    where = f"args[{index}] (kernel parameter {param.name!r}, {param.type_text})"
    read_only = param.is_const or param.address == "constant"
    if handle.dtype.names:  # before any message prints the dtype
        from conveyor.pipeline.recordvalues import check_nesting

        check_nesting(where, handle.dtype)
    if not read_only and not handle.writable:
        raise InputError(
            f"{where} is not const, so the kernel may write the resident array it receives: "
            f"declare it const (__global const / __constant), or pass "
            f"cv.resident(array, writable=True) to have it copied back after the stream")
    if param.dtype is not None and param.dtype != handle.dtype:
        raise InputError(f"{where} takes {param.dtype} elements but the array holds "
                         f"{handle.dtype}: pass array.astype(np.{param.dtype})")
    if param.dtype == np.bool_:
        from conveyor.pipeline import validate

        validate.check_bool_bytes(where, handle.array)
    if param.dtype is None:  # a struct pointer: the layout is all that can be checked
        from conveyor.pipeline import validate

        # A dtype without fields for a struct the source defines (float32 for rec*): the
        # kernel read the floats' bytes as records, with no error.
        structs.check_fields(where, handle.dtype, source, param.struct_name)
        validate.check_struct(where, handle.dtype, source, param.struct_name)


def _device_array(value: Any, kernel: Kernel, param: Param, index: int) -> Any:
    """What a launch takes for a device array (None for anything else); InputError for one
    the kernel would misread: another dtype than the parameter's (float64 read as float),
    not C-contiguous or not at the start of its buffer (the launch passes the whole buffer
    from its first byte), or of another device's context (PyOpenCL hung in set_args)."""
    backend = kernel.device.backend
    interface = getattr(value, "__cuda_array_interface__", None)
    native = None
    if interface is not None and backend == "cuda":
        dtype = np.dtype(interface["typestr"])
        contiguous = interface.get("strides") is None or _c_strides(
            tuple(interface["shape"]), tuple(interface["strides"]), dtype.itemsize)
        at_start = True  # its data pointer is where the launch starts
        native = value  # the CUDA backend passes its data pointer
    elif backend == "opencl" and type(value).__module__.startswith("pyopencl"):
        data = getattr(value, "base_data", None)
        if data is None and hasattr(value, "dtype") and getattr(value, "size", 1) == 0:
            raise InputError(f"args[{index}] (kernel parameter {param.name!r}) is "
                             f"{_described(value)}, which has no elements: a table is a "
                             f"device buffer of at least one element")
        if data is None or not hasattr(value, "dtype"):
            return None
        dtype = np.dtype(value.dtype)
        contiguous = bool(value.flags.c_contiguous)
        at_start = getattr(value, "offset", 0) == 0
        context = getattr(kernel.device, "context", None)
        if context is not None and value.context.int_ptr != context.int_ptr:
            raise InputError(f"args[{index}] (kernel parameter {param.name!r}) is "
                             f"{_described(value)} of another OpenCL context than "
                             f"{kernel.device.spec}'s: pass a NumPy array (uploaded once) or "
                             f"an array made on that device")
        native = data
    else:
        return None
    where = f"args[{index}] (kernel parameter {param.name!r}, {param.type_text})"
    if param.dtype is not None and dtype != param.dtype:
        raise InputError(f"{where} takes {param.dtype} elements but receives "
                         f"{_described(value)}: pass a device array of {param.dtype}")
    if param.dtype is None:  # a struct pointer: checked as a NumPy table's layout is
        from conveyor.pipeline import validate

        source = structs.struct_source(kernel)
        structs.check_fields(where, dtype, source, param.struct_name)
        validate.check_struct(where, dtype, source, param.struct_name)
    if not contiguous or not at_start:
        raise InputError(f"{where} receives {_described(value)}, a view that is not "
                         f"C-contiguous from the start of its buffer: the kernel would read "
                         f"the buffer from its first byte. Pass a contiguous copy "
                         f"(.copy() of the view)")
    return native


def _c_strides(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides), strict=True):
        if dim > 1 and stride != expected:
            return False
        expected *= dim
    return True


def _described(value: Any) -> str:
    """``value`` for messages, without its repr (a device array's repr downloads it)."""
    kind = type(value).__name__
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"a {kind} of shape {tuple(shape)} and dtype {dtype}"
    return f"{kind} {value!r:.40}"
