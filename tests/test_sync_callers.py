"""A caller that waits for its answer (API Gateway, function URLs, ALB, or ``caller_waits=True``)
is answered after its own run: with ``handoff="auto"`` the owner hands whatever was queued
behind it to a new invocation instead of running it first, however much time is left. Async
sources (SQS records, async invokes, hand-off envelopes) keep draining inline until the
deadline is near. On every backend (``provider`` fixture); hand-offs go to a recording Lambda
(or SQS) client and are delivered by calling the handler again, as Lambda would.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import pytest

from leaseguard import ConfigurationError, HandoffConfig, Signal, current_lease, lease_owned
from leaseguard.events import caller_waits
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.testing import LambdaContext

from .conftest import let_leases_expire
from .handoffs import RecordingLambda

TTL = 5_000
FOLLOW_UPS = 3


def http_api(key: str, text: str) -> dict[str, Any]:
    return {
        "version": "2.0",
        "routeKey": "POST /items/{k}",
        "requestContext": {"http": {"method": "POST"}, "requestId": text},
        "pathParameters": {"k": key},
        "body": text,
    }


def rest_api(key: str, text: str) -> dict[str, Any]:
    return {
        "resource": "/items/{k}",
        "httpMethod": "POST",
        "requestContext": {"resourcePath": "/items/{k}"},
        "pathParameters": {"k": key},
        "body": text,
    }


def function_url(key: str, text: str) -> dict[str, Any]:
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": f"/items/{key}",
        "requestContext": {"domainName": "abc.lambda-url.us-east-1.on.aws", "http": {}},
        "pathParameters": {"k": key},
        "body": text,
    }


def alb(key: str, text: str) -> dict[str, Any]:
    return {
        "requestContext": {"elb": {"targetGroupArn": "arn:aws:elasticloadbalancing:tg"}},
        "httpMethod": "POST",
        "path": f"/items/{key}",
        "pathParameters": {"k": key},
        "body": text,
    }


def async_event(key: str, text: str) -> dict[str, Any]:
    """What an async Invoke (or EventBridge, or a direct call) delivers: no caller waits."""
    return {"pathParameters": {"k": key}, "body": text}


SYNC_SOURCES = [http_api, rest_api, function_url, alb]


class Work:
    """The handler: notes each run's text; ``gate`` holds the run of ``"own"`` inside its
    lease."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.gate, self.inside = threading.Event(), threading.Event()

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        current_lease()  # it runs under the key's lease
        self.ran.append(event["body"])
        if event["body"] == "own":
            self.inside.set()
            assert self.gate.wait(10)
        return {"statusCode": 200, "body": event["body"]}


def contend(
    handler: Any, work: Work, first: dict[str, Any], follow: Any, context: LambdaContext
) -> tuple[Any, list[str]]:
    """``first`` owns key ``k`` while ``FOLLOW_UPS`` events are forwarded to it; then it
    finishes. Its answer, and what had run when it answered."""
    answer: dict[str, Any] = {}
    owner = threading.Thread(target=lambda: answer.update(value=handler(first, context)))
    owner.start()
    assert work.inside.wait(10)
    for n in range(FOLLOW_UPS):
        forwarded = handler(follow("k", f"f{n}"), LambdaContext())
        body = json.loads(forwarded["body"]) if "statusCode" in forwarded else forwarded
        assert body["leaseguard"]["status"] == "forwarded"
    work.gate.set()
    owner.join(10)
    assert not owner.is_alive()
    return answer["value"], list(work.ran)


