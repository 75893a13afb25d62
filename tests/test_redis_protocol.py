"""Redis implements the protocol model (leaseguard/protocol/model.py) row by row.

Regression tests for the rows the Redis scripts took over from the model (completed-id memory
[G2]/[Q5], failure reports and dead letters [G6], resend recognition by the done memory [N4],
the reply shapes of [Q5]/[Q6]/[Q7]), on a standalone server and on a Cluster; lost replies go
through :class:`tests.faults.ReplyDroppingProxy`. Random call sequences compared
call by call with the model are in ``tests/test_differential.py``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from leaseguard import LeaseLostError, Signal
from leaseguard.contract import LeaseResult
from leaseguard.errors import QueueFull
from leaseguard.protocol.model import DEDUPE_WINDOW_MS, DONE_LIMIT, TOKEN_MEMORY_MS
from leaseguard.providers import redis as lg_redis
from leaseguard.providers.redis import RedisLeaseProvider
from leaseguard.signals import DeadLetter, KeyState

from .conftest import ProviderFactory
from .differential import Op, T, redis_side, replay
from .faults import Rig, proxied_rig

TTL = 30_000


def new_key() -> str:
    return f"proto {{{uuid.uuid4().hex[:8]}}} ü"


def sig(name: str, payload: Any = None) -> Signal:
    return Signal(name, {"id": name} if payload is None else payload, enqueued_at_ms=1)


@pytest.fixture(params=["redis", "redis-cluster"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def provider(make_provider: ProviderFactory, backend: str) -> RedisLeaseProvider:
    made = make_provider(backend)()
    assert isinstance(made, RedisLeaseProvider)
    return made


# -- lost replies -----------------------------------------------------------------------------


@pytest.fixture
def rig(request: pytest.FixtureRequest, backend: str) -> Iterator[Rig]:
    with proxied_rig(request, backend, f"proto{uuid.uuid4().hex[:8]}:") as made:
        yield made


def test_a_lost_forward_resent_after_it_ran_is_a_duplicate(rig: Rig) -> None:
    """(a) The forward was queued, its reply lost; before the resend the owner took it, ran it
    and completed. The resend is a duplicate: not queued again, never run twice."""
    k = new_key()
    held = rig.provider.acquire_or_enqueue(k, sig("s0"), TTL)
    assert held.acquired and held.token is not None
    token = held.token
    taken: list[list[Signal]] = []

    def owner_runs_it() -> None:
        taken.append(rig.direct.take_signals(k, "s0", 10, token=token))
        assert rig.direct.transfer_to_next(k, "s0", TTL, token=token) is None

    drop = rig.lose_reply(lg_redis.ACQUIRE_OR_ENQUEUE_LUA, before_retry=owner_runs_it)
    result = rig.provider.acquire_or_enqueue(k, sig("s1"), TTL)
    assert drop.dropped and int(drop.dropped[0][3]) == 1  # the first run queued it
    assert [[s.id for s in batch] for batch in taken] == [["s1"]]  # and the owner ran it
    assert result == LeaseResult(False, None, None, position=None)  # a duplicate, key free
    state = rig.direct.inspect_key(k)
    assert (state.owner, state.queued, state.in_flight) == (None, (), ())
    assert rig.direct.pending_signals(k) == 0


def test_a_lost_forward_resent_while_another_owner_holds_names_it(rig: Rig) -> None:
    k = new_key()
    held = rig.provider.acquire_or_enqueue(k, sig("s0"), TTL)
    token = held.token
    newcomer: list[LeaseResult] = []

    def owner_runs_it_and_another_takes_the_key() -> None:
        rig.direct.take_signals(k, "s0", 10, token=token)
        rig.direct.transfer_to_next(k, "s0", TTL, token=token)
        newcomer.append(rig.direct.acquire_or_enqueue(k, sig("s2"), TTL))

    rig.lose_reply(
        lg_redis.ACQUIRE_OR_ENQUEUE_LUA, before_retry=owner_runs_it_and_another_takes_the_key
    )
    result = rig.provider.acquire_or_enqueue(k, sig("s1"), TTL)
    (other,) = newcomer
    assert other.acquired
    assert result == LeaseResult(False, "s2", other.token, position=None)
    assert rig.direct.inspect_key(k).queued == ()


def test_a_lost_release_resent_after_a_newcomer_took_the_key_returns_none(rig: Rig) -> None:
    """(b) transfer_to_next with nothing queued released the key; its reply was lost and a
    newcomer acquired before the resend. The resend is recognised (the released grant is
    remembered as done): None, no false LeaseLostError, and the newcomer keeps the key."""
    k = new_key()
    held = rig.provider.acquire_or_enqueue(k, sig("s1"), TTL)
    newcomer: list[LeaseResult] = []
    drop = rig.lose_reply(
        lg_redis.TRANSFER_TO_NEXT_LUA,
        before_retry=lambda: newcomer.append(rig.direct.acquire_or_enqueue(k, sig("s2"), TTL)),
    )
    assert rig.provider.transfer_to_next(k, "s1", TTL, token=held.token) is None
    assert drop.dropped == [[2]]  # the first run released
    assert rig.replies(lg_redis.TRANSFER_TO_NEXT_LUA) == [[2], [2]]  # the resend: recognised
    state = rig.direct.inspect_key(k)
    (other,) = newcomer
    assert (state.owner, state.token, state.in_flight) == ("s2", other.token, ("s2",))
    assert held.token is not None and other.token is not None and other.token > held.token


def test_a_lost_release_resent_after_the_newcomer_also_left_returns_none(rig: Rig) -> None:
    """p/pt name the newcomer by the time of the resend: only the done memory recognises it."""
    k = new_key()
    held = rig.provider.acquire_lease(k, "a", TTL)

    def newcomer_comes_and_goes() -> None:
        rig.direct.acquire_lease(k, "b", TTL)
        rig.direct.release_lease(k, "b")

    rig.lose_reply(lg_redis.TRANSFER_TO_NEXT_LUA, before_retry=newcomer_comes_and_goes)
    assert rig.provider.transfer_to_next(k, "a", TTL, token=held.token) is None
    assert rig.direct.get_lease_owner(k) is None
    # Without the token there is nothing to tell this resend from a stale owner's call.
    with pytest.raises(LeaseLostError):
        rig.direct.transfer_to_next(k, "a", TTL)


def test_a_lost_failure_report_is_applied_once(rig: Rig) -> None:
    k = new_key()
    held = rig.provider.acquire_lease(k, "owner", TTL)
    for name in ("s1", "s2"):
        rig.provider.acquire_or_enqueue(k, sig(name), TTL)
    rig.provider.take_signals(k, "owner", 2, token=held.token)
    drop = rig.lose_reply(lg_redis.TRANSFER_TO_NEXT_LUA)
    nxt = rig.provider.transfer_to_next(k, "owner", TTL, token=held.token, error="boom")
    assert nxt is not None and (nxt.id, nxt.attempts) == ("s1", 1)
    assert drop.dropped and int(drop.dropped[0][2]) == nxt.token
    state = rig.direct.inspect_key(k)
    assert [(s.id, s.attempts) for s in state.queued] == [("s2", 1)]  # one attempt, not two
    assert state.in_flight == ("s1",)


# -- failure reports [G6] -----------------------------------------------------------------------


def test_failed_signals_go_back_to_the_head_then_to_the_dead_letters(
    provider: RedisLeaseProvider,
) -> None:
    """(c) Every in-flight signal gets one more attempt and goes back to the head in order;
    at max_attempts it is dead-lettered with the error text; inspect_key shows both."""
    k = new_key()
    held = provider.acquire_lease(k, "owner", TTL)
    for name in ("s1", "s2", "s3"):
        provider.acquire_or_enqueue(k, sig(name), TTL)
    taken = provider.take_signals(k, "owner", 2, token=held.token)
    assert [(s.id, s.attempts) for s in taken] == [("s1", 0), ("s2", 0)]

    nxt = provider.transfer_to_next(k, "owner", TTL, token=held.token, error="first")
    assert nxt is not None and (nxt.id, nxt.attempts, nxt.payload) == ("s1", 1, {"id": "s1"})
    state = provider.inspect_key(k)
    assert [(s.id, s.attempts) for s in state.queued] == [("s2", 1), ("s3", 0)]
    assert state.in_flight == ("s1",) and state.dead_letters == ()

    # s1 owns now; it takes s2 and both fail twice more (max_attempts=3 by default).
    owner, token = nxt.id, nxt.token
    for round_, error in enumerate(("second", "third" * 300), start=2):
        again = provider.take_signals(k, owner, 1, token=token)
        assert [(s.id, s.attempts) for s in again] == [("s2", round_ - 1)]
        nxt = provider.transfer_to_next(k, owner, TTL, token=token, error=error)
        assert nxt is not None
        owner, token = nxt.id, nxt.token
        if round_ == 2:
            assert (nxt.id, nxt.attempts) == ("s1", 2)
    # The third failure dead-lettered s1 and s2; s3 owns the key now.
    assert nxt is not None and (nxt.id, nxt.attempts) == ("s3", 0)
    state = provider.inspect_key(k)
    assert (state.owner, state.queued, state.in_flight) == ("s3", (), ("s3",))
    assert [replace(d, failed_at_ms=0) for d in state.dead_letters] == [
        DeadLetter("s1", {"id": "s1"}, 3, ("third" * 300)[:1000], 1, 0),
        DeadLetter("s2", {"id": "s2"}, 3, ("third" * 300)[:1000], 1, 0),
    ]
    assert all(d.failed_at_ms > 1_700_000_000_000 for d in state.dead_letters)  # server ms
    # Dead-lettered ids are duplicates from now on.
    assert provider.acquire_or_enqueue(k, sig("s1"), TTL) == LeaseResult(
        False, "s3", token, position=None
    )
    assert provider.transfer_to_next(k, "s3", TTL, token=token) is None
    assert provider.acquire_or_enqueue(k, sig("s2"), TTL) == LeaseResult(
        False, None, None, position=None
    )
    assert len(provider.inspect_key(k).dead_letters) == 2


def test_requeue_owner_false_leaves_the_owners_signal_to_the_platform(
    provider: RedisLeaseProvider,
) -> None:
    k = new_key()
    held = provider.acquire_or_enqueue(k, sig("own"), TTL)
    provider.acquire_or_enqueue(k, sig("s1"), TTL)
    provider.acquire_or_enqueue(k, sig("s2"), TTL)
    provider.take_signals(k, "own", 1, token=held.token)
    nxt = provider.transfer_to_next(
        k, "own", TTL, token=held.token, error="boom", requeue_owner=False
    )
    # s1 (taken, failed) is retried first; the owner's own signal is gone, not dead-lettered.
    assert nxt is not None and (nxt.id, nxt.attempts) == ("s1", 1)
    state = provider.inspect_key(k)
    assert [(s.id, s.attempts) for s in state.queued] == [("s2", 0)]
    assert state.in_flight == ("s1",) and state.dead_letters == ()
    # The platform retries the owner's event: it is queued again, not a duplicate.
    retried = provider.acquire_or_enqueue(k, sig("own"), TTL)
    assert retried == LeaseResult(False, "s1", nxt.token, position=2)
    # ...and a resend of the failure report is still recognised (by the done memory).
    assert provider.transfer_to_next(k, "own", TTL, token=held.token, error="boom") is not None


def test_max_attempts_one_dead_letters_at_once_and_the_key_is_released(
    provider: RedisLeaseProvider,
) -> None:
    k = new_key()
    held = provider.acquire_or_enqueue(k, sig("own"), TTL)
    assert (
        provider.transfer_to_next(k, "own", TTL, token=held.token, error="x", max_attempts=1)
        is None
    )
    state = provider.inspect_key(k)
    assert (state.owner, state.queued, state.in_flight) == (None, (), ())
    assert [(d.id, d.attempts, d.error) for d in state.dead_letters] == [("own", 1, "x")]
    assert provider.acquire_or_enqueue(k, sig("own"), TTL) == LeaseResult(False, None, None)


def test_an_own_event_failing_without_requeue_resumes_its_attempts_on_each_retry(
    provider: RedisLeaseProvider,
) -> None:
    """[G6] [Q1]: the owner's own event failing with requeue_owner=False is removed (the
    platform retries it) with its count in the done memory; each retry resumes the count
    (LeaseResult.attempts), and at max_attempts it is dead-lettered with its payload."""
    k = new_key()
    payload = {"order": 7, "items": ["ü", None]}
    first = provider.acquire_or_enqueue(k, sig("own", payload), TTL)
    assert (first.acquired, first.owner, first.attempts) == (True, "own", 0)
    token = first.token
    for attempt, error in enumerate(("e1", "e2"), start=1):
        assert (
            provider.transfer_to_next(k, "own", TTL, token=token, error=error, requeue_owner=False)
            is None
        )
        state = provider.inspect_key(k)
        assert (state.owner, state.queued, state.in_flight, state.dead_letters) == (
            None,
            (),
            (),
            (),
        )
        retried = provider.acquire_or_enqueue(k, sig("own", payload), TTL)
        assert retried.acquired and retried.token is not None and token is not None
        assert retried.token > token
        assert retried == LeaseResult(True, "own", retried.token, attempts=attempt)
        token = retried.token
    # The third failed run reaches max_attempts (3): dead-lettered, not left to the platform.
    assert (
        provider.transfer_to_next(k, "own", TTL, token=token, error="e3", requeue_owner=False)
        is None
    )
    state = provider.inspect_key(k)
    assert (state.owner, state.queued, state.in_flight) == (None, (), ())
    assert [replace(d, failed_at_ms=0) for d in state.dead_letters] == [
        DeadLetter("own", payload, 3, "e3", 1, 0)
    ]
    assert provider.client.zscore(provider.redis_keys(k)[10], k) == 0  # dead-letter index
    # Its next retry is a duplicate of a dead letter.
    assert provider.acquire_or_enqueue(k, sig("own", payload), TTL) == LeaseResult(
        False, None, None
    )


def test_a_retried_own_event_queued_behind_a_holder_keeps_its_count(
    provider: RedisLeaseProvider,
) -> None:
    """[Q2] [Q6]: a retry that finds the key held is queued with the resumed count, and is
    handed it (or granted an orphaned key) with that count; a success forgets it."""
    k = new_key()
    held = provider.acquire_or_enqueue(k, sig("own"), TTL)
    provider.acquire_or_enqueue(k, sig("s1"), TTL)
    nxt = provider.transfer_to_next(
        k, "own", TTL, token=held.token, error="boom", max_attempts=2, requeue_owner=False
    )
    assert nxt is not None and (nxt.id, nxt.attempts) == ("s1", 0)
    assert provider.acquire_or_enqueue(k, sig("own"), TTL) == LeaseResult(
        False, "s1", nxt.token, position=1
    )
    assert [(s.id, s.attempts) for s in provider.inspect_key(k).queued] == [("own", 1)]
    handed = provider.transfer_to_next(k, "s1", TTL, token=nxt.token)
    assert handed is not None and (handed.id, handed.attempts) == ("own", 1)
    # A second failure reaches max_attempts=2: dead-lettered.
    assert (
        provider.transfer_to_next(
            k, "own", TTL, token=handed.token, error="x", max_attempts=2, requeue_owner=False
        )
        is None
    )
    assert [(d.id, d.attempts) for d in provider.inspect_key(k).dead_letters] == [("own", 2)]

    # [Q6]: the retry finds an orphaned key whose head is itself: granted with its count.
    k2 = new_key()
    first = provider.acquire_or_enqueue(k2, sig("own"), TTL)
    provider.transfer_to_next(k2, "own", TTL, token=first.token, error="e", requeue_owner=False)
    holder = provider.acquire_lease(k2, "w", TTL)
    provider.acquire_or_enqueue(k2, sig("own"), TTL)
    provider.take_signals(k2, "w", 1, token=holder.token)
    assert provider.renew_lease(k2, "w", 1, token=holder.token)
    time.sleep(0.05)
    again = provider.acquire_or_enqueue(k2, sig("own"), TTL)  # G5 counts the dead run too
    assert again == LeaseResult(True, "own", again.token, attempts=2)
    assert provider.transfer_to_next(k2, "own", TTL, token=again.token) is None
    # Completed: remembered as done (a duplicate), the count forgotten.
    assert provider.acquire_or_enqueue(k2, sig("own"), TTL) == LeaseResult(False, None, None)


def test_a_lost_grant_of_a_retried_own_event_resent_carries_its_attempts(rig: Rig) -> None:
    """[Q7]: the resend of a Q1 grant answers the same grant, with the same attempts."""
    k = new_key()
    first = rig.direct.acquire_or_enqueue(k, sig("own"), TTL)
    rig.direct.transfer_to_next(k, "own", TTL, token=first.token, error="e", requeue_owner=False)
    drop = rig.lose_reply(lg_redis.ACQUIRE_OR_ENQUEUE_LUA)
    result = rig.provider.acquire_or_enqueue(k, sig("own"), TTL)
    assert result == LeaseResult(True, "own", result.token, attempts=1)
    assert drop.dropped and [int(x) for x in drop.dropped[0][2:]] == [result.token, 1]
    assert rig.replies(lg_redis.ACQUIRE_OR_ENQUEUE_LUA)[-1] == drop.dropped[0]
    assert rig.direct.inspect_key(k).in_flight == ("own",)


def test_attempts_come_back_on_claims_and_adoptions(provider: RedisLeaseProvider) -> None:
    k = new_key()
    held = provider.acquire_lease(k, "owner", TTL)
    provider.acquire_or_enqueue(k, sig("s1"), TTL)
    provider.take_signals(k, "owner", 1)
    grant = provider.transfer_to_next(k, "owner", TTL, claim=False, token=held.token, error="e")
    assert grant is not None and grant.token is not None and grant.attempts == 1
    claimed = provider.claim_signal(k, "s1", grant.token, TTL)
    assert claimed is not None and claimed.attempts == 1
    # s1 dies holding the key: the sweeper adopts it with one more attempt (G5: a run that
    # never finished counts).
    assert provider.renew_lease(k, "s1", 1, token=grant.token)
    time.sleep(0.05)
    adopted = [s for key, s in provider.adopt_orphans(TTL, 1000) if key == k]
    assert [(s.id, s.attempts) for s in adopted] == [("s1", 2)]


# -- completed-id memory [G2] / [Q5] ------------------------------------------------------------


def test_a_completed_id_is_a_duplicate(provider: RedisLeaseProvider) -> None:
    """(d) Whoever completed it (its own run, a take, a release, a transfer_lease), a
    completed id answers "duplicate" within the window."""
    k = new_key()
    first = provider.acquire_or_enqueue(k, sig("s1"), TTL)
    assert provider.transfer_to_next(k, "s1", TTL, token=first.token) is None
    assert provider.acquire_or_enqueue(k, sig("s1"), TTL) == LeaseResult(False, None, None)

    held = provider.acquire_lease(k, "a", TTL)
    provider.acquire_or_enqueue(k, sig("s2"), TTL)
    provider.take_signals(k, "a", 10)
    provider.release_lease(k, "a")  # completes s2 [L4]
    assert provider.acquire_or_enqueue(k, sig("s2"), TTL) == LeaseResult(False, None, None)

    held = provider.acquire_lease(k, "b", TTL)
    provider.acquire_or_enqueue(k, sig("s3"), TTL)
    provider.take_signals(k, "b", 10)
    assert provider.transfer_lease(k, "b", "c", TTL)  # completes s3 [T1]
    c_token = provider.inspect_key(k).token
    assert held.token is not None and c_token is not None and c_token > held.token
    assert provider.acquire_or_enqueue(k, sig("s3"), TTL) == LeaseResult(False, "c", c_token)
    # A queued or fresh id is not a duplicate.
    assert provider.acquire_or_enqueue(k, sig("s4"), TTL).position == 1


def test_the_done_memory_keeps_the_newest_done_limit_ids(provider: RedisLeaseProvider) -> None:
    k = new_key()
    held = provider.acquire_lease(k, "owner", TTL)
    ids = [f"s{n}" for n in range(DONE_LIMIT + 1)]
    for name in ids:
        provider.acquire_or_enqueue(k, sig(name), TTL, max_queue=len(ids))
    assert len(provider.take_signals(k, "owner", DONE_LIMIT + 1, token=held.token)) == len(ids)
    assert provider.transfer_to_next(k, "owner", TTL, token=held.token) is None
    # 1002 completed (the 1001 taken, then the owner): the two oldest are forgotten.
    assert provider.acquire_or_enqueue(k, sig("s0"), TTL).acquired
    assert provider.acquire_or_enqueue(k, sig("s1"), TTL).position == 1
    for name in ("s2", ids[-1], "owner"):
        assert provider.acquire_or_enqueue(k, sig(name), TTL).position is None
    done = provider.client.zcard(provider.redis_keys(k)[5])
    assert done == DONE_LIMIT


def test_a_completed_id_is_forgotten_after_the_dedupe_window(
    provider: RedisLeaseProvider,
) -> None:
    k = new_key()
    first = provider.acquire_or_enqueue(k, sig("s1"), TTL)
    provider.transfer_to_next(k, "s1", TTL, token=first.token)
    keys = provider.redis_keys(k)
    assert 0 < provider.client.pttl(keys[5]) <= DEDUPE_WINDOW_MS
    # Age the entry past the window (white box: the completion time is its first field).
    entry = provider.client.hget(keys[6], "s1").decode()
    at, rest = entry.split(":", 1)
    provider.client.hset(keys[6], "s1", f"{int(at) - DEDUPE_WINDOW_MS}:{rest}")
    assert provider.acquire_or_enqueue(k, sig("s1"), TTL).acquired
    # ...and the next write drops it (lazily) before remembering the new completion.
    token = provider.inspect_key(k).token
    assert provider.transfer_to_next(k, "s1", TTL, token=token) is None
    assert provider.client.zcard(keys[5]) == 1


def test_a_released_key_keeps_its_token_and_previous_owner(provider: RedisLeaseProvider) -> None:
    """[G7]: t, p and pt stay after a release, as long as the released owner is remembered."""
    k = new_key()
    held = provider.acquire_lease(k, "a", TTL)
    provider.release_lease(k, "a")
    lease = provider.redis_keys(k)[0]
    fields = provider.client.hgetall(lease)
    assert {f.decode(): v.decode() for f, v in fields.items()} == {
        "t": str(held.token),
        "p": "a",
        "pt": str(held.token),
    }
    assert TOKEN_MEMORY_MS < provider.client.pttl(lease) <= max(DEDUPE_WINDOW_MS, TOKEN_MEMORY_MS)
    again = provider.acquire_lease(k, "b", TTL)
    assert again.token is not None and held.token is not None and again.token > held.token


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param(("release",), id="acquire-release"),
        pytest.param(("transfer", "release"), id="acquire-transfer-release"),
        pytest.param(("transfer",), id="acquire-transfer-expire"),
        pytest.param(("forward", "hand-off", "finish"), id="guarded-chain"),
    ],
)
def test_a_finished_key_leaves_nothing_that_never_expires(
    provider: RedisLeaseProvider, steps: tuple[str, ...]
) -> None:
    """Regression: a release (and a transfer) wrote the p/pt copy into a done memory that did
    not exist yet, so every key ever released kept a hash with no expiry: memory grew with the
    number of distinct keys. Once a key is idle every one of its Redis keys expires (the
    differential suite checks this after every step: tests/differential.py redis_storage)."""
    k = new_key()
    held = provider.acquire_lease(k, "a", TTL)
    owner, token = "a", held.token
    for step in steps:
        if step == "transfer":
            assert provider.transfer_lease(k, owner, "b", TTL)
            owner, token = "b", provider.inspect_key(k).token
        elif step == "forward":
            assert provider.acquire_or_enqueue(k, sig("s1"), TTL).position == 1
        elif step == "hand-off":
            head = provider.transfer_to_next(k, owner, TTL, token=token)
            assert head is not None and head.id == "s1"
            owner, token = "s1", head.token
        elif step == "finish":
            assert provider.transfer_to_next(k, owner, TTL, token=token) is None
        else:
            provider.release_lease(k, owner)
    if steps[-1] == "transfer":
        assert provider.renew_lease(k, owner, 1, token=token)
        time.sleep(0.01)
    assert provider.inspect_key(k).owner is None
    client = provider.client
    names = provider.redis_keys(k)
    lasting = {name: client.pttl(name) for name in names if client.pttl(name) == -1}
    assert lasting == {}
    assert all(client.pttl(name) <= max(DEDUPE_WINDOW_MS, TOKEN_MEMORY_MS) for name in names)


# -- reply shapes [Q6] [Q7] ---------------------------------------------------------------------


def test_an_orphan_whose_head_is_the_callers_own_signal_is_not_adopted(
    provider: RedisLeaseProvider,
) -> None:
    """[Q6]: the dead owner had taken the caller's signal; the head is the caller's own id, so
    the reply owns the key with adopted=None."""
    k = new_key()
    held = provider.acquire_lease(k, "dead", TTL)
    provider.acquire_or_enqueue(k, sig("s1"), TTL)
    provider.take_signals(k, "dead", 1)
    assert provider.renew_lease(k, "dead", 1, token=held.token)
    time.sleep(0.05)
    result = provider.acquire_or_enqueue(k, sig("s1"), TTL)
    assert result.acquired and result.owner == "s1" and result.adopted is None
    assert provider.inspect_key(k).in_flight == ("s1",)


def test_a_resend_after_the_handed_to_owner_expired_is_recognised(
    provider: RedisLeaseProvider,
) -> None:
    """[N4] after an expiry: the lease hash (with p/pt) expired with the head's lease, as the
    model's record does not; the copy of p/pt in the done memory still recognises the resend,
    with or without a token."""
    k = new_key()
    held = provider.acquire_or_enqueue(k, sig("s0"), TTL)
    provider.acquire_or_enqueue(k, sig("s1"), TTL)
    nxt = provider.transfer_to_next(k, "s0", TTL, token=held.token)
    assert nxt is not None and nxt.id == "s1"
    assert provider.renew_lease(k, "s1", 1, token=nxt.token)
    time.sleep(0.02)
    assert not provider.client.exists(provider.redis_keys(k)[0])
    assert provider.transfer_to_next(k, "s0", TTL) is None
    assert provider.transfer_to_next(k, "s0", TTL, token=held.token) is None
    with pytest.raises(LeaseLostError):
        provider.transfer_to_next(k, "s1", TTL, token=nxt.token)  # expired: not a resend
    # A fresh grant (no previous owner) clears the copy, as it clears p in the model.
    assert provider.acquire_lease(k, "x", 1).acquired
    time.sleep(0.02)
    with pytest.raises(LeaseLostError):
        provider.transfer_to_next(k, "s0", TTL)


# -- the model, call for call -------------------------------------------------------------------


def expire_lease(provider: RedisLeaseProvider, key: str) -> None:
    """The key's current owner dies: its lease runs out now (the lease hash expires with it)."""
    state = provider.inspect_key(key)
    assert state.owner is not None
    assert provider.renew_lease(key, state.owner, 1, token=state.token)
    time.sleep(0.02)
    assert provider.inspect_key(key).owner is None


