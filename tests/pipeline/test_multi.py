"""One stream over several devices (issue 15): exact against NumPy on two devices at once,
dynamic and static schedules, halo, reductions bitwise equal to one device, per-block and
ratio outputs, files, resident arrays, a fault on one device of two, Ctrl-C.

The two devices are the first two usable devices under test; where only one can build
kernels (this machine's Debian PoCL cannot: "unknown target CPU 'generic'"), the second is a
second context on the same hardware (its own Device: own context, queues, pools, kernels),
which runs the same coordinator code as two cards do.
"""

from __future__ import annotations

import gc
import signal
import threading

import numpy as np
import pytest
from streamkit import (
    add_reference,
    data,
    in_use,
    kernel,
    stage_threads,
    stencil_reference,
    store,
    to_host,
)

import conveyor as cv
from conftest import DEVICES
from conveyor.errors import InputError
from conveyor.pipeline import supply

SCHEDULES = ["dynamic", "static"]


def _second_context(dev: cv.Device) -> cv.Device:
    from conveyor.backends import opencl

    assert dev.backend == "opencl", "a second context is made for OpenCL devices only"
    platform, index = (int(part) for part in dev.spec.split(":")[1:])
    return opencl.Device(dev.cl_device, platform, index)  # type: ignore[attr-defined]


def two_devices() -> tuple[cv.Device, cv.Device, cv.Device | None]:
    """Two devices of one backend under test (the GPUs on the GPU machine), else one OpenCL
    device and a second context on it; the third item is that context (to close), or None.
    Skips where neither is possible."""
    for backend in ("cuda", "opencl"):
        of_backend = [d for d in DEVICES if d.backend == backend]
        if len(of_backend) >= 2:
            return of_backend[0], of_backend[1], None
    opencl = [d for d in DEVICES if d.backend == "opencl"]
    if not opencl:
        pytest.skip("no two devices of one backend, and no OpenCL device for a second context")
    second = _second_context(opencl[0])
    return opencl[0], second, second


@pytest.fixture(scope="module")
def pair():
    """Two devices (``two_devices``)."""
    first, second, made = two_devices()
    yield first, second
    if made is not None:
        gc.collect()
        made.close()


@pytest.fixture(autouse=True)
def second_pools_back_to_zero(request):
    """The conftest checks the devices under test; this checks a second context too."""
    yield
    if "pair" in request.fixturenames:
        gc.collect()
        for dev in request.getfixturevalue("pair"):
            assert in_use(dev) == (0, 0), dev
        assert stage_threads() == []
        assert [t for t in threading.enumerate() if t.name.startswith("conveyor-device")] == []


