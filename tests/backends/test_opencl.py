"""The OpenCL backend on real PoCL: device facts, errors, queue operations, kernel launch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import conveyor as cv
from conveyor.kernels.build import compile_kernel

AFFINE = """
__kernel void affine(__global float *y, float a, int b, ulong n) {
    size_t i = get_global_id(0);
    if (i < n) y[i] = a * (float)i + (float)b;
}
"""
KIB = 1024


@pytest.fixture
def ocl(device):
    if device.backend != "opencl":
        pytest.skip("OpenCL backend only")
    return device


@pytest.fixture
def queue(ocl):
    with ocl.create_queue() as made:
        yield made


@pytest.fixture
def buffer(ocl):
    made = ocl.alloc_device(64 * KIB)
    yield made
    made.close()


@pytest.fixture
def affine(ocl):
    return compile_kernel(ocl, AFFINE, "affine", (), cache=None)


def test_device_reports_its_facts(ocl):
    assert ocl.backend == "opencl"
    assert ocl.kind in ("gpu", "cpu", "other")
    assert 0 < ocl.max_alloc_bytes <= ocl.global_mem_bytes
    assert ocl.compute_units >= 1
    assert ocl.info.driver_version and ocl.info.platform


# -- errors --------------------------------------------------------------------------------
def test_alloc_larger_than_max_alloc_raises_input_error(ocl):
    with pytest.raises(cv.InputError, match="largest allocation"):
        ocl.alloc_device(ocl.max_alloc_bytes + 1)


def test_copy_out_into_a_too_large_array_raises_backend_error(queue, buffer):
    with pytest.raises(cv.BackendError) as caught:
        queue.copy_out(np.empty(128 * KIB, np.uint8), buffer).wait()
    error = caught.value
    assert (error.call, error.code) == ("clEnqueueReadBuffer", "INVALID_VALUE")
    assert error.message  # never blank


def test_copy_in_from_a_too_large_array_raises_backend_error(queue, buffer):
    with pytest.raises(cv.BackendError) as caught:
        queue.copy_in(buffer, np.empty(128 * KIB, np.uint8)).wait()
    assert (caught.value.call, caught.value.code) == ("clEnqueueWriteBuffer", "INVALID_VALUE")


def test_copy_into_a_freed_buffer_raises_backend_error(ocl, queue):
    freed = ocl.alloc_device(KIB)
    freed.close()
    with pytest.raises(cv.BackendError) as caught:
        queue.copy_in(freed, np.zeros(KIB, np.uint8))
    assert caught.value.code == "INVALID_MEM_OBJECT"


def test_launch_with_a_freed_buffer_raises_backend_error(ocl, queue, affine):
    freed = ocl.alloc_device(KIB)
    freed.close()
    with pytest.raises(cv.BackendError) as caught:
        queue.launch(affine, 16, [freed, 1.0, 0, 16])
    assert (caught.value.call, caught.value.code) == ("clSetKernelArg", "INVALID_MEM_OBJECT")


def test_launch_with_the_wrong_argument_count_raises_input_error(queue, buffer, affine):
    with pytest.raises(cv.InputError, match="takes 4 arguments"):
        queue.launch(affine, 16, [buffer, 1.0])


# -- queue operations ------------------------------------------------------------------------
def test_fill_sets_the_bytes(queue, buffer):
    queue.fill(buffer, 0xAB, 64 * KIB).wait()
    queue.fill(buffer, 0x01, KIB, offset=KIB).wait()
    out = np.empty(64 * KIB, np.uint8)
    queue.copy_out(out, buffer).wait()
    assert (out[KIB : 2 * KIB] == 0x01).all()
    assert (out[:KIB] == 0xAB).all() and (out[2 * KIB :] == 0xAB).all()


def test_marker_completes_after_the_commands_before_it(ocl, queue, buffer):
    gate = ocl.user_event()
    filled = queue.fill(buffer, 0, KIB, wait_for=[gate])
    marker = queue.marker()
    queue.flush()
    assert not marker.is_done()
    gate.set_complete()
    marker.wait()
    assert filled.is_done()


def test_finish_waits_for_every_command(queue, buffer):
    events = [queue.fill(buffer, value, 64 * KIB) for value in range(4)]
    queue.flush()
    queue.finish()
    assert all(e.is_done() for e in events)


def test_profile_ns_gives_start_before_end(queue, buffer):
    filled = queue.fill(buffer, 7, 64 * KIB)
    filled.wait()
    start, end = filled.profile_ns()
    assert 0 < start <= end


def test_user_event_completes_by_hand(ocl):
    gate = ocl.user_event()
    assert not gate.is_done()
    gate.set_complete()
    assert gate.is_done()
    gate.wait()


# -- kernels ---------------------------------------------------------------------------------
def test_kernel_params_come_from_the_source(affine):
    dtypes = [p.dtype for p in affine.params]
    assert dtypes == [np.dtype(np.float32), np.dtype(np.float32), np.dtype(np.int32),
                      np.dtype(np.uint64)]
    assert affine.params[0].is_pointer


@pytest.mark.parametrize("a", [2.5, np.float64(2.5), np.float32(2.5)], ids=type)
def test_launch_casts_scalar_args_to_the_declared_types(queue, buffer, affine, a):
    n = 1000
    queue.launch(affine, n, [buffer, a, 3, n]).wait()
    out = np.empty(n, np.float32)
    queue.copy_out(out, buffer).wait()
    np.testing.assert_array_equal(out, 2.5 * np.arange(n, dtype=np.float32) + 3)


def test_launch_rounds_the_global_size_up(queue, buffer, affine):
    queue.fill(buffer, 0, 64 * KIB).wait()
    queue.launch(affine, 3, [buffer, 1.0, 1, 3], local_size=2).wait()
    out = np.empty(5, np.float32)
    queue.copy_out(out, buffer).wait()
    np.testing.assert_array_equal(out, [1, 2, 3, 0, 0])  # the guard stops item 3


def test_build_error_raises_compile_error_with_the_log(ocl):
    with pytest.raises(cv.CompileError) as caught:
        ocl.build_binary("__kernel void broken(__global float *x) { x[0] = y; }", ())
    assert "y" in caught.value.log


def test_loading_a_missing_kernel_names_the_programs_kernels(ocl):
    # An InputError listing the kernels the compiler built (round eleven: a name made by a
    # macro was listed by its macro, and a missing one was a CompileError naming a code).
    binary = ocl.build_binary(AFFINE, ())
    with pytest.raises(cv.InputError, match="no kernel named 'nope'.*kernels found: affine"):
        ocl.load_kernel(binary, "nope", (), ())


def test_register_host_wraps_and_page_locks_only_on_nvidia(ocl):
    array = np.zeros(1000, np.float32)
    with ocl.register_host(array) as registration:
        # NVIDIA's driver page-locks a USE_HOST_PTR buffer's memory (backends/opencl.py)
        assert registration.page_locked is ocl.locks_host_ptr
        assert ocl.locks_host_ptr is ("NVIDIA" in ocl.info.platform and not ocl.info.host_unified)
        assert registration.array is array


# -- fork (issue 13, item 3) ----------------------------------------------------------------
# PoCL's threads do not survive fork(): a child forked after the parent made a context used to
# hang for ever in its first stream. Every child here runs under a timeout and is killed on
# expiry, so a regression fails instead of hanging the suite.
CHILD_SECONDS = 120
DOUBLE = """
__kernel void double_it(__global const float *a, __global float *c, ulong offset, ulong n) {
    size_t i = get_global_id(0);
    if (i < n) c[i] = 2.0f * a[i];
}
"""


def _stream_on(spec: str) -> float:
    """One short stream on the device ``spec``; its output's sum (runs in forked children)."""
    dev = cv.device(spec)
    a = np.arange(1000, dtype=np.float32)
    c = np.zeros_like(a)
    cv.stream(dev.compile(DOUBLE, "double_it"), [a], [c], device=dev)
    return float(c.sum())


