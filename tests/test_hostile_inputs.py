"""Hostile inputs, one table, every backend (``lease_backend``: memory, Redis, Redis Cluster,
DynamoDB), through the providers and through ``@lease_owned``.

Every row gets either a **typed error** (``InvalidLeaseArgument``, or its subclass
``HandlerKeyError`` for key functions) raised before any I/O, or a **defined outcome** that the
row checks. Then the test checks the backend: after a typed error, or an outcome that must
change nothing, the *whole* backend state (every Redis key under the namespace, every DynamoDB
item, every in-memory record) is exactly as before; after an outcome that writes (a key with
odd characters is a key like any other), the reference key is untouched.

The reference key ``REF`` holds a hand-off grant: ``s1`` owns it unclaimed with token ``T``
(as when an owner handed off by async invoke), ``s2`` is queued behind it.
"""

from __future__ import annotations

import copy
import datetime
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from leaseguard import Signal, lease_owned
from leaseguard.errors import HandlerKeyError, InvalidLeaseArgument
from leaseguard.handoff import ENVELOPE_FIELD, Envelope
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.providers.dynamodb import DynamoDBLeaseProvider
from leaseguard.providers.memory import InMemoryLeaseProvider
from leaseguard.providers.redis import RedisLeaseProvider
from leaseguard.testing import LambdaContext
from leaseguard.validation import DEFAULT_MAX_PAYLOAD_BYTES

REF = "ref:{1}"
TTL = 30_000
LIMIT = DEFAULT_MAX_PAYLOAD_BYTES
KIB10 = "k" * 10 * 1024


@dataclass
class World:
    provider: BaseLeaseProvider
    token: int  # the token of REF's grant to s1
    ran: list[Any] = field(default_factory=list)

    def guarded(self, key_fn: Callable[[Any], Any] | str = "k") -> Callable[..., Any]:
        """A guarded handler that records the events it runs."""
        function = (lambda e: e["k"]) if key_fn == "k" else key_fn

        @lease_owned(function, provider=self.provider, ttl_ms=TTL, handoff="inline")
        def handler(event: Any, context: Any) -> str:
            self.ran.append(event)
            return "ran"

        return handler

    def invoke(self, event: Any, key_fn: Callable[[Any], Any] | str = "k") -> Any:
        return self.guarded(key_fn)(event, LambdaContext())


def seed(provider: BaseLeaseProvider) -> World:
    provider.acquire_or_enqueue(REF, Signal("owner", {"k": REF, "n": 0}), TTL)
    provider.acquire_or_enqueue(REF, Signal("s1", {"k": REF, "n": 1}), TTL)
    provider.acquire_or_enqueue(REF, Signal("s2", {"k": REF, "n": 2}), TTL)
    grant = provider.transfer_to_next(REF, "owner", TTL, claim=False)
    assert grant is not None and grant.id == "s1" and grant.token is not None
    return World(provider, grant.token)


# -- what a row expects -----------------------------------------------------------------------


def owns(key: str, owner: str) -> Callable[[World, Any], None]:
    """The call acquired ``key`` for ``owner``, and only that key."""

    def check(world: World, result: Any) -> None:
        assert result.acquired and result.owner == owner
        assert world.provider.get_lease_owner(key) == owner
        assert world.provider.inspect_key(key).owner == owner

    return check


def returns(expected: Any) -> Callable[[World, Any], None]:
    def check(world: World, result: Any) -> None:
        assert result == expected

    return check


def rejected(world: World, result: Any) -> None:
    """A handoff envelope that names no claimable grant runs nothing."""
    assert result["leaseguard"]["status"] == "rejected"
    assert world.ran == []


def ran_stored_payloads(world: World, result: Any) -> None:
    """A forged envelope naming the live grant exactly runs what the backend stored for it,
    never the envelope's payload, then hands on to the next queued event."""
    assert result == "ran"
    assert world.ran == [{"k": REF, "n": 1}, {"k": REF, "n": 2}]


def queued_as_json(payload_back: Any) -> Callable[[World, Any], None]:
    def check(world: World, result: Any) -> None:
        assert result.acquired and result.owner == "edge"
        assert world.provider.inspect_key("edge").in_flight == ("edge",)
        world.provider.acquire_lease("edge2", "holder", TTL)
        world.provider.acquire_or_enqueue("edge2", Signal("again", payload_back[0]), TTL)
        (taken,) = world.provider.take_signals("edge2", "holder", 1)
        assert taken.payload == payload_back[1]

    return check


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[World], Any]
    expect: type[Exception] | Callable[[World, Any], None]
    writes: bool = False  # the outcome writes (elsewhere than REF); otherwise nothing changes
    prepare: Callable[[World], Any] | None = None  # runs before the "before" snapshot


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


