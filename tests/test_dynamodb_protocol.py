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
from leaseguard.errors import QueueFull
from leaseguard.protocol.model import DEDUPE_WINDOW_MS
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.providers.dynamodb import DynamoDBLeaseProvider
from leaseguard.providers.dynamodb.schema import INLINE
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
RESUMED = expression("#w = :w", "#a = :a", "if_not_exists(#t, :floor)")  # [Q1], attempts
RELEASE = expression("#d = list_append(list_append(")  # [G6] + [N1], one write


def sig(sid: str, n: int = 0) -> Signal:
    return Signal(sid, {"id": sid, "n": n}, enqueued_at_ms=1_000 + n)


def payload_items(provider: DynamoDBLeaseProvider, key: str = KEY) -> dict[str, str]:
    """Stored payloads of ``key``: ref -> signal id. A payload item's, and a record stored
    inline in the lease item (its ref is the record itself, so it is where the ref is)."""
    items = provider.client.query(
        TableName=provider.table_name,
        KeyConditionExpression="pk = :k AND begins_with(sk, :s)",
        ExpressionAttributeValues={":k": {"S": key}, ":s": {"S": "sig#"}},
        ConsistentRead=True,
    )["Items"]
    stored = {str(i["sk"]["S"])[4:]: str(i["i"]["S"]) for i in items}
    item = lease_item(provider, key)
    for ids, refs in (("q", "qn"), ("f", "fn"), ("x", "xn")):
        pairs = zip(item.get(ids, {"L": []})["L"], item.get(refs, {"L": []})["L"], strict=True)
        stored.update({r["S"]: i["S"] for i, r in pairs if r["S"].startswith(INLINE)})
    return stored


def lease_item(provider: DynamoDBLeaseProvider, key: str = KEY) -> dict[str, Any]:
    return dict(
        provider.client.get_item(
            TableName=provider.table_name,
            Key={"pk": {"S": key}, "sk": {"S": "lease"}},
            ConsistentRead=True,
        ).get("Item", {})
    )


