"""The first stream a user runs, against the warm rate later in the same process (issue 17).

One fresh process: find the device, build the kernel, make the workload's pageable inputs,
then time the process's first ``cv.stream`` into a fresh ``np.empty_like`` output with the
README's defaults (no block_bytes, no depth); then, in the same process, the warm rate (new
``np.empty_like`` output each run, best of ``--repeats``) and the warm rate into a pre-filled
output. Every result is checked.

    python3 -m bench.first_call --workload map --gib 4 --device cuda:0
    python3 -m bench.first_call --workload map --gib 4 --device cuda:0 --variants all

``--data-first`` makes the inputs before opening the device, so the device's warm-up
(memory/warmup.py) has only the kernel build to overlap. ``--variants`` runs the same in one
fresh process per variant, each with one of issue 17's
mechanisms turned off by its environment variable (``old``: all of them), and prints a table.
Prints one JSON object per process (the last line of its output).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()

VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "no-grow": {"CONVEYOR_RING_GROW": "0"},
    "driver-alloc": {"CONVEYOR_PINNED_ALLOC": "driver"},
    "no-prefault": {"CONVEYOR_PREFAULT": "off"},
    "register": {"CONVEYOR_PINNED_ALLOC": "register"},
    "register-no-grow": {"CONVEYOR_PINNED_ALLOC": "register", "CONVEYOR_RING_GROW": "0"},
    "no-warmup": {"CONVEYOR_WARMUP": "0"},
    # conveyor compiled from source in the process (a checkout without .pyc files), not
    # byte-compiled beforehand as an installed package is (bench/bytecode.py)
    "source": {},
    "old": {"CONVEYOR_RING_GROW": "0", "CONVEYOR_PINNED_ALLOC": "driver",
            "CONVEYOR_PREFAULT": "off", "CONVEYOR_WARMUP": "0"},
}


def _options(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench.first_call",
                                description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="map")
    p.add_argument("--gib", type=float, default=4.0)
    p.add_argument("--device", default=None, help="device spec (default: conveyor's choice)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--flops", type=int, default=2000, help="compute-heavy flops per element")
    p.add_argument("--block-mib", type=int, default=None,
                   help="block MiB (default: the README's defaults, none given)")
    p.add_argument("--data-first", action="store_true",
                   help="make the inputs before opening the device (no time for the device's "
                        "warm-up but the kernel build), not after")
    p.add_argument("--variants", default=None,
                   help=f"comma list of {', '.join(VARIANTS)}, or all: one process each")
    return p.parse_args(argv)


def measure(o: argparse.Namespace) -> dict[str, Any]:
    """The first stream and the warm rates, in this (fresh) process."""
    import numpy as np
    from bench.suite.workloads import make, parallel_fill

    import conveyor as cv

    if o.data_first:
        wl = make(o.workload, o.gib, o.flops)
    t0 = time.perf_counter()
    dev = cv.device(o.device)
    found = time.perf_counter() - t0
    if not o.data_first:
        wl = make(o.workload, o.gib, o.flops)
    t0 = time.perf_counter()
    kernel = dev.compile(wl.source, wl.kernel)
    built = time.perf_counter() - t0
    options: dict[str, Any] = dict(device=dev, halo=wl.halo, args=wl.args)
    if o.block_mib:
        options["block_bytes"] = o.block_mib * 2**20

    reports: list[tuple[float, Any]] = []  # (start on perf_counter_ns, report) of each run

    def run(out: Any) -> float:
        start = time.perf_counter()
        started_ns = time.perf_counter_ns()
        if wl.reduce:
            report = cv.stream(kernel, wl.inputs, reduce="sum", **options)
        else:
            report = cv.stream(kernel, wl.inputs, [out], **options)
        seconds = time.perf_counter() - start
        reports.append((started_ns, report))
        total = None if report.result is None else float(report.result)
        check = wl.check(out, total)
        if check != "ok":
            raise SystemExit(f"wrong result: {check}")
        return seconds

    def fresh() -> Any:
        return None if wl.reduce else np.empty_like(wl.inputs[0])

    made = dev.pinned_pool.stats().misses
    first = run(fresh())
    made = dev.pinned_pool.stats().misses - made  # pinned blocks the first stream allocated
    warm = []
    for _ in range(o.repeats):
        out = fresh()
        warm.append(run(out))
        del out
    filled = []
    out = fresh()
    for _ in range(o.repeats):
        if out is not None:
            parallel_fill(out, 0.0)
        filled.append(run(out))
    gb = wl.in_bytes / 1e9
    best = min(range(1, 1 + o.repeats), key=lambda i: reports[i][1].seconds)
    return {
        "first_where": _where(*reports[0]), "warm_where": _where(*reports[best]),
        "workload": wl.name, "device": dev.spec, "gib": o.gib, "data_first": o.data_first,
        "env": {k: v for k, v in os.environ.items() if k.startswith("CONVEYOR_")},
        "conveyor_from": str(Path(cv.__file__).parent),
        "process_to_device_seconds": found, "compile_seconds": built,
        "first_seconds": first, "first_gbps": gb / first, "first_pinned_made": made,
        "warm_fresh_gbps": gb / min(warm), "warm_filled_gbps": gb / min(filled),
        "first_over_warm": min(warm) / first,
        "seconds_since_start": time.perf_counter() - STARTED,
    }


def _where(started_ns: int, report: Any) -> dict[str, float]:
    """Where one stream's time went, in ms: before its first block (set-up: pools, rings'
    first entries, queues), the timeline's wall, and each lane's busy time."""
    tl = report.timeline
    where = {"setup_ms": (tl.origin_ns - started_ns) / 1e6, "timeline_ms": tl.wall_ns / 1e6}
    for lane in tl.lanes:
        where[f"{lane}_busy_ms"] = tl.busy_ns(lane) / 1e6
    return {k: round(v, 2) for k, v in where.items()}


def variants(o: argparse.Namespace, argv: list[str]) -> list[dict[str, Any]]:
    """Each variant in a fresh process of its own, conveyor byte-compiled as an installed
    package is (bench/bytecode.py); prints a table."""
    from bench import bytecode

    names = list(VARIANTS) if o.variants == "all" else o.variants.split(",")
    rest = [a for i, a in enumerate(argv) if not a.startswith("--variants")
            and not (i and argv[i - 1] == "--variants")]
    rows = []
    for name in names:
        env = {k: v for k, v in os.environ.items() if k not in VARIANTS["old"]}
        env.update(VARIANTS[name])
        # As an installed package: conveyor's modules compiled beforehand ("source": not).
        env = bytecode.env(env, compiled=name != "source")
        done = subprocess.run([sys.executable, "-m", "bench.first_call", *rest], env=env,
                              capture_output=True, text=True, check=False,
                              cwd=Path(__file__).resolve().parent.parent)
        if done.returncode:
            rows.append({"variant": name, "error": done.stderr.strip()[-400:]})
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["variant"] = name
        rows.append(row)
    print("| variant | first GB/s | warm (fresh output) | warm (pre-filled) | first ÷ warm "
          "| device found + first stream s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['variant']} | failed: {r['error']} | | | | |")
            continue
        print(f"| {r['variant']} | {r['first_gbps']:.1f} | {r['warm_fresh_gbps']:.1f} | "
              f"{r['warm_filled_gbps']:.1f} | {r['first_over_warm']:.2f} | "
              f"{r['process_to_device_seconds'] + r['first_seconds']:.2f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    o = _options(args)
    if o.variants:
        print(json.dumps(variants(o, args)))
    else:
        print(json.dumps(measure(o)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
