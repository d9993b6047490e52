"""``conveyor.stream``: the public entry point of the engine."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from conveyor import config, files
from conveyor.backends.base import Device, Kernel
from conveyor.errors import InputError, note_outputs_written, releasing_locals
from conveyor.memory import hostmem
from conveyor.pipeline import chunks, image, overlap, paths, resident, validate
from conveyor.pipeline.chain import Chain
from conveyor.pipeline.chainbind import BoundChain
from conveyor.pipeline.chunks import IterSource
from conveyor.pipeline.constant import constant_rows
from conveyor.pipeline.engine import Compute, Engine
from conveyor.pipeline.io import ArraySource, FileSource, Source, as_source
from conveyor.pipeline.options import StreamOptions, as_inputs, as_outputs, flag
from conveyor.pipeline.plan import Plan, make_plan
from conveyor.pipeline.reduce import Reduction
from conveyor.pipeline.report import Report
from conveyor.pipeline.shaped import Shaped, ShapedSink
from conveyor.pipeline.sinks import ArraySink, FileSink, Sink, as_sink, commit_all
from conveyor.pipeline.step import check_offsets


@releasing_locals
def stream(
    compute: Compute | Chain,
    inputs: Sequence[Any],
    outputs: Sequence[Any] | None = None,
    *,
    device: Device | str | Sequence[Device | str] | None = None,
    depth: int = 3,
    block_bytes: int | str | None = None,
    memory_limit: int | str | None = None,
    halo: int = 0,
    reduce: str | Callable[[Any, Any], Any] | None = None,
    args: Sequence[Any] = (),
    progress: bool = False,
    trace: files.PathLike | None = None,
    zero_copy: bool | None = None,
    workers: int | None = None,
    strict: bool | None = None,
    warmup: bool = True,
    boundary: str | float = "nearest",
    first_row: int = 0,
    schedule: str = "dynamic",
    keep_pinned: bool = False,
) -> Report:
    """Stream ``inputs`` through ``compute`` block by block and fill ``outputs``.

    ``compute`` is a Kernel from ``device.compile`` (or the KernelFuture of
    ``compile(..., wait=False)``, loaded here before the first block), a Python callable, or
    a ``cv.chain(...)`` of them run in order on each block, with device-only temps between
    them (``conveyor.pipeline.chain``: each link takes its own args; the stream's ``args``
    stay empty).
    A kernel receives the block's buffers (inputs, then outputs), then ``args``, then
    ``ulong offset, ulong n``: the index of the block's first element in the whole array and
    the block's element count (for N-D arrays, elements of input 0: rows times elements per
    row). A kernel's parameter types are what its compiler reports (OpenCL) or its
    preprocessed source says, checked against the compiled argument sizes (CUDA); a pointer
    to a vector type (``float4*``) is refused, since ``n`` counts scalars. Each value of
    ``args`` is cast to the type the kernel declares for it (3.7 to an ``int`` is 3); None,
    strings and arrays for scalar parameters are refused with an InputError before any work.

    A callable is called once per block as
    ``compute(*input_arrays, *output_arrays, *args, queue=, offset=, n=)`` with device arrays
    (PyOpenCL arrays on OpenCL; DLPack / CUDA-array-interface objects on CUDA), then ``args``
    as given, and must enqueue its work on ``queue``, the driver's own queue (a
    ``pyopencl.CommandQueue``, or a ``cuda.core`` Stream). It may write its output arrays and
    return None, or return device arrays (one per output, or a tuple: a
    ``pyopencl.array.Array``, or anything with ``__cuda_array_interface__``) that conveyor
    copies into the block's outputs on that queue; a wrong count, shape or dtype is an
    InputError. Unless ``warmup=False``, a callable is first called once on the first rows
    (at most 64, into scratch outputs that are dropped) before the stream starts, so that a
    library that loads its modules lazily (CuPy, PyTorch, Numba) does not load one while blocks
    are in flight, and what it returns is checked before any work.

    A kernel's pointer parameters after the streamed buffers take arrays in ``args``: each is
    uploaded once before the first block, counted against ``memory_limit``, and passed to
    every launch (``__global const T*`` or ``__constant T*``); ``cv.resident(array)`` keeps
    one on the device across streams. A non-const pointer needs ``cv.resident(array,
    writable=True)``, copied back after the stream (``conveyor.pipeline.resident``).

    Arrays are cut along axis 0 and must agree on its length. ``outputs`` holds arrays
    (C-contiguous, writable) or dtypes; a dtype makes a new array shaped like input 0's rows,
    found in ``report.outputs``. ``cv.per_block(shape, dtype)`` is one record per block
    (``report.block_ranges`` says which rows each covered) and ``cv.rows(dtype, ratio=(p,
    q))`` an output of ``rows × p / q`` rows, blocks cut at multiples of ``q`` rows
    (``conveyor.pipeline.shaped``). An output may be an input itself (in place: NumPy's answer,
    halo included); an output that overlaps an input in any other way is an InputError
    (pipeline/overlap.py).

    Inputs may also be files: a path to a ``.npy`` file, ``cv.npy(path)``, ``cv.raw(path,
    dtype, shape)``, ``cv.parquet(path, column)``, ``cv.arrow(path, column)``, or
    ``cv.iterate(chunks, length=rows)`` for any iterable of arrays; files are read block by
    block straight into the pinned staging buffers. Outputs may be a ``.npy`` path,
    ``cv.npy_out(path, dtype=None)`` or ``cv.raw_out(path, dtype)``: written block by block to a
    temporary file beside the target and renamed over it only when the whole stream succeeded
    (a file output's dtype defaults to the kernel's output parameter type, else input 0's);
    ``report.outputs`` then holds the path. See ``conveyor.pipeline.io``.

    ``cv.image(a)`` streams a 2-D input through images: the kernel takes ``read_only
    image2d_t, sampler_t`` in its place (CUDA: ``cudaTextureObject_t``) and the addressing mode
    matches ``boundary=`` (``conveyor.pipeline.image``).

    ``halo=h`` gives each input block ``h`` extra rows before and after, so element ``i`` of
    the block is at index ``i + h * row`` of the input buffer; outputs are exactly the block.
    The rows past either end follow ``boundary``, as Dask's ``map_overlap`` names them and
    exactly as ``np.pad`` makes them: "nearest" (the default) repeats the edge row (np.pad
    "edge"), "reflect" mirrors, edge row included (np.pad "symmetric"), "periodic" wraps
    around (np.pad "wrap"), a number is a constant (np.pad "constant"). ``reduce`` is
    "sum", "min", "max" (with a kernel: the kernel writes per-element values into its one output
    buffer and conveyor folds them on the device) or, with a callable that returns each block's
    partial, also any function ``f(a, b)``; the result is ``report.result``.

    ``depth`` slots are in flight at once; the block size comes from ``block_bytes`` (bytes of
    one block of the widest array) or from ``memory_limit`` (default: half the device's global
    memory), never exceeding it. ``zero_copy`` (default: on where the device shares memory with
    the host and ``halo`` is 0) uses blocks in place instead of copying them. ``workers`` sets
    the staging threads (1 to 1024; default: three per four cores, at most 16).
    ``progress=True`` shows a progress bar. ``trace`` names a Chrome-trace JSON file to write.

    ``strict=True`` (default: ``CONVEYOR_STRICT``, else off) raises HazardError when something
    on the hot path would silently block: a pageable host array handed to an async copy, a
    pool allocation after the ring was built, a kernel build or load after the first block.
    Without it each such hazard warns once per process (``conveyor.hazards``).

    ``first_row`` (default 0) is the row of a larger whole array that the inputs' row 0 is:
    ``offset`` counts from there, so a stream over one part of an array (a Dask chunk, a
    worker's row range of a file: ``conveyor.dask``) sees the offsets of the whole array. It
    may be negative for margin rows before the whole array's start that the caller discards
    (a kernel's ``ulong offset`` then wraps, and ``offset + i`` is still the row's index).
    Every element offset must fit a signed 64-bit integer (InputError otherwise).

    ``device`` is a Device or a spec string (``"cuda:1"``); several devices stream at once
    given as a list (``[d0, d1]``, ``["cuda:0", "cuda:1"]``) or a spec ending in ``:all``
    (``"cuda:all"``, ``"opencl:gpu:all"``): one engine per device, fed blocks from one
    supply, ``schedule="dynamic"`` (runs of blocks to whichever device has room) or
    ``"static"`` (one contiguous share each); ``report.devices`` holds each device's report
    and ``report.imbalance`` how unevenly they finished (``conveyor.pipeline.multi``). A
    kernel (or its source string, when it defines one kernel) is built for each device.

    ``inputs`` and ``outputs`` may also be one array, path or dtype alone; counts and sizes may
    be integral floats, and sizes strings like ``"512MiB"`` or ``"1.5GB"``
    (``conveyor.pipeline.options``).

    ``keep_pinned=True`` registers every pageable, C-contiguous array input and output (not a
    memmap) and keeps it page-locked from this stream on, within
    ``cv.configure(pinned_budget=...)``: this and later streams of the same arrays copy them
    directly, with no staging copy (``cv.keep_pinned``, ``cv.release_pinned``:
    memory/keep.py).

    Raises InputError (before any work) for arguments that cannot work; the first failure of a
    kernel, callable or staging copy is raised as is, after everything in flight has finished
    and every buffer has gone back to its pool.
    """
    this_stream = object()  # what claims this call's cv.iterate inputs (chunks.py)
    try:
        from conveyor.backends import device as default_device
        from conveyor.kernels.build import KernelFuture

        opts = StreamOptions.parse(depth=depth, block_bytes=block_bytes, memory_limit=memory_limit,
                                   halo=halo, workers=workers, args=args, reduce=reduce,
                                   zero_copy=zero_copy, progress=progress, strict=strict,
                                   warmup=warmup, boundary=boundary, first_row=first_row)
        keep_pinned = flag("keep_pinned", keep_pinned)  # "no" or a callback is no True
        config.check_all()  # every CONVEYOR_* variable, used on this stream's paths or not
        inputs, outputs = as_inputs(inputs), as_outputs(outputs)
        if isinstance(compute, KernelFuture):
            compute = compute.result()  # load now, before any block is in flight
        if device is None:
            devs = [default_device(warm_up=False)]
        elif isinstance(device, Device):
            devs = [device]
        else:
            from conveyor.backends import select

            devs = select(device, warm_up=False)
        if schedule not in ("dynamic", "static"):
            raise InputError(f"schedule={schedule!r}: use 'dynamic' (blocks to whichever device "
                             f"has room) or 'static' (one contiguous share per device)")
        dev = devs[0]
        if isinstance(compute, str):
            compute = _compile_source(compute, dev)
        if len(devs) > 1:
            from conveyor.pipeline import multi

            multi.check_devices(devs, schedule)
        elif isinstance(compute, Kernel | Chain) and _several_asked(device):
            # Several devices asked for, one found or named: a kernel of another device (a
            # chain's too) is built for it, as over two (code that streams over devices[:k]
            # ran for k = 2 and was refused for k = 1).
            from conveyor.pipeline import multi

            compute = (multi.kernel_for(compute, dev) if isinstance(compute, Kernel)
                       else multi.chain_kernels_for(compute, dev))
            # ... and a read-only resident table of another device is its table here
            opts = replace(opts, args=multi.tables_of_others(opts.args, dev))
        trace_at = ""
        if trace is not None:
            # A str or pathlib.Path, as report.timeline.save takes.
            trace = files.path_text(trace, "trace=")
            files.output_target(trace, f"trace={trace!r}", probe=True)  # before any work
            # Checked and written as it names the file now: written after the work, a
            # relative one followed a callable's os.chdir onto the stream's own input.
            trace_at = files.joined(trace)
        sources: list[Source] = []
        sinks: list[Sink] = []
        begun: list[FileSource] = []
        try:
            for i, a in enumerate(inputs):  # one by one: those made are closed if one fails
                source = as_source(a, i)
                if isinstance(source, IterSource):  # given twice to this stream: read once
                    source.claim(this_stream)
                sources.append(source)
            if not sources:
                raise InputError("a stream needs at least one input array")
            rows = sources[0].shape[0]
            # Once, before any output file, queue or device's engine exists.
            check_offsets(opts.first_row, rows, int(np.prod(sources[0].shape[1:], dtype=np.int64)))
            sinks = [
                o.sink(i, rows, sources[0].shape[1:]) if isinstance(o, Shaped)
                else as_sink(o, i, rows, sources[0].shape[1:],
                             _file_dtype(compute,
                                         len(sources) + image.sampler_params(dev, sources),
                                         i, sources[0].dtype, len(outputs or ()), o))
                for i, o in enumerate(outputs or ())
            ]
            _check_files(sources, sinks, compute)
            arrays = [(j, s.array) for j, s in enumerate(sinks) if isinstance(s, ArraySink)]
            for source in sources:
                if isinstance(source, IterSource):
                    source.watch(arrays, opts.halo)
            for source in sources:
                inner = source.inner if isinstance(source, image.ImageSource) else source
                if isinstance(inner, FileSource):
                    inner.begin(this_stream)  # stamped now: a rewrite during it is seen
                    begun.append(inner)
            mapped = _mapped_outputs(sinks) if begun else set()
            for inner in begun:
                if inner.file_id() in mapped:
                    inner.writes_in_place(this_stream)
            validate.check_widths(sources, sinks)
            if trace is not None:
                _check_trace(trace_at, sources, sinks, _all_args(compute, opts.args), trace)
            if len(devs) > 1:
                from conveyor.pipeline import multi

                if keep_pinned:
                    raise InputError("keep_pinned=True registers the arrays with one device: "
                                     "stream on one device, or leave keep_pinned off with "
                                     "several")
                report = multi.stream_several(compute, sources, sinks, devs, opts, schedule)
            else:
                fresh = _keep_arrays(sources, sinks, dev) if keep_pinned else []
                engines: list[Engine] = []
                try:
                    report = _run(compute, sources, sinks, dev, opts, engines)
                except BaseException:
                    if not any(engine.looped for engine in engines):  # refused before work
                        _release_kept(fresh, dev)
                    raise
        except BaseException:
            for sink in sinks:
                sink.abort()
            raise
        finally:
            for inner in begun:
                inner.finish(this_stream)
            for source in sources:
                source.close()
        if trace is not None:
            from conveyor.trace.export import save_chrome_trace

            try:
                read = _iterated_file(trace_at, sources)
                if read is not None:  # a chunk's file, known only once the chunks came
                    raise OSError(f"it names {read}, the file a cv.iterate input's chunks were "
                                  f"read from: write the trace to another file")
                save_chrome_trace(report.timeline, trace_at)
                report.trace_file = _as_given(trace, trace_at)
            except OSError as exc:  # the outputs are committed: a side file must not lose them
                warnings.warn(f"conveyor: trace {trace} was not written ({exc}); the stream "
                              f"itself succeeded", RuntimeWarning, stacklevel=2)
            except BaseException as exc:  # a Ctrl-C: raised, saying the outputs are whole
                note_outputs_written(exc)
                raise
        return report
    finally:
        # A cv.iterate input refused before its stream began (a bad option, a later input
        # that fails) is closed too (its generator's ``finally`` runs now); closing twice is
        # nothing.
        _close_iterables(inputs, this_stream)


def _close_iterables(inputs: Any, stream: object) -> None:
    """Close each ``cv.iterate`` input among ``inputs`` (as given, or as a list) that
    ``stream`` claimed or no stream did: never one another stream is reading (a stream
    refused for it closed it under that stream)."""
    for item in inputs if isinstance(inputs, list | tuple) else [inputs]:
        if isinstance(item, IterSource) and item.claimed_by(stream):
            item.close()


def _several_asked(device: Any) -> bool:
    """Whether ``device=`` asks for a list of devices (a list or tuple, a comma spec, an
    "all" spec), whatever it found."""
    if isinstance(device, list | tuple):
        return True
    text = device.strip().lower() if isinstance(device, str) else ""
    return "," in text or text == "all" or text.endswith(":all")


def _compile_source(source: str, dev: Device) -> Kernel:
    """The one kernel a source string defines, built for ``dev`` (through the cache)."""
    from conveyor.kernels.build import expanded_source
    from conveyor.kernels.signature import kernel_names

    # As the compiler sees it: a head made by a macro counts, one inside #if 0 does not.
    names = list(dict.fromkeys(kernel_names(expanded_source(dev, source, ())))) or \
        kernel_names(source)
    if len(names) != 1:
        raise InputError(f"compute is a source string that defines {len(names)} kernels "
                         f"({', '.join(names) or 'none'}): pass device.compile(source, name) "
                         f"for the one to run")
    return dev.compile(source, names[0])


def _keep_arrays(sources: list[Source], sinks: list[Sink], dev: Device) -> list[np.ndarray]:
    """Register the pageable arrays, inputs and outputs, for this and later streams
    (memory/keep.py); an output only when it can be written, and not one conveyor allocates
    for a dtype (a new array each stream: registering it would only cost). Returns the
    arrays this call registered (not kept before)."""
    from conveyor.memory import keep

    fresh: list[np.ndarray] = []

    ends: list[tuple[ArraySource | ArraySink, bool]] = [
        (s, False) for s in sources if isinstance(s, ArraySource)]
    ends += [(s, True) for s in sinks if isinstance(s, ArraySink) and not s.allocated]
    for end, written in ends:
        array = end.array
        if (not isinstance(array, np.memmap) and array.flags.c_contiguous
                and (array.flags.writeable or not written)):
            before = keep.find(dev, array) is not None
            if keep.keep_pinned(array, device=dev) and not before \
                    and keep.find(dev, array) is not None:
                fresh.append(array)
    return fresh


def _release_kept(arrays: list[np.ndarray], dev: Device) -> None:
    """Release what :func:`_keep_arrays` registered for a stream that failed before its
    first block (a refused call left its arrays page-locked for a stream that never ran; one
    that failed part way keeps them for the next, as it would have after its last block)."""
    from conveyor.memory import keep

    for array in arrays:
        keep.release_pinned(array, device=dev)


def open_sinks(sinks: Sequence[Sink], plan: Plan, reduction: Reduction | None, device: str,
               depth: int) -> Report | None:
    """Open the sinks for ``plan`` (a per-block output gets one record per block); when the
    plan has no blocks, commit them and return the stream's whole Report, else None."""
    for sink in sinks:
        if isinstance(sink, ShapedSink):
            sink.allocate(plan.block_count)
        sink.open()
    if plan.block_count:
        return None
    commit_all(sinks)
    return Report(device=device, depth=depth, outputs=[s.result for s in sinks],
                  block_rows=plan.block_rows, rows=plan.rows,
                  result=reduction.result() if reduction is not None else None)


def _all_args(compute: Any, args: Sequence[Any]) -> list[tuple[str, Any]]:
    """The stream's ``args`` and its chain links' own, each named for messages."""
    named = [(f"args[{index}]", value) for index, value in enumerate(args)]
    if isinstance(compute, Chain):
        named += [(f"args[{index}] of link {number}", value)
                  for number, item in enumerate(compute.links)
                  for index, value in enumerate(getattr(item, "args", ()))]
    return named


def _iterated_file(trace: str, sources: list[Source]) -> str | None:
    """The file behind a ``cv.iterate`` input's memory-mapped chunks that ``trace`` names, or
    None: chunks come during the work, so the check before it could not see them."""
    for source in sources:
        for path in getattr(source, "mapped_files", {}).values():
            if files.same_file(trace, path):
                return path
    return None


def _as_given(given: str, absolute: str) -> str:
    """``given``, or ``absolute`` where the current folder has changed since (as
    ``FileSink.result``)."""
    try:
        return given if files.joined(given) == absolute else absolute
    except InputError:  # the current folder was removed
        return absolute


def _check_trace(trace: str, sources: list[Source], sinks: list[Sink],
                 args: Sequence[tuple[str, Any]] = (), shown: str | None = None) -> None:
    """InputError when ``trace`` names a file the stream reads or writes (an input or output
    file, a Parquet or Arrow input, a memory map among the inputs, outputs or ``args``, a
    chain link's included; ``args`` as (name, value) pairs): the trace, written last, would
    replace it. ``shown``: the trace's name as given, for the message."""
    maps = None
    shown = trace if shown is None else shown
    names = [name for name, _ in args]
    tables = [getattr(a, "source", a) for _, a in args]  # a cv.resident's array, or the array
    for kind, ends in (("input", sources), ("output", sinks), ("args", tables)):
        for index, end in enumerate(ends):
            # An image input keeps its file or array on the source it wraps.
            end = end.inner if isinstance(end, image.ImageSource) else end
            path = getattr(end, "path", None)
            array = end if isinstance(end, np.ndarray) else getattr(end, "array", None)
            if path is None and isinstance(array, np.ndarray) and overlap.file_backed(array):
                # A memmap's file (np.load(mmap_mode=), open_memmap): the trace replaced it.
                maps = overlap.read_maps() if maps is None else maps
                path = overlap.mapped_path(array, maps)
            if path is not None and files.same_file(trace, path):
                what = names[index] if kind == "args" else f"{kind} {index}"
                raise InputError(f"trace={shown!r} names the same file as {what} "
                                 f"({path}): the trace would replace it; write the trace "
                                 f"to another file")


def _check_files(sources: list[Source], sinks: list[Sink], compute: Compute | Chain
                 ) -> None:
    """Refuse two file outputs naming one file, and (for a callable, which gets PyOpenCL /
    DLPack arrays that have no byte order) arrays that are not in the machine's byte order.
    An output that is also an input is fine: inputs keep reading the old file, which the
    output replaces only when the stream succeeded."""
    file_sinks = [s for s in sinks if isinstance(s, FileSink)]
    for i, first in enumerate(file_sinks):
        for second in file_sinks[i + 1 :]:
            if files.same_file(first.target, second.target):
                raise InputError(f"outputs {first.name} and {second.name} are one file: name "
                                 f"a different file for each output")
    overlap.check_map_sizes(
        [(f"{kind} {index}", array) for kind, ends in (("input", sources), ("output", sinks))
         for index, end in enumerate(ends)
         if isinstance(array := getattr(getattr(end, "inner", end), "array", None),
                       np.ndarray)])
    maps = None
    for index, sink in enumerate(sinks):
        array = getattr(sink, "array", None)
        if not file_sinks or not isinstance(array, np.ndarray) or not overlap.file_backed(array):
            continue
        maps = overlap.read_maps() if maps is None else maps
        # A shared map only: a copy-on-write one never writes its file.
        where = overlap.shared_file(array, maps)
        if where is None:
            continue
        for other in file_sinks:
            if files.same_file(where, other.target):
                raise InputError(
                    f"output {index} is a memory map of {where}, and output "
                    f"{sinks.index(other)} ({other.name}) is that file: a file output "
                    f"replaces its file when the stream ends, and output {index}'s rows "
                    f"would go with the old one; write one of them to another file")
    if (callable(compute) and not isinstance(compute, Kernel)) or (
            isinstance(compute, Chain) and compute.has_callables):
        validate.check_byte_order(sources, sinks)


def _mapped_outputs(sinks: list[Sink]) -> set[tuple[int, int]]:
    """(device, inode) of each file that outputs of ``sinks`` map shared and writable (a
    ``np.memmap`` output: in place where it is an input's file too), as
    ``overlap.mapped_file`` names a mapped file (its path's numbers where the path still names
    it, else the map's). Not by path: /proc/self/maps escapes a newline in a name; not by inode
    alone: two file systems' files may share an inode number."""
    arrays = [a for s in sinks if isinstance(a := getattr(s, "array", None), np.ndarray)
              and overlap.file_backed(a)]
    if not arrays:
        return set()
    maps = overlap.read_maps()
    return {found[:2] for a in arrays
            if (found := overlap.mapped_file(a, maps, shared_only=True)) is not None}


def _run(compute: Compute | Chain, sources: list[Source], sinks: list[Sink], dev: Device,
         opts: StreamOptions, engines: list[Engine] | None = None) -> Report:
    """Check, plan and run a stream of sources into sinks; commit the sinks. The engine made
    is added to ``engines`` where given (whether it began its blocks: ``Engine.looped``)."""
    reduce, element = opts.reduce, None
    residents: Any = None  # resident.ResidentArgs, or a chain's (chain.ChainResidents)
    planner: Any = make_plan
    if isinstance(compute, Chain) and image.indices(sources):
        raise InputError("image inputs (cv.image) are read by a single kernel, not by a chain: "
                         "stream the image with one kernel, or pass the array as a plain "
                         "input to the chain")
    # Image inputs (pipeline/image.py): checked against the device (no images: InputError), and
    # the most rows a block may have to fit the device's images.
    max_rows = image.prepare(compute, dev, sources, opts.boundary, opts.halo)
    if isinstance(compute, Chain):
        compute = compute.bind(dev, sources, sinks, opts.args, reduce)
        element, residents, planner = compute.element, compute.residents, compute.make_plan
    elif isinstance(compute, Kernel):
        # Checked before check_kernel: with outputs, its parameter-count message would
        # count a "partial buffer" and not say that the outputs are what to drop.
        if reduce is not None and sinks:
            raise InputError(
                "with reduce= and a kernel, pass no outputs: the kernel's one output buffer "
                "holds per-element values that conveyor folds on the device"
            )
        chunks.adopt_types(sources, compute)
        element = validate.check_kernel(compute, dev, sources, sinks, opts.args, reduce)
        buffers = len(sources) + len(sinks) + (1 if reduce is not None else 0)
        buffers += image.sampler_params(dev, sources)  # each image input's sampler_t
        residents = resident.bind(compute, buffers, opts.args)
    elif not callable(compute):
        raise InputError(
            f"compute must be a Kernel (device.compile) or a callable, "
            f"got {type(compute).__name__}"
        )
    else:
        resident.refuse_in_callable_args(opts.args, "the callable's")
    overlap.check_tables(_writable_tables(residents), sinks, _callable_arrays(compute))
    first = sources[0]
    reduction = Reduction.make(reduce, element, first.dtype,
                               int(np.prod(first.shape, dtype=np.int64)),
                               with_kernel=isinstance(compute, Kernel) or element is not None)
    pairs = overlap.in_place_pairs(
        [s.inner if isinstance(s, image.ImageSource) else s for s in sources], sinks)
    in_place = frozenset(i for i, _ in pairs)
    max_rows, cap = constant_rows(compute, dev, sources, opts.halo, max_rows, residents)
    room = paths.pinned_room(dev)
    plan = planner(
        tuple(validate.spec(a) for a in sources),
        tuple(validate.spec(a) for a in sinks),
        depth=opts.depth,
        block_bytes=opts.block_bytes,
        memory_limit=opts.memory_limit,
        halo=opts.halo,
        global_mem_bytes=dev.global_mem_bytes,
        pool_limit=dev.memory_pool.limit,
        pinned_limit=room,
        # which arrays stage: asked of the driver per array, so only where a limit is set
        staged=None if room is None else paths.staged_marks(dev, sources, sinks,
                                                            opts.zero_copy),
        max_alloc_bytes=dev.max_alloc_bytes,
        **(reduction.scratch_sizes(validate.spec(first).row_items) if reduction else {}),
        resident_bytes=residents.nbytes if residents is not None else 0,
        max_block_rows=max_rows,
        block_cap=cap,
        windowed=any(side is not None for s in sources
                     for side in getattr(s, "beside", (None, None))),
    )
    check_host_memory(plan, dev)
    empty = open_sinks(sinks, plan, reduction, dev.spec, opts.depth)
    if empty is not None:
        return empty
    opts = replace(opts, zero_copy=_zero_copy(opts.zero_copy, dev, opts.halo, sources, sinks,
                                              plan, compute, pairs))
    read = list(sources)  # bool inputs a kernel reads as bool, checked as they are read
    if isinstance(compute, BoundChain):
        validate.guard_bools(read, compute.bool_inputs())
    elif isinstance(compute, Kernel):
        params = list(compute.params)
        images = image.indices(sources)
        if images:  # the samplers dropped: parameters lined up with the buffers
            params = image.kernel_params(
                compute.name, params, images, len(sources) + len(sinks) + len(opts.args) + 2
                + (1 if reduce is not None else 0), dev.backend)
        validate.guard_bools(read, validate.bool_inputs(params, sources))
    engine = Engine(dev, plan, compute, read, sinks, opts, reduction=reduction,
                    in_place=in_place, residents=residents)
    if engines is not None:
        engines.append(engine)
    report = engine.run()
    commit_all(sinks)
    return report


def _writable_tables(residents: Any) -> list[tuple[str, np.ndarray]]:
    """(name, host array) of each writable resident table of a kernel's or a chain's args:
    the arrays a stream copies back into after it."""
    groups = [("", residents)] if isinstance(residents, resident.ResidentArgs) else [
        (f"{b.where()}: ", b.residents) for b in getattr(residents, "links", ())
        if b.residents is not None]
    found: dict[int, tuple[str, np.ndarray]] = {}  # one per handle (args=(t, t) is one)
    for where, args in groups:
        for i, handle in args.handles.items():
            if handle.writable:
                found.setdefault(id(handle), (f"{where}args[{i}]", handle.array))
    return list(found.values())


def _callable_arrays(compute: Any) -> list[tuple[str, np.ndarray]]:
    """(name, array) of the NumPy arrays a chain's callable links are given in their
    ``args=``, also inside Python's own containers (read as conveyor/containers.py reads
    them, a thousand items at most each): what a callable may write on the host while a
    writable table of the same memory is copied back over it."""
    from conveyor.containers import standard_items

    found: list[tuple[str, np.ndarray]] = []
    for bound in getattr(compute, "links", ()):
        if getattr(bound, "is_kernel", True):
            continue
        stack = [(f"{bound.where()}: args[{i}]", value)
                 for i, value in enumerate(getattr(bound, "args", ()))]
        seen: set[int] = set()
        while stack and len(seen) < 10_000:
            name, value = stack.pop()
            if id(value) in seen:
                continue
            seen.add(id(value))
            if issubclass(type(value), np.ndarray):
                found.append((name, value))
                continue
            items = standard_items(value)
            if items is not None:
                kind, inner = items
                values = [v for pair in inner for v in pair] if kind == "map" else inner
                stack += [(f"{name}[{j}]" if kind == "seq" else f"{name}[<an item>]", v)
                          for j, v in enumerate(values[:1000])]
    return found


def check_host_memory(plan: Plan, dev: Device) -> None:
    """InputError when the stream would hold more memory than the host has at all (a huge
    halo or block): the process would otherwise be killed for memory mid-stream. Compared
    with the host's total, not what is free now: a moment's pressure from another process
    must not refuse a small stream (nor does the driver's own allocation need that much)."""
    needed = plan.host_bytes(dev.host_unified)
    host = hostmem.total()
    if host is not None and needed > host:
        held = "its staging ring, and its device buffers, which this device keeps in host " \
            "memory" if dev.host_unified else "its pinned staging ring"
        raise InputError(
            f"this stream would hold about {needed} bytes of host memory ({held}"
            f"{', and halo pad rows' if plan.halo else ''}), more than the host's {host}: use "
            f"a smaller block_bytes or depth"
            + (f", or a smaller halo (halo={plan.halo})" if plan.halo else ""))


def inputs_written(compute: Any, inputs: int) -> list[str]:
    """The stream inputs a kernel may write: bound to a pointer parameter not declared const
    (nor ``__constant``), in a kernel or in a chain's kernel links, each named for messages.
    Used in place (zero-copy), such an input would be changed under the caller, or crash the
    process where its memory is read-only (a read-only memmap, NumPy over ``bytes``)."""
    def writable(param: Any) -> bool:
        if "image" in param.base or "sampler" in param.base:  # an image input's pair
            return False
        return bool(param.is_pointer and not (param.is_const or param.address == "constant"))

    found = []
    if isinstance(compute, Kernel):
        found = [f"input {i} (parameter {param.name!r} of kernel {compute.name!r})"
                 for i, param in enumerate(compute.params[:inputs]) if writable(param)]
    for link in getattr(compute, "links", ()):  # a bound chain (pipeline/chainbind.py)
        if isinstance(link.compute, Kernel):
            found += [f"input {ref.index} (parameter {param.name!r} of {link.where()})"
                      for ref, param in zip(link.reads, link.compute.params, strict=False)
                      if ref.kind == "in" and writable(param)]
    return found


def _zero_copy(wanted: bool | None, dev: Device, halo: int, inputs: list[Source],
               outputs: list[Sink], plan: Plan | None = None, compute: Any = None,
               pairs: frozenset[tuple[int, int]] = frozenset()) -> bool:
    """Whether the stream uses its arrays in place (``zero_copy=``: None decides)."""
    if wanted and image.indices(inputs):
        # It was refused as "parameter 'img' is not const: declare it const", which an
        # image2d_t cannot be.
        raise InputError("zero_copy=True with an image input (cv.image): an image is copied "
                         "into the device's image memory, never used in place; leave "
                         "zero_copy unset (the other arrays are then used in place where the "
                         "device allows)")
    arrays = [s.array for s in inputs if isinstance(s, ArraySource)]
    arrays += [s.array for s in outputs if isinstance(s, ArraySink)]
    written = inputs_written(compute, len(inputs))
    if wanted and written and dev.host_unified:
        raise InputError(
            f"zero_copy=True would let the kernel write your input arrays: "
            f"{'; '.join(written)} is not const. Declare it const (__global const T*), or "
            f"leave zero_copy unset (that input is then copied, as on a GPU)")
    stale = overlap.read_after_written(compute, pairs)
    if wanted and stale and dev.host_unified:
        raise InputError(
            f"zero_copy=True would let a link read an input its chain has already "
            f"overwritten in place: {'; '.join(stale)}. Leave zero_copy unset (the input is "
            f"then copied, and every link reads it as it was), or write into another array")
    # A callable may write the blocks it is given: never in place over read-only memory. A
    # chain of kernels only is no callable (it was refused with zero_copy=True, and copied).
    gets_arrays = (callable(compute) and not isinstance(compute, Kernel)) or bool(
        getattr(compute, "has_callables", False))
    read_only = gets_arrays and any(
        not s.array.flags.writeable for s in inputs if isinstance(s, ArraySource))
    # A kernel is told n = input 0's elements in the block: an array used in place with
    # fewer (one value per row, a per-block record, a ratio output) would be written past its
    # block's rows, into other rows or past the array. Staged, its device buffer is padded.
    narrow = [] if plan is None else [
        f"{kind} {i}" for kind, specs in (("input", plan.inputs), ("output", plan.outputs))
        for i, spec in enumerate(specs) if spec.narrower_than(plan.inputs[0], plan.block_rows)]
    possible = (
        dev.host_unified
        and halo == 0
        and len(arrays) == len(inputs) + len(outputs)  # files always stage
        and all(a.flags.c_contiguous for a in arrays)
        and all(_aligned_in_place(a, _struct_align(compute, at))
                for at, a in enumerate(arrays))
        and not narrow
        and not written
        and not stale
        and not read_only
    )
    if wanted and not possible and read_only and dev.host_unified:
        raise InputError("zero_copy=True with a callable and a read-only input array: the "
                         "callable could write it in place; pass a writeable copy, or leave "
                         "zero_copy unset")
    if wanted and not possible:
        raise InputError(
            f"zero_copy=True needs a device that shares memory with the host ({dev.spec} "
            f"{'does' if dev.host_unified else 'does not'}), halo=0, C-contiguous arrays "
            f"(not files), records at addresses aligned as their struct asks "
            f"(cv.pinned.empty gives {_MOST_ALIGN} bytes) and no array with fewer elements "
            f"per block than input 0"
            + (f" ({', '.join(narrow)} has fewer)" if narrow else "")
        )
    # In place, zero-copy makes a kernel's input and output one buffer: a kernel that reads
    # its input element again after writing its output (``y[i] = 0; y[i] += w * x[i]``)
    # would read its own result. Only an explicit zero_copy=True takes that (README).
    # A callable gets writable device arrays of its inputs: on the zero-copy path a callable
    # that changes one in place (x *= 2) changed the caller's array. As for a kernel's
    # non-const pointer, only an explicit zero_copy=True lets it (README).
    return possible and not pairs and not gets_arrays if wanted is None else wanted


#: The most alignment a kernel may assume of its buffers (OpenCL's smallest
#: CL_DEVICE_MEM_BASE_ADDR_ALIGN, 1024 bits, is 128 bytes).
_MOST_ALIGN = 128


def _aligned_in_place(array: np.ndarray, align: int | None) -> bool:
    """Whether ``array``'s memory may be a kernel's buffer in place. Records (void dtypes,
    with fields or bytes alone): their address a multiple of ``align``, the alignment of
    the kernel's struct, or where that is unknown of the largest power of two that divides
    their size (a struct's alignment divides its size; at most _MOST_ALIGN), so every
    block's start is too. Records of a 32-byte aligned struct (a double4 member) at NumPy's
    16-byte alignment made the kernel's aligned vector loads fault (SIGSEGV): such arrays
    are staged instead. Plain numbers are read with scalar loads, which take any address (a
    guard reads float32 arrays 1 to 3 bytes off in place)."""
    size = array.dtype.itemsize
    if array.dtype.kind != "V" or not size:
        return True
    # at most _MOST_ALIGN: the device's own buffers promise no more (a 256-aligned struct)
    need = min(align if align is not None else size & -size, _MOST_ALIGN)
    return array.ctypes.data % need == 0


def _struct_align(compute: Any, position: int) -> int | None:
    """The alignment of the struct that ``compute``'s pointer parameter ``position`` (its
    inputs', then its outputs') points to, where conveyor lays it out; else None."""
    if not isinstance(compute, Kernel) or position >= len(compute.params):
        return None
    param = compute.params[position]
    if not param.is_pointer or param.dtype is not None:
        return None
    from conveyor.pipeline.clayout import struct_type
    from conveyor.pipeline.structs import packs, struct_source

    code = struct_source(compute)
    found = struct_type(code, param.struct_name) if code is not None and not packs(code) \
        else None
    return None if found is None else found.align


def _file_dtype(compute: Compute | Chain, inputs: int, index: int, fallback: np.dtype,
                outputs: int = 0, given: Any = None) -> np.dtype:
    """The element type of a file output whose dtype is not given: the kernel's output
    parameter type where it declares one (in a chain: the first kernel link that writes it),
    else input 0's dtype."""
    if isinstance(compute, Chain):
        return compute.output_dtype(index, inputs, outputs) or fallback
    if isinstance(compute, Kernel) and inputs + index < len(compute.params):
        param = compute.params[inputs + index]
        if param.is_pointer and param.dtype is not None:
            return param.dtype
        if param.is_pointer and _dtype_not_given(given):
            # A struct: its records as the compiler lays them out, where conveyor reads the
            # struct (input 0's dtype was refused as "cannot check that it matches").
            from conveyor.pipeline.structs import records_dtype

            records = records_dtype(compute, param)
            if records is not None:
                return records
            raise InputError(
                f"output {index} is a file for kernel parameter {param.name!r} "
                f"({param.type_text}), whose records conveyor cannot lay out from the "
                f"source (a packed struct, an attribute, a type from a header): give their "
                f"dtype from Python, cv.npy_out(path, dtype=np.dtype(...)) with the struct's "
                f"members at the offsets the compiler gives them (the command line cannot "
                f"give an output's dtype)")
    return fallback


def _dtype_not_given(output: Any) -> bool:
    """True for a file output whose element type the stream must choose (a path, or a
    FileSink made without ``dtype=``)."""
    import os

    if isinstance(output, str | os.PathLike):
        return True
    return isinstance(output, FileSink) and output.dtype is None
