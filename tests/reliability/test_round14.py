"""Round fourteen: a helper tried ``cv.stream`` with unusual but legal inputs, as users and
attackers would; what it found, fixed (each test fails on the code before its fix).

- A callable ``reduce="sum"`` over zero rows of a datetime64 or structured input raised
  NumPy's ``UFuncTypeError`` ("ufunc 'add' cannot use operands with types dtype('<M8[s]')"):
  the sum of no elements was ``np.zeros(0, input_dtype).sum()``, which those dtypes do not
  have, though the callable's partials are its own numbers (a count, a field's sum). The same
  stream over one row or more worked. It is int 0 now, as for a type conveyor cannot know.
- An output given as a dtype's name (``"datetime64[s]"``, ``"U3"``, ``"S4"``) was refused
  with advice to pass ``np.datetime64[s]``, ``np.str96`` or ``np.bytes32``: code that does
  not run. Such dtypes are spelled ``np.dtype('datetime64[s]')`` now.

A second helper tried files, the command line and lifecycles:

- A shared memory map of a file as one output and that file as another (``cv.npy_out``) was
  not refused (two paths, or two maps, are): the file output replaced the file at the end,
  and the map's rows went with the old one. Exit 0, one output lost.
- ``files._umask`` read the umask by setting it to 0 and back: two threads committing
  outputs at once could leave the process's umask 0 for good.
- (The command line's and the cache's findings are tested beside their kind: test_cache.py,
  test_round11_cli.py.)
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import assert_clean  # noqa: E402

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402
from conveyor.pipeline.sinks import dtype_code  # noqa: E402

RECORD = np.dtype([("x", "f4"), ("y", "f4")])


@pytest.mark.parametrize("rows", [0, 1, 5])
def test_a_callable_sum_over_dates_counts_from_no_rows_to_many(device, rows):
    if device.backend != "opencl":
        pytest.skip("the callable reads PyOpenCL arrays")
    t = np.full(rows, np.datetime64("2021-06-01", "s"))

    def recent(t, *, queue, offset, n):
        return np.count_nonzero(t.get() > np.datetime64("2020-01-01"))

    report = cv.stream(recent, [t], device=device, reduce="sum")
    assert report.result == rows
    assert_clean(device)


def test_a_callable_sum_over_no_records_is_zero(device):
    if device.backend != "opencl":
        pytest.skip("the callable reads PyOpenCL arrays")

    def field_sum(r, *, queue, offset, n):
        return r.get()["x"].sum()

    assert cv.stream(field_sum, [np.zeros(0, RECORD)], device=device, reduce="sum").result == 0
    assert cv.stream(field_sum, [np.ones(3, RECORD)], device=device, reduce="sum").result == 3
    assert_clean(device)


def test_a_callable_sum_over_no_floats_keeps_numpys_type(device):
    """guard: where the input's dtype has a sum, an empty one is NumPy's (float32 0.0)."""
    if device.backend != "opencl":
        pytest.skip("the callable reads PyOpenCL arrays")

    def total(x, *, queue, offset, n):
        return x.get().sum()

    result = cv.stream(total, [np.zeros(0, np.float32)], device=device, reduce="sum").result
    assert result == 0 and np.asarray(result).dtype == np.float32


@pytest.mark.parametrize("name", ["datetime64[s]", "U3", "S4", "timedelta64[ms]", "V8",
                                  "uint8", "float32", ">f8"])
def test_an_output_named_by_its_dtype_is_told_code_that_runs(device, name):
    x = np.zeros(8, np.uint8)

    def copy(x, y, *, queue, offset, n):
        y[:] = x

    with pytest.raises(InputError, match="pass the dtype itself") as caught:
        cv.stream(copy, [x], [name], device=device)
    advised = str(caught.value).rsplit("pass the dtype itself (", 1)[1][:-1]
    assert np.dtype(eval(advised, {"np": np})) == np.dtype(name), advised


@pytest.mark.parametrize("dtype", [np.dtype("datetime64[s]"), np.dtype("<U3"), RECORD,
                                   np.dtype(object), np.dtype(np.float16), np.dtype(">i4")])
def test_dtype_code_is_python_that_makes_the_dtype(dtype):
    assert np.dtype(eval(dtype_code(dtype), {"np": np})) == dtype


TWO = """
__kernel void two(__global const float *x, __global float *y, __global float *z, ulong offset,
                  ulong n) {
    ulong i = get_global_id(0);
    if (i < n) { y[i] = 2.0f * x[i]; z[i] = 3.0f * x[i]; }
}
"""


def test_a_memory_map_and_a_file_output_of_one_file_are_refused_before_any_work(device,
                                                                                tmp_path):
    if device.backend != "opencl":
        pytest.skip("an OpenCL C kernel")
    k = device.compile(TWO, "two")
    x = np.arange(1000, dtype=np.float32)
    path = tmp_path / "both.npy"
    shared = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(1000,))
    link = tmp_path / "link.npy"
    link.symlink_to(path)
    for named in (path, link):
        with pytest.raises(InputError, match=r"output 0 is a memory map of .*both\.npy, and "
                                             r"output 1 .* is that file"):
            cv.stream(k, [x], [shared, cv.npy_out(named)], device=device)
    assert not shared.any()  # nothing ran
    del shared
    # guard: a copy-on-write map never writes its file: both results are kept
    private = np.load(path, mmap_mode="c")
    cv.stream(k, [x], [private, cv.npy_out(path)], device=device)
    np.testing.assert_array_equal(private, 2 * x)
    np.testing.assert_array_equal(np.load(path), 3 * x)
    assert_clean(device)


def test_reading_the_umask_from_many_threads_leaves_it_as_it_was():
    from conveyor.files import _umask

    old = os.umask(0o027)
    stop = threading.Event()
    seen: set[int] = set()
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        def read() -> None:
            while not stop.is_set():
                seen.add(_umask())

        threads = [threading.Thread(target=read) for _ in range(4)]
        for t in threads:
            t.start()
        stop.wait(0.5)
        stop.set()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
        now = os.umask(old)
    assert now == 0o027 and seen == {0o027}


COPY = """
__kernel void cp(__global const float *a, __global float *c, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) c[i] = a[i];
}
"""


@pytest.mark.parametrize("maker", ["npy_out", "raw_out"])
@pytest.mark.parametrize("dtype", [">f4", "i4"])
def test_an_output_file_of_the_wrong_dtype_is_told_the_dtype_to_pass(device, tmp_path, maker,
                                                                     dtype):
    """Round fourteen: ``cv.npy_out(p, dtype=">f4")`` for a ``float*`` was told to "pass
    a.astype(a.dtype.newbyteorder('='))", and ``dtype="i4"`` to "pass an array of float32
    (e.g. a.astype(np.float32))": there is no array ``a``; the fix is dtype=."""
    if device.backend != "opencl":
        pytest.skip("an OpenCL C kernel")
    k = device.compile(COPY, "cp")
    path = tmp_path / "out.bin"
    with pytest.raises(InputError) as caught:
        cv.stream(k, [np.zeros(8, np.float32)], [getattr(cv, maker)(path, dtype=dtype)],
                  device=device)
    message = str(caught.value)
    assert f"output 0 ({path})" in message, message
    assert f"pass dtype=np.float32 to cv.{maker}" in message and "astype" not in message
    assert not path.exists()


