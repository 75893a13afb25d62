"""DynamoDB against the protocol model (leaseguard/protocol/model.py): regression tests for the
lost-reply bugs an outside tester found, the completed-id memory, failure reports and reply
shapes.

A lost reply is reproduced where it happens: :class:`LostReply` wraps the provider's botocore
``_make_api_call``; for one chosen request it sends the request (DynamoDB applies it), drops the
reply, runs *another* caller's step on another client, then sends the very same parameters again
and returns that second reply, exactly like botocore's retry after a lost reply. ``give_up``
instead raises a timeout after the first send (every botocore retry timed out, the write was
applied anyway). Where a sequence has no interleaving, it also runs on
:class:`~leaseguard.providers.memory.InMemoryLeaseProvider` (the model) and the replies are
compared, tokens by order.

Every test checks that no event is lost (its payload is still stored while it is queued or in
flight, and it eventually runs) and that nothing is queued twice.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from leaseguard import LeaseBackendError, Signal
from leaseguard.contract import LeaseResult
from leaseguard.protocol.model import DEDUPE_WINDOW_MS
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.providers.dynamodb import DynamoDBLeaseProvider
from leaseguard.providers.memory import InMemoryLeaseProvider
from leaseguard.signals import DeadLetter, KeyState

TTL = 10_000
KEY = "chat:{7} ü"
Make = Callable[..., DynamoDBLeaseProvider]


class Clock:
    """A shared fake wall clock (ms) that stands still until moved."""

    def __init__(self) -> None:
        self.now = time.time_ns() // 1_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make(make_dynamodb: Make, clock: Clock) -> Make:
    """Clients of one fresh table, all on ``clock`` (no skew margin: one clock)."""

    def build(**options: Any) -> DynamoDBLeaseProvider:
        options.setdefault("clock", clock)
        options.setdefault("clock_skew_ms", 0)
        return make_dynamodb(**options)

    return build


class LostReply:
    """The first request of ``operation`` that ``when`` accepts is applied, its reply lost,
    ``between`` runs (another caller), then the same request is sent again and its reply is
    the one the caller sees. ``give_up``: raise a read timeout instead of resending."""

    def __init__(
        self,
        provider: DynamoDBLeaseProvider,
        operation: str,
        between: Callable[[], object] = lambda: None,
        when: Callable[[dict[str, Any]], bool] = lambda params: True,
        *,
        give_up: bool = False,
    ) -> None:
        client: Any = provider.client
        self.inner = client._make_api_call
        self.operation, self.between, self.when, self.give_up = operation, between, when, give_up
        self.fired = 0
        client._make_api_call = self

    def __call__(self, operation: str, params: dict[str, Any]) -> Any:
        if self.fired or operation != self.operation or not self.when(params):
            return self.inner(operation, params)
        self.fired += 1
        with contextlib.suppress(ClientError):
            self.inner(operation, copy.deepcopy(params))  # applied; the reply is lost
        self.between()
        if self.give_up:
            raise ReadTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")
        return self.inner(operation, params)


def expression(*parts: str) -> Callable[[dict[str, Any]], bool]:
    """Selects an UpdateItem on the lease item whose UpdateExpression contains every part."""

    def match(params: dict[str, Any]) -> bool:
        text = str(params.get("UpdateExpression", ""))
        return params["Key"]["sk"]["S"] == "lease" and all(p in text for p in parts)

    return match


GRANT = expression("#w = :w", "#f = :f", "if_not_exists(#t, :floor)")  # [Q1]
APPEND = expression("#q = list_append(if_not_exists(#q, :empty), :id)")  # [Q2]
ORPHAN = expression("#w = :w", "#c = :claimed")  # [Q6] / [D1]
RELEASE = expression("#d = list_append(list_append(")  # [G6] + [N1], one write


def sig(sid: str, n: int = 0) -> Signal:
    return Signal(sid, {"id": sid, "n": n}, enqueued_at_ms=1_000 + n)


def payload_items(provider: DynamoDBLeaseProvider, key: str = KEY) -> dict[str, str]:
    """Stored payload items of ``key``: ref -> signal id."""
    items = provider.client.query(
        TableName=provider.table_name,
        KeyConditionExpression="pk = :k AND begins_with(sk, :s)",
        ExpressionAttributeValues={":k": {"S": key}, ":s": {"S": "sig#"}},
        ConsistentRead=True,
    )["Items"]
    return {str(i["sk"]["S"])[4:]: str(i["i"]["S"]) for i in items}


def lease_item(provider: DynamoDBLeaseProvider, key: str = KEY) -> dict[str, Any]:
    return dict(
        provider.client.get_item(
            TableName=provider.table_name,
            Key={"pk": {"S": key}, "sk": {"S": "lease"}},
            ConsistentRead=True,
        ).get("Item", {})
    )


def assert_nothing_lost(provider: DynamoDBLeaseProvider, *expected: str) -> KeyState:
    """Every stored (queued or in-flight) signal of KEY has its payload item, each id is
    stored once, and the stored ids are exactly ``expected`` (in-flight first)."""
    item = lease_item(provider)
    ids = [v["S"] for v in item.get("f", {"L": []})["L"] + item.get("q", {"L": []})["L"]]
    refs = [v["S"] for v in item.get("fn", {"L": []})["L"] + item.get("qn", {"L": []})["L"]]
    assert ids == list(expected)
    assert len(set(ids)) == len(ids), f"queued twice: {ids}"
    stored = payload_items(provider)
    for sid, ref in zip(ids, refs, strict=True):
        assert stored.get(ref) == sid, f"the payload of {sid} is gone"
    return provider.inspect_key(KEY)


def run_chain(provider: BaseLeaseProvider, first: str, token: int | None) -> list[str]:
    """The owner ``first`` and every signal handed to after it run, each once: their ids."""
    ran, owner = [first], first
    while True:
        nxt = provider.transfer_to_next(KEY, owner, TTL, token=token)
        if nxt is None:
            return ran
        assert nxt.payload == {"id": nxt.id, "n": nxt.payload["n"]}  # the stored payload
        ran.append(nxt.id)
        owner, token = nxt.id, nxt.token


class Ranks:
    """Normalises replies of one side: tokens by the order they were first seen."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def token(self, token: int | None) -> int | None:
        if token is None:
            return None
        if token not in self.seen:
            assert not self.seen or token > max(self.seen), "tokens out of order"
            self.seen.append(token)
        return self.seen.index(token)

    def __call__(self, reply: object) -> object:
        if isinstance(reply, LeaseResult):
            return (
                "lease",
                reply.acquired,
                reply.owner,
                self.token(reply.token),
                reply.position,
                self(reply.adopted),
            )
        if isinstance(reply, Signal):
            return ("signal", reply.id, reply.payload, reply.attempts, self.token(reply.token))
        if isinstance(reply, KeyState):
            return (
                "state",
                reply.owner,
                self.token(reply.token),
                tuple(self(s) for s in reply.queued),
                reply.in_flight,
                tuple(self(d) for d in reply.dead_letters),
            )
        if isinstance(reply, DeadLetter):
            return ("dead", reply.id, reply.payload, reply.attempts, reply.error)
        if isinstance(reply, list):
            return [self(r) for r in reply]
        if isinstance(reply, tuple):
            return tuple(self(r) for r in reply)
        return reply