@pytest.mark.parametrize("source", SYNC_SOURCES, ids=lambda s: s.__name__)
def test_a_waiting_caller_is_answered_after_its_own_run(
    provider: BaseLeaseProvider, source: Any
) -> None:
    work, client = Work(), RecordingLambda()
    handler = lease_owned(
        "pathParameters.k",
        provider=provider,
        ttl_ms=TTL,
        handoff=HandoffConfig(lambda_client=client),
    )(work)
    # 30 s left: the deadline alone would let the owner run all three inline
    answer, ran = contend(handler, work, source("k", "own"), source, LambdaContext())
    assert answer == {"statusCode": 200, "body": "own"}
    assert ran == ["own"]  # nobody else's event ran before the caller was answered
    envelopes = client.pending()
    assert len(envelopes) == 1 and envelopes[0]["leaseguard_handoff"]["key"] == "k"
    assert provider.get_lease_owner("k") == envelopes[0]["leaseguard_handoff"]["owner"]
    # The receiver was invoked asynchronously (no caller waits): it drains the rest inline.
    answers = client.deliver(handler)
    assert answers == [{"statusCode": 200, "body": "f0"}]  # its answer: the signal it claimed
    assert work.ran == ["own", "f0", "f1", "f2"]  # each once, in order
    assert len(client.invokes) == 1  # the receiver handed nothing off
    assert provider.get_lease_owner("k") is None


@pytest.mark.parametrize("drain_batch", [0, 2])
def test_an_async_owner_still_drains_inline_while_time_is_left(
    provider: BaseLeaseProvider, drain_batch: int
) -> None:
    work, client = Work(), RecordingLambda()
    handler = lease_owned(
        "pathParameters.k",
        provider=provider,
        ttl_ms=TTL,
        handoff=HandoffConfig(lambda_client=client, drain_batch=drain_batch),
    )(work)
    answer, _ = contend(handler, work, async_event("k", "own"), http_api, LambdaContext())
    assert answer == {"statusCode": 200, "body": "own"}
    assert work.ran == ["own", "f0", "f1", "f2"]  # run inline, before it returned
    assert client.invokes == [] and provider.get_lease_owner("k") is None


def test_an_async_owner_near_its_deadline_hands_off(provider: BaseLeaseProvider) -> None:
    """2 s left at most, less than ``handoff_margin_ms`` (3 s): the deadline logic hands off."""
    work, client = Work(), RecordingLambda()
    handler = lease_owned(
        "pathParameters.k",
        provider=provider,
        ttl_ms=TTL,
        handoff=HandoffConfig(lambda_client=client),
    )(work)
    context = LambdaContext(timeout_ms=2_000)
    answer, _ = contend(handler, work, async_event("k", "own"), async_event, context)
    assert answer["body"] == "own" and work.ran == ["own"] and len(client.pending()) == 1
    client.deliver(handler)
    assert work.ran == ["own", "f0", "f1", "f2"]


def test_a_waiting_callers_drain_batch_hands_off_too(provider: BaseLeaseProvider) -> None:
    """With ``drain_batch`` the HTTP owner still answers first; the receiver runs the batch."""
    work, client = Work(), RecordingLambda()
    handler = lease_owned(
        "pathParameters.k",
        provider=provider,
        ttl_ms=TTL,
        handoff=HandoffConfig(lambda_client=client, drain_batch=5),
    )(work)
    answer, ran = contend(handler, work, http_api("k", "own"), http_api, LambdaContext())
    assert answer["body"] == "own" and ran == ["own"]
    client.deliver(handler)
    assert work.ran == ["own", "f0", "f1", "f2"] and len(client.invokes) == 1


@pytest.mark.parametrize(
    ("setting", "source", "inline"),
    [
        (True, async_event, False),  # a RequestResponse Invoke: its caller waits
        (False, http_api, True),  # the old behaviour: drain inline under the deadline
        (None, async_event, True),
        (None, http_api, False),
    ],
)
def test_caller_waits_overrides_the_event_source(
    provider: BaseLeaseProvider, setting: bool | None, source: Any, inline: bool
) -> None:
    work, client = Work(), RecordingLambda()
    handler = lease_owned(
        "pathParameters.k",
        provider=provider,
        ttl_ms=TTL,
        handoff=HandoffConfig(lambda_client=client, caller_waits=setting),
    )(work)
    contend(handler, work, source("k", "own"), source, LambdaContext())
    assert work.ran == (["own", "f0", "f1", "f2"] if inline else ["own"])
    assert len(client.invokes) == (0 if inline else 1)
    client.deliver(handler)  # a receiver never counts as waited on, whatever the setting
    assert work.ran == ["own", "f0", "f1", "f2"] and len(client.invokes) == (0 if inline else 1)