# -- a third helper: sources, the trace, threads --------------------------------------------
IDENT = """
__kernel void ident(__global const float *a, __global float *c, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) c[i] = a[i];
}
"""


class _SlowChunks:
    """An iterator object (not a generator) of 20 chunks of 10 rows, each after a pause."""

    def __init__(self) -> None:
        self.i = 0

    def __iter__(self):
        return self

    def __next__(self):
        import time

        time.sleep(0.003)
        if self.i == 20:
            raise StopIteration
        self.i += 1
        return np.arange((self.i - 1) * 10, self.i * 10, dtype=np.float32)


def test_one_iterate_input_given_to_two_streams_at_once_serves_one_and_refuses_the_other(
        device):
    """Round fourteen: one ``cv.iterate`` source read by two streams at once: both shared its
    position and held rows with no lock, and returned each other's rows and uninitialised
    memory with no error (or a generator's ``ValueError: generator already executing``).
    The source is claimed at the start of a stream now: the second gets an InputError."""
    if device.backend != "opencl":
        pytest.skip("an OpenCL C kernel")
    k = device.compile(IDENT, "ident")
    for attempt in range(3):
        source = cv.iterate(_SlowChunks(), length=200)
        go = threading.Barrier(2)
        results: dict[int, object] = {}

        def work(j: int, source=source, go=go, results=results) -> None:
            go.wait()
            try:
                results[j] = cv.stream(k, [source], [np.float32], device=device,
                                       block_bytes=64).outputs[0]
            except InputError as exc:
                results[j] = exc

        threads = [threading.Thread(target=work, args=(j,)) for j in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        outputs = [r for r in results.values() if isinstance(r, np.ndarray)]
        refusals = [r for r in results.values() if isinstance(r, InputError)]
        assert len(outputs) == 1 and len(refusals) == 1, (attempt, results)
        np.testing.assert_array_equal(outputs[0], np.arange(200, dtype=np.float32))
        assert "being read by another stream" in str(refusals[0])
        assert_clean(device)


@pytest.mark.parametrize("kind", ["parquet", "arrow", "memmap in args"])
def test_a_trace_naming_a_table_or_an_args_memmap_is_refused(device, tmp_path, kind):
    """Round fourteen: ``trace=`` naming a Parquet or Arrow input (or a memory-mapped .npy in
    ``args=``) replaced that file with the trace; a .npy input was refused already."""
    if device.backend != "opencl":
        pytest.skip("an OpenCL C kernel")
    k = device.compile(IDENT, "ident")
    x = np.arange(1000, dtype=np.float32)
    if kind == "memmap in args":
        k = device.compile("""
        __kernel void look(__global const float *a, __global float *c, __global const float *t,
                           ulong offset, ulong n) {
            ulong i = get_global_id(0);
            if (i < n) c[i] = a[i] + t[0];
        }""", "look")
        path = tmp_path / "table.npy"
        np.save(path, x)
        table = np.load(path, mmap_mode="r")
        inputs, args = [x], [table]
    else:
        pa = pytest.importorskip("pyarrow")
        path = tmp_path / f"data.{kind}"
        if kind == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(pa.table({"x": x}), path)
        else:
            import pyarrow.feather as feather

            feather.write_feather(pa.table({"x": x}), path)
        inputs, args = [getattr(cv, kind)(path, "x")], []
    before = path.read_bytes()
    with pytest.raises(InputError, match="names the same file as"):
        cv.stream(k, inputs, [np.float32], device=device, trace=path, args=args)
    assert path.read_bytes() == before


# -- a fourth helper: several devices, chains, conveyor.dask ---------------------------------
POOL2 = """
__kernel void pool2(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n / 2) y[i] = x[2 * i] + x[2 * i + 1];
}
"""
DEFINED_OUT = """
#define OUT double
__kernel void k(__global const float *x, __global OUT *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (OUT)x[i] * 2;
}
"""


@pytest.mark.parametrize("shape", ["rows", "per_block"])
def test_dask_map_blocks_refuses_a_shaped_output_for_dtype(shape):
    """Round fourteen: ``conveyor.dask.map_blocks(dtype=cv.rows(np.float32, ratio=(1, 2)))``
    was read as float32 (NumPy takes anything with a ``.dtype``): the output had input 0's
    rows, the kernel wrote half, and the rest was a pooled buffer's old bytes. No error."""
    da = pytest.importorskip("dask.array")
    import conveyor.dask as cvd

    given = (cv.rows(np.float32, ratio=(1, 2)) if shape == "rows"
             else cv.per_block((1,), np.float32))
    x = da.from_array(np.arange(1, 21, dtype=np.float32), chunks=10)
    with pytest.raises(InputError, match=rf"dtype=cv\.{shape}\(\.\.\.\) is not a NumPy dtype"):
        cvd.map_blocks(cvd.kernel(POOL2, "pool2"), x, dtype=given)


def test_dask_output_dtype_is_the_kernels_after_its_macros(device):
    """Round fourteen: the default output dtype was read from the raw text, so ``#define OUT
    double`` gave input 0's float32, which every chunk's stream then refused."""
    da = pytest.importorskip("dask.array")
    import conveyor.dask as cvd

    if device.backend != "opencl":
        pytest.skip("an OpenCL C kernel")
    x = np.arange(8, dtype=np.float32)
    y = cvd.map_blocks(cvd.kernel(DEFINED_OUT, "k"), da.from_array(x, chunks=4),
                       device=device.spec)
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y.compute(scheduler="synchronous"), 2 * x.astype(np.float64))
    with_option = DEFINED_OUT.replace("#define OUT double\n", "")
    spec = cvd.kernel(with_option, "k", options=["-DOUT=int"])
    assert cvd.map_blocks(spec, da.from_array(x, chunks=4)).dtype == np.int32


