"""``conveyor.dask.stream``: files to files on a Dask cluster, one long stream per worker.

The client reads only the files' headers. It makes each output's temporary ``.part`` file
beside the target at full size, with its header (the FileSink of a local stream, whose lock it
holds), splits the rows into one range per worker and sends each worker the file names and its
range: no array goes through the scheduler. Each worker streams its rows from the input files
(a :class:`~conveyor.pipeline.io.FileSource` over its range) into its rows of the part files
(:class:`RangeSink`). Only when every range has succeeded does the client rename the parts
over the targets; on any failure it deletes them. A range whose worker died is run again by
Dask on another worker and simply rewrites the same rows, so nothing is duplicated or missing.
Workers and client must see the same files (one host, or a shared file system).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from conveyor.dask.worker import Job, KernelSpec, as_job, check_op, run, worker_name
from conveyor.errors import InputError
from conveyor.files import same_file
from conveyor.pipeline.io import FileRows, FileSource, byte_view
from conveyor.pipeline.sinks import FileSink, Sink, commit_all, naming_errors

#: An output file as workers get it: (path of its part, dtype (a record's fields too), whole
#: shape, data offset, the output's name as the user gave it: for messages).
FileRef = tuple[str, np.dtype, tuple[int, ...], int, str]
#: An input file as workers get it: a FileRef's first four, then the file's size and its
#: header's bytes as the client read them (a worker refuses a file that no longer has them).
InputRef = tuple[str, np.dtype, tuple[int, ...], int, int, bytes]


class RangeSink(Sink):
    """Rows ``lo:hi`` of an output file that already exists at full size (a part file the
    client made): a worker's share, which its stream covers exactly (a halo's neighbour rows
    are given beside the inputs, never streamed)."""

    def __init__(self, ref: FileRef, lo: int, hi: int) -> None:
        path, dtype, shape, offset, self.output = ref
        self.path, self.name = path, f"rows {lo}:{hi} of {path}"
        self.dtype = np.dtype(dtype)
        self.shape = (hi - lo, *shape[1:])
        self.row_bytes = math.prod(shape[1:]) * self.dtype.itemsize
        self.start = offset + lo * self.row_bytes  # byte of the stream's row 0
        self._fd: int | None = None

    @property
    def result(self) -> str:
        """The file's path."""
        return self.path

    def rows(self, lo: int, hi: int) -> FileRows:
        """Where the stream's rows ``lo:hi`` go."""
        return FileRows(self, lo, hi)

    def open(self) -> None:
        """Open the existing file for writing (never create or truncate it)."""
        self._fd = os.open(self.path, os.O_WRONLY)

    def write_from(self, src: np.ndarray, lo: int) -> None:
        """Write the rows of ``src`` (stream rows from ``lo``)."""
        assert self._fd is not None, "open() first"
        if not len(src):
            return
        view = byte_view(np.ascontiguousarray(src))
        position = self.start + lo * self.row_bytes
        done = 0
        with self._naming_errors():
            while done < len(view):
                done += os.pwritev(self._fd, [view[done:]], position + done)

    def commit(self) -> None:
        """Flush this worker's rows to disk and close (the client renames the file)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                with self._naming_errors():
                    os.fsync(fd)
            finally:
                os.close(fd)

    def _naming_errors(self) -> contextlib.AbstractContextManager[None]:
        """A full disk or quota on a worker, named as a local stream names it (the output as
        the user gave it, and its folder): a bare "[Errno 28] No space left on device" named
        neither (the part is sparse, made at full size, so its blocks are found only here)."""
        return naming_errors(self.output, Path(self.path).parent)

    def abort(self) -> None:
        """Close (the client deletes the part file)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


@dataclass
class ClusterReport:
    """What ``conveyor.dask.stream`` did: the output paths, the reduction's result, and one
    entry per row range (rows, worker, seconds, blocks)."""

    outputs: list[str] = field(default_factory=list)
    result: Any = None
    ranges: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


