"""Round eighteen, helper D: streams over several devices (the ``pair`` fixture: PoCL's two
OpenCL CPU devices, PoCL 3.1/LLVM 15 and the wheel's PoCL 3.0/LLVM 14, or two contexts of
one) when something goes wrong or is unusual: a kernel source whose ``#if`` on a compiler
macro makes one device's build differ from the other's (another type, or no build at all), a
callable raising (or raising KeyboardInterrupt) on one device's blocks only, a device closed
mid-stream, a pool limit on one device only, an output file filling its disk, fewer rows
than devices, ``first_row`` offsets near 2**63, arrays kept pinned for each device.

Found (strict xfails, each asserting the right behaviour):

- A reduction whose kernel writes ``int`` per-element values on one device and ``float`` on
  the other (``#if __clang_major__ >= 15 #define OUT int``: the driver reports each right)
  folds both devices' partials as the LAST device's type: a wrong total with no error
  (1200010000.0, 2200020000.0 or 71252020600832 for NumPy's 2500025000.0 / 2500000000,
  depending on the order of the devices and the schedule). ``multi._several`` keeps only
  the last ``validate.check_kernel`` result as ``element``; a chain ending in ``reduce``
  (``multi._chain_several``) uses ``bound[0].element`` alone, likewise wrong.
- A typedef chosen by a macro the compiler predefines and conveyor's preprocessor does not
  know (``#ifdef __clang__ typedef int word; #else typedef float word;``) is read as the
  ``#else`` type when both have the same size: the driver reports ``word*``, resolved
  through the preprocessed source (float), and the compiler's size check
  (``kernels/sizecheck.py``) compares sizes only (4 == 4). The kernel's ints come back as
  float32 denormals, and the right int32 output is refused. (On one device as on two;
  with ``__clang_major__`` each PoCL of the pair gets another type.)
- An output dtype that one device's build of the kernel refuses (the other takes it) says
  "kernel parameter 'y' is int* ... declare the parameter float*" without naming the device:
  the user's source declares ``float`` on the other device, so the advice reads as wrong.
- An OutOfMemoryError on the one device with a pool ``limit`` says "raise the pool's limit
  (device.memory_pool.limit ...)" without saying which device's.
- A resident table past the memory limit that is a device pool's ``limit`` (no
  ``memory_limit=`` given; here the second device's, as on that device alone) is told to "use
  a larger memory_limit", which then fails with OutOfMemoryError ("use a lower
  memory_limit"): ``plan.make_plan``'s resident check ignores ``by_pool``.

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    assert_clean,
    data,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    kernel,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import CompileError, InputError, OutOfMemoryError  # noqa: E402

SCHEDULES = ["dynamic", "static"]

# One source for the per-device kernels: OUT is int where the compiler is clang 15 or newer
# (Debian's PoCL 3.1), float elsewhere (the wheel's PoCL 3.0, LLVM 14); the driver reports
# each build's type (a macro, expanded before the driver sees it).
PER_DEVICE = """
#if defined(__clang_major__) && __clang_major__ >= 15
#define OUT int
#else
#define OUT float
#endif
__kernel void halve(__global const float *x, __global OUT *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (OUT)(x[i] * 0.5f);
}
__kernel void copy(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i];
}
"""

_built: dict[tuple[int, str, str], cv.Kernel] = {}


def _build(dev: cv.Device, source: str, name: str) -> cv.Kernel:
    key = (id(dev), source, name)
    if key not in _built or _built[key].device is not dev:
        _built[key] = dev.compile(source, name)
    return _built[key]


def _opencl(*devices: cv.Device) -> None:
    for dev in devices:
        if dev.backend != "opencl":
            pytest.skip("OpenCL C kernels with OpenCL compilers' macros")


def _types_differ(pair) -> tuple[cv.Kernel, cv.Kernel]:
    """``halve`` built on each device of the pair; skip unless the two builds' output types
    differ (two PoCLs of different LLVM versions, as here)."""
    _opencl(*pair)
    k0, k1 = (_build(dev, PER_DEVICE, "halve") for dev in pair)
    if k0.params[1].dtype == k1.params[1].dtype:
        pytest.skip("both devices' compilers choose one type (one compiler version)")
    return k0, k1


def _clean(pair) -> None:
    for dev in pair:
        assert_clean(dev)
    assert [t for t in threading.enumerate() if t.name.startswith("conveyor-device")] == []


def _still_right(pair) -> None:
    """A stream over both devices, and on each alone, is exact."""
    x = data((20_000,), np.float32, 21)
    for devices in (list(pair), [pair[0]], [pair[1]]):
        y = np.zeros_like(x)
        cv.stream(kernel(devices[0], "ident"), [x], [y], device=devices, block_bytes=8000)
        np.testing.assert_array_equal(y, x)
    _clean(pair)


# ---------------------------------------------------------------- one source, two compilers


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_sum_whose_kernel_writes_int_on_one_device_and_float_on_the_other_is_refused(
        pair, schedule):
    # Over [d0, d1] the total was 1200010000.0 or 1875012500.0, over [d1, d0]
    # 71252020600832: neither device's answer (2500000000 as ints, 2500025000.0 as floats).
    k0, _ = _types_differ(pair)
    x = np.arange(1, 100_001, dtype=np.float32)
    try:
        with pytest.raises(InputError, match="opencl"):
            cv.stream(k0, [x], reduce="sum", device=list(pair), block_bytes=40_000,
                      schedule=schedule)
    finally:
        _clean(pair)


def test_a_chain_ending_in_a_sum_of_other_types_on_each_device_is_refused(pair):
    # 4579449600768 over [d0, d1], 220005000.0 over [d1, d0], for 400010000.0 / 400000000.
    k0, _ = _types_differ(pair)
    copy = _build(pair[0], PER_DEVICE, "copy")
    x = np.arange(1, 40_001, dtype=np.float32)
    chain = cv.chain(cv.link(copy, reads="in0", writes="t"),
                     cv.link(k0, reads="t", writes="reduce"), temps={"t": np.float32})
    try:
        with pytest.raises(InputError, match="opencl"):
            cv.stream(chain, [x], reduce="sum", device=list(pair), block_bytes=4000)
    finally:
        _clean(pair)


def test_an_output_type_that_one_devices_build_refuses_names_that_device(pair):
    # "kernel parameter 'y' is int* (int32) but output 0 has dtype float32: ... or declare the
    # parameter float*": the source does declare float, on the other device.
    k0, k1 = _types_differ(pair)
    x = np.arange(1, 1001, dtype=np.float32)
    for wanted in (np.float32, np.int32):
        refusing = next(k.device for k in (k0, k1) if k.params[1].dtype != wanted)
        y = np.zeros(x.shape, wanted)
        with pytest.raises(InputError) as info:
            cv.stream(k0, [x], [y], device=list(pair))
        assert refusing.spec in str(info.value) + "".join(getattr(info.value, "__notes__", []))
        assert (y == 0).all()
    _clean(pair)


WORDS = """
#ifdef __clang__
typedef int word;
#else
typedef float word;
#endif
__kernel void towords(__global const float *x, __global word *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = (word)(x[i] * 2.0f);
}
"""

CLANG = """
__kernel void clang(__global const int *x, __global int *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
#ifdef __clang__
    if (i < n) y[i] = 1;
#else
    if (i < n) y[i] = 0;
#endif
}
"""


def test_a_typedef_chosen_by_a_predefined_macro_between_types_of_one_size(device):
    # The kernel writes ints (its compiler defines __clang__); conveyor reads word* as
    # float*: a float32 output gets the ints' bits (2.8e-45 for 2), an int32 one is refused.
    _opencl(device)
    probe = np.zeros(1, np.int32)
    cv.stream(_build(device, CLANG, "clang"), [probe], [probe], device=device)
    if probe[0] != 1:
        pytest.skip("this OpenCL compiler does not define __clang__")
    x = np.arange(8, dtype=np.float32)
    ints = np.zeros(8, np.int32)
    try:
        k = _build(device, WORDS, "towords")
    except InputError:
        return  # the build refused, naming what conveyor could not read: right too
    cv.stream(k, [x], [ints], device=device)  # was: "word* (float32) but output 0 ... int32"
    np.testing.assert_array_equal(ints, (x * 2).astype(np.int32))
    with pytest.raises(InputError):  # and float32 is the wrong type for it
        cv.stream(k, [x], [np.zeros(8, np.float32)], device=device)


def test_guard_a_kernel_that_builds_on_one_device_only_names_the_other(pair, tmp_path):
    """guard: a source whose ``#error`` fires on one device's compiler only (an ``#if`` on
    ``__clang_major__``) is a CompileError naming that device's spec, before any output file
    exists; both devices stream right after."""
    k0, k1 = _types_differ(pair)  # the compilers differ
    newer = k0.device if k0.params[1].dtype == np.int32 else k1.device
    older = k1.device if newer is k0.device else k0.device
    source = PER_DEVICE + "\n#if __clang_major__ >= 15\n#error needs LLVM 14\n#endif\n"
    built = older.compile(source, "copy")
    out = tmp_path / "y.npy"
    with pytest.raises(CompileError) as info:
        cv.stream(built, [np.ones(100, np.float32)], [str(out)], device=[older, newer])
    assert newer.spec in "".join(getattr(info.value, "__notes__", []))
    assert os.listdir(tmp_path) == []
    _still_right(pair)


# ---------------------------------------------------------------- failures on one device


def _on_second(exc_type):
    """A callable raising ``exc_type`` on the second device's blocks; the first device's
    first block waits (at most 30 s) for the second device to have one, so that the dynamic
    schedule gives it one whatever the load."""
    second_ran = threading.Event()

    def compute(x, y, *, queue, offset, n):
        if threading.current_thread().name == "conveyor-device-1":
            second_ran.set()
            raise exc_type("on the second device")
        second_ran.wait(30)
        return x * 2
    return compute


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("exc_type", [ZeroDivisionError, KeyboardInterrupt])
def test_guard_a_callable_raising_on_one_devices_blocks_only(pair, tmp_path, schedule,
                                                              exc_type):
    """guard: a callable raising (even KeyboardInterrupt, raised on that device's thread, not
    a signal) on the second device's blocks only: that exception, no output file nor
    temporary, every pool at zero, no thread left, both devices right after."""
    x = data((20_000,), np.float32, 3)
    out = tmp_path / "y.npy"
    with pytest.raises(exc_type, match="on the second device"):
        cv.stream(_on_second(exc_type), [x], [str(out)], device=list(pair), block_bytes=4000,
                  schedule=schedule, warmup=False)
    assert os.listdir(tmp_path) == []
    _still_right(pair)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_guard_a_device_closed_by_a_callable_mid_stream(pair, schedule):
    """guard: ``close()`` of the second device (a context of its own) from a block's callable
    while both stream: the stream is exact, nothing is left in use on either device, and it
    streams again (the pool holds again what the stream asks for after the close, as
    ``BlockPool.close`` says, so how much it holds after depends on timing: not checked)."""
    _opencl(*pair)
    from conveyor.backends import opencl

    spec = pair[1].spec.split(":")
    second = opencl.Device(pair[1].cl_device, int(spec[1]), int(spec[2]))
    devices = [pair[0], second]
    try:
        def compute(x, y, *, queue, offset, n):
            if offset == 8000:
                second.close()
            return x * 2

        x = data((40_000,), np.float32, 4)
        for _ in range(2):
            y = np.zeros_like(x)
            cv.stream(compute, [x], [y], device=devices, block_bytes=4000, schedule=schedule)
            np.testing.assert_array_equal(y, x * 2)
            _clean(devices)
    finally:
        second.close()


def test_out_of_memory_on_the_one_device_with_a_pool_limit_names_it(pair):
    # "out of device memory: asked for 64.0 KiB with 64.0 KiB in use (limit 64.0 KiB); ...
    # raise the pool's limit (device.memory_pool.limit / ...)": which device's?
    if pair[0].spec == pair[1].spec:
        pytest.skip("two contexts of one device share a spec")
    x = data((200_000,), np.float32, 5)
    y = np.zeros_like(x)
    pair[1].memory_pool.limit = 64 * 1024
    try:
        with pytest.raises(OutOfMemoryError) as info:
            cv.stream(kernel(pair[0], "ident"), [x], [y], device=list(pair), zero_copy=False,
                      memory_limit="1MiB")
    finally:
        pair[1].memory_pool.limit = None
    _clean(pair)
    text = str(info.value) + "".join(getattr(info.value, "__notes__", []))
    assert pair[1].spec in text


def test_guard_a_full_disk_under_an_output_written_by_two_devices(pair, tmp_path):
    """guard: a ``.npy`` output on a full tmpfs, written by two devices (the static schedule's
    second device writes the far rows first): an OSError naming the output, the old file kept,
    no temporary left, every pool at zero."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mnt)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        target = mnt / "old.npy"
        np.save(target, np.arange(3))
        x = data((200_000,), np.float32, 6)  # 800 KB out
        for schedule in SCHEDULES:
            with pytest.raises(OSError, match="old.npy"):
                cv.stream(kernel(pair[0], "ident"), [x], [str(target)], device=list(pair),
                          block_bytes=40_000, schedule=schedule)
            assert os.listdir(mnt) == ["old.npy"]
            np.testing.assert_array_equal(np.load(target), np.arange(3))
            _clean(pair)
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


