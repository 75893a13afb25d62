"""Differential testing of a backend against the protocol model (leaseguard/protocol/model.py).

A *sequence* is a list of :class:`Op` drawn at random from a seed, applied step by step to the
model (an :class:`~leaseguard.providers.memory.InMemoryLeaseProvider` on a clock the harness
moves) and to one backend, in lockstep. After every step the replies, and the
:class:`~leaseguard.signals.KeyState` of the key the step named (of every key after
``adopt_orphans`` and at the end), must be equal once normalised: fencing tokens by rank (the
order in which each side first showed them, per key), ``remaining_ms`` as live or not,
exceptions by type. The first difference ends the sequence and is returned as a
:class:`Disagreement`, which prints the seed and the ops so it can be replayed::

    from tests.differential import Op, T, replay, redis_side
    replay([Op("acquire_or_enqueue", "k0", id="s1", v=3), Op("expire", "k0"), ...],
           redis_side(redis.Redis.from_url(url)))   # -> [] or [Disagreement]

Ops are abstract where sides differ: a token is ``T(rank)`` (``T(-1)``: one never issued) and
is turned into each side's own token value. A *resend* (``resend=True``) is one call whose reply
was lost and which the client sent again; each side reproduces it at the level where it
happens: the model (and memory) run the public call twice with the same nonces
(``new_nonce``), Redis sends every script command (EVALSHA) twice, DynamoDB sends every
write request (botocore ``_make_api_call``) twice; the second reply is the one compared.
A *late resend* (``Op.late(earlier)``, drawn with chance ``LATE_P`` a step) is an earlier step
that wrote sent again after other steps, with the nonces it drew then (each side records the
nonces its provider drew per step, by the step's repr): a request that arrives again after
its client gave up on it. Memory and Redis make them; DynamoDB does not (``Side.late_resends``).
On DynamoDB a step is several requests, so its late arrival is one of them: a *late request*
(``Op.late_request(key, step, n)``, chance ``LATE_P``) applies one recorded ``UpdateItem`` of
an earlier step (by its index in the sequence) again, exactly as sent. The model does nothing
for it if DynamoDB refused it, and runs a late resend of that step if DynamoDB applied it (a
late request may act as its call, as a late resend does); either way the states must agree,
and the owner's deadline must not move back (see :meth:`Side.deliver_late`).
``expire`` makes the key's current lease run out (see :func:`expire`).
On a side whose storage bounds a queue by size (DynamoDB's item limit, judged at
``SCALED_ROOM``), a forward runs on the backend first and the model's step is given the room the
backend judged (:class:`RoomJudge`); a refused forward must leave the key's items as they were.
"""

from __future__ import annotations

import contextlib
import copy
import random
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from leaseguard.contract import LeaseResult
from leaseguard.errors import InvalidLeaseArgument, LeaseLostError, QueueFull
from leaseguard.providers import memory as memory_module
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.providers.memory import InMemoryLeaseProvider
from leaseguard.signals import DeadLetter, KeyState, Signal

TTL = 60_000  # long: nothing expires unless an "expire" step says so
KEYS = ("k0", "k1")
IDS = tuple(f"s{i}" for i in range(6))
WORKERS = ("w0", "w1")  # plain lease owners (acquire_lease), next to signal ids
MODEL_EPOCH_MS = 1_700_000_000_000
FORGED_TOKEN = 1  # below every token a backend issues
# DynamoDB's clock_skew_ms in the suite: a takeover there waits until ``e + skew < now``, so
# ``expire`` jumps past the deadline by more than this (the model's own expiry needs nothing).
DYNAMODB_SKEW_MS = 750


class T(NamedTuple):
    """A token by rank on its key: T(0) is the first token the side showed; T(-1) is forged."""

    rank: int

    def __repr__(self) -> str:
        return f"T({self.rank})"


class Op:
    """One step: a public call (``name``) on ``key`` with abstract arguments, or ``expire``.
    ``late_of``: this step is a *late resend* of that earlier step (its request, with the nonces
    it drew then, arriving again after other steps: a client that gave up, a slow network)."""

    def __init__(
        self, name: str, key: str, *, resend: bool = False, late_of: Op | None = None, **kw: Any
    ) -> None:
        self.name, self.key, self.resend, self.late_of, self.kw = name, key, resend, late_of, kw

    @staticmethod
    def late(of: Op) -> Op:
        return Op(of.name, of.key, late_of=of, **of.kw)

    @staticmethod
    def late_request(key: str, step: int, n: int) -> Op:
        """One of the UpdateItem requests that step ``step`` of the sequence (on ``key``)
        sent: the ``n``-th, modulo their number."""
        return Op("late_request", key, step=step, n=n)

    def __repr__(self) -> str:
        if self.late_of is not None:
            return f"Op.late({self.late_of!r})"
        args = [repr(self.name), repr(self.key)]
        args += [f"{k}={v!r}" for k, v in self.kw.items()]
        return f"Op({', '.join(args + (['resend=True'] if self.resend else []))})"


class Clock:
    """Milliseconds that stand still until moved."""

    def __init__(self, start: int) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now


# -- sides: a provider, how it resends, how time passes, and its token ranks -------------------