def stream(compute: Any, inputs: Sequence[Any], outputs: Sequence[Any] | None = None, *,
           client: Any = None, reduce: str | Callable[[Any, Any], Any] | None = None,
           args: Sequence[Any] = (), halo: int = 0, boundary: Any = "nearest",
           device: Any = None, **options: Any) -> ClusterReport:
    """Stream files through ``compute`` on every worker of ``client``'s cluster.

    ``inputs`` are ``.npy`` paths, ``cv.npy(path)`` or ``cv.raw(path, dtype, shape)``;
    ``outputs`` ``.npy`` paths, ``cv.npy_out`` or ``cv.raw_out`` (dtype default: the kernel's
    output parameter type, else input 0's). Each worker runs one stream over its own row
    range (``offset`` is the row in the whole file, ``halo`` rows come from the neighbouring
    ranges, the file's ends are padded under ``boundary`` as in ``cv.stream``: "nearest"
    repeats the edge row, "reflect", "periodic", a constant; "none" is "nearest", as for
    :func:`conveyor.dask.map_blocks`); ``reduce`` folds every
    range's result in row order. Outputs appear only when every range succeeded. ``client``
    defaults to the current ``distributed`` client. ``compute``, ``args``, ``device`` and
    ``options`` as in :func:`conveyor.dask.map_blocks`.
    """
    from conveyor.dask.arrays import _check_boundary, _check_halo, _stream_options
    from conveyor.pipeline.io import as_source
    from conveyor.pipeline.options import as_inputs, as_outputs, count
    from conveyor.pipeline.shaped import Shaped
    from conveyor.pipeline.sinks import as_sink

    started = time.perf_counter()
    job = as_job(compute, device, args, _stream_options(options))
    h = count("halo", halo, 0, "0 or more rows", "an int of 0 or more (rows each side)")
    _check_boundary(boundary)  # named before the cluster is looked for
    if reduce is not None:
        reduce = check_op(job, reduce, "reduce")
    client = _client(client)
    sources = [as_source(x, i) for i, x in enumerate(as_inputs(inputs))]
    try:
        refs = [_source_ref(s, i) for i, s in enumerate(sources)]
    finally:
        for source in sources:
            source.close()
    if not refs:
        raise InputError("a stream needs at least one input file")
    total, row_shape = refs[0][2][0], refs[0][2][1:]
    for i, ref in enumerate(refs):
        if ref[2][0] != total:
            raise InputError(f"input {i} {ref[0]} has {ref[2][0]} rows but input 0 has "
                             f"{total}: inputs must agree on axis 0")
    boundary = _check_halo(h, boundary, [np.dtype(ref[1]) for ref in refs])
    pads = "nearest" if isinstance(boundary, str) and boundary == "none" else boundary
    wanted = as_outputs(outputs)
    if reduce is not None and wanted:
        raise InputError("with reduce=, pass no outputs")
    if isinstance(job.compute, KernelSpec):  # on the client: each range failed on its worker
        job.compute.check_count(len(refs), job.args, "conveyor.dask.stream",
                                outputs=len(wanted) or (1 if reduce is not None else 0))
    default = _default_dtype(job, len(refs), np.dtype(refs[0][1]))
    sinks: list[FileSink] = []
    try:
        for i, out in enumerate(wanted):
            if isinstance(out, Shaped):  # as_sink's advice (an array) is refused below
                raise InputError(f"output {i} is a {type(out).__name__} (cv.rows / "
                                 f"cv.per_block), for a local cv.stream: conveyor.dask.stream "
                                 f"writes one row per input row to files (a .npy path, "
                                 f"cv.npy_out or cv.raw_out)")
            sink = as_sink(out, i, total, row_shape,
                           _default_dtype(job, len(refs), np.dtype(refs[0][1]), i))
            if sink.shape[:1] != (total,):  # its rows are the workers' ranges: never checked
                raise InputError(
                    f"arrays disagree in length along axis 0: input 0 has {total} rows, "
                    f"output {i} {sink.name} has {sink.shape[0] if sink.shape else 0}")
            if not isinstance(sink, FileSink):
                raise InputError(f"output {i}: conveyor.dask.stream writes files (a .npy "
                                 f"path, cv.npy_out or cv.raw_out); use map_blocks for arrays")
            for earlier in sinks:
                if same_file(earlier.target, sink.target):
                    # Both parts were renamed over one file: the last output won, silently.
                    raise InputError(f"outputs {earlier.name} and {sink.name} are one file: "
                                     f"name a different file for each output")
            sinks.append(sink)
        for sink in sinks:
            sink.open()
        # The dtype itself, not its .str: a record's is "|V8" (fields lost on the workers).
        out_refs: list[FileRef] = [(str(s._tmp), s.dtype, s.shape, s.offset, s.name)
                                   for s in sinks]
        # Outputs named by path take the kernel's type as read here (no device's macros).
        defaulted = {i: (f"a type its source chooses by the device's macros, where the client "
                         f"(no device) read {{wanted}}: name the output's type: "
                         f"cv.npy_out({str(out)!r}, np.{{dtype}})")
                     for i, out in enumerate(wanted) if isinstance(out, str | os.PathLike)}
        ranges = _ranges(total, _workers(client))
        futures = [
            client.submit(_stream_range, job, refs, out_refs, lo, hi, h, reduce, defaulted, pads,
                          workers=[addr], allow_other_workers=True, pure=False,
                          key=f"conveyor-rows-{lo}-{hi}-{os.urandom(6).hex()}")
            for addr, (lo, hi) in ranges
        ]
        try:
            done = client.gather(futures)
        except BaseException as exc:
            client.cancel(futures)
            if isinstance(exc, Exception):
                for sink in sinks:  # a worker could not open a part whose folder moved
                    sink.check_place()
            raise
        commit_all(sinks)
    except BaseException:
        for sink in sinks:
            sink.abort()
        raise
    partials = [d.pop("partial") for d in done]
    result = None
    if reduce is not None:
        from conveyor.pipeline import reduce as reducing

        result = reducing.combine(reduce, partials, default,
                                  kernel=isinstance(job.compute, KernelSpec))
    return ClusterReport(outputs=[s.result for s in sinks], result=result, ranges=list(done),
                         seconds=time.perf_counter() - started)


