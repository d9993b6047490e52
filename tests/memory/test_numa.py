"""Host memory and threads on a device's NUMA node (memory/numa.py): reading the topology
from a sysfs tree, and the real affinity and memory-policy calls on this host.

This machine has one node, so ``place_of_pci`` on the real /sys finds nothing to do; the
topology cases read a sysfs tree written under tmp_path (the files the kernel has there).
The calls that place threads and memory run for real, on node 0 and on a subset of the CPUs
this process may use.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import conveyor as cv
from conveyor.errors import InputError
from conveyor.memory import hostmem, numa

ALLOWED = frozenset(os.sched_getaffinity(0))
ONE_CPU = frozenset({min(ALLOWED)})
PCI = "0000:17:00.0"
#: With one CPU a thread placed on "one of them" is where it was: such a test proves nothing.
two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="this process may run on one CPU only")


def _sysfs(root: Path, *, online: str = "0-1", node: str = "1", local: str | None = None,
           node_cpus: dict[int, str] | None = None) -> Path:
    """A sysfs tree with the files place_of_pci reads, for one PCI device at PCI."""
    (root / "devices/system/node").mkdir(parents=True)
    (root / "devices/system/node/online").write_text(online + "\n")
    for index, cpus in (node_cpus or {}).items():
        (root / f"devices/system/node/node{index}").mkdir()
        (root / f"devices/system/node/node{index}/cpulist").write_text(cpus + "\n")
    device = root / "bus/pci/devices" / PCI
    device.mkdir(parents=True)
    (device / "numa_node").write_text(node + "\n")
    if local is not None:
        (device / "local_cpulist").write_text(local + "\n")
    return root


def test_cpu_lists_read_and_write_the_sysfs_form():
    assert numa.parse_cpulist("0-3,8-11\n") == frozenset({0, 1, 2, 3, 8, 9, 10, 11})
    assert numa.parse_cpulist("5") == frozenset({5})
    assert numa.parse_cpulist("\n") == frozenset()
    assert numa.format_cpulist({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert numa.format_cpulist(numa.parse_cpulist("0-63,128-191")) == "0-63,128-191"


@pytest.mark.parametrize("given, expected", [
    ("0000:17:00.0", "0000:17:00.0"),
    ("00000000:AB:1F.3", "0000:ab:1f.3"),  # NVML's eight-digit domain, upper case
    ("17:00.0", "0000:17:00.0"),  # no domain
    ("0001:c1:00.0\x00\x00", "0001:c1:00.0"),  # a C string's padding
    ("not an address", None),
    ("0:1:2:3", None),
    ("zz:00.0", None),
    ("0000:-7b:00.0", None),  # a signed byte read as negative
])
def test_pci_addresses_are_read_in_every_form_drivers_give(given, expected):
    assert numa.normalize_pci(given) == expected


def test_the_node_and_its_cpus_of_a_device_on_a_two_node_host(tmp_path):
    root = _sysfs(tmp_path, local=numa.format_cpulist(ALLOWED))
    assert numa.place_of_pci("00000000:17:00.0", root) == numa.Place(1, ALLOWED)


def test_cpus_this_process_may_not_use_are_left_out(tmp_path):
    outside = max(ALLOWED) + 1000
    root = _sysfs(tmp_path, local=f"{min(ALLOWED)},{outside}")
    assert numa.place_of_pci(PCI, root) == numa.Place(1, ONE_CPU)


def test_without_local_cpulist_the_nodes_own_list_is_read(tmp_path):
    root = _sysfs(tmp_path, node_cpus={1: numa.format_cpulist(ALLOWED)})
    assert numa.place_of_pci(PCI, root) == numa.Place(1, ALLOWED)


@pytest.mark.parametrize("case", ["one node", "no node", "node offline", "no cpus allowed",
                                  "no such device", "unreadable node", "no address"])
def test_nothing_to_do_is_none(tmp_path, case):
    local = numa.format_cpulist(ALLOWED)
    address: str | None = PCI
    if case == "one node":
        root = _sysfs(tmp_path, online="0", node="0", local=local)
    elif case == "no node":  # the kernel writes -1 where firmware gives no node
        root = _sysfs(tmp_path, node="-1", local=local)
    elif case == "node offline":
        root = _sysfs(tmp_path, node="3", local=local)
    elif case == "no cpus allowed":
        root = _sysfs(tmp_path, local=str(max(ALLOWED) + 1000))
    elif case == "no such device":
        root = _sysfs(tmp_path, local=local)
        address = "0000:18:00.0"
    elif case == "unreadable node":
        root = _sysfs(tmp_path, node="garbage", local=local)
    else:
        root, address = _sysfs(tmp_path, local=local), None
    assert numa.place_of_pci(address, root) is None


def test_this_one_node_host_needs_nothing():
    """The real /sys here: one node, so no device of it has a place."""
    nodes = numa.parse_cpulist(Path("/sys/devices/system/node/online").read_text())
    if len(nodes) > 1:
        pytest.skip("this host has several NUMA nodes")
    assert numa.place_of_pci("0000:00:00.0") is None
    for dev in cv.devices():
        assert dev.host_place is None, dev


def test_numa_off_and_cpu_devices_have_no_place(monkeypatch):
    unified = [d for d in cv.devices() if d.host_unified]
    if not unified:
        pytest.skip("no device here shares the host's memory")
    dev = unified[0]
    assert numa.place_for(dev) is None
    monkeypatch.setenv("CONVEYOR_NUMA", "off")
    assert numa.place_for(dev) is None
    monkeypatch.setenv("CONVEYOR_NUMA", "nearest")
    with pytest.raises(InputError, match="CONVEYOR_NUMA='nearest': use one of auto, off"):
        numa.place_for(dev)


@pytest.mark.parametrize("node, cpus", [(-1, {0}), (numa.MASK_BITS, {0}), (True, {0}),
                                        (0, set()), (0, {-1}), (0, {2**40}), (0, [0]),
                                        (0, {"0"})])
def test_a_place_that_cannot_be_used_is_refused_where_it_is_made(node, cpus):
    with pytest.raises(InputError, match="Place (node|cpus)="):
        numa.Place(node, cpus)


def test_a_place_keeps_its_cpus_as_a_frozenset():
    assert numa.Place(0, {0}).cpus == frozenset({0})
    assert hash(numa.Place(0, {0})) == hash(numa.Place(0, frozenset({0})))


def test_host_place_can_be_set_and_refuses_what_is_not_a_place():
    dev = cv.devices()[0]
    saved = dev.host_place
    try:
        dev.host_place = numa.Place(0, ONE_CPU)
        assert dev.host_place == numa.Place(0, ONE_CPU)
        with pytest.raises(InputError, match=r"host_place=\(0, \{0\}\): use a conveyor"):
            dev.host_place = (0, {0})  # type: ignore[assignment]
    finally:
        dev.host_place = saved


@two_cpus
def test_on_node_places_the_thread_and_what_conveyor_maps_then_puts_it_back():
    place = numa.Place(0, ONE_CPU)
    before = os.sched_getaffinity(0)
    policy = numa.thread_policy()
    with numa.on_node(place):
        assert os.sched_getaffinity(0) == ONE_CPU
        assert numa.current() == place
        if policy is not None:  # the memory-policy calls exist here (x86-64, arm64)
            assert numa.thread_policy()[0] == numa.MPOL_PREFERRED
        address = hostmem.map_faulted(4 * 2**20)
        try:
            if policy is not None:
                assert numa.policy_of(address) == numa.MPOL_PREFERRED  # mbind before faulting
                assert numa.node_of(address) == 0
        finally:
            hostmem.unmap(address, 4 * 2**20)
    assert os.sched_getaffinity(0) == before
    assert numa.current() is None
    if policy is not None:
        assert numa.thread_policy()[0] == policy[0]
        outside = hostmem.map_faulted(4 * 2**20)
        try:
            assert numa.policy_of(outside) == numa.MPOL_DEFAULT
        finally:
            hostmem.unmap(outside, 4 * 2**20)


@two_cpus
def test_nested_places_restore_the_outer_one():
    outer, inner = numa.Place(0, ALLOWED), numa.Place(0, ONE_CPU)
    with numa.on_node(outer):
        with numa.on_node(inner):
            assert numa.current() == inner and os.sched_getaffinity(0) == ONE_CPU
        assert numa.current() == outer and os.sched_getaffinity(0) == ALLOWED


def test_the_memory_policy_calls_work_here():
    """Where they exist (Linux x86-64 and arm64, not refused by a sandbox), the thread's
    policy reads back what was set; elsewhere only CPUs are placed."""
    if numa.thread_policy() is None:
        pytest.skip("no memory-policy calls here (machine, sandbox, or a numactl policy)")
    with numa.on_node(numa.Place(0, ALLOWED)):
        mode, mask = numa.thread_policy()
        assert mode == numa.MPOL_PREFERRED and mask[0] & 1
    assert numa.thread_policy()[0] == numa.MPOL_DEFAULT


@two_cpus
def test_fault_threads_started_inside_a_place_do_not_keep_it():
    """conveyor's shared pool of faulting threads may first be started by an allocation on a
    device's node: its threads get the process's CPUs and default policy back."""
    saved = hostmem._pool
    hostmem._pool = None
    try:
        with numa.on_node(numa.Place(0, ONE_CPU)):
            address = hostmem.map_faulted(64 * 2**20)  # starts the pool, from in here
        hostmem.unmap(address, 64 * 2**20)
        seen = set(hostmem._threads().map(
            lambda _: (frozenset(os.sched_getaffinity(0)), (numa.thread_policy() or (0,))[0]),
            range(64)))
        assert seen == {(ALLOWED, numa.MPOL_DEFAULT)}
    finally:
        if hostmem._pool is not None:
            hostmem._pool.shutdown()
        hostmem._pool = saved


def test_bind_thread_never_raises():
    """It is a thread pool's initializer: one that raises breaks the pool."""
    place = numa.Place(0, {max(ALLOWED) + 1000})  # a CPU this process may not use
    errors: list[BaseException] = []
    threading.excepthook, saved = (lambda args: errors.append(args.exc_value)), \
        threading.excepthook
    try:
        thread = threading.Thread(target=numa.bind_thread, args=(place,))
        thread.start()
        thread.join()
    finally:
        threading.excepthook = saved
    assert errors == []