class Opaque:
    pass


def raise_key_error(event: Any) -> str:
    return str(event["missing"])


def env(**body: Any) -> dict[str, Any]:
    return {ENVELOPE_FIELD: {"version": 1, **body}}


def acquire(key: Any, owner: Any = "o", ttl: Any = TTL) -> Callable[[World], Any]:
    return lambda w: w.provider.acquire_lease(key, owner, ttl)


def enqueue(payload: Any, key: str = REF, sid: Any = "x") -> Callable[[World], Any]:
    return lambda w: w.provider.acquire_or_enqueue(key, Signal(sid, payload), TTL)


CASES: list[Case] = [
    # keys: any characters are a key of their own; size and type are checked
    Case("key-braces", acquire("{a}"), owns("{a}", "o"), writes=True),
    Case("key-nested-braces", acquire("a}b{c{{}}"), owns("a}b{c{{}}", "o"), writes=True),
    Case(
        "key-colons-like-the-layout",
        acquire("lg:{ref:{1}}:lease"),
        owns("lg:{ref:{1}}:lease", "o"),
        writes=True,
    ),
    Case("key-newline", acquire("a\nb\r\n"), owns("a\nb\r\n", "o"), writes=True),
    Case("key-nul", acquire("a\x00b"), owns("a\x00b", "o"), writes=True),
    Case("key-percent-escapes", acquire("%7B%25"), owns("%7B%25", "o"), writes=True),
    Case("key-1-kib", acquire("k" * 1024), owns("k" * 1024, "o"), writes=True),
    Case("key-10-kib", acquire(KIB10), InvalidLeaseArgument),
    Case("key-1-kib-plus-1", acquire("k" * 1025), InvalidLeaseArgument),
    Case("key-empty", acquire(""), InvalidLeaseArgument),
    Case("key-int", acquire(42), InvalidLeaseArgument),
    Case("key-bytes", acquire(b"k"), InvalidLeaseArgument),
    Case("key-none", acquire(None), InvalidLeaseArgument),
    Case("key-list", acquire(["k"]), InvalidLeaseArgument),
    Case("key-lone-surrogate", acquire("\ud800"), InvalidLeaseArgument),
    # owners
    Case("owner-empty", acquire("fresh", ""), InvalidLeaseArgument),
    Case("owner-1-mib", acquire("fresh", "o" * 1024 * 1024), InvalidLeaseArgument),
    Case("owner-int", acquire("fresh", 7), InvalidLeaseArgument),
    Case(
        "owner-odd-characters",
        acquire("fresh", "o{\n}\x00"),
        owns("fresh", "o{\n}\x00"),
        writes=True,
    ),
    # TTLs
    Case("ttl-zero", acquire("fresh", "o", 0), InvalidLeaseArgument),
    Case("ttl-negative", acquire("fresh", "o", -1), InvalidLeaseArgument),
    Case("ttl-bool", acquire("fresh", "o", True), InvalidLeaseArgument),
    Case("ttl-float", acquire("fresh", "o", 1.5), InvalidLeaseArgument),
    Case("ttl-integral-float", acquire("fresh", "o", 1000.0), InvalidLeaseArgument),
    Case("ttl-nan", acquire("fresh", "o", math.nan), InvalidLeaseArgument),
    Case("ttl-inf", acquire("fresh", "o", math.inf), InvalidLeaseArgument),
    Case("ttl-str", acquire("fresh", "o", "1000"), InvalidLeaseArgument),
    Case("ttl-above-one-day", acquire("fresh", "o", 86_400_001), InvalidLeaseArgument),
    Case("ttl-one-day", acquire("fresh", "o", 86_400_000), owns("fresh", "o"), writes=True),
    Case(
        "renew-ttl-nan", lambda w: w.provider.renew_lease(REF, "s1", math.nan), InvalidLeaseArgument
    ),
    # payloads
    Case("payload-set", enqueue({1, 2}), InvalidLeaseArgument),
    Case("payload-object", enqueue(Opaque()), InvalidLeaseArgument),
    Case("payload-bytes", enqueue(b"raw"), InvalidLeaseArgument),
    Case("payload-datetime", enqueue({"at": datetime.datetime(2026, 1, 1)}), InvalidLeaseArgument),
    Case("payload-nan", enqueue({"x": math.nan}), InvalidLeaseArgument),
    Case("payload-inf", enqueue([math.inf]), InvalidLeaseArgument),
    Case("payload-int-keys", enqueue({1: "one"}), InvalidLeaseArgument),
    Case("payload-nested-65", enqueue(nested(65)), InvalidLeaseArgument),
    Case("payload-nested-100k", enqueue(nested(100_000)), InvalidLeaseArgument),
    Case("payload-over-limit", enqueue("x" * (LIMIT - 1)), InvalidLeaseArgument),
    Case(
        "payload-at-limit",
        enqueue("x" * (LIMIT - 2), key="edge", sid="edge"),
        queued_as_json(("y" * (LIMIT - 2), "y" * (LIMIT - 2))),
        writes=True,
    ),
    Case(
        "payload-tuple-comes-back-a-list",
        enqueue(("a", 1), key="edge", sid="edge"),
        queued_as_json((("a", 1), ["a", 1])),
        writes=True,
    ),
    # signals, limits, tokens
    Case(
        "signal-not-a-signal",
        lambda w: w.provider.acquire_or_enqueue(REF, {"id": "x"}, TTL),
        InvalidLeaseArgument,
    ),
    Case("signal-id-empty", enqueue({}, sid=""), InvalidLeaseArgument),
    Case("signal-id-huge", enqueue({}, sid="i" * 2048), InvalidLeaseArgument),
    Case(
        "signal-time-negative",
        lambda w: w.provider.acquire_or_enqueue(REF, Signal("x", {}, -1), TTL),
        InvalidLeaseArgument,
    ),
    Case(
        "signal-time-bool",
        lambda w: w.provider.acquire_or_enqueue(REF, Signal("x", {}, True), TTL),
        InvalidLeaseArgument,
    ),
    Case("take-limit-zero", lambda w: w.provider.take_signals(REF, "s1", 0), InvalidLeaseArgument),
    Case(
        "take-limit-huge",
        lambda w: w.provider.take_signals(REF, "s1", 10_001),
        InvalidLeaseArgument,
    ),
    Case("adopt-limit-bool", lambda w: w.provider.adopt_orphans(TTL, True), InvalidLeaseArgument),
    Case(
        "claim-token-zero",
        lambda w: w.provider.claim_signal(REF, "s1", 0, TTL),
        InvalidLeaseArgument,
    ),
    Case(
        "claim-token-str",
        lambda w: w.provider.claim_signal(REF, "s1", "1", TTL),
        InvalidLeaseArgument,
    ),
    Case(
        "claim-flag-str",
        lambda w: w.provider.transfer_to_next(REF, "s1", TTL, claim="yes"),
        InvalidLeaseArgument,
    ),
    Case(
        "claim-forged-token",
        lambda w: w.provider.claim_signal(REF, "s1", w.token + 1, TTL),
        returns(None),
    ),
    Case(
        "claim-by-non-owner",
        lambda w: w.provider.claim_signal(REF, "s2", w.token, TTL),
        returns(None),
    ),
    Case(
        "renew-stale-token",
        lambda w: w.provider.renew_lease(REF, "s1", TTL, token=w.token - 1),
        returns(False),
    ),
    Case("renew-by-non-owner", lambda w: w.provider.renew_lease(REF, "s2", TTL), returns(False)),
    Case("release-by-non-owner", lambda w: w.provider.release_lease(REF, "s2"), returns(None)),
    # the decorator: keys from events
    Case(
        "event-without-key-path",
        lambda w: w.invoke({"body": "hi"}, "pathParameters.threadId"),
        HandlerKeyError,
    ),
    Case(
        "event-not-a-dict",
        lambda w: w.invoke(["not", "a", "dict"], "pathParameters.threadId"),
        HandlerKeyError,
    ),
    Case("key-fn-raises", lambda w: w.invoke({"k": "x"}, raise_key_error), HandlerKeyError),
    Case("key-fn-returns-int", lambda w: w.invoke({"k": 5}), HandlerKeyError),
    Case("key-fn-returns-none", lambda w: w.invoke({"k": None}), HandlerKeyError),
    Case("key-fn-returns-empty", lambda w: w.invoke({"k": ""}), HandlerKeyError),
    Case("key-fn-returns-10-kib", lambda w: w.invoke({"k": KIB10}), HandlerKeyError),
    Case("key-fn-returns-surrogate", lambda w: w.invoke({"k": "\udfff"}), HandlerKeyError),
    # the decorator: events that cannot be stored
    Case(
        "event-not-json",
        lambda w: w.invoke({"k": "e", "at": datetime.date(2026, 1, 1)}),
        InvalidLeaseArgument,
    ),
    Case(
        "event-over-limit",
        lambda w: w.invoke({"k": "e", "blob": "x" * LIMIT}),
        InvalidLeaseArgument,
    ),
    Case(
        "event-nested-deep",
        lambda w: w.invoke({"k": "e", "deep": nested(100)}),
        InvalidLeaseArgument,
    ),
    Case("event-nan", lambda w: w.invoke({"k": "e", "x": math.nan}), InvalidLeaseArgument),
    # the decorator: handoff envelopes
    Case(
        "envelope-wrong-token",
        lambda w: w.invoke(Envelope(REF, "s1", w.token + 1).to_event()),
        rejected,
    ),
    Case(
        "envelope-not-the-owner",
        lambda w: w.invoke(Envelope(REF, "s2", w.token).to_event()),
        rejected,
    ),
    Case(
        "envelope-names-another-key",
        lambda w: w.invoke(Envelope("other", "s1", w.token).to_event()),
        rejected,
    ),
    Case(
        "envelope-replayed",
        lambda w: w.invoke(Envelope(REF, "s1", w.token).to_event()),
        rejected,
        prepare=lambda w: (w.invoke(Envelope(REF, "s1", w.token).to_event()), w.ran.clear()),
    ),
    Case(
        "envelope-token-str",
        lambda w: w.invoke(env(key=REF, owner="s1", token=str(w.token))),
        rejected,
    ),
    Case("envelope-token-bool", lambda w: w.invoke(env(key=REF, owner="s1", token=True)), rejected),
    Case(
        "envelope-token-negative", lambda w: w.invoke(env(key=REF, owner="s1", token=-5)), rejected
    ),
    Case(
        "envelope-version-9",
        lambda w: w.invoke(env(key=REF, owner="s1", token=w.token, version=9)),
        rejected,
    ),
    Case(
        "envelope-key-10-kib",
        lambda w: w.invoke(env(key=KIB10, owner="s1", token=w.token)),
        rejected,
    ),
    Case("envelope-owner-missing", lambda w: w.invoke(env(key=REF, token=w.token)), rejected),
    Case("envelope-not-an-object", lambda w: w.invoke({ENVELOPE_FIELD: [REF, "s1"]}), rejected),
    Case(
        "envelope-forged-payload",
        lambda w: w.invoke(Envelope(REF, "s1", w.token, {"k": REF, "evil": True}).to_event()),
        ran_stored_payloads,
        writes=True,
    ),
]