Step = Callable[[BaseLeaseProvider, Callable[[int], None], Callable[[str], int | None]], object]


def same_as_model(dynamodb: DynamoDBLeaseProvider, clock: Clock, steps: list[Step]) -> list[Any]:
    """Runs ``steps`` on DynamoDB and on the model (memory); their replies must agree. A step
    gets the provider, a function that lets time pass and one that names the token a signal
    id was last granted (as the replies showed it)."""
    model_clock = Clock()
    model = InMemoryLeaseProvider(clock=model_clock)
    sides: list[list[Any]] = []
    for provider, moved in ((dynamodb, clock), (model, model_clock)):
        ranks, tokens, replies = Ranks(), dict[str, int | None](), []

        def advance(ms: int, moved: Clock = moved) -> None:
            moved.now += ms

        for step in steps:
            reply = step(provider, advance, tokens.get)
            for shown in (reply, getattr(reply, "adopted", None)):
                if isinstance(shown, (Signal, LeaseResult)) and shown.token is not None:
                    tokens[shown.id if isinstance(shown, Signal) else str(shown.owner)] = (
                        shown.token
                    )
            replies.append(ranks(reply))
        sides.append(replies)
    assert sides[0] == sides[1]
    return sides[0]


def model_lost_reply(
    setup: Callable[[BaseLeaseProvider], object],
    first: Callable[[BaseLeaseProvider, Any], object],
    between: Callable[[BaseLeaseProvider, Any], object],
    advance_ms: int = 0,
) -> tuple[object, object]:
    """The model's replies for a lost reply: ``first`` is applied, ``between`` runs, then
    ``first`` is resent (the same call with the same nonces, as the model defines a resend).
    ``setup`` runs before (its reply is passed to both); returns (between's reply, the
    resend's reply), normalised with token ranks continuing from ``setup``'s."""
    from leaseguard.providers import memory as memory_module

    clock = Clock()
    model = InMemoryLeaseProvider(clock=clock)
    ranks = Ranks()
    before = setup(model)
    ranks(before)
    clock.now += advance_ms
    drawn: list[str] = []
    original = memory_module._nonce

    def record() -> str:
        drawn.append(original())
        return drawn[-1]

    memory_module._nonce = record
    try:
        first(model, before)
    finally:
        memory_module._nonce = original
    seen = ranks(between(model, before))
    again = iter(list(drawn))
    memory_module._nonce = lambda: next(again, None) or original()
    try:
        resent = ranks(first(model, before))
    finally:
        memory_module._nonce = original
    return seen, resent


