"""How many of N processes survive building one kernel at the same moment (issue 13, item 1).

    python bench/build_race.py [--processes 8] [--rounds 8] [--no-cache] [--device opencl:0:0]

Each round writes a source no process has built before and gives the round a cold PoCL cache
of its own (``POCL_CACHE_DIR`` in a temporary folder), then starts the processes (spawn) at
one barrier; each builds the kernel and streams 64 floats through it. Prints the exit codes of
every round and the count of processes that died. Without conveyor's build lock about one
process in ten aborted in PoCL (``pocl_binary.c: Assertion 'len > 0'``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import uuid

import numpy as np

SOURCE = """// {tag}
__kernel void scale(__global const float *a, __global float *out, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i < n) out[i] = a[i] * 3.0f;
}}
"""


def _child(spec: str, source: str, barrier, results) -> None:  # a spawned process
    import conveyor as cv

    dev = cv.device(spec)
    barrier.wait(timeout=60)
    kernel = dev.compile(source, "scale")
    a = np.arange(64, dtype=np.float32)
    out = np.zeros_like(a)
    cv.stream(kernel, [a], [out], device=dev)
    results.put(bool(np.array_equal(out, a * np.float32(3))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--no-cache", action="store_true", help="CONVEYOR_NO_CACHE=1")
    parser.add_argument("--device", default="opencl:0:0")
    options = parser.parse_args()
    ctx = multiprocessing.get_context("spawn")
    died = wrong = 0
    with tempfile.TemporaryDirectory() as folder:
        if options.no_cache:
            os.environ["CONVEYOR_NO_CACHE"] = "1"
        for round_ in range(options.rounds):
            os.environ["CONVEYOR_CACHE_DIR"] = os.path.join(folder, f"cache-{round_}")
            os.environ["POCL_CACHE_DIR"] = os.path.join(folder, f"pocl-{round_}")
            source = SOURCE.format(tag=uuid.uuid4())
            barrier, results = ctx.Barrier(options.processes), ctx.Queue()
            children = [ctx.Process(target=_child, args=(options.device, source, barrier, results))
                        for _ in range(options.processes)]
            for child in children:
                child.start()
            for child in children:
                child.join(timeout=120)
            codes = [child.exitcode for child in children]
            wrong += [results.get(timeout=5) for _ in range(codes.count(0))].count(False)
            died += sum(code != 0 for code in codes)
            print(f"round {round_}: exit codes {codes}", flush=True)
    total = options.processes * options.rounds
    print(f"died {died} of {total}; wrong results {wrong}")


if __name__ == "__main__":
    main()