def orphan_indexed(provider: RedisLeaseProvider, key: str) -> bool:
    return provider.client.zscore(provider.redis_keys(key)[4], key) is not None


def hash_tag(name: str) -> str:
    return name[name.index("{") + 1 : name.index("}")]


def without_deadline(state: KeyState) -> KeyState:
    return replace(state, remaining_ms=None)


# -- backpressure [Q8] --------------------------------------------------------------------------


def test_a_forward_into_a_full_queue_is_refused_and_stores_nothing(
    provider: RedisLeaseProvider,
) -> None:
    k = new_key()
    held = provider.acquire_lease(k, "owner", TTL)
    assert provider.acquire_or_enqueue(k, sig("s1"), TTL, max_queue=2).position == 1
    assert provider.acquire_or_enqueue(k, sig("s2"), TTL, max_queue=2).position == 2
    before = provider.inspect_key(k)
    with pytest.raises(QueueFull) as refused:
        provider.acquire_or_enqueue(k, sig("s3"), TTL, max_queue=2)
    full = refused.value
    assert (full.key, full.depth, full.limit, full.holder) == (k, 2, 2, "owner")
    assert without_deadline(provider.inspect_key(k)) == without_deadline(before)
    assert provider.pending_signals(k) == 2
    # Not Q8: an id already queued keeps its place [Q3], a duplicate is a duplicate [Q5].
    assert provider.acquire_or_enqueue(k, sig("s2"), TTL, max_queue=1).position == 2
    assert provider.acquire_or_enqueue(k, sig("owner"), TTL, max_queue=1) == LeaseResult(
        False, "owner", held.token
    )  # [Q4] a second delivery of the owner
    # Room again: queued [Q2].
    provider.take_signals(k, "owner", 1, token=held.token)
    assert provider.acquire_or_enqueue(k, sig("s3"), TTL, max_queue=2).position == 2


