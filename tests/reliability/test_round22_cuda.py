"""Round twenty-two, helper C: the CUDA backend read against the OpenCL one.

The CUDA backend (backends/cuda.py, cuda_events.py, cuda_images.py, cuda_array.py) cannot run
on this machine, so it was read line by line against opencl.py, opencl_kernels.py and base.py,
and every place where a user would see CUDA behave otherwise than OpenCL became a test here.
Each test asserts the RIGHT behaviour and runs over the ``device`` fixture: it passes on PoCL
(OpenCL), and is expected to FAIL on CUDA (the lead runs it on the GPU machine with
``CONVEYOR_TEST_BACKENDS=cuda``). No test here is marked xfail: its docstring says, after
"CUDA:", what is expected to go wrong there and where.

Every kernel is portable (``cv.portable``, or streamkit's), so each test builds on both
backends; none of them makes a CUDA kernel touch a bad pointer (a launch that does leaves the
context's error sticky and fails every later test of the run): a launch given a bad pointer
runs with ``n = 0``.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit (and, through it, streamkit)
from reliakit import (  # noqa: E402
    first_device_only,  # noqa: E402, F401 (autouse: first device only)
    kernel,
)

import conveyor as cv  # noqa: E402
from conveyor.errors import BackendError, InputError  # noqa: E402

CHILD_SECONDS = 20


# -- kernel arguments --------------------------------------------------------------------------
BY_VALUE = cv.portable("""
typedef struct { char c; float f; } S;
__kernel void r22c_sadd(__global const float *x, __global float *y, S s, ulong offset,
                        ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + s.c + 10 * s.f;
}
""")


def test_a_struct_passed_by_value_reaches_the_kernel(device):
    """A struct parameter passed by value takes a structured NumPy scalar of its C layout
    (round fourteen; README "args="). On OpenCL PyOpenCL passes the scalar's bytes.

    CUDA: BackendError at the first launch, "cuLaunchKernel(r22c_sadd): the argument is of
    unsupported type: <class 'numpy.void'>": the Kernel's converters (cuda.py:209-215, through
    kernels/argcast.py ``as_given``) hand the np.void to ``cc.launch`` (cuda.py:425), and
    cuda.core's ParamHolder takes no NumPy or ctypes struct ("TODO: support ctypes/numpy
    struct", _kernel_arg_handler.pyx). Round fourteen's test of this skipped CUDA ("an OpenCL C
    kernel"), so it never ran there."""
    k = device.compile(BY_VALUE, "r22c_sadd")
    x = np.arange(8, dtype=np.float32)
    y = np.zeros_like(x)
    record = np.array((1, 2.0), np.dtype([("c", "i1"), ("f", "f4")], align=True))[()]
    cv.stream(k, [x], [y], args=(record,), device=device)
    np.testing.assert_array_equal(y, x + 21)


def test_a_kernel_reads_and_writes_registered_host_memory_in_place(device):
    """On a device that shares the host's memory, a stream uses its arrays in place: the
    ZeroCopy path (pipeline/paths.py:169) registers each block (``register_host``) and hands
    the Registration to the kernel as its buffer, then ``sync_host``. OpenCL passes the
    registration's USE_HOST_PTR buffer (on a discrete GPU too).

    CUDA: BackendError "the argument is of unsupported type: ...Registration'>" at the launch:
    ``_pointer_arg`` (cuda.py:221-233) knows DeviceBuffer, PinnedBuffer, device arrays and
    ints, not a Registration, so it reaches ``cc.launch`` as it is (``device_array`` refuses it
    too: "not a CUDA buffer", cuda.py:185-193). CUDA's Device sets ``host_unified`` from
    ``props.integrated`` (cuda.py:506), so on an integrated GPU (Jetson, GB10) every default
    stream of C-contiguous arrays takes this path and fails at its first block."""
    k = kernel(device, "scale")
    x = np.arange(4096, dtype=np.float32)
    y = np.zeros_like(x)
    queue = device.create_queue()
    rx, ry = device.register_host(x), device.register_host(y)
    try:
        queue.launch(k, x.size, [rx, ry, 2.0, np.uint64(0), np.uint64(x.size)])
        queue.sync_host(ry).wait()
        np.testing.assert_array_equal(y, 2 * x)
    finally:
        queue.finish()
        ry.close()
        rx.close()
        queue.close()