def assert_nothing_lost(provider: DynamoDBLeaseProvider, *expected: str) -> KeyState:
    """Every stored (queued or in-flight) signal of KEY has its payload (item or inline), each id is
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
                reply.attempts,
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
                reply.halted,
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
    original = memory_module.new_nonce

    def record() -> str:
        drawn.append(original())
        return drawn[-1]

    memory_module.new_nonce = record
    try:
        first(model, before)
    finally:
        memory_module.new_nonce = original
    seen = ranks(between(model, before))
    again = iter(list(drawn))
    memory_module.new_nonce = lambda: next(again, None) or original()
    try:
        resent = ranks(first(model, before))
    finally:
        memory_module.new_nonce = original
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
    make: Make, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leaseguard.providers.dynamodb import done

    # a completion rewrites d once PRUNE_MIN (64) forgotten elements piled up: 8 here, so that
    # 12 completions (24 elements) show it without 160 requests
    monkeypatch.setattr(done, "PRUNE_MIN", 8)
    provider = make()
    for n in range(12):
        result = provider.acquire_or_enqueue(KEY, sig(f"s{n}", n), TTL)
        assert result.acquired
        assert provider.transfer_to_next(KEY, f"s{n}", TTL, token=result.token) is None
    assert len(lease_item(provider)["d"]["L"]) == 24  # an id and a marker per completion
    again = provider.acquire_or_enqueue(KEY, sig("s0"), TTL)
    assert (again.acquired, again.owner) == (False, None)  # [Q5]
    clock.now += DEDUPE_WINDOW_MS + 1
    last = provider.acquire_or_enqueue(KEY, sig("s11", 11), TTL)  # forgotten: runs again
    assert last.acquired
    assert provider.transfer_to_next(KEY, "s11", TTL, token=last.token) is None
    # The completion rewrote d as what it remembers (in its own write).
    assert len(lease_item(provider)["d"]["L"]) == 2
    # Nothing is left: the duplicate's record was inline in its refused grant, which stored
    # nothing (a payload item of a duplicate would be left to its TTL).
    assert list(payload_items(provider).values()) == []


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


# -- bug 8: a deadline write applied late moved the deadline back ---------------------------------


class Late:
    """The first request of ``operation`` that ``when`` accepts is held back and the caller
    sees a timeout (every botocore retry timed out); :meth:`arrive` applies it later, after
    other steps, exactly as sent: a slow network, or DynamoDB applying a request after its
    client gave up. Returns what DynamoDB answered (a refused condition: None)."""

    def __init__(
        self,
        provider: DynamoDBLeaseProvider,
        operation: str,
        when: Callable[[dict[str, Any]], bool],
    ) -> None:
        client: Any = provider.client
        self.inner = client._make_api_call
        self.operation, self.when = operation, when
        self.held: dict[str, Any] | None = None
        client._make_api_call = self

    def __call__(self, operation: str, params: dict[str, Any]) -> Any:
        if self.held is not None or operation != self.operation or not self.when(params):
            return self.inner(operation, params)
        self.held = copy.deepcopy(params)
        raise ReadTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")

    def arrive(self) -> Any:
        assert self.held is not None, "no request was held back"
        try:
            return self.inner(self.operation, self.held)
        except ClientError as exc:
            assert exc.response["Error"]["Code"] == "ConditionalCheckFailedException"
            return None


EXTENDS = {
    "renew_lease": lambda p, token: p.renew_lease(KEY, "owner", TTL, token=token),
    "acquire_lease (refresh)": lambda p, token: p.acquire_lease(KEY, "owner", TTL),
}


@pytest.mark.parametrize("extend", list(EXTENDS.values()), ids=list(EXTENDS))
def test_a_deadline_write_applied_after_a_later_one_never_moves_the_deadline_back(
    make: Make, clock: Clock, extend: Callable[[DynamoDBLeaseProvider, int], object]
) -> None:
    """Regression: DynamoDB deadlines are absolute (the caller's clock at sending plus the
    TTL), so a renewal sent at +1 s that arrived after the renewal sent at +5 s set the
    deadline back to +11 s while the owner counted on +15 s; from +11 s (plus the margin) a
    newcomer took the key from a live owner. Redis sets deadlines by its own clock when a
    script runs, so a late renewal with the same TTL can only lengthen one."""
    start = clock.now
    owner, newcomer = make(), make()
    held = owner.acquire_lease(KEY, "owner", TTL)  # deadline +10 s
    late = Late(owner, "UpdateItem", expression("SET #e = :exp"))
    clock.now = start + 1_000
    with pytest.raises(LeaseBackendError):
        extend(owner, held.token)  # sent at +1 s; the caller gives up on it
    clock.now = start + 5_000
    assert owner.renew_lease(KEY, "owner", TTL, token=held.token)  # deadline +15 s
    assert late.arrive() is None  # the +1 s request, at last: refused
    clock.now = start + 12_000  # past +11 s, inside the +15 s the owner counts on
    refused = newcomer.acquire_lease(KEY, "newcomer", TTL)
    assert (refused.acquired, refused.owner, refused.token) == (False, "owner", held.token)
    assert owner.renew_lease(KEY, "owner", TTL, token=held.token)  # still the owner's
    clock.now = start + 12_000 + TTL + 1  # and it ends only when the owner stops renewing
    assert newcomer.acquire_lease(KEY, "newcomer", TTL).acquired


def test_of_two_extensions_sent_in_one_millisecond_the_later_deadline_stands(
    make: Make, clock: Clock
) -> None:
    """Found by the differential suite's late requests (its clock stands still between steps):
    a renewal to 10 s held back, one to 20 s sent in the same millisecond, then the first
    arrives: send times tie, so the later deadline stands. A botocore resend (the very same
    request) still applies."""
    owner = make()
    held = owner.acquire_lease(KEY, "owner", TTL)
    late = Late(owner, "UpdateItem", expression("SET #e = :exp"))
    with pytest.raises(LeaseBackendError):
        owner.renew_lease(KEY, "owner", TTL, token=held.token)
    assert owner.renew_lease(KEY, "owner", 2 * TTL, token=held.token)
    assert late.arrive() is None
    assert owner.inspect_key(KEY).remaining_ms == 2 * TTL
    # a shorter renewal in that millisecond is answered as done: the lease already reaches on
    assert owner.renew_lease(KEY, "owner", TTL, token=held.token)
    assert owner.inspect_key(KEY).remaining_ms == 2 * TTL
    LostReply(owner, "UpdateItem", when=expression("SET #e = :exp"))
    assert owner.renew_lease(KEY, "owner", 3 * TTL, token=held.token)  # applied, then resent
    assert owner.inspect_key(KEY).remaining_ms == 3 * TTL


def test_an_extension_sent_by_a_clock_behind_the_last_one_is_refused_visibly(
    make: Make, clock: Clock
) -> None:
    """The price of that order: a caller whose clock is behind the one that last extended
    the lease (a clock stepped back, or one owner name on two machines) cannot extend it.
    Asking for no more than the deadline already gives is answered as done; asking for more,
    its renewal says not renewed and its re-acquire raises. The deadline stays."""
    start = clock.now
    ahead, behind = make(), make(clock=lambda: clock.now - 500)
    held = ahead.acquire_lease(KEY, "owner", TTL)
    clock.now = start + 1_000
    assert ahead.renew_lease(KEY, "owner", TTL, token=held.token)  # deadline +11 s, sent at +1 s
    before = ahead.inspect_key(KEY)
    assert behind.renew_lease(KEY, "owner", TTL, token=held.token)  # +10.5 s: already covered
    assert behind.acquire_lease(KEY, "owner", TTL) == LeaseResult(True, "owner", held.token)
    assert behind.renew_lease(KEY, "owner", 2 * TTL, token=held.token) is False  # +20.5 s
    with pytest.raises(LeaseBackendError, match="sent later"):
        behind.acquire_lease(KEY, "owner", 2 * TTL)
    after = ahead.inspect_key(KEY)
    assert (after.owner, after.token, after.remaining_ms) == (
        "owner",
        held.token,
        before.remaining_ms,
    )
    clock.now = start + 2_000  # once its clock passes the last one's, it extends again
    assert behind.renew_lease(KEY, "owner", 2 * TTL, token=held.token)
    assert ahead.inspect_key(KEY).remaining_ms == 2 * TTL - 500


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
        # s1 (attempts 1) fails with requeue_owner=False, below max_attempts: removed, the
        # platform retries it; its failed done entry carries the count (2)
        lambda p, _, tok: p.transfer_to_next(
            KEY, "s1", TTL, token=tok("s1"), error="x", requeue_owner=False, max_attempts=3
        ),
        lambda p, *_: p.inspect_key(KEY),
        lambda p, _, tok: p.transfer_to_next(KEY, "s2", TTL, token=tok("s2")),
        lambda p, _, tok: p.transfer_to_next(KEY, "s3", TTL, token=tok("s3")),
        lambda p, *_: p.acquire_or_enqueue(KEY, sig("s1", 1), TTL),  # runs again, attempts 2
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
    assert replies[14][1:3] == (True, "s1") and replies[14][6] == 2
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
    assert replies[2] == ("lease", True, "s1", 1, None, None, 1)  # [G5] it died in flight
    assert replies[5][:3] == ("lease", True, "s1") and replies[5][5][1] == "s1"


def test_request_counts_of_the_uncontended_path_did_not_grow(make: Make) -> None:
    provider = make()
    sent: list[str] = []
    provider.client.meta.events.register(
        "before-send.dynamodb.*", lambda event_name, **_: sent.append(event_name.split(".")[-1])
    )
    first = provider.acquire_or_enqueue(KEY, sig("s1"), TTL)
    assert provider.transfer_to_next(KEY, "s1", TTL, token=first.token) is None
    assert sent == ["UpdateItem", "UpdateItem"]  # the grant with its record inline, the release


def test_the_done_view_applies_the_window_and_the_limits() -> None:
    """[G2] what ``d`` remembers: the latest entry per id, newer than the window, at most
    DONE_LIMIT ids and DONE_BYTES bytes of ids; a failed owner (nested) is not deduplicated."""
    from leaseguard.protocol.model import DONE_LIMIT
    from leaseguard.providers.dynamodb.done import DONE_BYTES, done_view, marker

    now = 10**12

    def mark(token: int, ok: bool = True, at: int = now) -> dict[str, Any]:
        return {"N": str(marker(at, token, ok))}

    old: list[dict[str, Any]] = [{"S": "a"}, mark(7, at=now - DEDUPE_WINDOW_MS)]
    new: list[dict[str, Any]] = [{"S": "b"}, {"L": [{"S": "o"}]}, mark(8, ok=False)]
    view = done_view(old + new, now)
    assert list(view) == ["b", "o"] and not view["o"].ok and view["o"].token == 8
    many: list[dict[str, Any]] = [{"S": f"s{i}"} for i in range(DONE_LIMIT + 5)]
    kept = done_view([*many, mark(9)], now)
    assert len(kept) == DONE_LIMIT and "s4" not in kept and "s5" in kept
    long: list[dict[str, Any]] = [{"S": f"{i:04d}" + "x" * 1000} for i in range(100)]
    # each entry is charged its stored bytes and a marker: 1 + 1,004 + 1 + 18
    assert len(done_view([*long, mark(1)], now)) == DONE_BYTES // 1024


# -- backpressure, halting, envelope retries, redrive (rows Q8 Q9 N1 D4 C4 V1 V2, G5) --------------


def forward(sid: str, n: int = 0, max_queue: int | None = None) -> Step:
    """acquire_or_enqueue of ``sid``; a refusal ([Q8]) as ("full", depth, limit, holder)."""

    def step(p: BaseLeaseProvider, *_: Any) -> object:
        try:
            return p.acquire_or_enqueue(KEY, sig(sid, n), TTL, max_queue=max_queue)
        except QueueFull as full:
            assert full.key == KEY
            return ("full", full.depth, full.limit, full.holder)

    return step


def inspect(p: BaseLeaseProvider, *_: Any) -> object:
    return p.inspect_key(KEY)


def expire(p: BaseLeaseProvider, advance: Callable[[int], None], *_: Any) -> object:
    """The current lease (and its index entry) runs out: the owner died."""
    advance(TTL + 1)
    return None


def test_a_full_queue_refuses_forwards_in_the_models_order(make: Make, clock: Clock) -> None:
    provider = make()
    steps: list[Step] = [
        forward("o"),  # [Q1]
        forward("s1", 1, max_queue=2),  # [Q2]
        forward("s2", 2, max_queue=2),  # [Q2]
        forward("s3", 3, max_queue=2),  # [Q8] refused: 2 queued, holder o
        forward("s1", 1, max_queue=2),  # [Q3] a known id is never refused: its place
        forward("o", max_queue=1),  # [Q4]
        inspect,
        lambda p, _, tok: p.take_signals(KEY, "o", 1, token=tok("o")),
        forward("s3", 3, max_queue=2),  # [Q2] room again
        expire,
        forward("s4", 4, max_queue=2),  # [Q8] free with work pending: refused, holder none
        inspect,
        forward("s4", 4, max_queue=3),  # [Q6] G5 (attempts + 1), s4 behind, o owns again
        inspect,
    ]
    replies = same_as_model(provider, clock, steps)
    assert replies[3] == ("full", 2, 2, "o")
    assert replies[4][1:5] == (False, "o", 0, 1)
    assert replies[10] == ("full", 2, 2, None)
    assert replies[11][6] is False
    assert replies[12][1:3] == (True, "o") and replies[12][5][3] == 1  # o's attempt counted
    assert [s[1] for s in replies[13][3]] == ["s1", "s2", "s3", "s4"]
    assert [s[3] for s in replies[13][3]] == [1, 0, 0, 0]


def test_a_refused_forward_leaves_no_state_and_no_payload(make: Make) -> None:
    provider = make()
    held = provider.acquire_or_enqueue(KEY, sig("o"), TTL)
    provider.acquire_or_enqueue(KEY, sig("s1", 1), TTL, max_queue=1)
    before = (lease_item(provider), payload_items(provider), provider.inspect_key(KEY))
    with pytest.raises(QueueFull) as info:
        provider.acquire_or_enqueue(KEY, sig("s2", 2), TTL, max_queue=1)
    assert (info.value.depth, info.value.limit, info.value.holder) == (1, 1, "o")
    assert (lease_item(provider), payload_items(provider), provider.inspect_key(KEY)) == before
    assert provider.pending_signals(KEY) == 1
    # the provider's own bound applies when the call names none
    bounded = make(max_queue=1)
    with pytest.raises(QueueFull):
        bounded.acquire_or_enqueue(KEY, sig("s2", 2), TTL)
    assert payload_items(provider) == before[1]
    # a forward that fills the last place concurrently: the append's own condition refuses
    racer = make()
    LostReply(
        provider,
        "UpdateItem",
        between=lambda: racer.acquire_or_enqueue(KEY, sig("s3", 3), TTL, max_queue=2),
        when=GRANT,
        give_up=False,
    )
    with pytest.raises(QueueFull) as info:
        provider.acquire_or_enqueue(KEY, sig("s4", 4), TTL, max_queue=2)
    assert info.value.depth == 2
    assert_nothing_lost(provider, "o", "s1", "s3")
    assert sorted(payload_items(provider).values()) == ["o", "s1", "s3"]
    assert run_chain(provider, "o", held.token) == ["o", "s1", "s3"]


def test_a_halted_key_releases_queues_and_is_not_adopted_until_redriven(
    make: Make, clock: Clock
) -> None:
    provider = make()

    def fail(owner: str, halt: bool) -> Step:
        return lambda p, _, tok: p.transfer_to_next(
            KEY,
            owner,
            TTL,
            token=tok(owner),
            error="boom",
            max_attempts=2,
            on_poison="halt" if halt else "skip",
        )

    steps: list[Step] = [
        forward("o"),
        forward("s1", 1),
        forward("s2", 2),
        lambda p, _, tok: p.take_signals(KEY, "o", 1, token=tok("o")),
        fail("o", halt=True),  # [G6] o and s1 back at the head (attempts 1): nothing dead yet
        fail("o", halt=True),  # [G6] o dead-lettered, h set; [N1] released, queue kept
        inspect,
        forward("s3", 3),  # [Q9] not acquired, no holder, its place
        forward("s3", 3),  # [Q9] again: the same place
        forward("s4", 4, max_queue=3),  # [Q8] before [Q9]
        lambda p, *_: p.adopt_orphans(TTL, 10),  # [D4]
        lambda p, *_: p.acquire_lease(KEY, "w0", TTL),  # [L3] a plain owner; still halted
        lambda p, _, tok: p.take_signals(KEY, "w0", 2, token=tok("w0")),
        # [C4] not on a halted key: the taken head is first in flight with w0's token
        lambda p, _, tok: p.claim_signal(KEY, "s1", tok("w0") or 1, TTL),
        # [N1] halted: w0 completes s1 and s2 and releases, s3 stays queued
        lambda p, _, tok: p.transfer_to_next(KEY, "w0", TTL, token=tok("w0")),
        inspect,
        lambda p, *_: p.acquire_lease(KEY, "w1", TTL),
        lambda p, _, tok: p.take_signals(KEY, "w1", 2, token=tok("w1")),
        expire,  # w1 died with s3 in flight
        lambda p, _, tok: p.claim_signal(KEY, "s3", tok("w1") or 1, TTL),  # [C4] not: halted
        forward("s5", 5),  # [Q9] G5: s3 back at the head with one more attempt
        inspect,
        lambda p, *_: p.redrive(KEY, ["nope"]),  # [V2]
        lambda p, *_: p.redrive(KEY),  # [V1] o first, attempts 0; no longer halted
        lambda p, *_: p.redrive(KEY),  # [V2]
        inspect,
        lambda p, *_: p.dead_letter_keys(),
        lambda p, *_: p.adopt_orphans(TTL, 10),  # [D1] the redriven work runs
        inspect,
    ]
    replies = same_as_model(provider, clock, steps)
    assert replies[5] is None
    assert replies[6][5][0][1] == "o" and replies[6][6] is True
    assert replies[7] == ("lease", False, None, None, 3, None, 0)
    assert replies[8] == replies[7]
    assert replies[9] == ("full", 3, 3, None)
    assert replies[10] == [] and replies[13] is None and replies[14] is None
    assert replies[19] is None
    assert replies[20] == ("lease", False, None, None, 2, None, 0)
    assert [(s[1], s[3]) for s in replies[21][3]] == [("s3", 1), ("s5", 0)]
    assert (replies[22], replies[23], replies[24]) == (0, 1, 0)
    assert replies[25][6] is False and [s[1] for s in replies[25][3]] == ["o", "s3", "s5"]
    assert replies[25][3][0][3] == 0
    assert replies[26] == []
    assert [(k, s[1], s[3]) for k, s in replies[27]] == [(KEY, "o", 0)]


def test_the_sweeper_drops_a_halted_key_from_the_orphan_index(make: Make, clock: Clock) -> None:
    provider = make()
    held = provider.acquire_or_enqueue(KEY, sig("o"), TTL)
    provider.acquire_or_enqueue(KEY, sig("s1", 1), TTL)
    provider.transfer_to_next(
        KEY, "o", TTL, token=held.token, error="x", max_attempts=1, on_poison="halt"
    )
    assert "gp" not in lease_item(provider)  # [N1] halted: out of the index
    # a plain owner's forwarders put it back ([Q2] indexes); the sweep meets it once ([D4])
    provider.acquire_lease(KEY, "w0", 1_000)
    provider.acquire_or_enqueue(KEY, sig("s2", 2), TTL)
    assert "gp" in lease_item(provider)
    clock.now += 2_000
    sent: list[str] = []
    provider.client.meta.events.register(
        "before-send.dynamodb.*", lambda event_name, **_: sent.append(event_name.split(".")[-1])
    )
    assert provider.adopt_orphans(TTL, 10) == []
    assert "gp" not in lease_item(provider) and "h" in lease_item(provider)
    sent.clear()
    assert provider.adopt_orphans(TTL, 10) == []
    assert "GetItem" not in sent  # no candidate any more: only the index queries
    assert provider.inspect_key(KEY).halted


def test_an_envelope_retried_after_its_lease_ran_out_runs_again(make: Make, clock: Clock) -> None:
    provider = make()
    steps: list[Step] = [
        forward("o"),
        forward("s1", 1),
        forward("s2", 2),
        # [N3] s1 granted unclaimed: an envelope with its token
        lambda p, _, tok: p.transfer_to_next(KEY, "o", TTL, claim=False, token=tok("o")),
        lambda p, _, tok: p.claim_signal(KEY, "s1", tok("s1") or 1, TTL),  # [C1]
        lambda p, _, tok: p.take_signals(KEY, "s1", 1, token=tok("s1")),  # s2 in flight too
        expire,  # the receiver died
        lambda p, _, tok: p.claim_signal(KEY, "s1", tok("s1") or 1, TTL),  # [C4]
        inspect,
    ]
    replies = same_as_model(provider, clock, steps)
    assert replies[4][:5] == ("signal", "s1", {"id": "s1", "n": 1}, 0, 1)
    assert replies[7][:4] == ("signal", "s1", {"id": "s1", "n": 1}, 1)
    assert replies[7][4] == 2  # a new token
    assert replies[8][1] == "s1" and [(s[1], s[3]) for s in replies[8][3]] == [("s2", 1)]

    # [C4] resent (its reply lost) after a duplicate envelope's claim: the same grant
    clock.now += TTL + 1
    old = provider.inspect_key(KEY)
    assert old.owner is None and old.in_flight == ("s1",)
    token = lease_item(provider)["t"]["N"]
    duplicate: list[object] = []
    LostReply(
        provider,
        "UpdateItem",
        between=lambda: duplicate.append(make().claim_signal(KEY, "s1", int(token), TTL)),
        when=ORPHAN,
    )
    again = provider.claim_signal(KEY, "s1", int(token), TTL)
    assert again is not None and (again.id, again.attempts) == ("s1", 2)
    assert duplicate == [None]  # [C3]: the grant moved on
    state = provider.inspect_key(KEY)
    assert (state.owner, state.token) == ("s1", again.token)
    assert provider.claim_signal(KEY, "s1", int(token), TTL) is None  # [C3]
    assert run_chain(provider, "s1", again.token) == ["s1", "s2"]


def test_a_dead_owners_in_flight_signals_count_an_attempt(make: Make, clock: Clock) -> None:
    """[G5] on every path that requeues: acquire_lease (L3), the next event (Q6), the sweeper
    (D1)."""
    provider = make()
    steps: list[Step] = [
        forward("o"),
        forward("s1", 1),
        lambda p, _, tok: p.take_signals(KEY, "o", 1, token=tok("o")),
        expire,
        lambda p, *_: p.acquire_lease(KEY, "w0", TTL),  # [L3]
        inspect,
        lambda p, _, tok: p.take_signals(KEY, "w0", 1, token=tok("w0")),
        expire,
        lambda p, *_: p.adopt_orphans(TTL, 10, claim=True),  # [D1]
        inspect,
        expire,
        forward("s2", 2),  # [Q6]
        inspect,
    ]
    replies = same_as_model(provider, clock, steps)
    assert [(s[1], s[3]) for s in replies[5][3]] == [("o", 1), ("s1", 1)]
    assert [(k, s[1], s[3]) for k, s in replies[8]] == [(KEY, "o", 2)]
    assert [(s[1], s[3]) for s in replies[9][3]] == [("s1", 1)]
    assert replies[11][5][1:4:2] == ("o", 3)
    assert [(s[1], s[3]) for s in replies[12][3]] == [("s1", 1), ("s2", 0)]


def dead_letter(p: BaseLeaseProvider, sid: str, *, halt: bool = False) -> None:
    """``sid`` runs on the free KEY and fails its only attempt: a dead letter."""
    held = p.acquire_or_enqueue(KEY, sig(sid), TTL)
    p.transfer_to_next(
        KEY,
        sid,
        TTL,
        token=held.token,
        error="x",
        max_attempts=1,
        on_poison="halt" if halt else "skip",
    )


def run_one(p: BaseLeaseProvider) -> str | None:
    """The sweeper adopts KEY's head and it completes: its id."""
    adopted = [s for key, s in p.adopt_orphans(TTL, 10, claim=True) if key == KEY]
    if not adopted:
        return None
    p.transfer_to_next(KEY, adopted[0].id, TTL, token=adopted[0].token)
    return adopted[0].id


