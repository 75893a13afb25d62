"""Fault: owners are SIGKILLed at random points during a burst.

The simulator (:mod:`leaseguard.simulate.engine`) runs the real ``@lease_owned`` in worker
processes standing in for warm Lambda environments; a handler SIGKILLs its own process mid-work
with probability ``KILL_RATE`` per event. The platform retries a crashed invocation (as Lambda
retries an async event), replaces the worker, and runs the sweeper (``adopt_orphans``) every
100 ms. Every handler logs what it ran to its own file, flushed per line, so the check below
does not trust leaseguard's own account.

Proved on Redis, Redis Cluster and DynamoDB:

* every event is handled (nothing is left queued or in flight when the run settles);
* no key ever had two handler runs at once, and tokens rose with every run (the checker);
* an event handled more than once is one a killed invocation held in flight, and it was
  handled at most once more per such kill. Those re-runs are counted in two kinds: the handler
  was killed *in the middle of* the event, or the event had completed but the kill came before
  its owner completed the lease (a take_signals batch, or the owner's own event, completes with
  the owner's hand-off: until then the backend must assume it may not have run).
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from leaseguard.config import ProviderConfig
from leaseguard.providers.dynamodb import DynamoDBLeaseProvider
from leaseguard.simulate.checker import check, lapses_from
from leaseguard.simulate.engine import Simulation, SimulationConfig
from leaseguard.testing import RedisClusterServers

KILL_RATE = 0.08  # at least one kill in 60 draws: all but certain, and the seed is fixed
# make test runs half the events of make soak (LEASEGUARD_SOAK=1): the same checks on a burst of
# 100 (60 on DynamoDB, whose moto server is slow) instead of 200 (120).
EVENTS_SCALE = 1 if os.environ.get("LEASEGUARD_SOAK") == "1" else 2


@pytest.fixture(params=["redis", "redis-cluster", "dynamodb"])
def backend(request: pytest.FixtureRequest) -> ProviderConfig:
    prefix = f"crash{uuid.uuid4().hex[:8]}:"
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        return ProviderConfig(backend="redis", redis_url=url, key_prefix=prefix)
    if request.param == "redis-cluster":
        cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
        return ProviderConfig(
            backend="redis", redis_url=cluster.url, redis_cluster=True, key_prefix=prefix
        )
    endpoint = request.getfixturevalue("dynamodb_endpoint")
    table = f"crash-{uuid.uuid4().hex[:8]}"
    DynamoDBLeaseProvider(table, endpoint_url=endpoint, region_name="us-east-1").create_table()
    return ProviderConfig(
        backend="dynamodb",
        table_name=table,
        dynamodb_endpoint=endpoint,
        region_name="us-east-1",
        clock_skew_ms=100,
    )


@dataclass
class Reruns:
    """Runs of an event beyond its first, each explained by a kill or by a run that saw its
    lease expire (``unexplained`` lists the rest, which must be none). One kill can explain up
    to two: leaseguard delivers again what the dead owner held in flight, and the platform
    retries the killed invocation's own event, which runs again if by then it had completed
    elsewhere (a signal id is deduplicated while it is queued or in flight, not forever). A run
    whose grant lapsed (a renewal slower than the TTL on a loaded machine, found by a renewal, at
    the run's end or at its hand-off) leaves its events to be delivered again, as invariant d
    allows."""

    killed_mid_handler: int = 0  # its handler was killed while running it
    completed_not_committed: int = 0  # it had completed; its owner was killed before handing off
    retried_by_platform: int = 0  # the platform's retry of the killed invocation ran it again
    after_lost_lease: int = 0  # a run of it lost its lease (the grant lapsed)
    completed_twice: int = 0  # events whose work completed more than once
    unexplained: list[str] = field(default_factory=list)


def account_for_reruns(records: list[dict[str, Any]]) -> Reruns:
    """Classify every extra run of an event by the kills that explain it."""
    kills = [r for r in records if r["type"] == "kill"]
    killed = {r["inv"] for r in kills}
    retried = Counter(r["event"] for r in kills if r["kind"] == "event")
    finished = {(r["run"], r["event"]) for r in records if r["type"] == "handled"}
    lapsed = lapses_from(records)  # grants found lost: by a renewal, at the end or the hand-off
    lost_runs = {
        r["run"] for r in records if r["type"] == "start" and (r["key"], r["token"]) in lapsed
    }
    lapsed = Counter(r["event"] for r in records if r["type"] == "begin" and r["run"] in lost_runs)
    begun: Counter[str] = Counter()
    completed: Counter[str] = Counter()
    cut_short: Counter[str] = Counter()  # runs of the event that a kill interrupted
    committed_late: Counter[str] = Counter()  # runs that completed inside a killed invocation
    for rec in records:
        if rec["type"] == "handled":
            completed[rec["event"]] += 1
        if rec["type"] != "begin":
            continue
        event = rec["event"]
        begun[event] += 1
        if rec.get("inv") in killed:
            if (rec["run"], event) in finished:
                committed_late[event] += 1
            else:
                cut_short[event] += 1
    reruns = Reruns()
    for event, runs in begun.items():
        extra = runs - 1
        budget = cut_short[event] + committed_late[event] + retried[event] + lapsed[event]
        if extra > budget:
            reruns.unexplained.append(
                f"{event}: began {runs} times, {budget} kills and lost leases explain"
            )
        if completed[event] > 1 + committed_late[event] + retried[event] + lapsed[event]:
            reruns.unexplained.append(f"{event}: completed {completed[event]} times")
        for kind, available in (
            ("killed_mid_handler", cut_short[event]),
            ("completed_not_committed", committed_late[event]),
            ("retried_by_platform", retried[event]),
            ("after_lost_lease", lapsed[event]),
        ):
            used = min(extra, available)
            setattr(reruns, kind, getattr(reruns, kind) + used)
            extra -= used
        reruns.completed_twice += completed[event] > 1
    return reruns


def crash_config(backend: ProviderConfig) -> SimulationConfig:
    """4 workers on 3 keys, a few of their handler runs SIGKILLed, a sweeper every 100 ms."""
    dynamodb = backend.backend == "dynamodb"
    return SimulationConfig(
        backend,
        workers=4,
        invocations=(120 if dynamodb else 200) // EVENTS_SCALE,
        keys=3,
        work_ms=(5, 20),
        kill_rate=KILL_RATE,
        # moto takes tens of ms a request, far more on a loaded machine: a renewal slower than
        # the TTL would let a live owner's lease lapse (the limit fencing tokens cover, which
        # the checker reports as an overlap, or as a duplicate when the lapse shows only at the
        # hand-off), and that is not what this test is about. Redis had 600 ms: on a slow VM
        # under make test's load Redis Cluster then saw such duplicates in most runs, at
        # bea9090 as after it.
        ttl_ms=2_000 if dynamodb else 1_500,
        sweep_every_ms=100,
        drain=2,
        seed=11,
        quiesce_timeout_s=120,
    )


def test_owners_killed_mid_burst_lose_nothing(backend: ProviderConfig) -> None:
    config = crash_config(backend)
    result = Simulation(config).run()
    # nothing left queued or in flight anywhere, no invocation left unfinished
    assert result.quiesced, (result.stuck, result.unfinished)
    assert result.kills > 0
    report = check(result.records, [e["id"] for e in result.events])
    assert report.violations == []  # no overlap, tokens rising, FIFO, nothing lost
    events = [e["id"] for e in result.events]
    assert min(report.handled[e] for e in events) >= 1  # every event was handled
    reruns = account_for_reruns(result.records)
    assert reruns.unexplained == [], reruns  # every second run: a kill or an expired lease
    assert 0 < reruns.killed_mid_handler <= result.kills  # a kill interrupts one run
    statuses = Counter(r["status"] for r in result.records if r["type"] == "invoke")
    assert statuses["error"] == 0
    print(
        f"{backend.backend}{'-cluster' if backend.redis_cluster else ''}: "
        f"{len(events)} events, {result.kills} kills, {result.adopted} adopted by the sweeper; "
        f"ran again: {reruns.killed_mid_handler} killed mid-handler, "
        f"{reruns.completed_not_committed} completed before their owner was killed, "
        f"{reruns.retried_by_platform} by the platform's retry of a killed invocation, "
        f"{reruns.after_lost_lease} after a run lost its lease "
        f"({reruns.completed_twice} events completed more than once)"
    )
