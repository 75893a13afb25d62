"""The metrics the SAM app's queue alarms watch (template.yaml, docs/deploy.md), on every
backend: ``QueueDepth`` (each forward's place in its key's queue), ``QueueFull`` (a forward
refused), ``OldestQueuedAgeMs`` (how long a key's oldest queued event had waited when it was
granted the key) and the sweeper's ``OrphanAdopted``. Each comes from what a step returns
anyway; the last test counts the backend requests to show it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from leaseguard import HandoffConfig, Signal, lease_owned
from leaseguard.errors import QueueFull
from leaseguard.handoff import Envelope, dispatch_orphans
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.testing import LambdaContext
from leaseguard.types import now_ms

from .conftest import let_leases_expire
from .test_guard import TTL, CountingMetrics, Recorder, hold_in_background

HELD_S = 0.3


class _Dispatched:
    def __init__(self) -> None:
        self.envelopes: list[Envelope] = []

    def dispatch(self, envelope: Envelope) -> None:
        self.envelopes.append(envelope)


def test_forwards_report_their_depth_and_each_hand_off_the_age_of_the_queue_head(
    provider: BaseLeaseProvider,
) -> None:
    recorder = Recorder()
    metrics = CountingMetrics()
    handler = lease_owned(
        lambda e: e["k"], provider=provider, ttl_ms=TTL, handoff="inline", metrics=metrics
    )(recorder)
    owner = hold_in_background(handler, {"k": "d", "n": 0}, recorder)
    forwarded_at = now_ms()
    for n in (1, 2, 3):
        handler({"k": "d", "n": n}, LambdaContext())
    time.sleep(HELD_S)
    recorder.gate.set()
    owner.join()
    assert [s[0] for s in recorder.seen] == [0, 1, 2, 3]
    assert metrics.values["QueueDepth"] == [1, 2, 3]
    # Each inline hand-off granted the queue's head, which had waited at least since the last
    # forward (the owner held the key HELD_S after it) and at most since the first.
    ages = metrics.values["OldestQueuedAgeMs"]
    assert len(ages) == 3
    assert all(HELD_S * 1000 * 0.9 <= age <= now_ms() - forwarded_at for age in ages), ages
    assert "QueueFull" not in metrics.values


def test_a_refused_forward_counts_queue_full(provider: BaseLeaseProvider) -> None:
    recorder = Recorder()
    metrics = CountingMetrics()
    handler = lease_owned(
        lambda e: e["k"], provider=provider, ttl_ms=TTL, max_queue=1, metrics=metrics
    )(recorder)
    owner = hold_in_background(handler, {"k": "f", "n": 0}, recorder)
    handler({"k": "f", "n": 1}, LambdaContext())
    with pytest.raises(QueueFull):  # not an API request: the platform retries it later
        handler({"k": "f", "n": 2}, LambdaContext())
    recorder.gate.set()
    owner.join()
    assert metrics.names.count("QueueFull") == 1
    assert metrics.values["QueueDepth"] == [1]  # the refused one has no place


def test_an_adopted_orphan_reports_how_long_it_waited(provider: BaseLeaseProvider) -> None:
    """The next event for a key whose owner died adopts the queue's head: its age is the time
    since it was queued, here set 5 s in the past."""
    metrics = CountingMetrics()
    ran: list[Any] = []

    @lease_owned(lambda e: e["k"], provider=provider, ttl_ms=TTL, metrics=metrics)
    def handler(event: dict[str, Any], context: Any) -> Any:
        ran.append(event["n"])
        return event["n"]

    provider.acquire_lease("o", "dead-owner", TTL)
    queued_at = now_ms() - 5_000
    orphan = Signal("orphan", {"k": "o", "n": "orphan"}, enqueued_at_ms=queued_at)
    provider.acquire_or_enqueue("o", orphan, TTL)
    let_leases_expire(provider, ("o", "dead-owner"))
    before = now_ms()
    assert handler({"k": "o", "n": "new"}, LambdaContext()) == "new"
    assert ran == ["orphan", "new"]
    (age, *_) = metrics.values["OldestQueuedAgeMs"]
    assert before - queued_at <= age <= now_ms() - queued_at


def test_the_sweeper_reports_each_stuck_key_and_its_age(provider: BaseLeaseProvider) -> None:
    metrics = CountingMetrics()
    queued_at = now_ms() - 90_000
    for key in ("s1", "s2"):
        provider.acquire_lease(key, f"dead-{key}", TTL)
        signal = Signal(f"w-{key}", {"k": key}, enqueued_at_ms=queued_at)
        provider.acquire_or_enqueue(key, signal, TTL)
    let_leases_expire(provider, ("s1", "dead-s1"), ("s2", "dead-s2"))
    dispatched = _Dispatched()
    sent = dispatch_orphans(provider, dispatched, TTL, 10, metrics=metrics)
    assert sorted(e.key for e in sent) == ["s1", "s2"]
    assert metrics.names.count("OrphanAdopted") == 2
    ages = metrics.values["OldestQueuedAgeMs"]
    assert len(ages) == 2 and all(90_000 <= age < 90_000 + 60_000 for age in ages), ages
    # Nothing orphaned: nothing counted (and nothing flushed).
    quiet = CountingMetrics()
    assert dispatch_orphans(provider, _Dispatched(), TTL, 10, metrics=quiet) == []
    assert quiet.names == []


def test_a_batch_drain_reports_the_age_of_each_take(provider: BaseLeaseProvider) -> None:
    assert getattr(provider, "partial_reports", False)  # every backend drains in batches
    metrics = CountingMetrics()
    gate, inside = threading.Event(), threading.Event()
    seen: list[Any] = []

    @lease_owned(
        lambda e: e["k"],
        provider=provider,
        ttl_ms=TTL,
        metrics=metrics,
        handoff=HandoffConfig(drain_batch=3),
    )
    def handler(event: dict[str, Any], context: Any) -> Any:
        seen.append(event["n"])
        if event["n"] == 0:
            inside.set()
            gate.wait(10)
        return event["n"]

    owner = threading.Thread(target=handler, args=({"k": "b", "n": 0}, LambdaContext()))
    owner.start()
    assert inside.wait(10)
    for n in (1, 2, 3):
        handler({"k": "b", "n": n}, LambdaContext())
    time.sleep(HELD_S)
    gate.set()
    owner.join()
    assert seen == [0, 1, 2, 3]
    # The hand-off to 1, then a take for each of 2 and 3 under its grant.
    ages = metrics.values["OldestQueuedAgeMs"]
    assert len(ages) == 3 and all(age >= HELD_S * 1000 * 0.9 for age in ages), ages


def test_the_queue_metrics_cost_no_request(make_provider: Any) -> None:
    """A forwarded event and an owner's hand-off make the same backend calls with metrics as
    without: the numbers come from the replies they already get. Counted on the in-memory
    provider, whose every public call is one step (the others' are too, but take more setup)."""

    def calls(metrics: Any) -> list[str]:
        provider = make_provider("memory")()
        made: list[str] = []
        for name in ("acquire_or_enqueue", "take_signals", "transfer_to_next", "renew_lease"):
            original = getattr(provider, name)

            def counted(*args: Any, _name: str = name, _f: Any = original, **kw: Any) -> Any:
                made.append(_name)
                return _f(*args, **kw)

            setattr(provider, name, counted)
        recorder = Recorder()
        handler = lease_owned(
            lambda e: e["k"], provider=provider, ttl_ms=TTL, handoff="inline", metrics=metrics
        )(recorder)
        owner = hold_in_background(handler, {"k": "c", "n": 0}, recorder)
        handler({"k": "c", "n": 1}, LambdaContext())
        recorder.gate.set()
        owner.join()
        return made

    with_metrics = CountingMetrics()
    assert calls(with_metrics) == calls(None)
    assert {"QueueDepth", "OldestQueuedAgeMs"} <= set(with_metrics.values)
