"""DynamoDB's lease item against the real 400 KB limit: the completed-id memory ``d`` stays
within DONE_STORED_BYTES after completions of any size, and the key keeps working.

The moto server the tests use refuses writes by DynamoDB's own size rules
(:func:`leaseguard.testing.dynamodb_server.install_item_size_limit`); the first test shows it
does (moto alone counts differently). Issue 23, finding 3: a completion of 128 signals or more
wrote a batch that the prune could never cut, nothing behind it was pruned either, and the lease
item grew with every later completion until every write of the key was refused.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from leaseguard import Signal
from leaseguard.protocol.model import DONE_LIMIT
from leaseguard.providers.dynamodb import DynamoDBLeaseProvider
from leaseguard.providers.dynamodb.done import DONE_STORED_BYTES, done_view
from leaseguard.providers.dynamodb.schema import DONE_RESERVE_BYTES, item_bytes, value_bytes
from leaseguard.testing.dynamodb_server import ITEM_LIMIT_BYTES, DynamoDBServer

TTL = 60_000
KEY = "bounds"
Make = Callable[..., DynamoDBLeaseProvider]


class Clock:
    def __init__(self) -> None:
        self.now = time.time_ns() // 1_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make(make_dynamodb: Make, clock: Clock) -> Make:
    def build(**options: Any) -> DynamoDBLeaseProvider:
        options.setdefault("clock", clock)
        options.setdefault("clock_skew_ms", 0)
        return make_dynamodb(**options)

    return build


def lease_item(provider: DynamoDBLeaseProvider) -> dict[str, Any]:
    return dict(
        provider.client.get_item(
            TableName=provider.table_name,
            Key={"pk": {"S": KEY}, "sk": {"S": "lease"}},
            ConsistentRead=True,
        ).get("Item", {})
    )


def assert_bounded(provider: DynamoDBLeaseProvider) -> dict[str, Any]:
    """The lease item is within DynamoDB's limit and ``d`` within its documented bound."""
    item = lease_item(provider)
    assert item_bytes(item) <= ITEM_LIMIT_BYTES
    if "d" in item:
        assert value_bytes(item["d"]) <= DONE_STORED_BYTES
    return item


def complete_batch(provider: DynamoDBLeaseProvider, owner: str, ids: list[str]) -> None:
    """``owner`` runs, ``ids`` are forwarded behind it, taken in one batch and completed with
    it in one write ([G6] then [N1])."""
    granted = provider.acquire_or_enqueue(KEY, Signal(owner, {}), TTL)
    assert granted.acquired and granted.owner == owner
    for sid in ids:
        queued = provider.acquire_or_enqueue(KEY, Signal(sid, {}), TTL)
        assert not queued.acquired and queued.position is not None
    taken = provider.take_signals(KEY, owner, len(ids), token=granted.token) if ids else []
    assert [s.id for s in taken] == ids
    assert provider.transfer_to_next(KEY, owner, TTL, token=granted.token) is None


def run_alone(provider: DynamoDBLeaseProvider, sid: str) -> None:
    """``sid`` owns the free key, runs and completes: a grant and a release ([Q1] [N1])."""
    granted = provider.acquire_or_enqueue(KEY, Signal(sid, {}), TTL)
    assert granted.acquired and granted.owner == sid
    assert provider.transfer_to_next(KEY, sid, TTL, token=granted.token) is None


def test_the_test_server_refuses_by_dynamodbs_size_rules(dynamodb_server: DynamoDBServer) -> None:
    """A write that replaces an attribute of an item at the limit is accepted (moto's own
    count, which adds the old value, refuses it); one byte past the limit is refused with
    DynamoDB's ValidationException and changes nothing."""
    client = boto3.client("dynamodb", endpoint_url=dynamodb_server.endpoint_url)
    table = f"size-{uuid.uuid4().hex[:8]}"
    client.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    # pk "k" (2 + 1 bytes), a list of 400 strings (1 + 3 + 400 * (1 + 1,000)), a number
    # 12345 (1 + 3 + 1), and a string that fills the item to exactly 409,600 bytes
    items: dict[str, Any] = {
        "pk": {"S": "k"},
        "l": {"L": [{"S": "x" * 1_000}] * 400},
        "n": {"N": "12345"},
    }
    fill = ITEM_LIMIT_BYTES - (3 + 1 + 3 + 400 * 1_001 + 1 + 4) - 1
    items["s"] = {"S": "y" * fill}
    client.put_item(TableName=table, Item=items)
    key = {"pk": {"S": "k"}}
    client.update_item(
        TableName=table,
        Key=key,
        UpdateExpression="SET s = :v, n = :n",
        ExpressionAttributeValues={":v": {"S": "z" * fill}, ":n": {"N": "54321"}},
    )
    for update, values in (
        ("SET b = :v", {":v": {"BOOL": True}}),  # 2 bytes more
        ("SET n = :v", {":v": {"N": "1234567"}}),  # 4 digits -> 5 bytes: one more
        ("SET l[400] = :v", {":v": {"S": ""}}),  # an element: one byte more
    ):
        with pytest.raises(ClientError) as refused:
            client.update_item(
                TableName=table, Key=key, UpdateExpression=update, ExpressionAttributeValues=values
            )
        assert refused.value.response["Error"]["Code"] == "ValidationException"
        assert "maximum allowed size" in refused.value.response["Error"]["Message"]
    stored = client.get_item(TableName=table, Key=key, ConsistentRead=True)["Item"]
    assert set(stored) == {"pk", "l", "n", "s"} and stored["n"] == {"N": "54321"}
    assert len(stored["l"]["L"]) == 400 and stored["s"]["S"] == "z" * fill
    with pytest.raises(ClientError) as too_big:
        client.put_item(TableName=table, Item={**items, "pk": {"S": "k2"}, "b": {"BOOL": True}})
    assert too_big.value.response["Error"]["Code"] == "ValidationException"


