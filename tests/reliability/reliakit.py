"""Helpers for the reliability tests: streamkit (tests/pipeline) on the path, the injected
fault, and the checks made after every failure (pools at zero, nothing in flight, no staging
thread, the next stream right)."""

from __future__ import annotations

import gc
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

PIPELINE = Path(__file__).resolve().parents[1] / "pipeline"
if str(PIPELINE) not in sys.path:
    sys.path.insert(0, str(PIPELINE))

from streamkit import (  # noqa: E402
    add_reference,
    data,
    in_use,
    kernel,
    record_paths,
    stage_threads,
    stencil_reference,
    store,
    to_host,
)

import conveyor as cv  # noqa: E402

__all__ = [
    "Boom", "add_reference", "assert_clean", "data", "in_use", "kernel", "next_stream_right",
    "opencl_c_only", "record_paths", "run_threads", "stage_threads", "stencil_reference",
    "store", "to_host", "vadd_arrays",
]


class Boom(RuntimeError):
    """The injected fault."""


def vadd_arrays(n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inputs a, b and a zeroed output c for the add kernel."""
    a, b = data((n,), np.float32, seed), data((n,), np.float32, seed + 1)
    return a, b, np.zeros_like(a)


def pocl_only(device: cv.Device) -> None:
    """Skip unless PoCL: the test's kernels use what its clang takes and NVIDIA's OpenCL
    compiler refuses (``enum e : uchar``, an unnamed parameter in a definition)."""
    import pytest

    if device.backend != "opencl" or "Portable Computing Language" not in device.info.platform:
        pytest.skip("C that PoCL's compiler takes (NVIDIA's OpenCL refuses it)")


def opencl_c_only(device: cv.Device) -> None:
    """Skip on CUDA: the test's kernels are OpenCL C (atomic_add, __constant, get_global_id
    without cv.portable); the behaviour they guard is the engine's, tried on OpenCL."""
    import pytest

    if device.backend != "opencl":
        pytest.skip("OpenCL C kernels")


def zero_copy_where_unified(device: cv.Device, request: Any) -> None:
    """Skip a test's ``zero_copy=True`` case (a parametrized ``zero_copy``) on a device that
    does not share the host's memory: the stream refuses it there."""
    import pytest

    params = getattr(request.node, "callspec", None)
    if params is not None and params.params.get("zero_copy") is True \
            and not device.host_unified:
        pytest.skip("zero_copy=True needs a device in host memory")


def assert_clean(device: cv.Device) -> None:
    """Every pool of ``device`` at zero bytes in use with nothing fenced, no staging thread."""
    gc.collect()
    assert in_use(device) == (0, 0)
    for pool in (device.memory_pool, device.pinned_pool):
        stats = pool.stats()
        assert stats.pending_bytes == 0, stats
        assert stats.blocks_in_use == 0, stats
    assert stage_threads() == []


def next_stream_right(device: cv.Device) -> None:
    """The device still streams right: a kernel map (copying and zero-copy) and a stencil."""
    a, b, c = vadd_arrays(10_000, seed=11)
    for zero_copy in (False, None):
        c[:] = 0
        cv.stream(kernel(device, "add"), [a, b], [c], device=device, block_bytes=4000,
                  zero_copy=zero_copy)
        np.testing.assert_array_equal(c, add_reference(a, b))
    x = data((3000, 3), np.float32, 13)
    y = np.zeros_like(x)
    cv.stream(kernel(device, "sten"), [x], [y], device=device, args=(3, 1), halo=1,
              block_bytes=3 * 4 * 300)
    np.testing.assert_array_equal(y, stencil_reference(x, 1))
    assert in_use(device) == (0, 0)


_compiled: dict[tuple[int, str, str], cv.Kernel] = {}


def compiled(device: cv.Device, source: str, name: str) -> cv.Kernel:
    """``device.compile(cv.portable(source), name)``, built once per device, source and name
    (a kernel of a closed device that left its id to a new one is built again)."""
    key = (id(device), source, name)
    if key not in _compiled or _compiled[key].device is not device:
        _compiled[key] = device.compile(cv.portable(source), name)
    return _compiled[key]


def rec_kernels(member: str) -> str:
    """Kernels over ``typedef struct { <member> a; float b; } rec;`` (the typedef on the
    source's second line): ``rec_sum`` (y = a + b), ``rec_lut`` (x plus a 4-record table's a +
    b) and ``rec_make`` (records from x: a = x, b = x / 2)."""
    return f"""
typedef struct {{ {member} a; float b; }} rec;
__kernel void rec_sum(__global const rec *r, __global float *y, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) y[i] = (float)r[i].a + r[i].b;
}}
__kernel void rec_lut(__global const float *x, __global float *y, __global const rec *t,
                      ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] + (float)t[i % 4].a + t[i % 4].b;
}}
__kernel void rec_make(__global const float *x, __global rec *r, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) {{ r[i].a = ({member})x[i]; r[i].b = x[i] * 0.5f; }}
}}
"""


def _first_device_only(request: Any) -> None:
    """Skip a test's copies on devices after the first (its ``device`` parameter): for checks
    that are conveyor's, the same on every device (streams over two devices take the ``pair``
    fixture). Rounds fifteen and sixteen use it, through :data:`first_device_only`, to keep
    ``make test`` short."""
    import pytest

    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.indices.get("device", 0) != 0:
        pytest.skip("checks conveyor's, the same on every device: run on the first device")