def seen_on(setup: object, between: object, resent: object) -> tuple[object, object]:
    """DynamoDB's side of :func:`model_lost_reply`: the same normalisation."""
    ranks = Ranks()
    ranks(setup)
    return ranks(between), ranks(resent)


def orphaned_setup(p: BaseLeaseProvider) -> None:
    """``dead`` holds the key for 1 s with s1 queued (the caller then lets 5 s pass)."""
    p.acquire_lease(KEY, "dead", 1_000)
    p.acquire_or_enqueue(KEY, sig("s1", 1), TTL)


# -- bug 1: accepted events lost when a resend meets another caller's write ----------------------


def test_a_lost_grant_reply_resent_after_a_forwarders_append_is_the_grant(make: Make) -> None:
    owner_side, forwarder = make(), make()
    queued: list[LeaseResult] = []
    LostReply(
        owner_side,
        "UpdateItem",
        lambda: queued.append(forwarder.acquire_or_enqueue(KEY, sig("s2", 2), TTL)),
        GRANT,
    )
    result = owner_side.acquire_or_enqueue(KEY, sig("s1", 1), TTL)
    # [Q7]: the grant nonce survived the append (appends write neither it nor the version)
    assert (result.acquired, result.owner, result.adopted) == (True, "s1", None)
    assert (queued[0].acquired, queued[0].owner, queued[0].position) == (False, "s1", 1)
    state = assert_nothing_lost(owner_side, "s1", "s2")
    assert state.token == result.token
    assert model_lost_reply(
        lambda p: None,
        lambda p, _: p.acquire_or_enqueue(KEY, sig("s1", 1), TTL),
        lambda p, _: p.acquire_or_enqueue(KEY, sig("s2", 2), TTL),
    ) == seen_on(None, queued[0], result)
    assert run_chain(owner_side, "s1", result.token) == ["s1", "s2"]
    assert_nothing_lost(owner_side)


def test_a_lost_append_reply_resent_after_the_hand_off_keeps_the_payload(make: Make) -> None:
    owner_side, forwarder = make(), make()
    held = owner_side.acquire_or_enqueue(KEY, sig("o"), TTL)
    handed: list[Signal | None] = []
    LostReply(
        forwarder,
        "UpdateItem",
        lambda: handed.append(owner_side.transfer_to_next(KEY, "o", TTL, token=held.token)),
        APPEND,
    )
    result = forwarder.acquire_or_enqueue(KEY, sig("s1", 1), TTL)
    nxt = handed[0]
    assert nxt is not None and nxt.id == "s1" and nxt.payload == {"id": "s1", "n": 1}
    # [Q4]: a second delivery of the owner (the model's answer to this resend), not a
    # "duplicate" that deletes the payload the new owner's in-flight entry references
    assert (result.acquired, result.owner, result.token) == (False, "s1", nxt.token)
    assert_nothing_lost(forwarder, "s1")
    assert model_lost_reply(
        lambda p: p.acquire_or_enqueue(KEY, sig("o"), TTL),
        lambda p, _: p.acquire_or_enqueue(KEY, sig("s1", 1), TTL),
        lambda p, held: p.transfer_to_next(KEY, "o", TTL, token=held.token),
    ) == seen_on(held, nxt, result)
    assert owner_side.claim_signal(KEY, "s1", nxt.token or 0, TTL) is None  # claimed inline
    assert run_chain(owner_side, "s1", nxt.token) == ["s1"]
    assert_nothing_lost(owner_side)


