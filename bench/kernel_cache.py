"""Benchmark: building a kernel from a warm disk cache vs cold (empty cache), default device.

Each measurement runs in a fresh Python process, timing only ``Device.compile`` (not the
interpreter start or device discovery). The driver's own kernel cache would make "cold" builds
warm too, so the child processes run with PoCL's cache off (``POCL_KERNEL_CACHE=0``) and
NVIDIA's off (``CUDA_CACHE_DISABLE=1``), and without the device's warm-up thread
(``CONVEYOR_WARMUP=0``) but in one row that has it, as ``cv.device()`` starts it by default.
"warm, in-process" clears the in-process memo and compiles again in the same process. Prints
one markdown table row per mode; target: warm/cold at most 5%.

conveyor's own modules that a build imports (kernels/build.py, buildlock.py, cache.py, ...)
are byte-compiled first, as an installed package is (bench/bytecode.py: a compiled copy first
on ``PYTHONPATH``): on the lent GPU machines the checkout's ``.pyc`` files were never written,
and compiling those modules from source took 19 ms of a 40 ms warm build (bench/NOTES.md,
session 8). One row shows the warm build without bytecode.

    .venv/bin/python bench/kernel_cache.py [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench.bytecode

from bench import bytecode  # noqa: E402

from conveyor.kernels.portable import PRELUDE  # noqa: E402

# Enough work for the compiler to matter: a few loops and math built-ins, like a real kernel.
SOURCE = PRELUDE + """
__kernel void blur(__global float* out, __global const float* a, ulong offset, ulong n)
{
    size_t i = get_global_id(0);
    if (i >= n) return;
    float acc = 0.0f;
    for (int k = -RADIUS; k <= RADIUS; ++k) {
        long j = (long)i + k;
        j = j < 0 ? 0 : (j >= (long)n ? (long)n - 1 : j);
        acc += exp(-0.5f * k * k / (RADIUS * RADIUS)) * a[j];
    }
    out[i] = sqrt(fabs(acc)) + sin(acc) * cos(acc);
}
"""

CHILD = r"""
import json, sys, time
import conveyor as cv
from conveyor.kernels import build
dev = cv.device()
source = sys.stdin.read()
t0 = time.perf_counter()
dev.compile(source, "blur", ["-DRADIUS=4"])
t1 = time.perf_counter()
build.clear_memo()
dev.compile(source, "blur", ["-DRADIUS=4"])
t2 = time.perf_counter()
c = build.default_cache()
print(json.dumps({"first": t1 - t0, "again": t2 - t1, "hits": c.hits, "misses": c.misses,
                  "device": f"{dev.spec} {dev.name}"}))
"""


def _child(cache_dir: Path, warmup: bool = False, compiled: bool = True) -> dict:
    # The device's warm-up thread (memory/warmup.py) imports the pipeline while the build
    # runs, and the two share the GIL: off unless asked, so the figure is the build's own.
    env = bytecode.env(dict(os.environ, CONVEYOR_CACHE_DIR=str(cache_dir),
                            POCL_KERNEL_CACHE="0", CUDA_CACHE_DISABLE="1",
                            CONVEYOR_WARMUP="on" if warmup else "0"), compiled=compiled)
    env.pop("CONVEYOR_NO_CACHE", None)
    out = subprocess.run([sys.executable, "-c", CHILD], input=SOURCE, env=env,
                         capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    """Run the cold and warm builds ``--reps`` times and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    reps = parser.parse_args().reps
    cold: list[float] = []
    warm_process: list[float] = []
    warm_memo: list[float] = []
    warm_beside_warmup: list[float] = []
    warm_no_bytecode: list[float] = []
    device = ""
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-") as root:
        for rep in range(reps):
            cache_dir = Path(root) / f"rep{rep}"  # a new, empty cache: a cold build
            first = _child(cache_dir)
            assert first["misses"] == 1 and first["hits"] == 1, first
            cold.append(first["first"])
            warm_memo.append(first["again"])
            second = _child(cache_dir)  # a new process over the warm cache
            assert second["hits"] == 2 and second["misses"] == 0, second
            warm_process.append(second["first"])
            # The same, the device's warm-up running; then conveyor compiled from source.
            warm_beside_warmup.append(_child(cache_dir, warmup=True)["first"])
            warm_no_bytecode.append(_child(cache_dir, compiled=False)["first"])
            device = first["device"]
    cold_ms = statistics.median(cold) * 1e3
    print(f"device: {device}; {reps} repetitions, medians; driver caches off\n")
    print("| build | median ms | min ms | warm/cold |")
    print("|---|---:|---:|---:|")
    print(f"| cold (empty cache) | {cold_ms:.1f} | {min(cold) * 1e3:.1f} | 100% |")
    for label, times in (("warm, new process", warm_process),
                         ("warm, new process, beside the device's warm-up", warm_beside_warmup),
                         ("warm, new process, conveyor without bytecode", warm_no_bytecode),
                         ("warm, in-process (memo cleared)", warm_memo)):
        median_ms = statistics.median(times) * 1e3
        print(f"| {label} | {median_ms:.2f} | {min(times) * 1e3:.2f} | "
              f"{median_ms / cold_ms:.1%} |")


if __name__ == "__main__":
    main()
