"""Parquet and Arrow IPC inputs: numeric columns read one row group / record batch at a time.

:func:`parquet` and :func:`arrow` (``cv.parquet``, ``cv.arrow``; PyArrow, extra ``parquet``)
check everything that can fail before any work: the columns exist, are numeric and of one
dtype, and hold no nulls (from the row groups' statistics and the batches' validity buffers).
A file that shrinks while it is read is an InputError, as a ``.npy``'s is.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

import numpy as np

from conveyor.errors import InputError
from conveyor.pipeline.io import PathLike, Source, _existing, open_regular
from conveyor.pipeline.validate import arrow_nulls


class ChunkedSource(Source):
    """A column stored in chunks (Parquet row groups, Arrow record batches), decoded one chunk
    at a time; the last chunks used are kept, since consecutive blocks share them."""

    def __init__(self, name: str, dtype: np.dtype, row_shape: tuple[int, ...],
                 chunk_rows: Sequence[int], load: Callable[[int], np.ndarray]) -> None:
        self.name = name
        self.path = name  # the file (trace= must not name it: stream.py _check_trace)
        self.dtype = dtype
        self.starts = np.concatenate([[0], np.cumsum(chunk_rows, dtype=np.int64)])
        self.shape = (int(self.starts[-1]), *row_shape)
        self._load = load
        self._kept: dict[int, np.ndarray] = {}
        # One load at a time: two streams of one cv.parquet object (threads, or one object
        # given twice over two devices) called read_row_group on one ParquetFile at once,
        # which hung, crashed or said the file was damaged (PyArrow's reader is not shared).
        self._lock = threading.Lock()

    def close(self) -> None:
        """Let go of the chunks kept (the file stays open: the source may be streamed again)."""
        self._kept = {}

    def _chunk(self, index: int) -> np.ndarray:
        chunk = self._kept.get(index)
        if chunk is None:
            with self._lock:
                chunk = self._kept.get(index)  # another reader's load, while this one waited
                if chunk is None:
                    chunk = self._load(index)
                    kept = {k: v for k, v in self._kept.items() if k >= index - 1}
                    kept[index] = chunk
                    self._kept = kept
        return chunk

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo:hi`` (a view of one chunk, or the chunks joined)."""
        first = int(np.searchsorted(self.starts, lo, side="right")) - 1
        parts = []
        index = first
        while index < len(self.starts) - 1 and self.starts[index] < hi:
            start = int(self.starts[index])
            chunk = self._chunk(index)
            parts.append(chunk[max(lo - start, 0) : hi - start])
            index += 1
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.empty((0, *self.shape[1:]), self.dtype)


def parquet(path: PathLike, columns: str | Sequence[str]) -> ChunkedSource:
    """Numeric column(s) of a Parquet file as an input, decoded one row group at a time.
    Several columns (of one dtype) make a 2-D input, one column per row element."""
    pq = _pyarrow("parquet")
    target = _existing(path)
    handle = _open(target)
    with _closed_on_error(handle):
        try:
            file = pq.ParquetFile(handle)
        except Exception as exc:
            raise InputError(f"{path} is not a Parquet file ({exc}): write one with "
                             f"pyarrow.parquet.write_table(table, path)") from exc
        names = _column_names(str(path), columns)
        schema = file.schema_arrow
        dtype = _column_dtype(str(path), schema, names)
        meta = file.metadata
        groups = [meta.row_group(i).num_rows for i in range(file.num_row_groups)]
        for i in range(file.num_row_groups):
            group = meta.row_group(i)
            for j in range(group.num_columns):
                column = group.column(j)
                stats = column.statistics
                if (column.path_in_schema in names and stats is not None
                        and stats.has_null_count and stats.null_count):
                    _refuse_nulls(str(path), column.path_in_schema, stats.null_count,
                                  f"row group {i}")
        stamp = _stamp(target)

    def load(index: int) -> np.ndarray:
        with _read_guard(str(path), target, stamp, f"row group {index}"):
            table = file.read_row_group(index, columns=names)
        return _table_rows(str(path), table, names, dtype, row_shape)

    row_shape = _row_shape(columns, names)
    return ChunkedSource(str(path), dtype, row_shape, groups, load)


