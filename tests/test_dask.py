"""conveyor.dask on a real LocalCluster of two spawned worker processes (PoCL): map_blocks
(with each halo boundary), reduce, file streams, the CLI, errors that name their chunk and
worker, and a worker killed mid-run. One cluster for the module; small arrays."""

from __future__ import annotations

import os
import pickle
import sys

import numpy as np
import pytest

import conveyor as cv

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")

import conveyor.dask as cvd  # noqa: E402
from conftest import DEVICES  # noqa: E402
from conveyor.dask import worker as dask_worker  # noqa: E402

# The kernels here are OpenCL C: the workers use the first OpenCL device under test.
OPENCL = [d.spec for d in DEVICES if d.backend == "opencl"]
pytestmark = pytest.mark.skipif(not OPENCL, reason="no usable OpenCL device")

SPEC = OPENCL[0] if OPENCL else "opencl:0:0"

AXPY = """
__kernel void axpy(__global const float* x, __global float* y, float a, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = a * x[i] + (float)(offset + i);
}
"""
# Halo 2: element i of the block is x[i + 2]; rows i-2, i, i+2 of the array, and the row.
STENCIL = """
__kernel void sten(__global const float* x, __global float* y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] - 2.0f * x[i + 2] + 3.0f * x[i + 4] + (float)((offset + i) % 7);
}
"""
ROWS = """
__kernel void rows(__global const int* x, __global long* y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (long)x[i] * 3 + (long)((offset + i) / 4);
}
"""


@pytest.fixture(scope="module")
def client():
    # The test module's own functions are pickled by value: workers cannot import tests/.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=":0")
    with cluster, distributed.Client(cluster) as c:
        yield c


@pytest.fixture
def two_workers(client):
    client.wait_for_workers(2, timeout=60)
    return client


def _local(source, name, inputs, **kw):
    dev = cv.device(SPEC)  # the workers' device, not the default one (a GPU machine's CUDA)
    return cv.stream(dev.compile(source, name), inputs, device=dev, **kw)


def _stencil_reference(x, mode):
    p = np.pad(x, 2, **mode)
    return (p[:-4] - 2 * p[2:-2] + 3 * p[4:] + (np.arange(len(x)) % 7)).astype(np.float32)


def test_first_row_shifts_the_offset_a_kernel_sees(device):
    x = np.arange(100, dtype=np.float32)
    k = device.compile(cv.portable(AXPY), "axpy")
    y = cv.stream(k, [x], [np.float32], args=(1.0,), device=device, first_row=1000).outputs[0]
    np.testing.assert_array_equal(y, x + np.arange(1000, 1100))
    wrapped = cv.stream(k, [x], [np.float32], args=(0.0,), device=device,
                        first_row=-2).outputs[0]  # margin rows before row 0 wrap
    assert wrapped[2:].tolist() == list(range(98))
    with pytest.raises(cv.InputError, match="first_row"):
        cv.stream(k, [x], [np.float32], args=(1.0,), device=device, first_row=1.5)


def test_a_kernel_keeps_its_source_and_options(device):
    source = cv.portable(AXPY)
    k = device.compile(source, "axpy", ["-DUNUSED=1"])
    assert (k.source, k.name, k.options) == (source, "axpy", ("-DUNUSED=1",))
    job = dask_worker.as_job(k, None, (2.0,), {})
    assert job.compute == cvd.KernelSpec(source, "axpy", ("-DUNUSED=1",))
    assert job.device == device.spec
    assert len(pickle.dumps(job)) < 2000  # text, not a loaded kernel or a device
    future = device.compile(source, "axpy", ["-DOTHER=2"], wait=False)
    assert dask_worker.as_job(future, None, (), {}).compute.options == ("-DOTHER=2",)
    assert future.result().source == source


def test_the_client_opens_no_device(two_workers, monkeypatch):
    import conveyor.backends

    def refuse(*a, **k):
        raise AssertionError("the client opened a device")

    monkeypatch.setattr(conveyor.backends, "device", refuse)
    monkeypatch.setattr(conveyor.backends, "devices", refuse)
    x = np.arange(1000, dtype=np.float32)
    y = cvd.map_blocks(cvd.kernel(AXPY, "axpy"), da.from_array(x, chunks=300), args=(2.0,),
                       device=SPEC)
    np.testing.assert_array_equal(y.compute(), 2 * x + np.arange(1000))


