"""A chat thread's worker: one invocation at a time owns a thread and appends its messages.

Messages arrive as ``POST /threads/{threadId}/messages`` (HTTP API, body ``{"text": ...}``), as
direct and async invocations (``{"threadId": ..., "text": ...}``), or as SQS records through the
batch worker (batch.py), which shares the threads and their log. While an invocation owns
the thread, the others forward their message to it and return at once (HTTP 202); the owner
drains them with ``take_signals`` and appends each message to the thread's log, fenced by its
lease token so that an owner whose lease ran out can no longer write.
"""

from __future__ import annotations

import json
import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Tracer
from botocore.exceptions import ClientError

from leaseguard import current_lease, lease_owned
from leaseguard.config import provider_from_env

logger = Logger()
tracer = Tracer()  # Tracing: Active in template.yaml; off outside Lambda and under sam local
# Module level: created once per execution environment. Tests point it at a local DynamoDB.
conversations = boto3.resource("dynamodb").Table(os.environ["CONVERSATION_TABLE_NAME"])
# The lease backend's client, built here in the init phase rather than by the first invocation
# (the template always sets LEASEGUARD_BACKEND; a setting that cannot work fails the init, not
# a request). Without it, @lease_owned resolves the environment's provider on first use.
# leaseguard.testing.use_provider still takes the place of this one in tests.
PROVIDER = provider_from_env() if os.environ.get("LEASEGUARD_BACKEND") else None
MAX_MESSAGES_PER_RUN = int(os.environ.get("MAX_MESSAGES_PER_RUN", "100"))


class StaleOwner(Exception):
    """A newer owner of the thread (a higher fencing token) has written: this one must stop."""


def message_of(event: dict[str, Any]) -> dict[str, Any]:
    """The message an event carries: an API Gateway request's or an SQS record's JSON body
    (the batch worker's, functions/thread_worker/batch.py), else the event itself."""
    if "requestContext" in event or event.get("eventSource") == "aws:sqs":
        return dict(json.loads(event.get("body") or "{}"))
    return event


def thread_of(event: dict[str, Any]) -> str:
    return str((event.get("pathParameters") or {}).get("threadId") or message_of(event)["threadId"])


def text_of(event: dict[str, Any]) -> str:
    # Any of the shapes: the sweeper hands every orphaned thread to this function, including
    # one whose queue the batch worker's SQS records formed.
    return str(message_of(event)["text"])


def append(thread: str, message_id: str, text: str, token: int) -> bool:
    """Append one message, once: refused (:class:`StaleOwner`) if a newer owner, with a higher
    token, already wrote, and skipped (``False``) if the message id is in the log already (a
    message run again after a crash)."""
    try:
        conversations.update_item(
            Key={"threadId": thread},
            UpdateExpression="SET messages = list_append(if_not_exists(messages, :none), :m),"
            " fence = :t ADD ids :id",
            ConditionExpression="(attribute_not_exists(fence) OR fence <= :t)"
            " AND NOT contains(ids, :mid)",
            ExpressionAttributeValues={
                ":m": [{"id": message_id, "text": text, "token": token}],
                ":t": token,
                ":id": {message_id},
                ":mid": message_id,
                ":none": [],
            },
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
            raise
        if int(exc.response.get("Item", {}).get("fence", {}).get("N", "0")) > token:
            raise StaleOwner(f"thread {thread!r}: token {token} is not the newest") from exc
        return False
    return True


# Tracer outside @lease_owned (leaseguard.stacking): its subsegment spans the lease steps too,
# and tracer= adds the lease_key and fencing_token annotations to it.
@tracer.capture_lambda_handler
@lease_owned(thread_of, provider=PROVIDER, logger=logger, tracer=tracer)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    lease = current_lease()
    # This run's message is queued under the lease owner's id; follow-ups under their own.
    batch = [(lease.owner, text_of(event))]
    handled = appended = 0
    while batch:
        for message_id, text in batch:
            lease.check()  # stop before writing if the lease was lost
            appended += append(lease.key, message_id, text, lease.token or 0)
        handled += len(batch)
        # Follow-ups that arrived meanwhile: ours to run now. The rest wait for the handoff.
        room = min(MAX_MESSAGES_PER_RUN - handled, 10)
        batch = [(s.id, text_of(s.payload)) for s in lease.take_signals(room)] if room > 0 else []
    result = {"threadId": lease.key, "appended": appended, "token": lease.token}
    logger.info("thread updated", extra=result)
    if "requestContext" in event:
        return {"statusCode": 200, "body": json.dumps(result)}
    return result
