"""suite.json, suite.md (tables to paste into RESULTS.md) and suite.png, and the issue's
targets evaluated from the same run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .workloads import NAMES

CONVEYOR = ("conveyor-cuda", "conveyor-opencl")
PEERS = ("pyopencl-naive", "cupy-naive", "cupy-pipeline", "pytorch")
KINDS = ("pageable", "pinned")


def _row(rows: list[dict[str, Any]], wl: str, system: str, kind: str) -> dict[str, Any] | None:
    for row in rows:
        if (row["workload"], row["system"], row["kind"]) == (wl, system, kind):
            return row if row.get("status") == "ok" else None
    return None


def _f(value: Any, fmt: str = ".2f") -> str:
    return "—" if value is None else format(value, fmt)


def targets(suite: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target of issue 6 with its figures: status "met", "missed" or "n/a"."""
    rows = suite["rows"]
    found: list[dict[str, Any]] = []

    def add(target: str, status: str, detail: str) -> None:
        found.append({"target": target, "status": status, "detail": detail})

    for kind, floor in (("pinned", 0.95), ("pageable", 0.85)):
        for wl in ("map", "filter-sum"):
            for system in CONVEYOR:
                row = _row(rows, wl, system, kind)
                name = f"{kind} {wl} ≥ {floor:.2f} × pinned H2D ceiling ({system})"
                if row is None or row.get("ratio") is None:
                    add(name, "n/a", "no result")
                    continue
                add(name, "met" if row["ratio"] >= floor else "missed",
                    f"{row['gbps_in']:.1f} GB/s = {row['ratio']:.2f} × {row['ceiling']:.1f}")
    bound = suite.get("kernel_alone", {})
    for system in CONVEYOR:
        for kind in KINDS:
            row = _row(rows, "compute-heavy", system, kind)
            name = f"compute-heavy exposed transfer ≤ 5% of wall ({system}, {kind})"
            share = None if row is None else row["extra"].get("exposed_share")
            if share is None:
                add(name, "n/a", "no result" if row is None else "no device timeline")
                continue
            note = ""
            alone = bound.get(row["device"])
            if alone:
                note = (f"; kernel alone {alone['seconds'] * 1e3:.1f} ms vs link "
                        f"{alone['link_seconds'] * 1e3:.1f} ms: "
                        + ("compute-bound" if alone["compute_bound"] else
                           "NOT compute-bound, so transfer cannot hide under compute"))
            add(name, "met" if share <= 0.05 else "missed",
                f"{share:.1%} ({row['extra']['exposed_transfer_seconds'] * 1e3:.1f} ms of "
                f"{row['seconds'] * 1e3:.1f} ms){note}")
    for wl in NAMES:
        for kind in KINDS:
            ours = _row(rows, wl, "conveyor-cuda", kind)
            peers = [r for p in PEERS if (r := _row(rows, wl, p, kind)) is not None]
            name = f"conveyor-cuda ≥ 1.05 × best peer ({wl}, {kind})"
            if ours is None or not peers:
                add(name, "n/a", "no conveyor-cuda result" if ours is None else "no peer result")
                continue
            best = max(peers, key=lambda r: r["gbps_in"])
            ratio = ours["gbps_in"] / best["gbps_in"]
            add(name, "met" if ratio >= 1.05 else "missed",
                f"{ours['gbps_in']:.1f} vs {best['system']} {best['gbps_in']:.1f} GB/s = "
                f"{ratio:.2f}×")
    for wl in NAMES:
        for kind in KINDS:
            cuda, ocl = (_row(rows, wl, s, kind) for s in CONVEYOR)
            name = f"conveyor-opencl within 10% of conveyor-cuda ({wl}, {kind})"
            if cuda is None or ocl is None:
                add(name, "n/a", "needs both conveyor rows")
                continue
            ratio = ocl["gbps_in"] / cuda["gbps_in"]
            add(name, "met" if ratio >= 0.90 else "missed",
                f"{ocl['gbps_in']:.1f} vs {cuda['gbps_in']:.1f} GB/s = {ratio:.2f}×")
    return found