def test_a_lost_redrive_reply_resent_answers_what_it_moved(make: Make) -> None:
    """[V3] The redrive's write applied and its reply was lost; meanwhile its signal ran and
    another signal died. botocore's resend of the same request (the same nonce) answers 1, as
    the first reply would have, and leaves the new dead letters where they are (issue 23, 6)."""
    provider = make()
    dead_letter(provider, "o", halt=True)

    def others_move_on(p: BaseLeaseProvider) -> str | None:
        ran = run_one(p)
        dead_letter(p, "n")
        dead_letter(p, "m")
        return ran

    between = lambda: others_move_on(provider)  # noqa: E731
    lost = LostReply(
        provider, "UpdateItem", between, when=expression("list_append(:rq", "#gx = :gx")
    )
    assert provider.redrive(KEY) == 1  # [V3], not "nothing to redrive"
    assert lost.fired == 1
    model = model_lost_reply(
        lambda p: dead_letter(p, "o", halt=True),
        lambda p, _: p.redrive(KEY),
        lambda p, _: others_move_on(p),
    )
    assert model == ("o", 1)  # between: o ran; the resend: 1
    state = provider.inspect_key(KEY)
    assert [d.id for d in state.dead_letters] == ["n", "m"]  # the resend moved nothing more
    assert (state.queued, state.halted) == ((), False)
    # A redrive called again (a new call, a new nonce) moves what is dead by then.
    assert provider.redrive(KEY) == 2
    assert provider.redrive(KEY) == 0  # [V2]