@dataclass
class Side:
    name: str
    provider: BaseLeaseProvider
    advance: Callable[[int], None]  # let this many ms pass
    # Redis and DynamoDB resend the request itself (an object with a ``twice`` flag); memory
    # replays a call with the nonces its first run drew from ``nonce_module``.
    resend_hook: Any = None
    nonce_module: Any = memory_module
    ttl: int = TTL  # the TTL of every call (the clock sides need not share the wall's)
    jump_ms: int = 0  # expire by moving the clock this far (0: renew for 1 ms, wait 2 ms)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    anomalies: list[str] = field(default_factory=list)
    # What the side stores for a key that it should not, given the model's state of the key
    # (None: the side's storage is not checked). See :func:`redis_storage`.
    storage: Callable[[str, KeyState], list[str]] | None = None
    # Whether a late resend can be made here: the step's request sent again with the nonces
    # ``nonce_module.new_nonce`` drew for it, recorded per step (by its repr, the last one).
    # Not on DynamoDB: a step there is several requests (with version nonces drawn the same
    # way), so running the call again makes requests no client sends; what arrives late there
    # is one recorded request (``late_requests`` below).
    late_resends: bool = True
    nonces: dict[str, list[str]] = field(default_factory=dict)
    # Whether late requests can be made here (DynamoDB): each step's UpdateItem requests are
    # recorded by ``resend_hook`` (its ``recorded`` list), one list per step, in order.
    late_requests: bool = False
    requests: list[list[dict[str, Any]]] = field(default_factory=list)
    # Whether the side's storage bounds a key's queue by size (DynamoDB's item limit): a
    # RoomJudge that records the room each forward judged, for the model's step.
    room: RoomJudge | None = None

    def rank(self, key: str, token: int | None) -> int | None:
        if token is None:
            return None
        seen = self.tokens.setdefault(key, [])
        if token not in seen:
            if seen and token < max(seen):
                self.anomalies.append(f"{key}: token {token} issued after {max(seen)}")
            seen.append(token)
        return seen.index(token)

    def value(self, key: str, ref: T | None) -> int | None:
        if ref is None:
            return None
        seen = self.tokens.get(key, [])
        return seen[ref.rank] if 0 <= ref.rank < len(seen) else FORGED_TOKEN

    def call(self, fn: Callable[[], Any], op: Op) -> tuple[str, Any]:
        """``fn`` for ``op``: once; twice for a resend (by the side's hook, or by the model
        running it again with the nonces it drew); or, for a late resend, once with the nonces
        the earlier step drew. The nonces a step draws are kept for its late resends."""
        if self.room is None:
            return self._call_recorded(fn, op)
        with self.room.judging():
            return self._call_recorded(fn, op)

    def _call_recorded(self, fn: Callable[[], Any], op: Op) -> tuple[str, Any]:
        if op.late_of is not None:
            with _nonces(self.nonce_module, self.nonces.get(repr(op.late_of), [])):
                return _capture(fn)
        self.requests.append([])
        if self.late_requests and op.name != "late_request":
            self.resend_hook.recorded = self.requests[-1]
        try:
            return self._call(fn, op)
        finally:
            if self.late_requests:
                self.resend_hook.recorded = None

    def _call(self, fn: Callable[[], Any], op: Op) -> tuple[str, Any]:
        made = self.nonces[repr(op)] = []
        if op.resend and self.resend_hook is not None:  # the side sends the request twice
            self.resend_hook.twice = True
            try:
                with _nonces(self.nonce_module, [], made):
                    return _capture(fn)
            finally:
                self.resend_hook.twice = False
        with _nonces(self.nonce_module, [], made):
            outcome = _capture(fn)
        if not op.resend:
            return outcome
        with _nonces(self.nonce_module, made):  # the first reply was the lost one
            return _capture(fn)

    def deliver_late(self, op: Op) -> tuple[bool, str | None]:
        """A late request: one recorded UpdateItem of step ``op.kw["step"]`` applied again.
        Whether DynamoDB applied it, and what went wrong if it moved the deadline of the key's
        owner back (an owner that stayed: a new owner shows in the state comparison)."""
        sent = self.requests[op.kw["step"]] if self.late_requests else None
        if not sent:
            return False, None
        params = sent[op.kw["n"] % len(sent)]
        before = self.provider.inspect_key(op.key)
        try:
            self.resend_hook.send("UpdateItem", copy.deepcopy(params))
        except self.resend_hook.error as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return False, None
        after = self.provider.inspect_key(op.key)
        stayed = before.owner is not None and (after.owner, after.token) == (
            before.owner,
            before.token,
        )
        if stayed and (after.remaining_ms or 0) < (before.remaining_ms or 0):
            return True, f"deadline moved back {before.remaining_ms} -> {after.remaining_ms} ms"
        return True, None


@contextlib.contextmanager
def _nonces(module: Any, replay: list[str], made: list[str] | None = None) -> Iterator[None]:
    """While inside, ``module.new_nonce`` hands out ``replay`` first, then fresh nonces, and
    appends each to ``made``."""
    original, again = module.new_nonce, iter(list(replay))

    def nonce() -> str:
        value = next(again, None) or original()
        if made is not None:
            made.append(value)
        return value

    module.new_nonce = nonce
    try:
        yield
    finally:
        module.new_nonce = original


