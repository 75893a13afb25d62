"""Retries with a delay (``RetryConfig(delay_ms=...)``, leaseguard/guard/retries.py): a failed
forwarded event waits before its next run with no invocation waiting for it, on every backend
and every hand-off path, and the wait is never charged as a run.

The model checker holds the guard's retry wait to invariant (o) (docs/protocol.md); these
tests run it on the real backends: the wait on an unclaimed grant whose TTL is the delay (an
Invoke hand-off, inline only), and the wait of an SQS envelope sent with ``DelaySeconds``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import boto3
import pytest
from moto import mock_aws

from leaseguard import ConfigurationError, HandoffConfig, RetryConfig, lease_owned
from leaseguard.guard.retries import MAX_RETRY_DELAY_MS, retry_delay_ms
from leaseguard.handoff import Envelope
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.testing import LambdaContext
from tests.conftest import let_leases_expire

TTL = 3_000


def _by_name(event: dict[str, Any], context: Any) -> str:
    return str(event["n"])


def _flaky(
    provider: BaseLeaseProvider,
    calls: list[str],
    *,
    delay_ms: int | None = None,
    handoff: Any = "inline",
) -> Any:
    """A guarded handler whose first run of ``s1`` raises; the owner ``o`` forwards ``s1``
    from inside its own run, so that ``s1`` is queued behind it and handed the key."""
    retries = RetryConfig(max_attempts=3, delay_ms=delay_ms)

    @lease_owned(
        lambda e: e["k"], provider=provider, ttl_ms=TTL, signal_id_fn=_by_name, handoff=handoff,
        retries=retries,
    )  # fmt: skip
    def handler(event: dict[str, Any], context: Any) -> Any:
        if "leaseguard_handoff" in event:
            raise AssertionError("an envelope reached the handler")
        calls.append(event["n"])
        if event["n"] == "o":
            forwarded = handler({"k": "k", "n": "s1"}, LambdaContext())
            assert forwarded["leaseguard"]["position"] == 1, forwarded  # queued, not run
        if event["n"] == "s1" and calls.count("s1") == 1:
            raise RuntimeError("flaky downstream")
        return event["n"]

    return handler


def test_the_delay_doubles_is_capped_and_jittered_deterministically() -> None:
    delays = [retry_delay_ms(1_000, 5_000, "k", "s", attempts) for attempts in range(1, 6)]
    nominal = [1_000, 2_000, 4_000, 5_000, 5_000]
    assert all(n // 2 <= d < n for d, n in zip(delays, nominal, strict=True)), delays
    assert delays == [retry_delay_ms(1_000, 5_000, "k", "s", a) for a in range(1, 6)]
    spread = {retry_delay_ms(1_000, 5_000, "k", f"s{n}", 1) for n in range(20)}
    assert len(spread) > 10  # retries of different signals do not all wake together
    assert retry_delay_ms(0, 5_000, "k", "s", 3) == 0


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"delay_ms": -1}, "retry delay_ms must be positive"),
        ({"delay_ms": MAX_RETRY_DELAY_MS + 1}, "retry delay_ms must be at most"),
        ({"max_delay_ms": 0}, "retry max_delay_ms must be positive"),
        ({"delay_ms": 1.5}, "retry delay_ms must be an int"),
    ],
)
def test_bad_retry_delays_are_refused_at_decoration(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        lease_owned("k", retries=RetryConfig(**options))(lambda event, context: None)


def test_a_failed_forwarded_event_waits_on_an_unclaimed_grant_whose_ttl_is_its_delay(
    provider: BaseLeaseProvider,
) -> None:
    """Inline (or by Invoke, which has no delay): after its failed run the signal is granted
    the key again unclaimed, for exactly its delay. Nothing runs it meanwhile and events that
    arrive queue behind it; once the grant has run out, the sweeper's adoption finds it with
    one attempt (the failed run: the wait charged nothing), and it runs before them."""
    calls: list[str] = []
    delay = retry_delay_ms(20_000, 300_000, "k", "s1", 1)
    handler = _flaky(provider, calls, delay_ms=20_000)
    assert handler({"k": "k", "n": "o"}, LambdaContext()) == "o"  # answered, not held
    assert calls == ["o", "s1"]
    state = provider.inspect_key("k")
    assert state.owner == "s1" and state.in_flight == ("s1",)
    assert state.remaining_ms is not None and 0 < state.remaining_ms <= delay
    later = handler({"k": "k", "n": "s2"}, LambdaContext())  # arrives during the wait
    assert later["leaseguard"]["position"] == 1 and calls == ["o", "s1"]  # behind s1

    let_leases_expire(provider, ("k", "s1"))  # the delay is over
    ((key, adopted),) = provider.adopt_orphans(TTL, 10, claim=False)
    assert (key, adopted.id, adopted.attempts) == ("k", "s1", 1)
    assert adopted.token is not None
    envelope = Envelope("k", adopted.id, adopted.token, adopted.payload).to_event()
    handler(envelope, LambdaContext())  # the sweeper's envelope: s1 runs, then s2 inline
    assert calls == ["o", "s1", "s1", "s2"]
    state = provider.inspect_key("k")
    assert state.owner is None and not state.queued and not state.dead_letters


def test_without_a_delay_the_failed_event_runs_again_at_once(provider: BaseLeaseProvider) -> None:
    calls: list[str] = []
    handler = _flaky(provider, calls, delay_ms=0)
    handler({"k": "k", "n": "o"}, LambdaContext())
    assert calls == ["o", "s1", "s1"]
    assert provider.inspect_key("k").owner is None


def test_by_sqs_the_envelope_arrives_after_the_delay(
    provider: BaseLeaseProvider, fake_aws_env: None
) -> None:
    """With a standard SQS queue the envelope is sent with DelaySeconds (the delay rounded up
    to a second) and the grant lives the delay plus the TTL, so its receiver claims it."""
    calls: list[str] = []
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="leaseguard-handoffs")["QueueUrl"]
        handoff = HandoffConfig("sqs", queue_url=url, sqs_client=sqs)
        handler = _flaky(provider, calls, delay_ms=1_500, handoff=handoff)
        handler({"k": "k", "n": "o"}, LambdaContext())
        assert calls == ["o"]  # s1 is handed off by SQS, at once
        handler(_received(sqs, url), LambdaContext())
        assert calls == ["o", "s1"]  # its run failed: its retry's envelope waits in SQS
        state = provider.inspect_key("k")
        delay = retry_delay_ms(1_500, 300_000, "k", "s1", 1)
        assert state.owner == "s1" and state.remaining_ms is not None
        assert delay < state.remaining_ms <= delay + TTL
        assert not sqs.receive_message(QueueUrl=url).get("Messages")  # not yet
        time.sleep(-(-delay // 1000) + 0.3)
        handler(_received(sqs, url), LambdaContext())
    assert calls == ["o", "s1", "s1"]
    state = provider.inspect_key("k")
    assert state.owner is None and not state.dead_letters


def _received(sqs: Any, url: str) -> dict[str, Any]:
    """The one message on the queue, as the SQS record of a Lambda event."""
    (message,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
    assert json.loads(message["Body"])["leaseguard_handoff"]["owner"] == "s1"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    return {"eventSource": "aws:sqs", "messageId": message["MessageId"], "body": message["Body"]}


def test_a_failure_that_dead_letters_hands_off_without_waiting(
    provider: BaseLeaseProvider,
) -> None:
    """Only a signal that goes back to the queue waits: one dead-lettered by its failure
    does not hold up the events behind it."""
    calls: list[str] = []

    @lease_owned(
        lambda e: e["k"], provider=provider, ttl_ms=TTL, signal_id_fn=_by_name, handoff="inline",
        retries=RetryConfig(max_attempts=1, delay_ms=20_000),
    )  # fmt: skip
    def handler(event: dict[str, Any], context: Any) -> Any:
        calls.append(event["n"])
        if event["n"] == "o":
            for name in ("poison", "next"):
                handler({"k": "k", "n": name}, LambdaContext())
        if event["n"] == "poison":
            raise ValueError("cannot parse")
        return event["n"]

    handler({"k": "k", "n": "o"}, LambdaContext())
    assert calls == ["o", "poison", "next"]
    state = provider.inspect_key("k")
    assert [d.id for d in state.dead_letters] == ["poison"] and state.owner is None


def test_the_retry_delay_comes_from_the_environment(
    provider: BaseLeaseProvider, monkeypatch: Any
) -> None:
    monkeypatch.setenv("LEASEGUARD_RETRY_DELAY_MS", "20000")
    calls: list[str] = []
    handler = _flaky(provider, calls)
    handler({"k": "k", "n": "o"}, LambdaContext())
    assert calls == ["o", "s1"] and provider.inspect_key("k").owner == "s1"
    monkeypatch.setenv("LEASEGUARD_RETRY_DELAY_MS", "soon")
    with pytest.raises(ConfigurationError, match="LEASEGUARD_RETRY_DELAY_MS"):
        lease_owned("k")(lambda event, context: None)
