"""Sources that read what they should (pipeline/io.py, pipeline/chunks.py): a generator
that refills one buffer for every chunk, one file source shared by streams in several
threads, an iterable with more rows than its length, raw files' shapes and offsets checked
before any work. Exact against NumPy on a real device."""

from __future__ import annotations

import argparse
import os
import threading

import numpy as np
import pytest
from streamkit import data, kernel, stencil_reference

import conveyor as cv
from conveyor.cli.inputs import Input, open_input
from conveyor.pipeline import chunks, io
from conveyor.pipeline import stream as stream_module
from conveyor.pipeline.stage import copy_rows


def refilled(x: np.ndarray, sizes: list[int], ended: list[bool] | None = None):
    """Chunks of ``x`` of ``sizes`` rows, each a view of one buffer that is filled again for
    the next chunk (the ``f.readinto(buf)`` pattern). Past the last chunk the buffer is
    spoiled once more, and ``ended`` (if given) records that the generator ran to its end."""
    buf = np.empty((max(sizes, default=0), *x.shape[1:]), x.dtype)
    start = 0
    for size in sizes:
        part = buf[:size]
        part[:] = x[start : start + size]
        start += size
        yield part
    buf.fill(-999)
    if ended is not None:
        ended.append(True)


def cut(rows: int, size: int) -> list[int]:
    """Chunk sizes of ``size`` rows (the last one shorter) covering ``rows``."""
    return [min(size, rows - start) for start in range(0, rows, size)]