def test_a_lost_append_reply_resent_after_another_append_keeps_its_place(make: Make) -> None:
    owner_side, forwarder, other = make(), make(), make()
    held = owner_side.acquire_or_enqueue(KEY, sig("o"), TTL)
    appended: list[LeaseResult] = []
    LostReply(
        forwarder,
        "UpdateItem",
        lambda: appended.append(other.acquire_or_enqueue(KEY, sig("s2", 2), TTL)),
        APPEND,
    )
    result = forwarder.acquire_or_enqueue(KEY, sig("s1", 1), TTL)
    assert (result.acquired, result.owner, result.position) == (False, "o", 1)  # [Q3]
    assert_nothing_lost(forwarder, "o", "s1", "s2")
    assert model_lost_reply(
        lambda p: p.acquire_or_enqueue(KEY, sig("o"), TTL),
        lambda p, _: p.acquire_or_enqueue(KEY, sig("s1", 1), TTL),
        lambda p, _: p.acquire_or_enqueue(KEY, sig("s2", 2), TTL),
    ) == seen_on(held, appended[0], result)
    assert run_chain(owner_side, "o", held.token) == ["o", "s1", "s2"]


def test_a_lost_adopting_acquire_reply_resent_after_an_append_is_the_grant(
    make: Make, clock: Clock
) -> None:
    first, caller, forwarder = make(), make(), make()
    first.acquire_lease(KEY, "dead", 1_000)
    first.acquire_or_enqueue(KEY, sig("s1", 1), TTL)
    clock.now += 5_000  # "dead" died with s1 queued: the key is orphaned
    appended: list[LeaseResult] = []
    LostReply(
        caller,
        "UpdateItem",
        lambda: appended.append(forwarder.acquire_or_enqueue(KEY, sig("s3", 3), TTL)),
        ORPHAN,
    )
    result = caller.acquire_or_enqueue(KEY, sig("s2", 2), TTL)
    # [Q6] (recognised as [Q7] / by its version): the head owns the key, ours is queued
    assert (result.acquired, result.owner) == (True, "s1")
    assert result.adopted is not None and result.adopted.id == "s1"
    assert result.adopted.token == result.token
    assert_nothing_lost(caller, "s1", "s2", "s3")
    assert model_lost_reply(
        orphaned_setup,
        lambda p, _: p.acquire_or_enqueue(KEY, sig("s2", 2), TTL),
        lambda p, _: p.acquire_or_enqueue(KEY, sig("s3", 3), TTL),
        advance_ms=5_000,
    ) == seen_on(None, appended[0], result)
    assert run_chain(caller, "s1", result.token) == ["s1", "s2", "s3"]
    assert_nothing_lost(caller)


# -- bug 2: a write applied after the client gave up, then the platform redelivers -------------


def test_a_grant_applied_after_the_client_gave_up_is_delayed_not_lost(
    make: Make, clock: Clock
) -> None:
    caller, platform = make(), make()
    LostReply(caller, "UpdateItem", when=GRANT, give_up=True)
    with pytest.raises(LeaseBackendError):
        caller.acquire_or_enqueue(KEY, sig("s1", 1), TTL)
    # The platform delivers the same event again: the grant it does not know about holds it.
    again = platform.acquire_or_enqueue(KEY, sig("s1", 1), TTL)
    assert (again.acquired, again.owner) == (False, "s1")  # [Q4]
    assert_nothing_lost(platform, "s1")
    clock.now += TTL + 1  # at most a TTL later the sweeper re-delivers it, with its payload
    adopted = platform.adopt_orphans(TTL, 10)
    assert [(k, s.id, s.payload) for k, s in adopted] == [(KEY, "s1", {"id": "s1", "n": 1})]
    assert run_chain(platform, "s1", adopted[0][1].token) == ["s1"]
    assert_nothing_lost(platform)


