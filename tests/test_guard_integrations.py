"""``@lease_owned`` with Powertools (BatchProcessor, Logger, Metrics), without Powertools, and
with a backend that goes away while a handler runs."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import Any

import pytest
import redis
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from leaseguard import LeaseBackendError, Signal, current_lease, lease_owned
from leaseguard.providers.base import BaseLeaseProvider
from leaseguard.providers.redis import RedisLeaseProvider
from leaseguard.testing import LambdaContext, RedisServer


def sqs_record(message_id: str, order: str, note: Any = "") -> dict[str, Any]:
    return {
        "messageId": message_id,
        "receiptHandle": f"rh-{message_id}",
        "body": json.dumps({"orderId": order, "note": note}),
        "attributes": {"ApproximateReceiveCount": "1"},
        "messageAttributes": {},
        "md5OfBody": "x",
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders",
        "awsRegion": "us-east-1",
    }


def test_sqs_batch_with_powertools_batch_processor(provider: BaseLeaseProvider) -> None:
    processor = BatchProcessor(event_type=EventType.SQS)
    seen: list[tuple[str, str, bool]] = []
    holding, release = threading.Event(), threading.Event()

    @lease_owned(lambda record: record.json_body["orderId"], provider=provider, ttl_ms=3_000)
    def record_handler(record: SQSRecord, lambda_context: Any = None) -> str:
        body = record.json_body
        seen.append((body["orderId"], body["note"], isinstance(record, SQSRecord)))
        if body["note"] == "hold":
            holding.set()
            release.wait(10)
        if body["note"] == "fail":
            raise ValueError("cannot process")
        return str(body["orderId"])

    def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return process_partial_response(event, record_handler, processor, context)

    # Another invocation holds order A while the batch arrives.
    holder = threading.Thread(
        target=lambda_handler,
        args=({"Records": [sqs_record("m0", "A", "hold")]}, LambdaContext()),
    )
    holder.start()
    assert holding.wait(10)
    batch = {
        "Records": [
            sqs_record("m1", "A", "forwarded"),  # A is held: queued, counts as processed
            sqs_record("m2", "B", "fail"),  # fails: reported for SQS to redeliver
            sqs_record("m3", "C", "ok"),
        ]
    }
    response = lambda_handler(batch, LambdaContext())
    assert response == {"batchItemFailures": [{"itemIdentifier": "m2"}]}
    assert ("A", "forwarded", True) not in seen
    release.set()
    holder.join()
    # The holder ran the forwarded record inline, rebuilt as an SQSRecord.
    assert ("A", "forwarded", True) in seen
    assert provider.get_lease_owner("A") is None


def test_powertools_logger_lines_carry_the_lease(
    provider: BaseLeaseProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    # Powertools reuses the handler of an existing logger of the same service, which would
    # still write to an earlier test's captured stdout.
    logger = Logger(service=f"lease-test-{uuid.uuid4().hex}")

    @lease_owned(lambda e: e["k"], provider=provider, ttl_ms=3_000, logger=logger)
    def handler(event: dict[str, Any], context: Any) -> int | None:
        logger.info("inside the handler")
        return current_lease().token

    token = handler({"k": "log-key"}, LambdaContext(aws_request_id="req-1"))
    logger.info("after the invocation")
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    inside = next(line for line in lines if line["message"] == "inside the handler")
    assert inside["lease_key"] == "log-key"
    assert inside["lease_owner"] == "req-1"
    assert inside["fencing_token"] == token
    after = next(line for line in lines if line["message"] == "after the invocation")
    assert "lease_key" not in after  # a warm environment's next invocation starts clean


def test_powertools_metrics_are_flushed_as_emf(
    provider: BaseLeaseProvider, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "LeaseguardTest")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "lease-test")

    @lease_owned(lambda e: e["k"], provider=provider, ttl_ms=3_000)
    def handler(event: dict[str, Any], context: Any) -> str:
        return "ok"

    assert handler({"k": "metric-key"}, LambdaContext()) == "ok"
    blobs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if "_aws" in line]
    assert blobs, "no EMF output"
    names = {
        metric["Name"]
        for blob in blobs
        for directive in blob["_aws"]["CloudWatchMetrics"]
        for metric in directive["Metrics"]
    }
    assert {"LeaseAcquired", "LeaseHoldMs"} <= names
    assert all(b["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "LeaseguardTest" for b in blobs)


def test_user_metrics_object_receives_lease_metrics(provider: BaseLeaseProvider) -> None:
    metrics = Metrics(namespace="UserNamespace", service="svc")
    metrics.clear_metrics()

    @lease_owned(lambda e: e["k"], provider=provider, ttl_ms=3_000, metrics=metrics)
    def handler(event: dict[str, Any], context: Any) -> str:
        return "ok"

    handler({"k": "m"}, LambdaContext())
    recorded = metrics.provider.metric_set  # Powertools' own buffer, flushed by log_metrics
    assert "LeaseAcquired" in recorded and "LeaseHoldMs" in recorded
    metrics.clear_metrics()


def test_tracer_gets_lease_annotations(provider: BaseLeaseProvider) -> None:
    class RecordingTracer:
        def __init__(self) -> None:
            self.annotations: dict[str, str] = {}

        def put_annotation(self, key: str, value: str) -> None:
            self.annotations[key] = value

    tracer = RecordingTracer()

    @lease_owned(lambda e: e["k"], provider=provider, ttl_ms=3_000, tracer=tracer)
    def handler(event: dict[str, Any], context: Any) -> int | None:
        return current_lease().token

    token = handler({"k": "traced"}, LambdaContext())
    assert tracer.annotations == {"lease_key": "traced", "fencing_token": str(token)}


def test_works_without_powertools_installed(tmp_path: Any) -> None:
    script = textwrap.dedent(
        """
        import sys, threading, logging
        sys.modules["aws_lambda_powertools"] = None  # as if it were not installed
        logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="%(message)s")
        from leaseguard import InMemoryLeaseProvider, current_lease, lease_owned
        from leaseguard.testing import LambdaContext

        provider = InMemoryLeaseProvider()
        inside, release, seen = threading.Event(), threading.Event(), []

        @lease_owned(lambda e: e["k"], provider=provider, ttl_ms=1000)
        def handler(event, context):
            seen.append((event["n"], current_lease().token))
            if event["n"] == 0:
                inside.set()
                release.wait(5)
            return event["n"]

        t = threading.Thread(target=handler, args=({"k": "x", "n": 0}, LambdaContext()))
        t.start(); inside.wait(5)
        print("FORWARDED", handler({"k": "x", "n": 1}, LambdaContext())["leaseguard"]["status"])
        release.set(); t.join()
        print("SEEN", [n for n, _ in seen])
        print("POWERTOOLS", sys.modules.get("aws_lambda_powertools") is not None)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "FORWARDED forwarded" in done.stdout
    assert "SEEN [0, 1]" in done.stdout
    assert "POWERTOOLS False" in done.stdout
    assert "forwarded event to the key's owner" in done.stdout  # stdlib logging took over


