"""Round fifteen, helper d: a hostile input or environment, as an attacker (or an unlucky
user) would present it: the kernel cache and the headers its key covers, ``.npy`` files that
lie, file outputs on a full disk or through links, the environment conveyor reads (``HOME``,
``PYOPENCL_BUILD_OPTIONS``) and kernel sources with tricks.

Each bug found has a test here, seen failing on the code before its fix; guards say "guard:".
"""

from __future__ import annotations

import errno
import os
import re
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    assert_clean,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    opencl_c_only,
)

import conveyor as cv  # noqa: E402
from conveyor import config  # noqa: E402
from conveyor.errors import InputError  # noqa: E402
from conveyor.kernels import build  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_memo")  # tests/conftest.py: the disk cache on

SCALE_SRC = """__kernel void scale_by(__global const float *x, __global float *y, ulong offset,
                       ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * SCALE;
}
"""

COPY_SRC = """__kernel void copy_on(__global const float *x, __global float *y, ulong offset,
                      ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + 1.0f;
}
"""


def _run_scale(device: cv.Device, source: str, options: tuple[str, ...] = ()) -> float:
    """Build ``scale_by`` afresh (memo cleared: through the disk cache) and return SCALE."""
    build.clear_memo()
    kernel = device.compile(source, "scale_by", options)
    x = np.ones(8, np.float32)
    y = np.zeros_like(x)
    cv.stream(kernel, [x], [y], device=device)
    return float(y[0])


# -- the kernel cache's key and the headers the compiler really reads -------------------------
def test_a_header_included_from_a_symlinked_header_is_in_the_cache_key(device, tmp_path,
                                                                       monkeypatch):
    """``inc/a.h`` is a symlink to ``real/a.h``, which says ``#include "b.h"``: the compiler
    finds ``b.h`` beside the header as it was named (``inc/b.h``: a header farm of links),
    but the key looked beside the link's target (``real/``), found nothing, and keyed the
    header as missing. Editing ``inc/b.h`` then loaded the old binary: SCALE 2 after it was
    changed to 3, no warning."""
    opencl_c_only(device)
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "inc").mkdir()
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "a.h").write_text('#include "b.h"\n')
    (tmp_path / "inc" / "a.h").symlink_to(tmp_path / "real" / "a.h")
    header = tmp_path / "inc" / "b.h"
    header.write_text("#define SCALE 2.0f\n")
    source = f'#include "{tmp_path}/inc/a.h"\n' + SCALE_SRC
    assert _run_scale(device, source) == 2.0  # the compiler reads inc/b.h
    header.write_text("#define SCALE 3.0f\n")
    assert _run_scale(device, source) == 3.0  # 2.0: the binary of the old header


def test_headers_from_an_include_dir_in_pyopencl_build_options_are_in_the_key(
        device, tmp_path, monkeypatch):
    """PyOpenCL appends ``PYOPENCL_BUILD_OPTIONS`` to every build, and the key has the
    variable's text (round one), but not the contents of the headers its ``-I`` folders
    give: an edited header loaded the binary of its old text."""
    opencl_c_only(device)
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "envinc"
    folder.mkdir()
    header = folder / "scale.h"
    header.write_text("#define SCALE 2.0f\n")
    monkeypatch.setenv("PYOPENCL_BUILD_OPTIONS", f"-I{folder}")
    source = '#include "scale.h"\n' + SCALE_SRC
    assert _run_scale(device, source) == 2.0
    header.write_text("#define SCALE 3.0f\n")
    assert _run_scale(device, source) == 3.0  # 2.0 from the cache


def test_headers_from_an_include_dir_in_options_are_in_the_key(device, tmp_path, monkeypatch):
    """guard: the same header through conveyor's own ``-I`` option misses after an edit."""
    opencl_c_only(device)
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "optinc"
    folder.mkdir()
    header = folder / "scale.h"
    header.write_text("#define SCALE 2.0f\n")
    source = '#include "scale.h"\n' + SCALE_SRC
    assert _run_scale(device, source, (f"-I{folder}",)) == 2.0
    header.write_text("#define SCALE 3.0f\n")
    assert _run_scale(device, source, (f"-I{folder}",)) == 3.0


