"""The ninth round, leftovers: what the last pass found still open, on real PoCL kernels and
real files. Each test fails without its fix, except the guards named as such.

- ``cv.iterate`` chunks that are ndarray subclasses whose ``__getitem__`` copies: a guard.
  ``np.asarray`` of a chunk is already a plain ndarray view of its memory (as
  ``validate.plain`` gives for inputs), so the subclass's indexing is never called.
- An Arrow IPC file whose footer places a record batch past the file's end (a damaged or
  crafted footer, a file cut short) was read as the footer said: ``os.pread`` of the 2 GiB a
  block's metadata length may claim allocated them first, and the error said only "N bytes
  at M run past the end of the file". Each block is checked against the file's size before
  anything is read: "record batch k claims bytes past its end".
- ``workers=99999999999`` (``--workers`` on the command line) was accepted: the staging pool
  then started one thread per 8 MiB piece of a block copied at once (29 for a 256 MiB block,
  against 3 by default here; about 2,000 for a 16 GiB one). It is an InputError giving the
  range now (1 to 1024), and an argparse error for the command.
- Messages that pointed the wrong way: ``inputs=range(3)`` said "input 0 is a scalar" (pass
  scalars in args=); a ``ulong`` argument of ``2**64`` said "Python int too large to convert
  to C long"; ``halo=2**40`` on 1000 rows said "more than a block (1 rows)" (or "one ring ...
  needs 28587302338560 device bytes" with block_bytes); a big-endian ``.npy`` given by path
  was told ``a.astype(...)``, of an array the caller never held. Each says what to change.
"""

from __future__ import annotations

import struct
import sys
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import assert_clean, compiled, kernel  # noqa: E402

import conveyor as cv  # noqa: E402
from conveyor.cli import main  # noqa: E402
from conveyor.kernels.argcast import cast_scalar  # noqa: E402
from conveyor.kernels.signature import Param  # noqa: E402

_kernel = compiled  # reliakit: built once per device, source and name


# -- 1. cv.iterate chunks of an ndarray subclass (guard) ------------------------------------
class _CopyingSlices(np.ndarray):
    """An ndarray subclass whose indexing hands out copies, and counts them."""

    calls = 0

    def __getitem__(self, key):
        type(self).calls += 1
        return np.ndarray.__getitem__(self, key).copy()


def test_iterate_chunks_of_a_copying_subclass_are_read_from_their_memory(device):
    """Guard: a chunk is taken as ``np.asarray(chunk)``, a plain ndarray view of its memory
    (NumPy's ``asarray`` drops the subclass), so rows are never read through the subclass's
    ``__getitem__``; chunks that are memory the iterable fills again stay safe."""
    x = np.arange(1000, dtype=np.float32)
    for zero_copy in (False, None):
        _CopyingSlices.calls = 0
        chunks = (x[lo : lo + 300].copy().view(_CopyingSlices) for lo in range(0, 1000, 300))
        out = cv.stream(kernel(device, "ident"), [cv.iterate(chunks, length=1000)],
                        [np.float32], device=device, block_bytes=400,
                        zero_copy=zero_copy).outputs[0]
        np.testing.assert_array_equal(out, x)
        assert _CopyingSlices.calls == 0
    assert_clean(device)


