"""The handle a guarded run holds and the thread that renews it: reads have no side effects,
stopping never hangs on a stuck renewal, and the async driver keeps the event loop free."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from leaseguard import InMemoryLeaseProvider, LeaseHandle, Signal, current_lease, lease_owned
from leaseguard.contract import LeaseResult
from leaseguard.renewal import LeaseRenewer
from leaseguard.testing import LambdaContext


def test_reading_lost_or_repr_never_fires_on_lost() -> None:
    fired: list[str | None] = []
    handle = LeaseHandle(
        InMemoryLeaseProvider(),  # type: ignore[arg-type]
        "k",
        "o",
        1,
        100,
        on_lost=lambda h: fired.append(h.lost_reason),
        sent_at=time.monotonic() - 1.0,  # granted a second ago with a 100 ms TTL
    )
    assert handle.lost and "lost" in repr(handle) and handle.remaining_ms == 0
    assert fired == []  # a read (even a debugger's repr) is not an event
    assert handle.settle() is True
    assert handle.settle() is True
    assert fired == ["no renewal succeeded within the TTL"]  # once, from settle


class _StuckRenewals(InMemoryLeaseProvider):
    """Renewals hang (a request stuck in client retries) until released."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def renew_lease(self, key: str, owner: str, ttl_ms: int, *, token: int | None = None) -> bool:
        self.entered.set()
        self.release.wait(30)
        return False


def test_stopping_the_renewer_does_not_wait_for_a_stuck_renewal() -> None:
    provider = _StuckRenewals()
    lease = provider.acquire_lease("k", "o", 5_000)
    handle = LeaseHandle(provider, "k", "o", lease.token, 5_000)  # type: ignore[arg-type]
    renewer = LeaseRenewer(handle, 10).start()
    assert provider.entered.wait(5)
    started = time.monotonic()
    renewer.stop()
    waited = time.monotonic() - started
    provider.release.set()
    assert waited < 10  # bounded (about 1 s), not the 30 s the renewal hangs
    assert handle.lost_reason == "a renewal was still in flight when the run ended"


class _BlockingAcquire(InMemoryLeaseProvider):
    """acquire_or_enqueue blocks until another asyncio task has run."""

    def __init__(self) -> None:
        super().__init__()
        self.other_task_ran = threading.Event()

    def acquire_or_enqueue(self, *args: Any, **kwargs: Any) -> LeaseResult:
        self.other_task_ran.wait(10)
        return super().acquire_or_enqueue(*args, **kwargs)


def test_the_async_driver_does_not_block_the_event_loop_on_the_backend() -> None:
    provider = _BlockingAcquire()

    @lease_owned(lambda e: e["k"], provider=provider, ttl_ms=3_000)
    async def handler(event: dict[str, Any], context: Any) -> str:
        return "ran"

    async def other() -> None:
        await asyncio.sleep(0.01)
        provider.other_task_ran.set()

    async def main() -> tuple[str, bool]:
        task = asyncio.create_task(other())
        result = await handler({"k": "a"}, LambdaContext())
        await task
        return result, provider.other_task_ran.is_set()

    started = time.monotonic()
    result, other_ran = asyncio.run(main())
    assert result == "ran" and other_ran
    assert time.monotonic() - started < 5  # the other task ran while the guard waited
    state = provider.inspect_key("a")
    assert state.owner is None and not state.in_flight


def test_the_async_driver_keeps_the_flow_order_with_forwarded_signals() -> None:
    provider = InMemoryLeaseProvider()
    order: list[int] = []

    @lease_owned(lambda e: e["k"], provider=provider, ttl_ms=3_000)
    async def handler(event: dict[str, Any], context: Any) -> int:
        order.append(event["n"])
        return int(event["n"])

    provider.acquire_or_enqueue("f", Signal("holder", {"k": "f", "n": 0}), 3_000)
    for n in (1, 2):
        provider.acquire_or_enqueue("f", Signal(f"s{n}", {"k": "f", "n": n}), 3_000)
    provider.renew_lease("f", "holder", 1)
    time.sleep(0.01)  # the holder died: the next event adopts its work, in order
    assert asyncio.run(handler({"k": "f", "n": 3}, LambdaContext())) == 3
    assert order == [0, 1, 2, 3]


class _CountingRenewals(InMemoryLeaseProvider):
    """Counts renewals per (owner, token): which grant the renewer was renewing."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals: dict[tuple[str, int | None], int] = {}

    def renew_lease(self, key: str, owner: str, ttl_ms: int, *, token: int | None = None) -> bool:
        self.renewals[(owner, token)] = self.renewals.get((owner, token), 0) + 1
        return super().renew_lease(key, owner, ttl_ms, token=token)


def test_one_renewer_thread_follows_every_run_of_an_inline_chain(monkeypatch: Any) -> None:
    # A thread per run cost more than the run on a busy key (bench/hot_key.py); each run of the
    # chain must still be renewed under its own grant, and nothing after the chain ends.
    from leaseguard import renewal

    started: list[str] = []

    class CountingThread(threading.Thread):
        def start(self) -> None:
            started.append(self.name)
            super().start()

    monkeypatch.setattr(renewal.threading, "Thread", CountingThread)
    provider = _CountingRenewals()
    provider.acquire_lease("k", "holder", 10_000)
    for n in range(3):
        provider.acquire_or_enqueue("k", Signal(f"s{n}", {"n": n}), 10_000)
    provider.release_lease("k", "holder")
    ran: list[tuple[str, int | None]] = []

    @lease_owned(lambda e: "k", provider=provider, ttl_ms=300, renew_every_ms=50)
    def handler(event: dict[str, Any], context: Any) -> str:
        lease = current_lease()
        time.sleep(0.4)  # longer than the TTL: only renewals keep each run's lease
        lease.check()
        ran.append((lease.owner, lease.token))
        return "ok"

    before = set(provider.renewals)
    assert handler({"n": "own"}, LambdaContext()) == "ok"  # the own event ran last, inline
    assert [owner for owner, _ in ran][:3] == ["s0", "s1", "s2"]  # the adopted chain first
    assert len({token for _, token in ran}) == 4  # each run under a grant of its own
    assert started == ["leaseguard-renew-k"]
    assert all(provider.renewals.get(grant, 0) >= 3 for grant in ran), provider.renewals
    after = dict(provider.renewals)
    time.sleep(0.2)
    assert provider.renewals == after and set(after) - before == set(ran)
    assert provider.inspect_key("k").owner is None
