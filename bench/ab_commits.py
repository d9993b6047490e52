"""Two versions of conveyor's source, A/B in alternating processes on one device (session 13).

Each round starts one process per version (``PYTHONPATH`` = that version's ``src``), in turns
that alternate which goes first; each process warms up, then measures
- ``small``: streams of 20 blocks of 8 KiB (per-stream and per-block host costs), median ms;
- ``pinned`` / ``pageable``: a 1 GiB float32 ``y = 2x`` stream from pinned / NumPy memory,
  64 MiB blocks, median input GB/s.
Prints every process's figures and each version's medians over the rounds.

    python3 bench/ab_commits.py --old /path/to/old/src --device cuda:0 --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = r"""
import json, statistics, sys, time
import numpy as np
sys.path.insert(0, "tests/pipeline"); sys.path.insert(0, "tests")
from streamkit import kernel
import conveyor as cv
dev = cv.device(sys.argv[1])
k = kernel(dev, "scale")
x = np.arange(20 * 2048, dtype=np.float32)
big = np.ones(2**28, np.float32)
pin = cv.pinned.empty(big.shape, big.dtype, device=dev)
pin[:] = 1
out = {}
for _ in range(10):
    cv.stream(k, [x], [np.float32], device=dev, block_bytes=8192, args=(2.0,))
small = []
for _ in range(40):
    t = time.perf_counter()
    cv.stream(k, [x], [np.float32], device=dev, block_bytes=8192, args=(2.0,))
    small.append((time.perf_counter() - t) * 1e3)
out["small"] = statistics.median(small)
for name, src in (("pinned", pin), ("pageable", big)):
    y = np.empty_like(src)
    y.fill(0)
    cv.stream(k, [src], [y], device=dev, block_bytes=64 << 20, args=(2.0,))
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        cv.stream(k, [src], [y], device=dev, block_bytes=64 << 20, args=(2.0,))
        runs.append(src.nbytes / (time.perf_counter() - t) / 1e9)
    out[name] = statistics.median(runs)
print("RESULT " + json.dumps(out))
"""


def _probe(src: str, device: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (src, os.environ.get("PYTHONPATH", "")) if p))
    done = subprocess.run([sys.executable, "-c", PROBE, device], env=env, cwd=ROOT,
                          capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"probe failed under {src}:\n{done.stdout}\n{done.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the other version's src folder")
    parser.add_argument("--new", default=str(ROOT / "src"))
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    got: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for r in range(args.rounds):
        order = ("old", "new") if r % 2 == 0 else ("new", "old")
        for side in order:
            result = _probe(getattr(args, side), args.device)
            got[side].append(result)
            print(f"round {r} {side}: " + ", ".join(f"{k} {v:.3f}" for k, v in result.items()),
                  flush=True)
    for side, runs in got.items():
        print(f"{args.device} {side} medians: " + ", ".join(
            f"{key} {statistics.median(r[key] for r in runs):.3f}" for key in runs[0]))


if __name__ == "__main__":
    main()
