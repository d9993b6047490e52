"""``conveyor.dask.map_blocks`` and ``conveyor.dask.reduce`` over ``dask.array`` arrays.

Each chunk along axis 0 is one ``cv.stream`` on the worker that holds it (the stream cuts a
chunk bigger than the device's memory into blocks). Chunks along other axes are merged first
(``rechunk``: conveyor streams whole rows), and every input takes input 0's row chunks. The
stream gets ``first_row`` = the chunk's first row, so ``offset`` in a kernel or callable is the
index in the whole array, as in one local ``cv.stream``.

Halo: each input is extended by dask's own overlap (``da.overlap.overlap``, depth ``halo`` on
axis 0, dask's boundary names). The stream runs over the chunk's own rows with conveyor's
``halo=h``, the overlap's rows before and after them given as that halo
(``Source.beside``), so every row sees exactly the rows dask's overlap gives it and the
compute sees only the array's rows (offsets 0 to N - 1, as one local stream); with
``boundary="none"`` the array's own ends repeat the edge row, as in ``cv.stream(halo=h)``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from conveyor.dask.worker import Job, KernelSpec, as_job, check_op, run
from conveyor.errors import InputError

BOUNDARIES = ("nearest", "reflect", "periodic", "none")


def _dask_array() -> Any:
    try:
        import dask.array as da
    except ImportError as exc:  # pragma: no cover - the extra is missing
        raise InputError("conveyor.dask needs Dask: pip install 'conveyor[dask]'") from exc
    return da


def map_blocks(compute: Any, *arrays: Any, dtype: Any = None, args: Sequence[Any] = (),
               halo: int = 0, boundary: Any = "nearest", device: Any = None,
               **options: Any) -> Any:
    """A dask array whose chunks are ``compute`` streamed over ``arrays``' chunks.

    ``compute`` is a Kernel (``device.compile``; only its source, name and options go to the
    workers), :func:`conveyor.dask.kernel` (built on the workers only), or a callable as
    ``cv.stream`` takes it (pickled to the workers). The one output has input 0's rows and
    ``dtype`` (default: the kernel's output parameter type, else input 0's). ``args`` are the
    kernel's scalar arguments. ``halo`` and ``boundary`` follow ``da.map_overlap`` on axis 0:
    boundary "nearest", "reflect", "periodic", "none" or a constant. ``device`` is a spec
    string each worker opens (default: the worker's ``CONVEYOR_DEVICE``, else its best
    device). ``options``: ``depth``, ``block_bytes``, ``memory_limit``, ``workers``,
    ``strict``, ``zero_copy`` of every chunk's stream.

    A chunk's failure is raised by ``compute()`` as its own exception type, with a note naming
    the chunk, its rows and the worker.
    """
    da = _dask_array()
    job = as_job(compute, device, args, _stream_options(options))
    from conveyor.pipeline.options import count

    h = count("halo", halo, 0, "0 or more rows", "an int of 0 or more (rows each side)")
    data = _rows(da, arrays)
    boundary = _check_halo(h, boundary, [a.dtype for a in data])
    if isinstance(job.compute, KernelSpec):
        job.compute.check_count(len(data), job.args, "map_blocks")
    first = data[0]
    out_dtype = (_output_dtype(dtype) if dtype is not None
                 else _default_dtype(job, len(data), first))
    declared = tuple(a.dtype for a in data)
    data, chunks, starts, befores, pads = _overlapped(da, data, h, boundary)
    chunk_fn = functools.partial(_map_chunk, job=job, halo=h, dtype=out_dtype,
                                 defaulted=dtype is None, boundary=pads, declared=declared)
    out_ind = _index(first.ndim, "o")
    pairs: list[Any] = []
    for i, a in enumerate(data):
        pairs += [a, ("r", *(_index(a.ndim, f"i{i}")[1:] if i else out_ind[1:]))]
    pairs += [_per_chunk(chunks, [(i, starts[i], befores[i], chunks[i])
                                  for i in range(len(chunks))]), ("r",)]
    return da.blockwise(chunk_fn, out_ind, *pairs, dtype=out_dtype, concatenate=True,
                        align_arrays=False, adjust_chunks={"r": chunks},
                        meta=np.empty((0,) * first.ndim, out_dtype))


def reduce(compute: Any, array: Any, op: str | Callable[[Any, Any], Any] = "sum", *,
           args: Sequence[Any] = (), halo: int = 0, boundary: Any = "nearest",
           device: Any = None, **options: Any) -> Any:
    """A 0-d dask array: ``compute`` reduced over ``array`` with ``op``; ``.compute()`` gives
    what ``cv.stream(compute, [array], reduce=op).result`` gives.

    Each row chunk is one conveyor reduction on its worker (a kernel's per-element values
    folded on the device, or a callable's partials; ``offset`` is the row in the whole
    array); ``da.reduction`` folds the chunks' partials in chunk order, with the host folds
    ``cv.stream`` uses (sum, min, max, or any ``f(a, b)`` with a callable). A number or an
    array comes back as is; any other partial (a list, say) in a 0-d object array
    (``result[()]``). Arguments as in :func:`map_blocks`: with ``halo=h`` each chunk's
    stream reads its neighbours' rows (dask's overlap) and folds its own rows only, so the
    result is ``cv.stream(compute, [array], reduce=op, halo=h, boundary=...)``'s.
    """
    da = _dask_array()
    job = as_job(compute, device, args, _stream_options(options))
    op = check_op(job, op, "op")
    from conveyor.pipeline.options import count

    h = count("halo", halo, 0, "0 or more rows", "an int of 0 or more (rows each side)")
    (data,) = _rows(da, (array,))
    boundary = _check_halo(h, boundary, [data.dtype])
    if isinstance(job.compute, KernelSpec):
        job.compute.check_count(1, job.args, "reduce")
    from conveyor.pipeline import reduce as reducing

    reducing.check_not_empty(op, int(np.prod(data.shape, dtype=np.int64)))
    kept = tuple(int(c) for c in data.chunks[0] if c)  # an empty chunk has no partial
    if len(kept) != len(data.chunks[0]) and kept:
        data = data.rechunk({0: kept})
    element = _default_dtype(job, 1, data)
    fold = functools.partial(_fold, op=op, element=element, kernel=isinstance(
        job.compute, KernelSpec))
    if not kept:  # no rows: what cv.stream gives for none (0 for a sum), with no chunk to run
        import dask

        empty = np.empty((0,), object)
        return da.from_delayed(dask.delayed(_final(fold))(empty), shape=(), dtype=object)
    declared = (data.dtype,)
    (data,), chunks, starts, befores, pads = _overlapped(da, [data], h, boundary)
    chunk_fn = functools.partial(_reduce_chunk, job=job, op=op, halo=h, boundary=pads,
                                 declared=declared)
    ind = _index(data.ndim, "i")
    where = _per_chunk(chunks, [(i, starts[i], befores[i], chunks[i])
                                for i in range(len(chunks))])
    partials = da.blockwise(chunk_fn, ("r",), data, ind, where, ("r",), dtype=object,
                            concatenate=True, align_arrays=False,
                            adjust_chunks={"r": (1,) * len(chunks)},
                            meta=np.empty((0,), object))
    return da.reduction(partials, chunk=_keep, combine=fold, aggregate=_final(fold),
                        dtype=object, concatenate=True, meta=np.empty((), object))


# -- on the workers ---------------------------------------------------------------------------
# What a chunk says when its kernel writes another type than the output's: map_blocks made
# that output itself, of the type the client read from the source (no device's macros) or of
# the type dtype= asked for ("pass an array of float32" named an array the caller never made).
_DEFAULTED = ("a type its source chooses by the device's macros, where the client (no device) "
              "read {wanted}: pass dtype=np.{dtype} to map_blocks")
_ASKED = "and map_blocks was asked for dtype={wanted}: pass dtype=np.{dtype}, or leave it out"


def _map_chunk(*blocks: Any, job: Job, halo: int, dtype: np.dtype, defaulted: bool = False,
               boundary: Any = None, declared: Sequence[np.dtype] = ()) -> np.ndarray:
    """On a worker: stream chunk ``i`` (rows ``lo:lo + count`` of the whole array). With a
    halo each block is the chunk extended by dask's overlap (``before`` rows in front, as
    many after where the chunk has neighbours or dask padded the array's end): only the
    chunk's own rows are streamed, those rows given beside them as its halo, so the compute
    sees the offsets of the array's rows alone, as one local stream does. A ``boundary``
    given: the chunk is the whole array, padded by its stream."""
    *data, (i, lo, before, count) = blocks
    data = _as_declared(data, declared)
    report = run(job, _chunk_inputs(data, before, count, halo, boundary), [dtype],
                 first_row=lo, halo=halo, boundary="nearest" if boundary is None else boundary,
                 where=f"chunk {i} (rows {lo}:{lo + count})",
                 defaulted={0: _DEFAULTED if defaulted else _ASKED})
    result: np.ndarray = report.outputs[0]
    return result


def _as_declared(data: Sequence[Any], declared: Sequence[np.dtype]) -> list[Any]:
    """Each block in its dask array's dtype: dask's overlap joins records with
    np.concatenate, which lays them out as ``align=True`` (NumPy 2), so the compiler's
    layout the caller gave came back at other offsets (and was refused, or misread)."""
    blocks = list(data)
    for i, want in enumerate(declared[:len(blocks)]):
        block = blocks[i]
        if want.names and isinstance(block, np.ndarray) and block.dtype != want:
            # NumPy casts records field by position: dask's concatenate keeps the fields
            # and their order, only their offsets change, so the values are the same
            blocks[i] = block.astype(want)
    return blocks


def _chunk_inputs(data: list[Any], before: int, count: int, halo: int, boundary: Any
                  ) -> list[Any]:
    """A chunk's inputs: its blocks as given, or (with a halo dask's overlap made) each
    block's own rows with the overlap's rows beside them (``Source.beside``)."""
    if not halo or boundary is not None:
        return list(data)
    from conveyor.pipeline import validate
    from conveyor.pipeline.io import ArraySource

    inputs = []
    for k, block in enumerate(data):
        source = ArraySource(validate.as_input(block[before : before + count], k), f"input {k}")
        after = block.shape[0] - before - count
        source.beside = (block[before - halo : before] if before else None,
                         block[before + count : before + count + halo] if after else None)
        inputs.append(source)
    return inputs


def _reduce_chunk(block: np.ndarray, where: tuple[int, int, int, int], *, job: Job, op: Any,
                  halo: int = 0, boundary: Any = None, declared: Sequence[np.dtype] = ()
                  ) -> np.ndarray:
    """On a worker: chunk ``i``'s partial (its own rows folded; with a halo, the overlap's
    rows beside them, as in :func:`_map_chunk`)."""
    from conveyor.pipeline.fold import halves_kept_wide

    i, lo, before, count = where
    (block,) = _as_declared([block], declared)
    with halves_kept_wide():  # a chunk's total is a partial: cast once, by the aggregate
        report = run(job, _chunk_inputs([block], before, count, halo, boundary), [],
                     first_row=lo, reduce=op, halo=halo,
                     boundary="nearest" if boundary is None else boundary,
                     where=f"chunk {i} (rows {lo}:{lo + count})")
    partial = np.empty((1,), object)
    partial[0] = report.result
    return partial


def _keep(partials: np.ndarray, axis: Any = None, keepdims: bool = False) -> np.ndarray:
    return partials


def _fold(partials: np.ndarray, axis: Any = None, keepdims: bool = False, *, op: Any,
          element: np.dtype, kernel: bool, final: bool = False) -> np.ndarray:
    """Dask's combine (and, ``final``, its aggregate): the partials folded in chunk order;
    a sum of float16 partials stays float32 (fold.WideHalves) until the aggregate."""
    from conveyor.pipeline import reduce as reducing
    from conveyor.pipeline.fold import halves_kept_wide

    folded = np.empty((1,), object)
    with contextlib.nullcontext() if final else halves_kept_wide():
        folded[0] = reducing.combine(op, list(np.ravel(partials)), element, kernel=kernel)
    return folded


def _final(fold: Callable[..., np.ndarray]) -> Callable[..., Any]:
    def aggregate(partials: np.ndarray, axis: Any = None, keepdims: bool = False) -> Any:
        value = fold(partials, final=True)[0]  # the value itself, as cv.stream's result
        if value is None or isinstance(value, np.ndarray | np.generic | int | float | complex):
            return value  # None: a function fold over no rows, as cv.stream gives
        wrapped = np.empty((), object)  # dask would take a list for nested blocks
        wrapped[()] = value
        return wrapped

    return aggregate


# -- on the client ----------------------------------------------------------------------------
def _overlapped(da: Any, data: list[Any], h: int, boundary: Any
                ) -> tuple[list[Any], tuple[int, ...], tuple[int, ...], tuple[int, ...], Any]:
    """The inputs as the chunks' tasks take them, with each chunk's rows (the output's
    chunks), first rows, and rows of dask's overlap in front; and the boundary each chunk's
    own stream pads with (None: dask's overlap gives every halo row). A halo longer than
    the array (which dask's overlap cannot give: it needs chunks of at least the depth) runs
    the array as one chunk, padded by its stream, as ``cv.stream(halo=h)`` takes it."""
    pads = None
    if h:
        total = int(data[0].shape[0])
        if h > total:
            data = [a.rechunk({0: (total,)}) for a in data]
            pads = "nearest" if boundary == "none" else boundary
        else:
            # dask's overlap needs chunks of at least the depth: merge small ones first, as
            # it would itself, so that the chunks counted here are the chunks it extends.
            rows = da.overlap.ensure_minimum_chunksize(h, data[0].chunks[0])
            data = [a.rechunk({0: rows}) for a in data]
    chunks = tuple(int(c) for c in data[0].chunks[0])
    starts = tuple(int(s) for s in np.concatenate([[0], np.cumsum(chunks, dtype=np.int64)]))
    befores = (0,) * len(chunks)
    if h and pads is None:
        at_ends = h if boundary != "none" else 0
        befores = tuple(at_ends if i == 0 else h for i in range(len(chunks)))
        data = [da.overlap.overlap(a, depth={k: (h if k == 0 else 0) for k in range(a.ndim)},
                                   boundary={k: boundary for k in range(a.ndim)})
                for a in data]
    return data, chunks, starts, befores, pads


def _check_halo(h: int, boundary: Any, dtypes: Sequence[np.dtype]) -> Any:
    """``boundary`` as the pads take it (a constant as ``cv.stream`` reads it: a Fraction as a
    float, a long double past float64's range refused); InputError for what a local stream
    refuses: an unknown boundary, a constant that the dtype of an input (``dtypes``, in
    order) cannot hold."""
    _check_boundary(boundary)
    if not h or isinstance(boundary, str):
        return boundary
    from conveyor.pipeline.halo import constant
    from conveyor.pipeline.options import _boundary

    value = _boundary(boundary)
    assert not isinstance(value, str)  # _check_boundary let no other string through
    for i, dtype in enumerate(dtypes):  # dask pads: refuse what a local stream refuses
        constant(value, dtype, f"input {i}")
    return value


def _per_chunk(chunks: tuple[int, ...], values: Sequence[tuple[int, ...]]) -> Any:
    """A blockwise argument that gives chunk i's ``values[i]`` (its index and rows) as a
    literal in its task: no task of its own per chunk (as ``da.arange`` would add), and no
    tuple of every chunk's rows in every task (quadratic in the chunk count). This is how
    ``da.map_blocks`` passes ``block_id``."""
    from dask.layers import ArrayValuesDep

    return ArrayValuesDep((chunks,), {(i,): v for i, v in enumerate(values)})


def _stream_options(options: dict[str, Any]) -> dict[str, Any]:
    known = ("depth", "block_bytes", "memory_limit", "workers", "strict", "zero_copy")
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InputError(f"unknown option(s) {', '.join(unknown)}: conveyor.dask takes "
                         f"{', '.join(known)} (progress and trace are per-process: use "
                         f"cv.stream locally for those)")
    return options


def _check_boundary(boundary: Any) -> None:
    if isinstance(boundary, str):
        if boundary not in BOUNDARIES:
            raise InputError(f"boundary={boundary!r}: use one of {', '.join(BOUNDARIES)} or "
                             f"a constant (dask's names, as in da.map_overlap)")
    elif isinstance(boundary, bool | np.bool_) or not isinstance(boundary, numbers.Complex):
        raise InputError(f"boundary={boundary!r}: use one of {', '.join(BOUNDARIES)} or a "
                         f"number (a constant for the rows past either end)")


def _rows(da: Any, arrays: Sequence[Any]) -> list[Any]:
    """The inputs as dask arrays chunked along axis 0 only, all like input 0."""
    if not arrays:
        raise InputError("conveyor.dask needs at least one input array")
    for i, a in enumerate(arrays):
        _check_array_input(i, a)
    data = [da.asarray(a) for a in arrays]
    for i, a in enumerate(data):
        if a.ndim == 0:  # first: a 0-d array has no chunks[0] for the checks below
            raise InputError(f"input {i} is a scalar (0-d): conveyor streams arrays of rows "
                             f"(axis 0); pass scalars in args=, arrays as inputs")
        if a.dtype.hasobject:  # every chunk's stream refused it on the workers, at compute
            raise InputError(f"input {i} has dtype {a.dtype}, which holds Python objects: "
                             f"convert it to a numeric dtype first (a.astype(np.float32))")
        if not a.dtype.isnative:  # the same: each chunk refused it, a traceback each
            raise InputError(f"input {i} has dtype {a.dtype.str}, not in this machine's byte "
                             f"order (kernels read native order): convert it first, "
                             f"a.astype(a.dtype.newbyteorder('='))")
        unknown = [k for k, sizes in enumerate(a.chunks) if any(math.isnan(c) for c in sizes)]
        if unknown:  # any axis: rows are merged whole (rechunk), which needs every length
            raise InputError(f"input {i} has chunks of unknown length along axis {unknown[0]} "
                             f"(after a filter, say): call .compute_chunk_sizes() on it "
                             f"first")
        if a.shape[0] != data[0].shape[0]:
            raise InputError(f"input {i} has {a.shape[0]} rows but input 0 has "
                             f"{data[0].shape[0]}: inputs must agree on axis 0")
    rows = data[0].chunks[0]
    return [a.rechunk({k: (rows if k == 0 else -1) for k in range(a.ndim)}) for a in data]


def _check_array_input(index: int, value: Any) -> None:
    """InputError for an input of :func:`map_blocks` or :func:`reduce` that is a file (a
    path, ``cv.npy``, ``cv.raw``, a table) or a ``cv.image``/``cv.iterate``: dask made it a
    0-d object array ("is a scalar") or raised AttributeError from deep inside dask."""
    import os

    from conveyor.pipeline.chunks import IterSource
    from conveyor.pipeline.image import ImageInput
    from conveyor.pipeline.io import Source

    if isinstance(value, IterSource):  # a Source too: before the files
        raise InputError(f"input {index} is a cv.iterate(...), which one local stream reads "
                         f"once, in order (cv.stream): Dask workers cannot share it; pass a "
                         f"NumPy or dask array (dask.array.concatenate of the chunks)")
    if isinstance(value, str | bytes | os.PathLike | Source):
        raise InputError(f"input {index} is a file ({getattr(value, 'name', value)!r}): "
                         f"conveyor.dask.map_blocks and reduce take arrays (NumPy or dask); "
                         f"stream files with conveyor.dask.stream(compute, [paths], ...), or "
                         f"pass np.load(path, mmap_mode='r')")
    if isinstance(value, ImageInput):
        raise InputError(f"input {index} is a cv.image(...): image blocks are read by one "
                         f"device's stream (cv.stream), not by conveyor.dask; pass the array "
                         f"itself to stream it as rows")


def _output_dtype(dtype: Any) -> np.dtype:
    """``dtype=`` of :func:`map_blocks` as a NumPy dtype; InputError, on the client, for what
    is none (NumPy parses "f4,(" as Python: a bare SyntaxError) or holds Python objects
    (refused by every chunk's stream on the workers, one logged traceback each), and for
    ``cv.rows``/``cv.per_block``: NumPy takes anything with a ``.dtype`` for its dtype, so
    the output got input 0's rows, of which the kernel wrote a part: the rest was a pooled
    buffer's old bytes, returned with no error."""
    from conveyor.pipeline.shaped import Shaped

    if isinstance(dtype, Shaped) or (
            hasattr(dtype, "dtype") and not isinstance(dtype, np.dtype | type)):
        shown = (f"cv.{'rows' if type(dtype).__name__ == 'Rows' else 'per_block'}(...)"
                 if isinstance(dtype, Shaped) else repr(dtype))
        raise InputError(f"dtype={shown} is not a NumPy dtype: map_blocks' output has input "
                         f"0's rows, of one dtype (np.float32, say); for cv.rows or "
                         f"cv.per_block outputs stream with cv.stream on one device")
    try:
        parsed = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError):
        raise InputError(f"dtype={dtype!r} is not a NumPy dtype: give the output's element "
                         f"type, e.g. np.float32, or leave it out for the kernel's") from None
    if parsed.hasobject:
        raise InputError(f"dtype={parsed} holds Python objects: give a numeric dtype, e.g. "
                         f"np.float32")
    if parsed.subdtype is not None:  # dask made chunks of input 0's shape: NumPy's ValueError
        base, shape = parsed.subdtype
        raise InputError(f"dtype={parsed} is an array type ({shape} of {base}): map_blocks' "
                         f"output has input 0's rows of one element type; give {base}, with "
                         f"rows of input 0's shape")
    return parsed


def _default_dtype(job: Job, inputs: int, first: Any) -> np.dtype:
    if isinstance(job.compute, KernelSpec):
        found = job.compute.output_dtype(inputs)
        if found is not None:
            return found
    return np.dtype(first.dtype)


def _index(ndim: int, prefix: str) -> tuple[str, ...]:
    return ("r", *(f"{prefix}{k}" for k in range(1, ndim)))
