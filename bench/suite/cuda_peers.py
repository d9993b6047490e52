"""The CUDA peers: a naive CuPy loop, a hand-written CuPy pipeline and PyTorch.

All three launch the workload's one kernel source through ``cupy.RawKernel(source, name)``
(NVRTC; ``cv.portable``'s prelude makes the OpenCL C a CUDA C ``extern "C"`` kernel), with
blocks of 256 threads and ``np.uint64`` for the ``ulong`` arguments, so only the data movement
differs from conveyor's. PyTorch runs that kernel on its tensors through
``__cuda_array_interface__`` on a ``cupy.cuda.ExternalStream`` of its own stream: the point of
the PyTorch peer is its transfer scheme (``pin_memory()``, ``non_blocking`` copies, streams).
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np

from .systems import Runner, RunResult, System
from .workloads import Workload, block_ranges, halo_pieces, parallel_copy

THREADS_PER_BLOCK = 256
H2D, D2H = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost


def _launch(kern: Any, n: int, args: tuple[Any, ...]) -> None:
    """Launch ``kern`` over n work items on CuPy's current stream."""
    kern((max(-(-n // THREADS_PER_BLOCK), 1),), (THREADS_PER_BLOCK,), args)


class _CupySystem(System):
    """What both CuPy peers share: the device, pinned NumPy arrays from cupyx.empty_pinned."""

    def __init__(self, index: int, block_elems: int, depth: int) -> None:
        super().__init__(block_elems, depth)
        import cupy
        import cupyx

        self.cp, self.cupyx, self.index = cupy, cupyx, index
        self.device_spec = f"cuda:{index}"
        cupy.cuda.Device(index).use()

    def pin_inputs(self, arrays: list[np.ndarray]) -> list[Any]:
        pinned = []
        for a in arrays:
            p = self.cupyx.empty_pinned(a.shape, a.dtype)
            parallel_copy(p, a)
            pinned.append(p)
        return pinned

    def pin_output(self, n: int) -> tuple[Any, np.ndarray]:
        out = self.cupyx.empty_pinned((n,), np.float32)
        return out, out

    def trim(self) -> None:
        super().trim()
        self.cp.cuda.Device(self.index).synchronize()
        self.cp.get_default_memory_pool().free_all_blocks()
        self.cp.get_default_pinned_memory_pool().free_all_blocks()


class NaiveCupy(_CupySystem):
    """Per block: ``cp.asarray(a[s:e])``, the kernel, ``.get(out=c[s:e])`` (a device-side
    ``sum`` for the reduction), on CuPy's default stream."""

    name = "cupy-naive"

    def trim(self) -> None:
        # Device memory only: its pinned arrays stay in CuPy's pinned pool, so the hand-written
        # pipeline that runs next reuses them instead of page-locking the same sizes again.
        self.cp.cuda.Device(self.index).synchronize()
        self.cp.get_default_memory_pool().free_all_blocks()

    def runner(self, wl: Workload, inputs: list[Any], output: Any, kind: str) -> Runner:
        cp = self.cp
        kern = cp.RawKernel(wl.source, wl.kernel)
        h, total_n, edges = wl.halo, wl.n, wl.edges

        def host_block(a: np.ndarray, first: float, last: float, s: int, e: int) -> np.ndarray:
            lo, hi, _, front, back = halo_pieces(total_n, s, e, h)
            if not (front or back):
                return a[lo:hi]
            return np.concatenate([np.full(front, first, np.float32), a[lo:hi],
                                   np.full(back, last, np.float32)])

        def run() -> RunResult:
            start = time.perf_counter()
            acc = cp.zeros((), cp.float64)
            for s, e in block_ranges(total_n, self.block_elems):
                d_in = [cp.asarray(host_block(a, f, la, s, e))
                        for a, (f, la) in zip(inputs, edges, strict=True)]
                d_out = cp.empty(e - s, cp.float32)
                _launch(kern, e - s, (*d_in, d_out, *wl.args, np.uint64(s), np.uint64(e - s)))
                if wl.reduce:
                    acc += d_out.sum(dtype=cp.float64)
                else:
                    d_out.get(out=output[s:e])
            total = float(acc.get()) if wl.reduce else None  # waits for the device
            cp.cuda.Device(self.index).synchronize()
            return time.perf_counter() - start, total, {}

        return Runner(run)


class _Slot:
    """One ring slot of the hand-written pipeline."""

    def __init__(self, cp: Any, cupyx: Any, n_inputs: int, block: int, halo: int,
                 staged: bool, reduce: bool) -> None:
        self.stream = cp.cuda.Stream(non_blocking=True)
        width = block + 2 * halo
        self.d_in = [cp.empty(width, cp.float32) for _ in range(n_inputs)]
        self.d_out = cp.empty(block, cp.float32)
        self.stage_in = [cupyx.empty_pinned((width,), np.float32) for _ in range(n_inputs)
                         ] if staged else []
        self.stage_out = cupyx.empty_pinned((block,), np.float32) if staged and not reduce \
            else None
        self.acc = cp.zeros((), cp.float64)
        self.event: Any = None
        self.pending: tuple[int, int] | None = None  # output block waiting in stage_out


class CupyPipeline(_CupySystem):
    """A competent hand-written pipeline: a ring of ``depth`` slots, each with its own stream,
    device buffers and pinned staging buffers; H2D, kernel and D2H on the slot's stream; the
    host waits on a slot's last event before reusing it. Pageable inputs are copied into the
    pinned staging buffers with ``np.copyto`` (and outputs out of them); pinned inputs and
    outputs are copied from and to directly."""

    name = "cupy-pipeline"

    def runner(self, wl: Workload, inputs: list[Any], output: Any, kind: str) -> Runner:
        cp, rt = self.cp, self.cp.cuda.runtime
        kern = cp.RawKernel(wl.source, wl.kernel)
        h, total_n, edges = wl.halo, wl.n, wl.edges
        block = min(self.block_elems, total_n)
        staged = kind == "pageable"
        slots = [_Slot(cp, self.cupyx, len(inputs), block, h, staged, wl.reduce)
                 for _ in range(self.depth)]
        ranges = block_ranges(total_n, block)
        cp.cuda.Device(self.index).synchronize()

        def retire(slot: _Slot) -> None:
            if slot.event is not None:
                slot.event.synchronize()
            if slot.pending is not None:
                s, e = slot.pending
                np.copyto(output[s:e], slot.stage_out[: e - s])
                slot.pending = None

        def run() -> RunResult:
            start = time.perf_counter()
            for slot in slots:
                with slot.stream:
                    slot.acc.fill(0)
            for k, (s, e) in enumerate(ranges):
                slot = slots[k % len(slots)]
                retire(slot)
                n = e - s
                lo, hi, at, front, back = halo_pieces(total_n, s, e, h)
                sptr = slot.stream.ptr
                for i, (a, (first, last)) in enumerate(zip(inputs, edges, strict=True)):
                    dev = slot.d_in[i]
                    if staged:
                        stage = slot.stage_in[i]
                        np.copyto(stage[at : at + hi - lo], a[lo:hi])
                        stage[:front] = first
                        stage[at + hi - lo : at + hi - lo + back] = last
                        rt.memcpyAsync(dev.data.ptr, stage.ctypes.data, (n + 2 * h) * 4, H2D,
                                       sptr)
                    else:
                        rt.memcpyAsync(dev.data.ptr + at * 4, a[lo:hi].ctypes.data,
                                       (hi - lo) * 4, H2D, sptr)
                        with slot.stream:
                            if front:
                                dev[:front].fill(first)
                            if back:
                                dev[at + hi - lo : at + hi - lo + back].fill(last)
                with slot.stream:
                    _launch(kern, n, (*slot.d_in, slot.d_out, *wl.args, np.uint64(s),
                                      np.uint64(n)))
                    if wl.reduce:
                        slot.acc += slot.d_out[:n].sum(dtype=cp.float64)
                if not wl.reduce:
                    if staged:
                        rt.memcpyAsync(slot.stage_out.ctypes.data, slot.d_out.data.ptr, n * 4,
                                       D2H, sptr)
                        slot.pending = (s, e)
                    else:
                        rt.memcpyAsync(output[s:e].ctypes.data, slot.d_out.data.ptr, n * 4,
                                       D2H, sptr)
                slot.event = slot.stream.record()
            for k in range(len(ranges), len(ranges) + len(slots)):  # drain in block order
                retire(slots[k % len(slots)])
            total = sum(float(slot.acc.get()) for slot in slots) if wl.reduce else None
            return time.perf_counter() - start, total, {}

        def close() -> None:
            for slot in slots:
                slot.stream.synchronize()
            slots.clear()

        return Runner(run, close)


class Torch(System):
    """PyTorch's transfer scheme on ``depth`` streams, round-robin. Pageable: per block
    ``torch.from_numpy(a[s:e]).pin_memory().to(dev, non_blocking=True)``, result
    ``.to('cpu', non_blocking=True)`` (pinned) copied into the NumPy output (``copy_`` into
    ``torch.from_numpy`` of it: ATen's CPU copies, ``pin_memory`` too, run on its intra-op
    threads) once its stream's event has completed. Pinned: the inputs are pinned tensors
    made before timing, slices go ``.to(dev, non_blocking=True)`` and results into a pinned
    output tensor. Every device tensor is allocated on the stream that uses it, and the host
    waits on a block's event before reusing its stream's slot, so nothing is freed or read
    early."""

    name = "pytorch"

    def __init__(self, index: int, block_elems: int, depth: int) -> None:
        super().__init__(block_elems, depth)
        import cupy
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        self.torch, self.cp, self.index = torch, cupy, index
        self.device_spec = f"cuda:{index}"
        self.dev = torch.device("cuda", index)
        torch.cuda.set_device(self.dev)
        cupy.cuda.Device(index).use()

    def pin_inputs(self, arrays: list[np.ndarray]) -> list[Any]:
        pinned = []
        for a in arrays:
            t = self.torch.empty(a.shape, dtype=self.torch.float32, pin_memory=True)
            parallel_copy(t.numpy(), a)  # == torch.from_numpy(a).pin_memory(), in parallel
            pinned.append(t)
        return pinned

    def pin_output(self, n: int) -> tuple[Any, np.ndarray]:
        t = self.torch.empty(n, dtype=self.torch.float32, pin_memory=True)
        return t, t.numpy()

    def runner(self, wl: Workload, inputs: list[Any], output: Any, kind: str) -> Runner:
        torch, cp = self.torch, self.cp
        kern = cp.RawKernel(wl.source, wl.kernel)
        h, total_n, edges = wl.halo, wl.n, wl.edges
        pageable = kind == "pageable"
        streams = [torch.cuda.Stream(device=self.dev) for _ in range(self.depth)]
        with warnings.catch_warnings():  # CuPy 14: "use Stream.from_external()"; same stream
            warnings.simplefilter("ignore", DeprecationWarning)
            cupy_streams = [cp.cuda.ExternalStream(s.cuda_stream, self.index) for s in streams]
        ranges = block_ranges(total_n, self.block_elems)
        f32 = torch.float32

        def host_piece(a: Any, lo: int, hi: int) -> Any:
            if pageable:
                return torch.from_numpy(a[lo:hi]).pin_memory()
            return a[lo:hi]

        def upload(a: Any, first: float, last: float, s: int, e: int) -> Any:
            lo, hi, at, front, back = halo_pieces(total_n, s, e, h)
            if not (front or back or h):
                return host_piece(a, lo, hi).to(self.dev, non_blocking=True)
            d = torch.empty(e - s + 2 * h, dtype=f32, device=self.dev)
            d[at : at + hi - lo].copy_(host_piece(a, lo, hi), non_blocking=True)
            if front:
                d[:front].fill_(first)
            if back:
                d[at + hi - lo :].fill_(last)
            return d

        def finish(pending: tuple[Any, Any, int, int] | None) -> None:
            if pending is None:
                return
            event, host, s, e = pending
            event.synchronize()
            if host is not None:  # ATen's CPU copy_ runs on its intra-op threads
                torch.from_numpy(output[s:e]).copy_(host)

        def run() -> RunResult:
            start = time.perf_counter()
            accs = []
            for st in streams:
                with torch.cuda.stream(st):
                    accs.append(torch.zeros((), dtype=torch.float64, device=self.dev))
            pending: list[tuple[Any, Any, int, int] | None] = [None] * len(streams)
            for k, (s, e) in enumerate(ranges):
                j = k % len(streams)
                finish(pending[j])
                pending[j] = None
                st, n = streams[j], e - s
                with torch.cuda.stream(st):
                    d_in = [upload(a, f, la, s, e)
                            for a, (f, la) in zip(inputs, edges, strict=True)]
                    d_out = torch.empty(n, dtype=f32, device=self.dev)
                    with cupy_streams[j]:
                        _launch(kern, n, (*[cp.asarray(t) for t in d_in], cp.asarray(d_out),
                                          *wl.args, np.uint64(s), np.uint64(n)))
                    host = None
                    if wl.reduce:
                        accs[j] += d_out.sum(dtype=torch.float64)
                    elif pageable:
                        host = d_out.to("cpu", non_blocking=True)
                    else:
                        output[s:e].copy_(d_out, non_blocking=True)
                    event = torch.cuda.Event()
                    event.record(st)
                pending[j] = (event, host, s, e)
            for k in range(len(ranges), len(ranges) + len(streams)):
                finish(pending[k % len(streams)])
            total = sum(float(a.item()) for a in accs) if wl.reduce else None
            torch.cuda.synchronize(self.dev)
            return time.perf_counter() - start, total, {}

        def close() -> None:
            for st in streams:
                st.synchronize()

        return Runner(run, close)

    def trim(self) -> None:
        super().trim()
        self.torch.cuda.synchronize(self.dev)
        self.torch.cuda.empty_cache()
        host_empty = getattr(self.torch._C, "_host_emptyCache", None)
        if host_empty is not None:
            host_empty()
