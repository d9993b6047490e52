"""``conveyor devices``, ``demo``, ``bench`` and ``cache``."""

from __future__ import annotations

import argparse
import math
import statistics
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

import conveyor as cv
from conveyor.cli.files import refuse_one_file_twice, refuse_to_replace
from conveyor.errors import ConveyorError, InputError

if TYPE_CHECKING:
    from conveyor.kernels.cache import KernelCache


def run_devices(options: argparse.Namespace) -> int:
    """The device table, known misconfigurations, and (``--measure``) link bandwidth."""
    from conveyor.backends.diagnose import hidden_devices, problems

    found = cv.devices()
    rows = [("SPEC", "BACKEND", "KIND", "MEMORY", "CUS", "SVM", "UNIFIED", "NAME")]
    for dev in found:
        rows.append((dev.spec, dev.backend, dev.kind, f"{dev.global_mem_bytes / 2**30:.1f} GiB",
                     str(dev.compute_units), "yes" if dev.svm else "no",
                     "yes" if dev.host_unified else "no", dev.name))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if not found:
        # A setting that hides installed devices is what to change, not an install.
        causes = ("; ".join(hidden_devices())
                  or "install pocl-binary-distribution, or a GPU driver")
        print(f"no device found: {causes}")
    for problem in problems(found, probe=True):
        print(f"note: {problem}")
    from conveyor import config

    for reader in (config.default_device_spec, config.check_all):
        try:  # every other command refuses these: say so here, where devices are chosen
            reader()
        except InputError as exc:
            print(f"note: {exc}")
    for dev in found:
        if dev.host_place is not None:  # several NUMA nodes (memory/numa.py)
            print(f"{dev.spec}: pinned memory and staging threads on host NUMA "
                  f"{dev.host_place}")
    if options.measure:
        _measure_all(found)
    return 0


def _measure_all(found: list[cv.Device]) -> None:
    from conveyor.measure import link_bandwidth

    print("\nlink bandwidth, GB/s (best of 3 copies of 64 MiB):")
    print(f"{'SPEC':<14}{'pinned in':>10}{'pinned out':>11}{'pageable in':>12}"
          f"{'pageable out':>13}")
    for dev in found:
        try:
            figures = link_bandwidth(dev)
        except ConveyorError as exc:
            print(f"{dev.spec:<14}cannot measure: {' '.join(str(exc).split())}")
            continue
        print(f"{dev.spec:<14}{figures.pinned_h2d_gbps:>10.2f}{figures.pinned_d2h_gbps:>11.2f}"
              f"{figures.pageable_h2d_gbps:>12.2f}{figures.pageable_d2h_gbps:>13.2f}")
        _cache_ceiling(dev.spec, dev.name, figures.as_dict())
    _measure_together(found)


def _cache_ceiling(spec: str, name: str, figures: dict[str, float]) -> None:
    """Store measured ceilings under ``spec``/``name`` and say where (or why not)."""
    try:
        from conveyor.trace.ceiling import save_link_ceiling

        where = save_link_ceiling(spec, name, figures)
    except (ImportError, OSError, ConveyorError) as exc:
        print(f"  (not cached: {' '.join(str(exc).split())})")
    else:
        print(f"  cached in {where}")


def _measure_together(found: list[cv.Device]) -> None:
    """Every backend's devices of one kind at once (where there are several): the aggregate
    ceiling of a stream over them (conveyor.measure_all)."""
    from conveyor.measure_all import aggregate_bandwidth, group_key, groups

    for group in groups(found):
        spec, name = group_key(group)
        try:
            figures = aggregate_bandwidth(group)
        except ConveyorError as exc:
            print(f"{spec}: all at once: cannot measure: {' '.join(str(exc).split())}")
            continue
        print(f"{spec} all at once: pinned in {figures.pinned_h2d_gbps:.2f}, "
              f"out {figures.pinned_d2h_gbps:.2f} GB/s")
        _cache_ceiling(spec, name, figures.as_dict())


def run_demo(options: argparse.Namespace) -> int:
    """``conveyor demo``: see :mod:`conveyor.demo`."""
    from conveyor import demo

    options.plot = demo.plot_file(options.plot)
    refuse_one_file_twice([("--trace", options.trace), ("--plot", options.plot)])
    refuse_to_replace([("--trace", options.trace), ("--plot", options.plot)],
                      options.force)
    _fits_host(options.mib, 4)  # x, y, out, and NumPy's expected result
    return demo.run(options.device, options.mib, options.trace, options.plot)


def _fits_host(mib: int, arrays: int) -> None:
    """InputError when ``arrays`` arrays of ``mib`` MiB exceed the host's memory (NumPy's
    MemoryError, or "Maximum allowed dimension exceeded" past 2**63 elements, came out as a
    traceback after the device was opened)."""
    from conveyor.memory import hostmem

    host = hostmem.total()  # the same measure as a stream's own check (pipeline/stream.py)
    if host is None:
        return
    if mib >= 1 and arrays * mib * 2**20 > host:
        raise InputError(f"--mib {mib}: {arrays} arrays of {mib} MiB need "
                         f"{arrays * mib / 1024:.1f} GiB of host memory and this machine has "
                         f"{host / 2**30:.1f} GiB: give a smaller --mib")


