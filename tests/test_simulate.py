"""The simulator's checker fails on broken providers and passes on real ones."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from collections import Counter
from typing import Any

import pytest
from rich.console import Console

from leaseguard.cli.simulate_cmd import _print_summary, _print_verdict
from leaseguard.config import ProviderConfig
from leaseguard.contract import LeaseResult
from leaseguard.providers.memory import InMemoryLeaseProvider
from leaseguard.signals import Signal
from leaseguard.simulate.checker import check
from leaseguard.simulate.engine import Simulation, SimulationConfig, _Outbox
from leaseguard.simulate.summary import arrival_rows, summarize


def simulate(provider: InMemoryLeaseProvider, **options: object) -> tuple[object, object]:
    config = SimulationConfig(
        ProviderConfig(backend="memory"),
        **{
            "workers": 4,
            "invocations": 150,
            "keys": 2,
            "work_ms": (2, 8),
            "threads": True,
            "quiesce_timeout_s": 30,
            **options,
        },  # type: ignore[arg-type]
    )
    result = Simulation(config, provider=provider).run()
    return result, check(result.records, [e["id"] for e in result.events])


class TwoOwners(InMemoryLeaseProvider):
    """Grants a held key to every third newcomer as well, with a made-up lower token."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.guard = threading.Lock()

    def _acquire_or_enqueue(
        self, key: str, signal: Signal, record: str, ttl_ms: int, max_queue: int
    ) -> LeaseResult:
        with self.guard:
            self.calls += 1
            rogue = self.calls % 3 == 0
        result = super()._acquire_or_enqueue(key, signal, record, ttl_ms, max_queue)
        if not result.acquired and rogue and result.position:
            return LeaseResult(True, signal.id, 1)  # "you own it too"
        return result


class DropsSignals(InMemoryLeaseProvider):
    """Says it queued every fourth forwarded signal but throws it away."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def _acquire_or_enqueue(
        self, key: str, signal: Signal, record: str, ttl_ms: int, max_queue: int
    ) -> LeaseResult:
        held = self.get_lease_owner(key)
        self.calls += 1
        if held is not None and held != signal.id and self.calls % 4 == 0:
            return LeaseResult(False, held, None, position=1)
        return super()._acquire_or_enqueue(key, signal, record, ttl_ms, max_queue)


class Reorders(InMemoryLeaseProvider):
    """Serves the queue newest first."""

    def _acquire_or_enqueue(
        self, key: str, signal: Signal, record: str, ttl_ms: int, max_queue: int
    ) -> LeaseResult:
        result = super()._acquire_or_enqueue(key, signal, record, ttl_ms, max_queue)
        if not result.acquired and result.position:
            with self._lock:
                queue = self._keys[key].queue
                queue.insert(0, queue.pop())  # jump the queue
        return result


class LateRenewals(InMemoryLeaseProvider):
    """A correct provider on an overloaded machine: every eighth renewal arrives after the lease
    ran out (the renewer's thread was not scheduled in time)."""

    def __init__(self, late_s: float) -> None:
        super().__init__()
        self.late_s = late_s
        self.renewals = 0

    def _renew(self, key: str, owner: str, ttl_ms: int, token: int | None = None) -> bool:
        self.renewals += 1
        if self.renewals % 8 == 0:
            time.sleep(self.late_s)
        return super()._renew(key, owner, ttl_ms, token)


class RevokesLeases(InMemoryLeaseProvider):
    """Broken: every fourth forward onto a held key first cuts the owner's live lease to 1 ms
    and grants the key anew, while the owner still certainly holds it by its own renewals."""

    def __init__(self) -> None:
        super().__init__()
        self.forwards = 0

    def _acquire_or_enqueue(
        self, key: str, signal: Signal, record: str, ttl_ms: int, max_queue: int
    ) -> LeaseResult:
        held = self.inspect_key(key)
        if held.owner is not None and held.owner != signal.id:
            self.forwards += 1
            if self.forwards % 4 == 0:
                self._renew(key, held.owner, 1, held.token)
                time.sleep(0.002)
        return super()._acquire_or_enqueue(key, signal, record, ttl_ms, max_queue)


def test_lapsed_leases_are_told_apart_from_double_grants() -> None:
    """Renewals later than the TTL let leases lapse: the runs after them overlap the stale
    owner's and re-run its events, as docs/safety.md allows, and the checker counts that apart.
    The same lapse forced by a provider while the owner still held the lease is a violation."""
    lapsing = dict(drain=0, ttl_ms=100, work_ms=(20, 60), invocations=80, seed=5)
    result, report = simulate(LateRenewals(late_s=0.25), **lapsing)
    assert report.ok, report.violations  # type: ignore[attr-defined]
    assert report.lapsed_grants > 0  # type: ignore[attr-defined]
    after_lapse = report.overlaps_after_lapse + report.reruns_after_lapse  # type: ignore[attr-defined]
    assert after_lapse > 0, report  # the lapses had consequences the checker had to explain
    assert min(report.handled[e["id"]] for e in result.events) >= 1  # type: ignore[attr-defined]
    summary = summarize(result, report)  # type: ignore[arg-type]
    assert summary.lease_lost == report.lapsed_grants  # type: ignore[attr-defined]
    console = Console(record=True, width=120)
    _print_summary(console, summary)
    _print_verdict(console, report, result)
    shown = console.export_text()
    assert "re-runs after a lapse (explained)" in shown or "overlaps after a lapse" in shown
    assert f"{report.lapsed_grants} lease(s) lapsed" in shown  # type: ignore[attr-defined]
    assert "re-runs only after kills or lapsed leases" in shown

    # (a second simulation in this process: its workers' log must not be the first one's)
    _, revoked = simulate(RevokesLeases(), drain=0, ttl_ms=200, work_ms=(10, 30), seed=5)
    # its owners saw the loss too, yet their leases were cut while certainly held: violations
    assert revoked.lapsed_grants > 0  # type: ignore[attr-defined]
    assert revoked.by_kind()["overlap"] > 0, revoked.violations  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("broken", "expected"),
    [(TwoOwners, "overlap"), (DropsSignals, "lost"), (Reorders, "fifo")],
    ids=["two-owners", "drops-signals", "reorders"],
)
def test_checker_catches_a_broken_provider(
    broken: type[InMemoryLeaseProvider], expected: str
) -> None:
    _, report = simulate(broken(), drain=0)
    kinds = report.by_kind()  # type: ignore[attr-defined]
    assert kinds[expected] > 0, kinds
    assert not report.ok  # type: ignore[attr-defined]


