"""The signal queue, run unchanged against every backend (``lease_backend`` fixture)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from leaseguard import LeaseLostError, Signal
from leaseguard.errors import InvalidLeaseArgument
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.validation import DEFAULT_MAX_PAYLOAD_BYTES

from .conftest import let_leases_expire

KEY = "chat:{7} ü"
TTL = 5_000


die = let_leases_expire


def sig(n: int | str, payload: Any = None) -> Signal:
    return Signal(f"s{n}", payload if payload is not None else {"n": n})


def state(provider: BaseLeaseProvider, key: str = KEY) -> tuple[Any, ...]:
    s = provider.inspect_key(key)
    return (s.owner, s.token, s.queued, s.in_flight)


def test_free_key_is_acquired_by_the_signal(provider: BaseLeaseProvider) -> None:
    result = provider.acquire_or_enqueue(KEY, sig(1), TTL)
    assert result.acquired and result.owner == "s1" and result.token
    assert result.adopted is None and result.position is None
    assert provider.pending_signals(KEY) == 0


def test_held_key_queues_with_positions_and_names_holder(provider: BaseLeaseProvider) -> None:
    held = provider.acquire_lease(KEY, "owner", TTL)
    for n in (1, 2, 3):
        result = provider.acquire_or_enqueue(KEY, sig(n), TTL)
        assert not result.acquired
        assert (result.owner, result.token, result.position) == ("owner", held.token, n)
    assert provider.pending_signals(KEY) == 3


def test_same_signal_id_is_queued_once(provider: BaseLeaseProvider) -> None:
    provider.acquire_lease(KEY, "owner", TTL)
    provider.acquire_or_enqueue(KEY, sig(1), TTL)
    provider.acquire_or_enqueue(KEY, sig(2), TTL)
    again = provider.acquire_or_enqueue(KEY, sig(1, {"retry": True}), TTL)
    assert not again.acquired and again.position == 1
    assert provider.pending_signals(KEY) == 2
    assert [s.payload for s in provider.take_signals(KEY, "owner", 10)] == [{"n": 1}, {"n": 2}]


def test_a_signal_that_owns_the_key_is_not_run_twice(provider: BaseLeaseProvider) -> None:
    first = provider.acquire_or_enqueue(KEY, sig(1), TTL)
    again = provider.acquire_or_enqueue(KEY, sig(1), TTL)  # a duplicate delivery
    assert not again.acquired and again.position is None
    assert (again.owner, again.token) == ("s1", first.token)
    assert provider.pending_signals(KEY) == 0
    assert provider.inspect_key(KEY).in_flight == ("s1",)


def test_dead_owners_own_signal_is_delivered_again(provider: BaseLeaseProvider) -> None:
    first = provider.acquire_or_enqueue(KEY, sig(1, {"mine": True}), TTL)
    provider.acquire_or_enqueue(KEY, sig(2), TTL)
    die(provider, (KEY, "s1"))  # mid-run
    adopted = provider.adopt_orphans(TTL, 10)
    assert [(k, s.id, s.payload) for k, s in adopted] == [(KEY, "s1", {"mine": True})]
    assert adopted[0][1].token and first.token and adopted[0][1].token > first.token
    nxt = provider.transfer_to_next(KEY, "s1", TTL)
    assert nxt is not None and nxt.id == "s2"


def test_a_stale_grant_of_a_redelivered_owner_is_refused(provider: BaseLeaseProvider) -> None:
    # s1 owns the key, pauses past its TTL; s2 arrives and s1's event is delivered again, so the
    # id s1 owns the key a second time, under a higher token. The paused first holder of s1
    # must be refused by its token; the owner id alone cannot tell the two grants apart.
    stale = provider.acquire_or_enqueue(KEY, sig(1), TTL)
    die(provider, (KEY, "s1"))
    again = provider.acquire_or_enqueue(KEY, sig(2), TTL)
    assert again.adopted is not None and again.adopted.id == "s1"
    assert stale.token is not None and again.token is not None and again.token > stale.token
    before = state(provider)
    assert provider.renew_lease(KEY, "s1", TTL, token=stale.token) is False
    with pytest.raises(LeaseLostError):
        provider.take_signals(KEY, "s1", 10, token=stale.token)
    with pytest.raises(LeaseLostError):
        provider.transfer_to_next(KEY, "s1", TTL, token=stale.token)
    assert state(provider) == before
    assert provider.renew_lease(KEY, "s1", TTL, token=again.token) is True  # the live grant
    nxt = provider.transfer_to_next(KEY, "s1", TTL, token=again.token)
    assert nxt is not None and nxt.id == "s2"
    with pytest.raises(LeaseLostError):  # and its retry is not mistaken for the stale grant's
        provider.transfer_to_next(KEY, "s1", TTL, token=stale.token)


@pytest.mark.parametrize("token", [-1, True, 1.5, "7", 2**63])
def test_a_bad_grant_token_is_refused_before_io(provider: BaseLeaseProvider, token: Any) -> None:
    provider.acquire_lease(KEY, "owner", TTL)
    before = state(provider)
    for call in (
        lambda: provider.renew_lease(KEY, "owner", TTL, token=token),
        lambda: provider.take_signals(KEY, "owner", 1, token=token),
        lambda: provider.transfer_to_next(KEY, "owner", TTL, token=token),
    ):
        with pytest.raises(InvalidLeaseArgument):
            call()
    assert state(provider) == before


def test_take_signals_is_fifo_and_honours_limit(provider: BaseLeaseProvider) -> None:
    provider.acquire_lease(KEY, "owner", TTL)
    for n in range(5):
        provider.acquire_or_enqueue(KEY, sig(n, {"n": n, "text": "ü{}"}), TTL)
    first = provider.take_signals(KEY, "owner", 2)
    rest = provider.take_signals(KEY, "owner", 10)
    assert [s.id for s in first] == ["s0", "s1"]
    assert [s.id for s in rest] == ["s2", "s3", "s4"]
    assert rest[0].payload == {"n": 2, "text": "ü{}"}
    assert all(s.token is None and s.enqueued_at_ms > 0 for s in first + rest)
    assert provider.take_signals(KEY, "owner", 10) == []
    assert provider.inspect_key(KEY).in_flight == ("s0", "s1", "s2", "s3", "s4")


def test_take_signals_by_non_owner_raises_and_changes_nothing(
    provider: BaseLeaseProvider,
) -> None:
    provider.acquire_lease(KEY, "owner", TTL)
    provider.acquire_or_enqueue(KEY, sig(1), TTL)
    before = state(provider)
    with pytest.raises(LeaseLostError) as info:
        provider.take_signals(KEY, "intruder", 10)
    assert info.value.holder == "owner"
    assert state(provider) == before


def test_transfer_to_next_hands_to_head_with_higher_token(provider: BaseLeaseProvider) -> None:
    held = provider.acquire_lease(KEY, "owner", TTL)
    provider.acquire_or_enqueue(KEY, sig(1), TTL)
    provider.acquire_or_enqueue(KEY, sig(2), TTL)
    nxt = provider.transfer_to_next(KEY, "owner", TTL)
    assert nxt is not None and nxt.id == "s1" and nxt.payload == {"n": 1}
    assert nxt.token is not None and held.token is not None and nxt.token > held.token
    assert provider.get_lease_owner(KEY) == "s1"
    assert provider.inspect_key(KEY).token == nxt.token
    assert provider.pending_signals(KEY) == 1
    last = provider.transfer_to_next(KEY, "s1", TTL)
    assert last is not None and last.id == "s2" and last.token is not None
    assert last.token > nxt.token
    assert provider.transfer_to_next(KEY, "s2", TTL) is None
    assert provider.get_lease_owner(KEY) is None
    assert state(provider) == (None, None, (), ())


def test_transfer_to_next_releases_when_queue_is_empty(provider: BaseLeaseProvider) -> None:
    first = provider.acquire_lease(KEY, "owner", TTL)
    assert provider.transfer_to_next(KEY, "owner", TTL) is None
    assert provider.get_lease_owner(KEY) is None
    again = provider.acquire_or_enqueue(KEY, sig(9), TTL)
    assert again.acquired and again.token and first.token and again.token > first.token


def test_transfer_to_next_by_non_owner_raises_and_changes_nothing(
    provider: BaseLeaseProvider,
) -> None:
    provider.acquire_lease(KEY, "owner", TTL)
    provider.acquire_or_enqueue(KEY, sig(1), TTL)
    before = state(provider)
    with pytest.raises(LeaseLostError):
        provider.transfer_to_next(KEY, "stale", TTL)
    assert state(provider) == before
    with pytest.raises(LeaseLostError):
        provider.transfer_to_next("never-held", "stale", TTL)


def test_expired_owner_cannot_hand_off(provider: BaseLeaseProvider) -> None:
    provider.acquire_lease(KEY, "owner", TTL)
    provider.acquire_or_enqueue(KEY, sig(1), TTL)
    die(provider, (KEY, "owner"))
    with pytest.raises(LeaseLostError):
        provider.transfer_to_next(KEY, "owner", TTL)
    assert provider.pending_signals(KEY) == 1


def test_completed_signals_never_come_back(provider: BaseLeaseProvider) -> None:
    provider.acquire_lease(KEY, "owner", TTL)
    for n in range(3):
        provider.acquire_or_enqueue(KEY, sig(n), TTL)
    assert len(provider.take_signals(KEY, "owner", 2)) == 2
    nxt = provider.transfer_to_next(KEY, "owner", TTL)
    assert nxt is not None and nxt.id == "s2"
    assert provider.inspect_key(KEY).in_flight == ("s2",)
    assert provider.transfer_to_next(KEY, "s2", TTL) is None
    assert provider.adopt_orphans(TTL, 100) == []
    assert state(provider) == (None, None, (), ())


def test_claim_signal_runs_a_remote_handoff_once(provider: BaseLeaseProvider) -> None:
    provider.acquire_lease(KEY, "owner", TTL)
    provider.acquire_or_enqueue(KEY, sig(1, {"body": "hi"}), TTL)
    nxt = provider.transfer_to_next(KEY, "owner", TTL, claim=False)
    assert nxt is not None and nxt.token is not None
    before = state(provider)
    assert provider.claim_signal(KEY, "s1", nxt.token + 1, TTL) is None  # stale token
    assert provider.claim_signal(KEY, "owner", nxt.token, TTL) is None  # not the owner
    assert provider.claim_signal("other-key", "s1", nxt.token, TTL) is None
    assert state(provider) == before
    claimed = provider.claim_signal(KEY, "s1", nxt.token, TTL)
    assert claimed is not None and claimed.payload == {"body": "hi"}
    assert claimed.token == nxt.token
    assert provider.claim_signal(KEY, "s1", nxt.token, TTL) is None  # a duplicate delivery


def test_inline_handoff_cannot_be_claimed_again(provider: BaseLeaseProvider) -> None:
    provider.acquire_lease(KEY, "owner", TTL)
    provider.acquire_or_enqueue(KEY, sig(1), TTL)
    nxt = provider.transfer_to_next(KEY, "owner", TTL)  # claim=True: the caller runs it
    assert nxt is not None and nxt.token is not None
    assert provider.claim_signal(KEY, "s1", nxt.token, TTL) is None


def test_adopt_orphans_gives_head_to_a_new_owner(provider: BaseLeaseProvider) -> None:
    dead = provider.acquire_lease(KEY, "dead", TTL)
    provider.acquire_or_enqueue(KEY, sig(1), TTL)
    provider.acquire_or_enqueue(KEY, sig(2), TTL)
    provider.acquire_lease("alive", "owner", 600_000)  # outlives any time the test moves on
    provider.acquire_or_enqueue("alive", sig(3), TTL)
    assert provider.adopt_orphans(TTL, 10) == []  # nobody died yet
    die(provider, (KEY, "dead"))
    adopted = provider.adopt_orphans(TTL, 10)
    assert [(k, s.id) for k, s in adopted] == [(KEY, "s1")]
    token = adopted[0][1].token
    assert token is not None and dead.token is not None and token > dead.token
    assert provider.get_lease_owner(KEY) == "s1"
    assert provider.get_lease_owner("alive") == "owner"
    assert provider.adopt_orphans(TTL, 10) == []  # s1 is alive now
    assert provider.claim_signal(KEY, "s1", token, TTL) is not None  # claim=False by default


def test_adopt_orphans_honours_limit(provider: BaseLeaseProvider) -> None:
    for k in range(5):
        provider.acquire_lease(f"k{k}", "dead", TTL)
        provider.acquire_or_enqueue(f"k{k}", sig(k), TTL)
    die(provider, *((f"k{k}", "dead") for k in range(5)))
    first = provider.adopt_orphans(TTL, 2)
    rest = provider.adopt_orphans(TTL, 10)
    assert len(first) == 2 and len(rest) == 3
    assert {k for k, _ in first + rest} == {f"k{k}" for k in range(5)}


def test_dead_owner_in_flight_signals_are_redelivered_in_order(
    provider: BaseLeaseProvider,
) -> None:
    provider.acquire_lease(KEY, "first", TTL)
    for n in range(4):
        provider.acquire_or_enqueue(KEY, sig(n), TTL)
    granted = provider.transfer_to_next(KEY, "first", TTL)
    assert granted is not None and granted.id == "s0"
    assert [s.id for s in provider.take_signals(KEY, "s0", 2)] == ["s1", "s2"]
    die(provider, (KEY, "s0"))  # while running s0, s1 and s2
    adopted = provider.adopt_orphans(TTL, 10)
    assert [(k, s.id) for k, s in adopted] == [(KEY, "s0")]
    assert [s.id for s in provider.take_signals(KEY, "s0", 10)] == ["s1", "s2", "s3"]


def test_new_signal_on_orphaned_key_runs_the_orphans_first(provider: BaseLeaseProvider) -> None:
    provider.acquire_lease(KEY, "dead", TTL)
    provider.acquire_or_enqueue(KEY, sig(1), TTL)
    die(provider, (KEY, "dead"))
    result = provider.acquire_or_enqueue(KEY, sig(2), TTL)
    assert result.acquired and result.owner == "s1"
    assert result.adopted is not None and result.adopted.id == "s1"
    assert result.adopted.token == result.token
    assert provider.pending_signals(KEY) == 1  # s2 waits behind s1
    nxt = provider.transfer_to_next(KEY, "s1", TTL)
    assert nxt is not None and nxt.id == "s2"
    assert provider.transfer_to_next(KEY, "s2", TTL) is None


def test_released_key_with_queue_is_adopted(provider: BaseLeaseProvider) -> None:
    provider.acquire_lease(KEY, "owner", TTL)
    provider.acquire_or_enqueue(KEY, sig(1), TTL)
    provider.release_lease(KEY, "owner")  # plain release leaves the queue behind
    adopted = provider.adopt_orphans(TTL, 10)
    assert [s.id for _, s in adopted] == ["s1"]


def test_pending_signals_of_unknown_key_is_zero(provider: BaseLeaseProvider) -> None:
    assert provider.pending_signals("nothing-here") == 0


def test_inspect_key_reports_owner_ttl_and_queue(provider: BaseLeaseProvider) -> None:
    held = provider.acquire_lease(KEY, "owner", TTL)
    provider.acquire_or_enqueue(KEY, sig(1, {"a": [1, 2]}), TTL)
    snapshot = provider.inspect_key(KEY)
    assert (snapshot.owner, snapshot.token) == ("owner", held.token)
    assert snapshot.remaining_ms is not None and 0 < snapshot.remaining_ms <= TTL
    assert [(s.id, s.payload) for s in snapshot.queued] == [("s1", {"a": [1, 2]})]


# -- payloads: JSON only, bounded ----------------------------------------------------------------


class _Opaque:
    pass


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


BAD_PAYLOADS: list[Any] = [
    _Opaque(),
    {1, 2},
    b"bytes",
    math.nan,
    {"x": math.inf},
    {1: "int key"},
    _nested(10_000),
    "x" * DEFAULT_MAX_PAYLOAD_BYTES,
]


@pytest.mark.parametrize("payload", BAD_PAYLOADS, ids=lambda p: type(p).__name__)
def test_bad_payload_is_refused_without_change(provider: BaseLeaseProvider, payload: Any) -> None:
    provider.acquire_lease(KEY, "owner", TTL)
    provider.acquire_or_enqueue(KEY, sig(1), TTL)
    before = state(provider)
    with pytest.raises(InvalidLeaseArgument):
        provider.acquire_or_enqueue(KEY, Signal("bad", payload), TTL)
    with pytest.raises(InvalidLeaseArgument):
        provider.acquire_or_enqueue("free-key", Signal("bad", payload), TTL)
    assert state(provider) == before
    assert provider.get_lease_owner("free-key") is None


def test_payload_limit_is_configurable(make_provider: Any, lease_backend: str) -> None:
    small = make_provider(lease_backend)(max_payload_bytes=64)
    small.acquire_lease(KEY, "owner", TTL)
    small.acquire_or_enqueue(KEY, Signal("ok", "x" * 62), TTL)  # 64 bytes with quotes
    with pytest.raises(InvalidLeaseArgument, match="limit is 64"):
        small.acquire_or_enqueue(KEY, Signal("big", "x" * 63), TTL)
    assert small.pending_signals(KEY) == 1


def test_large_payload_under_limit_round_trips(provider: BaseLeaseProvider) -> None:
    payload = {"text": "ü" * 60_000, "n": [1.5, None, True]}
    provider.acquire_lease(KEY, "owner", TTL)
    provider.acquire_or_enqueue(KEY, Signal("big", payload), TTL)
    assert provider.take_signals(KEY, "owner", 1)[0].payload == payload


@pytest.mark.parametrize(
    "bad_call",
    [
        lambda p: p.acquire_or_enqueue(KEY, "not a signal", TTL),
        lambda p: p.acquire_or_enqueue(KEY, Signal("", {}), TTL),
        lambda p: p.acquire_or_enqueue(KEY, Signal("x", {}, enqueued_at_ms=-1), TTL),
        lambda p: p.acquire_or_enqueue(KEY, Signal("x", {}, enqueued_at_ms=True), TTL),  # type: ignore[arg-type]
        lambda p: p.acquire_or_enqueue(KEY, sig(1), 0),
        lambda p: p.take_signals(KEY, "owner", 0),
        lambda p: p.take_signals(KEY, "owner", True),
        lambda p: p.take_signals(KEY, "owner", 10_001),
        lambda p: p.transfer_to_next(KEY, "owner", TTL, claim="yes"),
        lambda p: p.claim_signal(KEY, "owner", 0, TTL),
        lambda p: p.claim_signal(KEY, "owner", "1", TTL),
        lambda p: p.adopt_orphans(TTL, 0),
        lambda p: p.adopt_orphans(-5, 10),
        lambda p: p.pending_signals(""),
        lambda p: p.inspect_key(None),
    ],
)
def test_bad_queue_arguments_are_refused_without_change(
    provider: BaseLeaseProvider, bad_call: Any
) -> None:
    provider.acquire_lease(KEY, "owner", TTL)
    provider.acquire_or_enqueue(KEY, sig(1), TTL)
    before = state(provider)
    with pytest.raises(InvalidLeaseArgument):
        bad_call(provider)
    assert state(provider) == before


def test_plain_acquire_does_not_inherit_a_dead_owners_signals(provider: BaseLeaseProvider) -> None:
    provider.acquire_or_enqueue(KEY, sig(1), TTL)  # s1 owns the key; its event is in flight
    die(provider, (KEY, "s1"))
    assert provider.acquire_lease(KEY, "plain-owner", TTL).acquired
    provider.release_lease(KEY, "plain-owner")  # completes only what plain-owner received
    adopted = provider.adopt_orphans(TTL, 10)
    assert [(k, s.id) for k, s in adopted] == [(KEY, "s1")]  # delivered again, not lost


def test_the_memory_provider_forgets_keys_that_fell_idle() -> None:
    """Regression: a key that ever completed a signal (or whose owner's lease ran out unseen)
    was never forgotten, so a warm process grew with every key it saw. Idle records go once the
    model forgets them: the dedupe window after the last completion, the token memory after
    the key fell idle."""
    from leaseguard.protocol.model import DEDUPE_WINDOW_MS, TOKEN_MEMORY_MS
    from leaseguard.providers.memory import InMemoryLeaseProvider

    now = [0]
    provider = InMemoryLeaseProvider(clock=lambda: now[0])
    for i in range(1_500):
        got = provider.acquire_or_enqueue(f"q{i}", Signal(f"s{i}", {}), 1_000)
        assert provider.transfer_to_next(f"q{i}", f"s{i}", 1_000, token=got.token) is None
        provider.acquire_lease(f"l{i}", "me", 1_000)  # never released: its lease runs out
    provider.acquire_or_enqueue("busy", Signal("held", {}), 86_400_000)
    provider.acquire_or_enqueue("busy", Signal("queued", {}), 86_400_000)
    assert provider.tracked_keys() == 3_001
    now[0] += DEDUPE_WINDOW_MS + TOKEN_MEMORY_MS
    for _ in range(2_048):  # enough steps for a collection to run
        provider.get_lease_owner("busy")
    # the completed keys are gone; a lease that ran out unseen counts as idle from the
    # collection that saw it
    assert provider.tracked_keys() == 1_501
    now[0] += TOKEN_MEMORY_MS
    for _ in range(2_048):
        provider.get_lease_owner("busy")
    assert provider.tracked_keys() == 1  # the held key with work stays
    state = provider.inspect_key("busy")
    assert state.owner == "held" and [s.id for s in state.queued] == ["queued"]
    # A forgotten key starts afresh: a completed id older than the window runs again.
    assert provider.acquire_or_enqueue("q0", Signal("s0", {}), 1_000).acquired
