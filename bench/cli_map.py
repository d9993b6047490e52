"""``conveyor map`` on a .npy file into a .npy file, the whole command timed from the shell,
against the warm in-process stream rate of the same work (issue 17, target 6).

    python3 -m bench.cli_map --gib 4 --device cuda:0 [--dir /tmp]

Writes x.npy (``--gib`` GiB of float32) into a temporary folder under ``--dir``, then times
``python -m conveyor.cli map affine.cl --kernel affine -i x.npy -o y.npy`` (a new process:
interpreter, imports, device, kernel from the disk cache, the stream, the rename) and, in this
process, the same stream file to file and array to array, warm (the best of ``--repeats``
after one untimed run). Every output is checked. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import conveyor as cv

# Portable (conveyor.kernels.portable): one text for OpenCL and CUDA devices. The CLI tells the
# language by the file's extension, so it is written as affine.cl or affine.cu.
KERNEL = cv.portable("""
__kernel void affine(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = 2.0f * x[i] + 1.0f;
}
""")
ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.cli_map", description=__doc__.split("\n")[0])
    p.add_argument("--gib", type=float, default=4.0)
    p.add_argument("--device", default=None)
    p.add_argument("--dir", default=None, help="folder for the files (default: the temp dir)")
    p.add_argument("--repeats", type=int, default=2)
    o = p.parse_args(argv)
    from bench.suite.workloads import parallel_fill, pmap, tiled_random

    dev = cv.device(o.device)
    n = int(o.gib * 2**30) // 4
    with tempfile.TemporaryDirectory(dir=o.dir, prefix="conveyor-cli-map-") as folder:
        work = Path(folder)
        x = tiled_random(n, 7)
        np.save(work / "x.npy", x)
        want = np.empty_like(x)
        pmap(lambda s, e: np.add(np.float32(2) * x[s:e], np.float32(1), out=want[s:e]), n)
        source = work / ("affine.cu" if dev.backend == "cuda" else "affine.cl")
        source.write_text(KERNEL)
        from bench import bytecode

        env = bytecode.env()  # as an installed command: its modules compiled beforehand
        command = [sys.executable, "-m", "conveyor.cli", "map", str(source),
                   "--kernel", "affine", "-i", str(work / "x.npy"), "-o", str(work / "y.npy"),
                   "--device", dev.spec, "--force", "-q"]
        subprocess.run(command, env=env, check=True)  # warms the kernel cache on disk
        shell = []
        for _ in range(o.repeats):
            start = time.perf_counter()
            subprocess.run(command, env=env, check=True)
            shell.append(time.perf_counter() - start)
        _check(np.load(work / "y.npy", mmap_mode="r"), want, "conveyor map")
        kernel = dev.compile(KERNEL, "affine")

        def file_to_file() -> float:
            start = time.perf_counter()
            cv.stream(kernel, [cv.npy(work / "x.npy")], [cv.npy_out(work / "y2.npy")],
                      device=dev)
            return time.perf_counter() - start

        y = np.empty_like(x)
        parallel_fill(y, 0.0)

        def array_to_array() -> float:
            start = time.perf_counter()
            cv.stream(kernel, [x], [y], device=dev)
            return time.perf_counter() - start

        files = [file_to_file() for _ in range(o.repeats + 1)][1:]
        _check(np.load(work / "y2.npy", mmap_mode="r"), want, "file to file")
        arrays = [array_to_array() for _ in range(o.repeats + 1)][1:]
        _check(y, want, "array to array")
    gb = n * 4 / 1e9
    out = {"device": dev.spec, "gib": o.gib, "shell_seconds": min(shell),
           "shell_gbps": gb / min(shell), "in_process_file_gbps": gb / min(files),
           "in_process_array_gbps": gb / min(arrays)}
    out["shell_over_file"] = out["shell_gbps"] / out["in_process_file_gbps"]
    out["shell_over_array"] = out["shell_gbps"] / out["in_process_array_gbps"]
    print(json.dumps(out))
    return 0


def _check(got: np.ndarray, want: np.ndarray, what: str) -> None:
    if not np.array_equal(got, want):
        raise SystemExit(f"{what}: wrong result")


if __name__ == "__main__":
    sys.exit(main())