def test_dask_map_blocks_refuses_files_and_images_on_the_client(tmp_path):
    """Round fourteen: ``cv.npy(path)`` raised AttributeError inside dask; a path and a
    ``cv.image`` were called "a scalar (0-d)"."""
    pytest.importorskip("dask.array")
    import conveyor.dask as cvd

    path = tmp_path / "x.npy"
    np.save(path, np.arange(10, dtype=np.float32))
    k = cvd.kernel(IDENT, "ident")
    for given, phrase in ((cv.npy(path), "is a file"), (str(path), "is a file"),
                          (path, "is a file"),
                          (cv.image(np.ones((4, 4), np.float32)), "is a cv.image")):
        with pytest.raises(InputError, match=phrase):
            cvd.map_blocks(k, given)


@pytest.mark.parametrize("spec", [",", " , ", ",,"])
def test_a_device_spec_of_commas_alone_is_an_input_error(spec):
    """Round fourteen: ``device=","`` raised IndexError from inside cv.stream (and the
    command line printed its traceback)."""
    with pytest.raises(InputError, match="names no device"):
        cv.stream(IDENT, [np.ones(4, np.float32)], [np.float32], device=spec)


@pytest.mark.parametrize("block_bytes", [4000, 2 * 2**20])  # staged inline, and on threads
def test_staging_spans_carry_the_bytes_they_staged(device, block_bytes):
    """Round fourteen: every stage-in and stage-out span had ``nbytes`` 0 (only the copies
    carried bytes), though the README says each slice of the trace has its bytes."""
    if device.backend != "opencl" or device.info.host_unified is False:
        pytest.skip("staged on PoCL's CPU device (zero_copy=False)")
    k = device.compile(IDENT, "ident")
    x = np.arange(3 * 2**20 // 4 + 77, dtype=np.float32)
    y = np.empty_like(x)
    report = cv.stream(k, [x], [y], device=device, block_bytes=block_bytes, zero_copy=False)
    np.testing.assert_array_equal(y, x)
    staged = {lane: sum(s.nbytes for s in report.timeline.lane(lane))
              for lane in ("stage-in", "copy-in", "copy-out", "stage-out")}
    assert staged == dict.fromkeys(staged, x.nbytes), staged


def test_a_report_pickles_and_copies_with_its_timeline(device, tmp_path):
    """Round fourteen: the report of a stream with blocks could not be pickled ("Can't
    pickle local object 'Engine._report.<locals>.timeline'"), so it could not come back
    from a multiprocessing worker; a 0-block report could."""
    import copy
    import pickle

    if device.backend != "opencl":
        pytest.skip("an OpenCL C kernel")
    k = device.compile(IDENT, "ident")
    x = np.arange(100_000, dtype=np.float32)
    report = cv.stream(k, [x], [np.empty_like(x)], device=device, block_bytes=40_000)
    for other in (pickle.loads(pickle.dumps(report)), copy.deepcopy(report)):
        assert other.blocks == report.blocks == 10
        assert len(other.timeline.spans) == len(report.timeline.spans)
        assert other.overlap == report.overlap and str(other) == str(report)
        np.testing.assert_array_equal(other.outputs[0], x)


# -- a fifth helper: kernels, their parameters, the cache --------------------------------------
UNNAMED_FORMS = ["float UNUSED", "uint __attribute__((aligned(4)))",
                 "__global float * __attribute__((aligned(16)))", "union U", "enum E"]


def test_unnamed_parameters_with_attributes_or_tags_build_in_a_child_process():
    """Round fourteen: an unnamed ``float __attribute__((unused))`` (or ``union U``, ``enum E``)
    was read as a parameter named by its last word, so PoCL was asked that argument's name,
    which it answers for unnamed arguments by crashing: the process died of SIGSEGV. Run in
    a child, so a regression fails this test instead of ending the run."""
    import subprocess

    script = f"""
import sys, numpy as np, conveyor as cv
devices = [d for d in cv.devices() if d.backend == "opencl"]
if not devices:
    sys.exit(0)
dev = devices[0]
pre = ("union U {{ float a; int b; }};\\nenum E {{ A, B }};\\n"
       "#define UNUSED __attribute__((unused))\\n")
for form in {UNNAMED_FORMS!r}:
    src = pre + ("__kernel void f(__global const float *x, __global float *y, %s, ulong offset, "
                 "ulong n) {{ ulong i = get_global_id(0); if (i < n) y[i] = x[i] * 2; }}" % form)
    try:
        k = dev.compile(src, "f")
    except cv.CompileError:
        continue  # NVIDIA's compiler wants every parameter named: refused, not a crash
    assert [p.name for p in k.params][:2] == ["x", "y"] and k.params[2].name in ("", "arg2"), (
        form, [p.name for p in k.params])
print("built", len({UNNAMED_FORMS!r}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                              [str(Path(cv.__file__).resolve().parents[1]),
                               os.environ.get("PYTHONPATH", "")])))
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])


BY_VALUE = """
typedef struct { char c; float f; } S;
__kernel void add(__global const float *x, __global float *y, S s, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + s.c + 10 * s.f;
}
"""


def test_a_struct_passed_by_value_takes_its_c_layout_only(device):
    """Round fourteen: a struct parameter by value took any NumPy scalar "as given": NumPy's
    packed record (5 bytes for {char; float}) gave 1.0 where C's layout gives 21.0, and an
    np.float64 gave 18.75, with no error. Struct pointers were checked already."""
    if device.backend != "opencl":
        pytest.skip("an OpenCL C kernel")
    k = device.compile(BY_VALUE, "add")
    x = np.zeros(4, np.float32)
    fields = [("c", "i1"), ("f", "f4")]
    aligned = np.array((1, 2.0), np.dtype(fields, align=True))[()]
    y = np.empty_like(x)
    cv.stream(k, [x], [y], args=(aligned,), device=device)
    np.testing.assert_array_equal(y, 21.0)
    for value, phrase in ((np.array((1, 2.0), np.dtype(fields))[()], "lies at byte 1"),
                          (np.float64(1.0), "is a struct of 8 bytes passed by value"),
                          (np.array((1, 2.0), np.dtype([("c", "i1"), ("f", ">f4")],
                                                       align=True))[()], "byte order")):
        with pytest.raises(InputError, match=phrase):
            cv.stream(k, [x], [np.empty_like(x)], args=(value,), device=device)
    assert_clean(device)


# -- a sixth helper: lifecycle, memory, processes ----------------------------------------------
def test_svm_pinned_arrays_are_settled_by_streams_and_freed_by_close(device):
    """Round fourteen: the pool of ``cv.pinned.empty(..., svm=True)`` blocks was neither
    settled at a stream's end nor closed by ``device.close()``: every size ever made stayed
    held (274 MiB after 60 sizes, and after close)."""
    from conveyor.memory.pinned import existing_svm_pool

    if not device.svm:
        pytest.skip("no fine-grained SVM")
    k = device.compile(IDENT, "ident")
    sizes = [2**18 + 4096 * i for i in range(40)]  # 40 size classes of about 1 MiB
    for n in sizes:
        x = cv.pinned.empty(n, np.float32, device=device, svm=True)
        x[:] = 2
        out = np.empty_like(x)
        cv.stream(k, [x], [out], device=device)
        assert (out == 2).all()
        del x, out
    pool = existing_svm_pool(device)
    assert pool is not None
    held = pool.stats().held_bytes
    assert held < sum(n * 4 for n in sizes) // 4, held  # the keep budget, not every size
    device.close()
    assert pool.stats().held_bytes == 0


def test_a_plan_over_the_pools_limit_says_to_raise_that_limit(device):
    """Round fourteen: with no memory_limit= and ``device.memory_pool.limit`` below the ring,
    the refusal advised "a larger memory_limit", which then failed with OutOfMemoryError; a
    block of one row in one slot was still told to shrink its block or depth."""
    if device.backend != "opencl":
        pytest.skip("an OpenCL C kernel")
    k = device.compile(IDENT, "ident")
    a = np.arange(1_000_000, dtype=np.float32)
    old = device.memory_pool.limit
    device.memory_pool.limit = 100_000
    try:
        with pytest.raises(InputError, match=r"the device pool's limit of 100000 \(device\."
                                             r"memory_pool\.limit\): use a smaller block_bytes, "
                                             r"or a lower depth, or a higher device\.memory_pool"):
            cv.stream(k, [a], [np.empty_like(a)], device=device, block_bytes="64KiB",
                      zero_copy=False)
    finally:
        device.memory_pool.limit = old
    with pytest.raises(InputError, match=r"memory limit of 200: use a larger memory_limit$"):
        cv.stream(k, [a], [np.empty_like(a)], device=device, block_bytes=4, depth=1,
                  memory_limit=200, zero_copy=False)


def test_pinned_empty_out_of_memory_advises_what_applies_to_an_array(device):
    """Round fourteen: OutOfMemoryError from ``cv.pinned.empty`` advised "a lower
    memory_limit, smaller blocks (block_bytes=) or a lower depth": no stream is involved."""
    import pickle

    from conveyor.errors import OutOfMemoryError

    old = device.pinned_pool.limit
    device.pinned_pool.limit = 2**20
    try:
        with pytest.raises(OutOfMemoryError) as caught:
            cv.pinned.empty(1_000_000, np.float32, device=device)
    finally:
        device.pinned_pool.limit = old
    text = str(caught.value)
    assert text.endswith("use a smaller array, or raise device.pinned_pool.limit"), text
    assert "memory_limit" not in text and str(pickle.loads(pickle.dumps(caught.value))) == text
    if device.svm:
        with pytest.raises(InputError, match="largest allocation"):
            cv.pinned.empty(device.max_alloc_bytes + 1, np.uint8, device=device, svm=True)


def test_pinned_empty_takes_subarray_dtypes_as_numpy_does(device):
    a = cv.pinned.empty((3,), np.dtype((np.float32, (2, 3))), device=device)
    assert a.shape == (3, 2, 3) and a.dtype == np.float32
    with pytest.raises(InputError, match="has no bytes"):
        cv.pinned.empty((3,), "S0", device=device)


CLANG_CHOSEN = """
#ifdef __clang__
typedef double real;
#else
typedef float real;
#endif
__kernel void twice(__global const real *x, __global real *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2 * x[i];
}
"""
AGREED = """
typedef float real;
#define COUNT uint
typedef struct { float a; double b; } rec;
__kernel void use(__global const real *x, __global real *y, COUNT k, __global const rec *r,
                  ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * k + (real)r[0].b;
}
"""


def test_a_type_chosen_by_a_macro_conveyor_does_not_know_is_refused_not_misread(device,
                                                                                tmp_path,
                                                                                monkeypatch):
    """Round fourteen: ``#ifdef __clang__ typedef double real; #else typedef float real;``
    was read as float (conveyor's preprocessor does not define __clang__; PoCL's compiler
    does): a float32 array went to a double kernel, the answers were wrong, and with
    zero_copy the kernel wrote past its output. The compiler now confirms each such size."""
    if device.backend != "opencl" or "Portable Computing Language" not in device.info.platform:
        pytest.skip("PoCL's compiler (clang) defines __clang__")
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(InputError, match=r"kernel parameter twice\.x: conveyor read its type "
                                         r"real as 4 bytes( \(float\))?, but the "
                                         r"compiler's sizeof\(real\)"):
        device.compile(CLANG_CHOSEN, "twice")


def test_typedef_and_macro_types_conveyor_reads_right_build_and_stream(device, tmp_path,
                                                                         monkeypatch):
    """guard: the compiler's sizeof agrees with conveyor's reading: built once, exact."""
    if device.backend != "opencl":
        pytest.skip("an OpenCL C kernel")
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path / "cache"))
    k = device.compile(AGREED, "use")
    x = np.arange(10, dtype=np.float32)
    r = np.zeros(1, np.dtype([("a", "f4"), ("b", "f8")], align=True))
    r["b"] = 0.5
    y = np.empty_like(x)
    cv.stream(k, [x], [y], args=(3, r), device=device)
    np.testing.assert_array_equal(y, x * 3 + 0.5)


