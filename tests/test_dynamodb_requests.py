"""How many HTTP requests each DynamoDB operation sends, counted where botocore sends them.

A ``before-send`` hook on the provider's own client sees every HTTP request (retries included)
just before it goes on the wire to the serialized moto server. The lease operations must cost
exactly one request each, whatever the outcome; the queue steps cost what docs/dynamodb.md says.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from leaseguard import Signal
from leaseguard.errors import QueueFull
from leaseguard.providers.dynamodb import DynamoDBLeaseProvider
from leaseguard.testing import DynamoDBServer

TTL = 10_000


class Counted:
    """A provider whose client records the operation name of every HTTP request it sends."""

    def __init__(self, provider: DynamoDBLeaseProvider) -> None:
        self.provider = provider
        self.sent: list[str] = []
        provider.client.meta.events.register("before-send.dynamodb.*", self._record)

    def _record(self, event_name: str, **_: Any) -> None:
        self.sent.append(event_name.rsplit(".", 1)[-1])

    def requests(self, call: Callable[[DynamoDBLeaseProvider], object]) -> list[str]:
        self.sent.clear()
        call(self.provider)
        return list(self.sent)


@pytest.fixture
def make(dynamodb_server: DynamoDBServer) -> Callable[..., Counted]:
    table = f"requests-{uuid.uuid4().hex[:8]}"
    DynamoDBLeaseProvider(
        table, endpoint_url=dynamodb_server.endpoint_url, region_name="us-east-1"
    ).create_table()

    def build(**options: Any) -> Counted:
        return Counted(
            DynamoDBLeaseProvider(
                table, endpoint_url=dynamodb_server.endpoint_url, region_name="us-east-1", **options
            )
        )

    return build


ONE = ["UpdateItem"]


def test_fresh_and_refused_acquire_cost_one_request_each(make: Callable[..., Counted]) -> None:
    p = make()
    results: list[Any] = []
    assert p.requests(lambda q: results.append(q.acquire_lease("k", "a", TTL))) == ONE
    assert p.requests(lambda q: results.append(q.acquire_lease("k", "b", TTL))) == ONE
    fresh, refused = results
    assert fresh.acquired and fresh.owner == "a"
    # The refusal names the holder and its token from the same single request.
    assert (refused.acquired, refused.owner, refused.token) == (False, "a", fresh.token)


def test_takeover_after_expiry_costs_one_request(make: Callable[..., Counted]) -> None:
    p = make()
    first = p.provider.acquire_lease("k", "a", 1_000)
    later = make(clock=lambda: _wall_ms() + 60_000)  # a caller for whom a's lease is long gone
    taken: list[Any] = []
    assert later.requests(lambda q: taken.append(q.acquire_lease("k", "b", TTL))) == ONE
    assert taken[0].acquired and taken[0].owner == "b"
    assert first.token is not None and taken[0].token > first.token


def test_renew_release_transfer_cost_one_request_each(make: Callable[..., Counted]) -> None:
    p = make()
    p.provider.acquire_lease("k", "a", TTL)
    assert p.requests(lambda q: q.renew_lease("k", "a", TTL)) == ONE
    assert p.requests(lambda q: q.renew_lease("k", "stranger", TTL)) == ONE  # refused
    assert p.requests(lambda q: q.transfer_lease("k", "a", "b", TTL)) == ONE
    assert p.requests(lambda q: q.transfer_lease("k", "a", "c", TTL)) == ONE  # refused
    assert p.requests(lambda q: q.release_lease("k", "stranger")) == ONE  # not the owner
    assert p.requests(lambda q: q.release_lease("k", "b")) == ONE
    assert p.provider.get_lease_owner("k") is None


def test_documented_costs_of_the_other_steps(make: Callable[..., Counted]) -> None:
    """Pinned so docs/dynamodb.md stays true."""
    p = make()
    p.provider.acquire_lease("k", "a", TTL)
    # The current owner acquiring again keeps its token: the refused grant, then a refresh.
    assert p.requests(lambda q: q.acquire_lease("k", "a", TTL)) == ["UpdateItem", "UpdateItem"]
    assert p.requests(lambda q: q.get_lease_owner("k")) == ["GetItem"]
    # A signal on a free key: the grant, with the record inline.
    fresh = p.requests(lambda q: q.acquire_or_enqueue("free", Signal("s1", {"n": 1}), TTL))
    assert fresh == ["UpdateItem"]
    # A signal on a held key: the refused grant (which names the holder), the append.
    held = p.requests(lambda q: q.acquire_or_enqueue("k", Signal("s2", {"n": 2}), TTL))
    assert held == ["UpdateItem", "UpdateItem"]
    # Completion with nothing queued: a release conditional on the empty queue, which
    # removes the finished signal's inline record with its ref.
    done = p.requests(lambda q: q.transfer_to_next("free", "s1", TTL))
    assert done == ["UpdateItem"]
    # A hand-off: the refused release is the snapshot (the head's record inline in it), then
    # the grant.
    p.provider.acquire_or_enqueue("h", Signal("s3", {"n": 3}), TTL)
    p.provider.acquire_or_enqueue("h", Signal("s4", {"n": 4}), TTL)
    handed = p.requests(lambda q: q.transfer_to_next("h", "s3", TTL))
    assert handed == ["UpdateItem", "UpdateItem"]
    # A duplicate (here: an id completed a moment ago, remembered for the dedupe window): the
    # refused grant that shows it, which stored nothing.
    dup = p.requests(lambda q: q.acquire_or_enqueue("free", Signal("s1", {"n": 1}), TTL))
    assert dup == ["UpdateItem"]
    # A failure report reads the item first (no blind fast path), then one conditional write
    # completes, retries the owner at the head and hands the key to it.
    held = p.provider.acquire_or_enqueue("f", Signal("s5", {"n": 5}), TTL)
    failed = p.requests(
        lambda q: q.transfer_to_next("f", "s5", TTL, token=held.token, error="boom")
    )
    assert failed == ["GetItem", "UpdateItem"]


MiB = 1024 * 1024


def _large(sid: str, size: int) -> Signal:
    return Signal(sid, {"body": "x" * (size - 11)})


def test_costs_of_payloads_larger_than_one_item(make: Callable[..., Counted]) -> None:
    """Pinned so docs/dynamodb.md stays true: a payload over one item (~392 KiB) is written with
    BatchWriteItem (25 items a request) instead of PutItem and read in the same BatchGetItem
    (100 items and 16 MB a request); the protocol writes are the ones of a small payload."""
    p = make(max_payload_bytes=10 * MiB)
    # 6 MiB on a free key: its 16 items in one BatchWriteItem, then the grant
    fresh = p.requests(lambda q: q.acquire_or_enqueue("free", _large("s1", 6 * MiB), TTL))
    assert fresh == ["BatchWriteItem", "UpdateItem"]
    # 6 MiB on a held key: its items, the refused grant, the append
    p.provider.acquire_or_enqueue("h", Signal("o", {}), TTL)
    held = p.requests(lambda q: q.acquire_or_enqueue("h", _large("s2", 6 * MiB), TTL))
    assert held == ["BatchWriteItem", "UpdateItem", "UpdateItem"]
    # 10 MiB: 27 items, two BatchWriteItem
    ten = p.requests(lambda q: q.acquire_or_enqueue("h", _large("s3", 10 * MiB), TTL))
    assert ten == ["BatchWriteItem", "BatchWriteItem", "UpdateItem", "UpdateItem"]
    # 6 MiB of 2-byte characters: 16 items again, but about 19 MB as sent (JSON escapes them
    # as \u00e9), so two BatchWriteItem: a request stays under DynamoDB's 16 MB
    wide = Signal("s5", {"body": "é" * (3 * MiB - 6)})
    assert p.requests(lambda q: q.acquire_or_enqueue("w", wide, TTL)) == [
        "BatchWriteItem",
        "BatchWriteItem",
        "UpdateItem",
    ]
    assert p.provider.inspect_key("w").token is not None
    # the hand-off to the 6 MiB head: its 16 items in one BatchGetItem (the finished owner's
    # record was inline: nothing to delete)
    handed = p.requests(lambda q: q.transfer_to_next("h", "o", TTL))
    assert handed == ["UpdateItem", "BatchGetItem", "UpdateItem"]
    # the next hand-off deletes the 6 MiB payload's 16 items in one BatchWriteItem
    handed = p.requests(lambda q: q.transfer_to_next("h", "s2", TTL))
    assert handed == ["UpdateItem", "BatchGetItem", "UpdateItem", "BatchWriteItem"]
    # completion of the 10 MiB one with nothing queued: the release, its 27 items deleted in
    # two BatchWriteItem
    done = p.requests(lambda q: q.transfer_to_next("h", "s3", TTL))
    assert done == ["UpdateItem", "BatchWriteItem", "BatchWriteItem"]
    assert p.requests(lambda q: q.transfer_to_next("free", "s1", TTL)) == [
        "UpdateItem",
        "BatchWriteItem",
    ]
    # dead-lettering a 1 MiB payload (3 items): the read, the dead letter's error on its head,
    # the other two items kept as long (an UpdateItem of their TTL each), the release
    held_d = p.provider.acquire_or_enqueue("d", _large("s4", MiB), TTL)
    dead = p.requests(
        lambda q: q.transfer_to_next("d", "s4", TTL, token=held_d.token, error="x", max_attempts=1)
    )
    assert dead == ["GetItem", "UpdateItem", "UpdateItem", "UpdateItem", "UpdateItem"]
    # its redrive: the read, each of its 3 items given a fresh retention_s, the write
    assert p.requests(lambda q: q.redrive("d")) == ["GetItem"] + ["UpdateItem"] * 4


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def test_costs_of_backpressure_halting_claims_and_redrive(make: Callable[..., Counted]) -> None:
    """Pinned so docs/dynamodb.md stays true; none of these is on the uncontended path."""
    clock = _Clock()
    p = make(clock=clock, clock_skew_ms=0, orphan_shards=2)
    held = p.provider.acquire_or_enqueue("k", Signal("o", {"n": 0}), TTL)
    p.provider.acquire_or_enqueue("k", Signal("s1", {"n": 1}), TTL)
    # [Q8] refused: the refused grant that shows the full queue (its inline record stored
    # nothing; a payload item would be written first and deleted after)
    full = p.requests(lambda q: _refused(q, "k", Signal("s2", {"n": 2}), max_queue=1))
    assert full == ["UpdateItem"]
    # a failure report that dead-letters under on_poison="halt": the read, the dead letter's
    # payload item (its inline record, error, attempts and time), then completion and release
    # in one write (no payload reads: nothing is granted)
    halted = p.requests(
        lambda q: q.transfer_to_next(
            "k", "o", TTL, token=held.token, error="x", max_attempts=1, on_poison="halt"
        )
    )
    assert halted == ["GetItem", "PutItem", "UpdateItem"]
    # [Q9] a forward into the halted key: the refused grant, the append
    queued = p.requests(lambda q: q.acquire_or_enqueue("k", Signal("s3", {"n": 3}), TTL))
    assert queued == ["UpdateItem", "UpdateItem"]
    # the dead-letter index: one Query per shard; redrive: the read, the dead letter's payload
    # item given a fresh retention_s (one UpdateItem per item), and one write
    assert p.requests(lambda q: q.dead_letter_keys()) == ["Query", "Query"]
    assert p.requests(lambda q: q.redrive("k")) == ["GetItem", "UpdateItem", "UpdateItem"]
    # [C4] an envelope retried after its lease ran out: as a claim
    p.provider.adopt_orphans(TTL, 10, claim=False)
    state = p.provider.inspect_key("k")
    clock.now += TTL + 1
    assert state.owner is not None and state.token is not None
    claimed = p.requests(lambda q: q.claim_signal("k", str(state.owner), int(state.token), TTL))
    assert claimed == ["GetItem", "BatchGetItem", "UpdateItem"]
    # [L3] over a dead owner's in-flight signals: the refused blind grant, then [G5] + [G3]
    clock.now += TTL + 1
    taken = p.requests(lambda q: q.acquire_lease("k", "w0", TTL))
    assert taken == ["UpdateItem", "UpdateItem"]


class _Clock:
    def __init__(self) -> None:
        self.now = _wall_ms()

    def __call__(self) -> int:
        return self.now


def _refused(provider: DynamoDBLeaseProvider, key: str, signal: Signal, max_queue: int) -> None:
    with pytest.raises(QueueFull):
        provider.acquire_or_enqueue(key, signal, TTL, max_queue=max_queue)


def test_costs_of_a_retried_own_event_that_failed(make: Callable[..., Counted]) -> None:
    """Pinned so docs/dynamodb.md stays true: a platform retry of an own event whose run failed
    (requeue_owner=False) resumes its attempts from the failed done entry ([G6] [Q1] [Q2])."""
    p = make()
    first = p.provider.acquire_or_enqueue("k", Signal("o", {"n": 0}), TTL)
    failed = p.requests(
        lambda q: q.transfer_to_next(
            "k", "o", TTL, token=first.token, error="x", requeue_owner=False
        )
    )
    # the read, the completion and release in one write (the record was inline)
    assert failed == ["GetItem", "UpdateItem"]
    results: list[Any] = []
    # free key: the blind grant refused on the resume tag, the grant from its snapshot
    retry = p.requests(lambda q: results.append(q.acquire_or_enqueue("k", Signal("o", {}), TTL)))
    assert retry == ["UpdateItem", "UpdateItem"]
    assert (results[0].acquired, results[0].attempts) == (True, 1)
    p.provider.transfer_to_next(
        "k", "o", TTL, token=results[0].token, error="x", requeue_owner=False
    )
    p.provider.acquire_or_enqueue("k", Signal("h", {"n": 1}), TTL)
    # held key: as any forward (the refused grant is the snapshot of the append)
    queued = p.requests(lambda q: results.append(q.acquire_or_enqueue("k", Signal("o", {}), TTL)))
    assert queued == ["UpdateItem", "UpdateItem"]
    assert (results[1].acquired, results[1].position) == (False, 1)
    assert [(s.id, s.attempts) for s in p.provider.inspect_key("k").queued] == [("o", 2)]


# -- inline records: the guarded invocation in two requests ---------------------------------------


def _event(sid: str, size: int = 200) -> Signal:
    """A small event, as an API or queue trigger forwards it: ``size`` bytes of JSON."""
    return Signal(sid, {"body": "x" * (size - 11)})


def _lease_bytes(p: Counted, key: str) -> int:
    from leaseguard.providers.dynamodb.schema import item_bytes

    item = p.provider.client.get_item(
        TableName=p.provider.table_name,
        Key={"pk": {"S": key}, "sk": {"S": "lease"}},
        ConsistentRead=True,
    )["Item"]
    return item_bytes(item)


def _payload_items(p: Counted, key: str) -> list[str]:
    return [
        item["sk"]["S"]
        for item in p.provider.client.query(
            TableName=p.provider.table_name,
            KeyConditionExpression="pk = :k AND begins_with(sk, :s)",
            ExpressionAttributeValues={":k": {"S": key}, ":s": {"S": "sig#"}},
            ConsistentRead=True,
        )["Items"]
    ]


def test_an_uncontended_guarded_invocation_is_two_requests(make: Callable[..., Counted]) -> None:
    """The grant stores the event inline; the completing release removes it with its ref.
    Renewals stay one request and one write unit (the lease item stays within 1 KB)."""
    from leaseguard.providers.dynamodb.schema import INLINE_ITEM_BYTES

    p = make()
    key, owner = f"thread-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    results: list[Any] = []
    assert p.requests(lambda q: results.append(q.acquire_or_enqueue(key, _event(owner), TTL))) == [
        "UpdateItem"
    ]
    assert results[0].acquired and _payload_items(p, key) == []
    assert _lease_bytes(p, key) <= INLINE_ITEM_BYTES
    for _ in range(3):
        assert p.requests(lambda q: q.renew_lease(key, owner, TTL, token=results[0].token)) == ONE
    done = p.requests(lambda q: q.transfer_to_next(key, owner, TTL, token=results[0].token))
    assert done == ONE
    assert p.provider.inspect_key(key).in_flight == () and _payload_items(p, key) == []


def test_a_forwarded_invocation_is_two_requests(make: Callable[..., Counted]) -> None:
    """A forward is the refused grant and the append with the event inline; the owner's hand-off
    to it is the refused release (the forwarded event in its snapshot) and the grant."""
    p = make()
    key, owner, forwarded = "thread", str(uuid.uuid4()), str(uuid.uuid4())
    held = p.provider.acquire_or_enqueue(key, _event(owner), TTL)
    results: list[Any] = []
    sent = p.requests(lambda q: results.append(q.acquire_or_enqueue(key, _event(forwarded), TTL)))
    assert sent == ["UpdateItem", "UpdateItem"]
    assert (results[0].acquired, results[0].owner, results[0].position) == (False, owner, 1)
    nxt: list[Any] = []
    handed = p.requests(lambda q: nxt.append(q.transfer_to_next(key, owner, TTL, token=held.token)))
    assert handed == ["UpdateItem", "UpdateItem"]
    assert nxt[0] == Signal(
        forwarded, _event(forwarded).payload, nxt[0].enqueued_at_ms, token=(held.token or 0) + 1
    )
    assert p.requests(lambda q: q.transfer_to_next(key, forwarded, TTL, token=nxt[0].token)) == ONE
    assert _payload_items(p, key) == []


def test_a_large_event_falls_back_to_a_payload_item(make: Callable[..., Counted]) -> None:
    """An event too large for the lease item's budget is stored as today: its payload item
    first (PutItem), deleted by its completion (BatchWriteItem)."""
    p = make()
    results: list[Any] = []
    fresh = p.requests(lambda q: results.append(q.acquire_or_enqueue("k", _event("a", 2048), TTL)))
    assert fresh == ["PutItem", "UpdateItem"]
    assert len(_payload_items(p, "k")) == 1
    # forwarded: its payload item, the refused grant, the append
    held = p.requests(lambda q: q.acquire_or_enqueue("k", _event("b", 2048), TTL))
    assert held == ["PutItem", "UpdateItem", "UpdateItem"]
    # the hand-off reads the head's payload item and deletes the finished one's
    handed = p.requests(lambda q: q.transfer_to_next("k", "a", TTL, token=results[0].token))
    assert handed == ["UpdateItem", "BatchGetItem", "UpdateItem", "BatchWriteItem"]
    assert p.requests(lambda q: q.transfer_to_next("k", "b", TTL)) == [
        "UpdateItem",
        "BatchWriteItem",
    ]
    assert _payload_items(p, "k") == []


def test_a_queue_that_outgrows_the_inline_budget_falls_back(make: Callable[..., Counted]) -> None:
    """Appends go inline while the lease item (as the refused grant shows it) stays within its
    budget; later ones get a payload item, written after the refusal showed the item's size."""
    from leaseguard.providers.dynamodb.schema import INLINE_ITEM_BYTES

    p = make()
    held = p.provider.acquire_or_enqueue("k", _event("o"), TTL)

    def forward(sid: str) -> list[str]:
        return p.requests(lambda q: q.acquire_or_enqueue("k", _event(sid), TTL))

    costs = [forward(f"s{n}") for n in range(6)]
    inline = costs.index(["UpdateItem", "PutItem", "UpdateItem"])
    assert inline >= 2
    assert costs[:inline] == [["UpdateItem", "UpdateItem"]] * inline
    assert costs[inline:] == [["UpdateItem", "PutItem", "UpdateItem"]] * (6 - inline)
    assert _lease_bytes(p, "k") <= INLINE_ITEM_BYTES + 6 * 64  # grows by refs, not records
    assert len(_payload_items(p, "k")) == 6 - inline
    # every signal runs in order, with its payload, whichever way it was stored
    owner, token, ran = "o", held.token, []
    while True:
        nxt = p.provider.transfer_to_next("k", owner, TTL, token=token)
        if nxt is None:
            break
        assert nxt.payload == _event(nxt.id).payload
        owner, token = nxt.id, nxt.token
        ran.append(owner)
    assert ran == [f"s{n}" for n in range(6)]
    assert _payload_items(p, "k") == []


