"""Every Python example in README.md runs, unchanged, and does what the text says.

The blocks are found by tests/test_docs.py's parser, so its markers (``<!-- not-run: ... -->``)
apply here too, and each runs compiled at its own line of README.md, so a traceback names the
README line that failed. tests/test_docs.py runs docs/*.md's examples and checks every link.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from leaseguard import aws
from leaseguard.config import provider_from_env
from leaseguard.testing import LambdaContext
from tests.handoffs import RecordingLambda
from tests.test_docs import Block, python_blocks

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = [b for b in python_blocks(README) if b.runs]


def block(marker: str) -> Block:
    found = [b for b in BLOCKS if marker in b.code]
    assert len(found) == 1, f"expected one README example containing {marker!r}"
    return found[0]


def test_every_python_example_is_covered() -> None:
    markers = [
        "run_agent(",
        "def post_message",
        "process_partial_response",
        "ConditionExpression",
        "RedisLeaseProvider.from_url",
        "sweeper_handler()",
    ]
    assert len(BLOCKS) == len(markers)
    for marker in markers:
        block(marker)


USER_OUTLINE = [
    "Install",
    "Quick start",
    "Using it with event sources",
    "What it promises",
    "Settings",
    "Backends",
    "Command line",
    "Testing a guarded handler",
    "Deploy with AWS SAM",
    "Working on leaseguard",
    "Performance",
    "Further reading",
]


def test_the_readme_is_a_users_page() -> None:
    """What it does, how to use it and what it promises, in that order; measurements and their
    history live in docs/benchmarks.md (with their commands and dates), not here."""
    text = README.read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings == USER_OUTLINE
    dated = re.search(r"\b20\d\d-\d\d-\d\d\b", text)
    assert not dated, f"{dated and dated.group()}: a dated figure belongs in docs/benchmarks.md"
    for target in ("docs/safety.md", "docs/protocol.md", "docs/benchmarks.md", "docs/testing.md"):
        assert f"]({target}" in text, target
    assert "make test" in text and "make demo" in text


@pytest.fixture(autouse=True)
def memory_backend(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("LEASEGUARD_BACKEND", "memory")
    provider_from_env.cache_clear()
    yield
    provider_from_env.cache_clear()


def run(example: Block, **names: Any) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "readme_example", **names}
    exec(compile("\n" * (example.line - 1) + example.code, str(README), "exec"), namespace)
    return namespace


def test_quick_start(monkeypatch: pytest.MonkeyPatch) -> None:
    client = RecordingLambda()  # the async Invoke an HTTP owner hands the next event to
    made = aws.default_client
    monkeypatch.setattr(aws, "default_client", lambda s: client if s == "lambda" else made(s))
    calls: list[tuple[str, list[str]]] = []
    gate, inside = threading.Event(), threading.Event()

    def run_agent(thread: str, messages: list[str]) -> str:
        calls.append((thread, messages))
        inside.set()
        gate.wait(10)
        return f"{len(messages)} message(s)"

    handler = run(block("run_agent("), run_agent=run_agent)["handler"]

    def event(body: str) -> dict[str, Any]:
        return {
            "version": "2.0",
            "routeKey": "POST /threads/{threadId}/messages",
            "requestContext": {"http": {}},
            "pathParameters": {"threadId": "t1"},
            "body": body,
        }

    results: dict[str, Any] = {}
    first = threading.Thread(target=lambda: results.update(a=handler(event("a"), LambdaContext())))
    first.start()
    assert inside.wait(10)
    busy = handler(event("b"), LambdaContext())
    assert busy["statusCode"] == 202  # forwarded to the owner
    gate.set()
    first.join()
    assert results["a"] == {"statusCode": 200, "body": "1 message(s)"}
    # "b" arrived after the owner's take: its caller waits, so the owner answered it and
    # handed "b" to a new invocation, which runs it next.
    assert calls == [("t1", ["a"])]
    assert client.deliver(handler) == [{"statusCode": 200, "body": "1 message(s)"}]
    assert calls == [("t1", ["a"]), ("t1", ["b"])]


def test_api_gateway_example() -> None:
    post_message = run(block("def post_message"))["post_message"]
    event = {
        "httpMethod": "POST",
        "requestContext": {},
        "pathParameters": {"threadId": "t9"},
        "body": json.dumps({"text": "hello"}),
    }
    result = post_message(event, LambdaContext())
    assert json.loads(result["body"]) == {"thread": "t9", "got": "hello"}


def test_sqs_batch_example() -> None:
    fulfilled: list[Any] = []
    handler = run(block("process_partial_response"), fulfil=fulfilled.append)["handler"]

    def record(message_id: str, order: str) -> dict[str, Any]:
        return {
            "messageId": message_id,
            "receiptHandle": "r",
            "body": json.dumps({"orderId": order}),
            "attributes": {},
            "messageAttributes": {},
            "md5OfBody": "",
            "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:1:q",
            "awsRegion": "us-east-1",
        }

    response = handler({"Records": [record("m1", "o1"), record("m2", "o2")]}, LambdaContext())
    assert response == {"batchItemFailures": []}
    assert fulfilled == [{"orderId": "o1"}, {"orderId": "o2"}]


def test_fencing_example(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        table = boto3.resource("dynamodb").create_table(
            TableName="conversations",
            KeySchema=[{"AttributeName": "threadId", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "threadId", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        append_message = run(block("ConditionExpression"))["append_message"]
        append_message({"threadId": "t", "text": "one"}, LambdaContext())
        append_message({"threadId": "t", "text": "two"}, LambdaContext())
        item = table.get_item(Key={"threadId": "t"})["Item"]
        assert item["messages"] == ["one", "two"]
        # A stale owner (an older, lower token) is refused by the same condition.
        with pytest.raises(table.meta.client.exceptions.ConditionalCheckFailedException):
            table.update_item(
                Key={"threadId": "t"},
                UpdateExpression="SET fence = :t",
                ConditionExpression="attribute_not_exists(fence) OR fence <= :t",
                ExpressionAttributeValues={":t": int(item["fence"]) - 1},
            )


def test_contract_example(redis_url: str) -> None:
    example = block("RedisLeaseProvider.from_url")
    code = example.code.replace("redis://localhost:6379/0", redis_url)
    namespace = run(dataclasses.replace(example, code=code))
    assert namespace["provider"].get_lease_owner("order:17") is None  # released at the end


def test_sweeper_example(monkeypatch: pytest.MonkeyPatch, fake_aws_env: None) -> None:
    """The README's sweeper: built at init from the environment, one pass per invocation."""
    from leaseguard.handoff import InvokeDispatcher

    for name, value in {
        "LEASEGUARD_BACKEND": "memory",
        "LEASEGUARD_WORKER_FUNCTION": "thread-worker",
    }.items():
        monkeypatch.setenv(name, value)
    namespace = run(block("sweeper_handler()"))
    assert namespace["handler"]({}, None) == {"dispatched": 0, "keys": []}
    closure = namespace["handler"].__closure__ or ()
    assert any(isinstance(cell.cell_contents, InvokeDispatcher) for cell in closure)
