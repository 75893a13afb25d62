"""Verifies a simulation from an independent log of what every handler did.

The log is written by the simulated handlers and the invocation driver, not by leaseguard, so a
provider cannot vouch for itself. Clock: ``time.monotonic_ns()``, which on Linux is one
system-wide clock, so timestamps from different processes compare directly.

Invariants, per key:

1. **Mutual exclusion**: handler runs (one per lease grant) never overlap in time, unless the
   earlier run's grant *lapsed*: it was found lost (its handle's ``on_lost``) and the later run
   started after the time until which the earlier grant was certainly held (its
   ``valid_until``: the TTL from the last renewal sent that succeeded). That is the documented
   limit (a renewal later than the TTL, as on an overloaded machine; docs/safety.md), counted
   apart; an overlap with a grant that was still certainly held is a double grant.
2. **Fencing**: in start order, each run's token is strictly greater than the previous run's,
   or equal when both ran under the same grant (the same owner: a ``drain_batch`` batch).
3. **Exactly once**: every event's work completed exactly once. With kills on, an event may
   complete more than once only if a killed invocation had touched it (ran it, took it, or
   it was that invocation's own event): those duplicates are counted as *explained*. An
   event handled by a grant that lapsed may run again (invariant d of docs/protocol.md), once
   that grant's ``valid_until`` has passed: counted apart too.
4. **FIFO**: of two forwarded events, if the first was queued (its invocation returned) before
   the second's invocation began, the first started before the second.
5. **Nothing left behind**: no event is unhandled when the run ends.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

Record = dict[str, Any]


@dataclass(frozen=True)
class Violation:
    kind: str  # overlap | token | duplicate | fifo | lost
    key: str
    detail: str


@dataclass
class RunInfo:
    run: str
    key: str
    owner: str
    token: int | None
    start: int
    end: int
    worker: int
    invocation: str
    completed: bool


@dataclass
class CheckReport:
    violations: list[Violation] = field(default_factory=list)
    runs: list[RunInfo] = field(default_factory=list)
    handled: Counter[str] = field(default_factory=Counter)
    explained_duplicates: int = 0
    killed_invocations: int = 0
    lapsed_grants: int = 0  # grants found lost (by a renewal, at their run's end or hand-off)
    overlaps_after_lapse: int = 0
    reruns_after_lapse: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_kind(self) -> Counter[str]:
        return Counter(v.kind for v in self.violations)


def runs_from(records: Iterable[Record]) -> list[RunInfo]:
    """One :class:`RunInfo` per handler run. A run whose process was killed has no ``end``; its
    interval ends at the last record that process wrote (a replacement worker has a new pid)."""
    starts: dict[str, Record] = {}
    ends: dict[str, int] = {}
    last_seen: dict[int, int] = defaultdict(int)
    for rec in records:
        pid = rec.get("pid")
        stamp = int(rec.get("t") or rec.get("t1") or 0)
        if isinstance(pid, int):
            last_seen[pid] = max(last_seen[pid], stamp)
        if rec["type"] == "start":
            starts[rec["run"]] = rec
        elif rec["type"] == "end":
            ends[rec["run"]] = rec["t"]
    runs = []
    for run_id, rec in starts.items():
        completed = run_id in ends
        end = ends.get(run_id, max(last_seen[rec.get("pid", -1)], rec["t"]))
        runs.append(
            RunInfo(
                run_id,
                rec["key"],
                rec["owner"],
                rec.get("token"),
                rec["t"],
                end,
                rec["worker"],
                rec.get("inv", ""),
                completed,
            )
        )
    runs.sort(key=lambda r: (r.key, r.start))
    return runs


def lapses_from(records: Iterable[Record]) -> dict[tuple[str, int], int]:
    """For every grant (key, token) that was found lost: the ``time.monotonic_ns()`` until which
    it was certainly held (the latest its records report). A grant missing here never lapsed."""
    records = list(records)
    token_of = {
        rec["run"]: (rec["key"], rec["token"])
        for rec in records
        if rec["type"] == "start" and rec.get("token") is not None
    }
    valid_until: dict[tuple[str, int], int] = {}
    lost: set[tuple[str, int]] = set()
    for rec in records:
        if rec["type"] == "lost" and rec.get("token") is not None:
            grant = (rec["key"], rec["token"])
            lost.add(grant)
        elif rec["type"] == "end" and rec["run"] in token_of:
            grant = token_of[rec["run"]]
            if rec.get("lost"):
                lost.add(grant)
        else:
            continue
        if rec.get("valid_until") is not None:
            valid_until[grant] = max(valid_until.get(grant, 0), int(rec["valid_until"]))
    return {grant: until for grant, until in valid_until.items() if grant in lost}


def check(records: list[Record], expected_events: Iterable[str]) -> CheckReport:
    report = CheckReport()
    runs = runs_from(records)
    report.runs = runs
    lapsed = lapses_from(records)
    report.lapsed_grants = len(lapsed)

    def lapsed_before(run: RunInfo, stamp: int) -> bool:
        """Whether ``run``'s grant lapsed and was no longer certainly held at ``stamp``."""
        until = lapsed.get((run.key, run.token)) if run.token is not None else None
        return until is not None and until <= stamp

    by_key: dict[str, list[RunInfo]] = defaultdict(list)
    for run in runs:
        by_key[run.key].append(run)
    for key, key_runs in by_key.items():
        for before, after in itertools.pairwise(key_runs):
            if after.start < before.end and lapsed_before(before, after.start):
                report.overlaps_after_lapse += 1
            elif after.start < before.end:
                report.violations.append(
                    Violation(
                        "overlap",
                        key,
                        f"run {after.run} ({after.owner}, token {after.token}) started while "
                        f"{before.run} ({before.owner}, token {before.token}) was still running",
                    )
                )
            same_grant = after.token == before.token and after.owner == before.owner
            if (
                after.token is None
                or before.token is None
                or after.token < before.token
                or (after.token == before.token and not same_grant)
            ):
                report.violations.append(
                    Violation(
                        "token",
                        key,
                        f"token {after.token} of {after.owner} is not above {before.token} of "
                        f"{before.owner}",
                    )
                )

    killed = {rec["inv"] for rec in records if rec["type"] == "kill"}
    report.killed_invocations = len(killed)
    touched_by_killed: set[str] = set()
    for rec in records:
        if rec.get("inv") in killed:
            if rec["type"] in ("start", "invoke", "kill") and rec.get("event"):
                touched_by_killed.add(rec["event"])
            elif rec["type"] == "take":
                touched_by_killed.update(rec["events"])

    handled: Counter[str] = Counter()
    first_start: dict[str, int] = {}
    event_key: dict[str, str] = {}
    run_of = {run.run: run for run in runs}
    handlers: dict[str, list[RunInfo]] = defaultdict(list)  # the runs that completed each event
    for rec in records:
        if rec["type"] == "handled":
            handled[rec["event"]] += 1
            event_key[rec["event"]] = rec["key"]
            if rec.get("run") in run_of:
                handlers[rec["event"]].append(run_of[rec["run"]])
        elif rec["type"] == "begin":
            stamp = rec["t"]
            first_start[rec["event"]] = min(first_start.get(rec["event"], stamp), stamp)
    report.handled = handled
    for event in expected_events:
        count = handled.get(event, 0)
        if count == 0:
            report.violations.append(
                Violation("lost", event_key.get(event, "?"), f"event {event} was never handled")
            )
        elif count > 1:
            if event in touched_by_killed:
                report.explained_duplicates += count - 1
            elif _reruns_follow_lapses(handlers[event], lapsed_before, count):
                report.reruns_after_lapse += count - 1
            else:
                report.violations.append(
                    Violation(
                        "duplicate",
                        event_key.get(event, "?"),
                        f"event {event} was handled {count} times and no kill explains it",
                    )
                )

    # Arrival order is that of first deliveries: a platform retry of a crashed invocation is
    # the same event arriving again (it may already have run), not a new one to order.
    forwarded: dict[str, list[Record]] = defaultdict(list)
    for rec in records:
        if rec["type"] == "invoke" and rec["status"] == "forwarded" and rec.get("attempt") == 0:
            forwarded[rec["key"]].append(rec)
    for key, recs in forwarded.items():
        report.violations.extend(_fifo_violations(key, recs, first_start))
    return report