def test_dead_letter_keys_come_from_the_index(make: Make) -> None:
    provider = make()
    keys = [f"{KEY}:{i}" for i in range(3)]
    for i, key in enumerate(keys[:2]):
        held = provider.acquire_or_enqueue(key, sig(f"o{i}"), TTL)
        provider.acquire_or_enqueue(key, sig(f"s{i}"), TTL)
        provider.take_signals(key, f"o{i}", 1, token=held.token)
        provider.transfer_to_next(
            key,
            f"o{i}",
            TTL,
            token=held.token,
            error="x",
            max_attempts=1,
            on_poison="halt" if i else "skip",
        )
    held = provider.acquire_or_enqueue(keys[2], sig("fine"), TTL)
    provider.transfer_to_next(keys[2], "fine", TTL, token=held.token)
    sent: list[str] = []
    provider.client.meta.events.register(
        "before-send.dynamodb.*", lambda event_name, **_: sent.append(event_name.split(".")[-1])
    )
    assert provider.dead_letter_keys() == sorted(keys[:2])
    assert set(sent) == {"Query"}  # one per shard: never a Scan, no item reads
    assert len(provider.dead_letter_keys(limit=1)) == 1
    assert provider.redrive(keys[0], ["o0"]) == 1  # s0 is still dead
    assert provider.dead_letter_keys() == sorted(keys[:2])
    assert provider.redrive(keys[0]) == 1
    assert provider.dead_letter_keys() == [keys[1]]
    assert "gd" not in lease_item(provider, keys[0]) and "gd" in lease_item(provider, keys[1])
    state = provider.inspect_key(keys[0])
    # each redrive puts its dead letters at the head: s0 (redriven last) runs first
    assert [s.id for s in state.queued] == ["s0", "o0"] and not state.halted
    assert provider.redrive(keys[1]) == 2 and provider.dead_letter_keys() == []


