"""The guard's parts on their own: the hand-off policy and the responses an event source gets.

The end-to-end behaviour is in test_guard.py; these pin each part's rules so a change to one is
seen where it is made.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from leaseguard.errors import PayloadTooLarge, QueueFull
from leaseguard.guard import GuardOptions, HandoffConfig, HandoffPolicy, RetryConfig
from leaseguard.guard.responses import Outcome, Status, chain_result, queue_full, too_large
from leaseguard.handoff import InvokeDispatcher, SqsDispatcher
from leaseguard.testing import LambdaContext

API_EVENT = {"httpMethod": "POST", "requestContext": {"requestId": "r"}, "body": "{}"}
SQS_RECORD = {"eventSource": "aws:sqs", "body": "{}", "messageId": "m"}
QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/handoff"


def policy(**settings: Any) -> HandoffPolicy:
    handoff = HandoffConfig(
        settings.pop("handoff", "auto"),
        margin_ms=settings.pop("handoff_margin_ms", 1_000),
        queue_url=settings.pop("queue_url", None),
        lambda_client=object(),
        sqs_client=object(),
    )
    options = GuardOptions.build(
        "handler",
        ttl_ms=3_000,
        renew_every_ms=None,
        handoff=handoff,
        retries=RetryConfig(),
        max_queue=None,
        on_lost=None,
        on_signal_error=None,
        signal_id_fn=None,
    )
    assert not settings, settings
    return HandoffPolicy(options)


def context(remaining_ms: int, arn: str | None = None) -> LambdaContext:
    return LambdaContext(timeout_ms=remaining_ms, function_arn=arn)


def test_auto_runs_inline_while_the_deadline_leaves_margin_plus_the_longest_run() -> None:
    auto = policy()
    assert auto.place_next(context(10_000), longest_ms=5_000) == "inline"
    # 10 s left, 1 s margin: a run as long as 9 s so far might not fit again.
    assert auto.place_next(context(10_000), longest_ms=9_500) == "remote"
    assert isinstance(auto.dispatcher(context(10_000)), InvokeDispatcher)


def test_without_a_context_everything_runs_inline_and_a_forced_mode_says_so() -> None:
    assert policy().place_next(None, longest_ms=1e9) == "inline"
    assert policy(handoff="invoke").place_next(None, 0) == "inline, cannot dispatch"
    # A context that names no function cannot be invoked; SQS still works.
    assert policy(handoff="invoke").place_next(context(10_000, arn=""), 0) == (
        "inline, cannot dispatch"
    )
    sqs = policy(handoff="sqs", queue_url=QUEUE)
    assert sqs.place_next(None, 0) == "remote"
    assert isinstance(sqs.dispatcher(None), SqsDispatcher)


def test_inline_never_dispatches_and_forced_modes_always_do() -> None:
    assert policy(handoff="inline").place_next(context(1), longest_ms=1e9) == "inline"
    assert policy(handoff="invoke").place_next(context(600_000), 0) == "remote"


def test_api_gateway_never_gets_a_raw_body() -> None:
    # An adopted chain that stopped before the invocation's own event, and a failed queued
    # signal, both answer 202 with a JSON body; a raw dict would make a REST API answer 502.
    failed = Outcome(error=RuntimeError("boom"))
    for outcome, fate, status in [
        (None, Status.RETRIED, "queued"),
        (failed, Status.RETRIED, "retried"),
        (failed, Status.DEAD_LETTERED, "dead_lettered"),
        (failed, Status.HALTED, "halted"),
    ]:
        answer = chain_result(API_EVENT, "k", "sig", outcome, own_event=False, fate=fate)
        assert answer["statusCode"] == 202
        assert json.loads(answer["body"])["leaseguard"]["status"] == status
    assert chain_result(API_EVENT, "k", "sig", Outcome(value={"ok": 1}), own_event=True) == {
        "ok": 1
    }


def test_a_failed_own_event_re_raises_so_the_platform_retries_it() -> None:
    error = RuntimeError("boom")
    with pytest.raises(RuntimeError) as raised:
        chain_result(SQS_RECORD, "k", "sig", Outcome(error=error), own_event=True)
    assert raised.value is error


def test_refusals_are_http_for_api_gateway_and_errors_elsewhere() -> None:
    full = QueueFull("k", 5, 5, holder="owner")
    answer = queue_full(API_EVENT, full)
    assert answer["statusCode"] == 429 and answer["headers"]["retry-after"] == "1"
    assert json.loads(answer["body"])["leaseguard"]["max_queue"] == 5
    with pytest.raises(QueueFull):
        queue_full(SQS_RECORD, full)
    assert "reason" not in json.loads(answer["body"])["leaseguard"]
    by_size = QueueFull("k", 0, 1000, why="its DynamoDB lease item holds 300,000 bytes")
    body = json.loads(queue_full(API_EVENT, by_size)["body"])["leaseguard"]
    assert (body["depth"], body["max_queue"], body["reason"]) == (0, 1000, by_size.why)
    large = PayloadTooLarge(7 * 2**20, 6 * 2**20)
    assert too_large(API_EVENT, large)["statusCode"] == 413
    with pytest.raises(PayloadTooLarge):
        too_large(SQS_RECORD, large)