def test_an_append_applied_after_the_client_gave_up_is_queued_once(make: Make) -> None:
    owner_side, forwarder, platform = make(), make(), make()
    held = owner_side.acquire_or_enqueue(KEY, sig("o"), TTL)
    LostReply(forwarder, "UpdateItem", when=APPEND, give_up=True)
    with pytest.raises(LeaseBackendError):
        forwarder.acquire_or_enqueue(KEY, sig("s1", 1), TTL)
    again = platform.acquire_or_enqueue(KEY, sig("s1", 1), TTL)
    assert (again.acquired, again.owner, again.position) == (False, "o", 1)
    assert_nothing_lost(platform, "o", "s1")
    assert run_chain(owner_side, "o", held.token) == ["o", "s1"]


# -- bug 3: an event run twice: a forward resent after the owner ran and completed it ----------


def test_a_forward_resent_after_it_ran_is_a_duplicate(make: Make, clock: Clock) -> None:
    owner_side, forwarder = make(), make()
    held = owner_side.acquire_or_enqueue(KEY, sig("o"), TTL)
    ran: list[str] = []

    def owner_runs_everything() -> None:
        ran.extend(s.id for s in owner_side.take_signals(KEY, "o", 10, token=held.token))
        assert owner_side.transfer_to_next(KEY, "o", TTL, token=held.token) is None

    LostReply(forwarder, "UpdateItem", owner_runs_everything, APPEND)
    result = forwarder.acquire_or_enqueue(KEY, sig("s1", 1), TTL)
    assert ran == ["s1"]
    model = model_lost_reply(
        lambda p: p.acquire_or_enqueue(KEY, sig("o"), TTL),
        lambda p, _: p.acquire_or_enqueue(KEY, sig("s1", 1), TTL),
        lambda p, held: (
            p.take_signals(KEY, "o", 10, token=held.token),
            p.transfer_to_next(KEY, "o", TTL, token=held.token),
        ),
    )
    assert model[1] == Ranks()(result)
    # [Q5]: remembered as completed; the key is free, so no owner and no token
    assert (result.acquired, result.owner, result.token, result.position) == (
        False,
        None,
        None,
        None,
    )
    assert_nothing_lost(forwarder)
    assert forwarder.pending_signals(KEY) == 0
    # A redelivery by the platform within the window is a duplicate too, even behind an owner.
    busy = owner_side.acquire_or_enqueue(KEY, sig("o2"), TTL)
    late = forwarder.acquire_or_enqueue(KEY, sig("s1", 1), TTL)
    assert (late.acquired, late.owner, late.token, late.position) == (False, "o2", busy.token, None)
    assert run_chain(owner_side, "o2", busy.token) == ["o2"]
    # [G2] Past the dedupe window the id is forgotten and runs again.
    clock.now += DEDUPE_WINDOW_MS + 1
    fresh = forwarder.acquire_or_enqueue(KEY, sig("s1", 1), TTL)
    assert (fresh.acquired, fresh.owner) == (True, "s1")


def test_completed_ids_are_remembered_in_the_lease_item_and_pruned(
    make: Make, clock: Clock
) -> None:
    provider = make()
    for n in range(80):
        result = provider.acquire_or_enqueue(KEY, sig(f"s{n}", n), TTL)
        assert result.acquired
        assert provider.transfer_to_next(KEY, f"s{n}", TTL, token=result.token) is None
    assert len(lease_item(provider)["d"]["L"]) == 160  # an id and a marker per completion
    again = provider.acquire_or_enqueue(KEY, sig("s0"), TTL)
    assert (again.acquired, again.owner) == (False, None)  # [Q5]
    clock.now += DEDUPE_WINDOW_MS + 1
    last = provider.acquire_or_enqueue(KEY, sig("s79", 79), TTL)  # forgotten: runs again
    assert last.acquired
    assert provider.transfer_to_next(KEY, "s79", TTL, token=last.token) is None
    # The completer dropped the forgotten batches from the head of d (one extra write).
    assert len(lease_item(provider)["d"]["L"]) < 160
    # Only the duplicate's payload item is left: nothing references it; its TTL reaps it.
    assert list(payload_items(provider).values()) == ["s0"]


# -- bug 4: the sweeper's adoption resent after a forwarder wrote ---------------------------------