def test_two_owners_also_breaks_fencing() -> None:
    _, report = simulate(TwoOwners(), drain=0)
    assert report.by_kind()["token"] > 0  # type: ignore[attr-defined]


def test_checker_passes_on_the_real_memory_provider() -> None:
    result, report = simulate(InMemoryLeaseProvider())
    assert report.ok, report.violations  # type: ignore[attr-defined]
    summary = summarize(result, report)  # type: ignore[arg-type]
    assert summary.invocations == 150 and summary.handled == 150
    assert summary.forwarded > 0 and summary.acquired > 0
    assert sum(count for _, count in arrival_rows(summary)) == summary.invocations
    assert summary.killed_on_arrival == 0 and summary.adopted_by_sweeper == 0
    console = Console(record=True, width=120)
    _print_summary(console, summary)
    shown = console.export_text()
    for name, count in arrival_rows(summary):  # each outcome its own row, named and counted
        cells = ([w for w in line.split() if w != "│"] for line in shown.splitlines())
        assert [*name.split(), str(count)] in cells, name


def test_kills_are_survived_and_explained_on_redis(redis_url: str) -> None:
    config = SimulationConfig(
        ProviderConfig(backend="redis", redis_url=redis_url, key_prefix="sim-kill:"),
        workers=4,
        invocations=150,
        keys=3,
        work_ms=(5, 20),
        kill_rate=0.05,
        ttl_ms=500,
        sweep_every_ms=100,
        seed=3,
    )
    result = Simulation(config).run()
    assert result.quiesced, (result.stuck, result.unfinished)
    report = check(result.records, [e["id"] for e in result.events])
    assert report.ok, report.violations
    assert result.kills > 0
    assert min(report.handled[e["id"]] for e in result.events) >= 1  # nothing lost
    statuses = Counter(r["status"] for r in result.records if r["type"] == "invoke")
    assert statuses["error"] == 0
    # Each event's first delivery has one outcome, a kill before it answered included: the
    # summary's arrival rows add up to the events (they came to fewer, the kills left out).
    summary = summarize(result, report)
    rows = dict(arrival_rows(summary))
    assert sum(rows.values()) == summary.invocations == 150
    killed_first = {
        e["id"]
        for e in result.events
        if not any(
            r["type"] == "invoke" and r["attempt"] == 0 and r["event"] == e["id"]
            for r in result.records
        )
    }
    assert rows["killed before answering (retried)"] == len(killed_first) <= result.kills
    assert summary.adopted_orphans == summary.adopted_by_sweeper + summary.adopted_on_arrival


def _put_then_die(outbox: Any, worker: int, count: int) -> None:
    for n in range(count):
        outbox.put(("done", worker, n))
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_workers_messages_survive_its_crash_right_after() -> None:
    """Regression: the outbox was a ``multiprocessing.Queue``, whose ``put`` returns before a
    feeder thread writes the message; a worker that crashed soon after lost it. A lost ``done``
    left its invocation outstanding, and the crash test's run never settled with every key idle
    (``quiesced=False, stuck={}``; seen on Redis Cluster, 2026-12-02)."""
    context = mp.get_context("forkserver")
    outbox = _Outbox(context)
    workers = [context.Process(target=_put_then_die, args=(outbox, w, 40)) for w in range(4)]
    for proc in workers:
        proc.start()
    received: list[tuple[Any, ...]] = []
    while len(received) < 160:
        try:
            received.append(outbox.get(timeout=10))
        except queue.Empty:
            break
    for proc in workers:
        proc.join(10)
        assert proc.exitcode == -signal.SIGKILL
    assert sorted(received) == [("done", w, n) for w in range(4) for n in range(40)]
