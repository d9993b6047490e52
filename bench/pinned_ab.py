"""Pinned inputs, conveyor against CuPy's hand-written pipeline, interleaved in one process.

Both systems' runners (bench/suite: ``Conveyor`` and ``CupyPipeline``) are made once over
their own pinned copies of the workload's inputs and output; then ``--rounds`` rounds run
each once, alternating which goes first, the first round dropped. Prints each system's
median input GB/s and every run, per workload. Best-of-N figures hide a system whose runs
spread; medians of interleaved runs show it (bench/NOTES.md, session 10).

On the GPU machine: ``python3 bench/pinned_ab.py --workloads stencil,map`` (needs CuPy).
``--trace`` adds a line per conveyor run: where its time went (set-up before the first
block, the copy-in lane's busy share and longest gap, how late the host woke for a finished
slot, the tail after the last span) and the garbage collections during each system's runs.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.suite.cuda_peers import CupyPipeline  # noqa: E402
from bench.suite.systems import Conveyor  # noqa: E402
from bench.suite.workloads import make  # noqa: E402

import conveyor as cv  # noqa: E402

collections: list[int] = []  # ns of each garbage collection since the last clear
_gc_started = [0]


def _on_gc(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _gc_started[0] = time.perf_counter_ns()
    else:
        collections.append(time.perf_counter_ns() - _gc_started[0])


def _breakdown(report: cv.Report | None, t0: int, t1: int) -> str:
    """Where one conveyor run's wall time went, from its timeline (host clock, ns)."""
    if report is None:
        return "(no report)"
    tl = report.timeline
    ms = 1e6
    ins = sorted(tl.lane("copy-in"), key=lambda s: s.start_ns)
    outs = {s.block: s for s in tl.lane("copy-out")}
    waits = tl.lane("host-wait")
    gaps = [(b.start_ns - a.end_ns, b.block) for a, b in zip(ins, ins[1:], strict=False)]
    gap, at = max(gaps, default=(0, -1))
    span = ins[-1].end_ns - ins[0].start_ns if ins else 0
    # How late the host saw a slot's block leave: host-wait end after its copy-out's end.
    late = sorted(w.end_ns - outs[w.block].end_ns for w in waits if w.block in outs)
    return (f"wall {(t1 - t0) / ms:.1f} ms: set-up {(tl.origin_ns - t0) / ms:.1f},"
            f" first copy-in +{(ins[0].start_ns - tl.origin_ns) / ms if ins else 0:.1f},"
            f" copy-in busy {tl.busy_ns('copy-in') / span if span else 0:.3f} of"
            f" {span / ms:.1f}, longest gap {gap / ms:.2f} before block {at},"
            f" wake late median {statistics.median(late) / ms if late else 0:.3f}"
            f" max {max(late, default=0) / ms:.3f}, tail {(t1 - tl.end_ns) / ms:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0", help="a CUDA device spec")
    parser.add_argument("--workloads", default="stencil,map")
    parser.add_argument("--gib", type=float, default=4.0, help="GiB per unit array")
    parser.add_argument("--block-mib", type=int, default=64)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--trace", action="store_true",
                        help="a line per conveyor run: where its time went")
    parser.add_argument("--memory", choices=("own", "conveyor", "cupy"), default="own",
                        help="whose pinned memory each system streams from and into: its own "
                             "(default), or both conveyor's (cv.pinned) or both CuPy's "
                             "(cupyx.empty_pinned); each system still has arrays of its own")
    parser.add_argument("--spin-wait", action="store_true",
                        help="experiment: the CUDA events the host waits on spin instead of "
                             "sleeping (CU_EVENT_DEFAULT for conveyor's blocking-sync events)")
    o = parser.parse_args()
    if o.rounds < 2:
        parser.error("--rounds: at least 2 (the first round is a warm-up and is dropped)")
    if o.spin_wait:
        from conveyor.backends import cuda_events

        cuda_events._BLOCKING_FLAGS = cuda_events._TIMED_FLAGS
    dev = cv.device(o.device)
    dev.wait_for_warm_up()
    gc.callbacks.append(_on_gc)
    block = o.block_mib * 2**20 // 4
    for name in o.workloads.split(","):
        wl = make(name, o.gib, 20)
        runners = []
        systems = (Conveyor("conveyor-cuda", dev, block, o.depth),
                   CupyPipeline(getattr(dev, "index", 0), block, o.depth))
        try:
            for system in systems:
                maker = {"own": system, "conveyor": systems[0], "cupy": systems[1]}[o.memory]
                inputs = maker.pin_inputs(wl.inputs)
                out, view = maker.pin_output(wl.n)
                runners.append((system.name, system.runner(wl, inputs, out, "pinned"), view))
            rates: dict[str, list[float]] = {label: [] for label, _, _ in runners}
            conveyor_system = systems[0]
            for r in range(o.rounds):
                for label, runner, view in (runners if r % 2 == 0 else runners[::-1]):
                    collections.clear()
                    t0 = time.perf_counter_ns()
                    seconds, total, _ = runner.run()
                    t1 = time.perf_counter_ns()
                    if o.trace:
                        gc_ms = sum(collections) / 1e6
                        if label.startswith("conveyor"):
                            print(f"  {name} round {r} {label}: {wl.in_bytes / seconds / 1e9:.1f}"
                                  f" GB/s {_breakdown(conveyor_system.last_report, t0, t1)}"
                                  f" gc {len(collections)} ({gc_ms:.1f} ms)", flush=True)
                        else:
                            print(f"  {name} round {r} {label}: {wl.in_bytes / seconds / 1e9:.1f}"
                                  f" GB/s wall {(t1 - t0) / 1e6:.1f} ms gc {len(collections)}"
                                  f" ({gc_ms:.1f} ms)", flush=True)
                    check = wl.check(view, total)
                    if check != "ok":
                        raise SystemExit(f"{name} {label}: {check}")
                    if r:
                        rates[label].append(wl.in_bytes / seconds / 1e9)
            for label, values in rates.items():
                print(f"{name} {label}: median {statistics.median(values):.1f} GB/s  runs "
                      + " ".join(f"{v:.1f}" for v in values), flush=True)
        finally:
            for _, runner, _ in runners:
                runner.close()
        del runners
        gc.collect()


if __name__ == "__main__":
    main()