# -- a generator that reuses its buffer ------------------------------------------------------
@pytest.mark.parametrize(("rows", "row_shape", "chunk", "block_rows", "halo"), [
    (100_000, (), 7777, 16384, 0),  # the report: blocks span chunks (53338 wrong before)
    (100_000, (), 7777, 16384, 1),
    (20_000, (), 3001, 700, 0),  # chunks of several blocks: blocks lent from the chunk
    (20_000, (), 3001, 700, 2),
    (5_000, (3,), 1, 64, 1),  # one row per chunk
    (6_000, (3,), 1000, 1000, 3),  # chunks and blocks of one size, a halo across both
])
def test_a_generator_that_refills_one_buffer_streams_exactly(device, rows, row_shape, chunk,
                                                             block_rows, halo):
    x = data((rows, *row_shape), np.float32, 21)
    row_bytes = 4 * int(np.prod(row_shape, dtype=np.int64))
    source = cv.iterate(refilled(x, cut(rows, chunk)), length=rows)
    if halo:
        report = cv.stream(kernel(device, "sten"), [source], [np.float32], device=device,
                           block_bytes=block_rows * row_bytes, halo=halo,
                           args=(row_bytes // 4, halo))
        np.testing.assert_array_equal(report.outputs[0], stencil_reference(x, halo))
    else:
        report = cv.stream(kernel(device, "scale"), [source], [np.float32], device=device,
                           block_bytes=block_rows * row_bytes, args=(3.0,))
        np.testing.assert_array_equal(report.outputs[0], x * np.float32(3))


@pytest.mark.inline_staging
@pytest.mark.parametrize("halo", [0, 2])
def test_a_refilled_buffer_staged_inline_streams_exactly(device, halo):
    x = data((30_000,), np.float32, 22)
    source = cv.iterate(refilled(x, cut(len(x), 2500)), length=len(x))
    report = cv.stream(kernel(device, "sten"), [source], [np.float32], device=device,
                       block_bytes=4 * 4000, halo=halo, args=(1, halo))
    np.testing.assert_array_equal(report.outputs[0], stencil_reference(x, halo))


def test_rows_lent_and_not_yet_copied_outlive_the_next_chunk(monkeypatch):
    # Rows within one chunk are lent to the staging copy; asking for the next chunk (which
    # refills the buffer) must not change what that copy reads, even when it reads later.
    monkeypatch.setattr(chunks, "LOAN_PATIENCE_S", 0.01)
    x = np.arange(40, dtype=np.float32)
    source = cv.iterate(refilled(x, [20, 20]), length=40)
    lent = source.rows(0, 10)
    across = np.array(source.rows(8, 30))  # asks for the second chunk
    first = np.empty(10, np.float32)
    copy_rows(first, lent)  # as a staging copy reads it
    np.testing.assert_array_equal(first, x[:10])
    np.testing.assert_array_equal(across, x[8:30])
    end = np.empty(12, np.float32)
    copy_rows(end, source.rows(28, 40))  # the last rows: the generator is asked to end
    np.testing.assert_array_equal(end, x[28:])


def test_a_staging_copy_that_fails_before_reading_a_chunk_does_not_hang(device, monkeypatch):
    # A lent block whose copy never reads it (the copy failed first) must not keep the
    # source waiting before the next chunk: the stream fails with the copy's error.
    monkeypatch.setattr(chunks, "LOAN_PATIENCE_S", 0.01)

    class Boom(Exception):
        pass

    class Faulty(stream_module.Engine):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            real, count = self.stager.copy, [0]

            def copy(dst, src):
                if isinstance(src, io.FileRows):
                    count[0] += 1
                    if count[0] == 2:
                        raise Boom("the copy failed before it read")
                real(dst, src)

            self.stager.copy = copy

    real_engine = stream_module.Engine
    monkeypatch.setattr(stream_module, "Engine", Faulty)
    x = data((20_000,), np.float32, 23)
    with pytest.raises(Boom):
        cv.stream(kernel(device, "scale"), [cv.iterate(refilled(x, cut(len(x), 5000)),
                                                       length=len(x))],
                  [np.float32], device=device, block_bytes=4 * 1000, args=(2.0,), workers=2)
    monkeypatch.setattr(stream_module, "Engine", real_engine)
    report = cv.stream(kernel(device, "scale"), [cv.iterate(refilled(x, cut(len(x), 5000)),
                                                            length=len(x))],
                       [np.float32], device=device, block_bytes=4 * 1000, args=(2.0,))
    np.testing.assert_array_equal(report.outputs[0], x * np.float32(2))


# -- more rows than length ---------------------------------------------------------------------
@pytest.mark.parametrize("sizes", [
    [500, 500, 500, 500],  # length ends between chunks: the ask after the last row finds more
    [700, 700, 600],  # a chunk runs past length
    [1500, 0, 0, 500],  # empty chunks, then more
])
def test_an_iterable_longer_than_length_is_an_input_error(device, tmp_path, sizes):
    x = data((2000,), np.float32, 24)
    out = tmp_path / "y.npy"
    with pytest.raises(cv.InputError,
                       match=r"yielded at least 2000 rows but length=1500: pass the real length"):
        cv.stream(kernel(device, "scale"), [cv.iterate(refilled(x, sizes), length=1500)],
                  [cv.npy_out(out)], device=device, block_bytes=4 * 400, args=(2.0,))
    assert not out.exists()


def test_a_first_chunk_longer_than_length_is_refused_before_any_work():
    with pytest.raises(cv.InputError, match=r"yielded at least 2000 rows but length=1500"):
        cv.iterate(iter([np.zeros(2000, np.float32)]), length=1500)
    with pytest.raises(cv.InputError, match=r"yielded at least 3 rows but length=0"):
        cv.iterate(iter([np.zeros(3, np.float32)]), length=0)


def test_an_iterable_that_ends_at_length_runs_to_its_end(device):
    x = data((1500,), np.float32, 25)
    ended: list[bool] = []
    source = cv.iterate(refilled(x, [700, 800, 0, 0], ended), length=1500)  # empty: fine
    report = cv.stream(kernel(device, "scale"), [source], [np.float32], device=device,
                       block_bytes=4 * 400, args=(2.0,))
    np.testing.assert_array_equal(report.outputs[0], x * np.float32(2))
    assert ended == [True]  # the code after the generator's loop ran, within the stream


# -- one file source, several streams at once -------------------------------------------------
def test_closing_a_file_source_under_a_read_waits_for_the_read(tmp_path, monkeypatch):
    # Stream A's read holds the descriptor; stream B ends (close()) and another file is
    # opened, which took the closed descriptor's number: A read that file's bytes, or EBADF.
    x = np.arange(1000, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "other.bin").write_bytes(b"\x7f" * 8000)
    source = cv.npy(tmp_path / "x.npy")
    entered, go = threading.Event(), threading.Event()
    real = os.preadv

    def paused(fd, buffers, offset):
        if not entered.is_set():
            entered.set()
            assert go.wait(10)
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", paused)
    got = np.zeros_like(x)
    failed: list[BaseException] = []

    def read():
        try:
            source.rows(0, len(x)).read_into(got)
        except BaseException as exc:  # handed to the test's thread
            failed.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    assert entered.wait(10)
    source.close()  # another stream of the same source ends
    other = os.open(tmp_path / "other.bin", os.O_RDONLY)
    try:
        go.set()
        reader.join(10)
    finally:
        os.close(other)
    assert not reader.is_alive() and failed == []
    np.testing.assert_array_equal(got, x)
    assert source._fd is None  # closed by the read that held it last


@pytest.mark.slow
def test_one_npy_source_streamed_by_three_threads_at_once(device, tmp_path):
    x = data((40_000,), np.float32, 26)
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "other.bin").write_bytes(b"\x7f" * 160_000)
    source = cv.npy(tmp_path / "x.npy")
    k = kernel(device, "scale")
    expected = x * np.float32(2)
    wrong: list[str] = []
    stop = threading.Event()

    def churn():  # opens and closes another file: it takes any descriptor number freed
        while not stop.is_set():
            os.close(os.open(tmp_path / "other.bin", os.O_RDONLY))

    def streams():
        for _ in range(60):
            try:
                report = cv.stream(k, [source], [np.float32], device=device,
                                   block_bytes=8192, args=(2.0,))
            except Exception as exc:  # counted: the test fails on any
                wrong.append(repr(exc))
                continue
            if not np.array_equal(report.outputs[0], expected):
                wrong.append("wrong output")

    churner = threading.Thread(target=churn)
    workers = [threading.Thread(target=streams) for _ in range(3)]
    churner.start()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    stop.set()
    churner.join()
    assert wrong == []
    assert source._fd is None


# -- raw files: shapes, offsets and messages ---------------------------------------------------
def _ten_floats(tmp_path):
    x = np.arange(10, dtype=np.float32)
    path = tmp_path / "ten.bin"
    x.tofile(path)
    return x, path


def test_a_raw_shape_that_is_not_whole_is_refused(tmp_path):
    _, path = _ten_floats(tmp_path)
    with pytest.raises(cv.InputError, match=r"ten.bin: shape \(-1, 2.5\) has 2.5, not a whole"):
        cv.raw(path, np.float32, shape=(-1, 2.5))
    for bad in [(-1, "2"), (True, 10), (-1, float("nan"))]:
        with pytest.raises(cv.InputError, match="not a whole number"):
            cv.raw(path, np.float32, shape=bad)
    with pytest.raises(cv.InputError, match="is not a shape"):
        cv.raw(path, np.float32, shape="(-1, 2)")


def test_integral_raw_shapes_and_offsets_are_taken_as_meant(device, tmp_path):
    x, path = _ten_floats(tmp_path)
    assert cv.raw(path, np.float32, shape=(-1, 2.0)).shape == (5, 2)
    assert cv.raw(path, np.float32, shape=np.array([5, 2])).shape == (5, 2)
    assert cv.raw(path, np.float32, shape=10).shape == (10,)
    source = cv.raw(path, np.float32, shape=(-1, 3), offset=4.0)
    assert (source.shape, source.offset) == ((3, 3), 4)
    report = cv.stream(kernel(device, "scale"), [source], [np.float32], device=device,
                       args=(2.0,))
    np.testing.assert_array_equal(report.outputs[0], x[1:].reshape(3, 3) * np.float32(2))
    assert cv.raw(path, np.float32, offset=40).shape == (0,)  # the offset may be the end


@pytest.mark.parametrize(("offset", "message"), [
    (-4, r"ten.bin has 40 bytes and offset=-4 is negative: give the byte where the data "
         r"starts, from 0 to 40"),
    (100, r"ten.bin has 40 bytes and offset=100 lies past its end: give the byte where the "
          r"data starts, from 0 to 40"),
    (2.5, r"ten.bin: offset=2.5 is not a whole number"),
    (True, r"ten.bin: offset=True is not a whole number"),
])
def test_a_raw_offset_outside_the_file_is_refused(tmp_path, offset, message):
    _, path = _ten_floats(tmp_path)
    with pytest.raises(cv.InputError, match=message):
        cv.raw(path, np.float32, offset=offset)


def test_raw_messages_name_the_api_arguments_and_the_cli_options(tmp_path):
    _, path = _ten_floats(tmp_path)
    with pytest.raises(cv.InputError, match=r"check dtype= and shape=$") as api:
        cv.raw(path, np.float32, shape=(-1, 3))
    with pytest.raises(cv.InputError, match=r"dtype=/shape= say \(11,\) float32") as said:
        cv.raw(path, np.float32, shape=(11,))
    assert "--" not in str(api.value) + str(said.value)
    options = argparse.Namespace(dtype="float32", shape="-1,3", columns=None)
    with pytest.raises(cv.InputError, match=r"check --dtype and --shape$"):
        open_input(Input(str(path)), options)
    options.shape = "11"
    with pytest.raises(cv.InputError, match=r"--dtype/--shape say \(11,\) float32"):
        open_input(Input(str(path)), options)