def _make_first_device_only() -> Any:
    import pytest

    @pytest.fixture(autouse=True)
    def first_device_only(request: Any) -> None:
        _first_device_only(request)

    return first_device_only


#: An autouse fixture: a test module that imports it runs its one-device tests on the first
#: device only.
first_device_only = _make_first_device_only()


def _make_opencl_c_kernels() -> Any:
    import pytest

    @pytest.fixture(autouse=True)
    def opencl_c_kernels(request: Any) -> None:
        if "device" in request.fixturenames:
            opencl_c_only(request.getfixturevalue("device"))

    return opencl_c_kernels


#: An autouse fixture: a test module whose kernels are all OpenCL C (or whose callables use
#: PyOpenCL's arrays) skips its tests on CUDA devices.
opencl_c_kernels = _make_opencl_c_kernels()


def child_env(src: str) -> dict[str, str]:
    """The environment of a child interpreter: the conveyor under test (``src``) first on
    its path, the rest as given (a GPU machine's PyOpenCL lies on PYTHONPATH too)."""
    import os

    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [src, os.environ.get("PYTHONPATH")])))


def run_threads(target: Any, count: int) -> None:
    """Run ``target(i)`` on ``count`` threads started together; raise the first failure."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def main(index: int) -> None:
        try:
            barrier.wait()
            target(index)
        except BaseException as exc:  # reported by the main thread
            exc.add_note(f"thread {index}")
            errors.append(exc)

    threads = [threading.Thread(target=main, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    if errors:
        raise errors[0]


#: Counts each value of a uint input mod 16 into a writable table (round forty-one on).
HIST = """__kernel void hist(__global const uint *x, __global uint *counts, ulong offset,
                         ulong n) {
    ulong i = get_global_id(0);
    if (i < n) atomic_inc(&counts[x[i] % 16]);
}"""


def compiling_opencl_spec() -> str | None:
    """The spec of the first OpenCL device that can build kernels here, or None: what the
    cluster rounds hand Dask workers (``device="SPEC"``)."""
    import conveyor as cv
    from conveyor.backends.diagnose import cannot_compile

    for dev in cv.devices():
        if dev.backend == "opencl" and not cannot_compile([dev]):
            return str(dev.spec)
    return None


def _make_compiling_device() -> Any:
    import pytest

    @pytest.fixture(scope="module", name="dev")
    def compiling_device() -> Any:
        """The first OpenCL device that builds kernels here (``compiling_opencl_spec``), as a
        module fixture named ``dev``; the module's tests skip where there is none."""
        spec = compiling_opencl_spec()
        if spec is None:
            pytest.skip("no usable OpenCL device")
        return cv.device(spec)

    return compiling_device


#: A module-scoped fixture named ``dev`` (import this name; tests take ``dev``).
compiling_device = _make_compiling_device()


def _reads(x: Any, *args: Any, queue: Any, offset: int, n: int) -> int:
    return int(n)


def stream_with_arg(dev: Any, arg: Any) -> Any:
    """A callable stream of 64 float32 ones on ``dev`` given ``arg`` in its ``args=`` (the
    checks of what a callable's args hold, reached through ``cv.stream``); its result, the
    sum of each block's ``n``, is 64."""
    x = np.ones(64, np.float32)
    return cv.stream(_reads, [x], device=dev, reduce="sum", args=(arg,))


def _make_two_worker_client() -> Any:
    import pytest

    @pytest.fixture(scope="module", name="dask_client")
    def two_worker_client() -> Any:
        """Two in-process Dask workers of one thread each: one cluster per test module."""
        distributed = pytest.importorskip("distributed")
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                           dashboard_address=":0", silence_logs=50)
        with cluster, distributed.Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
            LIVE_CLIENTS.append(client)
            try:
                yield client
            finally:
                LIVE_CLIENTS.remove(client)

    return two_worker_client


#: The clients of the two-worker clusters alive now: tests/conftest.py's pool check waits
#: for their workers to be idle first (``settle_clients``).
LIVE_CLIENTS: list[Any] = []


def settle_clients() -> None:
    """Wait for every live cluster's workers to finish their tasks (see below)."""
    for client in list(LIVE_CLIENTS):
        wait_for_idle_workers(client)


def wait_for_idle_workers(client: Any, most_seconds: float = 60.0) -> None:
    """Wait until no worker of ``client``'s cluster runs a task. A computation raises at its
    first failed task while the others still run on their workers' threads, holding pool
    blocks: the pools' check after the test saw them (a CI run: 1024 bytes of a warm-up in
    use at the teardown). A bound on the wait, not an assertion on its time."""
    import time

    deadline = time.monotonic() + most_seconds
    while time.monotonic() < deadline:
        busy = client.run(lambda dask_worker: len(dask_worker.state.executing))
        if not any(busy.values()):
            return
        time.sleep(0.01)


#: A module-scoped fixture named ``dask_client``: an in-process two-worker ``LocalCluster``'s
#: client (import this name; tests take ``dask_client``).
two_worker_client = _make_two_worker_client()