# -- a failed own event's platform retry resumes its attempts (rows G6, Q1 Q2 Q6 Q7 Q9) ----------


def fail_own(owner: str, max_attempts: int = 3, halt: bool = False) -> Step:
    """``owner``'s invocation failed on its own event: the platform retries it (G6)."""
    return lambda p, _, tok: p.transfer_to_next(
        KEY,
        owner,
        TTL,
        token=tok(owner),
        error=f"{owner} failed",
        requeue_owner=False,
        max_attempts=max_attempts,
        on_poison="halt" if halt else "skip",
    )


def test_an_own_event_that_failed_resumes_its_attempts_then_is_dead_lettered(
    make: Make, clock: Clock
) -> None:
    provider = make()
    steps: list[Step] = [
        forward("o"),  # [Q1] attempts 0
        fail_own("o"),  # [G6] removed, not dead yet: its done entry carries 1
        inspect,
        forward("o"),  # [Q1] the platform's retry: attempts resumed (1)
        forward("o"),  # [Q4] a second delivery of the owner
        fail_own("o"),  # [G6] 2 < 3: removed again, the done entry carries 2
        forward("s1", 1),  # [Q1] another event holds the key
        forward("o"),  # [Q2] the retry queued behind it, with its attempts (2)
        inspect,
        lambda p, _, tok: p.transfer_to_next(KEY, "s1", TTL, token=tok("s1")),  # [N2] to o
        fail_own("o"),  # [G6] 3 >= 3: dead-lettered with its payload, not removed
        inspect,
        forward("o"),  # [Q5] dead-lettered: never runs again
        lambda p, *_: p.redrive(KEY),  # [V1] attempts start again from 0
        inspect,
    ]
    replies = same_as_model(provider, clock, steps)
    assert replies[0][1:3] == (True, "o") and replies[0][6] == 0
    assert replies[1] is None and replies[2][3] == () and replies[2][5] == ()
    assert replies[3][1:3] == (True, "o") and replies[3][6] == 1
    assert replies[4][1:3] == (False, "o") and replies[4][6] == 0
    assert replies[7][1:3] == (False, "s1") and replies[7][4] == 1 and replies[7][6] == 0
    assert replies[8][3] == (("signal", "o", {"id": "o", "n": 0}, 2, None),)
    assert replies[9] == ("signal", "o", {"id": "o", "n": 0}, 2, 3)
    assert replies[10] is None
    assert replies[11][3] == () and replies[11][5] == (
        ("dead", "o", {"id": "o", "n": 0}, 3, "o failed"),
    )
    assert replies[12][1:3] == (False, None) and replies[13] == 1
    assert [(s[1], s[3]) for s in replies[14][3]] == [("o", 0)]
    assert provider.dead_letter_keys() == []


