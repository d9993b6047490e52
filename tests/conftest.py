"""Shared fixtures: every test that takes ``device`` runs once per usable device.

``CONVEYOR_TEST_BACKENDS`` (comma list: opencl, cuda) restricts the devices, so the GPU
workflow can run the suite once per backend; ``CONVEYOR_TEST_KIND=gpu`` keeps only GPUs.
After every test, every pool of every device must be back to zero bytes in use.
"""

from __future__ import annotations

import gc
import os
import signal
import sys

import pytest

import conveyor as cv
from conveyor.backends.diagnose import cannot_compile
from conveyor.kernels import build
from conveyor.memory import pinned
from conveyor.pipeline import staging

UNUSABLE: dict[str, str] = {}


def _can_compile(dev: cv.Device) -> bool:
    # The PoCL of the pocl-binary-distribution wheel (LLVM 14) cannot build for CPUs newer than
    # LLVM 14 knows; such a device is listed but useless, so the suite leaves it out (and says
    # so in its header) instead of failing every test on it.
    problem = cannot_compile([dev])
    if problem:
        UNUSABLE[dev.spec] = problem[0]
    return not problem


def _selected_devices() -> list[cv.Device]:
    wanted = os.environ.get("CONVEYOR_TEST_BACKENDS")
    found = cv.devices()
    if wanted:
        names = {w.strip() for w in wanted.split(",") if w.strip()}
        found = [d for d in found if d.backend in names]
    kind = os.environ.get("CONVEYOR_TEST_KIND")  # "gpu" on the GPU machine: skip its CPU PoCL
    if kind:
        found = [d for d in found if d.kind == kind]
    return [d for d in found if _can_compile(d)]


DEVICES = _selected_devices()


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as Python handles it by default: a shell that starts the suite in the
    background (``make test &``, a CI step without job control) hands it SIGINT ignored, and
    every test that interrupts a stream (here or in a child process, which inherits the
    ignoring) would then see no KeyboardInterrupt."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"conveyor devices under test: {', '.join(d.spec for d in DEVICES) or 'none'}"]
    lines += [f"left out: {why}" for why in UNUSABLE.values()]
    return lines


GPU_DEVICES = [d for d in DEVICES if d.kind == "gpu"]


#: Tests that start processes, send signals or run hundreds of streams. With every Hypothesis
#: test they are marked ``slow`` (pytest_collection_modifyitems below), so a quick run skips
#: them with ``pytest -m "not slow"``; ``make test`` and CI run everything.
SLOW_TESTS = frozenset({
    "test_eight_processes_compile_one_kernel_at_once",
    "test_hundreds_of_streams_keep_held_bytes_flat",
    "test_hundreds_of_streams_leave_no_threads_or_files_open",
    "test_sigint_at_random_points_leaves_the_process_usable",
    "test_ctrl_c_at_every_point_leaves_nothing_behind",
    "test_sigint_mid_stream_cleans_up_and_the_next_stream_is_right",
    "test_sigint_mid_map_leaves_no_output",
    "test_demo_runs_green",
    "test_second_process_hits_the_disk_cache",
    "test_unchanged_second_run_in_a_new_process_hits",
    "test_temp_file_of_a_killed_writer_is_ignored",
    "test_a_second_process_waits_for_the_holder",
    "test_a_hung_holder_is_given_up_on",
    "test_a_killed_holder_leaves_no_lock",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the Hypothesis tests and SLOW_TESTS ``slow``."""
    for item in items:
        name = getattr(item, "originalname", item.name)
        function = getattr(item, "function", None)
        if name in SLOW_TESTS or getattr(function, "is_hypothesis_test", False):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(params=DEVICES, ids=[d.spec for d in DEVICES])
def device(request: pytest.FixtureRequest) -> cv.Device:
    """Each usable device in turn."""
    return request.param


@pytest.fixture(params=GPU_DEVICES or [None], ids=[d.spec for d in GPU_DEVICES] or ["no-gpu"])
def gpu_device(request: pytest.FixtureRequest) -> cv.Device:
    """Each GPU device in turn; the test is skipped where there is none."""
    if request.param is None:
        pytest.skip("no GPU device here")
    return request.param


def _pools(dev: cv.Device) -> list:
    found = []
    if dev._memory_pool is not None:
        found.append(dev._memory_pool)
    if dev._pinned_pool is not None:
        found.append(dev._pinned_pool)
    svm = pinned._svm_pools.get(dev)
    if svm is not None:
        found.append(svm)
    return found


def _in_use() -> bool:
    return any(pool.stats().in_use_bytes for dev in DEVICES for pool in _pools(dev))


@pytest.fixture(autouse=True)
def pools_back_to_zero():
    """Every pool must show zero bytes in use once a test is over.

    What survives a test is frozen (``gc.freeze``) once the check passes, so the collection
    after the next test scans only what that test made: a full collection of the whole heap
    after each of some 2,800 tests took about a third of the suite's time on 2 cores. Where
    a pool is not back at zero, everything is unfrozen and collected again before the check
    (a pool block held by a cycle that an earlier test's survivor closed). A test's Dask
    cluster (tests/reliability/reliakit.py) is let finish its tasks first: a computation
    raises at its first failed task while the others still run, holding pool blocks."""
    yield
    kit = sys.modules.get("reliakit")
    if kit is not None:
        kit.settle_clients()
    gc.collect()
    if _in_use():
        gc.unfreeze()
        gc.collect()
    for dev in DEVICES:
        for pool in _pools(dev):
            stats = pool.stats()
            assert stats.in_use_bytes == 0, f"{dev.spec}: {pool!r} still has {stats} in use"
    gc.freeze()


@pytest.fixture(autouse=True)
def no_warm_up(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """``cv.device()`` starts no warm-up (memory/warmup.py) in tests, unless marked
    ``warm_up``: on a GPU its pinned blocks would land in a pool other tests share and count."""
    if request.node.get_closest_marker("warm_up") is None:
        monkeypatch.setenv("CONVEYOR_WARMUP", "0")


@pytest.fixture(autouse=True)
def staging_on_threads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests use small blocks, which a stream stages inline on its own thread; stage them on
    the staging threads instead (the path of every large block), unless the test is marked
    ``inline_staging``."""
    if request.node.get_closest_marker("inline_staging") is None:
        monkeypatch.setattr(staging, "THREAD_MIN_BYTES", 0)


@pytest.fixture
def fresh_memo(monkeypatch: pytest.MonkeyPatch):
    """For the kernel-cache tests (``pytestmark = pytest.mark.usefixtures("fresh_memo")``):
    the disk cache on, whatever the environment says, and the in-process memo empty before and
    after, so every build in the test goes through the disk cache."""
    monkeypatch.delenv("CONVEYOR_NO_CACHE", raising=False)
    build.clear_memo()
    yield
    build.clear_memo()
