"""Pinned inputs, conveyor against CuPy's hand-written pipeline, interleaved in one process.

Both systems' runners (bench/suite: ``Conveyor`` and ``CupyPipeline``) are made once over
their own pinned copies of the workload's inputs and output; then ``--rounds`` rounds run
each once, alternating which goes first, the first round dropped. Prints each system's
median input GB/s and every run, per workload. Best-of-N figures hide a system whose runs
spread; medians of interleaved runs show it (bench/NOTES.md, session 10).

On the GPU machine: ``python3 bench/pinned_ab.py --workloads stencil,map`` (needs CuPy).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.suite.cuda_peers import CupyPipeline  # noqa: E402
from bench.suite.systems import Conveyor  # noqa: E402
from bench.suite.workloads import make  # noqa: E402

import conveyor as cv  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0", help="a CUDA device spec")
    parser.add_argument("--workloads", default="stencil,map")
    parser.add_argument("--gib", type=float, default=4.0, help="GiB per unit array")
    parser.add_argument("--block-mib", type=int, default=64)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=7)
    o = parser.parse_args()
    if o.rounds < 2:
        parser.error("--rounds: at least 2 (the first round is a warm-up and is dropped)")
    dev = cv.device(o.device)
    dev.wait_for_warm_up()
    block = o.block_mib * 2**20 // 4
    for name in o.workloads.split(","):
        wl = make(name, o.gib, 20)
        runners = []
        try:
            for system in (Conveyor("conveyor-cuda", dev, block, o.depth),
                           CupyPipeline(getattr(dev, "index", 0), block, o.depth)):
                inputs = system.pin_inputs(wl.inputs)
                out, view = system.pin_output(wl.n)
                runners.append((system.name, system.runner(wl, inputs, out, "pinned"), view))
            rates: dict[str, list[float]] = {label: [] for label, _, _ in runners}
            for r in range(o.rounds):
                for label, runner, view in (runners if r % 2 == 0 else runners[::-1]):
                    seconds, total, _ = runner.run()
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