def test_a_retried_own_event_resumes_on_an_orphaned_or_halted_key(make: Make, clock: Clock) -> None:
    """[Q6] and [Q9] store the retry with its attempts too; at max_attempts=1 the owner's own
    event is dead-lettered at once (requeue_owner=False no longer skips that)."""
    provider = make()
    steps: list[Step] = [
        forward("o"),
        fail_own("o"),  # its done entry carries 1
        forward("p"),
        fail_own("p"),  # so does p's
        forward("s1", 1),
        forward("s2", 2),
        lambda p, _, tok: p.take_signals(KEY, "s1", 1, token=tok("s1")),
        expire,  # s1 died with s2 in flight
        forward("o"),  # [Q6] s1 first (G5: attempts 1), then s2 (1), o behind them with 1
        inspect,
        fail_own("s1", max_attempts=1, halt=True),  # [G6] s1 dead at once: halted, released
        forward("o"),  # [Q3] on a halted key: still queued, its place
        inspect,
        lambda p, *_: p.acquire_lease(KEY, "w0", 1_000),
        lambda p, _, tok: p.take_signals(KEY, "w0", 1, token=tok("w0")),
        expire,  # w0 died with s2 in flight on the halted key
        forward("p"),  # [Q9] s2 back at the head (G5: 2), p queued with its 1; no grant
        inspect,
        lambda p, *_: p.redrive(KEY),  # [V1]
        forward("q"),  # [Q6] the redriven head owns the key
        inspect,
    ]
    replies = same_as_model(provider, clock, steps)
    assert replies[8][1:3] == (True, "s1") and replies[8][5][1] == "s1"
    assert replies[8][6] == 0  # not the caller's own signal
    assert [(s[1], s[3]) for s in replies[9][3]] == [("s2", 1), ("o", 1)]
    assert replies[11] == ("lease", False, None, None, 2, None, 0)
    assert replies[12][6] is True and [d[1] for d in replies[12][5]] == ["s1"]
    assert replies[16] == ("lease", False, None, None, 3, None, 0)
    assert [(s[1], s[3]) for s in replies[17][3]] == [("s2", 2), ("o", 1), ("p", 1)]
    assert replies[19][2] == "s1" and replies[19][6] == 0
    assert [(s[1], s[3]) for s in replies[20][3]] == [("s2", 2), ("o", 1), ("p", 1), ("q", 0)]