def run_bench(options: argparse.Namespace) -> int:
    """Link bandwidth, then ``--runs`` runs each of conveyor and a naive blocking loop on
    saxpy: medians with their spread, and a warning when the spread is too large to compare."""
    from conveyor.demo import SAXPY
    from conveyor.measure import link_bandwidth, naive_loop

    if not (math.isfinite(options.max_spread) and options.max_spread >= 0):
        # NaN compares false with every spread (never "too noisy"), a negative one true.
        raise InputError(f"--max-spread {options.max_spread:g}: give a percentage, a finite "
                         f"number >= 0 (e.g. --max-spread 25)")
    _fits_host(options.mib, 4)  # x, y and two outputs
    dev = cv.device(options.device, warm_up=False)  # nothing of it may share the timings
    print(f"device: {dev.spec} {dev.name} ({dev.kind}, {dev.backend})")
    link = link_bandwidth(dev)
    print(f"link, GB/s: pinned in {link.pinned_h2d_gbps:.2f}, out {link.pinned_d2h_gbps:.2f}; "
          f"pageable in {link.pageable_h2d_gbps:.2f}, out {link.pageable_d2h_gbps:.2f}")
    rows = options.mib * 2**20 // 4
    rng = np.random.default_rng(0)
    x = rng.random(rows, dtype=np.float32)
    y = rng.random(rows, dtype=np.float32)
    out = np.zeros_like(x)
    naive_out = np.zeros_like(x)
    kernel = dev.compile(SAXPY, "saxpy")
    fast: list[float] = []
    slow: list[float] = []
    block_rows = 0
    zero_copy = False
    # One warm-up run of each (pools, queues, first touches), not counted; then alternate, so
    # a slow spell of the machine hits both.
    for run in range(options.runs + 1):
        report = cv.stream(kernel, [x, y], [out], device=dev, args=(2.0,))
        block_rows, zero_copy = report.block_rows, report.zero_copy
        naive = naive_loop(dev, kernel, [x, y], naive_out, block_rows, args=(2.0,))
        if not np.array_equal(out, naive_out):
            raise ConveyorError("conveyor and the naive loop disagree: please report this")
        if run:
            fast.append(report.seconds)
            slow.append(naive)
    moved = x.nbytes + y.nbytes + out.nbytes
    print(f"saxpy, 2 x {options.mib} MiB in, {options.mib} MiB out, blocks of {block_rows} rows; "
          f"median of {options.runs} run{'s' if options.runs > 1 else ''} (min-max) after a "
          f"warm-up:")
    print(f"  conveyor   {_seconds(fast, moved)}{'  (zero-copy)' if zero_copy else ''}")
    print(f"  naive loop {_seconds(slow, moved)}")
    ratios = [s / f for f, s in zip(fast, slow, strict=True)]
    print(f"  conveyor is {statistics.median(ratios):.2f}x the naive loop "
          f"({min(ratios):.2f}x-{max(ratios):.2f}x); pinned link ceiling "
          f"{link.pinned_h2d_gbps:.2f} GB/s in")
    spread = max(_spread(fast), _spread(slow), _spread(ratios))
    if spread >= options.max_spread:
        print(f"too noisy to compare: runs spread {spread:.0f}% (max - min over median; "
              f"--max-spread {options.max_spread:g}); close other programs, or raise --runs "
              f"or --mib")
    return 0


def _seconds(times: Sequence[float], moved: int) -> str:
    middle = statistics.median(times)
    return (f"{middle * 1e3:9.2f} ms  {moved / middle / 1e9:7.2f} GB/s in+out  "
            f"({min(times) * 1e3:.2f}-{max(times) * 1e3:.2f} ms, spread {_spread(times):.0f}%)")


def _spread(values: Sequence[float]) -> float:
    """(max - min) / median, in percent."""
    middle = statistics.median(values)
    return 100.0 * (max(values) - min(values)) / middle if middle > 0 else 0.0


def run_cache(options: argparse.Namespace) -> int:
    """``cache info`` / ``cache clear``; neither creates the cache folder. A refused folder is
    said in the command's line, not as a Python warning (which would print a source line)."""
    from conveyor.kernels.build import default_cache

    cache = default_cache()
    if cache is None and options.action == "clear":
        # Off for builds, but the entries of earlier runs are still on disk: clear them.
        from conveyor import config
        from conveyor.kernels.cache import KernelCache

        print("the kernel cache is off (CONVEYOR_NO_CACHE is set); clearing its folder anyway")
        cache = KernelCache(config.cache_dir())
    if cache is None:
        print("the kernel cache is off (CONVEYOR_NO_CACHE is set)")
        return 0
    if not cache.path.exists():  # checked first: asking the cache would create the folder
        print(f"kernel cache {cache.path}: 0 entries (the folder does not exist yet; the "
              f"first build makes it)")
        return 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # cache.refused has the reason
        if options.action == "clear":
            return _clear(cache)
        info = cache.info()
    state = "on" if info.enabled else f"off (the directory {cache.refused or 'was refused'})"
    bad = (f"; {info.bad} not a regular file (a folder, FIFO or link where an entry should "
           f"be: 'conveyor cache clear' removes them, but for folders with files in them)"
           if info.bad else "")
    print(f"kernel cache {info.path}: {state}, {info.entries} entries, "
          f"{info.total_bytes / 2**20:.1f} MiB{bad}")
    return 0


def _clear(cache: KernelCache) -> int:
    """``cache clear``: 0 when every entry went; an error saying which did not, and why."""
    cleared = cache.clear_entries()
    if cleared.refused is not None:
        raise InputError(f"cannot clear the kernel cache: the directory {cache.path} "
                         f"{cleared.refused}; conveyor neither reads nor changes it (fix it, "
                         f"or remove it yourself)")
    if cleared.failed:
        shown = "; ".join(cleared.failed[:3])
        more = f"; and {len(cleared.failed) - 3} more" if len(cleared.failed) > 3 else ""
        raise ConveyorError(f"removed {cleared.removed} entries from {cache.path} but could "
                            f"not remove {len(cleared.failed)}: {shown}{more}; remove them "
                            f"yourself (a folder with files in it is never recursed into)")
    print(f"removed {cleared.removed} entries from {cache.path}")
    return 0
