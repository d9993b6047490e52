"""The four workloads: inputs made cheaply, one portable kernel each, NumPy references and the
checks every run passes before its time counts.

Every kernel is one OpenCL C source wrapped in ``cv.portable``: conveyor compiles it with
``dev.compile``, PyOpenCL with ``cl.Program``, CuPy and PyTorch with ``cupy.RawKernel`` (NVRTC),
so only the data movement differs between systems. Kernels take the block's buffers, then the
scalar arguments, then ``ulong offset, ulong n``. The stencil's input block carries ``halo``
elements before and after (rows past either end repeat the edge element, conveyor's ``halo=``
semantics), so element ``i`` of the block is at ``x[i + 2]``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import conveyor as cv

THREADS = min(16, os.cpu_count() or 1)
PIECE = 2 * 2**20  # elements (8 MiB of float32) per parallel piece
CHUNK = 16 * 2**20  # elements (64 MiB) of random data tiled over the inputs
_pool = ThreadPoolExecutor(THREADS, thread_name_prefix="suite")

MAP = cv.portable("""
__kernel void vadd(__global const float *a, __global const float *b, __global float *c,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}
""")

FILTER = cv.portable("""
__kernel void keep_above(__global const float *x, __global float *y, float t,
                         ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] > t ? x[i] : 0.0f;
}
""")

STENCIL = cv.portable("""
__kernel void smooth5(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);   /* element i of the block is x[i + 2] (halo 2) */
    if (i < n) y[i] = 0.2f * (x[i] + x[i + 1] + x[i + 2] + x[i + 3] + x[i + 4]);
}
""")

BURN = cv.portable("""
__kernel void burn(__global const float *x, __global float *y, ulong iters,
                   ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) {
        float v = x[i];
        for (ulong k = 0; k < iters; k++) v = v * 0.999f + 0.001f;
        y[i] = v;
    }
}
""")

NAMES = ("map", "filter-sum", "stencil", "compute-heavy")


# -- parallel helpers (NumPy releases the GIL in copies and ufuncs) ----------------------------
def pieces(n: int, piece: int = PIECE) -> list[tuple[int, int]]:
    """[start, stop) pieces covering ``range(n)``."""
    return [(s, min(s + piece, n)) for s in range(0, n, piece)]


def pmap(fn: Callable[[int, int], Any], n: int) -> list[Any]:
    """``fn(start, stop)`` over the pieces of ``range(n)`` on the thread pool, in order."""
    return list(_pool.map(lambda p: fn(*p), pieces(n)))


def parallel_copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` (1-D, same length) in parallel pieces."""
    pmap(lambda s, e: np.copyto(dst[s:e], src[s:e]), len(src))


def parallel_fill(dst: np.ndarray, value: float) -> None:
    """Fill (and so touch) every page of ``dst``."""
    pmap(lambda s, e: dst[s:e].fill(value), len(dst))


def tiled_random(n: int, seed: int) -> np.ndarray:
    """n float32 values in [0, 1): one 64 MiB random chunk tiled over the array (rng.random of
    gigabytes takes tens of seconds; this takes a memcpy)."""
    chunk = np.random.default_rng(seed).random(min(n, CHUNK), dtype=np.float32)
    size = len(chunk)
    out = np.empty(n, np.float32)

    def tile(s: int, e: int) -> None:
        at = s % size  # pieces never straddle a chunk boundary: CHUNK is a multiple of PIECE
        np.copyto(out[s:e], chunk[at : at + e - s])

    pmap(tile, n)
    return out


def halo_pieces(total: int, s: int, e: int, h: int) -> tuple[int, int, int, int, int]:
    """How block [s, e) with ``h`` halo elements is laid out on the device.

    Returns (lo, hi, at, front, back): copy ``x[lo:hi]`` to device element ``at``; the first
    ``front`` device elements are ``x[0]`` and the ``back`` elements after the copy are
    ``x[-1]`` (non-zero only for the first and last blocks).
    """
    lo, hi = max(s - h, 0), min(e + h, total)
    front = lo - (s - h)
    return lo, hi, front, front, (e + h) - hi


def block_ranges(n: int, block: int) -> list[tuple[int, int]]:
    """The blocks of ``block`` elements over ``range(n)``."""
    return [(s, min(s + block, n)) for s in range(0, n, block)]