def test_a_check_the_compiler_cannot_evaluate_is_dropped(device, tmp_path, monkeypatch):
    """guard: a macro that is no type alone (``#define GF __global float``) cannot be
    measured with sizeof: the kernel builds without that check, as before."""
    if device.backend != "opencl":
        pytest.skip("an OpenCL C kernel")
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path / "cache"))
    source = """
    #define GF __global float
    __kernel void f(GF *x, GF *y, ulong offset, ulong n) {
        ulong i = get_global_id(0);
        if (i < n) y[i] = x[i] + 1;
    }"""
    k = device.compile(source, "f")
    x = np.arange(5, dtype=np.float32)
    y = np.empty_like(x)
    cv.stream(k, [x], [y], device=device)
    np.testing.assert_array_equal(y, x + 1)


def test_dask_refuses_a_big_endian_input_on_the_client():
    """Round fourteen: a big-endian input was checked only by each chunk's stream on the
    workers (a logged traceback per chunk), not on the client as object dtypes are."""
    da = pytest.importorskip("dask.array")
    import conveyor.dask as cvd

    x = da.from_array(np.arange(10, dtype=">f4"), chunks=5)
    with pytest.raises(InputError, match=r"input 0 has dtype >f4, not in this machine's byte"):
        cvd.map_blocks(cvd.kernel(IDENT, "ident"), x)
