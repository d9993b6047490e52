"""Inputs and outputs that share memory (or bytes of one file), found before any work.

A stream gives NumPy's answer: every input as it was before any output was written. An input
that is exactly an output (the same rows at the same bytes: ``inputs=[a], outputs=[a]``) is
run in place: a block's output rows are written only after its own input rows were read, and
the halo rows that a block reads from its neighbour before are saved before the first block
(pipeline/halo.py). Any other overlap (``inputs=[a[:-1]], outputs=[a[1:]]``) would read rows
that a block before has already overwritten: it is an InputError that says to pass a copy.
Two outputs that share memory are refused too: which one's rows would stay there depends on
the order of the copies, block by block.

A chain run in place is exact only while every link reads the input before the output
that is the same array is written: ``read_after_written`` names the links that read it
later, and such a stream copies instead of using the arrays in place (zero-copy).

Memory is compared with ``np.shares_memory``, its search bounded (``MAX_WORK``): for
views of many strided dimensions the exact answer is a knapsack problem that can take
minutes, so an overlap that the bounded search cannot rule out is refused too. Two memory
maps of one file have different addresses, so arrays backed by a file (``np.memmap``,
``np.load(mmap_mode=)``) and file inputs (``cv.npy``, ``cv.raw``) are compared by file and
byte range too (the mapping's file and offset come from ``/proc/self/maps``; without it, on
other systems, only memory is compared). File outputs never overlap anything: they are
written into a temporary file renamed at the end.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from conveyor.errors import InputError
from conveyor.memory.hostmem import address, byte_bounds
from conveyor.pipeline.io import ArraySource, FileSource, Source
from conveyor.pipeline.sinks import ArraySink, Sink

#: How hard ``np.shares_memory`` may search (its ``max_work``): about 0.05 s for two arrays.
#: Only views of many strided dimensions whose byte ranges interleave need more.
MAX_WORK = 1_000_000

#: (st_dev, st_ino, first byte, end byte) of a file range.
FileRange = tuple[int, int, int, int]


@dataclass
class _Region:
    """The host bytes of one input or output."""

    array: np.ndarray | None  # the memory, for arrays
    file: FileRange | None  # the bytes of a file, for file inputs and file-backed arrays
    rows: int
    contiguous: bool


def in_place_inputs(sources: Sequence[Source], sinks: Sequence[Sink]) -> frozenset[int]:
    """The inputs that are exactly an output (run in place). InputError, naming both and the
    fix, for an input that overlaps an output in any other way, and for two outputs that
    share memory (which one's rows end up there would depend on the order of the copies)."""
    return frozenset(i for i, _ in in_place_pairs(sources, sinks))


def in_place_pairs(sources: Sequence[Source], sinks: Sequence[Sink]
                   ) -> frozenset[tuple[int, int]]:
    """``(input, output)`` for every input that is exactly that output; InputError as
    :func:`in_place_inputs` says."""
    inputs = [_region(s) for s in sources]
    outputs = [_region(s) for s in sinks]
    present = [r for r in (*inputs, *outputs) if r is not None]
    if not any(outputs) or len(present) < 2:
        return frozenset()
    if _any_file(outputs) and _any_file(present):
        maps = _read_maps()
        written = {id(r) for r in outputs if r is not None}
        for region in present:
            if region.array is not None and region.file is None:
                # An output in a private (copy-on-write) map writes its own pages, never the
                # file: compared by memory only. (An input in one still shows the file's
                # bytes it has not written: compared by file too.)
                region.file = mapped_file(region.array, maps,
                                           shared_only=id(region) in written)
    for j, first in enumerate(outputs):
        for k in range(j + 1, len(outputs)):
            second = outputs[k]
            relation = "apart" if first is None or second is None else _relation(first, second)
            if relation != "apart":
                raise InputError(
                    f"outputs {j} and {k} {_SHARE[relation]}: each block's copy of one would "
                    f"overwrite rows of the other, so the result would depend on the order "
                    f"of the copies. {_UNDECIDED if relation == 'undecided' else ''}"
                    f"Pass a separate array for each output"
                )
    in_place: set[tuple[int, int]] = set()
    for i, source in enumerate(inputs):
        for j, sink in enumerate(outputs):
            if source is None or sink is None:
                continue
            relation = _relation(source, sink)
            if relation == "same":
                in_place.add((i, j))
            elif relation == "partial":
                raise InputError(
                    f"input {i} and output {j} overlap in memory but are not the same rows "
                    f"(as in inputs=[a[:-1]], outputs=[a[1:]]): blocks would read rows that "
                    f"earlier blocks have already overwritten. Pass a copy of the input "
                    f"(inputs=[x.copy()]) or a separate output array; the very same array as "
                    f"input and output (in place) is fine"
                )
            elif relation == "undecided":
                raise InputError(
                    f"input {i} and output {j} {_SHARE[relation]}: blocks might read rows "
                    f"that earlier blocks have already overwritten. {_UNDECIDED}Pass a copy "
                    f"of the input (inputs=[x.copy()]) or a separate output array"
                )
    return frozenset(in_place)


def check_tables(tables: Sequence[tuple[str, np.ndarray]], sinks: Sequence[Sink],
                 callables: Sequence[tuple[str, np.ndarray]] = ()) -> None:
    """InputError for a writable resident table (``(name, host array)``: copied back into
    its array after the stream; one entry per handle) that shares memory with an output
    array, with another writable table, or with an array a callable link is given in its
    ``args`` (``callables``): the copy-back would silently replace what the stream, the
    other table or the callable wrote there."""
    outputs = [(f"output {j}", s.array) for j, s in enumerate(sinks)
               if isinstance(s, ArraySink) and s.array.nbytes]
    outputs += [(f"the array in {name}", array) for name, array in callables if array.nbytes]
    for t, (name, table) in enumerate(tables):
        for other, array in outputs + list(tables[t + 1:]):
            shared = _shares(table, array)
            if shared is not False:
                says, why = ("shares memory", "") if shared else ("may share memory", _UNDECIDED)
                raise InputError(
                    f"{name} is a cv.resident(..., writable=True) table that {says} "
                    f"with {other}: the table is copied back into its array after the "
                    f"stream, over what the stream wrote there. {why}Pass a separate array "
                    f"for each")
    _check_table_files(tables, outputs, sinks)


def _check_table_files(tables: Sequence[tuple[str, np.ndarray]],
                       outputs: Sequence[tuple[str, np.ndarray]], sinks: Sequence[Sink]
                       ) -> None:
    """:func:`check_tables` for a writable table in a shared memory map of a file: another
    map of the same file's bytes among the outputs or the other tables (two maps of one
    file share no memory, but write the same bytes), or a file output that is that file
    (renamed over it at the end, the table's copy-back lost)."""
    mapped = [(name, table) for name, table in tables if table.nbytes and _file_backed(table)]
    if not mapped:
        return
    maps = _read_maps()

    def where(array: np.ndarray) -> FileRange | None:
        return mapped_file(array, maps, shared_only=True) if _file_backed(array) else None

    # A file output replaces the name it is given (a rename): the table's file is lost only
    # where that name is the one the table was mapped from (a hard link of it is another
    # name, which the rename replaces with the table's file left as it was).
    targets = []
    for j, sink in enumerate(sinks):
        target = getattr(sink, "target", None)
        with contextlib.suppress(OSError, TypeError, ValueError):
            if target is not None:
                targets.append((f"output {j} ({target})", os.path.realpath(target)))
    others = [(other, where(array)) for other, array in (*outputs, *tables)]
    for name, table in mapped:
        mine = where(table)
        if mine is None:  # a private map: its writes never reach the file
            continue
        for other, theirs in others:
            if other != name and theirs is not None and theirs[:2] == mine[:2] and \
                    mine[2] < theirs[3] and theirs[2] < mine[3]:
                raise InputError(
                    f"{name} is a cv.resident(..., writable=True) table mapped from the same "
                    f"bytes of a file as {other}: the table is copied back into the file after "
                    f"the stream, over what the stream wrote there. Pass a separate file or "
                    f"array for each")
        named = mapped_path(table, maps)
        for other, path in targets:
            if named is not None and os.path.realpath(named) == path:
                raise InputError(
                    f"{name} is a cv.resident(..., writable=True) table mapped from the file "
                    f"that {other} replaces at the end of the stream: the table's copy-back "
                    f"into it would be lost. Write the output to another file")


def read_after_written(compute: object, pairs: frozenset[tuple[int, int]]) -> list[str]:
    """A chain's reads of an input that is also an output (``pairs``: (input, output))
    in a link after the one that wrote that output, each named for messages. Used in place
    (zero-copy), the input's buffer is the output's: such a link would read the new values,
    not the input's, where NumPy's answer reads every input before any output is written."""
    links = list(getattr(compute, "links", ()))  # a bound chain (pipeline/chainbind.py)
    found = []
    for i, j in sorted(pairs):
        writer = next((k for k, b in enumerate(links)
                       if any(r.kind == "out" and r.index == j for r in b.writes)), None)
        if writer is None:
            continue
        found += [f"{b.where()} reads input in{i} after {links[writer].where()} wrote "
                  f"output out{j}, the same array" for b in links[writer + 1:]
                  if any(r.kind == "in" and r.index == i for r in b.reads)]
    return found


def _region(item: Source | Sink) -> _Region | None:
    inner = getattr(item, "inner", None)
    if inner is not None:  # a wrapper reads another source's bytes (io.BoolChecked, a cast)
        return _region(inner)
    if isinstance(item, ArraySource | ArraySink):
        array = item.array
        if array.nbytes == 0:
            return None
        return _Region(array, None, int(array.shape[0]), bool(array.flags.c_contiguous))
    if isinstance(item, FileSource):
        if item.nbytes == 0:
            return None
        try:
            stat = os.stat(item.path)
        except OSError:
            return None
        return _Region(None, (stat.st_dev, stat.st_ino, item.offset, item.offset + item.nbytes),
                       item.shape[0], True)
    return None  # file outputs (a temporary file), Parquet/Arrow, iterables


def _relation(a: _Region, b: _Region) -> str:
    """"same" (the same rows at the same bytes), "partial" (other overlap) or "apart"."""
    if a.array is not None and b.array is not None and np.may_share_memory(a.array, b.array):
        if (a.contiguous and b.contiguous and a.rows == b.rows
                and a.array.nbytes == b.array.nbytes
                and address(a.array) == address(b.array)):
            return "same"
        shared = _shares(a.array, b.array)
        if shared is None:
            return "undecided"
        if shared:
            return "partial"
    if a.file is not None and b.file is not None and a.file[:2] == b.file[:2]:
        if a.file[2] < b.file[3] and b.file[2] < a.file[3]:
            if a.file == b.file and a.rows == b.rows and a.contiguous and b.contiguous:
                return "same"
            return "partial"
    return "apart"


#: How a relation other than "apart" reads in messages.
_SHARE = {
    "same": "share memory", "partial": "share memory",
    "undecided": "may share memory",
}

#: Why an overlap was not decided, for messages.
_UNDECIDED = ("Their bytes interleave, and their strided dimensions are too many to rule out a "
              "shared byte in a bounded search. ")


def _shares(a: np.ndarray, b: np.ndarray) -> bool | None:
    """Whether ``a`` and ``b`` share a byte; None where ``MAX_WORK`` did not decide it."""
    try:
        # NumPy's stubs allow only -1 and 0; any positive bound works at run time.
        return bool(np.shares_memory(a, b, max_work=MAX_WORK))  # type: ignore[arg-type]
    except np.exceptions.TooHardError:
        return None


def file_backed(array: np.ndarray) -> bool:
    """True when ``array``'s memory is a mapping of a file (np.memmap, an mmap)."""
    return _file_backed(array)


#: A file mapping of this process: (start, end, file offset, path, private).
Mapping = tuple[int, int, int, str, bool, tuple[int, int]]  # ..., (device, inode)


def read_maps() -> list[Mapping]:
    """This process's file mappings (see :func:`_read_maps`)."""
    return _read_maps()


def mapped_path(array: np.ndarray, maps: list[Mapping]) -> str | None:
    """The path of the file behind file-backed ``array`` (None where not found)."""
    low = byte_bounds(array)[0]
    return next((path for start, end, _, path, _, _ in maps if start <= low < end), None)


def shared_file(array: np.ndarray, maps: list[Mapping]) -> str | None:
    """The path of the file that file-backed ``array`` writes through a shared mapping, or
    None (not found, or a private, copy-on-write mapping, whose writes stay in memory)."""
    low = byte_bounds(array)[0]
    return next((path for start, end, _, path, private, _ in maps
                 if start <= low < end and not private), None)


def check_map_sizes(arrays: Sequence[tuple[str, np.ndarray]],
                    maps: list[Mapping] | None = None) -> None:
    """InputError for a file-backed array (``what``, array) whose file was cut below what its
    map reaches after it was mapped: reading or writing those pages kills the process with
    SIGBUS (no Python error), so it is refused before any work. ``maps``: :func:`read_maps`
    already read (read here where needed, else)."""
    for what, array in arrays:
        if not array.size or not _file_backed(array):
            continue
        maps = _read_maps() if maps is None else maps
        low, high = byte_bounds(array)
        for start, end, offset, path, _, (_, inode) in maps:
            if not start <= low < end:
                continue
            try:
                held = os.stat(path)
            except OSError:
                break  # removed or replaced since: its size cannot be read by name
            needed = offset + high - start
            if held.st_ino == inode and held.st_size < needed:
                raise InputError(
                    f"{what} is a memory map of {path}, which now holds {held.st_size} "
                    f"bytes, fewer than the {needed} the map reaches: the file was cut after "
                    f"it was mapped, and touching those pages would kill the process "
                    f"(SIGBUS); map the file again (np.load(..., mmap_mode=...))")
            break


def mapping_of(array: np.ndarray) -> object | None:
    """The mapping behind ``array``'s memory (the mmap.mmap of an np.memmap, shared by its
    slices, where NumPy keeps it), or None."""
    base: object = array
    while base is not None:
        if isinstance(base, mmap.mmap):
            return base
        if isinstance(base, np.memmap):
            return getattr(base, "_mmap", None) or base
        # np.frombuffer(an mmap.mmap) keeps a memoryview as its base, the mmap behind it.
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return None


def _file_backed(array: np.ndarray) -> bool:
    return mapping_of(array) is not None


def _any_file(regions: Sequence[_Region | None]) -> bool:
    return any(r is not None and (r.file is not None
                                  or (r.array is not None and _file_backed(r.array)))
               for r in regions)


def maps_lines() -> list[str]:
    """The lines of ``/proc/self/maps`` (none where it cannot be read), read as bytes, split
    at ``\\n`` only and decoded as the file system names files (as text, a mapped file whose
    name is not UTF-8 raised UnicodeDecodeError in every memmap stream, and ``splitlines``
    also cut at U+2028). A path's ``\\012`` may be a newline the kernel escaped or those four
    characters: :func:`_map_path` tells them apart."""
    try:
        with open("/proc/self/maps", "rb") as f:
            data = f.read()
    except OSError:
        return []
    return [os.fsdecode(line) for line in data.split(b"\n") if line]


def _map_path(text: str, span: str, node: tuple[int, int]) -> str:
    """The path of a mapping whose text in ``/proc/self/maps`` is ``text``: the kernel writes
    a newline in a name as ``\\012`` and leaves a backslash as it is, so each ``\\012`` is
    a newline or those four characters. The link ``/proc/self/map_files/<span>`` names the
    file exactly where it can be read (it needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE);
    else the reading that names the mapped (device, inode), then one that names the inode
    alone (an overlay's files show another device in the maps than in ``stat``); the text as
    written where none does (a file deleted or replaced since it was mapped)."""
    if "\\012" not in text:
        return text
    try:
        linked = os.readlink(f"/proc/self/map_files/{span}")
        if os.stat(linked).st_ino == node[1]:
            return linked
    except OSError:
        pass
    found = []
    for candidate in _readings(text):
        try:
            stat = os.stat(candidate)
        except OSError:
            continue
        if (stat.st_dev, stat.st_ino) == node:
            return candidate
        if stat.st_ino == node[1]:
            found.append(candidate)
    return found[0] if found else text


def _readings(text: str, most: int = 8) -> Iterator[str]:
    """``text`` with each ``\\012`` read as written or as a newline: every mix of the two
    for up to ``most`` of them (a name may hold both), else only all of one or the other."""
    pieces = text.split("\\012")
    if len(pieces) - 1 > most:
        yield from (text, "\n".join(pieces))
        return
    for mix in itertools.product(("\\012", "\n"), repeat=len(pieces) - 1):
        yield pieces[0] + "".join(sep + piece for sep, piece in zip(mix, pieces[1:], strict=True))


def _read_maps() -> list[Mapping]:
    """This process's file mappings: (start, end, file offset, path, private, (device,
    inode)); empty where the system has no /proc/self/maps."""
    maps = []
    for line in maps_lines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        major, _, minor = fields[3].partition(":")
        node = (os.makedev(int(major, 16), int(minor, 16)), int(fields[4]))
        path = _map_path(fields[5], f"{start:x}-{end:x}", node)
        maps.append((start, end, int(fields[2], 16), path, fields[1][3:4] == "p", node))
    return maps


def mapped_file(array: np.ndarray, maps: list[Mapping], *, shared_only: bool = False
                 ) -> FileRange | None:
    """The file bytes behind a file-backed array, or None (also, with ``shared_only``, for a
    private map)."""
    if not _file_backed(array):
        return None
    low, high = byte_bounds(array)
    for start, end, offset, path, private, (device, inode) in maps:
        if start <= low < end:
            if private and shared_only:
                return None
            first = offset + low - start
            try:
                stat = os.stat(path)
            except OSError:
                stat = None
            if stat is not None and stat.st_ino == inode:
                # The file's own (device, inode), as a FileSource of its path takes them (some
                # file systems show another device number in /proc/self/maps).
                return (stat.st_dev, stat.st_ino, first, first + high - low)
            # A file deleted or replaced since it was mapped, or a memfd: still one file for
            # every map of it (a mapping keeps its inode alive), named by the map's numbers.
            return (device, inode, first, first + high - low)
    return None