# -- 2. an Arrow IPC footer that places a record batch past the file's end -------------------
def _arrow_with_block(tmp_path: Path, name: str, block: int, offset: int | None = None,
                      meta: int | None = None, body: int | None = None) -> Path:
    """A 3-batch Arrow IPC file whose footer's block ``block`` says ``offset``, ``meta``
    (metaDataLength) and ``body`` (bodyLength) where given."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.feather as feather

    from conveyor.pipeline.ipcfile import _Table

    path = tmp_path / name
    feather.write_feather(pa.table({"x": np.arange(30, dtype=np.float32)}), path,
                          chunksize=10, compression="uncompressed")
    data = bytearray(path.read_bytes())
    footer_size = struct.unpack_from("<i", data, len(data) - 10)[0]
    footer_at = len(data) - 10 - footer_size
    footer = bytes(data[footer_at : footer_at + footer_size])
    table = _Table(footer, struct.unpack_from("<I", footer, 0)[0])
    count, first = table.vector(3)
    assert count == 3
    at = footer_at + first + 24 * block  # Block {offset: long, meta: int, pad, body: long}
    was = struct.unpack_from("<qi4xq", data, at)
    struct.pack_into("<qi4xq", data, at, was[0] if offset is None else offset,
                     was[1] if meta is None else meta, was[2] if body is None else body)
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("claim", ["metadata of 2 GiB", "offset past the end",
                                   "body past the end", "negative offset"])
def test_an_arrow_footer_claiming_bytes_past_the_end_is_refused_before_reading(tmp_path,
                                                                                claim):
    pytest.importorskip("pyarrow")
    path = {
        "metadata of 2 GiB": lambda: _arrow_with_block(tmp_path, "m.arrow", 1, meta=2**31 - 1),
        "offset past the end": lambda: _arrow_with_block(tmp_path, "o.arrow", 1,
                                                         offset=2**40),
        "body past the end": lambda: _arrow_with_block(tmp_path, "b.arrow", 1, body=2**40),
        "negative offset": lambda: _arrow_with_block(tmp_path, "n.arrow", 1, offset=-8),
    }[claim]()
    tracemalloc.start()
    try:
        # Before: "2147483647 bytes at 424 run past the end of the file" after allocating
        # them (and for the body: no error here at all).
        with pytest.raises(cv.InputError, match=rf"{path.name} is not an Arrow IPC file "
                                                rf"\(record batch 1 claims bytes past its end"):
            cv.arrow(path, "x")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20  # was 2 GiB for the metadata claim: nothing large is read
    # Guard: an intact file of several batches still reads.
    pa = pytest.importorskip("pyarrow")
    import pyarrow.feather as feather

    feather.write_feather(pa.table({"x": np.arange(30, dtype=np.float32)}),
                          tmp_path / "ok.arrow", chunksize=10)
    assert cv.arrow(tmp_path / "ok.arrow", "x").shape == (30,)


# -- 3. workers past any sane count -----------------------------------------------------------
def _stage_threads() -> int:
    return sum(t.name.startswith("conveyor-stage") for t in threading.enumerate())


def test_workers_past_1024_are_refused_with_the_range(device, tmp_path, capsys):
    ident = kernel(device, "ident")
    x = np.arange(1000, dtype=np.float32)
    for workers in (99999999999, 1025, 2.0**40):
        with pytest.raises(cv.InputError, match=r"workers=.* is more staging threads than "
                                                r"conveyor starts: workers takes None \(the "
                                                r"default number\) or an int from 1 to 1024"):
            cv.stream(ident, [x], [np.float32], device=device, workers=workers)  # accepted
    assert _stage_threads() == 0
    # Guard: the cap itself is taken (the pool starts threads only as pieces need them).
    out = cv.stream(ident, [x], [np.float32], device=device, workers=1024).outputs[0]
    np.testing.assert_array_equal(out, x)
    # The command: argparse refuses it, with the range.
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "k.cl").write_text(
        "__kernel void ident(__global const float *x, __global float *y, ulong offset,\n"
        "                    ulong n) { ulong i = get_global_id(0); if (i < n) y[i] = x[i]; }\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["map", str(tmp_path / "k.cl"), "--kernel", "ident", "-i", str(tmp_path / "x.npy"),
              "-o", str(tmp_path / "y.npy"), "--device", device.spec, "-q",
              "--workers", "99999999999"])
    assert exit_info.value.code == 2
    assert "--workers: '99999999999': give a whole number from 1 to 1024" in (
        capsys.readouterr().err)
    assert not (tmp_path / "y.npy").exists()
    assert_clean(device)


# -- 4. messages that say what to change ------------------------------------------------------
def test_a_range_or_list_of_numbers_as_inputs_says_to_pass_an_array(device):
    ident = kernel(device, "ident")
    with pytest.raises(cv.InputError, match=r"inputs=range\(0, 3\) is a range of numbers, not "
                                            r"an array: .*np\.asarray\(values, dtype\), or "
                                            r"np\.arange"):
        cv.stream(ident, range(3), [np.float32], device=device)  # was "input 0 is a scalar"
    with pytest.raises(cv.InputError, match=r"inputs=\[1\.0, 2\.0, 3\.0\] is a list of "
                                            r"numbers, not an array: .*np\.asarray"):
        cv.stream(ident, [1.0, 2.0, 3.0], [np.float32], device=device)
    # Guard: one number alone is still a scalar for args=; the fix the message gives works.
    with pytest.raises(cv.InputError, match=r"input 0 is a scalar: pass scalars in args="):
        cv.stream(ident, [3.5], [np.float32], device=device)
    out = cv.stream(ident, [np.asarray(range(3), np.float32)], [np.float32],
                    device=device).outputs[0]
    np.testing.assert_array_equal(out, [0, 1, 2])
    assert_clean(device)


def test_a_ulong_argument_past_its_range_names_the_range(device):
    sten = kernel(device, "sten")
    x = np.ones((100, 3), np.float32)
    # The type as the backend spells it: "ulong" (OpenCL), "unsigned long long" (CUDA).
    with pytest.raises(cv.InputError, match=r"18446744073709551616 cannot be passed as kernel "
                                            r"parameter 'halo' \([a-z ]+ halo\): it does not "
                                            r"fit: it is out of range for [a-z ]+ \(uint64: 0 "
                                            r"to 18446744073709551615 = 2\*\*64-1\)"):
        # Was "it does not fit (Python int too large to convert to C long)".
        cv.stream(sten, [x], [np.float32], args=(3, 2**64), device=device)
    with pytest.raises(cv.InputError, match=r"out of range for [a-z ]+ \(uint64: 0 to "):
        cv.stream(sten, [x], [np.float32], args=(-1, 0), device=device)
    long_k = Param("k", False, np.dtype(np.int64), False, "long k", base="long")
    with pytest.raises(cv.InputError, match=r"out of range for long \(int64: "
                                            r"-9223372036854775808 = -2\*\*63 to "
                                            r"9223372036854775807 = 2\*\*63-1\)"):
        cast_scalar(long_k, 2**63)
    # Guard: the ends of the range pass.
    ulong_k = Param("k", False, np.dtype(np.uint64), False, "ulong k", base="ulong")
    assert cast_scalar(ulong_k, 2**64 - 1) == np.uint64(2**64 - 1)
    assert cast_scalar(long_k, -(2**63)) == np.int64(-(2**63))
    assert_clean(device)


def test_a_halo_past_the_input_says_so_not_more_than_a_block(device):
    sten = kernel(device, "sten")
    x = np.ones((1000, 3), np.float32)
    for options in ({}, {"block_bytes": 12 * 2000}):
        with pytest.raises(cv.InputError, match=r"halo=1099511627776 rows is more than the "
                                                r"input's 1000 rows.*use a smaller halo "
                                                r"\(halo=1000 already reaches every row"):
            # Was "more than a block (1 rows): use a larger block_bytes", and with
            # block_bytes "one ring of 1 slots of 1000 rows needs 28587302338560 bytes".
            cv.stream(sten, [x], [np.float32], args=(3, 1), halo=2**40, device=device,
                      **options)
    with pytest.raises(cv.InputError, match=r"halo=2000 rows is more than the input's 1000 "
                                            r"rows, and more than a block \(100 rows\): use a "
                                            r"smaller halo .*or a block_bytes that holds the "
                                            r"whole input"):
        cv.stream(sten, [x], [np.float32], args=(3, 1), halo=2000, block_bytes=12 * 100,
                  device=device)  # was "more than a block (100 rows): use a larger block..."
    # Guard: a halo past the input that fits still streams (its rows past the ends are the
    # boundary's), and a halo more than a block of a longer input keeps its message.
    out = cv.stream(sten, [x[:10]], [np.float32], args=(3, 1), halo=20,
                    device=device).outputs[0]
    assert out.shape == (10, 3)
    with pytest.raises(cv.InputError, match=r"halo=5 rows is more than a block \(4 rows\)"):
        cv.stream(sten, [x], [np.float32], args=(3, 5), halo=5, block_bytes=3 * 4 * 4,
                  device=device)
    assert_clean(device)


_REC = """typedef struct { int a; float b; } rec;
__kernel void rec_sum(__global const rec *r, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (float)r[i].a + r[i].b;
}
"""


def test_a_big_endian_file_is_told_how_to_rewrite_it(device, tmp_path, capsys):
    ident = kernel(device, "ident")
    path = tmp_path / "be.npy"
    x = np.arange(100, dtype=np.float32)
    np.save(path, x.astype(">f4"))
    with pytest.raises(cv.InputError) as info:
        cv.stream(ident, [str(path)], [np.float32], device=device)
    message = str(info.value)
    # Was "pass a.astype(a.dtype.newbyteorder('='))": there is no ``a`` for a path.
    fix = f"np.save({str(path)!r}, np.load({str(path)!r}).astype('<f4'))"
    assert message.endswith(f"rewrite the file in this machine's byte order: {fix}"), message
    # A Python callable, and a raw file, are told the same way.
    with pytest.raises(cv.InputError, match=r"input 0 \(.*be\.npy\) has dtype >f4.*rewrite "
                                            r"the file .*np\.save\("):
        cv.stream(lambda v: v, [str(path)], [np.float32], device=device)
    with pytest.raises(cv.InputError, match=r"write its values in this machine's byte order "
                                            r"to a \.npy file and pass that: np\.save\("
                                            r"'native\.npy', np\.fromfile\(.*be\.npy', '>f4', "
                                            r"offset=128\)\.astype\('<f4'\)\)"):
        cv.stream(ident, [cv.raw(path, ">f4", offset=128)], [np.float32], device=device)
    # Records with a big-endian field, in a .npy.
    records = np.zeros(8, [("a", ">i4"), ("b", ">f4")])
    records["a"], records["b"] = np.arange(8), 0.5
    np.save(tmp_path / "rec.npy", records)
    rec_sum = _kernel(device, _REC, "rec_sum")
    with pytest.raises(cv.InputError, match=r"field 'a' is >i4.*rewrite the file in this "
                                            r"machine's byte order: a = np\.load\("):
        cv.stream(rec_sum, [str(tmp_path / "rec.npy")], [np.float32], device=device)
    # The command adds the option that converts as it reads.
    # Portable text, named as the command tells the language: .cu for a CUDA device.
    kernel_file = tmp_path / ("k.cu" if device.backend == "cuda" else "k.cl")
    kernel_file.write_text(cv.portable(
        "__kernel void ident(__global const float *x, __global float *y, ulong offset,\n"
        "                    ulong n) { ulong i = get_global_id(0); if (i < n) y[i] = x[i]; }\n"))
    code = main(["map", str(kernel_file), "--kernel", "ident", "-i", str(path), "-o",
                 str(tmp_path / "y.npy"), "--device", device.spec, "-q"])
    err = capsys.readouterr().err
    assert code != 0 and "add --cast x:float32 (it converts the values as they are read), " \
                         "or rewrite the file in this machine's byte order: np.save(" in err, err
    # The fix the message gives, run as given, and the stream then succeeds.
    exec(fix, {"np": np})  # noqa: S102
    out = cv.stream(ident, [str(path)], [np.float32], device=device).outputs[0]
    np.testing.assert_array_equal(out, x)
    assert_clean(device)