def _stream_or_error(spec: str) -> str:
    try:
        return f"ok {_stream_on(spec)}"
    except cv.BackendError as exc:
        return f"BackendError {exc}"


def test_a_pool_forked_after_a_stream_raises_backend_error_naming_spawn(ocl):
    import multiprocessing

    assert _stream_on(ocl.spec) == 999 * 1000
    with multiprocessing.get_context("fork").Pool(1) as workers:
        pending = workers.apply_async(_stream_or_error, (ocl.spec,))
        try:
            answer = pending.get(timeout=CHILD_SECONDS)
        except multiprocessing.TimeoutError:
            workers.terminate()
            pytest.fail("the forked worker's stream hung")
    assert answer.startswith("BackendError fork:"), answer
    assert "get_context('spawn')" in answer
    assert _stream_on(ocl.spec) == 999 * 1000  # the parent goes on working


def _in_forked_child(child: Callable[[], str]) -> str:
    """What ``child()`` returns when run in a child made by ``os.fork()`` (which leaves
    without running the parent's clean-up); the test fails if the child hangs."""
    import os
    import time

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
        time.sleep(0.05)
    with os.fdopen(read_end, "rb") as reader:
        return reader.read().decode()


def test_os_fork_after_a_stream_raises_in_the_child_and_never_hangs(ocl):
    _stream_on(ocl.spec)
    answer = _in_forked_child(lambda: _stream_or_error(ocl.spec))
    assert answer.startswith("BackendError fork:"), answer


def test_a_forked_child_asking_the_driver_anything_gets_the_fork_error(ocl):
    # On a GPU the first driver call of a forked child's stream is the pinned pool asking
    # whether the parent's pending copies are done; compile() asks the driver who the compiler
    # is. NVIDIA's driver answered both with errors of its own (INVALID_DEVICE), not "fork".
    gate = ocl.user_event()

    def child() -> str:
        answers = []
        for ask in (gate.is_done, ocl.compiler_identity):
            try:
                answers.append(f"no error: {ask()}")
            except cv.BackendError as exc:
                answers.append(f"BackendError {exc}")
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                answers.append(f"{type(exc).__name__} {exc}")
        return "\n".join(answers)

    try:
        answers = _in_forked_child(child).split("\n")
    finally:
        gate.set_complete()
    assert len(answers) == 2 and all(a.startswith("BackendError fork:") for a in answers), answers


FORK_FIRST = f"""
import os, sys
pid = os.fork()  # before any OpenCL context exists, in parent or child
import numpy as np, conveyor as cv
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_opencl import _stream_on
print(os.getpid(), _stream_on(sys.argv[1]), flush=True)
if pid:
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.slow
def test_a_child_forked_before_any_context_works(ocl):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FORK_FIRST, ocl.spec], capture_output=True,
                          text=True, timeout=CHILD_SECONDS)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert len(lines) == 4 and lines[1] == lines[3] == str(999.0 * 1000), done.stdout