def arrow(path: PathLike, columns: str | Sequence[str]) -> ChunkedSource:
    """Numeric column(s) of an Arrow IPC (Feather v2) file as an input, one record batch at a
    time. Read with file reads, not a memory map, so a file that shrinks while it is read is
    an InputError, not a SIGBUS."""
    pa = _pyarrow("ipc")
    import pyarrow

    from conveyor.pipeline import ipcfile

    target = _existing(path)
    handle = _open(target)
    with _closed_on_error(handle):
        try:
            batches = ipcfile.record_batches(handle.fileno())
            reader = pa.open_file(handle)
        except Exception as exc:
            raise InputError(f"{path} is not an Arrow IPC file ({exc}): write one with "
                             f"pyarrow.feather.write_feather(table, path) (an Arrow IPC "
                             f"stream, written by pyarrow.ipc.new_stream, is read by neither: "
                             f"write it again with pyarrow.ipc.new_file)") from exc
        names = _column_names(str(path), columns)
        dtype = _column_dtype(str(path), reader.schema, names)
        for name in names:
            for index, count in enumerate(ipcfile.column_nulls(reader.schema, name, batches)):
                if count:
                    _refuse_nulls(str(path), name, count, f"record batch {index}")
        stamp = _stamp(target)

    def load(index: int) -> np.ndarray:
        with _read_guard(str(path), target, stamp, f"record batch {index}"):
            batch = reader.get_batch(index)
        return _table_rows(str(path), pyarrow.Table.from_batches([batch]), names, dtype,
                           row_shape)

    row_shape = _row_shape(columns, names)
    return ChunkedSource(str(path), dtype, row_shape, [b.rows for b in batches], load)


# -- helpers ---------------------------------------------------------------------------------
def _pyarrow(module: str) -> Any:
    try:
        import importlib

        return importlib.import_module(f"pyarrow.{module}")
    except ImportError as exc:
        raise InputError("Parquet and Arrow files need PyArrow: pip install "
                         "'conveyor[parquet]'") from exc


def _open(target: Path) -> BinaryIO:
    """``target`` opened for PyArrow to read, once, through ``io.open_regular``: a FIFO put in
    its place after its check (``_existing``) is refused there, where PyArrow's own open of
    the path waited for a writer for ever. A file gone or unreadable since is an InputError,
    as the check's are."""
    name = f"input file {target}"
    try:
        fd = open_regular(target, name)
    except OSError as exc:
        raise InputError(f"cannot read {name} ({exc.strerror}): check the path and its "
                         f"permissions") from exc
    return os.fdopen(fd, "rb")


@contextlib.contextmanager
def _closed_on_error(handle: BinaryIO) -> Iterator[None]:
    """Close ``handle`` if the checks made with it fail: the source that would hold it is
    never made, and the error's traceback kept it (and its descriptor) open meanwhile."""
    try:
        yield
    except BaseException:
        handle.close()
        raise


def _column_names(path: str, columns: Any) -> list[str]:
    """``columns`` (a name, or a sequence of names) as a list; InputError for anything else:
    None or a number was a raw TypeError, bytes were taken as numbers, and an empty list was
    said to hold "columns of different types"."""
    if isinstance(columns, str):
        return [columns]
    names = None
    if not isinstance(columns, bytes | bytearray):
        try:
            names = list(columns)
        except TypeError:
            pass
    if names is None or not all(isinstance(name, str) for name in names):
        raise InputError(f"{path}: columns={columns!r}: name a column (a str) or give a list "
                         f"of names, e.g. 'x' or ['x', 'y']")
    if not names:
        raise InputError(f"{path}: columns=[] names no column: give at least one, e.g. ['x']")
    return names


def _column_dtype(path: str, schema: Any, names: list[str]) -> np.dtype:
    import pyarrow

    dtypes = []
    for name in names:
        if name not in schema.names:
            raise InputError(f"{path} has no column {name!r}; columns: "
                             f"{', '.join(schema.names)}")
        if len(schema.get_all_field_indices(name)) > 1:  # schema.field() raises KeyError
            raise InputError(f"{path} holds {schema.names.count(name)} columns named "
                             f"{name!r}: which one is meant is ambiguous; write the table "
                             f"with distinct column names")
        arrow_type = schema.field(name).type
        if pyarrow.types.is_dictionary(arrow_type):  # decoded as it is read: its values count
            arrow_type = arrow_type.value_type
        try:
            dtype = np.dtype(arrow_type.to_pandas_dtype())
        except (NotImplementedError, TypeError) as exc:
            raise InputError(f"column {name!r} of {path} is {schema.field(name).type}, not "
                             f"numeric: pick a numeric column") from exc
        if dtype.hasobject or dtype.kind not in "biuf":
            raise InputError(f"column {name!r} of {path} is {schema.field(name).type}, not "
                             f"numeric: pick a numeric column")
        dtypes.append(dtype)
    if len(set(dtypes)) != 1:
        raise InputError(f"columns {names} of {path} have different types {dtypes}: stream "
                         f"them as separate inputs")
    return dtypes[0]


