"""Figures of a simulation run, computed from the same independent log the checker reads."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from leaseguard.simulate.checker import CheckReport
from leaseguard.simulate.engine import SimulationResult

ARRIVAL_ROWS = {
    "ran": "acquired the lease on arrival",
    "forwarded": "forwarded to the owner",
    "duplicate": "duplicate deliveries ignored",
    "error": "failed on arrival (retried)",
    "killed": "killed before answering (retried)",
}
"""How each event's first delivery was answered (its ``leaseguard`` status, or ``killed`` when
its worker died first), as the summary names them. Every event has exactly one, so these rows
add up to the invocations."""


@dataclass(frozen=True)
class Summary:
    invocations: int
    acquired: int
    forwarded: int
    duplicates: int
    failed_on_arrival: int
    killed_on_arrival: int
    other_arrivals: dict[str, int]
    """First answers with a status :data:`ARRIVAL_ROWS` does not name, by status."""
    handed_off_inline: int
    handed_off_by_invoke: int
    drained_by_owner: int
    adopted_orphans: int
    """Both of the two below: queued events that ran with no owner to hand them on."""
    adopted_by_sweeper: int
    """Keys the sweeper found free with events queued (an owner killed, or a lapsed lease)."""
    adopted_on_arrival: int
    """Arrivals that found their key free with events queued and ran the queue's head before
    their own event: the key's owner had been killed, its lease had lapsed, or a hand-off's
    lease ran out before the invocation it was handed to claimed it."""
    lease_lost: int
    kills: int
    explained_duplicates: int
    overlaps_after_lapse: int
    reruns_after_lapse: int
    handled: int
    wait_p50_ms: float
    wait_p99_ms: float
    hold_p50_ms: float
    hold_p99_ms: float
    throughput_per_s: float
    wall_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def summarize(result: SimulationResult, report: CheckReport) -> Summary:
    records = result.records
    first = [r for r in records if r["type"] == "invoke" and r.get("attempt") == 0]
    statuses = Counter(r["status"] for r in first if r["kind"] == "event")
    # An event whose first delivery has no invoke record was killed before it answered (a
    # kill record stands in its place, and the retry is attempt 1).
    answered = {r["event"] for r in first if r["kind"] == "event"}
    statuses["killed"] = sum(1 for e in result.events if e["id"] not in answered)
    runs_by_inv: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        if rec["type"] == "start":
            runs_by_inv[rec["inv"]].append(rec)
    # Invoke records name each invocation's kind and own event; a killed invocation has only
    # its kill record, which carries the same fields.
    kind_of = {r["inv"]: r["kind"] for r in records if r["type"] in ("invoke", "kill")}
    own_event = {r["inv"]: r.get("event") for r in records if r["type"] in ("invoke", "kill")}
    inline = by_invoke = adopted_on_arrival = 0
    for inv, runs in runs_by_inv.items():
        runs.sort(key=lambda r: r["t"])
        kind = kind_of.get(inv)
        if kind == "handoff":
            by_invoke += 1
        elif kind == "event" and runs[0]["event"] != own_event.get(inv):
            adopted_on_arrival += 1  # the key's owner had died: its signals ran first
        inline += len(runs) - 1
    invoked_at = {r["event"]: r["t0"] for r in first if r.get("event")}
    began: dict[str, int] = {}
    for rec in records:
        if rec["type"] == "begin":
            began[rec["event"]] = min(began.get(rec["event"], rec["t"]), rec["t"])
    waits = [(began[e] - t0) / 1e6 for e, t0 in invoked_at.items() if e in began]
    holds = [(run.end - run.start) / 1e6 for run in report.runs]
    handled = sum(report.handled.values())
    return Summary(
        invocations=len(result.events),
        acquired=statuses["ran"],
        forwarded=statuses["forwarded"],
        duplicates=statuses["duplicate"],
        failed_on_arrival=statuses["error"],
        killed_on_arrival=statuses["killed"],
        other_arrivals={s: n for s, n in sorted(statuses.items()) if s not in ARRIVAL_ROWS and n},
        handed_off_inline=inline,
        handed_off_by_invoke=by_invoke,
        drained_by_owner=sum(len(r["events"]) for r in records if r["type"] == "take"),
        adopted_orphans=result.adopted + adopted_on_arrival,
        adopted_by_sweeper=result.adopted,
        adopted_on_arrival=adopted_on_arrival,
        lease_lost=report.lapsed_grants,  # found by a renewal, at a run's end or its hand-off
        kills=result.kills,
        explained_duplicates=report.explained_duplicates,
        overlaps_after_lapse=report.overlaps_after_lapse,
        reruns_after_lapse=report.reruns_after_lapse,
        handled=handled,
        wait_p50_ms=round(_percentile(waits, 50), 1),
        wait_p99_ms=round(_percentile(waits, 99), 1),
        hold_p50_ms=round(_percentile(holds, 50), 1),
        hold_p99_ms=round(_percentile(holds, 99), 1),
        throughput_per_s=round(handled / result.wall_s, 1) if result.wall_s else 0.0,
        wall_s=round(result.wall_s, 2),
    )


def arrival_rows(summary: Summary) -> list[tuple[str, int]]:
    """One row per outcome of an event's first delivery; they add up to the invocations."""
    rows = [
        (ARRIVAL_ROWS["ran"], summary.acquired),
        (ARRIVAL_ROWS["forwarded"], summary.forwarded),
        (ARRIVAL_ROWS["duplicate"], summary.duplicates),
        (ARRIVAL_ROWS["error"], summary.failed_on_arrival),
        (ARRIVAL_ROWS["killed"], summary.killed_on_arrival),
    ]
    rows += [(f"answered {status!r} on arrival", n) for status, n in summary.other_arrivals.items()]
    return rows