def test_a_lock_folder_that_is_a_file_leaves_the_kernel_built_and_cached(device, tmp_path,
                                                                        monkeypatch):
    """guard: ``locks`` planted as a plain file in the cache: one warning, the kernel builds
    (unlocked), is stored, and computes right; the file is not touched."""
    opencl_c_only(device)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (cache / "locks").write_text("mine")
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(cache))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert _run_scale(device, "#define SCALE 4.0f\n" + SCALE_SRC) == 4.0
    assert any("build-lock folder" in str(w.message) for w in record)
    assert (cache / "locks").read_text() == "mine"
    assert len(list(cache.glob("*.bin"))) == 1


# -- the environment: HOME ----------------------------------------------------------------------
def test_a_relative_home_does_not_put_the_cache_in_the_current_folder(device, tmp_path,
                                                                     monkeypatch):
    """``CONVEYOR_CACHE_DIR`` and ``XDG_CACHE_HOME`` must be absolute; ``HOME`` was taken as
    it is, so ``HOME=relhome`` made ``relhome/.cache/conveyor`` in whatever folder the process
    was in (binaries it will run, kept under a path that follows ``chdir``)."""
    opencl_c_only(device)
    monkeypatch.delenv("CONVEYOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", "relhome")
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _run_scale(device, "#define SCALE 6.0f\n" + SCALE_SRC) == 6.0
    assert not (tmp_path / "relhome").exists()
    assert config.cache_dir().is_absolute()


def test_a_user_with_no_home_can_still_compile(device, monkeypatch):
    """``docker run -u 54321`` with no ``HOME``: ``Path.home()`` could not tell the home, and
    every ``compile()`` failed with ``RuntimeError: Could not determine home directory``
    from ``config.cache_dir``. The cache is optional: the kernel builds uncached, with one
    warning that says how to name a cache folder. (The password database is made to have no
    entry for this user, as in such a container; the device and compiler are real.)"""
    opencl_c_only(device)
    import pwd

    for name in ("HOME", "CONVEYOR_CACHE_DIR", "XDG_CACHE_HOME", "CONVEYOR_NO_CACHE"):
        monkeypatch.delenv(name, raising=False)

    def no_entry(uid: int) -> None:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    monkeypatch.setattr(build, "_warned_no_home", False)
    with pytest.raises(config.NoHomeError, match="CONVEYOR_CACHE_DIR"):
        config.cache_dir()
    with pytest.warns(RuntimeWarning, match="uncached.*CONVEYOR_CACHE_DIR"):
        assert _run_scale(device, "#define SCALE 7.0f\n" + SCALE_SRC) == 7.0
    assert build.default_cache() is None


# -- kernel sources with tricks -------------------------------------------------------------------
@pytest.mark.parametrize("where", ["source", "option", "name"])
def test_a_lone_surrogate_in_a_source_option_or_name_is_an_input_error(device, where):
    """Text read with ``errors='surrogateescape'`` (a Latin-1 comment in a kernel file, an
    environment variable) holds lone surrogates, which no compiler takes:
    ``compile()`` raised ``UnicodeEncodeError: 'utf-8' codec can't encode character
    '\\udce9'`` from ``cache_key``'s ``source.encode()`` (an option's, from PyOpenCL's
    build). It should be an InputError naming the source's line (or the option), as a NUL
    character already is."""
    source = "#define SCALE 2.0f\n" + SCALE_SRC
    options: tuple[str, ...] = ()
    name = "scale_by"
    if where == "source":
        source = "// caf\udce9\n" + source
    elif where == "option":
        options = ("-DNOTE=caf\udce9",)
    else:
        name = "scale_by\udce9"  # from _signature_key's name.encode()
    match = {"source": "line 1", "option": "options", "name": "scale_by"}[where]
    with pytest.raises(InputError, match=match):
        device.compile(source, name, options)