def test_the_providers_max_queue_is_the_default_bound(
    make_provider: ProviderFactory, backend: str
) -> None:
    provider = make_provider(backend)(max_queue=1)
    assert isinstance(provider, RedisLeaseProvider)
    k = new_key()
    assert provider.acquire_or_enqueue(k, sig("s1"), TTL).acquired  # [Q1] needs no room
    assert provider.acquire_or_enqueue(k, sig("s2"), TTL).position == 1
    with pytest.raises(QueueFull) as refused:
        provider.acquire_or_enqueue(k, sig("s3"), TTL)
    assert (refused.value.depth, refused.value.limit, refused.value.holder) == (1, 1, "s1")
    assert provider.acquire_or_enqueue(k, sig("s3"), TTL, max_queue=2).position == 2


def test_a_full_orphaned_key_is_refused_before_its_work_is_requeued(
    provider: RedisLeaseProvider,
) -> None:
    """[Q8] before [Q6]: no G5 (the dead owner's signal keeps its attempts), no grant."""
    k = new_key()
    assert provider.acquire_or_enqueue(k, sig("s1"), TTL).acquired
    provider.acquire_or_enqueue(k, sig("s2"), TTL)
    expire_lease(provider, k)
    before = provider.inspect_key(k)
    with pytest.raises(QueueFull) as refused:
        provider.acquire_or_enqueue(k, sig("s3"), TTL, max_queue=1)
    assert (refused.value.depth, refused.value.holder) == (1, None)
    assert provider.inspect_key(k) == before
    # A known id is not refused: [Q6], the dead owner's signal first, one more attempt (G5).
    result = provider.acquire_or_enqueue(k, sig("s2"), TTL, max_queue=1)
    assert result.acquired and result.owner == "s1"
    assert result.adopted is not None and (result.adopted.id, result.adopted.attempts) == ("s1", 1)