def test_dead_lettering_an_inline_record_moves_it_to_a_payload_item(
    make: Callable[..., Counted],
) -> None:
    """The dead letter keeps its payload, error, attempts and time (on a payload item of its
    own, written before the completion lists it); a redrive runs it from there."""
    clock = _Clock()
    p = make(clock=clock)
    held = p.provider.acquire_or_enqueue("k", _event("o"), TTL)
    failed = p.requests(
        lambda q: q.transfer_to_next("k", "o", TTL, token=held.token, error="boom", max_attempts=1)
    )
    assert failed == ["GetItem", "PutItem", "UpdateItem"]
    (dead,) = p.provider.inspect_key("k").dead_letters
    assert (dead.id, dead.payload, dead.attempts, dead.error) == (
        "o",
        _event("o").payload,
        1,
        "boom",
    )
    assert dead.failed_at_ms == clock.now and len(_payload_items(p, "k")) == 1
    assert p.provider.redrive("k") == 1
    again = p.provider.acquire_or_enqueue("k", _event("s1"), TTL)
    assert again.acquired and again.owner == "o" and again.adopted is not None
    assert again.adopted.payload == _event("o").payload


def test_renewals_of_the_largest_inline_event_stay_one_write_unit(
    make: Callable[..., Counted],
) -> None:
    """The blind grant inlines a record only if the lease item, with what it cannot see (recent
    completions in ``d``, up to 160 bytes) and what its renewals add (``es``, ``et``), stays
    within 1 KB, so no renewal of that grant costs a second write unit. Two completions of
    57-byte ids fill that reserve; then the largest event the grant inlines. (When renewals
    began to record ``es``/``et``, this item went from 1,024 bytes to 1,045 at the first
    renewal.)"""
    from leaseguard.providers.dynamodb.schema import INLINE_ITEM_BYTES, grant_fits
    from leaseguard.signals import encode_signal

    p = make()
    key = f"thread-{uuid.uuid4().hex[:8]}"
    for _ in range(2):
        done = p.provider.acquire_or_enqueue(key, _event(uuid.uuid4().hex + "x" * 25), TTL)
        assert done.owner is not None
        p.provider.transfer_to_next(key, done.owner, TTL, token=done.token)
    owner = str(uuid.uuid4())
    size = max(
        n for n in range(200, 1024) if grant_fits(key, owner, encode_signal(_event(owner, n)))
    )
    held = p.provider.acquire_or_enqueue(key, _event(owner, size), TTL)
    assert held.acquired and _payload_items(p, key) == []  # inline
    for _ in range(3):
        assert p.provider.renew_lease(key, owner, TTL, token=held.token)
        assert _lease_bytes(p, key) <= INLINE_ITEM_BYTES