def test_the_bound_leaves_the_room_forwards_reserve() -> None:
    """The forward's room check (schema.queue_bound) reserves DONE_RESERVE_BYTES for ``d``:
    the bound must lie within it, or a completion could push a full item over the limit."""
    assert DONE_STORED_BYTES <= DONE_RESERVE_BYTES


# make test: around _PRUNE_MAX (128), the old cut's limit; make soak adds 500 and 1,000 (each
# forward rewrites the growing item on moto: 1,000 take minutes)
SIZES = [1, 127, 128, 129] + ([500, 1_000] if os.environ.get("LEASEGUARD_SOAK") else [])


@pytest.mark.parametrize("size", SIZES)
def test_a_completion_of_any_size_is_cut_and_the_memory_stays_bounded(
    make: Make, clock: Clock, size: int
) -> None:
    """A completion of ``size`` signals, then completions of 1 KiB ids: ``d`` never holds more
    than DONE_STORED_BYTES, the big batch is cut once its ids are forgotten (by the byte
    limit, here), and every write keeps working. Before, a batch of 128 or more was never
    pruned: behind it ``d`` grew by each later completion."""
    provider = make(max_queue=1_000)
    batch = [f"b{i:04d}-{uuid.uuid4().hex[:24]}" for i in range(size)]
    complete_batch(provider, "owner", batch)
    assert_bounded(provider)
    for n in range(72):  # 72 KiB of ids: past DONE_BYTES, within the window
        clock.now += 10
        run_alone(provider, f"{n:04d}" + "L" * 1_020)
        assert_bounded(provider)
    item = assert_bounded(provider)
    view = done_view(item["d"]["L"], clock.now)
    assert not any(sid in view for sid in batch)  # forgotten first (the oldest)
    assert not any(e.get("S") in batch for e in item["d"]["L"])  # and cut from d
    newest = f"{71:04d}" + "L" * 1_020
    again = provider.acquire_or_enqueue(KEY, Signal(newest, {}), TTL)
    assert (again.acquired, again.owner) == (False, None)  # [Q5] still remembered


def test_a_key_with_a_big_completion_keeps_working_past_the_item_limit(
    make: Make, clock: Clock
) -> None:
    """Issue 23 finding 3 as reported: take 130, complete, then completions go on. Without
    the fix ``d`` grows by each one (about 1 KiB here) until the item passes 400 KB and
    DynamoDB refuses every write of the key; with it ``d`` stays bounded and the 430th
    completion works like the first. make test runs 100 of them: past DONE_STORED_BYTES of
    ids by a third, so the unbounded ``d`` would already fail the bound; make soak runs 430,
    past the item limit itself."""
    provider = make(max_queue=1_000)
    complete_batch(provider, "owner", [f"s{i:03d}" for i in range(130)])
    runs = 430 if os.environ.get("LEASEGUARD_SOAK") else 100
    assert runs * 1_004 > DONE_STORED_BYTES * 4 // 3
    for n in range(runs):  # each a grant and a release, none refused by the item limit
        clock.now += 5
        run_alone(provider, f"{n:04d}" + "L" * 1_000)
    item = assert_bounded(provider)
    assert value_bytes(item["d"]) <= DONE_STORED_BYTES