def _add(dev):
    return kernel(dev, "add")


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("zero_copy", [False, None], ids=["copying", "auto"])
def test_map_is_exact_on_two_devices(pair, schedule, zero_copy):
    a, b = data((100_003,), np.float32, 1), data((100_003,), np.float32, 2)
    c = np.zeros_like(a)
    report = cv.stream(_add(pair[0]), [a, b], [c], device=list(pair), block_bytes=4000,
                       schedule=schedule, zero_copy=zero_copy)
    np.testing.assert_array_equal(c, add_reference(a, b))
    assert [r.blocks for r in report.devices] != [] and sum(
        r.blocks for r in report.devices) == report.blocks
    if schedule == "static":  # dynamic: a device that starts late may get no run
        assert all(r.blocks > 0 for r in report.devices)
    assert sum(r.bytes_in for r in report.devices) == report.bytes_in == a.nbytes * 2
    assert 0.0 <= report.imbalance <= 1.0
    if schedule == "static":  # one contiguous half each
        assert [r.blocks for r in report.devices] == [report.blocks // 2,
                                                      report.blocks - report.blocks // 2]


def test_one_device_in_a_list_is_the_one_device_path(pair):
    a, b = data((5000,), np.float32, 1), data((5000,), np.float32, 2)
    c = np.zeros_like(a)
    report = cv.stream(_add(pair[0]), [a, b], [c], device=[pair[0]], block_bytes=4000)
    np.testing.assert_array_equal(c, add_reference(a, b))
    assert report.devices == [] and report.imbalance is None


def test_a_source_string_and_a_callable_run_on_each_device(pair):
    x = data((20_000,), np.float32, 3)
    y = np.zeros_like(x)
    source = cv.portable("""
    __kernel void twice(__global const float *x, __global float *y, ulong offset, ulong n) {
        ulong i = get_global_id(0);
        if (i < n) y[i] = 2.0f * x[i];
    }""")
    cv.stream(source, [x], [y], device=list(pair), block_bytes=4000)
    np.testing.assert_array_equal(y, 2 * x)
    queues = set()

    def triple(a, b, queue, offset, n):
        queues.add(id(queue))
        store(b, to_host(a, queue) * 3, queue)

    y[:] = 0
    cv.stream(triple, [x], [y], device=list(pair), block_bytes=4000)
    np.testing.assert_array_equal(y, 3 * x)
    assert len(queues) == 2  # each device's compute queue


def test_device_specs_name_several_devices(pair):
    from conveyor.backends import select

    assert select("opencl:all") == [d for d in cv.devices() if d.backend == "opencl"]
    assert select([pair[0].spec, pair[0]]) == [pair[0], pair[0]]
    with pytest.raises(InputError, match="listed twice"):
        cv.stream(_add(pair[0]), [np.zeros(10, np.float32)] * 2, [np.float32],
                  device=[pair[0], pair[0]])
    with pytest.raises(InputError, match="before ':all'"):
        select("tpu:all")
    with pytest.raises(InputError, match="schedule='round'"):
        cv.stream(_add(pair[0]), [np.zeros(10, np.float32)] * 2, [np.float32],
                  device=list(pair), schedule="round")


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_halo_is_exact_on_two_devices(pair, schedule):
    x = data((6000, 3), np.float32, 5)
    y = np.zeros_like(x)
    cv.stream(kernel(pair[0], "sten"), [x], [y], device=list(pair), args=(3, 2), halo=2,
              block_bytes=3 * 4 * 250, schedule=schedule)
    np.testing.assert_array_equal(y, stencil_reference(x, 2))
    # In place, a device could read halo rows another device has already overwritten.
    with pytest.raises(InputError, match="halo rows that another has already overwritten"):
        cv.stream(kernel(pair[0], "sten"), [x], [x], device=list(pair), args=(3, 2), halo=2,
                  block_bytes=3 * 4 * 250)


def test_in_place_without_halo(pair):
    a, b = data((30_000,), np.float32, 1), data((30_000,), np.float32, 2)
    expected = add_reference(a, b)
    cv.stream(_add(pair[0]), [a, b], [a], device=list(pair), block_bytes=4000)
    np.testing.assert_array_equal(a, expected)


@pytest.mark.parametrize("op", ["sum", "min", "max"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_kernel_reductions_are_bitwise_those_of_one_device(pair, op, dtype):
    x = data((50_001,), dtype, 7)
    one = cv.stream(kernel(pair[0], "ident", dtype), [x], reduce=op, device=pair[0],
                    block_bytes=4000)
    for schedule in SCHEDULES:
        two = cv.stream(kernel(pair[0], "ident", dtype), [x], reduce=op, device=list(pair),
                        block_bytes=4000, schedule=schedule)
        assert type(two.result) is type(one.result)
        assert two.result.tobytes() == one.result.tobytes()


def test_a_callable_fold_goes_in_block_order(pair):
    x = data((30_000,), np.float32, 9)

    def block_mean(a, queue, offset, n):
        return float(to_host(a, queue).astype(np.float64).mean())

    def fold(first, second):  # not associative: only block order gives one device's result
        return first * 0.5 + second

    one = cv.stream(block_mean, [x], reduce=fold, device=pair[0], block_bytes=4000)
    two = cv.stream(block_mean, [x], reduce=fold, device=list(pair), block_bytes=4000)
    assert two.result == one.result


def test_per_block_and_ratio_outputs(pair):
    from test_shaped_outputs import BLOCK_SUM, POOL

    x = (np.arange(10_000) % 5).astype(np.float32)
    report = cv.stream(pair[0].compile(BLOCK_SUM, "block_sum"), [x],
                       [cv.per_block((3,), np.float32)], device=list(pair), block_bytes=4096)
    expected = np.array([[x[a:b].sum(), a, b - a] for a, b in report.block_ranges],
                        np.float32)
    np.testing.assert_array_equal(report.outputs[0], expected)
    x = np.arange(8192 * 3, dtype=np.float32) % 11
    report = cv.stream(pair[0].compile(POOL, "pool4"), [x], [cv.rows(np.float32, ratio=(1, 4))],
                       device=list(pair), block_bytes=4 * 1001)
    np.testing.assert_array_equal(report.outputs[0], x.reshape(-1, 4).sum(axis=1))


def test_files_in_and_out(pair, tmp_path):
    a, b = data((40_000,), np.float32, 11), data((40_000,), np.float32, 12)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    out = tmp_path / "c.npy"
    cv.stream(_add(pair[0]), [str(tmp_path / "a.npy"), cv.npy(tmp_path / "b.npy")],
              [str(out)], device=list(pair), block_bytes=4000)
    np.testing.assert_array_equal(np.load(out), add_reference(a, b))
    with pytest.raises(InputError, match="read once, in order"):
        cv.stream(_add(pair[0]), [cv.iterate([a], length=len(a)), b], [np.float32],
                  device=list(pair), block_bytes=4000)


def test_resident_tables_go_to_each_device(pair):
    from test_resident import LOOKUP, _data, _reference

    x, table = _data()
    k = pair[0].compile(LOOKUP, "lookup")
    y = np.zeros(len(x), np.float32)
    cv.stream(k, [x], [y], device=list(pair), args=(table, len(table), 0.5), block_bytes=4000)
    np.testing.assert_array_equal(y, _reference(x, table, 0.5))
    with cv.resident(table, device=pair[0]) as handle:
        y[:] = 0
        cv.stream(k, [x], [y], device=list(pair), args=(handle, len(table), 2.0),
                  block_bytes=4000)
        np.testing.assert_array_equal(y, _reference(x, table, 2.0))
        assert handle.users == 0
    with pytest.raises(InputError, match="writable"):
        cv.stream(k, [x], [y], device=list(pair),
                  args=(cv.resident(table, writable=True), len(table), 2.0))


class Boom(RuntimeError):
    """The injected fault."""


class FailingQueue:
    """A real queue whose ``launch`` raises Boom from its ``fail_at``-th launch on."""

    def __init__(self, real, fail_at: int) -> None:
        self.real = real
        self.fail_at = fail_at
        self.launches = 0

    def launch(self, *args, **kwargs):
        self.launches += 1
        if self.launches >= self.fail_at:
            raise Boom("launch failed on the second device")
        return self.real.launch(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_fault_on_one_device_stops_both_and_returns_every_buffer(pair, schedule,
                                                                  monkeypatch, tmp_path):
    _fault_on_the_second(pair, schedule, monkeypatch, tmp_path)


@pytest.mark.inline_staging
def test_a_fault_on_one_device_with_inline_staging(pair, monkeypatch, tmp_path):
    # Small blocks stage on the engine's own thread: a stopped engine must still get the
    # blocks it had already taken.
    _fault_on_the_second(pair, "dynamic", monkeypatch, tmp_path)


def _fault_on_the_second(pair, schedule, monkeypatch, tmp_path):
    real = pair[1].create_queue
    made: list[FailingQueue] = []

    def create_queue():
        made.append(FailingQueue(real(), fail_at=4))
        return made[-1]

    monkeypatch.setattr(pair[1], "create_queue", create_queue)
    a, b = data((200_000,), np.float32, 1), data((200_000,), np.float32, 2)
    out = tmp_path / "c.npy"
    with pytest.raises(Boom):
        cv.stream(_add(pair[0]), [a, b], [str(out)], device=list(pair), block_bytes=4000,
                  zero_copy=False, schedule=schedule)
    assert not out.exists() and list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    gc.collect()
    for dev in pair:
        assert in_use(dev) == (0, 0)
    c = np.zeros_like(a)
    cv.stream(_add(pair[0]), [a, b], [c], device=list(pair), block_bytes=4000)
    np.testing.assert_array_equal(c, add_reference(a, b))


def test_ctrl_c_stops_every_device(pair):
    main = threading.main_thread().ident
    calls = []

    def compute(a, b, queue, offset, n):
        calls.append(offset)
        if len(calls) == 6:
            signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C, to the calling thread
        store(b, to_host(a, queue) * 2, queue)

    x = np.arange(400_000, dtype=np.float32)
    y = np.zeros_like(x)
    with pytest.raises(KeyboardInterrupt):
        cv.stream(compute, [x], [y], device=list(pair), block_bytes=4000, workers=2)
    assert len(calls) < 100


def test_the_merged_report_and_trace(pair, tmp_path, monkeypatch):
    import json

    from conveyor.measure_all import group_key
    from conveyor.trace.ceiling import save_link_ceiling

    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path / "cache"))
    save_link_ceiling(*group_key(list(pair)), {"pinned_h2d_gbps": 100.0,
                                               "pinned_d2h_gbps": 100.0})

    a, b = data((50_000,), np.float32, 1), data((50_000,), np.float32, 2)
    trace = tmp_path / "run.json"
    report = cv.stream(_add(pair[0]), [a, b], [np.float32], device=list(pair),
                       block_bytes=4000, zero_copy=False, trace=str(trace))
    assert report.device == ",".join(r.device for r in report.devices)
    assert {s.device for s in report.timeline.spans} == set(report.timeline.devices)
    assert len(report.timeline.devices) == 2
    events = json.loads(trace.read_text())["traceEvents"]
    names = [e["args"]["name"] for e in events if e["name"] == "process_name"]
    assert len(names) == 2 and len({e["pid"] for e in events if e["ph"] == "X"}) == 2
    assert "2 devices, imbalance" in str(report)
    assert report.ceiling is not None  # the all-at-once ceiling of these devices
    assert report.ceiling_ratio_in == pytest.approx(report.gbps_in / 100.0)
    assert supply.Supply(multi_plan(50), 2, "dynamic").run_blocks == supply.RUN_BLOCKS


def multi_plan(blocks: int):
    from conveyor.pipeline.plan import ArraySpec, make_plan

    spec = ArraySpec((blocks * 10,), np.dtype(np.float32))
    return make_plan((spec,), (), depth=3, block_bytes=40, memory_limit=None, halo=0,
                     global_mem_bytes=2**30, max_alloc_bytes=2**30)


def test_pinned_arrays_are_direct_only_where_the_backend_shares_them(pair):
    from conveyor.memory.pinned import is_pinned_for

    x = cv.pinned.empty(1000, np.float32, device=pair[0])
    assert is_pinned_for(x, pair[0])
    # CUDA's pinned memory is portable; OpenCL's belongs to one context, and another context
    # of the same platform copies it directly, with blocking copies (_pinned_elsewhere), on
    # NVIDIA's OpenCL and CPU devices.
    same_platform = (pair[0].backend == pair[1].backend == "opencl"
                     and pair[0].cl_device.platform == pair[1].cl_device.platform
                     and (pair[1].kind == "cpu"
                          or "NVIDIA" in pair[1].cl_device.platform.name))
    assert is_pinned_for(x, pair[1]) == (same_platform or (
        pair[1].portable_pinned and pair[1].backend == pair[0].backend))
    assert not is_pinned_for(np.zeros(10, np.float32), pair[0])
    if pair[0].backend == "opencl":
        from conveyor.backends.opencl import _pinned_elsewhere

        # Directly only where the other device copies this context's pinned memory (same
        # platform): the two PoCLs of the CI machine are two platforms, and they stage it.
        assert not _pinned_elsewhere(x, pair[0])
        assert _pinned_elsewhere(x, pair[1]) == pair[1].copies_pinned_of(pair[0])
        assert not _pinned_elsewhere(np.zeros(10, np.float32), pair[1])
    del x


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_arrays_pinned_for_one_device_stream_direct_on_both(pair, schedule):
    """A pinned input and output of the first device: exact on both, and on the same platform
    (or CUDA) no device stages them through its ring: no stage spans in the timeline."""
    n = 60_001
    a = cv.pinned.empty(n, np.float32, device=pair[0])
    b = cv.pinned.empty(n, np.float32, device=pair[0])
    c = cv.pinned.empty(n, np.float32, device=pair[0])
    a[:], b[:], c[:] = data((n,), np.float32, 1), data((n,), np.float32, 2), 0
    report = cv.stream(_add(pair[0]), [a, b], [c], device=list(pair), block_bytes=4000,
                       schedule=schedule, zero_copy=False)
    np.testing.assert_array_equal(c, add_reference(a, b))
    if schedule == "static":  # dynamic: a device that starts late may get no run
        assert all(r.blocks > 0 for r in report.devices)
    if all(dev.copies_pinned_of(pair[0]) for dev in pair):
        lanes = {s.lane for s in report.timeline.spans}
        assert "copy-in" in lanes and not lanes & {"stage-in", "stage-out"}, lanes
    del a, b, c


def test_the_supply_deals_runs_in_order_and_static_shares():
    from conveyor.pipeline.supply import Supply

    plan = multi_plan(50)
    dynamic = Supply(plan, 2, "dynamic")
    first, second = dynamic.feed(0), dynamic.feed(1)
    got = [first.get(0), second.get(0), first.get(1), second.get(4), first.get(4)]
    assert [b.index for b in got] == [0, 4, 1, 8, 12]  # runs of 4, to whoever asks first
    assert [b.seq for b in got] == [0, 0, 1, 4, 4]
    static = Supply(plan, 2, "static")
    shares = [static.feed(0), static.feed(1)]
    assert [shares[1].get(k).index for k in range(25)] == list(range(25, 50))
    assert shares[1].get(25) is None and shares[0].get(24).index == 24
    static.stop()
    assert static.feed(0).get(0) is None  # no block is handed out new after a stop


def test_a_kernel_future_is_built_for_each_device(pair):
    a, b = data((20_000,), np.float32, 1), data((20_000,), np.float32, 2)
    c = np.zeros_like(a)
    source = kernel(pair[0], "add").source
    future = pair[0].compile(source, "add_float32", wait=False)
    cv.stream(future, [a, b], [c], device=list(pair), block_bytes=4000)
    np.testing.assert_array_equal(c, add_reference(a, b))


def test_a_failed_build_on_one_device_stops_the_other(pair, monkeypatch):
    def create_queue():
        raise Boom("no queue on the second device")

    monkeypatch.setattr(pair[1], "create_queue", create_queue)
    a, b = data((20_000,), np.float32, 1), data((20_000,), np.float32, 2)
    with pytest.raises(Boom):
        cv.stream(_add(pair[0]), [a, b], [np.float32], device=list(pair), block_bytes=4000,
                  zero_copy=False)


def test_a_stopped_supply_still_gives_what_either_caller_had():
    from conveyor.pipeline.supply import Supply

    supply = Supply(multi_plan(50), 2, "static")
    feed = supply.feed(0)
    assert feed.get(3).index == 3  # the staging thread ran ahead to block 3
    supply.stop()
    assert [feed.get(k).index for k in range(4)] == [0, 1, 2, 3]  # the engine gets them too
    assert feed.get(4) is None  # nothing new after the stop


def test_staging_threads_are_shared_between_the_devices(pair, monkeypatch):
    from conveyor.pipeline import engine as engine_module

    made = []
    real = engine_module.Stager

    def counting(workers=None, *args, **kwargs):
        made.append(workers)
        return real(workers, *args, **kwargs)

    monkeypatch.setattr(engine_module, "Stager", counting)
    a, b = data((20_000,), np.float32, 1), data((20_000,), np.float32, 2)
    cv.stream(_add(pair[0]), [a, b], [np.float32], device=list(pair), block_bytes=4000,
              zero_copy=False, workers=5)
    assert made == [2, 2]  # 5 threads in all, split evenly (at least one each)


CHAIN_SOURCE = cv.portable("""
__kernel void scale(__global const float *x, __global float *t, float a, ulong offset,
                    ulong n) {
    ulong i = get_global_id(0);
    if (i < n) t[i] = a * x[i] + (float)(offset + i);
}
__kernel void square(__global const float *t, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = t[i] * t[i];
}
""")


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_chain_runs_on_two_devices_exact_and_its_sum_equals_one_devices(pair, schedule):
    # A chain on several devices was not handled (stream_several took it for a callable).
    first = pair[0]
    scale, square = (first.compile(CHAIN_SOURCE, name) for name in ("scale", "square"))
    chain = cv.chain(cv.link(scale, reads="in0", writes="t", args=(0.5,)),
                     cv.link(square, reads="t", writes="out0"), temps={"t": np.float32})
    x = data((50_001,), np.float32, 4)
    y = np.zeros_like(x)
    report = cv.stream(chain, [x], [y], device=list(pair), block_bytes=4000,
                       schedule=schedule)
    t = np.float32(0.5) * x + np.arange(x.size, dtype=np.float32)
    np.testing.assert_array_equal(y, t * t)
    if schedule == "static":  # dynamic: a device that starts late may get no run
        assert all(r.blocks > 0 for r in report.devices)
    summed = cv.chain(cv.link(scale, reads="in0", writes="t", args=(0.5,)),
                      cv.link(square, reads="t", writes="reduce"), temps={"t": np.float32})
    one = cv.stream(summed, [x], reduce="sum", device=first, block_bytes=4000).result
    two = cv.stream(summed, [x], reduce="sum", device=list(pair), block_bytes=4000,
                    schedule=schedule).result
    assert one.tobytes() == two.tobytes()


def test_image_inputs_on_several_devices_are_refused(pair):
    x = np.zeros((40, 10), np.float32)
    with pytest.raises(InputError, match="image inputs .* stream on one device"):
        cv.stream(_add(pair[0]), [cv.image(x), x], [np.zeros_like(x)], device=list(pair))


def test_keep_pinned_on_several_devices_is_refused(pair):
    a, b = data((5000,), np.float32, 1), data((5000,), np.float32, 2)
    c = np.zeros_like(a)
    with pytest.raises(InputError, match="keep_pinned=True registers the arrays with one"):
        cv.stream(_add(pair[0]), [a, b], [c], device=list(pair), keep_pinned=True)
    assert (c == 0).all()


def test_a_chain_of_kernel_futures_runs_on_two_devices(pair):
    # A KernelFuture link was passed through as is and refused ("built for opencl:0:0, the
    # stream runs on opencl:0:0") on the second device.
    futures = [pair[0].compile(CHAIN_SOURCE, name, wait=False) for name in ("scale", "square")]
    chain = cv.chain(cv.link(futures[0], reads="in0", writes="t", args=(2.0,)),
                     cv.link(futures[1], reads="t", writes="out0"), temps={"t": np.float32})
    x = data((20_001,), np.float32, 5)
    y = np.zeros_like(x)
    cv.stream(chain, [x], [y], device=list(pair), block_bytes=4000)
    t = np.float32(2.0) * x + np.arange(x.size, dtype=np.float32)
    np.testing.assert_array_equal(y, t * t)


def test_a_device_that_cannot_build_is_named_by_its_spec(pair, monkeypatch):
    # device="opencl:all" took in a device that builds nothing; its CompileError named only
    # the device's long name, with no spec and no way out.
    def refuse(*args, **kwargs):
        raise cv.CompileError("build failed: unknown target CPU 'generic'")

    monkeypatch.setattr(pair[1], "compile", refuse)
    x = data((5000,), np.float32, 1)
    with pytest.raises(cv.CompileError) as info:
        cv.stream(_add(pair[0]), [x, x], [np.zeros_like(x)], device=list(pair))
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert pair[1].spec in notes and "name the devices to use" in notes


def test_the_aggregate_ceiling_closes_every_queue_after_a_failure(pair, monkeypatch):
    """A queue whose finish() fails (its real finish wrapped): every queue is still closed,
    every buffer given back, and the first error is the one raised."""
    from conveyor.errors import BackendError
    from conveyor.measure_all import aggregate_bandwidth

    made: list = []
    for index, dev in enumerate(pair):
        real_queue = dev.create_queue

        def create_queue(real_queue=real_queue, failing=index == 0):
            queue = real_queue()
            made.append(queue)
            if failing:
                real_finish = queue.finish

                def finish():
                    real_finish()
                    raise BackendError("injected", call="clFinish")

                queue.finish = finish
            return queue

        monkeypatch.setattr(dev, "create_queue", create_queue)
    with pytest.raises(BackendError, match="injected"):
        aggregate_bandwidth(list(pair), nbytes=1 << 20, repeats=1, copies=2)
    assert len(made) == 2
    assert all(getattr(q, "cl_queue", getattr(q, "stream", None)) is None for q in made)
