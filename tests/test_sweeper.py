"""leaseguard.sweeper: the documented sweeper entry point, on every backend."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from moto import mock_aws

from leaseguard import ConfigurationError, Signal, lease_owned
from leaseguard.handoff import InvokeDispatcher, SqsDispatcher
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.sweeper import sweep, sweeper_handler
from leaseguard.testing import LambdaContext
from tests.conftest import let_leases_expire

TTL = 3_000


@pytest.fixture
def fake_aws(fake_aws_env: None, monkeypatch: Any) -> None:
    for name in ("LEASEGUARD_WORKER_FUNCTION", "LEASEGUARD_HANDOFF_QUEUE_URL"):
        monkeypatch.delenv(name, raising=False)


def test_a_sweep_delivers_what_a_dead_owner_left(
    provider: BaseLeaseProvider, fake_aws: None
) -> None:
    """The owner of ``k`` dies with two events queued behind it; one pass of the handler
    adopts the key and sends its head by SQS, and the guarded function that receives the
    envelope runs the dead owner's event and the queued ones, in order."""
    ran: list[str] = []

    @lease_owned(
        lambda e: e["k"], provider=provider, ttl_ms=TTL, signal_id_fn=lambda e, c: e["n"],
        handoff="inline",
    )  # fmt: skip
    def worker(event: dict[str, Any], context: Any) -> str:
        ran.append(event["n"])
        return str(event["n"])

    assert provider.acquire_or_enqueue("k", Signal("dead", {"k": "k", "n": "dead"}), TTL).acquired
    for name in ("q1", "q2"):
        provider.acquire_or_enqueue("k", Signal(name, {"k": "k", "n": name}), TTL)
    with mock_aws():
        sqs = boto3.client("sqs")
        url = sqs.create_queue(QueueName="handoffs")["QueueUrl"]
        handler = sweeper_handler(provider, queue_url=url, ttl_ms=TTL)
        assert handler({}, LambdaContext()) == {"dispatched": 0, "keys": []}  # alive yet
        let_leases_expire(provider, ("k", "dead"))
        assert handler({}, LambdaContext()) == {"dispatched": 1, "keys": ["k"]}
        assert handler({}, LambdaContext()) == {"dispatched": 0, "keys": []}  # granted now
        (message,) = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert json.loads(message["Body"])["leaseguard_handoff"]["owner"] == "dead"
    record = {"eventSource": "aws:sqs", "messageId": message["MessageId"], "body": message["Body"]}
    worker(record, LambdaContext())
    assert ran == ["dead", "q1", "q2"]
    state = provider.inspect_key("k")
    assert state.owner is None and not state.queued and not state.in_flight


def test_the_sweeper_is_configured_from_the_environment_and_checked_at_init(
    fake_aws: None, monkeypatch: Any
) -> None:
    with pytest.raises(ConfigurationError, match="LEASEGUARD_WORKER_FUNCTION"):
        sweeper_handler()
    monkeypatch.setenv("LEASEGUARD_SWEEP_LIMIT", "0")
    monkeypatch.setenv("LEASEGUARD_WORKER_FUNCTION", "worker")
    with pytest.raises(Exception, match="limit must be positive"):
        sweeper_handler()
    monkeypatch.setenv("LEASEGUARD_SWEEP_LIMIT", "many")
    with pytest.raises(ConfigurationError, match="LEASEGUARD_SWEEP_LIMIT"):
        sweeper_handler()
    monkeypatch.delenv("LEASEGUARD_SWEEP_LIMIT")
    from leaseguard import sweeper

    assert isinstance(sweeper._dispatcher(None, None), InvokeDispatcher)
    monkeypatch.setenv("LEASEGUARD_HANDOFF_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/1/q")
    assert isinstance(sweeper._dispatcher(None, None), SqsDispatcher)  # the queue wins


def test_sweep_takes_an_explicit_dispatcher(provider: BaseLeaseProvider) -> None:
    sent: list[Any] = []

    class Recording:
        def dispatch(self, envelope: Any) -> None:
            sent.append(envelope)

    provider.acquire_or_enqueue("k", Signal("dead", {"n": "dead"}), TTL)
    let_leases_expire(provider, ("k", "dead"))
    (envelope,) = sweep(provider, Recording(), ttl_ms=TTL)
    assert sent == [envelope] and (envelope.key, envelope.owner) == ("k", "dead")