def test_a_long_run_at_a_high_rate_keeps_the_newest_ids(
    make: Make, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Completions 5 ms apart (200 a second, all inside the window) with request-id sized ids,
    DONE_LIMIT + 100 of them: ``d`` stays bounded, the newest DONE_LIMIT ids are remembered
    and the oldest forgotten first (a resend of an evicted id then runs again: the documented
    limit of the dedupe window, DONE_LIMIT ids per key per DEDUPE_WINDOW_MS). make test runs
    it with DONE_LIMIT at 120, past PRUNE_MIN (the memory's rules do not depend on the
    number); make soak with the real 1,000."""
    from leaseguard.providers.dynamodb import done

    limit = DONE_LIMIT if os.environ.get("LEASEGUARD_SOAK") else 120
    assert limit > done.PRUNE_MIN
    monkeypatch.setattr(done, "DONE_LIMIT", limit)
    provider = make()
    extra = 100  # completions past the limit: the oldest 100 are forgotten
    ids = [f"{n:04d}-{uuid.uuid4()}" for n in range(limit + extra)]
    for sid in ids:
        clock.now += 5
        run_alone(provider, sid)
    item = assert_bounded(provider)
    view = done_view(item["d"]["L"], clock.now)
    assert list(view) == ids[-limit:]
    assert len(item["d"]["L"]) <= 2 * limit + 64 + 2  # an id and a marker each, + garbage
    late = provider.acquire_or_enqueue(KEY, Signal(ids[extra], {}), TTL)
    assert (late.acquired, late.owner) == (False, None)  # the oldest remembered: duplicate
    evicted = provider.acquire_or_enqueue(KEY, Signal(ids[extra - 1], {}), TTL)
    assert evicted.acquired and evicted.owner == ids[extra - 1]  # forgotten: it runs again


def test_a_queue_filled_to_its_room_with_long_ids_completes_in_one_batch(
    make: Make, clock: Clock
) -> None:
    """1 KiB ids forwarded until the room check refuses ([Q8]), all taken and completed in
    one write: the batch (over DONE_BYTES by itself) is cut to the bound in that write, the
    item stays under DynamoDB's limit, and the key takes forwards again."""
    from leaseguard.errors import QueueFull

    provider = make(max_queue=1_000)
    granted = provider.acquire_or_enqueue(KEY, Signal("owner", {}), TTL)
    assert granted.acquired
    queued: list[str] = []
    with pytest.raises(QueueFull):
        for n in range(1_000):
            sid = f"{n:04d}" + "Q" * 1_020
            provider.acquire_or_enqueue(KEY, Signal(sid, {}), TTL)
            queued.append(sid)
    assert len(queued) > DONE_LIMIT // 20  # far past DONE_BYTES of ids
    taken = provider.take_signals(KEY, "owner", len(queued), token=granted.token)
    assert [s.id for s in taken] == queued
    assert provider.transfer_to_next(KEY, "owner", TTL, token=granted.token) is None
    item = assert_bounded(provider)
    view = done_view(item["d"]["L"], clock.now)
    assert "owner" in view and queued[-1] in view and queued[0] not in view
    clock.now += 10
    run_alone(provider, "after")
    assert_bounded(provider)


def test_a_key_at_the_dead_letter_bound_stays_within_the_item_limit(
    make: Make, clock: Clock
) -> None:
    """DEAD_LIMIT dead letters with 1 KiB ids and errors of MAX_ERROR_CHARS 4-byte characters
    (the largest a report stores), then a queue forwarded full (to the room check, [Q8]) and
    taken, and its whole batch failing on its last attempt: no dead letter fits, so every
    one waits at the head of the halted key ([G6]); every write is accepted by DynamoDB's own
    size rules, the lease item stays under 400 KB, and a redrive ([V1]) frees the list."""
    from leaseguard.errors import QueueFull
    from leaseguard.protocol.state import DEAD_LIMIT, MAX_ERROR_CHARS

    provider = make(max_queue=1_000)
    error = "\U0001f600" * MAX_ERROR_CHARS
    # DEAD_LIMIT signals failing in one report (a batch: one owner, the rest taken)
    ids = [f"x{n:03d}" + "D" * 1_020 for n in range(DEAD_LIMIT)]
    first = provider.acquire_or_enqueue(KEY, Signal(ids[0], {}), TTL)
    for sid in ids[1:]:
        provider.acquire_or_enqueue(KEY, Signal(sid, {}), TTL)
    assert len(provider.take_signals(KEY, ids[0], DEAD_LIMIT, token=first.token)) == DEAD_LIMIT - 1
    provider.transfer_to_next(KEY, ids[0], TTL, token=first.token, error=error, max_attempts=1)
    item = assert_bounded(provider)
    assert len(item["x"]["L"]) == DEAD_LIMIT
    (letter,) = [d for d in provider.inspect_key(KEY).dead_letters if d.id.startswith("x000")]
    assert letter.error == error  # stored whole, out of the lease item
    granted = provider.acquire_or_enqueue(KEY, Signal("own", {}), TTL)
    assert granted.acquired
    queued: list[str] = []
    # make soak forwards until the room check refuses (about 60 here: each forward rewrites
    # the growing item on moto); make test, 16
    with pytest.raises(QueueFull) if os.environ.get("LEASEGUARD_SOAK") else nullcontext():
        for n in range(1_000 if os.environ.get("LEASEGUARD_SOAK") else 16):
            sid = f"q{n:03d}" + "Q" * 1_020
            provider.acquire_or_enqueue(KEY, Signal(sid, {}), TTL)
            queued.append(sid)
    assert len(provider.take_signals(KEY, "own", len(queued), token=granted.token)) == len(queued)
    assert_bounded(provider)
    reply = provider.transfer_to_next(
        KEY, "own", TTL, token=granted.token, error=error, max_attempts=1
    )
    assert reply is None  # [N1] halted
    item = assert_bounded(provider)
    state = provider.inspect_key(KEY)
    assert state.halted and len(state.dead_letters) == DEAD_LIMIT
    assert [s.id for s in state.queued] == ["own", *queued]
    assert provider.redrive(KEY) == DEAD_LIMIT
    assert_bounded(provider)
    assert not provider.inspect_key(KEY).halted