def test_map_blocks_is_numpy_and_one_local_stream(two_workers):
    x = np.arange(1000, dtype=np.float32) % 17
    y = cvd.map_blocks(cvd.kernel(AXPY, "axpy"), da.from_array(x, chunks=(128,)),
                       args=(3.0,), device=SPEC, block_bytes=256)
    assert y.chunks == ((128,) * 7 + (104,),) and y.dtype == np.float32
    got = y.compute()
    np.testing.assert_array_equal(got, (3 * x + np.arange(1000)).astype(np.float32))
    np.testing.assert_array_equal(
        got, _local(AXPY, "axpy", [x], outputs=[np.float32], args=(3.0,)).outputs[0])


def test_map_blocks_merges_chunks_of_other_axes_and_keeps_row_offsets(two_workers):
    x = np.arange(600, dtype=np.int32).reshape(150, 4)
    dx = da.from_array(x, chunks=(40, 2))  # chunked on axis 1 too: merged into whole rows
    y = cvd.map_blocks(cvd.kernel(ROWS, "rows"), dx, device=SPEC)
    assert y.dtype == np.int64 and y.chunks == ((40, 40, 40, 30), (4,))
    expected = x.astype(np.int64) * 3 + (np.arange(600).reshape(150, 4) // 4)
    np.testing.assert_array_equal(y.compute(), expected)


def test_map_blocks_of_two_inputs_takes_input_0s_chunks(two_workers):
    a = np.arange(1000, dtype=np.float32)
    b = (np.arange(1000) % 5).astype(np.float32)
    add = AXPY.replace("__global float* y, float a", "__global const float* b, "
                       "__global float* y, float a").replace("a * x[i]", "a * x[i] + b[i]")
    y = cvd.map_blocks(cvd.kernel(add, "axpy"), da.from_array(a, chunks=300),
                       da.from_array(b, chunks=170), args=(2.0,), device=SPEC)
    assert y.chunks == ((300, 300, 300, 100),)
    np.testing.assert_array_equal(y.compute(), 2 * a + b + np.arange(1000))
    filtered = da.from_array(a, chunks=300)
    filtered = filtered[filtered > 10]
    with pytest.raises(cv.InputError, match="compute_chunk_sizes"):
        cvd.map_blocks(cvd.kernel(AXPY, "axpy"), filtered, args=(1.0,))


@pytest.mark.parametrize("boundary, mode", [
    ("nearest", {"mode": "edge"}),
    ("reflect", {"mode": "symmetric"}),
    ("periodic", {"mode": "wrap"}),
    ("none", {"mode": "edge"}),  # the array's ends: conveyor repeats the edge row
    (5.0, {"mode": "constant", "constant_values": 5.0}),
])
def test_map_blocks_halo_follows_dask_overlap(two_workers, boundary, mode):
    x = ((np.arange(500) * 7) % 13).astype(np.float32)
    y = cvd.map_blocks(cvd.kernel(STENCIL, "sten"), da.from_array(x, chunks=90), halo=2,
                       boundary=boundary, device=SPEC, block_bytes=128)
    got = y.compute()
    np.testing.assert_array_equal(got, _stencil_reference(x, mode))
    if boundary in ("none", "nearest"):  # the same as one local stream's halo
        local = _local(STENCIL, "sten", [x], outputs=[np.float32], halo=2, block_bytes=128)
        np.testing.assert_array_equal(got, local.outputs[0])


def test_map_blocks_halo_merges_chunks_smaller_than_the_halo(two_workers):
    x = np.arange(40, dtype=np.float32)
    got = cvd.map_blocks(cvd.kernel(STENCIL, "sten"), da.from_array(x, chunks=1), halo=2,
                         device=SPEC).compute()
    np.testing.assert_array_equal(got, _stencil_reference(x, {"mode": "edge"}))
    # a halo longer than the array runs it as one chunk, padded as cv.stream pads it
    one = cvd.map_blocks(cvd.kernel(STENCIL, "sten"), da.from_array(x[:1]), halo=2,
                         device=SPEC).compute()
    np.testing.assert_array_equal(one, _stencil_reference(x[:1], {"mode": "edge"}))
    with pytest.raises(cv.InputError, match="boundary='wrap'"):
        cvd.map_blocks(cvd.kernel(STENCIL, "sten"), da.from_array(x), halo=2, boundary="wrap")


@pytest.mark.parametrize("op", ["sum", "min", "max"])
def test_reduce_is_numpy_and_one_local_stream(two_workers, op):
    x = (np.arange(3001, dtype=np.int32) * 7919) % 1009 - 500
    got = cvd.reduce(cvd.kernel(ROWS, "rows"), da.from_array(x, chunks=700), op,
                     device=SPEC, block_bytes=1024).compute()
    values = x.astype(np.int64) * 3 + np.arange(3001) // 4
    assert got == getattr(np, op)(values)
    assert got == _local(ROWS, "rows", [x], reduce=op).result
    assert type(got) is type(_local(ROWS, "rows", [x], reduce=op).result)


# Halo 2 over ints, each row's value a long: a sum, min or max of it reads every row's pad.
ISTENCIL = """
__kernel void isten(__global const int* x, __global long* y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (long)x[i] * 3 - 5L * x[i + 2] + 7L * x[i + 4] + (long)((offset + i) % 5);
}
"""


@pytest.mark.parametrize(("boundary", "chunks"), [
    ("nearest", 7), ("reflect", (1, 1, 5, 2, 11)), ("periodic", 3), ("none", (9, 1, 10)),
    (-4, 6)])
def test_reduce_with_a_halo_is_one_local_stream(two_workers, boundary, chunks):
    """Each chunk folds its own rows only, its neighbours' rows (dask's overlap) given as its
    halo; chunks smaller than the halo are merged first, as map_blocks does."""
    x = ((np.arange(20, dtype=np.int32) * 7919) % 101) - 50
    for op in ("sum", "min", "max"):
        got = cvd.reduce(cvd.kernel(ISTENCIL, "isten"), da.from_array(x, chunks=chunks), op,
                         halo=2, boundary=boundary, device=SPEC).compute()
        local = _local(ISTENCIL, "isten", [x], reduce=op, halo=2,
                       boundary="nearest" if boundary == "none" else boundary).result
        assert got == local, (op, got, local)


def test_reduce_and_map_blocks_with_a_halo_longer_than_the_array(two_workers):
    x = np.array([5, -3, 8], dtype=np.int32)
    for boundary in ("nearest", "reflect", "periodic", 9):
        local = _local(ISTENCIL, "isten", [x], outputs=[np.int64], halo=4, boundary=boundary)
        mapped = cvd.map_blocks(cvd.kernel(ISTENCIL, "isten"), da.from_array(x, chunks=1),
                                halo=4, boundary=boundary, device=SPEC).compute()
        np.testing.assert_array_equal(mapped, local.outputs[0])
        total = cvd.reduce(cvd.kernel(ISTENCIL, "isten"), da.from_array(x, chunks=2), "sum",
                           halo=4, boundary=boundary, device=SPEC).compute()
        assert total == local.outputs[0].sum()


def test_map_blocks_refuses_a_constant_its_dtype_cannot_hold(two_workers):
    x = da.from_array(np.arange(100, dtype=np.float32), chunks=30)
    with pytest.raises(cv.InputError, match=r"boundary=1e\+40 is not a float32 value"):
        cvd.map_blocks(cvd.kernel(STENCIL, "sten"), x, halo=2, boundary=1e40)


def test_map_blocks_refuses_a_complex_boundary(two_workers):
    x = da.from_array(np.arange(100, dtype=np.int32), chunks=30)
    with pytest.raises(cv.InputError, match="boundary="):
        cvd.map_blocks(cvd.kernel(STENCIL, "sten"), x, halo=1, boundary=np.complex64(2))


def test_reduce_of_no_rows_is_what_a_local_stream_gives(two_workers):
    x = da.from_array(np.arange(3001, dtype=np.int32), chunks=700)[:0]
    got = cvd.reduce(cvd.kernel(ROWS, "rows"), x, "sum", device=SPEC).compute()
    local = _local(ROWS, "rows", [np.zeros(0, np.int32)], reduce="sum").result
    assert got == local == 0 and type(got) is type(local)
    with pytest.raises(cv.InputError, match="empty input"):
        cvd.reduce(cvd.kernel(ROWS, "rows"), x, "max", device=SPEC)


def test_reduce_with_a_callable_and_a_function_op(two_workers):
    x = np.arange(1000, dtype=np.float32)

    def rows_seen(x, *, queue, offset, n):
        return [(offset, offset + n)]

    got = cvd.reduce(rows_seen, da.from_array(x, chunks=300), lambda a, b: a + b,
                     device=SPEC, block_bytes=400).compute()
    covered = sorted(got[()])
    assert covered[0][0] == 0 and covered[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:], strict=False))