def test_a_lost_adoption_reply_resent_after_an_append_is_reported(make: Make, clock: Clock) -> None:
    first, sweeper, forwarder = make(), make(), make()
    first.acquire_lease(KEY, "dead", 1_000)
    first.acquire_or_enqueue(KEY, sig("s1", 1), TTL)
    clock.now += 5_000
    appended: list[LeaseResult] = []
    LostReply(
        sweeper,
        "UpdateItem",
        lambda: appended.append(forwarder.acquire_or_enqueue(KEY, sig("s2", 2), TTL)),
        ORPHAN,
    )
    adopted = sweeper.adopt_orphans(TTL, 10)
    assert model_lost_reply(
        orphaned_setup,
        lambda p, _: p.adopt_orphans(TTL, 10),
        lambda p, _: p.acquire_or_enqueue(KEY, sig("s2", 2), TTL),
        advance_ms=5_000,
    ) == seen_on(None, appended[0], adopted)
    assert [(k, s.id, s.payload) for k, s in adopted] == [(KEY, "s1", {"id": "s1", "n": 1})]
    state = assert_nothing_lost(sweeper, "s1", "s2")
    assert state.owner == "s1" and state.token == adopted[0][1].token
    claimed = sweeper.claim_signal(KEY, "s1", adopted[0][1].token or 0, TTL)
    assert claimed is not None and claimed.id == "s1"
    assert run_chain(sweeper, "s1", claimed.token) == ["s1", "s2"]


# -- bug 5: a resent release after a newcomer took the key ---------------------------------------


def test_a_resent_release_after_a_newcomer_took_the_key_answers_none(make: Make) -> None:
    owner_side, newcomer = make(), make()
    held = owner_side.acquire_or_enqueue(KEY, sig("s1", 1), TTL)
    taken: list[LeaseResult] = []
    LostReply(
        owner_side,
        "UpdateItem",
        lambda: taken.append(newcomer.acquire_or_enqueue(KEY, sig("s2", 2), TTL)),
        RELEASE,
    )
    assert owner_side.transfer_to_next(KEY, "s1", TTL, token=held.token) is None  # [N4]
    assert (taken[0].acquired, taken[0].owner) == (True, "s2")
    assert model_lost_reply(
        lambda p: p.acquire_or_enqueue(KEY, sig("s1", 1), TTL),
        lambda p, held: p.transfer_to_next(KEY, "s1", TTL, token=held.token),
        lambda p, _: p.acquire_or_enqueue(KEY, sig("s2", 2), TTL),
    ) == seen_on(held, taken[0], None)
    assert_nothing_lost(owner_side, "s2")
    assert run_chain(newcomer, "s2", taken[0].token) == ["s2"]


# -- bug 6: failure reports: attempts, retries at the head, dead letters --------------------------


def test_failures_retry_at_the_head_then_dead_letter_as_the_model(make: Make, clock: Clock) -> None:
    provider = make()

    def held(p: BaseLeaseProvider, *_: Any) -> object:
        return p.acquire_or_enqueue(KEY, sig("o"), TTL)

    steps: list[Step] = [
        held,
        lambda p, *_: p.acquire_or_enqueue(KEY, sig("s1", 1), TTL),
        lambda p, *_: p.acquire_or_enqueue(KEY, sig("s2", 2), TTL),
        lambda p, *_: p.acquire_or_enqueue(KEY, sig("s3", 3), TTL),
        lambda p, _, tok: p.take_signals(KEY, "o", 2, token=tok("o")),
        # [G6] all three in flight failed: back to the head in in-flight order, attempts 1;
        # the head (the owner's own signal) owns the key again
        lambda p, _, tok: p.transfer_to_next(
            KEY, "o", TTL, token=tok("o"), error="boom", max_attempts=2
        ),
        lambda p, *_: p.inspect_key(KEY),
        # o fails a second time: dead-lettered; s1 (attempts 1) owns the key next
        lambda p, _, tok: p.transfer_to_next(
            KEY, "o", TTL, token=tok("o"), error="boom again", max_attempts=2
        ),
        lambda p, *_: p.inspect_key(KEY),
        lambda p, *_: p.acquire_or_enqueue(KEY, sig("o"), TTL),  # [Q5] dead-lettered
        # s1 fails with requeue_owner=False: the platform retries it; it is not remembered
        lambda p, _, tok: p.transfer_to_next(
            KEY, "s1", TTL, token=tok("s1"), error="x", requeue_owner=False, max_attempts=2
        ),
        lambda p, *_: p.inspect_key(KEY),
        lambda p, _, tok: p.transfer_to_next(KEY, "s2", TTL, token=tok("s2")),
        lambda p, _, tok: p.transfer_to_next(KEY, "s3", TTL, token=tok("s3")),
        lambda p, *_: p.acquire_or_enqueue(KEY, sig("s1", 1), TTL),  # runs again
        lambda p, *_: p.acquire_or_enqueue(KEY, sig("s2", 2), TTL),  # done: duplicate
        lambda p, *_: p.inspect_key(KEY),
    ]
    replies = same_as_model(provider, clock, steps)
    assert replies[5] == ("signal", "o", {"id": "o", "n": 0}, 1, 1)
    assert replies[6][3] == (  # queued, with their attempts
        ("signal", "s1", {"id": "s1", "n": 1}, 1, None),
        ("signal", "s2", {"id": "s2", "n": 2}, 1, None),
        ("signal", "s3", {"id": "s3", "n": 3}, 0, None),
    )
    assert replies[8][5] == (("dead", "o", {"id": "o", "n": 0}, 2, "boom again"),)
    (dead,) = provider.inspect_key(KEY).dead_letters
    assert (dead.enqueued_at_ms, dead.failed_at_ms) == (1_000, clock.now)
    assert replies[14][1:3] == (True, "s1")
    assert replies[15][1:3] == (False, "s1")