def test_a_freed_pinned_buffer_is_refused_as_a_kernel_argument(device):
    """A pinned buffer closed before the launch that names it is a BackendError ("freed"), as
    a closed device buffer is on both backends (opencl.py ``_buffer_arg``).

    CUDA: no error: ``_pointer_arg`` (cuda.py:226-227) passes a PinnedBuffer's ``ptr``
    without checking it, and a closed one's is 0, so the kernel gets NULL (here with n = 0, so
    it reads nothing; a kernel that used it would fault and leave the context's error
    sticky). The DeviceBuffer branch just above it does check ``ptr``."""
    k = kernel(device, "scale")
    pinned = device.alloc_pinned(4096)
    pinned.close()
    out = device.alloc_device(4096)
    queue = device.create_queue()
    try:
        with pytest.raises(BackendError, match="freed"):
            queue.launch(k, 1, [pinned, out, 1.0, np.uint64(0), np.uint64(0)])
    finally:
        queue.finish()
        queue.close()
        out.close()


def test_a_registration_dropped_without_close_lets_go_of_the_memory(device):
    """A Registration let go of without ``close()`` (an exception between ``register_host``
    and the code that would close it, a caller's own use of ``device.register_host``) stops
    pinning the array when it is collected: on OpenCL PyOpenCL releases the USE_HOST_PTR
    buffer then. (``page_locked(a)`` is False on OpenCL in any case: it cannot tell.)

    CUDA: the pages stay registered for the life of the process: ``Registration``
    (cuda.py:157-179) has no finalizer (DeviceBuffer, PinnedBuffer and RegisteredPinned
    have one), so nothing calls cuMemHostUnregister; ``page_locked(a)`` stays True, a later
    registration of that memory (or of a new array NumPy puts there) is refused as
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (``page_locked=False``), and the memory freed
    by NumPy goes back to the allocator still locked."""
    a = np.ones(1 << 16, np.float32)
    registration = device.register_host(a)
    del registration
    gc.collect()
    assert not device.page_locked(a)


# -- kernels and their build options -------------------------------------------------------------
GONE = cv.portable("""
#if 0
__kernel void r22c_gone(__global const float *x, __global float *y, ulong offset, ulong n) { }
#endif
__kernel void r22c_kept(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i];
}
""")


def test_a_kernel_the_compiler_left_out_is_an_input_error_naming_those_it_built(device):
    """``compile(source, name)`` where ``name`` is only in a branch the compiler drops: the
    parameters are read from the raw text (kernels/build.py ``_read_params``), the build
    succeeds, and the load finds no such kernel. ``Device.compile`` documents "InputError when
    ``name`` is not a kernel in ``source``"; OpenCL says so and lists the kernels the compiler
    built (opencl_kernels.py ``load_kernel``).

    CUDA: CompileError "could not load kernel 'r22c_gone' from its binary ... (is it declared
    extern "C" __global__?): ..." (cuda.py:684-695): another error class for the same
    mistake, and no list of the kernels the module holds to say what is there."""
    with pytest.raises(InputError, match="r22c_kept"):
        device.compile(GONE, "r22c_gone")


OPTIONS = cv.portable("""
#include "r22c_bias.h"
#ifndef N
#define N 1
#endif
__kernel void r22c_opt(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) {
#ifdef FLAG
        y[i] = x[i] * N + BIAS;
#else
        y[i] = x[i] + BIAS;
#endif
    }
}
""")


@pytest.mark.parametrize("form", ["-I dir", "-DFLAG -DN=4", "-D N=4"])
def test_options_written_with_spaces_build_what_they_say(device, tmp_path, form):
    """Build options with a space inside one list item: ``"-I dir"``, ``"-DFLAG -DN=4"`` (two
    defines in one item), ``"-D N=4"``. OpenCL takes them as written (PyOpenCL joins the
    options with spaces and the driver splits them), and so does conveyor's own reading of
    them for every backend: its preprocessor (kernels/preprocess.py ``_defines``: "-DA=1 -DB"
    defines A and B) and the cache key's include folders (kernels/includes.py: "-I dir" in
    one item; README "also -I inside a combined option").

    CUDA: ``_program_options`` (cuda.py:245-273) splits nothing: "-I dir" becomes the
    include folder " dir" (a leading space: the header is not found, CompileError);
    "-DFLAG -DN=4" becomes one macro named "FLAG -DN" with value "4" (N is left undefined: a
    wrong answer, 1 * x + 3, or a CompileError, as NVRTC reads that name); "-D N=4" the
    macro " N". An InputError saying to give one option per item would also be right."""
    (tmp_path / "r22c_bias.h").write_text("#define BIAS 3.0f\n")
    folder = str(tmp_path)
    options = {
        "-I dir": [f"-I {folder}", "-DFLAG", "-DN=4"],
        "-DFLAG -DN=4": [f"-I{folder}", "-DFLAG -DN=4"],
        "-D N=4": [f"-I{folder}", "-DFLAG", "-D N=4"],
    }[form]
    try:
        k = device.compile(OPTIONS, "r22c_opt", options)
    except InputError as exc:  # a refusal that names the item is right too
        assert "option" in str(exc), exc
        return
    x = np.arange(64, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], device=device)
    np.testing.assert_array_equal(y, 4 * x + 3)