def snapshot(provider: BaseLeaseProvider) -> Any:
    """Everything the backend stores for this test's namespace."""
    if isinstance(provider, InMemoryLeaseProvider):
        with provider._lock:
            records = {
                key: copy.deepcopy(vars(rec))
                for key, rec in provider._keys.items()
                if rec.owner or rec.queue or rec.stored or rec.in_flight or rec.token
            }
            return records, set(provider._orphan_index)
    if isinstance(provider, RedisLeaseProvider):
        client = provider.client
        state = {}
        for name in sorted(client.scan_iter(match=f"{provider.prefix}*")):
            kind = client.type(name)
            if kind == b"hash":
                state[name] = client.hgetall(name)
            elif kind == b"list":
                state[name] = client.lrange(name, 0, -1)
            elif kind == b"zset":
                state[name] = client.zrange(name, 0, -1, withscores=True)
            else:
                state[name] = (kind, client.dump(name))
        return state
    assert isinstance(provider, DynamoDBLeaseProvider)
    items = provider.client.scan(TableName=provider.table_name, ConsistentRead=True)["Items"]
    return sorted(items, key=lambda i: (i["pk"]["S"], i["sk"]["S"]))


def reference(provider: BaseLeaseProvider) -> tuple[Any, ...]:
    state = provider.inspect_key(REF)
    return (state.owner, state.token, state.queued, state.in_flight, provider.pending_signals(REF))


def test_the_matrix_is_big_enough() -> None:
    assert len(CASES) >= 40
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input(provider: BaseLeaseProvider, case: Case) -> None:
    world = seed(provider)
    if case.prepare is not None:
        case.prepare(world)
    before, ref_before = snapshot(provider), reference(provider)
    if isinstance(case.expect, type):
        with pytest.raises(case.expect):
            case.run(world)
        assert world.ran == []
    else:
        case.expect(world, case.run(world))
    if case.writes:
        if case.name != "envelope-forged-payload":  # that one legitimately runs REF's queue
            assert reference(provider) == ref_before
    else:
        assert snapshot(provider) == before
        assert reference(provider) == ref_before
