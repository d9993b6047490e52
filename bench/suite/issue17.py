"""The issue 17 section of suite.md: first call, host staging bound, iterative use and
``conveyor map`` from the shell, with the issue's targets evaluated from the same run."""

from __future__ import annotations

from typing import Any

from .output import CONVEYOR, PEERS, _row
from .workloads import NAMES


def _mark(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def markdown(suite: dict[str, Any]) -> list[str]:
    """Lines of markdown (empty when the run measured none of it)."""
    lines: list[str] = []
    targets: list[str] = []
    first = suite.get("first_call", {})
    if first:
        lines += ["", "### Issue 17: the first call (fresh process, fresh `np.empty_like` "
                      "output, README defaults) vs warm in the same process", "",
                  "| workload | system | first GB/s | warm, fresh output | warm, pre-filled | "
                  "first ÷ warm | device found s | kernel s | inputs made first: first GB/s "
                  "| first ÷ warm |", "|---|---|---|---|---|---|---|---|---|---|"]
        for key, r in first.items():
            wl, system = key.split("|")
            if "error" in r:
                lines.append(f"| {wl} | {system} | failed: {r['error']} | | | | | | | |")
                continue
            late = r.get("data_first") or {"error": "not run"}
            late_cells = (f"failed: {late['error']} | " if "error" in late else
                          f"{late['first_gbps']:.1f} | {late['first_over_warm']:.2f}")
            lines.append(f"| {wl} | {system} | {r['first_gbps']:.1f} | {r['warm_fresh_gbps']:.1f}"
                         f" | {r['warm_filled_gbps']:.1f} | {r['first_over_warm']:.2f} | "
                         f"{r['process_to_device_seconds']:.2f} | {r['compile_seconds']:.2f} | "
                         f"{late_cells} |")
            also = ("" if "error" in late else
                    f"; inputs made before the device: {late['first_over_warm']:.2f}")
            targets.append(f"- {_mark(r['first_over_warm'] >= 0.90)} first stream ≥ 0.90 × warm "
                           f"({wl}, {system}): {r['first_over_warm']:.2f}{also}")
    bounds = suite.get("host_bound", {})
    if bounds:
        lines += ["", "### Issue 17: pageable inputs against the host staging bound "
                      "min(link, host memcpy ÷ bytes staged per input byte)", "",
                  "Link: the pinned H2D ceiling. Beside the link: the same bound from the "
                  "host memcpy measured while pinned copies keep the link busy both ways.", "",
                  "| workload | system | staged bytes per input byte | link GB/s | host GB/s | "
                  "bound GB/s | pageable GB/s | × bound | × pytorch | bound beside the link "
                  "| × that |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        rows = suite["rows"]
        torch = {wl: _row(rows, wl, "pytorch", "pageable") for wl in NAMES}
        for wl in NAMES:
            for system in CONVEYOR:
                r = _row(rows, wl, system, "pageable")
                b = bounds.get(wl, {}).get(r["device"]) if r is not None else None
                if r is None or b is None:
                    continue
                ratio = r["gbps_in"] / b["bound_gbps"]
                peer = torch.get(wl)
                vs = r["gbps_in"] / peer["gbps_in"] if peer else None
                host = "—" if b["host_gbps"] is None else f"{b['host_gbps']:.1f}"
                beside = b.get("bound_beside_link_gbps")
                lines.append(f"| {wl} | {system} | {b['staged_per_input_byte']:.2f} | "
                             f"{b['link_gbps']:.1f} | {host} | {b['bound_gbps']:.1f} | "
                             f"{r['gbps_in']:.1f} | {ratio:.2f} | "
                             f"{'—' if vs is None else f'{vs:.2f}'} | "
                             + ("— | — |" if beside is None else
                                f"{beside:.1f} | {r['gbps_in'] / beside:.2f} |"))
                if wl in ("map", "filter-sum", "stencil"):
                    also = ("" if beside is None else
                            f" ({r['gbps_in'] / beside:.2f} × the bound beside the link)")
                    targets.append(f"- {_mark(ratio >= 0.95)} pageable {wl} ≥ 0.95 × host "
                                   f"staging bound ({system}): {ratio:.2f}{also}")
                if wl == "filter-sum" and vs is not None:
                    targets.append(f"- {_mark(vs >= 1.05)} pageable filter-sum ≥ 1.05 × "
                                   f"PyTorch ({system}): {vs:.2f}")
    lines += _pinned(suite, targets)
    loops = suite.get("iterative", {})
    if loops:
        lines += ["", "### Issue 17: the same pageable arrays streamed again "
                      "(GB/s per pass; ratio: the best pass after the first ÷ pinned H2D)", "",
                  "| workload | system | plain passes | keep_pinned passes | plain ratio | "
                  "kept ratio |", "|---|---|---|---|---|---|"]
        for key, r in loops.items():
            wl, system = key.split("|")
            if "error" in r:
                lines.append(f"| {wl} | {system} | failed: {r['error']} | | | |")
                continue
            dev = next((row["device"] for row in suite["rows"] if row["system"] == system
                        and row.get("device")), None)
            h2d = suite["ceilings"]["devices"].get(dev, {}).get("pinned_h2d")
            plain = max(r["plain"][1:] or r["plain"])
            kept = max(r["kept"][1:] or r["kept"])
            pr = f"{plain / h2d:.2f}" if h2d else "—"
            kr = f"{kept / h2d:.2f}" if h2d else "—"
            lines.append(f"| {wl} | {system} | {' / '.join(f'{x:.1f}' for x in r['plain'])} | "
                         f"{' / '.join(f'{x:.1f}' for x in r['kept'])} | {pr} | {kr} |")
            if h2d:
                targets.append(f"- {_mark(kept / h2d >= 0.85)} iterative {wl} from the second "
                               f"pass ≥ 0.85 × pinned H2D ({system}, keep_pinned): "
                               f"{kept / h2d:.2f}")
    cli = suite.get("cli_map", {})
    if cli:
        lines += ["", "### Issue 17: `conveyor map` .npy → .npy timed from the shell", "",
                  "| system | GiB | shell s | shell GB/s | in-process file→file | "
                  "in-process array→array | shell ÷ file | shell ÷ array |",
                  "|---|---|---|---|---|---|---|---|"]
        for system, r in cli.items():
            if "error" in r:
                lines.append(f"| {system} | failed: {r['error']} | | | | | | |")
                continue
            lines.append(f"| {system} | {r['gib']:g} | {r['shell_seconds']:.2f} | "
                         f"{r['shell_gbps']:.1f} | {r['in_process_file_gbps']:.1f} | "
                         f"{r['in_process_array_gbps']:.1f} | {r['shell_over_file']:.2f} | "
                         f"{r['shell_over_array']:.2f} |")
            targets.append(f"- {_mark(r['shell_over_array'] >= 0.80)} conveyor map from the "
                           f"shell ≥ 0.80 × warm in-process ({system}, array→array): "
                           f"{r['shell_over_array']:.2f} (file→file: "
                           f"{r['shell_over_file']:.2f})")
    if targets:
        lines += ["", "Targets (issue 17), from this run:", "", *targets]
    return lines




def _pinned(suite: dict[str, Any], targets: list[str]) -> list[str]:
    """Target 3: pinned map, stencil and compute-heavy against the H2D ceiling and the best
    peer of the same run."""
    rows = suite["rows"]
    lines = ["", "### Issue 17: pinned inputs against the H2D ceiling and the best peer", "",
             "| workload | system | pinned GB/s | × H2D ceiling | best peer | × best peer |",
             "|---|---|---|---|---|---|"]
    found = False
    for wl in ("map", "stencil", "compute-heavy"):
        peers = [r for p in PEERS if (r := _row(rows, wl, p, "pinned")) is not None]
        best = max(peers, key=lambda r: r["gbps_in"]) if peers else None
        for system in CONVEYOR:
            r = _row(rows, wl, system, "pinned")
            if r is None or r.get("ratio") is None:
                continue
            found = True
            vs = r["gbps_in"] / best["gbps_in"] if best else None
            lines.append(f"| {wl} | {system} | {r['gbps_in']:.1f} | {r['ratio']:.2f} | "
                         + ("— | — |" if best is None else
                            f"{best['system']} {best['gbps_in']:.1f} | {vs:.2f} |"))
            targets.append(f"- {_mark(r['ratio'] >= 0.95)} pinned {wl} ≥ 0.95 × pinned H2D "
                           f"ceiling ({system}): {r['ratio']:.2f}")
            if vs is not None:
                targets.append(f"- {_mark(vs >= 1.02)} pinned {wl} ≥ 1.02 × best peer "
                               f"({system}): {vs:.2f} × {best['system']}")
    return lines if found else []