# -- halting [G6] [N1] [Q9] [D4] ----------------------------------------------------------------


def halted_key(provider: RedisLeaseProvider) -> str:
    """s1 owned the key and failed for good under on_poison="halt"; s2, s3 were queued."""
    k = new_key()
    held = provider.acquire_or_enqueue(k, sig("s1"), TTL)
    provider.acquire_or_enqueue(k, sig("s2"), TTL)
    provider.acquire_or_enqueue(k, sig("s3"), TTL)
    released = provider.transfer_to_next(
        k, "s1", TTL, token=held.token, error="poison", max_attempts=1, on_poison="halt"
    )
    assert released is None  # [N1] with signals queued: the key is halted
    return k


def test_a_halting_failure_releases_the_key_with_its_queue_kept(
    provider: RedisLeaseProvider,
) -> None:
    k = halted_key(provider)
    state = provider.inspect_key(k)
    assert (state.owner, state.in_flight, state.halted) == (None, (), True)
    assert [s.id for s in state.queued] == ["s2", "s3"]
    assert [(d.id, d.attempts, d.error) for d in state.dead_letters] == [("s1", 1, "poison")]
    assert k in provider.dead_letter_keys(1000)
    # [D4] the sweeper adopts nothing, and the orphan index does not list the key at all.
    assert not orphan_indexed(provider, k)
    assert [key for key, _ in provider.adopt_orphans(TTL, 1000)].count(k) == 0
    assert provider.inspect_key(k) == state
    # The halt outlives the released lease hash: it is not in it.
    provider.client.delete(provider.redis_keys(k)[0])
    assert provider.inspect_key(k).halted