def test_a_retried_own_event_queues_on_a_halted_key_with_its_attempts(
    make: Make, clock: Clock
) -> None:
    """[Q9] with nothing in flight: the retry is appended with its attempts."""
    provider = make()
    steps: list[Step] = [
        forward("o"),
        fail_own("o", max_attempts=2),  # its done entry carries 1
        forward("s1", 1),
        forward("s2", 2),
        fail_own("s1", max_attempts=1, halt=True),  # halted, released, s2 queued
        forward("o"),  # [Q9] appended with 1
        forward("o"),  # [Q9] again: the same place
        inspect,
        lambda p, *_: p.redrive(KEY),
        lambda p, *_: p.adopt_orphans(TTL, 10)[0][1],  # [D1] s1 runs (its new token)
        lambda p, _, tok: p.transfer_to_next(KEY, "s1", TTL, token=tok("s1")),  # s2
        lambda p, _, tok: p.transfer_to_next(KEY, "s2", TTL, token=tok("s2")),  # o
        fail_own("o", max_attempts=2),  # 2 >= 2: dead-lettered with its payload
        inspect,
    ]
    replies = same_as_model(provider, clock, steps)
    assert replies[5] == ("lease", False, None, None, 2, None, 0) and replies[6] == replies[5]
    assert [(s[1], s[3]) for s in replies[7][3]] == [("s2", 0), ("o", 1)]
    assert replies[11][1] == "o" and replies[11][3] == 1
    assert replies[13][5] == (("dead", "o", {"id": "o", "n": 0}, 2, "o failed"),)


