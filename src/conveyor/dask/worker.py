"""What the client sends to Dask workers, and what each worker keeps between tasks.

The client never touches a device: it turns what the user passed (a compiled Kernel, a
KernelFuture, :func:`kernel`, or a Python callable) into a :class:`Job`, which holds only the
kernel's source text, name and build options, the device spec and the stream options, and
pickles small. On the worker, :func:`resolve` finds the device (``cv.device``: one per process,
so its memory pools stay warm from one task to the next) and builds the kernel once per worker
process (the device's in-process memo; the disk cache makes even the first build a load on
every worker after the first). Dask's default nanny workers start by spawn, so no driver
state crosses a fork (the OpenCL backend refuses use after a fork anyway).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from conveyor.containers import slot_members
from conveyor.dask import held
from conveyor.errors import CompileError, InputError


@dataclass(frozen=True)
class KernelSpec:
    """A kernel as text: what a worker needs to build it (see :func:`kernel`)."""

    source: str
    name: str
    options: tuple[str, ...] = ()

    def output_dtype(self, inputs: int, index: int = 0) -> np.dtype | None:
        """The element type of the kernel's output parameter ``index`` (the one after
        ``inputs`` inputs and ``index`` outputs), read on the client (no device) from the
        source with its macros expanded (the options' ``-D`` too, as the compiler sees them:
        a ``#define``d type was read as its name, and input 0's dtype was used instead, which
        every chunk then refused), or None."""
        params = self.params()
        at = inputs + index
        if at < len(params) and params[at].is_pointer:
            if params[at].dtype is None:  # a struct: its records, where conveyor lays it out
                return self._records(params[at].struct_name)
            return params[at].dtype
        return None

    def _records(self, struct: str) -> np.dtype | None:
        """The dtype of records of ``struct`` as this source defines it (None where
        conveyor cannot lay it out, or the source packs structs)."""
        from conveyor.kernels.preprocess import expand_checked
        from conveyor.kernels.signature import code_only
        from conveyor.pipeline.structs import c_dtype, packs

        code = code_only(expand_checked(self.source, self.options)[0])
        return None if packs(code) else c_dtype(code, struct)

    def params(self, strict: bool = False) -> list[Any]:
        """The kernel's parameters, read on the client as :meth:`output_dtype` reads them.
        Not found in the expanded text, they are read from the raw text, unless ``strict``
        (:func:`kernel`: a kernel inside ``#if 0`` was taken, and every chunk failed)."""
        from conveyor.kernels.preprocess import expand_checked
        from conveyor.kernels.signature import parse_params

        text, expanded = expand_checked(self.source, self.options)
        try:
            return list(parse_params(text, self.name))
        except InputError:
            if not expanded or strict:
                raise
            return list(parse_params(self.source, self.name))

    def check_count(self, inputs: int, args: Sequence[Any], call: str,
                    outputs: int | None = None) -> None:
        """InputError on the client when the kernel does not take ``inputs`` inputs, the one
        output (or per-element buffer) that ``call`` passes (``outputs`` where the call
        takes them as given), the ``args``, offset and n, or when an array in ``args`` is
        bound to a pointer the kernel may write (no worker can copy that back): otherwise
        every chunk failed on its worker with a traceback each."""
        params = self.params()
        first = inputs + (1 if outputs is None else outputs)
        expected = first + len(args) + 2
        if len(params) != expected:
            buffers = (f"one output buffer ({call} makes one: split a kernel that writes "
                       f"more)" if outputs is None else f"{outputs} output buffers")
            raise InputError(
                f"kernel {self.name!r} takes {len(params)} parameters; {call} passes "
                f"{expected}: {inputs} inputs, {buffers}, {len(args)} args, then offset and n")
        for index, (param, value) in enumerate(zip(params[first:], args, strict=False)):
            if param.is_pointer and param.address == "local":
                raise InputError(
                    f"args[{index}] (kernel parameter {param.name!r}, {param.type_text}) is "
                    f"__local memory, which conveyor does not pass (a launch's arguments are "
                    f"buffers and scalars): declare a fixed-size __local array inside the "
                    f"kernel instead (e.g. __local float tile[256];)")
            if param.is_pointer and not (param.is_const or param.address == "constant") \
                    and not np.isscalar(value) and np.ndim(value) > 0:
                raise InputError(
                    f"args[{index}] (kernel parameter {param.name!r}, {param.type_text}) is "
                    f"not const, so the kernel may write the array it receives, which no "
                    f"Dask worker can copy back into this process's array: declare it const "
                    f"(__global const / __constant), or stream it with cv.stream and "
                    f"cv.resident(array, writable=True)")


def kernel(source: str, name: str, options: Sequence[str] = ()) -> KernelSpec:
    """Kernel ``name`` of ``source`` (built with ``options``), built on each worker the first
    time a task needs it and kept there: the client compiles nothing. InputError now when
    ``source`` has no kernel ``name``."""
    from conveyor.backends.base import _build_options

    spec = KernelSpec(source, name, _build_options(source, name, options,
                                                   "conveyor.dask.kernel()"))
    spec.params(strict=True)  # read as the compiler reads it: macros, -D options expanded
    return spec


@dataclass(frozen=True)
class Job:
    """One stream's recipe, as sent to workers: nothing in it holds a device."""

    compute: KernelSpec | Callable[..., Any]
    device: str | None
    args: tuple[Any, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)


def as_job(compute: Any, device: Any, args: Sequence[Any], options: dict[str, Any]) -> Job:
    """What the client sends for ``compute`` on ``device``: a Kernel (or KernelFuture) becomes
    its source, name and options (and its device's spec, unless ``device`` is given); a
    KernelSpec or a callable is sent as is. InputError for anything else."""
    from conveyor.backends.base import Device, Kernel
    from conveyor.kernels.build import KernelFuture
    from conveyor.pipeline.options import StreamOptions, flag

    spec: str | None
    if device is None or isinstance(device, str):
        spec = device
    elif isinstance(device, Device):
        spec = device.spec
    else:
        raise InputError(f"device={device!r}: pass a spec string like 'opencl:0:0' or 'cuda' "
                         f"(each worker opens its own device)")
    if spec is not None and ("," in spec or spec.strip().lower() == "all"
                             or spec.strip().lower().endswith(":all")):
        # Each worker opens one device (cv.device): every chunk failed on the workers with
        # "no device matches 'opencl:all'", a spec cv.stream takes.
        raise InputError(f"device={spec!r} names several devices, and each Dask worker "
                         f"streams on one: give one spec (e.g. 'opencl:0:0', 'cuda'), and "
                         f"one worker per device for several (dask-cuda's LocalCUDACluster)")
    what: KernelSpec | Callable[..., Any]
    if isinstance(compute, KernelSpec):
        what = compute
    elif isinstance(compute, Kernel | KernelFuture):
        if compute.source is None:
            raise InputError(f"kernel {compute.name!r} does not know its source: compile it "
                             f"with device.compile(source, name), or pass "
                             f"conveyor.dask.kernel(source, name)")
        what = KernelSpec(compute.source, compute.name, tuple(compute.options))
        spec = spec if spec is not None else compute.device.spec
    elif callable(compute):
        held.refuse_held(compute)
        what = compute
    elif type(compute).__name__ == "Chain":  # not imported: the client loads no engine
        raise InputError("conveyor.dask runs one kernel or callable per chunk; a chain "
                         "(cv.chain) does not go to Dask workers yet: stream it with "
                         "cv.stream, or pass its links' work as one kernel or callable")
    else:
        raise InputError(f"compute must be a Kernel, conveyor.dask.kernel(source, name) or a "
                         f"callable, got {type(compute).__name__}")
    parsed = StreamOptions.parse(args=args, **{k: v for k, v in options.items()
                                               if k in ("depth", "block_bytes",
                                                        "memory_limit", "workers")})
    kept = {"depth": parsed.depth, "block_bytes": parsed.block_bytes,
            "memory_limit": parsed.memory_limit, "workers": parsed.workers,
            # Checked here, on the client: refused on every worker, a file stream had made
            # its part files first (zero_copy=None means "decide", as in cv.stream).
            **{k: (v if v is None and k == "zero_copy" else flag(k, v))
               for k, v in options.items() if k in ("strict", "zero_copy")}}
    return Job(what, spec, _tables(parsed.args), kept)


def check_op(job: Job, op: Any, name: str) -> Any:
    """``op`` as the fold takes it (``sum``, ``np.max``... as their names); InputError on the
    client for a fold the workers would refuse (``name`` is the parameter: ``op`` of reduce,
    ``reduce`` of stream): every range failed there instead."""
    from conveyor.pipeline.options import reduce_op

    op = reduce_op(op)
    if not callable(op) and op not in ("sum", "min", "max"):
        raise InputError(f"{name}={op!r}: use 'sum', 'min', 'max' or a function f(a, b)")
    if isinstance(job.compute, KernelSpec) and callable(op):
        raise InputError(f"with a kernel, {name} is 'sum', 'min' or 'max' (a function f(a, b) "
                         f"needs a callable compute that returns each block's partial)")
    return op


def _tables(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` as they travel to workers: a cv.resident handle (a device buffer and locks of
    this process, which Dask failed to pickle: "Could not serialize object") becomes its
    table, as its device holds it, which each chunk's stream uploads; a writable one is
    refused (it is copied back into this process's array)."""
    values = list(args)
    for index, value in enumerate(values):
        if held.device_array(value):
            # Dask failed to pickle it ("Could not serialize object", a CommandQueue inside).
            raise InputError(f"args[{index}] is a device array of this process, which "
                             f"cannot travel to Dask workers: pass a NumPy array (a.get()) "
                             f"or a read-only cv.resident, which each worker uploads")
        if not held.is_resident(value):
            held.refuse_value(value, f"args[{index}] is ")
            continue
        if value.writable:
            raise InputError(f"args[{index}] is cv.resident(writable=True), which is copied "
                             f"back into this process's array after a stream: Dask workers "
                             f"cannot; stream it with cv.stream, or pass a read-only table")
        if value.closed:
            raise InputError("this resident array was closed: make a new cv.resident(...)")
        values[index] = value.host_copy()
    return tuple(values)


def resolve(job: Job) -> tuple[Any, Any]:
    """(device, compute) on this worker: the device ``job`` names and its kernel, built the
    first time this process needs it and kept by the device's memo (kernels/build.py), whose
    key covers the contents of included headers: a worker's own memo keyed by the source
    text kept a kernel built against a header since edited (wrong values, no error)."""
    import conveyor as cv

    dev = cv.device(job.device, warm_up=False)  # it streams at once: nothing to overlap
    if not isinstance(job.compute, KernelSpec):
        return dev, job.compute
    spec = job.compute
    return dev, dev.compile(spec.source, spec.name, spec.options)


def warm(compute: Any, *, client: Any = None, device: Any = None) -> dict[str, str]:
    """Build ``compute`` (a Kernel or :func:`kernel`) on every worker of ``client``'s
    cluster now, before the first task (or a timed run) needs it; {worker address: device
    spec}. A worker that joins later builds it on its first task. Compile errors are raised
    as in a task."""
    from conveyor.dask.files import _client

    job = as_job(compute, device, (), {})
    if not isinstance(job.compute, KernelSpec):
        raise InputError("warm() builds kernels: a callable has nothing to build")
    result: dict[str, str] = _client(client).run(_warm_here, job)
    return result


def _warm_here(job: Job, dask_worker: Any = None) -> str:
    """Build ``job``'s kernel on this worker (``client.run`` passes the worker as
    ``dask_worker``: ``get_worker()`` does not answer inside it)."""
    assert isinstance(job.compute, KernelSpec)
    try:
        dev, _ = resolve(job)
    except BaseException as exc:
        failure = _an_exception(exc)
        failure.add_note(f"conveyor.dask: building kernel {job.compute.name!r}, on worker "
                         f"{worker_name(dask_worker)}")
        failure = _ready_to_travel(failure)
    else:
        return str(dev.spec)
    raise failure  # outside the handler: no __context__ (Dask pickles it, with tblib)


def cached_kernels() -> int:
    """How many kernels this process keeps built (tests ask workers this)."""
    from conveyor.kernels.build import memo_count

    return memo_count()


def run(job: Job, inputs: list[Any], outputs: list[Any], *, first_row: int, where: str,
        halo: int = 0, boundary: Any = "nearest", reduce: Any = None,
        defaulted: dict[int, str] | None = None) -> Any:
    """One ``cv.stream`` of ``job`` on this worker; the Report. A failure is raised as is,
    with a note naming ``where`` (the chunk and its rows) and this worker. ``defaulted``:
    the outputs conveyor.dask made itself, of a dtype read on the client from the kernel's
    source or asked for by ``dtype=``, each with why it may differ and what to pass instead
    (:func:`_check_defaulted`)."""
    import conveyor as cv

    try:
        dev, compute = resolve(job)
        if defaulted and isinstance(job.compute, KernelSpec):
            _check_defaulted(compute, len(inputs), outputs, defaulted)
        return cv.stream(compute, inputs, outputs, device=dev, halo=halo, boundary=boundary,
                         reduce=reduce, args=job.args, first_row=first_row, **job.options)
    except BaseException as exc:
        failure = _an_exception(exc)
        failure.add_note(f"conveyor.dask: {where}, on worker {worker_name()}")
        failure = _ready_to_travel(failure)
    raise failure  # outside the handler: no __context__ (Dask pickles it, with tblib)


def _check_defaulted(kernel: Any, inputs: int, outputs: list[Any],
                     defaulted: dict[int, str]) -> None:
    """InputError when an output conveyor.dask made (of a dtype read on the client from the
    kernel's source with no device's macros, ``#ifdef __opencl_c_fp64``..., or given as
    ``dtype=``) is not the type the worker's build takes: each chunk was refused with advice
    to pass an array, which map_blocks makes itself."""
    for index, fix in defaulted.items():
        if inputs + index >= len(kernel.params) or index >= len(outputs):
            continue
        param = kernel.params[inputs + index]
        wanted = np.dtype(getattr(outputs[index], "dtype", outputs[index]))
        if param.is_pointer and param.dtype is not None and np.dtype(param.dtype) != wanted:
            raise InputError(
                f"output {index}: kernel {kernel.name!r} writes {param.type_text} "
                f"({np.dtype(param.dtype)}) on {kernel.device.spec}, "
                f"{fix.format(dtype=np.dtype(param.dtype), wanted=wanted)}")


def _an_exception(exc: BaseException) -> BaseException:
    """``exc``, or for a BaseException that is no Exception (a callable's own, raised on a
    worker thread, where no Ctrl-C lands) a RuntimeError naming it: Dask's worker cannot
    finish a task that raises one, and the client waited for ever. Either way one this task
    may add its notes to (:func:`_own_copy`)."""
    if isinstance(exc, Exception):
        return _own_copy(exc)
    wrapped = RuntimeError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")
    for note in getattr(exc, "__notes__", ()):
        wrapped.add_note(note)
    return wrapped


def _own_copy(exc: BaseException) -> BaseException:
    """A copy of ``exc`` for this task's notes: a failed build is one exception object in
    every task of the process that waited for it (kernels/build.py hands each the same), and
    each task's note went onto it (the error named two chunks on two workers). ``exc`` itself
    where it cannot be copied (an ``__init__`` that takes other arguments than it keeps)."""
    # Made through the exception's own reduce (what pickle uses: ImportError's name and path,
    # OSError's filename ride along), its state set attribute by attribute and its notes
    # given a list of their own (copy.copy's copy was seen sharing the original's notes).
    try:
        reduced: Any = exc.__reduce_ex__(2)
        try:
            made = reduced[0](*reduced[1])
        except Exception:  # an __init__ of other arguments than args (path, reason)
            # Made without it, then set up by the nearest built-in exception's own __init__
            # (OSError's errno and filename, UnicodeError's fields live there).
            made = type(exc).__new__(type(exc), *reduced[1])
            base = next(k for k in type(exc).__mro__ if k.__module__ == "builtins")
            base.__init__(made, *reduced[1])  # type: ignore[misc]
            made.args = exc.args
        state = reduced[2] if len(reduced) > 2 and isinstance(reduced[2], dict) else {}
        for key, value in state.items():
            if key != "__notes__":
                setattr(made, key, value)
        for key in ("name", "path", "obj"):  # members some types keep out of their reduce
            if hasattr(exc, key) and getattr(made, key, None) is not getattr(exc, key):
                setattr(made, key, getattr(exc, key))
        # Slot attributes (in no __dict__ and no reduce), a private __x as _Class__x.
        for member in slot_members(type(exc)):
            try:
                member.__set__(made, member.__get__(exc))
            except AttributeError:  # unset on exc: unset on the copy
                continue
        if type(made) is not type(exc) or str(made) != str(exc) or made.args != exc.args:
            return exc
    except Exception:
        return exc
    if hasattr(exc, "__notes__"):
        made.__notes__ = list(exc.__notes__)  # the copy's own list
    made.__cause__, made.__context__ = exc.__cause__, exc.__context__
    made.__suppress_context__ = exc.__suppress_context__
    return made.with_traceback(exc.__traceback__)


def _travel_light(exc: BaseException) -> None:
    """Make ``exc`` reach the client as itself: Dask pickles an exception with its chain
    (``__cause__``, ``__context__``), and a driver's own exception often cannot be pickled
    (PyOpenCL's errors hold an ``_ErrorRecord``), which would turn a CompileError into a bare
    Exception carrying its repr. The chain is cut and kept as notes (type and message)."""
    for attr in ("__cause__", "__context__"):
        link = getattr(exc, attr)
        if link is None or (attr == "__context__" and link is exc.__cause__):
            continue
        exc.add_note(f"caused by {type(link).__module__}.{type(link).__name__}: {link}")
    exc.__cause__ = exc.__context__ = None
    exc.__suppress_context__ = True


def _ready_to_travel(exc: BaseException) -> BaseException:
    """``exc`` as it can reach the client with its message and notes: its chain cut
    (:func:`_travel_light`), its text shortened under Dask's ``max-error-length`` (longer, Dask
    replaced it with "Long error message" and dropped the notes), and, for a driver
    library's own error that cannot be pickled (PyOpenCL's hold an ``_ErrorRecord``; Dask then
    sent a bare ``Exception`` of its repr, without the notes), a BackendError carrying its
    type, message and notes. (Told by its module, not by pickling it here: conveyor pickles
    nothing, tests/reliability/test_security.py.)"""
    _travel_light(exc)
    _fit_text(exc)
    if type(exc).__module__.split(".")[0] not in _UNPICKLABLE_MODULES:
        return exc
    from conveyor.errors import BackendError

    plain = BackendError(f"{type(exc).__module__}.{type(exc).__name__}: {exc}")
    for note in getattr(exc, "__notes__", ()):
        plain.add_note(note)
    plain.__traceback__ = exc.__traceback__  # where it was raised, for the client
    _fit_text(plain)
    return plain


#: Libraries whose exceptions do not survive a pickle (PyOpenCL's: an ``_ErrorRecord``).
_UNPICKLABLE_MODULES = frozenset({"pyopencl"})


def _fit_text(exc: BaseException) -> None:
    """Shorten ``exc``'s message (a CompileError's build log first) to Dask's
    ``distributed.admin.max-error-length``, saying how much was cut."""
    try:
        import dask

        limit = int(dask.config.get("distributed.admin.max-error-length", 10_000))
    except Exception:
        limit = 10_000
    over = len(str(exc)) - (limit - 100)  # room for the line that says what was cut
    if over <= 0:
        return
    if isinstance(exc, CompileError) and len(exc.log) > over:
        exc.log = f"{exc.log[:len(exc.log) - over]}\n... ({over} more characters of the log)"
        return
    for attr in ("message",):
        text = getattr(exc, attr, None)
        if isinstance(text, str) and len(text) > over:
            setattr(exc, attr, f"{text[:len(text) - over]} ... ({over} more characters)")
            return
    if len(exc.args) == 1 and isinstance(exc.args[0], str) and len(exc.args[0]) > over:
        text = exc.args[0]
        exc.args = (f"{text[:len(text) - over]} ... ({over} more characters)",)


def worker_name(worker: Any = None) -> str:
    """This Dask worker's name and address (or the process id outside a worker); ``worker``
    where the caller has it (``client.run`` passes it)."""
    try:
        from distributed import get_worker

        worker = worker if worker is not None else get_worker()
    except (ImportError, ValueError):
        return f"pid {os.getpid()}"
    return f"{worker.name} ({worker.address}, pid {os.getpid()})"