def _fifo_violations(key: str, recs: list[Record], first_start: dict[str, int]) -> list[Violation]:
    """Forwards that did not overlap in time must start in forward order. One sweep in order of
    invocation start, keeping the latest first-start among forwards that had already
    returned: O(n log n), so long simulations stay cheap to verify."""
    found: list[Violation] = []
    returned = sorted(recs, key=lambda r: r["t1"])
    latest: tuple[int, str] | None = None
    j = 0
    for late in sorted(recs, key=lambda r: r["t0"]):
        while j < len(returned) and returned[j]["t1"] < late["t0"]:
            early = returned[j]
            started = first_start.get(early["event"])
            if started is not None and (latest is None or started > latest[0]):
                latest = (started, early["event"])
            j += 1
        started = first_start.get(late["event"])
        overtaken = latest is not None and started is not None and latest[0] > started
        if overtaken and latest is not None and latest[1] != late["event"]:
            found.append(
                Violation(
                    "fifo", key, f"{late['event']} was forwarded after {latest[1]} but ran first"
                )
            )
    return found


def _reruns_follow_lapses(
    runs: list[RunInfo], lapsed_before: Callable[[RunInfo, int], bool], count: int
) -> bool:
    """Whether each completion of an event after its first ran in a run that started once an
    earlier run that completed it had lapsed (its grant found lost and no longer held)."""
    if len(runs) != count:
        return False  # a completion whose run is unknown explains nothing
    ordered = sorted(runs, key=lambda r: r.start)
    return all(
        any(lapsed_before(earlier, later.start) for earlier in ordered[:i])
        for i, later in enumerate(ordered[1:], start=1)
    )