def _stream_range(job: Job, refs: list[InputRef], out_refs: list[FileRef], lo: int, hi: int,
                  halo: int, reduce: Any, defaulted: dict[int, str] | None = None,
                  boundary: Any = "nearest") -> dict[str, Any]:
    """On a worker: stream rows ``lo:hi`` from the input files into the same rows of the
    output files. With a halo, the ``halo`` rows each side (the neighbouring ranges' rows,
    pad rows under ``boundary`` past the file's ends, as one local stream has them) are read
    first and given beside the range's rows (``halo.rows_around``): only the range's rows
    are streamed, so a reduction counts each row of the file once."""
    from conveyor.pipeline.fold import halves_kept_wide
    from conveyor.pipeline.halo import rows_around

    total = refs[0][2][0]
    sources = [_range_source(ref, lo, hi) for ref in refs]
    if halo:
        for ref, source in zip(refs, sources, strict=True):
            whole = _range_source(ref, 0, total)
            try:
                source.beside = rows_around(whole, lo, hi, halo, boundary)
            finally:
                whole.close()
    sinks = [RangeSink(ref, lo, hi) for ref in out_refs]
    with halves_kept_wide():  # a range's total is a partial: the client casts the total once
        report = run(job, list(sources), list(sinks), first_row=lo, halo=halo,
                     boundary=boundary, reduce=reduce, where=f"rows {lo}:{hi} of {refs[0][0]}",
                     defaulted=defaulted)
    return {"rows": (lo, hi), "worker": worker_name(), "seconds": report.seconds,
            "blocks": report.blocks, "partial": report.result}


def _range_source(ref: InputRef, lo: int, hi: int) -> FileSource:
    """Rows ``lo:hi`` of an input file. The file must still have the size and header the
    client read its shape and dtype from: a worker opens it later (a range run again after
    its worker died, minutes later), and a file replaced meanwhile (``np.save`` of another
    dtype, same size) was read as the old dtype, with no error."""
    path, dtype, shape, offset, size, header = ref
    row_bytes = math.prod(shape[1:]) * np.dtype(dtype).itemsize
    return FileSource(path, dtype, (hi - lo, *shape[1:]), offset + lo * row_bytes,
                      header=header, size=size)


