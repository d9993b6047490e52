"""Host memory and threads near the device they serve, on hosts with several NUMA nodes.

On a host with two CPU sockets, each GPU hangs off one socket's PCIe root. Pinned staging
memory on the other socket's node makes every DMA cross the socket link, and staging threads
there copy into remote memory; both cost bandwidth that a stream over several GPUs needs. So
each device has a :class:`Place` (``device.host_place``): the node its PCIe slot is attached
to and the CPUs of that node, read where NVML reads them (sysfs:
``/sys/bus/pci/devices/<address>/numa_node`` and ``local_cpulist``). Then

- pinned blocks of the device's pools are allocated while the allocating thread prefers the
  node (``set_mempolicy(MPOL_PREFERRED)``) and runs on its CPUs, and memory conveyor maps
  itself (memory/hostmem.py) is bound to prefer the node before its pages are faulted
  (``mbind``), whichever thread faults them;
- the stream's staging workers run on the node's CPUs and prefer its memory.

"Prefer" is not "bind": a node that runs out of memory lends from another instead of failing.
Where the host has one node (most single-socket machines, and the 2 x H200 host measured
here), the device is host-unified (a CPU device), its PCIe address is unknown, the process may
not run on any of the node's CPUs, or ``CONVEYOR_NUMA=off``, the place is None and nothing is
done. Arrays the caller made are not moved; pages of a fresh output are first written by the
staging threads, so they land on their node. Memory policy calls exist on Linux x86-64 and
arm64, and are left alone in a process started under a policy (``numactl --membind``); there
and elsewhere only the CPUs are set (the kernel's default policy then allocates on the node
of the faulting CPU anyway).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from conveyor import config

if TYPE_CHECKING:
    from conveyor.backends.base import Device

T = TypeVar("T")

MPOL_DEFAULT = 0
MPOL_PREFERRED = 1
MPOL_F_NODE = 1
MPOL_F_ADDR = 2
#: Bits in the node masks passed to the kernel (more nodes than any host has).
MASK_BITS = 1024
_LONG_BITS = ctypes.sizeof(ctypes.c_ulong) * 8
_MaskType = ctypes.c_ulong * (MASK_BITS // _LONG_BITS)
Mask = ctypes.Array[ctypes.c_ulong]
#: (mbind, set_mempolicy, get_mempolicy) system call numbers per machine.
_SYSCALLS = {"x86_64": (237, 238, 239), "aarch64": (235, 237, 236)}
_local = threading.local()
#: The CPUs this process may run on, read when conveyor first needs them (a thread the caller
#: pins later, e.g. by an OpenMP runtime, does not narrow every device's place).
_PROCESS_CPUS = frozenset(os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity")
                          else range(os.cpu_count() or 1))


@dataclass(frozen=True)
class Place:
    """A host NUMA node and the CPUs of it that this process may run on (checked here: a
    bad place would otherwise fail inside a staging pool's thread start)."""

    node: int
    cpus: frozenset[int]

    def __post_init__(self) -> None:
        from conveyor.errors import InputError

        cpus = self.cpus
        if (isinstance(self.node, bool) or not isinstance(self.node, int)
                or not 0 <= self.node < MASK_BITS):
            raise InputError(f"Place node={self.node!r}: use a node number from 0 to "
                             f"{MASK_BITS - 1}")
        if (not isinstance(cpus, set | frozenset) or not cpus or any(
                isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < 2**20
                for c in cpus)):
            raise InputError(f"Place cpus={cpus!r}: use a non-empty set of CPU numbers")
        object.__setattr__(self, "cpus", frozenset(cpus))

    def __str__(self) -> str:
        return f"node {self.node} (CPUs {format_cpulist(self.cpus)})"


def parse_cpulist(text: str) -> frozenset[int]:
    """The CPUs of a sysfs list such as ``"0-3,8-11"`` (empty text: none)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return frozenset(cpus)


def format_cpulist(cpus: frozenset[int] | set[int]) -> str:
    """The sysfs form of a set of CPUs: runs joined by commas, ``"0-3,8"``."""
    runs: list[str] = []
    ordered = sorted(cpus)
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            low, high = ordered[start], ordered[i - 1]
            runs.append(str(low) if low == high else f"{low}-{high}")
            start = i
    return ",".join(runs)


def normalize_pci(address: str) -> str | None:
    """``domain:bus:device.function`` in sysfs's lower-case form (``"0000:17:00.0"``) from the
    forms drivers report (``"00000000:17:00.0"``, upper case, no domain); None if unreadable."""
    parts = address.strip().strip("\x00").split(":")
    try:
        if len(parts) == 2:
            parts = ["0", *parts]
        domain, bus, rest = parts
        slot, _, function = rest.partition(".")
        numbers = int(domain, 16), int(bus, 16), int(slot, 16), int(function or "0", 16)
    except ValueError:
        return None
    if min(numbers) < 0:  # "-7b": a signed byte read somewhere
        return None
    return "{:04x}:{:02x}:{:02x}.{:x}".format(*numbers)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def place_of_pci(address: str | None, sysfs: Path = Path("/sys")) -> Place | None:
    """The Place of the PCI device at ``address``, or None: unknown address, one node on the
    host, no node reported (``numa_node`` is -1), or none of the node's CPUs allowed to this
    process (its CPU affinity or cgroup)."""
    pci = normalize_pci(address) if address else None
    if pci is None:
        return None
    nodes = parse_cpulist(_read(sysfs / "devices/system/node/online") or "")
    if len(nodes) < 2:
        return None
    device = sysfs / "bus/pci/devices" / pci
    try:
        node = int((_read(device / "numa_node") or "-1").strip())
    except ValueError:
        return None
    if node < 0 or node not in nodes:
        return None
    local = _read(device / "local_cpulist")
    if local is None:
        local = _read(sysfs / f"devices/system/node/node{node}/cpulist") or ""
    cpus = parse_cpulist(local) & _PROCESS_CPUS
    return Place(node, cpus) if cpus else None


def place_for(device: Device) -> Place | None:
    """Where ``device``'s host memory and staging threads belong (``device.host_place`` reads
    it once): None with ``CONVEYOR_NUMA=off``, for a device that shares the host's memory, or
    where :func:`place_of_pci` finds nothing to do."""
    if config.numa_mode() == "off" or device.host_unified:
        return None
    return place_of_pci(device.pci_address())


# -- the kernel's calls ------------------------------------------------------------------------
@functools.cache
def _libc() -> ctypes.CDLL | None:
    """libc for the memory-policy calls, or None: another machine, a 32-bit Python (the
    numbers are the 64-bit kernel's), or a policy the process was started with (``numactl
    --membind``, ``--interleave``: kept, only CPUs are placed)."""
    if platform.machine() not in _SYSCALLS or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
    except (OSError, AttributeError):
        return None
    # The first call in the process comes before any policy of conveyor's is set.
    mode = ctypes.c_int(-1)
    get_mempolicy = _SYSCALLS[platform.machine()][2]
    if libc.syscall(ctypes.c_long(get_mempolicy), ctypes.byref(mode), None, ctypes.c_ulong(0),
                    None, ctypes.c_ulong(0)) != 0 or mode.value != MPOL_DEFAULT:
        return None
    return libc


def _mask(node: int) -> Mask:
    mask = _MaskType()
    mask[node // _LONG_BITS] = 1 << (node % _LONG_BITS)
    return mask


def _syscall(which: int, *args: object) -> int:
    """Make memory-policy call ``which`` (0 mbind, 1 set_mempolicy, 2 get_mempolicy); 0, or
    the errno (ENOSYS where this machine has no such call)."""
    libc = _libc()
    if libc is None:
        return 38  # ENOSYS
    number = _SYSCALLS[platform.machine()][which]
    if libc.syscall(ctypes.c_long(number), *args) == 0:
        return 0
    return ctypes.get_errno()


def bind_range(address: int, nbytes: int, node: int) -> int:
    """Make the pages of [address, address + nbytes) (page aligned, not yet faulted) prefer
    ``node``: ``mbind(MPOL_PREFERRED)``. 0, or the errno (nothing is changed then)."""
    mask = _mask(node)
    return _syscall(0, ctypes.c_void_p(address), ctypes.c_ulong(nbytes),
                    ctypes.c_int(MPOL_PREFERRED), ctypes.byref(mask),
                    ctypes.c_ulong(MASK_BITS + 1), ctypes.c_uint(0))


def _set_policy(mode: int, mask: Mask | None) -> int:
    pointer = ctypes.byref(mask) if mask is not None else None
    return _syscall(1, ctypes.c_int(mode), pointer,
                    ctypes.c_ulong(MASK_BITS + 1 if mask is not None else 0))


def thread_policy() -> tuple[int, Mask] | None:
    """The calling thread's memory policy (mode, node mask), or None where it cannot be read."""
    mode, mask = ctypes.c_int(0), _MaskType()
    if _syscall(2, ctypes.byref(mode), ctypes.byref(mask), ctypes.c_ulong(MASK_BITS + 1),
                None, ctypes.c_ulong(0)):
        return None
    return mode.value, mask