# -- bug 7: reply shapes --------------------------------------------------------------------------


def test_adopted_is_none_exactly_when_the_caller_owns_the_key(make: Make, clock: Clock) -> None:
    provider = make()

    def expire(p: BaseLeaseProvider, advance: Callable[[int], None], tok: Any) -> object:
        assert p.renew_lease(KEY, "s1", 1, token=tok("s1"))
        advance(2)
        return None

    steps: list[Step] = [
        lambda p, *_: p.acquire_or_enqueue(KEY, sig("s1", 1), TTL),
        expire,  # s1 died in flight; its redelivery adopts the key and is the owner
        lambda p, *_: p.acquire_or_enqueue(KEY, sig("s1", 1), TTL),
        lambda p, *_: p.acquire_or_enqueue(KEY, sig("s2", 2), TTL),
        expire,  # s1 died again, s2 queued: s3 adopts the key for s1 and runs it first
        lambda p, *_: p.acquire_or_enqueue(KEY, sig("s3", 3), TTL),
        lambda p, *_: p.inspect_key(KEY),
    ]
    replies = same_as_model(provider, clock, steps)
    assert replies[2] == ("lease", True, "s1", 1, None, None)
    assert replies[5][:3] == ("lease", True, "s1") and replies[5][5][1] == "s1"


def test_request_counts_of_the_uncontended_path_did_not_grow(make: Make) -> None:
    provider = make()
    sent: list[str] = []
    provider.client.meta.events.register(
        "before-send.dynamodb.*", lambda event_name, **_: sent.append(event_name.split(".")[-1])
    )
    first = provider.acquire_or_enqueue(KEY, sig("s1"), TTL)
    assert provider.transfer_to_next(KEY, "s1", TTL, token=first.token) is None
    assert sent == ["PutItem", "UpdateItem", "UpdateItem", "BatchWriteItem"]


def test_the_done_view_applies_the_window_and_the_limits() -> None:
    """[G2] what ``d`` remembers: the latest entry per id, newer than the window, at most
    DONE_LIMIT ids and DONE_BYTES bytes of ids; a failed owner (nested) is not deduplicated."""
    from leaseguard.protocol.model import DONE_LIMIT
    from leaseguard.providers.dynamodb import DONE_BYTES, _done_view, _marker

    now = 10**12

    def mark(token: int, ok: bool = True, at: int = now) -> dict[str, Any]:
        return {"N": str(_marker(at, token, ok))}

    old: list[dict[str, Any]] = [{"S": "a"}, mark(7, at=now - DEDUPE_WINDOW_MS)]
    new: list[dict[str, Any]] = [{"S": "b"}, {"L": [{"S": "o"}]}, mark(8, ok=False)]
    view = _done_view(old + new, now)
    assert list(view) == ["b", "o"] and not view["o"].ok and view["o"].token == 8
    many: list[dict[str, Any]] = [{"S": f"s{i}"} for i in range(DONE_LIMIT + 5)]
    kept = _done_view([*many, mark(9)], now)
    assert len(kept) == DONE_LIMIT and "s4" not in kept and "s5" in kept
    long: list[dict[str, Any]] = [{"S": f"{i:04d}" + "x" * 1000} for i in range(100)]
    assert len(_done_view([*long, mark(1)], now)) == DONE_BYTES // 1005