def test_without_a_way_to_hand_off_a_waiting_caller_gets_its_answer_late_and_is_told(
    provider: BaseLeaseProvider, caplog: pytest.LogCaptureFixture
) -> None:
    """No ``queue_url`` and a context naming no function: nothing can take the queue, so it
    runs inline (every event still runs once, in order) and a warning says the caller waited."""
    work = Work()
    handler = lease_owned("pathParameters.k", provider=provider, ttl_ms=TTL)(work)
    with caplog.at_level(logging.WARNING, logger="leaseguard"):
        answer, _ = contend(
            handler, work, http_api("k", "own"), http_api, LambdaContext(function_arn="")
        )
    assert answer["body"] == "own" and work.ran == ["own", "f0", "f1", "f2"]
    assert any("caller waits" in r.getMessage() for r in caplog.records), caplog.text


class RecordingSqs:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send_message(self, **params: Any) -> dict[str, Any]:
        self.sent.append(params)
        return {"MessageId": str(len(self.sent))}


def test_a_waiting_caller_hands_off_through_sqs_when_queue_url_is_set(
    provider: BaseLeaseProvider,
) -> None:
    work, sqs, client = Work(), RecordingSqs(), RecordingLambda()
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/handoffs"
    handler = lease_owned(
        "pathParameters.k",
        provider=provider,
        ttl_ms=TTL,
        handoff=HandoffConfig(queue_url=url, sqs_client=sqs, lambda_client=client),
    )(work)
    contend(handler, work, http_api("k", "own"), http_api, LambdaContext())
    assert work.ran == ["own"] and client.invokes == []
    assert [m["QueueUrl"] for m in sqs.sent] == [url]
    envelope = json.loads(sqs.sent[0]["MessageBody"])
    assert handler(envelope, LambdaContext())["body"] == "f0"  # delivered as SQS would
    assert work.ran == ["own", "f0", "f1", "f2"]


def test_an_adopting_waiting_caller_runs_the_orphans_and_its_own_event_then_hands_off(
    provider: BaseLeaseProvider,
) -> None:
    """A dead owner left ``orphan`` in flight and ``before`` queued: FIFO order puts both before
    the HTTP caller's own event (the one case where that caller waits for others' runs); what
    is queued behind its own event is handed off."""
    provider.acquire_or_enqueue("k", Signal("dead-owner", http_api("k", "orphan")), TTL)
    provider.acquire_or_enqueue("k", Signal("queued", http_api("k", "before")), TTL)
    let_leases_expire(provider, ("k", "dead-owner"))
    work, client = Work(), RecordingLambda()
    handler = lease_owned(
        "pathParameters.k",
        provider=provider,
        ttl_ms=TTL,
        handoff=HandoffConfig(lambda_client=client),
    )(work)
    answer, ran = contend(handler, work, http_api("k", "own"), http_api, LambdaContext())
    assert answer == {"statusCode": 200, "body": "own"}
    assert ran == ["orphan", "before", "own"] and len(client.pending()) == 1
    client.deliver(handler)
    assert work.ran == ["orphan", "before", "own", "f0", "f1", "f2"]


def test_caller_waits_detection_and_its_setting_is_checked() -> None:
    for source in SYNC_SOURCES:
        assert caller_waits(source("k", "x")), source.__name__
    sqs = {"eventSource": "aws:sqs", "body": "{}", "messageId": "m"}
    assert not caller_waits(sqs) and not caller_waits(async_event("k", "x"))
    assert not caller_waits({"Records": [sqs]})
    with pytest.raises(ConfigurationError, match="caller_waits"):
        lease_owned("k", handoff=HandoffConfig(caller_waits="yes"))(lambda event, context: None)  # type: ignore[arg-type]
