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
    # A signal on a free key: its payload item, then the grant.
    fresh = p.requests(lambda q: q.acquire_or_enqueue("free", Signal("s1", {"n": 1}), TTL))
    assert fresh == ["PutItem", "UpdateItem"]
    # A signal on a held key: payload, the refused grant (which names the holder), the append.
    held = p.requests(lambda q: q.acquire_or_enqueue("k", Signal("s2", {"n": 2}), TTL))
    assert held == ["PutItem", "UpdateItem", "UpdateItem"]
    # Completion with nothing queued: a release conditional on the empty queue, then the
    # finished signal's payload is deleted.
    done = p.requests(lambda q: q.transfer_to_next("free", "s1", TTL))
    assert done == ["UpdateItem", "BatchWriteItem"]
    # A hand-off: the refused release is the snapshot, then the head's payload, the grant and
    # the deletion of the finished signal's payload.
    p.provider.acquire_or_enqueue("h", Signal("s3", {"n": 3}), TTL)
    p.provider.acquire_or_enqueue("h", Signal("s4", {"n": 4}), TTL)
    handed = p.requests(lambda q: q.transfer_to_next("h", "s3", TTL))
    assert handed == ["UpdateItem", "BatchGetItem", "UpdateItem", "BatchWriteItem"]
    # A duplicate (here: an id completed a moment ago, remembered for the dedupe window): the
    # payload item, the refused grant that shows it. The unreferenced payload is left to its
    # TTL: the enqueuer never deletes (a write of its own may still be applied later).
    dup = p.requests(lambda q: q.acquire_or_enqueue("free", Signal("s1", {"n": 1}), TTL))
    assert dup == ["PutItem", "UpdateItem"]
    # A failure report reads the item first (no blind fast path), then one conditional write
    # completes, retries the owner at the head and hands the key to it.
    held = p.provider.acquire_or_enqueue("f", Signal("s5", {"n": 5}), TTL)
    failed = p.requests(
        lambda q: q.transfer_to_next("f", "s5", TTL, token=held.token, error="boom")
    )
    assert failed == ["GetItem", "BatchGetItem", "UpdateItem"]


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000
