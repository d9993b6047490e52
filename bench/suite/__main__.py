"""python3 -m bench.suite: ceilings, then every workload through every system, pageable and
pre-pinned inputs; writes suite.json, suite.md and suite.png and prints suite.md.

On the GPU machine use ``bash bench/gpu.sh [OUTDIR]``. Locally, on PoCL, tiny:
``bash bench/gpu.sh /tmp/suite --small`` (or ``PYTHONPATH=src:. python -m bench.suite --small
--out /tmp/suite``). Besides the peer tables it measures issue 17's figures: each workload's
first call in a fresh process (bench/first_call.py), the host staging bound, the iterative case
(``--iterative``, ``--passes``) and ``conveyor map`` from the shell (bench/cli_map.py).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import conveyor as cv

from . import ceilings, iterative, output
from .systems import Conveyor, NaivePyOpenCL, System
from .workloads import NAMES, THREADS, Workload, make, parallel_fill

SYSTEMS = ("conveyor-cuda", "conveyor-opencl", "pyopencl-naive", "cupy-naive", "cupy-pipeline",
           "pytorch")


class Skip(Exception):
    """A system that cannot run here; the message says why."""


def _options(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench.suite", description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=4.0,
                   help="GiB per unit array: map 2 inputs of it, filter-sum 2x it, stencil and "
                        "compute-heavy 1x; ceiling copies of half of it (default 4)")
    p.add_argument("--block-mib", type=int, default=64, help="block MiB per input (default 64)")
    p.add_argument("--depth", type=int, default=3, help="slots / streams in flight (default 3)")
    p.add_argument("--repeats", type=int, default=2, help="timed runs after the warm-up")
    p.add_argument("--flops", type=int, default=2000, help="compute-heavy flops per element")
    p.add_argument("--device", action="append", default=[],
                   help="device spec (repeatable): picks the CUDA and/or OpenCL device; "
                        "default: the first CUDA GPU and the first OpenCL GPU")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma list of systems")
    p.add_argument("--workloads", default=",".join(NAMES), help="comma list of workloads")
    p.add_argument("--kinds", default="pageable,pinned", help="comma list of input kinds")
    p.add_argument("--out", default=os.environ.get("OUT") or "bench/out", help="output folder")
    p.add_argument("--first-call", default=",".join(NAMES),
                   help="workloads whose first call in a fresh process is measured per "
                        "conveyor system (bench/first_call.py; '' for none)")
    p.add_argument("--iterative", default="map,filter-sum",
                   help="workloads streamed --passes times over the same pageable arrays, "
                        "without and with keep_pinned ('' for none)")
    p.add_argument("--passes", type=int, default=3, help="passes of the iterative case")
    p.add_argument("--cli-map-gib", type=float, default=None,
                   help="GiB of the conveyor map .npy-to-.npy run (bench/cli_map.py; default "
                        "--gib; 0 for none)")
    p.add_argument("--small", action="store_true",
                   help="tiny sizes (--gib 0.0625, 4 MiB blocks, 1 repeat, 20 flops) and, "
                        "where no GPU is found, the first OpenCL device: the whole suite in "
                        "half a minute on PoCL")
    o = p.parse_args(argv)
    if o.small:
        o.gib, o.block_mib, o.repeats, o.flops = 0.0625, 4, 1, 20
    return o


def _devices(specs: list[str], small: bool = False
             ) -> tuple[cv.Device | None, cv.Device | None]:
    if small and not specs and not any(d.kind == "gpu" for d in cv.devices()):
        specs = ["opencl"]
    if specs:
        chosen = [cv.device(s) for s in specs]
        return (next((d for d in chosen if d.backend == "cuda"), None),
                next((d for d in chosen if d.backend == "opencl"), None))
    found = cv.devices()
    return (next((d for d in found if d.backend == "cuda" and d.kind == "gpu"), None),
            next((d for d in found if d.backend == "opencl" and d.kind == "gpu"), None))


def _need(dev: cv.Device | None, what: str) -> cv.Device:
    if dev is None:
        raise Skip(f"no {what} device (none found, or not named with --device)")
    return dev


def _systems(names: list[str], cuda: cv.Device | None, ocl: cv.Device | None, block: int,
             depth: int) -> tuple[list[System], dict[str, str]]:
    def cuda_index() -> int:
        return int(getattr(_need(cuda, "CUDA"), "index", 0))

    def peer(cls_name: str) -> Callable[[], System]:
        def make_peer() -> System:
            from . import cuda_peers

            cls: Any = getattr(cuda_peers, cls_name)
            return cls(cuda_index(), block, depth)  # type: ignore[no-any-return]

        return make_peer

    factories: dict[str, Callable[[], System]] = {
        "conveyor-cuda": lambda: Conveyor("conveyor-cuda", _need(cuda, "CUDA"), block, depth),
        "conveyor-opencl": lambda: Conveyor("conveyor-opencl", _need(ocl, "OpenCL GPU"), block,
                                            depth),
        "pyopencl-naive": lambda: NaivePyOpenCL(_need(ocl, "OpenCL GPU"), block, depth),
        "cupy-naive": peer("NaiveCupy"),
        "cupy-pipeline": peer("CupyPipeline"),
        "pytorch": peer("Torch"),
    }
    systems, skipped = [], {}
    for name in names:
        try:
            systems.append(factories[name]())
        except Skip as exc:
            skipped[name] = f"skipped: {exc}"
        except ImportError as exc:
            skipped[name] = f"skipped: {exc.name or exc} not installed"
        except Exception as exc:
            skipped[name] = f"skipped: {type(exc).__name__}: {exc}"
    return systems, skipped


def _run_row(system: System, wl: Workload, kind: str, pageable_out: np.ndarray | None,
             repeats: int, ceiling: float | None) -> dict[str, Any]:
    row: dict[str, Any] = {"workload": wl.name, "system": system.name, "kind": kind,
                           "device": system.device_spec, "in_bytes": wl.in_bytes,
                           "out_bytes": wl.out_bytes}
    inputs: list[Any] = wl.inputs if kind == "pageable" else system.pin_inputs(wl.inputs)
    out_obj: Any = None
    view: np.ndarray | None = None
    if not wl.reduce:
        out_obj, view = (pageable_out, pageable_out) if kind == "pageable" \
            else system.pin_output(wl.n)
    runner = system.runner(wl, inputs, out_obj, kind)
    times: list[float] = []
    best: tuple[float, float | None, dict[str, Any]] | None = None
    try:
        for attempt in range(repeats + 1):
            if view is not None:
                parallel_fill(view, 0.0)
            seconds, total, extra = runner.run()
            check = wl.check(view, total)
            if check != "ok":
                row.update(status=f"wrong result ({'warm-up' if not attempt else 'run'}): "
                                  f"{check}", check=check)
                return row
            if attempt:
                times.append(seconds)
                if best is None or seconds < best[0]:
                    best = (seconds, total, extra)
    finally:
        runner.close()
    assert best is not None
    seconds, total, extra = best
    gbps = wl.in_bytes / seconds / 1e9
    row.update(status="ok", check="ok", seconds=seconds, all_seconds=times, gbps_in=gbps,
               gbps_out=wl.out_bytes / seconds / 1e9, total=total, ceiling=ceiling,
               ratio=gbps / ceiling if ceiling else None, extra=extra)
    return row


def _issue17(o: argparse.Namespace, suite: dict[str, Any], systems: list[System],
             wl: Workload, block: int) -> None:
    """The host staging bound, the first call and the iterative case of one workload."""
    fig = suite["ceilings"]
    for spec, dev_fig in fig["devices"].items():
        suite["host_bound"].setdefault(wl.name, {})[spec] = iterative.host_bound(
            wl, dev_fig["pinned_h2d"], fig.get("host_memcpy_to_pinned"),
            fig.get("host_memcpy_beside_link"))
    for system in systems:
        if not isinstance(system, Conveyor):
            continue
        key = f"{wl.name}|{system.name}"
        if wl.name in o.first_call.split(","):
            result = iterative.first_call(system.device_spec, wl.name, o.gib, o.flops)
            if "error" not in result:  # and with the inputs made before the device is opened
                result["data_first"] = iterative.first_call(system.device_spec, wl.name, o.gib,
                                                            o.flops, data_first=True)
            suite["first_call"][key] = result
            print(f"  {system.name:16} first call: "
                  + (f"{result['first_gbps']:.2f} GB/s, warm {result['warm_fresh_gbps']:.2f}"
                     if "error" not in result else result["error"]), flush=True)
        if wl.name in o.iterative.split(","):
            try:
                result = iterative.iterative(system.dev, wl, o.passes, block, o.depth)
            except Exception as exc:
                traceback.print_exc()
                result = {"error": f"{type(exc).__name__}: {exc}"}
            suite["iterative"][key] = result
            print(f"  {system.name:16} iterative: {result}", flush=True)
            system.trim()


def _cli_map(spec: str, gib: float) -> dict[str, Any]:
    env = dict(os.environ)
    root = Path(__file__).resolve().parent.parent.parent
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), str(root),
                                         *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, "-m", "bench.cli_map", "--gib", str(gib),
                           "--device", spec], env=env, cwd=root, capture_output=True,
                          text=True, check=False)
    if done.returncode:
        return {"error": (done.stderr.strip() or done.stdout.strip())[-300:]}
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _driver(first: cv.Device | None) -> str:
    try:
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        found = subprocess.run(query, capture_output=True, text=True, timeout=20, check=True)
        return found.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return first.info.driver_version if first is not None else "?"


def main(argv: list[str] | None = None) -> int:
    o = _options(argv)
    started = time.perf_counter()
    names = [s for s in o.systems.split(",") if s]
    workloads = [w for w in o.workloads.split(",") if w]
    kinds = [k for k in o.kinds.split(",") if k]
    for bad, allowed in ((set(names) - set(SYSTEMS), SYSTEMS), (set(workloads) - set(NAMES), NAMES),
                         (set(kinds) - set(output.KINDS), output.KINDS)):
        if bad:
            sys.exit(f"unknown {', '.join(sorted(bad))}: choose from {', '.join(allowed)}")
    block = o.block_mib * 2**20 // 4
    cuda, ocl = _devices(o.device, o.small)
    devices = [d for d in (cuda, ocl) if d is not None]
    systems, skipped = _systems(names, cuda, ocl, block, o.depth)
    for name, why in skipped.items():
        print(f"{name}: {why}", flush=True)
    first = devices[0] if devices else None
    suite: dict[str, Any] = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "gpu": first.name if first is not None else None,
        "driver": _driver(first),
        "host": {"cpus": os.cpu_count(), "threads": THREADS, "machine": platform.node(),
                 "python": platform.python_version(), "numpy": np.__version__},
        "devices": {d.spec: {"name": d.name, "backend": d.backend, "kind": d.kind,
                             "driver": d.info.driver_version} for d in devices},
        "options": {"gib": o.gib, "block_mib": o.block_mib, "depth": o.depth,
                    "repeats": o.repeats, "flops": o.flops, "systems": names, "kinds": kinds},
        "skipped": skipped, "rows": [], "titles": {}, "kernel_alone": {},
        "first_call": {}, "iterative": {}, "host_bound": {}, "cli_map": {},
    }
    suite["ceilings"] = ceilings.measure(devices, int(o.gib / 2 * 2**30))
    h2d = {spec: fig["pinned_h2d"] for spec, fig in suite["ceilings"]["devices"].items()}
    for wl_name in NAMES:
        if wl_name not in workloads:
            continue
        t0 = time.perf_counter()
        wl = make(wl_name, o.gib, o.flops)
        suite["titles"][wl_name] = wl.title
        print(f"\n{wl_name}: {wl.title} (inputs and reference {time.perf_counter() - t0:.1f} s)",
              flush=True)
        pageable_out = None
        if not wl.reduce:
            pageable_out = np.empty(wl.n, np.float32)
            parallel_fill(pageable_out, 0.0)
        for name, why in skipped.items():
            suite["rows"].append({"workload": wl_name, "system": name, "kind": "—",
                                  "status": why})
        for system in systems:
            for kind in kinds:
                if kind not in system.kinds:
                    continue
                t0 = time.perf_counter()
                try:
                    row = _run_row(system, wl, kind, pageable_out, o.repeats,
                                   h2d.get(system.device_spec))
                except Exception as exc:
                    traceback.print_exc()
                    row = {"workload": wl_name, "system": system.name, "kind": kind,
                           "device": system.device_spec,
                           "status": f"failed: {type(exc).__name__}: {exc}".replace("\n", " ")}
                suite["rows"].append(row)
                gc.collect()
                figure = f"{row['gbps_in']:.2f} GB/s in, best {row['seconds']:.3f} s" \
                    if row["status"] == "ok" else row["status"]
                print(f"  {system.name:16} {kind:8} {figure}  ({time.perf_counter() - t0:.1f} s, "
                      f"at {time.perf_counter() - started:.0f} s)", flush=True)
            system.trim()
        _issue17(o, suite, systems, wl, block)
        if wl_name == "compute-heavy":
            for dev in devices:
                alone = ceilings.kernel_alone(dev, wl, block)
                fig = suite["ceilings"]["devices"][dev.spec]
                link = max(wl.in_bytes / fig["pinned_h2d"], wl.out_bytes / fig["pinned_d2h"],
                           (wl.in_bytes + wl.out_bytes) / fig["pinned_both"]) / 1e9
                alone.update(link_seconds=link, compute_bound=alone["seconds"] > link)
                suite["kernel_alone"][dev.spec] = alone
                print(f"  kernel alone on {dev.spec}: {alone['seconds'] * 1e3:.1f} ms "
                      f"(copies at the ceilings: {link * 1e3:.1f} ms)", flush=True)
        for system in systems:
            system.trim()
        del wl, pageable_out
        gc.collect()
        suite["elapsed_seconds"] = time.perf_counter() - started
        output.write(suite, Path(o.out))  # what is done so far survives a killed run
    cli_gib = o.gib if o.cli_map_gib is None else o.cli_map_gib
    for system in systems if cli_gib else []:
        if isinstance(system, Conveyor):
            suite["cli_map"][system.name] = _cli_map(system.device_spec, cli_gib)
            print(f"  conveyor map {cli_gib:g} GiB .npy on {system.device_spec}: "
                  f"{suite['cli_map'][system.name]}", flush=True)
    suite["elapsed_seconds"] = time.perf_counter() - started
    text = output.write(suite, Path(o.out))
    print("\n" + text)
    print(f"wrote {o.out}/suite.json, suite.md, suite.png in {suite['elapsed_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
