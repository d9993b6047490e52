"""Round eighteen, helper B: arrays that are not plain NumPy, where conveyor takes arrays.
PyOpenCL device arrays and raw ``pyopencl.Buffer``s as inputs, outputs, ``args=`` tables and
``cv.resident`` tables (same context, another context, another device of the ``pair``; views
at an offset, strided, 2-D column views, empty, other dtypes, struct records, pending work on
their queue, SVM-backed); host arrays over foreign memory (``np.frombuffer`` over bytes,
bytearray, mmap, ``array.array``; ctypes; ``__array_interface__`` / ``__array__`` objects;
``np.matrix``, ``np.ma``, ``np.recarray``, a subclass with ``__array_finalize__``); and what a
callable returns (a NumPy array, another context's array, a strided or SVM-backed one).
PyTorch and pandas are not installed here: not tried.

Found (strict xfails, each asserting the right behaviour):

- A device array in ``args=`` whose producing work is still pending on its queue (PyOpenCL
  records it in ``array.events``) is read by the stream's kernels without waiting for it:
  the kernel reads the table's old bytes, silently (``t + 1`` computed with the old ``t``).
  PyOpenCL's own operations wait for ``events``; so do a callable's returned arrays here.
- A device array of records for a kernel's struct pointer is passed unchecked: NumPy's
  packed layout for a padded C struct, or a big-endian field, is read from the wrong bytes
  (wrong answers), where the same table as a NumPy array is an InputError.
- A PyOpenCL array as an input, a ``cv.resident`` table or a ``cv.iterate`` chunk is turned
  into a NumPy object array element by element (``np.asarray`` walks ``__getitem__``, ~20 us
  per element: 2 s for 100,000 elements, hours for a GiB) before it is refused, and the
  refusal of ``cv.resident``/``cv.iterate`` says only "holds Python objects".
- A callable that returns an SVM-backed PyOpenCL array is told "a Array is not an OpenCL
  device array: return a pyopencl.array.Array" (it is one); the same array in ``args=`` works.
- A raw ``pyopencl.Buffer`` as an input is told "has dtype object, which holds Python
  objects: convert it to a numeric dtype first"; an empty PyOpenCL array in ``args=`` is told
  to "pass an array"; a ``memoryview``/``array.array`` in ``args=`` is told to "pass an
  array", though ``inputs=`` and ``cv.resident`` take them.

Guards (already right) say "guard:" in their docstrings.
"""

from __future__ import annotations

import array
import ctypes
import mmap
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    compiled,
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    rec_kernels,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402

cl = pytest.importorskip("pyopencl")
cla = pytest.importorskip("pyopencl.array")

LUT = """__kernel void lut(__global const float *x, __global float *y, __global const float *t,
                      ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + t[i % 4];
}
"""

TWICE = """__kernel void twice(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i];
}
"""

TABLE = np.array([1.0, 2.0, 3.0, 4.0], np.float32)


def _opencl(device: cv.Device) -> None:
    if device.backend != "opencl":
        pytest.skip("PyOpenCL arrays: OpenCL only")


def _lut_reference(x: np.ndarray, table: np.ndarray = TABLE) -> np.ndarray:
    return x + np.resize(table, x.shape)


def _queue(device: cv.Device):
    return cl.CommandQueue(device.context)