def policy_of(address: int) -> int | None:
    """The memory policy mode of the mapping at ``address`` (``MPOL_PREFERRED`` after
    :func:`bind_range`, ``MPOL_DEFAULT`` where none was set), or None where it cannot be read."""
    mode = ctypes.c_int(-1)
    if _syscall(2, ctypes.byref(mode), None, ctypes.c_ulong(0), ctypes.c_void_p(address),
                ctypes.c_ulong(MPOL_F_ADDR)):
        return None
    return mode.value


def node_of(address: int) -> int | None:
    """The node that holds the page at ``address`` (faulting it in if need be), or None where
    it cannot be read."""
    node = ctypes.c_int(-1)
    if _syscall(2, ctypes.byref(node), None, ctypes.c_ulong(0), ctypes.c_void_p(address),
                ctypes.c_ulong(MPOL_F_NODE | MPOL_F_ADDR)):
        return None
    return node.value


# -- using a place ---------------------------------------------------------------------------
def bind_thread(place: Place | None) -> None:
    """Run the calling thread on ``place``'s CPUs and have it prefer the node's memory (a
    thread pool's ``initializer``: it never raises, as a pool whose initializer raises is
    broken). Nothing for None; a refusal leaves the thread as it was."""
    if place is None:
        return
    with contextlib.suppress(Exception):
        os.sched_setaffinity(0, place.cpus)  # 0: the calling thread, on Linux
    with contextlib.suppress(Exception):
        _set_policy(MPOL_PREFERRED, _mask(place.node))