# -- workloads ------------------------------------------------------------------------------
@dataclass
class Workload:
    """One workload: inputs (1-D float32), kernel, scalar args, and the check of a result.

    ``reduce``: the kernel's per-element output is summed (float64 total); there is no output
    array. ``check(out, total)`` returns "ok" or "wrong: ...".
    """

    name: str
    title: str
    source: str
    kernel: str
    inputs: list[np.ndarray]
    args: tuple[Any, ...] = ()
    halo: int = 0
    reduce: bool = False
    check: Callable[[np.ndarray | None, float | None], str] = field(default=lambda o, t: "ok")

    @property
    def n(self) -> int:
        """Elements per input."""
        return len(self.inputs[0])

    @property
    def in_bytes(self) -> int:
        """Input bytes (halo re-reads not counted)."""
        return sum(a.nbytes for a in self.inputs)

    @property
    def out_bytes(self) -> int:
        """Output bytes that cross the link (0 for the reduction)."""
        return 0 if self.reduce else self.n * 4

    @property
    def edges(self) -> list[tuple[float, float]]:
        """(first, last) element of each input, for the halo fills at the two ends."""
        return [(float(a[0]), float(a[-1])) for a in self.inputs]


def _equal_check(ref: np.ndarray, rtol: float = 0.0) -> Callable[[np.ndarray | None, Any], str]:
    def check(out: np.ndarray | None, _total: Any) -> str:
        assert out is not None
        if all(pmap(lambda s, e: np.array_equal(out[s:e], ref[s:e]), len(ref))):
            return "ok"
        if rtol and all(pmap(lambda s, e: np.allclose(out[s:e], ref[s:e], rtol=rtol, atol=0),
                             len(ref))):
            return "ok"
        bad = sum(pmap(lambda s, e: int(np.count_nonzero(~np.isclose(
            out[s:e], ref[s:e], rtol=rtol or 1e-7, atol=0))), len(ref)))
        return f"wrong: {bad} of {len(ref)} elements differ"

    return check


def make(name: str, gib: float, flops: int = 2000, threshold: float = 0.5) -> Workload:
    """Workload ``name`` at ``gib`` GiB per unit array (map: 2 inputs of that size;
    filter-sum: one of twice that; stencil and compute-heavy: one)."""
    n = int(gib * 2**30) // 4
    if name == "map":
        a, b = tiled_random(n, 1), tiled_random(n, 2)
        ref = np.empty_like(a)
        pmap(lambda s, e: np.add(a[s:e], b[s:e], out=ref[s:e]), n)
        return Workload(name, f"c = a + b, 2 × {_size(a.nbytes)} in, {_size(a.nbytes)} out",
                        MAP, "vadd", [a, b], check=_equal_check(ref))
    if name == "filter-sum":
        x = tiled_random(2 * n, 3)
        t = np.float32(threshold)
        want = float(sum(pmap(lambda s, e: x[s:e][x[s:e] > t].sum(dtype=np.float64), len(x))))

        def check_sum(_out: Any, total: float | None) -> str:
            if total is not None and abs(total - want) <= 1e-4 * abs(want):
                return "ok"
            return f"wrong: {total!r} vs {want!r}"

        return Workload(name, f"sum of x[x > {threshold:g}], {_size(x.nbytes)} in", FILTER,
                        "keep_above", [x], (t,), reduce=True, check=check_sum)
    if name == "stencil":
        x = tiled_random(n, 4)
        ref = np.empty_like(x)

        def smooth(s: int, e: int) -> None:
            lo, hi, _, front, back = halo_pieces(n, s, e, 2)
            p = x[lo:hi]
            if front or back:
                p = np.pad(p, (front, back), mode="edge")
            r = p[:-4] + p[1:-3]
            r += p[2:-2]
            r += p[3:-1]
            r += p[4:]
            np.multiply(np.float32(0.2), r, out=ref[s:e])

        pmap(smooth, n)
        return Workload(name, f"5-point stencil, halo 2, {_size(x.nbytes)} in and out", STENCIL,
                        "smooth5", [x], halo=2, check=_equal_check(ref, rtol=1e-5))
    if name == "compute-heavy":
        x = tiled_random(n, 5)
        iters = max(flops // 2, 1)
        sample = np.unique(np.append(np.arange(0, n, max(n // 2**17, 1)), n - 1))
        want = x[sample].copy()
        for _ in range(iters):
            want = want * np.float32(0.999) + np.float32(0.001)

        def check_sample(out: np.ndarray | None, _total: Any) -> str:
            assert out is not None
            got = out[sample]
            if np.allclose(got, want, rtol=1e-3, atol=0):
                return "ok"
            bad = int(np.count_nonzero(~np.isclose(got, want, rtol=1e-3, atol=0)))
            return f"wrong: {bad} of {len(sample)} sampled elements differ"

        return Workload(name, f"{2 * iters} flops per element, {_size(x.nbytes)} in and out",
                        BURN, "burn", [x], (np.uint64(iters),), check=check_sample)
    raise ValueError(f"unknown workload {name!r}: use one of {', '.join(NAMES)}")


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:g} MiB"
