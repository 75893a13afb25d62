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
from leaseguard.protocol.model import DEDUPE_WINDOW_MS, DONE_LIMIT, TOKEN_MEMORY_MS
from leaseguard.providers import redis as lg_redis
from leaseguard.providers.redis import RedisLeaseProvider
from leaseguard.signals import DeadLetter

from .conftest import ProviderFactory
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


def test_attempts_come_back_on_claims_and_adoptions(provider: RedisLeaseProvider) -> None:
    k = new_key()
    held = provider.acquire_lease(k, "owner", TTL)
    provider.acquire_or_enqueue(k, sig("s1"), TTL)
    provider.take_signals(k, "owner", 1)
    grant = provider.transfer_to_next(k, "owner", TTL, claim=False, token=held.token, error="e")
    assert grant is not None and grant.token is not None and grant.attempts == 1
    claimed = provider.claim_signal(k, "s1", grant.token, TTL)
    assert claimed is not None and claimed.attempts == 1
    # s1 dies holding the key: the sweeper adopts it with its attempts.
    assert provider.renew_lease(k, "s1", 1, token=grant.token)
    time.sleep(0.05)
    adopted = [s for key, s in provider.adopt_orphans(TTL, 1000) if key == k]
    assert [(s.id, s.attempts) for s in adopted] == [("s1", 1)]


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
        provider.acquire_or_enqueue(k, sig(name), TTL)
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
