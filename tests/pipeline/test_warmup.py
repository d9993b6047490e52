"""A device's warm-up (memory/warmup.py, issue 17): pinned blocks put in the pool ahead of the
first stream, stopping at the first request, the limit, the keep budget, a failed allocation
or close(); the pipeline imported on its thread. Runs on a second OpenCL context of a device
under test (its own pools), with the real allocator wrapped to inject faults."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from streamkit import add_reference, data, kernel

import conveyor as cv
from conftest import DEVICES
from conveyor.errors import BackendError, InputError, OutOfMemoryError
from conveyor.memory.hostmem import physical_bytes
from conveyor.memory.warmup import WarmUp

BLOCK = 16 * 1024
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def fresh():
    """A second context on an OpenCL device under test: a device with empty pools of its own."""
    from conveyor.backends import opencl

    dev = next((d for d in DEVICES if d.backend == "opencl"), None)
    if dev is None:
        pytest.skip("no OpenCL device under test")
    platform, index = (int(part) for part in dev.spec.split(":")[1:])
    made = opencl.Device(dev.cl_device, platform, index)  # type: ignore[attr-defined]
    yield made
    made.close()


class CountingAllocate:
    """The pool's real allocator; ``on_call[n]`` runs before the n-th call (1-based)."""

    def __init__(self, real, on_call=None):
        self.real = real
        self.on_call = on_call or {}
        self.calls = 0

    def __call__(self, nbytes: int):
        self.calls += 1
        action = self.on_call.get(self.calls)
        if action is not None:
            action()
        return self.real(nbytes)


def wait_for(condition, seconds: float = 30.0) -> bool:
    """Poll ``condition`` until it holds (True) or ``seconds`` pass (False)."""
    import time

    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True


def _raise(exc: BaseException):
    def action():
        raise exc
    return action


# -- BlockPool.prepare ----------------------------------------------------------------------
def test_prepare_puts_idle_blocks_in_the_pool_without_counting_a_request(fresh):
    pool = fresh.pinned_pool
    assert pool.prepare(BLOCK, 4) == 4
    stats = pool.stats()
    assert (stats.held_bytes, stats.in_use_bytes, stats.hits, stats.misses) == (4 * BLOCK, 0, 0, 0)
    assert stats.peak_in_use_bytes == 0  # so it does not raise the keep budget either
    blocks = [pool.acquire(BLOCK) for _ in range(4)]
    assert pool.stats().hits == 4 and pool.stats().misses == 0
    for block in blocks:
        pool.release(block)


def test_prepare_stops_at_the_first_request_and_keeps_what_it_made(fresh):
    pool = fresh.pinned_pool
    taken = []
    pool.allocate = CountingAllocate(pool.allocate, {3: lambda: taken.append(pool.acquire(512))})
    # The third allocation happens while a "stream" asks for a block: it is kept, no more.
    assert pool.prepare(BLOCK, 10) == 3
    assert pool.stats().held_bytes == 3 * BLOCK
    pool.release(taken[0])


@pytest.mark.parametrize("bound", ["limit", "keep"])
def test_prepare_stays_within_the_pools_limit_and_keep_budget(fresh, bound):
    pool = fresh.pinned_pool
    setattr(pool, bound, 3 * BLOCK)
    assert pool.prepare(BLOCK, 10) == 3
    assert pool.stats().held_bytes == 3 * BLOCK


def test_prepare_stops_quietly_when_memory_runs_out_and_raises_other_errors(fresh):
    pool = fresh.pinned_pool
    pool.allocate = CountingAllocate(pool.allocate, {3: _raise(OutOfMemoryError(BLOCK, 0, None))})
    assert pool.prepare(BLOCK, 10) == 2
    pool.allocate = CountingAllocate(pool.allocate, {1: _raise(BackendError("driver gone"))})
    with pytest.raises(BackendError):
        pool.prepare(BLOCK, 10)
    stats = pool.stats()
    assert stats.held_bytes == 2 * BLOCK and stats.in_use_bytes == 0
    assert pool._reserved_bytes == 0


def test_prepare_stops_when_asked(fresh):
    stop = threading.Event()
    pool = fresh.pinned_pool
    pool.allocate = CountingAllocate(pool.allocate, {2: stop.set})
    assert pool.prepare(BLOCK, 10, stop.is_set) == 2