# ---------------------------------------------------------------- edges


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("rows", [1, 2, 3])
def test_guard_fewer_blocks_than_devices(pair, schedule, rows):
    """guard: a map, a sum and a max over 1 to 3 rows (one block) on two devices: exact, one
    device ran the block and the other none, and the per-device figures add up."""
    x = data((rows,), np.float32, 7)
    y = np.zeros_like(x)
    report = cv.stream(kernel(pair[0], "ident"), [x], [y], device=list(pair),
                       schedule=schedule)
    np.testing.assert_array_equal(y, x)
    assert sorted(d.blocks for d in report.devices) == [0, report.blocks]
    assert sum(d.bytes_in for d in report.devices) == x.nbytes
    assert sum(d.bytes_out for d in report.devices) == y.nbytes
    for op, expected in (("sum", x.astype(np.float64).sum()), ("max", x.max())):
        got = cv.stream(kernel(pair[0], "ident"), [x], reduce=op, device=list(pair),
                        schedule=schedule).result
        assert got == expected
    _clean(pair)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("first_row", [0, 2**40, 2**63 - 1 - 40_000])
def test_guard_offsets_over_two_devices_cover_the_rows_once(pair, schedule, first_row):
    """guard: with ``first_row`` (up to the last one a signed 64-bit offset can hold), the
    offsets a callable sees over two devices cover ``[first_row, first_row + rows)`` once."""
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def compute(x, y, *, queue, offset, n):
        with lock:
            seen.append((offset, n))
        return x * 2

    x = data((40_000,), np.float32, 8)
    y = np.zeros_like(x)
    cv.stream(compute, [x], [y], device=list(pair), block_bytes=4000, schedule=schedule,
              first_row=first_row, warmup=False)
    np.testing.assert_array_equal(y, x * 2)
    seen.sort()
    assert seen[0][0] == first_row and seen[-1][0] + seen[-1][1] == first_row + 40_000
    assert all(a + n == b for (a, n), (b, _) in zip(seen, seen[1:], strict=False))
    _clean(pair)