def test_a_retried_own_event_on_a_free_key_costs_one_more_write(make: Make) -> None:
    """The blind [Q1] refuses on the failed entry's tag; the refusal is the snapshot of the
    conditional grant that resumes the count. A fresh event still costs the pinned two."""
    provider = make()
    first = provider.acquire_or_enqueue(KEY, sig("o"), TTL)
    provider.transfer_to_next(KEY, "o", TTL, token=first.token, error="x", requeue_owner=False)
    item = lease_item(provider)
    assert {"B": b"o"} in item["d"]["L"] and {"L": [{"S": "o"}, {"N": "1"}]} in item["d"]["L"]
    sent: list[str] = []
    provider.client.meta.events.register(
        "before-send.dynamodb.*", lambda event_name, **_: sent.append(event_name.split(".")[-1])
    )
    again = provider.acquire_or_enqueue(KEY, sig("o"), TTL)
    assert (again.acquired, again.owner, again.attempts) == (True, "o", 1)
    assert sent == ["UpdateItem", "UpdateItem"]
    assert provider.take_signals(KEY, "o", 1, token=again.token) == []
    sent.clear()
    assert provider.transfer_to_next(KEY, "o", TTL, token=again.token) is None  # succeeded
    fresh = provider.acquire_or_enqueue(KEY, sig("s1", 1), TTL)
    assert (fresh.acquired, fresh.attempts) == (True, 0)
    assert sent == ["UpdateItem", "UpdateItem"]
    assert provider.acquire_or_enqueue(KEY, sig("o"), TTL).acquired is False  # [Q5] done


def test_a_lost_resumed_grant_reply_resent_after_an_append_is_the_grant(make: Make) -> None:
    owner_side, forwarder = make(), make()
    first = owner_side.acquire_or_enqueue(KEY, sig("o"), TTL)
    owner_side.transfer_to_next(KEY, "o", TTL, token=first.token, error="x", requeue_owner=False)
    queued: list[LeaseResult] = []
    LostReply(
        owner_side,
        "UpdateItem",
        lambda: queued.append(forwarder.acquire_or_enqueue(KEY, sig("s2", 2), TTL)),
        RESUMED,
    )
    result = owner_side.acquire_or_enqueue(KEY, sig("o"), TTL)
    assert (result.acquired, result.owner, result.attempts) == (True, "o", 1)
    assert (queued[0].owner, queued[0].position) == ("o", 1)
    assert_nothing_lost(owner_side, "o", "s2")
    assert model_lost_reply(
        lambda p: p.transfer_to_next(
            KEY,
            "o",
            TTL,
            token=p.acquire_or_enqueue(KEY, sig("o"), TTL).token,
            error="x",
            requeue_owner=False,
        ),
        lambda p, _: p.acquire_or_enqueue(KEY, sig("o"), TTL),
        lambda p, _: p.acquire_or_enqueue(KEY, sig("s2", 2), TTL),
    ) == seen_on(None, queued[0], result)
    assert run_chain(owner_side, "o", result.token) == ["o", "s2"]


def test_a_forgotten_failed_entry_resumes_nothing(make: Make, clock: Clock) -> None:
    """[G2] past the dedupe window the failed entry (and its tag) is forgotten: the retry
    starts from 0, and the stale tag is removed so the blind writes work again."""
    provider = make()
    steps: list[Step] = [
        forward("o"),
        fail_own("o"),
        lambda p, advance, _: advance(DEDUPE_WINDOW_MS + 1),
        forward("o"),  # [Q1] attempts 0
    ]
    replies = same_as_model(provider, clock, steps)
    assert replies[3][1:3] == (True, "o") and replies[3][6] == 0
    assert {"B": b"o"} not in lease_item(provider)["d"]["L"]