def _stamp(path: Path) -> tuple[int, int, int]:
    """(inode, size, modification time) of the file, as its metadata was read."""
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns


def _damaged(exc: BaseException) -> bool:
    """True for PyArrow's errors of decoding a file (ArrowInvalid, its thrift and page errors,
    raised as OSError), not the system's (a permission, a vanished file)."""
    import pyarrow

    if isinstance(exc, OSError):  # the system's carry an errno; PyArrow's decoding ones none
        return exc.errno is None
    return isinstance(exc, pyarrow.ArrowException)


@contextlib.contextmanager
def _read_guard(name: str, path: Path, stamp: tuple[int, int, int], part: str = ""
                ) -> Iterator[None]:
    """A failed read of a file that is now shorter than when its metadata was read is an
    InputError (as a .npy's is), as is one of a file written in place since (it changed, it
    is not damaged); so is one that PyArrow finds damaged (``part`` names what
    was read: "row group 2"); other failures pass as they are. After a read, a file of
    the same inode whose size or modification time changed was written in place meanwhile
    (a same-size rewrite read its new row groups against the old metadata, with no error):
    an InputError. A file replaced by another (a rename over it) is still read whole from the
    one opened."""
    ino, size, _ = stamp
    try:
        yield
    except Exception as exc:
        try:
            now = _stamp(path)
        except OSError:
            now = (-1, -1, -1)
        if now[1] < size:
            raise InputError(f"{name} got shorter while it was read: rerun on a complete "
                             f"file") from exc
        if now[0] == ino and now != stamp:
            # Rewritten in place (same size or longer): PyArrow fails to decode the new bytes
            # against the old metadata, but the file is whole; "damaged" sent the user to
            # write again a file that is fine.
            raise _changed(name, now[1]) from exc
        if _damaged(exc):
            what = " ".join(str(exc).split()) or type(exc).__name__
            where = f" ({part})" if part else ""
            raise InputError(f"{name} is damaged{where}: {what}: write the file again") from exc
        raise
    try:
        after = _stamp(path)
    except OSError:
        return  # removed: the open file is still whole
    if after[0] == ino and after[1] < size:
        raise InputError(f"{name} got shorter while it was read: rerun on a complete file")
    if after[0] == ino and after != stamp:
        raise _changed(name, after[1])


def _changed(name: str, size: int) -> InputError:
    """The error of a file written in place while it was read (now ``size`` bytes)."""
    return InputError(f"{name} changed while it was read (written by another program: now "
                      f"{size} bytes): the rows read may mix its old and new contents; "
                      f"rerun once nothing writes the file, or stream a copy of it")


def _refuse_nulls(path: str, name: str, count: int, where: str) -> NoReturn:
    raise InputError(f"column {name!r} of {path} has {count} nulls ({where}): fill them "
                     f"(pyarrow.compute.fill_null) before streaming")


def _row_shape(columns: str | Sequence[str], names: list[str]) -> tuple[int, ...]:
    return () if isinstance(columns, str) else (len(names),)


def _table_rows(path: str, table: Any, names: list[str], dtype: np.dtype,
                row_shape: tuple[int, ...]) -> np.ndarray:
    arrays = []
    for name in names:
        column = table.column(name)
        nulls = arrow_nulls(column)  # a dictionary's null values too
        if nulls:
            raise InputError(f"column {name!r} of {path} has {nulls} nulls: fill "
                             f"them (pyarrow.compute.fill_null) before streaming")
        arrays.append(column.to_numpy())
    if len(arrays) == 1 and row_shape == ():  # one column named as a str: rows are scalars
        return np.ascontiguousarray(arrays[0], dtype=dtype)
    # A list of columns, even of one, gives rows of len(names) values (_row_shape).
    return np.ascontiguousarray(np.stack(arrays, axis=1), dtype=dtype)