def test_a_user_name_like_the_size_checks_does_not_hide_a_wrong_size(device):
    """guard: a source that already defines ``__conveyor_sizeof_check_0`` (the name of the
    size check conveyor appends) with a type chosen by ``__clang__``: the check is still
    the one that fails, and a float32 array never reaches the double kernel."""
    opencl_c_only(device)
    source = textwrap.dedent("""
        #ifdef __clang__
        typedef double real;
        #else
        typedef float real;
        #endif
        typedef int __conveyor_sizeof_check_0;
        __kernel void twice(__global const real *x, __global real *y, ulong offset, ulong n) {
            ulong i = get_global_id(0);
            if (i < n) y[i] = x[i] * 2;
        }
    """)
    with pytest.raises(InputError, match="sizeof"):
        device.compile(source, "twice")


# -- .npy inputs that lie --------------------------------------------------------------------------
class _Planted:
    """An object whose unpickling makes a folder: proof that a file was unpickled."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.mark.parametrize("dtype", [object, [("a", "f4"), ("b", "O")]])
def test_a_pickled_npy_is_refused_and_never_unpickled(device, tmp_path, dtype):
    """guard: an object (or record-with-object) ``.npy`` whose pickle would run code is an
    InputError, by path and through ``cv.npy``, and nothing of it is unpickled."""
    marker = tmp_path / "unpickled"
    path = tmp_path / "evil.npy"
    values = np.empty(2, dtype=dtype)
    if values.dtype.names:
        values["b"] = [_Planted(str(marker)), None]
    else:
        values[:] = [_Planted(str(marker)), None]
    np.save(path, values, allow_pickle=True)
    kernel = device.compile(cv.portable("#define SCALE 1.0f\n" + SCALE_SRC), "scale_by")
    with pytest.raises(InputError, match="Python objects"):
        cv.stream(kernel, [str(path)], [np.float32], device=device)
    with pytest.raises(InputError, match="Python objects"):
        cv.npy(path)
    assert not marker.exists()
    assert_clean(device)


def _npy_header(path: Path, header: dict, body: bytes, version: int = 1) -> None:
    with open(path, "wb") as f:
        if version == 1:
            np.lib.format.write_array_header_1_0(f, header)
        else:
            np.lib.format.write_array_header_2_0(f, header)
        f.write(body)


@pytest.mark.parametrize("shape", [(2**61, 8), (2**62, 2**62), (3, 2**63)])
def test_npy_shapes_past_int64_are_input_errors(device, tmp_path, shape):
    """guard: a header whose shape's product (or one dimension) passes int64 is refused by
    name before anything is allocated."""
    path = tmp_path / "huge.npy"
    _npy_header(path, {"descr": "<f4", "fortran_order": False, "shape": shape}, b"\0" * 16)
    with pytest.raises(InputError, match="huge.npy"):
        cv.npy(path)
    assert_clean(device)


def test_npy_version_two_header_reads_right(device, tmp_path):
    """guard: a format 2.0 header (4-byte length) streams its values exactly."""
    path = tmp_path / "v2.npy"
    values = np.arange(1000, dtype=np.float32)
    _npy_header(path, {"descr": "<f4", "fortran_order": False, "shape": values.shape},
                values.tobytes(), version=2)
    kernel = device.compile(cv.portable(COPY_SRC), "copy_on")
    out = cv.stream(kernel, [str(path)], [np.float32], device=device,
                    block_bytes=1024).outputs[0]
    np.testing.assert_array_equal(out, values + 1)
    assert_clean(device)


def test_npy_of_zero_byte_rows_past_2_to_40_runs_nothing(device, tmp_path):
    """guard: shape (2**40, 0) holds no bytes; the stream runs no block (no plan of 2**40
    rows) and the output is (2**40, 0)."""
    path = tmp_path / "empty_rows.npy"
    _npy_header(path, {"descr": "<f4", "fortran_order": False, "shape": (2**40, 0)}, b"")
    kernel = device.compile(cv.portable(COPY_SRC), "copy_on")
    out = cv.stream(kernel, [str(path)], [np.float32], device=device).outputs[0]
    assert out.shape == (2**40, 0)
    assert_clean(device)


# -- file outputs: a full disk, links -------------------------------------------------------------
def _fail_block_one_writes(monkeypatch, start: int, stop: int) -> None:
    """``os.pwritev`` (the file sink's write) fails with ENOSPC for bytes in [start, stop):
    the disk fills while block 1 is written."""
    real = os.pwritev

    def pwritev(fd, buffers, offset, *flags):
        if start <= offset < stop:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buffers, offset, *flags)

    monkeypatch.setattr(os, "pwritev", pwritev)


def test_a_disk_full_mid_output_keeps_the_old_file_and_leaves_no_part(device, tmp_path,
                                                                     monkeypatch):
    """guard: ENOSPC at block 1 of a ``.npy`` output: the OSError itself, the file it would
    have replaced as it was, no ``.part`` or ``.new`` left, pools at zero."""
    target = tmp_path / "y.npy"
    np.save(target, np.full(3, 7.0, np.float32))
    kernel = device.compile(cv.portable(COPY_SRC), "copy_on")
    x = np.arange(100_000, dtype=np.float32)
    header = 128
    _fail_block_one_writes(monkeypatch, header + 10_000 * 4, header + 20_000 * 4)
    with pytest.raises(OSError) as caught:
        cv.stream(kernel, [x], [str(target)], device=device, block_bytes=40_000)
    assert caught.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["y.npy"]
    np.testing.assert_array_equal(np.load(target), np.full(3, 7.0, np.float32))
    assert_clean(device)


def test_a_failed_output_write_is_noted_with_the_rows_of_the_array(device, tmp_path,
                                                                   monkeypatch):
    """The note on a staging copy's error said ``while staging output 0 of block 1 (rows
    0:10000)``: block 1 covers rows 10000:20000; the rows printed were the piece's rows
    counted from the block's start, read as the array's (block 0's) rows."""
    kernel = device.compile(cv.portable(COPY_SRC), "copy_on")
    x = np.arange(100_000, dtype=np.float32)
    header = 128
    _fail_block_one_writes(monkeypatch, header + 10_000 * 4, header + 20_000 * 4)
    with pytest.raises(OSError) as caught:
        cv.stream(kernel, [x], [str(tmp_path / "y.npy")], device=device, block_bytes=40_000)
    monkeypatch.undo()
    notes = " ".join(getattr(caught.value, "__notes__", []))
    found = re.search(r"block 1 \(rows (\d+):(\d+)\)", notes)
    assert found is not None, notes
    lo, hi = int(found.group(1)), int(found.group(2))
    assert 10_000 <= lo < hi <= 20_000, notes
    assert_clean(device)


def test_an_output_through_a_symlink_to_its_own_input_is_right(device, tmp_path):
    """guard: ``inputs=["a.npy"], outputs=["link.npy"]`` with ``link.npy -> a.npy``: the
    input is read whole before the file is replaced, the link stays a link, and ``a.npy``
    holds the result."""
    source = tmp_path / "a.npy"
    values = np.arange(50_000, dtype=np.float32)
    np.save(source, values)
    link = tmp_path / "link.npy"
    link.symlink_to("a.npy")
    kernel = device.compile(cv.portable(COPY_SRC), "copy_on")
    cv.stream(kernel, [str(source)], [str(link)], device=device, block_bytes=16_000)
    assert link.is_symlink()
    np.testing.assert_array_equal(np.load(source), values + 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "link.npy"]
    assert_clean(device)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="others get os.access's refusal (an InputError) already")
