"""``@lease_owned`` among Powertools' decorators: the supported stack works end to end, the
orders that would break silently raise ConfigurationError naming the right one, and a guarded
event-handler route is refused with the supported way (guard the lambda_handler)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent,
    idempotent_function,
)
from moto import mock_aws

from leaseguard import (
    ConfigurationError,
    HandoffConfig,
    InMemoryLeaseProvider,
    current_lease,
    lease_owned,
)
from leaseguard.stacking import RECOMMENDED_STACK
from leaseguard.testing import LambdaContext

from .handoffs import RecordingLambda


@pytest.fixture
def persistence(monkeypatch: pytest.MonkeyPatch) -> Iterator[DynamoDBPersistenceLayer]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        client.create_table(
            TableName="idempotency",
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        yield DynamoDBPersistenceLayer(table_name="idempotency", boto3_client=client)


def api_event(thread: str, text: str, request: str) -> dict[str, Any]:
    return {
        "httpMethod": "POST",
        "path": f"/threads/{thread}",
        "resource": "/threads/{thread_id}",
        "pathParameters": {"thread_id": thread},
        "requestContext": {"requestId": request, "httpMethod": "POST", "path": "/"},
        "headers": {},
        "body": json.dumps({"text": text, "request": request}),
        "isBase64Encoded": False,
    }


def emf_metric_names(out: str) -> list[str]:
    names = []
    for line in out.splitlines():
        if '"_aws"' not in line:
            continue
        blob = json.loads(line)
        for directive in blob["_aws"]["CloudWatchMetrics"]:
            names += [m["Name"] for m in directive["Metrics"]]
    return names


def test_the_recommended_stack_end_to_end(
    persistence: DynamoDBPersistenceLayer, capsys: pytest.CaptureFixture[str]
) -> None:
    logger = Logger(service=f"order-{uuid.uuid4().hex}")
    metrics = Metrics(namespace="OrderTest", service="svc")
    metrics.clear_metrics()
    provider = InMemoryLeaseProvider()
    runs: list[tuple[str, int | None]] = []
    inside, release = threading.Event(), threading.Event()
    config = IdempotencyConfig(event_key_jmespath="body")

    client = RecordingLambda()

    @logger.inject_lambda_context(clear_state=True)
    @metrics.log_metrics
    @lease_owned(
        "pathParameters.thread_id",
        provider=provider,
        logger=logger,
        metrics=metrics,
        handoff=HandoffConfig(lambda_client=client),
    )
    @idempotent(persistence_store=persistence, config=config)
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        body = json.loads(event["body"])
        runs.append((body["text"], current_lease().token))
        logger.info("working", text=body["text"])
        if body["text"] == "first":
            inside.set()
            assert release.wait(10)
        return {"statusCode": 200, "body": json.dumps({"done": body["text"]})}

    owner_context = LambdaContext(aws_request_id="req-owner")
    results: dict[str, Any] = {}
    owner = threading.Thread(
        target=lambda: results.update(owner=handler(api_event("t1", "first", "r1"), owner_context))
    )
    owner.start()
    assert inside.wait(10)
    forwarded = handler(api_event("t1", "second", "r2"), LambdaContext(aws_request_id="req-fwd"))
    assert forwarded["statusCode"] == 202
    forwarded_out = capsys.readouterr().out
    release.set()
    owner.join(10)
    assert results["owner"]["statusCode"] == 200
    # The owner's caller waits: the forwarded event runs in the invocation it was handed to.
    assert [text for text, _ in runs] == ["first"]
    assert client.deliver(handler) == [{"statusCode": 200, "body": json.dumps({"done": "second"})}]
    owner_out = capsys.readouterr().out

    # Metrics: the forwarded invocation flushed its LeaseForwarded (log_metrics is outside).
    assert "LeaseForwarded" in emf_metric_names(forwarded_out)
    # (Powertools keeps one metric set per process; two invocations at once share it here.)
    flushed = emf_metric_names(forwarded_out + owner_out)
    assert {"LeaseAcquired", "LeaseHandedOff", "LeaseHoldMs"} <= set(flushed)
    # Logs: clear_state ran first, then the lease keys were added for each run.
    everything = forwarded_out + owner_out
    lines = [json.loads(x) for x in everything.splitlines() if x.startswith('{"level"')]
    working = [x for x in lines if x.get("message") == "working"]
    assert [x["text"] for x in working] == ["first", "second"]
    # (The logger's keys are process-wide too: the forwarded invocation reset them meanwhile.)
    assert working[0]["function_request_id"] == "req-owner"
    assert [x["lease_key"] for x in working] == ["t1", "t1"]
    assert [x["fencing_token"] for x in working] == [token for _, token in runs]
    assert runs[0][1] is not None and runs[1][1] is not None and runs[1][1] > runs[0][1]

    # Idempotency: the forwarded event's real result was stored by the owner's run of it, so
    # a retry of that event gets the result, not the 202, and the work does not run again.
    retry = handler(api_event("t1", "second", "r2"), LambdaContext())
    assert retry == {"statusCode": 200, "body": json.dumps({"done": "second"})}
    assert [text for text, _ in runs] == ["first", "second"]
    metrics.clear_metrics()


def test_lease_owned_outside_inject_lambda_context_clear_state_is_refused() -> None:
    logger = Logger(service=f"order-{uuid.uuid4().hex}")
    with pytest.raises(ConfigurationError) as raised:

        @lease_owned("k", provider=InMemoryLeaseProvider(), logger=logger)
        @logger.inject_lambda_context(clear_state=True)
        def handler(event: Any, context: Any) -> None: ...

    message = str(raised.value)
    # The decorator that is applied last is the outer one: here @lease_owned, over the logger.
    assert "@lease_owned on " in message
    assert " is outside (above) @logger.inject_lambda_context(clear_state=True)" in message
    assert "Put @logger.inject_lambda_context above @lease_owned" in message
    assert "is inside" not in message
    assert RECOMMENDED_STACK in message


def test_inject_lambda_context_without_clear_state_may_be_inside(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logger = Logger(service=f"order-{uuid.uuid4().hex}")

    @lease_owned("k", provider=InMemoryLeaseProvider(), logger=logger)
    @logger.inject_lambda_context
    def handler(event: Any, context: Any) -> None:
        logger.info("inside")

    handler({"k": "x"}, LambdaContext(aws_request_id="req-in"))
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    inside = next(x for x in lines if x["message"] == "inside")
    assert inside["lease_key"] == "x" and inside["function_request_id"] == "req-in"


def test_lease_owned_outside_log_metrics_is_refused() -> None:
    metrics = Metrics(namespace="OrderTest", service="svc")
    with pytest.raises(ConfigurationError) as raised:

        @lease_owned("k", provider=InMemoryLeaseProvider(), metrics=metrics)
        @metrics.log_metrics(capture_cold_start_metric=True)
        def handler(event: Any, context: Any) -> None: ...

    message = str(raised.value)
    assert " is outside (above) @metrics.log_metrics" in message and "LeaseForwarded" in message
    assert "Put @metrics.log_metrics above @lease_owned" in message
    assert "is inside" not in message
    assert RECOMMENDED_STACK in message


def test_the_recommended_stack_places_the_tracer_outside_lease_owned() -> None:
    order = [
        "@logger.inject_lambda_context",
        "@tracer.capture_lambda_handler",
        "@metrics.log_metrics",
        "@lease_owned",
        "@idempotent",
    ]
    positions = [RECOMMENDED_STACK.index(decorator) for decorator in order]
    assert positions == sorted(positions)


def test_idempotent_outside_lease_owned_is_refused_before_the_backend_is_touched(
    persistence: DynamoDBPersistenceLayer,
) -> None:
    provider = InMemoryLeaseProvider()
    ran: list[Any] = []

    @idempotent(persistence_store=persistence)
    @lease_owned("k", provider=provider)
    def handler(event: Any, context: Any) -> str:
        ran.append(event)
        return "done"

    with pytest.raises(ConfigurationError) as raised:
        handler({"k": "x"}, LambdaContext())
    assert "@idempotent is outside @lease_owned" in str(raised.value)
    assert ran == [] and provider.inspect_key("x").owner is None
    # Nothing was cached either: idempotency deletes its record when the handler raises.
    with pytest.raises(ConfigurationError):
        handler({"k": "x"}, LambdaContext())


@pytest.mark.filterwarnings("ignore:Couldn't determine the remaining time")
def test_idempotent_function_outside_a_guarded_record_handler_is_refused(
    persistence: DynamoDBPersistenceLayer,
) -> None:
    @idempotent_function(data_keyword_argument="record", persistence_store=persistence)
    @lease_owned(lambda record: record["k"], provider=InMemoryLeaseProvider())
    def record_handler(record: dict[str, Any]) -> str:
        return "done"

    with pytest.raises(ConfigurationError, match="@idempotent is outside @lease_owned"):
        record_handler(record={"k": "x"})


def test_a_guarded_route_is_refused_with_the_supported_way() -> None:
    app = APIGatewayRestResolver()

    @app.post("/threads/<thread_id>")
    @lease_owned(lambda event: event["pathParameters"]["thread_id"])
    def post(thread_id: str) -> dict[str, Any]:
        return {"thread": thread_id}

    with pytest.raises(ConfigurationError) as raised:
        app.resolve(api_event("t1", "x", "r1"), LambdaContext())
    message = str(raised.value)
    assert "event-handler route" in message and "def lambda_handler(event, context)" in message
    assert "app.resolve(event, context)" in message


def test_guarding_the_lambda_handler_of_a_resolver_works() -> None:
    app = APIGatewayRestResolver()
    inside, release = threading.Event(), threading.Event()
    seen: list[tuple[str, str]] = []

    @app.post("/threads/<thread_id>")
    def post(thread_id: str) -> dict[str, Any]:
        text = app.current_event.json_body["text"]
        seen.append((thread_id, text))
        if text == "first":
            inside.set()
            assert release.wait(10)
        return {"thread": thread_id, "key": current_lease().key}

    @lease_owned("pathParameters.thread_id", provider=InMemoryLeaseProvider())
    def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return app.resolve(event, context)

    results: dict[str, Any] = {}
    owner = threading.Thread(
        target=lambda: results.update(a=lambda_handler(api_event("t1", "first", "r1"), None))
    )
    owner.start()
    assert inside.wait(10)
    busy = lambda_handler(api_event("t1", "second", "r2"), LambdaContext())
    assert busy["statusCode"] == 202
    release.set()
    owner.join(10)
    assert results["a"]["statusCode"] == 200
    assert json.loads(results["a"]["body"]) == {"thread": "t1", "key": "t1"}
    assert seen == [("t1", "first"), ("t1", "second")]


def test_readme_stack_example(
    persistence: DynamoDBPersistenceLayer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """README.md's stacking example (not run by tests/test_readme.py: it needs a table), with
    the moto table of the fixture and the in-memory backend."""
    from leaseguard.config import provider_from_env
    from tests.test_docs import python_blocks
    from tests.test_readme import README

    (example,) = [b for b in python_blocks(README) if "@idempotent(persistence_store" in b.code]
    monkeypatch.setenv("LEASEGUARD_BACKEND", "memory")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "ReadmeStack")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", f"readme-{uuid.uuid4().hex}")
    provider_from_env.cache_clear()
    client = persistence.client
    monkeypatch.setattr(
        "aws_lambda_powertools.utilities.idempotency.DynamoDBPersistenceLayer",
        lambda table_name: DynamoDBPersistenceLayer(table_name=table_name, boto3_client=client),
    )
    replies: list[str] = []
    namespace: dict[str, Any] = {"__name__": "readme_stack", "reply_to": replies.append}
    code = "\n" * (example.line - 1) + example.code
    exec(compile(code, str(README), "exec"), namespace)
    handler = namespace["handler"]
    event = {
        **api_event("t9", "hello", "r9"),
        "pathParameters": {"threadId": "t9"},
    }
    first = handler(event, LambdaContext())
    again = handler(event, LambdaContext())  # the same event: answered from the idempotency table
    assert first == again and first["statusCode"] == 200 and len(replies) == 1
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert "LeaseAcquired" in emf_metric_names("\n".join(json.dumps(x) for x in lines))
    provider_from_env.cache_clear()
