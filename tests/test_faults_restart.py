"""Fault: the Redis server crashes (SIGKILL) and restarts while an owner works, with signals
queued behind it.

* **With AOF** (``appendonly yes``, ``appendfsync always``: every write is fsynced before Redis
  answers) the lease, its token, the queue and the in-flight record come back exactly as they
  were, scripts are loaded again on the first ``NOSCRIPT``, and the owner hands off as if
  nothing happened.
* **During the outage** every operation raises ``LeaseBackendError`` (never "not acquired"),
  and the decorator fails the invocation instead of running or dropping it: Lambda retries it,
  and the retry after the restart is queued and handled once.
* **An owner whose renewal failed in the outage** marks its lease lost and does not hand off;
  once its TTL passes the sweeper delivers its own event (again: at least once) and the queue.
* **Without persistence** the queue is gone after the restart. That loss cannot be undone, but
  it is not silent: ``pending_signals`` reports 0, the owner's renewal is refused and its
  hand-off raises ``LeaseLostError``, which the decorator reports (``on_lost``, ``LeaseLost``
  metric, an ERROR log naming no holder and 0 pending signals). Fencing still holds: tokens
  come from the server clock once the lease record is gone, so a new owner's token is higher
  and the old owner's fenced write is refused.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from leaseguard import LeaseBackendError, Signal, current_lease, lease_owned
from leaseguard.providers.redis import RedisLeaseProvider
from leaseguard.testing import LambdaContext, RedisServer

from .faults import CountingMetrics, Fence, ListLogger

KEY = "thread:{restart} 7"


@pytest.fixture
def aof_server() -> Iterator[RedisServer]:
    with RedisServer(appendonly=True) as server:  # appendfsync always
        yield server


@pytest.fixture
def volatile_server() -> Iterator[RedisServer]:
    with RedisServer() as server:  # no AOF, no RDB snapshots
        yield server


def crash_and_restart(server: RedisServer, during: Callable[[], None] = lambda: None) -> None:
    server.stop(signal.SIGKILL)  # no shutdown save: only what was fsynced survives
    try:
        during()
    finally:
        server.start()


def provider_for(server: RedisServer) -> RedisLeaseProvider:
    return RedisLeaseProvider.from_url(
        server.url, prefix=f"r{uuid.uuid4().hex[:6]}:", socket_timeout=0.5
    )


class HeldOwner:
    """A guarded handler whose first event holds the lease until released; follow-ups are
    forwarded to it. Records every run as (n, owner, token)."""

    def __init__(self, provider: RedisLeaseProvider, ttl_ms: int, renew_every_ms: int) -> None:
        self.runs: list[tuple[int, str, int]] = []
        self.inside, self.release = threading.Event(), threading.Event()
        self.lost: list[str | None] = []
        self.logger, self.metrics = ListLogger(), CountingMetrics()
        self.result: dict[str, Any] = {}
        self.thread: threading.Thread | None = None
        self.fence: Fence | None = None
        self.wrote: list[bool] = []

        @lease_owned(
            lambda e: e["k"],
            provider=provider,
            ttl_ms=ttl_ms,
            renew_every_ms=renew_every_ms,
            handoff="inline",
            on_lost=lambda handle: self.lost.append(handle.lost_reason),
            logger=self.logger,
            metrics=self.metrics,
        )
        def handler(event: dict[str, Any], context: Any) -> int:
            lease = current_lease()
            assert lease.token is not None
            self.runs.append((event["n"], lease.owner, lease.token))
            if event["n"] == 0:
                self.inside.set()
                assert self.release.wait(30)
                if self.fence is not None:
                    self.wrote.append(self.fence.write(lease.key, lease.token, "owner"))
            return int(event["n"])

        self.handler = handler

    def invoke(self, n: int) -> Any:
        return self.handler({"k": KEY, "n": n}, LambdaContext(aws_request_id=f"r{n}"))

    def start(self) -> HeldOwner:
        self.thread = threading.Thread(target=lambda: self.result.update(r=self.invoke(0)))
        self.thread.start()
        assert self.inside.wait(30)
        return self

    def finish(self) -> Any:
        self.release.set()
        assert self.thread is not None
        self.thread.join(30)
        return self.result.get("r")


def every_operation(provider: RedisLeaseProvider) -> list[Callable[[], object]]:
    return [
        lambda: provider.acquire_lease(KEY, "x", 1_000),
        lambda: provider.get_lease_owner(KEY),
        lambda: provider.renew_lease(KEY, "r0", 1_000),
        lambda: provider.release_lease(KEY, "x"),
        lambda: provider.transfer_lease(KEY, "r0", "x", 1_000),
        lambda: provider.acquire_or_enqueue(KEY, Signal("x", {}), 1_000),
        lambda: provider.take_signals(KEY, "r0", 10),
        lambda: provider.transfer_to_next(KEY, "r0", 1_000),
        lambda: provider.claim_signal(KEY, "r1", 1, 1_000),
        lambda: provider.pending_signals(KEY),
        lambda: provider.inspect_key(KEY),
        lambda: provider.adopt_orphans(1_000, 10),
    ]


def test_with_aof_queued_signals_survive_a_crash_and_the_outage_fails_invocations(
    aof_server: RedisServer,
) -> None:
    provider = provider_for(aof_server)
    owner = HeldOwner(provider, ttl_ms=15_000, renew_every_ms=10_000).start()
    for n in (1, 2, 3):
        assert owner.invoke(n)["leaseguard"]["position"] == n
    before = provider.inspect_key(KEY)
    assert before.owner == "r0" and [s.id for s in before.queued] == ["r1", "r2", "r3"]

    def outage() -> None:
        for operation in every_operation(provider):
            with pytest.raises(LeaseBackendError):
                operation()
        with pytest.raises(LeaseBackendError):  # the invocation fails: Lambda will retry it
            owner.invoke(4)

    crash_and_restart(aof_server, during=outage)

    after = provider.inspect_key(KEY)
    assert (after.owner, after.token, after.queued, after.in_flight) == (
        before.owner,
        before.token,
        before.queued,
        before.in_flight,
    )
    assert after.remaining_ms is not None and after.remaining_ms > 0  # the TTL survived too
    assert owner.invoke(4)["leaseguard"]["position"] == 4  # Lambda's retry, after the restart
    assert owner.finish() == 0
    assert [n for n, _, _ in owner.runs] == [0, 1, 2, 3, 4]  # each once, in arrival order
    tokens = [t for _, _, t in owner.runs]
    assert tokens == sorted(set(tokens))
    assert owner.lost == [] and "LeaseLost" not in owner.metrics.names
    final = provider.inspect_key(KEY)
    assert (final.owner, final.queued, final.in_flight) == (None, (), ())


def test_an_owner_whose_renewal_failed_in_the_outage_stops_and_its_work_is_delivered_again(
    aof_server: RedisServer,
) -> None:
    provider = provider_for(aof_server)
    owner = HeldOwner(provider, ttl_ms=1_000, renew_every_ms=150).start()
    owner.invoke(1)
    crash_and_restart(aof_server, during=lambda: time.sleep(0.5))  # renewals fail meanwhile
    assert owner.finish() == 0
    assert owner.lost and "renewal failed" in (owner.lost[0] or "")
    assert any("not handing off" in line for line in owner.logger.messages(logging.ERROR))
    assert [n for n, _, _ in owner.runs] == [0]  # it handed nothing off
    assert [s.id for s in provider.inspect_key(KEY).queued] == ["r1"]

    time.sleep(1.2)  # the lost owner's lease runs out on the server
    adopted = provider.adopt_orphans(1_000, 10)  # the sweeper
    assert [(key, s.id) for key, s in adopted] == [(KEY, "r0")]  # at least once: r0 again
    nxt = provider.transfer_to_next(KEY, "r0", 1_000, token=adopted[0][1].token)
    assert nxt is not None and nxt.id == "r1" and nxt.payload == {"k": KEY, "n": 1}


def test_without_persistence_the_loss_is_detected_and_fencing_still_holds(
    volatile_server: RedisServer, redis_url: str
) -> None:
    provider = provider_for(volatile_server)
    owner = HeldOwner(provider, ttl_ms=15_000, renew_every_ms=10_000)
    owner.fence = Fence(redis_url)  # the downstream store lives elsewhere and survives
    owner.start()
    first_token = owner.runs[0][2]
    assert owner.fence.write(KEY, first_token, "owner-before")
    for n in (1, 2):
        owner.invoke(n)
    assert provider.pending_signals(KEY) == 2

    crash_and_restart(volatile_server)

    assert provider.pending_signals(KEY) == 0  # reported, not hidden: the queue is gone
    state = provider.inspect_key(KEY)
    assert (state.owner, state.queued, state.in_flight) == (None, (), ())
    assert provider.renew_lease(KEY, "r0", 15_000, token=first_token) is False  # refused
    newcomer = provider.acquire_or_enqueue(KEY, Signal("r9", {"k": KEY, "n": 9}), 15_000)
    assert newcomer.acquired and newcomer.token is not None
    assert newcomer.token > first_token  # from the server clock: still above the old ones
    assert owner.fence.write(KEY, newcomer.token, "newcomer")

    assert owner.finish() == 0
    assert owner.wrote == [False]  # the old owner's fenced write was refused
    assert [n for n, _, _ in owner.runs] == [0]  # r1 and r2 were lost with the restart
    assert len(owner.lost) == 1 and "moved before the handoff" in (owner.lost[0] or "")
    assert "LeaseLost" in owner.metrics.names and "LeaseHandedOff" not in owner.metrics.names
    errors = owner.logger.messages(logging.ERROR)
    assert any("lease lost before the handoff" in line for line in errors), errors
    assert provider.inspect_key(KEY).owner == "r9"  # the newcomer was not disturbed


def test_without_persistence_an_owner_finishing_alone_reports_the_vanished_lease(
    volatile_server: RedisServer,
) -> None:
    provider = provider_for(volatile_server)
    owner = HeldOwner(provider, ttl_ms=15_000, renew_every_ms=10_000).start()
    owner.invoke(1)
    crash_and_restart(volatile_server)
    assert owner.finish() == 0
    assert owner.lost and "no owner" in (owner.lost[0] or "")  # nobody took it: it vanished
    assert provider.pending_signals(KEY) == 0