# -- fork ------------------------------------------------------------------------------------------
def _in_forked_child(child: Callable[[], str]) -> str:
    """What ``child()`` returns in a child made by ``os.fork()`` (which leaves without the
    parent's clean-up); the test fails if the child hangs."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write_end, child().encode()[:4000])
        finally:
            os._exit(0)
    os.close(write_end)
    deadline = time.monotonic() + CHILD_SECONDS
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.02)
    with os.fdopen(read_end, "rb") as reader:
        return reader.read().decode()


def _answer(ask: Callable[[], object]) -> str:
    try:
        return " ".join(f"no error: {ask()!r}".split())[:1000]
    except BackendError as exc:
        return " ".join(f"BackendError {exc}".split())[:1000]
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        return " ".join(f"{type(exc).__name__} {exc}".split())[:1000]


def test_a_forked_child_asking_the_driver_anything_gets_the_fork_error(device):
    """In a child forked after the parent used the device, asking whether an event is done,
    who the compiler is, or completing a user event is a BackendError that names the fork and
    the fix (spawn), as OpenCL's ``_check_not_forked`` makes it (test_opencl.py has this for
    OpenCL only; a pool's first question in a forked child is ``is_done``).

    CUDA: ``Event.is_done`` (cuda_events.py:127-132) asks cuEventQuery without
    ``device._current()`` (which raises the fork error) and reads any error as "done" (True);
    ``compiler_identity`` (cuda.py:652) asks NVRTC only and answers; ``UserEvent.set_complete``
    (cuda_events.py:172) writes the child's copy of the flag: three answers, no error."""
    k = kernel(device, "scale")  # the parent has built and used the device
    x = np.ones(16, np.float32)
    cv.stream(k, [x], [np.empty_like(x)], args=(2.0,), device=device)
    gate = device.user_event()

    def child() -> str:
        return "\n".join(_answer(ask) for ask in (gate.is_done, device.compiler_identity,
                                                  gate.set_complete))

    try:
        answers = _in_forked_child(child).split("\n")
    finally:
        gate.set_complete()
    assert len(answers) == 3, answers
    assert all(a.startswith("BackendError fork:") and "spawn" in a for a in answers), answers


def test_close_in_a_forked_child_raises_nothing_and_leaves_the_parent_working(device):
    """``device.close()`` in a forked child (a worker tidying up, a ``with`` block ending) is
    quiet: the child must not call the driver, and the parent owns the memory (OpenCL's
    buffers skip their release in a forked child; CUDA's own images do too,
    cuda_images.py:55-56).

    CUDA: BackendError "fork: ..." out of ``close()``: the pools' ``trim`` closes each held
    DeviceBuffer (cuda.py:92-98) and PinnedBuffer (cuda.py:113-119), whose ``close`` calls
    ``device._current()`` (cuda.py:533), which raises in a forked child; the first raise also
    stops the trim, leaving the other held blocks to finalizers that call cuMemFree and
    cuMemFreeHost in the child with no fork check (cuda.py:69-81)."""
    k = kernel(device, "scale")
    x = np.arange(20_000, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], args=(2.0,), device=device, block_bytes=16_000, zero_copy=False)
    assert device.memory_pool.stats().held_bytes > 0  # the child has blocks to close
    kept = cv.pinned.empty(1000, np.float32, device=device)

    def child() -> str:
        return _answer(device.close)

    answer = _in_forked_child(child)
    assert answer == "no error: None", answer
    del kept
    gc.collect()
    y[:] = 0
    cv.stream(k, [x], [y], args=(3.0,), device=device, block_bytes=16_000, zero_copy=False)
    np.testing.assert_array_equal(y, 3 * x)