def test_on_node_with_no_place_changes_nothing():
    before = os.sched_getaffinity(0)
    with numa.on_node(None):
        assert numa.current() is None and os.sched_getaffinity(0) == before


@two_cpus
def test_bind_thread_places_only_the_calling_thread():
    seen: list[set[int]] = []

    def bound() -> None:
        numa.bind_thread(numa.Place(0, ONE_CPU))
        seen.append(os.sched_getaffinity(0))

    thread = threading.Thread(target=bound)
    thread.start()
    thread.join()
    assert seen == [ONE_CPU]
    assert os.sched_getaffinity(0) == ALLOWED


@two_cpus
def test_allocate_near_allocates_on_the_devices_place_and_returns_what_it_made():
    dev = cv.devices()[0]
    saved = dev.host_place
    seen: list[tuple[numa.Place | None, set[int]]] = []

    def allocate(nbytes: int) -> bytearray:
        seen.append((numa.current(), os.sched_getaffinity(0)))
        return bytearray(nbytes)

    try:
        dev.host_place = numa.Place(0, ONE_CPU)
        made = numa.allocate_near(dev, allocate, 16)
        dev.host_place = None
        numa.allocate_near(dev, allocate, 16)
    finally:
        dev.host_place = saved
    assert made == bytearray(16)
    assert seen == [(numa.Place(0, ONE_CPU), ONE_CPU), (None, ALLOWED)]


def test_a_gpus_pci_address_names_a_display_controller_in_sysfs(gpu_device):
    """The address the driver reports (CUDA's attributes, NVIDIA's or AMD's OpenCL query) is
    the GPU's own sysfs entry: PCI class 0x03 (display or 3D controller)."""
    address = gpu_device.pci_address()
    assert address is not None, f"{gpu_device.spec} reports no PCI address"
    entry = Path("/sys/bus/pci/devices") / str(numa.normalize_pci(address))
    assert (entry / "class").read_text().startswith("0x03"), (address, entry)
