"""The command's one rule for files it writes: an existing file is replaced only with
``--force`` (outputs, traces and plots alike; the old file stays until the new one is
complete, since every write goes to a temporary file renamed over it)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from conveyor.errors import InputError
from conveyor.files import output_target, same_file


def refuse_to_replace(named: Sequence[tuple[str, str | None]], force: bool) -> None:
    """For the files a command writes (``named``: (option, path) pairs, e.g. ("-o", "y.npy")):
    InputError for a path no command may write (files.output_target: a missing folder, a
    FIFO, this process's standard output, a link planted in /tmp), then, unless ``force``,
    for the first that exists. Before any work: a ``--plot`` refused only when it was drawn
    would come after the outputs were written."""
    given = [(option, path) for option, path in named if path is not None]
    for option, path in given:
        output_target(path, f"{option} {path}", probe=True)
    if force:
        return
    for _, path in given:
        if os.path.lexists(path):
            raise InputError(f"{path} exists: add --force to replace it")


def refuse_one_file_twice(named: Sequence[tuple[str, str | None]]) -> None:
    """InputError if two of the files a command writes are one file (``named``: (option,
    path) pairs, e.g. ("-o", "y.npy"), ("--trace", "y.npy")): the later write would replace
    the earlier one, and the command would report both as written."""
    given = [(option, path) for option, path in named if path is not None]
    for i, (first_option, first) in enumerate(given):
        for second_option, second in given[i + 1:]:
            if same_file(first, second):
                raise InputError(f"{first_option} {first} and {second_option} {second} are "
                                 f"one file: name a different file for each")


def refuse_writing_what_is_read(written: Sequence[tuple[str, str | None]],
                                read: Sequence[tuple[str, str]]) -> None:
    """InputError if a file the command writes (``written``: (option, path) pairs) is one it
    reads (``read``: (what, path) pairs, e.g. ("kernel file", "k.cl"), ("-i", "x.raw")).
    ``--trace k.cl --force`` replaced the kernel's source with the trace, and ``--plot x.raw``
    a raw input with the picture, exit 0. (An output may be an input of the stream: the
    library reads the old file to the end; callers leave those pairs out.)"""
    for option, path in written:
        if path is None:
            continue
        for what, source in read:
            if os.path.exists(source) and same_file(path, source):
                raise InputError(f"{option} {path} is the same file as {what} {source}, which "
                                 f"the command reads: writing it would replace it; name "
                                 f"another file")