def test_skip_and_failures_that_dead_letter_nothing_do_not_halt(
    provider: RedisLeaseProvider,
) -> None:
    k = new_key()
    held = provider.acquire_or_enqueue(k, sig("s1"), TTL)
    provider.acquire_or_enqueue(k, sig("s2"), TTL)
    retried = provider.transfer_to_next(k, "s1", TTL, token=held.token, error="e", on_poison="halt")
    assert retried is not None and (retried.id, retried.attempts) == ("s1", 1)  # attempts < 3
    assert not provider.inspect_key(k).halted
    nxt = provider.transfer_to_next(k, "s1", TTL, token=retried.token, error="e", max_attempts=1)
    assert nxt is not None and nxt.id == "s2"  # skip: the key moves on
    assert not provider.inspect_key(k).halted


def test_events_for_a_halted_key_queue_behind_the_dead_letter(
    provider: RedisLeaseProvider,
) -> None:
    """[Q9]: not acquired, no holder, a position; again: the same position; [Q5] still first."""
    k = halted_key(provider)
    assert provider.acquire_or_enqueue(k, sig("s4"), TTL) == LeaseResult(
        False, None, None, position=3
    )
    assert provider.acquire_or_enqueue(k, sig("s4"), TTL).position == 3
    assert provider.acquire_or_enqueue(k, sig("s2"), TTL).position == 1
    assert provider.acquire_or_enqueue(k, sig("s1"), TTL) == LeaseResult(False, None, None)
    with pytest.raises(QueueFull) as refused:  # [Q8] before [Q9]
        provider.acquire_or_enqueue(k, sig("s5"), TTL, max_queue=3)
    assert (refused.value.depth, refused.value.holder) == (3, None)
    state = provider.inspect_key(k)
    assert (state.owner, state.halted) == (None, True)
    assert [s.id for s in state.queued] == ["s2", "s3", "s4"]
    assert not orphan_indexed(provider, k)