def test_workers_build_a_kernel_once_and_keep_it(two_workers):
    x = da.from_array(np.arange(400, dtype=np.float32), chunks=50)
    k = cvd.kernel(AXPY.replace("a * x[i]", "a * x[i] + 0.0f"), "axpy")
    before = two_workers.run(dask_worker.cached_kernels)
    for a in (1.0, 2.0):
        cvd.map_blocks(k, x, args=(a,), device=SPEC).compute()
    after = two_workers.run(dask_worker.cached_kernels)
    assert sum(after.values()) - sum(before.values()) <= len(after)  # at most one per worker


def test_warm_builds_on_every_worker_before_the_first_task(two_workers):
    k = cvd.kernel(AXPY.replace("a * x[i]", "a * x[i] + 1.0f"), "axpy")
    before = two_workers.run(dask_worker.cached_kernels)
    specs = cvd.warm(k, client=two_workers, device=SPEC)
    assert sorted(specs) == sorted(before) and set(specs.values()) == {SPEC}
    after = two_workers.run(dask_worker.cached_kernels)
    assert all(after[w] == before[w] + 1 for w in after)
    x = np.arange(100, dtype=np.float32)
    cvd.map_blocks(k, da.from_array(x, chunks=50), args=(1.0,), device=SPEC).compute()
    assert two_workers.run(dask_worker.cached_kernels) == after  # nothing built again