# -- WarmUp ---------------------------------------------------------------------------------
def test_a_stream_after_the_warm_up_allocates_no_pinned_memory(fresh):
    warm = WarmUp(fresh, 16 * BLOCK, block_bytes=BLOCK, pinned=True).start()
    assert warm.wait(60) and warm.error is None and warm.made == 16
    a, b = data((16 * 4096,), np.float32, 1), data((16 * 4096,), np.float32, 2)
    c = np.empty_like(a)
    cv.stream(kernel(fresh, "add"), [a, b], [c], device=fresh, block_bytes=BLOCK,
              zero_copy=False, depth=2)
    np.testing.assert_array_equal(c, add_reference(a, b))
    stats = fresh.pinned_pool.stats()
    assert stats.misses == 0 and stats.hits > 0 and stats.in_use_bytes == 0


def test_a_failing_warm_up_records_its_error_and_the_stream_still_runs(fresh):
    pool = fresh.pinned_pool
    pool.allocate = CountingAllocate(pool.allocate, {2: _raise(BackendError("no pinned memory"))})
    warm = WarmUp(fresh, 8 * BLOCK, block_bytes=BLOCK, pinned=True).start()
    assert warm.wait(60) and isinstance(warm.error, BackendError)
    assert warm.made == 1 and pool.stats().held_bytes == BLOCK  # the one made before
    a, b = data((8 * 4096,), np.float32, 3), data((8 * 4096,), np.float32, 4)
    c = np.empty_like(a)
    cv.stream(kernel(fresh, "add"), [a, b], [c], device=fresh, block_bytes=BLOCK,
              zero_copy=False)
    np.testing.assert_array_equal(c, add_reference(a, b))


def test_close_stops_a_warm_up_under_way_and_frees_what_it_made(fresh):
    pool = fresh.pinned_pool
    entered, go_on = threading.Event(), threading.Event()

    def hold():
        entered.set()
        go_on.wait(30)

    pool.allocate = CountingAllocate(pool.allocate, {2: hold})
    warm = fresh.warm_up(100 * BLOCK, block_bytes=BLOCK, pinned=True)
    assert warm is not None and fresh.warm_up() is warm  # one per device
    assert entered.wait(30)
    closer = threading.Thread(target=fresh.close)
    closer.start()
    assert wait_for(warm._stop.is_set)  # close() has asked it to stop ...
    closer.join(0.2)
    assert closer.is_alive()  # ... and waits for the allocation under way ...
    go_on.set()
    closer.join(30)
    assert not closer.is_alive() and not warm.running and warm.made == 2
    assert pool.stats().held_bytes == 0  # ... then the pool is closed with its blocks
    assert fresh.warm_up() is warm  # closed: no new warm-up


@pytest.mark.warm_up
def test_cv_device_starts_one_warm_up_per_device_that_stages():
    dev = cv.device(DEVICES[0].spec) if DEVICES else pytest.skip("no device under test")
    warm = dev._warmup
    if dev.host_unified:  # nothing to pin: no thread (PoCL's CPU device, in CI)
        assert warm is None and dev.warm_up() is None
        return
    assert warm is not None and cv.device(dev.spec)._warmup is warm
    assert warm.wait(60) and warm.error is None
    assert warm.made > 0 or warm.nbytes < warm.block_bytes
    assert "conveyor.pipeline.stream" in sys.modules
    dev.pinned_pool.trim()  # the blocks it made, on a device the other tests share