def test_a_halted_key_requeues_a_dead_owners_signals_on_the_next_event(
    provider: RedisLeaseProvider,
) -> None:
    """A plain owner took a signal of the halted key and died: [D4] leaves it, [Q9] requeues it
    (G5, one more attempt) and still grants nothing."""
    k = halted_key(provider)
    worker = provider.acquire_lease(k, "w", TTL)  # [L3]: a halted key is free
    assert [s.id for s in provider.take_signals(k, "w", 1, token=worker.token)] == ["s2"]
    expire_lease(provider, k)
    assert k not in [key for key, _ in provider.adopt_orphans(TTL, 1000)]
    assert provider.inspect_key(k).in_flight == ("s2",)
    assert provider.acquire_or_enqueue(k, sig("s4"), TTL) == LeaseResult(
        False, None, None, position=3
    )
    state = provider.inspect_key(k)
    assert [(s.id, s.attempts) for s in state.queued] == [("s2", 1), ("s3", 0), ("s4", 0)]
    assert (state.owner, state.in_flight, state.halted) == (None, (), True)


def test_a_plain_owner_of_a_halted_key_releases_it_with_a_queue(
    provider: RedisLeaseProvider,
) -> None:
    """[N1] while halted, whatever is queued."""
    k = halted_key(provider)
    worker = provider.acquire_lease(k, "w", TTL)
    assert provider.transfer_to_next(k, "w", TTL, token=worker.token) is None
    state = provider.inspect_key(k)
    assert (state.owner, len(state.queued), state.halted) == (None, 2, True)


# -- claiming an expired grant again [C4] -------------------------------------------------------


def handed_off(provider: RedisLeaseProvider) -> tuple[str, Signal]:
    """An envelope grant of s1 (s2 queued behind it), not claimed yet."""
    k = new_key()
    held = provider.acquire_lease(k, "a", TTL)
    provider.acquire_or_enqueue(k, sig("s1"), TTL)
    provider.acquire_or_enqueue(k, sig("s2"), TTL)
    grant = provider.transfer_to_next(k, "a", TTL, claim=False, token=held.token)
    assert grant is not None and grant.id == "s1" and grant.token is not None
    return k, grant


@pytest.mark.parametrize("claimed_first", [True, False])
def test_an_envelope_retried_after_its_grant_expired_runs_it_again(
    provider: RedisLeaseProvider, claimed_first: bool
) -> None:
    """[C4]: the receiver that claimed it died (or the envelope came after the lease ran out):
    the retry gets the signal under a new token, with one more attempt only if a receiver had
    claimed it (G5: an unclaimed grant never started)."""
    k, grant = handed_off(provider)
    assert grant.token is not None
    if claimed_first:
        first = provider.claim_signal(k, "s1", grant.token, TTL)
        assert first is not None and first.token == grant.token  # [C1]
        assert provider.claim_signal(k, "s1", grant.token, TTL) is None  # [C2]
    expire_lease(provider, k)
    again = provider.claim_signal(k, "s1", grant.token, TTL)
    assert again is not None and (again.id, again.payload, again.attempts) == (
        "s1",
        {"id": "s1"},
        1 if claimed_first else 0,
    )
    assert again.token is not None and again.token > grant.token
    state = provider.inspect_key(k)
    assert (state.owner, state.token, state.in_flight) == ("s1", again.token, ("s1",))
    assert [s.id for s in state.queued] == ["s2"]
    # The old envelope again, or with the new token: [C3] / [C2].
    assert provider.claim_signal(k, "s1", grant.token, TTL) is None
    assert provider.claim_signal(k, "s1", again.token, TTL) is None
    # The new run completes as usual.
    nxt = provider.transfer_to_next(k, "s1", TTL, token=again.token)
    assert nxt is not None and nxt.id == "s2"


def test_c4_needs_the_last_token_and_the_signal_first_in_flight(
    provider: RedisLeaseProvider,
) -> None:
    k, grant = handed_off(provider)
    assert grant.token is not None
    expire_lease(provider, k)
    assert provider.claim_signal(k, "s1", grant.token - 1, TTL) is None  # an older token
    assert provider.claim_signal(k, "s2", grant.token, TTL) is None  # queued, not in flight
    # Adopted by the sweeper first (a new grant): the old envelope is stale.
    assert [key for key, _ in provider.adopt_orphans(TTL, 1000)].count(k) == 1
    assert provider.claim_signal(k, "s1", grant.token, TTL) is None


def test_c4_does_not_apply_to_a_halted_key(provider: RedisLeaseProvider) -> None:
    """A plain owner of a halted key took s2 and died under token tw: on a running key, s2
    first in flight with t = tw would be [C4]; halted, nothing is granted."""
    k = halted_key(provider)
    worker = provider.acquire_lease(k, "w", TTL)
    assert worker.token is not None
    provider.take_signals(k, "w", 1, token=worker.token)
    expire_lease(provider, k)
    assert provider.claim_signal(k, "s2", worker.token, TTL) is None
    state = provider.inspect_key(k)
    assert (state.owner, state.in_flight, state.halted) == (None, ("s2",), True)


def test_a_lost_c4_reply_resent_gets_the_same_grant(rig: Rig) -> None:
    """[C4] again while w = this call's nonce: the same token, one attempt counted, not two."""
    k, grant = handed_off(rig.direct)
    assert grant.token is not None
    assert rig.direct.claim_signal(k, "s1", grant.token, TTL) is not None  # a receiver ran it
    expire_lease(rig.direct, k)
    drop = rig.lose_reply(lg_redis.CLAIM_SIGNAL_LUA)
    again = rig.provider.claim_signal(k, "s1", grant.token, TTL)
    assert again is not None and again.token is not None and again.attempts == 1
    assert drop.dropped and int(drop.dropped[0][3]) == again.token
    replies = rig.replies(lg_redis.CLAIM_SIGNAL_LUA)
    assert len(replies) == 2 and replies[0] == replies[1]
    state = rig.direct.inspect_key(k)
    assert (state.owner, state.token, state.in_flight) == ("s1", again.token, ("s1",))


def test_a_lost_c1_reply_resent_gets_the_same_claim(rig: Rig) -> None:
    k, grant = handed_off(rig.direct)
    assert grant.token is not None
    rig.lose_reply(lg_redis.CLAIM_SIGNAL_LUA)
    claimed = rig.provider.claim_signal(k, "s1", grant.token, TTL)
    assert claimed is not None and (claimed.token, claimed.attempts) == (grant.token, 0)
    assert rig.direct.claim_signal(k, "s1", grant.token, TTL) is None  # [C2] another call