def unbind_thread() -> None:
    """Give the calling thread the process's CPUs and the default memory policy: the
    initializer of conveyor's shared thread pools, whose threads may be started by a thread
    inside :func:`on_node` and would inherit its place for good."""
    with contextlib.suppress(Exception):
        os.sched_setaffinity(0, _PROCESS_CPUS)
    with contextlib.suppress(Exception):
        _set_policy(MPOL_DEFAULT, None)


def current() -> Place | None:
    """The Place the calling thread is allocating for (inside :func:`on_node`), or None."""
    return getattr(_local, "place", None)


@contextlib.contextmanager
def on_node(place: Place | None) -> Iterator[None]:
    """Within: the calling thread runs on ``place``'s CPUs and prefers its node, and memory
    that conveyor maps is bound to the node (:func:`current`); afterwards it is as before."""
    if place is None:
        yield
        return
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    policy = thread_policy()
    outer = current()
    bind_thread(place)
    _local.place = place
    try:
        yield
    finally:
        _local.place = outer
        if cpus is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, cpus)
        if policy is not None:
            mode, mask = policy
            _set_policy(mode, mask if mode != MPOL_DEFAULT else None)


def allocate_near(device: Device, allocate: Callable[[int], T], nbytes: int) -> T:
    """``allocate(nbytes)`` on ``device``'s node (:func:`on_node` of ``device.host_place``)."""
    with on_node(device.host_place):
        return allocate(nbytes)
