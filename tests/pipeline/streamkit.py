"""Helpers for the engine's tests: real kernels (compiled once per device and process),
reference data, and the checks every failure test makes (pools at zero, no staging thread)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import conveyor as cv
from conveyor.kernels.portable import portable

C_TYPES = {
    "float32": "float", "int32": "int", "uint8": "uchar", "float64": "double", "int64": "long",
}  # fmt: skip
DTYPES = [np.dtype(name) for name in C_TYPES]

_TEMPLATE = """
__kernel void add_{name}(__global const {t} *a, __global const {t} *b, __global {t} *c,
                         ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i] + ({t})((offset + i) % 7);
}}
__kernel void sten_{name}(__global const {t} *x, __global {t} *y, ulong cols, ulong halo,
                          ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) {{
        {t} s = x[i];
        for (ulong k = 1; k <= 2 * halo; k++) s += x[i + k * cols];
        y[i] = s;
    }}
}}
__kernel void ident_{name}(__global const {t} *x, __global {t} *r, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) r[i] = x[i];
}}
__kernel void scale_{name}(__global const {t} *x, __global {t} *y, {t} k,
                           ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * k;
}}
"""

_cache: dict[tuple[str, str, str], cv.Kernel] = {}
_unbuildable: dict[str, str] = {}


def kernel(device: cv.Device, kind: str, dtype: np.dtype | type = np.float32) -> cv.Kernel:
    """Kernel ``kind`` ("add", "sten", "ident", "scale") for ``dtype``, built once per device.

    add(a, b, c):            c = a + b + (global element index % 7)
    sten(x, y, cols, halo):  y[i] = sum of x[i + k * cols] for k in 0..2*halo
    ident(x, r):             r = x (per-element values for reductions)
    scale(x, y, k):          y = x * k
    """
    name = np.dtype(dtype).name
    key = (device.spec, kind, name)
    if device.spec in _unbuildable:
        pytest.skip(_unbuildable[device.spec])
    # Another context on the same device has the same spec: build again for it.
    if key not in _cache or _cache[key].device is not device:
        source = portable(_TEMPLATE.format(name=name, t=C_TYPES[name]))
        try:
            _cache[key] = device.compile(source, f"{kind}_{name}")
        except cv.CompileError as exc:
            # An environment fault (e.g. a PoCL whose LLVM rejects the host CPU), not the
            # engine's: say so once per device and skip its kernel tests.
            first = str(exc).splitlines()[1:2] or [str(exc)]
            _unbuildable[device.spec] = f"{device.spec} cannot build kernels: {first[0]}"
            pytest.skip(_unbuildable[device.spec])
    return _cache[key]


def image_values(shape: tuple[int, ...], dtype: np.dtype | type, seed: int = 0) -> np.ndarray:
    """Pixel values of ``dtype``: over the whole integer range, or eighths in [-64, 64) for
    floats (exact in half precision too)."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return (rng.integers(-512, 512, shape) / 8).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, shape, endpoint=True, dtype=dt)


def data(shape: tuple[int, ...], dtype: np.dtype | type, seed: int) -> np.ndarray:
    """Random values of ``dtype`` small enough that sums of a few never overflow."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    if dt.kind == "u":
        return rng.integers(0, 256, shape).astype(dt)
    return rng.integers(-1000, 1000, shape).astype(dt)


def add_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What the add kernel computes, in NumPy (same operations, same order)."""
    index = (np.arange(a.size, dtype=np.int64) % 7).astype(a.dtype).reshape(a.shape)
    return a + b + index


def stencil_reference(x: np.ndarray, halo: int) -> np.ndarray:
    """What the sten kernel computes: rows past either end repeat the edge row."""
    pad = [(halo, halo)] + [(0, 0)] * (x.ndim - 1)
    p = np.pad(x, pad, mode="edge")
    rows = x.shape[0]
    out = p[0:rows].copy()
    for k in range(1, 2 * halo + 1):
        out = out + p[k : k + rows]
    return out


def images_made(monkeypatch: pytest.MonkeyPatch, device: cv.Device,
                fail_at: int | None = None) -> list:
    """Record every image ``device`` allocates from now on; the ``fail_at``-th allocation
    (counting from 0) raises OutOfMemoryError instead."""
    from conveyor.errors import OutOfMemoryError

    made: list = []
    real = device.alloc_image

    def alloc(*args, **kw):
        if fail_at is not None and len(made) == fail_at:
            raise OutOfMemoryError(1 << 20, 0, None, where="device image")
        made.append(real(*args, **kw))
        return made[-1]

    monkeypatch.setattr(device, "alloc_image", alloc)
    return made


def fail_image_copy(monkeypatch: pytest.MonkeyPatch, device: cv.Device, at: int,
                    call: str) -> None:
    """The ``at``-th copy into an image (counting from 1) on any queue ``device`` makes from
    now on raises BackendError("injected", call=``call``)."""
    from conveyor.errors import BackendError

    real_queue = device.create_queue
    copies: list[int] = []

    def create_queue():
        queue = real_queue()
        real_copy = queue.copy_to_image

        def copy_to_image(*args, **kw):
            copies.append(1)
            if len(copies) == at:
                raise BackendError("injected", call=call)
            return real_copy(*args, **kw)

        queue.copy_to_image = copy_to_image
        return queue

    monkeypatch.setattr(device, "create_queue", create_queue)


def stage_threads() -> list[threading.Thread]:
    """Live staging worker threads."""
    return [t for t in threading.enumerate() if t.name.startswith("conveyor-stage")]


def in_use(device: cv.Device) -> tuple[int, int]:
    """Bytes in use in the device pool and the pinned pool."""
    return (device.memory_pool.stats().in_use_bytes, device.pinned_pool.stats().in_use_bytes)


def to_host(x, queue) -> np.ndarray:
    """A compute callable's device array as a NumPy array (after the queue's work on it)."""
    if hasattr(x, "get"):  # a PyOpenCL array, bound to the compute queue
        return x.get()
    import cupy

    with _cupy_stream(queue):
        return cupy.asnumpy(cupy.asarray(x), stream=cupy.cuda.get_current_stream())


def store(y, values: np.ndarray, queue) -> None:
    """Write ``values`` into a compute callable's device array, on its queue."""
    if hasattr(y, "set"):
        y.set(np.ascontiguousarray(values, dtype=y.dtype))
        return
    import cupy

    with _cupy_stream(queue):
        cupy.asarray(y).set(np.ascontiguousarray(values, dtype=y.dtype))


def _cupy_stream(queue):
    """CuPy's view of conveyor's CUDA stream (the stream protocol where CuPy has it)."""
    import cupy

    if hasattr(cupy.cuda.Stream, "from_external"):
        return cupy.cuda.Stream.from_external(queue)
    return cupy.cuda.ExternalStream(int(queue.handle))


def record_paths(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], list[str]]]:
    """From now on (until ``monkeypatch`` undoes it), each stream's path classes: one
    ``([input path classes], [output path classes])`` per stream, appended as it chooses."""
    from conveyor.pipeline import paths as paths_module

    chosen: list[tuple[list[str], list[str]]] = []
    real = paths_module.choose

    def choose(*args, **kwargs):
        ins, outs = real(*args, **kwargs)
        chosen.append(([type(p).__name__ for p in ins], [type(p).__name__ for p in outs]))
        return ins, outs

    monkeypatch.setattr(paths_module, "choose", choose)
    return chosen
