"""Fault: the connection dies right after Redis applied a command, before its reply arrived.

Every case runs the real provider through :class:`~tests.faults.ReplyDroppingProxy` in front of
a real Redis server (standalone, and every node of a real Cluster): the proxy lets the chosen
script run, reads its reply, and closes the client's connection instead of passing it on, as a
``CLIENT KILL`` of that connection right after the command would. redis-py then resends the same
command on a new connection (its retry is part of the provider's client configuration), so the
script runs a second time and meets its own effect. The cases check that the caller gets the
result of the first run, that nothing was applied twice (no double enqueue, no second grant
and token, no second batch), and that nothing another client did in between is undone.

The proxy records the reply it dropped; comparing it with the reply the retry got is how a test
knows the retry returned the applied result rather than a new one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from leaseguard import Signal, current_lease, lease_owned
from leaseguard.providers import redis as lg_redis
from leaseguard.testing import LambdaContext

from .faults import Rig, proxied_rig

TTL = 10_000


@pytest.fixture(params=["redis", "redis-cluster"])
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    with proxied_rig(request, request.param, f"amb{uuid.uuid4().hex[:8]}:") as made:
        yield made


def key() -> str:
    return f"order:{{{uuid.uuid4().hex[:6]}}}"


def sig(n: int) -> Signal:
    return Signal(f"s{n}", {"n": n})


def test_a_renew_whose_reply_was_lost(rig: Rig) -> None:
    k = key()
    held = rig.provider.acquire_lease(k, "a", TTL)
    drop = rig.lose_reply(lg_redis.RENEW_LUA)
    assert rig.provider.renew_lease(k, "a", TTL, token=held.token) is True
    assert drop.dropped == [1] and rig.replies(lg_redis.RENEW_LUA) == [1, 1]  # it ran twice
    state = rig.direct.inspect_key(k)
    assert (state.owner, state.token) == ("a", held.token)


def test_a_transfer_whose_reply_was_lost_grants_once(rig: Rig) -> None:
    k = key()
    rig.provider.acquire_lease(k, "a", TTL)
    drop = rig.lose_reply(lg_redis.TRANSFER_LUA)
    assert rig.provider.transfer_lease(k, "a", "b", TTL) is True
    first, retry = rig.replies(lg_redis.TRANSFER_LUA)
    assert drop.dropped == [first]
    assert retry == first  # the retry reported the applied grant: same token, no second one
    state = rig.direct.inspect_key(k)
    assert (state.owner, state.token) == ("b", int(first[1]))


def test_an_enqueue_whose_reply_was_lost_is_queued_once(rig: Rig) -> None:
    k = key()
    held = rig.provider.acquire_lease(k, "owner", TTL)
    rig.provider.acquire_or_enqueue(k, sig(0), TTL)
    rig.lose_reply(lg_redis.ACQUIRE_OR_ENQUEUE_LUA)
    result = rig.provider.acquire_or_enqueue(k, sig(1), TTL)
    assert (result.acquired, result.owner, result.token, result.position) == (
        False,
        "owner",
        held.token,
        2,
    )
    assert [s.id for s in rig.direct.inspect_key(k).queued] == ["s0", "s1"]
    assert rig.direct.pending_signals(k) == 2


def test_an_acquire_whose_reply_was_lost_still_owns_and_runs(rig: Rig) -> None:
    k = key()
    drop = rig.lose_reply(lg_redis.ACQUIRE_OR_ENQUEUE_LUA)
    result = rig.provider.acquire_or_enqueue(k, sig(1), TTL)
    (first,) = drop.dropped
    # Not "a duplicate of a running signal": this call's own grant, with its one token.
    assert (result.acquired, result.owner, result.token) == (True, "s1", int(first[2]))
    state = rig.direct.inspect_key(k)
    assert (state.owner, state.token, state.in_flight) == ("s1", result.token, ("s1",))
    again = rig.provider.acquire_or_enqueue(k, sig(1), TTL)  # a real second delivery still is
    assert not again.acquired and again.position is None


def test_an_adopting_acquire_whose_reply_was_lost_runs_the_orphan(rig: Rig) -> None:
    k = key()
    rig.provider.acquire_or_enqueue(k, sig(0), 100)  # dies with s0 in flight
    rig.provider.acquire_or_enqueue(k, sig(1), TTL)
    time.sleep(0.3)
    rig.lose_reply(lg_redis.ACQUIRE_OR_ENQUEUE_LUA)
    result = rig.provider.acquire_or_enqueue(k, sig(2), TTL)
    assert result.acquired and result.adopted is not None
    assert (result.owner, result.adopted.id, result.adopted.payload) == ("s0", "s0", {"n": 0})
    state = rig.direct.inspect_key(k)
    assert (state.owner, state.token) == ("s0", result.token)
    assert [s.id for s in state.queued] == ["s1", "s2"]  # nothing queued twice, nothing lost


def test_a_take_whose_reply_was_lost_returns_the_same_batch(rig: Rig) -> None:
    k = key()
    held = rig.provider.acquire_lease(k, "owner", TTL)
    for n in range(3):
        rig.provider.acquire_or_enqueue(k, sig(n), TTL)
    rig.lose_reply(lg_redis.TAKE_SIGNALS_LUA)
    taken = rig.provider.take_signals(k, "owner", 2, token=held.token)
    assert [s.id for s in taken] == ["s0", "s1"]  # not lost, not skipped
    assert [s.id for s in rig.provider.take_signals(k, "owner", 10)] == ["s2"]
    assert rig.direct.inspect_key(k).in_flight == ("s0", "s1", "s2")


def test_a_hand_off_whose_reply_was_lost_hands_off_once(rig: Rig) -> None:
    k = key()
    held = rig.provider.acquire_lease(k, "owner", TTL)
    rig.provider.acquire_or_enqueue(k, sig(1), TTL)
    rig.provider.acquire_or_enqueue(k, sig(2), TTL)
    drop = rig.lose_reply(lg_redis.TRANSFER_TO_NEXT_LUA)
    nxt = rig.provider.transfer_to_next(k, "owner", TTL, token=held.token)
    (first,) = drop.dropped
    assert nxt is not None and (nxt.id, nxt.payload, nxt.token) == ("s1", {"n": 1}, int(first[2]))
    state = rig.direct.inspect_key(k)
    assert (state.owner, state.token, state.in_flight) == ("s1", nxt.token, ("s1",))
    assert [s.id for s in state.queued] == ["s2"]  # the next one was not skipped


def test_a_release_whose_reply_was_lost_releases_nobody_else(rig: Rig) -> None:
    k = key()
    held = rig.provider.acquire_or_enqueue(k, sig(1), TTL)
    # Applied, reply lost; before the client resends, another invocation takes the free key.
    rig.lose_reply(
        lg_redis.TRANSFER_TO_NEXT_LUA,
        before_retry=lambda: rig.direct.acquire_or_enqueue(k, sig(2), TTL),
    )
    # The resend is recognised as the release it was (docs/protocol.md, row N4): no false
    # LeaseLostError (which fired on_lost, a LeaseLost metric and an ERROR log for a clean run).
    assert rig.provider.transfer_to_next(k, "s1", TTL, token=held.token) is None
    state = rig.direct.inspect_key(k)
    assert (state.owner, state.in_flight) == ("s2", ("s2",))
    assert state.token is not None and held.token is not None and state.token > held.token

    rig.lose_reply(
        lg_redis.RELEASE_LUA, before_retry=lambda: rig.direct.acquire_lease(k + "x", "c", TTL)
    )
    rig.provider.release_lease(k, "s2")
    rig.direct.acquire_lease(k, "c", TTL)
    rig.lose_reply(lg_redis.RELEASE_LUA)
    rig.provider.release_lease(k, "s2")  # a late retry of the old release: c keeps the key
    assert rig.direct.get_lease_owner(k) == "c"


def test_a_claim_whose_reply_was_lost_is_claimed_by_its_caller(rig: Rig) -> None:
    k = key()
    rig.provider.acquire_lease(k, "owner", TTL)
    rig.provider.acquire_or_enqueue(k, sig(1), TTL)
    grant = rig.provider.transfer_to_next(k, "owner", TTL, claim=False)
    assert grant is not None and grant.token is not None
    rig.lose_reply(lg_redis.CLAIM_SIGNAL_LUA)
    claimed = rig.provider.claim_signal(k, "s1", grant.token, TTL)
    assert claimed is not None and claimed.payload == {"n": 1}  # the caller runs it
    assert rig.provider.claim_signal(k, "s1", grant.token, TTL) is None  # and nobody else


def test_an_adoption_whose_reply_was_lost_is_reported(rig: Rig) -> None:
    k = key()
    rig.provider.acquire_or_enqueue(k, sig(0), 100)
    rig.provider.acquire_or_enqueue(k, sig(1), TTL)
    time.sleep(0.3)
    rig.lose_reply(lg_redis.ADOPT_LUA)
    adopted = [(key_, s.id) for key_, s in rig.provider.adopt_orphans(TTL, 100) if key_ == k]
    assert adopted == [(k, "s0")]  # the sweeper dispatches what it adopted
    assert rig.direct.inspect_key(k).owner == "s0"


def test_every_reply_lost_once_under_the_decorator(rig: Rig) -> None:
    """A guarded owner whose acquire, renewals, take and hand-offs each lose a reply once runs
    every event exactly once, under rising tokens, and leaves the key free."""
    k = key()
    runs: list[tuple[int, str, int]] = []

    @lease_owned(lambda e: e["k"], provider=rig.provider, ttl_ms=600, handoff="inline")
    def handler(event: dict[str, Any], context: Any) -> int:
        lease = current_lease()
        assert lease.token is not None
        runs.append((event["n"], lease.owner, lease.token))
        if event["n"] == 0:
            for n in (1, 2, 3):  # follow-ups arrive while the owner works
                forwarded = handler({"k": k, "n": n}, LambdaContext(aws_request_id=f"r{n}"))
                assert forwarded["leaseguard"]["position"] == n
            time.sleep(0.5)  # a couple of renewals, the first of which loses its reply
            assert [s.id for s in lease.take_signals(1)] == ["r1"]
            lease.check()
        return int(event["n"])

    for script in (
        lg_redis.ACQUIRE_OR_ENQUEUE_LUA,
        lg_redis.RENEW_LUA,
        lg_redis.TAKE_SIGNALS_LUA,
        lg_redis.TRANSFER_TO_NEXT_LUA,
    ):
        rig.lose_reply(script)
    assert handler({"k": k, "n": 0}, LambdaContext(aws_request_id="r0")) == 0
    assert all(not drop.times for drop in rig.plan.drops)  # every fault fired
    assert [n for n, _, _ in runs] == [0, 2, 3]  # r1 was taken and handled inside r0's run
    tokens = [t for _, _, t in runs]
    assert tokens == sorted(set(tokens))
    state = rig.direct.inspect_key(k)
    assert (state.owner, state.queued, state.in_flight) == (None, (), ())