# -- redrive [V1] [V2] and the dead-letter index ------------------------------------------------


def two_dead_letters(provider: RedisLeaseProvider, *, halt: bool = True) -> str:
    """s1 and s2 died (in that order) under a plain owner; s3 is queued; the key is free."""
    k = new_key()
    held = provider.acquire_lease(k, "a", TTL)
    for name in ("s1", "s2", "s3"):
        provider.acquire_or_enqueue(k, sig(name), TTL)
    provider.take_signals(k, "a", 2, token=held.token)
    nxt = provider.transfer_to_next(
        k,
        "a",
        TTL,
        token=held.token,
        error="bad",
        max_attempts=1,
        on_poison="halt" if halt else "skip",
    )
    if nxt is not None:  # skip: s3 owns; let it finish
        provider.transfer_to_next(k, nxt.id, TTL, token=nxt.token)
    return k


def test_redrive_all_puts_the_dead_letters_first_and_resumes_the_key(
    provider: RedisLeaseProvider,
) -> None:
    k = two_dead_letters(provider)
    assert provider.inspect_key(k).halted and k in provider.dead_letter_keys()
    assert provider.redrive(k) == 2  # [V1]
    state = provider.inspect_key(k)
    assert [(s.id, s.attempts, s.payload) for s in state.queued] == [
        ("s1", 0, {"id": "s1"}),
        ("s2", 0, {"id": "s2"}),
        ("s3", 0, {"id": "s3"}),
    ]
    assert (state.owner, state.dead_letters, state.halted) == (None, (), False)
    assert k not in provider.dead_letter_keys(1000)
    assert provider.redrive(k) == 0  # [V2] called again (a new call): nothing moves
    assert provider.inspect_key(k) == state
    # A free key with work is orphaned: the sweeper runs the head.
    assert orphan_indexed(provider, k)
    adopted = [s for key, s in provider.adopt_orphans(TTL, 1000) if key == k]
    assert [(s.id, s.attempts) for s in adopted] == [("s1", 0)]


def test_a_lost_redrive_reply_resent_answers_what_it_moved(rig: Rig) -> None:
    """[V3] The redrive ran, its reply was lost with the connection; before redis-py's resend
    of the same EVALSHA (the same nonce) the redriven head ran and another signal died. The
    resend answers 2, what the first run moved (issue 23, 6: it said "nothing to redrive"),
    and leaves the new dead letter alone."""
    k = two_dead_letters(rig.direct)

    def others_move_on() -> None:
        adopted = [s for key, s in rig.direct.adopt_orphans(TTL, 1000, claim=True) if key == k]
        assert [s.id for s in adopted] == ["s1"]
        nxt = rig.direct.transfer_to_next(
            k, "s1", TTL, token=adopted[0].token, error="again", max_attempts=1
        )
        assert nxt is not None and nxt.id == "s2"

    drop = rig.lose_reply(lg_redis.REDRIVE_LUA, before_retry=others_move_on)
    assert rig.provider.redrive(k) == 2
    assert drop.dropped == [2]  # the first run moved both
    state = rig.direct.inspect_key(k)
    assert [d.id for d in state.dead_letters] == ["s1"]  # the resend moved nothing more
    assert (state.owner, [s.id for s in state.queued]) == ("s2", ["s3"])
    assert rig.direct.redrive(k) == 1  # a new call moves what died since


def test_redrive_of_some_ids_keeps_the_others_in_order(provider: RedisLeaseProvider) -> None:
    k = two_dead_letters(provider, halt=False)
    assert not provider.inspect_key(k).halted
    assert provider.redrive(k, ["s1", "nope"]) == 1
    state = provider.inspect_key(k)
    assert [s.id for s in state.queued] == ["s1"] and state.owner is None
    assert [d.id for d in state.dead_letters] == ["s2"]
    assert k in provider.dead_letter_keys()
    assert provider.redrive(k, ["s1"]) == 0  # [V2]
    # s1 runs (a new event takes the orphaned key, Q6) and dies again: it is the newest dead
    # letter, after s2 (the dead letters' order survives a partial redrive).
    result = provider.acquire_or_enqueue(k, sig("s4"), TTL)
    assert result.acquired and result.owner == "s1" and result.token is not None
    provider.transfer_to_next(
        k, "s1", TTL, token=result.token, error="again", max_attempts=1, requeue_owner=True
    )
    assert [d.id for d in provider.inspect_key(k).dead_letters] == ["s2", "s1"]
    assert provider.redrive(k, ["s1", "s2"]) == 2
    assert [s.id for s in provider.inspect_key(k).queued][:2] == ["s2", "s1"]
    assert k not in provider.dead_letter_keys(1000)


def test_redrive_of_a_held_key_queues_behind_the_owner(provider: RedisLeaseProvider) -> None:
    k = two_dead_letters(provider)
    worker = provider.acquire_lease(k, "w", TTL)
    assert provider.redrive(k, ("s2",)) == 1
    state = provider.inspect_key(k)
    assert (state.owner, [s.id for s in state.queued], state.halted) == ("w", ["s2", "s3"], False)
    nxt = provider.transfer_to_next(k, "w", TTL, token=worker.token)
    assert nxt is not None and (nxt.id, nxt.attempts) == ("s2", 0)


def test_redrive_of_a_key_without_dead_letters_changes_nothing(
    provider: RedisLeaseProvider,
) -> None:
    k = new_key()
    assert provider.redrive(k) == 0
    provider.acquire_lease(k, "a", TTL)
    assert provider.redrive(k, ["x"]) == 0
    assert provider.inspect_key(k).owner == "a"
    assert k not in provider.dead_letter_keys(1000)


def test_the_dead_letter_index_lists_the_keys_with_dead_letters(
    provider: RedisLeaseProvider,
) -> None:
    """One index per slot on Cluster (like the orphan index), in the key's own slot, so each
    script keeps it in step; dead_letter_keys reads the indexes, never the keyspace."""
    keys = [f"dl {n} {{{uuid.uuid4().hex[:6]}}}" for n in range(6)]
    for k in keys[:5]:
        held = provider.acquire_or_enqueue(k, sig("s1"), TTL)
        provider.transfer_to_next(k, "s1", TTL, token=held.token, error="x", max_attempts=1)
    clean = provider.acquire_or_enqueue(keys[5], sig("s1"), TTL)
    provider.transfer_to_next(keys[5], "s1", TTL, token=clean.token)
    assert provider.dead_letter_keys(1000) == sorted(keys[:5])
    assert provider.dead_letter_keys(2) == sorted(keys[:5])[:2]
    for k in keys[:5]:
        index, lease = provider.redis_keys(k)[10], provider.redis_keys(k)[0]
        assert provider.client.zscore(index, k) == 0
        if provider.cluster:  # the key's slot's own index
            assert lg_redis.key_slot(hash_tag(index)) == lg_redis.key_slot(hash_tag(lease))
        else:
            assert index == f"{provider.prefix}deadindex"
    if provider.cluster:
        slots = {lg_redis.key_slot(lg_redis.escape_key(k)) for k in keys[:5]}
        assert len(slots) > 1  # several indexes
    assert provider.redrive(keys[0]) == 1
    assert provider.dead_letter_keys(1000) == sorted(keys[1:5])


