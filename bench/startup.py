"""Start-up as a user meets it (issue 17, target 5): each figure is a new process, timed from
the outside, the median of ``--repeats``.

    python3 -m bench.startup [--device opencl:0:0] [--repeats 7]

Rows: the interpreter alone (``python -c pass``: the floor of every row), ``import conveyor``,
``conveyor --help``, and a warm ``conveyor map`` of 1 MiB of float32 from a .npy file to a
.npy file (the kernel is in the disk cache: one untimed run first). It also reports which
driver modules ``import conveyor`` loaded (none is the promise: devices are found only when a
call needs one). Every output is checked. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import conveyor as cv

ROOT = Path(__file__).resolve().parent.parent
KERNEL = """
__kernel void affine(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i] + 1.0f;
}
"""
DRIVERS = ("pyopencl", "cuda.core", "cuda.bindings", "cupy", "torch")


def _time(command: list[str], env: dict[str, str], repeats: int) -> tuple[float, float]:
    """Median and min seconds of ``command`` run ``repeats`` times (each must succeed)."""
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), min(seconds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.startup",
                                description=__doc__.split("\n")[0])
    p.add_argument("--device", default=None, help="for conveyor map (default: its default)")
    p.add_argument("--repeats", type=int, default=7)
    o = p.parse_args(argv)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"),
                                         *filter(None, [env.get("PYTHONPATH")])])
    py = sys.executable
    probe = ("import sys, conveyor; print(','.join(m for m in " + repr(DRIVERS)
             + " if m in sys.modules) or 'none')")
    loaded = subprocess.run([py, "-c", probe], env=env, check=True, capture_output=True,
                            text=True).stdout.strip()
    rows: list[tuple[str, tuple[float, float]]] = [
        ("python -c pass", _time([py, "-c", "pass"], env, o.repeats)),
        ("import conveyor", _time([py, "-c", "import conveyor"], env, o.repeats)),
        ("conveyor --help", _time([py, "-m", "conveyor.cli", "--help"], env, o.repeats)),
    ]
    with tempfile.TemporaryDirectory(prefix="conveyor-startup-") as folder:
        work = Path(folder)
        x = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
        np.save(work / "x.npy", x)
        # The CLI tells the language by the extension: .cu for a CUDA device.
        kernel = work / ("affine.cu" if (o.device or "").startswith("cuda") else "affine.cl")
        kernel.write_text(cv.portable(KERNEL))
        command = [py, "-m", "conveyor.cli", "map", str(kernel), "--kernel",
                   "affine", "-i", str(work / "x.npy"), "-o", str(work / "y.npy"), "--force",
                   "-q", *(["--device", o.device] if o.device else [])]
        subprocess.run(command, env=env, check=True)  # the kernel into the disk cache
        rows.append(("warm conveyor map, 1 MiB", _time(command, env, o.repeats)))
        y = np.load(work / "y.npy")
        if not np.array_equal(y, 2 * x + 1):
            raise SystemExit("conveyor map gave a wrong output")
    print(f"{os.cpu_count()} CPUs; {o.repeats} runs each, new processes; "
          f"driver modules loaded by `import conveyor`: {loaded}\n")
    print("| command | median s | min s |\n|---|---:|---:|")
    for name, (median, least) in rows:
        print(f"| {name} | {median:.3f} | {least:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
