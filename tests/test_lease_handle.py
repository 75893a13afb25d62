"""The handle a guarded run holds and the thread that renews it: reads have no side effects,
stopping never hangs on a stuck renewal, and the async driver keeps the event loop free."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from typing import Any

import pytest

from leaseguard import InMemoryLeaseProvider, LeaseHandle, Signal, current_lease, lease_owned
from leaseguard.contract import LeaseResult
from leaseguard.renewer import LeaseRenewer
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
    assert handle._settle() is True
    assert handle._settle() is True
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
    from leaseguard import renewer as renewal

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


# -- the renewer's thread starts only when its first renewal falls due ----------------------------


def _renewer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("leaseguard-renew")]


def _granted(provider: _CountingRenewals, key: str, ttl_ms: int = 5_000) -> LeaseHandle:
    """A grant of ``key`` to an owner named after it (renewals are counted by owner and token)."""
    lease = provider.acquire_lease(key, key, ttl_ms)
    return LeaseHandle(provider, key, key, lease.token, ttl_ms)  # type: ignore[arg-type]


def test_a_run_that_ends_before_its_first_renewal_never_starts_a_thread() -> None:
    # Starting and joining a thread per invocation cost more than the run on a busy key.
    provider = _CountingRenewals()
    for n in range(50):
        renewer = LeaseRenewer(_granted(provider, f"short{n}"), 500).start()
        assert _renewer_threads() == []
        renewer.stop()
    time.sleep(0.6)  # past every one's due time: the timer must not start them after stop
    assert _renewer_threads() == [] and provider.renewals == {}


def test_a_run_longer_than_the_period_is_renewed_by_a_thread_of_its_own() -> None:
    provider = _CountingRenewals()
    handle = _granted(provider, "long", ttl_ms=300)
    started = time.monotonic()
    renewer = LeaseRenewer(handle, 50).start()
    assert _renewer_threads() == [] or time.monotonic() - started >= 0.05  # not yet due
    deadline = time.monotonic() + 5
    while provider.renewals.get(("long", handle.token), 0) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [t.name for t in _renewer_threads()] == ["leaseguard-renew-long"]
    renewer.stop()
    assert provider.renewals[("long", handle.token)] >= 3 and not handle.lost
    assert _renewer_threads() == []


def test_a_new_run_of_a_chain_puts_the_first_renewal_off(monkeypatch: Any) -> None:
    # Each run of an inline chain is a new grant, due a full period after it began: the timer
    # that fires at the first run's due time must wait again, neither renewing the second run
    # early nor starting its thread before then.
    started_at: list[float] = []

    class TimedThread(threading.Thread):
        def start(self) -> None:
            started_at.append(time.monotonic())
            super().start()

    monkeypatch.setattr(threading, "Thread", TimedThread)
    provider = _CountingRenewals()
    first, second = _granted(provider, "a"), _granted(provider, "b")
    renewer = LeaseRenewer(None, 200)
    renewer.follow(first)
    time.sleep(0.15)
    renewer.pause()
    followed = time.monotonic()
    renewer.follow(second)
    deadline = followed + 5
    while ("b", second.token) not in provider.renewals and time.monotonic() < deadline:
        time.sleep(0.005)
    renewed_after = time.monotonic() - followed
    renewer.stop()
    assert ("a", first.token) not in provider.renewals  # paused before its due time
    assert provider.renewals.get(("b", second.token), 0) >= 1
    assert renewed_after >= 0.2  # a period after the second run began, not the first
    assert len(started_at) == 1 and started_at[0] >= followed + 0.2


def test_a_renewal_thread_that_cannot_start_marks_the_lease_lost(monkeypatch: Any) -> None:
    fired: list[str | None] = []
    provider = _CountingRenewals()
    lease = provider.acquire_lease("k", "o", 5_000)
    handle = LeaseHandle(
        provider,  # type: ignore[arg-type]
        "k",
        "o",
        lease.token,
        5_000,
        on_lost=lambda h: fired.append(h.lost_reason),
    )
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name.startswith("leaseguard-renew"):
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    renewer = LeaseRenewer(handle, 20).start()
    deadline = time.monotonic() + 5
    while not fired and time.monotonic() < deadline:
        time.sleep(0.01)
    renewer.stop()
    assert fired == ["the renewal thread could not start: can't start new thread"]
    assert handle.lost and provider.renewals == {}


def test_a_forked_child_gets_a_timer_of_its_own() -> None:
    import os

    provider = _CountingRenewals()
    LeaseRenewer(_granted(provider, "parent"), 20).start().stop()  # the parent's timer runs
    pid = os.fork()
    if pid == 0:  # the child: only os._exit, whatever happens
        code = 1
        try:
            handle = _granted(provider, "child")
            renewer = LeaseRenewer(handle, 20).start()
            deadline = time.monotonic() + 5
            while ("child", handle.token) not in provider.renewals and time.monotonic() < deadline:
                time.sleep(0.01)
            renewer.stop()
            code = 0 if ("child", handle.token) in provider.renewals else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0  # the child's lease was renewed


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_timer_thread_that_died_is_replaced() -> None:
    from leaseguard.renewer import _DEFERRED_STARTS

    class EndsTheTimer(LeaseRenewer):
        def _first_renewal_due(self) -> None:
            raise SystemExit  # not an Exception: the timer's guard lets it end the thread

    provider = _CountingRenewals()
    EndsTheTimer(_granted(provider, "ender"), 10).start()
    deadline = time.monotonic() + 5
    while _DEFERRED_STARTS._thread.is_alive() and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.01)
    handle = _granted(provider, "after")
    renewer = LeaseRenewer(handle, 20).start()
    while ("after", handle.token) not in provider.renewals and time.monotonic() < deadline:
        time.sleep(0.01)
    renewer.stop()
    assert ("after", handle.token) in provider.renewals


def test_the_timer_does_not_wake_for_runs_that_ended(monkeypatch: Any) -> None:
    # Runs back to back, each ending long before its first renewal: waking the timer for each
    # one at its due time cost a context switch per run, what the timer is there to avoid.
    from leaseguard import renewer as renewal

    class CountingCondition(threading.Condition):
        waits = 0

        def wait(self, timeout: float | None = None) -> bool:
            CountingCondition.waits += 1
            return super().wait(timeout)

    timer = renewal._DeferredStarts()
    timer._cond = CountingCondition()
    monkeypatch.setattr(renewal, "_DEFERRED_STARTS", timer)
    provider = _CountingRenewals()
    handle = _granted(provider, "busy")
    runs = 0
    deadline = time.monotonic() + 0.8  # four periods
    while time.monotonic() < deadline or runs < 80:
        renewer = LeaseRenewer(handle, 200).start()
        time.sleep(0.0002)  # a short run, waiting on I/O as real ones do
        renewer.stop()
        runs += 1
    assert provider.renewals == {}
    assert CountingCondition.waits < runs // 4  # about two a period, not one a run


def test_a_grant_whose_reply_came_after_its_ttl_runs_nothing() -> None:
    """Found with the explorer's (d) clause: a grant whose reply arrived after its TTL ran out
    was run anyway, while another invocation may own the key. It must not run; the event stays
    in the backend and runs with the next owner."""

    class SlowReplies(InMemoryLeaseProvider):
        slow = True

        def acquire_or_enqueue(self, *args: Any, **kwargs: Any) -> Any:
            result = super().acquire_or_enqueue(*args, **kwargs)
            if self.slow:
                time.sleep(0.3)  # the reply is on the wire past the 200 ms TTL
            return result

    provider = SlowReplies()
    ran: list[str] = []
    handler = lease_owned(lambda e: "k", provider=provider, ttl_ms=200)(
        lambda e, c: ran.append(e["n"]) or "ok"
    )
    answer = handler({"n": "late"}, LambdaContext())
    assert ran == []
    assert answer["leaseguard"]["status"] == "queued"
    provider.slow = False
    assert handler({"n": "next"}, LambdaContext()) == "ok"
    assert ran == ["late", "next"]  # adopted (Q6): the late grant's event first, then its own


def test_the_guards_bookkeeping_is_private_and_its_old_names_warn() -> None:
    """settle(), mark_lost(), renewed() and valid_until were public before 0.2: they still
    work, each with a DeprecationWarning; the handler's surface does not warn."""
    from leaseguard.providers.memory import InMemoryLeaseProvider

    now = [100.0]
    handle = LeaseHandle(InMemoryLeaseProvider(), "k", "o", 1, 1_000, clock=lambda: now[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (handle.key, handle.owner, handle.token, handle.lost) == ("k", "o", 1, False)
        assert handle.remaining_ms == 1_000 and handle.lost_reason is None
        handle.check()
    with pytest.warns(DeprecationWarning, match="valid_until is deprecated: use LeaseHandle.rem"):
        assert handle.valid_until == 101.0
    with pytest.warns(DeprecationWarning, match="renewed"):
        handle.renewed(100.5)
    assert handle.remaining_ms == 1_500
    with pytest.warns(DeprecationWarning, match="settle"):
        assert handle.settle() is False
    with pytest.warns(DeprecationWarning, match="mark_lost"):
        handle.mark_lost("told so")
    assert handle.lost and handle.lost_reason == "told so"