class _Names:
    def __init__(self) -> None:
        self.names: list[str] = []

    def add_metric(self, name: str, unit: str, value: float) -> None:
        self.names.append(name)


def test_backend_stopped_mid_run_marks_lost_and_skips_handoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with RedisServer() as server:
        client = redis.Redis(port=server.port, socket_timeout=1, socket_connect_timeout=1)
        provider = RedisLeaseProvider(client)
        lost: list[str | None] = []
        stopped = threading.Event()
        metrics = _Names()

        @lease_owned(
            lambda e: e["k"],
            provider=provider,
            ttl_ms=300,
            on_lost=lambda h: lost.append(h.lost_reason),
            logger=logging.getLogger("leaseguard.test"),
            metrics=metrics,
        )
        def handler(event: dict[str, Any], context: Any) -> bool:
            provider.acquire_or_enqueue("down", Signal("queued", {"k": "down"}), 10_000)
            server.stop()  # the Redis server goes away while the handler runs
            stopped.set()
            deadline = time.monotonic() + 3
            while not current_lease().lost and time.monotonic() < deadline:
                time.sleep(0.05)
            return current_lease().lost

        with caplog.at_level(logging.WARNING, logger="leaseguard.test"):
            assert handler({"k": "down"}, LambdaContext()) is True
        assert stopped.is_set()
        # Either the renewal errored, or the TTL ran out while it was still retrying.
        assert len(lost) == 1 and lost[0] is not None
        assert "renewal failed" in lost[0] or "no renewal succeeded" in lost[0]
        messages = [r.getMessage() for r in caplog.records]
        assert any("not handing off" in m for m in messages), messages
        assert metrics.names.count("LeaseLost") == 1
        assert "LeaseHandedOff" not in metrics.names  # transfer_to_next was never attempted


def test_backend_down_at_acquire_fails_the_invocation() -> None:
    server = RedisServer().start()
    port = server.port
    server.cleanup()
    provider = RedisLeaseProvider(redis.Redis(port=port, socket_timeout=0.5))
    ran: list[Any] = []

    @lease_owned(lambda e: e["k"], provider=provider, ttl_ms=1_000)
    def handler(event: Any, context: Any) -> None:
        ran.append(event)

    with pytest.raises(LeaseBackendError):
        handler({"k": "x"}, LambdaContext())
    assert ran == []  # never fail open