def test_a_chunk_error_is_its_own_type_and_names_chunk_and_worker(two_workers):
    x = np.arange(1000, dtype=np.float32)

    def fails_at_row_600(x, y, *, queue, offset, n):
        if offset <= 600 < offset + n:
            raise ZeroDivisionError("no rows past 600")

    y = cvd.map_blocks(fails_at_row_600, da.from_array(x, chunks=300), device=SPEC)
    with pytest.raises(ZeroDivisionError, match="no rows past 600") as info:
        two_workers.compute(y).result()
    note = " ".join(getattr(info.value, "__notes__", []))
    assert "chunk 2 (rows 600:900)" in note and "on worker" in note and "tcp://" in note
    # A kernel given the wrong count of arguments: refused on the client (round 15), before
    # any chunk fails on a worker with a traceback each.
    with pytest.raises(cv.InputError, match="takes 5 parameters; map_blocks passes 6.*2 args"):
        cvd.map_blocks(cvd.kernel(AXPY, "axpy"), da.from_array(x, chunks=500),
                       args=(1.0, 2.0), device=SPEC)


def test_a_kernel_that_does_not_build_is_a_compile_error_in_the_client(two_workers):
    broken = cvd.kernel(AXPY.replace("a * x[i]", "a * x[i] +* 1"), "axpy")
    y = cvd.map_blocks(broken, da.from_array(np.ones(10, np.float32)), args=(1.0,),
                       device=SPEC)
    with pytest.raises(cv.CompileError) as info:
        two_workers.compute(y).result()
    notes = " ".join(info.value.__notes__)
    assert "chunk 0 (rows 0:10)" in notes and "caused by pyopencl" in notes
    assert info.value.log  # the build log came along


