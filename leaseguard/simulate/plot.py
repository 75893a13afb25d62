"""The timeline picture of a simulation: one lane per key, a bar per owner's hold."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from leaseguard.errors import extra_required
from leaseguard.simulate.checker import CheckReport
from leaseguard.simulate.engine import SimulationResult

_COLORS = ("#4C72B0", "#55A868", "#8172B2", "#CCB974", "#64B5CD", "#DD8452")


def plot_timeline(result: SimulationResult, report: CheckReport, path: str | Path) -> Path:
    """Write a PNG: for each key, bars for each owner's hold (a new colour per fencing token),
    ticks where events were forwarded to the owner, diamonds where the lease was handed off
    within an invocation, red crosses where a worker was killed, and red outlines around any
    violation the checker found."""
    with extra_required("cli", "the timeline picture (--plot)"):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

    start = result.started_ns
    keys = sorted({run.key for run in report.runs} | {e["key"] for e in result.events})
    lane = {key: i for i, key in enumerate(keys)}
    height = max(2.5, 0.55 * len(keys) + 1.6)
    fig, ax = plt.subplots(figsize=(13, height), dpi=110)

    def x(ns: int) -> float:
        return (ns - start) / 1e9

    runs_by_key: dict[str, list[Any]] = defaultdict(list)
    for run in report.runs:
        runs_by_key[run.key].append(run)
    bad_keys = {v.key for v in report.violations if v.kind in ("overlap", "token")}
    for key, runs in runs_by_key.items():
        y = lane[key]
        for i, run in enumerate(runs):
            ax.broken_barh(
                [(x(run.start), max(x(run.end) - x(run.start), 0.002))],
                (y - 0.32, 0.64),
                facecolors=_COLORS[i % len(_COLORS)],
                edgecolors="red" if key in bad_keys else "none",
                linewidth=1.2,
            )
    inline_starts: list[tuple[float, int]] = []
    by_inv: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in result.records:
        if rec["type"] == "start":
            by_inv[rec["inv"]].append(rec)
    kind_of = {r["inv"]: r["kind"] for r in result.records if r["type"] in ("invoke", "kill")}
    remote_starts: list[tuple[float, int]] = []
    for inv, runs in by_inv.items():
        runs.sort(key=lambda r: r["t"])
        inline_starts += [(x(r["t"]), lane[r["key"]]) for r in runs[1:] if r["key"] in lane]
        if kind_of.get(inv) in ("handoff", "sweep") and runs[0]["key"] in lane:
            remote_starts.append((x(runs[0]["t"]), lane[runs[0]["key"]]))
    forwards = [
        (x(r["t1"]), lane[r["key"]])
        for r in result.records
        if r["type"] == "invoke" and r["status"] == "forwarded" and r.get("key") in lane
    ]
    kills = [_kill_mark(result, r, lane, x) for r in result.records if r["type"] == "kill"]
    if forwards:
        fx, fy = zip(*forwards, strict=True)
        ax.scatter(fx, [v + 0.42 for v in fy], marker="|", s=40, color="#555555", linewidths=0.8)
    if inline_starts:
        ix, iy = zip(*inline_starts, strict=True)
        ax.scatter(ix, iy, marker="D", s=10, color="black", zorder=3)
    if remote_starts:
        rx, ry = zip(*remote_starts, strict=True)
        ax.scatter(rx, ry, marker="^", s=28, color="white", edgecolors="black", zorder=3)
    if kills:
        kx, ky = zip(*kills, strict=True)
        ax.scatter(kx, ky, marker="x", s=60, color="red", linewidths=2, zorder=4)

    ax.set_yticks(range(len(keys)), keys)
    ax.set_ylim(-1, len(keys))
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first invocation")
    verdict = "verified: no violation" if report.ok else f"{len(report.violations)} VIOLATIONS"
    ax.set_title(
        f"leaseguard simulate: {len(result.events)} invocations, {len(report.runs)} lease grants"
        f", {result.kills} kills - {verdict}",
        color="black" if report.ok else "red",
    )
    ax.grid(axis="x", alpha=0.3)
    ax.legend(
        handles=[
            Patch(color=_COLORS[0], label="owner holds the lease (colour changes with the token)"),
            Line2D([], [], marker="|", linestyle="", color="#555555", label="event forwarded"),
            Line2D(
                [],
                [],
                marker="D",
                linestyle="",
                color="black",
                markersize=4,
                label="handed off inline",
            ),
            Line2D(
                [],
                [],
                marker="^",
                linestyle="",
                color="white",
                markeredgecolor="black",
                label="new invocation (async invoke or sweeper)",
            ),
            Line2D([], [], marker="x", linestyle="", color="red", label="worker killed"),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.18 if len(keys) < 6 else -0.1),
        ncol=5,
        frameon=False,
        fontsize=8,
    )
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


def _kill_mark(
    result: SimulationResult, kill: dict[str, Any], lane: dict[str, int], x: Any
) -> tuple[float, float]:
    """At the killed invocation's last record (the coordinator notices the death later)."""
    last = max(
        (r for r in result.records if r.get("inv") == kill["inv"] and r.get("key") in lane),
        key=lambda r: int(r.get("t") or r.get("t1") or 0),
        default=None,
    )
    if last is None:
        return x(kill["t"]), -0.8
    return x(last.get("t", last.get("t1", kill["t"]))), lane[last["key"]]