def test_guard_arrays_kept_pinned_for_each_device_stream_over_both(pair):
    """guard: input a kept page-locked for the first device, b and the output for the second,
    streamed over both (both schedules), changed on the host between streams: exact."""
    a, b = data((50_000,), np.float32, 9), data((50_000,), np.float32, 10)
    c = np.zeros_like(a)
    cv.keep_pinned(a, device=pair[0])
    cv.keep_pinned(b, device=pair[1])
    cv.keep_pinned(c, device=pair[1])
    try:
        for schedule in SCHEDULES:
            for _ in range(2):
                c[:] = 0
                cv.stream(kernel(pair[0], "add"), [a, b], [c], device=list(pair),
                          block_bytes=20_000, schedule=schedule)
                index = (np.arange(a.size) % 7).astype(np.float32)
                np.testing.assert_array_equal(c, a + b + index)
                a += 1
                b -= 1
    finally:
        for array in (a, b, c):
            cv.release_pinned(array)
    _clean(pair)


LUT = """
__kernel void lut(__global const float *x, __global float *y, __global const float *t, ulong m,
                  ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + t[(offset + i) % m];
}
"""


def test_a_table_past_one_devices_pool_limit_is_told_to_raise_that_pool_limit(pair):
    # "the resident arrays in args= need 524288 device bytes, which leaves nothing of the memory
    # limit of 262144 for the blocks: use a larger memory_limit": with memory_limit="4MiB" the
    # stream fails with OutOfMemoryError ("use a lower memory_limit ..."). The limit is the
    # second device's pool's (plan.make_plan's by_pool), as on that device alone.
    _opencl(*pair)
    x = data((4000,), np.float32, 11)
    table = data((100_000,), np.float32, 12)  # 400 KB, in a 512 KiB block
    k = _build(pair[0], LUT, "lut")
    pair[1].memory_pool.limit = 256 * 1024
    try:
        with pytest.raises(InputError) as info:
            cv.stream(k, [x], [np.zeros_like(x)], device=list(pair), args=(table, table.size),
                      zero_copy=False)
        assert "memory_pool.limit" in str(info.value)
        assert "larger memory_limit" not in str(info.value)
    finally:
        pair[1].memory_pool.limit = None
    _clean(pair)