# -- device arrays in args= ------------------------------------------------------------------
def test_a_device_table_with_pending_work_is_read_after_that_work(device):
    """The table's values are still being copied in on the caller's queue (the copy waits on
    a user event, which a thread completes once the stream returned, or after 2 s): PyOpenCL
    records the copy in ``table.events``, and the stream's launches must wait for it, as
    PyOpenCL's own operations and a callable's returned arrays do."""
    _opencl(device)
    kernel = compiled(device, LUT, "lut")  # built before the gate's clock starts
    queue = _queue(device)
    x = np.arange(1000, dtype=np.float32)
    y = np.zeros_like(x)
    table = cla.zeros(queue, 4, np.float32)
    queue.finish()
    gate = cl.UserEvent(device.context)
    host = TABLE.copy()
    table.add_event(cl.enqueue_copy(queue, table.data, host, wait_for=[gate],
                                    is_blocking=False))
    returned = threading.Event()

    def open_gate() -> None:
        returned.wait(2)
        gate.set_status(cl.command_execution_status.COMPLETE)

    opener = threading.Thread(target=open_gate)
    opener.start()
    try:
        cv.stream(kernel, [x], [y], args=(table,), device=device, block_bytes=400)
    finally:
        returned.set()
        opener.join()
        queue.finish()
    np.testing.assert_array_equal(y, _lut_reference(x))  # today: y == x (the zeros)


@pytest.mark.parametrize("layout", ["packed", "big-endian"])
def test_a_device_table_of_records_is_checked_as_a_numpy_one_is(device, layout):
    """``struct { char a; float b; }`` is 8 bytes in C; NumPy's packed records are 5 (``b`` at
    byte 1), and a ``>f4`` field comes byte-swapped. As a NumPy table both are InputErrors
    naming the parameter; as a PyOpenCL array the kernel read them (``a`` = 1 read as 1,
    -127, 2, 3: wrong values, no error)."""
    _opencl(device)
    kernel = compiled(device, rec_kernels("char"), "rec_lut")
    fields = [("a", "i1"), ("b", "f4" if layout == "packed" else ">f4")]
    dtype = np.dtype(fields, align=layout != "packed")
    table = np.zeros(4, dtype)
    table["a"], table["b"] = [1, 2, 3, 4], [0.5, 0.25, 0.125, 2.0]
    x = np.arange(100, dtype=np.float32)
    y = np.zeros_like(x)
    with pytest.raises(InputError, match="args\\[0\\]"):  # the NumPy table: refused
        cv.stream(kernel, [x], [y], args=(table,), device=device)
    queue = _queue(device)
    on_device = cla.to_device(queue, table)
    try:
        cv.stream(kernel, [x], [y], args=(on_device,), device=device)
    except InputError as exc:
        assert "args[0]" in str(exc)
    else:
        expected = x + np.resize(table["a"].astype(np.float32) + table["b"], 100)
        np.testing.assert_array_equal(y, expected)