def _capture(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return ("ok", fn())
    except QueueFull as exc:  # by its size (``why``) or by max_queue
        return ("raise", ("QueueFull", exc.depth, exc.limit, exc.holder, exc.why is not None))
    except (LeaseLostError, InvalidLeaseArgument) as exc:
        return ("raise", type(exc).__name__)
    except Exception as exc:  # a crash is a disagreement, reported with its text
        return ("crash", f"{type(exc).__name__}: {exc}"[:300])


# Every side keeps at most this many dead letters per key (row G6), so sequences reach the
# bound and the backends are compared with the model past it (a signal kept on a halted key).
DEAD_LIMIT = 1


def model_side(name: str = "model", **options: Any) -> Side:
    clock = Clock(MODEL_EPOCH_MS)
    options.setdefault("max_payload_bytes", MAX_PAYLOAD_BYTES)
    if "model" in options:
        options["model"].dead_limit = DEAD_LIMIT
    options.setdefault("dead_limit", DEAD_LIMIT)
    provider = InMemoryLeaseProvider(clock=clock, **options)
    return Side(name, provider, lambda ms: setattr(clock, "now", clock.now + ms))


class ResendingRedis:
    """Wraps what a Redis provider sends its scripts with (``provider.execute``): while
    ``twice`` is set every script command is sent twice (a reply lost after Redis ran it, then
    the resend of the very same command)."""

    def __init__(self, execute: Callable[..., Any]) -> None:
        self._execute, self.twice = execute, False

    def __call__(self, *args: Any, **options: Any) -> Any:
        if self.twice and args and str(args[0]).upper() == "EVALSHA":
            self._execute(*args, **options)
        return self._execute(*args, **options)


def redis_side(client: Any, name: str = "redis") -> Side:
    from leaseguard.providers.redis import RedisLeaseProvider
    from leaseguard.providers.redis import provider as redis_provider_module

    provider = RedisLeaseProvider(
        client,
        prefix=f"d{uuid.uuid4().hex[:10]}:",
        max_payload_bytes=MAX_PAYLOAD_BYTES,
        dead_limit=DEAD_LIMIT,
    )
    hook = ResendingRedis(provider.execute)
    provider.execute = hook
    return Side(
        name,
        provider,
        lambda ms: time.sleep((ms + 1) / 1000),
        hook,
        nonce_module=redis_provider_module,
        storage=lambda key, want: redis_storage(provider, client, key, want),
    )


# The scripts' KEYS, in order (leaseguard/providers/lua/_prelude.lua).
REDIS_KEY_ROLES = (
    "lease", "queue", "signals", "inflight", "index", "done", "donetok", "attempts", "dead",
    "state", "deadindex",
)  # fmt: skip
# Kept for as long as the key's state needs them, however long that is: queued and in-flight
# work (with its attempts and the grant token in flight), dead letters and the halt flag.
REDIS_UNBOUNDED = frozenset({"queue", "signals", "inflight", "attempts", "dead", "state"})


# For each of a key's Redis keys in REDIS_KEY_ROLES order: its PTTL, or for the two indexes
# the user key's score there ('' for none); then the fields of signals and of attempts.
_STORAGE_PROBE = """
local out = {}
for i = 1, #KEYS do
  if i == 5 or i == 11 then
    out[i] = redis.call('ZSCORE', KEYS[i], ARGV[1]) or ''
  else
    out[i] = redis.call('PTTL', KEYS[i])
  end
end
out[#KEYS + 1] = redis.call('HKEYS', KEYS[3])
out[#KEYS + 2] = redis.call('HKEYS', KEYS[8])
return out
"""


def redis_storage(provider: Any, client: Any, key: str, want: KeyState) -> list[str]:
    """What Redis holds for ``key`` that it should not: a key that never expires, other than
    the work the model's state ``want`` still has (the lease, the done memory and their copies
    always expire), and index entries for a key with nothing pending."""
    keys = provider.redis_keys(key)
    if len(keys) != len(REDIS_KEY_ROLES):
        return [f"{len(keys)} Redis keys, the harness knows {len(REDIS_KEY_ROLES)}"]
    idle = not (want.owner or want.queued or want.in_flight or want.dead_letters or want.halted)
    # one script, not a pipeline: a Cluster client's pipeline of 13 commands after every step
    # cost more than the step itself
    replies = client.eval(_STORAGE_PROBE, len(keys), *keys, key)
    found = []
    for role, got in zip(REDIS_KEY_ROLES, replies[: len(REDIS_KEY_ROLES)], strict=True):
        if role in ("index", "deadindex"):
            if idle and got not in (b"", ""):  # "" from a client with decode_responses
                found.append(f"{role} lists {key!r}, which has nothing pending")
        elif got == -1 and (idle or role not in REDIS_UNBOUNDED):
            found.append(f"{role} of {key!r} never expires ({'idle' if idle else 'busy'} key)")
    # no garbage inside the unbounded keys either: only live signals are stored or counted
    live = {s.id for s in want.queued} | set(want.in_flight)
    for role, fields in zip(("signals", "attempts"), replies[len(REDIS_KEY_ROLES) :], strict=True):
        stale = sorted({f.decode() if isinstance(f, bytes) else f for f in fields} - live)
        if stale:
            found.append(f"{role} of {key!r} keeps {stale}, neither queued nor in flight")
    return found


# [Q8] by the lease item's size (docs/dynamodb.md, "The item limit") at the sizes a sequence
# reaches: the DynamoDB side judges a forward's room (schema.Lease.queue_bound) against these
# limits instead of 400 KB, 48 KB and 128 KB, so that a few queued inline payloads, a long
# dead letter or a grown done memory leave no room, while an idle key always has room for
# the largest inline forward. DynamoDB's own 400 KB limit still applies to every write
# (moto's, and the harness's item sizes in test_dynamodb_bounds.py).
SCALED_ROOM = {"ITEM_LIMIT_BYTES": 2_400, "ITEM_MARGIN_BYTES": 400, "DONE_RESERVE_BYTES": 800}


class RoomJudge:
    """While :meth:`judging`, ``Lease.queue_bound`` judges room at SCALED_ROOM and records
    the room it found below ``max_queue`` (the last one of the step: the snapshot the step
    decided on). The model's step is given that room (``InMemoryLeaseProvider.storage_room``),
    so that both answer the same forward by the same room, and every other part of the
    answer (which rows refuse, what is left stored, the payload item deleted) is compared."""

    def __init__(
        self, items: Callable[[str], list[dict[str, Any]]], limits: dict[str, int] = SCALED_ROOM
    ) -> None:
        self.items, self.limits = items, limits  # items: every item of a key, as stored
        self.judged: int | None = None
        self.refusals = 0  # forwards DynamoDB refused by the item's size, over the side's life

    @contextlib.contextmanager
    def judging(self) -> Iterator[None]:
        from unittest import mock

        from leaseguard.providers.dynamodb import schema

        original = schema.Lease.queue_bound
        self.judged = None

        def queue_bound(lease: Any, signal_id: str, ref: str, max_queue: int) -> int:
            with mock.patch.multiple(schema, **self.limits):
                bound: int = original(lease, signal_id, ref, max_queue)
            self.judged = bound if bound < max_queue else None
            return bound

        with mock.patch.object(schema.Lease, "queue_bound", queue_bound):
            yield


class ResendingDynamoDB:
    """Wraps a botocore client's ``_make_api_call``: while ``twice`` is set every write request
    is sent twice with the same parameters (botocore's retry after a lost reply); the first
    answer, error or not, is the lost one."""

    WRITES = frozenset({"UpdateItem", "PutItem", "DeleteItem", "BatchWriteItem"})

    def __init__(self, client: Any) -> None:
        from botocore.exceptions import ClientError

        self.send, self.error, self.twice = client._make_api_call, ClientError, False
        self.recorded: list[dict[str, Any]] | None = None  # UpdateItem requests, while set
        client._make_api_call = self

    def __call__(self, operation: str, params: dict[str, Any]) -> Any:
        if self.recorded is not None and operation == "UpdateItem":
            self.recorded.append(copy.deepcopy(params))
        if self.twice and operation in self.WRITES:
            with contextlib.suppress(self.error):
                self.send(operation, copy.deepcopy(params))
        return self.send(operation, params)


def dynamodb_side(table: str, client: Any, name: str = "dynamodb", **options: Any) -> Side:
    """A provider on ``table`` (created here) through ``client``, on a clock of its own."""
    from leaseguard.providers.dynamodb import DynamoDBLeaseProvider

    clock = Clock(time.time_ns() // 1_000_000)
    options.setdefault("orphan_shards", 2)  # adopt_orphans queries each shard: 8 is slow here
    options.setdefault("clock_skew_ms", DYNAMODB_SKEW_MS)
    options.setdefault("max_payload_bytes", MAX_PAYLOAD_BYTES)
    options.setdefault("dead_limit", DEAD_LIMIT)
    provider = DynamoDBLeaseProvider(table, client, clock=clock, **options)
    provider.create_table()
    hook = client._make_api_call
    if not isinstance(hook, ResendingDynamoDB):
        hook = ResendingDynamoDB(client)
    advance = lambda ms: setattr(clock, "now", clock.now + ms)  # noqa: E731
    # TTL 10 s, expiry by a jump past the deadline and the skew: 25 jumps stay inside the 300 s
    # dedupe window
    return Side(
        name,
        provider,
        advance,
        hook,
        ttl=10_000,
        jump_ms=10_002 + options["clock_skew_ms"],
        storage=lambda key, want: dynamodb_storage(table, client, key, want),
        late_resends=False,
        late_requests=True,
        room=RoomJudge(lambda key: dynamodb_items(table, client, key)),
    )


def _changed(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> str | None:
    """What differs between two listings of a key's items, by sort key, or None."""
    old, new = ({i["sk"]["S"]: i for i in items} for items in (before, after))
    added, gone = sorted(new.keys() - old.keys()), sorted(old.keys() - new.keys())
    rewritten = sorted(sk for sk in old.keys() & new.keys() if old[sk] != new[sk])
    if not (added or gone or rewritten):
        return None
    return f"items added {added}, deleted {gone}, rewritten {rewritten}"


def dynamodb_items(table: str, client: Any, key: str) -> list[dict[str, Any]]:
    """Every item of ``key`` (its lease item and payload items), as DynamoDB stores them."""
    pages = client.get_paginator("query").paginate(
        TableName=table,
        KeyConditionExpression="pk = :k",
        ExpressionAttributeValues={":k": {"S": key}},
        ConsistentRead=True,
    )
    return sorted((item for page in pages for item in page["Items"]), key=lambda i: i["sk"]["S"])


def dynamodb_storage(table: str, client: Any, key: str, want: KeyState) -> list[str]:
    """Items of ``key`` that DynamoDB's TTL would never delete (every item carries ``ttl``:
    a lease item from its first write, payload items while they are referenced and after), and
    index entries the model's state ``want`` rules out: the dead-letter index (``gd``) for a key
    with no dead letters. The orphan index is not checked: a key released through
    ``release_lease`` or ``transfer_lease`` may stay in it (those writes do not pin the queue),
    and so may a halted key that a forward queued on under a plain owner (docs/dynamodb.md);
    the sweeper's next visit removes such an entry ([D4]), so it costs a visit, not storage.
    ``test_dynamodb_protocol.py`` checks that a halting release takes the key out."""
    pages = client.get_paginator("query").paginate(
        TableName=table,
        KeyConditionExpression="pk = :k",
        ExpressionAttributeValues={":k": {"S": key}},
        ProjectionExpression="sk, #ttl, gp, gd",
        ExpressionAttributeNames={"#ttl": "ttl"},
    )
    found = []
    for page in pages:
        for item in page["Items"]:
            what = f"item {item['sk']['S']!r} of {key!r}"
            if "ttl" not in item:
                found.append(f"{what} has no ttl")
            if "gd" in item and not want.dead_letters:
                found.append(f"{what} is in the dead-letter index with no dead letter")
    return found


# -- normalising replies and states -------------------------------------------------------------


def norm(side: Side, key: str, value: Any) -> Any:
    if isinstance(value, LeaseResult):
        adopted = norm(side, key, value.adopted)
        return (
            "lease",
            value.acquired,
            value.owner,
            side.rank(key, value.token),
            value.position,
            adopted,
            value.attempts,
        )
    if isinstance(value, Signal):
        token = side.rank(key, value.token)
        return ("signal", value.id, value.payload, value.enqueued_at_ms, value.attempts, token)
    if isinstance(value, DeadLetter):
        return ("dead", value.id, value.payload, value.attempts, value.error)
    if isinstance(value, KeyState):
        token = side.rank(key, value.token)
        queued = tuple(norm(side, key, s) for s in value.queued)
        dead = tuple(norm(side, key, d) for d in value.dead_letters)
        return (
            "state",
            value.owner,
            token,
            value.remaining_ms is not None,
            queued,
            value.in_flight,
            dead,
            value.halted,
        )
    if isinstance(value, list):
        if value and isinstance(value[0], tuple):  # adopt_orphans: (key, signal) pairs
            return [(k, norm(side, k, s)) for k, s in sorted(value, key=lambda pair: pair[0])]
        return [norm(side, key, v) for v in value]
    return value


def apply(side: Side, op: Op) -> tuple[str, Any]:
    """Run ``op`` on ``side``: its normalised outcome."""
    p, k, kw, ttl = side.provider, op.key, op.kw, side.ttl
    owner, token = kw.get("owner", ""), side.value(k, kw.get("token"))
    calls: dict[str, Callable[[], Any]] = {
        "acquire_or_enqueue": lambda: p.acquire_or_enqueue(
            k,
            Signal(kw["id"], payload(kw), enqueued_at_ms=1_000 + kw["v"]),
            ttl,
            max_queue=kw.get("max_queue"),
        ),
        "take_signals": lambda: p.take_signals(
            k, owner, kw["limit"], token=token, completed=kw.get("completed", ())
        ),
        "transfer_to_next": lambda: p.transfer_to_next(
            k, owner, ttl, claim=kw["claim"], token=token, **kw.get("failure", {})
        ),
        "claim_signal": lambda: p.claim_signal(k, owner, token or FORGED_TOKEN, ttl),
        "renew_lease": lambda: p.renew_lease(k, owner, ttl, token=token),
        "release_lease": lambda: p.release_lease(k, owner),
        "acquire_lease": lambda: p.acquire_lease(k, owner, ttl),
        "transfer_lease": lambda: p.transfer_lease(k, owner, kw["to"], ttl),
        "adopt_orphans": lambda: p.adopt_orphans(ttl, kw.get("limit", 10), claim=kw["claim"]),
        "get_lease_owner": lambda: p.get_lease_owner(k),
        "pending_signals": lambda: p.pending_signals(k),
        "redrive": lambda: p.redrive(k, kw.get("ids")),
        "dead_letter_keys": lambda: sorted(p.dead_letter_keys(10)),
        "expire": lambda: expire(side, k),
        "tick": lambda: side.advance(kw["ms"]),
        "late_request": lambda: side.deliver_late(op),
    }
    kind, value = side.call(calls[op.name], op)
    return (kind, norm(side, k, value)) if kind == "ok" else (kind, value)


def expire(side: Side, key: str) -> bool | None:
    """The key's owner (if any) stops renewing and its lease runs out; other keys' owners live
    on. Each side renews its own current grant to 1 ms (the reply) and lets time pass. A side
    with ``jump_ms`` moves its clock past every deadline it indexed instead (DynamoDB indexes
    a grant's deadline; renewals do not move it), after renewing the other keys' owners past
    the jump."""
    p = side.provider
    held = p.inspect_key(key)
    if held.owner is None:
        return None
    if side.jump_ms:
        # A millisecond first: DynamoDB keeps the later of two deadlines sent in one
        # millisecond by the same grant (docs/dynamodb.md), and this clock stands still.
        side.advance(1)
        for other in set(side.tokens) - {key}:
            live = p.inspect_key(other)
            if live.owner is not None:
                p.renew_lease(other, live.owner, side.jump_ms + side.ttl, token=live.token)
    renewed = p.renew_lease(key, held.owner, 1, token=held.token)
    side.advance(side.jump_ms or 2)
    return renewed


def state(side: Side, key: str) -> tuple[str, Any]:
    kind, value = _capture(lambda: side.provider.inspect_key(key))
    return (kind, norm(side, key, value)) if kind == "ok" else (kind, value)


# -- drawing ops from the model's state ---------------------------------------------------------

WEIGHTS = {
    "acquire_or_enqueue": 24,
    "take_signals": 10,
    "transfer_to_next": 20,
    "claim_signal": 6,
    "renew_lease": 4,
    "release_lease": 5,
    "acquire_lease": 5,
    "transfer_lease": 4,
    "adopt_orphans": 5,
    "expire": 8,
    "get_lease_owner": 2,
    "pending_signals": 2,
    "redrive": 3,
    "dead_letter_keys": 1,
}
# On sides whose deadlines are the sender's clock (DynamoDB), a little time passes ("tick": 1,
# 7 or 250 ms, far inside every TTL): a late request then carries an older clock than the
# steps after it (DYNAMODB_WEIGHTS).
DYNAMODB_WEIGHTS = {**WEIGHTS, "tick": 8, "renew_lease": 12}
RESEND_P = 0.15
# A late resend (Op.late) of an earlier step that wrote, with this chance a step, on sides that
# can make one (not DynamoDB: see Side.late_resends).
LATE_P = 0.08
# Not adopt_orphans: it sends one request per candidate key, each with a nonce of its own, and
# which keys are candidates is each side's own (its index), so the nonces a step drew do not
# line up between sides; its per-key step is the grant that acquire_or_enqueue resends too.
LATE = frozenset(
    {"acquire_or_enqueue", "take_signals", "transfer_to_next", "claim_signal", "renew_lease",
     "release_lease", "acquire_lease", "transfer_lease", "redrive"}
)  # fmt: skip


# The steps whose UpdateItem requests a late request replays on DynamoDB: the decorator's
# (not release_lease, transfer_lease or acquire_lease, which name a plain owner, not a grant:
# a late copy of one acts on whatever lease that name holds then, as a late call would; the
# re-acquire's extension has its own regression in test_dynamodb_protocol.py).
LATE_REQUESTS = frozenset(
    {"acquire_or_enqueue", "take_signals", "transfer_to_next", "claim_signal", "renew_lease",
     "redrive"}
)  # fmt: skip


def late_request_of(op: Op) -> bool:
    """Whether a late request may replay one of ``op``'s requests. Not a renewal without a
    token: it names an owner, not a grant, so a late one reaches a later lease of the same
    owner name (docs/dynamodb.md, *Extensions apply in the order they were sent*)."""
    return op.name in LATE_REQUESTS and not (
        op.name == "renew_lease" and op.kw.get("token") is None
    )


def draw_op(
    rng: random.Random,
    model: Side,
    keys: Sequence[str],
    weights: dict[str, int],
    payloads: Callable[[random.Random], dict[str, Any]] | None = None,
) -> Op:
    """An op that mostly does something: owners and tokens mostly the model's current ones,
    sometimes a previous owner, an old token or a forged one."""
    assert isinstance(model.provider, InMemoryLeaseProvider)
    records = {k: model.provider.record(k) for k in keys}
    held = [k for k in keys if records[k].owner]
    key = rng.choice(held if held and rng.random() < 0.7 else keys)
    rec, seen = records[key], model.tokens.get(key, [])
    current = T(seen.index(rec.token)) if rec.owner and rec.token in seen else None
    name = rng.choices(list(weights), list(weights.values()))[0]
    if name == "expire" and current is None:
        name = "acquire_or_enqueue"
    if current is not None and not rec.claimed and rng.random() < 0.4:
        name = "claim_signal"  # a hand-off waits for its claim: mostly the right one

    def who() -> str:
        r = rng.random()
        if rec.owner and r < 0.8:
            return rec.owner
        if rec.prev and r < 0.85:
            return rec.prev
        return rng.choice(IDS + WORKERS)

    def grant(owner: str, none_p: float = 0.2) -> T | None:
        r = rng.random()
        if r < none_p:
            return None
        if current is not None and owner == rec.owner and r < 0.88:
            return current
        return T(rng.randrange(len(seen))) if seen and r < 0.95 else T(-1)

    resend = (
        name not in ("get_lease_owner", "pending_signals", "expire", "dead_letter_keys", "tick")
        and rng.random() < RESEND_P
    )
    if name == "acquire_or_enqueue":
        bound = {"max_queue": rng.choice((1, 2, 3))} if rng.random() < 0.3 else {}
        shape = (payloads or draw_payload)(rng)
        return Op(
            name, key, id=rng.choice(IDS), v=rng.randrange(100), resend=resend, **bound, **shape
        )
    if name == "redrive":
        dead = [d.id for d in rec.dead]
        if dead and rng.random() < 0.5:
            ids = tuple(rng.sample(dead, rng.randint(1, len(dead))))
            return Op(name, key, ids=ids, resend=resend)
        return Op(name, key, resend=resend)
    if name == "dead_letter_keys":
        return Op(name, key)
    if name == "adopt_orphans":
        # Limits from 1: with one key any limit is exact; with two, which orphan a limit of 1
        # adopts is each side's own order (its index), so two-key sequences draw 2 or 3.
        limit = rng.randint(1, 3) if len(keys) == 1 else rng.randint(2, 3)
        return Op(name, key, claim=rng.random() < 0.5, limit=limit, resend=resend)
    if name in ("get_lease_owner", "pending_signals"):
        return Op(name, key)
    if name == "expire":
        return Op(name, key)
    if name == "tick":
        return Op(name, key, ms=rng.choice((1, 7, 250)))
    owner = who()
    if name in ("release_lease", "acquire_lease"):
        return Op(
            name,
            key,
            owner=owner if name == "release_lease" else who_new(rng, rec.owner),
            resend=resend,
        )
    if name == "transfer_lease":
        to = rng.choice([o for o in IDS + WORKERS if o != owner])  # (to self: see the report)
        return Op(name, key, owner=owner, to=to, resend=resend)
    token = grant(owner, none_p=0.0 if name == "claim_signal" else 0.2)
    if name == "take_signals":
        reported: dict[str, Any] = {}
        if token is not None and rng.random() < 0.4:  # [K1] what ran since the last report
            ids = list(dict.fromkeys([*rec.in_flight, owner, rng.choice(IDS)]))
            rng.shuffle(ids)
            reported["completed"] = tuple(ids[: rng.randint(1, len(ids))])
        return Op(
            name,
            key,
            owner=owner,
            limit=rng.randint(1, len(rec.queue) + 1),
            token=token,
            resend=resend,
            **reported,
        )
    if name == "transfer_to_next":
        kw: dict[str, Any] = {"owner": owner, "claim": rng.random() < 0.6, "token": token}
        if rng.random() < 0.35:
            kw["failure"] = {
                "error": rng.choice(ERRORS),
                "requeue_owner": rng.random() < 0.6,
                "max_attempts": rng.choice((1, 2, 3)),
                "on_poison": "halt" if rng.random() < 0.3 else "skip",
            }
        if rng.random() < 0.3:  # [G8] a partial report of some in-flight ids (or others)
            ids = list(dict.fromkeys([*rec.in_flight, owner, rng.choice(IDS)]))
            rng.shuffle(ids)
            cut = rng.randint(0, len(ids))
            failed = ids[cut:][: rng.randint(0, 2)] if "failure" in kw else []
            kw.setdefault("failure", {})
            kw["failure"].update({"completed": tuple(ids[:cut]), "failed": tuple(failed)})
        return Op(name, key, resend=resend, **kw)
    return Op(name, key, owner=owner, token=token, resend=resend)


def who_new(rng: random.Random, holder: str | None) -> str:
    """acquire_lease's caller: mostly a plain worker, sometimes the holder again."""
    return holder if holder and rng.random() < 0.3 else rng.choice(WORKERS + IDS[:2])


# -- payloads: every storage form on DynamoDB ----------------------------------------------------


# A signal record is ``{"at":<ms>,"p":<payload>}``. On DynamoDB it goes inline on the lease item
# while the item stays within INLINE_ITEM_BYTES (a blind grant: record + key + 2 ids + 296 bytes
# reserved <= 1024, so about 720 bytes here), else on a payload item, split into items of
# ITEM_RECORD_BYTES when larger (schema.py). Shapes name a record size by its distance to those
# thresholds, so they stay right if the constants move; the text is multi-byte where a char
# is given, so a split can fall inside a character.
def _shapes() -> dict[str, tuple[int, str]]:
    from leaseguard.providers.dynamodb.schema import INLINE_ITEM_BYTES, ITEM_RECORD_BYTES

    inline = INLINE_ITEM_BYTES - 296 - 2 - 2 * 2  # grant_fits' edge for key "k0", ids "sN"
    return {
        "inline-2": (inline - 2, "a"),
        "inline": (inline, "é"),
        "inline+1": (inline + 1, "a"),
        "inline+40": (inline + 40, "☃"),
        "lease-item": (INLINE_ITEM_BYTES + 1, "a"),
        "item": (20_000, "ü"),
        "split-1": (ITEM_RECORD_BYTES - 1, "a"),
        "split": (ITEM_RECORD_BYTES, "é"),
        "split+1": (ITEM_RECORD_BYTES + 1, "a"),
        "split+30": (ITEM_RECORD_BYTES + 30, "💥"),
        "3-items": (2 * ITEM_RECORD_BYTES + 5, "€"),
        "too-large": (MAX_PAYLOAD_BYTES + 100, "a"),  # PayloadTooLarge on every side
    }


# Every side's max_payload_bytes: just above a 3-item split payload, so that PayloadTooLarge
# is reached without 6 MB payloads (the default).
MAX_PAYLOAD_BYTES = 850 * 1024
SHAPES = _shapes()
# How often each shape is drawn (the rest: the small ``{"v": n}``, or the nested one).
SHAPE_P = {"inline-2": 2, "inline": 3, "inline+1": 3, "inline+40": 2, "lease-item": 3,
           "item": 4, "split-1": 1, "split": 1, "split+1": 2.5, "split+30": 2.5, "3-items": 1.5,
           "too-large": 1}  # fmt: skip
NESTED_P = 0.15


def payload(kw: dict[str, Any]) -> Any:
    """The payload of an ``acquire_or_enqueue`` op: ``{"v": v}``, a nested one (``nest``), or
    one whose record is ``SHAPES[shape]`` bytes of UTF-8."""
    value = kw["v"]
    if kw.get("nest"):
        return {"v": value, "n": {"ключ": [1, 2.5, None, True, {"深": "ü☃"}], "e": {}, "l": []}}
    shape = kw.get("shape")
    if shape is None:
        return {"v": value}
    size, char = SHAPES[shape]
    empty = {"v": value, "s": ""}
    from leaseguard.signals import encode_signal

    base = len(encode_signal(Signal("x", empty, enqueued_at_ms=1_000 + value), 1 << 30).encode())
    fill = size - base
    width = len(char.encode("utf-8"))
    return {"v": value, "s": "a" * (fill % width) + char * (fill // width)}


def draw_payload(rng: random.Random) -> dict[str, Any]:
    """``shape=`` or ``nest=`` for an op, or nothing (most draws: small payloads)."""
    r = rng.random()
    if r < NESTED_P:
        return {"nest": True}
    if r < NESTED_P + 0.25:
        return {"shape": rng.choices(list(SHAPE_P), list(SHAPE_P.values()))[0]}
    return {}


def draw_filling_payload(rng: random.Random) -> dict[str, Any]:
    """Mostly records at the inline edge (the largest that stay on the lease item): what
    fills a key's lease item fastest, for the sequences that reach item-size refusals."""
    r = rng.random()
    if r < 0.55:
        return {"shape": rng.choice(("inline-2", "inline", "inline+1"))}
    return draw_payload(rng)


# Error texts of failure reports: the backends store them as the provider's shared check cut
# them (MAX_ERROR_CHARS, an empty one as "error", a lone surrogate replaced).
ERRORS = ("boom", "", "ünïcødé ☃ 💥 深", "x" * 1_500, "é" * 1_001, "line\nbreak\ttab\r", "\ud800!")


# -- sequences ----------------------------------------------------------------------------------


@dataclass
class Disagreement:
    backend: str
    seed: int | None
    what: str  # "reply", "state of k0", "token order"
    model: Any
    got: Any
    ops: list[Op]  # up to and including the step that disagreed

    @property
    def kind(self) -> tuple[str, str, bool, bool]:
        """(op, "reply" or "state", a resend, the model crashed): one line of the report."""
        last = self.ops[-1]
        return (last.name, self.what.split()[0], last.resend, "crashed" in self.what)

    def __str__(self) -> str:
        lines = [
            f"{self.backend} (seed {self.seed}) step {len(self.ops) - 1}: {self.what} differs",
            f"  model:   {_cut(repr(self.model))}",
            f"  backend: {_cut(repr(self.got))}",
            "  ops = [",
            *(f"      {op!r}," for op in self.ops),
            "  ]",
        ]
        return "\n".join(lines)


def _cut(text: str, limit: int = 3_000) -> str:
    """A reply's repr, shortened: a split payload's is 400 KB and more."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def run_sequence(
    seed: int | None,
    backend: Side,
    model: Side | None = None,
    *,
    length: int = 25,
    ops: Sequence[Op] | None = None,
    weights: dict[str, int] | None = None,
    trace: list[tuple[Op, Any]] | None = None,
    payloads: Callable[[random.Random], dict[str, Any]] | None = None,
) -> list[Disagreement]:
    """Apply a random sequence (from ``seed``) or ``ops`` to the model and ``backend``; the first
    disagreement, if any (a fresh namespace per call: adopt_orphans sees every key). ``trace``
    collects each op with the model's reply."""
    model = model or model_side()
    rng = random.Random(seed)
    keys = KEYS[: rng.choice((1, 2))] if ops is None else sorted({op.key for op in ops})
    done: list[Op] = []
    late, late_requests = backend.late_resends, backend.late_requests
    for step in range(length if ops is None else len(ops)):
        if ops is not None:
            op = ops[step]
        elif late and rng.random() < LATE_P and (earlier := [o for o in done if o.name in LATE]):
            op = Op.late(rng.choice(earlier))
        elif (
            late_requests
            and rng.random() < LATE_P
            and (earlier := [i for i, o in enumerate(done) if late_request_of(o)])
        ):
            at = rng.choice(earlier[-4:])  # mostly late by a few steps: its grant may stand
            op = Op.late_request(done[at].key, at, rng.randrange(1000))
        else:
            op = draw_op(rng, model, keys, weights or WEIGHTS, payloads)
        done.append(op)
        if op.name == "late_request":
            # DynamoDB first: the model runs a late resend of the step only if it applied
            got = apply(backend, op)
            applied, problem = got[1] if got[0] == "ok" else (False, None)
            if applied:
                apply(model, Op.late(done[op.kw["step"]]))
            want, got = ("ok", None), (("ok", problem) if got[0] == "ok" else got)
        elif backend.room is not None and op.name == "acquire_or_enqueue":
            # the backend first: the model's step is given the room the backend judged; a
            # refused forward must leave every item of the key as it was (nothing stored)
            before = backend.room.items(op.key)
            got = apply(backend, op)
            if got[0] == "raise" and got[1][0] == "QueueFull":
                changed = _changed(before, backend.room.items(op.key))
                if changed:
                    what = f"storage of {op.key} (a refused forward wrote)"
                    return [Disagreement(backend.name, seed, what, ("ok", None), changed, done)]
            room, judge = backend.room.judged, model.provider
            assert isinstance(judge, InMemoryLeaseProvider)
            judge.storage_room = lambda key, sid, room=room: room
            try:
                want = apply(model, op)
            finally:
                judge.storage_room = None
            if got[0] == "raise" and got[1][-1]:
                backend.room.refusals += 1
        else:
            want, got = apply(model, op), apply(backend, op)
        if trace is not None:
            trace.append((op, want))
        if want != got and documented(backend, op, want, got, done):
            return []  # the sides parted as docs/dynamodb.md says: the rest is not compared
        found = [("reply", want, got)] if want != got else []
        # the key the step named (every key after adopt_orphans and at the end): a difference
        # left on another key by a step is still found by a later step's check
        last = step == (length if ops is None else len(ops)) - 1
        checked = keys if last or op.name == "adopt_orphans" else (op.key,)
        if op.name in ("get_lease_owner", "pending_signals") and not last:
            checked = ()
        for key in checked if not found else ():
            want_state, got_state = state(model, key), state(backend, key)
            if want_state != got_state:
                found.append((f"state of {key}", want_state, got_state))
                break
        if not found and backend.storage is not None:
            for key in keys:
                kept = backend.storage(key, model.provider.inspect_key(key))
                if kept:
                    found.append((f"storage of {key}", ("ok", None), ("ok", kept[0])))
                    break
        if not found and backend.anomalies:
            found.append(("token order", ("ok", None), ("ok", backend.anomalies[0])))
        if found:
            what, want, got = found[0]
            if want[0] == "crash":
                what = f"{what} (the model crashed)"
            return [Disagreement(backend.name, seed, what, want, got, done)]
    return []


def documented(side: Side, op: Op, want: Any, got: Any, done: Sequence[Op]) -> bool:
    """A reply of ``transfer_to_next`` that differs as docs/dynamodb.md documents:

    * "Unknown tokens in [N4]": the ids a ``transfer_to_next(token=None)`` completed (its
      owner's and those it took) are recorded with token 0 on DynamoDB, so a later
      ``transfer_to_next`` naming one of them with the grant's token gets ``LeaseLostError``
      where the model answers None (nothing changes);
    * "Resends are write-level": a resent ``transfer_to_next(token=None)`` whose step handed
      the key straight back to the same id reports that hand-off here; the model runs the call
      again and completes the new grant too."""
    if not side.name.startswith("dynamodb") or op.name != "transfer_to_next":
        return False
    owner, token = op.kw.get("owner"), op.kw.get("token")
    if token is not None:  # any completion without a token recorded its ids with token 0
        return (want, got) == (("ok", None), ("raise", "LeaseLostError")) and any(
            o.name == "transfer_to_next" and o.key == op.key and o.kw.get("token") is None
            for o in done[:-1]
        )
    handed_back = got[0] == "ok" and isinstance(got[1], tuple) and got[1][:2] == ("signal", owner)
    return op.resend and want == ("ok", None) and handed_back


def replay(ops: Sequence[Op], backend: Side) -> list[Disagreement]:
    return run_sequence(None, backend, ops=ops)


def shrink(
    found: Disagreement, make_backend: Callable[[], Side], budget_s: float = 10.0
) -> Disagreement:
    """A shorter op list that still ends in a disagreement of the same kind on the same op:
    drop ops one at a time, then resend flags, while it still fails (within ``budget_s``)."""
    best, stop = found, time.monotonic() + budget_s

    def retry(candidate: list[Op]) -> bool:
        nonlocal best
        if time.monotonic() > stop:
            return False
        again = replay(candidate, make_backend())
        if again and again[0].kind[:2] == best.kind[:2] and again[0].kind[3] == best.kind[3]:
            best = again[0]
            return True
        return False

    progress = True
    while progress:
        progress = False
        for i in reversed(range(len(best.ops) - 1)):
            if i < len(best.ops) - 1 and retry(best.ops[:i] + best.ops[i + 1 :]):
                progress = True
    for i, op in enumerate(best.ops):
        if op.resend and i < len(best.ops):
            plain = Op(op.name, op.key, **op.kw)
            retry([*best.ops[:i], plain, *best.ops[i + 1 :]])
    best.seed = found.seed
    return best


@dataclass
class Summary:
    backend: str
    sequences: int = 0
    ops: int = 0
    seconds: float = 0.0
    disagreements: list[Disagreement] = field(default_factory=list)
    stopped: bool = False  # by the time budget, before the last seed
    room_refusals: int = 0  # forwards refused by the storage's room (DynamoDB), compared

    def __str__(self) -> str:
        rate = self.ops / self.seconds if self.seconds else 0.0
        return (
            f"{self.backend}: {self.sequences} sequences, {self.ops} ops in {self.seconds:.1f} s "
            f"({rate:.0f} ops/s), {len(self.disagreements)} disagreeing"
            + (f", {self.room_refusals} refused by the item's room" if self.room_refusals else "")
            + (" (stopped by the time budget)" if self.stopped else "")
        )


def run_many(
    make_backend: Callable[[], Side],
    seeds: Sequence[int],
    *,
    length: int = 25,
    budget_s: float = float("inf"),
    weights: dict[str, int] | None = None,
    payloads: Callable[[random.Random], dict[str, Any]] | None = None,
) -> Summary:
    """Run a sequence per seed (each on a fresh backend namespace) until the seeds or the time
    budget run out."""
    summary = Summary(make_backend.__name__)
    start = time.monotonic()
    for seed in seeds:
        if time.monotonic() - start > budget_s:
            summary.stopped = True
            break
        backend = make_backend()
        summary.backend = backend.name
        found = run_sequence(seed, backend, length=length, weights=weights, payloads=payloads)
        summary.sequences += 1
        summary.room_refusals += backend.room.refusals if backend.room is not None else 0
        summary.ops += len(found[0].ops) if found else length
        summary.disagreements += found
    summary.seconds = time.monotonic() - start
    return summary


def dynamodb_run(seeds: Sequence[int], length: int, budget_s: float) -> Summary:
    """:func:`run_many` on DynamoDB in a moto of this process's own, outside pytest (e.g.
    ``python -c 'from tests.differential import *; print(dynamodb_run(range(50), 25, 1e9))'``
    from the repository root)."""
    import os

    import boto3
    import moto

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        os.environ[name] = "testing"
    with moto.mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")

        def dynamodb() -> Side:
            return dynamodb_side(f"lg-{uuid.uuid4().hex[:12]}", client)

        return run_many(dynamodb, seeds, length=length, budget_s=budget_s)
