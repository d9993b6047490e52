"""What an Arrow IPC (Feather v2) file holds, read from its footer and message headers with
plain file reads: the rows and null counts of each record batch.

``cv.arrow`` needs both before any work (the plan is made from the rows; nulls are refused up
front) without reading the data, and without a memory map: a mapped file that shrinks while
it is read kills the process with SIGBUS. PyArrow decodes a batch's metadata only together
with its body, so the few fields needed are read here from the flatbuffers the format defines
(``File.fbs``: Footer, Block; ``Message.fbs``: Message, RecordBatch, FieldNode).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

MAGIC = b"ARROW1"
_CONTINUATION = 0xFFFFFFFF
_RECORD_BATCH = 3  # MessageHeader.RecordBatch


@dataclass(frozen=True)
class BatchInfo:
    """One record batch: its rows, and the null count of each field node (schema order,
    depth first)."""

    rows: int
    null_counts: tuple[int, ...]


class _Table:
    """A flatbuffer table: field ``k``'s position, or None when absent."""

    def __init__(self, buf: bytes, pos: int) -> None:
        self.buf = buf
        self.pos = pos
        self.vtable = pos - struct.unpack_from("<i", buf, pos)[0]
        self.vtable_size = struct.unpack_from("<H", buf, self.vtable)[0]

    def field(self, k: int) -> int | None:
        entry = 4 + 2 * k
        if entry >= self.vtable_size:
            return None
        offset = struct.unpack_from("<H", self.buf, self.vtable + entry)[0]
        return self.pos + offset if offset else None

    def scalar(self, k: int, fmt: str, default: int = 0) -> int:
        at = self.field(k)
        return default if at is None else int(struct.unpack_from(fmt, self.buf, at)[0])

    def table(self, k: int) -> _Table | None:
        at = self.field(k)
        return None if at is None else _Table(self.buf, at + _u32(self.buf, at))

    def vector(self, k: int) -> tuple[int, int]:
        """(count, position of the first element) of vector field ``k``."""
        at = self.field(k)
        if at is None:
            return 0, 0
        start = at + _u32(self.buf, at)
        return _u32(self.buf, start), start + 4


def _u32(buf: bytes, at: int) -> int:
    return int(struct.unpack_from("<I", buf, at)[0])


def _read(fd: int, offset: int, size: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise ValueError(f"{size} bytes at {offset} run past the end of the file")
    return data


def _check_block(index: int, offset: int, meta_size: int, body_size: int, size: int) -> None:
    """ValueError when record batch ``index``'s block (as the footer gives it) does not lie
    within the file's ``size`` bytes. Checked before anything is read: a damaged or crafted
    footer that claimed 2 GiB of metadata had that much allocated for the read (``os.pread``
    makes its buffer first), a bare MemoryError under a memory limit."""
    if offset < 0 or meta_size < 8 or body_size < 0 or offset + meta_size + body_size > size:
        raise ValueError(
            f"record batch {index} claims bytes past its end or outside it (metadata of "
            f"{meta_size} and a body of {body_size} bytes at byte {offset}; the file has "
            f"{size} bytes): the file is damaged or was cut short; write it again "
            f"(pyarrow.feather.write_feather, or pyarrow.ipc.new_file)")


def record_batches(path: str | os.PathLike[str] | int) -> list[BatchInfo]:
    """The record batches of the Arrow IPC file ``path`` (or of the open descriptor ``path``,
    read with ``pread`` and left open: the caller opened it once, checked as a regular file),
    in order. Raises ValueError when it is not one (a record batch the footer places past
    the file's end included, checked before any is read), OSError when it cannot be read."""
    owned = not isinstance(path, int)
    fd = path if isinstance(path, int) else os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size < 2 * len(MAGIC) + 4 or _read(fd, 0, len(MAGIC)) != MAGIC:
            raise ValueError("no Arrow IPC file magic at its start")
        tail = _read(fd, size - len(MAGIC) - 4, len(MAGIC) + 4)
        if tail[4:] != MAGIC:
            raise ValueError("no Arrow IPC file magic at its end")
        footer_size = struct.unpack_from("<i", tail)[0]
        if not 0 < footer_size <= size - 2 * len(MAGIC) - 4:
            raise ValueError(f"footer size {footer_size} does not fit the file")
        footer_buf = _read(fd, size - len(MAGIC) - 4 - footer_size, footer_size)
        footer = _Table(footer_buf, _u32(footer_buf, 0))
        count, first = footer.vector(3)  # recordBatches: [Block]
        # Block {offset: long, metaDataLength: int, (4 bytes of padding), bodyLength: long}
        blocks = [struct.unpack_from("<qi4xq", footer_buf, first + 24 * i)
                  for i in range(count)]
        for i, (offset, meta_size, body_size) in enumerate(blocks):
            _check_block(i, offset, meta_size, body_size, size)
        return [_batch(_read(fd, offset, meta_size)) for offset, meta_size, _ in blocks]
    except (struct.error, IndexError) as exc:
        raise ValueError(f"a malformed Arrow IPC footer or message ({exc})") from exc
    finally:
        if owned:
            os.close(fd)


def _batch(meta: bytes) -> BatchInfo:
    """The rows and null counts in one record batch message's metadata."""
    start = 8 if _u32(meta, 0) == _CONTINUATION else 4
    buf = meta[start:]
    message = _Table(buf, _u32(buf, 0))
    if message.scalar(1, "<B") != _RECORD_BATCH:
        raise ValueError("a record batch block does not hold a record batch")
    header = message.table(2)
    if header is None:
        raise ValueError("a record batch message without its header")
    rows = header.scalar(0, "<q")
    count, first = header.vector(1)  # nodes: [FieldNode {length: long, null_count: long}]
    nulls = tuple(struct.unpack_from("<q", buf, first + 16 * i + 8)[0] for i in range(count))
    return BatchInfo(rows, nulls)


def column_nulls(schema: Any, name: str, batches: list[BatchInfo]) -> list[int]:
    """The null count of top-level column ``name`` (of the PyArrow ``schema``) in each batch;
    empty when the batches' field nodes do not match the schema (then nothing is known)."""
    counts = [_nodes(schema.field(i).type) for i in range(len(schema.names))]
    field = schema.get_field_index(name)
    if field < 0 or any(len(b.null_counts) != sum(counts) for b in batches):
        return []
    node = sum(counts[:field])
    return [b.null_counts[node] for b in batches]


def _nodes(arrow_type: Any) -> int:
    """Field nodes a record batch holds for a column of ``arrow_type``: its own, then its
    children's, depth first."""
    children = getattr(arrow_type, "num_fields", 0)
    return 1 + sum(_nodes(arrow_type.field(i).type) for i in range(children))