def markdown(suite: dict[str, Any]) -> str:
    """The tables and target lines of ``suite`` as markdown."""
    o = suite["options"]
    lines = [
        f"## {suite['date']} — conveyor vs peers (bench/suite, {suite['gpu'] or 'no GPU'})",
        "",
        f"Driver {suite['driver']}; {suite['host']['cpus']} CPUs; sizes --gib {o['gib']:g}, "
        f"{o['block_mib']} MiB blocks per input, depth/streams {o['depth']}, best of "
        f"{o['repeats']} runs after a warm-up, every result checked against NumPy; "
        f"{suite['elapsed_seconds']:.0f} s in all. Ratios are to the pinned H2D ceiling of "
        f"the device the row ran on, measured in this run.",
        "",
        "| device | pinned H2D GB/s | pinned D2H | both at once | pageable H2D | pageable D2H |",
        "|---|---|---|---|---|---|",
    ]
    ceil = suite["ceilings"]
    for spec, fig in ceil.get("devices", {}).items():
        lines.append(
            f"| {spec} {fig['name']} | {fig['pinned_h2d']:.1f} | {fig['pinned_d2h']:.1f} | "
            f"{fig['pinned_both']:.1f} | {_f(fig.get('pageable_h2d'), '.1f')} | "
            f"{_f(fig.get('pageable_d2h'), '.1f')} |")
    if "host_memcpy_to_pinned" in ceil:
        lines += ["", f"Host memcpy pageable → pinned, {ceil['host_memcpy_threads']} threads: "
                      f"{ceil['host_memcpy_to_pinned']:.1f} GB/s ({ceil['bytes'] / 2**30:g} GiB "
                      "copies)."]
    if suite.get("skipped"):
        lines += ["", "Not run here: " + "; ".join(
            f"{name} ({why.removeprefix('skipped: ')})" for name, why in suite["skipped"].items())
            + "."]
    titles = suite.get("titles", {})
    for wl in NAMES:
        wl_rows = [r for r in suite["rows"] if r["workload"] == wl
                   and r["system"] not in suite.get("skipped", {})]
        if not wl_rows:
            continue
        lines += ["", f"### {wl}: {titles.get(wl, '')}", "",
                  "| system | input | input GB/s | × H2D ceiling | seconds | overlap | "
                  "exposed transfer | bound | check |", "|---|---|---|---|---|---|---|---|---|"]
        for r in wl_rows:
            if r["status"] != "ok":
                lines.append(f"| {r['system']} | {r['kind']} | {r['status']} | | | | | | |")
                continue
            x = r["extra"]
            lines.append(
                f"| {r['system']} | {r['kind']} | {r['gbps_in']:.1f} | {_f(r['ratio'])} | "
                f"{r['seconds']:.3f} | {_f(x.get('overlap'))} | {_f(x.get('exposed_share'), '.1%')}"
                f" | {x.get('bound') or '—'} | {r['check']} |")
        if wl == "compute-heavy":
            for spec, alone in suite.get("kernel_alone", {}).items():
                lines += ["", f"Kernel alone on {spec} (one block resident, launched "
                              f"{alone['blocks']} times): {alone['seconds'] * 1e3:.1f} ms; the "
                              f"copies at the pinned ceilings: {alone['link_seconds'] * 1e3:.1f}"
                              f" ms; " + ("compute-bound." if alone["compute_bound"] else
                                          "not compute-bound (the link is the bound).")]
    from . import issue17

    lines += issue17.markdown(suite)
    lines += ["", "Targets (issue 6), from this run:", ""]
    for t in suite["targets"]:
        lines.append(f"- **{t['status']}** {t['target']}: {t['detail']}")
    return "\n".join(lines) + "\n"


def plot(suite: dict[str, Any], path: Path) -> None:
    """Grouped bars of input GB/s per workload, one bar per system and input kind, with the
    pinned H2D ceiling(s) as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in suite["rows"] if r["status"] == "ok"]
    series = [(s, k) for s in (*CONVEYOR, *PEERS) for k in KINDS
              if any(r["system"] == s and r["kind"] == k for r in ok)]
    workloads = [w for w in NAMES if any(r["workload"] == w for r in ok)]
    fig, ax = plt.subplots(figsize=(14, 5.5))
    width = 0.8 / max(len(series), 1)
    colors = plt.get_cmap("tab10")
    for i, (system, kind) in enumerate(series):
        xs, ys = [], []
        for j, wl in enumerate(workloads):
            row = _row(ok, wl, system, kind)
            if row is not None:
                xs.append(j - 0.4 + (i + 0.5) * width)
                ys.append(row["gbps_in"])
        bars = ax.bar(xs, ys, width, label=f"{system} ({kind})",
                      color=colors((*CONVEYOR, *PEERS).index(system)),
                      hatch="//" if kind == "pinned" else None, edgecolor="white")
        ax.bar_label(bars, fmt="%.1f", fontsize=6)
    styles = iter(("--", ":", "-."))
    for spec, fig_c in suite["ceilings"].get("devices", {}).items():
        ax.axhline(fig_c["pinned_h2d"], color="black", linestyle=next(styles, "--"),
                   linewidth=1, label=f"pinned H2D ceiling {spec} ({fig_c['pinned_h2d']:.1f})")
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("input GB/s")
    ax.set_title(f"conveyor vs peers, {suite['gpu'] or 'no GPU'} ({suite['date']})")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(suite: dict[str, Any], out: Path) -> str:
    """Write suite.json, suite.md and suite.png into ``out``; return the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    suite["targets"] = targets(suite)
    text = markdown(suite)
    (out / "suite.json").write_text(json.dumps(suite, indent=1, default=str) + "\n")
    (out / "suite.md").write_text(text)
    try:
        plot(suite, out / "suite.png")
    except ImportError as exc:
        print(f"no suite.png: {exc}")
    return text
