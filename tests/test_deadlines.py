"""The owner stops draining before the Lambda deadline in every integration, batch record
handlers that are not given the context included, and what it hands off runs later.

The end-to-end tests run README.md's SQS example as it is written: a 4 s timeout, 20 records of
one order queued while another invocation holds it, 300 ms each. Every run must end at least
``handoff_margin_ms`` (less a little scheduling slack) before its own invocation's deadline, and
every record must run exactly once, in order; envelopes the stubbed Lambda client was asked to
``Invoke`` are delivered by calling the handler again, as Lambda would.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.batch.exceptions import UnexpectedBatchTypeError
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from moto import mock_aws

from leaseguard import HandoffConfig, InMemoryLeaseProvider, aws, current_lease, lease_owned
from leaseguard import config as config_module
from leaseguard.batch import (
    current_lambda_context,
    envelope_batch,
    handle_envelopes,
    invocation_context,
)
from leaseguard.guard import DEFAULT_HANDOFF_MARGIN_MS
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.testing import LambdaContext
from tests.test_guard_integrations import sqs_record
from tests.test_readme import block, run

TIMEOUT_MS = 4_000
WORK_S = 0.3
RECORDS = 20
SLACK_MS = 100  # a run may take a few ms longer than the slowest one before it


class StubLambda:
    """Records async Invokes instead of making them."""

    def __init__(self) -> None:
        self.invokes: list[dict[str, Any]] = []

    def invoke(self, **params: Any) -> dict[str, Any]:
        assert params["InvocationType"] == "Event"
        self.invokes.append(params)
        return {"StatusCode": 202}


@dataclass
class Run:
    note: Any
    invocation: str
    remaining_at_end_ms: int
    took_ms: float


@dataclass
class Work:
    """The record handler's work: ``hold`` blocks until released, a number takes 300 ms.
    Each run notes which invocation it ran in (its context's request id) and how much of that
    invocation's time was left when it ended."""

    holding: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    runs: list[Run] = field(default_factory=list)

    def __call__(self, body: dict[str, Any], context: Any = None) -> None:
        context = context or current_lambda_context()
        started = time.monotonic()
        if body["note"] == "hold":
            self.holding.set()
            assert self.release.wait(10)
        else:
            time.sleep(WORK_S)
        self.runs.append(
            Run(
                body["note"],
                context.aws_request_id,
                context.get_remaining_time_in_millis(),
                (time.monotonic() - started) * 1000,
            )
        )


@pytest.fixture
def env_backend(monkeypatch: pytest.MonkeyPatch, provider: BaseLeaseProvider) -> BaseLeaseProvider:
    """The README example builds its provider from the environment: here, each backend's."""
    monkeypatch.setattr(config_module, "provider_from_env", lambda: provider)
    return provider


@pytest.fixture
def stub_lambda(monkeypatch: pytest.MonkeyPatch) -> StubLambda:
    """What ``aws.default_client("lambda")`` returns for the README example, which passes none."""
    stub = StubLambda()
    made = aws.default_client
    monkeypatch.setattr(aws, "default_client", lambda s: stub if s == "lambda" else made(s))
    return stub


def drive(
    handler: Callable[[Any, Any], Any], work: Work, stub: StubLambda, order: str = "A"
) -> list[str]:
    """Another invocation holds ``order`` while a batch of 20 records for it arrives; then the
    holder drains and every envelope it (or a later invocation) sends is delivered. Returns
    the request ids of the invocations, in order."""
    holder_context = LambdaContext(timeout_ms=TIMEOUT_MS, aws_request_id="inv-0-holder")
    holder = threading.Thread(
        target=handler, args=({"Records": [sqs_record("m-hold", order, "hold")]}, holder_context)
    )
    holder.start()
    assert work.holding.wait(10)
    batch = {"Records": [sqs_record(f"m{n}", order, n) for n in range(RECORDS)]}
    assert handler(batch, LambdaContext(timeout_ms=TIMEOUT_MS)) == {"batchItemFailures": []}
    assert [r.note for r in work.runs] == []  # all 20 were queued for the holder
    # The holder's deadline counts from here: queueing 20 records on a loaded machine (moto)
    # can take longer than its whole timeout, which is no run of the drain's doing.
    holder_context.started_at = time.monotonic()
    work.release.set()
    holder.join(30)
    invocations = [holder_context.aws_request_id]
    while stub.invokes:
        params = stub.invokes.pop(0)
        assert params["FunctionName"] == holder_context.invoked_function_arn
        context = LambdaContext(timeout_ms=TIMEOUT_MS, aws_request_id=f"inv-{len(invocations)}")
        invocations.append(context.aws_request_id)
        response = handler(json.loads(params["Payload"]), context)
        assert response == {"batchItemFailures": []}, response
        assert len(invocations) < 40, "handoffs do not converge"
    return invocations


def check_deadlines(work: Work, invocations: list[str], margin_ms: int) -> dict[str, list[Any]]:
    ran = [r.note for r in work.runs if r.note != "hold"]
    assert ran == list(range(RECORDS)), ran  # nothing lost, nothing twice, in order
    for run_ in work.runs:
        assert run_.remaining_at_end_ms > 0, run_  # never past the deadline
        # The owner decides before its hand-off call, which a slow backend (moto under load)
        # stretches: half the margin is left however slow, never none.
        assert run_.remaining_at_end_ms >= margin_ms // 2 - SLACK_MS, run_
    where = {inv: [r.note for r in work.runs if r.invocation == inv] for inv in invocations}
    assert all(where.values()), where  # every delivered envelope ran something
    assert len(invocations) > 2  # the drain really was cut by the deadline, more than once
    print(
        "\n"
        + "\n".join(
            f"{inv}: {notes} (last ended {min(r.remaining_at_end_ms for r in work.runs if r.invocation == inv)} ms before its deadline)"  # noqa: E501
            for inv, notes in where.items()
        )
    )
    return where


def test_readme_sqs_example_stops_before_the_deadline_and_hands_off_the_rest(
    env_backend: BaseLeaseProvider, stub_lambda: StubLambda
) -> None:
    work = Work()
    handler = run(block("process_partial_response"), fulfil=work)["handler"]
    invocations = drive(handler, work, stub_lambda)
    check_deadlines(work, invocations, DEFAULT_HANDOFF_MARGIN_MS)
    state = env_backend.inspect_key("A")  # the last owner released it, nothing left
    assert state.owner is None and not state.queued and not state.in_flight


def test_record_handler_with_lambda_context_stops_before_the_deadline() -> None:
    provider, stub, work = InMemoryLeaseProvider(), StubLambda(), Work()
    processor = BatchProcessor(event_type=EventType.SQS)
    margin = 1_000
    contexts: list[Any] = []

    @lease_owned(
        lambda record: record.json_body["orderId"],
        provider=provider,
        handoff=HandoffConfig(margin_ms=margin, lambda_client=stub),
    )
    def record_handler(record: SQSRecord, lambda_context: Any) -> None:
        assert isinstance(record, SQSRecord)
        contexts.append(lambda_context)
        work(record.json_body, lambda_context)

    @handle_envelopes
    def handler(event: dict[str, Any], context: Any) -> Any:
        return process_partial_response(event, record_handler, processor, context)

    invocations = drive(handler, work, stub)
    where = check_deadlines(work, invocations, margin)
    assert all(isinstance(c, LambdaContext) for c in contexts)
    # A smaller margin: more runs fit in one invocation (4 s - 1 s margin, 300 ms each).
    assert max(len(notes) for notes in where.values()) >= 7


def test_without_handle_envelopes_the_deadline_comes_from_the_batch_processor() -> None:
    """``record_handler(record)`` from a plain ``process_partial_response``: the guard reads
    the context the processor holds. The Invoke handoff itself then needs
    ``@handle_envelopes``: without it the envelope is not an SQS batch."""
    provider, stub, work = InMemoryLeaseProvider(), StubLambda(), Work()

    @lease_owned(
        lambda record: record.json_body["orderId"],
        provider=provider,
        handoff=HandoffConfig(lambda_client=stub),
    )
    def record_handler(record: SQSRecord) -> None:
        work(record.json_body, current_lambda_context())

    def make_handler() -> Callable[[Any, Any], Any]:
        # One processor per execution environment: Lambda never runs two invocations in one
        # at once, but this test runs two in one process (the processor keeps the context).
        processor = BatchProcessor(event_type=EventType.SQS)

        def handler(event: dict[str, Any], context: Any) -> Any:
            return process_partial_response(event, record_handler, processor, context)

        return handler

    holder_context = LambdaContext(timeout_ms=TIMEOUT_MS, aws_request_id="holder")
    holder = threading.Thread(
        target=make_handler(),
        args=({"Records": [sqs_record("h", "B", "hold")]}, holder_context),
    )
    holder.start()
    assert work.holding.wait(10)
    handler = make_handler()
    handler({"Records": [sqs_record(f"b{n}", "B", n) for n in range(8)]}, LambdaContext())
    work.release.set()
    holder.join(30)
    ran = [r.note for r in work.runs if r.note != "hold"]
    assert 0 < len(ran) < 8 and len(stub.invokes) == 1  # cut by the deadline, handed off
    assert {r.invocation for r in work.runs} == {"holder"}
    assert all(r.remaining_at_end_ms >= DEFAULT_HANDOFF_MARGIN_MS - SLACK_MS for r in work.runs)
    envelope = json.loads(stub.invokes.pop(0)["Payload"])
    with pytest.raises(UnexpectedBatchTypeError):
        handler(envelope, LambdaContext())
    # Routed through handle_envelopes, the same envelope runs the rest.
    assert handle_envelopes(handler)(envelope, LambdaContext()) == {"batchItemFailures": []}
    while stub.invokes:
        handle_envelopes(handler)(json.loads(stub.invokes.pop(0)["Payload"]), LambdaContext())
    assert [r.note for r in work.runs if r.note != "hold"] == list(range(8))


def test_sqs_handoff_through_moto_queue_runs_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    """``queue_url=``: the rest goes to an SQS queue (moto) that triggers the same function;
    its messages are delivered as ordinary SQS batches."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="orders")["QueueUrl"]
        provider, work = InMemoryLeaseProvider(), Work()
        processor = BatchProcessor(event_type=EventType.SQS)

        @lease_owned(
            lambda record: record.json_body["orderId"],
            provider=provider,
            handoff=HandoffConfig(queue_url=url, sqs_client=sqs, margin_ms=1_000),
        )
        def record_handler(record: SQSRecord) -> None:
            work(record.json_body)

        @handle_envelopes
        def handler(event: dict[str, Any], context: Any) -> Any:
            return process_partial_response(event, record_handler, processor, context)

        holder = threading.Thread(
            target=handler,
            args=({"Records": [sqs_record("h", "C", "hold")]}, LambdaContext(timeout_ms=2_000)),
        )
        holder.start()
        assert work.holding.wait(10)
        handler({"Records": [sqs_record(f"c{n}", "C", n) for n in range(6)]}, LambdaContext())
        work.release.set()
        holder.join(30)
        deliveries = 0
        while True:
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
            messages = got.get("Messages", [])
            if not messages:
                break
            deliveries += 1
            records = [
                {**sqs_record(m["MessageId"], "?", None), "body": m["Body"]} for m in messages
            ]
            context = LambdaContext(timeout_ms=2_000)
            assert handler({"Records": records}, context) == {"batchItemFailures": []}
            for m in messages:
                sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        assert deliveries >= 1
        assert [r.note for r in work.runs if r.note != "hold"] == list(range(6))
        assert all(r.remaining_at_end_ms >= 1_000 - SLACK_MS for r in work.runs)


def test_invocation_context_and_envelope_batch() -> None:
    context = LambdaContext(function_arn="arn:aws:lambda:eu-west-1:1:function:f")
    assert current_lambda_context() is None
    with invocation_context(context):
        assert current_lambda_context() is context
    assert current_lambda_context() is None
    batch = envelope_batch({"leaseguard_handoff": {"version": 1}}, context)
    (record,) = batch["Records"]
    assert record["eventSource"] == "aws:sqs" and record["awsRegion"] == "eu-west-1"
    assert json.loads(record["body"]) == {"leaseguard_handoff": {"version": 1}}


def test_a_forged_envelope_through_handle_envelopes_runs_nothing() -> None:
    provider, work = InMemoryLeaseProvider(), Work()
    processor = BatchProcessor(event_type=EventType.SQS)

    @lease_owned(lambda record: record.json_body["orderId"], provider=provider)
    def record_handler(record: SQSRecord) -> Any:
        work(record.json_body)

    @handle_envelopes
    def handler(event: dict[str, Any], context: Any) -> Any:
        return process_partial_response(event, record_handler, processor, context)

    forged = {"leaseguard_handoff": {"version": 1, "key": "A", "owner": "x", "token": 7}}
    assert handler(forged, LambdaContext()) == {"batchItemFailures": []}
    malformed = {"leaseguard_handoff": {"version": 1, "key": "A"}}
    assert handler(malformed, LambdaContext()) == {"batchItemFailures": []}
    assert work.runs == []


async def _async_case() -> list[Any]:
    seen: list[Any] = []

    @lease_owned(lambda e: e["k"], provider=InMemoryLeaseProvider())
    async def guarded(event: dict[str, Any], context: Any = None) -> None:
        seen.append(current_lambda_context())

    @handle_envelopes
    async def handler(event: dict[str, Any], context: Any) -> None:
        await guarded(event)  # called without the context

    context = LambdaContext()
    await handler({"k": "x"}, context)
    return [context, *seen]


def test_async_handle_envelopes_sets_the_context() -> None:
    import asyncio

    context, seen = asyncio.run(_async_case())
    assert seen is context


def test_a_direct_call_without_a_context_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    @lease_owned(
        lambda e: e["k"], provider=InMemoryLeaseProvider(), logger=logging.getLogger("lg.t")
    )
    def handler(event: dict[str, Any]) -> str:
        return current_lease().key

    with caplog.at_level(logging.WARNING, logger="lg.t"):
        assert handler({"k": "x"}) == "x"
        assert handler({"k": "y"}) == "y"
    warned = [r for r in caplog.records if "without a Lambda context" in r.getMessage()]
    assert len(warned) == 1