def test_a_file_output_where_no_file_can_be_made_is_an_input_error_naming_it(device):
    """Root passes ``os.access`` for ``/sys`` (as for a read-only pseudo file system), where
    no file can be made: ``cv.stream(..., outputs=["/sys/y.npy"])`` raised
    ``PermissionError: [Errno 13] Permission denied: '/sys/.y.npy.ntnkar4s.new'``, a name the
    caller never gave, with no advice. ``trace=`` and the command's ``-o`` probe the folder
    (round eleven); ``cv.stream``'s file outputs do not."""
    try:
        fd, name = tempfile.mkstemp(dir="/sys")
    except OSError:
        pass
    else:
        os.close(fd)
        os.unlink(name)
        pytest.skip("sysfs here takes root's new files")
    kernel = device.compile(cv.portable(COPY_SRC), "copy_on")
    x = np.arange(10, dtype=np.float32)
    with pytest.raises(InputError, match="r15d-y.npy"):
        cv.stream(kernel, [x], ["/sys/r15d-y.npy"], device=device)
    assert_clean(device)


# -- Parquet / Arrow inputs ----------------------------------------------------------------------
def _table_files(tmp_path: Path, values: np.ndarray) -> dict[str, Path]:
    """``values`` as column ``x`` (and ``x + 0.5`` as ``z``) of a Parquet and an Arrow file,
    in row groups / record batches of 1000 rows."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    ipc = pytest.importorskip("pyarrow.ipc")
    table = pa.table({"x": values, "z": values + np.float32(0.5)})
    paths = {"parquet": tmp_path / "t.parquet", "arrow": tmp_path / "t.arrow"}
    pq.write_table(table, paths["parquet"], row_group_size=1000)
    with ipc.new_file(str(paths["arrow"]), table.schema) as writer:
        for batch in table.to_batches(max_chunksize=1000):
            writer.write_batch(batch)
    return paths


def _table_source(kind: str, path: Path, columns):
    return cv.parquet(path, columns) if kind == "parquet" else cv.arrow(path, columns)


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_a_list_of_one_column_streams_as_rows_of_one(device, tmp_path, kind):
    """``cv.parquet(path, columns=["x"])`` has shape ``(rows, 1)`` (a list makes one element
    per column), but ``tables._table_rows`` returns one column 1-D: the staging copy of
    block 0 raised NumPy's ``could not broadcast input array from shape (1000,) into shape
    (1000,1)``, after the stream had started. (The command passes one column as a str, so
    ``-i t.parquet:x`` works.)"""
    values = np.arange(3000, dtype=np.float32)
    path = _table_files(tmp_path, values)[kind]
    kernel = device.compile(cv.portable(COPY_SRC), "copy_on")
    source = _table_source(kind, path, ["x"])
    assert source.shape == (3000, 1)
    out = cv.stream(kernel, [source], [np.float32], device=device,
                    block_bytes=4000).outputs[0]
    np.testing.assert_array_equal(out, (values + 1).reshape(3000, 1))
    assert_clean(device)


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_a_list_of_two_columns_streams_as_rows_of_two(device, tmp_path, kind):
    """guard: two columns are rows of two elements, exactly."""
    values = np.arange(3000, dtype=np.float32)
    path = _table_files(tmp_path, values)[kind]
    kernel = device.compile(cv.portable(COPY_SRC), "copy_on")
    out = cv.stream(kernel, [_table_source(kind, path, ["x", "z"])], [np.float32],
                    device=device, block_bytes=8000).outputs[0]
    np.testing.assert_array_equal(out, np.stack([values, values + 0.5], axis=1) + 1)
    assert_clean(device)


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_table_files_with_flipped_bytes_never_raise_a_raw_error(device, tmp_path, kind):
    """guard: 25 copies of a table file with one to three bytes overwritten (seeded): each is
    an InputError or streams rows of the right shape (neither format checksums its values,
    so changed numbers cannot be seen); never a PyArrow, NumPy or OS error, never a crash,
    and the pools are at zero after each."""
    import random

    values = np.arange(3000, dtype=np.float32)
    good = _table_files(tmp_path, values)[kind].read_bytes()
    kernel = device.compile(cv.portable(COPY_SRC), "copy_on")
    rng = random.Random(15)
    bad = tmp_path / f"bad.{kind}"
    for _ in range(25):
        data = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        bad.write_bytes(bytes(data))
        try:
            out = cv.stream(kernel, [_table_source(kind, bad, "x")], [np.float32],
                            device=device, block_bytes=4000).outputs[0]
        except InputError:
            pass
        else:
            assert out.shape == values.shape
        assert_clean(device)