def _counting_getitem(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the element reads of every PyOpenCL array (``np.asarray`` of one walks it as a
    sequence, one ``__getitem__`` per element)."""
    reads = [0]
    real = cla.Array.__getitem__

    def getitem(self, index):
        reads[0] += 1
        return real(self, index)

    monkeypatch.setattr(cla.Array, "__getitem__", getitem)
    return reads


@pytest.mark.parametrize("where", ["input", "resident", "iterate"])
def test_a_device_array_where_host_arrays_go_is_refused_without_walking_it(
        device, where, monkeypatch):
    """A device array of 2,000 floats (of a GiB, in real use) as an input, a cv.resident table
    or a cv.iterate chunk: an InputError that names PyOpenCL, before any of its elements is
    read one by one through ``__getitem__`` (each read makes a new Array: 2 s per 100,000)."""
    _opencl(device)
    queue = _queue(device)
    x = np.arange(2000, dtype=np.float32)
    on_device = cla.to_device(queue, x)
    reads = _counting_getitem(monkeypatch)
    kernel = compiled(device, TWICE, "twice")
    with pytest.raises(InputError) as caught:
        if where == "input":
            cv.stream(kernel, [on_device], [np.float32], device=device)
        elif where == "resident":
            cv.resident(on_device)
        else:
            cv.stream(kernel, [cv.iterate([on_device], 2000)], [np.float32], device=device)
    message = str(caught.value)
    assert reads[0] == 0, f"{reads[0]} element reads before: {message}"
    assert "pyopencl" in message.lower() or "device array" in message, message


def test_device_tables_that_the_kernel_would_misread_are_refused(device, pair):
    """guard: a PyOpenCL table that is a view at an offset, strided, a 2-D column view, of
    float64 for a float pointer, or of another device's context (the pair's second device,
    or a second context on the same device) is an InputError naming args[0]; a contiguous
    one of the device's context (1-D or 2-D) is exact, and so is one from a PyOpenCL
    memory pool or an SVM allocator."""
    _opencl(device)
    queue = _queue(device)
    kernel = compiled(device, LUT, "lut")
    x = np.arange(1000, dtype=np.float32)
    long = cla.to_device(queue, np.resize(TABLE, 20))
    square = cla.to_device(queue, np.stack([TABLE, TABLE]))
    others = [cl.CommandQueue(cl.Context([device.cl_device]))]
    if pair[1].backend == "opencl" and pair[1].context is not device.context:
        others.append(_queue(pair[1]))
    refused = [long[10:14], cla.to_device(queue, np.repeat(TABLE, 2))[::2], square[:, ::2],
               cla.to_device(queue, TABLE.astype(np.float64))]
    refused += [cla.to_device(other, TABLE) for other in others]
    for table in refused:
        y = np.zeros_like(x)
        with pytest.raises(InputError, match="args\\[0\\]"):
            cv.stream(kernel, [x], [y], args=(table,), device=device, block_bytes=400)
        assert not y.any()
    from pyopencl.tools import ImmediateAllocator, MemoryPool

    pool = MemoryPool(ImmediateAllocator(queue))
    right = [cla.to_device(queue, TABLE), square, long[:4],
             cla.to_device(queue, TABLE, allocator=pool)]
    for table in right:
        y = np.zeros_like(x)
        cv.stream(kernel, [x], [y], args=(table,), device=device, block_bytes=400)
        np.testing.assert_array_equal(y, _lut_reference(x))


def test_a_device_table_over_two_devices_is_refused(pair):
    """guard: a device array in args= lives on one device: a stream over both devices of the
    pair refuses it before any work (an InputError naming it), the output untouched."""
    if any(dev.backend != "opencl" for dev in pair):
        pytest.skip("PyOpenCL arrays: OpenCL only")
    x = np.arange(4000, dtype=np.float32)
    y = np.zeros_like(x)
    table = cla.to_device(_queue(pair[0]), TABLE)
    with pytest.raises(InputError, match="args\\[0\\]|device array"):
        cv.stream(compiled(pair[0], LUT, "lut"), [x], [y], args=(table,), device=pair,
                  block_bytes=4000)
    assert not y.any()


def test_an_empty_device_table_is_told_it_has_no_elements(device):
    """An empty PyOpenCL array (``base_data`` None) in args=: the message said it is not an
    array ("receives a Array of shape (0,) ...: pass an array"); a NumPy one is told it
    "has no elements"."""
    _opencl(device)
    x = np.arange(100, dtype=np.float32)
    with pytest.raises(InputError, match="no elements"):
        cv.stream(compiled(device, LUT, "lut"), [x], [np.float32],
                  args=(cla.empty(_queue(device), 0, np.float32),), device=device)


@pytest.mark.parametrize("kind", ["memoryview", "array.array"])
def test_a_buffer_table_in_args_works_or_says_np_asarray(device, kind):
    """``memoryview(t)`` or ``array.array('f', ...)`` in args=: ``inputs=`` and
    ``cv.resident(...)`` take both as arrays (exact); args= said "receives memoryview <...>:
    pass an array (uploaded once...)". Right: the same (exact), or an InputError that says
    ``np.asarray``."""
    _opencl(device)
    table = memoryview(TABLE.copy()) if kind == "memoryview" else array.array("f", TABLE)
    x = np.arange(1000, dtype=np.float32)
    y = np.zeros_like(x)
    try:
        cv.stream(compiled(device, LUT, "lut"), [x], [y], args=(table,), device=device)
    except InputError as exc:
        assert "np.asarray" in str(exc), str(exc)
    else:
        np.testing.assert_array_equal(y, _lut_reference(x))


# -- device arrays and raw buffers as inputs and outputs --------------------------------------
def test_a_raw_buffer_input_is_named_as_a_device_buffer(device):
    """A ``pyopencl.Buffer`` as input 0: refused (right), but as "dtype object, which holds
    Python objects: convert it to a numeric dtype first", which names neither the buffer nor
    what to pass (a host array; PyOpenCL arrays are told so)."""
    _opencl(device)
    x = np.arange(100, dtype=np.float32)
    buffer = cl.Buffer(device.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                       hostbuf=x)
    with pytest.raises(InputError) as caught:
        cv.stream(compiled(device, TWICE, "twice"), [buffer], [np.float32], device=device)
    assert "Buffer" in str(caught.value) and "NumPy" in str(caught.value), str(caught.value)


def test_device_arrays_and_buffers_as_outputs_are_refused(device):
    """guard: a PyOpenCL array or a raw Buffer as an output (alone or in a list) is an
    InputError naming output 0; taken as a dtype it would be a new array, never written."""
    _opencl(device)
    kernel = compiled(device, TWICE, "twice")
    queue = _queue(device)
    x = np.arange(100, dtype=np.float32)
    for out in (cla.zeros(queue, 100, np.float32),
                cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 400)):
        for outputs in (out, [out]):
            with pytest.raises(InputError, match="output 0"):
                cv.stream(kernel, [x], outputs, device=device)


# -- host arrays over foreign memory ---------------------------------------------------------
class _Interface:
    """An object exposing only ``__array_interface__`` (its memory is ``owner``'s)."""

    def __init__(self, owner: np.ndarray) -> None:
        self.owner = owner
        self.__array_interface__ = owner.__array_interface__


class _ArrayMethod:
    """An object exposing only ``__array__``."""

    def __init__(self, owner: np.ndarray) -> None:
        self.owner = owner

    def __array__(self, dtype=None, copy=None):
        return self.owner


class _Tagged(np.ndarray):
    def __array_finalize__(self, obj):
        self.tag = getattr(obj, "tag", "new")


def _foreign_hosts(x: np.ndarray) -> dict[str, tuple[object, object]]:
    """name -> (input over foreign memory holding x's values, output over foreign memory)."""
    raw = x.tobytes()
    shifted = bytearray(len(raw) + 1)
    shifted[1:] = raw
    region = mmap.mmap(-1, len(raw))
    region[:] = raw
    out_region = mmap.mmap(-1, len(raw))
    floats = (ctypes.c_float * len(x))(*x.tolist())
    masked = np.ma.array(x.copy(), mask=np.zeros(len(x), bool))
    return {
        "frombuffer bytes": (np.frombuffer(raw, np.float32), np.frombuffer(
            bytearray(len(raw)), np.float32)),
        "frombuffer unaligned": (np.frombuffer(shifted, np.float32, offset=1), np.frombuffer(
            bytearray(len(raw) + 1), np.float32, offset=1)),
        "mmap": (np.frombuffer(region, np.float32), np.frombuffer(out_region, np.float32)),
        "array.array": (array.array("f", x.tolist()),
                        np.asarray(array.array("f", bytes(len(raw))))),
        "ctypes": (floats, np.ctypeslib.as_array((ctypes.c_float * len(x))())),
        "memoryview": (memoryview(x.copy()), np.zeros_like(x)),
        "__array_interface__": (_Interface(x.copy()), np.zeros_like(x)),
        "__array__": (_ArrayMethod(x.copy()), np.zeros_like(x)),
        "masked, nothing masked": (masked, np.ma.zeros(len(x), np.float32)),
        "recarray": (np.rec.array(x.copy()), np.rec.array(np.zeros_like(x))),
        "subclass": (x.copy().view(_Tagged), np.zeros_like(x).view(_Tagged)),
    }


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
@pytest.mark.parametrize("zero_copy", [None, False])
def test_host_arrays_over_foreign_memory_stream_exactly(device, zero_copy):
    """guard: inputs and outputs over memory NumPy does not own (bytes, an unaligned
    bytearray view, anonymous mmap, array.array, ctypes, objects exposing only
    ``__array_interface__`` or ``__array__``, a masked array with nothing masked, a recarray,
    a subclass with ``__array_finalize__``) and ``np.matrix`` rows, zero-copy or staged:
    exactly NumPy's ``2 * x``, written into the caller's memory."""
    _opencl(device)
    kernel = compiled(device, TWICE, "twice")
    x = np.arange(1000, dtype=np.float32) - 300.5
    for name, (source, out) in _foreign_hosts(x).items():
        cv.stream(kernel, [source], [out], device=device, block_bytes=400, zero_copy=zero_copy)
        np.testing.assert_array_equal(np.asarray(out), 2 * x, err_msg=name)
    matrix_in = np.matrix(x.reshape(10, 100))
    matrix_out = np.matrix(np.zeros((10, 100), np.float32))
    cv.stream(kernel, [matrix_in], [matrix_out], device=device, block_bytes=400,
              zero_copy=zero_copy)
    np.testing.assert_array_equal(np.asarray(matrix_out), 2 * x.reshape(10, 100))


# -- what callables return -------------------------------------------------------------------
def test_an_svm_array_returned_by_a_callable_is_copied_or_named(device):
    """A callable returns ``cla.to_device(queue, ..., allocator=SVMAllocator(...))``: a
    ``pyopencl.array.Array`` whose ``base_data`` is an ``SVMAllocation``. The same array in
    args= is passed (exact); returned, the message said it is not a pyopencl.array.Array.
    Right: copied (exact), or an InputError that says SVM arrays are not taken."""
    _opencl(device)
    if not device.cl_device.svm_capabilities:
        pytest.skip("no SVM on this device")
    from pyopencl.tools import SVMAllocator

    def svm_twice(x, y, *, queue, offset, n):
        return cla.to_device(queue, 2 * x.get(), allocator=SVMAllocator(
            queue.context, alignment=0, queue=queue))

    x = np.arange(1000, dtype=np.float32)
    y = np.zeros_like(x)
    try:
        cv.stream(svm_twice, [x], [y], device=device, block_bytes=400)
    except InputError as exc:
        assert "svm" in str(exc).lower(), str(exc)
    else:
        np.testing.assert_array_equal(y, 2 * x)


def test_callable_returns_that_are_not_its_device_arrays_are_refused(device, pair):
    """guard: a callable returning a NumPy array, a raw Buffer, a strided device array, one
    of float64, or one of another context (the pair's other device) is an InputError naming
    output 0, the output untouched; an array at an offset in a larger one is exact."""
    _opencl(device)
    other = next((d for d in pair if d.backend == "opencl" and d.context is not device.context),
                 None)
    other_queue = _queue(other) if other is not None else None
    x = np.arange(1000, dtype=np.float32)

    def numpy_array(x, y, *, queue, offset, n):
        return 2 * x.get()

    def raw_buffer(x, y, *, queue, offset, n):
        return (2 * x).data

    def strided(x, y, *, queue, offset, n):
        return cla.to_device(queue, np.repeat(2 * x.get(), 2))[::2]

    def wide(x, y, *, queue, offset, n):
        return (2 * x).astype(np.float64)

    def foreign(x, y, *, queue, offset, n):
        return cla.to_device(other_queue, 2 * x.get())

    def shifted(x, y, *, queue, offset, n):
        z = cla.zeros(queue, x.size + 7, x.dtype)
        z[7:] = 2 * x
        return z[7:]

    for function in (numpy_array, raw_buffer, strided, wide) + ((foreign,) if other else ()):
        y = np.zeros_like(x)
        with pytest.raises(InputError, match="output 0"):
            cv.stream(function, [x], [y], device=device, block_bytes=400)
        assert not y.any(), function.__name__
    y = np.zeros_like(x)
    cv.stream(shifted, [x], [y], device=device, block_bytes=400)
    np.testing.assert_array_equal(y, 2 * x)