def test_the_warm_up_amount_comes_from_conveyor_warmup(monkeypatch, fresh):
    from conveyor.memory import warmup

    monkeypatch.setenv("CONVEYOR_WARMUP", "off")
    assert warmup.default_bytes() == 0
    assert fresh.warm_up(pinned=True) is None and fresh._warmup is None  # off: no thread
    monkeypatch.setenv("CONVEYOR_WARMUP", "192MiB")
    assert warmup.default_bytes() == 192 * 2**20
    warm = WarmUp(fresh, block_bytes=BLOCK // 4, pinned=True)
    assert warm.nbytes == 192 * 2**20  # asked per device: not shared
    monkeypatch.setenv("CONVEYOR_WARMUP", "on")
    assert warmup.default_bytes() == min(warmup.DEFAULT_BYTES, physical_bytes() // 16)
    monkeypatch.delenv("CONVEYOR_WARMUP")
    assert 0 < warmup.default_bytes() <= warmup.DEFAULT_BYTES
    from conveyor import config
    from conveyor.pipeline.plan import DEFAULT_BLOCK_BYTES

    assert config.WARMUP_MIN_BYTES == DEFAULT_BLOCK_BYTES
    for bad, match in (("plenty", "is not a size"), ("1", "less than one 64 MiB")):
        monkeypatch.setenv("CONVEYOR_WARMUP", bad)
        with pytest.raises(InputError, match=f"CONVEYOR_WARMUP.*{match}"):
            cv.device()


def test_the_default_amount_is_shared_by_the_processs_devices(fresh, monkeypatch):
    from conveyor.memory import warmup

    monkeypatch.delenv("CONVEYOR_WARMUP")  # the default, not the tests' 0
    total = physical_bytes() // warmup.HOST_SHARE
    monkeypatch.setattr(warmup, "_default_given", total - 3 * 2**30 // 2)  # 1.5 GiB left
    share = warmup.default_bytes()
    first = WarmUp(fresh, pinned=True)
    second = WarmUp(fresh, pinned=True)
    third = WarmUp(fresh, pinned=True)
    assert share == warmup.DEFAULT_BYTES or share == total  # min(1 GiB, host / 16)
    assert first.nbytes == min(share, 3 * 2**30 // 2) > 0
    assert second.nbytes == max(0, 3 * 2**30 // 2 - first.nbytes)
    assert third.nbytes == 0 and warmup._default_given == total
    assert WarmUp(fresh, 2**60, pinned=True).nbytes == physical_bytes() // 4  # the cap


def test_a_request_before_the_thread_runs_stops_the_pinned_part(fresh):
    pool = fresh.pinned_pool
    warm = WarmUp(fresh, 32 * BLOCK, block_bytes=BLOCK, pinned=True)
    real_start = warm._thread.start

    def start_after_a_request():
        pool.release(pool.acquire(512))  # a stream's first block, before the thread runs
        real_start()

    warm._thread.start = start_after_a_request  # type: ignore[method-assign]
    warm.start()
    assert warm.wait(60) and warm.made == 0
    assert pool.stats().held_bytes == pool.bin_size(512)  # the stream's block, nothing more


# -- importing on a second thread ------------------------------------------------------------
def _import_graph(names: set[str]) -> dict[str, set[str]]:
    """Module-level conveyor imports of each module in ``names`` (not under ``if``: the
    TYPE_CHECKING ones never run), to modules in ``names``."""
    graph: dict[str, set[str]] = {}
    for name in names:
        path = SRC.joinpath(*name.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        deps: set[str] = set()
        for node in ast.parse(path.read_text()).body:
            nodes = node.body if isinstance(node, ast.Try) else [node]
            for item in nodes:
                if isinstance(item, ast.Import):
                    deps.update(a.name for a in item.names)
                elif isinstance(item, ast.ImportFrom) and item.module and item.level == 0:
                    deps.add(item.module)
                    deps.update(f"{item.module}.{a.name}" for a in item.names)
        # Importing a.b.c imports a and a.b first; a module's own packages come first too.
        deps |= {d.rsplit(".", k)[0] for d in deps | {name} for k in range(1, d.count(".") + 1)}
        graph[name] = {d for d in deps if d in names and d != name}
    return graph


def test_what_the_warm_up_imports_has_no_import_cycle():
    """Two threads importing modules of one cycle can deadlock; without a cycle the import
    locks only make one wait for the other."""
    code = ("import sys, json, conveyor as cv; cv.devices(); before = set(sys.modules); "
            "import conveyor.pipeline.stream; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('conveyor')"
            " and m not in before)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    graph = _import_graph(set(json.loads(done.stdout.splitlines()[-1])) | {"conveyor.pipeline"})
    assert len(graph) > 10, graph  # the pipeline was imported here, not by cv.device()
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in graph[name]:
            assert state.get(dep) != 1, f"import cycle: {' -> '.join([*path, name, dep])}"
            if dep not in state:
                visit(dep, [*path, name])
        state[name] = 2

    for name in graph:
        if name not in state:
            visit(name, [])


def test_interpreter_exit_stops_a_warm_up_under_way():
    code = """if True:
        import atexit
        state = {}
        # Registered before the warm-up module's own handler, so it runs after it.
        atexit.register(lambda: print("after exit:", state["w"].running, state["w"].made))
        import conveyor as cv
        from conveyor.backends import opencl
        from conveyor.memory.warmup import WarmUp
        dev = next(d for d in cv.devices() if d.backend == "opencl")
        platform, index = (int(p) for p in dev.spec.split(":")[1:])
        other = opencl.Device(dev.cl_device, platform, index)
        state["w"] = WarmUp(other, 2**30, block_bytes=4096, pinned=True).start()
        while other.pinned_pool.stats().held_bytes == 0:
            pass  # under way: exit now
        """
    if not any(d.backend == "opencl" for d in DEVICES):
        pytest.skip("no OpenCL device under test")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    running, made = done.stdout.split("after exit:")[1].split()
    assert running == "False" and int(made) < 2**30 // 4096  # stopped early


def test_a_fork_while_the_warm_up_imports_leaves_the_child_able_to_import():
    """A child forked while the warm-up thread held an import lock would wait for it forever:
    a fork stops and waits for every warm-up first."""
    code = """if True:
        import os, signal, sys
        import conveyor as cv
        from conveyor.memory.warmup import WarmUp
        dev = cv.devices()[0]
        for round_ in range(5):
            for name in [m for m in sys.modules if m.startswith("conveyor.pipeline")]:
                del sys.modules[name]  # so each round's warm-up imports again
            warm = WarmUp(dev, 0).start()  # imports only
            pid = os.fork()
            if pid == 0:
                signal.alarm(20)  # a hung child exits with SIGALRM, not forever
                import conveyor.pipeline.stream
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            assert status == 0, f"round {round_}: child status {status}"
            assert not warm.running
        print("ok")
        """
    if not DEVICES:
        pytest.skip("no device under test")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_thread_that_cannot_start_leaves_no_warm_up_and_no_error(fresh, monkeypatch):
    warm = WarmUp(fresh, 4 * BLOCK, block_bytes=BLOCK, pinned=True)

    def no_thread():
        raise RuntimeError("can't start new thread")

    warm._thread.start = no_thread  # type: ignore[method-assign]
    assert warm.start() is warm and isinstance(warm.error, RuntimeError)
    assert warm.wait(1) and not warm.running and warm.made == 0
    warm.stop()  # nothing to wait for


@pytest.mark.warm_up
def test_conveyors_own_calls_start_no_warm_up(fresh, monkeypatch):
    from conveyor import backends

    dev = DEVICES[0] if DEVICES else pytest.skip("no device under test")
    started = []
    monkeypatch.setattr(type(dev), "warm_up", lambda self, *a, **k: started.append(self))
    a = np.arange(4096, dtype=np.float32)
    cv.stream(kernel(dev, "ident"), [a], reduce="sum", device=dev.spec)
    cv.pinned.empty(16, np.float32)
    assert started == []
    backends.device(dev.spec)
    backends.select(f"{dev.spec},{dev.spec}")
    assert started == [dev, dev, dev]


def test_a_device_used_after_close_frees_its_pools_again_on_the_next_close(fresh):
    """cv.device(spec) returns the one Device object, so streams after close() run on it and
    its pools hold memory again; a second close() did nothing and that memory stayed held."""
    x = np.arange(50_000, dtype=np.float32)
    for _ in range(2):
        fresh.close()
        out = cv.stream(kernel(fresh, "scale"), [x], [np.float32], args=(2.0,), device=fresh,
                        block_bytes=16_384, zero_copy=False).outputs[0]
        np.testing.assert_array_equal(out, x * 2)
        assert fresh.memory_pool.stats().held_bytes > 0
        fresh.close()
        assert fresh.memory_pool.stats().held_bytes == 0
        assert fresh.pinned_pool.stats().held_bytes == 0
