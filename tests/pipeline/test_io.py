"""Sources and sinks (pipeline/io.py): every kind round-trips against NumPy on a real device;
a bad file fails before any work with an InputError; a failed stream leaves no output file."""

from __future__ import annotations

import numpy as np
import pytest
from streamkit import add_reference, data, kernel, stencil_reference

import conveyor as cv


def _leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".part"))


def _pair(tmp_path, rows=10_001, row_shape=()):
    a = data((rows, *row_shape), np.float32, 1)
    b = data((rows, *row_shape), np.float32, 2)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    return a, b


def test_npy_in_npy_out_round_trip(device, tmp_path):
    a, b = _pair(tmp_path)
    out = tmp_path / "c.npy"
    report = cv.stream(kernel(device, "add"), [str(tmp_path / "a.npy"), cv.npy(tmp_path / "b.npy")],
                       [str(out)], device=device, block_bytes=4000, workers=2)
    assert report.outputs == [str(out)]
    assert np.array_equal(np.load(out), add_reference(a, b))
    assert _leftovers(tmp_path) == []


def test_2d_npy_with_halo(device, tmp_path):
    x = data((3001, 5), np.float32, 3)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "y.npy"
    cols = np.uint64(5)
    cv.stream(kernel(device, "sten"), [str(tmp_path / "x.npy")], [cv.npy_out(out)],
              device=device, block_bytes=5 * 4 * 100, halo=2, args=(cols, 2))
    assert np.allclose(np.load(out), stencil_reference(x, 2))


def test_raw_in_raw_out_round_trip(device, tmp_path):
    a = data((4096, 3), np.float32, 4)
    a.tofile(tmp_path / "a.bin")
    cv.stream(kernel(device, "scale"), [cv.raw(tmp_path / "a.bin", np.float32, (-1, 3))],
              [cv.raw_out(tmp_path / "y.bin")], device=device, block_bytes=3 * 4 * 500,
              args=(3.0,))
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(a.shape)
    assert np.array_equal(got, a * np.float32(3.0))


def test_iterable_of_chunks_with_halo(device):
    x = data((5003,), np.float32, 5)
    chunks = (x[i : i + 777] for i in range(0, len(x), 777))
    report = cv.stream(kernel(device, "sten"), [cv.iterate(chunks, length=len(x))],
                       [np.float32], device=device, block_bytes=4 * 300, halo=1,
                       args=(1, 1))
    assert np.allclose(report.outputs[0], stencil_reference(x, 1))


def test_iterable_shorter_than_length_is_an_input_error(device):
    x = data((1000,), np.float32, 6)
    with pytest.raises(cv.InputError, match="real length"):
        cv.stream(kernel(device, "scale"), [cv.iterate(iter([x]), length=2000)],
                  [np.float32], device=device, block_bytes=400, args=(2.0,))