def test_files_one_stream_per_worker_equal_a_local_stream(two_workers, tmp_path):
    x = ((np.arange(2000) * 7) % 13).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    report = cvd.stream(cvd.kernel(STENCIL, "sten"), [str(tmp_path / "x.npy")],
                        [str(tmp_path / "y.npy")], client=two_workers, halo=2, device=SPEC,
                        block_bytes=512)
    assert [r["rows"] for r in report.ranges] == [(0, 1000), (1000, 2000)]
    assert len({r["worker"] for r in report.ranges}) == 2
    got = np.load(tmp_path / "y.npy")
    local = _local(STENCIL, "sten", [x], outputs=[np.float32], halo=2).outputs[0]
    np.testing.assert_array_equal(got, local)
    np.testing.assert_array_equal(got, _stencil_reference(x, {"mode": "edge"}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy", "y.npy"]
    total = cvd.stream(cvd.kernel(ROWS, "rows"), [cv.raw(_raw(tmp_path), np.int32)],
                       reduce="sum", client=two_workers, device=SPEC)
    assert total.result == _local(ROWS, "rows", [np.arange(999, dtype=np.int32)],
                                  reduce="sum").result


def _raw(tmp_path):
    path = tmp_path / "x.raw"
    np.arange(999, dtype=np.int32).tofile(path)
    return path


def test_a_failed_file_stream_leaves_no_output(two_workers, tmp_path):
    np.save(tmp_path / "x.npy", np.arange(1000, dtype=np.float32))

    def fails_late(x, y, *, queue, offset, n):
        if offset + n > 900:
            raise RuntimeError("disk full, say")

    with pytest.raises(RuntimeError, match="disk full") as info:
        cvd.stream(fails_late, [str(tmp_path / "x.npy")], [str(tmp_path / "y.npy")],
                   client=two_workers, device=SPEC, block_bytes=400)
    assert "rows 500:1000 of" in " ".join(info.value.__notes__)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy"]


def test_cli_map_and_reduce_on_a_scheduler(two_workers, tmp_path, capsys):
    from conveyor.cli import main

    (tmp_path / "k.cl").write_text(AXPY)
    np.save(tmp_path / "x.npy", np.arange(1000, dtype=np.float32))
    address = two_workers.scheduler.address
    assert main([
        "map", str(tmp_path / "k.cl"), "--kernel", "axpy", "-i", str(tmp_path / "x.npy"),
        "-o", str(tmp_path / "y.npy"), "--arg", "2", "--scheduler", address,
        "--device", SPEC]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), 3 * np.arange(1000))
    assert main(["reduce", str(tmp_path / "k.cl"), "--kernel", "axpy", "-i",
                 str(tmp_path / "x.npy"), "--arg", "2", "--op", "max", "-q",
                 "--scheduler", address, "--device", SPEC]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "2997.0"


def test_cli_on_a_local_cluster_it_starts(tmp_path, capsys):
    from conveyor.cli import main

    (tmp_path / "k.cl").write_text(ROWS)
    np.save(tmp_path / "x.npy", np.arange(100, dtype=np.int32))
    assert main(["reduce", str(tmp_path / "k.cl"), "--kernel", "rows", "-i",
                 str(tmp_path / "x.npy"), "--cluster", "local", "--device", SPEC,
                 "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    import json

    figures = json.loads(out)
    assert figures["result"] == int(np.sum(np.arange(100) * 3 + np.arange(100) // 4))
    assert sum(hi - lo for lo, hi in (r["rows"] for r in figures["ranges"])) == 100


def test_wrong_inputs_are_input_errors_before_any_work(two_workers, tmp_path):
    x = np.arange(10, dtype=np.float32)
    k = cvd.kernel(AXPY, "axpy")
    with pytest.raises(cv.InputError, match="use map_blocks for arrays"):
        cvd.stream(k, [x], [str(tmp_path / "y.npy")], client=two_workers)
    with pytest.raises(cv.InputError, match="unknown option"):
        cvd.map_blocks(k, da.from_array(x), progress=True)
    with pytest.raises(cv.InputError, match="no kernel|kernel"):
        cvd.kernel(AXPY, "nope")
    with pytest.raises(cv.InputError, match="agree on axis 0"):
        cvd.map_blocks(k, da.from_array(x), da.from_array(x[:5]))
    chain = cv.chain([lambda *a, **kw: None, lambda *a, **kw: None], temps=[np.float32])
    with pytest.raises(cv.InputError, match=r"a chain \(cv.chain\) does not go to Dask"):
        cvd.map_blocks(chain, da.from_array(x))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_cli_local_cuda_without_dask_cuda_is_a_clear_error(tmp_path, capsys):
    import importlib.util

    if importlib.util.find_spec("dask_cuda") is not None:
        pytest.skip("dask-cuda is installed here")
    from conveyor.cli import main

    (tmp_path / "k.cl").write_text(AXPY)
    np.save(tmp_path / "x.npy", np.arange(10, dtype=np.float32))
    assert main(["reduce", str(tmp_path / "k.cl"), "--kernel", "axpy", "-i",
                 str(tmp_path / "x.npy"), "--arg", "1", "--cluster", "local-cuda"]) == 2
    assert "needs dask-cuda" in capsys.readouterr().err


# -- last: these kill a worker (the nanny starts a new one) ------------------------------------
def _killer(marker, row):
    """A callable that kills its own worker process the first time it reaches ``row``."""

    def compute(x, y, *, queue, offset, n):
        if offset <= row < offset + n and not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(str(os.getpid()))
            os._exit(1)
        y.set(x.get(queue=queue) * 2 + np.arange(offset, offset + n, dtype=np.float32),
              queue=queue)

    return compute


def test_a_killed_worker_is_retried_without_lost_or_doubled_rows(two_workers, tmp_path):
    x = np.arange(1200, dtype=np.float32)
    expected = 3 * x
    y = cvd.map_blocks(_killer(str(tmp_path / "map-killed"), 700),
                       da.from_array(x, chunks=300), device=SPEC, block_bytes=400)
    # On the cluster by name: the callable must never run in this process.
    np.testing.assert_array_equal(two_workers.compute(y).result(), expected)
    assert (tmp_path / "map-killed").exists()  # a worker really died mid-chunk

    two_workers.wait_for_workers(2, timeout=60)
    np.save(tmp_path / "x.npy", x)
    cvd.stream(_killer(str(tmp_path / "file-killed"), 1000), [str(tmp_path / "x.npy")],
               [str(tmp_path / "y.npy")], client=two_workers, device=SPEC, block_bytes=400)
    assert (tmp_path / "file-killed").exists()
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "file-killed", "map-killed", "x.npy", "y.npy"]
