"""One stream over several devices of one host: one engine per device, one supply of blocks.

``cv.stream(..., device=[d0, d1])`` (or ``"cuda:all"``, a list of spec strings) plans the
stream once, for the smallest of the devices, so every device cuts the same blocks (and a
reduction's partials are the same whatever device folds them). Each device gets its own
:class:`~conveyor.pipeline.engine.Engine` (its rings, queues, pools, staging threads) on its
own thread, and every engine takes its blocks from one shared ``Supply``
(pipeline/supply.py):

- ``schedule="dynamic"`` (the default): an engine takes the next *run* of ``RUN_BLOCKS``
  consecutive blocks whenever it has room for another block (its staging ring or its device
  ring has a free entry), so a device behind a slower link, or busy with another job, takes
  fewer runs. Within a run its blocks go in increasing order; a run is short so the last runs
  end close together on every device.
- ``schedule="static"``: device ``i`` of ``n`` takes the contiguous blocks
  ``[i * blocks // n, (i + 1) * blocks // n)``; kept to compare with.

The first failure on any engine stops the supply: every engine issues no new block, lets
what it has in flight finish, gives every buffer back, and the first failure is raised as is
(a Ctrl-C on the calling thread does the same). Outputs are committed only when every engine
succeeded. Reductions fold the blocks' partials in global block order (``fold.Fold``),
so the result is bitwise the one device's.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from conveyor import config, interrupts
from conveyor.backends.base import Device, Kernel
from conveyor.closing import finish_uninterrupted, join
from conveyor.errors import BackendError, CompileError, InputError, OutOfMemoryError
from conveyor.interrupts import deferred_sigint, start_thread
from conveyor.memory import hostmem, numa
from conveyor.pipeline import chunks, image, overlap, paths, resident, validate
from conveyor.pipeline.chain import Chain, Link
from conveyor.pipeline.chunks import IterSource
from conveyor.pipeline.engine import Compute, Engine
from conveyor.pipeline.io import ArraySource, FileSource, Source
from conveyor.pipeline.merged import merge_reports
from conveyor.pipeline.options import StreamOptions
from conveyor.pipeline.plan import Plan, make_plan
from conveyor.pipeline.progress import Progress
from conveyor.pipeline.reduce import Reduction
from conveyor.pipeline.report import Report
from conveyor.pipeline.sinks import Sink, commit_all
from conveyor.pipeline.stage import default_workers
from conveyor.pipeline.supply import SCHEDULES, Supply


def kernel_for(compute: Compute, device: Device) -> Compute:
    """``compute`` for ``device``: a Kernel (or a KernelFuture's) built for another device is
    built for this one from its source, through the kernel cache; a callable is called as it
    is."""
    from conveyor.kernels.build import KernelFuture

    if isinstance(compute, KernelFuture):
        compute = compute.result()
    if not isinstance(compute, Kernel) or compute.device is device:
        return compute
    if compute.source is None:
        raise InputError(f"kernel {compute.name!r} was built for {compute.device.spec} and "
                         f"its source is unknown: compile it with device.compile(source, "
                         f"name) so that it can be built for {device.spec}")
    if compute.headers is not None:
        from conveyor.kernels.build import CHANGED_WHILE_BUILT, kernel_headers

        now = kernel_headers(compute.device, compute.options, compute.source)
        if compute.headers == CHANGED_WHILE_BUILT:
            raise InputError(
                f"kernel {compute.name!r} was built for {compute.device.spec} while a header "
                f"it includes changed, so which version it holds is unknown: compile the "
                f"kernel again so that every device runs the same code")
        if now != compute.headers:
            # A header edited (or the current folder changed) since: the other devices would
            # build what it holds now, and half the rows would come from other code.
            if _forced(compute.headers) != _forced(now):
                what = (f"{config.PYOPENCL_BUILD_OPTIONS_VAR}={_forced(compute.headers)!r}, "
                        f"which is {_forced(now)!r} now")
            else:
                changed = next((then for then, new in zip(compute.headers, now, strict=False)
                                if then != new), (compute.headers or now)[-1])
                what = (f"header {changed[1] or changed[0]}, which has changed since (edited, "
                        f"or the current folder changed)")
            raise InputError(
                f"kernel {compute.name!r} was built for {compute.device.spec} with {what}: "
                f"{device.spec} would build other code; compile the kernel again so that "
                f"every device runs the same code")
    try:
        return device.compile(compute.source, compute.name, compute.options)
    except CompileError as exc:
        # "opencl:all" may take in a device that builds nothing (a CPU OpenCL too old for its
        # CPU): say which spec failed and how to leave it out.
        exc.add_note(f"conveyor: building kernel {compute.name!r} for {device.spec}, one of "
                     f"several devices; to leave it out, name the devices to use, e.g. "
                     f"device=[{compute.device.spec!r}, ...]")
        raise


def _forced(headers: Sequence[tuple[str, str, str]]) -> str:
    """The ``PYOPENCL_BUILD_OPTIONS`` words a header state was read under ("" for none)."""
    return next((words for name, path, words in headers
                 if name == config.PYOPENCL_BUILD_OPTIONS_VAR and not path), "")


def check_devices(devices: Sequence[Device], schedule: str) -> None:
    """InputError for a device named twice (``schedule`` is checked by ``stream``)."""
    assert schedule in SCHEDULES
    for i, dev in enumerate(devices):
        if any(other is dev for other in devices[:i]):
            raise InputError(f"device {dev.spec} is listed twice: name each device once")


def _check_sources(sources: list[Source]) -> list[Source]:
    """Sources several engines can read at once: arrays and files as they are; other
    sources (Parquet, Arrow) behind a lock, one reader at a time; an iterable refused."""
    checked: list[Source] = []
    for source in sources:
        if isinstance(source, IterSource):
            raise InputError(f"{source.name} is read once, in order, and several devices "
                             f"read their blocks at once: pass an array or a file, or "
                             f"stream on one device")
        if isinstance(source, ArraySource | FileSource):
            checked.append(source)
        else:
            checked.append(_OneReader(source))
    return checked


class _OneReader(Source):
    """A source that keeps state between reads (decoded chunks), read by one engine at a
    time."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.shape = source.shape
        self.dtype = source.dtype
        self.name = source.name
        self.beside = source.beside
        self._lock = threading.Lock()

    def rows(self, lo: int, hi: int) -> Any:
        with self._lock:
            return self.source.rows(lo, hi)


class _Homes:
    """The cv.resident handles of a stream over several devices. Each stays on its own device
    (an unbound one is bound to the first device), held there for the whole stream (not
    evicted, not refreshed) where that device streams; every other device gets a copy of the
    table as that device holds it. So every block sees one table: a read-only table changed
    on the host without refresh() was the old table on its device and the new one on the
    others (a mix of both answers)."""

    def __init__(self, devices: Sequence[Device]) -> None:
        self.devices = devices
        self._copies: dict[int, tuple[Device, np.ndarray]] = {}
        self._held: list[resident.Resident] = []

    def arg(self, handle: resident.Resident, device: Device) -> Any:
        """What the engine on ``device`` passes for ``handle``: the handle on its own device,
        elsewhere its table (uploaded as a copy made for the stream)."""
        if id(handle) not in self._copies:
            home = handle.home(self.devices[0])  # InputError once closed
            fresh = handle.buffer is None  # uploaded from the host's table now
            if any(home is dev for dev in self.devices):
                queue = home.create_queue()
                try:
                    handle.use(home, queue)  # bound, uploaded, held: one table all stream
                    self._held.append(handle)
                    queue.finish()
                finally:
                    queue.close()
            table = handle.current() if fresh else handle.host_copy()
            self._copies[id(handle)] = (home, table)
        home, table = self._copies[id(handle)]
        return handle if home is device else table

    def release(self) -> None:
        """The stream is over: let go of the handles held."""
        held, self._held = self._held, []
        for handle in held:
            handle.done()


def _args_for(args: Sequence[Any], device: Device, homes: _Homes, where: str = ""
              ) -> list[Any]:
    """``args`` for the engine on ``device``: a cv.resident handle of another device becomes
    its table (``_Homes``; uploaded to this one as a copy made for the stream); a writable one
    is refused (each device would write its own copy). ``where`` names a chain's link."""
    values = list(args)
    for index, value in enumerate(values):
        if isinstance(value, resident.Resident):
            if value.writable:
                raise InputError(f"{where}args[{index}] is cv.resident(writable=True): with "
                                 f"several devices each would write its own copy; stream on "
                                 f"one device, or pass a read-only table")
            values[index] = homes.arg(value, device)
    return values


def _residents(kernel: Compute, device: Device, first: int, args: tuple[Any, ...],
               homes: _Homes) -> resident.ResidentArgs | None:
    """The resident arrays of ``args`` for the engine on ``device``: a cv.resident handle
    bound to another device is uploaded to this one as a copy made for the stream."""
    if not isinstance(kernel, Kernel):
        return None
    bound = resident.bind(kernel, first, _args_for(args, device, homes))
    if bound.device_arrays:
        raise InputError("a device array in args= lives on one device: with several devices "
                         "pass a NumPy array or cv.resident(array), uploaded to each")
    return bound


def stream_several(compute: Compute | Chain, sources: list[Source], sinks: list[Sink],
                   devices: list[Device], opts: StreamOptions, schedule: str) -> Report:
    """``cv.stream`` over several devices: check, plan once for all, run, commit the sinks."""
    homes = _Homes(devices)
    try:
        return _several(compute, sources, sinks, devices, opts, schedule, homes)
    finally:
        homes.release()


def _several(compute: Compute | Chain, sources: list[Source], sinks: list[Sink],
             devices: list[Device], opts: StreamOptions, schedule: str, homes: _Homes
             ) -> Report:
    reduce, element = opts.reduce, None
    if image.indices(sources):
        raise InputError("image inputs (cv.image) stream on one device: each device has its "
                         "own image formats and limits; pass one device")
    sources = _check_sources(sources)
    if isinstance(compute, Chain):
        return _chain_several(compute, sources, sinks, devices, opts, schedule, homes)
    kernels = [kernel_for(compute, dev) for dev in devices]
    first_kernel = kernels[0]
    if isinstance(first_kernel, Kernel):
        if reduce is not None and sinks:
            raise InputError(
                "with reduce= and a kernel, pass no outputs: the kernel's one output buffer "
                "holds per-element values that conveyor folds on the device")
        chunks.adopt_types(sources, first_kernel)
        elements = []
        for kernel, dev in zip(kernels, devices, strict=True):
            assert isinstance(kernel, Kernel)
            try:
                elements.append(validate.check_kernel(kernel, dev, sources, sinks, opts.args,
                                                      reduce))
            except InputError as exc:  # the source may build otherwise on another device
                if len(devices) > 1:
                    exc.add_note(f"conveyor: checking the kernel as built for {dev.spec}, one "
                                 f"of several devices")
                raise
        element = _one_element(elements, devices)
        validate.guard_bools(sources, validate.bool_inputs(first_kernel.params, sources))
    elif not callable(first_kernel):
        raise InputError(f"compute must be a Kernel (device.compile) or a callable, "
                         f"got {type(first_kernel).__name__}")
    else:  # a callable: a writable resident in its args would never be copied back
        resident.refuse_in_callable_args(opts.args, "the callable's")
    first = sources[0]
    reduction = Reduction.make(reduce, element, first.dtype,
                               int(np.prod(first.shape, dtype=np.int64)),
                               with_kernel=isinstance(first_kernel, Kernel))
    buffers = len(sources) + len(sinks) + (1 if reduce is not None else 0)
    residents = [_residents(k, d, buffers, opts.args, homes)
                 for k, d in zip(kernels, devices, strict=True)]
    return _plan_and_run(kernels, sources, sinks, devices, opts, schedule, reduction,
                         residents, make_plan)


def _chain_several(chain: Chain, sources: list[Source], sinks: list[Sink],
                   devices: list[Device], opts: StreamOptions, schedule: str, homes: _Homes
                   ) -> Report:
    """A chain over several devices: its kernel links built and its checks made for each
    device, its temps counted in the one plan."""
    bound = [_chain_for(chain, dev, homes).bind(dev, sources, sinks, opts.args, opts.reduce)
             for dev in devices]
    for link in getattr(bound[0], "links", ()):
        if getattr(getattr(link, "residents", None), "device_arrays", None):
            # As for one kernel (_residents): one device's pointer would reach the others.
            raise InputError(f"{link.where()}: a device array in args= lives on one device: "
                             f"with several devices pass a NumPy array or "
                             f"cv.resident(array), uploaded to each")
    validate.guard_bools(sources, bound[0].bool_inputs())
    first = sources[0]
    _one_element([b.element for b in bound], devices)
    reduction = Reduction.make(opts.reduce, bound[0].element, first.dtype,
                               int(np.prod(first.shape, dtype=np.int64)),
                               with_kernel=bound[0].element is not None)
    return _plan_and_run(bound, sources, sinks, devices, opts, schedule, reduction,
                         [b.residents for b in bound], bound[0].make_plan)


def _one_element(elements: Sequence[Any], devices: Sequence[Device]) -> Any:
    """The per-element type a reduction folds, the same on every device; InputError where
    the kernel, built for each device, writes another (a type its source chooses by a
    compiler's macro): each device's partials were folded as the last one's type, a wrong
    total with no error."""
    kinds = {np.dtype(e) for e in elements if e is not None}
    if len(kinds) > 1:
        each = ", ".join(f"{dev.spec} {np.dtype(e)}" for dev, e in
                         zip(devices, elements, strict=True) if e is not None)
        raise InputError(f"the kernel's per-element values have another type on each device "
                         f"({each}): its source chooses the type by a macro of each "
                         f"device's compiler; declare one type, or stream on one device")
    return elements[0] if elements else None


def chain_kernels_for(chain: Chain, device: Device) -> Chain:
    """``chain`` with its kernel links built for ``device`` (kernel_for) and their read-only
    resident args of another device as tables (``tables_of_others``): for a stream on one
    device named as a list (the rest of its resident args are bound as on one device)."""
    links: list[Any] = []
    for item in chain.links:
        if isinstance(item, Link):
            compute = kernel_for(item.compute, device)
            args = tables_of_others(item.args, device) if isinstance(compute, Kernel) \
                else item.args  # a callable link gets its args as given
            links.append(replace(item, compute=compute, args=args))
        else:
            links.append(kernel_for(item, device))
    made = copy.copy(chain)
    made.links = links
    return made


def tables_of_others(args: Sequence[Any], device: Device) -> tuple[Any, ...]:
    """``args`` for a kernel streamed on ``device`` alone, the device named as a list (code
    that streams over ``devices[:k]``, for k = 1): a read-only cv.resident handle that lives
    on another device becomes its table as that device holds it, uploaded for the stream, as
    over several devices (``_Homes``); everything else as given (a writable one of another
    device is still refused: its writes would go to a copy)."""
    values = list(args)
    for index, value in enumerate(values):
        if isinstance(value, resident.Resident) and not value.writable and \
                not value.closed and value.device is not None and value.device is not device:
            values[index] = value.current() if value.buffer is None else value.host_copy()
    return tuple(values)


def _chain_for(chain: Chain, device: Device, homes: _Homes) -> Chain:
    """``chain`` with its kernel links built for ``device`` (kernel_for) and their resident
    args for it (as for a single kernel's args: see ``_args_for``)."""
    links: list[Any] = []
    for number, item in enumerate(chain.links):
        if isinstance(item, Link):
            compute = kernel_for(item.compute, device)
            # A callable link gets its args as given, the handle on every device (as a plain
            # callable over several devices does): only a kernel's are device tables.
            where = f"link {number} ({item.name or getattr(compute, 'name', '?')!r}): "
            args = (tuple(_args_for(item.args, device, homes, where))
                    if isinstance(compute, Kernel) else item.args)
            links.append(replace(item, compute=compute, args=args))
        else:
            links.append(kernel_for(item, device))
    made = copy.copy(chain)
    made.links = links
    return made


def _plan_and_run(kernels: Sequence[Any], sources: list[Source], sinks: list[Sink],
                  devices: list[Device], opts: StreamOptions, schedule: str,
                  reduction: Reduction | None, residents: Sequence[Any], planner: Any
                  ) -> Report:
    """Plan once for every device, run the engines, commit the sinks; the residents are
    released whatever happens."""
    first = sources[0]
    try:
        # One plan for every device (the smallest's memory): the same blocks everywhere, so
        # a reduction's partials do not depend on which device folded them.
        room = min((free for free in map(paths.pinned_room, devices) if free is not None),
                   default=None)
        plan = planner(
            tuple(validate.spec(a) for a in sources),
            tuple(validate.spec(a) for a in sinks),
            depth=opts.depth, block_bytes=opts.block_bytes, memory_limit=opts.memory_limit,
            halo=opts.halo,
            global_mem_bytes=min(d.global_mem_bytes for d in devices),
            max_alloc_bytes=min(d.max_alloc_bytes for d in devices),
            pool_limit=min((d.memory_pool.limit for d in devices
                            if d.memory_pool.limit is not None), default=None),
            pinned_limit=room,
            # an array counts as staged where any device stages it (zero-copy: none); asked
            # of the drivers only where a limit is set
            staged=None if room is None else _staged_anywhere(devices, sources, sinks,
                                                              opts.zero_copy),
            **(reduction.scratch_sizes(validate.spec(first).row_items) if reduction else {}),
            resident_bytes=max((r.nbytes for r in residents if r is not None), default=0),
            **_constant_cap(kernels, devices, sources, opts.halo, residents),
        )
        from conveyor.pipeline.stream import open_sinks

        empty = open_sinks(sinks, plan, reduction, ",".join(d.spec for d in devices),
                           opts.depth)
        if empty is not None:  # no rows: one report per device all the same, as promised
            return replace(empty, imbalance=0.0, devices=[
                Report(device=d.spec, device_name=d.name, depth=empty.depth, rows=empty.rows,
                       block_rows=empty.block_rows) for d in devices])
        report = run(kernels, sources, sinks, devices, opts, plan, reduction, schedule,
                     residents)
    finally:
        for bound in residents:
            if bound is not None:
                bound.release()  # closes the copies made for the stream (twice is fine)
    commit_all(sinks)
    return report


def run(kernels: Sequence[Compute], sources: list[Source], sinks: list[Sink],
        devices: list[Device], opts: StreamOptions, plan: Plan, reduction: Reduction | None,
        schedule: str, residents: Sequence[resident.ResidentArgs | None]) -> Report:
    """Run a planned stream over ``devices`` with ``kernels`` (one per device; see the
    module); the sinks are open, and committed by the caller."""
    from conveyor.pipeline.stream import _zero_copy, check_host_memory

    pairs = overlap.in_place_pairs(sources, sinks)
    in_place = frozenset(i for i, _ in pairs)
    if in_place and plan.halo:
        # One device reads block k's halo rows after before block k + 1 writes them; another
        # device may write them first.
        raise InputError(f"an input that is also an output, with halo={plan.halo}, on several "
                         f"devices: a device could read halo rows that another has already "
                         f"overwritten; write into another array, or stream on one device")
    for dev in devices:  # each device has a ring of its own
        check_host_memory(plan, dev)
    check_host_memory_of_all(plan, devices)
    supply = Supply(plan, len(devices), schedule)
    total_workers = opts.workers or default_workers()
    workers = max(1, total_workers // len(devices))  # the host's threads, shared fairly
    progress = Progress(opts.progress, plan)
    # No engine starts its first block before every engine is built (a failed build then
    # stops the others before they write anything).
    barrier = threading.Barrier(len(devices))
    engines: list[Engine] = []
    try:
        for index, (kernel, dev) in enumerate(zip(kernels, devices, strict=True)):
            own = replace(opts, workers=workers, progress=False, zero_copy=_zero_copy(
                opts.zero_copy, dev, opts.halo, sources, sinks, plan, kernel, pairs))
            engines.append(Engine(
                dev, plan, kernel, sources, sinks, own,
                reduction=_fresh(reduction),
                in_place=in_place, residents=residents[index],
                blocks=supply.feed(index), progress=progress,
                started=functools.partial(_wait, barrier)))
        started = time.perf_counter()
        reports = _run_engines(engines, supply, barrier)
        seconds = time.perf_counter() - started
    except BaseException:
        for engine in engines:
            engine.stager.close()  # an engine that never ran: its workers
        raise
    finally:
        progress.close()
    feeds = [e.blocks for e in engines]
    return merge_reports(reports, engines, feeds, plan, sources, sinks, seconds,
                         result=reduction.result() if reduction is not None else None)


def _run_engines(engines: list[Engine], supply: Supply,
                 barrier: threading.Barrier) -> list[Report]:
    """Run every engine on its own thread; the first failure stops them all and is raised
    once every engine has finished and given its buffers back. Under one deferral of
    Ctrl-C, as a single engine runs (interrupts.py): one raised just after ``done``'s
    ``__enter__`` took its lock would leave it held, and every engine thread waiting for it
    in its ``finally``."""
    with deferred_sigint():
        return _run_engines_held(engines, supply, barrier)


def _run_engines_held(engines: list[Engine], supply: Supply,
                      barrier: threading.Barrier) -> list[Report]:
    reports: list[Report | None] = [None] * len(engines)
    failures: list[BaseException] = []
    done = threading.Condition()
    running = [0]

    def main(index: int) -> None:
        try:
            numa.bind_thread(engines[index].device.host_place)  # a thread of its own
            reports[index] = engines[index].run()
        except BaseException as exc:  # handed to the calling thread, which raises it
            if isinstance(exc, OutOfMemoryError | BackendError) and len(engines) > 1:
                # Out of memory, a device's failure: say whose (a pool limit set on one).
                exc.add_note(f"conveyor: on {engines[index].device.spec}, one of "
                             f"{len(engines)} devices")
            with done:
                failures.append(exc)
            supply.stop()
            barrier.abort()
        finally:
            with done:
                running[0] -= 1
                done.notify_all()

    def wait_all() -> None:
        with done:
            while running[0]:
                interrupts.wait(done)  # a held Ctrl-C is raised here

    # Each in a copy of the stream's context, as on one device (where the engine runs on the
    # calling thread): a stream a callable starts there is inside this one (resident.claim),
    # and a callable sees its caller's context variables.
    threads = [threading.Thread(target=contextvars.copy_context().run, args=(main, i),
                                name=f"conveyor-device-{i}", daemon=True)
               for i in range(len(engines))]
    interrupted: BaseException | None = None
    try:
        for thread in threads:
            with done:
                running[0] += 1
            try:
                start_thread(thread)
            except BaseException:
                with done:
                    running[0] -= 1
                raise
        # Waiting on a condition, not in Thread.join: a Ctrl-C that lands in a join can
        # leave the thread listed for ever (Python 3.11).
        wait_all()
    except BaseException as exc:  # Ctrl-C, or a thread that would not start: stop every
        interrupted = exc  # engine, let each drain and give its buffers back, then raise it
        supply.stop()
        barrier.abort()
    finish_uninterrupted(wait_all)
    for thread in threads:
        if thread.ident is not None:
            join(thread)
    if interrupted is not None:
        raise interrupted
    if failures:
        real = [f for f in failures if not isinstance(f, threading.BrokenBarrierError)]
        raise (real or failures)[0]
    return [r for r in reports if r is not None]


def _staged_anywhere(devices: Sequence[Device], sources: list[Source], sinks: list[Sink],
                     zero_copy: bool | None) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """``paths.staged_marks`` over several devices: an array is staged where any device
    stages it (a 256 KiB pinned limit cut a zero-copy stream over two devices to 695
    blocks, where one device ran it in one)."""
    marks = [paths.staged_marks(dev, sources, sinks, zero_copy) for dev in devices]
    return (tuple(map(any, zip(*(m[0] for m in marks), strict=True))),
            tuple(map(any, zip(*(m[1] for m in marks), strict=True))))


def check_host_memory_of_all(plan: Plan, devices: Sequence[Device]) -> None:
    """InputError when the rings of every device together would hold more memory than the
    host has (``stream.check_host_memory`` checks one device's ring; each engine holds its
    own ring, staging ring and pad rows at once, so a stream over several devices holds their
    sum). The same measure as that check: ``hostmem.total()``, not what is free now."""
    held = [plan.host_bytes(dev.host_unified) for dev in devices]
    needed = sum(held)
    host = hostmem.total()
    if host is None or needed <= host:
        return
    each = ", ".join(f"{dev.spec} {part}" for dev, part in zip(devices, held, strict=True))
    advice = "a smaller block_bytes or depth"
    if plan.halo:
        advice += f", a smaller halo (halo={plan.halo})"
    raise InputError(
        f"this stream over {len(devices)} devices would hold about {needed} bytes of host "
        f"memory (each device's pinned staging ring, and its device buffers where the device "
        f"keeps them in host memory: {each}), more than the host's {host}: use {advice}, or "
        f"fewer devices")


def _constant_cap(kernels: Sequence[Any], devices: Sequence[Device], sources: list[Source],
                  halo: int, residents: Sequence[Any]) -> dict[str, Any]:
    """make_plan's ``max_block_rows`` where ``__constant`` inputs must fit the smallest
    constant buffer of the devices (constant.constant_rows), else nothing."""
    from conveyor.pipeline.constant import constant_rows

    caps = [constant_rows(k, d, sources, halo, None, r)[0]
            for k, d, r in zip(kernels, devices, residents, strict=True)]
    rows = min((c for c in caps if c is not None), default=None)
    return {} if rows is None else {"max_block_rows": rows, "block_cap": "constant"}


def _wait(barrier: threading.Barrier) -> None:
    barrier.wait()


def _fresh(reduction: Reduction | None) -> Reduction | None:
    """An engine's own copy of ``reduction``: its fold kernel (built for its device), adding
    its partials to the stream's one fold, in global block order (``Reduction.share``: no
    result of its own)."""
    if reduction is None:
        return None
    own = copy.copy(reduction)  # its fold is the stream's own: every engine adds to it
    own.kernel = None
    own.share = True
    return own