def test_parquet_and_arrow_columns(device, tmp_path):
    pa = pytest.importorskip("pyarrow", reason="Parquet/Arrow need pyarrow (conveyor[parquet])")
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    a, b = data((20_000,), np.float32, 7), data((20_000,), np.float32, 8)
    table = pa.table({"a": a, "b": b, "name": [str(i) for i in range(len(a))]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=3000)
    feather.write_feather(table, tmp_path / "t.arrow", chunksize=2500)
    add = kernel(device, "add")
    for make in (cv.parquet, cv.arrow):
        path = tmp_path / ("t.parquet" if make is cv.parquet else "t.arrow")
        report = cv.stream(add, [make(path, "a"), make(path, "b")], [np.float32],
                           device=device, block_bytes=4 * 1000)
        assert np.array_equal(report.outputs[0], add_reference(a, b))
    pair = cv.parquet(tmp_path / "t.parquet", ["a", "b"])
    assert pair.shape == (20_000, 2)
    with pytest.raises(cv.InputError, match="no column 'c'"):
        cv.parquet(tmp_path / "t.parquet", "c")
    with pytest.raises(cv.InputError, match="not numeric"):
        cv.arrow(tmp_path / "t.arrow", "name")


def test_file_8x_the_memory_limit(device, tmp_path):
    rows = 2**20  # 4 MiB per input, 12 MiB in all
    a, b = _pair(tmp_path, rows)
    limit = (a.nbytes + b.nbytes) // 8
    out = tmp_path / "c.npy"
    report = cv.stream(kernel(device, "add"), [str(tmp_path / "a.npy"), str(tmp_path / "b.npy")],
                       [str(out)], device=device, memory_limit=limit)
    assert report.blocks >= 8 and report.peak_device_bytes <= limit
    assert np.array_equal(np.load(out), add_reference(a, b))


@pytest.mark.parametrize("damage", ["truncated", "longer"])
def test_a_file_whose_size_lies_is_an_input_error(tmp_path, damage):
    np.save(tmp_path / "a.npy", np.arange(1000, dtype=np.float32))
    with open(tmp_path / "a.npy", "r+b" if damage == "truncated" else "ab") as f:
        if damage == "truncated":
            f.truncate(4000)
        else:
            f.write(b"\0" * 8)
    with pytest.raises(cv.InputError, match="truncated" if damage == "truncated" else "longer"):
        cv.npy(tmp_path / "a.npy")
    (tmp_path / "r.bin").write_bytes(b"\0" * 10)
    with pytest.raises(cv.InputError, match="whole number"):
        cv.raw(tmp_path / "r.bin", np.float32)


def test_fortran_order_and_missing_files_are_input_errors(tmp_path):
    np.save(tmp_path / "f.npy", np.asfortranarray(np.ones((4, 3), np.float32)))
    with pytest.raises(cv.InputError, match="Fortran"):
        cv.npy(tmp_path / "f.npy")
    with pytest.raises(cv.InputError, match="does not exist"):
        cv.npy(tmp_path / "nope.npy")
    with pytest.raises(cv.InputError, match="does not exist"):
        cv.npy_out(tmp_path / "no-such-folder" / "c.npy")


def test_lengths_that_disagree_leave_no_output(device, tmp_path):
    np.save(tmp_path / "a.npy", np.ones(100, np.float32))
    np.save(tmp_path / "b.npy", np.ones(99, np.float32))
    with pytest.raises(cv.InputError, match="disagree in length"):
        cv.stream(kernel(device, "add"), [str(tmp_path / "a.npy"), str(tmp_path / "b.npy")],
                  [str(tmp_path / "c.npy")], device=device)
    assert not (tmp_path / "c.npy").exists() and _leftovers(tmp_path) == []


def test_a_failure_mid_stream_leaves_no_output(device, tmp_path):
    np.save(tmp_path / "x.npy", np.arange(10_000, dtype=np.float32))
    seen = []

    def compute(x, y, queue, offset, n):
        seen.append(offset)
        if len(seen) == 4:
            raise RuntimeError("boom at block 3")

    with pytest.raises(RuntimeError, match="boom"):
        cv.stream(compute, [str(tmp_path / "x.npy")], [cv.npy_out(tmp_path / "y.npy",
                  np.float32)], device=device, block_bytes=4000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy"]


def test_existing_output_is_replaced_only_on_success(device, tmp_path):
    a, b = _pair(tmp_path, 1000)
    out = tmp_path / "c.npy"
    np.save(out, np.zeros(3))
    with pytest.raises(cv.InputError):
        cv.stream(kernel(device, "add"), [str(tmp_path / "a.npy")], [str(out)], device=device)
    assert np.array_equal(np.load(out), np.zeros(3))
    cv.stream(kernel(device, "add"), [str(tmp_path / "a.npy"), str(tmp_path / "b.npy")],
              [str(out)], device=device)
    assert np.array_equal(np.load(out), add_reference(a, b))


def test_a_path_that_is_not_npy_says_which_constructor_to_use():
    with pytest.raises(cv.InputError, match=r"cv.raw\(\)"):
        cv.stream(lambda *a, **k: None, ["data.bin"])