def test_the_state_hash_goes_when_nothing_needs_it(provider: RedisLeaseProvider) -> None:
    """h and g outlive an expired lease hash, but a key with no work that is not halted keeps
    no state hash (no key left behind without a TTL)."""
    k = two_dead_letters(provider)
    state_key = provider.redis_keys(k)[9]
    assert provider.client.hget(state_key, "h") == b"1"
    assert provider.redrive(k) == 2
    assert provider.client.hget(state_key, "h") is None
    ((_, head),) = [(key, s) for key, s in provider.adopt_orphans(TTL, 1000) if key == k]
    assert (
        head.token is not None and provider.client.hget(state_key, "g") == str(head.token).encode()
    )
    token, owner = head.token, head.id
    for _ in range(3):
        nxt = provider.transfer_to_next(k, owner, TTL, token=token)
        if nxt is None:
            break
        assert nxt.token is not None
        owner, token = nxt.id, nxt.token
    assert provider.inspect_key(k).queued == ()
    assert not provider.client.exists(state_key)


# -- the new rows against the model, call for call (resends included) ---------------------------

POISON = {"error": "boom", "requeue_owner": True, "max_attempts": 1, "on_poison": "halt"}
OWN = {"error": "own", "requeue_owner": False, "max_attempts": 3, "on_poison": "skip"}
SCRIPTED: dict[str, list[Op]] = {
    "Q8": [
        Op("acquire_lease", "k0", owner="w0"),
        Op("acquire_or_enqueue", "k0", id="s1", v=1, max_queue=1),
        Op("acquire_or_enqueue", "k0", id="s2", v=2, max_queue=1),
        Op("acquire_or_enqueue", "k0", id="s2", v=2, max_queue=1, resend=True),
        Op("acquire_or_enqueue", "k0", id="s1", v=1, max_queue=1),
        Op("expire", "k0"),
        Op("acquire_or_enqueue", "k0", id="s3", v=3, max_queue=1),
        Op("acquire_or_enqueue", "k0", id="s1", v=1, max_queue=1, resend=True),
    ],
    "halt N1 Q9 D4 V1": [
        Op("acquire_or_enqueue", "k0", id="s1", v=1),
        Op("acquire_or_enqueue", "k0", id="s2", v=2),
        Op("transfer_to_next", "k0", owner="s1", claim=True, token=T(0), failure=POISON),
        Op("transfer_to_next", "k0", owner="s1", claim=True, token=T(0), resend=True),
        Op("acquire_or_enqueue", "k0", id="s3", v=3, resend=True),
        Op("adopt_orphans", "k0", claim=False),
        Op("acquire_lease", "k0", owner="w0"),
        Op("take_signals", "k0", owner="w0", limit=1, token=T(1)),
        Op("expire", "k0"),
        Op("adopt_orphans", "k0", claim=True),
        Op("claim_signal", "k0", owner="s2", token=T(1)),
        Op("acquire_or_enqueue", "k0", id="s4", v=4),
        Op("dead_letter_keys", "k0"),
        Op("redrive", "k0", ids=("s1",), resend=True),
        Op("adopt_orphans", "k0", claim=True, resend=True),
        Op("dead_letter_keys", "k0"),
    ],
    "C4": [
        Op("acquire_lease", "k0", owner="w0"),
        Op("acquire_or_enqueue", "k0", id="s1", v=1),
        Op("acquire_or_enqueue", "k0", id="s2", v=2),
        Op("transfer_to_next", "k0", owner="w0", claim=False, token=T(0)),
        Op("claim_signal", "k0", owner="s1", token=T(1), resend=True),
        Op("expire", "k0"),
        Op("claim_signal", "k0", owner="s1", token=T(1), resend=True),
        Op("claim_signal", "k0", owner="s1", token=T(1)),
        Op("expire", "k0"),
        Op("claim_signal", "k0", owner="s1", token=T(2)),
        Op("transfer_to_next", "k0", owner="s1", claim=False, token=T(3)),
    ],
    "G6 own attempts Q1 Q2 Q7": [
        Op("acquire_or_enqueue", "k0", id="s1", v=1),
        Op("acquire_or_enqueue", "k0", id="s2", v=2),
        Op("take_signals", "k0", owner="s1", limit=1, token=T(0)),
        Op("transfer_to_next", "k0", owner="s1", claim=True, token=T(0), failure=OWN),
        Op("acquire_or_enqueue", "k0", id="s1", v=1, resend=True),
        Op("transfer_to_next", "k0", owner="s2", claim=True, token=T(1), failure=OWN),
        Op("acquire_or_enqueue", "k0", id="s2", v=2, resend=True),
        Op("transfer_to_next", "k0", owner="s1", claim=True, token=T(2), failure=OWN),
        Op("transfer_to_next", "k0", owner="s2", claim=True, token=T(3), failure=OWN),
        Op("acquire_or_enqueue", "k0", id="s2", v=2, resend=True),
        Op("acquire_or_enqueue", "k0", id="s2", v=2),
        Op("acquire_or_enqueue", "k0", id="s1", v=1, resend=True),
        Op("transfer_to_next", "k0", owner="s1", claim=True, token=T(4), failure=OWN),
    ],
    "V1 V2 index": [
        Op("acquire_or_enqueue", "k0", id="s1", v=1),
        Op("transfer_to_next", "k0", owner="s1", claim=True, token=T(0), failure=POISON),
        Op("acquire_or_enqueue", "k1", id="s2", v=2),
        Op("acquire_or_enqueue", "k1", id="s3", v=3),
        Op("take_signals", "k1", owner="s2", limit=1, token=T(0)),
        Op(
            "transfer_to_next",
            "k1",
            owner="s2",
            claim=True,
            token=T(0),
            failure={**POISON, "on_poison": "skip"},
        ),
        Op("dead_letter_keys", "k0"),
        Op("redrive", "k1", ids=("s3",), resend=True),
        Op("dead_letter_keys", "k0"),
        Op("redrive", "k0", resend=True),
        Op("redrive", "k1"),
        Op("dead_letter_keys", "k0"),
        Op("acquire_or_enqueue", "k0", id="s4", v=4),
        Op("acquire_or_enqueue", "k1", id="s4", v=4),
    ],
}


@pytest.mark.parametrize("name", sorted(SCRIPTED))
def test_the_new_rows_agree_with_the_model(provider: RedisLeaseProvider, name: str) -> None:
    assert replay(SCRIPTED[name], redis_side(provider.client)) == []
