"""Device discovery: ``devices()`` lists every usable device, ``device(spec)`` picks one.

Backends load lazily: importing conveyor imports neither PyOpenCL nor cuda.core, and a backend
is loaded and its devices found only when a call needs that backend: ``device("cuda:0")`` never
starts OpenCL (whose drivers can take a second to list their platforms), ``device("opencl:0:0")``
never starts CUDA, and the default (or ``"gpu"``) stops at CUDA when CUDA has a GPU, since one
always ranks first. Each backend's devices are found once per process and kept, so every caller
shares one Device (and its pools) per device.

Spec strings: ``"cuda"``, ``"cuda:N"``, ``"opencl"`` (best OpenCL device), ``"opencl:P:D"``
(platform P, device D), ``"gpu"`` (best GPU of any backend), ``"cpu"`` (first CPU device).
``select(spec)`` also takes the specs of several devices: ``"cuda:all"``, ``"opencl:all"``,
``"opencl:gpu:all"``, ``"gpu:all"``, ``"cpu:all"``, ``"all"``, or a comma list of specs.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Sequence

from conveyor import config
from conveyor.backends.base import Device
from conveyor.errors import InputError

_lock = threading.Lock()
#: Each backend's devices, found once (a backend absent here has not been asked for yet).
_found: dict[str, list[Device]] = {}
BACKENDS = ("cuda", "opencl")


def _cuda_available() -> bool:
    try:
        return importlib.util.find_spec("cuda.core") is not None
    except (ImportError, ValueError):
        return False


def _discover(backend: str) -> list[Device]:
    if backend == "cuda":
        if not _cuda_available():
            return []
        from conveyor.backends import cuda

        return list[Device](cuda.discover())
    from conveyor.backends import opencl

    return list[Device](opencl.discover())


def backend_devices(backend: str) -> list[Device]:
    """The devices of one backend (``"cuda"`` or ``"opencl"``), found on first call; the
    other backend is not loaded."""
    if backend not in BACKENDS:
        raise InputError(f"backend {backend!r}: conveyor has {', '.join(BACKENDS)}")
    with _lock:
        if backend not in _found:
            _found[backend] = _discover(backend)
        return list(_found[backend])


def devices() -> list[Device]:
    """Every usable device of every backend: CUDA first, then OpenCL in platform order."""
    return [dev for backend in BACKENDS for dev in backend_devices(backend)]


def _backends_named(spec: str) -> tuple[str, ...]:
    """The backends a (lower-case) spec can match: the one it names, else OpenCL for the
    CPU kind (CUDA has no CPU devices), else all."""
    head = spec.split(":", 1)[0]
    if head in BACKENDS:
        return (head,)
    if head == "cpu":
        return ("opencl",)
    return BACKENDS


def _rank(dev: Device) -> tuple[int, int]:
    kind_rank = {"gpu": 0, "other": 1, "cpu": 2}[dev.kind]
    backend_rank = 0 if dev.backend == "cuda" else 1
    return (kind_rank, backend_rank)


def device(spec: str | Device | None = None, *, warm_up: bool = True) -> Device:
    """The device ``spec`` names; by default ``CONVEYOR_DEVICE``, else the best one:
    a CUDA GPU, else an OpenCL GPU, else a CPU device (PoCL).

    A GPU starts getting ready for a first stream on a thread (``Device.warm_up``,
    memory/warmup.py) while the caller goes on, unless ``warm_up`` is False (what conveyor's
    own calls pass: ``cv.stream(device=None)`` streams at once, leaving the warm-up nothing to
    overlap). Raises InputError for a spec that matches nothing, naming the devices that exist,
    and for anything but a string, a Device (returned as it is) or None.
    """
    if isinstance(spec, Device):  # already a device: as cv.stream(device=...) takes one
        chosen = spec
    elif spec is not None and not isinstance(spec, str):
        raise InputError(f"cv.device({spec!r}): pass a spec string like 'cuda:0', "
                         f"'opencl:0:0' or 'gpu', or None for the default (cv.devices() "
                         f"lists them)")
    else:
        chosen = _device(spec)
    if config.flag("warm_up", warm_up):
        chosen.warm_up()
    return chosen


def _device(spec: str | None) -> Device:
    from_env = spec is None
    if spec is None:
        spec = config.default_device_spec()
    elif "," in spec or spec.strip().lower().endswith(":all"):
        raise InputError(f"{spec!r} names several devices, and this call takes one device: "
                         f"name one (conveyor devices lists them); cv.stream(device=...) and "
                         f"conveyor map/reduce --device take several")
    # The pools read CONVEYOR_POOL_KEEP when a stream first needs them, mid-stream, the
    # warm-up CONVEYOR_WARMUP on its thread, and the rest only on the paths that use them (a
    # malformed CONVEYOR_PREFAULT went unseen on a zero-copy device): refused here, first.
    config.check_all()
    if spec is None or spec.strip().lower() == "gpu":
        # A CUDA GPU ranks first: when CUDA has one, OpenCL need not be started.
        cuda_gpus = [d for d in backend_devices("cuda") if d.kind == "gpu"]
        if cuda_gpus:
            return cuda_gpus[0]
    text = None if spec is None else spec.strip().lower()
    if text is not None:
        candidates = [d for b in _backends_named(text) for d in backend_devices(b)]
        chosen = _match(text, candidates)
        if chosen is not None:
            return chosen
    found = devices()
    if not found:
        from conveyor.backends.diagnose import hidden_devices

        # A setting that hides installed devices is what to change, not an install.
        causes = "; ".join(hidden_devices()) or (
            "install pocl-binary-distribution for the CPU device, or a GPU driver with "
            "OpenCL or CUDA")
        raise InputError(f"no compute device found: {causes}")
    if text is None:
        return min(found, key=_rank)
    from conveyor.backends.diagnose import problems

    listing = "; ".join(f"{d.spec} ({d.name}, {d.kind})" for d in found)
    hints = "".join(f"\n{problem}" for problem in problems())
    given = f"{config.DEVICE_VAR}={spec!r} matches no device" if from_env else \
        f"no device matches {spec!r}"
    fix = f" (unset {config.DEVICE_VAR} or name a device)" if from_env else ""
    raise InputError(f"{given}{fix}; devices here: {listing}{hints}")


def select(spec: str | Device | Sequence[str | Device], *, warm_up: bool = True
           ) -> list[Device]:
    """The devices a stream over several runs on: a Device, a spec, a spec ending in
    ``:all`` (every device of that backend and/or kind: ``cuda:all``, ``opencl:gpu:all``,
    ``gpu:all``, ``all``), a comma list of specs, or a list of any of these. InputError when
    a spec matches nothing, or an ``:all`` matches no device. ``warm_up``: as for
    :func:`device`, for each device a spec names."""
    if isinstance(spec, Device):
        return [spec]
    if not isinstance(spec, str):
        if not isinstance(spec, list | tuple):
            raise InputError(f"device={spec!r}: pass a Device, a spec string like 'cuda:0', "
                             f"'opencl:0:0' or 'cuda:all', or a list of them")
        if not spec:
            raise InputError(f"device={spec!r} names no device: pass one or more Devices or "
                             f"specs, or leave device= out for the default")
        return [dev for item in spec for dev in select(item, warm_up=warm_up)]
    if "," in spec:
        parts = [part for part in spec.split(",") if part.strip()]
        if not parts:  # "," alone: an IndexError deep in the stream, a traceback in the CLI
            raise InputError(f"device={spec!r} names no device: give specs between the "
                             f"commas ('cuda:0,cuda:1'), or leave device= out for the default")
        return [dev for part in parts for dev in select(part, warm_up=warm_up)]
    text = spec.strip().lower()
    if text != "all" and not text.endswith(":all"):
        return [device(spec, warm_up=warm_up)]
    found = [d for b in _backends_named(text) for d in backend_devices(b)]
    for part in text.split(":")[:-1]:
        if part in ("cuda", "opencl"):
            found = [d for d in found if d.backend == part]
        elif part in ("gpu", "cpu", "other"):
            found = [d for d in found if d.kind == part]
        else:
            raise InputError(f"device {spec!r}: before ':all' name a backend (cuda, opencl) "
                             f"and/or a kind (gpu, cpu), e.g. 'cuda:all', 'opencl:gpu:all'")
    if not found:
        listing = "; ".join(f"{d.spec} ({d.kind})" for d in devices()) or "none"
        raise InputError(f"no device matches {spec!r}; devices here: {listing}")
    config.warmup_bytes()
    warm_up = config.flag("warm_up", warm_up)
    for dev in found:
        if warm_up:
            dev.warm_up()
    return found


def _match(spec: str, found: list[Device]) -> Device | None:
    if spec in ("gpu", "cpu"):
        of_kind = [d for d in found if d.kind == spec]
        return min(of_kind, key=_rank) if of_kind else None
    if spec in ("cuda", "opencl"):
        of_backend = [d for d in found if d.backend == spec]
        return min(of_backend, key=_rank) if of_backend else None
    for dev in found:
        if dev.spec == spec:
            return dev
    if spec.startswith("opencl:") and spec.count(":") == 1:
        platform = spec + ":"
        matching = [d for d in found if d.spec.startswith(platform)]
        return min(matching, key=_rank) if matching else None
    return None


__all__ = ["Device", "backend_devices", "device", "devices", "select"]