def _source_ref(source: Any, index: int) -> InputRef:
    from conveyor.pipeline.chunks import IterSource
    from conveyor.pipeline.image import ImageSource

    if isinstance(source, IterSource | ImageSource):  # map_blocks refuses them too
        what = "a cv.iterate(...)" if isinstance(source, IterSource) else "a cv.image(...)"
        raise InputError(f"input {index} is {what}, which one device's local stream reads "
                         f"(cv.stream): conveyor.dask.stream reads .npy or raw files, each "
                         f"worker its own rows; pass the file's path")
    if not isinstance(source, FileSource):
        raise InputError(f"input {index} ({source.name}): conveyor.dask.stream reads .npy or "
                         f"raw files (each worker reads its own rows); use map_blocks for "
                         f"arrays")
    resolved = Path(source.path).resolve()
    try:
        same = os.path.samefile(resolved, source.path)
    except OSError:  # the resolved name is no file at all
        same = False
    if not same:
        # /proc/self/fd/N of a deleted or unnamed file resolves to its link text, ".../x.npy
        # (deleted)": no file (a raw FileNotFoundError on every worker, after the parts were
        # made), or another file planted under that name, read in its place.
        raise InputError(f"input {index} {source.name} resolves to {resolved}, which is not "
                         f"the same file (a deleted file, or one with no name): the workers "
                         f"open inputs by name and cannot open it; copy it to a path they can "
                         f"read")
    return (str(resolved), source.dtype, source.shape, source.offset, source._size,
            source._header)


def _default_dtype(job: Job, inputs: int, fallback: np.dtype, index: int = 0) -> np.dtype:
    """Output ``index``'s type where none is given: its kernel parameter's, else
    ``fallback`` (input 0's). Each output its own: two of int and float were given the
    first one's type, and the second refused on every worker."""
    if isinstance(job.compute, KernelSpec):
        found = job.compute.output_dtype(inputs, index)
        if found is not None:
            return found
    return fallback


def _client(client: Any) -> Any:
    if client is not None:
        if getattr(client, "status", "running") in ("closing", "closed"):
            # Its scheduler_info() had no "workers": a bare KeyError.
            raise InputError("the Dask client is closed: pass an open Client (or none, to "
                             "use the current one)")
        if not all(callable(getattr(client, name, None))
                   for name in ("submit", "run", "scheduler_info")):
            # An address given as the command line's --scheduler takes it: a raw
            # AttributeError ('str' object has no attribute 'scheduler_info').
            hint = f"Client({client!r})" if isinstance(client, str) else "Client(...)"
            raise InputError(f"client={client!r} ({type(client).__name__}) is not a Dask "
                             f"client: pass a distributed.Client, e.g. client={hint}, or none "
                             f"to use the current one")
        return client
    try:
        from distributed import get_client

        return get_client()
    except (ImportError, ValueError) as exc:
        raise InputError("conveyor.dask.stream needs a Dask cluster: pass client=Client(...) "
                         "(pip install 'conveyor[dask]')") from exc


def _workers(client: Any) -> list[str]:
    """The cluster's workers, asked of the scheduler: ``client.scheduler_info()`` returns a
    cache that the client's own refresh every 2 s (totals only, no workers) may replace
    between its fetch and its return ("no workers" once in ~1,000 file streams)."""
    try:
        info = client.sync(client.scheduler.identity, n_workers=-1)
    except Exception:  # an older distributed, or a client object without these
        info = client.scheduler_info(n_workers=-1)
    workers = sorted(info.get("workers") or ())
    if not workers:
        raise InputError("the Dask cluster has no workers: start some, or wait for them "
                         "(client.wait_for_workers(n))")
    return workers


def _ranges(total: int, workers: list[str]) -> list[tuple[str, tuple[int, int]]]:
    """One row range per worker, as even as rows allow (none empty unless no rows at all)."""
    count = max(1, min(len(workers), total))
    bounds = [total * k // count for k in range(count + 1)]
    return [(workers[k], (bounds[k], bounds[k + 1])) for k in range(count)]
